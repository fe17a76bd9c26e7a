"""What the projection's fenced merge costs without lance's index-assisted merge path.

`ProjectionStore` merges with `use_index(False)` (projection/lance.py `_execute_merge` says
why: lance 14 refuses the indexed path for a conditional merge on a keyed table, and earlier
releases had silent-miss bugs on it). This measures what that gives up: the same batch of
fenced upserts (B keys, half present, half new) merged into a table of N rows whose key
has a BTREE index, by the scan path and by the indexed path, interleaved, in one process.

    python -m bench.merge_index [--rows 10000,200000,1000000] [--batch 50] [--rounds 15]

Prints per size the median milliseconds per merge of each path and their ratio, or that
the installed LanceDB refuses the indexed path.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from jobspool.projection.handler import make_upsert
from jobspool.projection.lance import FENCE_WHERE, ProjectionStore, _execute_merge

TABLE = "notes"


def _filled(root: Path, rows: int) -> tuple[Any, pa.Schema]:
    store = ProjectionStore(root)
    assert store.apply([make_upsert("seed", TABLE, {"id": "seed", "text": "x"}, None, 1)]).ok
    tbl = store.open(TABLE)
    schema = tbl.schema
    step = 100_000
    for start in range(0, rows, step):
        n = min(step, rows - start)
        cols = {"id": [f"k{i}" for i in range(start, start + n)], "text": ["x" * 200] * n,
                "version": [1.0] * n, "fence": [1] * n, "_deleted": [False] * n,
                "_written_at": [0.0] * n}
        tbl.add(pa.table(cols, schema=schema))
    tbl.optimize()
    from lancedb.index import BTree
    tbl.create_index("id", config=BTree(), replace=False)
    return tbl, schema


def _batch(schema: pa.Schema, rows: int, size: int, r: int) -> pa.Table:
    fence = 10 + r
    present = [f"k{(r * 7919 + j * 104_729) % rows}" for j in range(size // 2)]
    new = [f"n{r}-{j}" for j in range(size - len(present))]
    ids = present + new
    n = len(ids)
    return pa.table({"id": ids, "text": ["y"] * n, "version": [float(fence)] * n,
                     "fence": [fence] * n, "_deleted": [False] * n, "_written_at": [1.0] * n},
                    schema=schema)


def _indexed(tbl: Any, batch: pa.Table) -> Any:
    return (tbl.merge_insert("id").when_matched_update_all(where=FENCE_WHERE)
            .when_not_matched_insert_all().execute(batch, on_bad_vectors="null"))


def measure(rows: int, size: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="merge-index-") as tmp:
        tbl, schema = _filled(Path(tmp) / "db", rows)
        scan: list[float] = []
        indexed: list[float] = []
        refused = ""
        for r in range(rounds):
            arms = [("scan", scan), ("indexed", indexed)]
            for name, out in arms if r % 2 == 0 else arms[::-1]:
                if name == "indexed" and refused:
                    continue
                batch = _batch(schema, rows, size, 2 * r + (name == "indexed"))
                started = time.perf_counter()
                try:
                    if name == "scan":
                        _execute_merge(tbl, "id", batch, None)
                    else:
                        _indexed(tbl, batch)
                except Exception as exc:  # the installed lance refuses the indexed path
                    refused = str(exc).splitlines()[0][:100]
                    continue
                out.append(time.perf_counter() - started)
        s = statistics.median(scan) * 1000
        if refused:
            print(f"rows={rows:>9,} batch={size}: scan {s:6.1f} ms/merge; indexed path refused "
                  f"by this lancedb ({refused})")
        else:
            i = statistics.median(indexed) * 1000
            print(f"rows={rows:>9,} batch={size}: scan {s:6.1f} ms/merge, indexed {i:6.1f} "
                  f"ms/merge, scan/indexed time {s / i:4.2f}x")


def main() -> None:
    import lancedb
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="10000,200000,1000000")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"lancedb {lancedb.__version__}; fenced merges, batched ({args.batch} jobs per merge), "
          f"median of {args.rounds} interleaved rounds")
    for rows in (int(x) for x in args.rows.split(",")):
        measure(rows, args.batch, args.rounds)


if __name__ == "__main__":
    main()
