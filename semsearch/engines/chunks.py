"""A file to chunk rows: the step every engine runs for each file it (re)embeds (the streaming
local path in indexing.py and the workers of engines/work.py), so both give the same chunks."""
from __future__ import annotations

from pathlib import Path

from semsearch.corpus.chunking import ChunkSettings, chunk_text, line_of
from semsearch.corpus.formats import STRUCTURED_EXTS, extract
from semsearch.corpus.readers import TEXT_EXTS, ReadOptions, _check_utf8, read_documents
from semsearch.corpus.streaming import chunk_stream, text_blocks
from semsearch.corpus.titles import chunk_context
from semsearch.errors import CorpusError
from semsearch.store.docstore import ChunkRow


def file_chunks(path: Path, offsets, chunking: ChunkSettings, read: ReadOptions, on_bytes=None, group: int = 64):
    """(document number, [ChunkRow]) for each document of a file (file_id filled in later);
    `offsets(text)` gives the tokens' character spans (the encoder's token_offsets). A text,
    PDF, HTML, Word or Markdown file is streamed in groups of chunks of its one document, in
    bounded memory."""
    if path.suffix.lower() in STRUCTURED_EXTS:  # PDF page by page, HTML, Word, Markdown: with their marks
        yield from _structured_rows(path, offsets, chunking, on_bytes, group)
        return
    if path.suffix.lower() in TEXT_EXTS:
        _check_utf8(path)  # up front: a file that is not UTF-8 is skipped before anything is added
        rows: list[ChunkRow] = []
        try:
            for i, (c, line) in enumerate(chunk_stream(text_blocks(path, on_bytes=on_bytes), offsets, chunking)):
                rows.append(ChunkRow(0, None, i, c.start, c.end, line, c.text, {}))
                if len(rows) >= group:
                    yield 0, rows
                    rows = []
        except (OSError, UnicodeDecodeError) as e:  # changed or gone while read
            raise CorpusError(f"{path}: unreadable ({e})") from e
        yield 0, rows  # also for a file without tokens: it is one (empty) document, as before
        return
    try:
        for n, doc in enumerate(read_documents(path, read)):
            rows = []
            for i, c in enumerate(chunk_text(doc.text, offsets, chunking)):
                line = line_of(doc.text, c.start) if doc.row is None else None
                rows.append(ChunkRow(0, doc.row, i, c.start, c.end, line, c.text, doc.metadata))
            yield n, rows
    except OSError as e:
        raise CorpusError(f"{path}: unreadable ({e.strerror or e})") from e


def _structured_rows(path: Path, offsets, chunking: ChunkSettings, on_bytes=None, group: int = 64):
    """The one document of a PDF, HTML, Word or Markdown file, streamed: each chunk carries its
    page, section path and the title in its metadata (and, where the settings say so, the title
    and section path as its context: semsearch/corpus/titles.py), and stops at a near section
    boundary."""
    try:
        ex = extract(path, on_bytes)  # an encrypted or damaged file fails here, before it is added
        rows: list[ChunkRow] = []
        for i, (c, line) in enumerate(chunk_stream(ex.blocks, offsets, chunking, ex.marks.boundaries)):
            meta = ex.marks.locate(c.start, c.end)
            rows.append(ChunkRow(0, None, i, c.start, c.end, line if ex.keeps_lines else None, c.text, meta,
                                 context=chunk_context(str(path), meta, chunking.titles)))
            if len(rows) >= group:
                yield 0, rows
                rows = []
    except (OSError, UnicodeDecodeError) as e:
        raise CorpusError(f"{path}: unreadable ({e})") from e
    yield 0, rows
