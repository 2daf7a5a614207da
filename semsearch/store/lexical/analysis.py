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


def decode_terms(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    n = len(blob) // 12
    return np.frombuffer(blob, np.int64, n), np.frombuffer(blob, np.int32, n, offset=8 * n)


@functools.lru_cache(maxsize=1)
def _question_hashes() -> frozenset[int]:
    return frozenset(int(h) for w in QUESTION_WORDS for h in terms(w))


def counted(term: int) -> bool:
    """Whether a query term counts among the terms a candidate must hold all of (not a question word)."""
    return int(term) not in _question_hashes()
