"""A synthetic corpus with the structure of real text, for the benchmarks at scale.

Uniform noise makes IVF and BM25 behave unlike real data, so: chunks belong to topics; a chunk's
~200 words are drawn 60% from a Zipf distribution over the whole vocabulary (100k terms) and 40%
from its topic's own 500-term Zipf vocabulary; its vector is its topic's centre plus noise, so
vectors form clusters as embeddings do. Queries pick a topic and draw 2-6 words (mostly from the
topic, a few common ones) and a vector near the topic's centre. Deterministic for a seed.
"""
from __future__ import annotations

import numpy as np

VOCAB = 100_000
TOPICS = 2_000
TOPIC_WORDS = 500
WORDS = 200  # mean words per chunk


class Corpus:
    def __init__(self, seed: int = 0, vocab: int = VOCAB, topics: int = TOPICS, dim: int = 384):
        rng = np.random.default_rng(seed)
        self.seed, self.vocab, self.topics, self.dim = seed, vocab, topics, dim
        ranks = np.arange(1, vocab + 1, dtype=np.float64)
        self.p_global = (1 / ranks) / (1 / ranks).sum()
        self.cdf_global = np.cumsum(self.p_global)
        # each topic: TOPIC_WORDS terms from the less common ranks, with their own Zipf weights
        self.topic_words = np.stack([rng.choice(np.arange(300, vocab), TOPIC_WORDS, replace=False) for _ in range(topics)])
        tw = 1 / np.arange(1, TOPIC_WORDS + 1, dtype=np.float64)
        self.cdf_topic = np.cumsum(tw / tw.sum())
        self.centres = rng.standard_normal((topics, dim)).astype(np.float32)
        self.centres /= np.linalg.norm(self.centres, axis=1, keepdims=True)
        self.words = np.array([f"w{i}" for i in range(vocab)])

    def _draw(self, rng, cdf, n):
        return np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)

    def chunk_terms(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(topic per chunk, lengths, term ids flat) of chunks start..start+n (deterministic per block)."""
        rng = np.random.default_rng([self.seed, start])
        topic = rng.integers(0, self.topics, n)
        lengths = rng.integers(WORDS // 2, WORDS * 3 // 2 + 1, n)
        total = int(lengths.sum())
        doc = np.repeat(np.arange(n), lengths)
        from_topic = rng.random(total) < 0.4
        terms = self._draw(rng, self.cdf_global, total)
        t_idx = self._draw(rng, self.cdf_topic, int(from_topic.sum()))
        terms[from_topic] = self.topic_words[topic[doc[from_topic]], t_idx]
        return topic, lengths, terms

    def vectors(self, topic: np.ndarray, start: int, noise: float = 0.9) -> np.ndarray:
        rng = np.random.default_rng([self.seed, start, 1])
        v = self.centres[topic] + noise * rng.standard_normal((len(topic), self.dim)).astype(np.float32) / np.sqrt(self.dim)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def texts(self, start: int, n: int) -> tuple[list[str], np.ndarray]:
        """Chunk texts (each led by its topic's marker word `topic<t>`, which the stand-in encoder reads)."""
        topic, lengths, terms = self.chunk_terms(start, n)
        ends = np.cumsum(lengths)
        words = self.words[terms]
        return [f"topic{t} " + " ".join(words[e - l: e]) for t, e, l in zip(topic.tolist(), ends.tolist(), lengths.tolist())], topic

    def queries(self, n: int, seed: int = 1) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """(term ids per query, topic per query, query vectors)."""
        rng = np.random.default_rng([self.seed, 10_000 + seed])
        topic = rng.integers(0, self.topics, n)
        out = []
        for t in topic.tolist():
            k = int(rng.integers(3, 9))
            n_common = int(rng.integers(1, 4))
            words = list(self.topic_words[t, self._draw(rng, self.cdf_topic, k - n_common)])
            words += list(np.minimum(self._draw(rng, self.cdf_global, n_common) + 20, self.vocab - 1))  # not the very top
            out.append(np.array(list(dict.fromkeys(words)), np.int64))
        vec = self.vectors(topic, 10_000_000 + seed, noise=1.0)
        return out, topic, vec

    def query_texts(self, n: int, seed: int = 1) -> list[str]:
        """Query texts, led by their topic's marker (which BM25 sees as one more rare word)."""
        terms, topic, _ = self.queries(n, seed)
        return [f"topic{t} " + " ".join(self.words[w]) for t, w in zip(topic.tolist(), terms)]


_ASCII_SPACE = np.array([chr(c).isspace() for c in range(256)])


class StandInEncoder:
    """A cheap deterministic encoder for the synthetic corpus: a text starting with `topic<t>`
    is its topic's centre plus noise seeded by the text's hash (what clusters of real embeddings
    look like to an index), in microseconds. Tokens are whitespace-separated words."""

    name = "stand-in"
    fingerprint = "standin02"
    backend = "stand-in"
    precision = "fp32"
    pooling = "mean"
    head_info = None

    def __init__(self, corpus: Corpus, max_length: int = 512):
        self.corpus = corpus
        self.dim = self.out_dim = corpus.dim
        self.max_length = max_length
        self.seconds = 0.0  # time spent encoding

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return standin_offsets(text)

    def chunk_offsets(self):
        """token_offsets for a build's reader process (engines/reader.py): a module function, pickled by name."""
        return standin_offsets

    def encode(self, texts, progress=None) -> np.ndarray:
        import time
        import zlib

        t = time.perf_counter()
        if isinstance(texts, str):
            texts = [texts]
        topic = np.array([int(t.split(" ", 1)[0][5:]) if t.startswith("topic") else zlib.crc32(t.encode()) % self.corpus.topics
                          for t in texts], np.int64) % self.corpus.topics
        seeds = np.array([zlib.crc32(t.encode("utf-8", "replace")) for t in texts], np.uint64)
        noise = np.stack([np.random.default_rng(int(s)).standard_normal(self.dim, np.float32) for s in seeds]) if len(texts) else \
            np.zeros((0, self.dim), np.float32)
        v = self.corpus.centres[topic] + 0.9 * noise / np.sqrt(self.dim)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        self.seconds += time.perf_counter() - t
        return v.astype(np.float32)


def standin_offsets(text: str) -> list[tuple[int, int]]:
    """The spans of the text's runs of non-space characters (as re.finditer(r"\\S+")): with
    numpy for an ASCII text, so the benchmarks time the index's work, not this tokenizer's."""
    if not text.isascii():
        import re

        return [m.span() for m in re.finditer(r"\S+", text)]
    space = np.frombuffer(text.encode("ascii"), np.uint8)
    space = _ASCII_SPACE[space]
    edges = np.flatnonzero(np.diff(np.concatenate(([True], space, [True])).view(np.int8)))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))
