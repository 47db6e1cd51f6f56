"""The ranks of a data-parallel job: which processes are ranks (from their launcher's records,
else the consumers), each rank's share of the samples, and the time the ranks spend waiting
for each other inside the step (collectives).

Where the ranks come from, best first:

* the init events a ``dlreplay capture`` writes in each rank process when it calls
  ``torch.distributed.init_process_group`` (``comm``/``comm.rank<R>.world<W>.init``, see
  ``capture/inject/distributed.py``): rank and world size as the launcher (``torchrun``,
  ``RANK``/``WORLD_SIZE``) gave them. The launcher's own process (torchrun's agent) and the
  ranks' DataLoader workers write none: they are never ranks;
* else the consumers (processes with fetch, step or compute events): one per rank, as
  MPI jobs and DLIO's traces (whose pid is the MPI rank) have them.

Collectives inside the step: the ranks of a data-parallel job meet at every all-reduce
(DistributedDataParallel's, in backward, or the script's own ``dist.all_reduce``), so each
rank's step lasts until the last rank arrives. A rank's measured step is its own compute
plus that wait. The rank whose batch arrived last at a step waited for no one: its step
time is the step's own compute (collectives' own cost included); what the other ranks
spent beyond it is collective wait (:func:`own_compute_steps`). The replay meets at a
barrier after each step, so the wait is made anew from the replay's own skew, not counted
twice.

Times in microseconds (tables) and seconds (the pass's dict).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..trace import vocabulary as voc
from .numbers import US, rounded

__all__ = ["INIT_PATTERN", "own_compute_steps", "pass_ranks", "rank_table", "ranks_of"]

#: The init event's name (``capture/inject/distributed.py``): rank, world size.
INIT_PATTERN = r"^comm\.rank(\d+)\.world(\d+)\.init$"

_RANK_SCHEMA = {"host": pl.String, "pid": pl.Int32, "rank": pl.Int64, "world_size": pl.Int64}


def rank_table(events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """One row per rank process recorded by its init event: (host, pid, rank, world_size),
    by rank; empty when the trace has none (no capture hooks, not a torch.distributed job).
    A process that made several groups keeps its first (the default group's) record."""
    inits = (
        events.lazy()
        .filter((pl.col("cat") == "comm") & (pl.col("role") == voc.INIT))
        .select(
            pl.col("host").cast(pl.String),
            "pid",
            "ts",
            pl.col("name").cast(pl.String).str.extract_groups(INIT_PATTERN).alias("g"),
        )
        .unnest("g")
        .rename({"1": "rank", "2": "world_size"})
        .filter(pl.col("rank").is_not_null())
        .sort("ts")
        .unique(["host", "pid"], keep="first", maintain_order=True)
        .select(
            "host",
            "pid",
            pl.col("rank").cast(pl.Int64),
            pl.col("world_size").cast(pl.Int64),
        )
    )
    df = inits.collect()
    return df.cast(_RANK_SCHEMA).sort("rank", "host", "pid")  # type: ignore[arg-type]


def ranks_of(events: pl.DataFrame | pl.LazyFrame, consumers: list[int]) -> tuple[int, str]:
    """(how many ranks the job ran, how that is known): the world size the ranks' init events
    recorded, else the consumers (at least 1)."""
    return _count(rank_table(events), consumers)


def _count(rt: pl.DataFrame, consumers: list[int]) -> tuple[int, str]:
    """:func:`ranks_of` over a :func:`rank_table`."""
    if rt.height:
        world = max(int(w) for w in rt["world_size"].to_list())
        seen = rt["rank"].n_unique()
        if seen < world:  # a rank whose events are lost (killed, or on another host's capture)
            return world, f"world size of {seen} rank(s)' init_process_group records"
        return world, "init_process_group records (torch.distributed ranks)"
    return max(len(consumers), 1), "processes with fetch events"


def own_compute_steps(steps: pl.DataFrame, pid: int | None) -> pl.DataFrame:
    """*pid*'s training steps (rows of :func:`~..trace.vocabulary.training_steps`) with each
    step's ``compute_us`` the step's own compute: that of the rank whose batch arrived last at
    the same step (epoch and position in it), which waited for no other rank. Steps that not
    every rank took keep their own time; a job of one consumer is returned unchanged."""
    consumers = steps["pid"].n_unique()
    mine = steps.filter(pl.col("pid") == pid)  # none when pid is None
    if consumers < 2 or mine.is_empty():
        return mine
    pos = pl.int_range(pl.len()).over("pid", "epoch").alias("__pos")
    ranked = steps.sort("ts").with_columns(pos)
    late = (
        ranked.group_by("epoch", "__pos")
        .agg(
            pl.col("compute_us").sort_by("ts").last().alias("__own"),
            pl.col("pid").n_unique().alias("__n"),
        )
        .filter(pl.col("__n") == consumers)
    )
    return (
        ranked.filter(pl.col("pid") == pid)
        .join(late, on=["epoch", "__pos"], how="left")
        .with_columns(
            pl.min_horizontal(pl.col("__own"), pl.col("compute_us"))
            .fill_null(pl.col("compute_us"))
            .alias("compute_us")
        )
        .drop("__pos", "__own", "__n")
    )


def _comm(events: pl.DataFrame, pids: list[int]) -> pl.DataFrame:
    """Per rank process: collective calls recorded inside epochs and their time (µs)."""
    return (
        events.filter(
            (pl.col("role") == voc.COMM) & pl.col("pid").is_in(pids) & pl.col("epoch").is_not_null()
        )
        .group_by("pid")
        .agg(pl.len().alias("comm_calls"), pl.col("dur").fill_null(0).sum().alias("comm_us"))
    )


def _shares(v: Any, pids: list[int]) -> pl.DataFrame:
    """Per rank process: samples and steps per epoch (medians over its epochs)."""
    fetch = v.role(voc.FETCH).filter(
        pl.col("pid").is_in(pids) & (pl.col("batch_size").fill_null(0) > 0)
    )
    return (
        fetch.group_by("pid", "epoch")
        .agg(pl.col("batch_size").sum().alias("samples"), pl.len().alias("steps"))
        .group_by("pid")
        .agg(
            pl.col("samples").median().alias("samples_per_epoch"),
            pl.col("steps").median().alias("steps_per_epoch"),
            pl.len().alias("epochs"),
        )
    )


def _waits(steps: pl.DataFrame) -> pl.DataFrame:
    """Per consumer: step time beyond the step's own compute (collective wait, µs)."""
    if steps["pid"].n_unique() < 2:
        return pl.DataFrame(schema={"pid": pl.Int32, "wait_us": pl.Int64})
    rows = [
        own_compute_steps(steps, int(pid))
        .join(
            steps.filter(pl.col("pid") == pid).select("ts", pl.col("compute_us").alias("__m")),
            on="ts",
        )
        .select(
            pl.lit(pid, pl.Int32).alias("pid"),
            (pl.col("__m") - pl.col("compute_us")).sum().alias("wait_us"),
        )
        for pid in steps["pid"].unique().sort().to_list()
    ]
    return pl.concat(rows)


def pass_ranks(v: Any) -> dict:
    """The job's ranks (:class:`~.view.TraceView` *v*): how many and how known, each rank's
    process, share of the samples per epoch, collective calls and time, and the wait for the
    other ranks inside its steps (seconds)."""
    events = v.annotations  # the few rows with a role: init, loop and comm events
    rt = rank_table(events)
    consumers = list(v.consumers)
    world, how = _count(rt, consumers)
    if rt.height:
        procs = rt.select("pid", "rank")
    else:
        procs = pl.DataFrame(
            {"pid": consumers, "rank": list(range(len(consumers)))},
            schema={"pid": pl.Int32, "rank": pl.Int64},
        )
    pids = procs["pid"].to_list()
    table = (
        procs.cast({"pid": pl.Int32})
        .join(_shares(v, pids).cast({"pid": pl.Int32}), on="pid", how="left")
        .join(_comm(events, pids).cast({"pid": pl.Int32}), on="pid", how="left")
        .join(_waits(v.step_table).cast({"pid": pl.Int32}), on="pid", how="left")
        .sort("rank")
    )
    per_rank = [
        {
            "rank": r["rank"],
            "pid": r["pid"],
            "samples_per_epoch": r["samples_per_epoch"],
            "steps_per_epoch": r["steps_per_epoch"],
            "comm_calls": int(r["comm_calls"] or 0),
            "comm_s": rounded(int(r["comm_us"] or 0) * US),
            "collective_wait_s": rounded(int(r["wait_us"] or 0) * US),
        }
        for r in table.iter_rows(named=True)
    ]
    shares = [r["samples_per_epoch"] for r in per_rank if r["samples_per_epoch"] is not None]
    return {
        "ranks": {
            "count": world,
            "source": how,
            "processes": len(pids),
            "per_rank": per_rank,
            "samples_per_epoch_total": sum(shares) if shares else None,
            "share_max_over_min": rounded(max(shares) / min(shares), 3)
            if shares and min(shares)
            else None,
        }
    }
