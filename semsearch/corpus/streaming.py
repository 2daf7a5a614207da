"""Chunk a large text file as a stream: bounded memory, the same chunks as chunking it whole.

The text is read in blocks of about a million characters, each cut after its last whitespace so
no token straddles two blocks (BERT-family tokenizers split on whitespace first), tokenized
block by block, and windowed exactly as `chunk_text` windows the whole text. Only the tokens
and text of the window in progress are kept, plus a running count of lines.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Sequence

from semsearch.corpus.chunking import Chunk, ChunkSettings, Offsets, window_end

BLOCK_CHARS = 1 << 20
_WS = (" ", "\n", "\t", "\r")


def text_blocks(path: Path, block_chars: int | None = None, on_bytes: Callable[[int], None] | None = None) -> Iterator[str]:
    """The UTF-8 text of a file (BOM dropped, newlines as they are) in blocks of block_chars;
    on_bytes(n) is told of each block's size in bytes (for a progress bar)."""
    block_chars = block_chars or BLOCK_CHARS
    with open(path, "rb") as raw:
        import io

        fh = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        pos = 0
        while block := fh.read(block_chars):
            if on_bytes is not None:
                now = raw.tell()
                on_bytes(now - pos)
                pos = now
            yield block


def chunk_stream(blocks: Iterator[str], offsets: Offsets, settings: ChunkSettings,
                 boundaries: Sequence[int] = ()) -> Iterator[tuple[Chunk, int]]:
    """(chunk, 1-based line of its start) for a text given as blocks; the chunks are those of
    `chunk_text` over the joined text (offsets are into the whole text). `boundaries` (section
    starts, sorted character offsets) may grow while the blocks are read: the reader adds those
    of a block before it yields the block."""
    W = settings.window
    spans: list[tuple[int, int]] = []  # tokens from the current window's start on, global offsets
    buf, buf_base = "", 0  # tokenized text from spans[0]'s start (or later, when spans is empty)
    carry, carry_base = "", 0  # text read but not tokenized yet (may end inside a word)
    lines_before = 0  # newlines in the text before buf_base

    def tokenize(piece: str, base: int) -> None:
        nonlocal buf
        spans.extend((base + s, base + e) for s, e in offsets(piece))
        buf += piece

    def trim(i: int) -> None:
        """Forget tokens before index i, and the text before the first one kept."""
        nonlocal spans, buf, buf_base, lines_before
        spans = spans[i:]
        keep_from = spans[0][0] if spans else carry_base
        cut = keep_from - buf_base
        if cut > 0:
            lines_before += buf.count("\n", 0, cut)
            buf, buf_base = buf[cut:], keep_from

    def emit(i: int, j: int) -> tuple[Chunk, int]:
        start, end = spans[i][0], spans[j - 1][1]
        line = lines_before + buf.count("\n", 0, start - buf_base) + 1
        return Chunk(buf[start - buf_base : end - buf_base], start, end, j - i), line

    for block in blocks:
        carry += block
        cut = max(carry.rfind(c) for c in _WS) + 1
        if cut <= 0:
            if len(carry) < 8 * BLOCK_CHARS:
                continue  # no whitespace yet: wait for more (cut anyway past 8 blocks)
            cut = len(carry)
        tokenize(carry[:cut], carry_base)
        carry, carry_base = carry[cut:], carry_base + cut
        i = 0
        while len(spans) > i + W:  # a full window with tokens after it: not the last one
            j, nxt = window_end(spans, i, None, settings, boundaries)
            yield emit(i, j)
            i = nxt
        trim(i)
    if carry:
        tokenize(carry, carry_base)
        carry_base += len(carry)
        carry = ""
    if not spans:
        return
    i: int | None = 0
    while i is not None:
        j, i2 = window_end(spans, i, len(spans), settings, boundaries)
        yield emit(i, j)
        i = i2
