"""Fusion of dense (cosine) and lexical (BM25) scores into one ranking: pure functions.

Both are computed over the same candidate set, the union of each side's top `depth`, with the
other side's score filled in exactly (the cosine from the stored vector, BM25 from the postings),
so no candidate is ranked on half its evidence.

- `convex` (default): alpha * minmax(dense) + (1 - alpha) * minmax(lexical), min-max over the
  candidates of one query. Cosines and BM25 scores live on different scales (BM25 is unbounded
  and grows with query length), so each is mapped to [0, 1] within the query first.
- `rrf`: reciprocal rank fusion, sum of 1 / (rrf_k + rank) over both sides (rank from 1).

Either way, for a query of ALL_TERMS_MIN or more terms (those some chunk holds, question words
such as "how" and "what" not counted: semsearch.store.lexical.QUESTION_WORDS), a candidate that
holds every one of them ranks before those that do not (`all_terms_first`: +1 to its fused
score). A long query whose every word one chunk holds is most often that chunk's words (a
passage, an error message, a line of a table); the dense side, which cannot place verbatim
strings such as option tables and code, pulled such a chunk below others in hybrid (a rendered
manual's 10-word passages: the page found 83.3 % by hybrid against 92.3 % by BM25 alone; 93.0 %
with this). Chosen with SciFact's train queries (nDCG@10 73.69 -> 73.70) and half of those
passages and of the manual's how-to questions; docs/design.md has the figures.
"""
from __future__ import annotations

import numpy as np

from semsearch.errors import InputError

MODES = ("dense", "lexical", "hybrid")
FUSIONS = ("convex", "rrf")
# Weight of the dense side in the convex combination, chosen on SciFact *train* queries
# (scripts/tune_hybrid.py; the test split was never used to pick it).
ALPHA = 0.5
DEPTH = 100  # candidates taken from each side before fusion
RRF_K = 60
ALL_TERMS_MIN = 5  # a query of this many terms or more: the candidates holding all of them first


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise InputError(f"unknown search mode {mode!r}; valid modes are: {', '.join(MODES)}")
    return mode


def check_fusion(fusion: str) -> str:
    if fusion not in FUSIONS:
        raise InputError(f"unknown fusion {fusion!r}; valid fusions are: {', '.join(FUSIONS)}")
    return fusion


def minmax(x: np.ndarray) -> np.ndarray:
    """x mapped to [0, 1]; where x is constant (one candidate, or no query term anywhere), all
    ones if it is positive and all zeros otherwise: it ranks nothing either way."""
    x = np.asarray(x, np.float64)
    if not len(x):
        return x
    lo, hi = x.min(), x.max()
    return (x - lo) / (hi - lo) if hi > lo else np.full_like(x, 1.0 if hi > 0 else 0.0)


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based rank of each score, best first (ties share the order of appearance)."""
    order = np.argsort(-np.asarray(x), kind="stable")
    r = np.empty(len(x), np.int64)
    r[order] = np.arange(1, len(x) + 1)
    return r


def fuse(dense: np.ndarray, lexical: np.ndarray, fusion: str = "convex", alpha: float = ALPHA,
         rrf_k: int = RRF_K) -> np.ndarray:
    """Fused scores (m,) of m candidates given their dense and lexical scores (m,) each."""
    dense, lexical = np.asarray(dense, np.float64), np.asarray(lexical, np.float64)
    if fusion == "convex":
        if not 0.0 <= alpha <= 1.0:
            raise InputError(f"alpha must be in [0, 1], got {alpha}")
        return alpha * minmax(dense) + (1 - alpha) * minmax(lexical)
    if fusion == "rrf":
        return 1.0 / (rrf_k + ranks(dense)) + 1.0 / (rrf_k + ranks(lexical))
    raise InputError(f"unknown fusion {fusion!r}; valid fusions are: {', '.join(FUSIONS)}")


def all_terms(held: np.ndarray, n_terms: int) -> np.ndarray:
    """Which candidates hold all of a query's n_terms terms (none for a query of fewer than
    ALL_TERMS_MIN): they rank first."""
    held = np.asarray(held)
    return held >= n_terms if n_terms >= ALL_TERMS_MIN else np.zeros(len(held), bool)


def all_terms_first(fused: np.ndarray, held: np.ndarray, n_terms: int) -> np.ndarray:
    """Fused scores with 1 added for the candidates that hold all of a long query's terms."""
    return np.asarray(fused, np.float64) + all_terms(held, n_terms)


def top(ids: np.ndarray, fused: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k best candidates, best first (ties: lower id first)."""
    order = np.lexsort((np.asarray(ids), -np.asarray(fused)))
    return order[:k]
