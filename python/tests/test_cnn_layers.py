"""The cnn's layers as Python parameters: kernel, pool, norm_groups and dropout train
a pack on the bundled digits, are scikit-learn parameters, and come back from a saved
model (which then predicts exactly as before); a group count that does not divide the
channels is refused naming it."""
import os
from pathlib import Path

import numpy as np
import pytest

import packtrain

DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", Path(__file__).resolve().parents[2] / "data"))
LAYERS = dict(architecture="cnn", channels=[4, 8], kernel=5, pool="avg", norm_groups=2, dropout=0.2, hidden=32,
              depth=1, members=2, epochs=6, batch_size=32, val_fraction=0, device="cpu", seed=3)


def test_kernel_pool_norm_groups_and_dropout_train_save_and_load(tmp_path):
    x = np.load(DATA / "optdigits" / "features.npy") / 16.0
    y = np.load(DATA / "optdigits" / "labels.npy")
    model = packtrain.EnsembleClassifier(**LAYERS)
    assert {k: model.get_params()[k] for k in ("kernel", "pool", "norm_groups")} == \
        {"kernel": 5, "pool": "avg", "norm_groups": 2}
    model.fit(x[:600], y[:600])
    probabilities = model.predict_proba(x[1400:])
    assert model.score(x[1400:], y[1400:]) > 0.5  # chance is 0.1
    model.save(tmp_path / "layers.ckpt")
    again = packtrain.load(tmp_path / "layers.ckpt")
    assert (again.kernel, again.pool, again.norm_groups, again.dropout) == (5, "avg", 2, 0.2)
    np.testing.assert_array_equal(again.predict_proba(x[1400:]), probabilities)


def test_a_group_count_that_does_not_divide_the_channels_is_refused():
    x = np.zeros((20, 1, 8, 8))
    y = np.arange(20) % 2
    with pytest.raises(ValueError, match="norm groups 3 do not divide block 0's 4 channels"):
        packtrain.EnsembleClassifier(**{**LAYERS, "norm_groups": 3, "epochs": 1}).fit(x, y)
