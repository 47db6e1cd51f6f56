"""The POSIX loop inference's time per step and per sample where the plain intervals do not
show them (:mod:`.infer`): a loader worker's decoding between two samples of a batch, the
consumer's step from each epoch's span when the workers read too few batches an epoch for a
steady interval, and the time (µs) that pauses cover in intervals. Times in µs in, seconds
out (as the field they stand for)."""

from __future__ import annotations

import numpy as np
import polars as pl

from .infer_batch import idle_gaps
from .infer_pools import Inferred, as_float

__all__ = [
    "batch_starts",
    "epoch_span_steps",
    "overlap_us",
    "per_epoch",
    "steady_batch_intervals",
    "warmup_count",
    "worker_intervals",
    "worker_sample_time",
]

_US = 1e-6


def overlap_us(a: pl.Series, b: pl.Series, spans: pl.DataFrame) -> pl.Series:
    """Per interval [a, b): the time (µs) covered by ``spans`` (ts, end; non-overlapping
    after a merge), from cumulative coverage at the interval's ends."""
    s = spans.select("ts", "end").sort("ts")
    # merge overlapping spans, then cumulative covered time at every span edge
    s = s.with_columns(pl.col("end").cum_max().shift(1).alias("__prev")).with_columns(
        (pl.col("__prev").is_null() | (pl.col("ts") > pl.col("__prev"))).cum_sum().alias("__g")
    )
    m = s.group_by("__g").agg(pl.col("ts").min(), pl.col("end").max()).sort("ts")
    starts, ends = m["ts"].to_numpy(), m["end"].to_numpy()
    before = np.concatenate([[0], np.cumsum(ends - starts)])

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, t, side="right")  # spans starting at or before t
        full = before[np.maximum(i - 1, 0)]
        part = np.where(
            i > 0,
            np.clip(t - starts[np.maximum(i - 1, 0)], 0, (ends - starts)[np.maximum(i - 1, 0)]),
            0,
        )
        return np.where(i > 0, full + part, 0)

    return pl.Series((covered(b.to_numpy()) - covered(a.to_numpy())).astype(np.int64))


def worker_sample_time(visits: pl.DataFrame, io: pl.DataFrame, batch: int) -> Inferred:
    """A loader worker's time per sample outside its I/O (seconds): the median of its longest
    silence (:func:`idle_gaps`) before each sample of a batch but the batch's first, its
    decoding of the sample before, which the replay's workers spend per sample."""
    if batch < 2:
        return Inferred(None, "no batch of more than one sample")
    g = idle_gaps(visits, io).sort("pid", "ts")
    pos = pl.int_range(pl.len()).over("pid", "epoch")
    inner = g.filter((pos % batch != 0) & pl.col("gap").is_not_null())["gap"]
    if inner.is_empty():
        return Inferred(None, "no batch of more than one sample")
    per = as_float(inner.median()) * _US
    return Inferred(
        per,
        f"median silence of a loader worker between two samples of a batch ({inner.len()} "
        f"samples): {per:.6f} s",
    )


def epoch_span_steps(
    starts: pl.DataFrame, pools: pl.DataFrame, pauses: pl.DataFrame | None
) -> tuple[np.ndarray, str]:
    """(the consumer's time per step of each epoch, how it was found) where the workers read
    too few batches an epoch for a steady interval (every batch prefetched at once): the
    epoch's batch *i* arrives at ``r_i`` (its last read's end; batch *i* is worker ``i % W``'s,
    the workers in the order they started) and the consumer takes a step of ``C`` seconds
    once it has the batch, so its last step ends at ``max_i(r_i + (N - i) C)``; that is the
    epoch's end ``E`` (for workers forked anew every epoch the pool's first worker to end,
    else the next epoch's first read; the pauses in between taken out), so ``C = min_i (E - r_i) /
    (N - i)``. ``C`` holds the step's compute and the loop's own time around it (the batch's
    hand-over): an upper bound on the compute, and what a replay must spend. The first
    epoch (its warm-up) is left out where a later one is measured. The last epoch of workers
    that live on ends where its checkpoint starts (:func:`_last_epoch_by_checkpoint`), else
    at the workers' exit (an upper bound: the smaller of it and the first epoch's is taken).
    Each consumer (the workers' parent: a rank) is measured over its own workers' batches,
    whose steps are its own; their steps are taken together."""
    if "ppid" in pools.columns and pools["ppid"].n_unique() > 1:
        parts = [
            _consumer_span_steps(
                starts.filter(pl.col("pid").is_in(own["pid"].implode())), own, pauses
            )
            for _, own in pools.group_by("ppid", maintain_order=True)
        ]
        vals = [v for v, _ in parts if v.size]
        what = parts[0][1] + f" (each of {len(parts)} consumers over its own workers' batches)"
        return (np.concatenate(vals) if vals else np.array([])), what
    return _consumer_span_steps(starts, pools, pauses)


