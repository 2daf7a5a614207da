"""Term analysis: a text's words, Lucene's English stop words, Porter2 stems, and the 64-bit
term hashes every posting file stores (changing any of it changes ANALYZER)."""
from __future__ import annotations

import functools
import hashlib
import re
import sys
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


class _WordTable:
    """encode_terms_many's memory of words up to 16 bytes: each word's bytes packed into two
    uint64 (zero-padded: the exact word, not a hash of it), a 64-bit mix of those as the sort key,
    and the word's code (term hash, or _STOP). A batch's words are looked up all at once with
    numpy (searchsorted on the keys, the packed bytes compared to rule out a shared key); only the
    words it has not met go through Python (_code). Why by hand: a Python dict look-up per word
    took ~0.3 us of this build's ~1 us a word at 200k distinct words (cache misses), and no
    tokenizer library gives these exact words, stop words and Porter2 stems as numpy arrays."""

    LIMIT = 1 << 20  # words remembered (32 bytes each), as _CODES; past it the table starts again

    def __init__(self):
        # (keys, packed, codes), replaced as one tuple: threads that encode at once each read a
        # consistent table (one's new words may be lost to the other's: a cache, nothing more)
        self.state = (np.zeros(0, np.uint64), np.zeros((0, 2), np.uint64), np.zeros(0, np.int64))

    def codes_of(self, key: np.ndarray, packed: np.ndarray, word) -> np.ndarray:
        """Codes of distinct words (their keys, packed bytes; word(i): the i-th word as a str)."""
        keys, held, codes = self.state
        n = len(keys)
        pos = np.searchsorted(keys, key)
        at = np.minimum(pos, max(n - 1, 0))
        found = (pos < n) & (keys[at] == key) & (held[at] == packed).all(axis=1) if n else np.zeros(len(key), bool)
        out = np.empty(len(key), np.int64)
        out[found] = codes[at[found]]
        miss = np.flatnonzero(~found)
        if len(miss):
            out[miss] = [_code(word(i)) for i in miss.tolist()]
            miss = miss[(pos[miss] >= n) | (keys[at[miss]] != key[miss])] if n else miss  # a key held for another word stays its
            if n + len(miss) > self.LIMIT:
                keys, held, codes = keys[:0], held[:0], codes[:0]
            keys = np.concatenate([keys, key[miss]])
            order = np.argsort(keys, kind="stable")
            self.state = (keys[order], np.concatenate([held, packed[miss]])[order], np.concatenate([codes, out[miss]])[order])
        return out


_TABLE = _WordTable()
_PACK = 16  # bytes of a word the table keeps; longer words go through _CODES
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))
_LITTLE = sys.byteorder == "little"
_KEEP = np.array([(1 << (8 * i)) - 1 for i in range(9)], np.uint64)  # the low i bytes of a uint64 (little-endian)


def _distinct_codes(words) -> np.ndarray:
    """The code of each of a batch's distinct words (an Arrow large_string array, no nulls; the
    empty word, which splitting leaves at a text's ends, is a stop word): words up to 16 bytes
    from _TABLE, all at once in numpy over the array's own buffers, longer ones from _CODES."""
    n = len(words)
    codes = np.empty(n, np.int64)
    if n == 0:
        return codes
    offs = np.frombuffer(words.buffers()[1], np.int64)[words.offset: words.offset + n + 1]
    buf = np.frombuffer(words.buffers()[2], np.uint8) if words.buffers()[2] is not None else np.zeros(0, np.uint8)
    starts, size = offs[:-1], np.diff(offs)
    codes[size == 0] = _STOP
    pack = _PACK if _LITTLE else 0  # (_KEEP's masks are little-endian)
    short = np.flatnonzero((size > 0) & (size <= pack))
    if len(short):
        s0, n0 = starts[short], size[short]
        # each word's first 16 bytes (rows of a view of every 16-byte window of the buffer), then
        # the bytes past its end zeroed: (k, 2) uint64 that hold the word exactly
        padded = np.concatenate([buf, np.zeros(_PACK, np.uint8)])
        windows = np.lib.stride_tricks.as_strided(padded, (len(buf), _PACK), (1, 1), writeable=False)
        packed = np.ascontiguousarray(windows[s0]).view(np.uint64)
        packed[:, 0] &= _KEEP[np.minimum(n0, 8)]
        packed[:, 1] &= _KEEP[np.maximum(n0 - 8, 0)]
        key = packed[:, 0] * _MIX[0] ^ packed[:, 1] * _MIX[1]
        order = np.argsort(key)  # sorted keys: the table's binary searches then narrow from the last one
        key = key[order]
        if len(key) > 1 and (key[1:] == key[:-1]).any():  # two distinct words share a key (rare): one by one
            codes[short] = _py_codes(_spans(buf, s0, s0 + n0))
        else:
            raw, s0, n0 = buf.tobytes(), s0[order], n0[order]
            codes[short[order]] = _TABLE.codes_of(key, packed[order], lambda i: raw[s0[i]:s0[i] + n0[i]].decode("utf-8"))
    long_ = np.flatnonzero(size > pack)
    if len(long_):
        codes[long_] = _py_codes(_spans(buf, starts[long_], starts[long_] + size[long_]))
    return codes


