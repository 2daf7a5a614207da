"""The in-process engine: the shards path in this process with one encoder, no cluster.

It runs the same per-file and per-batch functions as the Ray tasks and actors, so it is the
reference for them, and it measures what staging through Parquet costs against the streaming
local path (scripts/bench/bench_ray.py)."""
from __future__ import annotations

import time
from pathlib import Path

from semsearch.engines.spec import EncodeSpec, FileJob
from semsearch.engines.work import chunk_file, embed_table, schema


class InProcessEngine:
    name = "inprocess"

    def __init__(self, encoder, shard_rows: int = 2048):
        self.encoder = encoder  # the driver's own: nothing is loaded twice
        self.shard_rows = shard_rows

    def run(self, jobs: list[FileJob], spec: EncodeSpec, staging: Path) -> dict:
        import pyarrow as pa
        import pyarrow.parquet as pq

        t0 = time.perf_counter()
        out = Path(staging) / "shards"
        out.mkdir(parents=True, exist_ok=True)
        rows: list[dict] = []
        shards = 0

        def write() -> None:
            nonlocal shards
            table = embed_table(pa.Table.from_pylist(rows, schema(with_vectors=False)), self.encoder, spec.keep_states)
            pq.write_table(table, out / f"{shards:06d}.parquet")
            shards += 1
            rows.clear()

        for job in jobs:
            rows += chunk_file({"seq": job.seq, "path": job.path, "old_hash": job.old_hash}, spec, self.encoder.token_offsets)
            if len(rows) >= self.shard_rows:
                write()
        if rows:
            write()
        return {"engine": self.name, "workers": 1, "shards": shards, "seconds": round(time.perf_counter() - t0, 2)}
