"""`semsearch watch` / semsearch.watch.Watcher: catch-up, one generation a batch, ignored events,
failed batches, a vanished folder or index, and a kill in the middle of a batch."""
from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import REPO, FakeEncoder
from semsearch.cli import main
from semsearch.indexing import index_corpus
from semsearch.search import Retriever
from semsearch.store import Manifest, writer_lock
from semsearch.store.folder import open_index, verify
from semsearch.watch import Watcher, WatchStopped, _Rules

DEBOUNCE_MS = 200
DEADLINE = 45.0  # generous: a loaded 2-core machine


def until(cond, what: str, deadline: float = DEADLINE) -> float:
    """Seconds until cond() holds, polled; fails after `deadline` s."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - t0


@contextmanager
def watching(corpus: Path, index: Path, **kw):
    lines: list[str] = []
    kw.setdefault("encoder", FakeEncoder())
    kw.setdefault("debounce_ms", DEBOUNCE_MS)
    w = Watcher(corpus, index, log=lines.append, **kw)
    w.lines = lines
    w.start()
    try:
        assert w.ready.wait(DEADLINE), "no catch-up"
        yield w
    finally:
        w.stop()


def settled(w: Watcher, quiet: float = 1.5) -> int:
    """w.batches once no batch has run for `quiet` s; fails after DEADLINE s of batches."""
    t0, last, since = time.monotonic(), w.batches, time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() - t0 > DEADLINE:
            raise AssertionError(f"batches never stopped: {w.lines[-5:]}")
        time.sleep(0.05)
        if w.batches != last:
            last, since = w.batches, time.monotonic()
    return last


def names(r: Retriever, query: str = "alpha bravo charlie delta echo") -> set[str]:
    return {Path(h.path).name for h in r.search(query, k=100, mode="lexical")}


def indexed(index: Path) -> set[str]:
    _, _, docs = open_index(index)
    try:
        return {Path(p).name for p in docs.files()}
    finally:
        docs.close()


def generation(index: Path) -> int:
    return Manifest.load(index).generation


# ---- which events start work -----------------------------------------------------------------
def test_rules_take_what_the_walk_takes(tmp_path):
    from watchfiles import Change

    root = tmp_path / "c"
    (root / "sub").mkdir(parents=True)
    (root / "build").mkdir()
    (root / ".semsearchignore").write_text("build/\n*.log.md\n")
    rules = _Rules(root.resolve(), root / "idx", include=(), exclude=["drafts/"])
    rules.dirs = {"gone"}
    r = root.resolve()
    take = lambda p, c=Change.added: rules(c, str(r / p))  # noqa: E731
    assert take("a.txt") and take("sub/b.md", Change.modified) and take("sub/c.pdf", Change.deleted)
    assert take(".semsearchignore", Change.modified)  # new rules: walk again
    assert not take(".a.txt.swp") and not take("sub/.#b.md") and not take("a.txt~") and not take("#a.txt#")
    assert not take("4913") and not take("a.bin") and not take(".git/index")
    assert not take("build/x.txt") and not take("x.log.md") and not take("drafts/y.txt")  # ignore file, --exclude
    assert not take("idx/manifest.json", Change.modified) and not take("idx/docs.3.sqlite")  # the index inside
    assert take("sub", Change.added) and not take("sub", Change.modified)  # a folder moved in; a listing change
    assert take("gone", Change.deleted) and not take("never-seen", Change.deleted)
    assert rules(Change.deleted, str(r)) and not rules(Change.modified, str(r))
    only_md = _Rules(r, tmp_path / "elsewhere", include=["*.md"], exclude=())
    assert only_md(Change.added, str(r / "sub/b.md")) and not only_md(Change.added, str(r / "a.txt"))


# ---- changes reflected in search ---------------------------------------------------------------
def test_create_edit_rename_delete_reach_search(tmp_path):
    corpus = tmp_path / "notes"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha words about banks\n")
    index = corpus / ".." / "notes" / "idx"  # inside the watched folder: its writes must start no work
    with watching(corpus, index) as w:
        assert w.lines[0].startswith("catch-up: 1 added")
        r = Retriever.load(index, encoder=FakeEncoder())
        lat = []
        (corpus / "b.md").write_text("# B\nbravo words about soup\n")
        lat.append(until(lambda: "b.md" in names(r), "a created file"))
        (corpus / "a.txt").write_text("charlie words instead\n")
        lat.append(until(lambda: names(r, "charlie") == {"a.txt"} and "a.txt" not in names(r, "alpha"), "an edit"))
        (corpus / "b.md").rename(corpus / "renamed.md")
        lat.append(until(lambda: names(r, "bravo") == {"renamed.md"}, "a rename"))
        (corpus / "a.txt").unlink()
        lat.append(until(lambda: names(r, "charlie") == set(), "a deletion"))
        (corpus / "sub").mkdir()
        (corpus / "sub" / "d.txt").write_text("delta words\n")
        until(lambda: "d.txt" in names(r), "a file in a new folder")
        (corpus / "sub").rename(corpus / "moved")  # a folder renamed: one event for the folder alone
        until(lambda: {Path(h.path).parent.name for h in r.search("delta", k=5, mode="lexical")} == {"moved"}, "a folder rename")
        # Each change is searchable soon after the debounce (the median, so one slow moment of a
        # loaded machine does not fail the test; each one had the generous deadline above).
        assert statistics.median(lat) < DEBOUNCE_MS / 1000 + 2.0, lat
        print(f"change to searchable (create, edit, rename, delete): {', '.join(f'{x:.2f}' for x in lat)} s")
        # The index's own writes inside the folder start no batch. A rename's events may straddle
        # two debounce windows (one late batch that finds nothing to do), so first wait until no
        # batch has run for a while: a watcher that fed on its own writes never gets there.
        batches = settled(w)
        time.sleep(1.5)
        assert w.batches == batches, w.lines
        assert all(line.startswith(("catch-up:", "batch ")) and "generation" in line for line in w.lines), w.lines
        assert w.error is None
        r.close()


def test_ignored_files_start_no_work(tmp_path):
    corpus = tmp_path / "c"
    (corpus / "drafts").mkdir(parents=True)
    (corpus / "a.txt").write_text("alpha\n")
    (corpus / ".semsearchignore").write_text("private/\n")
    with watching(corpus, tmp_path / "idx", exclude=["drafts/"]) as w:
        g = generation(tmp_path / "idx")
        (corpus / ".a.txt.swp").write_text("alpha swap")
        (corpus / "a.txt~").write_text("alpha backup")
        (corpus / "4913").write_text("")
        (corpus / "4913").unlink()
        (corpus / "drafts" / "x.txt").write_text("alpha draft")
        (corpus / "private").mkdir()
        (corpus / "private" / "y.txt").write_text("alpha private")
        (corpus / "image.png").write_bytes(b"\x89PNG\0\0")
        time.sleep(DEBOUNCE_MS / 1000 + 1.5)
        assert w.batches == 0 and generation(tmp_path / "idx") == g, w.lines
        (corpus / "b.txt").write_text("bravo\n")  # and a real one does
        until(lambda: w.batches == 1, "a batch")
        assert indexed(tmp_path / "idx") == {"a.txt", "b.txt"}


def test_burst_of_1000_files_takes_few_generations(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "seed.txt").write_text("alpha\n")
    index = tmp_path / "idx"
    with watching(corpus, index) as w:
        g0 = generation(index)
        for i in range(1000):
            (corpus / f"n{i:04}.md").write_text(f"note {i} bravo\n")
        until(lambda: Manifest.load(index).counts.get("files") == 1001, "1,000 new files")
        gens = generation(index) - g0
        assert 1 <= gens <= 5 and w.batches <= 5, (gens, w.lines)
        assert len(indexed(index)) == 1001
        print(f"1,000 new files: {gens} generation(s), {w.batches} batch(es)")


# ---- catch-up, errors, the writer lock -----------------------------------------------------------
def test_catch_up_on_start(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    for n in "abc":
        (corpus / f"{n}.txt").write_text(f"{n} alpha\n")
    index = tmp_path / "idx"
    index_corpus(corpus, index, FakeEncoder(), progress=False)
    g = generation(index)
    with watching(corpus, index) as w:  # nothing changed: no generation
        assert w.lines[0].startswith("catch-up: index up to date (3 files") and generation(index) == g
    (corpus / "a.txt").unlink()
    (corpus / "b.txt").write_text("b changed while nobody watched\n")
    (corpus / "d.txt").write_text("d new\n")
    with watching(corpus, index) as w:
        assert w.lines[0].startswith("catch-up: 1 added, 1 changed, 1 removed") and generation(index) == g + 1
        assert indexed(index) == {"b.txt", "c.txt", "d.txt"}


def test_a_bad_file_fails_its_batch_and_watching_goes_on(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha\n")
    index = tmp_path / "idx"
    with watching(corpus, index) as w:
        g = generation(index)
        (corpus / "good.txt").write_text("bravo\n")
        (corpus / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
        until(lambda: w.batches >= 1, "the failing batch")
        assert "FAILED, nothing published" in w.lines[-1] and "bad.jsonl" in w.lines[-1], w.lines
        assert generation(index) == g and indexed(index) == {"a.txt"}  # the batch is atomic: nothing of it
        (corpus / "bad.jsonl").write_text('{"text": "fixed charlie"}\n')
        until(lambda: indexed(index) == {"a.txt", "good.txt", "bad.jsonl"}, "the batch after the fix")
        assert w.error is None and w.running
    with watching(corpus, index, skip_errors=True) as w:
        (corpus / "bad.jsonl").write_text('{"text": "echo kept"}\n{"text": broken\n')  # the bad line is skipped
        until(lambda: w.batches >= 1, "a batch")
        assert "1 changed" in w.lines[-1], w.lines
        r = Retriever.load(index, encoder=FakeEncoder())
        assert names(r, "echo") == {"bad.jsonl"} and names(r, "charlie") == set()
        r.close()


def test_batches_queue_behind_other_writers_of_the_process(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha\n")
    index = tmp_path / "idx"
    with watching(corpus, index) as w:
        with writer_lock(index):  # as a server's upsert would hold it
            (corpus / "b.txt").write_text("bravo\n")
            time.sleep(DEBOUNCE_MS / 1000 + 1.0)
            assert indexed(index) == {"a.txt"}
        until(lambda: indexed(index) == {"a.txt", "b.txt"}, "the queued batch")
        assert not any("FAILED" in line or "locked" in line for line in w.lines), w.lines


def test_polling(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha\n")
    index = tmp_path / "idx"
    with watching(corpus, index, poll=True, poll_ms=100) as w:
        (corpus / "b.txt").write_text("bravo\n")
        until(lambda: indexed(index) == {"a.txt", "b.txt"}, "a polled change")
        (corpus / "a.txt").unlink()
        until(lambda: indexed(index) == {"b.txt"}, "a polled deletion")
        assert w.error is None


@pytest.mark.parametrize("gone", ["folder", "index"])
def test_folder_or_index_removed_stops_with_a_message(tmp_path, gone):
    import shutil

    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha\n")
    index = tmp_path / "idx"
    with watching(corpus, index) as w:
        shutil.rmtree(corpus if gone == "folder" else index)
        until(lambda: not w.running, "the watcher to stop")
        assert isinstance(w.error, WatchStopped)
        assert ("no longer exists" if gone == "folder" else "was removed while watching") in w.lines[-1]
    if gone == "folder":
        assert indexed(index) == {"a.txt"}  # what was published stays


def test_run_blocks_until_stopped(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha\n")
    stop = threading.Event()
    w = Watcher(corpus, tmp_path / "idx", encoder=FakeEncoder(), log=lambda _: None)
    t = threading.Thread(target=w.run, args=(stop,))
    t.start()
    assert w.ready.wait(DEADLINE)
    stop.set()
    t.join(DEADLINE)
    assert not t.is_alive()
    with pytest.raises(Exception, match="is not a folder"):
        Watcher(corpus / "a.txt", tmp_path / "idx", encoder=FakeEncoder())


# ---- the command -----------------------------------------------------------------------------------
def test_cli_help_explains_the_options():
    out = CliRunner().invoke(main, ["watch", "--help"])
    assert out.exit_code == 0
    for opt in ("--index", "--include", "--exclude", "--debounce", "--max-wait", "--poll", "--skip-errors", "--checksum",
                "Quiet time that ends a batch", "file-system events", "one atomic generation"):
        assert opt in out.output, opt
    assert "watch" in CliRunner().invoke(main, ["--help"]).output


def test_cli_missing_folder_is_one_line():
    out = CliRunner().invoke(main, ["watch", "no/such/folder"])
    assert out.exit_code == 1 and "does not exist" in out.output


WORDS = ("loan bank credit river soup lentil comet meteor protein sleep muscle garden tomato harbor ship engine "
         "violin concert glacier desert falcon copper silicon ledger invoice tariff marble chapel lantern").split()


def _essay(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + ".\n"


def _sigint_ignored() -> bool:
    """Whether this process ignores SIGINT (a test run started in the background of a script):
    its children inherit that, and Python then leaves Ctrl-C ignored in them too."""
    status = Path("/proc/self/status")
    if not status.exists():
        return False
    ign = next((ln.split()[1] for ln in status.read_text().splitlines() if ln.startswith("SigIgn:")), "0")
    return bool(int(ign, 16) >> (signal.SIGINT - 1) & 1)


# Ctrl-C where a child can receive it; else SIGTERM, which the command takes the same way
_CTRL_C = signal.SIGTERM if _sigint_ignored() else signal.SIGINT


class _Proc:
    """A `semsearch watch` child: its stdout and stderr lines, gathered by threads."""

    def __init__(self, *args: str):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
        script = Path(sys.executable).with_name("semsearch")  # the installed command, else the module
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "semsearch.cli"]
        self.p = subprocess.Popen([*cmd, "-v", "watch", *args], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, into in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=lambda s=stream, i=into: [i.append(line.rstrip("\n")) for line in s], daemon=True).start()

    def stop(self, sig=signal.SIGINT) -> int:
        """Send sig and wait for the exit status; a child that does not end in time has its
        threads' stacks (faulthandler, on SIGABRT) and its last lines put in the failure."""
        self.p.send_signal(sig)
        try:
            return self.p.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{self.p.pid}/status")
            sigs = [ln for ln in status.read_text().splitlines() if ln.startswith("Sig")] if status.exists() else []
            self.p.send_signal(signal.SIGABRT)
            self.p.wait(DEADLINE)
            time.sleep(1)
            raise AssertionError(f"no exit {DEADLINE} s after {sig!r}: {sigs}\n" + "\n".join(self.out[-10:] + self.err[-80:]))

    def wait_line(self, lines: list[str], text: str, after: int = 0) -> int:
        until(lambda: any(text in line for line in lines[after:]) or self.p.poll() is not None, f"{text!r}", 120)
        assert any(text in line for line in lines[after:]), (self.out, self.err[-20:])
        return len(lines)


