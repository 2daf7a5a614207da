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
  the hits' texts again with the index's encoder (all of a search's hits in one encoder pass). The terms sum to the cosine of the vector those
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

import functools
import json
import mmap
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from semsearch import fusion as fusion_
from semsearch.corpus.titles import chunk_context, embedding_text, prefix_length
from semsearch.encoder.tokens import encoding_table
from semsearch.store import kept as kept_
from semsearch.store import lexical as lexical_

MATCH_TOL = 1e-4  # |re-encoded cosine - stored cosine| within which the vectors count as the same
KEPT_TOL = 5e-3  # the same for fp16 token states kept in the index
TOP_SPANS = 5  # spans highlighted by format_explanation


# ---- token states of the hits' texts ----------------------------------------------------------
class _Tokens:
    """One text's tokens as the encoder saw them: states (T, D) float32, their ids, their
    character offsets in the text (`off`, (T, 2); -1 for [CLS], [SEP] and other special tokens,
    and for the tokens of the chunk's context, its titles, read before its text), which are
    special, which continue a word ('##s'), and whether the text goes on past the model's max
    length (that part is not in the vector). `context`: the titles encoded before the text ("" for
    none), and `in_context` which tokens are theirs (None for none). Their strings are made when
    asked for: only records need them."""

    __slots__ = ("states", "ids", "names", "off", "special", "cont", "text", "source", "truncated", "context", "in_context")

    def __init__(self, states, ids, names, off, special, cont, text, source, truncated, context="", in_context=None):
        self.states, self.ids, self.names = states, ids, names
        self.off, self.special, self.cont = off, special, cont
        self.text, self.source, self.truncated = text, source, truncated
        self.context, self.in_context = context, in_context

    @property
    def tokens(self) -> list[str]:
        """Each token's string: names, a list of them or the vocabulary's strings to index by id."""
        names = self.names
        return [names[j] for j in self.ids.tolist()] if isinstance(names, _Vocabulary) else list(names)


class _Vocabulary(list):
    """A tokenizer's strings by id (to tell them from one text's own token strings)."""


def _word_spans(toks: Sequence[_Tokens], terms: Sequence[np.ndarray]) -> list[list[dict[str, Any]]]:
    """Each text's word spans with their terms summed: a word's WordPiece continuations ('##s'
    right after 'decision') merged into it."""
    return [_span_records(p) for p in _word_span_parts(toks, terms)]


def _word_span_parts(toks: Sequence[_Tokens], terms: Sequence[np.ndarray]) -> list[tuple]:
    """_word_spans' numbers, each text's (text, starts, ends, sums): all texts at once, in numpy;
    each word's sum adds its pieces left to right, as a loop over the tokens would."""
    if not toks:
        return []
    m = [min(len(t.off), len(x)) for t, x in zip(toks, terms)]  # (the same but for a misfit)
    off = np.concatenate([t.off[:n] for t, n in zip(toks, m)])
    special = np.concatenate([t.special[:n] for t, n in zip(toks, m)])
    cont = np.concatenate([t.cont[:n] for t, n in zip(toks, m)])
    which = np.repeat(np.arange(len(toks)), m)
    idx = np.flatnonzero(~special)  # special tokens are in no word
    st, en, h = off[idx, 0], off[idx, 1], which[idx]
    merged = np.zeros(len(idx), bool)
    merged[1:] = cont[idx[1:]] & (st[1:] == en[:-1]) & (h[1:] == h[:-1])
    first = np.flatnonzero(~merged)  # each word's first token (a position in idx)
    size = np.diff(np.append(first, len(idx)))
    starts, ends = st[first], en[first + size - 1]
    terms_all = np.concatenate([np.asarray(x, np.float64)[:n] for x, n in zip(terms, m)])
    x = terms_all[idx[first]]  # a copy
    for j in range(1, int(size.max()) if len(size) else 0):
        sel = size > j
        x[sel] += terms_all[idx[first[sel] + j]]
    keep = ends > starts
    a, b, x, h = starts[keep].tolist(), ends[keep].tolist(), x[keep].tolist(), h[first[keep]]
    bounds = np.searchsorted(h, np.arange(len(toks) + 1)).tolist()
    return [(t.text, a[bounds[k]:bounds[k + 1]], b[bounds[k]:bounds[k + 1]], x[bounds[k]:bounds[k + 1]])
            for k, t in enumerate(toks)]


def _span_records(part: tuple) -> list[dict[str, Any]]:
    text, a, b, x = part
    return [{"start": s, "end": e, "text": text[s:e], "contribution": c} for s, e, c in zip(a, b, x)]


def _tokenizer(encoder):
    return getattr(encoder, "tokenizer", None)


# Characters whose BERT normalisation is lower-casing at most: printable ASCII, tab, newline, CR.
_PLAIN_ASCII = re.compile(r"[\t\n\r\x20-\x7e]*\Z")
_LOWER_TOKENIZERS: dict[int, tuple[Any, Any, Any, Any]] = {}


def _lower_tokenizer(tok):
    """(a copy of tok without its normaliser, whether to lower-case, a pattern of the added
    tokens matched on raw text) where tok's normaliser and pre-tokeniser are BERT's, else
    (None, False, None). For a text of _PLAIN_ASCII characters holding none of those added
    tokens, BERT normalisation is lower-casing at most, character for character (no accents,
    Chinese characters or control characters occur; tab, newline and CR become spaces, on which
    the pre-tokeniser splits alike): the copy, given text.lower(), makes the same tokens with the
    same offsets, without the normaliser's Unicode decomposition and alignment bookkeeping (about
    a quarter of the tokenising time)."""
    state = (repr(tok.truncation), repr(tok.padding))
    got = _LOWER_TOKENIZERS.get(id(tok))
    if got is not None and got[0] is tok and got[1] == state:
        return got[2:]
    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    norm, pre = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
    out: tuple[Any, bool, Any] = (None, False, None)
    if norm.get("type") == "BertNormalizer" and pre.get("type") == "BertPreTokenizer":
        # An added token matched on the raw text ([CLS], [MASK]) may be missed or found otherwise
        # after lower-casing: a text holding one, in any case, keeps the full tokenizer.
        raw = [a["content"].lower() for a in spec.get("added_tokens", []) if not a.get("normalized", True) and a.get("content")]
        spec["normalizer"] = None
        out = (Tokenizer.from_str(json.dumps(spec)), bool(norm.get("lowercase", True)),
               re.compile("|".join(map(re.escape, raw))) if raw else None)
    _LOWER_TOKENIZERS[id(tok)] = (tok, state) + out
    return out


def _encodings(encoder, texts: Sequence[str]):
    """The tokenizer's encodings (ids, tokens, offsets, special marks), truncated as the encoder
    truncates: exactly the tokenizer's own, in one batched call (two where some texts are not
    plain ASCII)."""
    tok = _tokenizer(encoder)
    texts = list(texts)
    fast, lower, raw = _lower_tokenizer(tok)
    if fast is None:
        return tok.encode_batch(texts)
    lows = [t.lower() for t in texts]
    plain = [i for i, (t, lo) in enumerate(zip(texts, lows)) if _PLAIN_ASCII.match(t) and not (raw and raw.search(lo))]
    given = lows if lower else texts
    if len(plain) == len(texts):
        return fast.encode_batch(given)
    out = [None] * len(texts)
    for i, e in zip(plain, fast.encode_batch([given[i] for i in plain])):
        out[i] = e
    rest = [i for i in range(len(texts)) if out[i] is None]
    for i, e in zip(rest, tok.encode_batch([texts[i] for i in rest])):
        out[i] = e
    return out


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


_GRAIN = 32768  # elements: torch runs a copy this small on the calling thread


def _widen_parts(parts: Sequence[np.ndarray], dim: int) -> np.ndarray:
    """fp16 arrays (n_i, dim) -> one float32 (sum n_i, dim), exact: through torch where it is
    loaded (vectorised, about 4x numpy's conversion), else numpy. Copied in pieces below torch's
    parallel grain, so no OpenMP team is woken: its threads spin on a core after the copy, which
    slowed the tokenizer running next by a third on 2 cores."""
    out = np.empty((sum(len(p) for p in parts), dim), np.float32)
    torch = sys.modules.get("torch")
    at = 0
    for p in parts:
        dst = out[at : at + len(p)]
        at += len(p)
        if torch is None or not p.size:
            dst[:] = p
            continue
        try:
            for src, d in zip(torch.from_numpy(p.reshape(-1)).split(_GRAIN), torch.from_numpy(dst.reshape(-1)).split(_GRAIN)):
                d.copy_(src)
        except Exception:  # noqa: BLE001 - a torch that cannot: numpy gives the same numbers
            dst[:] = p
    return out


_MAPS: dict[tuple, np.ndarray] = {}  # (path, inode, size, mtime): the file mapped (copy-on-write, never written)
_MAPS_MAX = 256
_MAPS_LOCK = threading.Lock()


def _mapped(path: Path, dtype, cols: int) -> np.ndarray | None:
    """A states or token-table file as an array (rows, cols), memory-mapped once and kept (a
    published file never changes: a new write writes new files; the key's size and times tell a
    reused name apart); None where it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    got = _MAPS.get(key)
    if got is not None:
        return got
    item = np.dtype(dtype).itemsize * cols
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if st.st_size else b""
    except (OSError, ValueError):
        return None
    arr = np.frombuffer(buf, dtype, (st.st_size // item) * cols).reshape(-1, cols) if st.st_size >= item else np.zeros((0, cols), dtype)
    with _MAPS_LOCK:
        if len(_MAPS) >= _MAPS_MAX:
            _MAPS.clear()  # the arrays in use stay mapped while referenced
        _forget_gone()
        _MAPS[key] = arr
    return arr


def _forget_gone() -> None:
    """Drop the maps of files removed or replaced since (a merge or compaction removes the states
    files no segment names): a mapped file keeps its disk space until unmapped. Run when a new
    file is mapped, which is when a write has made new files (a stat per mapped file)."""
    for k in list(_MAPS):
        try:
            st = os.stat(k[0])
        except OSError:
            del _MAPS[k]
            continue
        if (st.st_ino, st.st_size, st.st_mtime_ns) != k[1:]:
            del _MAPS[k]


def _kept_states(g, folder: Path, ids: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
    """{chunk id: (fp16 token states as float32, their token table or None)} for chunks whose
    states the index keeps: the states widened from the mapped files into one buffer, the token
    tables (kept beside them, store.kept) sliced from theirs."""
    st = g.manifest.states
    if not st or not ids:
        return {}
    try:
        rows = g.docs.state_refs(ids)
    except Exception:  # noqa: BLE001 - a docstore without the columns: encode instead
        return {}
    dim = int(st["dim"])
    states_dir = Path(folder) / "states"
    maps: dict[str, tuple[np.ndarray | None, np.ndarray | None]] = {}
    parts, got, tables = [], [], {}
    for cid, file, off, n in rows:
        if file is None:
            continue
        if file not in maps:
            maps[file] = (_mapped(states_dir / file, np.float16, dim),
                          _mapped(states_dir / kept_.tokens_name(file), np.int32, kept_.TOKEN_COLS))
        sm, tm = maps[file]
        off, n = int(off), int(n)
        if sm is None or off < 0 or off + n > len(sm):
            continue
        parts.append(sm[off : off + n])
        got.append((int(cid), n))
        tables[int(cid)] = kept_.token_slice(tm, off, n)
    wide = _widen_parts(parts, dim)
    out, at = {}, 0
    for cid, n in got:
        out[cid] = (wide[at : at + n], tables[cid])
        at += n
    return out


_VOCABS: dict[int, tuple[Any, list[str], np.ndarray]] = {}


def _vocab(tok) -> tuple[list[str] | None, np.ndarray | None]:
    """(token string of each id, (vocabulary size,) bool: which ids continue a word, '##s') for a
    WordPiece tokenizer whose vocabulary gives each id one string (a token's string is then its
    id's); else (None, None)."""
    got = _VOCABS.get(id(tok))
    if got is not None and got[0] is tok:
        return got[1], got[2]
    vocab = tok.get_vocab(with_added_tokens=True)
    strings: list[str] | None = None
    table: np.ndarray | None = None
    model = (json.loads(tok.to_str()).get("model") or {}).get("type")
    if model == "WordPiece" and vocab and len(set(vocab.values())) == len(vocab) and min(vocab.values()) >= 0:
        strings = _Vocabulary([""] * (max(vocab.values()) + 1))
        for t, i in vocab.items():
            strings[i] = t
        table = np.fromiter((t.startswith("##") for t in strings), bool, len(strings))
    _VOCABS[id(tok)] = (tok, strings, table)
    return strings, table


def _explainable(encoder) -> bool:
    """Whether encoder gives token states (the native BERT-family encoders, torch or numpy)."""
    return _tokenizer(encoder) is not None and (hasattr(encoder, "iter_states") or hasattr(encoder, "_forward"))


def hit_tokens(encoder, texts: Sequence[str], kept: Sequence[np.ndarray | None] | None = None,
               tables: Sequence[np.ndarray | None] | None = None,
               contexts: Sequence[str] | None = None) -> list[_Tokens | None]:
    """Tokens and states for each text: the kept states where given (and of the right length),
    else encoded now, all of them in one encoder pass; None for every text where the encoder
    cannot give token states. tables: the token tables kept beside the kept states (a text with
    one is not tokenised again; the others are, in one batched call). contexts: each text's
    titles, encoded before it as the index encoded it (semsearch/corpus/titles.py); their tokens
    are at no place in the text, and the other tokens' offsets point into the text itself."""
    if not _explainable(encoder):
        return [None] * len(texts)
    shown = list(texts)
    contexts = list(contexts) if contexts is not None else [""] * len(shown)
    texts = [embedding_text(c, t) for c, t in zip(contexts, shown)]  # what the encoder read
    kept = list(kept) if kept is not None else [None] * len(texts)
    tables = list(tables) if tables is not None else [None] * len(texts)
    tabs = _token_tables(encoder, texts, kept, tables)
    fresh = _fresh_states(encoder, texts, kept, tabs)
    # every text's ids, offsets and special marks as arrays, all texts at once
    lens = [len(t) for t in tabs]
    allt = np.concatenate(tabs) if tabs else np.zeros((0, 3), np.int32)
    ids, off = allt[:, 0], allt[:, 1:]
    strings, names, cont = _token_strings(_tokenizer(encoder), ids)
    off, special, in_context = _outside_contexts(contexts, lens, off, off[:, 0] < 0)
    real_end = np.where(special, 0, off[:, 1])
    out, at = [], 0
    for i in range(len(texts)):
        states, source = (fresh[i], "encoded") if i in fresh else (kept[i], "kept")
        end = at + lens[i]
        last = int(real_end[at:end].max()) if end > at else 0
        out.append(_Tokens(states, ids[at:end], strings if strings is not None else names[at:end], off[at:end],
                           special[at:end], cont[at:end], shown[i], source, bool(shown[i][last:].strip()),
                           contexts[i], in_context[at:end] if contexts[i] else None))
        at = end
    return out


def _token_tables(encoder, texts: list[str], kept: list, tables: list) -> list[np.ndarray]:
    """Each text's token table: the kept one where it fits the kept states, else tokenised now
    (all of those texts in one batched call)."""
    # a kept token table goes only with the kept states it was written with
    tabs: list[np.ndarray | None] = [t if t is not None and k is not None and len(t) == len(k) else None
                                     for t, k in zip(tables, kept)]
    todo = [i for i, t in enumerate(tabs) if t is None]
    if todo:
        for i, e in zip(todo, _encodings(encoder, [texts[i] for i in todo])):
            tabs[i] = encoding_table(e)
    return tabs


def _fresh_states(encoder, texts: list[str], kept: list, tabs: list[np.ndarray]) -> dict[int, np.ndarray]:
    """{text number: token states} encoded now, in one encoder pass, for the texts whose kept
    states are missing or do not match their token table."""
    need = [i for i, (t, k) in enumerate(zip(tabs, kept)) if k is None or len(k) != len(t)]
    if not need:
        return {}
    run = getattr(encoder, "run_alone", None)  # a shared encoder (the server's) runs one pass at a time
    got = run(_encode_states, [texts[i] for i in need]) if run else _encode_states(encoder, [texts[i] for i in need])
    return dict(zip(need, got))


def _token_strings(tok, ids: np.ndarray) -> tuple[list[str] | None, list[str] | None, np.ndarray]:
    """(the vocabulary's string of each id, or None; else each token's string; which tokens
    continue a word) for the token ids of all texts. The tokenizer is asked for each token's
    string only where the vocabulary cannot give it (not WordPiece, or an id outside it)."""
    n = len(ids)
    strings, table = _vocab(tok)
    names = None
    if table is None or (n and (ids.min() < 0 or ids.max() >= len(table))):  # the tokenizer's own strings
        strings = None
        names = [tok.id_to_token(int(j)) or "" for j in ids.tolist()]
        cont = np.fromiter((t.startswith("##") for t in names), bool, n)
    else:
        cont = table[ids]
    return strings, names, cont


def _outside_contexts(contexts: list[str], lens: list[int], off: np.ndarray,
                      special: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, special marks, which tokens are the context's) of all texts' tokens, each text
    lens[i] tokens long: offsets made to point into the text after its context, and the
    context's tokens at no place in it (offsets -1, marked special)."""
    in_context = np.zeros(len(off), bool)
    if any(contexts):
        off = off.copy()
        for i, at in zip(range(len(lens)), np.cumsum([0] + lens[:-1]).tolist()):
            cut = prefix_length(contexts[i])
            if cut:
                o = off[at : at + lens[i]]
                mine = (o[:, 0] >= 0) & (o[:, 0] < cut)
                in_context[at : at + lens[i]] = mine
                o[~mine & (o[:, 0] >= 0)] -= cut
                o[mine] = -1
        special = special | in_context
    return off, special, in_context


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


def _token_records(tok: _Tokens, terms: np.ndarray) -> list[dict[str, Any]]:
    recs = [{"token": t, "start": a, "end": b, "contribution": c}
            for t, a, b, c in zip(tok.tokens, tok.off[:, 0].tolist(), tok.off[:, 1].tolist(),
                                  np.asarray(terms, np.float64).tolist())]
    for j in np.flatnonzero(tok.special).tolist():  # special tokens are at no place in the text
        recs[j]["start"] = recs[j]["end"] = None
    if tok.in_context is not None:  # nor are the chunk's titles, read before it
        for j in np.flatnonzero(tok.in_context).tolist():
            recs[j]["context"] = True
    return recs


def _fill_dense(d: dict[str, Any], tok: _Tokens, terms: np.ndarray, part: tuple) -> None:
    """The records of a dense explanation left to its first reading (Hit.explanation)."""
    d["tokens"] = _token_records(tok, terms)
    d["spans"] = _span_records(part)


def explain_dense(encoder, tok: _Tokens | None, text: str, q: np.ndarray, stored_vec: np.ndarray | None,
                  stored_score: float | None, query_layers: bool = False) -> dict[str, Any]:
    """The dense part of an explanation for one hit. stored_score: the cosine the ranking used.
    (tok carries the hit's text; `text` is kept for callers that pass it.)"""
    out, terms = _dense(encoder, tok, q, stored_vec, stored_score, query_layers)
    if terms is not None:
        out["spans"] = _word_spans([tok], [terms])[0]
    return out


def _dense(encoder, tok: _Tokens | None, q: np.ndarray, stored_vec: np.ndarray | None, stored_score: float | None,
           query_layers: bool, records: bool = True) -> tuple[dict[str, Any], np.ndarray | None]:
    """(explain_dense's dict with "spans" left None, the per-token terms) where there are terms,
    else (the finished dict, None): the caller fills in the word spans, many hits at once, and
    (records=False) the token records too (_token_records)."""
    pooling = getattr(encoder, "pooling", None)
    out: dict[str, Any] = {"pooling": pooling, "stored_score": stored_score, "ranking_score": stored_score}
    if query_layers or getattr(encoder, "query_tower", None) is not None:
        out["query"] = "the query vector comes from the trained query layers; the chunk side below is exact as its pooling says"
    if tok is None:
        out.update(exact=False, score=stored_score, tokens=[], spans=[],
                   note="per-token terms need the native (BERT-family) encoder's token states; only the cosine is given")
        return out, None
    head = getattr(encoder, "head", None)
    try:
        terms, v, how = dense_terms(pooling, tok.states, q, head)
    except ValueError as e:
        out.update(exact=False, score=stored_score, tokens=[], spans=[], note=str(e))
        return out, None
    score = float(terms.sum())
    out.update(exact=True, method=how, score=score, states=tok.source)
    terms = np.asarray(terms, np.float64)
    out["tokens"] = _token_records(tok, terms) if records else None
    out["spans"] = None  # a word's WordPiece pieces merged, their terms summed: _word_spans
    out["truncated"] = tok.truncated  # text past the model's max length is not in the vector
    if tok.context:  # the titles read before the text: their tokens' terms are in the sum, at no place in the text
        out["context"] = tok.context
        out["context_score"] = float(terms[tok.in_context].sum()) if tok.in_context is not None else 0.0
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
    return out, terms


# ---- the lexical side ------------------------------------------------------------------------
_WORD = re.compile(r"\w+", re.UNICODE)


class QueryTerms:
    """One query's analysed terms, worked out once for all its hits: the query words behind each
    term hash, the terms' positions in the index's vocabulary, and a memo of text words' terms."""

    def __init__(self, lex, query: str):
        self.words: dict[int, list[str]] = {}
        for w in _WORD.findall(query.lower()):
            if w not in lexical_.STOPWORDS:
                ws = self.words.setdefault(_word_term(w), [])
                if w not in ws:
                    ws.append(w)
        self.hashes = lex.query_hashes(query)  # in the order score_all() adds them
        self.known: set[str] = set()  # text words looked at so far
        self.match: dict[str, int] = {}  # ... those whose term is one of the query's: their term's hash
        self.average_length = float(lex.average_length) if len(lex) else 0.0

    def learn(self, words: set[str]) -> None:
        """Look at the words not seen before (set arithmetic, then one lookup a new word)."""
        new = words - self.known
        if new:
            q, terms = self.words, _TERMS
            for w in new:
                h = terms.get(w, _UNSEEN)  # (inlined: this loop runs for every new word of every text)
                if h is _UNSEEN:
                    h = _word_term(w)
                if h in q:
                    self.match[w] = h
            self.known |= new

    def term_of(self, word: str) -> int | None:
        """The hash of a text word's term where it is one of the query's, else None."""
        if word not in self.known:
            self.learn({word})
        return self.match.get(word)


_TERMS: dict[str, int | None] = {}  # word -> its term's hash (None: a stopword), across queries
_FORMS: dict[int, set[str]] = {}  # term hash -> the words of it met so far (those in _TERMS)
_UNSEEN = object()
_TERMS_MAX = 200_000


def _word_term(word: str) -> int | None:
    """lexical.analysis._term(word), or None for a stopword; remembered (a text's words recur across hits
    and queries, and stemming and hashing each is most of the lexical explanation's cost)."""
    try:
        return _TERMS[word]
    except KeyError:
        if len(_TERMS) >= _TERMS_MAX:
            _TERMS.clear()
            _FORMS.clear()
        h = _TERMS[word] = None if word in lexical_.STOPWORDS else lexical_.analysis._term(word)
        if h is not None:
            _FORMS.setdefault(h, set()).add(word)
        return h


_NOT_WORD_BYTES = bytes(c if c < 128 and (chr(c).isalnum() or c == 0x5F) else 0x20 for c in range(256))


def _ascii_words(low: str) -> set[str]:
    """The distinct \\w+ words of an ASCII text: in ASCII \\w is [A-Za-z0-9_], so mapping every
    other byte to a space and splitting finds the same words as the pattern, in a third of the time."""
    return set(low.encode("ascii").translate(_NOT_WORD_BYTES).decode("ascii").split())


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
    # the text's distinct words first (C speed), then each matching word's places; in ASCII text
    # \w is [a-z0-9_], so mapping every other character to a space and splitting finds the same
    # words as the pattern, in half the time
    words = _ascii_words(low) if low.isascii() else set(_WORD.findall(low))
    qt.learn(words)
    for w in words & qt.match.keys():
        got = _occurrences(low, w)
        if got:
            spans.setdefault(qt.match[w], []).extend(got)
    for v in spans.values():
        v.sort()
    return spans


def _occurrences(low: str, w: str) -> list[list[int]]:
    """[[start, end], ...] of w in low as a whole word."""
    out = []
    at = low.find(w)
    while at >= 0:
        end = at + len(w)
        if (at == 0 or not _is_word(low[at - 1])) and (end == len(low) or not _is_word(low[end])):
            out.append([at, end])
        at = low.find(w, end)
    return out


def _known_term_spans(qt: QueryTerms, text: str, tfs: Sequence[tuple[int, int]]) -> dict[int, list[list[int]]] | None:
    """_term_spans(qt, text) from BM25's own counts, without looking at every word of the text:
    for each (term hash, count in this chunk) the whole-word occurrences of the term's words met
    so far (the query's own, and the words of every text explained before). Where they are as
    many as BM25 counted, they are all of them (each is one of the words BM25 counts, of that
    term: BM25 counts the words of text.lower(), where they are looked for). None where a term
    falls short (a word not met yet), or where lower-casing moves offsets (a few Unicode letters
    become two characters): the caller looks at every word then."""
    low = text.lower()
    if len(low) != len(text):
        return None
    spans: dict[int, list[list[int]]] = {}
    for h, tf in tfs:
        if tf <= 0:
            continue
        got: list[list[int]] = []
        for w in tuple(_FORMS.get(h, ())):  # (a snapshot: other threads add words)
            got += _occurrences(low, w)
        if len(got) != tf:
            return None
        got.sort()
        spans[h] = got
    return spans


def explain_lexical(lex, query: str | QueryTerms, chunk_id: int, text: str, score: float | None) -> dict[str, Any]:
    """Each distinct query term's BM25 part for one chunk (they sum to its BM25 score)."""
    return explain_lexical_many(lex, query, [(chunk_id, text, score)])[0]


def explain_lexical_many(lex, query: str | QueryTerms, hits: Sequence[tuple],
                         defer: list | None = None) -> list[dict[str, Any]]:
    """explain_lexical for many (chunk id, text, BM25 score[, context]) of one query: each term's
    postings searched once for all the chunks. context: the titles BM25 indexed with the text
    (semsearch/corpus/titles.py), whose occurrences of a term count in its tf as `in_context`,
    not as spans. defer: a list given gets, per chunk, a function that fills in where the terms
    occur in its text (left empty until then), for the caller to run when the explanation is
    first read; else they are filled in now."""
    qt = query if isinstance(query, QueryTerms) else QueryTerms(lex, query)
    n = len(hits)
    cids = np.fromiter((int(x[0]) for x in hits), np.int64, n)
    _, held = lex.rows_of(cids)
    # per query term: its name, idf, and each chunk's part and count
    terms, lengths = lex.explain_terms(qt.hashes, cids)
    cols = [(h, " / ".join(qt.words.get(h, ["?"])), idf, c, tf) for h, idf, c, tf in terms]
    hashes = {h for h, *_ in terms}
    missing = [" / ".join(ws) for h, ws in qt.words.items() if h not in hashes]
    out_all, li = [], 0
    for r, (hit, is_held) in enumerate(zip(hits, held.tolist())):
        text, score, context = hit[1], hit[2], (hit[3] if len(hit) > 3 else "") or ""
        out: dict[str, Any] = {"score": score, "k1": lex.k1, "b": lex.b, "terms": []}
        if is_held:
            out["length"] = float(lengths[li])
            out["average_length"] = qt.average_length
            li += 1
        total = 0.0
        for h, name, idf, c, tf in cols:
            total += c[r]
            out["terms"].append({"term": name, "idf": idf, "tf": tf[r], "contribution": c[r], "spans": []})
        tfs = [(h, int(tf[r])) for h, _, _, _, tf in cols] if is_held else None
        if defer is None:
            _fill_term_spans(qt, text, out["terms"], cols, tfs, context)
        else:
            defer.append(functools.partial(_fill_term_spans, qt, text, out["terms"], cols, tfs, context))
        if missing:
            out["absent"] = list(missing)  # query terms no chunk of the index holds: they add nothing
        out["sum"] = total
        out_all.append(out)
    return out_all


def _fill_term_spans(qt: QueryTerms, text: str, terms: list[dict[str, Any]], cols: list,
                     tfs: Sequence[tuple[int, int]] | None = None, context: str = "") -> None:
    """Where each query term occurs in text (terms' "spans"). tfs: (term hash, BM25's count) of
    each term in this chunk, where the chunk is in the lexical index. context: the titles indexed
    before the text (as ChunkRow.lexical_text joins them): occurrences there are counted in
    `in_context`, and the spans point into the text itself."""
    if context:
        cut = len(context) + 1
        inner: list[dict[str, Any]] = [dict(t) for t in terms]
        _fill_term_spans(qt, f"{context}\n{text}", inner, cols, tfs)
        for t, x in zip(terms, inner):
            t["spans"] = [[a - cut, b - cut] for a, b in x["spans"] if a >= cut]
            if len(x["spans"]) > len(t["spans"]):
                t["in_context"] = len(x["spans"]) - len(t["spans"])
        return
    spans = _known_term_spans(qt, text, tfs) if tfs is not None else None
    if spans is None and tfs is not None:
        low = text.lower()
        if len(low) == len(text):
            words = _ascii_words(low) if low.isascii() else set(_WORD.findall(low))
            for w in words - _TERMS.keys():  # the text's words never met: now they are
                _word_term(w)
            spans = _known_term_spans(qt, text, tfs)
    if spans is None:
        spans = _term_spans(qt, text)
    for t, (h, *_) in zip(terms, cols):
        t["spans"] = spans.get(h, [])


# ---- fusion ----------------------------------------------------------------------------------
def _fusion_sides(pool, fusion: str) -> tuple | None:
    """What every hit's fusion arithmetic reads from its query's candidates, worked out once."""
    if pool is None:
        return None
    cand, d, b = pool[:3]
    full = pool[3] if len(pool) > 3 else np.zeros(len(cand), bool)
    if fusion == "convex":
        return cand, d, b, full, fusion_.minmax(d), fusion_.minmax(b), float(d.min()), float(d.max()), float(b.min()), float(b.max())
    return cand, d, b, full, fusion_.ranks(d), fusion_.ranks(b)


def explain_fusion(pool, chunk_id: int, fusion: str, alpha: float, score: float, _sides: tuple | None = None) -> dict[str, Any] | None:
    """The fused score's arithmetic for one hit, from its query's candidates (ids, cosines, bm25)."""
    sides = _sides if _sides is not None else _fusion_sides(pool, fusion)
    if sides is None:
        return None
    cand, d, b, full = sides[:4]
    j = int(np.searchsorted(cand, chunk_id))
    if j >= len(cand) or int(cand[j]) != chunk_id:
        return None
    out: dict[str, Any] = {"method": fusion, "candidates": int(len(cand)), "score": score}
    if fusion == "convex":
        nd, nb, dmin, dmax, bmin, bmax = sides[4:]
        out.update(alpha=alpha,
                   dense={"value": float(d[j]), "min": dmin, "max": dmax, "normalized": float(nd[j])},
                   lexical={"value": float(b[j]), "min": bmin, "max": bmax, "normalized": float(nb[j])})
        out["fused"] = float(alpha * nd[j] + (1 - alpha) * nb[j])
        out["formula"] = (f"{alpha:g} x {nd[j]:.4f} + {1 - alpha:g} x {nb[j]:.4f} = {out['fused']:.4f}")
    else:
        rd, rb = sides[4:]
        out.update(rrf_k=fusion_.RRF_K, dense={"value": float(d[j]), "rank": int(rd[j])},
                   lexical={"value": float(b[j]), "rank": int(rb[j])})
        out["fused"] = 1.0 / (fusion_.RRF_K + int(rd[j])) + 1.0 / (fusion_.RRF_K + int(rb[j]))
        out["formula"] = f"1/({fusion_.RRF_K}+{int(rd[j])}) + 1/({fusion_.RRF_K}+{int(rb[j])}) = {out['fused']:.6f}"
    # a long query's every term in this chunk: it ranks before the candidates without them
    out["all_terms"] = bool(full[j])
    if full[j]:
        out["fused"] += 1.0
        out["formula"] += f" + 1 (all query terms, a query of {fusion_.ALL_TERMS_MIN} or more) = {out['fused']:.6f}"
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


def hit_context(manifest, hit) -> str:
    """The titles a hit's chunk was encoded and indexed with ("" for none), rebuilt from its path
    and metadata as indexing made them (semsearch/corpus/titles.py), in an index that records them."""
    titles = int((getattr(manifest, "chunking", None) or {}).get("context", 0))
    return chunk_context(hit.path, hit.metadata, titles) if titles else ""


def explain_hits(retriever, g, queries: Sequence[str], qv: np.ndarray | None, hits: list[list], mode: str,
                 fusion: str, alpha: float, pools: list | None, lexical_parts: dict | None = None) -> None:
    """Set hit.explanation on every hit of a search (called by Retriever.search_batch).
    `lexical_parts`: the BM25 part of each explanation, {(query number, chunk id): dict}, worked
    out elsewhere (by the shards of a sharded index, each for its own chunks) instead of here."""
    flat = [(qi, h) for qi, row in enumerate(hits) for h in row]
    if not flat:
        return
    lex = g.lexical(retriever.folder, required=False) if mode in ("lexical", "hybrid") else None
    query_layers = (g.manifest.head or {}).get("kind") == "query-layers"
    dense = mode in ("dense", "hybrid") and qv is not None
    toks, stored = _hits_dense_inputs(retriever, g, flat) if dense else ({}, {})
    # the word spans, BM25 parts and fusion per query
    for qi, row in enumerate(hits):
        if not row:
            continue
        es: list[dict[str, Any]] = [{"mode": mode, "score": h.score, "query": queries[qi]} for h in row]
        # the records (each token's and word's dict, where query terms occur) are left to each
        # explanation's first reading: every number is worked out here
        later: list[list] = [[] for _ in row]
        if dense:
            spans_of = []  # (hit, dense dict, tokens, terms): word spans for all the query's hits at once
            for j, (e, h) in enumerate(zip(es, row)):
                tok = toks.get(h.id)
                e["dense"], t = _dense(retriever.encoder, tok, qv[qi], stored.get(h.id), h.dense_score, query_layers,
                                       records=False)
                if t is not None:
                    spans_of.append((j, e["dense"], tok, t))
            parts = _word_span_parts([s[2] for s in spans_of], [s[3] for s in spans_of])
            for (j, d, tok, t), part in zip(spans_of, parts):
                later[j].append(functools.partial(_fill_dense, d, tok, t, part))
        if lexical_parts is not None and mode in ("lexical", "hybrid"):
            for e, h in zip(es, row):
                e["lexical"] = lexical_parts.get((qi, h.id))
        elif lex is not None:
            fill: list = []
            for e, x in zip(es, explain_lexical_many(lex, QueryTerms(lex, queries[qi]),
                                                     [(h.id, h.text, h.lexical_score, hit_context(g.manifest, h)) for h in row],
                                                     defer=fill)):
                e["lexical"] = x
            for j, f in enumerate(fill):
                later[j].append(f)
        sides = _fusion_sides(pools[qi] if pools else None, fusion) if mode == "hybrid" else None
        for j, (e, h) in enumerate(zip(es, row)):
            if mode == "hybrid":
                e["fusion"] = explain_fusion(None, h.id, fusion, alpha, h.score, sides)
            if later[j] and hasattr(h, "defer_explanation"):
                h.defer_explanation(e, functools.partial(_run_all, later[j]))
            else:
                _run_all(later[j])
                h.explanation = e


def _hits_dense_inputs(retriever, g, flat: list) -> tuple[dict[int, _Tokens | None], dict[int, np.ndarray]]:
    """({chunk id: its tokens and token states}, {chunk id: its stored vector}) for the hits of
    all queries, each chunk once. The hits' token states and token tables are read in one buffer
    where the index keeps them, else tokenised in one batched call and encoded in one encoder pass."""
    ids = sorted({h.id for _, h in flat})
    hit_of = {h.id: h for _, h in flat}
    texts = [hit_of[i].text for i in ids]
    contexts = [hit_context(g.manifest, hit_of[i]) for i in ids]  # the titles each chunk was encoded with
    kept = _kept_states(g, retriever.folder, ids)
    pairs = [kept.get(i, (None, None)) for i in ids]
    toks = dict(zip(ids, hit_tokens(retriever.encoder, texts, [p[0] for p in pairs], tables=[p[1] for p in pairs],
                                    contexts=contexts)))
    return toks, _stored_vectors(g, ids)


def _run_all(fns) -> None:
    for f in fns:
        f()


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
            if d.get("context"):
                lines.append(f"  titles read with the chunk: {d['context']!r} ({d.get('context_score', 0.0):+.4f} of it)")
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
        parts = " + ".join(f"{t['term']} {t['contribution']:.3f} (idf {t['idf']:.2f}, tf {t['tf']}"
                           + (f", {t['in_context']} in the titles)" if t.get("in_context") else ")") for t in terms)
        score = lex.get("score") if lex.get("score") is not None else lex.get("sum", 0.0)
        lines.append(f"  bm25 {score:.3f}" + (f" = {parts}" if parts else " (no query term occurs)"))
    f = e.get("fusion")
    if f:
        if f["method"] == "convex":
            dn, ln = f["dense"], f["lexical"]
            full = f.get("all_terms")
            lines.append(f"  fusion convex (alpha {f['alpha']:g}): {f['alpha']:g} x {dn['normalized']:.4f} "
                         f"[cosine {dn['value']:.4f} in {dn['min']:.4f}..{dn['max']:.4f}] + {1 - f['alpha']:g} x {ln['normalized']:.4f} "
                         f"[bm25 {ln['value']:.3f} in {ln['min']:.3f}..{ln['max']:.3f}] = {f['fused'] - full:.4f} "
                         + (f"+ 1 (the chunk holds all query terms) = {f['fused']:.4f} " if full else "")
                         + f"(min-max over {f['candidates']} candidates)")
        else:
            lines.append(f"  fusion rrf: {f['formula']} (dense rank {f['dense']['rank']}, lexical rank {f['lexical']['rank']} "
                         f"of {f['candidates']} candidates)")
    return "\n".join(lines)
