"""`semsearch serve --engine ray`, started as a user starts it: the index served by Ray Serve, 3
shards x 2 replicas on a new local Ray cluster, answers over HTTP exactly as one process does;
while clients search and a writer publishes generations, one replica of each shard is killed
(SIGKILL of its process) in turn: no client error, read-your-writes after each acknowledged write,
no answer mixing generations. The cluster listens on loopback only, and SIGTERM stops it cleanly."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from semsearch.documents import Document, upsert_documents  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.search import Retriever  # noqa: E402

from conftest import REPO, SAMPLE  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time (pytest -n: one worker)

class Served(NamedTuple):
    folder: Path
    url: str
    enc: object
    proc: subprocess.Popen
    log: Path


QUERIES = ["How long does a loan decision take?", "lentil soup with cumin", "sleep and recovery after exercise",
           "printing press", "tomatoes need sun"]
WHERES = [None, {"lang": "en"}, ["year>=2005", "year<2020"], "path:*.jsonl"]
TOPICS = ["loan approval takes one business day", "lentil soup simmers with cumin", "sleep helps muscles recover",
          "printing presses spread books", "tomatoes need sun and water"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """An index partitioned by document into 3 (`index --shards 3`), then written to (each write
    split by partition), served as a user serves it: `semsearch serve --engine ray --shards 3
    --replicas 2 --host 127.0.0.1` in its own process (a new local Ray cluster of this machine's
    CPUs, on loopback): each shard owns one partition. Replicas are found by their process titles
    in its process tree."""
    from semsearch.encoder import Encoder

    if not Path("/proc/net/tcp").exists():
        pytest.skip("finds the server's replicas and sockets in Linux's /proc")
    root = tmp_path_factory.mktemp("serve_ray")
    corpus = root / "corpus"
    shutil.copytree(SAMPLE, corpus)
    with open(corpus / "papers.jsonl", "w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"Paper {i}: {TOPICS[i % 5]}.", "year": 2000 + i % 25,
                                "lang": "de" if i % 4 == 0 else "en"}) + "\n")
    folder = root / "index"
    enc = Encoder(device="cpu")  # the default precision: what the router loads for queries
    index_corpus(corpus, folder, enc, progress=False, shards=3)
    for j in range(3):
        upsert_documents(folder, [Document(f"note-{j}-{i}", f"Note {i}: {TOPICS[(i + j) % 5]}.", {"year": 2001 + i, "lang": "en"})
                                  for i in range(6)], enc)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    log = (root / "serve.log").open("w+")
    proc = None
    try:
        for attempt in range(3):  # a port taken between the probe and Serve's bind: again, on another
            port = _quiet_port()
            log.seek(0)
            log.truncate()
            proc = subprocess.Popen([sys.executable, "-m", "semsearch.cli", "serve", "--index", str(folder), "--engine", "ray",
                                     "--shards", "3", "--replicas", "2", "--host", "127.0.0.1", "--port", str(port)],
                                    env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
            url = f"http://127.0.0.1:{port}"
            if _healthy(proc, url, root / "serve.log", last=attempt == 2):
                break
            with contextlib.suppress(ProcessLookupError):  # what the failed start left of its cluster
                os.killpg(proc.pid, signal.SIGKILL)
        yield Served(folder, url, enc, proc, root / "serve.log")
    finally:
        if proc is not None and proc.poll() is None:  # a check failed before SIGTERM: stop it as a user would, then for good
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def _quiet_port() -> int:
    """A free loopback port below the kernel's ephemeral range and above Ray's worker ports
    (10002-19999 by default): the server starts a whole Ray cluster, whose processes bind ports of
    their own, between this probe and Serve's bind (a port from bind(0) was once taken by then)."""
    import random

    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def _healthy(proc: subprocess.Popen, url: str, log: Path, last: bool) -> bool:
    """Wait for the server's /health: True once it answers; False where it exited for want of its
    port (unless `last`); any other exit, or no answer in 400 s, fails with its log."""
    deadline = time.monotonic() + 400
    while True:
        if proc.poll() is not None:
            out = log.read_text()
            assert not last and "Failed to bind" in out, out[-3000:]
            return False
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)


