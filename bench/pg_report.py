"""Tables of bench/pg.py's results (markdown): rates, ratios against targets, pickup, dead tuples."""

from __future__ import annotations

import statistics
from typing import Any

LABELS = {
    "minimal.enqueue": ("minimal", "enqueue, one-at-a-time (INSERT per call)"),
    "minimal.enqueue_notify": ("minimal", "enqueue, one-at-a-time, INSERT + NOTIFY per call"),
    "minimal.consume": ("minimal", "consume, batched (claim 50 + complete 50, no-op)"),
    "jobspool.enqueue": ("jobspool", "enqueue, one-at-a-time (spool.enqueue)"),
    "jobspool.enqueue_many": ("jobspool", "enqueue, batched (enqueue_many of 50)"),
    "jobspool.worker": ("jobspool", "consume, batched (Worker batch_size=50, no-op)"),
    "jobspool.raw": ("jobspool", "consume, batched (claim(limit=50) + complete_many)"),
    "jobspool.statement_enqueue": ("jobspool's INSERT, bare psycopg",
                                   "enqueue, one-at-a-time (the statement alone)"),
    "pgqueuer.enqueue": ("pgqueuer", "enqueue, one-at-a-time (Queries.enqueue)"),
}


def _label(key: str) -> tuple[str, str]:
    if key.startswith("pgqueuer.consume."):
        size = key.rsplit(".", 1)[1]
        extra = " (its default)" if size == "10" else ""
        return "pgqueuer", f"consume, batched (batch_size={size}{extra}, no-op)"
    return LABELS.get(key, ("?", key))


def _med(xs: list[float | None]) -> float:
    """Median of the rounds that produced a figure (a failed round is None); NaN if none did."""
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else float("nan")


def _ratio(raw: dict[str, list[float | None]], a: str, b: str) -> float | None:
    if a not in raw or b not in raw:
        return None
    pairs = [x / y for x, y in zip(raw[a], raw[b], strict=False) if x is not None and y]
    return statistics.median(pairs) if pairs else None


def best_pgq(result: dict[str, Any]) -> int | None:
    """The pgqueuer batch size with the best median consume rate."""
    raw = result["raw"]
    sizes = [s for s in result.get("pgq_batches", []) if f"pgqueuer.consume.{s}" in raw]
    return max(sizes, key=lambda s: _med(raw[f"pgqueuer.consume.{s}"])) if sizes else None


def _rates(raw: dict[str, Any]) -> list[str]:
    out = ["| queue | operation | jobs/s (median) | per round |", "|---|---|---:|---|"]
    for key, xs in raw.items():
        if key.startswith("pickup."):
            continue
        q, what = _label(key)
        per = " / ".join("failed" if x is None else f"{x:,.0f}" for x in xs)
        out.append(f"| {q} | {what} | {_med(xs):,.0f} | {per} |")
    return out


def _ratios(result: dict[str, Any]) -> list[str]:
    raw = result["raw"]
    best = best_pgq(result)
    bk = f"pgqueuer.consume.{best}"
    rows: list[tuple[str, str, str, str, float | None]] = [
        ("jobspool / minimal", "enqueue, one-at-a-time", "jobspool.enqueue", "minimal.enqueue", 0.9),
        ("jobspool / minimal", "consume, batched 50 (Worker)", "jobspool.worker",
         "minimal.consume", 0.8),
        ("jobspool / minimal", "consume, batched 50 (claim + complete_many)", "jobspool.raw",
         "minimal.consume", None),
        ("jobspool / pgqueuer-best", f"consume, batched (Worker 50 vs pgqueuer {best})",
         "jobspool.worker", bk, 1.5),
        ("jobspool / pgqueuer-best", f"consume, batched (claim + complete_many 50 vs pgqueuer {best})",
         "jobspool.raw", bk, None),
        ("pgqueuer-default / minimal", "consume, batched (pgqueuer 10 vs minimal 50)",
         "pgqueuer.consume.10", "minimal.consume", None),
        ("pgqueuer-best / minimal", f"consume, batched (pgqueuer {best} vs minimal 50)", bk,
         "minimal.consume", None),
        ("jobspool / minimal+NOTIFY", "enqueue, one-at-a-time", "jobspool.enqueue",
         "minimal.enqueue_notify", None),
        ("minimal+NOTIFY / minimal", "enqueue, one-at-a-time", "minimal.enqueue_notify",
         "minimal.enqueue", None),
        ("jobspool's INSERT / minimal", "enqueue, one-at-a-time (the statement, bare psycopg)",
         "jobspool.statement_enqueue", "minimal.enqueue", None),
        ("jobspool / jobspool's INSERT", "enqueue, one-at-a-time (jobspool's client)",
         "jobspool.enqueue", "jobspool.statement_enqueue", None),
        ("pgqueuer / minimal", "enqueue, one-at-a-time", "pgqueuer.enqueue", "minimal.enqueue", None),
    ]
    out = ["| ratio | operation | measured | target |", "|---|---|---:|---|"]
    for name, what, a, b, target in rows:
        r = _ratio(raw, a, b)
        if r is None:
            continue
        verdict = "" if target is None else f"≥ {target} — {'met' if r >= target else 'NOT met'}"
        out.append(f"| {name} | {what} | {r:.2f}× | {verdict} |")
    return out


def _pct(xs: list[float], p: int) -> float:
    return statistics.quantiles(xs, n=100)[p - 1] if len(xs) > 1 else xs[0]


