"""Run-time detection of the device and of the CPU's reduced-precision units."""
from __future__ import annotations

import functools
import importlib.util
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
    """Whether the int8 encoder's engine (the `onnx` extra) can be imported."""
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
    """The concrete precision ('fp32', 'bf16', 'fp16') for a request on a device."""
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
    # Without bf16 units: fp32. int8 (ONNX Runtime, `--precision int8`) is faster here, but it is
    # not what auto picks: on SciFact `semsearch eval --precision int8` gives 64.97 nDCG@10 against
    # fp32's 64.51, outside the 0.3 that auto may move a figure (either way), its vectors reach
    # only 0.985 cosine to fp32, and they move with their batch mates (README, "CPUs without AMX").
    return "fp32"
