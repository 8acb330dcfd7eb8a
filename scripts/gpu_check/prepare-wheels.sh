#!/usr/bin/env bash
# Downloads, where pip reaches an index, the wheels that installing hpcdl needs on a machine without
# network (scripts/gpu_check/install.sh, run by scripts/gpu-check.sh): hpcdl's dependencies and build
# backend as pyproject.toml names them, and pytest with pytest-timeout, for one Python version on x86-64
# Linux. Bring the folder along with the tree (it is ignored by git).
#
#   scripts/gpu_check/prepare-wheels.sh [--python-version 3.12] [DIR]      (DIR: .gpu-check-wheels)
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=3.12
if [ "${1:-}" = "--python-version" ]; then
  VERSION=${2:?--python-version needs a version such as 3.12}
  shift 2
fi
DIR=${1:-.gpu-check-wheels}
PY=${PYTHON:-python3}

# The requirements, read from pyproject.toml (their one home): dependencies, build-system, and the test
# runner and its timeout plugin from the dev extra.
mapfile -t REQUIREMENTS < <("$PY" - <<'PY'
import re
try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)
wanted = list(project["project"]["dependencies"]) + list(project["build-system"]["requires"])
wanted += [r for r in project["project"]["optional-dependencies"]["dev"]
           if re.match(r"pytest(-timeout)?\b", r)]
print("\n".join(wanted))
PY
)
ABI="cp${VERSION//./}"
echo "==> pip download for CPython $VERSION, manylinux x86-64, into $DIR: ${REQUIREMENTS[*]}"
mkdir -p "$DIR"
"$PY" -m pip download --only-binary=:all: --dest "$DIR" \
  --python-version "$VERSION" --implementation cp --abi "$ABI" --abi abi3 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 \
  "${REQUIREMENTS[@]}"
echo "==> $(ls "$DIR" | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
