"""Run-time detection of the device and of the CPU's reduced-precision units."""
from __future__ import annotations

import functools
import platform
from pathlib import Path

from semsearch.errors import InputError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (empty where they cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


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
            raise InputError("precision 'fp16' is for GPUs; on a CPU use bf16 or fp32")
        return precision
    if device == "cuda":
        return "fp16"
    return "bf16" if cpu_has_fast_bf16() else "fp32"
