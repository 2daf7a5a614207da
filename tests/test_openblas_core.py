"""faiss's bundled OpenBLAS is told the CPU's core where it would not know it (encoder.hardware
steer_openblas, run when semsearch.store is imported): set only on CPUs with SkylakeX's AVX-512
subsets, never over the user's own OPENBLAS_CORETYPE, never under SEMSEARCH_CPU_ISA=avx2; and in a
fresh process it is set before faiss loads."""
from __future__ import annotations

import os
import subprocess
import sys

from semsearch.encoder import hardware

AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "amx_tile"})


def test_set_only_where_the_cpu_has_the_kernels_isa_and_the_user_said_nothing(monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.delenv("SEMSEARCH_CPU_ISA", raising=False)
    monkeypatch.setattr(hardware, "_proc_cpu_flags", lambda: AVX512)
    assert hardware.steer_openblas() == "SkylakeX" and os.environ["OPENBLAS_CORETYPE"] == "SkylakeX"
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")  # the user's own choice stays
    assert hardware.steer_openblas() is None and os.environ["OPENBLAS_CORETYPE"] == "Haswell"
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.setenv("SEMSEARCH_CPU_ISA", "avx2")  # capped: no AVX-512 kernels either
    assert hardware.steer_openblas() is None and "OPENBLAS_CORETYPE" not in os.environ
    monkeypatch.delenv("SEMSEARCH_CPU_ISA")
    monkeypatch.setattr(hardware, "_proc_cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f"}))  # AVX-512 F only
    assert hardware.steer_openblas() is None and "OPENBLAS_CORETYPE" not in os.environ


def test_a_fresh_process_names_the_core_before_faiss_loads():
    code = ("import os, sys; import semsearch.store; import faiss; "
            "from semsearch.encoder.hardware import SKYLAKEX_FLAGS, cpu_flags; "
            "print(os.environ.get('OPENBLAS_CORETYPE'), SKYLAKEX_FLAGS <= cpu_flags())")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "SEMSEARCH_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    core, has = out.stdout.split()
    assert core == ("SkylakeX" if has == "True" else "None"), out.stdout
