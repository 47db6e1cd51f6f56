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

from dlreplay.schema import CAT_CHECKPOINT, CAT_DATA

from .trace import vocabulary as voc
from .trace.counts import CKPT_LOADS as _CKPT_LOADS
from .trace.counts import CKPT_SAVES as _CKPT_SAVES
from .trace.counts import OP_CLASS as _OP_CLASS
from .trace.counts import OPEN as _OPEN
from .trace.counts import READ as _READ
from .trace.counts import SUMS as _SUMS
from .trace.counts import WRITE as _WRITE
from .trace.counts import file_process_table_counted, row_class

__all__ = [
    "CHECKPOINT_WRITE_BYTES",
    "LIBRARY_PATTERN",
    "ROLES",
    "classify_files",
    "file_process_table",
    "file_process_table_counted",
    "file_process_table_keyed",
    "loader_processes",
    "row_class",
]

ROLES = ("dataset", "checkpoint", "library", "other")
#: Written bytes above which a file not read by the loader counts as a checkpoint.
CHECKPOINT_WRITE_BYTES = 1 << 20

_LIBRARY_RE = (
    r"(^/(proc|sys|dev|etc|usr|lib|lib64|bin|sbin|run)(/|$))"
    r"|(/(site|dist)-packages/)|(/lib/python\d)|(/__pycache__/)"
    r"|(\.(py|pyc|pyo|pyd|pth|so|a|la)$)|(\.so(\.\d+)+$)|(/pyvenv\.cfg$)|(/bin/python[\d.]*$)"
)
#: Regex of the interpreter's and the system's files (role ``library``).
LIBRARY_PATTERN = _LIBRARY_RE


CLASSIFY_SCHEMA = {
    "file": pl.String(),
    "role": pl.String(),
    "bytes_read": pl.Int64(),
    "bytes_written": pl.Int64(),
    "reads": pl.Int64(),
    "writes": pl.Int64(),
    "opens": pl.Int64(),
    "processes": pl.Int64(),
}


