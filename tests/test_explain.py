"""Retriever.search(..., explain=True): the parts of each score add up to it, exactly, with the real
model over the bundled sample corpus, for every mode and for mean, max, cls and head pooling."""
from __future__ import annotations

import collections
import math
import shutil

import numpy as np
import pytest
import torch

from semsearch import fusion as fusion_
from semsearch.encoder import Encoder
from semsearch.encoder.pooling import AttentionHead
from semsearch import explain as explain_
from semsearch.corpus.titles import embedding_text
from semsearch.explain import format_explanation, hit_context
from semsearch.indexing import index_corpus
from semsearch.search import Retriever

from conftest import SAMPLE, FakeEncoder

QUERIES = ["how long does a personal loan decision take", "what does the underwriter check", "lentil soup with cumin"]


def corpus_of(root):
    """A few folders of the sample corpus (banking articles, the FAQ table, recipes)."""
    for sub in ("banking", "faq", "cooking"):
        shutil.copytree(SAMPLE / sub, root / sub)
    return root


pytestmark = pytest.mark.xdist_group("test_explain")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return corpus_of(tmp_path_factory.mktemp("explain") / "corpus")


@pytest.fixture(scope="module")
def mean_index(tmp_path_factory, corpus, real_encoder):
    folder = tmp_path_factory.mktemp("mean") / "idx"
    index_corpus(corpus, folder, real_encoder, progress=False)
    return folder


def check_dense(hit, tol=1e-4):
    d = hit.explanation["dense"]
    assert d["exact"] is True and d["states"] in ("encoded", "kept")
    total = math.fsum(t["contribution"] for t in d["tokens"])
    assert total == pytest.approx(d["score"], abs=1e-9)  # the terms sum to the cosine they explain
    assert math.fsum(w["contribution"] for w in d["spans"]) + math.fsum(
        t["contribution"] for t in d["tokens"] if t["start"] is None) == pytest.approx(d["score"], abs=1e-9)
    assert d["score"] == pytest.approx(hit.dense_score, abs=tol)  # ... which is the cosine the ranking used
    assert d["matches_stored"] is True and d["difference"] <= tol
    for t in d["tokens"]:  # every content token is a span of the hit's text
        if t["start"] is not None and hit.text[t["start"]:t["end"]].isascii():
            assert hit.text[t["start"]:t["end"]].lower() == t["token"].removeprefix("##")
    for w in d["spans"]:
        assert hit.text[w["start"]:w["end"]] == w["text"]
    return d


def check_lexical(hit):
    lex = hit.explanation["lexical"]
    assert math.fsum(t["contribution"] for t in lex["terms"]) == pytest.approx(hit.lexical_score, rel=1e-5, abs=1e-6)
    for t in lex["terms"]:
        assert (t["tf"] > 0) == (t["contribution"] > 0)
        assert len(t["spans"]) + t.get("in_context", 0) == t["tf"]  # each occurrence is marked in the text, or in its titles
        if t["tf"]:
            assert t["contribution"] <= t["idf"] * (lex["k1"] + 1) + 1e-6  # BM25's bound for one term
    return lex


def test_dense_mean_pooling_terms_sum_to_the_cosine(mean_index, real_encoder):
    r = Retriever.load(mean_index, encoder=real_encoder)
    for q in QUERIES:
        plain = r.search(q, k=5, mode="dense")
        hits = r.search(q, k=5, mode="dense", explain=True)
        assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in plain]  # explaining changes no ranking
        assert all(h.explanation is None for h in plain) and plain[0].to_dict()["explanation"] is None
        for h in hits:
            d = check_dense(h)
            assert d["pooling"] == "mean" and "lexical" not in h.explanation and "fusion" not in h.explanation
            n = len(d["tokens"])
            assert d["tokens"][0]["token"] == "[CLS]" and d["tokens"][-1]["token"] == "[SEP]" and n > 2
        assert hits[0].to_dict()["explanation"]["dense"]["tokens"] == hits[0].explanation["dense"]["tokens"]
    top = r.search("personal loan decision", k=1, mode="dense", explain=True)[0]
    best = max(top.explanation["dense"]["spans"], key=lambda w: w["contribution"])
    assert best["text"].lower() in {"personal", "loan", "loans", "decision", "decisions"}


