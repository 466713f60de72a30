"""EnsembleRegressor and EnsembleClassifier: packed deep ensembles with scikit-learn's API.

Every option of `packtrain train` is a keyword argument with the CLI's default
(read from the C++ runtime itself, runtime::train_defaults: one source of defaults).
fit() does what the CLI does with its training rows: standardizes features (and
regression targets) on them, holds out `val_fraction` of them for validation
(seeded by `split_seed`, the same rows the CLI would hold out) unless validation
data are given, trains all members as one pack in batches of `batch_size` rows (all
of them when there are fewer), and stops early with `patience` (without validation
rows the default patience is off, as the CLI's is). lr, weight_decay and dropout
take lists, as the CLI's comma lists: several values sweep their cross product,
`members` seeds each, in one pack (`select="best"` keeps the best configuration).
"""
import inspect
import json
import math
import numbers
import os
import tempfile
import threading
import warnings

import numpy as np
import torch

from . import _core

# The trainer's options schema (runtime/trainers/ensemble/ensemble_trainer_options.cpp), the
# one the CLI's flags are generated from: each field's name, kind, default, range.
_SCHEMA = {f["name"]: f for f in json.loads(_core.option_schema()) if f["python"]}
# A list default (channels) as a tuple: scikit-learn wants immutable defaults.
_TRAINER_DEFAULTS = {name: tuple(f["default"]) if isinstance(f["default"], list) else f["default"]
                     for name, f in _SCHEMA.items()}
_TRAINER_DEFAULTS["device"] = "auto"   # the CLI's default: CUDA when there is one
_DATA_DEFAULTS = dict(_core.default_data_options())
_DATA_DEFAULTS["select"] = "all"  # train --select: a sweep keeps all configurations, or the best
_OPTION_NAMES = tuple(_TRAINER_DEFAULTS)
_SWEPT = tuple(name for name, f in _SCHEMA.items() if f["sweep"])  # lists sweep them, as the CLI's comma lists
# acquire()'s defaults: `packtrain acquire`'s, from its options schema (runtime/trainers/uncertainty/acquisition.h);
# the strategy's depends on the head (None: epistemic for a regressor, bald for a classifier).
_ACQUISITION_DEFAULTS = {f["name"]: f["default"] for f in json.loads(_core.acquisition_option_schema())}

# What the C++ integer types hold (int64; the seeds are unsigned 64-bit).
_INT64_MAX, _UINT64_MAX = 2**63 - 1, 2**64 - 1
_DATA_INTEGER_RANGES = {"split_seed": (0, _UINT64_MAX)}


def _integer_range(field):
    """An integer field's [low, high]: its schema bound up to what its C++ type holds."""
    low = 0 if field["kind"] == "unsigned" else -_INT64_MAX - 1
    if "min" in field:
        low = math.floor(field["min"]) + 1 if field.get("min_open") else math.ceil(field["min"])
    return low, _UINT64_MAX if field["kind"] == "unsigned" else _INT64_MAX


def _checked_integer(name, value, low, high):
    """value as an int when it is an integer in [low, high]: TypeError for another
    type (2.5, True), ValueError outside the range, either stating the range."""
    rule = f"{name} must be an integer from {low} to {high}, got {value!r}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(rule)
    if not low <= int(value) <= high:
        raise ValueError(rule)
    return int(value)