def collect(query: pl.LazyFrame, events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Run ``query`` over ``events``: with polars' streaming engine when ``events`` is a
    LazyFrame (a table spilled to disk, see :mod:`.spill`), else in memory."""
    return (
        query.collect(engine="streaming") if isinstance(events, pl.LazyFrame) else query.collect()
    )


#: dlreplay's own files in a data folder (a generated dataset's manifest, journal, claim).
_OWN_RE = r"(?:^|/)\.dlreplay-[^/]*$"


def has_loader_processes(
    events: pl.DataFrame | pl.LazyFrame, per_process: pl.DataFrame | None = None
) -> bool:
    """True when some process of ``events`` is a data-loader worker (:func:`loader_processes`)."""
    fp = file_process_table(events) if per_process is None else per_process
    return bool(fp["loader"].any()) or loader_processes(events).height > 0


def loader_processes(events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """(host, pid) of the processes that emit ``item`` or ``items`` events (data-loader workers:
    a map-style Dataset's items, a batch of ``__getitems__`` or an IterableDataset's fetch)."""
    events = _with_roles(events)
    return collect(
        events.lazy()
        .filter(
            _role_is(
                events,
                ("item", "items"),
                (pl.col("cat") == CAT_DATA) & pl.col("name").is_in(["item", "items"]),
            )
        )
        .select(pl.col("host").cast(pl.String), pl.col("pid").cast(pl.Int64))
        .unique(),
        events,
    )


def _with_roles(events: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame | pl.LazyFrame:
    """An in-memory table built without the loader (by hand, by an older dlreplay) gets its roles."""
    return voc.ensure_roles(events) if isinstance(events, pl.DataFrame) else events


def _role_is(
    events: pl.DataFrame | pl.LazyFrame, role: str | tuple[str, ...], spelled: pl.Expr
) -> pl.Expr:
    """Rows of a vocabulary role (:mod:`.vocabulary`); tables without roles: dlreplay's own spelling."""
    names = events.collect_schema().names() if isinstance(events, pl.LazyFrame) else events.columns
    if "role" not in names:
        return spelled
    return pl.col("role").is_in([role] if isinstance(role, str) else list(role)).fill_null(False)


def _process_rows(keys: list[str]) -> list[pl.Expr]:
    """Per-row values of :func:`file_process_table` (after :func:`_with_classes`), with ``keys``."""
    size = pl.col("size").fill_null(0)
    op, ckpt = pl.col("__op"), pl.col("__ckpt")

    def when(cond: pl.Expr, value: pl.Expr) -> pl.Expr:
        return pl.when(cond).then(value).otherwise(0)

    return [
        *(pl.col(k) for k in keys),
        when(op == _READ, size).alias("rb"),
        when(op == _WRITE, size).alias("wb"),
        when(ckpt & (pl.col("__ck") == 1), size).alias("ck_r"),
        when(ckpt & (pl.col("__ck") == 2), size).alias("ck_w"),
        (op == _READ).cast(pl.Int64).alias("reads"),
        (op == _WRITE).cast(pl.Int64).alias("writes"),
        (op == _OPEN).cast(pl.Int64).alias("opens"),
        ckpt.alias("ckpt_event"),
    ]


def _with_classes(rows: pl.LazyFrame) -> pl.LazyFrame:
    """``rows`` with ``__op`` (operation class of ``name``), ``__ckpt`` (a checkpoint event) and
    ``__ck`` (1: a checkpoint load, 2: a save, by role where the table has roles)."""
    if "role" in rows.collect_schema().names():
        role = pl.col("role")
        ckpt = role.is_in(["checkpoint.save", "checkpoint.load", "checkpoint.io"]).fill_null(False)
        ck = (
            pl.when(role == "checkpoint.load")
            .then(1)
            .when(role == "checkpoint.save")
            .then(2)
            .otherwise(0)
        )
    else:
        ckpt = pl.col("cat") == CAT_CHECKPOINT
        ck = (
            pl.when(pl.col("name").is_in(_CKPT_LOADS))
            .then(1)
            .when(pl.col("name").is_in(_CKPT_SAVES))
            .then(2)
            .otherwise(0)
        )
    return rows.with_columns(
        pl.col("name").replace_strict(_OP_CLASS, default=0, return_dtype=pl.Int8).alias("__op"),
        ckpt.alias("__ckpt"),
        ck.alias("__ck"),
    )


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
        .select(
            pl.col("file").cast(pl.String),
            pl.col("host").cast(pl.String),
            pl.col("pid").cast(pl.Int64),
            pl.exclude("file", "host", "pid"),
        ),
        events,
    )
    loaders = loader_processes(events).with_columns(pl.lit(True).alias("loader"))
    return table.join(loaders, on=["host", "pid"], how="left", nulls_equal=True).with_columns(
        pl.col("loader").fill_null(False)
    )


#: Largest packed (file, process, row class) key space counted with dense arrays.
_DENSE_KEYS = 1 << 24


