"""POSIX-only inference: the training loop's parameters from the dataset I/O alone.

A plain DFTracer trace (the preload without annotations, ``dlreplay capture
--no-loader-hooks``) has no epoch, fetch or item events. What a PyTorch-style loader
leaves in the I/O still tells most of the loop:

* **epochs**: full passes over the dataset. Every file is visited (opened) the same
  number of times per epoch and epochs follow each other, so the visits sorted by time
  cut into E equal chunks give each file the same count in every chunk; E is the largest
  such count (checked on every file); without per-sample opens, bytes read over file size.
* **read threads**: the most processes reading dataset files at the same time.
* **samples per file**: opens of a file per epoch (map-style datasets open a file per
  sample); files held open: runs of consecutive reads per file per epoch.
* **batch size**: a worker builds whole batches and idles while its next batch is not
  yet wanted; the samples it reads between idle gaps are a whole number of batches, so
  the gap before every B-th sample of a worker's epoch is the longer one (collating,
  handing the batch over, idling): B is the period of the long gaps; where they stand out
  less (prefetched batches read back to back), the position of the long gaps shared by
  every worker's epoch (:mod:`.infer_batch`).
* **compute time per step**: in steady state a worker's batches start one round of all
  workers apart, so a step takes the median interval between a worker's batch starts
  divided by the workers (without workers: the consumer's idle gap between batches).

Each value comes with its evidence (the numbers it rests on) and is ``inferred``. Hard
cases: a worker that reads continuously with little per-batch work (no period in its
gaps: batch size unknown), an I/O-bound run (the "compute" time is then the loader's
period, an upper bound), prefetching at epoch starts (a worker's first three batches
are left out of the steady state: prefetch_factor 2 and the interval after it), and many workers (4 or more: intervals overlap more, the
error grows; see docs/fidelity.md, "POSIX-only traces").
Times are seconds; the frame's ``ts``/``dur`` are µs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import reduce

import numpy as np
import polars as pl

from dlreplay.schema import OPEN_OPS, READ_OPS

from .infer_batch import batch_from_gap_ranks, idle_gaps
from .infer_parts import SampleGroups, sample_groups
from .infer_pools import (
    EPOCH_AGREEMENT,
    Inferred,
    epochs_from_pools,
    persistent_workers,
    pool_threads,
    region_passes,
    reparses,
    sample_regions,
    whole_file_visits,
    worker_pools,
)
from .infer_steps import (
    batch_starts,
    epoch_span_steps,
    overlap_us,
    per_epoch,
    steady_batch_intervals,
    warmup_count,
    worker_intervals,
    worker_sample_time,
)

__all__ = [
    "Inferred",
    "PosixLoop",
    "batch_period",
    "infer_posix_loop",
    "natural_key",
    "steady_batch_intervals",
]

_US = 1e-6
#: A gap between two of a worker's samples is idle time when it exceeds this many times
#: the worker's median gap (within a batch, samples follow each other closely).
IDLE_FACTOR = 4.0


@dataclass
class PosixLoop:
    """What :func:`infer_posix_loop` found (each field ``inferred``, or None when not inferable)."""

    epochs: Inferred
    read_threads: Inferred
    samples_per_file: Inferred
    batch_size: Inferred
    computation_time: Inferred
    #: computation time per step (s) of each steady-state interval used (for a distribution)
    compute_samples: list[float] = field(default_factory=list)
    #: a consumer that reads its own samples: its silence (s) between two samples of a batch,
    #: the decoding a sample costs (its median), which the replay spends per sample
    preprocess_time: Inferred = field(default_factory=lambda: Inferred(None, "no batches"))
    #: (epoch, start µs, end µs) of each inferred epoch
    epoch_spans: list[tuple[int, int, int]] = field(default_factory=list)
    #: the files visited like samples (a marker or a file checked once is not one)
    sample_files: list[str] = field(default_factory=list)
    #: processes whose workers read the samples (a multi-rank job's ranks); 1 when no worker reads
    consumers: int = 1
    #: whether the workers live across epochs: False when a new pool is forked for every epoch
    persistent: Inferred = field(default_factory=lambda: Inferred(None, "no worker processes"))
    #: sample visits in the whole trace (opens, or reads of a held-open file's sample regions)
    visits: int = 0
    #: whether samples were read out of order (shuffled), from the order of each process's visits
    shuffled: Inferred = field(default_factory=lambda: Inferred(None, "no visits"))
    #: every visit read its file whole, and nothing in the trace told E passes of k visits per
    #: file from E/d passes of k*d samples each read with its whole file (DLIO's NPZ reader):
    #: the epochs and samples per file are a guess
    passes_guessed: bool = False
    #: the visits count a file's re-reads through a handle kept open (:func:`~.infer_pools.reparses`):
    #: the job does not open a file per sample
    kept_open: bool = False
    #: a sample reads several files (:func:`~.infer_parts.sample_groups`); None: one
    groups: SampleGroups | None = None

    def to_dict(self) -> dict:
        out: dict[str, object] = {
            k: {"value": getattr(self, k).value, "evidence": getattr(self, k).evidence}
            for k in (
                "epochs",
                "read_threads",
                "samples_per_file",
                "batch_size",
                "computation_time",
            )
        }
        out["epoch_spans_s"] = [(e, (b - a) * _US) for e, a, b in self.epoch_spans]
        return out


def _num(x: object) -> float:
    """A polars aggregate (median, max; possibly null) as a float, null as 0."""
    return float(x) if isinstance(x, (int, float)) else 0.0


def _visits(io: pl.DataFrame) -> pl.DataFrame:
    """Sample visits: opens of dataset files (pid, file, ts, end), in time order."""
    return (
        io.filter(pl.col("name").is_in(OPEN_OPS))
        .select("pid", "file", "ts", (pl.col("ts") + pl.col("dur").fill_null(0)).alias("end"))
        .sort("ts")
    )


def _read_runs(io: pl.DataFrame) -> pl.DataFrame:
    """Files held open: a visit is a run of consecutive reads of one file by one process
    (a read that starts where the previous read of that file in that process ended
    continues the run); (pid, file, ts, end) of each run's first read, in time order."""
    r = io.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0)).sort("ts")
    if r.is_empty():
        return pl.DataFrame(
            schema={"pid": pl.Int32, "file": pl.String, "ts": pl.Int64, "end": pl.Int64}
        )
    prev_end = (pl.col("offset") + pl.col("size")).shift(1).over("pid", "file")
    new = prev_end.is_null() | pl.col("offset").is_null() | (pl.col("offset") != prev_end)
    # a run also ends when the process touched another file in between
    other = (pl.col("file") != pl.col("file").shift(1).over("pid")).fill_null(True)
    r = r.with_columns((new | other).alias("__new"))
    return r.filter(pl.col("__new")).select(
        "pid", "file", "ts", (pl.col("ts") + pl.col("dur").fill_null(0)).alias("end")
    )


