"""The summary's per-(file, process) counts, as the loader makes them: the classes of event
rows and the table of rows and bytes per (file, host, pid) built from counted keys.

:func:`dlreplay.analyze.files.file_process_table` computes the same table from an event
table; the loader counts each part's rows where the part is resolved and builds the table
with :func:`file_process_table_counted` (see :mod:`.load`). Sizes in bytes, counts in events.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from dlreplay.schema import CAT_CHECKPOINT, OPEN_OPS, READ_OPS, WRITE_OPS

__all__ = ["file_process_table_counted", "row_class"]

READ, WRITE, OPEN = 1, 2, 3
OP_CLASS = {
    **{n: READ for n in READ_OPS},
    **{n: WRITE for n in WRITE_OPS},
    **{n: OPEN for n in OPEN_OPS},
}
#: checkpoint names of dlreplay's capture: DFTracer's AI conventions (capture/restart) and format_version 1
CKPT_LOADS, CKPT_SAVES = ("load", "restart"), ("save", "capture")
SUMS = [pl.exclude("ckpt_event").sum(), pl.col("ckpt_event").any()]


def row_class() -> pl.Expr:
    """The class of an event row for :func:`~dlreplay.analyze.files.file_process_table`: operation class (read,
    write, open, other) + 4 x checkpoint class (none, load, save, other checkpoint event)."""
    name = pl.col("name")
    ckpt = (pl.col("cat") == CAT_CHECKPOINT).fill_null(False)
    ck_class = (
        pl.when(~ckpt)
        .then(0)
        .when(name.is_in(CKPT_LOADS))
        .then(1)
        .when(name.is_in(CKPT_SAVES))
        .then(2)
        .otherwise(3)
    )
    return name.replace_strict(OP_CLASS, default=0, return_dtype=pl.Int64) + 4 * ck_class


def file_process_table_counted(
    counts: pl.DataFrame, files: pl.Series, processes: pl.DataFrame, loaders: np.ndarray
) -> pl.DataFrame:
    """:func:`~dlreplay.analyze.files.file_process_table` from row counts: ``counts`` has ``__file`` (index into
    ``files``, distinct paths; rows without a file are left out), ``__proc`` (index into
    ``processes``, distinct (``host``, ``pid``) rows), ``cls`` (:func:`row_class`), ``n``
    (rows) and ``b`` (bytes), several rows per key allowed; ``loaders`` the ``__proc``
    indices of the processes that emit ``item`` events."""
    nproc = max(processes.height, 1)
    op, ck, b, n = pl.col("cls") % 4, (pl.col("cls") // 4) % 4, pl.col("b"), pl.col("n")

    def where(cond: pl.Expr, value: pl.Expr) -> pl.Expr:
        return pl.when(cond).then(value).otherwise(0)

    # per-row values first, then plain sums (a conditional inside agg runs group by group)
    table = (
        counts.select(
            (pl.col("__file").cast(pl.Int64) * nproc + pl.col("__proc").cast(pl.Int64)).alias(
                "__key"
            ),
            where(op == READ, b).alias("rb"),
            where(op == WRITE, b).alias("wb"),
            where(ck == 1, b).alias("ck_r"),
            where(ck == 2, b).alias("ck_w"),
            where(op == READ, n).alias("reads"),
            where(op == WRITE, n).alias("writes"),
            where(op == OPEN, n).alias("opens"),
            (ck > 0).alias("ckpt_event"),
        )
        .group_by("__key")
        .agg(SUMS)
    )
    keys = table["__key"]
    at_proc = pl.Series(keys % nproc)
    return table.select(
        files.cast(pl.String).gather(keys // nproc).alias("file"),
        processes["host"].cast(pl.String).gather(at_proc).alias("host"),
        processes["pid"].cast(pl.Int64).gather(at_proc).alias("pid"),
        pl.exclude("__key"),
        pl.Series(np.isin(np.arange(processes.height), loaders)).gather(at_proc).alias("loader"),
    )
