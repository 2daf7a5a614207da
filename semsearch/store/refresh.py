"""Picking up a new generation of an index folder in a long-lived Retriever."""
from __future__ import annotations

import threading

from semsearch.errors import SettingsMismatch
from semsearch.store.folder import open_index
from semsearch.store.integrity import manifest_stamp

_LOCK = threading.Lock()


def reopen(r) -> bool:
    """Swap r's manifest, vector index and docstore for the folder's current generation, if it
    changed; True when it did. The old docstore is left to the garbage collector rather than
    closed, so a search running in another thread finishes on the generation it started with
    (its files stay readable after the writer unlinks them)."""
    with _LOCK:
        stamp = manifest_stamp(r.folder)
        if stamp == r._stamp:
            return False
        device = getattr(r.vectors, "device", "cpu")
        m, vectors, docs = open_index(r.folder, device)
        if m.generation == r.manifest.generation and m.files == r.manifest.files:
            docs.close()
            r._stamp = stamp
            return False
        enc = r.encoder
        if m.model_fingerprint != enc.fingerprint or m.pooling != enc.pooling or \
                (m.head or {}).get("fingerprint") != (r.manifest.head or {}).get("fingerprint"):
            docs.close()
            raise SettingsMismatch(
                f"{r.folder} was rebuilt with other settings (model {m.model} {m.model_fingerprint}, pooling "
                f"{m.pooling!r}); load a new Retriever for it")
        r.manifest, r.vectors, r.docs, r._stamp = m, vectors, docs, stamp
        return True
