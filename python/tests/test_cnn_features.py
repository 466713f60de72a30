"""Convolutional members from Python through the features that are not
architecture-specific: early stopping, a sweep with select="best", save and
resume (equal to the uninterrupted fit), and acquire, on the bundled optdigits
images with small, fast packs (the CLI's: tests/runtime/cli/cnn_features_cli_test.cpp)."""
import os
from pathlib import Path

import numpy as np

import packtrain

DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", Path(__file__).resolve().parents[2] / "data"))
SMALL = dict(architecture="cnn", channels=[4, 8], hidden=16, depth=1, members=3, batch_size=64, device="cpu", seed=2)


def digits():
    x = np.load(DATA / "optdigits" / "features.npy") / 16.0
    return x[:800], np.load(DATA / "optdigits" / "labels.npy")[:800]


def test_early_stopping_stops_before_the_last_epoch():
    x, y = digits()
    model = packtrain.EnsembleClassifier(**SMALL, epochs=15, patience=1, lr=0.05, val_fraction=0.2).fit(x, y)
    assert model.epochs_done_ < 15
    assert set(model.member_status_) == {"stopped"}, model.member_status_


def test_a_sweep_keeps_its_best_configuration():
    x, y = digits()
    model = packtrain.EnsembleClassifier(**SMALL, epochs=2, lr=[0.001, 0.01], select="best", val_fraction=0.2,
                                         patience=0).fit(x, y)
    assert len(model.configurations_) == 2
    losses = [c["val_loss"] for c in model.configurations_]
    best = int(np.argmin(losses))
    expected = ["deselected"] * 3 + ["training"] * 3 if best == 1 else ["training"] * 3 + ["deselected"] * 3
    assert list(model.member_status_) == expected, (model.configurations_, model.member_status_)
    assert model.score(x, y) > 0.2  # the kept members predict (chance 0.1)


def test_resume_equals_the_uninterrupted_fit(tmp_path):
    x, y = digits()
    options = dict(**SMALL, val_fraction=0)
    full = packtrain.EnsembleClassifier(**options, epochs=3).fit(x, y)
    part = packtrain.EnsembleClassifier(**options, epochs=2).fit(x, y)
    part.save(tmp_path / "part.ckpt")
    resumed = packtrain.resume(tmp_path / "part.ckpt", x, y, epochs=3, device="cpu")
    assert resumed.epochs_done_ == 3
    np.testing.assert_array_equal(resumed.predict_proba(x[:50]), full.predict_proba(x[:50]))


def test_acquire_chooses_distinct_pool_images():
    x, y = digits()
    model = packtrain.EnsembleClassifier(**SMALL, epochs=2, val_fraction=0).fit(x[:400], y[:400])
    for strategy in ("bald", "batchbald"):
        chosen, scores = model.acquire(x[400:], count=5, strategy=strategy)
        assert len(scores) == 400 and np.isfinite(scores).all()
        assert len(set(chosen.tolist())) == 5 and ((chosen >= 0) & (chosen < 400)).all(), (strategy, chosen)
