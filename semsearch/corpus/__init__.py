"""The corpus: walking folders, reading formats, chunking into token windows."""
from semsearch.corpus.chunking import Chunk, ChunkSettings, chunk_text
from semsearch.corpus.readers import Document, ReadOptions, read_documents
from semsearch.corpus.walk import walk

__all__ = ["Chunk", "ChunkSettings", "Document", "ReadOptions", "chunk_text", "read_documents", "walk"]
