"""Per-file accounting and the role of every file a traced job touched.

Roles, decided in this order:

``checkpoint``
    named by a ``checkpoint`` save/load event, or written with more than 1 MiB in total
    and not read by a data-loader process (a process that emits ``item`` events).
``library``
    interpreter and system files: Python sources and bytecode, shared objects,
    ``site-packages``/``dist-packages``, ``/proc``, ``/sys``, ``/dev``, ``/etc``, ``/usr``.
``dataset``
    files the input pipeline reads. With ``data_dirs``: read files under those
    directories, and when the trace has ``item`` events, only those read by a process
    that emits them (markers read by the main process are not samples). Without
    ``data_dirs``: files read by processes that emit ``item`` events; without such
    events: files read more than once (several opens) or by several processes.
``other``
    everything else (logs, directories, sockets, ...).

Sizes are bytes; counts are events.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import numpy as np
import polars as pl

from dlreplay.schema import CAT_CHECKPOINT, CAT_DATA, OPEN_OPS, READ_OPS, WRITE_OPS

from . import vocabulary as voc

__all__ = ["CHECKPOINT_WRITE_BYTES", "ROLES", "classify_files", "file_process_table", "file_process_table_keyed",
           "loader_processes"]

ROLES = ("dataset", "checkpoint", "library", "other")
#: Written bytes above which a file not read by the loader counts as a checkpoint.
CHECKPOINT_WRITE_BYTES = 1 << 20

_LIBRARY_RE = (
    r"(^/(proc|sys|dev|etc|usr|lib|lib64|bin|sbin|run)(/|$))"
    r"|(/(site|dist)-packages/)|(/lib/python\d)|(/__pycache__/)"
    r"|(\.(py|pyc|pyo|pyd|pth|so|a|la)$)|(\.so(\.\d+)+$)|(/pyvenv\.cfg$)|(/bin/python[\d.]*$)"
)

_READ, _WRITE, _OPEN = 1, 2, 3
_OP_CLASS = {**{n: _READ for n in READ_OPS}, **{n: _WRITE for n in WRITE_OPS}, **{n: _OPEN for n in OPEN_OPS}}

CLASSIFY_SCHEMA = {
    "file": pl.String(), "role": pl.String(), "bytes_read": pl.Int64(), "bytes_written": pl.Int64(),
    "reads": pl.Int64(), "writes": pl.Int64(), "opens": pl.Int64(), "processes": pl.Int64(),
}


def collect(query: pl.LazyFrame, events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Run ``query`` over ``events``: with polars' streaming engine when ``events`` is a
    LazyFrame (a table spilled to disk, see :mod:`.spill`), else in memory."""
    return query.collect(engine="streaming") if isinstance(events, pl.LazyFrame) else query.collect()