def test_cli_sigterm_stops_watching_as_ctrl_c_does(tmp_path):
    """kill, systemd and docker stop send SIGTERM: the command says it stopped and exits 0,
    with what it published intact."""
    corpus, index = tmp_path / "notes", tmp_path / "idx"
    corpus.mkdir()
    (corpus / "bank.txt").write_text("The bank approved the loan after checking the credit score.\n")
    w = _Proc(str(corpus), "--index", str(index), "--device", "cpu", "--precision", "fp32")
    try:
        w.wait_line(w.out, "catch-up: 1 added")
        assert w.stop(signal.SIGTERM) == 0
        until(lambda: any("stopped watching" in line for line in w.err), "the goodbye line", 5)
    finally:
        if w.p.poll() is None:
            w.p.kill()
    assert verify(index) == [] and indexed(index) == {"bank.txt"}


def test_cli_real_model_kill_mid_batch_then_catch_up(tmp_path):
    """End to end with the bundled model: a line a batch, a search that finds new text by
    meaning, SIGKILL in the middle of a batch (nothing published is lost; the index stays whole),
    and the next start catching up so that the index matches the folder."""
    corpus, index = tmp_path / "notes", tmp_path / "idx"
    corpus.mkdir()
    (corpus / "bank.txt").write_text("The bank approved the loan after checking the credit score.\n")
    (corpus / "soup.md").write_text("# Soup\nSimmer lentils with onion and cumin for twenty minutes.\n")
    args = (str(corpus), "--index", str(index), "--device", "cpu", "--precision", "fp32", "--debounce", str(DEBOUNCE_MS))
    w = _Proc(*args)
    try:
        n = w.wait_line(w.out, "catch-up: 2 added")
        (corpus / "space.txt").write_text("Meteor showers happen when Earth crosses the debris trail of a comet.\n")
        w.wait_line(w.out, "batch 1 (1 change): 1 added", n)
        r = Retriever.load(index, fast_start=True)
        assert Path(r.search("shooting stars in the night sky", k=1, mode="dense")[0].path).name == "space.txt"
        r.close()
        published = generation(index)
        rng = random.Random(0)
        for i in range(40):  # about 3 chunks each: seconds of embedding on a CPU
            (corpus / f"essay{i:02}.txt").write_text(_essay(rng, 600))
        w.wait_line(w.err, "batch 2: updating")
        time.sleep(0.3)
        assert generation(index) == published  # still embedding
        w.p.send_signal(signal.SIGKILL)
        w.p.wait(DEADLINE)
    finally:
        if w.p.poll() is None:
            w.p.kill()
    assert verify(index) == [] and generation(index) == published
    assert indexed(index) == {"bank.txt", "soup.md", "space.txt"}  # nothing published was lost

    w = _Proc(*args)
    try:
        w.wait_line(w.out, "catch-up: 40 added, 0 changed, 0 removed")
        assert indexed(index) == {p.name for p in corpus.iterdir()}
        assert verify(index) == []
        assert w.stop(_CTRL_C) == 0
        until(lambda: any("stopped watching" in line for line in w.err), "the goodbye line", 5)
    finally:
        if w.p.poll() is None:
            w.p.kill()
