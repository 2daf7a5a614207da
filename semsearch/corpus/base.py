"""What every reader of the corpus layer shares: the signal that skips a file, and the UTF-8 check."""
from __future__ import annotations

from pathlib import Path


class Skip(Exception):
    """A file that is skipped with a warning (not UTF-8, unreadable), carrying the reason."""


def check_utf8(path: Path) -> None:
    """Raise Skip naming the file offset of the first byte that is not UTF-8."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            try:
                dec.decode(block)
            except UnicodeDecodeError as e:
                raise Skip(f"not UTF-8 (byte {offset + e.start})") from e
            offset += len(block)
        try:
            dec.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise Skip(f"not UTF-8 (byte {offset + e.start})") from e
