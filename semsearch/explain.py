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

import itertools
import json
import re
import sys
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
    character starts and ends in the text (None for [CLS], [SEP] and other special tokens; `off`
    holds them all as an array), which are special, which continue a word ('##s'), and whether
    the text goes on past the model's max length (that part is not in the vector)."""

    __slots__ = ("states", "tokens", "starts", "ends", "off", "special", "cont", "text", "source", "truncated")

    def __init__(self, states, tokens, starts, ends, off, special, cont, text, source, truncated):
        self.states, self.tokens, self.starts, self.ends = states, tokens, starts, ends
        self.off, self.special, self.cont = off, special, cont
        self.text, self.source, self.truncated = text, source, truncated


def _word_spans(toks: Sequence[_Tokens], terms: Sequence[np.ndarray]) -> list[list[dict[str, Any]]]:
    """Each text's word spans with their terms summed: a word's WordPiece continuations ('##s'
    right after 'decision') merged into it. All texts at once, in numpy; each word's sum adds its
    pieces left to right, as a loop over the tokens would."""
    if not toks:
        return []
    m = [min(len(t.tokens), len(x)) for t, x in zip(toks, terms)]  # (the same but for a misfit)
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
    out = []
    for k, t in enumerate(toks):
        text, lo, hi = t.text, bounds[k], bounds[k + 1]
        out.append([{"start": s, "end": e, "text": text[s:e], "contribution": c}
                    for s, e, c in zip(a[lo:hi], b[lo:hi], x[lo:hi])])
    return out


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


def _widen(a: np.ndarray) -> np.ndarray:
    """fp16 -> float32 (exact either way): through torch where it is loaded (vectorised, about 4x
    numpy's conversion), else numpy. Copied in pieces below torch's parallel grain, so no OpenMP
    team is woken: its threads spin on a core after the copy, which slowed the tokenizer running
    next by a third on 2 cores."""
    torch = sys.modules.get("torch")
    if torch is None or not a.size:
        return a.astype(np.float32)
    out = np.empty(a.shape, np.float32)
    try:
        for src, dst in zip(torch.from_numpy(a.reshape(-1)).split(_GRAIN), torch.from_numpy(out.reshape(-1)).split(_GRAIN)):
            dst.copy_(src)
    except Exception:  # noqa: BLE001 - a torch that cannot: numpy gives the same numbers
        return a.astype(np.float32)
    return out


def _kept_states(g, folder: Path, ids: Sequence[int]) -> dict[int, np.ndarray]:
    """{chunk id: fp16 token states as float32} for chunks whose states the index keeps, read
    into one buffer and widened in one call."""
    st = g.manifest.states
    if not st or not ids:
        return {}
    try:
        rows = g.docs.state_refs(ids)
    except Exception:  # noqa: BLE001 - a docstore without the columns: encode instead
        return {}
    dim = int(st["dim"])
    rows = [(file, int(off), int(n), int(cid)) for cid, file, off, n in rows if file is not None]
    rows.sort()
    buf = np.empty((sum(n for _, _, n, _ in rows), dim), np.float16)
    got: list[tuple[int, int, int]] = []  # (chunk id, first row in buf, rows)
    at, i = 0, 0
    while i < len(rows):
        file = rows[i][0]
        j = i
        while j < len(rows) and rows[j][0] == file:
            j += 1
        try:
            with open(Path(folder) / "states" / file, "rb", buffering=0) as f:
                for _, off, n, cid in rows[i:j]:
                    f.seek(off * 2 * dim)
                    if f.readinto(buf[at : at + n]) == n * 2 * dim:
                        got.append((cid, at, n))
                        at += n
        except OSError:
            pass
        i = j
    wide = _widen(buf[:at])
    return {cid: wide[a : a + n] for cid, a, n in got}


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
        strings = [""] * (max(vocab.values()) + 1)
        for t, i in vocab.items():
            strings[i] = t
        table = np.fromiter((t.startswith("##") for t in strings), bool, len(strings))
    _VOCABS[id(tok)] = (tok, strings, table)
    return strings, table


def _explainable(encoder) -> bool:
    """Whether encoder gives token states (the native BERT-family encoders, torch or numpy)."""
    return _tokenizer(encoder) is not None and (hasattr(encoder, "iter_states") or hasattr(encoder, "_forward"))


