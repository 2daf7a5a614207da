"""How the command line shows results to a person: hit tables, an index's description, the
evaluation report, skipped files. Presentation only: the numbers come from the library."""
from __future__ import annotations

import json
import os
import sys



def skipped_lines(report, shown: int = 50) -> list[str]:
    """What an index run skipped and why, a line each (the first `shown` files by name)."""
    lines = [f"skipped {n} file(s): {reason}" for reason, n in report.skipped.items()]
    lines += [f"  skipped {printable(line)}" for line in report.skipped_files[:shown]]
    if len(report.skipped_files) > shown:
        lines.append(f"  ... and {len(report.skipped_files) - shown} more (--json lists them all)")
    return lines


def table(hits, width: int, explain: bool = False) -> str:
    """Hits as a table: rank, score, source location, a snippet of `width` characters; with
    `explain`, each hit's explanation under its row (colour on a terminal, unless NO_COLOR)."""
    if not hits:
        return "no hits"
    src_w = min(max(len(printable(h.location)) for h in hits), 50)
    lines = [f"{'rank':>4}  {'score':>6}  {'source':<{src_w}}  snippet"]
    for h in hits:
        snippet = " ".join(h.text.split())
        if len(snippet) > width:
            snippet = snippet[: width - 1] + "…"
        loc = printable(h.location)
        loc = loc if len(loc) <= src_w else "…" + loc[-(src_w - 1):]
        lines.append(f"{h.rank:>4}  {h.score:>6.3f}  {loc:<{src_w}}  {snippet}")
        if explain:
            from semsearch.explain import format_explanation

            color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
            lines += ["      " + line for line in format_explanation(h, color=color).splitlines()]
    return "\n".join(lines)


def printable(s: str) -> str:
    """s with control characters (a newline in a file name, say) escaped, so a table stays one line a row."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in s)


def info_rows(folder, m) -> list[tuple[str, object]]:
    last = m.last_run or {}
    rows = [
        ("index", str(folder)),
        ("format version", m.format_version),
        ("model", f"{m.model} (weights {m.model_fingerprint}, {m.backend})"),
        ("pooling", m.pooling + ((f" (trained query layers {m.head['path']})" if m.head.get("kind") == "query-layers" else f" (head {m.head['path']})") if m.head else "")),
        ("vectors", f"{m.dim}-d, {m.metric} (L2-normalised, inner product), index type {m.index.get('type')}"
                    + (f", built on {m.index['built_on']}" if m.index.get("built_on") else "")),
        ("max length", f"{m.max_length} tokens; chunks of {m.chunking['window']} tokens, overlap {m.chunking['overlap']}"
                       + ("; page and section titles searched with their chunks" if m.chunking.get("context")
                          else "; page and section titles not searched (built before they were: --rebuild adds them)")),
        ("precision", m.precision),
        ("holds", f"{m.counts['files']} files, {m.counts['documents']} documents, {m.counts['chunks']} chunks"),
        ("segments", _segments(m)),
        ("created", m.created),
        ("updated", m.updated),
        ("last run", f"{last.get('added', 0)} added, {last.get('updated', 0)} updated, {last.get('removed', 0)} removed, "
                     f"{last.get('unchanged', 0)} unchanged; {last.get('chunks', 0)} chunks in {last.get('seconds', 0):.1f} s"),
    ]
    # Imported here: `semsearch --help` and other commands do not load faiss and numpy for it.
    from semsearch.api import search_modes
    from semsearch.store.faiss_info import describe, faiss_build

    rows.append(("search modes", search_modes(folder, m)))
    rows.append(("faiss", describe(faiss_build())))  # the faiss loaded here, not the one the index was built with
    if m.index.get("params"):
        rows.append(("index params", json.dumps(m.index["params"])))
    if m.index.get("recall"):
        r = m.index["recall"]
        low = f" (at least {r['lower']:.3f}, one-sided 95%)" if "lower" in r else ""
        rows.append(("index recall", f"{r['recall']:.3f} recall@{r['k']}{low} against exact search on {r['queries']} queries "
                                     f"(target {r['target']}{', ' + r['knob'] + '=' + str(r['value']) if 'knob' in r else ''}"
                                     f"{', k_factor=' + str(r['k_factor']) if 'k_factor' in r else ''})"))
    return rows


def _segments(m) -> str:
    """'3 (100000, 1002, 6 live chunks; 12 deleted, not yet merged away)'."""
    live = [e["live"] for e in m.segments]
    dead = sum(e["rows"] - e["live"] for e in m.segments)
    shown = ", ".join(map(str, live[:8])) + (", ..." if len(live) > 8 else "")
    older = sum(1 for e in m.segments if not e.get("vecs") and e["rows"])
    shards = int(getattr(m, "shards", 1) or 1)
    if shards > 1:  # partitioned by document (store/partition.py): compact leaves one segment a partition
        per = [sum(e["live"] for e in m.segments if e.get("part") == p) for p in range(shards)]
        shares = ", ".join(f"{100 * x / max(sum(live), 1):.0f}%" for x in per)
        merge = (f"; in {shards} partitions by document ({shares} of the chunks; `serve --shards {shards}` gives each "
                 "shard one)" + ("; `semsearch compact` merges each partition's" if len(live) > shards else ""))
    else:
        merge = "; `semsearch compact` merges them" if len(live) > 1 else "; `semsearch compact` rewrites it" if older else ""
    return (f"{len(live)} ({shown} live chunks" + (f"; {dead} deleted, not yet merged away" if dead else "") + ")"
            + (f"; {older} written before format 4 (a second copy of their vectors in their docstores)" if older else "")
            + merge)


def eval_report(report: dict) -> str:
    """An evaluation report (semsearch.evaluate's) as text: settings, then a table of figures."""
    from semsearch import eval as ev

    out: list[str] = []
    rows = [r for r in report.get("results", ()) if "spearman" not in r]  # pair rows: below
    pair_rows = [r for r in report.get("results", ()) if "spearman" in r]
    if rows:
        s = report["settings"]
        out.append(f"{report['dataset']} ({report['split']}): {s['queries']} queries, {s['documents']} documents; "
                   f"model {s['model']} ({s['model_fingerprint']}), {s['precision']}, max length {s['max_length']}")
        if s.get("zero_queries"):
            out.append(f"{s['zero_queries']} of those queries are judged only on documents missing from the corpus: they count as 0")
        if s.get("fusion"):
            out.append(f"hybrid: {s['fusion']} fusion" + (f", alpha {s['alpha']}" if s.get("alpha") is not None else "")
                       + f", top {s['depth']} of each side")
        out.append(ev.format_table(rows))
        out.append("time: " + ", ".join(f"{k} {v}" for k, v in report["seconds"].items()))
    if pair_rows:
        out.append(f"pairs: {report['pairs_file']}")
        out.append(ev.format_table(pair_rows))
    return "\n".join(out)
