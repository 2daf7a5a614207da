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
    data[offsets[i]:offsets[i + 1]].

    A cache can also point into several arrays (an index's kept-states files, memory-mapped):
    text i is parts[part[i]][start[i] : start[i] + length[i]] (see from_spans)."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data = data
        self.offsets = offsets
        self.parts = [data]
        self.part = np.zeros(len(offsets) - 1, np.int64)
        self.start = np.asarray(offsets[:-1], np.int64)
        self.length = np.diff(np.asarray(offsets, np.int64))

    @classmethod
    def from_spans(cls, parts: list[np.ndarray], spans: np.ndarray) -> "StateCache":
        """A cache over (part, start, length) rows `spans` (n, 3) of the (T, D) arrays `parts`;
        nothing is copied (memory maps stay maps)."""
        self = cls.__new__(cls)
        self.parts = list(parts)
        spans = np.asarray(spans, np.int64).reshape(-1, 3)
        self.part, self.start, self.length = spans[:, 0].copy(), spans[:, 1].copy(), spans[:, 2].copy()
        self.data = parts[0] if parts else np.zeros((0, 0), np.float16)
        self.offsets = np.concatenate([[0], np.cumsum(self.length)])
        return self

    def __len__(self) -> int:
        return len(self.length)

    def rows(self, i: int) -> np.ndarray:
        """Text i's token states (T_i, D)."""
        s = int(self.start[i])
        return self.parts[int(self.part[i])][s : s + int(self.length[i])]

    def subset(self, idx: Sequence[int]) -> "StateCache":
        """A cache of texts idx (in that order), sharing the arrays."""
        idx = np.asarray(idx, np.int64)
        return StateCache.from_spans(self.parts, np.stack([self.part[idx], self.start[idx], self.length[idx]], 1))

    @property
    def dim(self) -> int:
        return int(self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.length.sum()) * self.dim * 2 + int(self.offsets.nbytes)

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
        lens = [int(self.length[i]) for i in idx]
        T = max(lens) if lens else 1
        out = np.zeros((len(idx), T, self.dim), np.float32)
        mask = np.zeros((len(idx), T), np.int64)
        for r, i in enumerate(idx):
            out[r, : lens[r]] = self.rows(i)
            mask[r, : lens[r]] = 1
        return torch.from_numpy(out).to(device), torch.from_numpy(mask).to(device)

    def pool_all(self, fn, batch: int = 256, device: str = "cpu") -> np.ndarray:
        """(n, D') L2-normalised vectors of every text under a pooling fn(states, mask)."""
        # Length-sorted batches: little padding, so each batch costs about its real tokens.
        order = np.argsort(-self.length, kind="stable")
        out: np.ndarray | None = None
        with torch.no_grad():
            for s in range(0, len(self), batch):
                idx = order[s : s + batch]
                st, m = self.batch(idx, device)
                v = torch.nn.functional.normalize(fn(st, m), dim=-1).float().cpu().numpy()
                if out is None:
                    out = np.zeros((len(self), v.shape[1]), np.float32)
                out[idx] = v
        return out if out is not None else np.zeros((0, self.dim), np.float32)

    def save(self, folder: Path, meta: dict) -> None:
        """Write states.npy (fp16), offsets.npy and states.json (no pickle)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if len(self.parts) == 1 and np.array_equal(self.start, self.offsets[:-1]):
            np.save(folder / "states.npy", self.parts[0][: int(self.offsets[-1])], allow_pickle=False)
        else:
            np.save(folder / "states.npy", np.concatenate([self.rows(i) for i in range(len(self))]), allow_pickle=False)
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
