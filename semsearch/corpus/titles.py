"""What a chunk is searched by besides its own text: the titles above it.

A chunk deep in a section of a page rarely repeats the page's title or its section's heading,
yet those are the words a reader looks it up by ("Bad files", "semsearch serve"). A chunk of a
structured file (PDF, HTML, Word, Markdown: the extractors record `title` and `section` in its
metadata) gets a context, `Title > Section > Subsection`, that BM25 indexes with its text
(ChunkRow.lexical_text) and that the encoder reads before it (`embedding_text`). The chunk's
stored text, offsets and snippets stay its own.

The context is made from the chunk's path and stored metadata alone, so that what explains a hit
later (semsearch/explain.py) rebuilds the very input that was encoded without the docstore
keeping it. Records of a table or JSON file keep no context even where they have a `title`
field: it is the user's metadata there (SciFact's `title`, say), and `--text-column title,text`
is how to search by it.

An index records in its chunking settings whether its chunks were embedded with their context
(`context`: CONTEXT, or 0 for an index built before, which keeps embedding without it until
rebuilt), so one index never mixes the two.
"""
from __future__ import annotations

from typing import Any, Mapping

from semsearch.corpus.chunking import CONTEXT
from semsearch.corpus.formats import STRUCTURED_EXTS
SEPARATOR = "\n\n"  # between the context and the text, in what the encoder reads
API_PREFIX = "api:"  # documents given through the API (semsearch.documents): their metadata is the user's


def _suffix(path: str) -> str:
    name = path.replace("\\", "/").rsplit("/", 1)[-1].lower()
    return "." + name.rsplit(".", 1)[-1] if "." in name else ""


def has_titles(path: str) -> bool:
    """Whether chunks of the file at `path` (a docstore path) carry their titles as context."""
    return not path.startswith(API_PREFIX) and _suffix(path) in STRUCTURED_EXTS


def titles_of(metadata: Mapping[str, Any] | None) -> str:
    """`Title > Section > Subsection` from a chunk's `title` and `section` metadata; the title
    once where the section path already starts with it (an HTML page's h1); "" without either."""
    meta = metadata or {}
    title = meta.get("title") if isinstance(meta.get("title"), str) else ""
    section = meta.get("section") if isinstance(meta.get("section"), str) else ""
    title, section = " ".join(title.split()), " ".join(section.split())
    if not section:
        return title
    if not title or section == title or section.startswith(title + " > "):
        return section
    return f"{title} > {section}"


def chunk_context(path: str, metadata: Mapping[str, Any] | None, version: int = CONTEXT) -> str:
    """The context of a chunk of the file at `path` with this metadata, in an index whose
    chunking settings record `version` (0: none)."""
    if not version or not has_titles(path):
        return ""
    return titles_of(metadata)


def embedding_text(context: str, text: str) -> str:
    """What the encoder reads for a chunk: its context, a blank line, its text (the tokenizer
    truncates the whole at the model's length, as it would the text alone)."""
    return f"{context}{SEPARATOR}{text}" if context else text


def prefix_length(context: str) -> int:
    """Characters before the chunk's text in embedding_text(context, text)."""
    return len(context) + len(SEPARATOR) if context else 0