def _checked_number(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _checked_option(name, value, default):
    """A data option's value checked against its default's type."""
    if isinstance(default, int) and not isinstance(default, bool):
        return _checked_integer(name, value, *_DATA_INTEGER_RANGES.get(name, (-_INT64_MAX - 1, _INT64_MAX)))
    return _checked_number(name, value)


def _swept_list(name, value, check):
    """A swept option's list of values (the CLI's comma list), each checked by check(name, v)."""
    values = np.asarray(value, dtype=object).reshape(-1) if isinstance(value, np.ndarray) else value
    if len(values) == 0:
        raise ValueError(f"{name}: an empty list; give one value, or several to sweep them")
    return [check(f"{name}[{i}]", v) for i, v in enumerate(values)]


def _checked_trainer_option(name, value):
    """A trainer option's value checked against its schema field's kind (the C++
    option's): what crosses into the runtime as JSON, whose own checks then give the rest."""
    field = _SCHEMA[name]
    kind = field["kind"]
    if name == "device":
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {value!r}")
        return value
    if kind == "flag":
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {value!r}")
        return bool(value)
    if kind in ("integer", "unsigned"):
        if value is None and field["optional"]:
            return None  # unset: the run picks (see the parameter's doc)
        if name in _SWEPT and isinstance(value, (list, tuple, np.ndarray)):  # hidden=[32, 64]: widths in one pack
            return _swept_list(name, value, lambda n, v: _checked_integer(n, v, *_integer_range(field)))
        return _checked_integer(name, value, *_integer_range(field))
    if kind == "integers":
        values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
        if not values:
            raise TypeError(f"{name} must be a non-empty list of integers, got {value!r}")
        if name in _SWEPT and all(isinstance(v, (list, tuple, np.ndarray)) for v in values):
            # channels=[[8, 16], [16, 32]]: members of each list in one pack (the CLI's 8,16/16,32)
            lists = []
            for i, v in enumerate(values):
                if len(v) == 0:
                    raise TypeError(f"{name}[{i}] must be a non-empty list of integers, got {v!r}")
                lists.append([_checked_integer(f"{name}[{i}][{j}]", c, 1, _INT64_MAX) for j, c in enumerate(v)])
            return lists
        return [_checked_integer(f"{name}[{i}]", v, 1, _INT64_MAX) for i, v in enumerate(values)]
    if kind == "number":
        if name in _SWEPT and isinstance(value, (list, tuple, np.ndarray)):
            return _swept_list(name, value, _checked_number)
        return _checked_number(name, value)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {value!r}")
    if "choices" in field and value not in field["choices"]:
        raise ValueError(f"{name} must be one of {', '.join(field['choices'])}, got {value!r}")
    return value


def _is_sweep(params):
    """Whether the checked parameters sweep: a swept number with several values, or
    several channel lists (a list of lists; one list of integers is one network)."""
    def several(name):
        value = params[name]
        if not isinstance(value, list) or len(value) < 2:
            return False
        return _SCHEMA[name]["kind"] != "integers" or isinstance(value[0], list)
    return any(several(n) for n in _SWEPT)


class _ParamsProtocol:
    """scikit-learn's parameter protocol (get_params, set_params; clone() uses them),
    for when scikit-learn is not installed: the package needs only torch and numpy."""

    @classmethod
    def _get_param_names(cls):
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def get_params(self, deep=True):
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params):
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}; valid: {', '.join(valid)}")
            setattr(self, name, value)
        return self

    def __repr__(self):
        defaults = {n: p.default for n, p in inspect.signature(type(self).__init__).parameters.items() if n != "self"}
        changed = {k: v for k, v in self.get_params().items() if v != defaults[k]}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


try:  # with scikit-learn: its own base classes (tags, repr, check_estimator)
    from sklearn.base import BaseEstimator as _Base, ClassifierMixin as _ClassifierMixin, RegressorMixin as _RegressorMixin
    from sklearn.exceptions import DataConversionWarning as _DataConversionWarning, NotFittedError
    from sklearn.utils import check_array as _check_array
    from sklearn.utils.multiclass import check_classification_targets as _check_classification_targets
except ImportError:  # pragma: no cover - exercised by the no-scikit-learn test
    _Base = _ParamsProtocol

    class _ClassifierMixin:
        _estimator_type = "classifier"

    class _RegressorMixin:
        _estimator_type = "regressor"
    _check_array = _check_classification_targets = _DataConversionWarning = None

    class NotFittedError(ValueError, AttributeError):
        """predict() before fit() (scikit-learn's exception when it is installed)."""


def _resolve_device(name):
    if name == "auto":
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return name


def _column_vector_note(what):
    """scikit-learn's warning for a (N, 1) target, which is read as (N)."""
    if _DataConversionWarning is not None:
        warnings.warn(f"A column-vector {what} was passed when a 1d array was expected; it is read as one value "
                      "per row", _DataConversionWarning, stacklevel=4)


def _check_folder_of(path):
    """FileNotFoundError naming the folder a save would write into when it does not
    exist (the C++ save would name its temporary file)."""
    folder = os.path.dirname(os.fspath(path)) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{os.fspath(path)}: the folder {folder} does not exist")


def _is_complex(a):
    try:
        return bool(np.iscomplexobj(a))
    except (TypeError, ValueError):
        return False  # _as_tensor's conversion says what is wrong with it


