"""Unit tests of the corpus layer: readers per format, walk(), chunking."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from semsearch.corpus import ChunkSettings, Document, ReadOptions, chunk_text, read_documents, walk
from semsearch.corpus.chunking import line_of
from semsearch.corpus.readers import Skip
from semsearch.errors import CorpusError, InputError


def read(path: Path, **opts) -> list[Document]:
    return list(read_documents(path, ReadOptions(**opts)))


def word_offsets(text: str) -> list[tuple[int, int]]:
    """The same tokenisation as the fake encoder of conftest: one token per \\w+ run."""
    return [m.span() for m in re.finditer(r"\w+", text)]


# ---------------------------------------------------------------------------------------------
# Plain text
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".txt", ".md", ".rst", ".markdown", ".text", ".TXT"])
def test_text_file_is_one_whole_document(tmp_path, ext):
    text = "Title\n=====\n\nFirst line, with ünïcödé.\nSecond line.\n"
    p = tmp_path / f"doc{ext}"
    p.write_text(text, encoding="utf-8")
    docs = read(p)
    assert len(docs) == 1
    assert docs[0].text == text
    assert docs[0].row is None
    assert docs[0].metadata == {}


def test_text_file_utf8_bom_is_dropped(tmp_path):
    p = tmp_path / "bom.txt"
    p.write_bytes("\ufeffhello world\n".encode("utf-8"))
    assert [d.text for d in read(p)] == ["hello world\n"]


def test_unsupported_extension_is_an_input_error(tmp_path):
    p = tmp_path / "notes.pages"
    p.write_text("hello")
    with pytest.raises(InputError, match=r"notes\.pages.*unsupported file type '\.pages'"):
        read(p)


# ---------------------------------------------------------------------------------------------
# CSV / TSV
# ---------------------------------------------------------------------------------------------


def test_csv_text_column_auto_detected_rest_is_metadata(tmp_path):
    p = tmp_path / "faq.csv"
    p.write_text("id,title,text,lang\n1,Loans,How do I apply for a loan?,en\n2,Cards,My card was declined,en\n")
    docs = read(p)
    assert [d.text for d in docs] == ["How do I apply for a loan?", "My card was declined"]
    assert [d.row for d in docs] == [1, 2]
    assert docs[0].metadata == {"id": "1", "title": "Loans", "lang": "en"}
    assert docs[1].metadata == {"id": "2", "title": "Cards", "lang": "en"}


def test_csv_text_column_names_are_matched_case_insensitively(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,Body,extra\n1,first body,x\n2,second body,y\n")
    docs = read(p)
    assert [d.text for d in docs] == ["first body", "second body"]
    assert docs[0].metadata == {"id": "1", "extra": "x"}


def test_csv_without_a_known_name_picks_the_longest_string_column(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,label,sentence\n1,pos,a rather long sentence about loans\n2,neg,another long sentence about soup\n")
    docs = read(p)
    assert [d.text for d in docs] == ["a rather long sentence about loans", "another long sentence about soup"]
    assert docs[1].metadata == {"id": "2", "label": "neg"}


def test_csv_text_column_named_explicitly(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("title,text\nLoans,How do I apply?\nCards,Declined card\n")
    docs = read(p, text_column="title")
    assert [d.text for d in docs] == ["Loans", "Cards"]
    assert [d.metadata for d in docs] == [{"text": "How do I apply?"}, {"text": "Declined card"}]
    assert [d.row for d in docs] == [1, 2]


def test_csv_unknown_text_column_names_file_and_lists_columns(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("title,text\nLoans,How do I apply?\n")
    with pytest.raises(CorpusError) as ei:
        read(p, text_column="nope")
    msg = str(ei.value)
    assert str(p) in msg and "'nope'" in msg and "title, text" in msg


def test_header_only_csv_has_no_documents(tmp_path):
    p = tmp_path / "nums.csv"
    p.write_text("a,b\n")
    assert read(p) == []


def test_records_with_no_text_like_field_ask_for_text_column(tmp_path):
    p = tmp_path / "nums.jsonl"
    p.write_text('{"a": 1, "b": 2.5}\n{"a": 3, "b": 4}\n')
    with pytest.raises(CorpusError, match="--text-column") as ei:
        read(p)
    assert str(p) in str(ei.value)


def test_tsv_uses_tabs_and_keeps_commas_in_text(tmp_path):
    p = tmp_path / "t.tsv"
    p.write_text("title\tpassage\nA\tone, two, three\nB\tfour\n")
    docs = read(p)
    assert [d.text for d in docs] == ["one, two, three", "four"]
    assert [d.metadata for d in docs] == [{"title": "A"}, {"title": "B"}]
    assert [d.row for d in docs] == [1, 2]


def test_csv_rows_count_records_and_blank_text_rows_are_dropped_but_counted(tmp_path):
    p = tmp_path / "t.csv"
    # Row 1 is a quoted field spanning two lines; row 2 has an empty text; row 3 is normal.
    p.write_text('id,text\n1,"multi\nline, with comma"\n2,\n3,three\n')
    docs = read(p)
    assert [(d.row, d.text) for d in docs] == [(1, "multi\nline, with comma"), (3, "three")]


def test_csv_empty_file_has_no_documents(tmp_path):
    p = tmp_path / "empty.csv"
    p.write_text("")
    assert read(p) == []


BAD_CSV = "id,text\n1,hello\n2,world\n3,too,many,fields\n4,again\n"  # line 4 (data row 3) is malformed


def test_csv_malformed_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text(BAD_CSV)
    with pytest.raises(CorpusError) as ei:
        read(p)
    msg = str(ei.value)
    assert str(p) in msg
    assert re.search(r"\bline 4\b", msg)
    assert "--skip-errors" in msg


def test_tsv_malformed_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.tsv"
    p.write_text(BAD_CSV.replace(",", "\t"))
    with pytest.raises(CorpusError, match=re.escape(str(p)) + r": malformed TSV: .*\bline 4\b"):
        read(p)


def test_csv_malformed_line_beyond_first_read_chunk_names_the_right_line(tmp_path):
    lines = ["text,n"] + [f"row {i},{i}" for i in range(1, 3000)]
    lines[2500] = "x,y,z"  # line 2501 of the file, in the second chunk of 2000 rows
    p = tmp_path / "big.csv"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=r"line 2501\b"):
        read(p)


def test_csv_skip_errors_goes_on_past_malformed_lines(tmp_path, caplog):
    p = tmp_path / "bad.csv"
    p.write_text(BAD_CSV)
    docs = read(p, skip_errors=True)
    assert [d.text for d in docs] == ["hello", "world", "again"]
    assert [d.metadata for d in docs] == [{"id": "1"}, {"id": "2"}, {"id": "4"}]
    assert any(str(p) in r.getMessage() and "skipped 1 malformed line" in r.getMessage() for r in caplog.records)


def test_csv_skip_errors_keeps_row_numbers_of_later_rows(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text(BAD_CSV)
    docs = read(p, skip_errors=True)
    assert [(d.row, d.text) for d in docs] == [(1, "hello"), (2, "world"), (4, "again")]


def test_csv_malformed_first_data_line_is_an_error(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("id,text\n1,bad,x\n2,t2\n3,t3\n")
    with pytest.raises(CorpusError, match=re.escape(str(p)) + r".*\bline 2\b"):
        read(p)


def test_csv_skip_errors_malformed_early_line_is_skipped_not_misparsed(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("id,text\n1,hello\n2,too,many,fields\n3,world\n4,again\n")
    docs = read(p, skip_errors=True)
    assert [d.text for d in docs] == ["hello", "world", "again"]


def test_csv_malformed_message_is_one_line(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text(BAD_CSV)
    with pytest.raises(CorpusError) as ei:
        read(p)
    assert "\n" not in str(ei.value)


# ---------------------------------------------------------------------------------------------
# JSONL / JSON
# ---------------------------------------------------------------------------------------------


def test_jsonl_text_field_rest_metadata_line_numbers_as_rows(tmp_path):
    p = tmp_path / "r.jsonl"
    recs = [
        {"id": 7, "text": "first record", "tags": ["a", "b"], "score": 0.5, "ok": True},
        None,  # a blank line: skipped, but it still counts as a line
        {"id": 8, "text": "second record", "tags": [], "score": None, "ok": False},
    ]
    p.write_text("".join(("" if r is None else json.dumps(r)) + "\n" for r in recs))
    docs = read(p)
    assert [d.text for d in docs] == ["first record", "second record"]
    assert [d.row for d in docs] == [1, 3]
    assert docs[0].metadata == {"id": 7, "tags": ["a", "b"], "score": 0.5, "ok": True}
    assert docs[1].metadata == {"id": 8, "tags": [], "score": None, "ok": False}


def test_jsonl_ndjson_extension_and_other_known_field_name(tmp_path):
    p = tmp_path / "r.ndjson"
    p.write_text('{"content": "alpha", "n": 1}\n{"content": "beta", "n": 2}\n')
    docs = read(p)
    assert [(d.row, d.text, d.metadata) for d in docs] == [(1, "alpha", {"n": 1}), (2, "beta", {"n": 2})]


def test_jsonl_text_field_named_explicitly(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"text": "t1", "q": "question one"}\n{"text": "t2", "q": "question two"}\n')
    docs = read(p, text_column="q")
    assert [d.text for d in docs] == ["question one", "question two"]
    assert [d.metadata for d in docs] == [{"text": "t1"}, {"text": "t2"}]


def test_jsonl_malformed_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c"\n{"text": "d"}\n')
    with pytest.raises(CorpusError) as ei:
        read(p)
    msg = str(ei.value)
    assert f"{p}:3:" in msg
    assert "--skip-errors" in msg


def test_jsonl_line_that_is_not_an_object_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "a"}\n[1, 2]\n')
    with pytest.raises(CorpusError, match=re.escape(f"{p}:2:") + ".*not a JSON object"):
        read(p)


def test_jsonl_skip_errors_goes_on(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "a"}\n{"text": "b"\n[1]\n{"text": "d"}\n')
    docs = read(p, skip_errors=True)
    assert [(d.row, d.text) for d in docs] == [(1, "a"), (4, "d")]


def test_jsonl_record_without_the_text_field(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"text": "a"}\n{"other": 1}\n{"text": "c"}\n')
    with pytest.raises(CorpusError, match=re.escape(f"{p}:2: record has no 'text' field")):
        read(p)
    assert [(d.row, d.text) for d in read(p, skip_errors=True)] == [(1, "a"), (3, "c")]


def test_json_list_of_objects(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps([{"body": "x", "n": 1}, {"body": "y", "n": 2, "nested": {"k": [1, None]}}]))
    docs = read(p)
    assert [(d.row, d.text) for d in docs] == [(1, "x"), (2, "y")]
    assert docs[1].metadata == {"n": 2, "nested": {"k": [1, None]}}


def test_json_single_object_is_one_document(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"text": "solo", "author": "me"}))
    assert [(d.row, d.text, d.metadata) for d in read(p)] == [(1, "solo", {"author": "me"})]


def test_json_malformed_names_file(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('[{"text": "a"},')
    with pytest.raises(CorpusError, match=re.escape(str(p)) + ": malformed JSON"):
        read(p)


@pytest.mark.parametrize("body", ["[1, 2, 3]", '"just a string"', '{"version": 3, "theme": {"dark": true}}'])
def test_json_that_is_not_a_corpus_is_skipped_with_the_reason(tmp_path, body):
    p = tmp_path / "r.json"
    p.write_text(body)
    with pytest.raises(Skip, match="not a JSON corpus"):
        read(p)


def test_json_without_a_text_field_is_read_when_one_is_named(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('[{"version": "3 and some words", "n": 1}]')
    assert [d.text for d in read(p, text_column="version")] == ["3 and some words"]


# ---------------------------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------------------------


def test_parquet_text_column_auto_detected_metadata_plain_python(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    p = tmp_path / "t.parquet"
    pd.DataFrame({"id": [1, 2, 3], "content": ["alpha doc", "beta doc", "gamma doc"], "score": [0.5, 1.5, 2.5]}).to_parquet(p)
    docs = read(p)
    assert [(d.row, d.text) for d in docs] == [(1, "alpha doc"), (2, "beta doc"), (3, "gamma doc")]
    assert docs[0].metadata == {"id": 1, "score": 0.5}
    assert type(docs[0].metadata["id"]) is int and type(docs[0].metadata["score"]) is float
    json.dumps([d.metadata for d in docs])  # serialisable for the docstore


def test_parquet_text_column_named_explicitly(tmp_path):
    pd = pytest.importorskip("pandas")
    p = tmp_path / "t.parquet"
    pd.DataFrame({"text": ["a", "b"], "title": ["Title A", "Title B"]}).to_parquet(p)
    docs = read(p, text_column="title")
    assert [(d.row, d.text, d.metadata) for d in docs] == [(1, "Title A", {"text": "a"}), (2, "Title B", {"text": "b"})]


def test_parquet_that_is_not_parquet_names_file(tmp_path):
    p = tmp_path / "fake.parquet"
    p.write_text("this is not parquet")
    with pytest.raises(CorpusError, match=re.escape(str(p))):
        read(p)


# ---------------------------------------------------------------------------------------------
# Non-UTF-8 files are skipped, not fatal
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, data", [
    ("latin.txt", b"caf\xe9 au lait\n"),
    ("latin.md", b"# caf\xe9\n"),
    ("latin.csv", b"id,text\n1,caf\xe9 au lait\n"),
    ("latin.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n'),
    ("latin.json", b'[{"text": "caf\xe9"}]'),
])
def test_non_utf8_file_raises_skip(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(Skip, match="not UTF-8"):
        read(p)


def test_non_utf8_csv_reports_the_file_offset_of_the_bad_byte(tmp_path):
    p = tmp_path / "latin.csv"
    data = b"text,id\nh\xe9llo,1\n"
    p.write_bytes(data)
    with pytest.raises(Skip) as ei:
        read(p)
    assert f"byte {data.index(0xE9)}" in str(ei.value)


def test_non_utf8_text_reports_the_file_offset_of_the_bad_byte(tmp_path):
    p = tmp_path / "latin.txt"
    data = b"plain ascii then caf\xe9\n"
    p.write_bytes(data)
    with pytest.raises(Skip, match=rf"byte {data.index(0xE9)}\b"):
        read(p)


# ---------------------------------------------------------------------------------------------
# walk()
# ---------------------------------------------------------------------------------------------


def test_walk_finds_supported_files_sorted_and_skips_with_reasons(tmp_path):
    pd = pytest.importorskip("pandas")
    root = tmp_path / "corpus"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD.txt").write_text("hidden dir content")
    (root / ".hidden.txt").write_text("hidden file")
    (root / "b.txt").write_text("b")
    (root / "a.md").write_text("a")
    (root / "sub" / "c.csv").write_text("text\nc\n")
    (root / "sub" / "deeper" / "d.jsonl").write_text('{"text": "d"}\n')
    pd.DataFrame({"text": ["p"]}).to_parquet(root / "sub" / "e.parquet")  # holds NUL bytes, but is not 'binary'
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    (root / "tool.exe").write_bytes(b"MZ\0\0")
    (root / "other.exe").write_bytes(b"MZ\0\0")
    (root / "README").write_text("no extension")
    (root / "blob.txt").write_bytes(b"looks like text\0but has a NUL")
    res = walk(root)
    # os.walk order: each folder's files by name, then its subfolders by name
    assert [f.path for f in res.files] == [
        (root / "a.md").resolve(), (root / "b.txt").resolve(),
        (root / "sub" / "c.csv").resolve(), (root / "sub" / "e.parquet").resolve(),
        (root / "sub" / "deeper" / "d.jsonl").resolve(),
    ]
    assert [f.path for f in walk(root).files] == [f.path for f in res.files]  # deterministic
    assert all(f.path.is_absolute() for f in res.files)
    assert res.files[1].size == 1 and res.files[1].mtime_ns > 0
    assert dict(res.skipped) == {
        "hidden": 2,  # the .git folder (not entered) and .hidden.txt
        "unsupported type (.png)": 1,
        "unsupported type (.exe)": 2,
        "unsupported type (no extension)": 1,
        "binary": 1,
    }
    assert res.examples["binary"].endswith("blob.txt")
    assert res.examples["unsupported type (.png)"].endswith("image.png")
    assert {Path(res.examples["hidden"]).name} <= {".git", ".hidden.txt"}


def test_walk_binary_detection_only_looks_at_nul_bytes(tmp_path):
    (tmp_path / "utf8.txt").write_text("naïve café ☕\n")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")  # not UTF-8, but not binary: the reader skips it later
    (tmp_path / "nul.md").write_bytes(b"# x\n\0")
    res = walk(tmp_path)
    assert [f.path.name for f in res.files] == ["latin.txt", "utf8.txt"]
    assert dict(res.skipped) == {"binary": 1}


def test_walk_a_single_file(tmp_path):
    p = tmp_path / "one.txt"
    p.write_text("hello")
    res = walk(p)
    assert [f.path for f in res.files] == [p.resolve()]
    assert not res.skipped


def test_walk_a_single_unsupported_file_is_skipped(tmp_path):
    p = tmp_path / "one.key"
    p.write_bytes(b"PK\3\4")
    res = walk(p)
    assert res.files == []
    assert dict(res.skipped) == {"unsupported type (.key)": 1}


def test_walk_empty_folder(tmp_path):
    res = walk(tmp_path)
    assert res.files == [] and not res.skipped


def test_walk_missing_path_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match=re.escape(repr(str(tmp_path / "nope")))):
        walk(tmp_path / "nope")


# ---------------------------------------------------------------------------------------------
# Chunking
# ---------------------------------------------------------------------------------------------


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def _token_index(text: str, chunk) -> tuple[int, int]:
    """(first, last) token numbers of a chunk within its document."""
    spans = word_offsets(text)
    starts = [s for s, _ in spans]
    ends = [e for _, e in spans]
    return starts.index(chunk.start), ends.index(chunk.end)


def test_chunk_windows_and_overlap_exact(fake_encoder):
    text = _words(20)
    chunks = list(chunk_text(text, fake_encoder.token_offsets, ChunkSettings(window=8, overlap=3)))
    # step 5: tokens 0-7, 5-12, 10-17, 15-19 (the last window is short and ends on the last token)
    assert [_token_index(text, c) for c in chunks] == [(0, 7), (5, 12), (10, 17), (15, 19)]
    assert [c.n_tokens for c in chunks] == [8, 8, 8, 5]
    assert [c.text for c in chunks] == [
        _words(8),
        " ".join(f"w{i}" for i in range(5, 13)),
        " ".join(f"w{i}" for i in range(10, 18)),
        " ".join(f"w{i}" for i in range(15, 20)),
    ]
    for c in chunks:
        assert text[c.start:c.end] == c.text


def test_chunk_exact_fit_is_one_chunk(fake_encoder):
    text = _words(8)
    chunks = list(chunk_text(text, fake_encoder.token_offsets, ChunkSettings(window=8, overlap=3)))
    assert len(chunks) == 1
    assert (chunks[0].start, chunks[0].end, chunks[0].n_tokens) == (0, len(text), 8)


def test_chunk_one_token_more_than_the_window_gives_two(fake_encoder):
    text = _words(9)
    chunks = list(chunk_text(text, fake_encoder.token_offsets, ChunkSettings(window=8, overlap=3)))
    assert [_token_index(text, c) for c in chunks] == [(0, 7), (5, 8)]


def test_chunk_zero_overlap_partitions_the_tokens(fake_encoder):
    text = _words(10)
    chunks = list(chunk_text(text, fake_encoder.token_offsets, ChunkSettings(window=4, overlap=0)))
    assert [_token_index(text, c) for c in chunks] == [(0, 3), (4, 7), (8, 9)]
    assert sum(c.n_tokens for c in chunks) == 10


def test_chunk_offsets_map_back_with_unicode_punctuation_and_newlines(fake_encoder):
    text = "  Café — naïve résumé!\n\n日本語 テキスト, and 😀 emoji;\n\tindented   spaces … end.  \n"
    chunks = list(chunk_text(text, fake_encoder.token_offsets, ChunkSettings(window=3, overlap=1)))
    assert len(chunks) > 2
    for c in chunks:
        assert text[c.start:c.end] == c.text
        assert c.text == c.text.strip()  # windows start and end on tokens
    assert chunks[0].start == text.index("Café")
    assert chunks[-1].end == text.index("end") + 3


def test_long_document_several_chunks_with_configured_overlap(fake_encoder):
    sentences = [f"Sentence number {i} talks about topic{i % 7} and detail{i}." for i in range(120)]
    text = "\n".join(sentences)
    s = ChunkSettings(window=30, overlap=6)
    spans = fake_encoder.token_offsets(text)
    chunks = list(chunk_text(text, fake_encoder.token_offsets, s))
    assert len(chunks) == -(-(len(spans) - s.overlap) // (s.window - s.overlap))  # ceil((n - o) / (w - o))
    assert len(chunks) > 5
    for c in chunks:
        assert text[c.start:c.end] == c.text
    for a, b in zip(chunks, chunks[1:]):
        a_tokens = [sp for sp in spans if a.start <= sp[0] and sp[1] <= a.end]
        b_tokens = [sp for sp in spans if b.start <= sp[0] and sp[1] <= b.end]
        assert len(a_tokens) == a.n_tokens and len(b_tokens) == b.n_tokens
        assert a_tokens[-s.overlap:] == b_tokens[:s.overlap]  # exactly `overlap` tokens shared
        assert not set(a_tokens[:-s.overlap]) & set(b_tokens)
    assert chunks[0].start == spans[0][0] and chunks[-1].end == spans[-1][1]


def test_long_document_with_the_real_tokenizer(real_encoder):
    text = "\n\n".join(
        f"Paragraph {i}: the bank's mortgage rates (APR {3 + i / 10:.1f}%) changed — café naïveté, 東京."
        for i in range(40)
    )
    s = ChunkSettings(window=32, overlap=8).check(real_encoder.max_length)
    spans = real_encoder.token_offsets(text)
    chunks = list(chunk_text(text, real_encoder.token_offsets, s))
    assert len(chunks) == -(-(len(spans) - s.overlap) // (s.window - s.overlap))
    assert len(chunks) > 5
    pos = 0
    for k, c in enumerate(chunks):
        assert text[c.start:c.end] == c.text
        assert c.n_tokens == (s.window if k < len(chunks) - 1 else c.n_tokens)
        first = spans.index(next(sp for sp in spans if sp[0] == c.start))
        assert first == pos
        pos += s.window - s.overlap
        # each chunk fits the model once framed with [CLS] and [SEP]
        assert len(real_encoder.tokenize([c.text])[0]) <= s.window + 2


def test_chunk_empty_and_blank_texts_give_no_chunks(fake_encoder):
    s = ChunkSettings(window=8, overlap=2)
    assert list(chunk_text("", fake_encoder.token_offsets, s)) == []
    assert list(chunk_text("  \n\t \n", fake_encoder.token_offsets, s)) == []


def test_chunk_without_tokens_still_maps_back(fake_encoder):
    text = "  ...  "
    chunks = list(chunk_text(text, fake_encoder.token_offsets, ChunkSettings(window=8, overlap=2)))
    for c in chunks:
        assert text[c.start:c.end] == c.text


def test_chunk_without_tokens_still_maps_back_real_tokenizer(real_encoder):
    text = "\n\x01\n"
    chunks = list(chunk_text(text, real_encoder.token_offsets, ChunkSettings(window=8, overlap=2)))
    for c in chunks:
        assert text[c.start:c.end] == c.text


def test_line_of():
    text = "a\nbb\n\nccc"
    assert [line_of(text, text.index(ch)) for ch in "abc"] == [1, 2, 4]


# ---------------------------------------------------------------------------------------------
# ChunkSettings.check
# ---------------------------------------------------------------------------------------------


def test_chunk_settings_defaults_fit_the_model():
    s = ChunkSettings()
    assert (s.window, s.overlap) == (254, 32)
    assert s.check(256) is s


@pytest.mark.parametrize("window, overlap, match", [
    (0, 0, "--chunk-tokens must be positive, got 0"),
    (-5, 0, "--chunk-tokens must be positive, got -5"),
    (10, -1, r"--overlap must be in \[0, 10\), got -1"),
    (10, 10, r"--overlap must be in \[0, 10\), got 10"),
    (10, 11, r"--overlap must be in \[0, 10\), got 11"),
    (255, 0, "--chunk-tokens 255 exceeds the model's 254 content tokens"),
    (1000, 32, "--chunk-tokens 1000 exceeds the model's 254 content tokens"),
])
def test_chunk_settings_check_rejects_bad_values(window, overlap, match):
    with pytest.raises(InputError, match=match):
        ChunkSettings(window=window, overlap=overlap).check(256)


@pytest.mark.parametrize("window, overlap", [(1, 0), (10, 9), (254, 0), (254, 253)])
def test_chunk_settings_check_accepts_boundaries(window, overlap):
    s = ChunkSettings(window=window, overlap=overlap)
    assert s.check(256) is s


def test_several_text_fields_are_joined(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"_id": "1", "title": "Loans", "text": "Banks approve them."}\n{"_id": "2", "text": "No title here."}\n')
    docs = read(p, text_column="title,text")
    assert [d.text for d in docs] == ["Loans Banks approve them.", "No title here."]
    assert docs[0].metadata == {"_id": "1"}
    with pytest.raises(CorpusError, match="no field 'body'"):
        read(p, text_column="title,body")
