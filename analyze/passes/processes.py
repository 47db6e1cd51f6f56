"""The passes over the processes: each one's role (consumer, loader worker, other), lifetime
and busy time, the balance across ranks and workers, and the time a worker spends in a
sample outside its I/O (preprocessing)."""

from __future__ import annotations

from typing import Any

import polars as pl

from dlreplay.schema import EVENT_SCHEMA, IO_CATEGORIES, READ_OPS

from ..trace import vocabulary as voc
from ..trace.spill import ORDER_COL
from .numbers import US, num, rounded, stats
from .view import TraceView, in_items, kernel_io_in_items, kernels_loaded

__all__ = ["pass_balance", "pass_preprocess", "pass_processes"]


def _i(x: Any) -> int:
    return int(x or 0)


def _first_ppid(v: TraceView) -> pl.DataFrame:
    """(host, pid, ppid) over a lazy table: the ppid of each (host, pid)'s first event with one,
    in table order (what ``ppid.drop_nulls().first()`` gives in memory).

    The ppid is constant per trace file and pid, so each (host, pid) has few candidates:
    the one with the earliest ``ts`` wins; a tie (or only null ``ts``) is settled by the
    order column over that (host, pid)'s tied rows only.
    """
    cand = v.collect(
        v.scan.filter(pl.col("ppid").is_not_null())
        .group_by("host", "pid", "ppid")
        .agg(pl.col("ts").min().alias("m"))
    )
    out = []
    for (host, pid), g in cand.group_by("host", "pid"):
        g = g.sort("m", nulls_last=True)
        m = g["m"][0]
        tied = g.filter(pl.col("m").eq_missing(m))
        if tied.height == 1:
            out.append((host, pid, tied["ppid"][0]))
            continue
        at = pl.col("ts").is_null() if m is None else pl.col("ts") == m
        first = v.collect(
            v.scan.filter(
                pl.col("host").eq_missing(host)
                & (pl.col("pid") == pid)
                & pl.col("ppid").is_not_null()
                & at
            )
            .select("ppid", ORDER_COL)
            .sort(ORDER_COL)
            .head(1)
        )
        out.append((host, pid, first["ppid"][0]))
    return pl.DataFrame(
        out, schema={c: EVENT_SCHEMA[c] for c in ("host", "pid", "ppid")}, orient="row"
    )


