"""Sharded search (semsearch/shards.py) answers exactly what one process answers: the same chunks,
scores within 1e-5, in dense, lexical and hybrid mode, with filters, over 1 to 4 shards, after
upserts and deletes (tombstones), and never mixing two generations."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from semsearch.documents import Document, delete_documents, upsert_documents
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.shards import Shard, ShardedSearch, Stale, assign, local_fanout

from conftest import SAMPLE, FakeEncoder

# (the third: six terms, all held by many chunks: the candidates holding every term of a long
# query rank first, counted on each shard under the whole index's statistics)
QUERIES = ["How long does a loan decision take?", "lentil soup with cumin", "loan approval takes one business day",
           "sleep and recovery after exercise", "printing press", "paper 7 tomatoes",
           "lentil soup simmers slowly with cumin and onion in a pot"]
WHERES = [None, {"lang": "en"}, ["year>=2005", "year<2020"], "path:*.jsonl", {"lang": {"!=": "en"}}]
TOPICS = ["loan approval takes one business day", "lentil soup simmers with cumin", "sleep helps muscles recover",
          "printing presses spread books", "tomatoes need sun and water"]


pytestmark = pytest.mark.xdist_group("test_shards")  # one worker sets the module fixtures up (pytest -n)


@pytest.fixture(scope="module")
def index(tmp_path_factory, real_encoder):
    """The sample corpus plus records with metadata, then documents written in four more
    generations (four more segments), one of them replaced and one deleted (tombstones)."""
    root = tmp_path_factory.mktemp("shards")
    corpus = root / "corpus"
    shutil.copytree(SAMPLE, corpus)
    with open(corpus / "papers.jsonl", "w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"Paper {i}: {TOPICS[i % 5]}.", "year": 2000 + i % 25,
                                "lang": "de" if i % 4 == 0 else "en"}) + "\n")
    folder = root / "index"
    index_corpus(corpus, folder, real_encoder, progress=False)
    for j in range(4):
        upsert_documents(folder, [Document(f"note-{j}-{i}", f"Note {i} of batch {j}: {TOPICS[(i + j) % 5]}, year {2000 + i}.",
                                           {"year": 2000 + i * 3, "lang": "en" if i % 3 else "fr"}) for i in range(8)],
                         real_encoder)
    upsert_documents(folder, [Document("note-1-2", "A replaced note about loan approval in one day.", {"year": 2011, "lang": "en"})],
                     real_encoder)
    delete_documents(folder, ["note-2-5"])
    return folder


def key(hits):
    return [(h.id, h.score) for h in hits]


def assert_same(a, b, what):
    assert [i for i, _ in a] == [i for i, _ in b], (what, a, b)
    assert all(abs(x - y) <= 1e-5 for (_, x), (_, y) in zip(a, b)), (what, a, b)


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_sharded_search_equals_one_process(index, real_encoder, shards):
    one = Retriever.load(index, device="cpu", encoder=real_encoder)
    assert len(one.manifest.segments) >= 5 and one.manifest.counts["chunks"] > 100
    router = ShardedSearch(index, local_fanout([Shard(index, i, shards) for i in range(shards)]), real_encoder)
    compared = 0
    for mode in ("dense", "lexical", "hybrid"):
        for where in WHERES:
            want = one.search_batch(QUERIES, 10, mode=mode, where=where)
            got = router.search_batch(QUERIES, 10, mode=mode, where=where)
            for q, a, b in zip(QUERIES, want, got):
                assert_same(key(a), key(b), (shards, mode, where, q))
                assert [h.text for h in a] == [h.text for h in b] and [h.metadata for h in a] == [h.metadata for h in b]
                compared += bool(a)
    assert compared >= 60
    for fusion, alpha in (("rrf", None), ("convex", 0.8)):
        for q in QUERIES:
            assert_same(key(one.search(q, 10, mode="hybrid", fusion=fusion, alpha=alpha)),
                        key(router.search(q, 10, mode="hybrid", fusion=fusion, alpha=alpha)), (fusion, alpha, q))
    assert_same(key(one.search(QUERIES[0])), key(router.search(QUERIES[0])), "default mode")  # hybrid in both


def test_assignment_is_balanced_and_a_function_of_the_manifest():
    segs = [{"live": n} for n in (100, 5, 40, 60, 3, 90)]
    got = assign(segs, 3)
    assert sorted(i for o in got for i in o) == list(range(6))
    loads = [sum(segs[i]["live"] for i in o) for o in got]
    assert max(loads) - min(loads) <= 60 and got == assign(segs, 3)
    assert assign(segs[:2], 4)[2:] == [[], []]  # more shards than segments: some hold none


def test_a_search_never_mixes_generations(tmp_path, small_corpus):
    enc = FakeEncoder()
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, enc, progress=False)
    shards = [Shard(folder, i, 2) for i in range(2)]
    router = ShardedSearch(folder, local_fanout(shards), enc)
    g1 = shards[0].generation()
    before = router.search("kelp forests", 5, mode="lexical")
    assert before == []
    upsert_documents(folder, [Document("k", "kelp forests grow fast", {})], enc)
    assert shards[0].prepare(g1, [np.zeros(0, np.int64)], None)["n"] == 3  # searches under way finish on g1
    fresh = Shard(folder, 0, 2)  # a replica started after the write holds only the new generation
    with pytest.raises(Stale) as e:
        fresh.prepare(g1, [np.zeros(0, np.int64)], None)
    assert e.value.generation == g1 + 1
    calls = []

    def fanout(method, *args):  # the first round sees the old generation: the search starts again on the new
        calls.append((method, args[0]))
        return local_fanout(shards)(method, *args)

    shards = [fresh, Shard(folder, 1, 2)]
    stale_router = ShardedSearch(folder, fanout, enc, generation=iter([g1, g1 + 1, g1 + 1]).__next__)
    hits = stale_router.search("kelp forests", 5, mode="lexical")
    assert [h.text for h in hits] == ["kelp forests grow fast"]
    assert calls[0] == ("prepare", g1) and all(g == g1 + 1 for _, g in calls[1:])
    assert {g for _, g in calls[1:]} == {g1 + 1}


def test_empty_shards_and_bad_input(tmp_path, small_corpus):
    enc = FakeEncoder()
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, enc, progress=False)  # one segment, three shards: two hold nothing
    router = ShardedSearch(folder, local_fanout([Shard(folder, i, 3) for i in range(3)]), enc)
    one = Retriever.load(folder, encoder=enc)
    for mode in ("dense", "lexical", "hybrid"):  # (the fake encoder ties at 0.0 below the first hit: k=1)
        assert key(router.search("lentils soup", 1, mode=mode)) == key(one.search("lentils soup", 1, mode=mode))
    from semsearch.errors import InputError

    for bad in ({"k": 0}, {"where": {"year": {"~": 1}}}, {"mode": "fuzzy"}):
        with pytest.raises(InputError):
            router.search("soup", **{"k": 3, **bad})
    with pytest.raises(InputError):
        Shard(folder, 3, 3)


def close(a, b, path="") -> list[str]:
    """Where two explanations differ: floats beyond 1e-5 (relative to their size), anything else unequal."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in close(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        ok = a is not None and b is not None and abs(float(a) - float(b)) <= 1e-5 * max(1.0, abs(float(a)))
        return [] if ok else [f"{path}: {a} against {b}"]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