def _as_tensor(a, what, dims):
    """float64 CPU tensor of `dims` dimensions from a numpy array, a torch tensor
    (any device) or anything numpy accepts (a DataFrame, a list)."""
    if hasattr(a, "toarray") or getattr(a, "layout", torch.strided) != torch.strided:
        raise TypeError(f"{what}: sparse input is not supported; pass a dense array")
    if isinstance(a, torch.Tensor):
        if a.is_complex():
            raise ValueError(f"{what}: complex data not supported")
        t = a.detach().to("cpu", torch.float64)
    elif _is_complex(a):  # before scikit-learn, whose message dumps the whole array (its words kept)
        raise ValueError(f"Complex data not supported: {what} is complex (pass its real part, or the real and "
                         "imaginary parts as columns)")
    elif _check_array is not None:  # scikit-learn's checks and messages
        t = torch.from_numpy(_check_array(a, dtype=np.float64, ensure_2d=dims == 2, allow_nd=dims > 2,
                                          ensure_all_finite=True, input_name=what, copy=True))
    else:
        array = np.asarray(a)
        if np.iscomplexobj(array):
            raise ValueError(f"{what}: complex data not supported")
        try:
            t = torch.from_numpy(np.array(array, dtype=np.float64))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what}: not numeric ({e})") from None
    if dims == 1 and t.dim() == 2 and t.shape[1] == 1:
        _column_vector_note(what)
        t = t[:, 0]
    if t.dim() != dims:
        raise ValueError(f"{what} must be {dims}-dimensional, got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{what} has 0 sample(s) (shape {tuple(t.shape)}): at least one row is needed")
    if dims == 2 and t.shape[1] == 0:
        raise ValueError(f"{what} has 0 feature(s) (shape {tuple(t.shape)}): at least one column is needed")
    if not torch.isfinite(t).all():
        raise ValueError(f"{what} contains NaN or infinity")
    return t.contiguous()


def _as_rows(a, what):
    """(rows, sample_shape): a table (N, I) as it is, or images (N, C, H, W) and
    sequences (N, C, L) as rows (N, C*H*W) with the shape of one sample, which
    architecture="cnn" takes its convolutions over (None for a table)."""
    if isinstance(a, torch.Tensor):
        ndim = a.dim()
    else:  # an object's own ndim, or its array's (not np.ndim: array-likes may refuse numpy's functions)
        ndim = getattr(a, "ndim", None)
        if ndim is None:
            try:
                ndim = np.asarray(a).ndim
            except (TypeError, ValueError):
                ndim = 2  # _as_tensor says what is wrong with it
    if ndim is not None and ndim > 4:
        raise ValueError(f"{what} has {ndim} dimensions: rows are (N, features), sequences (N, C, L) and images "
                         "(N, C, H, W)")
    if ndim in (3, 4):
        t = _as_tensor(a, what, ndim)
        if any(d == 0 for d in t.shape[1:]):
            raise ValueError(f"{what} has an empty sample shape {tuple(t.shape[1:])}")
        return t.reshape(t.shape[0], -1).contiguous(), [int(d) for d in t.shape[1:]]
    return _as_tensor(a, what, 2), None


def _like(result, reference):
    """`result` (a CPU tensor) as the caller gave their input: a torch tensor on the
    input's device for tensor input, else a numpy array."""
    if isinstance(reference, torch.Tensor):
        return result.to(reference.device)
    return result.numpy()


def _feature_names(X, n):
    columns = getattr(X, "columns", None)
    if columns is not None and len(columns) == n:
        return [str(c) for c in columns]
    return [f"x{i}" for i in range(n)]


