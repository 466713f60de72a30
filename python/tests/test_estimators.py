"""The Python package against the CLI (same data, same options: the same model),
scikit-learn's parameter protocol, inputs and outputs, callbacks, Ctrl-C and the GIL.

Run by CTest (python_tests) on the build tree's package; PACKTRAIN_BINARY names the
CLI and PACKTRAIN_DATA_DIR the bundled data."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import packtrain

DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", Path(__file__).resolve().parents[2] / "data"))
CLI = os.environ.get("PACKTRAIN_BINARY")


def concrete(split=0):
    """The bundled UCI concrete set as the CLI reads it: features, target, split k."""
    d = DATA / "concrete"
    table = np.loadtxt(d / "data.txt")
    features = np.loadtxt(d / "index_features.txt", dtype=int).reshape(-1)
    target = int(np.loadtxt(d / "index_target.txt"))
    train = np.sort(np.loadtxt(d / f"index_train_{split}.txt", dtype=int))  # the CLI's rows are in table order
    test = np.loadtxt(d / f"index_test_{split}.txt", dtype=int)
    return table[:, features], table[:, target], train, test


def blobs(n=300, seed=0, labels=(3, 7, 11)):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=4, size=(len(labels), 5))
    which = rng.integers(0, len(labels), size=n)
    return centers[which] + rng.normal(size=(n, 5)), np.asarray(labels, dtype=float)[which]


SMALL = dict(members=4, epochs=15, hidden=32)


def run_cli(*args):
    if not CLI:
        pytest.skip("PACKTRAIN_BINARY is not set (run through ctest)")
    return subprocess.run([CLI, *map(str, args)], check=True, capture_output=True, text=True)


def test_fit_is_the_cli_run(tmp_path):
    """fit() on the training rows of concrete split 0, holding out val_fraction as the CLI
    does, gives the very model `packtrain train` gives: identical predictions."""
    x, y, train, test = concrete()
    # Every other option the defaults of both (patience 50 on the ensemble's validation loss included).
    run_cli("train", "--members", 4, "--epochs", 15, "--hidden", 32, "--checkpoint", tmp_path / "cli.pt", "-q")
    from_cli = packtrain.load(tmp_path / "cli.pt")
    model = packtrain.EnsembleRegressor(**SMALL).fit(x[train], y[train])
    mine, theirs = model.predict(x[test], return_std=True), from_cli.predict(x[test], return_std=True)
    assert np.array_equal(mine[0], theirs[0]) and np.array_equal(mine[1], theirs[1])
    assert model.history_["val_loss"] == pytest.approx(from_cli._trainer.val_loss_history, rel=0, abs=0)
    # and it learned: R^2 on the test rows well above a constant's 0
    assert model.score(x[test], y[test]) > 0.5


def test_recalibration_is_fitted_on_the_validation_rows_and_is_the_clis(tmp_path):
    """recalibration="variance" (the default): the predictive variance of a fit with
    validation rows is the unrecalibrated fit's times variance_scale_, the scale that
    minimizes uncertainty-toolbox's Gaussian NLL of the validation rows (scipy); the
    CLI's run of the same options reports the same scale."""
    uct = pytest.importorskip("uncertainty_toolbox")
    scipy_optimize = pytest.importorskip("scipy.optimize")
    x, y, train, test = concrete()
    rows = train[: int(0.9 * len(train))]
    val = train[len(rows):]
    model = packtrain.EnsembleRegressor(**SMALL).fit(x[rows], y[rows], x[val], y[val])
    plain = packtrain.EnsembleRegressor(**SMALL, recalibration="none").fit(x[rows], y[rows], x[val], y[val])
    assert plain.variance_scale_ == 1.0
    s = model.variance_scale_
    m, sd = plain.predict(x[val], return_std=True)
    ref = scipy_optimize.minimize_scalar(lambda r: uct.metrics_scoring_rule.nll_gaussian(m, r * sd, y[val]),
                                         bounds=(1e-2, 1e2), method="bounded", options={"xatol": 1e-10})
    assert s == pytest.approx(ref.x ** 2, rel=1e-5)
    mine, theirs = model.predict(x[test], return_std=True), plain.predict(x[test], return_std=True)
    np.testing.assert_allclose(mine[0], theirs[0], rtol=1e-12)
    np.testing.assert_allclose(mine[1], np.sqrt(s) * theirs[1], rtol=1e-9)
    # The CLI, holding out its own validation rows, reports its scale and saves it.
    out = json.loads(run_cli("train", "--members", 4, "--epochs", 15, "--hidden", 32, "--json",
                             "--quiet", "--checkpoint", tmp_path / "cli.pt").stdout)
    cli_model = packtrain.EnsembleRegressor(**SMALL).fit(x[train], y[train])
    assert out["variance_scale"] == pytest.approx(cli_model.variance_scale_, rel=1e-12)
    assert packtrain.load(tmp_path / "cli.pt").variance_scale_ == pytest.approx(out["variance_scale"], rel=1e-12)


