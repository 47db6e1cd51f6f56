"""``dataset.scan_read_size``: a pass over the dataset's files before the first epoch.

A Dataset often reads its files through once as it is made, to index its records: a
JSON-lines dataset notes where each line starts (``for line in f: offsets.append(pos)``), a
text dataset counts its lines, a reader of a format without an index builds one. The pass
is the consumer's (the process that iterates the loader, a rank), before it asks for its
first batch, outside any sample's item event, and it reads each file start to end. A replay
without it reads fewer bytes than its job (0.9 MiB of 6.8 for a JSON-lines job of 3 epochs)
and fewer consecutive reads (0.5 % against 12.8 %).

Found with the loader's events, or from POSIX calls alone: where workers read the samples,
the consumer's reads before their first epoch; where the consumer reads its own samples
through files it keeps open, each file's first open read through before the file is opened
again (:func:`index_pass`; else the pass looks like one more epoch). Sizes are bytes.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from dlreplay.model import Dataset
from dlreplay.schema import OPEN_OPS, READ_OPS

from .base import Facts, Observed, num
from .measure import file_sizes

#: share of each file's bytes a pass reads, and share of the files it reads so
SCAN_COVERAGE = 0.9


def with_start_scan(dataset: Dataset, events: pl.DataFrame, obs: Observed, facts: Facts) -> Dataset:
    """*dataset* with ``scan_read_size`` where each consumer read nearly every dataset file
    whole before its first batch (*events*: the whole trace's, so the pass before the training
    counts); unchanged otherwise."""
    if not obs.paths or dataset.format == "arrow":
        return dataset
    first, sure = _first_asks(obs)
    if first is None:
        return dataset
    sizes = file_sizes(obs.io).select(pl.col("file").cast(pl.String), "size")
    if sizes.is_empty():
        return dataset
    io = events.filter(
        pl.col("cat").is_in(["POSIX", "STDIO"])
        & pl.col("name").cast(pl.String).is_in(READ_OPS)
        & (pl.col("size").fill_null(0) > 0)
        & pl.col("file").is_not_null()
    ).with_columns(pl.col("file").cast(pl.String))
    if first.is_empty():  # a POSIX-only trace: before the first epoch, any process
        first = io.select("pid").unique().with_columns(pl.lit(_first_epoch(obs)).alias("first"))
    before = io.join(first, on="pid").filter(
        (pl.col("ts") < pl.col("first")) & pl.col("file").is_in(obs.paths)
    )
    if before.is_empty():
        return dataset
    per = (
        before.group_by("pid", "file")
        .agg(pl.col("size").sum().alias("read"))
        .join(sizes, on="file")
        .filter(pl.col("read") >= SCAN_COVERAGE * pl.col("size"))
    )
    whole = per.group_by("pid").len()
    scanners = whole.filter(pl.col("len") >= SCAN_COVERAGE * len(obs.paths))["pid"]
    if scanners.is_empty():
        return dataset
    reads = before.filter(pl.col("pid").is_in(scanners.implode()))["size"]
    size = int(num(reads.median(), 0))
    if size <= 0:
        return dataset
    who = (
        f"{scanners.len()} of {len(obs.consumers)} consumer(s)"
        if sure
        else f"{scanners.len()} process(es) (POSIX calls alone: before the workers' first epoch)"
    )
    facts.put(
        "dataset.scan_read_size",
        f"{who} read {SCAN_COVERAGE:.0%} or more of {SCAN_COVERAGE:.0%} or more of the "
        f"{len(obs.paths)} dataset files before their first batch, outside any item "
        f"({reads.len()} reads, median {size:,} B)",
        "measured" if sure else "inferred",
    )
    facts.notes.append(
        f"each rank reads every dataset file through ({size:,} B reads) before its first "
        "epoch, as a Dataset that indexes its records does: the replay makes the same pass "
        "(dataset.scan_read_size; DLIO has no such key)"
    )
    return replace(dataset, scan_read_size=size)


def _first_asks(obs: Observed) -> tuple[pl.DataFrame | None, bool]:
    """(pid, ``first``: when each consumer first asked its loader for a batch, its first fetch
    event, else its first item event (µs); whether the loader's events told it). A POSIX-only
    trace whose workers read the samples: an empty frame (the first epoch's start holds for
    every process: :func:`_first_epoch`), as one whose consumer's pass :func:`index_pass`
    left out of the epochs; else None (a consumer reading its own samples would show its pass
    as one more epoch)."""
    if obs.items.height and obs.consumers:
        asks = obs.fetch if obs.fetch.height else obs.items
        first = (
            asks.filter(pl.col("pid").is_in(obs.consumers))
            .group_by("pid")
            .agg(pl.col("ts").min().alias("first"))
        )
        return first, True
    posix = obs.posix
    if posix is not None and (posix.read_threads.value or obs.index_pass) and posix.epoch_spans:
        return pl.DataFrame(schema={"pid": pl.Int32, "first": pl.Int64}), False
    return None, False


def _first_epoch(obs: Observed) -> int:
    """Where the POSIX inference's first epoch starts (µs)."""
    assert obs.posix is not None
    return int(min(start for _, start, _ in obs.posix.epoch_spans))


def index_pass(io: pl.DataFrame, paths: list[str]) -> pl.DataFrame | None:
    """The opens of an index pass in POSIX calls alone: ``(pid, file, a, b)``, each dataset
    file's first open by the process that made the pass (at ``a`` µs) read start to end in
    consecutive reads, up to ``b`` (the process's next open of the file, or never). Either
    the process reads the samples itself (no workers: :func:`_scan_then_reopen`) or others
    do (workers: :func:`_scan_alone`). None unless nearly every file
    (:data:`SCAN_COVERAGE`) was so."""
    opens = (
        io.filter(pl.col("name").cast(pl.String).is_in(OPEN_OPS) & pl.col("file").is_in(paths))
        .select("pid", pl.col("file").cast(pl.String), "ts")
        .sort("ts")
        .with_columns(pl.int_range(pl.len()).over("pid", "file").alias("k"))
    )
    reads = io.filter(
        pl.col("name").cast(pl.String).is_in(READ_OPS)
        & (pl.col("size").fill_null(0) > 0)
        & pl.col("offset").is_not_null()
        & pl.col("file").is_in(paths)
    ).select("pid", pl.col("file").cast(pl.String), "ts", "offset", "size")
    sizes = file_sizes(io).select(pl.col("file").cast(pl.String), pl.col("size").alias("fsize"))
    found = _scan_then_reopen(opens, reads, sizes, len(paths))
    return found if found is not None else _scan_alone(opens, reads, sizes, len(paths))


def _scan_then_reopen(
    opens: pl.DataFrame, reads: pl.DataFrame, sizes: pl.DataFrame, n_files: int
) -> pl.DataFrame | None:
    """The pass of a process that reads the samples itself: its first open of each file read
    through before it opened the file again (at ``b``), for the last time, and then read it
    through that second open at other places (seeks) or over and over (a handle kept open
    over the epochs); every pass ended before the process's first read through a second
    open. (Without seeks and over one epoch, a pass and an epoch read alike: not told
    apart.)"""
    # twice a file: the pass's open, then the one kept for the samples (a file opened again
    # every epoch is read in passes that are epochs)
    twice = opens.group_by("pid", "file").agg(pl.len().alias("n")).filter(pl.col("n") == 2)
    first = opens.filter(pl.col("k") == 0).select("pid", "file", pl.col("ts").alias("a"))
    second = opens.filter(pl.col("k") == 1).select("pid", "file", pl.col("ts").alias("b"))
    windows = first.join(second, on=["pid", "file"]).join(
        twice.select("pid", "file"), on=["pid", "file"]
    )
    if windows.height < SCAN_COVERAGE * n_files:
        return None
    later = pl.col("ts") >= pl.col("b")
    per = _runs(reads.join(windows, on=["pid", "file"]), later).join(sizes, on="file")
    scans = per.filter(
        ~pl.col("later")
        & (pl.col("jumps") == 0)
        & (pl.col("bytes") >= SCAN_COVERAGE * pl.col("fsize"))
    )
    after = per.filter(
        pl.col("later") & ((pl.col("jumps") >= 2) | (pl.col("bytes") >= 1.5 * pl.col("fsize")))
    )
    both = scans.join(after.select("pid", "file", pl.col("t0").alias("u0")), on=["pid", "file"])
    if both.height < SCAN_COVERAGE * n_files:
        return None
    # a pass before the training: every scan ends before that process's first later read
    order = both.group_by("pid").agg(
        pl.col("t1").max().alias("last"), pl.col("u0").min().alias("use")
    )
    if (order["last"] >= order["use"]).any():
        return None
    return windows.join(both.select("pid", "file"), on=["pid", "file"])


def _scan_alone(
    opens: pl.DataFrame, reads: pl.DataFrame, sizes: pl.DataFrame, n_files: int
) -> pl.DataFrame | None:
    """The pass of a process whose workers read the samples: it opened nearly every file once
    and read it through in consecutive reads, all before any other process's first read of
    the dataset, and other processes read those files after (``b``: never)."""
    once = (
        opens.group_by("pid", "file")
        .agg(pl.len().alias("n"), pl.col("ts").min().alias("a"))
        .filter(pl.col("n") == 1)
    )
    per = _runs(reads.join(once.select("pid", "file"), on=["pid", "file"]), pl.lit(False))
    scans = per.join(sizes, on="file").filter(
        (pl.col("jumps") == 0) & (pl.col("bytes") >= SCAN_COVERAGE * pl.col("fsize"))
    )
    who = scans.group_by("pid").len().filter(pl.col("len") >= SCAN_COVERAGE * n_files)["pid"]
    if who.is_empty():
        return None
    scans = scans.filter(pl.col("pid").is_in(who.implode()))
    others = reads.filter(~pl.col("pid").is_in(who.implode()))
    if others.is_empty() or scans["t1"].max() >= others["ts"].min():  # type: ignore[operator]
        return None
    scans = scans.filter(pl.col("file").is_in(others["file"].unique().implode()))
    if scans.height < SCAN_COVERAGE * n_files:
        return None
    return once.join(scans.select("pid", "file"), on=["pid", "file"]).select(
        "pid", "file", "a", pl.lit(1 << 62, pl.Int64).alias("b")
    )


def _runs(reads: pl.DataFrame, later: pl.Expr) -> pl.DataFrame:
    """Per pid, file and side of *later* (a boolean expression over the reads): bytes read, the
    reads that did not start where the one before ended (``jumps``; the first counts unless it
    starts at 0), the first and last read's times."""
    return (
        reads.sort("ts")
        .with_columns(later.alias("later"))
        .with_columns(
            (pl.col("offset") + pl.col("size")).shift(1).over("pid", "file", "later").alias("prev")
        )
        .with_columns((pl.col("offset") != pl.col("prev").fill_null(0)).alias("jump"))
        .group_by("pid", "file", "later")
        .agg(
            pl.col("size").sum().alias("bytes"),
            pl.col("jump").sum().alias("jumps"),
            pl.col("ts").min().alias("t0"),
            pl.col("ts").max().alias("t1"),
        )
    )


def without_pass(io: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """*io* without the calls of the index pass's opens (*windows*: :func:`index_pass`): each
    file's calls by that process from its first open to just before its second."""
    keyed = io.with_columns(pl.col("file").cast(pl.String).alias("__f"))
    drop = (
        keyed.join(windows.rename({"file": "__f"}), on=["pid", "__f"])
        .filter((pl.col("ts") >= pl.col("a")) & (pl.col("ts") < pl.col("b")))
        .select("pid", "__f", "ts", "name")
    )
    return keyed.join(drop, on=["pid", "__f", "ts", "name"], how="anti").drop("__f")
