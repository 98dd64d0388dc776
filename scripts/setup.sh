#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs SpecSweep with its dev extras. Idempotent.
# On a machine without an NVIDIA GPU it installs the CPU build of torch first, so that the
# plain `torch` requirement does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    python -m pip install -q torch
  else
    python -m pip install -q "torch==2.13.0"
  fi
fi
extras=${SPECSWEEP_EXTRAS:-dev,dashboard,postgres,deepspeed}
python -m pip install -q -e ".[${extras}]"
