#!/usr/bin/env bash
# Installs everything hpcdl's tests need on a fresh Debian 12 / Ubuntu 22.04+ machine:
# compilers and CMake, OpenMPI and MPICH, Lmod, Slurm + munge, sshd and iproute2 for multi-host tests,
# then hpcdl itself (editable, with its torch/mpi/dev extras) into the current Python.
# Run as root (or with sudo available). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3-dev
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

PY=${PYTHON:-python3}
echo "==> $PY -m pip install -e .[torch,mpi,dev]"
# torch is pinned to the CPU wheel so that no dependency range pulls a CUDA build.
$PY -m pip install -q "torch==2.13.0"
$PY -m pip install -q -e ".[torch,mpi,dev]"
echo "==> done: try 'hpcdl check-build --verbose'"