def hit_tokens(encoder, texts: Sequence[str], kept: Sequence[np.ndarray | None] | None = None, encs=None) -> list[_Tokens | None]:
    """Tokens and states for each text: the kept states where given (and of the right length),
    else encoded now, all of them in one encoder pass; None for every text where the encoder
    cannot give token states. encs: the texts' _encodings where the caller has them."""
    if not _explainable(encoder):
        return [None] * len(texts)
    texts = list(texts)
    if encs is None:
        encs = _encodings(encoder, texts)
    kept = list(kept) if kept is not None else [None] * len(texts)
    need = [i for i, (e, k) in enumerate(zip(encs, kept)) if k is None or len(k) != len(e.ids)]
    fresh: dict[int, np.ndarray] = {}
    if need:
        run = getattr(encoder, "run_alone", None)  # a shared encoder (the server's) runs one pass at a time
        got = run(_encode_states, [texts[i] for i in need]) if run else _encode_states(encoder, [texts[i] for i in need])
        fresh = dict(zip(need, got))
    # every text's offsets, special marks and ids as arrays in one conversion each
    chain = itertools.chain.from_iterable
    lens = [len(e.ids) for e in encs]
    n = sum(lens)
    off = np.fromiter(chain(chain(e.offsets for e in encs)), np.int64, 2 * n).reshape(n, 2)
    special = np.fromiter(chain(e.special_tokens_mask for e in encs), bool, n)
    ids = np.fromiter(chain(e.ids for e in encs), np.int64, n)
    strings, table = _vocab(_tokenizer(encoder))
    if table is None or (n and (ids.min() < 0 or ids.max() >= len(table))):  # the encodings' own strings
        strings = None
        cont = np.fromiter((t.startswith("##") for e in encs for t in e.tokens), bool, n)
    else:
        cont = table[ids]
    starts, ends = off[:, 0].tolist(), off[:, 1].tolist()
    for j in np.flatnonzero(special).tolist():
        starts[j] = ends[j] = None
    real_end = np.where(special, 0, off[:, 1])
    out, at = [], 0
    for i, e in enumerate(encs):
        states, source = (fresh[i], "encoded") if i in fresh else (kept[i], "kept")
        end = at + lens[i]
        last = int(real_end[at:end].max()) if end > at else 0
        tokens = [strings[j] for j in e.ids] if strings is not None else e.tokens
        out.append(_Tokens(states, tokens, starts[at:end], ends[at:end], off[at:end], special[at:end], cont[at:end],
                           texts[i], source, bool(texts[i][last:].strip())))
        at = end
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


def explain_dense(encoder, tok: _Tokens | None, text: str, q: np.ndarray, stored_vec: np.ndarray | None,
                  stored_score: float | None, query_layers: bool = False) -> dict[str, Any]:
    """The dense part of an explanation for one hit. stored_score: the cosine the ranking used.
    (tok carries the hit's text; `text` is kept for callers that pass it.)"""
    out, terms = _dense(encoder, tok, q, stored_vec, stored_score, query_layers)
    if terms is not None:
        out["spans"] = _word_spans([tok], [terms])[0]
    return out


def _dense(encoder, tok: _Tokens | None, q: np.ndarray, stored_vec: np.ndarray | None, stored_score: float | None,
           query_layers: bool) -> tuple[dict[str, Any], np.ndarray | None]:
    """(explain_dense's dict with "spans" left None, the per-token terms) where there are terms,
    else (the finished dict, None): the caller fills in the word spans, many hits at once."""
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
    out["tokens"] = [{"token": t, "start": a, "end": b, "contribution": c}
                     for t, a, b, c in zip(tok.tokens, tok.starts, tok.ends, terms.tolist())]
    out["spans"] = None  # a word's WordPiece pieces merged, their terms summed: _word_spans
    out["truncated"] = tok.truncated  # text past the model's max length is not in the vector
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
                ws = self.words.setdefault(lexical_._term(w), [])
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
            q = self.words
            for w in new:
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
_TERMS_MAX = 200_000


def _word_term(word: str) -> int | None:
    """lexical._term(word), or None for a stopword; remembered (a text's words recur across hits
    and queries, and stemming and hashing each is most of the lexical explanation's cost)."""
    try:
        return _TERMS[word]
    except KeyError:
        if len(_TERMS) >= _TERMS_MAX:
            _TERMS.clear()
        h = _TERMS[word] = None if word in lexical_.STOPWORDS else lexical_._term(word)
        return h


_NOT_WORD = str.maketrans({chr(i): " " for i in range(128) if not (chr(i).isalnum() or chr(i) == "_")})


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
    words = set(low.translate(_NOT_WORD).split()) if low.isascii() else set(_WORD.findall(low))
    qt.learn(words)
    for w in words & qt.match.keys():
        h = qt.match[w]
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
    return explain_lexical_many(lex, query, [(chunk_id, text, score)])[0]


