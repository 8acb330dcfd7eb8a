#!/usr/bin/env bash
# Installs hpcdl from this tree (editable) into a virtual environment without any network: its dependencies
# come from the interpreter it is layered over (--over) or from a folder of wheels prepared beforehand
# (prepare-wheels.sh), and its C++ runtime is built with the CMake found here.
#
#   scripts/gpu_check/install.sh [--over PYTHON] VENV WHEELS
#
# --over PYTHON: VENV sees PYTHON's installed packages (torch, numpy...) behind its own, so that only
# what PYTHON lacks comes from WHEELS and PYTHON's environment is left as it was. Without it VENV starts
# empty and everything comes from WHEELS. pip never reaches an index: --no-index, --find-links WHEELS,
# and no build isolation (the build backend, scikit-build-core, is installed first, also from WHEELS).
set -euo pipefail

OVER=""
if [ "${1:-}" = "--over" ]; then
  OVER=${2:?--over needs a Python}
  shift 2
fi
if [ $# -ne 2 ]; then
  echo "usage: $0 [--over PYTHON] VENV WHEELS" >&2
  exit 2
fi
VENV=$(realpath -m "$1")
WHEELS=$2
TREE=$(cd "$(dirname "$0")/../.." && pwd)
HINT="prepare it where pip reaches an index with scripts/gpu_check/prepare-wheels.sh $WHEELS and bring it along"
if [ ! -d "$WHEELS" ]; then
  echo "install: no wheel folder $WHEELS: only packages already installed can be used ($HINT)" >&2
  mkdir -p "$WHEELS"
fi
WHEELS=$(cd "$WHEELS" && pwd)
trap 'echo "install: failed; if a package was missing, $HINT" >&2' ERR

BASE=${OVER:-python3}
echo "==> $BASE -m venv $VENV"
"$BASE" -m venv "$VENV"
VPY="$VENV/bin/python"
if [ -n "$OVER" ]; then
  # The base's site-packages folders, after the venv's own (what the venv installs comes first); their
  # .pth files are not run, so that an hpcdl installed there in editable mode does not shadow this one.
  SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$OVER" -c 'import site; print("\n".join(d for d in site.getsitepackages() if d))' >"$SITE/_gpu_check_base.pth"
fi

OFFLINE=(--no-index --find-links "$WHEELS" --no-cache-dir --disable-pip-version-check)
# Nothing of this machine's pip configuration (an index, other find-links, constraints) takes part.
for variable in $(compgen -e | grep '^PIP_' || true); do unset "$variable"; done
export PIP_CONFIG_FILE=/dev/null PIP_NO_INPUT=1
echo "==> the build backend (scikit-build-core) from $WHEELS unless installed"
"$VPY" -m pip install -q "${OFFLINE[@]}" "scikit-build-core>=0.8"

if command -v cmake >/dev/null 2>&1; then
  cmake --version | head -1
elif "$VPY" -c 'import cmake' 2>/dev/null; then
  "$VPY" -c 'import cmake, subprocess, os; subprocess.run([os.path.join(cmake.CMAKE_BIN_DIR, "cmake"), "--version"])' | head -1
else
  echo "install: no CMake (3.18 or newer) on PATH or as the cmake Python package; install one" >&2
  exit 2
fi

# Editable, as scripts/setup.sh installs it: the tests run programs with the tree as their working
# directory, where its hpcdl/ is what Python imports; the editable install gives it the compiled runtime.
echo "==> pip install -e $TREE (C++ runtime built here)"
started=$(date +%s)
"$VPY" -m pip install "${OFFLINE[@]}" --no-build-isolation -e "$TREE"
echo "==> built and installed in $(( $(date +%s) - started )) s"
cd /  # not the tree: its hpcdl/ would be imported instead of the installed one
"$VPY" - "$TREE" "$VENV" <<'PY'
import os, sys
import hpcdl, hpcdl.common as hc
tree, venv = (os.path.realpath(p) + os.sep for p in sys.argv[1:])
built = hc.built()
print("hpcdl", hpcdl.__version__, "from", hpcdl.__file__, "runtime", built.library)
if not os.path.realpath(hpcdl.__file__).startswith(tree):
    sys.exit(f"install: this Python imports hpcdl from {hpcdl.__file__}, not from {tree}")
if not (built.loaded and os.path.realpath(built.library).startswith(venv)):
    sys.exit(f"install: the runtime built here does not load ({built.load_error or built.library})")
print(built)
PY
