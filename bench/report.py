"""Summaries and the Markdown table of a benchmark run."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from collections import defaultdict
from importlib import metadata
from typing import Any

PEERS = ["persist-queue", "litequeue", "dirq", "portalocker", "orjson"]
COLUMNS = [
    ("enqueue", "enqueue"),
    ("consume", "consume"),
    ("e2e_1", "e2e 1 consumer"),
    ("e2e_2", "e2e 2 consumers"),
    ("e2e_1_io", "e2e 1c, {io} ms handler"),
    ("e2e_2_io", "e2e 2c, {io} ms handler"),
]


def machine(workdir: str) -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
        with open("/proc/meminfo") as f:
            info["mem"] = f.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        df = subprocess.run(["df", "-T", workdir], capture_output=True, text=True, check=True)
        dev, fstype = df.stdout.splitlines()[1].split()[:2]
        info["disk"] = f"{dev} ({fstype})"
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        pass
    import sqlite3

    versions = {"sqlite": sqlite3.sqlite_version}
    for name in ["jobspool", *PEERS]:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "source" if name == "jobspool" else "-"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(__file__),
        )
        versions["jobspool_commit"] = rev.stdout.strip() or "?"
    except OSError:
        pass
    info["versions"] = versions
    return info


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(records: list[dict[str, Any]], cfg: Any) -> dict[str, Any]:
    """Medians over rounds, ratios to the reference taken within each round, and the targets."""
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        by[(r["queue"], r["metric"])][r["round"]] = r

    def ratio(q: str, metric: str, ref: str) -> float | None:
        """Median over rounds of q/ref, each ratio taken within one round."""
        rs = [
            rec["rate"] / by[(ref, metric)][rnd]["rate"]
            for rnd, rec in by.get((q, metric), {}).items()
            if not rec.get("error")
            and rec.get("rate")
            and (ref, metric) in by
            and rnd in by[(ref, metric)]
            and by[(ref, metric)][rnd].get("rate")
            and not by[(ref, metric)][rnd].get("error")
        ]
        return _median(rs)

    cells: dict[str, dict[str, Any]] = defaultdict(dict)
    for (q, metric), rounds in by.items():
        ok = [r for r in rounds.values() if not r.get("error")]
        cell: dict[str, Any] = {
            "rounds": len(ok),
            "errors": [r["error"] for r in rounds.values() if r.get("error")],
            "dups": sum(r.get("dups", 0) for r in ok),
            "missing": sum(r.get("missing", 0) for r in ok),
            "extra": sum(r.get("extra", 0) for r in ok),
            "lease_lost": sum(r.get("lease_lost", 0) for r in ok),
            "capped": any(r.get("capped") for r in ok),
        }
        if metric == "physical":
            for k in (
                "create_write_fsync_ops",
                "rename_ops",
                "dir_fsync_ops",
                "rename_dir_fsync_ops",
                "life_1_jobs",
                "life_batch_fsync_jobs",
                "life_batch_syncfs_jobs",
                "life_batch_jobs",
            ):
                cell[k] = _median([r[k] for r in ok if k in r])
        else:
            cell["rate"] = _median([r["rate"] for r in ok if "rate" in r])
            cell["rates"] = [round(r["rate"], 1) for r in ok if "rate" in r]
            cell["ratio"] = ratio(q, metric, "sqlite_min")
            rss = [r["rss_mb"] for r in ok if r.get("rss_mb")]
            cell["rss_mb"] = max(rss) if rss else None
            if ok and "rss_open_mb" in ok[0]:
                cell["rss_open_mb"] = max(r.get("rss_open_mb") or 0 for r in ok)
                cell["rss_import_mb"] = max(r.get("rss_import_mb") or 0 for r in ok)
            if ok and "completed" in ok[0]:
                cell["completed"] = sum(r.get("completed", 0) for r in ok)
            warm = [r["t_warm"] for r in ok if "t_warm" in r]
            if warm:
                cell["t_warm"] = _median(warm)
        cells[q][metric] = cell

    def get(q: str, metric: str, key: str = "rate") -> Any:
        return cells.get(q, {}).get(metric, {}).get(key)

    targets: list[dict[str, Any]] = []

    def target(name: str, value: float | None, goal: float, below: bool = False) -> None:
        met = None if value is None else (value < goal if below else value >= goal)
        targets.append(
            {"target": name, "value": value, "goal": goal, "op": "<" if below else "≥", "met": met}
        )

    target("durable e2e / sqlite_min (1 consumer)", ratio("jobspool", "e2e_1", "sqlite_min"), 1.0)
    target("durable e2e / sqlite_min (2 consumers)", ratio("jobspool", "e2e_2", "sqlite_min"), 1.0)
    target(
        "durable e2e / sqlite_min_batch (same batches)",
        ratio("jobspool", "e2e_1", "sqlite_min_batch"),
        1.0,
    )
    target("durable e2e / litequeue FULL", ratio("jobspool", "e2e_1", "litequeue_full"), 2.0)
    target("durable e2e / persist-queue", ratio("jobspool", "e2e_1", "persistqueue"), 2.0)
    target("durable=False e2e / dirq", ratio("jobspool_nd", "e2e_1", "dirq"), 1.0)
    depths = sorted(getattr(cfg, "depths", []))
    if len(depths) >= 2:
        lo, hi = get("jobspool", f"depth_{depths[0]}"), get("jobspool", f"depth_{depths[-1]}")
        target(f"jobspool {depths[-1]:,} queued / {depths[0]:,} queued", hi / lo if lo and hi else None, 0.8)
    one, two = get("jobspool", "e2e_1_io"), get("jobspool", "e2e_2_io")
    target("jobspool 2 consumers / 1 (I/O handlers)", two / one if one and two else None, 1.6)
    bad = sum(
        (c.get("dups", 0) + c.get("missing", 0) + c.get("extra", 0))
        for q in ("jobspool", "jobspool_nd")
        for c in cells.get(q, {}).values()
    )
    target("jobspool duplicates + missing jobs", float(bad) if cells.get("jobspool") else None, 1, below=True)
    if depths:
        target(
            f"jobspool worker peak RSS MB at {depths[-1]:,} queued",
            get("jobspool", f"depth_{depths[-1]}", "rss_mb"),
            100,
            below=True,
        )
    # jobspool against the bare file operations, round by round.
    limit_fraction: dict[str, dict[str, float | None]] = {}
    phys_rounds = by.get(("physical", "physical"), {})
    for q in ("jobspool", "jobspool_nd"):
        pairs = [
            (rec["rate"], phys_rounds[rnd])
            for rnd, rec in by.get((q, "e2e_1"), {}).items()
            if rec.get("rate") and rnd in phys_rounds and not phys_rounds[rnd].get("error")
        ]
        if pairs:
            limit_fraction[q] = {
                "batch": _median([r / p["life_batch_jobs"] for r, p in pairs]),
                "one": _median([r / p["life_1_jobs"] for r, p in pairs]),
            }
    return {"cells": cells, "targets": targets, "limit_fraction": limit_fraction}


def _n(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _r(x: float | None) -> str:
    return "" if x is None else f" ({x:.2f}×)"


def markdown(doc: dict[str, Any]) -> str:
    meta, cfg, s = doc["meta"], doc["config"], doc["summary"]
    cells, v = s["cells"], meta.get("versions", {})
    lines = [f"# jobspool benchmark, {meta['started'][:16].replace('T', ' ')} UTC", ""]
    lines.append(
        f"Machine: {meta.get('cpu', '?')}, {meta.get('cpus')} CPUs, {meta.get('mem', '?')}"
        f" RAM, {meta.get('disk', '?')}; {meta.get('platform')}; Python "
        f"{meta.get('python')}, SQLite {v.get('sqlite')}."
    )
    lines.append("Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "sqlite") + ".")
    lines.append(
        f"Run: {cfg['rounds']} round(s) interleaved; {cfg['n']:,} jobs per run "
        f"({cfg['n_io']:,} with {cfg['io_ms']:g} ms handlers), batch {cfg['batch']}, "
        f"payload ~{cfg['pad']} B; wall time {meta.get('wall_s')} s"
        + (
            f"; load average {meta['loadavg_before'][0]:.1f} before, {meta['loadavg_after'][0]:.1f} after "
            "(the machine is shared: other processes' load shows up as noise)"
            if meta.get("loadavg_before")
            else ""
        )
        + ("; **quick smoke run**" if cfg.get("quick") else "")
        + "."
    )
    lines += [
        "",
        "Figures are medians over rounds, in jobs/s; in brackets the median over rounds "
        "of the ratio to `sqlite_min` (one job per commit) measured in the same round. "
        "`sqlite_min_batch` is the same queue committing once per batch.",
        "",
    ]

    phys = cells.get("physical", {}).get("physical")
    if phys:
        lines += [
            "## Physical reference (bare file operations, this disk)",
            "",
            "| create+write+fsync 1 KB | rename | dir fsync after rename | job life, "
            f"one at a time | job life, batches of {cfg['batch']}, fsync per file | same, one "
            "syncfs per batch |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {_n(phys['create_write_fsync_ops'])} ops/s | {_n(phys['rename_ops'])} ops/s"
            f" | {_n(phys['dir_fsync_ops'])} ops/s | {_n(phys['life_1_jobs'])} jobs/s | "
            f"{_n(phys.get('life_batch_fsync_jobs'))} jobs/s | "
            f"{_n(phys.get('life_batch_syncfs_jobs'))} jobs/s |",
            "",
            "A job's life here = 1 new 1 KB file written and flushed + 3 renames (→ready, "
            "→leased, →done), each followed by an fsync of the target directory (shared "
            'by the batch when batched). The "limit" below is the faster batched variant.',
            "",
        ]

    main_q = [q for q in cfg["queues"] if any(m in cells.get(q, {}) for m, _ in COLUMNS)]
    if main_q:
        heads = [
            h.format(io=f"{cfg['io_ms']:g}") for m, h in COLUMNS if m in {k for q in main_q for k in cells[q]}
        ]
        metrics = [m for m, _ in COLUMNS if m in {k for q in main_q for k in cells[q]}]
        lines += [
            "## Throughput (jobs/s)",
            "",
            "| queue | " + " | ".join(heads) + " | 2c/1c (I/O) | dup / missing |",
            "|---|" + "---:|" * (len(heads) + 2),
        ]
        for q in main_q:
            row = [f"`{q}`"]
            bad = [0, 0]
            for m in metrics:
                c = cells[q].get(m, {})
                if c.get("errors") and not c.get("rounds"):
                    row.append("error")
                    continue
                row.append(_n(c.get("rate")) + _r(c.get("ratio")))
                bad[0] += c.get("dups", 0)
                bad[1] += c.get("missing", 0) + c.get("extra", 0)
            one = cells[q].get("e2e_1_io", {}).get("rate")
            two = cells[q].get("e2e_2_io", {}).get("rate")
            row.append(f"{two / one:.2f}×" if one and two else "–")
            row.append(f"{bad[0]} / {bad[1]}")
            lines.append("| " + " | ".join(row) + " |")
        lim = s.get("limit_fraction", {})
        for q in ("jobspool", "jobspool_nd"):
            if lim.get(q):
                lines += [
                    "",
                    f"`{q}` e2e (1 consumer), as a fraction of the physical job-life limit measured "
                    f"in the same round: {lim[q]['batch']:.0%} of the batched limit, "
                    f"{lim[q]['one']:.0%} of the one-at-a-time one.",
                ]
        lines.append("")

    dq = [q for q in cfg["depth_queues"] if any(k.startswith("depth_") for k in cells.get(q, {}))]
    depths = cfg["depths"]
    if dq:
        lines += [
            f"## Throughput with jobs queued ({cfg['depth_jobs']:,} jobs: enqueue a batch, "
            "claim + complete the oldest batch)",
            "",
            "| queue | "
            + " | ".join(f"{d:,} queued" for d in depths)
            + f" | {depths[-1]:,} / {depths[0]:,} | start-up at {depths[-1]:,} (s) "
            f"| peak RSS at {depths[-1]:,} (MB) |",
            "|---|" + "---:|" * (len(depths) + 3),
        ]
        notes = [
            "Peak RSS is the measuring process's own high-water mark (`VmHWM`; `ru_maxrss`, also in "
            'the JSON, is inflated: Linux carries it over from the spawning parent). "harness" is '
            'the interpreter with the bench loaded, "after open" adds the queue\'s imports and '
            "opening it on the "
            "backlog; the peak follows a full measurement (enqueue, claim, complete)",
            "Start-up is the time a consumer opened on the backlog spends in `warm()` before "
            "the timed cycle: what a long-running worker pays once (jobspool reads the sort "
            "key of every queued job into its claim index; the SQLite queues do nothing)",
        ]
        for q in dq:
            row = [f"`{q}`"]
            for d in depths:
                c = cells[q].get(f"depth_{d}", {})
                if c.get("errors") and not c.get("rounds"):
                    row.append("error")
                    continue
                row.append(_n(c.get("rate")) + _r(c.get("ratio")) + ("*" if c.get("capped") else ""))
                if c.get("capped"):
                    notes.append(
                        f"\\* `{q}` at {d:,}: capped at {cfg['naive_budget_s']:g} s per "
                        f"measurement, {c.get('completed', 0):,} jobs over "
                        f"{c['rounds']} round(s): a measured rate over fewer jobs, not extrapolated"
                    )
                if c.get("dups") or c.get("missing"):
                    notes.append(f"`{q}` at {d:,}: {c['dups']} duplicates, {c['missing']} missing")
            lo = cells[q].get(f"depth_{depths[0]}", {}).get("rate")
            hi = cells[q].get(f"depth_{depths[-1]}", {}).get("rate")
            row.append(f"{hi / lo:.2f}×" if lo and hi else "–")
            big = cells[q].get(f"depth_{depths[-1]}", {})
            warm_s = big.get("t_warm")
            row.append("–" if warm_s is None else f"{warm_s:.2f}")
            rss = big.get("rss_mb")
            row.append(
                "–"
                if rss is None
                else f"{rss:.0f} (harness {big.get('rss_import_mb', 0):.0f}, "
                f"after open {big.get('rss_open_mb', 0):.0f})"
            )
            lines.append("| " + " | ".join(row) + " |")
        if notes:
            lines += ["", *[f"{n}." for n in notes]]
        lines.append("")

    if s["targets"]:
        lines += ["## Targets (issue 6)", "", "| target | value | goal | met |", "|---|---:|---:|:-:|"]
        for t in s["targets"]:
            val = "–" if t["value"] is None else f"{t['value']:.2f}"
            met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
            lines.append(f"| {t['target']} | {val} | {t['op']} {t['goal']:g} | {met} |")
        lines.append("")

    errs = [(q, m, e) for q, ms in cells.items() for m, c in ms.items() for e in c.get("errors", [])]
    if errs:
        lines += ["## Errors", ""]
        for q, m, e in errs:
            last = e.strip().splitlines()[-1] if e.strip() else "?"
            lines.append(f"- `{q}` {m}: {last}")
        lines.append("")
    if meta.get("skipped"):
        lines += [
            "Skipped (not installed): " + ", ".join(f"`{q}` ({why})" for q, why in meta["skipped"].items()),
            "",
        ]
    return "\n".join(lines)