class _PackedEnsemble(_Base):
    """What the two estimators share: options, fitting, predicting, saving."""

    _head = None  # fixed by the subclass, or a parameter
    _options_json = None  # the trainer's options at the last fit

    def __init__(self, **params):
        for name, value in params.items():
            setattr(self, name, value)

    def _trainer_options(self):
        """The trainer's options from the parameters, each checked. The runtime picks
        what depends on the run (patience=None: 50 with validation rows, off
        without; a patience > 0 without them is its ValueError)."""
        names = self._get_param_names()
        options = {name: _checked_trainer_option(name, getattr(self, name)) for name in _OPTION_NAMES if name in names}
        options["device"] = _resolve_device(self.device)
        if self._head is not None:
            options["head"] = self._head
        return options

    def _carve(self, t, train_rows, val_rows):
        """The training and validation rows of a fit (the CLI's carve)."""
        return train_rows, val_rows

    def _not_in_callback(self, what):
        if getattr(self, "_in_training", False):
            if getattr(self, "_training_thread", None) != threading.get_ident():
                raise RuntimeError(f"{what}: this estimator is fitting in another thread; an estimator runs one "
                                   "fit at a time (give each thread its own: sklearn.base.clone(estimator))")
            raise RuntimeError(f"{what} cannot be called from a fit callback: return False from the callback to "
                               f"stop training, then call {what}")

    def _targets(self, y, what):
        return _as_tensor(y, what, 1).reshape(-1, 1)

    def fit(self, X, y, X_val=None, y_val=None, callback=None):
        """Trains every member on (X, y). Validation: (X_val, y_val) when given, else
        `val_fraction` of the rows held out as the CLI does (0: none). `callback`,
        if given, is called after every epoch with a dict (epoch, epochs, steps,
        train_loss, val_loss, active, member_train_loss, member_val_loss, events);
        returning False stops training after that epoch. Ctrl-C does the same and
        then raises KeyboardInterrupt (the model is usable)."""
        self._not_in_callback("fit()")
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        for name in ("val_fraction", "split_seed"):
            _checked_option(name, getattr(self, name), _DATA_DEFAULTS[name])
        if self.select not in ("all", "best"):
            raise ValueError(f"select must be 'all' or 'best', got {self.select!r}")
        x, shape = _as_rows(X, "X")
        t = self._targets(y, "y")
        if t.shape[0] != x.shape[0]:
            raise ValueError(f"X has {x.shape[0]} rows but y has {t.shape[0]}")
        if (X_val is None) != (y_val is None):
            raise ValueError("give both X_val and y_val, or neither")
        if X_val is not None:
            (vx, val_shape), vt = _as_rows(X_val, "X_val"), self._targets(y_val, "y_val")
            if vx.shape[1] != x.shape[1] or val_shape != shape:
                raise ValueError(f"X_val's samples are shaped {val_shape or vx.shape[1]}, X's {shape or x.shape[1]}")
        elif self.val_fraction > 0:
            if x.shape[0] < 2:
                raise ValueError(f"{x.shape[0]} sample(s): too few to hold out val_fraction={self.val_fraction} "
                                 "of them for validation (val_fraction=0 trains on all)")
            train_rows, val_rows = _core.carve_validation(x.shape[0], float(self.val_fraction), int(self.split_seed))
            train_rows, val_rows = self._carve(t, train_rows, val_rows)
            train_rows, val_rows = torch.tensor(train_rows, dtype=torch.long), torch.tensor(val_rows, dtype=torch.long)
            x, t, vx, vt = x[train_rows], t[train_rows], x[val_rows], t[val_rows]
            if vx.shape[0] == 0:
                vx = vt = None
        else:
            vx = vt = None
        params = self._trainer_options()
        if shape is not None:
            params["input_shape"] = shape  # what a cnn's convolutions run over
        if self.select == "best" and vx is None:
            raise ValueError("select='best' chooses on validation rows: give val_fraction > 0, or X_val and y_val")
        # Refused before anything large is allocated, as `packtrain train` refuses it.
        classes = int(torch.unique(t).numel()) if self._head == "classification" else 0
        options = json.dumps(params, sort_keys=True)
        _core.check_fit_memory(options, x.shape[0], x.shape[1], classes, 0 if vx is None else vx.shape[0])
        # Fitted before with the same options: the same trainer, whose steps (and
        # captured graphs) prepare() keeps when the data have the same shapes; every
        # member starts again from the seed either way.
        if not (isinstance(getattr(self, "_trainer", None), _core.Trainer) and self._options_json == options):
            self._trainer = _core.Trainer(options)
        self._options_json = options
        self._sweep = _is_sweep(params)
        self._validation = (vx, vt)
        self._trainer.prepare(x, t, vx, vt)
        self.n_features_in_ = x.shape[1]
        self.sample_shape_ = shape
        self.feature_names_in_ = np.asarray(_feature_names(X, x.shape[1]), dtype=object)
        self._target_name = getattr(y, "name", None) or "y"
        self._train(callback)
        return self

    def _train(self, callback):
        self._training_thread = threading.get_ident()
        self._in_training = True
        try:
            self._trainer.train(callback)
        finally:
            self._in_training = False
        if getattr(self, "_sweep", False):
            # Each configuration scored on the validation rows, as `train` reports a sweep.
            vx, vt = getattr(self, "_validation", (None, None))
            self.configurations_ = self._trainer.sweep(vx, vt, self.select == "best")
        self.history_ = {"train_loss": list(self._trainer.train_loss_history),
                         "val_loss": list(self._trainer.val_loss_history)}
        self.member_status_ = list(self._trainer.member_status)

    def reinitialize(self, seed=None):
        """Every member re-initialized in place (weights, optimizer state, early
        stopping), from `seed` (default: the `seed` option), ready to train again on
        the same data with continue_fit()."""
        self._not_in_callback("reinitialize()")
        self._check_fitted()
        self._trainer.reinitialize(_checked_integer("seed", self.seed if seed is None else seed, 0, _UINT64_MAX))
        return self

    def continue_fit(self, callback=None):
        """Runs the remaining epochs (after reinitialize(): all of them) on the data
        of the last fit(), reusing its steps."""
        self._not_in_callback("continue_fit()")
        self._check_fitted()
        self._train(callback)
        return self

    def _check_fitted(self):
        if getattr(self, "_trainer", None) is None:
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet: call fit(X, y) first")

    # Pickling (copy, joblib, multiprocessing): the trainer travels as its checkpoint.
    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_validation", None)  # the last fit's validation rows: for continue_fit's sweep report only
        trainer = state.pop("_trainer", None)
        if trainer is not None:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "model.pt")
                trainer.save(path, list(self.feature_names_in_), self._target_name)
                with open(path, "rb") as f:
                    state["_checkpoint"] = f.read()
        return state

    def __setstate__(self, state):
        checkpoint = state.pop("_checkpoint", None)
        self.__dict__.update(state)
        if checkpoint is not None:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "model.pt")
                with open(path, "wb") as f:
                    f.write(checkpoint)
                self._trainer = _core.load(path, _resolve_device(self.device))

    def _features(self, X):
        self._check_fitted()
        x, shape = _as_rows(X, "X")
        expected = getattr(self, "sample_shape_", None)
        if shape is not None and shape != expected:
            raise ValueError(f"X's samples are shaped {tuple(shape)}, but {type(self).__name__} was fitted on "
                             f"{'rows' if expected is None else 'samples shaped ' + str(tuple(expected))}")
        if x.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {x.shape[1]} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input")
        return x

    def _predict(self, X):
        x = self._features(X)  # checks fitted first
        return self._trainer.predict(x)

    def evaluate(self, X, y, levels=(0.5, 0.9, 0.95)):
        """Every metric `packtrain evaluate` prints, as a dict: "members" (per member:
        rmse and nll, or accuracy and nll), "ensemble", and "calibration" — for a
        regressor RMSE, mixture_nll, gaussian_nll (the moment-matched Gaussian's, what
        deep-ensemble papers report), crps, intervals (coverage and mean_width at
        `levels`), the calibration curve (expected, observed) and
        miscalibration_area; for a classifier accuracy, nll, brier, ece over 15
        equal-width bins and the bins themselves; "summary" says it in words."""
        self._check_fitted()
        if isinstance(self._trainer, _core.ShardedEnsemble):
            raise TypeError("a model loaded from a member-parallel manifest predicts only: evaluate it with "
                            "`packtrain evaluate MANIFEST TABLE`")
        x = self._features(X)
        t = self._targets(y, "y")
        if t.shape[0] != x.shape[0]:
            raise ValueError(f"X has {x.shape[0]} rows but y has {t.shape[0]}: give one target per row")
        return self._trainer.evaluate(x, t, [float(v) for v in levels])

    def acquire(self, X_pool, count=10, strategy=None, selection=_ACQUISITION_DEFAULTS["selection"],
                power=_ACQUISITION_DEFAULTS["power"], seed=_ACQUISITION_DEFAULTS["seed"],
                ucb_beta=_ACQUISITION_DEFAULTS["ucb_beta"]):
        """Which rows of an unlabelled pool to label next, as `packtrain acquire` picks
        them: (indices, scores), the `count` chosen rows' positions in X_pool in the
        order chosen and every row's score (higher: more worth a label). strategy:
        regressor epistemic (default), variance, ucb; classifier bald (default),
        entropy, margin, variation-ratio, batchbald; random for either. selection "top", or
        "power"/"softmax" to draw the batch with probability ~ score**power or
        exp(power * score), seeded. batchbald (Kirsch et al., 2019) picks greedily the
        rows that most raise the batch's joint mutual information with the member
        (selection "top" only; its scores are BALD's, the batch is not their top)."""
        seed = _checked_integer("seed", seed, 0, _UINT64_MAX)
        count = _checked_integer("count", count, 1, _INT64_MAX)
        ucb_beta, power = _checked_number("ucb_beta", ucb_beta), _checked_number("power", power)
        p = self._predict(X_pool)
        if strategy is None:
            strategy = "bald" if "member_probabilities" in p else "epistemic"
        scores = _core.acquisition_scores(p, strategy, ucb_beta, seed)
        if strategy == "batchbald":
            if selection != "top":
                raise ValueError(f"batchbald chooses its batch greedily, not by sampling: selection must be 'top', "
                                 f"got {selection!r}")
            members = p["member_probabilities"][list(p.get("included", range(len(p["member_probabilities"]))))]
            chosen, _ = _core.batchbald_select(members, count, seed=seed)
        else:
            chosen = _core.select_batch(scores, count, selection, power, seed)
        return np.asarray(chosen, dtype=np.int64), _like(scores, X_pool)

    def save(self, path):
        """Writes a checkpoint the CLI reads (`packtrain predict/evaluate/resume`)."""
        self._check_fitted()
        _check_folder_of(path)
        if isinstance(self._trainer, _core.ShardedEnsemble):
            raise TypeError("a model loaded from a member-parallel manifest predicts only: its shards stay the "
                            "checkpoint (packtrain resume MANIFEST continues it)")
        self._trainer.save(str(path), list(self.feature_names_in_), self._target_name)

    @property
    def epochs_done_(self):
        self._check_fitted()
        return self._trainer.epoch

    @property
    def variance_scale_(self):
        """The factor by which recalibration (recalibration="variance", the default,
        with validation rows) multiplied the predictive variance: fitted on the
        validation rows once training finished; 1.0 when none was fitted."""
        self._check_fitted()
        return float(getattr(self._trainer, "variance_scale", 1.0))


