"""Measurements of a trace that distill, the characterisation passes and the findings share:
a dataset file's size as its reads show it, which leading training steps are warm-up, and
how many loader workers each rank ran."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import polars as pl

from dlreplay.schema import OPEN_OPS, READ_OPS, SEEK_OPS

from .base import num

__all__ = ["WARMUP_FACTOR", "file_ends", "file_sizes", "warmup_steps", "workers_per_rank"]

Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)

#: A leading step longer than this many times the median step is warm-up (JIT, allocator, caches).
WARMUP_FACTOR = 3.0


def warmup_steps(step_seconds: np.ndarray | list[float]) -> int:
    """How many leading steps are warm-up: the first, plus the leading run of steps
    longer than ``WARMUP_FACTOR`` x the median step."""
    values = np.asarray(step_seconds, dtype=float)
    if values.size < 2:
        return min(values.size, 1)
    slow = values[1:] > WARMUP_FACTOR * float(np.median(values))
    return 1 + (int(np.argmin(slow)) if not slow.all() else 0)


def file_ends(io: Frame) -> Frame:
    """Per file of ``io``: the largest byte position seen (the end of a read, or an lseek
    result), where one is (the first case of :func:`file_sizes`)."""
    ends = io.select(
        "file",
        pl.when(pl.col("name").is_in(READ_OPS))
        .then(pl.col("offset") + pl.col("size"))
        .when(pl.col("name").is_in(SEEK_OPS))
        .then(pl.col("ret"))
        .otherwise(None)
        .alias("end"),
    )
    return ends.group_by("file").agg(pl.col("end").max().alias("size")).filter(pl.col("size") > 0)


def file_sizes(io: Frame, sized: Frame | None = None) -> Frame:
    """Per file: the largest byte position seen (end of a read, or an lseek result); for a file
    with neither (a trace without offsets and no seek to its end), the most bytes one process
    read between an open of it and the next (a file read whole, as Pillow reads an image).

    ``io`` needs the opens as well as the reads and seeks for the second case; eager or lazy.
    ``sized``: :func:`file_ends` of ``io``, when already computed."""
    if sized is None:
        sized = file_ends(io)
    rest = io.join(sized.select("file"), on="file", how="anti")
    per_open = (
        rest.filter(pl.col("name").is_in(OPEN_OPS) | pl.col("name").is_in(READ_OPS))
        .sort("ts")
        .with_columns(pl.col("name").is_in(OPEN_OPS).cum_sum().over("pid", "file").alias("__open"))
        .filter(pl.col("name").is_in(READ_OPS) & (pl.col("__open") > 0))
        .group_by("pid", "file", "__open")
        .agg(pl.col("size").sum().alias("size"))
        .group_by("file")
        .agg(pl.col("size").max())
        .filter(pl.col("size") > 0)
    )
    return pl.concat([sized, per_open.select("file", "size")], how="vertical_relaxed")


def workers_per_rank(worker_items: pl.DataFrame, epochs: pl.DataFrame, consumers: list[int]) -> int:
    """Workers per epoch of each consumer (rank), the most over ranks.

    A DataLoader worker's parent is its consumer, so workers are grouped by ppid
    (one join for all ranks); with a single consumer, every worker is its own.
    """
    if len(consumers) == 1:
        return _workers_per_epoch(worker_items, epochs.filter(pl.col("pid") == consumers[0]))
    mine = worker_items.filter(pl.col("ppid").is_in(consumers))
    if mine.is_empty() or epochs.is_empty():
        return _concurrent_processes(worker_items) // max(len(consumers), 1)
    mids = mine.select("pid", "ppid", "ts")
    starts = epochs.select(
        pl.col("pid").alias("ppid"), pl.col("ts").alias("epoch_ts"), pl.col("epoch").alias("win")
    ).sort("epoch_ts")
    tagged = mids.sort("ts").join_asof(
        starts,
        left_on="ts",
        right_on="epoch_ts",
        by="ppid",
        strategy="backward",
        check_sortedness=False,
    )
    return int(
        num(tagged.group_by("ppid", "win").agg(pl.col("pid").n_unique().alias("n"))["n"].max())
    )


def _workers_per_epoch(worker_items: pl.DataFrame, epochs: pl.DataFrame) -> int:
    """Most worker processes loading samples in one epoch.

    Each item belongs to the epoch whose window it starts in; a worker counts in an epoch
    where it loaded at least a quarter of the median items per (worker, epoch): persistent
    workers count in every epoch, non-persistent ones in theirs, and a previous epoch's
    worker finishing at a window's edge does not count twice. Without epoch events, fall
    back to processes alive at the same time.
    """
    if epochs.is_empty():
        return _concurrent_processes(worker_items)
    starts = epochs.select(pl.col("ts").alias("epoch_ts"), pl.col("epoch").alias("win")).sort(
        "epoch_ts"
    )
    tagged = (
        worker_items.select("pid", "ts")
        .sort("ts")
        .join_asof(starts, left_on="ts", right_on="epoch_ts", strategy="backward")
        .with_columns(pl.col("win").fill_null(starts["win"][0]))
    )
    n = tagged.group_by("pid", "win").len()
    fair = n.filter(pl.col("len") >= 0.25 * pl.col("len").median())
    return int(num(fair.group_by("win").len()["len"].max()))


def _concurrent_processes(frame: pl.DataFrame) -> int:
    """Most processes whose event spans (first start .. last end) overlap in time.

    Non-persistent DataLoader workers live for one epoch, so counting distinct pids
    would multiply by the number of epochs; overlap counts the workers of one epoch.
    A single process reading everything is the consumer itself: 0 workers.
    """
    spans = frame.group_by("pid").agg(
        pl.col("ts").min().alias("a"), (pl.col("ts") + pl.col("dur")).max().alias("b")
    )
    if spans.height <= 1:
        return 0
    points = pl.concat(
        [
            spans.select(pl.col("a").alias("t"), pl.lit(1).alias("d")),
            spans.select(pl.col("b").alias("t"), pl.lit(-1).alias("d")),
        ]
    ).sort(["t", "d"], descending=[False, True])
    return int(num(points["d"].cum_sum().max()))
