"""The passes over the training loop: data wait and compute per step (AU, as dlreplay and as
DLIO count it), epoch times, dataset I/O overlapped with compute, and checkpoint saves."""

from __future__ import annotations

import polars as pl

from dlreplay.schema import SYNC_OPS, WRITE_OPS

from ..distill.measure import WARMUP_FACTOR
from ..trace import vocabulary as voc
from .numbers import US, num, rounded, stats
from .view import TraceView, kernel_overlapped, kernels_loaded

__all__ = ["au_dlio", "pass_checkpoints", "pass_epochs", "pass_overlap", "pass_steps"]


def _au(fr: pl.DataFrame, data_only: bool = False) -> float | None:
    """compute / (compute + data wait + checkpoint + other) over the steps of ``fr``; with
    ``data_only``, compute / (compute + data wait): what the input pipeline alone costs."""
    c, w, k, o = (int(fr[x].sum()) for x in ("compute_us", "wait_us", "ckpt_us", "other_us"))
    if data_only:
        k = o = 0
    return rounded(c / (c + w + k + o), 4) if c + w + k + o else None


def au_dlio(st: pl.DataFrame) -> float | None:
    """AU as DLIO 2.0's statistics compute it, from the trace (0..1).

    Per block (an epoch's steps up to a checkpoint, and after each): the compute of
    every step but the block's first, over the block's time less the first step's
    processing time, where DLIO starts a block after the checkpoint and the first batch
    of the block, yet its first step's time runs from the end of the checkpoint: the
    wait after a checkpoint is subtracted twice (a block's AU can pass 100 %). An
    epoch's AU is the blocks' mean weighted by their steps; the result is the mean over
    epochs and consumers. ``st`` is a :attr:`~.view.TraceView.step_table`. None without two steps in a block.
    """
    if st.height < 2:
        return None
    b = st.sort("pid", "ts").with_columns(
        pl.col("block_first").cast(pl.Int64).cum_sum().over("pid").alias("blk")
    )
    # a block after a checkpoint: DLIO's t0 is the checkpoint's end, its block starts after the fetch
    post = pl.when(pl.col("block_first") & ~pl.col("epoch_first")).then(pl.col("after_ckpt_us"))
    # a save inside a step's loop body (not DLIO's: its saves come after the step) ends the block before it
    end = pl.col("end") - pl.when(
        ~pl.col("block_first") & (pl.col("basis") != "compute events")
    ).then(pl.col("ckpt_us")).otherwise(0)
    per = (
        b.group_by("pid", "epoch", "blk")
        .agg(
            pl.col("compute_us").filter(~pl.col("block_first")).sum().alias("c"),
            (
                end.max()
                - pl.col("end").filter(pl.col("block_first")).first()
                - post.filter(pl.col("block_first")).first().fill_null(0)
            ).alias("t"),
            pl.len().alias("n"),
        )
        .filter((pl.col("n") > 1) & (pl.col("t") > 0))
    )
    if per.is_empty():
        return None
    ep = per.group_by("pid", "epoch").agg(
        ((pl.col("c") / pl.col("t")) * pl.col("n")).sum() / pl.col("n").sum()
    )
    return rounded(ep.group_by("pid").agg(pl.col("c").mean())["c"].mean(), 4)


def _worst_waits(s: pl.DataFrame) -> list[dict]:
    """The five steps of ``s`` that waited longest for data (earliest first among equals)."""
    worst = s.sort(["wait_us", "ts"], descending=[True, False]).head(5)
    return [
        {
            "pid": r["pid"],
            "epoch": r["epoch"],
            "wait_s": rounded(r["wait_us"] * US),
            "compute_s": rounded(r["compute_us"] * US),
        }
        for r in worst.iter_rows(named=True)
    ]


def _per_epoch(s: pl.DataFrame) -> list[dict]:
    """Steps, compute, data wait, checkpoint and other time (s) and AU of each epoch of ``s``."""
    per_epoch = (
        s.group_by("epoch")
        .agg(
            pl.len().alias("steps"),
            pl.col("compute_us").sum(),
            pl.col("wait_us").sum(),
            pl.col("ckpt_us").sum(),
            pl.col("other_us").sum(),
        )
        .sort("epoch")
    )
    return [
        {
            "epoch": r["epoch"],
            "steps": r["steps"],
            "compute_s": rounded(r["compute_us"] * US),
            "wait_s": rounded(r["wait_us"] * US),
            "checkpoint_s": rounded(r["ckpt_us"] * US),
            "other_s": rounded(r["other_us"] * US),
            "au": _au(pl.DataFrame([r])),
        }
        for r in per_epoch.iter_rows(named=True)
    ]


