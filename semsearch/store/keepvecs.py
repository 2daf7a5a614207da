"""The final merge of a long run keeps its segments' vector files in place (format 10).

A long run publishes a segment every 250k chunks, each with its vector file (store/vecfile.py);
the merge at its end builds one IVF fast-scan index over them all. Until format 9 it then wrote
one merged vector file, list by list, beside the segments' files: at 10M chunks a 7.7 GB copy
(257 s, its reads scattered over 40 files) that held the build's disk at 1.47x the finished
index (docs/benchmarks.md). Here each segment's file is rewritten in the merged index's list
order on its own (read whole, in one forward sweep; written; 0.2 GB at a time), the published
manifest is made to name the new file (the segment, still flat, reads its rows in any order),
and the old file goes: the disk holds one segment's file twice at most. The merged segment
names those files (`vecs`, `vecs_more`); its re-ranking reads each query's candidates from
them, a few runs of rows in each (the lists it probed). The exact neighbours the recall tuning
needs are found from the same forward sweep.

A crash between two of those publishes leaves a valid index (the run's segments, some of them
with their rows in list order); the run resumed merges them again.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from semsearch.store import integrity, vecfile
from semsearch.store.files import fsync_dir
from semsearch.store.vecfile import Stacked, VectorFile, widen
from semsearch.store.vectors import exact_knn

log = logging.getLogger(__name__)

BATCH = 65536  # rows widened to float32 at a time for the exact search


class _Published:
    """The published manifest, for the swaps of vector files of segments it names."""

    def __init__(self, folder: Path):
        from semsearch.store.manifest import IndexFormatError, Manifest

        self.folder = folder
        try:
            self.manifest: Manifest | None = Manifest.load(folder)
        except (IndexFormatError, OSError):
            self.manifest = None  # nothing published yet: every segment of the group is new

    def entry(self, seg_id: int) -> dict | None:
        if self.manifest is None:
            return None
        return next((e for e in self.manifest.segments if e["id"] == seg_id), None)

    def save(self) -> None:
        from semsearch.store.manifest import MULTI_VEC_VERSION

        assert self.manifest is not None
        self.manifest.format_version = max(int(self.manifest.format_version or 0), MULTI_VEC_VERSION)
        fsync_dir(self.folder)  # the new file's name is durable before the manifest names it
        self.manifest.save(self.folder)


def _swap(entry: dict, old: str, new: str, rec: dict) -> None:
    """Name `new` (integrity record `rec`) where the segment entry named its vector file `old`."""
    if entry.get("vecs") == old:
        entry["vecs"] = new
    else:
        entry["vecs_more"] = [new if n == old else n for n in entry["vecs_more"]]
    integ = entry.setdefault("integrity", {"files": {}, "ntotal": entry.get("rows")})
    files = {k: v for k, v in (integ.get("files") or {}).items() if k != old}
    files[new] = rec
    integ["files"] = files


def keep_in_place(folder: Path, group: list[dict], seg_id: int, vecs: Stacked, lists, tunes: bool,
                  k: int = 10, sample: int = 500) -> tuple[list[str], tuple | None]:
    """Put each of `vecs`'s files (the group's, in order) in the list order of the merged
    index (its `lists`), rewriting those that are not (published ones swapped in the manifest,
    their old file removed); gives back the file names, in order, and where `tunes`, the recall
    tuning's (queries, exact neighbours, the queries' own ids), found in the same sweep."""
    folder = Path(folder)
    order = vecfile.list_order(vecs.ids, lists)
    owners = [e for e in group for _ in vecfile.file_names(e)]
    if len(owners) != len(vecs.files):
        raise ValueError("the group's vector files are not the files of the store")
    queries = self_ids = None
    if tunes:
        pick = np.sort(np.random.default_rng(0).choice(len(vecs), min(sample, len(vecs)), replace=False))
        queries, self_ids = vecs.at_positions(pick, sweep=True), vecs.ids[pick].copy()
    published = _Published(folder)
    names: list[str] = []
    rewritten = 0

    def sweep():
        nonlocal rewritten
        for j in range(len(vecs.files)):
            vf = vecs.files[j]
            a, b = vecs.bounds(j)
            mine = order[(order >= a) & (order < b)] - a  # its positions, list by list
            ids, rows = vecfile.read_whole(vf)
            if not vecfile.in_order(vf, mine):
                _rewrite(folder, owners[j], vf, rows, mine, seg_id, published)
                vecs.replace(j, VectorFile(folder / vecfile.kept_name(vf.path.name, seg_id)))
                rewritten += 1
            names.append(vecs.files[j].path.name)
            del vf
            if tunes:
                for at in range(0, len(ids), BATCH):
                    yield ids[at : at + BATCH], widen(rows[at : at + BATCH])

    if tunes:
        found = (queries, exact_knn(queries, sweep(), k, self_ids), self_ids)
    else:
        found = None
        for _ in sweep():
            pass
    log.info("vector files kept in place: %d of %d rewritten in list order", rewritten, len(names))
    return names, found


def _rewrite(folder: Path, owner: dict, vf: VectorFile, rows: np.ndarray, order: np.ndarray, seg_id: int,
             published: _Published) -> None:
    """vf (of segment `owner`) rewritten with its rows in `order`; the segment named with the
    new file (in the published manifest first, where it is published); the old file removed."""
    old, new = vf.path.name, vecfile.kept_name(vf.path.name, seg_id)
    vecfile.rewrite(vf, rows, folder / new, order)
    rec = integrity.file_record(folder / new)
    on_disk = published.entry(int(owner["id"]))
    if on_disk is not None:
        _swap(on_disk, old, new, rec)
        published.save()
    _swap(owner, old, new, rec)
    (folder / old).unlink(missing_ok=True)  # (its pages go once the last map of it is let go of)
