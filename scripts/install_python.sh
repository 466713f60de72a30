#!/usr/bin/env bash
# Installs the Python package (import packtrain) into the project's environment —
# the cached virtual environment with torch 2.11.0 that scripts/setup.sh made — from
# the package the main build assembled in build/python/packtrain (its extension module
# links build/'s libraries), compiling nothing a second time: a .pth file puts
# build/python on the environment's path and a dist-info records it for pip (`pip
# list` shows it as editable, `pip uninstall packtrain` removes it), as an editable
# install does. A later rebuild of build/ is what the next `import packtrain` loads.
# If build/ lacks the module it builds that target there (seconds when built).
# Then checks that the package imports, finds its data and trains outside the checkout.
#
# Into another environment with torch==2.11.0, or from a clone without the main build:
#   pip install --no-build-isolation .
# which compiles the runtime again for the wheel, in build/wheel (about 12 minutes on
# a 2-core machine), and installs a copy.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
cache="${PACKTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/packtrain}"
venv="$cache/venv-torch-2.11.0"
python="$venv/bin/python"
[[ -x "$python" ]] || { echo "install_python: no environment at $python: run scripts/setup.sh first" >&2; exit 1; }

# The build tree's module must be built against this environment's torch.
[[ -f build/CMakeCache.txt ]] ||
  step "configuring build/ (cmake --preset default)" "about 10 s here" cmake --preset default
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' build/CMakeCache.txt)
if [[ "$torch_dir" != "$venv"/* ]]; then
  echo "install_python: build/ is configured against the torch at '$torch_dir', not $venv's;" \
       "reconfigure build/ (rm build/CMakeCache.txt; cmake --preset default) or use pip install --no-build-isolation ." >&2
  exit 1
fi
step "building packtrain's extension module in build/ (target packtrain_python_core)" \
     "nothing to do after the main build; about 20 min from nothing on 2 cores" \
     cmake --build build --target packtrain_python_core

link_build_tree() {
  # A copy pip installed earlier (pip install .) would shadow the build tree: remove it.
  if "$python" -m pip show --disable-pip-version-check packtrain >/dev/null 2>&1; then
    "$python" -m pip uninstall --disable-pip-version-check --yes --quiet packtrain
  fi
  "$python" - "$PWD" <<'PY'
import json, pathlib, sys, sysconfig
checkout = pathlib.Path(sys.argv[1])
tree = checkout / "build" / "python"
site = pathlib.Path(sysconfig.get_paths()["purelib"])
info = {}
exec((tree / "packtrain" / "_build_info.py").read_text(), info)
dist = site / f"packtrain-{info['PACKTRAIN_VERSION']}.dist-info"
dist.mkdir(exist_ok=True)
files = {
    site / "packtrain-build-tree.pth": f"{tree}\n",
    dist / "METADATA": "Metadata-Version: 2.1\nName: packtrain\n"
                       f"Version: {info['PACKTRAIN_VERSION']}\nSummary: packtrain as built in {tree}\n"
                       "Requires-Python: >=3.10\n"
                       f"Requires-Dist: torch=={info['TORCH_VERSION']}\nRequires-Dist: numpy\n",
    dist / "INSTALLER": "packtrain scripts/install_python.sh\n",
    dist / "direct_url.json": json.dumps({"url": checkout.as_uri(), "dir_info": {"editable": True}}) + "\n",
}
for path, text in files.items():
    path.write_text(text)
record = [path.relative_to(site) for path in files] + [(dist / "RECORD").relative_to(site)]
(dist / "RECORD").write_text("".join(f"{path},,\n" for path in record))
PY
}
step "installing packtrain into $venv (a path to build/python, no compilation)" "a few seconds" link_build_tree

tree="$PWD/build/python"
(cd / && env -u PYTHONPATH -u PACKTRAIN_DATA_DIR "$python" - "$tree" <<'PY'
import pathlib, sys
import numpy as np, packtrain
module = pathlib.Path(packtrain._core.__file__)
assert module.parent == pathlib.Path(sys.argv[1]) / "packtrain", f"import packtrain loaded {module}, not build/python's"
assert packtrain.load_dataset("concrete").X_train.shape[0] > 0
x = np.random.default_rng(0).normal(size=(64, 3))
mean, std = packtrain.EnsembleRegressor(members=2, epochs=2, batch_size=16).fit(x, x.sum(1)).predict(x, return_std=True)
assert mean.shape == std.shape == (64,)
print("install_python: import packtrain works:", packtrain.__file__)
PY
)
