#!/usr/bin/env bash
# Create ./.venv with semsearch (`bash scripts/setup.sh`), or with its test tools and every
# integration the tests exercise (`bash scripts/setup.sh test`: serve, LangChain, LlamaIndex,
# Haystack, Ray, ONNX Runtime). CPU torch comes from the pinned wheel (a plain `torch` requirement
# would pull a multi-GB CUDA build); GPU users install their own first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
if [ "${1:-}" = "test" ]; then
    .venv/bin/pip install -q -e '.[test]'
else
    .venv/bin/pip install -q -e .
fi
