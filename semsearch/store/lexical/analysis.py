"""Term analysis: a text's words, Lucene's English stop words, Porter2 stems, and the 64-bit
term hashes every posting file stores (changing any of it changes ANALYZER)."""
from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter

import numpy as np


ANALYZER = "words-lower-stop-porter2-v1"  # changes here change every stored term: bump it
# Words that phrase a question rather than name its subject: not counted when hybrid search asks
# which candidates hold all of a long query's terms (semsearch/fusion.py). "how to configure the
# proxy timeout" asks for the chunks with configure, proxy and timeout, wherever "how" is.
QUESTION_WORDS = ("how", "what", "why", "when", "where", "which", "who", "whom", "whose", "do", "does", "did",
                  "can", "could", "should", "would")

# Lucene's English stop set: frequent words that match nearly every chunk and rank nothing.
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)

_WORD = re.compile(r"\w+", re.UNICODE)


@functools.lru_cache(maxsize=1)
def _stemmer():
    import snowballstemmer  # uses PyStemmer's C implementation where it is installed

    return snowballstemmer.stemmer("english")


def _term(word: str) -> int:
    """The 64-bit hash of a word's stem (a signed int64); remembered in _HASHES (bounded)."""
    h = _HASHES.get(word)
    if h is None:
        stem = _stemmer().stemWord(word)
        h = int.from_bytes(hashlib.blake2b(stem.encode("utf-8"), digest_size=8).digest(), "little", signed=True)
        if len(_HASHES) > 1 << 20:
            _HASHES.clear()
        _HASHES[word] = h
    return h


def terms(text: str) -> list[int]:
    """The analysed terms of a text, in order (stop words dropped)."""
    return [_term(w) for w in _words(text) if w not in STOPWORDS]


# Lower-case ASCII letters, digits and "_" (what \w matches in ASCII) kept, every other byte a
# space: an ASCII text's words are then one C-level translate and split, several times faster
# than the regular expression, with the same words (tests/test_posting_file.py checks both ways agree).
_ASCII_WORDS = bytes(c + 32 if 65 <= c <= 90 else c if chr(c).isalnum() and c < 128 or c == 95 else 32 for c in range(256))
_HASHES: dict[str, int] = {}  # word -> term hash: _term's memory (a dict look-up per word)


def _words(text: str) -> list[str]:
    """A text's words, lower-cased (as _WORD.findall(text.lower()))."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_WORDS).decode("ascii").split()
    return _WORD.findall(text.lower())


def encode_terms(text: str) -> tuple[bytes, int]:
    """(blob of sorted term hashes int64 + their counts int32, number of terms) for a chunk.
    The same as counting terms(text), in C-level passes where it can (building an index of
    chunks of 200 words analyses each in ~0.25 ms instead of ~0.35)."""
    words = Counter(_words(text))
    for w in STOPWORDS.intersection(words):
        del words[w]
    hashes = list(map(_HASHES.get, words))  # _term's memory, read without a call per word
    if None in hashes:
        hashes = [h if h is not None else _term(w) for w, h in zip(words, hashes)]
    h = np.array(hashes, np.int64)
    tf = np.fromiter(words.values(), np.int64, len(words))
    order = np.argsort(h)
    h, tf = h[order], tf[order]
    if len(h) > 1 and (h[1:] == h[:-1]).any():  # words with one stem ("runs", "running")
        h, start = np.unique(h, return_index=True)
        tf = np.add.reduceat(tf, start)
    return h.tobytes() + tf.astype(np.int32).tobytes(), int(tf.sum())


_STOP = np.iinfo(np.int64).min  # encode_terms_many: a stop word's code (no stem's hash is this value in practice)
_CODES: dict[str, int] = {}  # word -> term hash, or _STOP for a stop word: encode_terms_many's memory


def _code(word: str) -> int:
    c = _STOP if word in STOPWORDS else _term(word)
    if len(_CODES) > 1 << 20:
        _CODES.clear()
    _CODES[word] = c
    return c


def encode_terms_many(texts: list[str]) -> list[tuple[bytes, int]]:
    """encode_terms of each text, for a batch: each text's words are split and looked up in
    Python (one C-level split and one dict look-up a word), and the counting, sorting and
    merging of stems run once over the whole batch in numpy instead of a few numpy calls per
    text (200k short chunks of a build: ~70 us a chunk -> ~15; tests/test_posting_file.py checks
    that both give the same bytes)."""
    if not texts:
        return []
    words = [_words(t) for t in texts]
    flat = [w for ws in words for w in ws]
    codes = list(map(_CODES.get, flat))
    if None in codes:
        codes = [c if c is not None else _code(w) for w, c in zip(flat, codes)]
    h = np.array(codes, np.int64)
    doc = np.repeat(np.arange(len(texts), dtype=np.int64), np.fromiter(map(len, words), np.int64, len(words)))
    keep = h != _STOP
    h, doc = h[keep], doc[keep]
    order = np.lexsort((h, doc))
    h, doc = h[order], doc[order]
    new = np.ones(len(h), bool)
    new[1:] = (h[1:] != h[:-1]) | (doc[1:] != doc[:-1])
    starts = np.flatnonzero(new)
    tf = np.diff(np.r_[starts, len(h)]).astype(np.int32)
    uh, udoc = h[starts], doc[starts]
    bounds = np.searchsorted(udoc, np.arange(len(texts) + 1))
    hb, tb = uh.tobytes(), tf.tobytes()
    totals = np.bincount(doc, minlength=len(texts))
    out = []
    for i, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
        out.append((hb[8 * a : 8 * b] + tb[4 * a : 4 * b], int(totals[i])))
    return out


def decode_terms(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    n = len(blob) // 12
    return np.frombuffer(blob, np.int64, n), np.frombuffer(blob, np.int32, n, offset=8 * n)


@functools.lru_cache(maxsize=1)
def _question_hashes() -> frozenset[int]:
    return frozenset(int(h) for w in QUESTION_WORDS for h in terms(w))


def counted(term: int) -> bool:
    """Whether a query term counts among the terms a candidate must hold all of (not a question word)."""
    return int(term) not in _question_hashes()