def pass_steps(v: TraceView) -> dict:
    """Data wait vs compute per training step, AU overall and per epoch (from the trace).

    AU = compute / (compute + data wait + checkpoint time + other time), warm-up steps
    excluded (the first step, and following steps longer than WARMUP_FACTOR x the
    median). ``au_steady`` also leaves out each epoch's first step; ``au_data`` and
    ``au_data_steady`` count data wait only (compute / (compute + wait): checkpoints and
    other loop time left out), which the data-loader findings read; ``au_dlio`` is
    :func:`au_dlio` (what DLIO prints for the same run).
    """
    st = v.step_table
    if st.is_empty():
        return {
            "steps": 0,
            "au": None,
            "per_epoch": [],
            "missing": "no training-loop events (fetch, step or compute; capture with `dlreplay capture`, "
            "or annotate with DFTracer's AI conventions)",
        }
    unknown = voc.unmeasured_loop_events(v.annotations)
    if unknown:  # taken as 0 s they would make data wait, compute and AU up
        return {
            "steps": 0,
            "unmeasured_steps": st.height,
            "au": None,
            "per_epoch": [],
            "missing": f"{unknown} training-loop event(s) with a negative or impossible duration "
            "(read as null; see the trace file warnings): data wait, compute and AU not measured",
        }
    s = st.filter(~pl.col("warm"))
    if s.is_empty():
        s = st

    waits = s["wait_us"]
    comp_med = num(s["compute_us"].median())
    starved = s.filter(pl.col("wait_us") > pl.col("compute_us"))
    steady = s.filter(~pl.col("epoch_first"))
    return {
        "steps": st.height,
        "warmup_steps": int(st["warm"].sum()),
        "au": _au(s),
        # without the first batch of each epoch (worker start-up, first prefetch)
        "au_steady": _au(steady) if steady.height else None,
        "au_data": _au(s, data_only=True),
        "au_data_steady": _au(steady, data_only=True) if steady.height else None,
        "au_dlio": au_dlio(st),
        "basis": st["basis"][0],
        "epoch_start_wait_s": rounded(num(s.filter(pl.col("epoch_first"))["wait_us"].sum()) * US),
        "epoch_lead_in_s": rounded(num(st["lead_in_us"].sum()) * US),
        "compute_s": rounded(num(s["compute_us"].sum()) * US),
        "wait_s": rounded(num(waits.sum()) * US),
        "checkpoint_s": rounded(num(s["ckpt_us"].sum()) * US),
        "other_s": rounded(num(s["other_us"].sum()) * US),
        "median_compute_s": rounded(comp_med * US),
        "median_wait_s": rounded(num(waits.median()) * US),
        "steps_waiting_longer_than_compute": starved.height,
        "worst_waits": _worst_waits(s),
        "per_epoch": _per_epoch(s),
        "warmup_factor": WARMUP_FACTOR,
    }


def pass_epochs(v: TraceView) -> dict:
    """Epoch wall times (s) per consumer, and where they come from (``basis``)."""
    ep = v.epochs.sort("ts")
    return {
        "epochs": [
            {"pid": r["pid"], "epoch": r["epoch"], "time_s": rounded(r["dur"] * US)}
            for r in ep.iter_rows(named=True)
        ],
        "basis": ep["basis"][0] if ep.height else None,
    }


def pass_overlap(v: TraceView) -> dict:
    """Share of dataset I/O time spent while the consumer computes (overlapped).

    Each dataset I/O call belongs to a consumer (itself, or its parent for a loader
    worker); the part of the call inside one of that consumer's step intervals
    counts as overlapped. Loader workers overlap; a loader without workers cannot.
    """
    st = v.steps
    n_io, io_us = v.collect(v.dataset_query().select(pl.len(), pl.col("dur").sum())).row(0)
    if not n_io or st.is_empty():
        return {
            "overlap": None,
            "io_time_s": rounded(num(io_us) * US) if n_io else 0.0,
            "missing": "no dataset I/O" if not n_io else "no step events",
        }
    cons = v.consumers or st["pid"].unique().to_list()
    overlapped, total = (kernel_overlapped if kernels_loaded() else _overlapped_polars)(v, st, cons)
    in_consumer = num(
        v.collect(v.dataset_query(pl.col("pid").is_in(cons)).select(pl.col("dur").sum())).item()
    )
    return {
        "overlap": rounded(overlapped / total, 4) if total else None,
        "io_time_s": rounded(total * US),
        "overlapped_s": rounded(overlapped * US),
        "io_in_consumer_s": rounded(in_consumer * US),
    }


