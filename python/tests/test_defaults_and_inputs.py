"""The estimators' defaults are `packtrain train`'s (read from its --help), small
training sets train in one smaller batch, sweeps take lists, and bad parameters or
calls raise a clear ValueError/TypeError/MemoryError/RuntimeError before any work.

Run by CTest (python_tests) on the build tree's package; PACKTRAIN_BINARY names the CLI."""
import inspect
import json
import logging
import os
import re
import subprocess
import time

import numpy as np
import pytest

import packtrain
from packtrain import _core

CLI = os.environ.get("PACKTRAIN_BINARY")
TINY = dict(members=2, epochs=3, hidden=8)


def data(n, seed=0, features=3):
    x = np.random.default_rng(seed).normal(size=(n, features))
    return x, x @ np.arange(1.0, features + 1)


def train_help_defaults(command="train"):
    """--flag: the default `packtrain train --help` (or `command`'s) shows ("--members INT=16 ..."; a
    sweepable flag's one-element list "--lr FLOAT=[0.003] ..." as its element), or
    None for a flag without a value (--layer-norm)."""
    if not CLI:
        pytest.skip("PACKTRAIN_BINARY is not set (run through ctest)")
    text = subprocess.run([CLI, command, "--help"], check=True, capture_output=True, text=True).stdout
    defaults = {}
    for line in text.splitlines():
        m = re.match(r"^\s+(?:-\w,)?(--[a-z][\w-]*)(?:\s+[A-Z][A-Z:|]*(?:=(\S+))?)?", line)  # -b,--count too
        if m:
            shown = m.group(2)
            if shown is not None and re.fullmatch(r"\[[^,\]]*\]", shown):
                shown = shown[1:-1]
            defaults[m.group(1)] = shown
    return defaults


def schema():
    """The trainer's options schema, as the runtime describes it (the CLI's flags are
    generated from it): {name: field}."""
    return {f["name"]: f for f in json.loads(_core.option_schema())}


@pytest.mark.parametrize("estimator", ["EnsembleRegressor", "EnsembleClassifier"])
def test_every_default_is_train_helps(estimator):
    """One source of defaults: each parameter's default equals the default `packtrain
    train --help` states for its flag (patience auto, on the ensemble's validation loss,
    where the estimators once had 0 and 'member')."""
    helps = train_help_defaults()
    fields = schema()
    params = getattr(packtrain, estimator)().get_params()
    compared = set()
    for name, value in params.items():
        field = fields.get(name)
        if field is None or name == "device":  # a data option (checked below), or the CLI's own --device
            continue
        flag = field["flag"]
        assert flag in helps, f"{name}: no {flag} in train --help"
        if field["kind"] == "flag":
            assert helps[flag] is None and value is field["flag_sets_false"], name
        elif value is None:
            assert field["optional"] and helps[flag] == "auto", (name, helps[flag])
        elif isinstance(value, (bool, str)):
            assert str(value) == helps[flag], (name, value, helps[flag])
        elif isinstance(value, tuple):  # an integer list (--channels 32,64), a tuple as Python's default
            assert tuple(int(v) for v in helps[flag].strip("[]").split(",")) == value, (name, value, helps[flag])
        else:
            assert type(value)(helps[flag]) == value, (name, value, helps[flag])
        compared.add(name)
    for name in ("val_fraction", "split_seed", "select"):  # the data options
        assert str(params[name]) == helps["--" + name.replace("_", "-")] or \
            type(params[name])(helps["--" + name.replace("_", "-")]) == params[name], name
        compared.add(name)
    assert {"patience", "early_stopping", "members", "lr", "batch_size", "capture", "val_fraction", "select"} <= compared
    assert estimator == "EnsembleClassifier" or "min_variance" in compared
    assert params["patience"] is None and params["early_stopping"] == "ensemble"
    omitted = {"head", "min_variance", "recalibration"} if estimator == "EnsembleClassifier" else set()
    assert set(params) - {"val_fraction", "split_seed", "select"} == \
        {name for name, f in fields.items() if f["python"]} - omitted


def test_every_acquire_default_is_the_schemas_and_acquire_helps():
    """acquire()'s parameters are `packtrain acquire`'s options: each default equals its
    schema field's (runtime/trainers/uncertainty/acquisition.h) and what `acquire --help`
    shows; the strategy's is the head's (None here, epistemic|bald there)."""
    helps = train_help_defaults("acquire")
    fields = {f["name"]: f for f in json.loads(_core.acquisition_option_schema())}
    params = inspect.signature(packtrain.EnsembleRegressor.acquire).parameters
    assert set(fields) <= set(params), set(fields) - set(params)
    for name, field in fields.items():
        default, shown = params[name].default, helps[field["flag"]]
        if name == "strategy":
            assert default is None and shown == "epistemic|bald", shown
            assert field["default"] == "epistemic" and "bald (classification)" in field["help"]
            continue
        assert default == field["default"], (name, default, field["default"])
        assert (str(default) == shown if isinstance(default, str) else type(default)(shown) == default), (name, shown)
    assert params["count"].default == int(helps["--count"])
    assert inspect.signature(packtrain.EnsembleClassifier.acquire) == inspect.signature(packtrain.EnsembleRegressor.acquire)


