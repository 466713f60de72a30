#!/usr/bin/env python3
"""Checks a packtrain export against outputs computed in C++ (model_export_test.cpp).

    check_export.py EXPORT INPUT.csv RAW.csv PREDICTIONS.csv

INPUT.csv: (B, I) inputs in original units. RAW.csv: the exported members' raw
outputs on the standardized inputs, (K*B, O), member-major. PREDICTIONS.csv:
(B, 2*T) the ensemble's mean then std per target (classification: T = classes).
Loads the export with a plain torch.load (weights_only=True, the default), then
through scripts/load_packtrain_export.py; prints "checked K members" and exits 0
when everything agrees to 1e-5, else prints the worst element and exits 1.
"""

import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "scripts"))
import load_packtrain_export as lpe  # noqa: E402

TOLERANCE = 1e-5


def compare(what, actual, expected, tolerance):
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        print(f"{what}: shape {actual.shape}, expected {expected.shape}")
        return False
    diff = np.abs(actual - expected) / (1 + np.abs(expected))
    if diff.size and diff.max() > tolerance:
        worst = np.unravel_index(diff.argmax(), diff.shape)
        print(f"{what}: worst element {worst}: {actual[worst]!r}, expected {expected[worst]!r} (tolerance {tolerance})")
        return False
    return True


def main(export_path, input_path, raw_path, predictions_path):
    plain = torch.load(export_path)  # the one standard call a Python user makes
    assert plain["format"] == lpe.FORMAT, plain.get("format")
    models, meta = lpe.load_members(export_path)
    x = np.loadtxt(input_path, delimiter=",", ndmin=2)
    raw = lpe.member_outputs(models, lpe.standardize(x, meta)).numpy()
    expected_raw = np.loadtxt(raw_path, delimiter=",", ndmin=2).reshape(len(models), x.shape[0], -1)
    ok = compare("raw member outputs", raw, expected_raw, TOLERANCE)
    result = lpe.predict(export_path, x)
    expected = np.loadtxt(predictions_path, delimiter=",", ndmin=2)
    half = expected.shape[1] // 2
    ok = compare("ensemble mean", result["mean"], expected[:, :half], TOLERANCE) and ok
    ok = compare("ensemble std", result["std"], expected[:, half:], TOLERANCE) and ok
    if not ok:
        return 1
    print(f"checked {len(models)} members")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