def test_save_is_read_by_the_cli(tmp_path):
    x, y, train, test = concrete()
    model = packtrain.EnsembleRegressor(**SMALL).fit(x[train], y[train])
    model.save(tmp_path / "py.pt")
    np.savetxt(tmp_path / "rows.csv", x[test], delimiter=",")
    out = run_cli("predict", tmp_path / "py.pt", tmp_path / "rows.csv").stdout.splitlines()
    assert out[0].startswith("mean,std")
    cli = np.array([[float(v) for v in line.split(",")[:2]] for line in out[1:]])
    mean, std = model.predict(x[test], return_std=True)
    np.testing.assert_allclose(cli[:, 0], mean, rtol=1e-8)
    np.testing.assert_allclose(cli[:, 1], std, rtol=1e-8)
    # and the evaluate command scores it on a table with the target
    np.savetxt(tmp_path / "scored.csv", np.column_stack([x[test], y[test]]), delimiter=",")
    report = json.loads(run_cli("evaluate", tmp_path / "py.pt", tmp_path / "scored.csv", "--json").stdout)
    rmse = float(np.sqrt(np.mean((mean - y[test]) ** 2)))
    assert report["ensemble"]["rmse"] == pytest.approx(rmse, rel=1e-9)


def test_defaults_are_the_clis():
    params = packtrain.EnsembleRegressor().get_params()
    assert params["members"] == 16 and params["depth"] == 2 and params["hidden"] == 64
    assert params["lr"] == 3e-3 and params["epochs"] == 200 and params["head"] == "gaussian"
    assert params["val_fraction"] == 0.1 and params["device"] == "auto"
    assert "head" not in packtrain.EnsembleClassifier().get_params()
    with pytest.raises(TypeError):
        packtrain.EnsembleRegressor(hiden=3)  # a misspelt option is an error, not ignored


def test_scikit_learn_clone_and_params():
    from sklearn.base import clone
    model = packtrain.EnsembleRegressor(members=3, lr=1e-2)
    copy = clone(model)
    assert copy.get_params() == model.get_params() and copy is not model
    copy.set_params(members=5)
    assert copy.members == 5 and model.members == 3
    with pytest.raises(ValueError, match="(?i)invalid parameter"):
        copy.set_params(nonsense=1)
    assert "members=3" in repr(model)


def test_inputs_numpy_and_torch_outputs_follow():
    x, y = blobs(200)
    y = x[:, 0] * 2 + x[:, 1]
    model = packtrain.EnsembleRegressor(**SMALL, head="mean").fit(torch.from_numpy(x), torch.from_numpy(y))
    t = model.predict(torch.from_numpy(x[:7]))
    a = model.predict(x[:7])
    assert isinstance(t, torch.Tensor) and isinstance(a, np.ndarray)
    np.testing.assert_array_equal(t.numpy(), a)
    means, variances = model.predict_members(x[:7])
    assert means.shape == (4, 7) and variances is None
    with pytest.raises(ValueError, match="features"):
        model.predict(x[:3, :2])
    with pytest.raises(ValueError, match="NaN"):
        model.fit(np.full((10, 5), np.nan), np.zeros(10))
    with pytest.raises(packtrain.estimators.NotFittedError, match="not fitted"):
        packtrain.EnsembleRegressor().predict(x)


