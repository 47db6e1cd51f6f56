"""A Dataset's own side files in POSIX calls alone: files of another extension in the samples'
folder that the job reads through once, before its first sample, and never again (a
JSON-lines Dataset's ``shard_00000.idx.npy`` line offsets, loaded as it is made). With the
loader's events the items tell them apart (:func:`.observe._read_in_items`); without, they
looked like samples ("6 files x 1 sample(s)": 3 index files and 3 JSON-lines files)."""

from __future__ import annotations

from pathlib import PurePosixPath

import polars as pl

from dlreplay.schema import OPEN_OPS

from .base import Facts
from .measure import file_sizes

#: the samples' files are read over and over (several epochs): this many times their bytes
AGAIN = 1.5


def read_ahead_side_files(
    paths: list[str], io: pl.DataFrame, reads: pl.DataFrame, facts: Facts
) -> tuple[list[str], pl.DataFrame, pl.DataFrame]:
    """(paths, io, reads) without the files of one extension that were each opened once and
    read through once (at most 110 % of their bytes), all before the first read of the other
    files, which were read :data:`AGAIN` times their bytes or more (samples over epochs).
    Unchanged where the files have one extension, or no extension's files read so."""
    ext = {p: PurePosixPath(p).suffix.lower() for p in paths}
    if len(set(ext.values())) < 2 or reads.is_empty():
        return paths, io, reads
    sizes = file_sizes(io).select(pl.col("file").cast(pl.String), "size")
    per = (
        reads.with_columns(pl.col("file").cast(pl.String))
        .group_by("file")
        .agg(
            pl.col("size").sum().alias("read"),
            pl.col("ts").min().alias("t0"),
            pl.col("ts").max().alias("t1"),
        )
        .join(sizes, on="file")
        .with_columns(pl.col("file").replace_strict(ext, default="").alias("ext"))
    )
    opens = (
        io.filter(pl.col("name").cast(pl.String).is_in(OPEN_OPS))
        .group_by(pl.col("file").cast(pl.String))
        .agg(pl.len().alias("opens"))
    )
    per = per.join(opens, on="file", how="left").with_columns(pl.col("opens").fill_null(0))
    for e in sorted(set(ext.values())):
        side, rest = per.filter(pl.col("ext") == e), per.filter(pl.col("ext") != e)
        if side.is_empty() or rest.is_empty():
            continue
        once = bool(
            ((side["opens"] <= 1) & (side["read"] <= 1.1 * side["size"])).all()
            and (rest["read"] >= AGAIN * rest["size"]).all()
        )
        if once and side["t1"].max() < rest["t0"].min():  # type: ignore[operator]
            keep = [p for p in paths if ext[p] != e]
            facts.notes.append(
                f"left out {side.height} {e or 'extensionless'} file(s) of the dataset's folder "
                "read through once before the first sample and never again, while the others "
                "were read over and over (the Dataset's own side files): "
                + ", ".join(PurePosixPath(f).name for f in side["file"].to_list()[:5])
            )
            return (
                keep,
                io.filter(pl.col("file").is_in(keep)),
                reads.filter(pl.col("file").is_in(keep)),
            )
    return paths, io, reads