def _signature(cls, extra):
    """cls.__init__ with one keyword argument per option, the CLI's defaults."""
    names = [n for n in _OPTION_NAMES if n not in extra.get("omit", ())]
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name in names:
        default = extra.get("defaults", {}).get(name, _TRAINER_DEFAULTS[name])
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
    for name, default in _DATA_DEFAULTS.items():
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
    signature = inspect.Signature(params)

    def __init__(self, **kwargs):
        bound = signature.bind(self, **kwargs)
        bound.apply_defaults()
        _PackedEnsemble.__init__(self, **{k: v for k, v in bound.arguments.items() if k != "self"})

    __init__.__signature__ = signature
    cls.__init__ = __init__
    return cls


class EnsembleRegressor(_RegressorMixin, _PackedEnsemble):
    """A deep ensemble regressor: `members` MLPs trained as one pack. head="gaussian"
    (the default) predicts a mean and a variance per member (deep ensembles);
    head="mean" a mean only (MSE)."""

    def fit(self, X, y, X_val=None, y_val=None, callback=None):
        if self.head not in ("gaussian", "mean"):
            raise ValueError(f"EnsembleRegressor: head must be 'gaussian' or 'mean', got {self.head!r}")
        return super().fit(X, y, X_val, y_val, callback)

    def predict(self, X, return_std=False):
        """The ensemble's mean (N); with return_std, also its standard deviation (N):
        the mixture's, members' own variances included (Gaussian head)."""
        p = self._predict(X)
        mean = _like(p["mean"], X)
        if not return_std:
            return mean
        return mean, _like(p["variance"].sqrt(), X)

    def predict_uncertainty(self, X, levels=(0.9,)):
        """The ensemble's prediction with its uncertainty split, per row (N): "mean",
        "std" (total), "aleatoric_std" (the noise the members predict; 0 with the
        mean head) and "epistemic_std" (their disagreement), std**2 = aleatoric_std**2
        + epistemic_std**2; and "intervals": {level: (lower, upper)}, the central
        intervals of the members' mixture itself (its quantiles), as `packtrain
        predict --interval` writes them."""
        p = self._predict(X)
        d = _core.decompose(p)
        out = {"mean": _like(d["mean"], X), "std": _like(d["total_std"], X),
               "aleatoric_std": _like(d["aleatoric_std"], X), "epistemic_std": _like(d["epistemic_std"], X)}
        out["intervals"] = {level: (_like(lower, X), _like(upper, X))
                            for level, lower, upper in _core.central_intervals(p, [float(v) for v in levels])}
        return out

    def predict_members(self, X):
        """Each member's predicted means (K, N) and, with the Gaussian head,
        variances (K, N); (means, None) with the mean head. After recalibration
        (variance_scale_ != 1) the members are the recalibrated ones: means
        stretched about the ensemble mean by sqrt(variance_scale_), variances
        times it — their mixture is what predict() describes."""
        p = self._predict(X)
        variance = p.get("member_variance")
        return _like(p["member_mean"], X), None if variance is None else _like(variance, X)

    def score(self, X, y):
        """R^2 of the ensemble mean (scikit-learn's regressor score)."""
        target = _as_tensor(y, "y", 1).numpy()
        mean = np.asarray(_like(self._predict(X)["mean"], None))
        residual = np.sum((target - mean) ** 2)
        total = np.sum((target - target.mean()) ** 2)
        return float(1 - residual / total) if total > 0 else (1.0 if residual == 0 else 0.0)


