"""Head folders, the model's trained parts: an attention-pooling head or trained query layers,
saved as head.safetensors + head.json (+ the ids of the documents it trained on). Reading and
writing the format lives here, beside the encoder that applies them; training builds them
(semsearch/train) and imports this, never the reverse."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from semsearch.errors import ModelError

HEAD_FORMAT = "semsearch-head v1"


POSITIVES_FILE = "train_positives.txt"


def write_head_folder(folder: Path, module, config: dict[str, Any], positive_ids: list[str] | None) -> dict[str, Any]:
    """head.safetensors (module's weights) + head.json (config) + train_positives.txt (or none)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in module.state_dict().items()}, str(folder / "head.safetensors"))
    cfg = {"format": HEAD_FORMAT, **config}
    (folder / "head.json").write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
    if positive_ids is not None:
        (folder / POSITIVES_FILE).write_text("".join(f"{d}\n" for d in sorted(set(positive_ids))), encoding="utf-8")
    else:
        (folder / POSITIVES_FILE).unlink(missing_ok=True)
    return head_info(folder)


def unseen_document_queries(folder: str | Path, qrels: dict[str, dict[str, int]]) -> list[str] | None:
    """The queries of qrels none of whose relevant documents the head trained on as a positive;
    None when the head folder does not record its training documents (e.g. trained on a pairs file)."""
    path = Path(folder) / POSITIVES_FILE
    if not path.exists():
        return None
    seen = set(path.read_text(encoding="utf-8").split())
    return [q for q, rel in qrels.items() if not any(r > 0 and d in seen for d, r in rel.items())]


QUERY_LAYERS = "query-layers"  # a head of fine-tuned query-encoder layers (encoder/query_layers.py)


def head_info(folder: Path) -> dict[str, Any]:
    """{'path', 'fingerprint'} (+ 'kind': 'query-layers' for trained query layers), as the manifest records it."""
    folder = Path(folder).resolve()
    h = hashlib.sha256((folder / "head.safetensors").read_bytes()).hexdigest()[:16]
    info = {"path": str(folder), "fingerprint": h}
    if head_kind(folder) == QUERY_LAYERS:
        info["kind"] = QUERY_LAYERS
    return info


def head_kind(folder: str | Path) -> str:
    """'pooling' (an attention-pooling head, applied to documents and queries) or 'query-layers'."""
    try:
        cfg = json.loads((Path(folder) / "head.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "pooling"
    return cfg.get("kind", "pooling") if isinstance(cfg, dict) else "pooling"


def is_query_head(info: dict[str, Any] | None) -> bool:
    """Whether a manifest's head record is trained query layers (documents keep their pooling)."""
    return bool(info) and info.get("kind") == QUERY_LAYERS


def head_pooling(folder: str | Path) -> str:
    """The pooling an index built with this head records: 'head' for a pooling head, the
    documents' own pooling for query layers."""
    cfg = read_head_config(folder)
    return cfg.get("doc_pooling", "mean") if cfg.get("kind") == QUERY_LAYERS else "head"


class PendingTower:
    """Trained query layers read from a head folder, built once the encoder knows its model's config."""

    kind = QUERY_LAYERS

    def __init__(self, folder: Path, cfg: dict[str, Any]):
        self.folder, self.cfg = Path(folder), cfg

    def build(self, model_cfg):
        from semsearch.encoder.query_layers import load_tower

        return load_tower(self.folder, model_cfg, self.cfg)


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
    """The AttentionHead saved in folder, or a PendingTower for trained query layers (see
    read_head_config for the base-model check)."""
    from safetensors.torch import load_file

    from semsearch.encoder.pooling import AttentionHead

    cfg = read_head_config(folder, base_fingerprint)
    if cfg.get("kind") == QUERY_LAYERS:
        return PendingTower(Path(folder), cfg)
    head = AttentionHead(cfg["dim"], cfg.get("out_dim"))
    head.load_state_dict(load_file(str(Path(folder) / "head.safetensors")))
    return head.eval()
