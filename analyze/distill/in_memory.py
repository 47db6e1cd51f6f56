"""A job that loads its dataset into memory as it starts (``np.load`` of whole arrays into a
``TensorDataset``, pickles read at start): it reads its files once, before its first sample,
and nothing while it trains. Distill has nothing to model and says so (the rest of its
error)."""

from __future__ import annotations

from pathlib import PurePosixPath

import polars as pl

from dlreplay.schema import OPEN_OPS, READ_OPS


def read_once(events: pl.DataFrame, data_dirs: list[str] | None) -> str:
    """The rest of the no-dataset error: the files under *data_dirs* that were read, each once
    by one process (a job that loads its dataset into memory as it starts, ``np.load`` of the
    whole array, a pickle), named as such; else where to look."""
    reads = events.filter(
        pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("file").is_not_null()
    )
    if data_dirs:
        under = pl.lit(False)
        for d in data_dirs:
            under = under | pl.col("file").cast(pl.String).str.starts_with(d.rstrip("/") + "/")
        reads = reads.filter(under)
    files = reads.select(pl.col("file").cast(pl.String)).unique()["file"].to_list()
    if not files or not data_dirs:
        return " Pass --data-dir with the dataset's path, or check the capture's --data-dir."
    opens = events.filter(pl.col("name").is_in(OPEN_OPS) & pl.col("file").is_in(files))
    once = opens.group_by("file").agg(
        pl.len().alias("n"), pl.col("pid").n_unique().alias("p")
    ).filter((pl.col("n") <= 1) & (pl.col("p") <= 1)).height == len(files)
    if not once:
        return " Check the capture's --data-dir: the files under it were read, but not by workers."
    return " Each file under the data dir was opened and read once, by one process." + in_memory(
        files
    )


def in_memory(files: list[str]) -> str:
    """What a job that read *files* once as it started, and nothing while it trained, is (the
    rest of distill's error)."""
    names = ", ".join(sorted(PurePosixPath(f).name for f in files)[:4])
    return (
        f" {len(files)} file(s) were read before the first sample and none while the job "
        f"trained ({names}{', ...' if len(files) > 4 else ''}): it holds its dataset in "
        "memory, and dlreplay models the reads a job makes while it trains, of which this one "
        "makes none."
    )
