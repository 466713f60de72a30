"""Members of different widths in one pack (`hidden=[4, 16]`, as `train --hidden 4,16`):
a sweep over widths whose configurations, validation losses and selection match the
CLI's, each member predicting at its own width; bad widths refused as parameters."""
import json
import os
import subprocess

import numpy as np
import pytest

import packtrain

CLI = os.environ.get("PACKTRAIN_BINARY")


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    return x, np.sin(x[:, 0]) + 0.5 * x[:, 1] ** 2 + 0.1 * rng.normal(size=n)


def test_widths_sweep_in_one_pack_as_the_cli(tmp_path):
    x, y = data(160)
    model = packtrain.EnsembleRegressor(members=2, epochs=5, hidden=[4, 16]).fit(x, y)
    assert [(c["hidden"], c["members"]) for c in model.configurations_] == [(4, 2), (16, 2)]
    assert model.predict_members(x)[0].shape[0] == 4
    losses = [c["val_loss"] for c in model.configurations_]
    assert losses[0] != losses[1]
    best = packtrain.EnsembleRegressor(members=2, epochs=5, hidden=[4, 16], select="best").fit(x, y)
    chosen = [c for c in best.configurations_ if c["selected"]]
    assert len(chosen) == 1 and chosen[0]["val_loss"] == min(losses)
    assert best.member_status_.count("deselected") == 2
    # save/load keeps each member's width: the same predictions
    best.save(tmp_path / "m.pt")
    again = packtrain.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(again.predict(x), best.predict(x))
    if CLI:
        np.savetxt(tmp_path / "t.csv", np.column_stack([x, y]), delimiter=",", header="a,b,c,y", comments="")
        out = json.loads(subprocess.run(
            [CLI, "train", "--data", str(tmp_path / "t.csv"), "--test-fraction", "0", "--members", "2", "--epochs", "5",
             "--hidden", "4,16", "--device", "cpu", "--json", "--quiet"],
            check=True, capture_output=True, text=True).stdout)
        assert [c["hidden"] for c in out["configurations"]] == [4, 16]
        assert [c["val_loss"] for c in out["configurations"]] == pytest.approx(losses, rel=1e-9)


@pytest.mark.parametrize("hidden, error, message", [
    ([4, 2.5], TypeError, r"hidden\[1\] must be an integer"),
    ([4, 0], ValueError, r"hidden\[1\] must be an integer from 1"),
    ([], ValueError, "hidden: an empty list"),
    ([8, 8], ValueError, "given twice"),
])
def test_bad_widths_are_refused(hidden, error, message):
    x, y = data(40)
    with pytest.raises(error, match=message):
        packtrain.EnsembleRegressor(members=1, epochs=1, hidden=hidden).fit(x, y)


def test_layer_norm_with_several_widths_is_refused():
    x, y = data(40)
    with pytest.raises(ValueError, match="layer-norm with several --hidden widths|layer norm"):
        packtrain.EnsembleRegressor(members=1, epochs=1, hidden=[4, 8], layer_norm=True).fit(x, y)