@pytest.mark.parametrize("shards", [2, 3])
def test_explanations_equal_one_process(index, real_encoder, shards):
    one = Retriever.load(index, device="cpu", encoder=real_encoder)
    router = ShardedSearch(index, local_fanout([Shard(index, i, shards) for i in range(shards)]), real_encoder)
    assert_explained_alike(one, router, QUERIES[:3])


def assert_explained_alike(one, router, queries):
    """The router's explained hits equal one process's in every key, numbers within 1e-5 (3 modes,
    with and without a filter)."""
    for mode in ("dense", "lexical", "hybrid"):
        for where in (None, {"lang": "en"}):
            want = one.search_batch(queries, 4, mode=mode, where=where, explain=True)
            got = router.search_batch(queries, 4, mode=mode, where=where, explain=True)
            for a, b in zip(want, got):
                assert [h.id for h in a] == [h.id for h in b]
                for ha, hb in zip(a, b):
                    assert hb.explanation is not None and hb.explanation["mode"] == mode
                    assert not close(ha.explanation, hb.explanation), (mode, where, close(ha.explanation, hb.explanation)[:5])


def test_more_shards_than_segments_answer_filtered_searches_as_one_process(tmp_path, real_encoder):
    """A fresh index is one segment: served by 3 shards, two hold nothing. A filtered search is
    answered as one process answers it (it was a TypeError: an empty shard counted None)."""
    enc = real_encoder
    folder = tmp_path / "idx"
    index_corpus(SAMPLE, folder, enc, progress=False)
    one = Retriever.load(folder, encoder=enc)
    assert len(one.manifest.segments) == 1
    router = ShardedSearch(folder, local_fanout([Shard(folder, i, 3) for i in range(3)]), enc)
    for mode in ("dense", "lexical", "hybrid"):
        for where in (None, ["path:*.md"], {"$path": "*.csv"}, ["path:*.nothing"]):
            want = one.search_batch(QUERIES, 10, mode=mode, where=where)
            got = router.search_batch(QUERIES, 10, mode=mode, where=where)
            for q, a, b in zip(QUERIES, want, got):
                assert_same(key(a), key(b), (mode, where, q))


