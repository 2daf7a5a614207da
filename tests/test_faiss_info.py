"""Which faiss is loaded and installed (semsearch.store.faiss_info), and scripts/install_gpu.sh --check."""
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from semsearch.store import faiss_info as fi

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("names, expected", [
    ([], []),
    (["numpy", "torch"], []),
    (["faiss-cpu", "numpy"], ["faiss-cpu"]),
    (["faiss_cpu"], ["faiss-cpu"]),  # names as metadata may spell them
    (["Faiss-GPU-cu12"], ["faiss-gpu-cu12"]),
    (["faiss"], ["faiss"]),  # conda / built from source
    (["faiss-haystack", "faiss-node", "autofaiss", "langchain-faiss"], []),  # users of faiss, not builds of it
    (["faiss-cpu", "faiss-gpu"], ["faiss-cpu", "faiss-gpu"]),
    (["faiss-gpu-cu12-cuvs", "faiss-cuda-cu128", "faiss-cpu-noavx2", "faiss-gpu-cuvs"],
     ["faiss-cpu-noavx2", "faiss-cuda-cu128", "faiss-gpu-cu12-cuvs", "faiss-gpu-cuvs"]),
])
def test_faiss_distributions(names, expected):
    assert fi.faiss_distributions(names) == expected


def test_conflict_only_with_more_than_one():
    assert fi.conflict([]) is None
    assert fi.conflict(["faiss-cpu"]) is None
    assert fi.conflict(["faiss-gpu-cu12"]) is None
    msg = fi.conflict(fi.faiss_distributions(["faiss-gpu-cu12", "faiss-cpu"]))
    assert "faiss-cpu, faiss-gpu-cu12" in msg and fi.FIX_SCRIPT in msg


def test_check_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(fi, "installed_faiss_distributions", lambda: ["faiss-cpu", "faiss-gpu"])
    fi.check_distributions.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=fi.__name__):
            assert fi.check_distributions() == ["faiss-cpu", "faiss-gpu"]
            fi.check_distributions()
        warnings = [r for r in caplog.records if "more than one faiss" in r.getMessage()]
        assert len(warnings) == 1 and fi.FIX_SCRIPT in warnings[0].getMessage()
    finally:
        fi.check_distributions.cache_clear()


def test_describe():
    info = {"version": "1.15.1", "gpu_build": False, "gpus": 0, "distributions": ["faiss-cpu"], "conflict": None}
    assert fi.describe(info) == "1.15.1, CPU build (faiss-cpu), GPUs seen: 0"
    both = dict(info, gpu_build=True, gpus=1, distributions=["faiss-cpu", "faiss-gpu"], conflict="x")
    assert fi.describe(both).startswith("1.15.1, GPU build (faiss-cpu, faiss-gpu), GPUs seen: 1; WARNING")


def test_faiss_build_here():
    """The real function on this environment: whatever faiss is installed, the report is consistent."""
    import faiss

    info = fi.faiss_build()
    assert info["version"] == faiss.__version__
    assert info["gpu_build"] == hasattr(faiss, "StandardGpuResources")
    assert info["distributions"] == fi.installed_faiss_distributions() and info["distributions"]
    if not info["gpu_build"]:
        assert info["gpus"] == 0 and "CPU build" in fi.describe(info)
    from semsearch.store.vectors import faiss_gpus, resolve_index_device

    assert faiss_gpus() == info["gpus"]
    if info["gpus"] == 0:
        assert resolve_index_device("auto") == "cpu"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_install_gpu_script_check_mode():
    """`scripts/install_gpu.sh --check` changes nothing: it prints the plan and checks the faiss that
    loads now (a flat index search; on a machine without a GPU, the CPU fallback)."""
    env = dict(os.environ, PYTHON=sys.executable, HF_HUB_OFFLINE="1")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "install_gpu.sh"), "--check"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "would run:" in out and "pip uninstall" in out and "pip install" in out
    assert "flat search: ok" in out
    info = fi.faiss_build()
    assert f"faiss {info['version']}" in out
    if info["gpus"] == 0:
        assert "CPU fallback: ok" in out


def test_gpu_extra_installs_no_second_faiss():
    """`pip install 'semsearch[gpu]'` must not add a faiss beside the core faiss-cpu."""
    import re

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[\s<>=!~;\[@]", r, maxsplit=1)[0] for r in project["optional-dependencies"]["gpu"]]
    assert names and fi.faiss_distributions(names) == []
    assert fi.faiss_distributions(re.split(r"[\s<>=!~;\[@]", r, maxsplit=1)[0] for r in project["dependencies"]) == ["faiss-cpu"]


def test_installed_distributions_read_from_folder_names_as_importlib_metadata_finds_them(tmp_path, monkeypatch):
    """The folder-name scan finds what importlib.metadata finds, on a made-up site folder (wheel
    and egg layouts, a develop install, a user of faiss that does not provide it) and here."""
    from importlib.metadata import distributions

    site = tmp_path / "site"
    for folder, name in [("faiss_cpu-1.9.0.dist-info", "faiss-cpu"), ("faiss_gpu_cu12-1.8.0.dist-info", "faiss-gpu-cu12"),
                         ("faiss-1.7.4-py3.11.egg-info", "faiss"), ("faiss_haystack-1.0.dist-info", "faiss-haystack"),
                         ("numpy-2.0.dist-info", "numpy")]:
        (site / folder).mkdir(parents=True)
        (site / folder / ("METADATA" if folder.endswith("dist-info") else "PKG-INFO")).write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 1\n")
    (site / "Faiss_GPU.egg-info").mkdir()  # a develop install: no version in the name
    (site / "Faiss_GPU.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: Faiss_GPU\nVersion: 1\n")
    monkeypatch.setattr(sys, "path", [str(site), str(tmp_path / "gone"), str(tmp_path / "a.zip")])
    got = fi.installed_faiss_distributions()
    assert got == ["faiss", "faiss-cpu", "faiss-gpu", "faiss-gpu-cu12"]
    assert got == fi.faiss_distributions(d.metadata["Name"] for d in distributions(path=[str(site)]))
    monkeypatch.undo()
    assert fi.installed_faiss_distributions() == fi.faiss_distributions(d.metadata["Name"] or "" for d in distributions())
