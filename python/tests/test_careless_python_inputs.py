"""Issue 51, item 10 from Python: inputs a careless caller hands the estimators get one
clear error each — X of 5 dimensions (not scikit-learn's "dim <= 2"), complex X (not
a 29-line dump of the array), save() into a missing folder (naming the folder, not a
temporary file), fit() from a second thread while one runs (not "from a fit
callback"), BALD and BatchBALD over one member (their disagreement is 0 for every row)."""
import threading

import numpy as np
import pytest
import torch

import packtrain
from packtrain import _core

SMALL = dict(members=2, hidden=8, depth=1, epochs=2, batch_size=16, device="cpu")


def data(rows=64, features=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    return x, x.sum(1) + 0.1 * rng.normal(size=rows)


def test_five_dimensional_and_complex_x_are_one_line_each():
    x, y = data()
    with pytest.raises(ValueError, match=r"^X has 5 dimensions: rows are \(N, features\)"):
        packtrain.EnsembleRegressor(**SMALL).fit(x.reshape(64, 1, 1, 1, 3), y)
    with pytest.raises(ValueError, match="Complex data not supported: X is complex") as e:
        packtrain.EnsembleRegressor(**SMALL).fit(x + 1j, y)
    assert "\n" not in str(e.value)


def test_save_into_a_missing_folder_names_the_folder(tmp_path):
    x, y = data()
    model = packtrain.EnsembleRegressor(**SMALL).fit(x, y)
    with pytest.raises(FileNotFoundError, match="the folder .*missing does not exist"):
        model.save(tmp_path / "missing" / "m.ckpt")


def test_fit_from_a_second_thread_says_so():
    x, y = data()
    model = packtrain.EnsembleRegressor(**dict(SMALL, epochs=50))
    started, release = threading.Event(), threading.Event()

    def callback(report):
        started.set()
        release.wait(30)
        return False

    worker = threading.Thread(target=lambda: model.fit(x, y, callback=callback))
    worker.start()
    try:
        assert started.wait(60)
        with pytest.raises(RuntimeError, match="fitting in another thread"):
            model.fit(x, y)
    finally:
        release.set()
        worker.join(60)


def test_disagreement_over_one_member_is_refused():
    probabilities = torch.full((1, 5, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="at least 2 members"):
        _core.batchbald_select(probabilities, 2)
    x = np.random.default_rng(0).normal(size=(64, 3))
    labels = (x[:, 0] > 0).astype(int)
    one = packtrain.EnsembleClassifier(**dict(SMALL, members=1)).fit(x, labels)
    for strategy in ("bald", "batchbald"):
        with pytest.raises(ValueError, match="needs at least 2 members"):
            one.acquire(x[:10], count=2, strategy=strategy)