def test_default_patience_is_off_without_validation_rows_as_the_clis(tmp_path):
    """val_fraction=0: the default patience trains every epoch (as `train --val-fraction
    0` does); a patience given without validation rows is still an error."""
    x, y = data(80)
    model = packtrain.EnsembleRegressor(**TINY, val_fraction=0).fit(x, y)
    assert model.epochs_done_ == 3 and model._trainer.patience == 0
    assert json.loads(model._trainer.options_json)["patience"] is None  # unset: resolved by each run
    assert packtrain.EnsembleRegressor(**TINY).fit(x, y)._trainer.patience == 50
    with pytest.raises(ValueError, match="patience > 0 needs validation rows"):
        packtrain.EnsembleRegressor(**TINY, val_fraction=0, patience=3).fit(x, y)


def test_small_training_set_trains_in_one_batch_of_its_rows(caplog):
    """27 rows with the default batch of 64: trained (one step an epoch, a batch of the
    24 training rows), said once on the "packtrain" logger, not raised."""
    x, y = data(27)
    train_rows, _ = _core.carve_validation(27, 0.1, 0)
    with caplog.at_level(logging.INFO, logger="packtrain"):
        model = packtrain.EnsembleRegressor(**TINY).fit(x, y)
    notes = [r.getMessage() for r in caplog.records if "larger than the training set" in r.getMessage()]
    assert notes == [f"batch size 64 is larger than the training set ({len(train_rows)} rows): training with "
                     f"batches of {len(train_rows)}"]
    assert model._trainer.steps_taken == model.epochs_done_ == 3
    assert np.isfinite(model.predict(x)).all()
    # the classifier too, and a refit on more rows takes the full batch again
    labels = (x[:, 0] > 0).astype(float)
    assert packtrain.EnsembleClassifier(**TINY).fit(x, labels).predict(x).shape == (27,)
    x2, y2 = data(300)
    assert model.fit(x2, y2)._trainer.steps_taken == 3 * (len(_core.carve_validation(300, 0.1, 0)[0]) // 64)


def test_sweeps_take_lists_as_the_cli(tmp_path):
    """lr/weight_decay/dropout lists sweep their cross product, `members` seeds each, in
    one pack, as `train --lr 1e-3,3e-3` does: the same configurations and validation
    losses; select='best' keeps the best one only."""
    x, y = data(120)
    np.savetxt(tmp_path / "t.csv", np.column_stack([x, y]), delimiter=",", header="a,b,c,y", comments="")
    settings = dict(members=2, epochs=4, hidden=8, lr=[1e-3, 3e-3], dropout=[0.0, 0.1])
    model = packtrain.EnsembleRegressor(**settings).fit(x, y)
    assert [(c["lr"], c["dropout"], c["members"]) for c in model.configurations_] == [
        (1e-3, 0.0, 2), (1e-3, 0.1, 2), (3e-3, 0.0, 2), (3e-3, 0.1, 2)]
    assert model.predict_members(x)[0].shape[0] == 8
    best = packtrain.EnsembleRegressor(**settings, select="best").fit(x, y)
    chosen = [c for c in best.configurations_ if c["selected"]]
    assert len(chosen) == 1 and chosen[0]["val_loss"] == min(c["val_loss"] for c in best.configurations_)
    assert best.member_status_.count("deselected") == 6
    # with the CLI's rows (no test rows: all of the table trains, as fit() has it)
    if CLI:
        out = json.loads(subprocess.run(
            [CLI, "train", "--data", str(tmp_path / "t.csv"), "--test-fraction", "0", "--members", "2", "--epochs", "4",
             "--hidden", "8", "--lr", "1e-3,3e-3", "--dropout", "0,0.1", "--device", "cpu", "--json", "--quiet"],
            check=True, capture_output=True, text=True).stdout)
        cli = [c["val_loss"] for c in out["configurations"]]
        assert cli == pytest.approx([c["val_loss"] for c in model.configurations_], rel=1e-9)


@pytest.mark.parametrize("params, error, message", [
    (dict(lr=float("nan")), ValueError, "lr must be a finite number, got nan"),
    (dict(weight_decay=float("inf")), ValueError, "weight_decay must be a finite number"),
    (dict(lr=[1e-3, float("nan")]), ValueError, r"lr\[1\] must be a finite number"),
    (dict(lr=[]), ValueError, "lr: an empty list"),
    (dict(lr=[1e-3, 1e-3]), ValueError, "given twice"),
    (dict(lr=[1e-3, "fast"]), TypeError, r"lr\[1\] must be a number"),
    (dict(lr="fast"), TypeError, "lr must be a number"),
    (dict(dropout=[0.1, 1.5]), ValueError, "dropout must be in"),
    (dict(members=2**70), ValueError, "members must be an integer from 1 to 9223372036854775807, got 1180591620717411303424"),
    (dict(members=2.5), TypeError, "members must be an integer from 1 to 9223372036854775807, got 2.5"),
    (dict(members=0), ValueError, "members must be an integer from 1 to"),
    (dict(members=True), TypeError, "members must be an integer"),
    (dict(seed=-1), ValueError, "seed must be an integer from 0 to 18446744073709551615"),
    (dict(epochs=2**63), ValueError, "epochs must be an integer from 1 to 9223372036854775807"),
    (dict(split_seed=2**64), ValueError, "split_seed must be an integer from 0 to 18446744073709551615"),
    (dict(layer_norm="yes"), TypeError, "layer_norm must be True or False"),
    (dict(select="some"), ValueError, "select must be 'all' or 'best'"),
])
def test_bad_parameters_raise_a_clear_error(params, error, message):
    x, y = data(40)
    with pytest.raises(error, match=message):
        packtrain.EnsembleRegressor(**{**TINY, **params}).fit(x, y)


def test_bad_input_the_runtime_finds_raises_value_error(tmp_path):
    """What the runtime refuses as bad input (a packtrain::UserError: unreadable data, a
    file that is not a checkpoint, a bad generation option) is ValueError, as it is
    exit status 2 for the CLI, never RuntimeError."""
    with pytest.raises(ValueError, match="no_such_set: no such file or directory, nor a bundled data set"):
        packtrain.load_dataset("no_such_set")
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.ckpt"):
        packtrain.load(junk)


def test_a_pack_larger_than_memory_is_refused_before_it_is_allocated():
    """members=10**9 is refused by the runtime's estimate (as `train` refuses it), at
    once and without allocating, naming what to lower; a sweep counts its configurations."""
    x, y = data(40)
    start = time.monotonic()
    with pytest.raises(MemoryError, match=r"needs about .* \(1000000000 members, .*lower members"):
        packtrain.EnsembleRegressor(members=10**9).fit(x, y)
    with pytest.raises(MemoryError, match=r"\(2000000000 members"):
        packtrain.EnsembleRegressor(members=10**9, lr=[1e-3, 3e-3]).fit(x, y)
    assert time.monotonic() - start < 10


def test_calls_inside_a_fit_callback_are_refused():
    """reinitialize() (once an endless loop), continue_fit() and fit() from within a fit
    callback raise RuntimeError saying what to do; the model stays usable."""
    x, y = data(60)
    model = packtrain.EnsembleRegressor(**TINY)
    for call in (lambda: model.reinitialize(), lambda: model.continue_fit(), lambda: model.fit(x, y)):
        with pytest.raises(RuntimeError, match="cannot be called from a fit callback: return False"):
            model.fit(x, y, callback=lambda report, call=call: call())
    assert model.reinitialize().continue_fit().epochs_done_ == 3


def test_evaluate_and_acquire_check_their_arguments():
    x, y = data(60)
    model = packtrain.EnsembleRegressor(**TINY).fit(x, y)
    with pytest.raises(ValueError, match="X has 5 rows but y has 4"):
        model.evaluate(x[:5], y[:4])
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 18446744073709551615, got -1"):
        model.acquire(x, seed=-1)
    with pytest.raises(TypeError, match="count must be an integer"):
        model.acquire(x, count=2.5)
    with pytest.raises(ValueError, match="ucb_beta must be a finite number"):
        model.acquire(x, strategy="ucb", ucb_beta=float("nan"))
    assert len(model.acquire(x, count=3, seed=2**64 - 1)[0]) == 3


def test_a_rare_label_the_carve_would_only_validate_is_trained_on():
    """A label whose only row the CLI's validation carve would hold out stays in
    training: the classifier fits and knows it."""
    x, _ = data(60)
    labels = (x[:, 0] > 0).astype(float)
    _, val_rows = _core.carve_validation(60, 0.1, 0)
    labels[val_rows[0]] = 7.0
    model = packtrain.EnsembleClassifier(**TINY).fit(x, labels)
    assert list(model.classes_) == [0.0, 1.0, 7.0]
    strings = np.where(labels == 7.0, "rare", np.where(labels > 0, "pos", "neg"))
    assert "rare" in packtrain.EnsembleClassifier(**TINY).fit(x, strings).classes_
