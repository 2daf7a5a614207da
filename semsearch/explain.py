"""Why a hit matched: its score taken apart into exact parts (Retriever.search(..., explain=True)).

- Dense side. With mean pooling a chunk's vector is normalize(mean of its token states h_t), so
  its cosine with a query vector q is sum_t (q . h_t) / (n ||mean||): one exact term per token.
  Max pooling: each dimension d of the vector is one token's h_t,d (the token that won it), so
  the cosine is sum_t of sum over the dimensions t won of q_d v_d / ||v||, exact per token. CLS
  pooling: the vector is the [CLS] token's state; the whole score is that token's (the other
  tokens act through attention, which no sum of terms describes). A trained attention head
  (pooling 'head') is a weighted sum w_t of (projected) token states: token t's term is
  w_t (q . P h_t) / ||v||, exact given the head's weights. Trained query layers change the query
  vector only; the document side stays as its pooling says.
  The token states come from the index where it keeps them (--keep-states, fp16) or from encoding
  the hit's text again with the index's encoder. The terms sum to the cosine of the vector those
  states pool to; that vector is compared with the stored one and the explanation says when they
  differ (fp16 states, bf16 or int8 arithmetic in other batch shapes, a compressed vector index).
- Lexical side. BM25 is a sum over the query's distinct terms of idf x tf weight; each term's
  part is read from the same posting arrays the ranking used.
- Hybrid. convex: alpha * minmax(cosine) + (1 - alpha) * minmax(bm25), min and max over the
  query's candidates (the union of both sides' top candidates); rrf: 1 / (k + rank) per side.

Nothing here runs unless explain=True is asked for. `format_explanation` renders one hit's
explanation for a terminal; the search page of `semsearch serve` renders the same dict.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from semsearch import fusion as fusion_
from semsearch.store import lexical as lexical_

MATCH_TOL = 1e-4  # |re-encoded cosine - stored cosine| within which the vectors count as the same
KEPT_TOL = 5e-3  # the same for fp16 token states kept in the index
TOP_SPANS = 5  # spans highlighted by format_explanation


# ---- token states of the hits' texts ----------------------------------------------------------
class _Tokens:
    """One text's tokens as the encoder saw them: states (T, D) float32, their strings, their
    character spans in the text (None for [CLS], [SEP] and other special tokens)."""

    __slots__ = ("states", "tokens", "spans", "source")

    def __init__(self, states, tokens, spans, source):
        self.states, self.tokens, self.spans, self.source = states, tokens, spans, source


def _tokenizer(encoder):
    return getattr(encoder, "tokenizer", None)


def _encodings(encoder, texts: Sequence[str]):
    """The tokenizer's encodings (ids, tokens, offsets, special marks), truncated as the encoder truncates."""
    return _tokenizer(encoder).encode_batch(list(texts))


def _spans_of(enc) -> list[tuple[int, int] | None]:
    return [None if special else (int(a), int(b)) for (a, b), special in zip(enc.offsets, enc.special_tokens_mask)]


def _encode_states(encoder, texts: Sequence[str]) -> list[np.ndarray]:
    """Token states (T_i, D) float32 of texts, in the encoder's own arithmetic, real tokens only."""
    if hasattr(encoder, "iter_states"):  # the torch encoder (fp32, bf16, or int8 through ONNX Runtime)
        out: list[np.ndarray] = [np.zeros((0, encoder.dim), np.float32)] * len(texts)
        for b in encoder.iter_states(list(texts), progress=False):
            lens = b.mask.sum(1).tolist()
            # Encoder.pool works on states.float(): the very numbers its vectors were pooled from.
            st = b.states.float().cpu().numpy()
            for r, i in enumerate(b.index):
                out[i] = st[r, : lens[r]]
        return out
    # The torch-free query encoder: one unpadded forward pass a text, as its encode() runs.
    from semsearch.encoder.numpy_encoder import one_blas_thread

    with one_blas_thread():
        return [np.asarray(encoder._forward(e.ids), np.float32) for e in _encodings(encoder, texts)]


