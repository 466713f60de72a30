#!/usr/bin/env python3
"""Load a packtrain export (runtime/io/model_export.h) in plain PyTorch and predict.

The export is one file that ``torch.load(path)`` reads with its default
``weights_only=True``: a dict of plain containers and tensors, with each member's
``torch.nn.Sequential`` state_dict (format 1: MLP members, described by their
widths; format 2: convolutional members, described layer by layer as
``torch.nn.<type>(**args)``). This module rebuilds the members and applies
the standardization and the prediction head exactly as packtrain does.

As a module::

    from load_packtrain_export import load_members, predict
    models, meta = load_members("model.pt")   # list of torch.nn.Sequential (eval mode), metadata
    result = predict("model.pt", x)           # x: (B, I) numpy array in original units
                                              # (cnn members: also (B, C, H, W) or (B, C, L))
    result["mean"], result["std"]             # (B, T); classification: class probabilities (B, C)

From the command line, predictions as CSV on stdout::

    python load_packtrain_export.py EXPORT INPUT.csv > predictions.csv

INPUT.csv holds one example per row and the model's I features as columns, in
original units; a first row that is not numeric is taken as a header and skipped.
"""

import argparse
import csv
import sys

import numpy as np
import torch

FORMAT = "packtrain-export-1"  # MLP members: the architecture's widths, rebuilt by build_member
LAYERS_FORMAT = "packtrain-export-2"  # other members (cnn): their layers, rebuilt by build_layers
FORMATS = (FORMAT, LAYERS_FORMAT)

_ACTIVATIONS = {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "silu": torch.nn.SiLU, "tanh": torch.nn.Tanh}


def load_export(path):
    """The export's dict, tensors on the CPU; checks its format tag."""
    export = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(export, dict) or export.get("format") not in FORMATS:
        found = export.get("format") if isinstance(export, dict) else type(export).__name__
        raise ValueError(f"{path}: not a packtrain export (format {found!r}, expected one of {FORMATS!r})")
    return export


def build_member(arch, hidden=None):
    """An untrained member of this architecture, with the layer order (and so the
    state_dict names) of packtrain's make_standalone_mlp (ensemble/pack.cpp):
    Linear -> [LayerNorm] -> activation -> [Dropout], `depth` times, then Linear;
    `hidden` wide (a pack of different widths gives each member's), else arch's."""
    hidden = arch["hidden"] if hidden is None else hidden
    layers = []
    width = arch["in_features"]
    for _ in range(arch["depth"]):
        layers.append(torch.nn.Linear(width, hidden))
        if arch["layer_norm"]:
            layers.append(torch.nn.LayerNorm(hidden))
        layers.append(_ACTIVATIONS[arch["activation"]]())
        if arch["dropout"] > 0:
            layers.append(torch.nn.Dropout(arch["dropout"]))
        width = hidden
    layers.append(torch.nn.Linear(width, arch["out_features"]))
    return torch.nn.Sequential(*layers)


# The torch.nn layers a format-2 export may name (runtime/io/model_export.h).
_LAYERS = ("Unflatten", "Flatten", "Conv1d", "Conv2d", "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d",
           "GroupNorm", "LayerNorm", "Linear", "Dropout", "ReLU", "GELU", "SiLU", "Tanh")


def build_layers(layer_list):
    """An untrained member from its layer list in a format-2 export: torch.nn.Sequential of
    torch.nn.<type>(**args), in order, as packtrain's standalone member (for a cnn:
    Unflatten, Conv2d/Conv1d, [GroupNorm], ReLU, MaxPool/AvgPool, ..., Flatten, Linear)."""
    layers = []
    for layer in layer_list:
        if layer["type"] not in _LAYERS:
            raise ValueError(f"unknown layer {layer['type']!r} (this script knows {', '.join(_LAYERS)})")
        args = {key: tuple(value) if isinstance(value, list) else value for key, value in layer["args"].items()}
        layers.append(getattr(torch.nn, layer["type"])(**args))
    return torch.nn.Sequential(*layers)


def load_members(path):
    """(members, meta): each exported member as a torch.nn.Sequential in eval mode
    (its weights loaded with strict=True), and every other entry of the export."""
    export = load_export(path)
    models = []
    widths = export["architecture"].get("member_hidden") or [None] * len(export["members"])
    for state, hidden in zip(export["members"], widths):
        if export["format"] == LAYERS_FORMAT:
            model = build_layers(export["architecture"]["member_layers"][len(models)])
        else:
            model = build_member(export["architecture"], hidden)
        model.load_state_dict(state, strict=True)
        models.append(model.eval())
    meta = {key: value for key, value in export.items() if key != "members"}
    return models, meta


