"""The passes over what the job read: the summary, Darshan's access pattern, transfer sizes
and reads per sample, bandwidth over time, metadata calls, and signs of the page cache."""

from __future__ import annotations

import os
import socket
from typing import Any

import numpy as np
import polars as pl

from dlreplay.osutil import host_memory_bytes
from dlreplay.schema import CLOSE_OPS, OPEN_OPS, READ_OPS, SEEK_OPS, STAT_OPS, WRITE_OPS

from .numbers import US, hist_stats, rounded
from .view import (
    DATA_READ,
    TraceView,
    flag_reads_lazy,
    in_items,
    kernel_read_flags,
    kernel_sample_reads,
    kernels_loaded,
)

__all__ = [
    "META_OPS",
    "TIMELINE_BINS",
    "pass_access",
    "pass_bandwidth",
    "pass_metadata",
    "pass_overview",
    "pass_page_cache",
    "pass_transfer",
]

META_OPS = OPEN_OPS + CLOSE_OPS + STAT_OPS + SEEK_OPS
#: Bins of the bandwidth-over-time series.
TIMELINE_BINS = 120


def pass_overview(v: TraceView) -> dict:
    """The summary (operations, top files, Darshan histograms, dataset bytes)."""
    return v.summary.to_dict()


def pass_access(v: TraceView) -> dict:
    """Darshan's sequential / consecutive / random read fractions, overall and per file (dataset)."""
    # Per (file, read size) at once, one batch of processes at a time (a read's predecessor
    # is of its own process): the flagged reads are never held whole. The totals and each
    # file's median read are taken from the merged counts.
    ops = pl.col("name").is_in(OPEN_OPS) | pl.col("name").is_in(READ_OPS)
    if kernels_loaded():  # one pass in C over the rows in time order
        counts = [kernel_read_flags(v, ops)]
    else:
        counts = _read_flags_polars(v, ops)
    hist = (
        pl.concat(counts)
        .group_by("file", "size")
        .agg(pl.col("n", "__seq", "__con").sum())
        .sort("file", "size")
    )
    del counts
    n_all = pl.col("n").sum()
    cum = pl.col("n").cum_sum()
    # the median as polars takes it: the middle value, or the mean of the two middle values
    lower = pl.col("size").filter(cum > (n_all - 1) // 2).first()
    upper = pl.col("size").filter(cum > n_all // 2).first()
    per_file = hist.group_by("file", maintain_order=True).agg(
        n_all.alias("reads"),
        pl.col("__seq").sum(),
        pl.col("__con").sum(),
        ((lower + upper) / 2).alias("median_read"),
    )
    if per_file.is_empty() and not v.collect(v.dataset_query().select(pl.len())).item():
        return {
            "reads": 0,
            "sequential": None,
            "consecutive": None,
            "random": None,
            "per_file": [],
            "missing": "no dataset reads",
        }
    if per_file.is_empty():
        return {
            "reads": 0,
            "sequential": None,
            "consecutive": None,
            "random": None,
            "per_file": [],
            "missing": "read offsets unknown",
        }
    n = int(per_file["reads"].sum())
    seq = int(per_file["__seq"].sum())
    con = int(per_file["__con"].sum())
    per_file = per_file.select(
        "file",
        "reads",
        (pl.col("__seq") / pl.col("reads")).alias("sequential"),
        (pl.col("__con") / pl.col("reads")).alias("consecutive"),
        "median_read",
    ).sort(["reads", "file"], descending=[True, False])
    return {
        "reads": n,
        "sequential": rounded(seq / n, 4),
        "consecutive": rounded(con / n, 4),
        "random": rounded((n - seq) / n, 4),
        "per_file": [
            {k: (rounded(x, 4) if isinstance(x, float) else x) for k, x in r.items()}
            for r in per_file.head(20).iter_rows(named=True)
        ],
    }


def _read_flags_polars(v: TraceView, ops: pl.Expr) -> list[pl.DataFrame]:
    """:func:`~.view.kernel_read_flags` as polars queries (the definition; without the C
    kernels), one batch of processes at a time."""
    counts = []
    for batch in v.pid_batches:
        io = v.ordered_dataset(
            ("pid", "file", "name", "size", "offset"), ops if batch is None else ops & batch
        )
        counts.append(
            flag_reads_lazy(io, packed=v.pids_packable)
            .group_by("file", "size")
            .agg(
                pl.len().alias("n"),
                pl.col("seq").sum().alias("__seq"),
                pl.col("consec").sum().alias("__con"),
            )
            .collect()
        )
        del io
    return counts


def pass_transfer(v: TraceView) -> dict:
    """Dataset read sizes (bytes), reads and bytes per sample, which calls and which format."""
    # counted per distinct size: one row per read is never held
    # (one query: reads per (call, size), then per size and per call)
    per = v.collect(
        v.dataset_query(DATA_READ).group_by("name", "size").agg(pl.len().cast(pl.Int64).alias("n"))
    )
    hist = per.group_by("size").agg(pl.col("n").sum())
    out: dict[str, Any] = {"read_size": hist_stats(hist), "calls": {}}
    n_reads = int(hist["n"].sum() or 0)
    calls = per.group_by("name").agg(pl.col("n").sum().alias("len"))
    out["calls"] = {
        n: c for n, c in calls.sort(["len", "name"], descending=[True, False]).iter_rows()
    }
    exts = [os.path.splitext(f)[1].lower() for f in v.dataset_files]
    out["extensions"] = (
        dict(pl.Series(exts, dtype=pl.Utf8).value_counts(sort=True).iter_rows()) if exts else {}
    )
    items = v.items
    if items.height and n_reads:
        out.update((kernel_sample_reads if kernels_loaded() else _sample_reads_polars)(v, items))
    else:
        out["samples_with_reads"] = 0
        out["reads_per_sample"] = None
        out["bytes_per_sample"] = None
        out["missing"] = "no item events: sample size unknown" if n_reads else "no dataset reads"
    return out


def _sample_reads_polars(v: TraceView, items: pl.DataFrame) -> dict[str, Any]:
    """:func:`~.view.kernel_sample_reads` as polars queries (the definition; without the C kernels)."""
    samples = []  # per sample (pid, item): reads and bytes, one batch of processes at a time
    for batch in v.pid_batches:
        reads = v.dataset_query(DATA_READ if batch is None else DATA_READ & batch).select(
            "pid", "ts", "size"
        )
        samples.append(
            v.collect(
                in_items(v, reads, items)
                .filter(pl.col("item_ts").is_not_null())
                .group_by("pid", "item_ts")
                .agg(pl.len().alias("reads"), pl.col("size").sum().alias("bytes"))
            )
        )
        del reads
    n, reads_med, bytes_med = (
        pl.concat(samples)
        .select(pl.len().alias("n"), pl.col("reads").median(), pl.col("bytes").median())
        .row(0)
    )
    return {
        "samples_with_reads": int(n),
        "reads_per_sample": rounded(reads_med, 2),
        "bytes_per_sample": rounded(bytes_med, 1),
    }


def pass_bandwidth(v: TraceView) -> dict:
    """Bytes read per time bin over the run (dataset and all files), in bytes/s."""
    t0, t1 = v.span
    width = max((t1 - t0) / TIMELINE_BINS, 1.0)
    ds = v.role_files("dataset")
    binned = v.collect(
        v.io_lazy.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0))
        .select(
            ((pl.col("ts") - t0) / width)
            .floor()
            .cast(pl.Int64)
            .clip(0, TIMELINE_BINS - 1)
            .alias("b"),
            "size",
            pl.col("file").is_in(ds).alias("ds"),
        )
        .group_by("b")
        .agg(
            pl.col("size").sum().alias("all"),
            pl.col("size").filter(pl.col("ds")).sum().alias("dsb"),
        )
    )
    if binned.is_empty() or t1 <= t0:
        return {
            "bin_s": None,
            "t_s": [],
            "dataset_bps": [],
            "all_bps": [],
            "peak_bps": None,
            "missing": "no reads",
        }
    full = (
        pl.DataFrame({"b": np.arange(TIMELINE_BINS, dtype=np.int64)})
        .join(binned, on="b", how="left")
        .fill_null(0)
    )
    sec = width * US
    all_bps = (full["all"] / sec).to_list()
    return {
        "bin_s": rounded(sec),
        "t_s": [rounded(i * sec, 4) for i in range(TIMELINE_BINS)],
        "dataset_bps": [rounded(x, 1) for x in (full["dsb"] / sec).to_list()],
        "all_bps": [rounded(x, 1) for x in all_bps],
        "peak_bps": rounded(max(all_bps), 1),
    }