def _kept_states(g, folder: Path, ids: Sequence[int]) -> dict[int, np.ndarray]:
    """{chunk id: fp16 token states as float32} for chunks whose states the index keeps."""
    st = g.manifest.states
    if not st or not ids:
        return {}
    marks = ",".join("?" * len(ids))
    try:
        rows = g.docs.db.execute(f"SELECT id, state_file, state_off, state_len FROM chunks WHERE id IN ({marks})",
                                 [int(i) for i in ids]).fetchall()
    except Exception:  # noqa: BLE001 - a docstore without the columns: encode instead
        return {}
    out, row = {}, 2 * int(st["dim"])  # bytes a token
    by_file: dict[str, list] = {}
    for cid, file, off, n in rows:
        if file is not None:
            by_file.setdefault(file, []).append((int(cid), int(off), int(n)))
    for file, refs in by_file.items():
        try:
            with open(Path(folder) / "states" / file, "rb") as f:
                for cid, off, n in refs:
                    f.seek(off * row)
                    buf = f.read(n * row)
                    if len(buf) == n * row:
                        out[cid] = np.frombuffer(buf, np.float16).reshape(n, -1).astype(np.float32)
        except OSError:
            continue
    return out


def hit_tokens(encoder, texts: Sequence[str], kept: Sequence[np.ndarray | None] | None = None) -> list[_Tokens | None]:
    """Tokens and states for each text: the kept states where given (and of the right length),
    else encoded now; None for every text where the encoder cannot give token states."""
    if _tokenizer(encoder) is None or not (hasattr(encoder, "iter_states") or hasattr(encoder, "_forward")):
        return [None] * len(texts)
    encs = _encodings(encoder, texts)
    kept = list(kept) if kept is not None else [None] * len(texts)
    need = [i for i, (e, k) in enumerate(zip(encs, kept)) if k is None or len(k) != len(e.ids)]
    fresh: dict[int, np.ndarray] = {}
    if need:
        run = getattr(encoder, "run_alone", None)  # a shared encoder (the server's) runs one pass at a time
        got = run(_encode_states, [texts[i] for i in need]) if run else _encode_states(encoder, [texts[i] for i in need])
        fresh = dict(zip(need, got))
    out = []
    for i, e in enumerate(encs):
        states, source = (fresh[i], "encoded") if i in fresh else (kept[i], "kept")
        out.append(_Tokens(states, list(e.tokens), _spans_of(e), source))
    return out


# ---- the dense side --------------------------------------------------------------------------
def _head_parts(head):
    """(score weights (D,), score bias, projection (D, D') or None) of an attention head, torch or numpy."""
    if hasattr(head, "score_w"):
        return np.asarray(head.score_w, np.float64), float(head.score_b), (None if head.proj is None else np.asarray(head.proj, np.float64))
    w = head.score.weight.detach().float().cpu().numpy()[0].astype(np.float64)
    b = float(head.score.bias.detach().float().cpu().numpy()[0])
    p = None if head.proj is None else head.proj.weight.detach().float().cpu().numpy().T.astype(np.float64)
    return w, b, p


def dense_terms(pooling: str, states: np.ndarray, q: np.ndarray, head=None) -> tuple[np.ndarray, np.ndarray, str]:
    """(per-token terms (T,), the pooled vector (D',) unnormalised, how) such that
    terms.sum() == cos(q, pooled) up to float rounding."""
    H = np.asarray(states, np.float32)
    q64 = np.asarray(q, np.float64)
    T = len(H)
    if pooling == "mean":
        v = H.mean(0, dtype=np.float32)  # as the encoder pools (float32)
        norm = max(float(np.linalg.norm(v.astype(np.float64))), 1e-12)
        # q . h_t in float32 (as the cosine itself is computed), the rest in float64
        return (H @ np.asarray(q, np.float32)).astype(np.float64) / (T * norm), v, "exact: the chunk vector is the mean of its token states, so each token adds (q . h_t) / (n |mean|)"
    if pooling == "max":
        v = H.max(0)
        win = H.argmax(0)
        norm = max(float(np.linalg.norm(v.astype(np.float64))), 1e-12)
        terms = np.bincount(win, weights=q64 * v.astype(np.float64), minlength=T) / norm
        return terms, v, "exact: each dimension is one token's value (the token that won it); a token adds q_d v_d over the dimensions it won"
    if pooling == "cls":
        v = H[0]
        norm = max(float(np.linalg.norm(v.astype(np.float64))), 1e-12)
        terms = np.zeros(T)
        terms[0] = float(v.astype(np.float64) @ q64) / norm
        return terms, v, ("exact but whole: with cls pooling the chunk vector is the [CLS] token's state, so the whole score is "
                          "that token's; the other tokens act on it through attention, which no per-token sum describes")
    if pooling == "head" and head is not None:
        sw, sb, P = _head_parts(head)
        H64 = H.astype(np.float64)
        s = H64 @ sw + sb
        w = np.exp(s - s.max())
        w /= w.sum()
        HP = H64 @ P if P is not None else H64
        v = w @ HP
        norm = max(float(np.linalg.norm(v)), 1e-12)
        return w * (HP @ q64) / norm, v.astype(np.float32), (
            "exact given the head's attention weights: the vector is a weighted sum of (projected) token states, "
            "so each token adds w_t (q . P h_t) / |v|; the weights themselves depend on every token")
    raise ValueError(f"no per-token terms for pooling {pooling!r}")