def _overlapped_polars(v: TraceView, st: pl.DataFrame, cons: list[int]) -> tuple[int, int]:
    """:func:`~.view.kernel_overlapped` as polars queries (the definition; without the C kernels): each
    call's step by a backward ``join_asof``, one batch of processes at a time."""
    steps = (
        st.lazy()
        .select(
            pl.col("pid").alias("owner"),
            pl.col("ts").alias("s_ts"),
            (pl.col("ts") + pl.col("dur")).alias("s_end"),
        )
        .sort("s_ts")
    )
    # (min_horizontal skips nulls: a call before any step must count 0, not its whole duration)
    inside = pl.when(pl.col("s_end").is_not_null()).then(
        (pl.min_horizontal(pl.col("ts") + pl.col("dur"), pl.col("s_end")) - pl.col("ts")).clip(
            lower_bound=0
        )
    )
    overlapped = total = 0
    for batch in v.pid_batches:  # the sums add up
        calls = v.by_ts(
            v.dataset_query(batch).select(
                pl.when(pl.col("pid").is_in(cons))
                .then(pl.col("pid"))
                .otherwise(pl.col("ppid"))
                .alias("owner"),
                "ts",
                pl.col("dur").fill_null(0),
            )
        )
        j = calls.join_asof(
            steps,
            left_on="ts",
            right_on="s_ts",
            by="owner",
            strategy="backward",
            check_sortedness=False,
        )
        ov, every = v.collect(
            j.select(inside.fill_null(0).sum().alias("ov"), pl.col("dur").sum().alias("all"))
        ).row(0)
        overlapped += int(ov or 0)
        total += int(every or 0)
        del calls, j
    return overlapped, total


def pass_checkpoints(v: TraceView) -> dict:
    """Checkpoint saves: count, bytes, time, share of the run, write calls, fsync."""
    saves = v.saves
    ck_files = sorted(set(v.role_files("checkpoint")) | set(saves["file"].drop_nulls().to_list()))
    ck_io = v.collect(v.io_lazy.filter(pl.col("file").is_in(ck_files)).select("name", "size"))
    writes = ck_io.filter(pl.col("name").is_in(WRITE_OPS) & (pl.col("size") > 0))
    syncs = ck_io.filter(pl.col("name").is_in(SYNC_OPS)).height
    cons = set(v.consumers)
    save_s = num(saves["dur"].sum()) * US
    blocked = (
        float(saves.filter(pl.col("pid").is_in(list(cons)))["dur"].sum() or 0) * US
        if cons
        else save_s
    )
    # share of the training loop (steps + waits); the run's wall time also holds start-up
    st = v.step_table
    loop_us = (
        int(
            st.select(
                pl.col("wait_us").sum() + pl.col("compute_us").sum() + pl.col("ckpt_us").sum()
            ).item()
            or 0
        )
        if st.height
        else 0
    )
    dur = loop_us * US if loop_us else v.duration_s
    nbytes = int(saves["size"].sum() or 0) if saves.height else int(writes["size"].sum() or 0)
    return {
        "saves": saves.height,
        "loads": v.role(voc.CKPT_LOAD).height,
        "files": len(ck_files),
        "bytes": nbytes,
        "time_s": rounded(save_s),
        "blocked_s": rounded(blocked),
        "share_of_training": rounded(blocked / dur, 4) if dur else None,
        "training_s": rounded(dur),
        "training_basis": "steps + data waits" if loop_us else "whole trace",
        "save_time": stats(saves["dur"] * US),
        "bandwidth_bps": rounded(nbytes / save_s, 1) if save_s else None,
        "write_calls": writes.height,
        "write_size": stats(writes["size"]),
        "fsyncs": syncs,
        "writes_visible": writes.height > 0,
    }
