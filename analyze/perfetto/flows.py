"""Flow arrows of the timeline: the hand-over of each batch from the loader worker that
built it (its last ``item``) to the consumer's ``fetch`` of that batch.

PyTorch's DataLoader gives batch ``j`` of an epoch to worker ``j % W`` and each worker
builds its batches from ``batch_size`` consecutive items. Per consumer and epoch, the
workers that start inside the epoch (or all of them, if persistent) are numbered in start
order; a worker's items inside the epoch are cut into batches of the epoch's batch size;
batch ``k`` of worker ``w`` is fetch step ``k * W + w``. The arrow starts at the last item
of the batch, ends at that fetch, and is kept only when the item ends before the fetch
does and begins before the fetch begins (flows attach to slice starts).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..trace import vocabulary as voc
from .tracks import Layout

__all__ = ["FLOW_COLUMNS", "flows"]

#: Columns of the flow table (µs for the times).
FLOW_COLUMNS = ("src_pid", "src_tid", "src_ts", "dst_pid", "dst_tid", "dst_ts")
_SCHEMA = {c: pl.Int64 for c in FLOW_COLUMNS}


def flows(events: pl.DataFrame, layout: Layout) -> pl.DataFrame:
    """Item -> fetch hand-overs: columns ``src_pid, src_tid, src_ts, dst_pid, dst_tid, dst_ts`` (µs)."""
    out: list[pl.DataFrame] = []
    for consumer, workers in layout.workers.items():
        if workers:
            out.extend(_consumer_flows(events, consumer, workers))
    if not out:
        return pl.DataFrame(schema=_SCHEMA)
    return pl.concat(out)


def _consumer_flows(events: pl.DataFrame, consumer: int, workers: list[int]) -> list[pl.DataFrame]:
    """The hand-overs to one consumer from its ``workers``, one table per epoch with fetches."""
    cons = events.filter(pl.col("pid") == consumer)
    fetch = cons.filter(
        (pl.col("role") == voc.FETCH) & (pl.col("batch_size") > 0) & pl.col("step").is_not_null()
    )
    epochs = voc.epoch_spans(cons).with_columns((pl.col("end") - pl.col("ts")).alias("dur"))
    items = events.filter(pl.col("pid").is_in(workers) & (pl.col("role") == voc.ITEM)).select(
        "pid", "tid", "ts", "dur"
    )
    starts = items.group_by("pid").agg(pl.col("ts").min().alias("start"))
    out = []
    for ep in epochs.iter_rows(named=True):
        found = _epoch_flows(consumer, ep, fetch, items, starts)
        if found is not None:
            out.append(found)
    return out


def _epoch_flows(
    consumer: int,
    ep: dict[str, Any],
    fetch: pl.DataFrame,
    items: pl.DataFrame,
    starts: pl.DataFrame,
) -> pl.DataFrame | None:
    """The hand-overs of one epoch ``ep``; None when it has no fetch with a batch size."""
    e0, e1 = ep["ts"], ep["ts"] + (ep["dur"] or 0)
    f = fetch.filter(pl.col("epoch") == ep["epoch"]) if ep["epoch"] is not None else fetch.head(0)
    if f.is_empty():
        return None
    bs = int(f.select(pl.col("batch_size").max().fill_null(0)).item())
    if bs <= 0:
        return None
    in_ep = starts.filter((pl.col("start") >= e0) & (pl.col("start") <= e1)).sort("start")
    wids = in_ep["pid"].to_list() or starts.sort("start")["pid"].to_list()
    j = _batches(items, wids, e0, e1, bs).join(
        f.select(
            "step",
            pl.col("tid").alias("dst_tid"),
            pl.col("ts").alias("dst_ts"),
            (pl.col("ts") + pl.col("dur").fill_null(0)).alias("dst_end"),
        ),
        on="step",
    )
    # The trace processor needs the arrow's source slice to begin first.
    j = j.filter((pl.col("end") <= pl.col("dst_end")) & (pl.col("ts") <= pl.col("dst_ts")))
    return j.select(
        pl.col("pid").alias("src_pid"),
        pl.col("tid").alias("src_tid"),
        pl.col("ts").alias("src_ts"),
        pl.lit(consumer, pl.Int64).alias("dst_pid"),
        "dst_tid",
        "dst_ts",
    ).cast(_SCHEMA)  # type: ignore[arg-type]


def _batches(items: pl.DataFrame, wids: list[int], e0: int, e1: int, bs: int) -> pl.DataFrame:
    """The batches the workers ``wids`` (in start order) built in ``e0..e1``: per batch its last
    item (``tid``, ``ts``, ``end``) and the fetch ``step`` it is handed to."""
    n = len(wids)
    return (
        items.filter(pl.col("pid").is_in(wids) & (pl.col("ts") >= e0) & (pl.col("ts") <= e1))
        .sort("pid", "ts")
        .with_columns(pl.int_range(pl.len()).over("pid").alias("k"))
        .with_columns(
            (pl.col("k") // bs).alias("batch"),
            pl.col("pid")
            .replace_strict({p: i for i, p in enumerate(wids)}, return_dtype=pl.Int64)
            .alias("w"),
        )
        .group_by("pid", "batch")
        .agg(
            pl.col("tid").last(),
            pl.col("ts").last(),
            (pl.col("ts") + pl.col("dur").fill_null(0)).last().alias("end"),
            pl.col("w").first(),
            pl.len().alias("n"),
        )
        .with_columns((pl.col("batch") * n + pl.col("w")).alias("step"))
    )