_signature(EnsembleRegressor, {})


class EnsembleClassifier(_ClassifierMixin, _PackedEnsemble):
    """A deep ensemble classifier: `members` MLPs trained as one pack with
    cross-entropy; labels are any numbers (as the CLI reads a target column)."""

    _head = "classification"

    def _targets(self, y, what):
        labels = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
        if labels.ndim == 2 and labels.shape[1] == 1:
            _column_vector_note(what)
            labels = labels[:, 0]
        if labels.ndim != 1:
            raise ValueError(f"{what} must be 1-dimensional (one label per row), got shape {labels.shape}")
        if _check_classification_targets is not None:
            _check_classification_targets(labels)
        if self._label_values is None:  # numbers: the trainer's classes are the labels, as the CLI reads them
            t = _as_tensor(labels, what, 1)
            if not torch.equal(t, t.round()):
                raise ValueError(f"{what}: numeric class labels must be whole numbers")
            return t.reshape(-1, 1)
        index = np.searchsorted(self._label_values, labels)
        index = np.minimum(index, len(self._label_values) - 1)
        unknown = self._label_values[index] != labels
        if unknown.any():
            raise ValueError(f"{what}: label {labels[unknown][0]!r} is not among the training labels")
        return torch.from_numpy(index.astype(np.float64)).reshape(-1, 1)

    def fit(self, X, y, X_val=None, y_val=None, callback=None):
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        labels = np.asarray(y.detach().cpu() if isinstance(y, torch.Tensor) else y)
        numeric = labels.dtype.kind in "biuf"
        values = np.unique(labels)
        if len(values) < 2:
            raise ValueError(f"y has only one class ({values[0] if len(values) else 'none'}): a classifier needs "
                             "at least 2 classes")
        self._label_values = None if numeric else values  # other labels (strings) train as their indices
        super().fit(X, y, X_val, y_val, callback)
        self.classes_ = values if not numeric else np.asarray(self._trainer.classes)
        return self

    _label_values = None

    def _carve(self, t, train_rows, val_rows):
        """The CLI's carve, except that the rows of a class the carve left with no
        training row stay in training (a class the trainer never sees cannot be
        validated): rare labels are trained on, not only validated."""
        labels = t.reshape(-1).numpy()
        unseen = np.setdiff1d(labels[val_rows], labels[train_rows])
        if len(unseen) == 0:
            return train_rows, val_rows
        back = np.isin(labels[val_rows], unseen)
        return sorted(list(train_rows) + list(np.asarray(val_rows)[back])), list(np.asarray(val_rows)[~back])

    def predict(self, X):
        """The class (one of classes_) with the highest mixture probability (N)."""
        predicted = self._predict(X)["predicted"]
        if self._label_values is not None:
            return self._label_values[predicted.numpy().astype(np.int64)]
        return _like(predicted, X)

    def predict_proba(self, X):
        """The mixture's class probabilities (N, C), columns in the order of classes_."""
        return _like(self._predict(X)["probabilities"], X)

    def predict_uncertainty(self, X):
        """The ensemble's uncertainty per row (N), in nats: "entropy" of the mixture's
        class probabilities = "aleatoric_entropy" (the members' mean entropy) +
        "mutual_information" (their disagreement: BALD's score)."""
        d = _core.decompose(self._predict(X))
        return {k: _like(v, X) for k, v in d.items()}

    def predict_member_proba(self, X):
        """Each member's class probabilities as (N, C, K): the layout baal's
        heuristics (BALD, ...) take."""
        return _like(self._predict(X)["member_probabilities"].permute(1, 2, 0).contiguous(), X)

    def score(self, X, y):
        """Accuracy of predict(X)."""
        predicted = self.predict(X)
        predicted = predicted.cpu().numpy() if isinstance(predicted, torch.Tensor) else predicted
        target = np.asarray(y.detach().cpu() if isinstance(y, torch.Tensor) else y).reshape(-1)
        return float(np.mean(predicted == target))


