"""Split a document into overlapping token windows that keep their character offsets."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

from semsearch.errors import InputError

Offsets = Callable[[str], list[tuple[int, int]]]  # text -> (start, end) of each content token


CONTEXT = 1  # chunks embedded and indexed with their titles (semsearch/corpus/titles.py): that form's version


@dataclass(frozen=True)
class ChunkSettings:
    window: int = 254  # content tokens a chunk; + [CLS] and [SEP] = the model's 256
    overlap: int = 32
    # Whether chunks carry their titles (semsearch/corpus/titles.py): CONTEXT, or 0 (none: an
    # index built before them keeps it); None: the index's own, CONTEXT for a new index.
    context: int | None = None

    @classmethod
    def of_index(cls, chunking: Mapping[str, int]) -> "ChunkSettings":
        """An index's settings as its manifest records them (one recorded before titles: 0)."""
        return cls(chunking["window"], chunking["overlap"], int(chunking.get("context", 0)))

    @property
    def titles(self) -> int:
        """The context version these settings embed with (None resolved: a new index's)."""
        return CONTEXT if self.context is None else self.context

    def as_manifest(self) -> dict[str, int]:
        return {"window": self.window, "overlap": self.overlap, "context": self.titles}

    def check(self, max_length: int) -> "ChunkSettings":
        if self.window < 1:
            raise InputError(f"--chunk-tokens must be positive, got {self.window}")
        if not 0 <= self.overlap < self.window:
            raise InputError(f"--overlap must be in [0, {self.window}), got {self.overlap}")
        if self.window > max_length - 2:
            raise InputError(f"--chunk-tokens {self.window} exceeds the model's {max_length - 2} content tokens")
        if self.context not in (None, 0, CONTEXT):  # an index a newer semsearch wrote: its chunks' form is unknown here
            raise InputError(f"chunk titles of form {self.context} are not known to this semsearch (it writes form {CONTEXT}); "
                             "rebuild the index with --rebuild, or upgrade semsearch")
        return self


@dataclass
class Chunk:
    text: str
    start: int  # character offsets in the document text
    end: int
    n_tokens: int


def chunk_text(text: str, offsets: Offsets, settings: ChunkSettings, boundaries: Sequence[int] = ()) -> Iterator[Chunk]:
    """Token windows of `settings.window` tokens, each sharing `settings.overlap` with the last.
    `boundaries` (sorted character offsets where a section starts) cut a window short when one
    falls in its second half, so a chunk does not glue the end of a section to the next one."""
    spans = offsets(text)
    if not spans:  # nothing the model would see (blank, or only characters the tokenizer drops)
        return
    i: int | None = 0
    while i is not None:
        end, nxt = window_end(spans, i, len(spans), settings, boundaries)
        start, stop = spans[i][0], spans[end - 1][1]
        yield Chunk(text[start:stop], start, stop, end - i)
        i = nxt


def window_end(spans: Sequence[tuple[int, int]], i: int, n: int | None, settings: ChunkSettings,
               boundaries: Sequence[int] = ()) -> tuple[int, int | None]:
    """(end token index, next window's first token or None) of the window from token i; n is the
    number of tokens when known (None: more follow spans[i + window]). The window stops at the
    last section boundary in its second half (the next one then starts at that boundary, with
    no overlap reaching back into the previous section); otherwise it is `window` tokens and
    the next starts `window - overlap` on, or at a boundary inside that overlap."""
    W = settings.window
    end = i + W if n is None else min(i + W, n)
    last = n is not None and end >= n
    half = i + max(W // 2, 1)
    if boundaries and end - 1 >= half:
        lo = spans[half - 1][0]  # a boundary after this token's start maps to token >= half
        hi = spans[end][0] if not last else spans[end - 1][0]
        k = bisect.bisect_right(boundaries, hi) - 1
        if k >= 0 and boundaries[k] > lo:
            b = bisect.bisect_left(spans, boundaries[k], key=lambda t: t[0])
            if b < (n if n is not None else len(spans)):
                return b, b
    if last:
        return end, None
    nxt = i + W - settings.overlap
    if boundaries and settings.overlap:
        k = bisect.bisect_right(boundaries, spans[end][0]) - 1  # a boundary within the overlap
        if k >= 0 and boundaries[k] > spans[nxt][0]:
            nxt = bisect.bisect_left(spans, boundaries[k], key=lambda t: t[0])
    return end, nxt


def line_of(text: str, offset: int) -> int:
    """1-based line number of a character offset."""
    return text.count("\n", 0, offset) + 1
