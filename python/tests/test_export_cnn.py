"""Export of convolutional members: `packtrain export` of a cnn checkpoint writes each
member as a torch.nn layer list and state_dict (format packtrain-export-2) that
scripts/load_packtrain_export.py rebuilds as a plain torch.nn.Sequential; its
predictions equal the estimator's own members and `packtrain predict`, on 2-D
(optdigits) and 1-D (MNIST-1D) samples.

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

SMALL = dict(architecture="cnn", hidden=16, depth=1, members=3, epochs=2, batch_size=32, val_fraction=0,
             device="cpu", seed=3)


def cli(*args):
    if not CLI:
        pytest.skip("PACKTRAIN_BINARY is not set (run through ctest)")
    result = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def export_and_compare(model, x, tmp_path, expected_layers):
    """Saves `model`, exports it with the CLI, rebuilds its members in plain PyTorch and
    checks them against the estimator's members and `packtrain predict`."""
    model.save(tmp_path / "cnn.ckpt")
    exported = cli("export", tmp_path / "cnn.ckpt", tmp_path / "cnn.pt")
    assert f"{SMALL['members']} member(s)" in exported.stdout + exported.stderr
    plain = torch.load(tmp_path / "cnn.pt")  # the one call a Python user makes (weights_only=True)
    assert plain["format"] == lpe.LAYERS_FORMAT and plain["architecture"]["kind"] == "cnn"
    layers = plain["architecture"]["member_layers"]
    assert len(layers) == SMALL["members"] and [layer["type"] for layer in layers[0]] == expected_layers
    members, meta = lpe.load_members(tmp_path / "cnn.pt")
    assert all(isinstance(m, torch.nn.Sequential) for m in members) and len(members) == SMALL["members"]
    # Samples in their own shape and as rows are the same input.
    result = lpe.predict(tmp_path / "cnn.pt", x)
    np.testing.assert_array_equal(result["mean"], lpe.predict(tmp_path / "cnn.pt", x.reshape(len(x), -1))["mean"])
    # Each member equals the estimator's member (probabilities (K, N, C)).
    expected = np.transpose(model.predict_member_proba(x), (2, 0, 1))
    np.testing.assert_allclose(result["member_means"], expected, rtol=0, atol=1e-5)
    assert (result["label"] == model.predict(x)).all()
    # And the ensemble equals `packtrain predict` on the same rows (printed to 6 digits).
    np.savetxt(tmp_path / "rows.csv", x.reshape(len(x), -1), delimiter=",")
    lines = cli("predict", tmp_path / "cnn.ckpt", tmp_path / "rows.csv").stdout.splitlines()
    printed = np.loadtxt(lines, delimiter=",", skiprows=1, ndmin=2)
    np.testing.assert_allclose(result["mean"], printed[:, 1:], rtol=0, atol=1e-5)
    return result


def test_exported_2d_members_equal_the_estimators(tmp_path):
    x = np.load(DATA / "optdigits" / "features.npy") / 16.0
    y = np.load(DATA / "optdigits" / "labels.npy")
    model = packtrain.EnsembleClassifier(**SMALL, channels=[4, 8]).fit(x[:500], y[:500])
    result = export_and_compare(model, x[1500:1600], tmp_path, [
        "Unflatten", "Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU", "MaxPool2d", "Flatten", "Linear", "ReLU",
        "Linear"])
    assert (result["label"] == y[1500:1600]).mean() > 0.2  # trained: chance is 0.1


def test_exported_1d_members_equal_the_estimators(tmp_path):
    x = np.load(DATA / "mnist1d" / "train_features.npy")
    y = np.load(DATA / "mnist1d" / "train_labels.npy")
    assert x.ndim == 3  # (N, 1, 40)
    model = packtrain.EnsembleClassifier(**SMALL, channels=[4]).fit(x[:600], y[:600])
    test = np.load(DATA / "mnist1d" / "test_features.npy")[:100]
    export_and_compare(model, test, tmp_path, ["Unflatten", "Conv1d", "ReLU", "MaxPool1d", "Flatten", "Linear",
                                               "ReLU", "Linear"])


