"""packtrain.resume(): a run saved by save() or by `packtrain train --checkpoint`
continues exactly as the uninterrupted run (identical predictions on the CPU), and
a bad path, other rows or an epoch count not ahead are refused with the reason."""
import os
import subprocess

import numpy as np
import pytest

import packtrain

CLI = os.environ.get("PACKTRAIN_BINARY")
SMALL = dict(members=4, hidden=16, seed=3, device="cpu")


def run_cli(*args):
    if not CLI:
        pytest.skip("PACKTRAIN_BINARY is not set (run through ctest)")
    return subprocess.run([CLI, *map(str, args)], check=True, capture_output=True, text=True)


def test_resume_of_a_save_continues_as_the_uninterrupted_fit(tmp_path):
    d = packtrain.load_dataset("concrete")
    straight = packtrain.EnsembleRegressor(epochs=8, val_fraction=0, **SMALL).fit(d.X_train, d.y_train)
    half = packtrain.EnsembleRegressor(epochs=4, val_fraction=0, **SMALL).fit(d.X_train, d.y_train)
    half.save(tmp_path / "half.pt")
    seen = []
    resumed = packtrain.resume(tmp_path / "half.pt", d.X_train, d.y_train, epochs=8, device="cpu",
                               callback=lambda report: seen.append(report["epoch"]))
    assert isinstance(resumed, packtrain.EnsembleRegressor)
    assert seen == [5, 6, 7, 8]
    assert resumed.epochs == 8 and resumed.epochs_done_ == 8
    mine, theirs = resumed.predict(d.X_test, return_std=True), straight.predict(d.X_test, return_std=True)
    assert np.array_equal(mine[0], theirs[0]) and np.array_equal(mine[1], theirs[1])


def test_resume_of_a_cli_checkpoint_reloads_its_data(tmp_path):
    run_cli("train", "--members", 4, "--hidden", 16, "--epochs", 5, "--device", "cpu", "-q",
            "--checkpoint", tmp_path / "half.pt")
    resumed = packtrain.resume(tmp_path / "half.pt", epochs=10, device="cpu")
    d = packtrain.load_dataset("concrete")
    # fit() on the run's rows is `packtrain train` (test_estimators.py: test_fit_is_the_cli_run)
    straight = packtrain.EnsembleRegressor(members=4, hidden=16, epochs=10, device="cpu").fit(d.X_train, d.y_train)
    assert list(resumed.feature_names_in_) == d.feature_names
    assert np.array_equal(resumed.predict(d.X_test), straight.predict(d.X_test))
    with pytest.raises(ValueError, match="reloads its own data"):
        packtrain.resume(tmp_path / "half.pt", d.X_train, d.y_train, epochs=10)


def test_resume_refuses_a_bad_path_other_rows_and_epochs_not_ahead(tmp_path):
    missing = tmp_path / "missing.pt"
    with pytest.raises(FileNotFoundError, match="missing.pt: no such checkpoint"):
        packtrain.resume(missing)
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    with pytest.raises(ValueError, match="notes.txt"):
        packtrain.resume(tmp_path / "notes.txt")
    d = packtrain.load_dataset("concrete")
    packtrain.EnsembleRegressor(epochs=3, val_fraction=0, **SMALL).fit(d.X_train, d.y_train).save(tmp_path / "m.pt")
    with pytest.raises(ValueError, match="fitted from Python"):
        packtrain.resume(tmp_path / "m.pt", epochs=6)
    with pytest.raises(ValueError, match="training data differ"):
        packtrain.resume(tmp_path / "m.pt", d.X_train, d.y_train + 1.0, epochs=6)
    with pytest.raises(ValueError, match="is at epoch 3"):
        packtrain.resume(tmp_path / "m.pt", d.X_train, d.y_train, epochs=3)


def test_a_member_parallel_manifest_resumes_whole_here(tmp_path):
    """A member-parallel run's shards, gathered into one process, continue as the
    one-process run of the same options (member early stopping, no recalibration:
    what --member-parallel trains)."""
    small = ("--members", 4, "--hidden", 16, "--device", "cpu", "-q")
    run_cli("launch", "--nproc", 2, "--", "train", "--member-parallel", *small, "--epochs", 5,
            "--checkpoint", tmp_path / "m.ckpt")
    run_cli("train", *small, "--epochs", 10, "--early-stopping", "member", "--recalibrate", "none",
            "--checkpoint", tmp_path / "one.ckpt")
    resumed = packtrain.resume(tmp_path / "m.ckpt", epochs=10, device="cpu")
    assert resumed.members == 4 and resumed.epochs_done_ == 10
    d = packtrain.load_dataset("concrete")
    assert np.array_equal(resumed.predict(d.X_test), packtrain.load(tmp_path / "one.ckpt").predict(d.X_test))
