"""scripts/bench/cpuid_cap.c: the benchmarks' way of timing a lesser x86 CPU on a bigger one
(`bench_encode.py --cpu-cap`). It must fool every library's CPUID check and nothing else."""
from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64") or shutil.which("gcc") is None
    or "cpuid_fault" not in (Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""),
    reason="needs x86 Linux with CPUID faulting and gcc")


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cpuid") / "cpuid_cap.so"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(out), str(REPO / "scripts" / "bench" / "cpuid_cap.c")], check=True)
    return out


def _run(lib: Path, cap: str, code: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "CPUID_CAP": cap, "LD_PRELOAD": str(lib)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_capped_process_sees_the_lesser_cpu(lib):
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    native = _run(lib, "native", probe)
    assert native.returncode == 0, native.stderr
    avx2 = _run(lib, "avx2", probe)
    assert avx2.returncode == 0, avx2.stderr
    assert avx2.stdout.strip() == "AVX2"  # ATen dispatches on CPUID, as MLAS and oneDNN do
    if "avx512f" in Path("/proc/cpuinfo").read_text():
        assert native.stdout.strip() in ("AVX512", "AVX512_BF16")  # nothing hidden without a cap
        assert _run(lib, "avx512", probe).stdout.strip() == "AVX512"


def test_a_real_crash_still_crashes_and_a_bad_cap_is_named(lib):
    crash = _run(lib, "avx2", "import ctypes; ctypes.string_at(0)")
    assert crash.returncode == -11  # SIGSEGV: not taken for a CPUID instruction
    jump = _run(lib, "avx2", "import ctypes; ctypes.CFUNCTYPE(None)(0x10)()")  # code at an unmapped address
    assert jump.returncode == -11
    bad = _run(lib, "avx3", "print('ran')")
    assert bad.returncode == 2 and "unknown CPUID_CAP=avx3" in bad.stderr and "ran" not in bad.stdout