def pass_metadata(v: TraceView) -> dict:
    """Metadata (open/close/stat/seek) vs data calls on the dataset files: counts, time, per sample."""
    per_name = v.collect(
        v.dataset_query().group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum().alias("us"))
    )
    if per_name.is_empty():
        return {"meta_calls": 0, "data_calls": 0, "meta_share": None, "missing": "no dataset I/O"}
    name = pl.col("name")
    kinds = (
        per_name.select(
            pl.when(name.is_in(OPEN_OPS))
            .then(pl.lit("open"))
            .when(name.is_in(CLOSE_OPS))
            .then(pl.lit("close"))
            .when(name.is_in(STAT_OPS))
            .then(pl.lit("stat"))
            .when(name.is_in(SEEK_OPS))
            .then(pl.lit("seek"))
            .when(name.is_in(READ_OPS + WRITE_OPS))
            .then(pl.lit("data"))
            .otherwise(pl.lit("other"))
            .alias("k"),
            "n",
            "us",
        )
        .group_by("k")
        .agg(pl.col("n").sum(), pl.col("us").sum())
    )
    d = {k: (n, us) for k, n, us in kinds.iter_rows()}
    meta_n = sum(d.get(k, (0, 0))[0] for k in ("open", "close", "stat", "seek"))
    meta_us = sum(d.get(k, (0, 0))[1] for k in ("open", "close", "stat", "seek"))
    data_n, data_us = d.get("data", (0, 0))
    files = v.files.filter(pl.col("role") == "dataset")
    items = v.items.height
    sizes = v.dataset_file_sizes
    return {
        "meta_calls": int(meta_n),
        "data_calls": int(data_n),
        "meta_time_s": rounded(meta_us * US),
        "data_time_s": rounded(data_us * US),
        "meta_share": rounded(meta_us / (meta_us + data_us), 4) if meta_us + data_us else None,
        "meta_call_share": rounded(meta_n / (meta_n + data_n), 4) if meta_n + data_n else None,
        "opens": int(d.get("open", (0, 0))[0]),
        "seeks": int(d.get("seek", (0, 0))[0]),
        "stats": int(d.get("stat", (0, 0))[0]),
        "files": files.height,
        "opens_per_sample": rounded(d.get("open", (0, 0))[0] / items, 3) if items else None,
        "seeks_per_read": rounded(d.get("seek", (0, 0))[0] / data_n, 3) if data_n else None,
        "mean_file_size": rounded(sizes["size"].mean(), 1) if sizes.height else None,
    }