def _merge_words(text: str, tokens: list[str], spans: list[tuple[int, int] | None], terms: list[float]) -> list[dict[str, Any]]:
    """Word spans: a word's WordPiece continuations ('##s' after 'decision') merged into it, their
    terms summed."""
    words: list[list] = []
    cur: list | None = None
    for t, sp, c in zip(tokens, spans, terms):
        if sp is None:
            continue
        if cur is not None and t.startswith("##") and sp[0] == cur[1]:
            cur[1] = sp[1]
            cur[2] += c
        else:
            cur = [sp[0], sp[1], c]
            words.append(cur)
    return [{"start": a, "end": b, "text": text[a:b], "contribution": x} for a, b, x in words if b > a]


def explain_dense(encoder, tok: _Tokens | None, text: str, q: np.ndarray, stored_vec: np.ndarray | None,
                  stored_score: float | None, query_layers: bool = False) -> dict[str, Any]:
    """The dense part of an explanation for one hit. stored_score: the cosine the ranking used."""
    pooling = getattr(encoder, "pooling", None)
    out: dict[str, Any] = {"pooling": pooling, "stored_score": stored_score, "ranking_score": stored_score}
    if query_layers or getattr(encoder, "query_tower", None) is not None:
        out["query"] = "the query vector comes from the trained query layers; the chunk side below is exact as its pooling says"
    if tok is None:
        out.update(exact=False, score=stored_score, tokens=[], spans=[],
                   note="per-token terms need the native (BERT-family) encoder's token states; only the cosine is given")
        return out
    head = getattr(encoder, "head", None)
    try:
        terms, v, how = dense_terms(pooling, tok.states, q, head)
    except ValueError as e:
        out.update(exact=False, score=stored_score, tokens=[], spans=[], note=str(e))
        return out
    score = float(terms.sum())
    out.update(exact=True, method=how, score=score, states=tok.source)
    parts = terms.tolist()
    out["tokens"] = [{"token": t, "start": None if sp is None else sp[0], "end": None if sp is None else sp[1],
                      "contribution": c} for t, sp, c in zip(tok.tokens, tok.spans, parts)]
    out["spans"] = _merge_words(text, tok.tokens, tok.spans, parts)
    last = max((sp[1] for sp in tok.spans if sp is not None), default=0)
    out["truncated"] = bool(text[last:].strip())  # text past the model's max length is not in the vector
    if stored_vec is not None:
        vn = np.asarray(v, np.float64)
        vn = vn / max(float(np.linalg.norm(vn)), 1e-12)
        out["vector_max_difference"] = float(np.abs(vn - np.asarray(stored_vec, np.float64)).max())
        # the stored vector's own cosine (a compressed vector index ranks by an approximation of it)
        stored_score = float(np.asarray(stored_vec, np.float64) @ np.asarray(q, np.float64))
        out["stored_score"] = stored_score
    if stored_score is not None:
        diff = abs(score - stored_score)
        out["difference"] = diff
        tol = KEPT_TOL if tok.source == "kept" else MATCH_TOL
        out["matches_stored"] = diff <= tol
        if tok.source == "kept":
            out["note"] = (f"token states kept in the index (fp16): the terms sum to {score:.6f}, the cosine of the vector "
                           f"they pool to; the stored vector's cosine is {stored_score:.6f}")
        elif diff > tol:
            out["note"] = (f"the re-encoded vector differs from the stored one (precision {getattr(encoder, 'precision', '?')}, "
                           f"or a compressed vector index): the terms sum to the re-encoded cosine {score:.6f}; "
                           f"the stored vector's cosine is {stored_score:.6f}")
    return out