_signature(EnsembleClassifier, {"omit": ("head", "min_variance", "recalibration")})


def load(path, device="cpu"):
    """A fitted estimator from a checkpoint written by the CLI (`train --checkpoint`)
    or by save(), or from a member-parallel run's manifest (every shard checked
    against it and loaded here, whatever number of ranks trained it; such a model
    predicts but cannot be saved or trained further from Python)."""
    loaded = _core.load(str(path), _resolve_device(device))
    options = json.loads(loaded.options_json)
    # The estimator's parameters are the scalar options a refit would use; a CLI
    # sweep's per-member values (not parameters) stay with the loaded trainer, which
    # predicts as trained.
    cls = EnsembleClassifier if options["head"] == "classification" else EnsembleRegressor
    model = cls(**{name: options[name] for name in cls._get_param_names() if name in options and name != "device"},
                device=device)
    if cls is EnsembleClassifier:
        model.classes_ = np.asarray(loaded.classes)
    if isinstance(loaded, _core.ShardedEnsemble):
        model.members = loaded.members
    model._trainer = loaded
    model.n_features_in_ = loaded.in_features
    model.sample_shape_ = options.get("input_shape") or None
    model.feature_names_in_ = np.asarray([f"x{i}" for i in range(loaded.in_features)], dtype=object)
    model._target_name = "y"
    return model


