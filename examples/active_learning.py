"""Pool-based active learning with a packed deep ensemble (packtrain's Python package).

Start from 40 labelled rows of the bundled UCI concrete set; each round, retrain the
ensemble, ask the labelling oracle for the 20 pool rows where the members disagree
most (epistemic spread), and compare with asking for 20 random rows. Test RMSE per
round goes to a plot (matplotlib) or a CSV.   python examples/active_learning.py
"""
import numpy as np
import packtrain

data = packtrain.load_dataset("concrete")
X, y, X_test, y_test = data.X_train, data.y_train, data.X_test, data.y_test
oracle = lambda rows: y[rows]  # the labeller: here the data set's own targets

def run(strategy, rounds=8, start=40, batch=20, seed=0):
    rng = np.random.default_rng(seed)
    labelled = list(rng.choice(len(X), start, replace=False))
    curve = []
    for _ in range(rounds):
        model = packtrain.EnsembleRegressor(members=16, epochs=150, batch_size=32, seed=seed)
        model.fit(X[labelled], oracle(labelled))
        curve.append((len(labelled), np.sqrt(np.mean((model.predict(X_test) - y_test) ** 2))))
        pool = np.setdiff1d(np.arange(len(X)), labelled)
        if strategy == "spread":  # the members' disagreement: std of their means
            score = model.predict_members(X[pool])[0].std(axis=0)
            labelled += list(pool[np.argsort(-score)[:batch]])
        else:
            labelled += list(rng.choice(pool, batch, replace=False))
    return np.array(curve)

curves = {s: run(s) for s in ("spread", "random")}
for s, c in curves.items():
    print(s, " ".join(f"{n:.0f}:{r:.2f}" for n, r in c))
try:
    import matplotlib.pyplot as plt
    for s, c in curves.items():
        plt.plot(c[:, 0], c[:, 1], marker="o", label=s)
    plt.xlabel("labelled rows"), plt.ylabel("test RMSE (MPa)"), plt.legend()
    plt.savefig("active_learning.png")
    print("learning curves -> active_learning.png")
except ImportError:
    rows = [(s, n, r) for s, c in curves.items() for n, r in c]
    np.savetxt("active_learning.csv", np.array(rows, dtype=object), fmt="%s", delimiter=",",
               header="strategy,labelled,test_rmse", comments="")
    print("learning curves -> active_learning.csv (pip install matplotlib for a plot)")