def _host_memory(manifest: dict | None) -> tuple[int | None, str]:
    """RAM of the traced host: from the capture manifest, else this host's when it is the same."""
    mem = (manifest or {}).get("mem_total_bytes")
    if mem:
        return int(mem), "capture manifest"
    host = (manifest or {}).get("host")
    if host and host == socket.gethostname() and host_memory_bytes():
        return host_memory_bytes(), "this host (same as the capture's)"
    return None, "unknown"


def pass_page_cache(v: TraceView) -> dict:
    """Signs that reads came from the page cache: in-call bandwidth, dataset size vs RAM, re-reads."""
    big = pl.col("size") >= (64 << 10)
    n, us, nbytes, n_big, big_us, big_bytes = v.collect(
        v.dataset_query(DATA_READ).select(
            pl.len().alias("n"),
            pl.col("dur").sum().alias("us"),
            pl.col("size").sum().alias("b"),
            big.sum().alias("nbig"),
            pl.col("dur").filter(big).sum().alias("bus"),
            pl.col("size").filter(big).sum().alias("bb"),
        )
    ).row(0)
    if not n:
        return {"in_call_bps": None, "missing": "no dataset reads"}
    us, nbytes, big_us = int(us or 0), int(nbytes), int(big_us or 0)
    ds_size = int(v.dataset_file_sizes["size"].sum() or 0)
    mem, mem_src = _host_memory(v.manifest)
    return {
        "in_call_bps": rounded(nbytes / (us * US), 1) if us else None,
        "large_read_bps": rounded(int(big_bytes or 0) / (big_us * US), 1) if big_us else None,
        "large_reads": int(n_big),
        "dataset_bytes": ds_size,
        "bytes_read": nbytes,
        "reread_factor": rounded(nbytes / ds_size, 3) if ds_size else None,
        "host_memory_bytes": mem,
        "host_memory_source": mem_src,
    }