def three_shards_answer_as_one_process(cluster):
    from semsearch.shards import assign

    folder, url, enc = cluster[:3]
    one = Retriever.load(folder, device="cpu", encoder=enc)
    segs = one.manifest.segments
    assert one.manifest.shards == 3 and sorted(sorted({segs[i]["part"] for i in o}) for o in assign(segs, 3)) == [[0], [1], [2]]
    compared = 0
    with httpx.Client(base_url=url, timeout=120) as c:
        for mode in ("dense", "lexical", "hybrid"):
            for where in WHERES:
                got = c.post("/search", json={"queries": QUERIES, "k": 10, "mode": mode, "where": where})
                assert got.status_code == 200, got.text
                for q, res, want in zip(QUERIES, got.json()["results"], one.search_batch(QUERIES, 10, mode=mode, where=where)):
                    assert [h["id"] for h in res["hits"]] == [h.id for h in want], (mode, where, q)
                    assert all(abs(h["score"] - w.score) <= 1e-5 for h, w in zip(res["hits"], want)), (mode, where, q)
                    compared += bool(want)
        info = c.get("/info").json()
        assert info["counts"] == one.manifest.counts and info["generation"] == one.manifest.generation
        explained = c.post("/search", json={"query": "lentil soup", "k": 3, "explain": True})
        assert explained.status_code == 200, explained.text
        want = one.search("lentil soup", 3, explain=True)
        got = explained.json()["hits"]
        assert [h["id"] for h in got] == [h.id for h in want]
        for h, w in zip(got, want):  # the same numbers as one process (tests/test_shards.py compares them whole)
            e, x = h["explanation"], w.explanation
            assert abs(e["fusion"]["fused"] - x["fusion"]["fused"]) <= 1e-5 if "fused" in x.get("fusion", {}) else True
            assert abs(e["lexical"]["sum"] - x["lexical"]["sum"]) <= 1e-4 and abs(e["dense"]["score"] - x["dense"]["score"]) <= 1e-5
    assert compared >= 50


def _titles(server: int) -> dict[int, str]:
    out = {}
    for p in descendants(server):
        try:
            out[p] = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
        except OSError:
            continue
    return out


def _replicas(server: int, shard: int) -> list[int]:
    """The live processes of a shard's replicas under the server's process tree (Ray titles an
    actor's process `ray::ServeReplica:<app>:<deployment>`, and adds the method it runs)."""
    out = []
    for p in sorted(descendants(server)):
        try:
            title = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
            state = Path(f"/proc/{p}/stat").read_text().rsplit(") ", 1)[1][0]
        except OSError:
            continue
        base = f"ray::ServeReplica:semsearch:shard-{shard}"  # (while it runs a call, Ray adds ".method()")
        if (title == base or title.startswith(base + ".")) and state != "Z":
            out.append(p)
    return out


def killing_a_replica_of_each_shard_under_load_loses_nothing(cluster):
    folder, url, enc = cluster[:3]
    stop = threading.Event()
    errors: list[str] = []
    seen: list[tuple[int, bool]] = []  # (generation, the probe document found) of each search that asked for it
    written: dict[int, int] = {}  # probe number -> generation its write published

    def client(n: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            i = 0
            while not stop.is_set():
                q = QUERIES[(n + i) % len(QUERIES)]
                r = c.get("/search", params={"q": q, "k": 5, "mode": ("dense", "lexical", "hybrid")[i % 3]})
                if r.status_code != 200:
                    errors.append(f"client {n}: {r.status_code} {r.text[:200]}")
                i += 1

    def writer() -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            n = 0
            while not stop.is_set():
                text = f"zqx{n} probe document number {n}"
                r = c.post("/documents", json={"documents": [{"id": f"probe-{n}", "text": text}]})
                if r.status_code != 200:
                    errors.append(f"writer: {r.status_code} {r.text[:200]}")
                    return
                written[n] = r.json()["generation"]
                found = c.get("/search", params={"q": f"zqx{n}", "k": 1, "mode": "lexical"})
                if found.status_code != 200:
                    errors.append(f"writer's read: {found.status_code} {found.text[:200]}")
                    return
                body = found.json()
                ok = bool(body["hits"]) and body["hits"][0]["text"] == text
                seen.append((body["generation"], ok))
                if not ok:  # read-your-writes: the acknowledged write is searchable at once
                    errors.append(f"probe {n} written at generation {written[n]} not found at generation {body['generation']}")
                n += 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(8)]
    threads.append(threading.Thread(target=writer, daemon=True))
    for t in threads:
        t.start()
    killed = []
    try:
        time.sleep(3)
        for shard in range(3):
            pids = _replicas(cluster.proc.pid, shard)
            assert len(pids) == 2, (pids, sorted(_titles(cluster.proc.pid).values()))
            os.kill(pids[0], signal.SIGKILL)  # kill -9 of the replica's process, mid-load
            killed.append(pids[0])
            time.sleep(4)
            deadline = time.time() + 180  # Serve starts a replacement: wait for two live replicas again
            while len(now := _replicas(cluster.proc.pid, shard)) < 2 or pids[0] in now:
                assert time.time() < deadline, f"shard {shard} was not given a new replica"
                time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(180)
    assert not errors, errors[:5]
    assert len(killed) == 3 and len(written) >= 3 and all(ok for _, ok in seen)
    gens = [g for g, _ in seen]
    assert gens == sorted(gens)  # the writer's own reads see its generations in order