def _consumer_span_steps(
    starts: pl.DataFrame, pools: pl.DataFrame, pauses: pl.DataFrame | None
) -> tuple[np.ndarray, str]:
    """:func:`epoch_span_steps` of one consumer's workers."""
    spans, left_at = _epoch_spans(starts, pools)
    spans, closed = _last_epoch_by_checkpoint(spans, pauses)
    exited = None  # the last epoch measured to its workers' exit: an upper bound
    if spans and spans[-1][2] is None and left_at is not None and left_at > spans[-1][1].max():
        exited = spans[-1][0]
        spans[-1] = (exited, spans[-1][1], left_at)
    out: list[tuple[int, float]] = []
    for e, r, end in spans:
        if end is None:  # its end is not in the reads
            continue
        span = np.full(r.size, float(end))
        if pauses is not None and pauses.height:
            # each batch's time to the epoch's end less the pauses in it (a checkpoint
            # before batch i's arrival is no time of the steps after it)
            span -= overlap_us(
                pl.Series(r.astype(np.int64)), pl.Series(span.astype(np.int64)), pauses
            ).to_numpy()
        left = r.size - np.arange(r.size)  # steps from batch i's arrival to the epoch's end
        step = float(np.min((span - r) / left))
        if step > 0:
            out.append((e, step * _US))
    exact = [c for e, c in out[1:] if e != exited]
    tighter = not exact and exited is not None and len(out) > 1
    if exact:
        vals = np.asarray(exact)
    elif tighter:  # the first epoch's (warm-up in) and the last's to the workers' exit (what
        # the job did after its last step in): both upper bounds, the smaller the tighter
        vals = np.asarray([min(c for _, c in out)])
    else:
        vals = np.asarray([c for _, c in out[:1]])
    first_only = len(out) == 1 and out[0][0] == min(starts["epoch"].unique().to_list())
    return vals, (
        "the consumer's time per step from each epoch's span (its batches' arrival to the "
        "pool's end or the next epoch's first read) over its steps: compute and the loop's "
        "own time, an upper bound on the compute (too few batches a worker for a steady "
        "interval)"
        + ("; the first epoch's alone, its warm-up included: a guess" if first_only else "")
        + (
            "; the smaller of the first epoch's (its warm-up in) and the last epoch's up to "
            "its workers' exit (whatever the job did after its last step in): a guess"
            if tighter
            else ""
        )
        + (
            "; the last epoch ends where its checkpoint starts, as each earlier one's did"
            if closed
            else ""
        )
    )


def _epoch_spans(
    starts: pl.DataFrame, pools: pl.DataFrame
) -> tuple[list[tuple[int, np.ndarray, float | None]], float | None]:
    """((epoch, batch arrivals in batch order, end) of each epoch, µs; end None for the last
    epoch of workers that live on), and that epoch's workers' exit where the trace shows it
    (DFTracer's end record, ``pools.ended``; else their last event is only a read): None."""
    ends = pools.select("pid", "b")
    left_at = None
    spans: list[tuple[int, np.ndarray, float | None]] = []
    for e in sorted(starts["epoch"].unique().to_list()):
        mine = starts.filter(pl.col("epoch") == e)
        order = mine.group_by("pid").agg(pl.col("t0").min()).sort("t0")["pid"]
        w = order.len()
        ranked = mine.join(
            pl.DataFrame({"pid": order, "__w": pl.int_range(w, eager=True)}), on="pid"
        ).sort(pl.col("batch") * w + pl.col("__w"))
        later = starts.filter(pl.col("epoch") > e)
        others = starts.filter((pl.col("epoch") != e) & pl.col("pid").is_in(order.implode()))
        if others.is_empty():  # a pool forked for this epoch alone: it ends with the epoch
            # (its first worker to end is the nearest to the epoch's end: each one's exit
            # after the consumer's last step takes its own time)
            end = ends.filter(pl.col("pid").is_in(order.implode()))["b"].min()
        else:  # workers that live on: the next epoch's first read; None for the last epoch
            end = later["t0"].min() if later.height else None
            if end is None and "ended" in pools.columns:  # they exit when the loader goes
                gone = pools.filter(pl.col("pid").is_in(order.implode()) & pl.col("ended"))
                first_gone = gone["b"].min()
                left_at = float(first_gone) if isinstance(first_gone, (int, float)) else None
        r = ranked["t1"].to_numpy().astype(np.float64)
        if r.size and (end is None or isinstance(end, (int, float))):
            spans.append((int(e), r, None if end is None else float(end)))
    return spans, left_at


def _last_epoch_by_checkpoint(
    spans: list[tuple[int, np.ndarray, float | None]], pauses: pl.DataFrame | None
) -> tuple[list[tuple[int, np.ndarray, float | None]], bool]:
    """*spans* (epoch, batch arrivals, end; µs) with the end of the last epoch of workers that
    live on, whose reads do not show it, taken from a checkpoint: when exactly one pause
    (checkpoint) starts after each earlier epoch's last arrival and before its end, the job
    checkpoints at every epoch's end, and the one pause after the last epoch's last arrival
    starts at its end. Returns (spans, whether the last epoch's end was found so)."""
    if len(spans) < 2 or spans[-1][2] is not None or pauses is None or pauses.is_empty():
        return spans, False
    starts = pauses["ts"].to_numpy().astype(np.float64)

    def after(r: np.ndarray, end: float) -> np.ndarray:
        return starts[(starts > r.max()) & (starts < end)]

    if not all(end is not None and after(r, end).size == 1 for _, r, end in spans[:-1]):
        return spans, False
    e, r, _ = spans[-1]
    last = after(r, np.inf)
    if last.size != 1:
        return spans, False
    return [*spans[:-1], (e, r, float(last[0]))], True