def resume(checkpoint, X=None, y=None, X_val=None, y_val=None, epochs=None, device="auto", callback=None):
    """Continues a run from its checkpoint exactly as if it had not stopped, and
    returns the fitted estimator (`packtrain resume` from Python).

    A checkpoint of `packtrain train --checkpoint` (or a member-parallel manifest,
    resumed whole here) reloads its own data and checks they are the rows it was
    trained on. A checkpoint of an estimator's save() holds no rows: give X and y
    (and X_val, y_val) as the trainer saw them — fit(X, y, X_val, y_val), or
    fit(X, y) with val_fraction=0 — checked against the checkpoint. `epochs`: train
    until this many epochs in all (default: the run's own); `callback` as in fit()."""
    path = os.fspath(checkpoint)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint (write one with `packtrain train --checkpoint` or an "
                                "estimator's save())")
    epochs = 0 if epochs is None else _checked_integer("epochs", epochs, 1, 2**63 - 1)
    if (X is None) != (y is None) or (X_val is None) != (y_val is None):
        raise ValueError("give both X and y (and both X_val and y_val), or neither")
    rows = {}
    if X is not None:  # as the regressor's fit() and a classifier's of numeric labels pass them
        # Images and sequences as the rows fit() gave the trainer (the checkpoint keeps their shape).
        rows = {"x": _as_rows(X, "X")[0], "y": _as_tensor(y, "y", 1).reshape(-1, 1)}
        if X_val is not None:
            rows.update(val_x=_as_rows(X_val, "X_val")[0], val_y=_as_tensor(y_val, "y_val", 1).reshape(-1, 1))
    trainer, feature_names, target_name = _core.resume(path, _resolve_device(device), epochs, **rows)
    model = load(path, device)  # the estimator of the run's options and classes, around the model as saved
    if isinstance(model, EnsembleClassifier):
        model._label_values = None  # numeric labels, as the trainer's classes
    model.members, model.epochs = (json.loads(trainer.options_json)[k] for k in ("members", "epochs"))
    model._trainer = trainer
    model.feature_names_in_ = np.asarray(feature_names, dtype=object)
    model._target_name = target_name or "y"
    model._train(callback)
    return model
