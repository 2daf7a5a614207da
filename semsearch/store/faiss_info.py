"""Which faiss is loaded here, and which faiss distributions are installed.

faiss-cpu and every GPU build of faiss (faiss-gpu, faiss-gpu-cu12, faiss-gpu-cuvs, faiss-cuda, ...)
install the same `faiss` module. With two of them installed, the one that loads depends on the
order they were installed in, and uninstalling either one breaks the other's files. So more than
one is reported as a problem (a logged warning, once per process) naming the fix:
`scripts/install_gpu.sh` keeps exactly one.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import sys
from typing import Iterable

log = logging.getLogger(__name__)

FIX_SCRIPT = "scripts/install_gpu.sh"

# Distributions that provide the `faiss` module: plain `faiss` (conda, a build from source), faiss-cpu
# and its variants, and the GPU builds. Not faiss-haystack, faiss-node and other users of faiss.
_PROVIDES_FAISS = re.compile(r"^faiss(-(cpu|gpu|cuda)(-[a-z0-9]+)*)?$")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def faiss_distributions(names: Iterable[str]) -> list[str]:
    """The names among `names` (installed distributions) that provide the `faiss` module, sorted."""
    return sorted({n for n in map(_normalise, names) if _PROVIDES_FAISS.match(n)})


def conflict(dists: list[str]) -> str | None:
    """A message when more than one faiss distribution is installed, else None."""
    if len(dists) < 2:
        return None
    return (f"more than one faiss is installed ({', '.join(dists)}): each provides the `faiss` module, and "
            f"which one loads depends on install order. Keep one: run {FIX_SCRIPT} for the GPU build, or "
            f"`pip uninstall {' '.join(dists)}` then `pip install faiss-cpu` for the CPU one")


def installed_faiss_distributions() -> list[str]:
    """The faiss distributions installed in this environment: the names of the `.dist-info` and
    `.egg-info` folders on sys.path, which is where importlib.metadata finds them. Read from the
    folder names (`faiss_cpu-1.9.0.dist-info`), not through importlib.metadata: that parses the
    metadata of every installed distribution, 0.25-0.3 s of each index's opening with ~200
    installed, the largest fixed cost of a one-shot `semsearch query`."""
    names = []
    for entry in sys.path:
        try:
            listing = os.listdir(entry or ".")
        except OSError:  # a zip file, a folder gone or unreadable
            continue
        for f in listing:
            if f[:5].lower() == "faiss" and f.endswith((".dist-info", ".egg-info")):
                names.append(f.rsplit(".", 1)[0].split("-", 1)[0])  # name[-version[-pyX.Y]]: the name
    return faiss_distributions(names)


@functools.lru_cache(maxsize=1)
def check_distributions() -> list[str]:
    """installed_faiss_distributions(), warning once per process when there is more than one."""
    dists = installed_faiss_distributions()
    msg = conflict(dists)
    if msg:
        log.warning(msg)
    return dists


@functools.lru_cache(maxsize=1)
def faiss_build() -> dict:
    """The loaded faiss: version, whether it is a GPU build, how many GPUs it sees, and the faiss
    distributions installed (warned about when more than one)."""
    import faiss

    gpu_build = hasattr(faiss, "StandardGpuResources")
    gpus = 0
    if gpu_build:
        try:
            gpus = int(faiss.get_num_gpus())  # 0 where the CUDA runtime finds no device
        except RuntimeError:
            gpus = 0
    dists = check_distributions()
    return {"version": getattr(faiss, "__version__", "unknown"), "gpu_build": gpu_build, "gpus": gpus,
            "distributions": dists, "conflict": conflict(dists)}


def describe(info: dict) -> str:
    """One line, e.g. `1.15.1, CPU build (faiss-cpu), GPUs seen: 0`."""
    dists = ", ".join(info["distributions"]) or "no faiss distribution found"
    line = f"{info['version']}, {'GPU' if info['gpu_build'] else 'CPU'} build ({dists}), GPUs seen: {info['gpus']}"
    if info.get("conflict"):
        line += f"; WARNING: more than one faiss installed, run {FIX_SCRIPT}"
    return line