def test_a_stale_shard_answer_travels_as_a_value_and_is_raised_by_the_router():
    """A replica returns Stale (StaleAnswer) rather than raising it, so that Ray Serve does not log
    the protocol's expected answer as a failed request with a traceback; the router's fanout
    raises it again as Stale, with its generation, and passes other answers through."""
    pytest.importorskip("ray")
    from semsearch.serve_ray import StaleAnswer, ray_fanout
    from semsearch.shards import Stale

    class Response:
        def __init__(self, value):
            self.value = value

        def result(self, timeout_s=None):
            return self.value

    class Handle:
        def __init__(self, value):
            self.call = self
            self.value = value

        def remote(self, method, *args):
            return Response(self.value)

    fanout = ray_fanout([Handle({"n": 1}), Handle({"n": 2})])
    assert fanout("candidates", 7) == [{"n": 1}, {"n": 2}]
    fanout = ray_fanout([Handle({"n": 1}), Handle(StaleAnswer("shard 1 holds generation 8, not 7", 8))])
    with pytest.raises(Stale) as e:
        fanout("candidates", 7)
    assert e.value.generation == 8 and "generation 8" in str(e.value)


def test_a_search_is_two_rounds_once_the_router_knows_its_terms_and_filter(index, real_encoder):
    """The rounds a search costs: `prepare` only for terms or a filter this router has not met at
    this generation; hybrid fuses from the `candidates` round (no round to fill in scores); the
    answers equal one process's, before and after a write moves the generation."""
    shards = [Shard(index, i, 3) for i in range(3)]
    calls: list[str] = []

    def fanout(method, *args):
        calls.append(method)
        return local_fanout(shards)(method, *args)

    router = ShardedSearch(index, fanout, real_encoder)

    def rounds(query, mode, where=None):
        calls.clear()
        got = router.search(query, 10, mode=mode, where=where)
        one = Retriever.load(index, device="cpu", encoder=real_encoder).search(query, 10, mode=mode, where=where)
        assert_same(key(one), key(got), (query, mode, where))
        assert got, (query, mode, where)
        return list(calls)

    assert rounds("loan approval", "hybrid") == ["prepare", "candidates", "chunks"]
    assert rounds("loan approval", "hybrid") == ["candidates", "chunks"]
    assert rounds("approval loan", "lexical") == ["candidates", "chunks"]  # the same terms
    assert rounds("loan approval decision", "hybrid") == ["prepare", "candidates", "chunks"]  # one new term
    assert rounds("loan approval", "hybrid", {"lang": "en"}) == ["prepare", "candidates", "chunks"]  # a new filter
    assert rounds("loan approval", "hybrid", {"lang": "en"}) == ["candidates", "chunks"]
    assert rounds("loan decision", "dense", {"lang": "en"}) == ["candidates", "chunks"]
    upsert_documents(index, [Document("rounds-1", "Loan approval decisions in one day, said the note.", {"lang": "en"})],
                     real_encoder)
    try:
        assert rounds("loan approval", "hybrid") == ["prepare", "candidates", "chunks"]  # a new generation
        assert rounds("loan approval", "hybrid") == ["candidates", "chunks"]
        # its first search asked for the terms searched lately too: theirs are two rounds at once
        assert rounds("loan decision", "lexical") == ["candidates", "chunks"]
        assert rounds("approval decision", "hybrid", {"lang": "en"}) == ["prepare", "candidates", "chunks"]  # (a filter)
    finally:
        delete_documents(index, ["rounds-1"])


def test_every_shard_count_answers_as_the_index_grows_and_shrinks(tmp_path):
    """1 to 4 shards, each with one router kept across generations (its statistics and filter
    counts are per generation), over an index of no chunk, one segment, many (upserts), one of them
    emptied by a delete, and one again (compact): every mode and filter form answers as one
    process does, empty shards and filters that let nothing through included."""
    from semsearch.store.folder import compact

    enc = FakeEncoder()
    corpus = tmp_path / "c"
    corpus.mkdir()
    folder = tmp_path / "idx"
    (corpus / "empty.txt").write_text("")
    index_corpus(corpus, folder, enc, progress=False)  # a file without text: no chunk yet
    routers = {n: ShardedSearch(folder, local_fanout([Shard(folder, i, n) for i in range(n)]), enc) for n in (1, 2, 3, 4)}
    wheres = [None, {"lang": "en"}, ["year>=2005", "year<2020"], "path:*.jsonl", {"lang": {"!=": "en"}}, {"lang": "xx"}]
    queries = ["loan approval", "lentil soup cumin", "sleep recovery after exercise", "zzz unknown words"]

    def check(state: str) -> int:
        one = Retriever.load(folder, encoder=enc)
        answered = 0
        for n, router in routers.items():
            for mode in ("dense", "lexical", "hybrid"):
                for where in wheres:
                    want = one.search_batch(queries, 5, mode=mode, where=where)
                    got = router.search_batch(queries, 5, mode=mode, where=where)
                    for q, a, b in zip(queries, want, got):
                        assert_same_up_to_ties(key(a), key(b), (state, n, mode, where, q))
                        answered += bool(a)
        return answered

    assert Retriever.load(folder, encoder=enc).manifest.counts["chunks"] == 0
    assert check("no chunk") == 0
    with open(corpus / "papers.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"text": f"Paper {i}: {TOPICS[i % 5]} {extra(i)}.", "year": 2000 + i % 25,
                                "lang": "de" if i % 4 == 0 else "en"}) + "\n")
    index_corpus(corpus, folder, enc, progress=False)
    assert check("one segment") > 0
    for j in range(3):
        upsert_documents(folder, [Document(f"n{j}-{i}", f"Note {i}: {TOPICS[(i + j) % 5]} {extra(100 + 4 * j + i)}.",
                                           {"year": 2001 + i, "lang": "en" if i % 2 else "fr"}) for i in range(4)], enc)
    assert len(Retriever.load(folder, encoder=enc).manifest.segments) >= 4
    assert check("many segments") > 0
    delete_documents(folder, [f"n1-{i}" for i in range(4)])  # one segment left with nothing live
    assert check("a segment emptied") > 0
    compact(folder)
    assert len(Retriever.load(folder, encoder=enc).manifest.segments) == 1
    assert check("compacted") > 0