def loader_processes(events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """(host, pid) of the processes that emit ``item`` events (data-loader workers)."""
    events = _with_roles(events)
    return collect(
        events.lazy()
        .filter(_role_is(events, "item", (pl.col("cat") == CAT_DATA) & (pl.col("name") == "item")))
        .select("host", "pid")
        .unique(),
        events,
    )


def _with_roles(events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame | pl.LazyFrame:
    """An in-memory table built without the loader (by hand, by an older dlreplay) gets its roles."""
    return voc.ensure_roles(events) if isinstance(events, pl.DataFrame) else events


def _role_is(events: pl.DataFrame | pl.LazyFrame, role: str | tuple[str, ...], spelled: pl.Expr) -> pl.Expr:
    """Rows of a vocabulary role (:mod:`.vocabulary`); tables without roles: dlreplay's own spelling."""
    names = events.collect_schema().names() if isinstance(events, pl.LazyFrame) else events.columns
    if "role" not in names:
        return spelled
    return pl.col("role").is_in([role] if isinstance(role, str) else list(role)).fill_null(False)


#: checkpoint names of dlreplay's capture: DFTracer's AI conventions (capture/restart) and format_version 1
_CKPT_LOADS, _CKPT_SAVES = ("load", "restart"), ("save", "capture")


def _process_rows(keys: list[str]) -> list[pl.Expr]:
    """Per-row values of :func:`file_process_table` (after :func:`_with_classes`), with ``keys``."""
    size = pl.col("size").fill_null(0)
    op, ckpt = pl.col("__op"), pl.col("__ckpt")

    def when(cond: pl.Expr, value: pl.Expr) -> pl.Expr:
        return pl.when(cond).then(value).otherwise(0)

    return [
        *(pl.col(k) for k in keys),
        when(op == _READ, size).alias("rb"), when(op == _WRITE, size).alias("wb"),
        when(ckpt & (pl.col("__ck") == 1), size).alias("ck_r"), when(ckpt & (pl.col("__ck") == 2), size).alias("ck_w"),
        (op == _READ).cast(pl.Int64).alias("reads"), (op == _WRITE).cast(pl.Int64).alias("writes"),
        (op == _OPEN).cast(pl.Int64).alias("opens"), ckpt.alias("ckpt_event"),
    ]


def _with_classes(rows: pl.LazyFrame) -> pl.LazyFrame:
    """``rows`` with ``__op`` (operation class of ``name``), ``__ckpt`` (a checkpoint event) and
    ``__ck`` (1: a checkpoint load, 2: a save, by role where the table has roles)."""
    if "role" in rows.collect_schema().names():
        role = pl.col("role")
        ckpt = role.is_in(["checkpoint.save", "checkpoint.load", "checkpoint.io"]).fill_null(False)
        ck = pl.when(role == "checkpoint.load").then(1).when(role == "checkpoint.save").then(2).otherwise(0)
    else:
        ckpt = pl.col("cat") == CAT_CHECKPOINT
        ck = pl.when(pl.col("name").is_in(_CKPT_LOADS)).then(1).when(pl.col("name").is_in(_CKPT_SAVES)) \
            .then(2).otherwise(0)
    return rows.with_columns(pl.col("name").replace_strict(_OP_CLASS, default=0, return_dtype=pl.Int8).alias("__op"),
                             ckpt.alias("__ckpt"), ck.alias("__ck"))


_SUMS = [pl.exclude("ckpt_event").sum(), pl.col("ckpt_event").any()]


def file_process_table(events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per (file, host, pid): bytes read/written (I/O calls and checkpoint events), call counts.

    One group-by over the event table (a LazyFrame: a streaming query); :func:`classify_files`
    and the summary aggregate this much smaller table. ``loader`` marks processes that
    emit ``item`` events. Row order is unspecified.
    """
    events = _with_roles(events)
    table = collect(
        _with_classes(events.lazy().filter(pl.col("file").is_not_null()))
        .select(_process_rows(["file", "host", "pid"]))
        .group_by("pid", "host", "file")  # the integer key first groups fastest
        .agg(_SUMS)
        .select("file", "host", "pid", pl.exclude("file", "host", "pid")),
        events,
    )
    loaders = loader_processes(events).with_columns(pl.lit(True).alias("loader"))
    return table.join(loaders, on=["host", "pid"], how="left", nulls_equal=True).with_columns(
        pl.col("loader").fill_null(False))


#: Largest packed (file, process, row class) key space counted with dense arrays.
_DENSE_KEYS = 1 << 24


def file_process_table_keyed(rows: pl.DataFrame, files: pl.Series, processes: pl.DataFrame) -> pl.DataFrame:
    """:func:`file_process_table` from events whose file and process are integer keys.

    ``rows`` has ``name``, ``cat``, ``size`` and ``__file`` (UInt32 index into ``files``,
    distinct paths; null: no file) and ``__proc`` (UInt32 index into ``processes``,
    distinct (``host``, ``pid``) rows), in any order. The loader, which has these keys,
    uses it; the result equals :func:`file_process_table` of the table.

    Rows are counted, and their bytes summed, per (file, process, row class) packed into
    one integer (the row class: operation class x checkpoint load/save/other): with
    ``numpy.bincount`` over a dense key space (up to :data:`_DENSE_KEYS`, and while all
    bytes together stay below 2**53, so float64 sums are exact), else one polars
    group-by; the classes are then spread into the columns on the small result.
    """
    nproc = max(processes.height, 1)
    name = pl.col("name")
    ckpt = (pl.col("cat") == CAT_CHECKPOINT).fill_null(False)
    ck_class = pl.when(~ckpt).then(0).when(name.is_in(_CKPT_LOADS)).then(1).when(name.is_in(_CKPT_SAVES)).then(2) \
        .otherwise(3)
    row_class = name.replace_strict(_OP_CLASS, default=0, return_dtype=pl.Int64) + 4 * ck_class
    key = (pl.col("__file").cast(pl.Int64) * nproc + pl.col("__proc").cast(pl.Int64)) * 16 + row_class
    v = rows.lazy().filter(pl.col("__file").is_not_null()).select(
        key.alias("__k"), pl.col("size").fill_null(0).alias("b")).collect()
    k, size = v["__k"].to_numpy(), v["b"].to_numpy()
    nkeys = files.len() * nproc * 16
    if nkeys <= _DENSE_KEYS and float(np.abs(size).sum(dtype=np.float64)) < 2.0**53:
        count = np.bincount(k, minlength=nkeys)
        at = np.flatnonzero(count)
        parts = pl.DataFrame({"__k": at, "b": np.bincount(k, weights=size, minlength=nkeys)[at].astype(np.int64),
                              "n": count[at].astype(np.int64)})
    else:
        parts = v.group_by("__k").agg(pl.col("b").sum(), pl.len().cast(pl.Int64).alias("n"))
    op, ck, b, n = pl.col("__k") % 4, (pl.col("__k") // 4) % 4, pl.col("b"), pl.col("n")

    def where(cond: pl.Expr, value: pl.Expr) -> pl.Expr:
        return pl.when(cond).then(value).otherwise(0)

    # per-row values first, then plain sums (a conditional inside agg runs group by group)
    table = parts.select(
        (pl.col("__k") // 16).alias("__key"),
        where(op == _READ, b).alias("rb"), where(op == _WRITE, b).alias("wb"),
        where(ck == 1, b).alias("ck_r"), where(ck == 2, b).alias("ck_w"),
        where(op == _READ, n).alias("reads"), where(op == _WRITE, n).alias("writes"),
        where(op == _OPEN, n).alias("opens"), (ck > 0).alias("ckpt_event"),
    ).group_by("__key").agg(_SUMS)
    loaders = rows.lazy().filter((pl.col("cat") == CAT_DATA) & (name == "item")).select("__proc").unique() \
        .collect()["__proc"].drop_nulls().to_numpy()
    keys = table["__key"]
    at_proc = pl.Series(keys % nproc)
    return table.select(
        files.cast(pl.String).gather(keys // nproc).alias("file"),
        processes["host"].cast(pl.String).gather(at_proc).alias("host"),
        processes["pid"].cast(pl.Int64).gather(at_proc).alias("pid"),
        pl.exclude("__key"),
        pl.Series(np.isin(np.arange(processes.height), loaders)).gather(at_proc).alias("loader"),
    )


def _empty(events: pl.DataFrame | pl.LazyFrame) -> bool:
    if isinstance(events, pl.DataFrame):
        return events.height == 0
    return collect(events.select(pl.len()), events).item() == 0


def _under(dirs: Iterable[str]) -> pl.Expr:
    """True for files inside any of ``dirs`` (absolute prefixes; relative ones match anywhere)."""
    expr = pl.lit(False)
    for d in dirs:
        d = os.path.normpath(str(d)).rstrip("/")
        if not d or d == ".":
            continue
        if d.startswith("/"):
            expr = expr | pl.col("file").str.starts_with(d + "/")
        else:
            expr = expr | pl.col("file").str.contains("/" + re.escape(d) + "/") \
                | pl.col("file").str.starts_with(d + "/")
    return expr


def classify_files(events: pl.DataFrame | pl.LazyFrame, data_dirs: Iterable[str] | None = None, *,
                   per_process: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per file: file, role, bytes_read, bytes_written, reads, writes, opens, processes.

    ``bytes_read``/``bytes_written`` are bytes transferred by read/write calls (a
    checkpoint save/load event counts when its writes/reads were not traced);
    ``processes`` counts distinct (host, pid). Sorted by bytes read, then written.
    ``per_process`` reuses a :func:`file_process_table` already computed.
    """
    if _empty(events):
        return pl.DataFrame(schema=CLASSIFY_SCHEMA)
    events = _with_roles(events)
    fp = file_process_table(events) if per_process is None else per_process
    has_loaders = bool(fp["loader"].any()) or loader_processes(events).height > 0
    per_file = fp.lazy().group_by("file").agg(
        pl.max_horizontal(pl.col("rb").sum(), pl.col("ck_r").sum()).alias("bytes_read"),
        pl.max_horizontal(pl.col("wb").sum(), pl.col("ck_w").sum()).alias("bytes_written"),
        pl.col("reads").sum(), pl.col("writes").sum(), pl.col("opens").sum(),
        pl.len().cast(pl.Int64).alias("processes"),
        pl.col("ckpt_event").any().alias("__ckpt_event"),
        (pl.col("loader") & (pl.col("reads") > 0)).any().alias("__loader_read"),
        (pl.col("reads") > 0).sum().alias("__readers"),
    )
    read = (pl.col("reads") > 0) | (pl.col("bytes_read") > 0)
    checkpoint = pl.col("__ckpt_event") | (
        (pl.col("bytes_written") > CHECKPOINT_WRITE_BYTES) & ~pl.col("__loader_read")
    )
    library = pl.col("file").str.contains(_LIBRARY_RE)
    if data_dirs:
        dataset = read & _under(data_dirs)
        if has_loaders:
            dataset = dataset & pl.col("__loader_read")
    elif has_loaders:
        dataset = read & pl.col("__loader_read")
    else:
        dataset = read & ((pl.col("opens") > 1) | (pl.col("__readers") > 1))
    role = (
        pl.when(checkpoint).then(pl.lit("checkpoint"))
        .when(library).then(pl.lit("library"))
        .when(dataset).then(pl.lit("dataset"))
        .otherwise(pl.lit("other"))
    )
    return (
        per_file.with_columns(role.alias("role"))
        .select(list(CLASSIFY_SCHEMA))
        .sort(["bytes_read", "bytes_written", "file"], descending=[True, True, False])
        .collect()
        .cast(pl.Schema(CLASSIFY_SCHEMA))
    )