def explain_lexical_many(lex, query: str | QueryTerms, hits: Sequence[tuple[int, str, float | None]]) -> list[dict[str, Any]]:
    """explain_lexical for many (chunk id, text, BM25 score) of one query: each term's postings
    searched once for all the chunks."""
    qt = query if isinstance(query, QueryTerms) else QueryTerms(lex, query)
    n = len(hits)
    cids = np.fromiter((int(c) for c, _, _ in hits), np.int64, n)
    _, held = lex.rows_of(cids)
    # per query term: its name, idf, and each chunk's part and count
    terms, lengths = lex.explain_terms(qt.hashes, cids)
    cols = [(h, " / ".join(qt.words.get(h, ["?"])), idf, c, tf) for h, idf, c, tf in terms]
    hashes = {h for h, *_ in terms}
    missing = [" / ".join(ws) for h, ws in qt.words.items() if h not in hashes]
    out_all, li = [], 0
    for r, ((_, text, score), is_held) in enumerate(zip(hits, held.tolist())):
        out: dict[str, Any] = {"score": score, "k1": lex.k1, "b": lex.b, "terms": []}
        if is_held:
            out["length"] = float(lengths[li])
            out["average_length"] = qt.average_length
            li += 1
        spans = _term_spans(qt, text)
        total = 0.0
        for h, name, idf, c, tf in cols:
            total += c[r]
            out["terms"].append({"term": name, "idf": idf, "tf": tf[r], "contribution": c[r], "spans": spans.get(h, [])})
        if missing:
            out["absent"] = list(missing)  # query terms no chunk of the index holds: they add nothing
        out["sum"] = total
        out_all.append(out)
    return out_all


# ---- fusion ----------------------------------------------------------------------------------
def _fusion_sides(pool, fusion: str) -> tuple | None:
    """What every hit's fusion arithmetic reads from its query's candidates, worked out once."""
    if pool is None:
        return None
    cand, d, b = pool
    if fusion == "convex":
        return cand, d, b, fusion_.minmax(d), fusion_.minmax(b), float(d.min()), float(d.max()), float(b.min()), float(b.max())
    return cand, d, b, fusion_.ranks(d), fusion_.ranks(b)


def explain_fusion(pool, chunk_id: int, fusion: str, alpha: float, score: float, _sides: tuple | None = None) -> dict[str, Any] | None:
    """The fused score's arithmetic for one hit, from its query's candidates (ids, cosines, bm25)."""
    sides = _sides if _sides is not None else _fusion_sides(pool, fusion)
    if sides is None:
        return None
    cand, d, b = sides[:3]
    j = int(np.searchsorted(cand, chunk_id))
    if j >= len(cand) or int(cand[j]) != chunk_id:
        return None
    out: dict[str, Any] = {"method": fusion, "candidates": int(len(cand)), "score": score}
    if fusion == "convex":
        nd, nb, dmin, dmax, bmin, bmax = sides[3:]
        out.update(alpha=alpha,
                   dense={"value": float(d[j]), "min": dmin, "max": dmax, "normalized": float(nd[j])},
                   lexical={"value": float(b[j]), "min": bmin, "max": bmax, "normalized": float(nb[j])})
        out["fused"] = float(alpha * nd[j] + (1 - alpha) * nb[j])
        out["formula"] = (f"{alpha:g} x {nd[j]:.4f} + {1 - alpha:g} x {nb[j]:.4f} = {out['fused']:.4f}")
    else:
        rd, rb = sides[3:]
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
        texts = [text_of[i] for i in ids]
        # all the hits tokenised in one batched call, read in one buffer, encoded (where the index
        # keeps no states) in one encoder pass; the word spans, BM25 parts and fusion per query
        encs = _encodings(retriever.encoder, texts) if _explainable(retriever.encoder) else None
        kept = _kept_states(g, retriever.folder, ids)
        toks = dict(zip(ids, hit_tokens(retriever.encoder, texts, [kept.get(i) for i in ids], encs)))
        stored = _stored_vectors(g, ids)
    for qi, row in enumerate(hits):
        if not row:
            continue
        es: list[dict[str, Any]] = [{"mode": mode, "score": h.score, "query": queries[qi]} for h in row]
        if dense:
            spans_of = []  # (dense dict, tokens, terms): word spans for all the query's hits at once
            for e, h in zip(es, row):
                tok = toks.get(h.id)
                e["dense"], t = _dense(retriever.encoder, tok, qv[qi], stored.get(h.id), h.dense_score, query_layers)
                if t is not None:
                    spans_of.append((e["dense"], tok, t))
            for (d, _, _), spans in zip(spans_of, _word_spans([s[1] for s in spans_of], [s[2] for s in spans_of])):
                d["spans"] = spans
        if lex is not None:
            for e, x in zip(es, explain_lexical_many(lex, QueryTerms(lex, queries[qi]),
                                                     [(h.id, h.text, h.lexical_score) for h in row])):
                e["lexical"] = x
        sides = _fusion_sides(pools[qi] if pools else None, fusion) if mode == "hybrid" else None
        for e, h in zip(es, row):
            if mode == "hybrid":
                e["fusion"] = explain_fusion(None, h.id, fusion, alpha, h.score, sides)
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
