"""`--precision auto` on the CPU: the decision table of hardware.AUTO_CPU_RULE as a function of the CPU's
flags (given, not this machine's), and an existing index keeping its own arithmetic."""
from __future__ import annotations

import pytest

from semsearch.encoder import hardware

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # no bf16 units (e.g. Cascade Lake)
AVX512_BF16 = AVX512 | {"avx512_bf16"}  # e.g. Zen 4, Cooper Lake, Xeons whose AMX is not exposed
AMX = AVX512_BF16 | {"amx_tile", "amx_bf16", "amx_int8"}
OLD_X86 = frozenset({"sse4_2", "avx"})


@pytest.mark.parametrize("flags, machine, ort, want", [
    (AMX, "x86_64", True, "bf16"),
    (AMX, "x86_64", False, "bf16"),
    (AVX512_BF16, "x86_64", True, "int8"),  # measured: int8 faster than bf16, nDCG@10 within 0.3 (docs/precision.md)
    (AVX512_BF16, "x86_64", False, "fp32"),  # no ONNX Runtime: the next fastest there (bf16 is not)
    (AVX512, "x86_64", True, "int8"),  # not measured: as before (int8, as on AVX2)
    (AVX512, "x86_64", False, "fp32"),
    (AVX2, "x86_64", True, "int8"),
    (AVX2, "AMD64", True, "int8"),
    (AVX2, "x86_64", False, "fp32"),
    (OLD_X86, "x86_64", True, "fp32"),
    (frozenset(), "x86_64", True, "fp32"),  # flags unreadable
    (frozenset({"asimd", "bf16", "i8mm"}), "aarch64", True, "fp32"),  # ARM: no figure of ours
    (AMX, "arm64", True, "fp32"),  # the flags only count on x86-64
])
def test_auto_cpu_rule(flags, machine, ort, want):
    assert hardware.auto_cpu_precision(flags, machine, ort) == want


def test_cpu_classes():
    assert [hardware.cpu_class(f, "x86_64") for f in (AMX, AVX512_BF16, AVX512, AVX2, OLD_X86)] == \
        ["amx", "avx512_bf16", "avx2", "avx2", "other"]
    assert {row for row, _ in hardware.AUTO_CPU_RULE} == {"amx", "avx512_bf16", "avx2", "other"}
    # every row ends in a path that needs nothing optional
    assert all(choices[-1] in ("fp32", "bf16") for _, choices in hardware.AUTO_CPU_RULE)
    assert all("int8" not in choices[1:] for _, choices in hardware.AUTO_CPU_RULE)


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given flags, on x86-64, with ONNX Runtime installed."""
    def use(flags: frozenset[str], ort: bool = True):
        monkeypatch.setattr(hardware, "_proc_cpu_flags", lambda: flags)
        monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(hardware, "onnxruntime_installed", lambda: ort)
        monkeypatch.delenv("SEMSEARCH_CPU_ISA", raising=False)
    return use


def test_resolve_precision_auto_follows_the_rule(cpu, monkeypatch):
    cpu(AMX)
    assert hardware.resolve_precision("auto", "cpu") == "bf16"
    assert hardware.resolve_precision("auto", "cuda") == "fp16"
    # SEMSEARCH_CPU_ISA caps the flags the rule sees
    monkeypatch.setenv("SEMSEARCH_CPU_ISA", "avx512")
    assert hardware.resolve_precision("auto", "cpu") == "int8"
    monkeypatch.setenv("SEMSEARCH_CPU_ISA", "avx2")
    assert hardware.resolve_precision("auto", "cpu") == "int8"
    cpu(AVX512_BF16)
    assert hardware.resolve_precision("auto", "cpu") == "int8" and hardware.int8_is_fast()
    cpu(AVX512_BF16, ort=False)
    assert hardware.resolve_precision("auto", "cpu") == "fp32" and not hardware.int8_is_fast()
    cpu(OLD_X86)
    assert hardware.resolve_precision("auto", "cpu") == "fp32"
    # an explicit precision is never second-guessed
    cpu(AVX512_BF16)
    for p in ("fp32", "bf16", "int8"):
        assert hardware.resolve_precision(p, "cpu") == p


@pytest.mark.parametrize("flags, float_index", [(AMX, "bf16"), (AVX512_BF16, "bf16"), (AVX2, "fp32"), (OLD_X86, "fp32")])
def test_an_index_keeps_its_own_arithmetic(cpu, flags, float_index):
    """`auto` for new indexes changed on AVX-512-BF16 CPUs; an existing index did not: an int8 index
    is encoded in int8, an fp32 one in fp32, a bf16 or fp16 one in bf16 or fp32 (never int8),
    whatever auto would pick."""
    cpu(flags)
    assert hardware.precision_for_index("fp32", "cpu") == "fp32"
    for index_precision in ("bf16", "fp16"):
        assert hardware.precision_for_index(index_precision, "cpu") == float_index
    assert hardware.precision_for_index("int8", "cpu") == "int8"
    assert hardware.precision_for_index("int8", "cuda") == "fp16"
    cpu(flags, ort=False)
    assert hardware.precision_for_index("int8", "cpu") == "fp32"