def test_group_norm_average_pooling_wide_kernels_and_swept_dropout_export(tmp_path):
    """A CLI-trained pack with every layer option (--norm-groups, --pool avg, --kernel 5,
    head dropout swept over two rates): the export's members predict as `packtrain predict`."""
    ckpt, export = tmp_path / "cnn.ckpt", tmp_path / "cnn.pt"
    cli("--threads", 1, "train", "--data", "mnist1d", "--architecture", "cnn", "--head", "classification",
        "--channels", "4,8", "--hidden", 16, "--members", 2, "--epochs", 1, "--norm-groups", 2, "--pool", "avg",
        "--kernel", 5, "--dropout", "0,0.3", "--device", "cpu", "--quiet", "--checkpoint", ckpt)
    cli("export", ckpt, export)
    layers = torch.load(export)["architecture"]["member_layers"]
    blocks = ["Unflatten", "Conv1d", "GroupNorm", "ReLU", "AvgPool1d", "Conv1d", "GroupNorm", "ReLU", "AvgPool1d",
              "Flatten"]
    # Members 0-1 (dropout 0) have no Dropout layer; members 2-3 theirs, at their rate.
    assert [[layer["type"] for layer in member] for member in layers] == [
        blocks + ["Linear", "ReLU", "Linear", "ReLU", "Linear"]] * 2 + [
        blocks + ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout", "Linear"]] * 2
    assert layers[3][1]["args"]["kernel_size"] == [5] and layers[3][2]["args"]["num_groups"] == 2
    assert layers[3][12]["args"]["p"] == pytest.approx(0.3)
    x = np.load(DATA / "mnist1d" / "test_features.npy")[:50]
    np.savetxt(tmp_path / "rows.csv", x.reshape(len(x), -1), delimiter=",")
    printed = np.loadtxt(cli("predict", ckpt, tmp_path / "rows.csv").stdout.splitlines(), delimiter=",",
                         skiprows=1, ndmin=2)
    np.testing.assert_allclose(lpe.predict(export, x)["mean"], printed[:, 1:], rtol=0, atol=1e-5)


def test_strided_padded_convolutions_train_and_export(tmp_path):
    """Python's stride and padding (an even kernel 2, stride 2, no padding): the pack
    trains, its parameters come back from get_params, and the export's Conv2d carries
    them and predicts as the estimator's members."""
    x = np.load(DATA / "optdigits" / "features.npy") / 16.0
    y = np.load(DATA / "optdigits" / "labels.npy")
    model = packtrain.EnsembleClassifier(**SMALL, channels=[8], kernel=2, stride=2, padding=0).fit(x[:500], y[:500])
    assert {k: model.get_params()[k] for k in ("kernel", "stride", "padding")} == {"kernel": 2, "stride": 2,
                                                                                   "padding": 0}
    result = export_and_compare(model, x[1500:1600], tmp_path, [
        "Unflatten", "Conv2d", "ReLU", "MaxPool2d", "Flatten", "Linear", "ReLU", "Linear"])
    conv = torch.load(tmp_path / "cnn.pt")["architecture"]["member_layers"][0][1]["args"]
    assert conv["kernel_size"] == [2, 2] and conv["stride"] == [2, 2] and conv["padding"] == [0, 0]
    assert (result["label"] == y[1500:1600]).mean() > 0.2  # trained: chance is 0.1


def test_members_of_different_channels_sweep_in_one_pack_and_export_at_their_own(tmp_path):
    """channels=[[2, 4], [4, 8]] (the CLI's --channels 2,4/4,8): one pack padded to the
    widest channels, a configuration per list, select="best" keeps one; the export
    rebuilds every member at its own channels and predicts as the estimator's members."""
    x = np.load(DATA / "optdigits" / "features.npy") / 16.0
    y = np.load(DATA / "optdigits" / "labels.npy")
    params = dict(SMALL, members=2, val_fraction=0.2)
    model = packtrain.EnsembleClassifier(**params, channels=[[2, 4], [4, 8]]).fit(x[:500], y[:500])
    assert [(c["channels"], c["members"]) for c in model.configurations_] == [([2, 4], 2), ([4, 8], 2)]
    assert model.predict_member_proba(x[:5]).shape[-1] == 4  # (N, C, K): 2 lists x 2 members
    losses = [c["val_loss"] for c in model.configurations_]
    assert losses[0] != losses[1]
    model.save(tmp_path / "cnn.ckpt")
    cli("export", tmp_path / "cnn.ckpt", tmp_path / "cnn.pt")
    layers = torch.load(tmp_path / "cnn.pt")["architecture"]["member_layers"]
    assert [[m[1]["args"]["out_channels"], m[4]["args"]["out_channels"]] for m in layers] == [[2, 4]] * 2 + [[4, 8]] * 2
    assert [m[8]["args"]["in_features"] for m in layers] == [4 * 2 * 2] * 2 + [8 * 2 * 2] * 2
    test = x[1500:1600]
    expected = np.transpose(model.predict_member_proba(test), (2, 0, 1))
    np.testing.assert_allclose(lpe.predict(tmp_path / "cnn.pt", test)["member_means"], expected, rtol=0, atol=1e-5)
    best = packtrain.EnsembleClassifier(**params, channels=[[2, 4], [4, 8]], select="best").fit(x[:500], y[:500])
    assert best.member_status_.count("deselected") == 2
    with pytest.raises(ValueError, match="repeat"):
        packtrain.EnsembleClassifier(**params, channels=[[2, 4], [2, 4]]).fit(x[:100], y[:100])
    with pytest.raises(TypeError, match=r"channels\[1\]\[0\]"):
        packtrain.EnsembleClassifier(**params, channels=[[2, 4], [2.5, 4]]).fit(x[:100], y[:100])