def test_classifier_probabilities_and_labels():
    x, y = blobs(400)
    model = packtrain.EnsembleClassifier(**SMALL).fit(x[:300], y[:300])
    assert list(model.classes_) == [3.0, 7.0, 11.0]
    p = model.predict_proba(x[300:])
    members = model.predict_member_proba(x[300:])
    assert p.shape == (100, 3) and members.shape == (100, 3, 4)  # (N, C, K): baal's layout
    np.testing.assert_allclose(members.sum(axis=1), 1, rtol=1e-9)
    np.testing.assert_allclose(members.mean(axis=2), p, rtol=1e-9)
    assert set(np.unique(model.predict(x[300:]))) <= {3.0, 7.0, 11.0}
    assert model.score(x[300:], y[300:]) > 0.9
    with pytest.raises(ValueError, match="continuous|whole numbers"):
        model.fit(x[:10], np.linspace(0, 1, 10))


def test_callback_sees_every_member_and_can_stop():
    x, y = blobs(200)
    seen = []

    def callback(report):
        seen.append(report)
        return report["epoch"] < 3

    model = packtrain.EnsembleRegressor(members=5, epochs=50, hidden=16).fit(x, y, callback=callback)
    assert [r["epoch"] for r in seen] == [1, 2, 3] and model.epochs_done_ == 3
    assert len(seen[0]["member_train_loss"]) == 5 and len(seen[0]["member_val_loss"]) == 5
    assert seen[0]["train_loss"] == pytest.approx(np.mean(seen[0]["member_train_loss"]))
    assert seen[-1]["active"] == 5


def test_callback_error_stops_and_is_raised():
    x, y = blobs(100)

    def callback(report):
        raise ZeroDivisionError("from the callback")

    model = packtrain.EnsembleRegressor(members=2, epochs=20, hidden=8)
    with pytest.raises(ZeroDivisionError, match="from the callback"):
        model.fit(x, y, callback=callback)
    assert model.epochs_done_ == 1 and np.isfinite(model.predict(x)).all()


def test_ctrl_c_stops_after_the_epoch_and_leaves_a_usable_model():
    x, y = blobs(300)
    model = packtrain.EnsembleRegressor(members=8, epochs=100000, hidden=32, patience=0)  # runs until stopped
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y)
    assert time.monotonic() - started < 30
    assert 0 < model.epochs_done_ < 100000
    assert np.isfinite(model.predict(x)).all()


def test_the_gil_is_released_while_training():
    """A second thread runs while C++ trains: it wakes at epoch 1 and has set its flag
    by a later epoch (within 3000 epochs, however slowly the machine schedules it). With a 100 s switch interval the interpreter never hands the GIL
    over by itself, so the flag can only be set while the fit has released it."""
    x, y = blobs(300)
    go, woke = threading.Event(), threading.Event()
    seen_awake = []

    def background():
        go.wait()
        woke.set()

    def callback(report):
        if report["epoch"] == 1:
            go.set()
        seen_awake.append(woke.is_set())
        return not woke.is_set()  # done once the thread has run

    thread = threading.Thread(target=background)
    thread.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        packtrain.EnsembleRegressor(members=4, epochs=3000, hidden=16).fit(x, y, callback=callback)
    finally:
        sys.setswitchinterval(interval)
        go.set()
        thread.join()
    assert seen_awake[0] is False and seen_awake[-1] is True, seen_awake


def test_reinitialize_then_train_again_repeats_the_run():
    x, y = blobs(200)
    model = packtrain.EnsembleRegressor(members=3, epochs=10, hidden=16).fit(x, y)
    first = model.predict(x)
    model.reinitialize().continue_fit()
    np.testing.assert_array_equal(model.predict(x), first)
    model.reinitialize(seed=5).continue_fit()
    assert not np.array_equal(model.predict(x), first)


