#!/usr/bin/env bash
# Installs everything hpcdl's tests need on a fresh Debian 12 / Ubuntu 22.04+ machine:
# compilers and CMake, OpenMPI and MPICH, Lmod, Slurm + munge, sshd and iproute2 for multi-host tests,
# then a virtual environment (.venv, or $HPCDL_VENV) holding hpcdl itself (editable) with every Python
# package a test uses: its torch/tensorflow/mpi/dev extras, matplotlib, and the wheel build backend.
# Run as root (or with sudo available). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3-dev python3-venv
  openmpi-bin libopenmpi-dev mpich libmpich-dev
  lmod tcl8.6
  slurm-wlm slurm-client slurm-wlm-torque munge
  openssh-server openssh-client iproute2 procps psmisc util-linux
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}"
fi

VENV=${HPCDL_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> $PY -m venv $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip
# torch and tensorflow are pinned to their CPU wheels so that no dependency range pulls a CUDA build.
echo "==> $VPY -m pip install torch==2.13.0 tensorflow-cpu==2.21.0"
"$VPY" -m pip install -q "torch==2.13.0"
"$VPY" -m pip install -q "tensorflow-cpu==2.21.0"
# Legacy Keras 2 (TF_USE_LEGACY_KERAS=1), made for TensorFlow 2.21. --no-deps: it requires the `tensorflow`
# distribution, which would be installed over tensorflow-cpu.
echo "==> $VPY -m pip install --no-deps tf-keras==2.21.0"
"$VPY" -m pip install -q --no-deps "tf-keras==2.21.0"
# The build backend is installed into the environment itself: the wheel test builds without isolation.
echo "==> $VPY -m pip install -e .[torch,tensorflow,mpi,dev]"
"$VPY" -m pip install -q "scikit-build-core>=0.8"
"$VPY" -m pip install -q -e ".[torch,tensorflow,mpi,dev]"
# hpcdl.tensorflow's asynchronous graph kernel, compiled against this TensorFlow (else on first use).
# What TensorFlow's import and the compiler print is shown only when the build fails.
echo "==> building hpcdl.tensorflow's graph kernel"
kernel_log=$(mktemp)
if kernel=$(TF_CPP_MIN_LOG_LEVEL=3 "$VPY" -c 'from hpcdl.tensorflow._latch import prebuild; prebuild()' 2>"$kernel_log"); then
  echo "==> graph kernel: $kernel"
else
  tail -n 20 "$kernel_log"
  echo "==> (graph kernel not built; hpcdl warns and builds on first use)"
fi
rm -f "$kernel_log"
echo "==> done: run the tests with '$VPY -m pytest'; try '$VENV/bin/hpcdl check-build --verbose'"