def _pickup(raw: dict[str, Any]) -> list[str]:
    labels = {"jobspool": "jobspool worker idle in run_forever (LISTEN/NOTIFY)",
              "minimal": "minimal queue: LISTEN connection, claim when notified"}
    out = []
    for q, label in labels.items():
        rounds = [r for r in raw.get(f"pickup.{q}", []) if r]
        if not rounds:
            continue
        for col, what in ((0, "from before the enqueue call"), (1, "from the enqueue's return")):
            xs = sorted(x[col] for r in rounds for x in r)
            p50 = statistics.median(xs)
            per = " / ".join(f"{statistics.median([x[col] for x in r]):.2f}" for r in rounds)
            target = (f"p50 ≤ 3 ms — {'met' if p50 <= 3 else 'NOT met'}"
                      if q == "jobspool" and col == 0 else "")
            out.append(f"| {label}, {what} | {p50:.2f} | {_pct(xs, 95):.2f} | {xs[-1]:.1f} "
                       f"| {len(xs)} | {per} | {target} |")
    if not out:
        return []
    out = ["| one job at a time after a 10-50 ms idle gap | p50 ms | p95 ms | max ms | samples "
           "| p50 per round | target |", "|---|---:|---:|---:|---:|---|---|", *out]
    j, m = raw.get("pickup.jobspool", []), raw.get("pickup.minimal", [])
    pairs = [(a, b) for a, b in zip(j, m, strict=False) if a and b]
    if pairs:
        r = statistics.median(statistics.median(x[0] for x in a) / statistics.median(x[0] for x in b)
                              for a, b in pairs)
        out += ["", f"Pickup p50, jobspool / minimal (median of per-round ratios): {r:.2f}×"]
    return out


def _big(big: dict[str, Any]) -> list[str]:
    series = big["series"]
    end = series[-1]["tables"]
    # Only the tables the run churned (the schema-version and settings tables stay still).
    tables = sorted(t for t, e in end.items() if e["ins"] + e["upd"] + e["del"] > 100)
    head = "| t s | enqueued | completed | " + " | ".join(f"{t} live / dead" for t in tables) + " |"
    out = [f"{big['jobs']:,} jobs enqueued one at a time while a `run_forever` worker "
           f"(batch 50) drained them; {big['completed']:,} completed in {big['seconds']} s; "
           f"server autovacuum_naptime = {big['autovacuum_naptime']}.", "",
           head, "|" + "---:|" * (3 + len(tables))]
    for s in series:
        cells = [f"{s['tables'][t]['live']:,} / {s['tables'][t]['dead']:,}" if t in s["tables"]
                 else "" for t in tables]
        out.append(f"| {s['t']} | {s['enqueued']:,} | {s['completed']:,} | " + " | ".join(cells) + " |")
    out += ["", "| table | max dead | dead at end | live at end | size at end | autovacuums | "
            "updates (HOT) | deletes |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for t in tables:
        mx = max(s["tables"].get(t, {}).get("dead", 0) for s in series)
        e = end.get(t, {})
        if not e:
            continue
        out.append(f"| {t} | {mx:,} | {e['dead']:,} | {e['live']:,} | {e['bytes'] / 2**20:.1f} MiB "
                   f"| {e['autovacuums']} | {e['upd']:,} ({e['hot_upd']:,}) | {e['del']:,} |")
    return out


def render(result: dict[str, Any]) -> str:
    """The whole report as markdown."""
    v, c = result["versions"], result["config"]
    lines = [f"# PostgreSQL store benchmark, {result['started']}", "",
             f"`{result['command']}`", "",
             "PostgreSQL " + v.get("postgresql", "?") + ", psycopg " + v.get("psycopg", "?")
             + (", pgqueuer " + v["pgqueuer"] if "pgqueuer" in v else "")
             + f", jobspool {v.get('jobspool', '?')} ({v.get('commit', '?')}), Python {v.get('python')}; "
             f"{c['jobs']:,} jobs per measurement, {c['rounds']} interleaved "
             f"round{'s' if c['rounds'] != 1 else ''}, payload pad "
             f"{c['pad']} B, one database per queue on one server (fsync on).", "",
             "## Ratios (median of per-round ratios: the headline)", "", *_ratios(result), "",
             "## Rates (jobs/s; absolute numbers drift with the shared machine's load)", "",
             *_rates(result["raw"])]
    pick = _pickup(result["raw"])
    if pick:
        lines += ["", "## Idle pickup (enqueue called → handler starts)", "", *pick]
    if "big" in result:
        lines += ["", "## Dead tuples over a long run (pg_stat_user_tables, jobspool's tables)", "",
                  *_big(result["big"])]
    if result.get("statements"):
        lines += ["", "## Where each database's server time went (pg_stat_statements, all rounds)", "",
                  "| database | calls | total ms | mean ms | rows | statement |",
                  "|---|---:|---:|---:|---:|---|"]
        for q, rows in result["statements"].items():
            for calls, total, mean, nrows, text in rows:
                text = text.replace("|", "\\|")
                lines.append(f"| {q} | {calls:,} | {total:,.1f} | {mean:.3f} | {nrows:,} | `{text}` |")
    if result["notes"]:
        lines += ["", "## Notes", "", *[f"- {n}" for n in result["notes"]]]
    return "\n".join(lines)
