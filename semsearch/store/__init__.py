"""The index folder: manifest, FAISS vectors, SQLite docstore."""
from semsearch.store.folder import DEFAULT_INDEX, IndexWriter, index_path, open_index, writer_lock
from semsearch.store.manifest import FORMAT_VERSION, Manifest

__all__ = ["DEFAULT_INDEX", "FORMAT_VERSION", "IndexWriter", "Manifest", "index_path", "open_index", "writer_lock"]