def test_lexical_terms_sum_to_bm25(mean_index, real_encoder):
    r = Retriever.load(mean_index, encoder=real_encoder)
    hits = r.search("personal loan decision underwriter", k=6, mode="lexical", explain=True)
    assert hits
    for h in hits:
        assert h.lexical_score == h.score and "dense" not in h.explanation
        lex = check_lexical(h)
        assert {t["term"] for t in lex["terms"]} >= {"personal", "loan", "decision", "underwriter"}
    # a word no chunk holds is named as absent and adds nothing
    h = r.search("loan zyzzyvaquux", k=1, mode="lexical", explain=True)[0]
    assert h.explanation["lexical"]["absent"] == ["zyzzyvaquux"]
    check_lexical(h)


@pytest.mark.parametrize("fusion", ["convex", "rrf"])
def test_hybrid_fusion_arithmetic_gives_the_score(mean_index, real_encoder, fusion):
    r = Retriever.load(mean_index, encoder=real_encoder)
    for q in QUERIES:
        hits = r.search(q, k=5, mode="hybrid", fusion=fusion, explain=True)
        assert [h.id for h in hits] == [h.id for h in r.search(q, k=5, mode="hybrid", fusion=fusion)]
        for h in hits:
            check_dense(h)
            check_lexical(h)
            f = h.explanation["fusion"]
            assert f["method"] == fusion and f["fused"] == pytest.approx(h.score, abs=1e-12)
            if fusion == "convex":
                for side, value in (("dense", h.dense_score), ("lexical", h.lexical_score)):
                    s = f[side]
                    assert s["value"] == pytest.approx(value, abs=1e-6) and s["min"] <= s["value"] <= s["max"]
                    norm = (s["value"] - s["min"]) / (s["max"] - s["min"]) if s["max"] > s["min"] else float(s["max"] > 0)
                    assert s["normalized"] == pytest.approx(norm, abs=1e-12)
                assert f["alpha"] == fusion_.ALPHA
                assert f["alpha"] * f["dense"]["normalized"] + (1 - f["alpha"]) * f["lexical"]["normalized"] == pytest.approx(h.score, abs=1e-12)
            else:
                assert 1 / (fusion_.RRF_K + f["dense"]["rank"]) + 1 / (fusion_.RRF_K + f["lexical"]["rank"]) == pytest.approx(h.score, abs=1e-15)
    # alpha and a metadata filter travel into the explanation
    hits = r.search("loan decision", k=3, mode="hybrid", alpha=0.8, where={"category": "lending"}, explain=True)
    assert hits and all(h.metadata["category"] == "lending" and h.explanation["fusion"]["alpha"] == 0.8 for h in hits)
    for h in hits:
        f = h.explanation["fusion"]
        assert 0.8 * f["dense"]["normalized"] + 0.2 * f["lexical"]["normalized"] == pytest.approx(h.score, abs=1e-12)


def test_search_batch_explains_every_query(mean_index, real_encoder):
    r = Retriever.load(mean_index, encoder=real_encoder)
    results = r.search_batch(QUERIES, k=3, explain=True)
    for q, hits in zip(QUERIES, results):
        assert hits and all(h.explanation["query"] == q for h in hits)
        for h in hits:
            check_dense(h)
            check_lexical(h)


@pytest.mark.parametrize("pooling", ["max", "cls"])
def test_max_and_cls_pooling(tmp_path, pooling):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copytree(SAMPLE / "faq", corpus / "faq")
    enc = Encoder(pooling=pooling, precision="fp32", device="cpu")
    index_corpus(corpus, tmp_path / "idx", enc, progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=enc)
    for mode in ("dense", "hybrid"):
        hits = r.search("how long does a personal loan decision take", k=4, mode=mode, explain=True)
        assert hits
        for h in hits:
            d = check_dense(h)
            assert d["pooling"] == pooling
            c = np.array([t["contribution"] for t in d["tokens"]])
            if pooling == "cls":  # the whole score is the [CLS] token's
                assert d["tokens"][0]["token"] == "[CLS]" and c[0] == pytest.approx(d["score"], abs=1e-12)
                assert not c[1:].any() and "CLS" in d["method"]
            else:  # max: several tokens win dimensions; the terms are theirs, exact
                assert (c != 0).sum() > 3 and "won" in d["method"]
            text = format_explanation(h, color=False)
            assert f"{pooling} pooling, exact" in text
            if pooling == "cls":
                assert "the whole score is the [CLS] token's" in text


