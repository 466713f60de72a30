"""The data sets the CLI reads — the nine bundled UCI sets (concrete,
energy, yacht, wine-quality-red, bostonHousing, kin8nm, naval-propulsion-plant,
power-plant, protein-tertiary-structure), the array sets optdigits and mnist1d (images and
sequences, flattened to rows), UCI-format and array (.npy) directories, CSV/TSV tables — split as
the CLI splits them (C++: runtime/data), for the estimators and the examples."""
from collections import namedtuple

from . import _core

Split = namedtuple("Split", "X_train y_train X_test y_test feature_names target_name description")


def load_dataset(data="concrete", split=0, test_fraction=0.2, split_seed=0):
    """A data set's training and test rows as numpy arrays (training rows in table
    order: fit() then holds out the validation rows `packtrain train` would).
    UCI sets use their standard split `split`; tables hold out `test_fraction`."""
    d = _core.load_data(str(data), int(split), float(test_fraction), int(split_seed))
    return Split(d["x_train"].numpy(), d["y_train"].numpy(), d["x_test"].numpy(), d["y_test"].numpy(),
                 list(d["feature_names"]), d["target_name"], d["description"])
