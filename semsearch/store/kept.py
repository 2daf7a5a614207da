"""Kept token states (`--keep-states`): raw files under states/, appended to, shared by generations.

`<name>.f16` holds every kept chunk's token states, fp16 rows of D values; a chunk row names its
file, first row and row count. `<name>.tok` beside it holds, row for row, what the tokenizer made
of the same text: each token's id and its character start and end in the chunk's text (-1, -1
for [CLS], [SEP] and other special tokens). An explanation reads them together, so explaining a
hit neither encodes nor tokenises its text again. A token row whose id is -1 was not recorded
(an encoder without a tokenizer): that chunk is tokenised again. An index kept before token rows
existed has no `.tok` files and is tokenised again too; nothing else changes.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

TOKEN_COLS = 3  # id, start, end (int32)
UNKNOWN = -1


def tokens_name(states_name: str) -> str:
    """The token rows' file beside a states file: '3.f16' -> '3.tok'."""
    return states_name.rsplit(".", 1)[0] + ".tok"


def token_rows(tokens: np.ndarray | None, n: int) -> np.ndarray:
    """(n, 3) int32 rows to write for a chunk of n token states: its token table where it fits,
    else rows marked unknown."""
    if tokens is not None and len(tokens) == n:
        return np.ascontiguousarray(tokens, np.int32).reshape(n, TOKEN_COLS)
    return np.full((n, TOKEN_COLS), UNKNOWN, np.int32)


class StatesFile:
    """One states file and its token rows, opened on the first append (truncating an
    interrupted run's leftovers), appended to chunk by chunk."""

    def __init__(self, folder: Path, name: str):
        self.dir = Path(folder) / "states"
        self.name = name
        self.rows = 0
        self._st = self._tok = None

    @property
    def opened(self) -> bool:
        return self._st is not None

    def append(self, states: np.ndarray, tokens: np.ndarray | None = None) -> tuple[str, int, int]:
        """Append one text's token states (T, D) and token table (T, 3); gives back (file, first
        row, T) for its chunk row."""
        if self._st is None:
            self.dir.mkdir(exist_ok=True)
            self._st = open(self.dir / self.name, "wb")
            self._tok = open(self.dir / tokens_name(self.name), "wb")
        n = int(states.shape[0])
        ref = (self.name, self.rows, n)
        self._st.write(np.ascontiguousarray(states, np.float16).tobytes())
        self._tok.write(token_rows(tokens, n).tobytes())
        self.rows += n
        return ref

    def flush(self) -> None:
        for f in (self._st, self._tok):
            if f is not None:
                f.flush()

    def finish(self) -> None:
        """Flush, fsync and close (a commit)."""
        for f in (self._st, self._tok):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()

    def close(self) -> None:
        for f in (self._st, self._tok):
            if f is not None:
                f.close()

    def unlink(self) -> None:
        self.close()
        for name in (self.name, tokens_name(self.name)):
            (self.dir / name).unlink(missing_ok=True)


def files_of(states_names) -> set[str]:
    """The files under states/ that the named states files use: each and its token rows."""
    return {n for s in states_names for n in (s, tokens_name(s))}


def token_slice(rows: np.ndarray | None, first: int, n: int) -> np.ndarray | None:
    """n token rows of a token-table file's rows (R, 3) from row `first`; None where they are
    not all there or not all recorded."""
    if rows is None or first < 0 or first + n > len(rows):
        return None
    got = rows[first : first + n]
    if n and (got[:, 0] == UNKNOWN).any():
        return None
    return got
