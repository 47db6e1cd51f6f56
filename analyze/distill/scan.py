"""``dataset.scan_read_size``: a pass over the dataset's files before the first epoch.

A Dataset often reads its files through once as it is made, to index its records: a
JSON-lines dataset notes where each line starts (``for line in f: offsets.append(pos)``), a
text dataset counts its lines, a reader of a format without an index builds one. The pass
is the consumer's (the process that iterates the loader, a rank), before it asks for its
first batch, outside any sample's item event, and it reads each file start to end. A replay
without it reads fewer bytes than its job (0.9 MiB of 6.8 for a JSON-lines job of 3 epochs)
and fewer consecutive reads (0.5 % against 12.8 %).

Found with the loader's events only (a POSIX-only trace shows such a pass as one more
epoch's reads of one process). Sizes are bytes.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from dlreplay.model import Dataset
from dlreplay.schema import READ_OPS

from .base import Facts, Observed, num
from .measure import file_sizes

#: share of each file's bytes a pass reads, and share of the files it reads so
SCAN_COVERAGE = 0.9


def with_start_scan(dataset: Dataset, events: pl.DataFrame, obs: Observed, facts: Facts) -> Dataset:
    """*dataset* with ``scan_read_size`` where each consumer read nearly every dataset file
    whole before its first batch (*events*: the whole trace's, so the pass before the training
    counts); unchanged otherwise."""
    if not obs.items.height or not obs.consumers or not obs.paths or dataset.format == "arrow":
        return dataset
    sizes = file_sizes(obs.io).select(pl.col("file").cast(pl.String), "size")
    if sizes.is_empty():
        return dataset
    first = _first_asks(obs)
    io = events.filter(
        pl.col("cat").is_in(["POSIX", "STDIO"])
        & pl.col("name").cast(pl.String).is_in(READ_OPS)
        & (pl.col("size").fill_null(0) > 0)
        & pl.col("file").is_not_null()
    ).with_columns(pl.col("file").cast(pl.String))
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
    facts.put(
        "dataset.scan_read_size",
        f"{scanners.len()} of {len(obs.consumers)} consumer(s) read {SCAN_COVERAGE:.0%} or more "
        f"of {SCAN_COVERAGE:.0%} or more of the {len(obs.paths)} dataset files before their "
        f"first batch, outside any item ({reads.len()} reads, median {size:,} B)",
        "measured",
    )
    facts.notes.append(
        f"each rank reads every dataset file through ({size:,} B reads) before its first "
        "epoch, as a Dataset that indexes its records does: the replay makes the same pass "
        "(dataset.scan_read_size; DLIO has no such key)"
    )
    return replace(dataset, scan_read_size=size)


def _first_asks(obs: Observed) -> pl.DataFrame:
    """pid, ``first``: when each consumer first asked its loader for a batch (its first fetch
    event), else its first item event (µs)."""
    asks = obs.fetch if obs.fetch.height else obs.items
    return (
        asks.filter(pl.col("pid").is_in(obs.consumers))
        .group_by("pid")
        .agg(pl.col("ts").min().alias("first"))
    )