def pass_processes(v: TraceView) -> dict:
    """Per process: role (consumer / worker / other), lifetime, I/O and item busy time."""
    if not v.height:
        return {"processes": []}
    is_io = pl.col("cat").is_in(IO_CATEGORIES)
    is_item = pl.col("role") == voc.ITEM
    aggs = [
        pl.len().alias("events"),
        pl.col("ts").min().alias("t0"),
        (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("t1"),
        pl.col("dur").filter(is_io).sum().alias("io_us"),
        pl.col("dur").filter(is_item).sum().alias("item_us"),
        is_item.sum().alias("items"),
        pl.col("size").filter(pl.col("name").is_in(READ_OPS)).sum().alias("bytes_read"),
    ]
    if isinstance(
        v.events, pl.DataFrame
    ):  # a query: polars' eager group_by holds more bytes per event
        per = (
            v.events.lazy()
            .group_by("host", "pid")
            .agg(pl.col("ppid").drop_nulls().first().alias("ppid"), *aggs)
            .collect()
        )
    else:
        per = v.collect(v.events.group_by("host", "pid").agg(*aggs)).join(
            _first_ppid(v), on=["host", "pid"], how="left", nulls_equal=True
        )
    per = per.sort("t0", "pid")
    cons, work = set(v.consumers), set(v.workers)
    rows = []
    for r in per.iter_rows(named=True):  # one row per process, not per event
        life = max(r["t1"] - r["t0"], 1)
        role = "consumer" if r["pid"] in cons else "worker" if r["pid"] in work else "other"
        rows.append(
            {
                "host": r["host"],
                "pid": r["pid"],
                "ppid": r["ppid"],
                "role": role,
                "events": r["events"],
                "lifetime_s": rounded(life * US),
                "io_time_s": rounded(_i(r["io_us"]) * US),
                "item_time_s": rounded(_i(r["item_us"]) * US),
                "items": _i(r["items"]),
                "bytes_read": _i(r["bytes_read"]),
                "busy": rounded(_i(r["item_us"]) / life, 4) if role == "worker" else None,
            }
        )
    return {"processes": rows}


def pass_balance(v: TraceView) -> dict:
    """Balance across ranks (consumers) and loader workers: items, busy time, max/median ratios."""
    items = v.items
    out: dict[str, Any] = {}
    if v.workers:
        w = (
            items.filter(pl.col("pid").is_in(v.workers))
            .group_by("pid")
            .agg(
                pl.len().alias("items"),
                pl.col("dur").sum().alias("busy_us"),
                pl.col("ppid").first(),
            )
            .sort("pid")
        )  # a fixed order: the mean of busy_s is a float sum
        med = num(w["busy_us"].median())
        out["workers"] = {
            "count": w.height,
            "items": stats(w["items"]),
            "busy_s": stats(w["busy_us"] * US),
            "max_over_median": rounded(num(w["busy_us"].max()) / med, 3) if med else None,
        }
    rank_rows = []
    st = v.step_table
    if len(v.consumers) > 1 and st.height:
        per = st.group_by("pid").agg(
            pl.col("wait_us").sum(), pl.col("compute_us").sum(), pl.len().alias("steps")
        )
        ep = v.epochs.group_by("pid").agg(pl.col("dur").sum().alias("epoch_us"))
        per = per.join(ep, on="pid", how="left").sort("pid")
        med = num(per["epoch_us"].median())
        rank_rows = [
            {
                "pid": r["pid"],
                "steps": r["steps"],
                "wait_s": rounded(r["wait_us"] * US),
                "compute_s": rounded(r["compute_us"] * US),
                "epoch_s": rounded((r["epoch_us"] or 0) * US),
            }
            for r in per.iter_rows(named=True)
        ]
        out["ranks"] = {
            "count": per.height,
            "per_rank": rank_rows,
            "max_over_median": rounded(num(per["epoch_us"].max()) / med, 3) if med else None,
            "wait_max_over_median": rounded(
                num(per["wait_us"].max()) / num(per["wait_us"].median()), 3
            )
            if per["wait_us"].median()
            else None,
        }
    return out


def _io_in_items_polars(v: TraceView, items: pl.DataFrame, loaders: pl.Expr) -> int:
    """:func:`~.view.kernel_io_in_items` as polars queries (the definition; without the C kernels)."""
    io_us = 0
    for batch in v.pid_batches:  # one batch of processes at a time: the sums add up
        io = v.io_lazy.filter(loaders if batch is None else loaders & batch).select(
            "pid", "ts", "dur"
        )
        io_us += int(
            v.collect(
                in_items(v, io, items)
                .filter(pl.col("item_ts").is_not_null())
                .select(pl.col("dur").sum())
            ).item()
            or 0
        )
        del io
    return io_us


def pass_preprocess(v: TraceView) -> dict:
    """Time inside ``Dataset.__getitem__`` vs the POSIX time inside it (deserialisation, decode)."""
    items = v.items
    if items.is_empty():
        return {
            "item_time_s": None,
            "io_in_items_s": None,
            "ratio": None,
            "missing": "no item events",
        }
    item_us = int(items["dur"].sum() or 0)
    loaders = pl.col("pid").is_in(items["pid"].unique().implode())
    io_us = (kernel_io_in_items if kernels_loaded() else _io_in_items_polars)(v, items, loaders)
    return {
        "items": items.height,
        "item_time_s": rounded(item_us * US),
        "io_in_items_s": rounded(io_us * US),
        "non_io_s": rounded(max(item_us - io_us, 0) * US),
        "ratio": rounded(item_us / io_us, 3) if io_us else None,
        "per_item_s": rounded(item_us / items.height * US),
    }
