#!/usr/bin/env bash
# Create ./.venv with semsearch and its test tools. CPU torch comes from the pinned wheel
# (a plain `torch` requirement would pull a multi-GB CUDA build); GPU users install their own first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e '.[test]'