#: as distill's WARMUP_FACTOR: a leading interval longer than this x the median is warm-up
_WARMUP_FACTOR = 3.0


def warmup_count(values: np.ndarray) -> int:
    """Leading values (in time order) longer than _WARMUP_FACTOR x the median: the first
    steps of a framework are much slower than its steady state (distill leaves them out too)."""
    if values.size < 3:
        return 0
    slow = values > _WARMUP_FACTOR * float(np.median(values))
    return int(np.argmin(slow)) if not slow.all() else 0


def batch_starts(visits: pl.DataFrame, batch: int) -> pl.DataFrame:
    """Each process's batches of *batch* samples in each epoch, in its visits' order (*visits*:
    pid, epoch, ts, end µs): pid, epoch, batch, ``t0``/``t1`` (its first visit's start, its
    last's end), ``n`` samples."""
    b = visits.sort("pid", "ts").with_columns(
        (pl.int_range(pl.len()).over("pid", "epoch") // batch).alias("batch")
    )
    return (
        b.group_by("pid", "epoch", "batch")
        .agg(pl.col("ts").min().alias("t0"), pl.col("end").max().alias("t1"), pl.len().alias("n"))
        .sort("pid", "t0")
    )


def steady_batch_intervals(
    visits: pl.DataFrame, batch: int, threads: int
) -> tuple[np.ndarray, str]:
    """(compute per step of each steady-state interval, how it was found) of workers reading
    batches of *batch* samples (*visits*: pid, epoch, ts, end µs, one row per sample): the
    interval between a worker's batch starts over the *threads* workers (see
    :func:`worker_intervals`), warm-up intervals left out."""
    vals, what = worker_intervals(batch_starts(visits, batch), batch, max(threads, 1), None)
    warm = warmup_count(vals)
    return vals[warm:], what + (f", {warm} warm-up interval(s) left out" if warm else "")


def worker_intervals(
    starts: pl.DataFrame, batch: int, threads: int, pauses: pl.DataFrame | None
) -> tuple[np.ndarray, str]:
    """(compute per step of each steady-state interval, how it was found): the interval
    between a worker's batch starts (``starts``: pid, epoch, batch, t0, t1, n) over the
    ``threads`` workers, the ``pauses`` inside it taken out; the first epoch's (the run's
    warm-up in them) left out where later epochs have such intervals."""
    w = max(threads, 1)
    iv = starts.with_columns(
        (pl.col("t0") - pl.col("t0").shift(1).over("pid", "epoch")).alias("iv")
    )
    # steady state: from a worker's fourth batch of an epoch on (its first two are the
    # prefetch burst, the third's interval still runs from the burst)
    steady = iv.filter(
        (pl.col("batch") >= 3) & (pl.col("n") == batch) & pl.col("iv").is_not_null()
    ).sort("t0")
    first = steady["epoch"].min()
    if steady["epoch"].n_unique() > 1:  # the first epoch's are warm-up where later ones exist
        steady = steady.filter(pl.col("epoch") != first)
    if pauses is not None and pauses.height and steady.height:
        steady = steady.with_columns(
            (pl.col("iv") - overlap_us(steady["t0"] - steady["iv"], steady["t0"], pauses)).alias(
                "iv"
            )
        )
    vals = (steady["iv"].to_numpy() * _US / w) if steady.height else np.array([])
    # busy: a worker's batch (first sample's open to last's) over its cycle. A compute-bound
    # worker idles most of it (a few %); above a quarter the loader sets the pace and the
    # interval is the loader's period, an upper bound on the compute
    busy = (
        as_float(steady.select(((pl.col("t1") - pl.col("t0")) / pl.col("iv")).median()).item())
        if steady.height
        else 0.0
    )
    what = f"median interval between a worker's batch starts / {w} workers" + (
        f" (workers busy {busy:.0%} of it: the loader's period, an upper bound)"
        if busy > 0.25
        else ""
    )
    return vals, what


def per_epoch(frame: pl.DataFrame, spans: list[tuple[int, int, int]]) -> pl.DataFrame:
    """``frame`` with ``epoch``: the latest inferred epoch starting at or before each event."""
    if not spans:
        return frame.with_columns(pl.lit(0, pl.Int64).alias("epoch"))
    starts = pl.DataFrame(
        {"epoch": [e for e, _, _ in spans], "e_ts": [a for _, a, _ in spans]}
    ).sort("e_ts")
    out = (
        frame.drop("epoch", strict=False)
        .sort("ts")
        .join_asof(starts, left_on="ts", right_on="e_ts", strategy="backward")
    )
    return out.with_columns(pl.col("epoch").fill_null(starts["epoch"][0])).drop("e_ts")
