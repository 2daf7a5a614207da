"""Run-time detection of the device and of the CPU's reduced-precision units."""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import platform
from pathlib import Path

from semsearch.errors import InputError

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
# SEMSEARCH_CPU_ISA caps the instruction sets the project believes it has, e.g. to try the AVX2 path
# on a machine with AMX. It steers only our own choices (precision, kernels we pick), not what
# torch / oneDNN / ONNX Runtime detect for themselves (ONEDNN_MAX_CPU_ISA=AVX2 and
# MKL_ENABLE_INSTRUCTIONS=AVX2 cap those of oneDNN and MKL).
CPU_ISAS = ("native", "avx2", "avx512")
DEVICES = ("auto", "cpu", "cuda")


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (empty where they cannot be read), less those that
    $SEMSEARCH_CPU_ISA rules out ('avx2': no AVX-512 nor AMX; 'avx512': no AMX; 'native': all)."""
    isa = os.environ.get("SEMSEARCH_CPU_ISA", "native").strip().lower() or "native"
    if isa not in CPU_ISAS:
        raise InputError(f"SEMSEARCH_CPU_ISA={isa!r} is not known; valid values are: {', '.join(CPU_ISAS)}")
    flags = _proc_cpu_flags()
    if isa == "avx2":
        return frozenset(f for f in flags if not f.startswith(("avx512", "amx")))
    if isa == "avx512":
        return frozenset(f for f in flags if not f.startswith("amx"))
    return flags


# The AVX-512 subsets of OpenBLAS's SkylakeX kernels.
SKYLAKEX_FLAGS = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def steer_openblas() -> str | None:
    """Name the CPU's core to the OpenBLAS that faiss loads, where the user has not.

    faiss-cpu's wheels bundle OpenBLAS 0.3.15 (2021), which takes a CPU newer than its table
    (a Sapphire Rapids Xeon, with AMX) for a generic core: faiss's flat search, which assigns
    every vector an IVF build adds and runs its k-means, made 21 GFLOPS on one thread of such a
    Xeon, and 125 with OPENBLAS_CORETYPE=SkylakeX (numpy's newer OpenBLAS: 148; at 10M chunks the
    assignment to 12,649 lists took hours instead of minutes: docs/benchmarks.md). OpenBLAS reads
    the variable when it is loaded, so this runs before the first `import faiss` (store/__init__).
    Only on CPUs with the AVX-512 subsets those kernels use, and not under
    SEMSEARCH_CPU_ISA=avx2 (cpu_flags). Gives back what it set, else None."""
    if "OPENBLAS_CORETYPE" in os.environ or not SKYLAKEX_FLAGS <= cpu_flags():
        return None
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    return "SkylakeX"


@functools.lru_cache(maxsize=1)
def _proc_cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def onnxruntime_installed() -> bool:
    """Whether the int8 encoder's engine (onnxruntime and onnx, both dependencies) can be imported."""
    return importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None


def cpu_has_fast_bf16() -> bool:
    """True where the CPU multiplies bf16 in hardware (AMX tiles or AVX-512 BF16)."""
    if platform.machine().lower() in ("arm64", "aarch64"):
        return False
    flags = cpu_flags()
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_device(device: str) -> str:
    """'cuda' or 'cpu' for a requested device name; 'auto' picks CUDA when one is present."""
    import torch

    if device not in DEVICES:
        raise InputError(f"unknown device {device!r}; valid devices are: {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device 'cuda' was asked for but no CUDA GPU is available; use --device auto or cpu")
    return device


def resolve_precision(precision: str, device: str) -> str:
    """The concrete precision ('fp32', 'bf16', 'fp16', 'int8') for a request on a device."""
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r}; valid precisions are: {', '.join(PRECISIONS)}")
    if precision != "auto":
        if precision == "fp16" and device == "cpu":
            raise InputError("precision 'fp16' is for GPUs; on a CPU use bf16, int8 or fp32")
        if precision == "int8" and device != "cpu":
            raise InputError("precision 'int8' is for CPUs (ONNX Runtime); on a GPU use fp16 or fp32")
        return precision
    if device == "cuda":
        return "fp16"
    return auto_cpu_precision(cpu_flags(), platform.machine(), onnxruntime_installed())