# ---- the lexical side ------------------------------------------------------------------------
_WORD = re.compile(r"\w+", re.UNICODE)


class QueryTerms:
    """One query's analysed terms, worked out once for all its hits: the query words behind each
    term hash, the terms' positions in the index's vocabulary, and a memo of text words' terms."""

    def __init__(self, lex, query: str):
        self.words: dict[int, list[str]] = {}
        for w in _WORD.findall(query.lower()):
            if w not in lexical_.STOPWORDS:
                ws = self.words.setdefault(lexical_._term(w), [])
                if w not in ws:
                    ws.append(w)
        self.vocab_pos = lex._query_terms(query)  # the terms the index holds, as score_all() adds them
        self.memo: dict[str, int | None] = {}
        self.average_length = float(lex.lengths.mean()) if len(lex.lengths) else 0.0

    def term_of(self, word: str) -> int | None:
        """The hash of a text word's term where it is one of the query's, else None."""
        try:
            return self.memo[word]
        except KeyError:
            h = None if word in lexical_.STOPWORDS else lexical_._term(word)
            self.memo[word] = h = h if h in self.words else None
            return h


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _term_spans(qt: QueryTerms, text: str) -> dict[int, list[list[int]]]:
    """{term hash: [[start, end], ...]}: where the query's terms occur in text, as words."""
    spans: dict[int, list[list[int]]] = {}
    low = text.lower()
    if len(low) != len(text):  # lower-casing moved offsets (a few Unicode letters): word by word
        for m in _WORD.finditer(text):
            h = qt.term_of(m.group().lower())
            if h is not None:
                spans.setdefault(h, []).append([m.start(), m.end()])
        return spans
    # the text's distinct words first (C speed), then each matching word's places
    for w in set(_WORD.findall(low)):
        h = qt.term_of(w)
        if h is None:
            continue
        at = low.find(w)
        while at >= 0:
            end = at + len(w)
            if (at == 0 or not _is_word(low[at - 1])) and (end == len(low) or not _is_word(low[end])):
                spans.setdefault(h, []).append([at, end])
            at = low.find(w, end)
    for v in spans.values():
        v.sort()
    return spans


def explain_lexical(lex, query: str | QueryTerms, chunk_id: int, text: str, score: float | None) -> dict[str, Any]:
    """Each distinct query term's BM25 part for one chunk (they sum to its BM25 score)."""
    qt = query if isinstance(query, QueryTerms) else QueryTerms(lex, query)
    out: dict[str, Any] = {"score": score, "k1": lex.k1, "b": lex.b, "terms": []}
    pos = int(np.searchsorted(lex.ids, chunk_id)) if len(lex.ids) else 0
    held = pos < len(lex.ids) and int(lex.ids[pos]) == chunk_id
    if held:
        out["length"] = float(lex.lengths[pos])
        out["average_length"] = qt.average_length
    spans = _term_spans(qt, text)
    total, hashes = 0.0, set()
    for v in qt.vocab_pos.tolist():
        h = int(lex.vocab[v])
        hashes.add(h)
        lo, hi = int(lex.indptr[v]), int(lex.indptr[v + 1])
        c, tf = 0.0, 0
        if held:  # a term's postings are in row order
            j = lo + int(np.searchsorted(lex.postings[lo:hi], pos))
            if j < hi and int(lex.postings[j]) == pos:
                c, tf = float(lex.weights[j]), int(lex.tfs[j])
        total += c
        out["terms"].append({"term": " / ".join(qt.words.get(h, ["?"])), "idf": float(lex.idf[v]), "tf": tf,
                             "contribution": c, "spans": spans.get(h, [])})
    missing = [" / ".join(ws) for h, ws in qt.words.items() if h not in hashes]
    if missing:
        out["absent"] = missing  # query terms no chunk of the index holds: they add nothing
    out["sum"] = total
    return out


