"""Typed errors raised by the library; only the CLI turns them into messages and exit codes."""
from __future__ import annotations


class SemsearchError(Exception):
    """Base class of every error semsearch raises on purpose.

    `given`: the caller's own text as the message quotes it (an id, a path it sent), which a
    server's message scrubber leaves as it is: an id that looks like a path is echoed, not
    rewritten into another id the caller would then retry with."""

    given: tuple[str, ...] = ()

    def quoting(self, *given: str) -> "SemsearchError":
        self.given = tuple(given)
        return self


class InputError(SemsearchError, ValueError):
    """A bad argument: unknown option value, empty query, missing path."""


class CorpusError(SemsearchError):
    """A corpus file that cannot be read as asked (names the file and line)."""


class ModelError(SemsearchError):
    """A model folder that is missing or cannot be loaded."""


class IndexFormatError(SemsearchError):
    """An index folder that is missing, damaged, or written by another format version."""


class SettingsMismatch(SemsearchError):
    """A request whose model, pooling or head differs from the index's own."""


class HeadCorpusMismatch(SettingsMismatch):
    """A trained head given for an index of another corpus than the one it was trained on."""


class IndexLocked(SemsearchError):
    """Another process is writing the same index."""


class DocumentNotFound(InputError):
    """A document id that the index does not hold."""


class TooLarge(InputError):
    """A write that would cause more work than one request may (HTTP 413)."""