def test_dropout_is_the_clis_and_follows_the_seed(tmp_path):
    """Dropout's masks follow from the seed, not the process: fit(dropout=0.1) gives the
    model `packtrain train --dropout 0.1` gives, prediction for prediction."""
    x, y, train, test = concrete()
    run_cli("train", "--members", 4, "--epochs", 15, "--hidden", 32, "--dropout", 0.1,
            "--checkpoint", tmp_path / "cli.pt", "-q")
    from_cli = packtrain.load(tmp_path / "cli.pt")
    torch.manual_seed(12345)  # the process's generator plays no part
    model = packtrain.EnsembleRegressor(dropout=0.1, **SMALL).fit(x[train], y[train])
    assert np.array_equal(model.predict(x[test]), from_cli.predict(x[test]))
    plain = packtrain.EnsembleRegressor(**SMALL).fit(x[train], y[train])
    assert not np.allclose(plain.predict(x[test]), model.predict(x[test]))


def test_patience_needs_validation():
    x, y = blobs(100)
    with pytest.raises(ValueError, match="validation"):
        packtrain.EnsembleRegressor(patience=3, val_fraction=0).fit(x, y)
    model = packtrain.EnsembleRegressor(members=3, patience=2, epochs=400, hidden=16).fit(x, y)
    assert model.epochs_done_ < 400 and set(model.member_status_) == {"stopped"}


def test_early_stopping_parameter_is_the_clis(tmp_path):
    """early_stopping="ensemble" stops each ensemble on its mixture's validation loss,
    as `packtrain train --early-stopping ensemble` does: the same stopping epoch, the
    same model (the default of both); "member" stops on each member's own loss."""
    assert packtrain.EnsembleRegressor().get_params()["early_stopping"] == "ensemble"
    x, y, train, test = concrete()
    settings = dict(members=4, epochs=300, hidden=32, patience=5)
    run_cli("train", "--members", 4, "--epochs", 300, "--hidden", 32, "--patience", 5, "--early-stopping", "ensemble",
            "--checkpoint", tmp_path / "cli.pt", "-q")
    from_cli = packtrain.load(tmp_path / "cli.pt")
    model = packtrain.EnsembleRegressor(early_stopping="ensemble", **settings).fit(x[train], y[train])
    assert model.epochs_done_ < 300 and set(model.member_status_) == {"stopped"}
    assert model.epochs_done_ == from_cli.epochs_done_
    assert np.array_equal(model.predict(x[test]), from_cli.predict(x[test]))
    with pytest.raises(ValueError, match="early.stopping"):
        packtrain.EnsembleRegressor(early_stopping="sometimes", **settings).fit(x[train], y[train])


