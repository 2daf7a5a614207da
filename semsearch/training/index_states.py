"""Training passages' token states from an index built with --keep-states: no second encoding.

A BEIR corpus indexed from its corpus.jsonl carries each document's `_id` in the chunk metadata;
a document's first chunk holds the same tokens as the document truncated at the model's length,
which is what training encodes. Other passages are matched by their exact chunk text. Passages
found in neither way are encoded (and counted).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from semsearch.errors import InputError, SettingsMismatch
from semsearch.training.states import StateCache

log = logging.getLogger(__name__)


@dataclass
class IndexStates:
    passages: StateCache
    from_index: int  # passages whose states came from the index
    encoded: int  # passages the index did not hold, encoded now


@dataclass
class IndexChunks:
    texts: list[str]  # every chunk's text, in chunk-id order
    metadata: list[dict]
    ords: list[int]  # chunk number within its document
    states: StateCache  # their kept token states


def _open(folder: Path, encoder):
    from semsearch.store.manifest import Manifest

    folder = Path(folder)
    m = Manifest.load(folder)
    if not m.states:
        raise InputError(f"{folder}: the index kept no token states; build it with `semsearch index ... --keep-states`")
    if encoder is not None and m.model_fingerprint != encoder.fingerprint:
        raise SettingsMismatch(f"{folder}: the index was built with model weights {m.model_fingerprint}, not {encoder.fingerprint}")
    if encoder is not None and m.max_length != encoder.max_length:
        raise SettingsMismatch(f"{folder}: the index's max length is {m.max_length}, not {encoder.max_length}")
    return m


def _spans(folder: Path, dim: int, refs: list[tuple[str, int, int]]) -> StateCache:
    files = sorted({f for f, _, _ in refs})
    parts = [np.memmap(Path(folder) / "states" / f, dtype=np.float16, mode="r").reshape(-1, dim) for f in files]
    part_of = {f: i for i, f in enumerate(files)}
    spans = np.array([(part_of[f], off, n) for f, off, n in refs], np.int64).reshape(-1, 3)
    return StateCache.from_spans(parts, spans)


def index_chunks(folder: Path, encoder=None) -> IndexChunks:
    """Every chunk of an index with kept token states: texts, metadata and states (memory-mapped)."""
    from semsearch.store.segments import read_rows

    m = _open(folder, encoder)
    rows = [r[1:] for r in read_rows(folder, m, "c.text, c.metadata, c.ord, c.state_file, c.state_off, c.state_len",
                                     "c.state_file IS NOT NULL")]
    if not rows:
        raise InputError(f"{folder}: the index holds no chunks with kept token states")
    return IndexChunks([r[0] for r in rows], [json.loads(r[1]) if r[1] else {} for r in rows], [r[2] for r in rows],
                       _spans(folder, m.states["dim"], [(r[3], r[4], r[5]) for r in rows]))


def first_sentence(text: str, shortest: int = 20, longest: int = 200) -> str | None:
    """The text's first sentence (for a document that starts with its title: the title), or None
    when there is none short enough to be a query for the rest."""
    import re

    t = " ".join(text.split())
    m = re.match(r"(.{%d,%d}?[.!?])\s" % (shortest, longest), t + " ")
    if m is None or len(m.group(1)) > 0.5 * len(t):
        return None
    return m.group(1)


def add_pseudo_queries(data, passages: StateCache, chunks: IndexChunks, id_field: str = "_id", limit: int | None = None,
                       seed: int = 0):
    """Unlabelled pairs from the corpus: each document's first sentence (its title, where it starts
    with one) as a query for its first chunk. Gives back (data with the pseudo-queries added as
    unlabelled queries, passages extended with chunks the data lacked)."""
    from semsearch.training.data import PairData

    pos_by_id = {p: i for i, p in enumerate(data.passage_ids)} if data.passage_ids is not None else {}
    pos_by_text = {t: i for i, t in enumerate(data.passages)}
    queries, positives, unlabelled = list(data.queries), {q: set(p) for q, p in data.positives.items()}, set(data.unlabelled)
    new_texts: list[str] = []
    new_rows: list[int] = []
    picks = [i for i in range(len(chunks.texts)) if chunks.ords[i] == 0]
    if limit is not None and len(picks) > limit:
        picks = sorted(np.random.default_rng(seed).choice(picks, limit, replace=False).tolist())
    for i in picks:
        q = first_sentence(chunks.texts[i])
        if q is None:
            continue
        doc = chunks.metadata[i].get(id_field)
        p = pos_by_id.get(str(doc)) if doc is not None else None
        if p is None:
            p = pos_by_text.get(chunks.texts[i])
        if p is None:
            p = len(data.passages) + len(new_texts)
            pos_by_text[chunks.texts[i]] = p
            new_texts.append(chunks.texts[i])
            new_rows.append(i)
        qi = len(queries)
        queries.append(q)
        positives[qi] = {p}
        unlabelled.add(qi)
    if new_rows:
        cs = chunks.states
        spans = np.concatenate([np.stack([passages.part, passages.start, passages.length], 1),
                                np.stack([cs.part[new_rows] + len(passages.parts), cs.start[new_rows], cs.length[new_rows]], 1)])
        passages = StateCache.from_spans(passages.parts + cs.parts, spans)
    ids = (list(data.passage_ids) + [None] * len(new_texts)) if data.passage_ids is not None else None
    from semsearch.encoder.heads import corpus_record, document_key

    # the corpus trained on is now the index's (every document, not only those picked)
    corpus = corpus_record(document_key(chunks.metadata[i].get("_id"), chunks.texts[i]) for i in range(len(chunks.texts))
                           if chunks.ords[i] == 0)
    out = PairData(queries, data.passages + new_texts, positives, data.negatives, passage_ids=ids, query_ids=None,
                   checksum=data.checksum, source=data.source + f" + {len(unlabelled) - len(data.unlabelled)} pseudo-queries from the index",
                   dev_queries=data.dev_queries, unlabelled=unlabelled, corpus=corpus)
    return out, passages


def passage_states(folder: Path, passages: list[str], passage_ids: list[str] | None, encoder,
                   progress: bool | None = None, id_field: str = "_id") -> IndexStates:
    """Token states of `passages` taken from the index's kept states (by document id, else by
    exact text); the few the index lacks are encoded."""
    from semsearch.store.segments import read_rows

    m = _open(folder, encoder)
    by_id: dict[str, tuple[str, int, int]] = {}
    by_text: dict[str, tuple[str, int, int]] = {}
    for _, ord_, text, meta, sf, so, sl in read_rows(
            folder, m, "c.ord, c.text, c.metadata, c.state_file, c.state_off, c.state_len", "c.state_file IS NOT NULL"):
        ref = (sf, so, sl)
        if ord_ == 0 and meta:
            doc = json.loads(meta).get(id_field)
            if doc is not None:
                by_id.setdefault(str(doc), ref)
        by_text.setdefault(text, ref)
    refs: list[tuple[str, int, int] | None] = []
    for i, text in enumerate(passages):
        ref = by_id.get(passage_ids[i]) if passage_ids is not None else None
        refs.append(ref or by_text.get(text))
    missing = [i for i, r in enumerate(refs) if r is None]
    found = [(i, r) for i, r in enumerate(refs) if r is not None]
    if not found:
        raise InputError(f"{folder}: none of the {len(passages)} training passages is in this index "
                         "(a BEIR corpus must be indexed from its corpus.jsonl, with --text-column title,text)")
    cache = _spans(folder, m.states["dim"], [r for _, r in found])
    spans = np.zeros((len(passages), 3), np.int64)
    spans[[i for i, _ in found]] = np.stack([cache.part, cache.start, cache.length], 1)
    parts = list(cache.parts)
    if missing:
        log.warning("%d of %d training passages are not in %s: encoding them", len(missing), len(passages), folder)
        extra = StateCache.build(encoder, [passages[i] for i in missing], progress)
        spans[missing] = np.stack([np.full(len(missing), len(parts)), extra.start, extra.length], 1)
        parts.append(extra.parts[0])
    return IndexStates(StateCache.from_spans(parts, spans), len(found), len(missing))