def test_attention_head_terms_are_exact(tmp_path):
    torch.manual_seed(0)
    head = AttentionHead(384, out_dim=256)
    with torch.no_grad():  # a head that weighs tokens unevenly and projects: nothing like a plain mean
        head.score.weight.normal_(0, 0.2)
        head.proj.weight.normal_(0, 0.05)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copytree(SAMPLE / "faq", corpus / "faq")
    enc = Encoder(pooling="head", head=head, precision="fp32", device="cpu")
    index_corpus(corpus, tmp_path / "idx", enc, progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=enc)
    hits = r.search("lost or stolen card", k=3, mode="dense", explain=True)
    assert hits
    for h in hits:
        d = check_dense(h)
        assert d["pooling"] == "head" and "attention weights" in d["method"]


def test_kept_token_states_need_no_encoding(tmp_path, real_encoder):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copytree(SAMPLE / "faq", corpus / "faq")
    index_corpus(corpus, tmp_path / "idx", real_encoder, progress=False, keep_states=True)
    r = Retriever.load(tmp_path / "idx", encoder=real_encoder)
    for h in r.search("can I repay my loan early", k=4, mode="hybrid", explain=True):
        d = h.explanation["dense"]
        assert d["states"] == "kept" and "fp16" in d["note"]
        assert math.fsum(t["contribution"] for t in d["tokens"]) == pytest.approx(d["score"], abs=1e-9)
        # fp16 states pool to a vector a little off the stored one: both cosines are given
        assert d["stored_score"] == pytest.approx(h.dense_score, abs=1e-6)
        assert abs(d["score"] - d["stored_score"]) == pytest.approx(d["difference"]) and d["difference"] < 5e-3
        assert d["matches_stored"] is True


def test_torch_free_query_encoder_explains_too(mean_index):
    r = Retriever.load(mean_index, fast_start=True)
    assert type(r.encoder).__name__ == "NumpyEncoder"
    for h in r.search("what does the underwriter check", k=3, mode="hybrid", explain=True):
        check_dense(h, tol=1e-4)
        check_lexical(h)


def test_an_encoder_without_token_states_says_so(small_corpus, tmp_path):
    index_corpus(small_corpus, tmp_path / "idx", FakeEncoder(), progress=False)
    r = Retriever.load(tmp_path / "idx", encoder=FakeEncoder())
    hits = r.search("loan credit bank", k=2, mode="hybrid", explain=True)
    d = hits[0].explanation["dense"]
    assert d["exact"] is False and d["tokens"] == [] and "token states" in d["note"]
    check_lexical(hits[0])
    assert hits[0].explanation["fusion"]["fused"] == pytest.approx(hits[0].score)
    assert "bm25" in format_explanation(hits[0], color=False)


def test_format_explanation(mean_index, real_encoder):
    r = Retriever.load(mean_index, encoder=real_encoder)
    h = r.search("how long does a personal loan decision take", k=1, mode="hybrid", explain=True)[0]
    plain = format_explanation(h, color=False)
    assert "\x1b[" not in plain and "[[" in plain and "]]" in plain and "{{" in plain
    top = max(h.explanation["dense"]["spans"], key=lambda w: w["contribution"])
    assert f"[[{top['text']}" in plain or f"[[{{{{{top['text']}" in plain
    assert "mean pooling, exact sum of" in plain and "bm25 " in plain and "fusion convex (alpha 0.5)" in plain
    coloured = format_explanation(h, color=True)
    assert "\x1b[1;33m" in coloured and "\x1b[0m" in coloured and "[[" not in coloured
    assert format_explanation(h.to_dict(), color=False) == plain  # the JSON form renders the same
    rrf = r.search("loan decision", k=1, mode="hybrid", fusion="rrf", explain=True)[0]
    assert "fusion rrf: 1/(60+" in format_explanation(rrf, color=False)
    lexical = r.search("loan decision", k=1, mode="lexical", explain=True)[0]
    out = format_explanation(lexical, color=False)
    assert "dense" not in out and "{{" in out and "bm25" in out
    assert format_explanation(r.search("loan", k=1)[0], color=False) == ""