def _even_pass(
    chunk: pl.DataFrame,
    per_file: pl.DataFrame,
    e: int,
    reads: pl.DataFrame,
    sizes: pl.DataFrame,
) -> bool:
    """Whether the visits cut into ``e`` passes in time order (``chunk``'s ``epoch``) visit
    every file as often in each pass, and read every file whole in each (90 % of its bytes,
    the union of its reads)."""
    if e == 1:
        return True
    got = chunk.group_by("file", "epoch").len().join(per_file.rename({"len": "total"}), on="file")
    # a file counts when it is visited as often in every pass (a pass missing it: not even)
    even = got.group_by("file").agg(
        ((pl.col("len") * e == pl.col("total")).all() & (pl.len() == e)).alias("ok")
    )
    if int(even["ok"].sum()) < EPOCH_AGREEMENT * per_file.height:
        return False
    if not reads.height:
        return True
    # every read belongs to the pass of its process's latest visit of that file
    vis = chunk.select("pid", "file", pl.col("ts").alias("v_ts"), "epoch").sort("v_ts")
    tagged = reads.sort("ts").join_asof(
        vis,
        left_on="ts",
        right_on="v_ts",
        by=["pid", "file"],
        strategy="backward",
        check_sortedness=False,
    )
    # distinct bytes (the union of the reads): a chunk or sieve window read again for each of
    # its samples counts once per pass
    end = pl.col("offset") + pl.col("size")
    covered = tagged.sort("file", "epoch", "offset").with_columns(
        end.cum_max().shift(1).over("file", "epoch").alias("__seen")
    )
    new_bytes = (end - pl.max_horizontal("offset", pl.col("__seen").fill_null(0))).clip(0)
    per = covered.group_by("file", "epoch").agg(new_bytes.sum().alias("b")).join(sizes, on="file")
    # a file counts when it is read whole in every pass (not in one of them)
    whole = per.group_by("file").agg((pl.col("b") >= 0.9 * pl.col("fsize")).all().alias("w"))
    return int(whole["w"].sum()) >= EPOCH_AGREEMENT * per_file.height


#: A cut between passes falls in an idle gap when the gap is this many times the 90th
#: percentile of the other gaps between visits (an epoch ends with the loader idle while the
#: consumer takes its prefetched batches, and the next begins with a burst).
CUT_GAP_FACTOR = 2.0


