"""Run every public search entry point from many threads and from asyncio at once, with writes
interleaved, against one index; report what went wrong as JSON on stdout.

    python tests/concurrency_run.py INDEX_FOLDER SURFACE [SURFACE ...]

The writer also merges the index's segments (semsearch compact) every few rounds.

Surfaces: retriever, asyncio, explain (Retriever.search with explain=True, from threads and asyncio), oneshot (a
Retriever.load(fast_start=True): numpy query encoder, small segments searched with numpy), http, mcp (the MCP
server over streamable HTTP, four client sessions at once; the writer writes through its tools), langchain,
llamaindex, haystack. tests/test_concurrency.py
runs this in a child process with a time limit, because a deadlock inside SQLite can hold the
interpreter's lock: a test in the same process could then not even notice that it hangs.

The reference: before the concurrent phase, every call is made once, serially, in both states the
writer moves the index between (without and with one extra document, whose text shares no word
with any query); every concurrent result must equal one of the two (same ids, scores within 1e-5).
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import threading
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUERIES = ["How long does a loan decision take?", "lentil soup with cumin", "sleep and recovery after exercise"]
WHERES = [None, {"year": {">=": 2010}}, {"lang": "de"}, ["year>=2005", "year<2020", "lang=en"], "path:*.md",
          {"lang": {"!=": "en"}}]
MODES = ["dense", "lexical", "hybrid"]
RETRIEVER_SURFACES = ("retriever", "asyncio", "explain", "oneshot")
EXTRA_ID = "zz-extra"
EXTRA_TEXT = "Qwxv plorb zintafex grumbleworts vorpal snicker-snack."
THREADS = 8
# Passes over the calls per thread. By default a quarter: each thread makes a quarter of the calls,
# from its own starting point, so every call is made by two of the threads at once with the others
# (and once more by the asyncio loop) while the writer writes; a soak asks for more (10: each
# thread makes every call ten times).
ROUNDS = float(os.environ.get("SEMSEARCH_CONCURRENCY_ROUNDS", "0.25"))


def calls():
    return [(q, m, w) for q in QUERIES for m in MODES for w in WHERES]


def key(hits) -> list[tuple[str, int, float]]:
    """[(source path, chunk number, score)]: chunk ids are not compared, as the writer's document
    gets a new id each time it is written again."""
    return [(str(p), int(c), float(s)) for p, c, s in hits]


def same(a, b) -> bool:
    return len(a) == len(b) and all(x[:2] == y[:2] and abs(x[2] - y[2]) <= 1e-5 for x, y in zip(a, b))


class Labelled(list):
    """A server's hits with the generation its answer names (HTTP and MCP answers carry one)."""

    def __init__(self, hits, generation: int):
        super().__init__(hits)
        self.generation = generation


# Where each state of the index begins: (the first generation a write through a server can
# publish, whether the writer's document is there after it). The writer is the only one publishing
# while a surface runs, so the generation before its write, plus one, is the first that holds the
# change (a write may publish more than one: a merge after it).
STATES: list[tuple[int, bool]] = []


def record_write(folder, present: bool, write) -> None:
    from semsearch.store.manifest import Manifest

    first = Manifest.load(folder).generation + 1
    write()
    STATES.append((first, present))