def extra(i: int) -> str:
    """A few words of the document's own (the fake encoder's cosines would tie for texts of the same words)."""
    return " ".join(f"w{i}x{j}" for j in range(i % 4))


def assert_same_up_to_ties(a, b, what):
    """The same scores (within 1e-5), and the same ids for each run of exactly tied scores (the
    order inside a tie is the only freedom the router has); a tie cut by k may hold other ids."""
    assert len(a) == len(b) and all(abs(x - y) <= 1e-5 for (_, x), (_, y) in zip(a, b)), (what, a, b)
    at = 0
    while at < len(a):
        end = at
        while end < len(a) and abs(a[end][1] - a[at][1]) <= 1e-6:
            end += 1
        if end < len(a):  # (the last run may go on past k)
            assert {i for i, _ in a[at:end]} == {i for i, _ in b[at:end]}, (what, a, b)
        at = end


def test_a_router_from_many_threads_and_asyncio_while_a_writer_writes(tmp_path, small_corpus, monkeypatch):
    """ShardedSearch from 8 threads and an asyncio loop at once, while a writer upserts (new
    generations), with the router's kept statistics so small that searches clear them under each
    other: no error, and each answer is one process's at the generation it names."""
    import asyncio
    import threading
    import time

    import semsearch.shards as shards_mod

    monkeypatch.setattr(shards_mod, "_PREP_TERMS", 3)
    monkeypatch.setattr(shards_mod, "_PREP_FILTERS", 1)
    enc = FakeEncoder()
    folder = tmp_path / "idx"
    index_corpus(small_corpus, folder, enc, progress=False)
    router = ShardedSearch(folder, local_fanout([Shard(folder, i, 2) for i in range(2)]), enc)
    queries = ["loan credit score", "lentils onion cumin", "meteor comet debris", "mortgage rates", "soup bank"]
    wheres = [None, "path:*.txt", "path:*.md", {"n": {">=": 0}}]
    answers, errors = [], []
    stop = threading.Event()

    def one(i: int):
        q, w, mode = queries[i % 5], wheres[i % 4], ("dense", "lexical", "hybrid")[i % 3]
        gen, hits = router.search_at([q], 3, mode, w)
        answers.append((gen, q, w, mode, key(hits[0])))

    def worker(t: int):
        i = t
        while not stop.is_set():
            try:
                one(i)
            except Exception as e:  # noqa: BLE001 - collected, asserted empty below
                errors.append(repr(e))
            i += 7

    async def loop():
        i = 3
        while not stop.is_set():
            try:
                await asyncio.to_thread(one, i)
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
            i += 5
            await asyncio.sleep(0)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    threads.append(threading.Thread(target=lambda: asyncio.run(loop())))
    for t in threads:
        t.start()
    try:
        for j in range(4):  # the writer: each upsert a new generation
            upsert_documents(folder, [Document(f"w{j}", f"loan credit note {j} about mortgage rates", {"n": j})], enc)
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not errors, errors[:5]
    assert len(answers) > 50 and len({g for g, *_ in answers}) >= 2
    # every answer is one process's at its generation (the last one checked again now)
    last = max(g for g, *_ in answers)
    one_process = Retriever.load(folder, encoder=enc)
    assert one_process.manifest.generation == last
    checked = [a for a in answers if a[0] == last]
    for gen, q, w, mode, got in checked:
        assert_same_up_to_ties(key(one_process.search(q, 3, mode=mode, where=w)), got, (q, w, mode))
    assert checked


# ---- indexes partitioned by document (store/partition.py) -----------------------------------------
def _parts_hold_their_documents(folder, n):
    from test_engines import parts_hold_their_documents

    return parts_hold_their_documents(folder, n)