def _cuts_in_gaps(ranked: pl.DataFrame, e: int) -> float:
    """The shortest gap (µs) at the cuts between ``e`` passes (visits in time order, with
    ``__k``) over the 90th percentile of the other gaps: >= CUT_GAP_FACTOR when every cut
    falls where the loader idled."""
    n = ranked.height
    gaps = ranked.select(
        "__k",
        (pl.col("ts") - pl.col("end").cum_max().shift(1)).clip(lower_bound=0).alias("gap"),
    ).drop_nulls()
    cuts = {k * n // e for k in range(1, e)}
    at = gaps.filter(pl.col("__k").is_in(list(cuts)))["gap"]
    rest = gaps.filter(~pl.col("__k").is_in(list(cuts)))["gap"]
    if at.is_empty() or rest.is_empty():
        return 0.0
    return _num(at.min()) / max(_num(rest.quantile(0.9)), 1.0)


def _epochs_from_visits(
    v: pl.DataFrame, reads: pl.DataFrame
) -> tuple[int, str, pl.DataFrame, bool] | None:
    """(E, evidence, visits with ``epoch``, guessed) for the most passes E into which the visits
    split evenly (every file as often in each, in time order) with every file read whole in
    each pass (its bytes read at least 90 % of its size), else None.

    Where every visit reads its file whole (a reader that reads a file whole for every sample),
    E passes of k visits per file read like E/d passes of k*d: the most passes whose cuts all
    fall in idle gaps of the loader (:func:`_cuts_in_gaps`) win, else the most passes, a guess
    (``guessed``)."""
    per_file = v.group_by("file").len()
    counts = per_file["len"].to_list()
    if not counts:
        return None
    n = v.height
    g = reduce(math.gcd, counts)
    sizes = reads.group_by("file").agg((pl.col("offset") + pl.col("size")).max().alias("fsize"))
    whole_visits = whole_file_visits(reads, v)
    # each consumer's visits cut in its own time order (ranks need not read in step: a rank
    # may run its epochs before another's); one consumer: the whole trace's order
    mine = pl.col("consumer") if "consumer" in v.columns else pl.lit(0)
    ranked = v.with_row_index("__k").with_columns(
        pl.int_range(pl.len()).over(mine).alias("__kc"), pl.len().over(mine).alias("__nc")
    )
    passing: list[tuple[int, pl.DataFrame]] = []
    for e in sorted((d for d in range(1, g + 1) if g % d == 0), reverse=True):
        chunk = ranked.with_columns((pl.col("__kc") * e // pl.col("__nc")).alias("epoch"))
        if _even_pass(chunk, per_file, e, reads, sizes):
            passing.append((e, chunk))
            if not whole_visits:
                break
    if not passing:
        return None
    e, chunk = passing[0]
    guessed, how = False, ""
    if whole_visits and len(passing) > 1:
        in_gaps = [
            (x, c) for x, c in passing if x > 1 and _cuts_in_gaps(ranked, x) >= CUT_GAP_FACTOR
        ]
        if in_gaps:
            e, chunk = in_gaps[0]
            how = "; every visit reads its file whole: the most passes whose cuts fall in the loader's idle gaps"
        else:
            guessed = True
            how = (
                f"; every visit reads its file whole and no cut into fewer passes falls in an idle "
                f"gap: one visit per sample assumed (a guess: {', '.join(str(x) for x, _ in passing)} passes fit)"
            )
    ev = (
        f"{n} visits of {per_file.height} files ({min(counts)}-{max(counts)} per file) split into "
        f"{e} passes in time order, each file visited {g // e}x and read whole in every pass{how}"
    )
    return e, ev, chunk.drop("__k", "__kc", "__nc"), guessed


def _dataset_visits(v: pl.DataFrame) -> pl.DataFrame:
    """Visits of the files visited like the rest: a file visited less than 3/4 of the median
    number of times (a marker, a stray check) is not part of the passes; a quarter where the
    visits are a held-open file's sample regions (``offset``), whose count a file's buffer
    lowers at random (a region read in the buffer of the read before makes no call: of 512
    files of 16 lines, 27 fell under 3/4)."""
    per_file = v.group_by("file").len()
    med = _num(per_file["len"].median())
    cut = 0.25 if "offset" in v.columns else 0.75
    keep = per_file.filter(pl.col("len") >= cut * med)["file"]
    return v.filter(pl.col("file").is_in(keep.implode()))


def _concurrent(frame: pl.DataFrame) -> int:
    """Most processes whose event spans overlap in time."""
    spans = frame.group_by("pid").agg(
        pl.col("ts").min().alias("a"), (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("b")
    )
    if spans.height <= 1:
        return 0
    points = pl.concat(
        [
            spans.select(pl.col("a").alias("t"), pl.lit(1).alias("d")),
            spans.select(pl.col("b").alias("t"), pl.lit(-1).alias("d")),
        ]
    ).sort(["t", "d"], descending=[False, True])
    return int(_num(points["d"].cum_sum().max()))


def _worker_gaps(v: pl.DataFrame) -> list[np.ndarray]:
    """Per process and epoch: the gaps (µs) before each of its samples but the first; NaN
    before a sample whose ``masked`` column (optional) is true."""
    gap = pl.col("ts") - pl.col("end").shift(1).over("pid", "epoch")
    if "masked" in v.columns:
        gap = (  # the first sample's has no gap (null, dropped) either way
            pl.when(pl.col("masked") & gap.is_not_null())
            .then(float("nan"))
            .otherwise(gap.cast(pl.Float64))
        )
    s = v.sort("pid", "ts").with_columns(gap.alias("gap"))
    return [
        g["gap"].drop_nulls().to_numpy().astype(float)
        for _, g in s.group_by("pid", "epoch", maintain_order=True)
        if g.height > 2
    ]


def batch_period(v: pl.DataFrame) -> tuple[int | None, str]:
    """The batch size: the period of a worker's longer gaps (see the module doc). *v*: one row
    per sample visit (``pid``, ``epoch``, ``ts``, ``end`` µs; ``masked``, optional: the gap
    before that sample is no evidence either way, as a streamed shard's open, and is left out).

    A worker reads a batch's samples back to back; between batches it collates, hands the
    batch over and, when the loader is ahead, idles: the gap before every B-th sample of a
    worker's epoch is longer. For each candidate B the score is the median gap at those
    positions are split from the others at the geometric mean of their median and the
    others' 75th percentile; the score is the share of boundaries above it less the other
    gaps above it per boundary (a multiple of B leaves boundaries among the others, a
    divisor puts inner gaps among the boundaries: both score lower). The best B wins at a
    score of 0.6 or more.
    """
    seqs = _worker_gaps(v)
    if not seqs:
        return None, "too few samples per worker and epoch"
    longest = max(len(x) for x in seqs) + 1
    best, best_score, best_ratio, n_bound = None, 0.0, 0.0, 0
    for b in range(2, max(longest // 2, 2) + 1):  # one per candidate batch size, not per event
        bound = np.concatenate([x[b - 1 :: b] for x in seqs])  # gap before sample b, 2b, ...
        other = np.concatenate([np.delete(x, np.arange(b - 1, len(x), b)) for x in seqs])
        bound, other = bound[~np.isnan(bound)], other[~np.isnan(other)]
        if bound.size < 2 or other.size < b:
            continue
        lo = max(float(np.percentile(other, 75)), 50.0)
        ratio = float(np.median(bound)) / lo
        if ratio < 2:
            continue
        cut = math.sqrt(float(np.median(bound)) * lo)
        # boundaries above the cut, less the other gaps above it (per boundary): a multiple of
        # the batch size leaves boundaries among the others, a divisor puts inner gaps in
        score = float(np.mean(bound > cut)) - float(np.sum(other > cut)) / bound.size
        if score > best_score + 0.02:
            best, best_score, best_ratio, n_bound = b, score, ratio, bound.size
    if best is None or best_score < 0.6:
        return None, (
            f"no batch period in the workers' gaps between samples (best {best}: score "
            f"{best_score:.2f}); workers read continuously"
        )
    return best, (
        f"the gap before every {best}th sample of a worker's epoch is the long one ({best_ratio:.1f}x "
        f"the others' 75th percentile; {n_bound} batch boundaries, score {best_score:.2f})"
    )


def infer_posix_loop(
    io: pl.DataFrame,
    read_threads: int | None = None,
    traced_pids: set[int] | None = None,
    pauses: pl.DataFrame | None = None,
    held_open_regions: bool = False,
    lifetimes: pl.DataFrame | None = None,
    whole_file_samples: bool = False,
) -> PosixLoop:
    """Infer the loop from ``io``: POSIX/STDIO events on the dataset files (pid, ppid, ts,
    dur, name, file, size, offset). ``read_threads`` overrides the concurrency count;
    ``traced_pids`` (every process of the trace) tells a lone reading worker from a consumer;
    ``pauses`` (``ts``, ``end`` µs: checkpoint writes) are time the loop did not compute,
    taken out of the intervals they fall in; ``held_open_regions`` (a format whose samples are
    regions of a file, HDF5): a file each process opens once is visited per sample-sized read;
    ``lifetimes`` (pid, a, b µs: each process's first and last event) tell worker pools apart;
    ``whole_file_samples`` (a format of one sample a file: NPZ, NPY, JPEG, PNG): a file read
    again from its start through a handle kept open is visited again
    (:func:`~.infer_pools.reparses`)."""
    visits = _visits(io)
    basis = "opens"
    if visits.is_empty() or visits.group_by("file").len()["len"].max() is None:
        visits, basis = _read_runs(io), "read runs"
    elif whole_file_samples and (again := reparses(io, visits)) is not None:
        visits, basis = again, "each open's first read, again through the handle kept open"
    if visits.is_empty():
        none = Inferred(None, "no dataset I/O")
        return PosixLoop(none, none, none, none, none)
    regions = sample_regions(io, visits) if held_open_regions else None
    if regions is not None:
        visits, basis = regions
    # a sample of several files (an image and its mask): its first file's visit is the sample's
    groups = sample_groups(visits) if basis == "opens" else None
    if groups is not None:
        visits = visits.filter(pl.col("file").is_in([f for f, i in groups.part.items() if i == 0]))
    pools = worker_pools(io, traced_pids, lifetimes)
    visits = _with_consumer(visits, io, traced_pids)
    epochs, visits, epoch_spans, guessed = _epochs(io, _dataset_visits(visits), basis, pools)
    if read_threads is None and pools is not None and ("pools" in str(epochs.evidence) or guessed):
        # (passes guessed: an epoch's count of readers is not to be trusted, a pool's is)
        threads, consumers = pool_threads(pools, per_epoch=not guessed)
    else:
        threads, consumers = _read_threads(io, visits, epoch_spans, read_threads, traced_pids)
    spf = _samples_per_file(visits, basis)
    order = _shuffled(visits)
    batch, ev_batch = batch_period(visits)
    if batch is None:  # no clear period: where the long gaps fall in every worker's epoch
        batch, ev_ranks = batch_from_gap_ranks(idle_gaps(visits, io))
        ev_batch = ev_ranks if batch else f"{ev_batch}; {ev_ranks}"
    computation, samples, preprocess = _computation_time(
        visits, batch, int(threads.value or 0), pauses, io, pools
    )
    return PosixLoop(
        epochs=epochs,
        read_threads=threads,
        samples_per_file=spf,
        batch_size=Inferred(batch, ev_batch),
        computation_time=computation,
        compute_samples=samples,
        preprocess_time=preprocess,
        epoch_spans=epoch_spans,
        sample_files=sorted(groups.part if groups else visits["file"].unique().to_list()),
        groups=groups,
        consumers=consumers,
        persistent=persistent_workers(pools, epochs),
        passes_guessed=guessed,
        shuffled=order,
        visits=visits.height,
        kept_open=basis.startswith("each open's first read, again"),
    )


def _with_consumer(
    visits: pl.DataFrame, io: pl.DataFrame, traced_pids: set[int] | None
) -> pl.DataFrame:
    """``visits`` with ``consumer``: the process each visit's sample is read for, the
    visitor's parent where the parent is traced (a worker), else the visitor itself."""
    if traced_pids is None or "ppid" not in io.columns:
        return visits
    parents = io.select("pid", "ppid").unique("pid")
    return (
        visits.drop("consumer", strict=False)
        .join(parents, on="pid", how="left")
        .with_columns(
            pl.when(pl.col("ppid").is_in(list(traced_pids)))
            .then(pl.col("ppid"))
            .otherwise(pl.col("pid"))
            .cast(pl.Int64)
            .alias("consumer")
        )
        .drop("ppid")
    )


def _epochs(
    io: pl.DataFrame, visits: pl.DataFrame, basis: str, pools: pl.DataFrame | None = None
) -> tuple[Inferred, pl.DataFrame, list[tuple[int, int, int]], bool]:
    """(epochs, the visits with ``epoch``, (epoch, start µs, end µs) of each, whether the
    passes are a guess): one per pool of worker processes when a new pool was forked for every
    epoch (:func:`worker_pools`), else the passes the visits split into (see
    :func:`_epochs_from_visits`), else one."""
    by_pool = epochs_from_pools(visits, pools)
    if by_pool is not None:
        return (*by_pool, False)
    reads = io.filter(
        pl.col("name").is_in(READ_OPS)
        & (pl.col("size") > 0)
        & pl.col("offset").is_not_null()
        & pl.col("file").is_in(visits["file"].unique().implode())
    )
    reads = reads.select("pid", "file", "ts", "offset", "size")
    regions = "offset" in visits.columns
    if regions:  # a sample is a region of its file: each region read once per pass
        visits = visits.with_columns(
            pl.col("file").alias("__file"),
            pl.concat_str(pl.col("file"), pl.lit("@"), pl.col("offset").cast(pl.String)).alias(
                "file"
            ),
        )
        reads = reads.clear()
    split = _epochs_from_visits(visits, reads)
    if regions and (split is None or split[0] == 1) and (passes := region_passes(visits)):
        split = (*passes, False)
    guessed = False
    if split is not None:
        n_epochs, ev_epochs, visits, guessed = split
        if regions:
            ev_epochs = ev_epochs.replace(" files (", " file regions (", 1).replace(
                "each file visited", "each region visited", 1
            )
        ev_epochs = f"{ev_epochs} ({basis})"
    else:
        n_epochs, ev_epochs = 1, "visits do not split into even passes"
        visits = visits.with_columns(pl.lit(0, pl.Int64).alias("epoch"))
    if regions:
        visits = visits.with_columns(pl.col("__file").alias("file")).drop("__file")
    spans = (
        visits.group_by("epoch")
        .agg(pl.col("ts").min().alias("a"), pl.col("end").max().alias("b"))
        .sort("epoch")
    )
    epoch_spans = [(int(e), int(a), int(b)) for e, a, b in spans.iter_rows()]
    return Inferred(n_epochs, ev_epochs), visits, epoch_spans, guessed


def _read_threads(
    io: pl.DataFrame,
    visits: pl.DataFrame,
    epoch_spans: list[tuple[int, int, int]],
    read_threads: int | None,
    traced_pids: set[int] | None,
) -> tuple[Inferred, int]:
    """(read threads, the processes the samples are read for): the worker processes (children
    of a traced process) reading samples in an epoch (persistent workers read in every epoch,
    others only in theirs), per consumer (each rank of a multi-rank job has its own workers);
    none: the consumer reads itself."""
    sample_files = visits["file"].unique().implode()
    readers = io.filter(pl.col("name").is_in(READ_OPS) & pl.col("file").is_in(sample_files))
    pids = readers["pid"].n_unique()
    consumers = (
        1  # the processes the samples are read for (the workers' parents, when workers read)
    )
    if read_threads is not None:
        return Inferred(read_threads, "given"), consumers
    if traced_pids is None:
        threads = _concurrent(readers)
        return Inferred(
            threads,
            f"{threads} of the {pids} processes reading dataset files read at the same time",
        ), consumers
    # a worker counts in the epochs it reads a fair share in (a persistent worker in all;
    # reads at an epoch's edge, by the previous epoch's workers, do not count)
    work = per_epoch(readers.filter(pl.col("ppid").is_in(list(traced_pids))), epoch_spans)
    n = work.group_by("pid", "ppid", "epoch").len()
    fair = n.filter(pl.col("len") >= 0.25 * pl.col("len").median())
    # per consumer (the workers' parent: each rank of a multi-rank job has its own workers)
    per = fair.group_by("epoch", "ppid").agg(pl.col("pid").n_unique())["pid"]
    threads = int(_num(per.max())) if per.len() else 0
    parents = fair["ppid"].n_unique()
    if threads:
        consumers = parents
        ev_threads = (
            f"{threads} worker processes (children of a traced process) read samples in an "
            "epoch "
            + (f"for each of {parents} consumers " if parents > 1 else "")
            + f"({pids} reading process(es) in all)"
        )
        return Inferred(threads, ev_threads), consumers
    # no worker: each process reading a fair share reads its own samples (a rank of its own)
    own = readers.group_by("pid").len()
    consumers = max(own.filter(pl.col("len") >= 0.25 * pl.col("len").median()).height, 1)
    ev_threads = (
        f"each of {consumers} processes reads its samples itself, none a worker"
        if consumers > 1
        else "the consumer reads the samples itself"
    ) + f" ({pids} reading process(es))"
    return Inferred(threads, ev_threads), consumers


def _samples_per_file(visits: pl.DataFrame, basis: str) -> Inferred:
    """Samples per file: the median visits of a file in an epoch."""
    per = visits.group_by("file", "epoch").len()["len"]
    spf = int(_num(per.median()) or 1)
    return Inferred(
        spf,
        f"median visits per file per epoch: {spf} ({per.len()} file-epochs, "
        f"{int(_num(per.min()))}-{int(_num(per.max()))}; visits: {basis})",
    )


def _computation_time(
    visits: pl.DataFrame,
    batch: int | None,
    threads: int,
    pauses: pl.DataFrame | None,
    io: pl.DataFrame | None = None,
    pools: pl.DataFrame | None = None,
) -> tuple[Inferred, list[float], Inferred]:
    """(compute time per step, the steady-state intervals it is the median of, the time per
    sample outside its I/O of a consumer that reads its own batches): the interval between a
    worker's batch starts over the workers, or without workers the reading process's idle
    time between its batches less one sample's decoding; warm-up intervals left out. Workers
    with too few batches an epoch for a steady interval: each epoch's span (``pools``: the
    workers' lifetimes) over its steps (:func:`~.infer_steps.epoch_span_steps`)."""
    none = Inferred(None, "the samples are read by workers")
    guessed = ""
    if not batch:
        if io is None or (threads and pools is None):
            return Inferred(None, "batch size unknown"), [], Inferred(None, "batch size unknown")
        # gaps with no period in them: batch 1, as distill's reader then says, and the time
        # per sample taken as one step's: a consumer's idle time before each sample, or with
        # workers its pace over each epoch's span; so a replay spends the job's time between
        # samples whatever the batch was (it spent none: epochs a third of the job's)
        batch, guessed = 1, "batch size unknown, taken as 1: "
    starts = batch_starts(visits, batch)
    preprocess = none
    if threads and guessed:  # a worker's samples come in bursts of the unknown batch: the
        # interval between them is no step; each epoch's span over its samples is the pace
        preprocess = Inferred(None, "batch size unknown")
        assert pools is not None
        vals, what = epoch_span_steps(starts, pools, pauses)
    elif threads:
        preprocess = worker_sample_time(visits, io, batch) if io is not None else none
        vals, what = worker_intervals(starts, batch, threads, pauses)
        if vals.size < FEW_STEADY and pools is not None:
            # no or few steady intervals (one may still hold the prefetch ramp or the
            # loader's period): each epoch's span bounds the step too; the smaller wins
            span, how = epoch_span_steps(starts, pools, pauses)
            if span.size and (not vals.size or np.median(span) < np.median(vals)):
                if vals.size:
                    how += f" (under the median of the {vals.size} steady interval(s))"
                vals, what = span, how
    elif io is not None:
        vals, what, preprocess = _consumer_intervals(visits, io, batch, pauses)
    else:
        iv = starts.with_columns(
            (pl.col("t0") - pl.col("t1").shift(1).over("pid", "epoch")).alias("iv")
        )
        steady = iv.filter(pl.col("iv").is_not_null() & (pl.col("n") == batch)).sort("t0")
        vals = steady["iv"].to_numpy() * _US if steady.height else np.array([])
        what = "median idle time of the reading process between its batches"
    warm = warmup_count(vals)
    if warm:
        what += f", {warm} warm-up interval(s) left out"
        vals = vals[warm:]
    if not vals.size:
        return (
            Inferred(None, "no steady-state batches (too few per worker and epoch)"),
            [],
            preprocess,
        )
    compute = float(np.median(vals))
    return (
        Inferred(
            compute, f"{guessed}{what}: {compute:.4f} s over {vals.size} steady-state batches"
        ),
        [float(x) for x in vals],
        preprocess,
    )


def _consumer_intervals(
    visits: pl.DataFrame, io: pl.DataFrame, batch: int, pauses: pl.DataFrame | None
) -> tuple[np.ndarray, str, Inferred]:
    """(compute per step, how it was found, the time per sample outside its I/O) of a consumer
    that reads its own batches: the time it did no I/O before each batch's first sample
    (:func:`idle_gaps`), across epochs too (an epoch's last step ends where the next epoch's
    first batch is read), checkpoint writes (``pauses``) taken out, less one sample's
    decoding: the median silence before the batch's other samples, which the replay spends
    per sample (``reader.preprocess_time``), its batch's last sample included; the run's
    first step is warm-up, as distill's measured steps leave it out."""
    g = idle_gaps(visits, io).sort("pid", "ts")
    g = g.with_columns(pl.int_range(pl.len()).over("pid", "epoch").alias("__i"))
    # the batches' phase: a look at a file before the first batch shifts them; the phase
    # whose positions hold the longest gaps (median) is where the batches start
    phase = (
        g.filter(pl.col("__i") > 0)
        .group_by((pl.col("__i") % batch).alias("__p"))
        .agg(pl.col("gap").median().alias("m"))
        .sort("m", descending=True)["__p"]
    )
    shift = int(phase[0]) if phase.len() and batch > 1 else 0
    g = g.with_columns(((pl.col("__i") - shift + batch) // batch).alias("batch"))
    inner = g.filter(
        (pl.col("__i") > 0) & ((pl.col("__i") - shift) % batch != 0) & pl.col("gap").is_not_null()
    )["gap"]
    per_sample = _num(inner.median()) if batch > 1 else 0.0
    preprocess = (
        Inferred(
            per_sample * _US,
            f"median silence of the reading process between two samples of a batch "
            f"({inner.len()} samples): {per_sample * _US:.6f} s",
        )
        if inner.len()
        else Inferred(None, "no batch of more than one sample")
    )
    first = (
        g.group_by("pid", "epoch", "batch")
        .agg(pl.col("ts").first().alias("t0"), pl.col("gap").first().alias("iv"))
        .sort("pid", "t0")
        .filter(pl.int_range(pl.len()).over("pid") >= 2)  # no step before; the warm-up step
        .filter(pl.col("iv").is_not_null())
    )
    if pauses is not None and pauses.height and first.height:
        gone = overlap_us(first["t0"] - first["iv"], first["t0"], pauses)
        first = first.with_columns((pl.col("iv") - gone).alias("iv"))
    vals = (first.sort("t0")["iv"].to_numpy() - per_sample) * _US if first.height else np.array([])
    return (
        np.clip(vals, 0.0, None),
        "median idle time of the reading process before each of its batches (across epochs, "
        "checkpoint writes out, the run's first step left out) less one sample's decoding",
        preprocess,
    )


#: Fewer steady-state worker intervals than this: the epoch-span bound is taken where it is smaller.
FEW_STEADY = 4


#: Changes of file or region (per process and epoch) from which the share going forward tells
#: the sample order (under 75 %: shuffled); with fewer, a likelihood ratio decides (14 of a
#: shuffled run's went forward 12 times in the sweep: 8 workers with 2 samples each an epoch)
MIN_ORDER_MOVES = 20
#: Below MIN_ORDER_MOVES: the chance that a change goes forward in a shuffled order (a pair of
#: random draws), and in an unshuffled one (forward but for the odd look back at a file's
#: metadata or index; the sweep's unshuffled runs went forward 80-100 %)
P_FORWARD_SHUFFLED, P_FORWARD_ORDERED = 0.5, 0.9
#: ... and the likelihood ratio either way that tells the order (a 99 % posterior from even odds)
ORDER_ODDS = 100.0


def _order_odds(forward: int, moves: int) -> float:
    """Likelihood of ``forward`` of ``moves`` changes going forward in a shuffled order over
    that in an unshuffled one (binomial, :data:`P_FORWARD_SHUFFLED` / :data:`P_FORWARD_ORDERED`;
    the binomial coefficients cancel)."""
    back = moves - forward
    return (P_FORWARD_SHUFFLED**forward * (1 - P_FORWARD_SHUFFLED) ** back) / (
        P_FORWARD_ORDERED**forward * (1 - P_FORWARD_ORDERED) ** back
    )


def natural_key(name: str) -> tuple:
    """Sort key of a file name with its numbers as numbers (img_10 after img_9)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _shuffled(visits: pl.DataFrame) -> Inferred:
    """Whether samples were read out of order: each process's visits in an epoch, in time
    order, by file (in natural name order) and region; shuffled when under 75 % of the
    changes go forward (an unshuffled loader's workers each read their batches in order)."""
    files = sorted(visits["file"].cast(pl.String).unique().to_list(), key=natural_key)
    ranks = pl.DataFrame({"file": files, "__rank": range(len(files))})
    v = visits.with_columns(pl.col("file").cast(pl.String)).join(ranks, on="file")
    key = (
        pl.col("__rank") * (1 << 40) + pl.col("offset").fill_null(0)
        if "offset" in v.columns
        else pl.col("__rank")
    )
    by = ["pid", "epoch"] if "epoch" in v.columns else ["pid"]
    moves = (
        v.sort("ts")
        .select(key.diff().over(by).alias("d"))
        .filter(pl.col("d").is_not_null() & (pl.col("d") != 0))
    )
    if moves.height < MIN_ORDER_MOVES:
        forward = int(moves.select((pl.col("d") > 0).sum()).item()) if moves.height else 0
        odds = _order_odds(forward, moves.height)
        said = (
            f"{forward} of {moves.height} changes of file"
            f"{' or region' if 'offset' in v.columns else ''} in each process's visits "
            f"go forward: {odds:.3g} times likelier shuffled than in order"
        )
        if odds >= ORDER_ODDS or odds <= 1 / ORDER_ODDS:
            return Inferred(odds >= ORDER_ODDS, f"{said} (a binomial likelihood ratio)")
        return Inferred(None, f"{said}: too few changes to tell the order")
    fwd = _num(moves.select((pl.col("d") > 0).mean()).item())
    return Inferred(
        fwd < 0.75,
        f"{fwd:.0%} of {moves.height} changes of file{' or region' if 'offset' in v.columns else ''} "
        f"in each process's visits go forward (shuffled under 75 %)",
    )
