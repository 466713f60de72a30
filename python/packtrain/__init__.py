"""packtrain: train many small models as one, from Python.

K models of one shape are stacked into batched weight tensors and trained as one
vectorized model by packtrain's C++ runtime (a captured CUDA Graph step on a GPU,
a fused member-wise step on a CPU). The estimators follow scikit-learn's API:

    import packtrain
    model = packtrain.EnsembleRegressor(members=16, epochs=200).fit(X, y)
    mean, std = model.predict(X_test, return_std=True)

Options and defaults are the command-line tool's (`packtrain train --help`).
"""
import os
from pathlib import Path

import torch  # loads LibTorch's libraries before the extension module needs them

from . import _build_info

_installed = torch.__version__.split("+")[0]
if _installed != _build_info.TORCH_VERSION:
    raise ImportError(
        f"packtrain was built against torch {_build_info.TORCH_VERSION} but this environment has torch "
        f"{torch.__version__}: install torch=={_build_info.TORCH_VERSION}, or rebuild packtrain here "
        f"(pip install --no-build-isolation --force-reinstall <packtrain checkout>)")

# An installed package carries the bundled data sets beside its modules.
if (Path(__file__).parent / "data").is_dir():
    os.environ.setdefault("PACKTRAIN_DATA_DIR", str(Path(__file__).parent / "data"))

from . import _core  # noqa: E402
from .datasets import load_dataset  # noqa: E402
from .estimators import EnsembleClassifier, EnsembleRegressor, load, resume  # noqa: E402
from .multitask import MultiTaskModel, resume_multitask  # noqa: E402

__version__ = _build_info.PACKTRAIN_VERSION
__all__ = ["EnsembleRegressor", "EnsembleClassifier", "MultiTaskModel", "load", "load_dataset", "resume", "resume_multitask",
           "__version__"]
