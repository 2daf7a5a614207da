"""Saving and loading a pooling head: a folder with head.safetensors + head.json."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from semsearch.errors import ModelError

HEAD_FORMAT = "semsearch-head v1"


def save_head(head, folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Write a head and its config; gives back {'path', 'fingerprint'} for manifests."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(tensors, str(folder / "head.safetensors"))
    cfg = {"format": HEAD_FORMAT, "dim": head.dim, "out_dim": head.proj.out_features if head.proj is not None else None, **config}
    (folder / "head.json").write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
    return head_info(folder)


def head_info(folder: Path) -> dict[str, Any]:
    folder = Path(folder).resolve()
    h = hashlib.sha256((folder / "head.safetensors").read_bytes()).hexdigest()[:16]
    return {"path": str(folder), "fingerprint": h}


def read_head_config(folder: str | Path, base_fingerprint: str | None = None) -> dict[str, Any]:
    """A head folder's head.json; refused if trained on another base model than `base_fingerprint`
    (when given). Cheap: the weights are not read."""
    folder = Path(folder)
    if not (folder / "head.json").exists():
        raise ModelError(f"{folder}: not a pooling head folder (no head.json)")
    cfg = json.loads((folder / "head.json").read_text(encoding="utf-8"))
    if cfg.get("format") != HEAD_FORMAT:
        raise ModelError(f"{folder}: head format {cfg.get('format')!r}, expected {HEAD_FORMAT!r}")
    trained_on = cfg.get("base_model_fingerprint")
    if base_fingerprint is not None and trained_on not in (None, base_fingerprint):
        from semsearch.errors import SettingsMismatch

        raise SettingsMismatch(f"{folder}: head was trained on model weights {trained_on}, not {base_fingerprint} ({cfg.get('base_model')})")
    return cfg


def load_head(folder: str | Path, base_fingerprint: str | None = None):
    """The AttentionHead saved in folder (see read_head_config for the base-model check)."""
    from safetensors.torch import load_file

    from semsearch.encoder.pooling import AttentionHead

    cfg = read_head_config(folder, base_fingerprint)
    head = AttentionHead(cfg["dim"], cfg.get("out_dim"))
    head.load_state_dict(load_file(str(Path(folder) / "head.safetensors")))
    return head.eval()
