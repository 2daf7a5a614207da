"""Titles count: a chunk of a page is searched by its page and section titles too (BM25 and the
embedding), while its stored text, offsets and snippets stay its own; an index records whether
its chunks carry them, and one built before keeps embedding without them until rebuilt."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from semsearch.corpus.chunking import CONTEXT, ChunkSettings
from semsearch.corpus.titles import chunk_context, embedding_text, titles_of
from semsearch.errors import InputError, SettingsMismatch
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.store.manifest import Manifest

# The second and later chunks of the first section never say what it is about in the words of its heading.
DESCALE = ("Fill the tank with a mixture of water and citric acid. Run half of it through the group head, "
           "wait twenty minutes, then run the rest. Rinse with two full tanks of clean water before brewing again. "
           "Wipe the drip tray and soak the portafilter basket in the same solution while you wait. "
           "Do this every month where the tap water is hard, every three months where it is soft. "
           "A chalky white crust around the outlet is the sign that it is overdue.")
KNIVES = ("Hold the blade at fifteen degrees to the whetstone and draw it across in smooth strokes, "
          "heel to tip, ten times a side. Finish on the fine grit and strop on leather. "
          "Test the edge on a sheet of paper: it should slice without tearing.")
FLOUR = ("Keep it in an airtight tin in a cool cupboard, away from the stove. Whole grain kinds go rancid "
         "within three months; white keeps for a year. Freeze a new bag for two days to kill any weevil eggs.")
HEADING = "Descaling the espresso machine"
QUERY = "descaling the espresso machine"
SETTINGS = ChunkSettings(window=24, overlap=0)


def _write(root: Path, kind: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if kind == "md":
        p = root / "handbook.md"
        p.write_text(f"# Kitchen handbook\n\n## {HEADING}\n\n{DESCALE}\n\n## Sharpening knives\n\n{KNIVES}\n\n"
                     f"## Storing flour\n\n{FLOUR}\n", encoding="utf-8")
    else:
        p = root / "handbook.html"
        body = "".join(f"<h2>{h}</h2><p>{t}</p>" for h, t in ((HEADING, DESCALE), ("Sharpening knives", KNIVES),
                                                             ("Storing flour", FLOUR)))
        p.write_text(f"<html><head><title>Kitchen handbook</title></head><body><main><article><h1>Kitchen handbook</h1>"
                     f"{body}</article></main></body></html>", encoding="utf-8")
    return p


def _rows(folder: Path) -> list[tuple]:
    r = Retriever.load(folder)
    return sorted(tuple(x[1:]) for x in r.docs.select("c.ord, c.start, c.end, c.line, c.text, c.metadata"))


def test_titles_of_structured_chunks_only():
    meta = {"title": "Kitchen handbook", "section": "Kitchen handbook > Storing flour"}
    assert titles_of(meta) == "Kitchen handbook > Storing flour"  # the title once
    assert titles_of({"title": "Report", "section": "Methods > Survey"}) == "Report > Methods > Survey"  # a PDF's bookmarks
    assert titles_of({"title": "Report"}) == "Report" and titles_of({}) == ""
    for path in ("/d/a.md", "/d/a.html", "/d/a.htm", "/d/a.html.gz", "/d/a.pdf", "/d/a.docx"):
        assert chunk_context(path, meta) == "Kitchen handbook > Storing flour"
    # a record's `title` is the user's metadata (SciFact's): no context; nor for an API document
    for path in ("/d/corpus.jsonl", "/d/t.csv", "/d/a.txt", "/d/a.parquet", "api:doc.md", "api:x"):
        assert chunk_context(path, meta) == ""
    assert chunk_context("/d/a.md", meta, version=0) == ""  # an index from before titles
    assert embedding_text("T > S", "body") == "T > S\n\nbody" and embedding_text("", "body") == "body"
    # settings as a manifest records them: one from before titles has none; a form not known here is refused
    assert ChunkSettings.of_index({"window": 254, "overlap": 32}).titles == 0
    assert ChunkSettings(254, 32).as_manifest() == {"window": 254, "overlap": 32, "context": CONTEXT}
    with pytest.raises(InputError, match="--rebuild"):
        ChunkSettings.of_index({"window": 254, "overlap": 32, "context": CONTEXT + 1}).check(256)


@pytest.mark.parametrize("kind", ["md", "html"])
def test_a_chunk_is_found_by_its_section_title_that_its_text_lacks(tmp_path, real_encoder, kind):
    _write(tmp_path / "c", kind)
    new, old = tmp_path / "new", tmp_path / "old"
    index_corpus(tmp_path / "c", new, real_encoder, SETTINGS, progress=False)
    index_corpus(tmp_path / "c", old, real_encoder, ChunkSettings(24, 0, context=0), progress=False)
    assert Manifest.load(new).chunking == {"window": 24, "overlap": 0, "context": CONTEXT}
    assert Manifest.load(old).chunking["context"] == 0

    # the stored chunks are the same: text, offsets, lines, metadata (titles are not in the text)
    assert _rows(new) == _rows(old)

    r, r_old = Retriever.load(new, encoder=real_encoder), Retriever.load(old, encoder=real_encoder)
    section = {h.id for h in r.search(QUERY, k=50, mode="dense") if HEADING in (h.metadata.get("section") or "")}
    lacking = [h for h in r.search(QUERY, k=50, mode="dense")
               if h.id in section and not any(w in h.text.lower() for w in ("descal", "espresso", "machine"))]
    assert len(section) >= 3 and len(lacking) >= 2  # the section runs over chunks that do not name it

    # lexical: found by the heading's words alone, which its text does not hold
    lex = r.search(QUERY, k=len(section), mode="lexical")
    assert {h.id for h in lex} == section
    assert not any(h.id in {x.id for x in lacking} for h in r_old.search(QUERY, k=10, mode="lexical"))

    # dense: every chunk of the section above every chunk of the others, and closer than without titles
    dense = r.search(QUERY, k=50, mode="dense")
    ranks = [i for i, h in enumerate(dense) if h.id in section]
    assert ranks == list(range(len(section)))
    old_score = {(h.start, h.end): h.score for h in r_old.search(QUERY, k=50, mode="dense")}
    for h in lacking:
        assert h.score > old_score[(h.start, h.end)] + 0.05

    # hybrid top hits are the section's; snippets are the chunk's own text, offsets into the file's text
    top = r.search(QUERY, k=3, mode="hybrid")
    assert all(h.id in section for h in top)
    for h in top:
        assert "Kitchen handbook >" not in h.text
        if kind == "md":
            assert Path(h.path).read_text(encoding="utf-8")[h.start:h.end] == h.text


def test_explain_reads_the_titles_and_points_into_the_chunk_text(tmp_path, real_encoder):
    _write(tmp_path / "c", "md")
    index_corpus(tmp_path / "c", tmp_path / "i", real_encoder, SETTINGS, progress=False)
    r = Retriever.load(tmp_path / "i", encoder=real_encoder)
    hits = r.search_batch([QUERY], k=4, mode="hybrid", explain=True)[0]
    assert hits
    for h in hits:
        d = h.explanation["dense"]
        assert d["exact"] and d["matches_stored"], d.get("note")  # the very input that was encoded
        assert d["context"] == "Kitchen handbook > " + (h.metadata["section"].split(" > ", 1)[1])
        ctx = [t for t in d["tokens"] if t.get("context")]
        assert ctx and all(t["start"] is None for t in ctx)
        assert abs(sum(t["contribution"] for t in ctx) - d["context_score"]) < 1e-9
        for s in d["spans"]:
            assert h.text[s["start"]:s["end"]] == s["text"]
        for t in d["tokens"]:
            if t["start"] is not None:
                assert h.text[t["start"]:t["end"]].lower() == t["token"].removeprefix("##")
        for t in h.explanation["lexical"]["terms"]:
            for a, b in t["spans"]:
                assert h.text[a:b].lower() in QUERY


def test_kept_states_explain_the_same_input(tmp_path, real_encoder):
    _write(tmp_path / "c", "md")
    index_corpus(tmp_path / "c", tmp_path / "i", real_encoder, SETTINGS, progress=False, keep_states=True)
    r = Retriever.load(tmp_path / "i", encoder=real_encoder)
    for h in r.search_batch([QUERY], k=3, mode="dense", explain=True)[0]:
        d = h.explanation["dense"]
        assert d["states"] == "kept" and d["matches_stored"] and d["context"]
        assert all(h.text[s["start"]:s["end"]] == s["text"] for s in d["spans"])


def _drop_context(folder: Path) -> None:
    """The manifest as an index built before titles has it (chunking: window and overlap)."""
    p = folder / "manifest.json"
    m = json.loads(p.read_text(encoding="utf-8"))
    m["chunking"].pop("context")
    p.write_text(json.dumps(m), encoding="utf-8")


def test_an_index_from_before_titles_keeps_embedding_without_them(tmp_path, fake_encoder):
    from semsearch.formatting import info_rows

    root = tmp_path / "c"
    _write(root, "md")
    folder = tmp_path / "i"
    index_corpus(root, folder, fake_encoder, ChunkSettings(24, 0, context=0), progress=False)
    _drop_context(folder)
    assert ChunkSettings.of_index(Manifest.load(folder).chunking).titles == 0

    # an update: the index's own setting, the new file's chunks without their titles
    (root / "more.md").write_text(f"# Pantry\n\n## Jam jars\n\n{FLOUR}\n", encoding="utf-8")
    index_corpus(root, folder, fake_encoder, progress=False)
    m = Manifest.load(folder)
    assert m.chunking == {"window": 24, "overlap": 0, "context": 0}
    r = Retriever.load(folder, encoder=fake_encoder)
    got = [h for h in r.search("jam jars pantry", k=50, mode="dense") if h.path.endswith("more.md")]
    body = next(h for h in got if "Jam" not in h.text)
    want = fake_encoder.encode([body.text])[0]  # its text alone was encoded
    assert abs(body.score - float(fake_encoder.encode(["jam jars pantry"])[0] @ want)) < 1e-5
    assert not [h for h in r.search("pantry jam jars", k=20, mode="lexical") if h.id == body.id]
    assert any("not searched" in str(v) and "--rebuild" in str(v) for _, v in info_rows(folder, m))

    # asking for titles on it is refused, naming --rebuild; --rebuild takes them
    with pytest.raises(SettingsMismatch, match="--rebuild") as e:
        index_corpus(root, folder, fake_encoder, ChunkSettings(24, 0, context=CONTEXT), progress=False)
    assert "titles" in str(e.value)
    index_corpus(root, folder, fake_encoder, SETTINGS, progress=False, rebuild=True)
    assert Manifest.load(folder).chunking == {"window": 24, "overlap": 0, "context": CONTEXT}
    r = Retriever.load(folder, encoder=fake_encoder)
    assert [h for h in r.search("pantry jam jars", k=20, mode="lexical") if h.path.endswith("more.md")]


def test_engines_embed_what_the_local_path_embeds(tmp_path, fake_encoder):
    from semsearch.engines.inprocess import InProcessEngine

    _write(tmp_path / "c", "md")
    _write(tmp_path / "c", "html")
    a, b = tmp_path / "a", tmp_path / "b"
    index_corpus(tmp_path / "c", a, fake_encoder, SETTINGS, progress=False)
    index_corpus(tmp_path / "c", b, fake_encoder, SETTINGS, progress=False, engine=InProcessEngine(fake_encoder))
    ra, rb = Retriever.load(a, encoder=fake_encoder), Retriever.load(b, encoder=fake_encoder)
    for mode in ("dense", "lexical"):
        ha, hb = ra.search(QUERY, k=20, mode=mode), rb.search(QUERY, k=20, mode=mode)
        assert [(h.path, h.start, round(h.score, 5)) for h in ha] == [(h.path, h.start, round(h.score, 5)) for h in hb]
    top = ra.search(QUERY, k=1, mode="dense")[0]
    want = fake_encoder.encode([embedding_text(chunk_context(top.path, top.metadata), top.text)])[0]
    assert abs(top.score - float(fake_encoder.encode([QUERY])[0] @ want)) < 1e-5


def test_records_and_api_documents_keep_their_text_alone(tmp_path, fake_encoder):
    from semsearch.documents import Document, upsert_documents

    root = tmp_path / "c"
    root.mkdir()
    (root / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "Espresso machines", "text": "citric acid in the tank"}) + "\n",
                                       encoding="utf-8")
    folder = tmp_path / "i"
    index_corpus(root, folder, fake_encoder, SETTINGS, progress=False)
    upsert_documents(folder, [Document("x.md", "soak the basket overnight", {"title": "Portafilter care", "section": "Cleaning"})],
                     fake_encoder)
    r = Retriever.load(folder, encoder=fake_encoder)
    for q, text in (("citric acid tank", "citric acid in the tank"), ("soak basket overnight", "soak the basket overnight")):
        h = r.search(q, k=1, mode="dense")[0]
        assert h.text == text
        assert abs(h.score - float(fake_encoder.encode([q])[0] @ fake_encoder.encode([text])[0])) < 1e-5
    assert not r.search("espresso machines", k=5, mode="lexical")  # SciFact's title stays metadata
    assert not r.search("portafilter care", k=5, mode="lexical")