def test_a_taken_port_is_a_clear_error_before_any_cluster_starts(tmp_path):
    """`serve --engine ray --port P` where P is taken: exit status 1 and a message naming --port,
    at once (Ray Serve's proxy failed ~20 s later, after the cluster started, with a traceback)."""
    from click.testing import CliRunner

    from semsearch.cli import main

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t = time.monotonic()
        res = CliRunner().invoke(main, ["serve", "--index", str(tmp_path), "--engine", "ray", "--port", str(port)])
    assert res.exit_code == 1 and f"--port {port}: cannot listen on 127.0.0.1:{port}" in res.output, res.output
    assert "Traceback" not in res.output and time.monotonic() - t < 30 and not ray.is_initialized()


def test_a_shard_without_live_replicas_is_a_clear_error(monkeypatch):
    """The fan-out retries a call whose replica died, then gives up naming the shard: never a
    partial answer."""
    import ray.exceptions

    from semsearch import serve_ray

    monkeypatch.setattr(serve_ray, "RETRY_WAIT_S", 0.01)

    class Dead:
        def result(self, timeout_s=None):
            raise ray.exceptions.RayActorError()

    class Alive:
        def result(self, timeout_s=None):
            return "ok"

    class Handle:
        def __init__(self, responses):
            self.responses = list(responses)
            outer = self

            class _Call:
                def remote(self, *args):
                    return outer.responses.pop(0) if outer.responses else Dead()

            self.call = _Call()

    fanout = serve_ray.ray_fanout([Handle([Alive()]), Handle([Dead(), Dead(), Alive()])])
    assert fanout("generation") == ["ok", "ok"]  # the second shard's call went to a live replica on the third try
    fanout = serve_ray.ray_fanout([Handle([Alive()]), Handle([])])
    with pytest.raises(serve_ray.ShardUnavailable, match="shard 1 of 2"):
        fanout("generation")


def descendants(pid: int) -> set[int]:
    """pid and every process below it (from /proc/*/stat)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parent[int(d.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    out, frontier = {pid}, [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in out]
        out.update(kids)
        frontier += kids
    return out


def listening(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket these processes hold."""
    inodes: set[str] = set()
    for p in pids:
        try:
            for fd in Path(f"/proc/{p}/fd").iterdir():
                with_target = os.readlink(fd) if fd.is_symlink() else ""
                if with_target.startswith("socket:["):
                    inodes.add(with_target[8:-1])
        except OSError:
            continue  # a process that ended meanwhile
    out = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                raw, port = f[1].split(":")
                addr = socket.inet_ntop(socket.AF_INET if width == 4 else socket.AF_INET6,
                                        b"".join(bytes.fromhex(raw[i : i + 8])[::-1] for i in range(0, len(raw), 8)))
                out.append((addr, int(port, 16)))
    return out


def test_served_by_the_cli_answers_as_one_process_survives_killed_replicas_and_stays_on_loopback(cluster):
    """One test over the one server (a module fixture used by several tests is set up again where
    pytest-xdist's queue runs dry between them, and a second Ray Serve start costs ~50 s): the
    same answers as one process, then replicas killed under load, then the network and SIGTERM
    checks, which stop the server."""
    three_shards_answer_as_one_process(cluster)
    killing_a_replica_of_each_shard_under_load_loses_nothing(cluster)
    listens_on_loopback_only_and_stops_on_sigterm(cluster)


def listens_on_loopback_only_and_stops_on_sigterm(cluster):
    """Every TCP port of the server's process tree (the driver, GCS, raylet, workers, replicas and
    the HTTP proxy) is on loopback, where a cluster started as before listened on all interfaces
    and the node's address (16 sockets); SIGTERM stops it cleanly: exit status 0, no stack dump,
    no process of the tree left."""
    proc, log = cluster.proc, cluster.log
    tree = descendants(proc.pid)
    ports = listening(tree)
    assert len(tree) > 3 and len(ports) > 3, (tree, ports)
    wide = [(a, p) for a, p in ports if not (a.startswith(("127.", "::ffff:127.")) or a == "::1")]
    assert not wide, f"listening beyond loopback: {wide}"

    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=120)
    out = log.read_text()
    assert rc == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    deadline = time.monotonic() + 30
    while True:  # Ray's own processes finish their exit
        left = [p for p in tree - {proc.pid} if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().split(") ")[1][0] != "Z"]
        if not left:
            break
        assert time.monotonic() < deadline, f"processes left after SIGTERM: {left}"
        time.sleep(1)