# ---- the fast paths give what the plain ones give ---------------------------------------------
TRICKY = [
    "Most personal loan decisions are made within one business day.",
    "Tabs\tand\nnew lines\r\nand  double  spaces; punctuation!? (brackets) [1], x_y, 3.5%",
    "The [MASK] token, [cls] in lower case and [SEP] in the text itself.",
    "Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9, \u03b1-helix \u00d7 2, \u4e2d\u6587 text",
    "a vertical\x0btab and a form\x0cfeed, a bell\x07 and a delete\x7f",
    "",
    "antidisestablishmentarianism hyperparathyroidism " * 80,  # word pieces, and past the max length
]


def test_batched_tokenizing_is_the_tokenizers_own(real_encoder):
    """_encodings (plain ASCII through a copy without the normaliser, the rest as is) gives the
    very tokens, offsets and special marks of the encoder's tokenizer."""
    texts = TRICKY + [p.read_text(encoding="utf-8") for p in sorted((SAMPLE / "banking").glob("*"))[:5]]
    ours = explain_._encodings(real_encoder, texts)
    theirs = real_encoder.tokenizer.encode_batch(texts)
    for a, b in zip(ours, theirs):
        assert (a.ids, a.tokens, a.offsets, a.special_tokens_mask) == (b.ids, b.tokens, b.offsets, b.special_tokens_mask)
    assert len(theirs[-1 - 5].ids) == real_encoder.max_length  # the long text was truncated alike


def _reference_words(text, tokens):
    """Word spans as a loop over the tokens merges them (a word's '##' pieces into it)."""
    words, cur = [], None
    for t in tokens:
        if t["start"] is None:
            continue
        if cur is not None and t["token"].startswith("##") and t["start"] == cur[1]:
            cur[1] = t["end"]
            cur[2] += t["contribution"]
        else:
            cur = [t["start"], t["end"], t["contribution"]]
            words.append(cur)
    return [{"start": a, "end": b, "text": text[a:b], "contribution": x} for a, b, x in words if b > a]


def test_word_spans_are_the_token_loops(mean_index, real_encoder):
    r = Retriever.load(mean_index, encoder=real_encoder)
    for q in QUERIES:
        for h in r.search(q, k=5, mode="hybrid", explain=True):
            d = h.explanation["dense"]
            assert d["spans"] == _reference_words(h.text, d["tokens"])  # the same sums, to the last bit
            # the tokens of what was encoded: the chunk's titles (a Markdown file's), then its text
            encoded = embedding_text(hit_context(r.manifest, h), h.text)
            assert [t["token"] for t in d["tokens"]] == real_encoder.tokenizer.encode(encoded).tokens


def test_fp16_states_widen_exactly():
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)  # every fp16 value, NaNs and infinities too
    a = np.concatenate([bits, bits[:1000]]).view(np.float16).reshape(-1, 8)
    wide, plain = explain_._widen_parts([a[:500], a[500:]], a.shape[1]), a.astype(np.float32)
    num = ~np.isnan(plain)  # (a signalling NaN may come back quiet: a NaN either way)
    assert wide.dtype == np.float32 and np.array_equal(wide.view(np.uint32)[num], plain.view(np.uint32)[num])
    assert np.isnan(wide[~num]).all()


def test_ascii_word_split_is_the_pattern():
    texts = TRICKY + [p.read_text(encoding="utf-8") for p in sorted((SAMPLE / "cooking").glob("*"))]
    texts.append("".join(chr(i) for i in range(128)) + " a" + "".join(f"{chr(i)}b{i}" for i in range(128)))
    for t in texts:
        low = t.lower()
        if low.isascii():
            assert explain_._ascii_words(low) == set(explain_._WORD.findall(low))


# ---- token tables kept beside the token states ------------------------------------------------
def _as_json(hits):
    import json

    return json.dumps([h.to_dict() for h in hits], sort_keys=True)


