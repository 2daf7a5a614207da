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
    if cpu_has_fast_bf16():
        return "bf16"
    if int8_is_fast():
        # ONNX Runtime's int8 kernels (u8 x s8 multiply-add): on a 2-core AVX2 EPYC 1.7x
        # sentence-transformers' fp32 on documents and 2.2x on queries, SciFact nDCG@10 64.66
        # against fp32's 64.51 (README, "CPUs without AMX"). An encoder that cannot load it
        # falls back to fp32 with a warning (Encoder._load_onnx).
        return "int8"
    return "fp32"


def int8_is_fast() -> bool:
    """Whether `auto` runs the int8 encoder on this CPU: an x86-64 CPU with AVX2 (measured there)
    and no bf16 units, with ONNX Runtime installed. ARM has int8 kernels too, but no figure of
    ours: it stays on fp32 until one is measured."""
    return platform.machine().lower() in ("x86_64", "amd64") and "avx2" in cpu_flags() and onnxruntime_installed()


def precision_for_index(index_precision: str, device: str) -> str:
    """The precision to encode with for an index built in index_precision, on a resolved device
    ('cpu' or 'cuda'): its own arithmetic where this machine has it, so that a query and the
    chunks added later land where the index's vectors are. The float precisions agree with each
    other to a cosine of 0.9999; int8 agrees with them to 0.98-0.99 only, so an int8 index is
    encoded in int8 and a float index never is."""
    if device == "cuda":
        return "fp16"
    if index_precision == "int8":
        if onnxruntime_installed():
            return "int8"
        logging.getLogger(__name__).warning("this index was built in int8, but ONNX Runtime is not installed: encoding in fp32 "
                                            "(cosine 0.98-0.99 to its vectors); pip install onnxruntime onnx to match them")
        return "fp32"
    return "bf16" if cpu_has_fast_bf16() else "fp32"