@pytest.fixture(scope="module")
def partitioned(index, tmp_path_factory):
    """The module's index (7 segments, with replaced and deleted documents) partitioned into 3
    by `semsearch compact --shards 3`, then both written to alike: a batch of documents that
    falls into every partition, a replacement and a deletion."""
    from click.testing import CliRunner

    from semsearch.cli import main

    root = tmp_path_factory.mktemp("parted")
    one, parted = root / "one", root / "parted"
    shutil.copytree(index, one)
    shutil.copytree(index, parted)
    res = CliRunner().invoke(main, ["compact", "--index", str(parted), "--shards", "3", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["shards"] == 3
    return one, parted


def _write_alike(folders, enc):
    docs = [Document(f"later-{i}", f"Later note {i}: {TOPICS[(i * 2) % 5]} and {TOPICS[(i + 3) % 5]}.",
                     {"year": 2003 + i, "lang": "en" if i % 2 else "de"}) for i in range(12)]
    for f in folders:
        upsert_documents(f, docs, enc)
        upsert_documents(f, [Document("later-3", "A replaced later note on printing presses.", {"year": 2019, "lang": "en"})], enc)
        delete_documents(f, ["later-4", "note-0-1"])


def test_a_partitioned_index_answers_as_the_index_it_was_and_each_shard_holds_one_partition(partitioned, real_encoder):
    """Partitioned, then written to (a batch across partitions is split at commit): each segment
    holds one partition's documents, Retriever answers as on the unpartitioned copy (ids, texts,
    scores within 1e-5: 3 modes x 5 filter forms), and 3 shards own one partition each while 1, 2
    and 4 shards answer the same."""
    one, parted = partitioned
    _write_alike([one, parted], real_encoder)
    m, by_part = _parts_hold_their_documents(parted, 3)
    assert m.counts == Retriever.load(one, encoder=real_encoder).manifest.counts
    shares = [sum(e["live"] for e in by_part[p]) / m.counts["chunks"] for p in range(3)]
    assert all(s > 0.1 for s in shares), shares  # (a few large files: not 1/3 each at this size)
    a, b = Retriever.load(one, encoder=real_encoder), Retriever.load(parted, encoder=real_encoder)
    for mode in ("dense", "lexical", "hybrid"):
        for where in WHERES:
            for q, x, y in zip(QUERIES, a.search_batch(QUERIES, 10, mode=mode, where=where),
                               b.search_batch(QUERIES, 10, mode=mode, where=where)):
                assert_same(key(x), key(y), (mode, where, q))
                assert [h.text for h in x] == [h.text for h in y]
    owned = assign(m.segments, 3)
    assert sorted(sorted({m.segments[i]["part"] for i in o}) for o in owned) == [[0], [1], [2]]
    for shards in (1, 2, 3, 4):
        router = ShardedSearch(parted, local_fanout([Shard(parted, i, shards) for i in range(shards)]), real_encoder)
        for mode in ("dense", "lexical", "hybrid"):
            for where in (None, ["year>=2005", "year<2020"], "path:*.jsonl"):
                for q, x, y in zip(QUERIES, a.search_batch(QUERIES, 10, mode=mode, where=where),
                                   router.search_batch(QUERIES, 10, mode=mode, where=where)):
                    assert_same(key(x), key(y), (shards, mode, where, q))


def test_a_shard_of_one_partition_holds_only_its_own_chunks_and_explains_as_one_process(partitioned, real_encoder):
    """A shard that owns one partition of an index partitioned into 3 claims only its own chunks
    (the partitions' id ranges interleave: a chunk of another partition inside its range is not
    its; it claimed them, and explained other shards' hits without their length), and the three
    shards' explanations equal one process's in every key (3 modes, with and without a filter)."""
    _, parted = partitioned
    one = Retriever.load(parted, device="cpu", encoder=real_encoder)
    shards = [Shard(parted, i, 3) for i in range(3)]
    every = np.array(sorted(_chunk_ids(parted)), np.int64)
    held = [s._at(s.generation()).g.docs.held(every.tolist()) for s in shards]
    assert sum(len(h) for h in held) == len(every) and np.array_equal(np.sort(np.concatenate(held)), every)
    assert_explained_alike(one, ShardedSearch(parted, local_fanout(shards), real_encoder), QUERIES[:4])


def test_compact_partitions_a_partitioned_index_anew_and_it_answers_as_before(partitioned, real_encoder, tmp_path, monkeypatch):
    """`compact --shards N` on an index partitioned into 3 (its partitions' chunk ids interleave):
    into 2, 4, then 1 (partitioned no more), each in one generation; every time each partition is
    one segment holding its own documents (a single segment, format 6, for 1), the chunk ids and
    counts are kept, and Retriever answers as the unpartitioned copy (3 modes x 5 filter forms:
    ids, texts, scores within 1e-5)."""
    from click.testing import CliRunner

    from semsearch.cli import main
    from semsearch.store import merge as merge_
    from semsearch.store.lexical import writing
    from semsearch.store.manifest import FORMAT_VERSION, Manifest

    in_order = {"vectors": 0, "postings": 0}  # the merges took the path for ids that interleave
    monkeypatch.setattr(merge_, "_in_id_order", _counted(merge_._in_id_order, in_order, "vectors"))
    monkeypatch.setattr(writing, "_Order", _counted(writing._Order, in_order, "postings"))
    one, parted = partitioned
    folder = tmp_path / "again"
    shutil.copytree(parted, folder)
    a = Retriever.load(one, encoder=real_encoder)
    want = {(mode, str(where)): a.search_batch(QUERIES, 10, mode=mode, where=where)
            for mode in ("dense", "lexical", "hybrid") for where in WHERES}
    ids_before = sorted(_chunk_ids(folder))
    for n in (2, 4, 1):
        res = CliRunner().invoke(main, ["compact", "--index", str(folder), "--shards", str(n), "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert out["shards"] == n and out["chunks"] == a.manifest.counts["chunks"], out
        if n > 1:
            m, by_part = _parts_hold_their_documents(folder, n)
            assert sorted(by_part) == list(range(n)) and all(len(v) == 1 for v in by_part.values()), by_part
        else:
            m = Manifest.load(folder)
            assert m.shards == 1 and len(m.segments) == 1 and m.format_version == FORMAT_VERSION
            assert "part" not in m.segments[0]
        assert sorted(_chunk_ids(folder)) == ids_before
        if n != 4:  # (2 into 4: each new partition's documents were all in one of the 2: no interleaving)
            assert in_order["vectors"] == in_order["postings"] == n, in_order
        in_order.update(vectors=0, postings=0)
        b = Retriever.load(folder, encoder=real_encoder)
        assert b.manifest.counts == a.manifest.counts
        for (mode, where), expected in want.items():
            got = b.search_batch(QUERIES, 10, mode=mode, where=next(w for w in WHERES if str(w) == where))
            for q, x, y in zip(QUERIES, expected, got):
                assert_same(key(x), key(y), (n, mode, where, q))
                assert [h.text for h in x] == [h.text for h in y]


def _counted(fn, counts: dict, name: str):
    def call(*a, **k):
        counts[name] += 1
        return fn(*a, **k)

    return call


def _chunk_ids(folder) -> list[int]:
    """The live chunk ids of every segment (from the docstores, less the tombstones)."""
    import sqlite3

    from semsearch.store.manifest import Manifest
    from semsearch.store.segments import Tombstones

    m, out = Manifest.load(folder), []
    for e in m.segments:
        dead = set(Tombstones.load(folder / e["deletes"]).chunks.tolist()) if e.get("deletes") else set()
        db = sqlite3.connect(f"file:{folder / e['docs']}?mode=ro", uri=True)
        out += [i for (i,) in db.execute("SELECT id FROM chunks") if i not in dead]
        db.close()
    return out


def test_index_shards_builds_partitions_that_writes_keep_and_numbers_that_differ_are_refused(tmp_path):
    """`index --shards 3` on a new index: one segment a partition, each document's chunks in its
    own; an update keeps them so; another --shards is a clear error that names the way
    (`compact --shards`; nothing written); `compact` keeps a segment a partition."""
    from semsearch.errors import InputError
    from semsearch.store.folder import compact
    from semsearch.store.manifest import Manifest

    enc = FakeEncoder()
    corpus = tmp_path / "c"
    shutil.copytree(SAMPLE, corpus)
    folder = tmp_path / "idx"
    index_corpus(corpus, folder, enc, progress=False, shards=3)
    m, by_part = _parts_hold_their_documents(folder, 3)
    assert sorted(by_part) == [0, 1, 2] and all(len(v) == 1 for v in by_part.values())
    (corpus / "added.txt").write_text("An added file about loan approval and lentil soup.\n")
    (corpus / "growing_tomatoes.txt").unlink()
    index_corpus(corpus, folder, enc, progress=False)  # the index's own number of partitions
    _parts_hold_their_documents(folder, 3)
    before = Manifest.load(folder).generation
    with pytest.raises(InputError, match="partitioned into 3 .*compact --index .* --shards 2"):
        index_corpus(corpus, folder, enc, progress=False, shards=2)
    assert Manifest.load(folder).generation == before
    out = compact(folder)
    assert out["shards"] == 3 and out["segments"] == 3
    _parts_hold_their_documents(folder, 3)
    from click.testing import CliRunner

    from semsearch.cli import main

    res = CliRunner().invoke(main, ["info", "--index", str(folder)])
    assert res.exit_code == 0 and "in 3 partitions by document (" in res.output and "compact` merges them" not in res.output


def _records_corpus(root, jsonl_records: int = 600, csv_rows: int = 300, changed: bool = False):
    """A JSONL file and a CSV file of many records each, and a text file. `changed`: the JSONL
    file with record 5 rewritten and record 7 gone."""
    import csv

    root.mkdir(exist_ok=True)
    with open(root / "notes.jsonl", "w") as fh:
        for i in range(jsonl_records):
            if changed and i == 7:
                continue
            text = "a rewritten note on zebrafish" if changed and i == 5 else f"Note {i}: {TOPICS[i % 5]} {extra(i)} n{i}"
            fh.write(json.dumps({"id": f"r{i}", "text": text, "year": 2000 + i % 30}) + "\n")
    if csv_rows:
        with open(root / "rows.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "text", "year"])
            w.writerows([f"c{i}", f"Row {i}: {TOPICS[(i + 2) % 5]} {extra(i)} c{i}", 1990 + i % 40] for i in range(csv_rows))
    (root / "plain.txt").write_text("A plain file about loan approval and printing presses.\n")
    return root


def _answers_alike(one, parted, enc, wheres=(None, "path:*.jsonl", ["year>=2005", "year<2020"])):
    a, b = Retriever.load(one, encoder=enc), Retriever.load(parted, encoder=enc)
    assert a.manifest.counts == b.manifest.counts
    for mode in ("dense", "lexical", "hybrid"):
        for where in wheres:
            for q, x, y in zip(QUERIES, a.search_batch(QUERIES, 10, mode=mode, where=where),
                               b.search_batch(QUERIES, 10, mode=mode, where=where)):
                assert_same_up_to_ties(key(x), key(y), (mode, where, q))


def test_the_records_of_a_file_are_documents_spread_over_the_partitions_and_go_with_their_file(tmp_path):
    """`index --shards 3` over a JSONL file of 600 records and a CSV file of 300 rows: each record
    is a document of its own, so each partition holds a third of the chunks (+-5 points), not
    whole files; counts (files, documents, chunks) and answers are the unpartitioned index's (3
    modes x 3 filter forms), served by 3 shards as well. The JSONL file changed (a record
    rewritten, one gone) and the CSV file deleted: none of their old records is left in any
    partition. Re-partitioned into 2, then 1: the same counts and answers."""
    from semsearch.store.folder import compact

    enc = FakeEncoder()
    corpus = _records_corpus(tmp_path / "c")
    one, parted = tmp_path / "one", tmp_path / "parted"
    index_corpus(corpus, one, enc, progress=False)
    index_corpus(corpus, parted, enc, progress=False, shards=3)
    m, by_part = _parts_hold_their_documents(parted, 3)
    assert m.counts["files"] == 3 and m.counts["documents"] == 901, m.counts
    shares = [sum(e["live"] for e in by_part[p]) / m.counts["chunks"] for p in range(3)]
    assert all(abs(x - 1 / 3) <= 0.05 for x in shares), shares
    _answers_alike(one, parted, enc)
    router = ShardedSearch(parted, local_fanout([Shard(parted, i, 3) for i in range(3)]), enc)
    want = Retriever.load(one, encoder=enc)
    for mode in ("dense", "lexical", "hybrid"):
        for q, x, y in zip(QUERIES, want.search_batch(QUERIES, 10, mode=mode), router.search_batch(QUERIES, 10, mode=mode)):
            assert_same_up_to_ties(key(x), key(y), (mode, q))

    _records_corpus(corpus, csv_rows=0, changed=True)
    (corpus / "rows.csv").unlink()
    for folder in (one, parted):
        index_corpus(corpus, folder, enc, progress=False)
    m, _ = _parts_hold_their_documents(parted, 3)
    assert m.counts["files"] == 2 and m.counts["documents"] == 600, m.counts
    from semsearch.store.segments import read_rows

    texts = [t for _, t in read_rows(parted, m, "c.text")]  # every live chunk of every partition
    assert len(texts) == m.counts["chunks"] and "a rewritten note on zebrafish" in texts
    assert not [t for t in texts if t.startswith(("Note 5:", "Note 7:", "Row "))]
    assert [h.text for h in Retriever.load(parted, encoder=enc).search("n7 n5 c3", 3, mode="lexical")] == []
    _answers_alike(one, parted, enc)
    for n in (2, 1):
        compact(parted, shards=n)
        if n > 1:
            _parts_hold_their_documents(parted, n)
        _answers_alike(one, parted, enc)


def test_a_long_partitioned_run_ends_with_one_merge_a_partition(tmp_path, monkeypatch):
    """A run that publishes its segments as it goes (every ~100 chunks here), unsplit, ends with
    one merge a partition that splits and merges them at once (not a split of each, then a merge),
    and holds what an unpartitioned run holds, chunk for chunk."""
    from semsearch.store import merge as merge_
    from test_engines import assert_same_index

    import os

    from semsearch.store import partition

    # Documents are stored by absolute path, so which partition each lands in depends on where the
    # checkout lives (a fresh clone's partition 1 spanned 3 of the run's segments, not 4+): hashed
    # here by the path under the sample's folder, the same split wherever the tests run.
    real_part_of = partition.part_of
    monkeypatch.setattr(partition, "part_of", lambda path, n: real_part_of(os.path.relpath(path, SAMPLE.parent), n))
    enc = FakeEncoder()
    index_corpus(SAMPLE, tmp_path / "one", enc, progress=False, segment_chunks=100)
    merges = []
    real_merge = merge_.merge
    monkeypatch.setattr(merge_, "merge", lambda *x, **k: merges.append((len(x[1]), k.get("part"))) or real_merge(*x, **k))
    index_corpus(SAMPLE, tmp_path / "parted", enc, progress=False, segment_chunks=100, shards=3)
    _, by_part = _parts_hold_their_documents(tmp_path / "parted", 3)
    assert sorted(by_part) == [0, 1, 2] and all(len(v) == 1 for v in by_part.values())
    assert sorted(p for _, p in merges) == [(0, 3), (1, 3), (2, 3)] and all(n > 3 for n, _ in merges), merges  # the run's segments
    assert_same_index(tmp_path / "one", tmp_path / "parted")
    # a partitioned index is format 7: a format-6 reader (READABLE up to 6) refuses it rather than
    # looking interleaved ids up in the wrong segment; one partition stays format 6. Where a file's
    # records fall in several partitions (the sample's JSONL and CSV files) it is format 9: a
    # format-8 writer would delete such a file from one partition only.
    from semsearch.errors import IndexFormatError
    from semsearch.store import manifest as manifest_
    from semsearch.store.manifest import Manifest

    # (one partition built by a long run keeps its segments' docstores in place: format 8, which a
    # format-7 reader refuses rather than seeing only the first docstore's chunks)
    parted = Manifest.load(tmp_path / "parted")
    assert parted.format_version == manifest_.SPREAD_VERSION == 9 and any(e.get("guests") for e in parted.segments)
    assert manifest_.PARTED_VERSION == 7
    assert Manifest.load(tmp_path / "one").format_version == manifest_.IN_PLACE_VERSION == 8
    monkeypatch.setattr(manifest_, "READABLE", (1, 2, 3, 4, 5, 6, 7, 8))
    with pytest.raises(IndexFormatError, match="format version 9"):
        Manifest.load(tmp_path / "parted")
    monkeypatch.setattr(manifest_, "READABLE", (1, 2, 3, 4, 5, 6, 7))
    with pytest.raises(IndexFormatError, match="format version 8"):
        Manifest.load(tmp_path / "one")


def test_a_segment_whose_filtered_search_finds_too_few_is_searched_exactly_within_itself(tmp_path, monkeypatch):
    """An approximate segment's filtered search that finds fewer than k allowed chunks (its probed
    lists hold few) is answered exactly among that segment's own allowed chunks, so the result is
    each segment's best and does not depend on which shard holds which segment. Here every IVF
    segment's filtered search is made to find only 2: the answer is still the exact top 10."""
    from semsearch import filters
    from semsearch.indexing import VectorSettings
    from semsearch.store.vectors import VectorIndex

    enc = FakeEncoder()
    folder = tmp_path / "idx"
    index_corpus(SAMPLE, folder, enc, progress=False, shards=3, vectors=VectorSettings(index_type="ivf"))
    r = Retriever.load(folder, encoder=enc)
    assert {e["index"]["type"] for e in r.manifest.segments} == {"ivf"}
    real = VectorIndex.search_filtered

    def finds_two(self, q, k, allowed, share=1.0):
        s, i = real(self, q, k, allowed, share)
        return s[:, :2], i[:, :2]

    monkeypatch.setattr(VectorIndex, "search_filtered", finds_two)
    g = r._gen
    for where in ("path:*.md", {"$path": "*.csv"}, None):
        allowed = filters.parse(where).select(g.docs) if where is not None else None
        sel = allowed if allowed is not None else filters.parse("path:*").select(g.docs)
        qv = enc.encode(QUERIES)
        scores, ids = g.vectors.search_filtered(qv, 10, sel)
        ids_all, vecs = g.docs.get_vectors(sel.ids)
        exact = qv @ vecs.T
        for q in range(len(QUERIES)):
            want = np.lexsort((ids_all, -exact[q]))[:10]
            # (the fake encoder's bag-of-words scores tie exactly in arithmetic; faiss's BLAS kernel
            # and numpy's sum them in other orders, so a tie may come out split by a last bit)
            assert_same_up_to_ties(list(zip(ids_all[want].tolist(), exact[q][want].tolist())),
                                   list(zip(ids[q].tolist(), scores[q].tolist())), (where, q))