def test_kept_token_tables_explain_as_tokenising_does(tmp_path, real_encoder, monkeypatch):
    """An index with --keep-states keeps each chunk's token ids and offsets (states/<n>.tok): an
    explanation then tokenises nothing, and is the very explanation tokenising gives; where the
    tables are missing (an index kept before them) or cut short, the hits are tokenised again."""
    from semsearch.store import kept as kept_

    corpus = corpus_of(tmp_path / "corpus")
    (corpus / "tricky.txt").write_text("\n\n".join(TRICKY), encoding="utf-8")
    folder = tmp_path / "idx"
    index_corpus(corpus, folder, real_encoder, progress=False, keep_states=True)
    toks = sorted((folder / "states").glob("*.tok"))
    assert toks and all(p.with_suffix(".f16").exists() for p in toks)
    r = Retriever.load(folder, encoder=real_encoder)
    queries = QUERIES + ["caf\u00e9 cr\u00e8me and the [MASK] token", "antidisestablishmentarianism"]
    calls = []
    real = explain_._encodings
    monkeypatch.setattr(explain_, "_encodings", lambda *a: calls.append(1) or real(*a))
    kept = {(q, m): _as_json(r.search(q, k=6, mode=m, explain=True)) for q in queries for m in ("dense", "hybrid")}
    assert calls == []  # nothing tokenised
    assert all('"states": "kept"' in v for v in kept.values())
    monkeypatch.setattr(kept_, "token_slice", lambda *a: None)  # as an index without token tables
    again = {(q, m): _as_json(r.search(q, k=6, mode=m, explain=True)) for q in queries for m in ("dense", "hybrid")}
    assert calls and again == kept
    monkeypatch.undo()
    for p in toks:  # cut short: those chunks are tokenised again, with the same result
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    assert {(q, m): _as_json(r.search(q, k=6, mode=m, explain=True)) for q in queries for m in ("dense", "hybrid")} == kept


def test_token_table_is_the_tokenizers_own(real_encoder):
    texts = TRICKY + [p.read_text(encoding="utf-8") for p in sorted((SAMPLE / "banking").glob("*"))[:3]]
    for t, e in zip(real_encoder.token_table(texts), real_encoder.tokenizer.encode_batch(texts)):
        assert t.dtype == np.int32 and t[:, 0].tolist() == e.ids
        special = np.asarray(e.special_tokens_mask, bool)
        assert (t[special, 1:] == -1).all() and t[~special, 1:].tolist() == [list(o) for i, o in enumerate(e.offsets) if not special[i]]
    assert len(real_encoder.token_table([TRICKY[-1]])[0]) == real_encoder.max_length


def test_token_tables_follow_writes_and_compaction(tmp_path, real_encoder, monkeypatch):
    """Documents written through the API into an index with kept states get token tables too;
    compaction keeps every table a live chunk uses and removes the rest."""
    from semsearch.documents import Document, delete_documents, upsert_documents
    from semsearch.store.folder import compact

    corpus = tmp_path / "corpus"
    shutil.copytree(SAMPLE / "faq", corpus / "faq")
    folder = tmp_path / "idx"
    index_corpus(corpus, folder, real_encoder, progress=False, keep_states=True)
    text = "Overdraft fees at the credit union are waived for students under twenty-five."
    upsert_documents(folder, [Document("fees", text)], real_encoder)
    upsert_documents(folder, [Document("gone", "A short note that is deleted again.")], real_encoder)
    delete_documents(folder, ["gone"])
    for stray in ("999.f16", "999.tok"):  # an interrupted write's leftovers: no segment names them
        (folder / "states" / stray).write_bytes(b"\0" * 24)
    compact(folder)
    names = {p.name for p in (folder / "states").iterdir()}
    assert not names & {"999.f16", "999.tok"}
    assert names and all(n.rsplit(".", 1)[0] + ".tok" in names for n in names if n.endswith(".f16"))
    assert all(n.rsplit(".", 1)[0] + ".f16" in names for n in names if n.endswith(".tok"))
    calls = []
    real = explain_._encodings
    monkeypatch.setattr(explain_, "_encodings", lambda *a: calls.append(1) or real(*a))
    hits = Retriever.load(folder, encoder=real_encoder).search("student overdraft fees", k=3, mode="hybrid", explain=True)
    assert hits[0].text == text and calls == []
    d = hits[0].explanation["dense"]
    assert d["states"] == "kept" and [t["token"] for t in d["tokens"][:3]] == ["[CLS]", "over", "##dra"]
    assert (d["tokens"][1]["start"], d["tokens"][1]["end"]) == (0, 4)
    assert [s["text"] for s in d["spans"][:3]] == ["Overdraft", "fees", "at"]


