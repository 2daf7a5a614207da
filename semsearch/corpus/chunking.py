"""Split a document into overlapping token windows that keep their character offsets."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from semsearch.errors import InputError

Offsets = Callable[[str], list[tuple[int, int]]]  # text -> (start, end) of each content token


@dataclass(frozen=True)
class ChunkSettings:
    window: int = 254  # content tokens a chunk; + [CLS] and [SEP] = the model's 256
    overlap: int = 32

    def check(self, max_length: int) -> "ChunkSettings":
        if self.window < 1:
            raise InputError(f"--chunk-tokens must be positive, got {self.window}")
        if not 0 <= self.overlap < self.window:
            raise InputError(f"--overlap must be in [0, {self.window}), got {self.overlap}")
        if self.window > max_length - 2:
            raise InputError(f"--chunk-tokens {self.window} exceeds the model's {max_length - 2} content tokens")
        return self


@dataclass
class Chunk:
    text: str
    start: int  # character offsets in the document text
    end: int
    n_tokens: int


def chunk_text(text: str, offsets: Offsets, settings: ChunkSettings) -> Iterator[Chunk]:
    """Token windows of `settings.window` tokens, each sharing `settings.overlap` with the last."""
    spans = offsets(text)
    if not spans:  # nothing the model would see (blank, or only characters the tokenizer drops)
        return
    step = settings.window - settings.overlap
    i = 0
    while True:
        w = spans[i : i + settings.window]
        start, end = w[0][0], w[-1][1]
        yield Chunk(text[start:end], start, end, len(w))
        if i + settings.window >= len(spans):
            break
        i += step


def line_of(text: str, offset: int) -> int:
    """1-based line number of a character offset."""
    return text.count("\n", 0, offset) + 1
