"""Token-state cache: the frozen encoder's per-token vectors of many texts, packed in fp16.

The encoder is frozen while a pooling head trains, so its token states are computed once and
every epoch (and every re-pooling) only runs the head.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

STATES_FORMAT = "semsearch-states v1"


class StateCache:
    """data (N_tokens, D) fp16 holds every text's real tokens back to back; text i is
    data[offsets[i]:offsets[i + 1]]."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data = data
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def dim(self) -> int:
        return int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.offsets.nbytes)

    @classmethod
    def build(cls, encoder, texts: Sequence[str], progress: bool | None = None) -> "StateCache":
        """Run the encoder once over texts and keep every real token's state."""
        parts: list[np.ndarray | None] = [None] * len(texts)
        for b in encoder.iter_states(list(texts), progress):
            lens = b.mask.sum(1).tolist()
            states = b.states.to(torch.float16).cpu().numpy()
            for r, i in enumerate(b.index):
                parts[i] = states[r, : lens[r]]
        lengths = np.array([0] + [p.shape[0] for p in parts], np.int64)
        offsets = np.cumsum(lengths)
        data = np.concatenate(parts) if parts else np.zeros((0, encoder.dim), np.float16)
        return cls(data, offsets)

    def batch(self, idx: Sequence[int], device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(states (B, T, D) float32, mask (B, T)) for texts idx, right-padded."""
        lens = [int(self.offsets[i + 1] - self.offsets[i]) for i in idx]
        T = max(lens) if lens else 1
        out = np.zeros((len(idx), T, self.dim), np.float32)
        mask = np.zeros((len(idx), T), np.int64)
        for r, i in enumerate(idx):
            out[r, : lens[r]] = self.data[self.offsets[i] : self.offsets[i + 1]]
            mask[r, : lens[r]] = 1
        return torch.from_numpy(out).to(device), torch.from_numpy(mask).to(device)

    def pool_all(self, fn, batch: int = 256, device: str = "cpu") -> np.ndarray:
        """(n, D') L2-normalised vectors of every text under a pooling fn(states, mask)."""
        outs = []
        with torch.no_grad():
            for s in range(0, len(self), batch):
                st, m = self.batch(range(s, min(s + batch, len(self))), device)
                outs.append(torch.nn.functional.normalize(fn(st, m), dim=-1).cpu().numpy())
        return np.concatenate(outs).astype(np.float32) if outs else np.zeros((0, self.dim), np.float32)

    def save(self, folder: Path, meta: dict) -> None:
        """Write states.npy (fp16), offsets.npy and states.json (no pickle)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "states.npy", self.data, allow_pickle=False)
        np.save(folder / "offsets.npy", self.offsets, allow_pickle=False)
        (folder / "states.json").write_text(json.dumps({"format": STATES_FORMAT, **meta}, indent=2))

    @classmethod
    def load(cls, folder: Path, meta: dict | None = None, mmap: bool = True) -> "StateCache | None":
        """The cache in folder, or None if absent or built with other settings than `meta`."""
        folder = Path(folder)
        try:
            saved = json.loads((folder / "states.json").read_text())
        except (OSError, ValueError):
            return None
        if saved.get("format") != STATES_FORMAT or any(saved.get(k) != v for k, v in (meta or {}).items()):
            return None
        data = np.load(folder / "states.npy", mmap_mode="r" if mmap else None, allow_pickle=False)
        return cls(data, np.load(folder / "offsets.npy", allow_pickle=False))
