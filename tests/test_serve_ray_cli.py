"""`semsearch serve --engine ray --host 127.0.0.1` as a user runs it: the local Ray cluster it
starts listens on loopback only (every TCP port of the driver, GCS, raylet, workers and replicas),
and SIGTERM stops it cleanly: exit status 0, no stack dump, no Ray process left behind."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from conftest import REPO, SAMPLE  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time (pytest -n: one worker)

pytest.importorskip("ray")
if not Path("/proc/net/tcp").exists():
    pytest.skip("reads listening sockets from Linux's /proc", allow_module_level=True)


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


def test_a_loopback_server_keeps_its_ray_cluster_on_loopback_and_stops_on_sigterm(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    cli = [sys.executable, "-m", "semsearch.cli"]
    folder = tmp_path / "index"
    built = subprocess.run(cli + ["index", str(SAMPLE), "--index", str(folder), "--no-progress"], env=env,
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(cli + ["serve", "--index", str(folder), "--engine", "ray", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, Path(log.name).read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, Path(log.name).read_text()[-3000:]
            time.sleep(1)
        r = httpx.post(f"http://127.0.0.1:{port}/search", json={"query": "loan approval", "k": 3}, timeout=120)
        assert r.status_code == 200 and r.json()["hits"], r.text
        tree = descendants(proc.pid)
        ports = listening(tree)
        assert len(tree) > 3 and len(ports) > 3, (tree, ports)  # the GCS, raylet, workers and the HTTP proxy
        wide = [(a, p) for a, p in ports if not (a.startswith(("127.", "::ffff:127.")) or a == "::1")]
        assert not wide, f"listening beyond loopback: {wide}"

        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
        out = Path(log.name).read_text()
        assert rc == 0, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        time.sleep(2)  # Ray's own processes finish their exit
        left = [p for p in tree - {proc.pid} if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().split(") ")[1][0] != "Z"]
        assert not left, f"processes left after SIGTERM: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
