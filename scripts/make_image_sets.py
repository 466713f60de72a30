#!/usr/bin/env python3
"""Rebuilds the two bundled array sets, data/optdigits/ and data/mnist1d/, as NumPy
.npy files: features float32 (N, C, H, W) or (N, C, L), labels int64 (N).

    python -m venv /tmp/image-sets && /tmp/image-sets/bin/pip install scikit-learn==1.9.1 mnist1d==0.0.2.post1
    /tmp/image-sets/bin/python scripts/make_image_sets.py [--out data]

optdigits: scikit-learn's copy of the UCI optical recognition of handwritten digits
test set (sklearn.datasets.load_digits, shipped inside the scikit-learn wheel, no
download): 1,797 8x8 images of 17 grey levels (0-16), labels 0-9, in the order
scikit-learn gives them. Written as features.npy (1797, 1, 8, 8) and labels.npy.

mnist1d: MNIST-1D (Greydanus 2020) regenerated offline by the `mnist1d` package's
own generator, mnist1d.data.make_dataset(get_dataset_args()): the ten templates are
constants in its source (get_templates), the default arguments give 5,000 sequences
of length 40, seed 42, and its first 80% (4,000) are the training split, the rest
(1,000) the test split, as in the paper. get_dataset() would first try to download
the original pickle; make_dataset() does not touch the network. Written as
train_features.npy (4000, 1, 40), train_labels.npy, test_features.npy (1000, 1, 40)
and test_labels.npy.

Prints each file's shape, dtype and per-class counts (the facts the data's README
and the reader's test state).
"""
import argparse
import os

import numpy as np


def save(out_dir, name, array):
    path = os.path.join(out_dir, name)
    np.save(path, array, allow_pickle=False)
    counts = ""
    if array.dtype == np.int64:
        counts = " counts " + " ".join(str(int(c)) for c in np.bincount(array, minlength=10))
    print(f"{path}: {array.dtype} {tuple(array.shape)}{counts}")


def make_optdigits(out_dir):
    from sklearn.datasets import load_digits

    digits = load_digits()
    features = digits.images.astype(np.float32).reshape(-1, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    assert features.shape == (1797, 1, 8, 8) and labels.shape == (1797,)
    assert np.array_equal(features.reshape(-1, 64), digits.data.astype(np.float32))
    os.makedirs(out_dir, exist_ok=True)
    save(out_dir, "features.npy", features)
    save(out_dir, "labels.npy", labels)


def make_mnist1d(out_dir):
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    data = make_dataset(args)  # no download: the templates are constants in the package (get_templates)
    os.makedirs(out_dir, exist_ok=True)
    for split, x, y in (("train", data["x"], data["y"]), ("test", data["x_test"], data["y_test"])):
        features = np.ascontiguousarray(x, dtype=np.float32)[:, None, :]
        labels = np.asarray(y, dtype=np.int64)
        save(out_dir, f"{split}_features.npy", features)
        save(out_dir, f"{split}_labels.npy", labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data"))
    args = parser.parse_args()
    make_optdigits(os.path.join(args.out, "optdigits"))
    make_mnist1d(os.path.join(args.out, "mnist1d"))


if __name__ == "__main__":
    main()