# What `--precision auto` runs on a CPU, by class: the fastest path whose SciFact nDCG@10 stays
# within 0.3 of fp32 (dense and hybrid), from the measured table in docs/precision.md ("The table
# auto comes from"), first choice first; a later one is taken where an earlier one cannot run (int8
# needs ONNX Runtime). A class not measured keeps the choice it had before that table.
AUTO_CPU_RULE: tuple[tuple[str, tuple[str, ...]], ...] = (
    # AMX: bf16 3.41x sentence-transformers on documents, int8 2.13x (not measured again since).
    ("amx", ("bf16",)),
    # AVX-512 with bf16 and VNNI, no AMX: int8 2.6-2.8x documents, 2.8x queries (recipe v4); bf16 no
    # faster than fp32 on documents and slower on queries (its matmul peak is below fp32's), so fp32
    # is next where int8 cannot run. nDCG@10 of all three within 0.3 of fp32.
    ("avx512_bf16", ("int8", "fp32")),
    # AVX2: int8 1.8x documents, 2.1x queries natively; 2.0x / 2.4x with CPUID capped to AVX2.
    # AVX-512 without bf16 units (Skylake class), CPUID capped: int8 1.6x / 1.9x, fp32 1.1x / 0.8x.
    ("avx2", ("int8", "fp32")),
    # ARM and older x86: no int8 or bf16 figure of ours.
    ("other", ("fp32",)),
)


def cpu_class(flags: frozenset[str] | set[str], machine: str) -> str:
    """The row of AUTO_CPU_RULE a CPU falls in: 'amx', 'avx512_bf16', 'avx2' or 'other'."""
    if machine.lower() not in ("x86_64", "amd64"):
        return "other"
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx2" in flags:
        return "avx2"
    return "other"


def auto_cpu_precision(flags: frozenset[str] | set[str], machine: str, int8_available: bool) -> str:
    """`auto`'s precision on a CPU with these feature flags and this architecture (platform.machine()),
    with or without ONNX Runtime (int8's engine): the first path of its AUTO_CPU_RULE row that can run.
    An encoder that then cannot load the int8 model falls back to fp32 with a warning
    (Encoder._load_onnx)."""
    choices = dict(AUTO_CPU_RULE)[cpu_class(flags, machine)]
    return next(p for p in choices if p != "int8" or int8_available)


def int8_is_fast() -> bool:
    """Whether `auto` runs the int8 encoder on this CPU (see AUTO_CPU_RULE)."""
    return auto_cpu_precision(cpu_flags(), platform.machine(), onnxruntime_installed()) == "int8"


def precision_for_index(index_precision: str, device: str) -> str:
    """The precision to encode with for an index built in index_precision, on a resolved device
    ('cpu' or 'cuda'): its own arithmetic where this machine has it, so that a query and the
    chunks added later land where the index's vectors are. An fp32 index stays fp32 (a bf16 query
    vector is ~2e-3 from its fp32 one, and bf16 padding makes it depend on what it is batched
    with); a bf16 or fp16 one is encoded in bf16 where the CPU has bf16 units, else fp32 (the
    float precisions agree to a cosine of 0.9999); int8 agrees with them to 0.98-0.99 only, so an
    int8 index is encoded in int8 and a float index never is."""
    if device == "cuda":
        return "fp16"
    if index_precision == "int8":
        if onnxruntime_installed():
            return "int8"
        logging.getLogger(__name__).warning("this index was built in int8, but ONNX Runtime is not installed: encoding in fp32 "
                                            "(cosine 0.98-0.99 to its vectors); pip install onnxruntime onnx to match them")
        return "fp32"
    if index_precision == "fp32":
        return "fp32"
    return "bf16" if cpu_has_fast_bf16() else "fp32"
