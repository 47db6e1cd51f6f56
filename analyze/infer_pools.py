"""POSIX-only inference, the parts about who reads: pools of DataLoader workers forked anew
for every epoch (their forks mark the epochs), and files held open whose samples are regions
of them (an HDF5 file of small chunks). Used by :mod:`.infer`; times are µs as in the frame."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from dlreplay.schema import READ_OPS

__all__ = [
    "EPOCH_AGREEMENT",
    "Inferred",
    "as_float",
    "epochs_from_pools",
    "persistent_workers",
    "pool_threads",
    "reparses",
    "sample_regions",
    "whole_file_visits",
    "worker_pools",
]

#: Share of files whose visits must split evenly into the candidate epochs.
EPOCH_AGREEMENT = 0.95
#: Share of a file the distinct regions of the sample's read size must cover (the rest is the
#: format's own: HDF5's superblock, B-trees and heaps, a few KiB in any file).
REGION_COVERAGE = 0.4


@dataclass(frozen=True)
class Inferred:
    """One inferred value and the evidence it rests on (plain words with the numbers)."""

    value: float | int | None
    evidence: str


def as_float(x: object) -> float:
    """A polars aggregate (median, max; possibly null) as a float, null as 0."""
    return float(x) if isinstance(x, (int, float)) else 0.0


def sample_regions(io: pl.DataFrame, visits: pl.DataFrame) -> tuple[pl.DataFrame, str] | None:
    """(visits, basis) when each process opens a file once and reads its samples as regions of
    it (an HDF5 file of small chunks, opened once per worker): every read of the sample's size
    (the largest of the sizes read at the most places) is one sample's visit. None when files are opened per sample (the
    opens already count them) or the reads show no such regions."""
    reads = io.filter(
        pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("offset").is_not_null()
    )
    if reads.is_empty() or visits.is_empty():
        return None
    # held open: a file opened about once by each process that reads it (the consumer may look
    # at it once more, before it reads); opened per sample (or batch), the opens are the visits
    opens_per_file = visits.group_by("file").len()
    readers = reads.group_by("file").agg(pl.col("pid").n_unique().alias("procs"))
    held = opens_per_file.join(readers, on="file").filter(pl.col("len") <= pl.col("procs") + 1)
    if held.height < 0.5 * opens_per_file.height:
        return None
    # the sample's read: of the sizes read at the most distinct places (a per-sample label or
    # index entry is read as often, in a few bytes), the largest; and the samples are the data,
    # not the format's metadata that every process reads at each open (HDF5's B-tree nodes and
    # heaps): a size's regions cover REGION_COVERAGE of the file, or each region is read by at
    # most half the processes that read the file (the workers share the samples out)
    fsize = reads.group_by("file").agg((pl.col("offset") + pl.col("size")).max().alias("f"))
    share = (
        reads.group_by("file", "size", "offset")
        .agg(pl.col("pid").n_unique().alias("p"))
        .join(readers, on="file")
        .group_by("size")
        .agg((pl.col("p") / pl.col("procs")).median().alias("share"))
    )
    per_size = (
        reads.group_by("file", "size")
        .agg(pl.col("offset").n_unique().alias("n"))
        .join(fsize, on="file")
        .group_by("size")
        .agg(
            pl.col("n").sum().alias("places"),
            (pl.col("n") * pl.col("size") / pl.col("f")).median().alias("cover"),
        )
        .join(share, on="size")
        .filter((pl.col("cover") >= REGION_COVERAGE) | (pl.col("share") <= 0.5))
    )
    if per_size.is_empty():
        return None
    most = as_float(per_size["places"].max())
    size = int(as_float(per_size.filter(pl.col("places") >= 0.5 * most)["size"].max()))
    own = reads.filter(pl.col("size") == size)
    regions = as_float(own.group_by("file").agg(pl.col("offset").n_unique())["offset"].median())
    opens = as_float(visits.group_by("file").len()["len"].median())
    # a process reads several regions for each open of the file
    per_open = (
        own.group_by("pid", "file")
        .agg(pl.col("offset").n_unique().alias("r"))
        .join(visits.group_by("pid", "file").len(), on=["pid", "file"])
        .select((pl.col("r") / pl.col("len")).median())
        .item()
    )
    if regions < 2 or as_float(per_open) < 2:
        return None
    out = own.select(
        "pid", "file", "ts", (pl.col("ts") + pl.col("dur").fill_null(0)).alias("end"), "offset"
    ).sort("ts")
    return out, (
        f"reads of {size:,} B, the largest size read at the most places: each process opens a file "
        f"once ({opens:.0f} opens per file) and reads {regions:.0f} distinct regions of it"
    )


#: share of a held-open file's sample regions that must be visited the same number of times
#: (the passes) for :func:`region_passes` to cut the visits by it
REGION_PASS_SHARE = 0.5


def region_passes(v: pl.DataFrame) -> tuple[int, str, pl.DataFrame] | None:
    """(E, evidence, *v* with ``epoch``) for visits of sample regions (*v*'s ``file`` names a
    region) read E times, most of them: a sample read through a buffer makes no call when it
    lies in the bytes the previous one brought in (a worker keeps each file's buffer: 30 % of
    the lines of files of 32 short lines), so regions show fewer visits and the visits do
    not split into even passes. E is the count most regions have (more than
    :data:`REGION_PASS_SHARE` of them, E >= 2); the k-th visit of those regions is in
    pass k, and every visit is in the pass whose first such visit came last before it. None
    where the passes overlap in time (the k-th visits of the regions not all after the
    (k-1)-th) or no count is so common."""
    counts = v.group_by("file").agg(pl.len().alias("n"))
    if counts.is_empty():
        return None
    common = counts.group_by("n").agg(pl.len().alias("regions")).sort("regions", descending=True)
    e, most = int(common["n"][0]), int(common["regions"][0])
    if e < 2 or most <= REGION_PASS_SHARE * counts.height:
        return None
    modal = counts.filter(pl.col("n") == e)["file"].implode()
    kth = (
        v.filter(pl.col("file").is_in(modal))
        .sort("ts")
        .with_columns(pl.int_range(pl.len()).over("file").alias("k"))
        .group_by("k")
        .agg(pl.col("ts").min().alias("a"), pl.col("ts").max().alias("b"))
        .sort("k")
    )
    a, b = kth["a"].to_numpy(), kth["b"].to_numpy()
    if len(a) != e or bool((a[1:] <= b[:-1]).any()):  # a pass began before the last ended
        return None
    epoch = np.clip(np.searchsorted(a, v["ts"].to_numpy(), side="right") - 1, 0, e - 1)
    out = v.with_columns(pl.Series("epoch", epoch, dtype=pl.Int64))
    ev = (
        f"{v.height} visits of {counts.height} file regions; {most} of them ({most / counts.height:.0%})"
        f" visited {e}x, one after another: {e} passes in time order (a region read fewer "
        "times was in the bytes a previous read brought in)"
    )
    return e, ev, out


def worker_pools(
    io: pl.DataFrame, traced_pids: set[int] | None, lifetimes: pl.DataFrame | None = None
) -> pl.DataFrame | None:
    """The reading worker processes (children of a traced process) with their pool: per parent,
    workers alive at the same time are one pool, and a pool forked after the previous one
    ended is a new one (non-persistent workers: a new pool every epoch). Columns pid, ppid,
    a, b (first and last event, µs: of any kind where ``lifetimes`` (pid, a, b) gives them, else
    of the reads), pool (0, 1, ... per parent), and ``ended`` where ``lifetimes`` has it (b is
    the process's exit: DFTracer's end record); None without workers."""
    if traced_pids is None:
        return None
    reads = io.filter(
        pl.col("name").is_in(READ_OPS)
        & (pl.col("size") > 0)
        & pl.col("ppid").is_in(list(traced_pids))
    )
    if reads.is_empty():
        return None
    procs = reads.group_by("pid", "ppid").agg(
        pl.len().alias("n"),
        pl.col("ts").min().alias("a"),
        (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("b"),
    )
    if lifetimes is not None:  # a worker lives from its start to its last event of any kind
        keep = [c for c in ("pid", "a", "b", "ended") if c in lifetimes.columns]
        procs = procs.drop("a", "b").join(lifetimes.select(keep), on="pid")
    # a process reading a small share (the consumer's look at a file) is no worker
    procs = procs.filter(pl.col("n") >= 0.25 * pl.col("n").median()).sort("ppid", "a")
    if procs.is_empty():
        return None
    new = (pl.col("a") > pl.col("b").cum_max().shift(1).over("ppid")).fill_null(False)
    return procs.with_columns(new.cast(pl.Int64).cum_sum().over("ppid").alias("pool"))


def epochs_from_pools(
    visits: pl.DataFrame, pools: pl.DataFrame | None
) -> tuple[Inferred, pl.DataFrame, list[tuple[int, int, int]]] | None:
    """(epochs, the pools' visits with ``epoch``, spans) when every parent forked two or more
    pools of workers one after another, each pool as many workers, a like share of the visits
    (within half the median) and nearly every file: each pool is one epoch, its workers'
    visits; else None."""
    if pools is None:
        return None
    per_parent = pools.group_by("ppid").agg(pl.col("pool").max() + 1)
    n_pools = int(as_float(per_parent["pool"].max()))
    if n_pools < 2 or per_parent["pool"].n_unique() != 1:
        return None
    sizes = pools.group_by("ppid", "pool").len()["len"]
    if sizes.min() != sizes.max():
        return None
    # a visit belongs to the epoch of the pool its process is one of
    tagged = (
        visits.drop("epoch", strict=False)
        .join(pools.select("pid", pl.col("pool").alias("epoch")), on="pid")
        .sort("ts")
    )
    share = tagged.group_by("epoch").len()["len"]
    med = as_float(share.median())
    if (
        share.len() != n_pools
        or as_float(share.min()) < 0.5 * med
        or as_float(share.max()) > 1.5 * med
    ):
        return None
    # a pool is a pass: it visits (nearly) every file (workers that started one after the
    # other, each reading its part, are one pool seen apart)
    covered = tagged.group_by("epoch").agg(pl.col("file").n_unique())["file"]
    if as_float(covered.min()) < EPOCH_AGREEMENT * visits["file"].n_unique():
        return None
    spans = (
        tagged.group_by("epoch")
        .agg(pl.col("ts").min().alias("a"), pl.col("end").max().alias("b"))
        .sort("epoch")
    )
    workers = int(as_float(sizes.max()))
    ev = (
        f"{n_pools} pools of {workers} worker process(es) per consumer, each forked after the "
        f"previous one ended (non-persistent workers: a new pool every epoch); each pool read "
        f"{int(as_float(share.min()))}-{int(as_float(share.max()))} sample visits"
    )
    return (
        Inferred(n_pools, ev),
        tagged,
        [(int(e), int(a), int(b)) for e, a, b in spans.iter_rows()],
    )


def persistent_workers(pools: pl.DataFrame | None, epochs: Inferred) -> Inferred:
    """Whether the workers live across epochs: a pool per epoch (False), or one pool reading
    in every one of two or more epochs (True)."""
    if pools is None:
        return Inferred(None, "no worker processes read the samples")
    n = int(as_float(pools["pool"].max())) + 1
    if n >= 2:
        return Inferred(False, f"a new pool of worker processes for every epoch ({n} pools)")
    if int(epochs.value or 0) >= 2:
        return Inferred(True, f"the same worker processes read in all {epochs.value} epochs")
    return Inferred(None, "one epoch: persistence not visible")


def whole_file_visits(reads: pl.DataFrame, visits: pl.DataFrame) -> bool:
    """True when the sample files' ``reads`` (file, offset, size) add up to a whole file per
    visit (90 % or more): each visit then reads its file whole, whatever the samples in it."""
    if reads.is_empty() or visits.is_empty():
        return False
    sizes = reads.group_by("file").agg(
        (pl.col("offset") + pl.col("size")).max().alias("fsize"), pl.col("size").sum().alias("b")
    )
    per = sizes.join(visits.group_by("file").len(), on="file")
    ratio = per.select((pl.col("b") / (pl.col("fsize") * pl.col("len"))).median()).item()
    return as_float(ratio) >= 0.9


def pool_threads(pools: pl.DataFrame, per_epoch: bool = True) -> tuple[Inferred, int]:
    """(read threads, consumers) from the worker pools (*per_epoch*: forked for every epoch,
    else living across them): the most workers in one pool of one consumer, and the
    consumers (the pools' parents)."""
    per = pools.group_by("ppid", "pool").len()["len"]
    threads = int(as_float(per.max()))
    parents = pools["ppid"].n_unique()
    return Inferred(
        threads,
        f"{threads} worker processes in each pool "
        + ("forked for an epoch" if per_epoch else "(the workers alive together)")
        + (f", for each of {parents} consumers" if parents > 1 else ""),
    ), parents


#: Share of a file's bytes read since the last read of its start that makes a new access.
WHOLE_FILE = 0.9


def reparses(io: pl.DataFrame, opens: pl.DataFrame) -> pl.DataFrame | None:
    """Visits of files of one sample each that a loader keeps open (a worker caching its
    handles): it parses the file again through the handle for every sample (``np.load`` of a
    kept file object reads the zip's magic from the file's start, then its directory), so
    each open's first read, from offset 0, comes again at each sample, after reads of other
    files (a read of a file's start again within one access, a buffered reader's, is none).
    Those reads, (pid, file, ts, end) in time order, where they outnumber the opens; else
    None (a file opened for every sample reads its first read once an open)."""
    r = (
        io.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0))
        .select(
            "pid",
            "file",
            "ts",
            (pl.col("ts") + pl.col("dur").fill_null(0)).alias("end"),
            "offset",
            "size",
        )
        .sort("ts")
        .with_columns(
            (pl.col("file") != pl.col("file").shift(1).over("pid")).fill_null(True).alias("back"),
            # the bytes this process read of the file before each read, and the file's size
            (pl.col("size").cum_sum() - pl.col("size")).over("pid", "file").alias("before"),
            (pl.col("offset") + pl.col("size")).max().over("file").alias("fsize"),
        )
        .filter(pl.col("offset") == 0)
        # a whole access since the last read of the file's start: a new one, even with no
        # other file between (a worker that meets the file at an epoch's end and next start)
        .with_columns(
            (
                pl.col("back")
                | (
                    (pl.col("before") - pl.col("before").shift(1).over("pid", "file"))
                    >= WHOLE_FILE * pl.col("fsize")
                )
            ).alias("back")
        )
    )
    if r.is_empty():
        return None
    o = opens.select("pid", "file", pl.col("ts").alias("o_ts")).sort("o_ts")
    tagged = r.join_asof(
        o,
        left_on="ts",
        right_on="o_ts",
        by=["pid", "file"],
        strategy="backward",
        check_sortedness=False,
    ).drop_nulls("o_ts")
    first = tagged.group_by("pid", "file", "o_ts").agg(pl.col("size").first().alias("p_size"))
    again = tagged.join(first, on=["pid", "file", "o_ts"]).filter(
        (pl.col("size") == pl.col("p_size")) & pl.col("back")
    )
    if again.height <= opens.height:
        return None
    return again.select("pid", "file", "ts", "end").sort("ts")
