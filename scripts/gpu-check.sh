#!/usr/bin/env bash
# The GPU path proven on one GPU, in one command, on a machine without network:
#
#   scripts/gpu-check.sh [--dry] [--install] [--wheels DIR] [--venv DIR] [--out DIR] [--budget SECONDS]
#                        [--timeout STEP=SECONDS]... [--only STEP,...]
#
# On a GPU machine it installs hpcdl from this tree into a virtual environment layered over the machine's
# Python (its torch, numpy... are used; what it lacks comes from the wheel folder, prepared beforehand with
# scripts/gpu_check/prepare-wheels.sh and brought along with the tree), builds the C++ runtime with the
# machine's CMake, then within 8 minutes runs the gpu-marked tests, every collective on CUDA tensors at one
# rank with NCCL (and its NVTX ranges), 2 and 4 ranks on the one GPU through the device-operation path,
# and two short benchmarks, and prints one verdict table. Exit status 0: every check passed.
#
# --dry runs the same steps on the CPU with gloo standing in for NCCL, with the environment's installed
# hpcdl (--install installs it as on a GPU machine); what needs a GPU is reported as skipped.
#
# Steps: gpu_tests, one_rank, ranks, gpu_overhead, gpu_fusion (--only runs some; --timeout changes one's).
# Defaults: --wheels .gpu-check-wheels, --venv .gpu-check/venv, --out .gpu-check/out; PYTHON: the Python
# to layer over (python3; in the dry mode the one that runs the check: .venv/bin/python if present).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0 INSTALL="" WHEELS=.gpu-check-wheels VENV=.gpu-check/venv OUT=.gpu-check/out
DRIVER_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) DRY=1 ;;
    --install) INSTALL=1 ;;
    --wheels) WHEELS=${2:?}; shift ;;
    --venv) VENV=${2:?}; shift ;;
    --out) OUT=${2:?}; shift ;;
    --budget|--timeout|--only) DRIVER_ARGS+=("$1" "${2:?}"); shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$INSTALL" ]; then INSTALL=$((1 - DRY)); fi
mkdir -p "$OUT"

if [ "$DRY" = 1 ]; then
  DRIVER_ARGS+=(--dry)
  if [ -x .venv/bin/python ]; then BASE=${PYTHON:-.venv/bin/python}; else BASE=${PYTHON:-python3}; fi
else
  BASE=${PYTHON:-python3}
fi
PY=$BASE
if [ "$INSTALL" = 1 ]; then
  echo "==> installing hpcdl into $VENV (log: $OUT/install.log)"
  started=$(date +%s)
  bash scripts/gpu_check/install.sh --over "$BASE" "$VENV" "$WHEELS" >"$OUT/install.log" 2>&1
  rc=$?
  echo "    exit $rc after $(( $(date +%s) - started )) s"
  DRIVER_ARGS+=(--install-rc "$rc" --install-seconds "$(( $(date +%s) - started ))" --install-log "$OUT/install.log")
  if [ "$rc" = 0 ]; then PY="$VENV/bin/python"; else tail -5 "$OUT/install.log" >&2; fi
fi
exec "$PY" scripts/gpu_check/check.py --out "$OUT" "${DRIVER_ARGS[@]}"
