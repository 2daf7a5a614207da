"""Fetch a public BEIR dataset, verify it against its published checksum, and unpack it.

    python scripts/fetch_dataset.py                       # FiQA-2018 into data/beir/fiqa (git-ignored)
    python scripts/fetch_dataset.py fiqa --out DIR        # elsewhere
    python scripts/fetch_dataset.py fiqa --archive fiqa.zip   # a copy of the archive you already have
    python scripts/fetch_dataset.py fiqa --offline        # never download: reuse or fail
    python scripts/fetch_dataset.py NAME --md5 HEX        # another BEIR archive, with its published md5

The archive is the one the BEIR benchmark publishes (<url>/<name>.zip); its MD5 is the one the
BEIR README lists beside the download link (also examples/dataset/md5.csv in the beir
repository). A mismatch is refused: nothing is unpacked, and a download that fails the check is
deleted. The archive is kept beside the folder (data/beir/<name>.zip by default), so a second
run, or a run without network, verifies it and reuses it; a folder already unpacked from the same
archive is checked file by file against the hashes recorded when it was unpacked
(<out>/.fetch.json) and reused.

Files are unpacked byte for byte (the qrels keep their CRLF line ends): corpus.jsonl,
queries.jsonl, qrels/<split>.tsv, the layout `semsearch eval` and `semsearch train --beir` read.
The last lines printed say what was written: documents, queries, and for each split its judged
queries, judgements, and references to documents or queries that are missing.

FiQA-2018 (financial opinion question answering: StackExchange and Reddit posts) has train, dev
and test splits: 57,638 documents, 6,648 queries (5,500 train, 500 dev, 648 test).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets"
MD5_SOURCE = "the BEIR README's dataset table (github.com/beir-cellar/beir; also examples/dataset/md5.csv)"

# Public BEIR datasets with a train split and a published archive MD5.
DATASETS = {
    "fiqa": {
        "md5": "17918ed23cd04fb15047f73e6c3bd9d9",
        "about": "FiQA-2018: financial opinion QA (StackExchange/Reddit), train/dev/test",
        "expect": {"docs": 57638, "queries": 6648, "splits": {"train": 5500, "dev": 500, "test": 648}},
    },
    "scifact": {
        "md5": "5f7d1de60b170fc8027bb7898e2efca1",
        "about": "SciFact: scientific claim verification, train/test",
        "expect": {"docs": 5183, "queries": 1109, "splits": {"train": 809, "test": 300}},
    },
}
MANIFEST = ".fetch.json"
KEEP = ("corpus.jsonl", "queries.jsonl")  # plus qrels/*.tsv


class Refused(Exception):
    """Something the user must act on; printed without a traceback."""


def file_hashes(path: Path) -> tuple[str, str, int]:
    md5, sha = hashlib.md5(), hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            md5.update(block)
            sha.update(block)
            size += len(block)
    return md5.hexdigest(), sha.hexdigest(), size


def download(url: str, dest: Path, timeout: float) -> None:
    part = dest.with_name(dest.name + ".part")
    print(f"downloading {url}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            done, last = 0, 0.0
            for block in iter(lambda: resp.read(1 << 20), b""):
                out.write(block)
                done += len(block)
                if sys.stderr.isatty() and time.monotonic() - last > 0.5:
                    last = time.monotonic()
                    pct = f" ({100 * done / total:.0f}%)" if total else ""
                    print(f"\r  {done / 1e6:.1f} MB{pct}", end="", file=sys.stderr)
        if sys.stderr.isatty():
            print(file=sys.stderr)
    except (urllib.error.URLError, OSError) as e:
        part.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise Refused(f"could not download {url}: {reason}\n"
                      f"  get the archive some other way and pass it with --archive ZIP "
                      f"(or put it at {dest}); it is verified all the same") from e
    part.replace(dest)


def verify(archive: Path, md5: str, downloaded: bool, published: bool) -> tuple[str, int]:
    got_md5, sha, size = file_hashes(archive)
    if got_md5 != md5:
        note = ""
        if downloaded:
            archive.unlink()
            note = " (the download was deleted)"
        raise Refused(f"checksum mismatch for {archive}{note}:\n"
                      f"  expected md5 {md5}\n  got      md5 {got_md5} ({size:,} bytes)\n"
                      f"  refusing to unpack it: the archive is damaged, truncated, or not the published one")
    print(f"verified {archive.name}: md5 {got_md5} ({'published' if published else 'as given by --md5'}), sha256 {sha}, {size:,} bytes", file=sys.stderr)
    return sha, size


def members(zf: zipfile.ZipFile, name: str) -> dict[str, zipfile.ZipInfo]:
    """{relative path in the dataset folder: member} for the files a BEIR folder needs."""
    wanted: dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        if info.is_dir():
            continue
        parts = Path(info.filename).parts
        if info.filename.startswith(("/", "\\")) or ".." in parts:
            raise Refused(f"unsafe path in archive: {info.filename!r}")
        if parts and parts[0] == name:
            parts = parts[1:]
        rel = "/".join(parts)
        if rel in KEEP or (len(parts) == 2 and parts[0] == "qrels" and parts[1].endswith(".tsv")):
            wanted[rel] = info
    missing = [f for f in KEEP if f not in wanted]
    if missing or not any(r.startswith("qrels/") for r in wanted):
        raise Refused(f"the archive does not hold a BEIR folder: missing {', '.join(missing) or 'qrels/*.tsv'}")
    return wanted


def unpack(archive: Path, name: str, out: Path, record: dict) -> None:
    if out.exists() and not (out / MANIFEST).is_file() and (not out.is_dir() or any(out.iterdir())):
        raise Refused(f"{out} exists and was not written by this script: choose another --out, or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    try:
        files = {}
        with zipfile.ZipFile(archive) as zf:
            for rel, info in sorted(members(zf, name).items()):
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(dest, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                _, sha, size = file_hashes(dest)
                files[rel] = {"sha256": sha, "bytes": size}
        (tmp / MANIFEST).write_text(json.dumps({**record, "files": files}, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def unpacked_matches(out: Path, md5: str) -> bool:
    """True if `out` was unpacked from the archive with this md5 and no file changed since."""
    try:
        record = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if record.get("archive_md5") != md5:
        return False
    for rel, meta in record.get("files", {}).items():
        p = out / rel
        if not p.is_file() or p.stat().st_size != meta["bytes"] or file_hashes(p)[1] != meta["sha256"]:
            print(f"{p} differs from the archive: unpacking again", file=sys.stderr)
            return False
    return bool(record.get("files"))


def read_ids(path: Path) -> list[str]:
    ids = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    ids.append(str(json.loads(line)["_id"]))
                except (ValueError, KeyError) as e:
                    raise Refused(f"{path}:{lineno}: not a BEIR record with an '_id'") from e
    return ids


def count(out: Path) -> dict:
    docs = read_ids(out / "corpus.jsonl")
    queries = read_ids(out / "queries.jsonl")
    doc_set, query_set = set(docs), set(queries)
    splits = {}
    for tsv in sorted((out / "qrels").glob("*.tsv")):
        judged: dict[str, int] = {}
        pairs = 0
        with open(tsv, encoding="utf-8-sig", newline="") as fh:
            for lineno, line in enumerate(fh, 1):
                parts = line.rstrip("\r\n").split("\t")
                if not line.strip() or (lineno == 1 and not parts[-1].strip().lstrip("-").isdigit()):
                    continue
                if len(parts) == 4:
                    parts = [parts[0], parts[2], parts[3]]
                q, d = parts[0].strip(), parts[1].strip()
                pairs += 1
                judged.setdefault(q, 0)
                if d not in doc_set:
                    judged[q] += 1
        splits[tsv.stem] = {
            "queries": len(judged),
            "qrels": pairs,
            "queries_without_text": sum(q not in query_set for q in judged),
            "judgements_on_missing_docs": sum(judged.values()),
            "crlf": b"\r\n" in tsv.read_bytes()[:4096],
        }
    return {"docs": len(docs), "unique_docs": len(doc_set), "queries": len(queries), "splits": splits}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", nargs="?", default="fiqa",
                    help="BEIR dataset name: " + ", ".join(f"{k} ({v['about']})" for k, v in DATASETS.items())
                    + "; another BEIR name needs --md5 (default: fiqa)")
    ap.add_argument("--out", type=Path, help="dataset folder to write (default: data/beir/NAME in this repository, git-ignored)")
    ap.add_argument("--archive", type=Path,
                    help="use this copy of NAME.zip instead of downloading (default: OUT/../NAME.zip, downloaded if absent)")
    ap.add_argument("--url", help=f"where to download the archive (default: {BEIR_URL}/NAME.zip)")
    ap.add_argument("--md5", help="expected archive MD5 (default: the published one for NAME)")
    ap.add_argument("--offline", action="store_true", help="never download: verify and reuse what is here, else fail")
    ap.add_argument("--timeout", type=float, default=60.0, help="network timeout in seconds (default: 60)")
    ap.add_argument("--force", action="store_true", help="unpack again even if OUT already matches the archive")
    ap.add_argument("--json", action="store_true", help="print the counts as JSON on stdout")
    args = ap.parse_args(argv)

    name = args.name
    known = DATASETS.get(name)
    md5 = (args.md5 or (known or {}).get("md5") or "").lower()
    if not md5:
        ap.error(f"no published checksum known for {name!r}: pass its MD5 with --md5 (known: {', '.join(DATASETS)})")
    out = (args.out or REPO / "data" / "beir" / name).resolve()
    archive = (args.archive or out.parent / f"{name}.zip").resolve()
    url = args.url or f"{BEIR_URL}/{name}.zip"

    try:
        downloaded = False
        if not archive.is_file():
            if args.archive:
                raise Refused(f"{archive} not found")
            if args.offline:
                raise Refused(f"--offline and no archive at {archive}: get {url} there, or pass --archive ZIP")
            archive.parent.mkdir(parents=True, exist_ok=True)
            download(url, archive, args.timeout)
            downloaded = True
        sha, size = verify(archive, md5, downloaded, published=md5 == (known or {}).get("md5"))
        if not args.force and unpacked_matches(out, md5):
            print(f"{out} already unpacked from this archive: reused", file=sys.stderr)
        else:
            record = {"dataset": name, "source": url if downloaded else str(archive.name), "archive_md5": md5,
                      "archive_sha256": sha, "archive_bytes": size,
                      "md5_from": MD5_SOURCE if md5 == (known or {}).get("md5") else "--md5"}
            unpack(archive, name, out, record)
            print(f"unpacked into {out}", file=sys.stderr)
        counts = count(out)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    report = {"dataset": name, "folder": str(out), "archive": str(archive), "archive_md5": md5, "archive_sha256": sha, **counts}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{name}: {out}")
        print(f"  corpus.jsonl   {counts['docs']:>8,} documents" + (f" ({counts['unique_docs']:,} distinct ids)" if counts["unique_docs"] != counts["docs"] else ""))
        print(f"  queries.jsonl  {counts['queries']:>8,} queries")
        for split, s in counts["splits"].items():
            extra = []
            if s["queries_without_text"]:
                extra.append(f"{s['queries_without_text']} without a query text")
            if s["judgements_on_missing_docs"]:
                extra.append(f"{s['judgements_on_missing_docs']} on documents not in the corpus")
            print(f"  qrels/{split + '.tsv':<9}{s['queries']:>8,} quer{'y' if s['queries'] == 1 else 'ies'}, {s['qrels']:,} judgements"
                  + (f" ({'; '.join(extra)})" if extra else ""))
    expect = (known or {}).get("expect") if not args.md5 or args.md5.lower() == (known or {}).get("md5") else None
    if expect:
        got = {"docs": counts["docs"], "queries": counts["queries"],
               "splits": {k: v["queries"] for k, v in counts["splits"].items() if k in expect["splits"]}}
        if got != expect:
            print(f"warning: counts differ from the published ones: expected {expect}, got {got}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