# ---- fusion ----------------------------------------------------------------------------------
def explain_fusion(pool, chunk_id: int, fusion: str, alpha: float, score: float) -> dict[str, Any] | None:
    """The fused score's arithmetic for one hit, from its query's candidates (ids, cosines, bm25)."""
    if pool is None:
        return None
    cand, d, b = pool
    j = int(np.searchsorted(cand, chunk_id))
    if j >= len(cand) or int(cand[j]) != chunk_id:
        return None
    out: dict[str, Any] = {"method": fusion, "candidates": int(len(cand)), "score": score}
    if fusion == "convex":
        nd, nb = fusion_.minmax(d), fusion_.minmax(b)
        out.update(alpha=alpha,
                   dense={"value": float(d[j]), "min": float(d.min()), "max": float(d.max()), "normalized": float(nd[j])},
                   lexical={"value": float(b[j]), "min": float(b.min()), "max": float(b.max()), "normalized": float(nb[j])})
        out["fused"] = float(alpha * nd[j] + (1 - alpha) * nb[j])
        out["formula"] = (f"{alpha:g} x {nd[j]:.4f} + {1 - alpha:g} x {nb[j]:.4f} = {out['fused']:.4f}")
    else:
        rd, rb = fusion_.ranks(d), fusion_.ranks(b)
        out.update(rrf_k=fusion_.RRF_K, dense={"value": float(d[j]), "rank": int(rd[j])},
                   lexical={"value": float(b[j]), "rank": int(rb[j])})
        out["fused"] = 1.0 / (fusion_.RRF_K + int(rd[j])) + 1.0 / (fusion_.RRF_K + int(rb[j]))
        out["formula"] = f"1/({fusion_.RRF_K}+{int(rd[j])}) + 1/({fusion_.RRF_K}+{int(rb[j])}) = {out['fused']:.6f}"
    return out


# ---- all of it, for the hits of a search ------------------------------------------------------
def _stored_vectors(g, ids: list[int]) -> dict[int, np.ndarray]:
    if not ids:
        return {}
    arr = np.asarray(sorted(set(ids)), np.int64)
    vecs = g.vectors.reconstruct(arr)
    got = arr
    if vecs is None:
        got, vecs = g.docs.get_vectors(arr)
    return {int(i): np.asarray(v, np.float32) for i, v in zip(got, vecs)}


def explain_hits(retriever, g, queries: Sequence[str], qv: np.ndarray | None, hits: list[list], mode: str,
                 fusion: str, alpha: float, pools: list | None) -> None:
    """Set hit.explanation on every hit of a search (called by Retriever.search_batch)."""
    flat = [(qi, h) for qi, row in enumerate(hits) for h in row]
    if not flat:
        return
    lex = g.lexical(retriever.folder, required=False) if mode in ("lexical", "hybrid") else None
    query_layers = (g.manifest.head or {}).get("kind") == "query-layers"
    dense = mode in ("dense", "hybrid") and qv is not None
    toks: dict[int, _Tokens | None] = {}
    stored: dict[int, np.ndarray] = {}
    if dense:
        ids = sorted({h.id for _, h in flat})
        text_of = {h.id: h.text for _, h in flat}
        kept = _kept_states(g, retriever.folder, ids)
        toks = dict(zip(ids, hit_tokens(retriever.encoder, [text_of[i] for i in ids], [kept.get(i) for i in ids])))
        stored = _stored_vectors(g, ids)
    terms: dict[int, QueryTerms] = {}
    for qi, h in flat:
        e: dict[str, Any] = {"mode": mode, "score": h.score, "query": queries[qi]}
        if dense:
            e["dense"] = explain_dense(retriever.encoder, toks.get(h.id), h.text, qv[qi], stored.get(h.id), h.dense_score,
                                       query_layers)
        if lex is not None:
            if qi not in terms:
                terms[qi] = QueryTerms(lex, queries[qi])
            e["lexical"] = explain_lexical(lex, terms[qi], h.id, h.text, h.lexical_score)
        if mode == "hybrid":
            e["fusion"] = explain_fusion(pools[qi] if pools else None, h.id, fusion, alpha, h.score)
        h.explanation = e


# ---- a terminal rendering --------------------------------------------------------------------
_ANSI = {1: "\x1b[1;33m", 2: "\x1b[4;36m", 3: "\x1b[1;4;33m"}
_RESET = "\x1b[0m"
_PLAIN = {1: ("[[", "]]"), 2: ("{{", "}}"), 3: ("[[{{", "}}]]")}


def strongest_spans(e: dict[str, Any], n: int = TOP_SPANS) -> list[dict[str, Any]]:
    """The n word spans with the largest positive dense terms."""
    spans = (e.get("dense") or {}).get("spans") or []
    return sorted((s for s in spans if s["contribution"] > 0), key=lambda s: -s["contribution"])[:n]


