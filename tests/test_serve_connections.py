"""What the HTTP server holds open for a client (semsearch.exposure.server_config): a request
whose headers or body do not arrive in time gets a 408 and its connection closes, idle sockets
included; a client that behaves is answered, kept-alive connections too; past max_connections a
request gets a 503 (real uvicorn on loopback, raw sockets; FakeEncoder, real FAISS and SQLite)."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from semsearch.exposure import server_config  # noqa: E402
from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.serve import create_app  # noqa: E402
from semsearch.service import Service  # noqa: E402

from conftest import FakeEncoder  # noqa: E402

HEADER_S, BODY_S = 1.0, 1.5


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("conn")
    (root / "c").mkdir()
    (root / "c" / "a.txt").write_text("kelp forests grow fast in cold water")
    index_corpus(root / "c", root / "idx", FakeEncoder(), progress=False)
    return create_app(Service(root / "idx", device="cpu", encoder=FakeEncoder()))


@contextmanager
def served(app, max_connections: int = 1000):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, "warning", header_timeout=HEADER_S, body_timeout=BODY_S,
                                          max_connections=max_connections))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline and t.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        t.join(10)


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    return s


def read_all(s: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (time.monotonic)."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out, time.monotonic()


def test_idle_and_slow_requests_get_a_408_and_are_closed(app):
    with served(app) as port:
        t0 = time.monotonic()
        idle = connect(port)  # sends nothing at all
        got, closed = read_all(idle)
        assert got.startswith(b"HTTP/1.1 408") and b"request headers" in got, got
        assert HEADER_S * 0.8 <= closed - t0 < HEADER_S + 10

        slow = connect(port)  # headers a few bytes at a time, never finished
        t0 = time.monotonic()
        for part in (b"GET /health HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n", b"X-A: 1\r\n", b"X-B: 2\r\n"):
            try:
                slow.sendall(part)
            except OSError:
                break
            time.sleep(0.4)
        got, closed = read_all(slow)
        assert got.startswith(b"HTTP/1.1 408"), got
        assert closed - t0 < HEADER_S + 10

        body = connect(port)  # headers whole, then 10 of the 100 bytes of the body it announced
        body.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"query\":")
        t0 = time.monotonic()
        got, closed = read_all(body)
        assert got.startswith(b"HTTP/1.1 408") and b"request body" in got, got
        assert BODY_S * 0.8 <= closed - t0 < BODY_S + 10


def test_clients_that_behave_are_answered_and_kept_alive(app):
    with served(app) as port:
        s = connect(port)
        for i in range(3):  # one kept-alive connection, each request within the header deadline
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                got += s.recv(65536)
            assert got.startswith(b"HTTP/1.1 200"), got
            time.sleep(HEADER_S * 0.5)
        # a whole request sent slowly but within the deadlines is answered
        s.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n")
        time.sleep(BODY_S * 0.5)
        s.sendall(b'{"query": "kelp"}')
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200") and b"kelp" in got, got[:300]
        s.close()


def test_past_max_connections_a_request_gets_a_503(app):
    with served(app, max_connections=4) as port:
        held = [connect(port) for _ in range(4)]
        time.sleep(0.2)
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        got, _ = read_all(s)
        assert got.startswith(b"HTTP/1.1 503"), got
        for h in held:
            h.close()
        time.sleep(0.3)
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        got, _ = read_all(s)
        assert got.startswith(b"HTTP/1.1 200"), got


def test_the_cli_passes_the_connection_bounds_to_the_server(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import semsearch.serve
    from semsearch.cli import main

    got = []
    monkeypatch.setattr(semsearch.serve, "serve", lambda index, host, port, device, limits, *a, **kw: got.append(limits))
    r = CliRunner().invoke(main, ["serve", "--index", str(tmp_path), "--header-timeout", "3", "--body-timeout", "7.5",
                                  "--max-connections", "12"])
    assert r.exit_code == 0, r.output
    assert (got[-1].header_timeout, got[-1].body_timeout, got[-1].max_connections) == (3.0, 7.5, 12)


def test_an_absolute_form_target_is_checked_as_its_host(app):
    """`GET http://evil.example/info`: the target's authority is the request's host (RFC 9112
    3.2.2), so the Host check refuses it whatever the Host header says."""
    pytest.importorskip("httptools")  # uvicorn's parser where installed; its pure-Python one answers 404 to such a target
    with served(app) as port:
        for target, ok in ((b"http://evil.example/health", False), (b"http://127.0.0.1:%d/health" % port, True),
                           (b"/health", True)):
            s = connect(port)
            s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            got, _ = read_all(s)
            assert got.startswith(b"HTTP/1.1 200") == ok, (target, got[:200])