def file_process_table_keyed(
    rows: pl.DataFrame, files: pl.Series, processes: pl.DataFrame
) -> pl.DataFrame:
    """:func:`file_process_table` from events whose file and process are integer keys.

    ``rows`` has ``name``, ``cat``, ``size`` and ``__file`` (UInt32 index into ``files``,
    distinct paths; null: no file) and ``__proc`` (UInt32 index into ``processes``,
    distinct (``host``, ``pid``) rows), in any order. The result equals
    :func:`file_process_table` of the table.

    Rows are counted, and their bytes summed, per (file, process, row class) packed into
    one integer (:func:`row_class`): with ``numpy.bincount`` over a dense key space (up
    to :data:`_DENSE_KEYS`, and while all bytes together stay below 2**53, so float64
    sums are exact), else one polars group-by; then :func:`file_process_table_counted`.
    """
    nproc = max(processes.height, 1)
    key = (
        pl.col("__file").cast(pl.Int64) * nproc + pl.col("__proc").cast(pl.Int64)
    ) * 16 + row_class()
    v = (
        rows.lazy()
        .filter(pl.col("__file").is_not_null())
        .select(key.alias("__k"), pl.col("size").fill_null(0).alias("b"))
        .collect()
    )
    k, size = v["__k"].to_numpy(), v["b"].to_numpy()
    nkeys = files.len() * nproc * 16
    if nkeys <= _DENSE_KEYS and float(np.abs(size).sum(dtype=np.float64)) < 2.0**53:
        count = np.bincount(k, minlength=nkeys)
        at = np.flatnonzero(count)
        parts = pl.DataFrame(
            {
                "__k": at,
                "b": np.bincount(k, weights=size, minlength=nkeys)[at].astype(np.int64),
                "n": count[at].astype(np.int64),
            }
        )
    else:
        parts = v.group_by("__k").agg(pl.col("b").sum(), pl.len().cast(pl.Int64).alias("n"))
    loaders = (
        rows.lazy()
        .filter((pl.col("cat") == CAT_DATA) & pl.col("name").is_in(["item", "items"]))
        .select("__proc")
        .unique()
        .collect()["__proc"]
        .drop_nulls()
        .to_numpy()
    )
    counts = parts.select(
        (pl.col("__k") // 16 // nproc).alias("__file"),
        (pl.col("__k") // 16 % nproc).alias("__proc"),
        (pl.col("__k") % 16).alias("cls"),
        "n",
        "b",
    )
    return file_process_table_counted(counts, files, processes, loaders)


def _empty(events: pl.DataFrame | pl.LazyFrame) -> bool:
    if isinstance(events, pl.DataFrame):
        return events.height == 0
    return collect(events.select(pl.len()), events).item() == 0


def _under(dirs: Iterable[str]) -> pl.Expr:
    """True for files inside any of ``dirs`` (absolute prefixes; relative ones match anywhere)."""
    expr = pl.lit(False)
    for d in dirs:
        d = os.path.normpath(str(d))
        if d.startswith("/") and not d.strip("/"):  # a filesystem root holds every absolute path
            expr = expr | pl.col("file").str.starts_with("/")
            continue
        d = d.rstrip("/")
        if not d or d == ".":
            continue
        if d.startswith("/"):
            expr = expr | pl.col("file").str.starts_with(d + "/")
        else:
            expr = (
                expr
                | pl.col("file").str.contains("/" + re.escape(d) + "/")
                | pl.col("file").str.starts_with(d + "/")
            )
    return expr


def classify_files(
    events: pl.DataFrame | pl.LazyFrame,
    data_dirs: Iterable[str] | None = None,
    *,
    per_process: pl.DataFrame | None = None,
    by_loader: bool = True,
) -> pl.DataFrame:
    """One row per file: file, role, bytes_read, bytes_written, reads, writes, opens, processes.

    ``bytes_read``/``bytes_written`` are bytes transferred by read/write calls (a
    checkpoint save/load event counts when its writes/reads were not traced);
    ``processes`` counts distinct (host, pid). Sorted by bytes read, then written.
    ``per_process`` reuses a :func:`file_process_table` already computed. ``by_loader``
    False: the rules of a trace without loader events, even where it has them (a comparison
    with such a trace classifies both sides alike). dlreplay's own files (``.dlreplay-*``: a
    generated dataset's manifest) are never the dataset.
    """
    if _empty(events):
        return pl.DataFrame(schema=CLASSIFY_SCHEMA)
    events = _with_roles(events)
    fp = file_process_table(events) if per_process is None else per_process
    has_loaders = by_loader and has_loader_processes(events, fp)
    per_file = (
        fp.lazy()
        .group_by("file")
        .agg(
            pl.max_horizontal(pl.col("rb").sum(), pl.col("ck_r").sum()).alias("bytes_read"),
            pl.max_horizontal(pl.col("wb").sum(), pl.col("ck_w").sum()).alias("bytes_written"),
            pl.col("reads").sum(),
            pl.col("writes").sum(),
            pl.col("opens").sum(),
            pl.len().cast(pl.Int64).alias("processes"),
            pl.col("ckpt_event").any().alias("__ckpt_event"),
            (pl.col("loader") & (pl.col("reads") > 0)).any().alias("__loader_read"),
            (pl.col("reads") > 0).sum().alias("__readers"),
        )
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
    dataset = dataset & ~pl.col("file").str.contains(_OWN_RE)
    role = (
        pl.when(checkpoint)
        .then(pl.lit("checkpoint"))
        .when(library)
        .then(pl.lit("library"))
        .when(dataset)
        .then(pl.lit("dataset"))
        .otherwise(pl.lit("other"))
    )
    return (
        per_file.with_columns(role.alias("role"))
        .select(list(CLASSIFY_SCHEMA))
        .sort(["bytes_read", "bytes_written", "file"], descending=[True, True, False])
        .collect()
        .cast(pl.Schema(CLASSIFY_SCHEMA))
    )