class Checker:
    """Every answer must equal a serial run's in one of the index's two states (without the
    writer's document, or with it). A labelled answer (HTTP, MCP) must equal the reference of the
    state its generation names: checked when the run ends (check_labels), from where the writer
    recorded each state to begin (STATES); the references are labelled too."""

    def __init__(self):
        self.refs: dict[tuple, list] = {}
        self.problems: list[str] = []
        self.done = 0
        self.labels = 0
        self.labels_by: dict[str, int] = {}  # labelled answers checked against their state, by surface
        self.labelled: list[tuple] = []
        self.by_surface: dict[str, int] = {}  # checked calls of each surface
        self.lock = threading.Lock()

    def add_ref(self, surface: str, call, result) -> None:
        self.refs.setdefault((surface, repr(call)), []).append(result)

    def check(self, surface: str, call, result) -> None:
        refs = self.refs[(surface, repr(call))]
        with self.lock:
            self.done += 1
            self.by_surface[surface] = self.by_surface.get(surface, 0) + 1
            if not any(same(result, r) for r in refs):
                self.problems.append(f"{surface} {call!r}: {result} not one of {refs}")
            elif isinstance(result, Labelled):
                self.labelled.append((surface, call, result))

    def check_labels(self) -> None:
        import bisect

        firsts = [g for g, _ in STATES]

        def present(g: int) -> bool:  # before the first recorded write: without the document
            at = bisect.bisect_right(firsts, g)
            return STATES[at - 1][1] if at else False

        for surface, call, result in self.labelled:
            refs = self.refs[(surface, repr(call))]
            if len(refs) != 2 or not all(isinstance(r, Labelled) for r in refs):
                continue
            want = refs[1] if present(result.generation) else refs[0]
            self.labels += 1
            self.labels_by[surface] = self.labels_by.get(surface, 0) + 1
            if not same(result, want):
                self.problems.append(f"{surface} {call!r}: generation {result.generation} gave {result}, the state "
                                     f"{'with' if present(result.generation) else 'without'} the document is {want}")

    def error(self, surface: str, call, e: BaseException) -> None:
        with self.lock:
            self.problems.append(f"{surface} {call!r}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")


# ---- the surfaces: each gives (name, fn(call) -> [(id, score)], async fn or None) ------------------
def check_explanation(h) -> None:
    """A hit's explanation is there and whole: its records (built when first read) add up."""
    import math

    e = h.explanation
    if e is None:
        raise AssertionError("a hit without its explanation")
    d = e.get("dense")
    if d and d.get("exact"):
        if not d["tokens"] or d["spans"] is None:
            raise AssertionError(f"dense records missing: {sorted(d)}")
        if abs(math.fsum(t["contribution"] for t in d["tokens"]) - d["score"]) > 1e-6:
            raise AssertionError("token contributions do not add up to the dense score")
    lex = e.get("lexical")
    if lex and abs(math.fsum(t["contribution"] for t in lex["terms"]) - lex["sum"]) > 1e-9:
        raise AssertionError("BM25 parts do not add up")
    # each occurrence is marked in the text, or counted in the titles the chunk is searched by
    if lex and any(t["tf"] and not t["spans"] and not t.get("in_context") and h.text.isascii() for t in lex["terms"]):
        raise AssertionError(f"a matched query term without its place in the text or titles: {lex['terms']}")


def retriever_surface(folder, explain: bool = False, fast_start: bool = False):
    from semsearch.search import Retriever

    r = Retriever.load(folder, fast_start=fast_start)
    if fast_start:
        from semsearch.store.vectors import MatrixIndex

        assert all(isinstance(p.segment.vectors, MatrixIndex) for p in r.docs.parts), "oneshot: not the numpy search"

    def run(call):
        q, m, w = call
        hits = r.search(q, 5, mode=m, where=w, explain=explain)
        if explain:
            for h in hits:
                check_explanation(h)
        return key((h.path, h.chunk, h.score) for h in hits)

    return run


class PadsLikeBf16:
    """The real fp32 encoder, with what padding does to a vector in bf16 (the `auto` choice on AMX
    CPUs) made explicit and larger: a text encoded beside longer ones moves by 1e-3 per token of
    difference, 100x the comparison's tolerance. A text encoded alone, or beside texts of its own
    token length, is exact. So the servers' surfaces run the bf16 path (the shared encoder's
    unpadded passes) on every CPU, and a query whose vector depended on its batch mates would
    show as a score difference from the serial run."""

    pads_exactly = False

    def __init__(self, encoder):
        self._enc = encoder

    def __getattr__(self, name):
        return getattr(self._enc, name)

    def encode(self, texts, progress=None, **kw):
        import numpy as np

        vecs = self._enc.encode(texts, progress=progress, **kw)
        lens = np.array([min(len(self._enc.token_offsets(t)), self._enc.max_length) for t in texts])
        return vecs + 1e-3 * (lens.max() - lens)[:, None].astype(vecs.dtype) if len(lens) else vecs


def server_encoder():
    from semsearch.encoder import Encoder

    return PadsLikeBf16(Encoder(device="cpu", precision="fp32"))


