"""Other inference engines against semsearch's torch encoder, on SciFact documents, same run.

    pip install openvino nncf          # not project dependencies: this script only
    python scripts/bench/bench_engines.py [--docs 300]

It answers "would a fused engine or int8 reach 4x the sentence-transformers baseline here?":
- torch: the product's path (bf16 weights on CPUs with AMX, fp32 otherwise);
- openvino-bf16: the same network compiled by OpenVINO (fused attention, GELU and LayerNorm);
- openvino-int8: OpenVINO after NNCF post-training int8 quantisation (AMX int8 where the CPU has
  it), calibrated on the bundled sample corpus, not on SciFact;
- matmuls-only: the model's dense layers alone at the same token count in bf16, a ceiling for any
  engine that does not cut the work itself.
Prints docs/s, the ratio to the torch path, and the minimum cosine to fp32 torch vectors.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "beir" / "scifact"))
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--out", default=str(REPO / "results" / "bench_engines.json"))
    args = ap.parse_args()
    try:
        import nncf
        import openvino as ov
    except ImportError:
        raise SystemExit("this benchmark needs OpenVINO and NNCF: pip install openvino nncf")
    import numpy as np
    import torch

    from semsearch.corpus.readers import ReadOptions, read_documents
    from semsearch.corpus.walk import walk
    from semsearch.encoder import Encoder

    docs = []
    with open(Path(args.data) / "corpus.jsonl") as fh:
        for line in fh:
            r = json.loads(line)
            docs.append(f"{r.get('title', '')} {r.get('text', '')}".strip())
    rng = np.random.default_rng(0)
    docs = [docs[i] for i in rng.choice(len(docs), args.docs, replace=False)]

    fp32 = Encoder(precision="fp32", device="cpu")
    fast = Encoder(precision="auto", device="cpu")
    ids = fast.tokenize(docs)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))

    class Masked(torch.nn.Module):
        """The encoder with its padding mask always applied, so that tracing keeps it."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            x = self.m.embeddings(ids)
            bias = ((1 - mask.to(x.dtype)) * -1e4)[:, None, None, :]
            for layer in self.m.layers:
                x = layer(x, bias)
            return x

    example = (torch.ones(2, 64, dtype=torch.long), torch.ones(2, 64, dtype=torch.long))
    shapes = [ov.PartialShape([-1, -1])] * 2

    def convert():
        return ov.convert_model(Masked(fp32.model), example_input=example, input=shapes)

    calib = []
    for f in walk(REPO / "data" / "sample").files:
        calib += [d.text for d in read_documents(f.path, ReadOptions())]
    calib_ids = fast.tokenize(calib)
    int8 = nncf.quantize(convert(), nncf.Dataset([(np.array([c]), np.ones((1, len(c)), np.int64)) for c in calib_ids]),
                         model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib_ids))
    core = ov.Core()
    engines = {"openvino-bf16": core.compile_model(convert(), "CPU", {"INFERENCE_PRECISION_HINT": "bf16"}).create_infer_request(),
               "openvino-int8": core.compile_model(int8, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"}).create_infer_request()}

    def run_ov(req):
        out = np.zeros((len(docs), fast.dim), np.float32)
        s = 0
        while s < len(order):  # the same batches as the torch path: length-sorted, T to a multiple of 32
            T = min(-(-len(ids[order[s]]) // 32) * 32, fast.max_length)
            idx = order[s : s + max(1, fast.batch_tokens // T)]
            s += len(idx)
            arr, mask = np.zeros((len(idx), T), np.int64), np.zeros((len(idx), T), np.int64)
            for r, i in enumerate(idx):
                arr[r, : len(ids[i])], mask[r, : len(ids[i])] = ids[i], 1
            states = req.infer([arr, mask])[0]
            v = (states * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
            out[idx] = v / np.linalg.norm(v, axis=1, keepdims=True)
        return out

    def matmuls_only():
        cfg = fast.model.cfg
        dt = torch.bfloat16 if fast.precision == "bf16" else torch.float32
        D, F = cfg.hidden_size, cfg.intermediate_size
        w = [torch.randn(o, i, dtype=dt) for i, o in ((D, 3 * D), (D, D), (D, F), (F, D))]
        with torch.inference_mode():
            tokens = sum(min(-(-len(x) // 32) * 32, fast.max_length) for x in ids)
            x = {D: torch.randn(fast.batch_tokens, D, dtype=dt), F: torch.randn(fast.batch_tokens, F, dtype=dt)}
            for _ in range(-(-tokens // fast.batch_tokens)):
                for _layer in range(cfg.num_hidden_layers):
                    for m in w:
                        torch.nn.functional.linear(x[m.shape[1]], m)
        return None  # no vectors: a time only

    ref = fp32.encode(docs)
    runs = {"torch": lambda: fast.encode(docs), **{k: (lambda r=r: run_ov(r)) for k, r in engines.items()},
            "matmuls-only": matmuls_only}
    for f in runs.values():  # warm: every batch shape once
        f()
    times = {k: 0.0 for k in runs}
    vecs = {}
    for _ in range(3):  # interleaved rounds: machine drift hits every engine alike
        for k, f in runs.items():
            t = time.perf_counter()
            vecs[k] = f()
            times[k] += time.perf_counter() - t
    report = {"docs": len(docs), "precision": fast.precision, "engines": {}}
    for k in runs:
        row = {"docs_per_s": round(3 * len(docs) / times[k], 1), "vs_torch": round(times["torch"] / times[k], 2)}
        if vecs[k] is not None:
            row["min_cosine_vs_fp32"] = round(float((vecs[k] * ref).sum(1).min()), 5)
        report["engines"][k] = row
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