def highlight(text: str, dense_spans, lexical_spans, color: bool, width: int = 320) -> str:
    """text (whitespace collapsed, cut to about `width` characters around the first highlight) with
    the dense spans and the lexical matches marked: ANSI colours (bold yellow: dense; underlined
    cyan: a query term), or [[dense]] and {{term}} without colour."""
    flag = np.zeros(len(text) + 1, np.int8)
    for s in dense_spans:
        flag[s[0]:s[1]] |= 1
    for s in lexical_spans:
        flag[s[0]:s[1]] |= 2
    marked = np.flatnonzero(flag[:len(text)])
    lo = 0
    if len(text) > width and len(marked):
        lo = max(0, min(int(marked[0]) - width // 4, len(text) - width))
    hi = min(len(text), lo + width)
    out, i = [], lo
    while i < hi:
        f = int(flag[i])
        j = i
        while j < hi and flag[j] == f:
            j += 1
        seg = re.sub(r"\s+", " ", text[i:j])
        if f == 0:
            out.append(seg)
        elif color:
            out.append(_ANSI[f] + seg + _RESET)
        else:
            out.append(_PLAIN[f][0] + seg + _PLAIN[f][1])
        i = j
    return ("..." if lo > 0 else "") + "".join(out).strip() + ("..." if hi < len(text) else "")


def format_explanation(hit, color: bool = False) -> str:
    """One hit's explanation as terminal text: the snippet with its strongest spans marked, the
    dense terms, the query terms' BM25 parts and the fusion arithmetic. Empty without one."""
    e = getattr(hit, "explanation", None) if not isinstance(hit, dict) else hit.get("explanation")
    if not e:
        return ""
    text = hit["text"] if isinstance(hit, dict) else hit.text
    top = strongest_spans(e)
    lex = e.get("lexical") or {}
    lex_spans = [s for t in lex.get("terms", []) if t["contribution"] > 0 for s in t["spans"]]
    lines = ["  " + highlight(text, [(s["start"], s["end"]) for s in top], lex_spans, color)]
    d = e.get("dense")
    if d:
        if d.get("exact"):
            head = f"  dense {d['score']:.4f} ({d['pooling']} pooling, exact sum of {len(d['tokens'])} token terms"
            head += ", token states kept in the index)" if d.get("states") == "kept" else ")"
            if top:
                head += ": " + ", ".join(f"{s['text']!r} {s['contribution']:+.4f}" for s in top)
            lines.append(head)
            if d["pooling"] == "cls":
                lines.append("  cls pooling: the whole score is the [CLS] token's")
            if d.get("note") and (d.get("states") != "kept" or not d.get("matches_stored", True)):
                lines.append("  note: " + d["note"])
        else:
            stored = d.get("stored_score")
            lines.append(f"  dense {stored:.4f}" if stored is not None else "  dense")
            if d.get("note"):
                lines.append("  note: " + d["note"])
    if lex:
        terms = [t for t in lex.get("terms", []) if t["contribution"] > 0]
        parts = " + ".join(f"{t['term']} {t['contribution']:.3f} (idf {t['idf']:.2f}, tf {t['tf']})" for t in terms)
        score = lex.get("score") if lex.get("score") is not None else lex.get("sum", 0.0)
        lines.append(f"  bm25 {score:.3f}" + (f" = {parts}" if parts else " (no query term occurs)"))
    f = e.get("fusion")
    if f:
        if f["method"] == "convex":
            dn, ln = f["dense"], f["lexical"]
            lines.append(f"  fusion convex (alpha {f['alpha']:g}): {f['alpha']:g} x {dn['normalized']:.4f} "
                         f"[cosine {dn['value']:.4f} in {dn['min']:.4f}..{dn['max']:.4f}] + {1 - f['alpha']:g} x {ln['normalized']:.4f} "
                         f"[bm25 {ln['value']:.3f} in {ln['min']:.3f}..{ln['max']:.3f}] = {f['fused']:.4f} "
                         f"(min-max over {f['candidates']} candidates)")
        else:
            lines.append(f"  fusion rrf: {f['formula']} (dense rank {f['dense']['rank']}, lexical rank {f['lexical']['rank']} "
                         f"of {f['candidates']} candidates)")
    return "\n".join(lines)