def http_surface(folder):
    import httpx
    import uvicorn

    from semsearch.exposure import server_config
    from semsearch.serve import Service, create_app

    app = create_app(Service(folder, device="cpu", encoder=server_encoder()))  # the bf16 path: PadsLikeBf16
    # The server as `semsearch serve` runs it: its deadlines protocol and connection cap
    server = uvicorn.Server(server_config(app, "127.0.0.1", 0, "warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    local = threading.local()

    def run(call):
        q, m, w = call
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers=_auth())
        if w is None or isinstance(w, (str, list)):  # GET /search, the CLI's conditions as where=...
            conds = [] if w is None else [w] if isinstance(w, str) else w
            resp = local.client.get("/search", params=[("q", q), ("k", 5), ("mode", m)] + [("where", c) for c in conds])
        else:
            resp = local.client.post("/search", json={"query": q, "k": 5, "mode": m, "where": w})
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        body = resp.json()
        return Labelled(key((h["path"], h["chunk"], h["score"]) for h in body["hits"]), body["generation"])

    HTTP_URL.append(f"http://127.0.0.1:{port}")
    return run


HTTP_URL: list[str] = []  # where the server runs: the writer then writes through it
MCP_WRITE: list = []  # the MCP server's write tools, as write(present): the writer then writes through them


def mcp_surface(folder):
    """`semsearch mcp --http --allow-writes` in this process (uvicorn thread), called by the
    official SDK's client: four sessions on one background event loop, which every caller's
    calls go to, so that the server has many tool calls in flight at once."""
    import asyncio
    import itertools

    import uvicorn
    from mcp import Client

    from semsearch.exposure import server_config
    from semsearch.mcp_server import create_server, http_app
    from semsearch.service import Operations, Service

    ops = Operations(Service(folder, device="cpu", encoder=server_encoder()))  # the bf16 path: PadsLikeBf16
    server = uvicorn.Server(server_config(http_app(create_server(ops, allow_writes=True), ops), "127.0.0.1", 0, "warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/mcp"
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def open_clients():
        return [await Client(url).__aenter__() for _ in range(4)]

    clients = asyncio.run_coroutine_threadsafe(open_clients(), loop).result(120)
    turn = itertools.cycle(clients)

    def tool(name, args) -> dict:
        out = asyncio.run_coroutine_threadsafe(next(turn).call_tool(name, args), loop).result(300)
        if out.is_error:
            raise RuntimeError(f"MCP {name}: {out.content[0].text[:300]}")
        return out.structured_content

    def run(call):
        q, m, w = call
        out = tool("search", {"query": q, "k": 5, "mode": m, "where": w})
        return Labelled(key((h.get("file") or h.get("document"), h["chunk"], h["score"]) for h in out["hits"]),
                        out["generation"])

    def write(present: bool) -> None:
        if present:
            tool("upsert_document", {"id": EXTRA_ID, "text": EXTRA_TEXT, "metadata": {"year": 2015, "lang": "de"}})
        else:
            tool("delete_document", {"id": EXTRA_ID})

    MCP_WRITE.append(write)
    return run


def _auth() -> dict:
    k = os.environ.get("SEMSEARCH_API_KEY")
    return {"Authorization": f"Bearer {k}"} if k else {}


def langchain_surface(folder):
    from semsearch.integrations.langchain import SemsearchRetriever

    ret = SemsearchRetriever.from_index(folder, k=5)

    def conv(docs):
        return key((d.metadata["path"], d.metadata["chunk"], d.metadata["score"]) for d in docs)

    def run(call):
        q, m, w = call
        return conv(ret.invoke(q, k=5, mode=m, where=w))

    async def arun(call):
        q, m, w = call
        return conv(await ret.ainvoke(q, k=5, mode=m, where=w))

    def batch(cs):
        outs = []
        for (q, m, w) in cs:  # batch takes one config for all inputs: group by mode/where
            outs.append(conv(ret.batch([q], k=5, mode=m, where=w)[0]))
        return outs

    return run, arun


def llamaindex_surface(folder):
    from llama_index.core.schema import QueryBundle

    from semsearch.integrations.llamaindex import SemsearchRetriever

    from semsearch.search import Retriever

    shared = Retriever.load(folder)  # one index and model behind every (mode, where) component
    cache: dict = {}
    lock = threading.Lock()

    def get(m, w):
        with lock:
            kk = (m, repr(w))
            if kk not in cache:
                cache[kk] = SemsearchRetriever(shared, similarity_top_k=5, mode=m, where=w)
            return cache[kk]

    def conv(nodes):
        return key((n.node.metadata["path"], n.node.metadata["chunk"], n.score) for n in nodes)

    def run(call):
        q, m, w = call
        return conv(get(m, w).retrieve(q))

    async def arun(call):
        q, m, w = call
        return conv(await get(m, w).aretrieve(QueryBundle(q)))

    return run, arun


def haystack_surface(folder):
    from semsearch.integrations.haystack import SemsearchRetriever

    comp = SemsearchRetriever(index=str(folder), top_k=5)
    comp.warm_up() if hasattr(comp, "warm_up") else None

    def conv(out):
        return key((d.meta["path"], d.meta["chunk"], d.score) for d in out["documents"])

    def run(call):
        q, m, w = call
        return conv(comp.run(query=q, top_k=5, mode=m, where=w))

    async def arun(call):
        q, m, w = call
        return conv(await comp.run_async(query=q, top_k=5, mode=m, where=w))

    return run, arun


def wrote(counts: dict) -> None:
    """Count one write; the first releases the readers (they start once the writer has written)."""
    counts["writes"] += 1
    counts["first"].set()


def writer(folder, stop: threading.Event, checker: Checker, counts: dict) -> None:
    from semsearch.documents import Document, delete_documents, upsert_documents
    from semsearch.encoder import Encoder

    if MCP_WRITE or HTTP_URL:
        # Through the servers: with both, the upsert goes through HTTP and the delete through MCP's
        # tool, two services of one process writing one index in turn under both servers' readers.
        import httpx

        doc = {"id": EXTRA_ID, "text": EXTRA_TEXT, "metadata": {"year": 2015, "lang": "de"}}
        with httpx.Client(base_url=HTTP_URL[0] if HTTP_URL else "http://unused", timeout=60, headers=_auth()) as c:

            def over_http(present: bool) -> None:
                r = c.post("/documents", json={"documents": [doc]}) if present else c.delete(f"/documents/{EXTRA_ID}")
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")

            ways = {True: over_http if HTTP_URL else MCP_WRITE[0], False: MCP_WRITE[0] if MCP_WRITE else over_http}
            while not stop.is_set():
                for present in (True, False):
                    try:
                        record_write(folder, present, lambda: ways[present](present))
                    except Exception as e:  # noqa: BLE001 - reported
                        checker.error("writer", None, e)
                        return
                    wrote(counts)
        return
    from semsearch.store.folder import compact

    enc = Encoder(device="cpu")
    rounds = 0
    while not stop.is_set():
        try:
            upsert_documents(folder, [Document(EXTRA_ID, EXTRA_TEXT, {"year": 2015, "lang": "de"})], enc)
            wrote(counts)
            if rounds % 3 == 1:  # merges under readers too: the segments change, the live chunks do not
                compact(folder)
                wrote(counts)
            delete_documents(folder, [EXTRA_ID])
            wrote(counts)
            if rounds % 3 == 2:
                compact(folder)
                wrote(counts)
            rounds += 1
        except Exception as e:  # noqa: BLE001 - reported
            checker.error("writer", None, e)
            return


def watch_ast(checker: Checker) -> None:
    """Report each AST built outside the main thread from now on (ast.parse, ast.literal_eval,
    numpy's .npy header reader): on CPython 3.11 two threads building one at once can fail with
    SystemError (python/cpython#106905), so no search or write path may build one. The audit
    event fires on every such call, so this catches the path however rarely the race itself hits."""
    main = threading.main_thread()

    def hook(event, args):
        if event == "compile" and args[1] == "<unknown>" and threading.current_thread() is not main:
            # list.append, no lock: Checker.error holds its lock while formatting a traceback,
            # which itself parses source lines on 3.11.
            checker.problems.append("an AST was built in a worker thread:\n" + "".join(traceback.format_stack(limit=8)))

    sys.addaudithook(hook)


def main() -> None:
    folder = Path(sys.argv[1])
    surfaces = sys.argv[2:]
    from semsearch.documents import Document, delete_documents, upsert_documents
    from semsearch.encoder import Encoder

    checker = Checker()
    runners: dict[str, tuple] = {}
    for s in surfaces:
        if s in RETRIEVER_SURFACES:
            run = retriever_surface(folder, explain=s == "explain", fast_start=s == "oneshot")
            runners[s] = (run, None)
        elif s == "http":
            runners[s] = (http_surface(folder), None)
        elif s == "mcp":
            runners[s] = (mcp_surface(folder), None)
        else:
            runners[s] = {"langchain": langchain_surface, "llamaindex": llamaindex_surface,
                          "haystack": haystack_surface}[s](folder)
    # References in both states of the index, the extra document written as the writer writes it
    # (through the server where there is one: its encoder's vector, not another's).
    enc = Encoder(device="cpu")

    def write(present: bool) -> None:
        if MCP_WRITE:
            record_write(folder, present, lambda: MCP_WRITE[0](present))
        elif HTTP_URL:
            import httpx

            with httpx.Client(base_url=HTTP_URL[0], timeout=60, headers=_auth()) as c:
                doc = {"id": EXTRA_ID, "text": EXTRA_TEXT, "metadata": {"year": 2015, "lang": "de"}}
                record_write(folder, present, lambda: (
                    c.post("/documents", json={"documents": [doc]}) if present else c.delete(f"/documents/{EXTRA_ID}")
                ).raise_for_status())
        elif present:
            upsert_documents(folder, [Document(EXTRA_ID, EXTRA_TEXT, {"year": 2015, "lang": "de"})], enc)
        else:
            delete_documents(folder, [EXTRA_ID])

    # The Retriever's surfaces (explaining, the numpy start, asyncio) are checked against one
    # serial plain Retriever: explaining and the fast start must not change a hit or its score.
    family = [s for s in runners if s in RETRIEVER_SURFACES]
    plain = retriever_surface(folder) if family else None
    for state in ("without", "with"):
        if state == "with":
            write(True)
        for c in calls():
            if plain is not None:
                got = plain(c)
                for s in family:
                    checker.add_ref(s, c, got)
            for s, (run, _) in runners.items():
                if s not in RETRIEVER_SURFACES:
                    checker.add_ref(s, c, run(c))
    write(False)

    watch_ast(checker)
    stop = threading.Event()
    counts = {"writes": 0, "first": threading.Event()}
    w = threading.Thread(target=writer, args=(folder, stop, checker, counts), daemon=True)
    w.start()
    # A barrier, not a race: the readers start once the writer has published its first write, so
    # every run searches while writes go on however busy the CPU (it keeps writing until they end).
    while not counts["first"].wait(0.2) and w.is_alive():  # (a writer that failed has said why)
        pass

    def thread_work(s, run, j):
        cs = calls()
        offset = j * len(cs) // THREADS  # the threads' stretches overlap: every call is made by some
        for i in range(math.ceil(ROUNDS * len(cs))):
            c = cs[(i + offset) % len(cs)]
            try:
                checker.check(s, c, run(c))
            except Exception as e:  # noqa: BLE001 - reported
                checker.error(s, c, e)

    async def async_work(s, run, arun):
        cs = calls() * max(1, round(ROUNDS))  # the loop makes every call at least once

        async def one(c):
            try:
                out = await arun(c) if arun is not None else await asyncio.to_thread(run, c)
                checker.check(s, c, out)
            except Exception as e:  # noqa: BLE001 - reported
                checker.error(s, c, e)

        sem = asyncio.Semaphore(THREADS)

        async def bounded(c):
            async with sem:
                await one(c)

        await asyncio.gather(*(bounded(c) for c in cs))

    threads = []
    for s, (run, arun) in runners.items():
        if s != "asyncio":
            threads += [threading.Thread(target=thread_work, args=(s, run, j), daemon=True) for j in range(THREADS)]
        if s in ("asyncio", "oneshot", "explain") or arun is not None:
            threads.append(threading.Thread(target=lambda s=s, run=run, arun=arun: asyncio.run(async_work(s, run, arun)),
                                            daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    w.join(timeout=120)
    checker.check_labels()
    print(json.dumps({"problems": checker.problems[:20], "n_problems": len(checker.problems),
                      "calls": checker.done, "labelled": checker.labels,
                      "labelled_by": checker.labels_by, "writes": counts["writes"],
                      "surfaces": sorted(checker.by_surface)}))


if __name__ == "__main__":
    main()
