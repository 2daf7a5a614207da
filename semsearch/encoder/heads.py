"""Head folders, the model's trained parts: an attention-pooling head or trained query layers,
saved as head.safetensors + head.json (+ the ids of the documents it trained on). Reading and
writing the format lives here, beside the encoder that applies them; training builds them
(semsearch/training) and imports this, never the reverse."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Iterable

from semsearch.errors import ModelError

HEAD_FORMAT = "semsearch-head v1"

log = logging.getLogger(__name__)


POSITIVES_FILE = "train_positives.txt"


def write_head_folder(folder: Path, module, config: dict[str, Any], positive_ids: list[str] | None) -> dict[str, Any]:
    """head.safetensors (module's weights) + head.json (config) + train_positives.txt (or none)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    if "corpus" not in config and getattr(module, "corpus", None):  # set by training: the corpus it learnt from
        config = {**config, "corpus": module.corpus}
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


# ---- the corpus a head was trained on --------------------------------------------------------
# A head learns its corpus: query layers trained on one corpus measured lower than the base model
# on another domain (nDCG@10 dense -1.0, hybrid -0.5 on a held-out argument-retrieval set). So
# head.json records the documents it was trained on, as a bottom-k sketch of their keys, and a
# head given for an index is checked against the index's documents. A sketch rather than one
# hash of the whole set: the index a head was trained on keeps growing and changing, and it
# should still pass; another corpus shares next to none of its documents.
CORPUS_SKETCH = 128  # keys kept: the share below is estimated within about +-0.045
SAME_CORPUS = 0.5  # this share of the head's training documents in an index: the same corpus


def document_key(doc_id: Any, text: str) -> str:
    """A document's key: its id where the corpus gives one (a BEIR or JSONL `_id`), else a hash
    of its text (of its first chunk, in an index)."""
    if doc_id is not None:
        return f"id:{doc_id}"
    return "text:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def index_row_key(metadata: str | None, text: str) -> str:
    """document_key of an index document from its first chunk's metadata (JSON) and text."""
    doc_id = None
    if metadata:
        try:
            meta = json.loads(metadata)
        except ValueError:
            meta = None
        doc_id = meta.get("_id") if isinstance(meta, dict) else None
    return document_key(doc_id, text)


def _key_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big")


def corpus_record(keys: Iterable[str]) -> dict[str, Any]:
    """{'documents', 'fingerprint' (of the whole key set), 'sketch' (the CORPUS_SKETCH smallest
    key hashes, hex)} for head.json."""
    hashes = sorted({_key_hash(k) for k in keys})
    whole = hashlib.sha256(b"".join(h.to_bytes(8, "big") for h in hashes)).hexdigest()[:16]
    return {"documents": len(hashes), "fingerprint": whole, "sketch": [f"{h:016x}" for h in hashes[:CORPUS_SKETCH]]}


def corpus_share(record: dict[str, Any], keys: Iterable[str]) -> float:
    """The estimated share of the record's documents that are among keys (1.0 for the same set)."""
    sketch = [int(h, 16) for h in record.get("sketch") or ()]
    if not sketch:
        return 1.0
    have = {_key_hash(k) for k in keys}
    return sum(h in have for h in sketch) / len(sketch)


def check_head_corpus(folder: str | Path, keys: Iterable[str], force: bool = False, *, where: str = "this index",
                      train: str = "semsearch train --index ...") -> float | None:
    """Whether the head in folder was trained on the corpus whose document keys are given (an
    index's, see index_row_key; a dataset's, see document_key): the share of its training
    documents found there, None when the head records no corpus (heads written before the record,
    or trained on a pairs file alone: accepted). Below SAME_CORPUS: HeadCorpusMismatch, or with
    force a logged warning. `where` names the corpus in the message, `train` the command to train
    a head on it."""
    from semsearch.errors import HeadCorpusMismatch

    cfg = read_head_config(folder)
    record = cfg.get("corpus")
    if not isinstance(record, dict) or not record.get("sketch"):
        return None
    keys = list(keys)
    if record.get("fingerprint") and corpus_record(keys)["fingerprint"] == record["fingerprint"]:
        return 1.0
    share = corpus_share(record, keys)
    if share >= SAME_CORPUS:
        return share
    what = "query layers" if cfg.get("kind") == QUERY_LAYERS else "pooling head"
    were = "were" if cfg.get("kind") == QUERY_LAYERS else "was"
    trained = f" ({cfg['training_data']})" if cfg.get("training_data") else ""
    msg = (f"the {what} at {folder} {were} trained on another corpus{trained}: about {share:.0%} of the "
           f"{record.get('documents', '?')} training documents are in {where} of {len(set(keys))} documents. "
           "A head fits the corpus it was trained on and measured lower than the base model on another domain; "
           f"train one on {where} (`{train}`), or use this one anyway with --force")
    if force:
        log.warning("%s (forced)", msg)
        return share
    raise HeadCorpusMismatch(msg)
