#!/usr/bin/env bash
# FAISS with GPU support for semsearch: swap faiss-cpu for a GPU build of faiss, leaving exactly one.
#
# faiss-cpu (a dependency of semsearch) and the GPU builds all install the same `faiss` module; with
# two installed, the one that loads depends on install order, and uninstalling one deletes files the
# other needs. So this script uninstalls every faiss distribution first, then installs one GPU build
# (by default `faiss-gpu` at the version of the faiss loaded now, so indexes stay readable by the
# same faiss), then checks it: `import faiss`, GPU build, GPUs seen, a flat search (and on a GPU,
# the same search on the GPU).
#
# Usage: scripts/install_gpu.sh [--check] [--package NAME] [--version VERSION]
#   --check          change nothing: print what would run, then check the faiss installed now
#                    (on a machine without a GPU: that the CPU fallback works)
#   --package NAME   the GPU build to install (default faiss-gpu: CUDA 12 runtime wheels from the
#                    package index; others: faiss-gpu-cu12, faiss-gpu-cuvs)
#   --version V      its version (default: the version of the faiss loaded now)
# Environment: PYTHON, the interpreter of the environment to change (default .venv/bin/python,
# else python3).
#
# After `pip install -U semsearch` (or `pip install -e .`), pip puts faiss-cpu back beside the GPU
# build: semsearch then warns (more than one faiss installed); run this script again.
set -euo pipefail

cd "$(dirname "$0")/.."
CHECK=0
PACKAGE=faiss-gpu
VERSION=""
while [ $# -gt 0 ]; do
    case "$1" in
        --check) CHECK=1 ;;
        --package) PACKAGE="$2"; shift ;;
        --version) VERSION="$2"; shift ;;
        -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

# What is installed and loaded now (semsearch.store.faiss_info).
read -r LOADED INSTALLED < <("$PYTHON" - <<'EOF'
from semsearch.store.faiss_info import installed_faiss_distributions
try:
    import faiss
    version = faiss.__version__
except ImportError:
    version = "-"
print(version, ",".join(installed_faiss_distributions()) or "-")
EOF
) || true
if [ -z "${LOADED:-}" ]; then echo "$PYTHON cannot import semsearch: install semsearch first (scripts/setup.sh)" >&2; exit 1; fi
echo "faiss loaded now: $LOADED; faiss distributions installed: ${INSTALLED//,/ }"
if [ -z "$VERSION" ] && [ "$LOADED" != "-" ]; then VERSION="$LOADED"; fi
SPEC="$PACKAGE${VERSION:+==$VERSION}"

plan=()
if [ "$INSTALLED" != "-" ]; then plan+=("$PYTHON -m pip uninstall -y ${INSTALLED//,/ }"); fi
plan+=("$PYTHON -m pip install $SPEC")

if [ "$CHECK" = 1 ]; then
    echo "would run:"
    for cmd in "${plan[@]}"; do echo "  $cmd"; done
    echo "then check: import faiss, exactly one faiss installed, GPUs seen, a flat search"
else
    for cmd in "${plan[@]}"; do echo "+ $cmd"; $cmd; done
fi

# The check: one faiss installed, what it is, a flat search that finds each vector itself, and on a
# GPU the same search on the GPU; with no GPU, semsearch resolves the vector index to the CPU.
EXPECT_GPU=0
if [ "$CHECK" = 0 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    EXPECT_GPU=1
fi
EXPECT_GPU=$EXPECT_GPU "$PYTHON" - <<'EOF'
import os
import sys

import numpy as np

from semsearch.store.faiss_info import conflict, describe, faiss_build
from semsearch.store.vectors import resolve_index_device

info = faiss_build()
print(f"faiss {describe(info)}")
if info["conflict"]:
    sys.exit("FAIL: " + info["conflict"])
import faiss

rng = np.random.default_rng(0)
x = rng.standard_normal((2000, 64)).astype("float32")
faiss.normalize_L2(x)
index = faiss.IndexFlatIP(64)
index.add(x)
_, ids = index.search(x[:100], 5)
if not (ids[:, 0] == np.arange(100)).all():
    sys.exit("FAIL: flat search does not find each vector itself")
print("flat search: ok")
if info["gpus"] > 0:
    gpu = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    _, gids = gpu.search(x[:100], 5)
    if not (gids[:, 0] == ids[:, 0]).all():
        sys.exit("FAIL: the GPU flat search differs from the CPU one")
    print(f"GPU flat search: ok (same top hits as the CPU); semsearch's vector index device: {resolve_index_device('auto')}")
else:
    if os.environ.get("EXPECT_GPU") == "1":
        sys.exit("FAIL: nvidia-smi lists a GPU but faiss sees none: "
                 + ("a CPU build loaded" if not info["gpu_build"] else
                    "check the driver's CUDA version and the GPU's compute capability against the wheel's"))
    if resolve_index_device("auto") != "cpu":
        sys.exit("FAIL: no GPU, yet the vector index does not resolve to the CPU")
    print("CPU fallback: ok (no GPU seen: semsearch builds and searches the vector index on the CPU)")
EOF