def _spans(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    raw = buf.tobytes()
    return [raw[a:b].decode("utf-8") for a, b in zip(starts.tolist(), ends.tolist())]


def _py_codes(words: list[str]) -> list[int]:
    """Each word's code from _CODES (one dict look-up a word), _code for words not met yet."""
    codes = list(map(_CODES.get, words))
    if None in codes:
        codes = [c if c is not None else _code(w) for w, c in zip(words, codes)]
    return codes


SMALL_BATCH = 64  # texts below which encode_terms_many analyses each text alone


def encode_terms_many(texts: list[str]) -> list[tuple[bytes, int]]:
    """encode_terms of each text: a build's batch through Arrow (_encode_batch), a small one (a
    one-document write's few chunks) text by text, which needs no Arrow: its import, the first
    time a process wrote, was ~0.5 s of a one-document upsert's 0.6 s at 1M chunks."""
    if len(texts) < SMALL_BATCH:
        return [encode_terms(t) for t in texts]
    return _encode_batch(texts)


def _encode_batch(texts: list[str]) -> list[tuple[bytes, int]]:
    """encode_terms of each text, for a build's batch (tests/test_posting_file.py checks that both
    give the same bytes). The batch's words are split and made distinct in Arrow's C++ kernels
    (ASCII texts after one translate, as _words splits them; other texts' words from _words),
    each distinct word is coded once (_distinct_codes), and the counting and sorting of each
    text's stems runs once over the whole batch in numpy. Why Arrow: splitting and a hash table
    of 400k words in C++ took a third of the time of the numpy sort it replaces (a build spent
    ~125 us a chunk of 200 words here, its largest cost after the model; docs/benchmarks.md)."""
    if not texts:
        return []
    import pyarrow as pa  # (imported here: a build's, not a query's, import time)
    import pyarrow.compute as pc

    ascii_ = [i for i, t in enumerate(texts) if t.isascii()]
    other = [i for i, t in enumerate(texts) if not t.isascii()] if len(ascii_) < len(texts) else []
    words, docs = [], []
    if ascii_:
        sel = texts if not other else [texts[i] for i in ascii_]
        buf = "".join(sel).encode("ascii").translate(_ASCII_WORDS)
        offsets = np.zeros(len(sel) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, sel), np.int64, len(sel)), out=offsets[1:])
        split = pc.ascii_split_whitespace(pa.LargeStringArray.from_buffers(len(sel), pa.py_buffer(offsets), pa.py_buffer(buf)))
        words.append(split.flatten())
        parent = pc.list_parent_indices(split).to_numpy()
        docs.append(parent if not other else np.asarray(ascii_, np.int64)[parent])
    if other:
        found = [_words(texts[i]) for i in other]
        words.append(pa.array([w for ws in found for w in ws], pa.large_string()))
        docs.append(np.repeat(np.asarray(other, np.int64), np.fromiter(map(len, found), np.int64, len(found))))
    encoded = pc.dictionary_encode(pa.concat_arrays(words) if len(words) > 1 else words[0])
    word = encoded.indices.to_numpy()
    doc = np.concatenate(docs).astype(np.int64, copy=False)
    stems, stem_of = np.unique(_distinct_codes(encoded.dictionary), return_inverse=True)  # words of one stem: one code
    stem = stem_of.reshape(-1)[word]
    keep = stems[stem] != _STOP
    doc, stem = doc[keep], stem[keep]
    key = np.sort(doc * max(len(stems), 1) + stem)  # by text, then by stem hash (stems is sorted)
    new = np.ones(len(key), bool)
    new[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(new)
    tf = np.diff(np.r_[starts, len(key)]).astype(np.int32)
    first = key[starts]
    uh = stems[first % max(len(stems), 1)]
    bounds = np.searchsorted(first // max(len(stems), 1), np.arange(len(texts) + 1))
    hb, tb = uh.tobytes(), tf.tobytes()
    totals = np.bincount(doc, minlength=len(texts))
    return [(hb[8 * a : 8 * b] + tb[4 * a : 4 * b], int(totals[i]))
            for i, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist()))]


def decode_terms(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    n = len(blob) // 12
    return np.frombuffer(blob, np.int64, n), np.frombuffer(blob, np.int32, n, offset=8 * n)


@functools.lru_cache(maxsize=1)
def _question_hashes() -> frozenset[int]:
    return frozenset(int(h) for w in QUESTION_WORDS for h in terms(w))


def counted(term: int) -> bool:
    """Whether a query term counts among the terms a candidate must hold all of (not a question word)."""
    return int(term) not in _question_hashes()