def test_mapped_states_files_are_let_go_once_removed(tmp_path):
    """A states file a compaction removed is unmapped when the next file is mapped (a mapped file
    keeps its disk space), and a file rewritten under the same name is mapped anew."""
    a, b = tmp_path / "1.f16", tmp_path / "2.f16"
    a.write_bytes(np.arange(8, dtype=np.float16).tobytes())
    b.write_bytes(np.ones(8, np.float16).tobytes())
    assert explain_._mapped(a, np.float16, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert any(k[0] == str(a) for k in explain_._MAPS)
    a.unlink()
    explain_._mapped(b, np.float16, 4)
    assert not any(k[0] == str(a) for k in explain_._MAPS) and any(k[0] == str(b) for k in explain_._MAPS)
    b.write_bytes(np.full(12, 2, np.float16).tobytes())  # the same name, other bytes
    assert explain_._mapped(b, np.float16, 4).tolist() == [[2, 2, 2, 2]] * 3
    assert sum(k[0] == str(b) for k in explain_._MAPS) == 1


def test_explanations_are_finished_once_from_many_threads(mean_index, real_encoder):
    """A hit's records are built on the first reading of its explanation: hits read from many
    threads at once all see the same, whole explanation."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    r = Retriever.load(mean_index, encoder=real_encoder)
    want = [json.dumps(h.explanation, sort_keys=True) for h in r.search(QUERIES[0], k=8, mode="hybrid", explain=True)]
    for _ in range(5):
        hits = r.search(QUERIES[0], k=8, mode="hybrid", explain=True)
        with ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda i: json.dumps(hits[i % len(hits)].explanation, sort_keys=True), range(64)))
        assert got == [want[i % len(hits)] for i in range(64)]
        assert all(h.explanation["dense"]["tokens"] and h.explanation["dense"]["spans"] for h in hits)


def test_term_spans_from_bm25_counts_are_the_full_scan(mean_index, real_encoder, monkeypatch):
    """Where BM25's counts are met by the term words known so far, those occurrences are all of
    them: the same spans as looking at every word of the text; otherwise the scan runs."""
    from semsearch.store import lexical

    lex = Retriever.load(mean_index, encoder=real_encoder)._gen.lexical(mean_index)
    texts = TRICKY + [p.read_text(encoding="utf-8") for p in sorted(SAMPLE.rglob("*.md")) + sorted(SAMPLE.rglob("*.txt"))]
    texts += ["Caf\u00e9 LOANS, na\u00efve loan\u2019s lenders; \u0130stanbul loans", "\u00b2loan loan\u00b2 loan_x x_loan loan"]
    queries = QUERIES + ["loans loaned lending", "soup soups cumin onions", "the check checks checked", "caf\u00e9 loan istanbul"]
    used = fell_back = wide = 0
    for q in queries:
        for fresh in (True, False):  # with no word met yet, then with every word of the texts met
            if fresh:
                monkeypatch.setattr(explain_, "_TERMS", {})
                monkeypatch.setattr(explain_, "_FORMS", {})
            for text in texts:
                qt = explain_.QueryTerms(lex, q)
                counts = collections.Counter(lexical.terms(text))  # what BM25 counts for this text
                tfs = [(h, counts[h]) for h in qt.hashes.tolist()]
                fast = explain_._known_term_spans(qt, text, tfs)
                full = explain_._term_spans(explain_.QueryTerms(lex, q), text)
                if fast is None:
                    fell_back += 1
                    continue
                used += 1
                wide += not text.isascii() and bool(fast)
                assert fast == full, (q, text[:80])
    assert used > 50 and fell_back > 0 and wide > 0