def standardize(x, meta):
    """x (B, I) in original units -> float32 model inputs (B, I). Members with a
    sample shape (cnn) also take samples of that shape, (B, C, H, W) or (B, C, L)."""
    x = torch.as_tensor(np.asarray(x, dtype=np.float64))
    shape = meta["architecture"].get("input_shape")
    if shape is not None and x.ndim == len(shape) + 1 and list(x.shape[1:]) == list(shape):
        x = x.reshape(x.shape[0], -1)  # the rows in the (C, H, W) order the members unflatten
    if x.ndim != 2 or x.shape[1] != meta["x_mean"].numel():
        raise ValueError(f"input must be (B, {meta['x_mean'].numel()}), got {tuple(x.shape)}")
    return ((x - meta["x_mean"]) / meta["x_std"]).to(torch.float32)


@torch.no_grad()
def member_outputs(models, z, precision="fp32"):
    """Raw outputs (K, B, O), float32, of the members on standardized inputs z (B, I),
    in the arithmetic they trained in: "bf16-mixed" under torch.autocast(bfloat16),
    as packtrain predicts (exports before it: "fp32")."""
    with torch.autocast(z.device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        return torch.stack([model(z).float() for model in models])


def apply_head(raw, meta):
    """Predictions from raw outputs (K, B, O), as float64 numpy arrays:
    member_means (K, B, T) and the ensemble's mean and std (B, T); the gaussian
    head adds member_variances; classification gives probabilities over C classes
    (member_means (K, B, C), mean and std across members (B, C)) and label (B)."""
    raw = raw.to(torch.float64)
    head = meta["head"]
    if head == "classification":
        probs = torch.softmax(raw, dim=-1)
        mean = probs.mean(0)
        classes = np.asarray(meta["classes"], dtype=np.float64)
        return {"member_means": probs.numpy(), "mean": mean.numpy(), "std": probs.std(0, unbiased=False).numpy(),
                "label": classes[mean.argmax(-1).numpy()]}
    y_mean, y_std = meta["y_mean"], meta["y_std"]
    # The ensemble's recalibration (absent in earlier exports: 1): the mixture
    # stretched about its mean by sqrt(s), as packtrain predicts.
    stretch = float(meta.get("variance_scale", 1.0)) ** 0.5

    def stretched(means):
        return means.mean(0) + stretch * (means - means.mean(0))

    if head == "mean":
        means = stretched(raw * y_std + y_mean)
        return {"member_means": means.numpy(), "mean": means.mean(0).numpy(),
                "std": means.std(0, unbiased=False).numpy()}
    if head == "gaussian":
        t = y_mean.numel()  # outputs: T means, then T raw variances
        means = stretched(raw[..., :t] * y_std + y_mean)
        variances = (torch.nn.functional.softplus(raw[..., t:]) + meta["min_variance"]) * y_std**2 * stretch**2
        mean = means.mean(0)
        # The equally weighted mixture of the members' Gaussians.
        variance = ((variances + means**2).mean(0) - mean**2).clamp_min(0)
        return {"member_means": means.numpy(), "member_variances": variances.numpy(), "mean": mean.numpy(),
                "std": variance.sqrt().numpy()}
    raise ValueError(f"unknown head {head!r} (expected mean, gaussian or classification)")


def predict(path, x):
    """Predictions of the exported members for x (B, I), a numpy array in original
    units; see apply_head for what the dict holds."""
    models, meta = load_members(path)
    return apply_head(member_outputs(models, standardize(x, meta), meta.get("precision", "fp32")), meta)


def read_input_csv(path):
    """(B, I) float64 array from a CSV file; a non-numeric first row is a header."""
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    if rows:
        try:
            [float(v) for v in rows[0]]
        except ValueError:
            rows = rows[1:]
    return np.array([[float(v) for v in row] for row in rows], dtype=np.float64).reshape(len(rows), -1)


def write_predictions_csv(result, meta, out):
    writer = csv.writer(out, lineterminator="\n")
    mean, std = result["mean"], result["std"]
    if meta["head"] == "classification":
        names = [f"{c:g}" for c in meta["classes"]]
        writer.writerow(["label"] + [f"p_{n}" for n in names])
        for label, p in zip(result["label"], mean):
            writer.writerow([f"{label:g}"] + [repr(float(v)) for v in p])
        return
    t = mean.shape[1]
    names = [""] if t == 1 else [f"_{j}" for j in range(t)]
    writer.writerow([f"mean{n}" for n in names] + [f"std{n}" for n in names])
    for m, s in zip(mean, std):
        writer.writerow([repr(float(v)) for v in m] + [repr(float(v)) for v in s])


def main(argv=None):
    parser = argparse.ArgumentParser(description="Predict with a packtrain export; prints CSV.")
    parser.add_argument("export", help="file written by packtrain's export_for_pytorch")
    parser.add_argument("input", help="CSV of inputs, one example per row, in original units")
    args = parser.parse_args(argv)
    models, meta = load_members(args.export)
    result = apply_head(member_outputs(models, standardize(read_input_csv(args.input), meta), meta.get("precision", "fp32")), meta)
    write_predictions_csv(result, meta, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
