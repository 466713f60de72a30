"""Convolutional members from Python: EnsembleClassifier(architecture="cnn") takes
images (N, C, H, W) and sequences (N, C, L) as arrays or tensors, predicts them and
survives a save and load; samples of another shape are refused."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import packtrain

DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", Path(__file__).resolve().parents[2] / "data"))
SMALL = dict(architecture="cnn", channels=[8], hidden=32, depth=1, members=3, epochs=15, batch_size=32,
             val_fraction=0, device="cpu", seed=1)


def digits():
    """The bundled optdigits images (1,797 x 1 x 8 x 8, grey levels 0-16) and labels."""
    x = np.load(DATA / "optdigits" / "features.npy") / 16.0
    return x, np.load(DATA / "optdigits" / "labels.npy")


def test_a_cnn_pack_learns_digits_from_images_and_tensors(tmp_path):
    x, y = digits()
    train, test = slice(0, 600), slice(1400, 1797)
    model = packtrain.EnsembleClassifier(**SMALL).fit(x[train], y[train])
    assert model.sample_shape_ == [1, 8, 8] and model.n_features_in_ == 64
    accuracy = model.score(x[test], y[test])
    assert accuracy > 0.8, accuracy  # chance is 0.1
    probabilities = model.predict_proba(torch.from_numpy(x[test]))  # a tensor in, a tensor out
    assert isinstance(probabilities, torch.Tensor) and probabilities.shape == (397, 10)
    # The same samples as rows in the same (C, H, W) order are the same input.
    np.testing.assert_array_equal(model.predict_proba(x[test].reshape(397, 64)), probabilities.numpy())
    with pytest.raises(ValueError, match=r"shaped \(1, 4, 16\)"):
        model.predict(x[test].reshape(397, 1, 4, 16))
    model.save(tmp_path / "cnn.ckpt")
    again = packtrain.load(tmp_path / "cnn.ckpt")
    assert again.architecture == "cnn" and again.channels == [8] and again.sample_shape_ == [1, 8, 8]
    np.testing.assert_array_equal(again.predict_proba(x[test]), probabilities.numpy())


def test_sequences_train_and_a_table_or_bad_channels_are_refused():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 2, 12))
    y = (x[:, 0, :6].sum(axis=1) > 0).astype(int)  # the sign of the first channel's first half
    model = packtrain.EnsembleClassifier(**SMALL).fit(x, y)
    assert model.sample_shape_ == [2, 12] and model.score(x, y) > 0.7
    with pytest.raises(ValueError, match="input_shape"):  # a table has no sample shape to convolve over
        packtrain.EnsembleClassifier(**SMALL).fit(x.reshape(200, 24), y)
    with pytest.raises(TypeError, match="channels"):
        packtrain.EnsembleClassifier(**{**SMALL, "channels": 8}).fit(x, y)
    with pytest.raises(ValueError, match=r"channels\[0\]"):
        packtrain.EnsembleClassifier(**{**SMALL, "channels": [0]}).fit(x, y)
