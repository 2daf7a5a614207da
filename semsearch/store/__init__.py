"""The index folder: manifest, FAISS vectors, SQLite docstore."""
from semsearch.encoder.hardware import steer_openblas

steer_openblas()  # before any module here imports faiss (its OpenBLAS reads the CPU's name once, when loaded)

from semsearch.store.folder import DEFAULT_INDEX, IndexWriter, index_path, open_index, writer_lock  # noqa: E402
from semsearch.store.manifest import FORMAT_VERSION, Manifest  # noqa: E402

__all__ = ["DEFAULT_INDEX", "FORMAT_VERSION", "IndexWriter", "Manifest", "index_path", "open_index", "writer_lock"]