def test_import_refuses_another_torch(tmp_path):
    """A package built against another torch says so at import."""
    package = Path(packtrain.__file__).parent
    copy = tmp_path / "packtrain"
    shutil.copytree(package, copy, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "_build_info.py").write_text('TORCH_VERSION = "1.0.0"\nPACKTRAIN_VERSION = "0"\n')
    result = subprocess.run([sys.executable, "-c", "import packtrain"], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode != 0
    assert "built against torch 1.0.0" in result.stderr and torch.__version__ in result.stderr


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_device_parameter(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    x, y = blobs(200)
    model = packtrain.EnsembleRegressor(**SMALL, device=device).fit(torch.from_numpy(x).to(device), y)
    out = model.predict(torch.from_numpy(x).to(device))
    assert out.device.type == device and torch.isfinite(out).all()


@pytest.mark.parametrize("estimator", ["EnsembleRegressor", "EnsembleClassifier"])
def test_scikit_learn_check_estimator(estimator):
    """Every check of scikit-learn's check_estimator passes (none skipped) with the
    default parameters: the checks fit data sets of 9 to 50 rows, fewer than the
    default batch of 64, which then trains in batches of all the training rows."""
    from sklearn.utils.estimator_checks import check_estimator
    model = getattr(packtrain, estimator)()
    results = check_estimator(model, on_fail=None)
    failed = {r["check_name"]: str(r["exception"])[:300] for r in results if r["status"] == "failed"}
    assert len(results) > 40 and not failed, failed


def test_pickle_round_trip():
    import pickle
    x, y = blobs(150)
    model = packtrain.EnsembleClassifier(**SMALL).fit(x, y)
    copy = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(copy.predict_proba(x), model.predict_proba(x))
    assert list(copy.classes_) == list(model.classes_)


def test_without_scikit_learn():
    """The core package needs only torch and numpy: with scikit-learn unimportable the
    estimators still fit, predict and keep the parameter protocol."""
    code = """
import sys
sys.modules["sklearn"] = None  # import sklearn now fails
import numpy as np, packtrain
x = np.random.default_rng(0).normal(size=(100, 3))
m = packtrain.EnsembleRegressor(members=2, epochs=3).fit(x, x.sum(1))
assert m.predict(x).shape == (100,)
assert m.get_params()["members"] == 2 and m.set_params(members=3).members == 3
try:
    m.set_params(nonsense=1)
except ValueError as e:
    assert "invalid parameter" in str(e)
else:
    raise AssertionError("set_params accepted an unknown name")
assert "members=3" in repr(m)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_without_validation_rows():
    x, y = blobs(120)
    model = packtrain.EnsembleRegressor(members=2, epochs=4, hidden=8, val_fraction=0).fit(x, y)
    assert all(np.isnan(model.history_["val_loss"])) and len(model.history_["train_loss"]) == 4


def test_load_dataset_is_the_clis_split():
    x, y, train, test = concrete()
    data = packtrain.load_dataset("concrete", split=0)
    np.testing.assert_array_equal(data.X_train, x[train])
    np.testing.assert_array_equal(data.y_test, y[test])
    assert "concrete" in data.description and len(data.feature_names) == x.shape[1]


def test_the_active_learning_example_runs(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "active_learning.py"
    result = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("spread 40:") and lines[1].startswith("random 40:")
    assert (tmp_path / "active_learning.png").exists() or (tmp_path / "active_learning.csv").exists()


def test_load_reads_a_member_parallel_manifest(tmp_path):
    """A run split over 2 ranks (packtrain launch ... --member-parallel) loads from its
    manifest: all 5 members, and the same predictions as the CLI's predict."""
    x, y, train, test = concrete()
    run_cli("launch", "--nproc", 2, "--", "train", "--members", 5, "--epochs", 5, "--hidden", 16, "--device", "cpu",
            "--member-parallel", "--checkpoint", tmp_path / "mp.ckpt", "-q")
    model = packtrain.load(tmp_path / "mp.ckpt")
    means, variances = model.predict_members(x[test])
    assert means.shape == (5, len(test)) and np.isfinite(means).all()
    np.savetxt(tmp_path / "rows.csv", x[test], delimiter=",")
    out = run_cli("predict", tmp_path / "mp.ckpt", tmp_path / "rows.csv").stdout.splitlines()
    cli = np.array([[float(v) for v in line.split(",")[:2]] for line in out[1:]])
    mean, std = model.predict(x[test], return_std=True)
    np.testing.assert_allclose(cli[:, 0], mean, rtol=1e-8)
    np.testing.assert_allclose(cli[:, 1], std, rtol=1e-8)
    with pytest.raises(TypeError, match="member-parallel"):
        model.save(tmp_path / "again.pt")


def test_fitting_again_on_same_shaped_data_keeps_the_steps_and_equals_a_fresh_fit():
    """The active-learning case: a second fit on new rows of the same shapes keeps the
    prepared steps (on a GPU, their captured graphs: nothing is captured again) and
    trains exactly as a fresh estimator would."""
    x1, y1 = blobs(200, seed=1)
    x2, y2 = blobs(200, seed=2)
    model = packtrain.EnsembleRegressor(members=3, epochs=8, hidden=16).fit(x1, y1)
    steps = model._trainer.steps_id
    model.fit(x2, y2)
    assert model._trainer.steps_id == steps
    fresh = packtrain.EnsembleRegressor(members=3, epochs=8, hidden=16).fit(x2, y2)
    np.testing.assert_array_equal(model.predict(x1), fresh.predict(x1))
    model.fit(x2[:150], y2[:150])  # other shapes: new steps
    assert model._trainer.steps_id != 0
    np.testing.assert_array_equal(
        model.predict(x1), packtrain.EnsembleRegressor(members=3, epochs=8, hidden=16).fit(x2[:150], y2[:150]).predict(x1))


def test_uncertainty_evaluation_and_acquisition_through_the_estimators(tmp_path):
    """predict_uncertainty, evaluate and acquire give what the CLI's predict,
    evaluate and acquire give for the same model."""
    x, y, train, test = concrete()
    model = packtrain.EnsembleRegressor(**SMALL).fit(x[train], y[train])
    u = model.predict_uncertainty(x[test], levels=(0.5, 0.9))
    np.testing.assert_allclose(u["std"] ** 2, u["aleatoric_std"] ** 2 + u["epistemic_std"] ** 2, rtol=1e-10)
    np.testing.assert_allclose(u["mean"], model.predict(x[test]), rtol=1e-12)
    lower50, upper50 = u["intervals"][0.5]
    lower90, upper90 = u["intervals"][0.9]
    assert np.all(lower90 < lower50) and np.all(lower50 < upper50) and np.all(upper50 < upper90)
    metrics = model.evaluate(x[test], y[test])
    c = metrics["calibration"]
    assert c["rows"] == len(test)
    assert [i["level"] for i in c["intervals"]] == [0.5, 0.9, 0.95]
    assert c["gaussian_nll"] == pytest.approx(metrics["ensemble"]["nll"])
    assert np.isfinite(c["mixture_nll"]) and c["crps"] > 0
    coverage = np.mean((y[test] >= lower90) & (y[test] <= upper90))
    assert c["intervals"][1]["coverage"] == pytest.approx(coverage)
    chosen, scores = model.acquire(x[test], count=8)
    assert len(chosen) == 8 and scores.shape == (len(test),)
    np.testing.assert_array_equal(chosen, np.argsort(-scores, kind="stable")[:8])
    np.testing.assert_allclose(scores, u["epistemic_std"], rtol=1e-12)
    if CLI:  # the CLI ranks the same pool the same way from the saved model
        model.save(tmp_path / "m.pt")
        np.savetxt(tmp_path / "pool.csv", x[test], delimiter=",")
        out = run_cli("acquire", tmp_path / "m.pt", tmp_path / "pool.csv", "--count", 8, "--json", "--header", "no")
        assert [r["row"] for r in json.loads(out.stdout)["chosen"]] == list(chosen)
        evaluated = json.loads(run_cli("evaluate", tmp_path / "m.pt", _xy_csv(tmp_path, x[test], y[test]), "--json",
                                       "--header", "no").stdout)
        assert evaluated["calibration"]["crps"] == pytest.approx(c["crps"], rel=1e-9)

    xb, yb = blobs()
    classifier = packtrain.EnsembleClassifier(**SMALL).fit(xb, yb)
    cu = classifier.predict_uncertainty(xb)
    np.testing.assert_allclose(cu["entropy"], cu["aleatoric_entropy"] + cu["mutual_information"], atol=1e-12)
    cm = classifier.evaluate(xb, yb)["calibration"]
    assert cm["accuracy"] == pytest.approx(classifier.score(xb, yb))
    chosen, scores = classifier.acquire(xb, count=5, selection="softmax", power=10.0, seed=1)
    assert len(set(chosen.tolist())) == 5
    np.testing.assert_allclose(scores, cu["mutual_information"], rtol=1e-12, atol=1e-15)


def _xy_csv(tmp_path, x, y):
    path = tmp_path / "xy.csv"
    np.savetxt(path, np.column_stack([x, y]), delimiter=",")
    return path
