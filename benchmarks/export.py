"""Benchmark the Perfetto export on a synthetic trace of >= 1 M events.

    python benchmarks/export.py [--events 1000000] [--out DIR] [--format perfetto-trace|json.gz]

The table mimics a data-loader run: one consumer (epochs, fetches, steps), W workers
each doing ``item`` events containing open/lseek/read/close POSIX calls. Prints wall
time (s), events per second, output size (MB) and peak RSS (MB, ``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from dlreplay.analyze.perfetto import export_trace
from dlreplay.schema import EVENT_SCHEMA

CALLS_PER_ITEM = 6  # open64, lseek64, read x2, lseek64, close
BATCH = 8


def synthetic_events(n_events: int, workers: int = 8, seed: int = 0) -> pl.DataFrame:
    """A realistic event table with about ``n_events`` rows (times µs, sizes bytes)."""
    rng = np.random.default_rng(seed)
    n_items = n_events // (CALLS_PER_ITEM + 1)
    t0 = 1_700_000_000_000_000
    consumer = 1000
    wpid = np.arange(workers) + 2000
    item_w = np.arange(n_items) % workers
    per_w = np.arange(n_items) // workers
    item_dur = rng.integers(200, 3000, n_items)
    item_ts = t0 + 10_000 + per_w * 3500 + rng.integers(0, 200, n_items)
    # POSIX calls inside each item, back to back.
    names = np.array(["open64", "lseek64", "read", "read", "lseek64", "close"])
    call_dur = (item_dur[:, None] // (CALLS_PER_ITEM + 1)).repeat(CALLS_PER_ITEM, axis=1)
    call_ts = item_ts[:, None] + 1 + np.arange(CALLS_PER_ITEM)[None, :] * call_dur
    sizes = rng.integers(4096, 1 << 20, (n_items, CALLS_PER_ITEM))
    is_read = np.isin(names, ["read"])[None, :].repeat(n_items, axis=0)
    files = np.array([f"/data/train/file_{i:05d}.npz" for i in range(4096)])
    file_of = files[rng.integers(0, len(files), n_items)]
    calls = pl.DataFrame(
        {
            "pid": np.repeat(wpid[item_w], CALLS_PER_ITEM),
            "ts": call_ts.ravel(),
            "dur": call_dur.ravel(),
            "cat": "POSIX",
            "name": np.tile(names, n_items),
            "file": np.repeat(file_of, CALLS_PER_ITEM),
            "size": np.where(is_read, sizes, 0).ravel(),
        }
    ).with_columns(pl.col("size").replace(0, None))
    items = pl.DataFrame(
        {
            "pid": wpid[item_w],
            "ts": item_ts,
            "dur": item_dur,
            "cat": "data",
            "name": "item",
            "sample_index": rng.permutation(n_items),
        }
    )
    n_steps = n_items // BATCH
    step_ts = t0 + 10_000 + np.arange(n_steps) * (3500 * workers // BATCH + 1)
    fetch = pl.DataFrame(
        {
            "pid": consumer,
            "ts": step_ts,
            "dur": np.full(n_steps, 300),
            "cat": "dataloader",
            "name": "fetch",
            "epoch": 0,
            "step": np.arange(n_steps),
            "batch_size": BATCH,
        }
    )
    step = pl.DataFrame(
        {
            "pid": consumer,
            "ts": step_ts + 300,
            "dur": np.full(n_steps, 200),
            "cat": "compute",
            "name": "step",
            "epoch": 0,
            "step": np.arange(n_steps),
        }
    )
    end = int(max(step_ts.max(), item_ts.max())) + 10_000
    epoch = pl.DataFrame(
        {
            "pid": [consumer],
            "ts": [t0],
            "dur": [end - t0],
            "cat": ["pipeline"],
            "name": ["epoch"],
            "epoch": [0],
        }
    )
    ppid = {consumer: 1, **{int(w): consumer for w in wpid}}
    out = pl.concat([calls, items, fetch, step, epoch], how="diagonal_relaxed")
    out = out.with_columns(
        pl.col("pid").alias("tid"),
        pl.col("pid").replace_strict(ppid, return_dtype=pl.Int64).alias("ppid"),
        pl.lit("bench").alias("host"),
    )
    for col, dtype in EVENT_SCHEMA.items():
        if col not in out.columns:
            out = out.with_columns(pl.lit(None, dtype).alias(col))
    return out.select([pl.col(c).cast(t) for c, t in EVENT_SCHEMA.items()]).sort("ts")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument(
        "--out", type=Path, default=None, help="Output directory (default: a temporary one)."
    )
    ap.add_argument("--format", choices=["perfetto-trace", "json.gz"], default="perfetto-trace")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    events = synthetic_events(args.events)
    build = time.perf_counter() - t
    rss_table = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as tmp:
        out = (args.out or Path(tmp)) / f"bench.{args.format}"
        out.parent.mkdir(parents=True, exist_ok=True)
        stats = export_trace(events, out)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"events: {events.height:,} (table built in {build:.1f} s, {events.estimated_size() / 1e6:.0f} MB, "
            f"peak RSS after build {rss_table:.0f} MB)"
        )
        print(stats.summary())
        print(
            f"export: {stats.seconds:.1f} s, {events.height / stats.seconds:,.0f} events/s, "
            f"peak RSS {rss:.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
