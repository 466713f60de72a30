"""precision="bf16-mixed" from Python (ensemble/precision.h): the estimators take the
CLI's --precision; the model trains and predicts float32 arrays; it is the CLI's run;
a saved model keeps its precision; the export predicts in it, as packtrain does.

Run by CTest (python_tests) on the build tree's package; PACKTRAIN_BINARY names the CLI."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import packtrain

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", ROOT / "data"))
CLI = os.environ.get("PACKTRAIN_BINARY")
sys.path.insert(0, str(ROOT / "scripts"))
import load_packtrain_export as lpe  # noqa: E402

SMALL = dict(members=3, epochs=15, hidden=32, device="cpu")


def concrete(split=0):
    d = DATA / "concrete"
    table = np.loadtxt(d / "data.txt")
    features = np.loadtxt(d / "index_features.txt", dtype=int).reshape(-1)
    target = int(np.loadtxt(d / "index_target.txt"))
    train = np.sort(np.loadtxt(d / f"index_train_{split}.txt", dtype=int))
    test = np.loadtxt(d / f"index_test_{split}.txt", dtype=int)
    return table[:, features], table[:, target], train, test


def cli(*args):
    if not CLI:
        pytest.skip("PACKTRAIN_BINARY is not set (run through ctest)")
    return subprocess.run([CLI, *map(str, args)], check=True, capture_output=True, text=True)


def test_precision_is_a_parameter_and_bad_values_are_refused():
    assert packtrain.EnsembleRegressor().get_params()["precision"] == "fp32"
    with pytest.raises(Exception, match="bf16-mixed"):
        packtrain.EnsembleRegressor(precision="fp16", epochs=1).fit(np.zeros((20, 2)), np.zeros(20))


def test_bf16_mixed_is_the_clis_run_and_learns_as_fp32_does(tmp_path):
    x, y, train, test = concrete()
    cli("train", "--members", 3, "--epochs", 15, "--hidden", 32, "--precision", "bf16-mixed", "--device", "cpu",
        "--checkpoint", tmp_path / "cli.pt", "-q")
    mixed = packtrain.EnsembleRegressor(precision="bf16-mixed", **SMALL).fit(x[train], y[train])
    fp32 = packtrain.EnsembleRegressor(**SMALL).fit(x[train], y[train])
    from_cli = packtrain.load(tmp_path / "cli.pt")
    assert from_cli.get_params()["precision"] == "bf16-mixed"
    mean, std = mixed.predict(x[test], return_std=True)
    assert np.array_equal(mean, from_cli.predict(x[test]))
    assert np.isfinite(std).all()
    assert not np.array_equal(mean, fp32.predict(x[test]))  # the products ran in bfloat16
    assert mixed.score(x[test], y[test]) > 0.5
    assert mixed.score(x[test], y[test]) == pytest.approx(fp32.score(x[test], y[test]), abs=0.1)


def test_a_saved_model_keeps_its_precision_and_its_export_predicts_in_it(tmp_path):
    x, y, train, test = concrete()
    model = packtrain.EnsembleRegressor(precision="bf16-mixed", **SMALL).fit(x[train], y[train])
    model.save(tmp_path / "m.ckpt")
    loaded = packtrain.load(tmp_path / "m.ckpt")
    assert loaded.get_params()["precision"] == "bf16-mixed"
    np.testing.assert_array_equal(loaded.predict(x[test]), model.predict(x[test]))
    cli("export", tmp_path / "m.ckpt", tmp_path / "m.pt")
    exported = torch.load(tmp_path / "m.pt")
    assert exported["precision"] == "bf16-mixed"
    result = lpe.predict(tmp_path / "m.pt", x[test])
    # Each member's products in bfloat16 under torch.autocast, as packtrain's: the same
    # means to within the rounding of a product that sums in another order (a bfloat16
    # step, 2^-8 relative, of the standardized output, times the target's sd).
    means, _ = model.predict_members(x[test])
    tolerance = 4 * 2.0**-8 * np.abs(means).max()
    np.testing.assert_allclose(result["member_means"].reshape(means.shape), means, rtol=0, atol=tolerance)
    # Without the autocast the export's fp32 predictions differ by more than that.
    models, meta = lpe.load_members(tmp_path / "m.pt")
    raw = lpe.apply_head(lpe.member_outputs(models, lpe.standardize(x[test], meta)), meta)
    assert np.abs(raw["member_means"] - result["member_means"]).max() > 0
