"""Indexing engines: where files are read, chunked and encoded.

An engine takes the files to (re)embed and writes their chunk rows with vectors as Parquet
shards into a staging folder; the driver (`engines/build.py`) then fills the docstore and the
vector index from the shards in file order, so every engine gives the same index folder.

- `inprocess`: this process, one encoder (the shards path without a cluster).
- `ray`: Ray Data on a local or remote cluster; files are read and chunked in tasks and encoded
  in an actor pool with one model replica per actor (`pip install semsearch[ray]`).

The default `semsearch index` (engine `local`) streams straight into the index without shards
(`indexing._update`) and does not come through here.
"""
from __future__ import annotations

from semsearch.engines.spec import EncodeSpec, Engine, FileJob, spec_for  # noqa: F401  (the engines' shared types)
from semsearch.errors import InputError

ENGINES = ("local", "ray")


def make_engine(name: str, address: str | None = None, workers: int | None = None):
    """The engine called `name` ('local' gives None: the streaming path of indexing.py)."""
    if name == "local":
        if address or workers:
            raise InputError("--ray-address and --workers need --engine ray")
        return None
    if name == "ray":
        from semsearch.engines.ray_engine import RayEngine

        return RayEngine(address=address, workers=workers)
    raise InputError(f"unknown engine {name!r}; valid engines are: {', '.join(ENGINES)}")
