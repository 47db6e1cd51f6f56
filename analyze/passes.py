"""Characterisation passes: what a traced job did, measured from the event table.

Each pass is a function ``pass_x(view: TraceView) -> dict`` over one shared
:class:`TraceView` (the event table plus the frames every pass needs: dataset I/O,
data-loader events, file roles), returns JSON-safe numbers and can be run and tested
alone. :func:`characterize` runs them all (or a chosen few) into a
:class:`Characterization`; the findings rules (:mod:`.findings`), the report
(:mod:`.report`) and ``compare`` read it.

Units: times in seconds (``*_s``), sizes in bytes, bandwidths in bytes/s (``*_bps``),
fractions in 0..1, counts in events. A value that the trace cannot give (for example
AU without data-loader events) is ``None``, and the pass says why under ``missing``.
"""

from __future__ import annotations

import importlib
import math
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl

from dlreplay.allocator import release_free_memory
from dlreplay.osutil import host_memory_bytes
from dlreplay.schema import (
    CLOSE_OPS,
    EVENT_SCHEMA,
    IO_CATEGORIES,
    OPEN_OPS,
    READ_OPS,
    SEEK_OPS,
    STAT_OPS,
    SYNC_OPS,
    WRITE_OPS,
)

from .distill.measure import WARMUP_FACTOR, file_ends, file_sizes, warmup_steps
from .files import classify_files, file_process_table
from .summary import Summary, summarize
from .trace import vocabulary as voc
from .trace.spill import ORDER_COL

__all__ = ["PASSES", "Characterization", "TraceView", "characterize", "darshan_pattern", "flag_reads",
           "flag_reads_lazy"]

_US = 1e-6
META_OPS = OPEN_OPS + CLOSE_OPS + STAT_OPS + SEEK_OPS
#: Bins of the bandwidth-over-time series.
TIMELINE_BINS = 120


def _f(x: Any, nd: int = 6) -> float | None:
    """A JSON-safe rounded float (None for null/NaN)."""
    if x is None:
        return None
    v = float(x)
    return None if math.isnan(v) or math.isinf(v) else round(v, nd)


def _i(x: Any) -> int:
    return int(x or 0)


def _num(x: Any) -> float:
    """A polars scalar (sum/median/max, possibly null) as a float, null as 0."""
    return float(x or 0)


#: Columns of :attr:`TraceView.dataset_io` collected from a lazy (spilled) table.
DATASET_IO_COLUMNS = ("pid", "ppid", "ts", "dur", "name", "file", "size", "offset", "ret")
#: I/O events (reads, writes, opens) above which the passes that follow every dataset read
#: (access, transfer, overlap, preprocess) take the processes in :data:`PID_BATCHES`
#: batches (:meth:`TraceView.pid_batches`): their transient columns are then held for one
#: batch at a time. Results are the same. With the C kernels (:mod:`._kernels`), only over a
#: spilled table: in memory they take row slices (:meth:`TraceView.row_batches`).
PID_BATCH_MIN_ROWS = 1 << 20
PID_BATCHES = 4
#: Rows of the in-memory table a pass's C kernel takes at a time (see :meth:`TraceView.row_batches`).
ROW_BATCH = 1 << 19
_IO = pl.col("cat").is_in(IO_CATEGORIES) & pl.col("file").is_not_null()
_DATA_READ = pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0)

try:  # the passes' per-event loops in C (``_kernels.c``); without it, the polars queries below
    _KERNELS: Any = importlib.import_module("._kernels", __package__)
except ImportError:  # pragma: no cover - the extension is optional
    _KERNELS = None
#: A null in the int64 columns handed to :mod:`._kernels` (no trace's pid or µs timestamp).
_NULL_I64 = int(np.iinfo(np.int64).min)


@dataclass
class TraceView:
    """The event table and the frames the passes share (computed once, on first use).

    ``events`` is an in-memory table, or a ``pl.LazyFrame`` over a spilled one (see
    :mod:`.spill`: the EVENT_SCHEMA columns plus :data:`ORDER_COL`). Over a LazyFrame,
    aggregations run as lazy queries on polars' streaming engine, projecting only the
    columns they need; the data-loader frames (items, fetches, steps, epochs, saves) are
    collected whole (few rows), and :attr:`dataset_io` only with
    :data:`DATASET_IO_COLUMNS` (``file`` and ``name`` categorical). Every frame keeps
    the in-memory table's row order. ``data_dirs`` selects the dataset as in
    :func:`~dlreplay.analyze.files.classify_files`; ``manifest`` is the capture's
    ``manifest.json`` (host memory, data dirs), if any.
    """

    events: pl.DataFrame | pl.LazyFrame
    manifest: dict | None = None
    data_dirs: list[str] | None = None
    #: :func:`file_process_table` of ``events`` when already known (the loader's
    #: :attr:`~.load.LoadedTrace.per_process`); computed on first use otherwise
    known_per_process: pl.DataFrame | None = None
    #: :func:`summarize` of ``events`` (with these ``data_dirs``) when already computed
    known_summary: Summary | None = None

    def __post_init__(self) -> None:
        if isinstance(self.events, pl.DataFrame):
            self.events = voc.ensure_roles(self.events)  # a table built by hand or by an older dlreplay
        if not self.data_dirs:
            self.data_dirs = list((self.manifest or {}).get("data_dirs") or []) or None

    @property
    def lazy(self) -> bool:
        """True over a LazyFrame (a spilled table)."""
        return isinstance(self.events, pl.LazyFrame)

    @property
    def scan(self) -> pl.LazyFrame:
        """The event table as a LazyFrame."""
        return self.events.lazy()

    def collect(self, query: pl.LazyFrame) -> pl.DataFrame:
        """Run ``query`` (streaming engine over a spilled table)."""
        return query.collect(engine="streaming") if self.lazy else query.collect()

    def rows(self, cond: pl.Expr, columns: Iterable[str] | None = None) -> pl.DataFrame:
        """The events matching ``cond`` in table order, with ``columns`` (default: all)."""
        cols = list(columns) if columns is not None else None
        if isinstance(self.events, pl.DataFrame):
            out = self.events.filter(cond)
            return out if cols is None else out.select(cols)
        want = cols if cols is not None else list(EVENT_SCHEMA)
        return self._ordered(self.events.filter(cond), [pl.col(c) for c in want])

    def _ordered(self, query: pl.LazyFrame, exprs: list[pl.Expr]) -> pl.DataFrame:
        """``query`` (over the spilled table) collected with ``exprs``, in table order.

        The streaming engine keeps the scan's order: spill group by group, each group in
        table order, groups in trace-file order. A stable sort by ``ts`` (nulls last)
        then gives the in-memory table's order (``ts``, trace file, line) without a
        second key; one chunk, as a filter of the in-memory table (so float sums add up
        the same way).
        """
        names = [e.meta.output_name() for e in exprs]
        extra = [] if "ts" in names else [pl.col("ts")]
        df = self.collect(query.select(*exprs, *extra))
        return df.sort("ts", nulls_last=True, maintain_order=True).select(names).rechunk()

    @cached_property
    def height(self) -> int:
        """Number of events."""
        if isinstance(self.events, pl.DataFrame):
            return self.events.height
        return int(self.collect(self.events.select(pl.len())).item())

    def role(self, *roles: str) -> pl.DataFrame:
        """Annotation events of these roles (see :mod:`.vocabulary`), in table order."""
        return self.annotations.filter(voc.has_role(roles))

    @cached_property
    def annotations(self) -> pl.DataFrame:
        """Every event with a role (few rows: the data-loader and training-loop events)."""
        return self.rows(pl.col("role").is_not_null())

    @cached_property
    def summary(self) -> Summary:
        """The one-screen summary (see :func:`~dlreplay.analyze.summary.summarize`)."""
        if self.known_summary is not None:
            return self.known_summary
        return summarize(self.events, data_dirs=self.data_dirs, per_process=self.per_process)

    @cached_property
    def per_process(self) -> pl.DataFrame:
        """Per (file, host, pid): bytes and calls (see :func:`file_process_table`)."""
        if self.known_per_process is not None:
            return self.known_per_process
        return file_process_table(self.events)

    @cached_property
    def files(self) -> pl.DataFrame:
        """Per file: role, bytes, call counts (see :func:`classify_files`)."""
        return classify_files(self.events, self.data_dirs, per_process=self.per_process)

    def role_files(self, role: str) -> list[str]:
        return self.files.filter(pl.col("role") == role)["file"].to_list()

    @cached_property
    def io(self) -> pl.DataFrame:
        """POSIX/STDIO events with a file name (over a spilled table: all of them in memory;
        the passes use :attr:`io_lazy` and :attr:`dataset_io` instead)."""
        return self.rows(_IO)

    @property
    def io_lazy(self) -> pl.LazyFrame:
        """:attr:`io` as a LazyFrame (for aggregations; never materialised)."""
        return self.events.lazy().filter(_IO)

    @cached_property
    def dataset_files(self) -> list[str]:
        """The dataset's files (role ``dataset`` in :attr:`files`)."""
        return self.role_files("dataset")

    @cached_property
    def dataset_mask(self) -> pl.Series | None:
        """Over the in-memory table: which rows are I/O on dataset files (a boolean Series, 1
        bit a row), found once; the passes filter by it instead of matching every row's
        file against the dataset's names again (~4 ms a filter for 2 M events and 4,096
        files). None over a spilled table."""
        if not isinstance(self.events, pl.DataFrame):
            return None
        return self.events.select((_IO & pl.col("file").is_in(self.dataset_files)).fill_null(False)).to_series()

    def _dataset(self, cond: pl.Expr | None) -> pl.Expr:
        mask = self.dataset_mask
        pred = pl.lit(mask) if mask is not None else _IO & pl.col("file").is_in(self.dataset_files)
        return pred if cond is None else pred & cond

    def dataset_query(self, cond: pl.Expr | None = None) -> pl.LazyFrame:
        """I/O events on dataset files (that match ``cond``) as a query over the table, for
        aggregations (collect it with :meth:`collect`): in table order in memory, in no
        particular order over a spilled table."""
        return self.scan.filter(self._dataset(cond))

    def dataset_rows(self, columns: Iterable[str], cond: pl.Expr | None = None) -> pl.DataFrame:
        """I/O events on dataset files (that match ``cond``), in table order, with ``columns``.

        Built on each call and not kept: most events of a training job are dataset I/O,
        so each pass takes the few columns it reads for as long as it needs them (a
        shared frame of every column a pass reads held ~60 bytes per event through the
        whole analysis). Over a spilled table, a streaming query of those columns."""
        cols = list(columns)
        if isinstance(self.events, pl.DataFrame):
            return self.events.lazy().filter(self._dataset(cond)).select(cols).collect()
        return self._ordered(self.events.filter(self._dataset(cond)), [pl.col(c) for c in cols])

    def ordered_dataset(self, columns: Iterable[str], cond: pl.Expr | None = None) -> pl.LazyFrame:
        """:meth:`dataset_rows` as a query in table order: over the in-memory table nothing is
        built until a pass collects its result (polars frees each step's columns as it goes);
        over a spilled table, the rows collected in table order."""
        if isinstance(self.events, pl.DataFrame):
            return self.events.lazy().filter(self._dataset(cond)).select(list(columns))
        return self.dataset_rows(columns, cond).lazy()

    @cached_property
    def ts_sorted(self) -> bool:
        """True when the in-memory table is sorted by ``ts`` without nulls (as loaded): its
        rows, or any subset of them in table order, need no sort by time."""
        if not isinstance(self.events, pl.DataFrame):
            return False
        ts = self.events["ts"]
        return ts.null_count() == 0 and ts.is_sorted()

    def by_ts(self, query: pl.LazyFrame) -> pl.LazyFrame:
        """``query`` (rows of the table, in table order in memory) sorted by ``ts``; no sort
        where the table already is (:attr:`ts_sorted`)."""
        return query if self.ts_sorted else query.sort("ts")

    @cached_property
    def pid_batches(self) -> list[pl.Expr | None]:
        """Conditions that split the table's rows by process into batches of about equal I/O
        (:data:`PID_BATCHES`, heaviest process first to the lightest batch), together every
        row exactly once: the last batch is every process not in the others, null pid
        included. ``[None]`` (one batch, no condition) for a trace with one process or fewer
        than :data:`PID_BATCH_MIN_ROWS` I/O events. A pass whose result per process is
        additive (sums, counts, per-sample rows) runs once per batch and adds up."""
        pp = self.per_process
        if pp.is_empty():
            return [None]
        weights = pp.group_by("pid").agg((pl.col("reads") + pl.col("writes") + pl.col("opens")).sum().alias("w"))
        total = int(weights["w"].sum() or 0)
        n = min(PID_BATCHES, weights.height)
        if n < 2 or total < PID_BATCH_MIN_ROWS:
            return [None]
        loads = [0] * n
        members: list[list[int]] = [[] for _ in range(n)]
        for pid, w in weights.sort(["w", "pid"], descending=[True, False], nulls_last=True).iter_rows():
            if pid is None:
                continue  # the last batch takes it
            k = loads.index(min(loads))
            loads[k] += int(w or 0)
            members[k].append(int(pid))
        named = [m for m in members[:-1] if m]
        taken = [pid for m in named for pid in m]
        conds: list[pl.Expr | None] = [pl.col("pid").is_in(m) for m in named]
        conds.append((~pl.col("pid").is_in(taken)).fill_null(True))
        return conds

    def row_batches(self, exprs: list[pl.Expr], cond: pl.Expr, *, dataset: bool = True) -> Iterator[pl.DataFrame]:
        """The rows that match ``cond`` (and are dataset I/O, with ``dataset``) with ``exprs``,
        in batches for a pass's C kernel: over the in-memory table, slices of
        :data:`ROW_BATCH` rows in table order (a slice costs no copy, and its filter reads
        only its rows: a pass holds one slice's rows at a time whatever the processes);
        over a spilled table, :attr:`pid_batches` (whole processes, each in table order)."""
        if isinstance(self.events, pl.DataFrame):
            mask = self.dataset_mask if dataset else None
            for a in range(0, self.events.height, ROW_BATCH):
                pred = cond if mask is None else pl.lit(mask.slice(a, ROW_BATCH)) & cond
                yield self.events.slice(a, ROW_BATCH).lazy().filter(pred).select(exprs).collect()
            return
        for batch in self.pid_batches:
            query = self.events.filter(self._dataset(cond) if dataset else cond)
            if batch is not None:
                query = query.filter(batch)
            yield self._ordered(query, exprs)

    @cached_property
    def pids_packable(self) -> bool:
        """Every process id fits :func:`flag_reads_lazy`'s packed sort key."""
        lo, hi = self.collect(self.scan.select(pl.col("pid").min().alias("lo"), pl.col("pid").max().alias("hi"))).row(0)
        return lo is None or (_PACKED_PIDS[0] <= int(lo) and int(hi) <= _PACKED_PIDS[1])

    @property
    def dataset_io(self) -> pl.DataFrame:
        """I/O events on dataset files with :data:`DATASET_IO_COLUMNS` (built on each use:
        the passes read :meth:`dataset_rows` with their own columns)."""
        return self.dataset_rows(DATASET_IO_COLUMNS)

    @property
    def dataset_reads(self) -> pl.DataFrame:
        """Reads of dataset files that moved bytes, with :data:`DATASET_IO_COLUMNS` (built on each use)."""
        return self.dataset_rows(DATASET_IO_COLUMNS, _DATA_READ)

    @cached_property
    def items(self) -> pl.DataFrame:
        """One row per sample loaded (``Dataset.__getitem__``, DLIO's ``__getitem__``)."""
        return self.role(voc.ITEM)

    @cached_property
    def fetches(self) -> pl.DataFrame:
        """Consumer-side batch waits (old traces' end-of-epoch probe, batch_size 0, included)."""
        return self.role(voc.FETCH)

    @cached_property
    def steps(self) -> pl.DataFrame:
        """The consumers' training steps as intervals (pid, ts, dur, epoch): the compute of
        each step, or its loop body where compute is not annotated (see :attr:`step_table`)."""
        st = self.step_table
        return st.select("pid", "ts", (pl.col("end") - pl.col("ts")).alias("dur"), "epoch")

    @cached_property
    def epochs(self) -> pl.DataFrame:
        """One row per epoch of each consumer: pid, epoch, ts, dur, end (µs), basis (see
        :func:`~.vocabulary.epoch_spans`: epoch events, DLIO's training phases, or loop events)."""
        return voc.epoch_spans(self.annotations).with_columns((pl.col("end") - pl.col("ts")).alias("dur"))

    @cached_property
    def saves(self) -> pl.DataFrame:
        """Checkpoint saves (``torch.save`` in a capture, ``ai.checkpoint.capture``, DLIO's checkpoint)."""
        return self.role(voc.CKPT_SAVE)

    @cached_property
    def step_table(self) -> pl.DataFrame:
        """One row per training step (see :func:`_step_table`); shared by several passes."""
        return _step_table(self)

    @cached_property
    def dataset_file_sizes(self) -> pl.DataFrame:
        """(file, size): the largest byte position read or seeked per dataset file, else the most
        bytes read between two opens of it (see :func:`~.distill.measure.file_sizes`)."""
        io = self.dataset_query(pl.col("name").is_in(READ_OPS + SEEK_OPS + OPEN_OPS))
        sized = self.collect(file_ends(io))
        if sized.height == len(self.dataset_files):  # every file has an end: no per-open sums to add
            return sized
        return self.collect(file_sizes(io, sized.lazy()))

    @cached_property
    def consumers(self) -> list[int]:
        """Pids that consume batches (one per rank): with fetch, step or compute events."""
        return sorted(self.role(voc.FETCH, voc.STEP, voc.COMPUTE)["pid"].unique().to_list())

    @cached_property
    def workers(self) -> list[int]:
        """Pids that run ``Dataset.__getitem__`` in a separate process (loader workers)."""
        return sorted(set(self.items["pid"].unique().to_list()) - set(self.consumers))

    @cached_property
    def span(self) -> tuple[int, int]:
        """(first start, last end) of the trace in microseconds."""
        row = self.collect(self.scan.select(
            pl.col("ts").min().alias("a"), (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("b"))).row(0)
        if row[0] is None or row[1] is None:
            return (0, 0)
        return int(row[0]), int(row[1])

    @property
    def duration_s(self) -> float:
        return (self.span[1] - self.span[0]) * _US


# ---------------------------------------------------------------------------------------
# Helpers


def darshan_pattern(reads: pl.DataFrame, by: Iterable[str] = ("pid", "file")) -> pl.DataFrame:
    """Darshan's sequential/consecutive flags per read, ordered in time per ``by``.

    A read is *consecutive* when it starts exactly where the previous read of the same
    (process, file) ended, *sequential* when it starts at or past that end (so
    consecutive reads are sequential too); the rest are random. The first read of each
    open of a file has no predecessor: it is compared with offset 0, so a file read
    from its start counts as consecutive (Darshan keeps one record per file and rank
    across opens; per open is what a loader that re-opens files each epoch needs).
    Returns ``reads`` with boolean ``seq`` and ``consec`` (null when the offset is unknown).
    """
    keys = list(by)
    r = reads.sort("ts").with_columns(pl.col("session").fill_null(0) if "session" in reads.columns
                                      else pl.lit(0).alias("session"))
    grp = [*keys, "session"]
    prev_end = (pl.col("offset") + pl.col("size")).shift(1).over(grp).fill_null(0)
    return r.with_columns(
        (pl.col("offset") >= prev_end).alias("seq"),
        (pl.col("offset") == prev_end).alias("consec"),
    )


def _sessions(io: pl.DataFrame) -> pl.DataFrame:
    """``io`` with ``session``: the number of opens of (pid, file) up to each event."""
    return io.sort("ts").with_columns(
        pl.col("name").is_in(OPEN_OPS).cast(pl.Int64).cum_sum().over("pid", "file").alias("session")
    )


def flag_reads(io: pl.DataFrame) -> pl.DataFrame:
    """The reads (bytes > 0, offset known) of ``io`` (pid, file, name, size, offset; in
    time order) with Darshan's ``seq``/``consec`` flags, compared within each open of a
    (process, file): what :func:`darshan_pattern` of :func:`_sessions` gives, row order
    and the session numbers aside (see :func:`flag_reads_lazy`)."""
    return flag_reads_lazy(io.lazy(), packed=_packable(io["pid"])).collect()


#: Process ids that :func:`flag_reads_lazy` can pack with a file code into one Int64 sort key.
_PACKED_PIDS = (0, (1 << 31) - 1)


def _packable(pid: pl.Series) -> bool:
    """True when every process id in ``pid`` lies in :data:`_PACKED_PIDS` (nulls allowed)."""
    lo, hi = pid.min(), pid.max()
    return lo is None or (_PACKED_PIDS[0] <= int(lo) and int(hi) <= _PACKED_PIDS[1])  # type: ignore[arg-type]


def flag_reads_lazy(io: pl.LazyFrame, *, packed: bool = True) -> pl.LazyFrame:
    """:func:`flag_reads` as a query over ``io`` (in time order): the reads with pid, file,
    name, size, offset, seq, consec.

    Only the opens and the reads that count are kept; one stable sort by (pid, file)
    then keeps each (process, file)'s events in time order, and a read's predecessor is
    the row before it when that row is a read of the same (process, file): an open in
    between starts a new session, whose first read is compared with offset 0. With
    ``packed`` (every pid in :data:`_PACKED_PIDS`), the sort is on one Int64 key, pid
    and file code packed (a two-key sort row-encodes its keys: ~25 bytes a row more);
    a null pid sorts first, as in the two-key sort.
    """
    read = pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("offset").is_not_null()
    rows = io.select("pid", "file", "name", "size", "offset", read.fill_null(False).alias("__r")).filter(
        pl.col("__r") | pl.col("name").is_in(OPEN_OPS))
    code = pl.col("file").to_physical().cast(pl.Int64)
    if packed:
        key = pl.col("pid").cast(pl.Int64).fill_null(-1) * (1 << 32) + code
        rows = rows.with_columns(key.alias("__k")).sort("__k", maintain_order=True)
        same = pl.col("__k") == pl.col("__k").shift(1)
    else:
        rows = rows.with_columns(code.alias("__k")).sort("pid", "__k", maintain_order=True)
        same = (pl.col("pid").eq_missing(pl.col("pid").shift(1)) & (pl.col("__k") == pl.col("__k").shift(1)))
    prev = (same & pl.col("__r").shift(1)).fill_null(False)
    prev_end = pl.when(prev).then((pl.col("offset") + pl.col("size")).shift(1)).otherwise(0)
    return rows.with_columns(
        (pl.col("offset") >= prev_end).alias("seq"), (pl.col("offset") == prev_end).alias("consec"),
    ).filter(pl.col("__r")).drop("__k", "__r")


def _i64(expr: pl.Expr, name: str) -> pl.Expr:
    """``expr`` as int64 for :mod:`._kernels`, null as :data:`_NULL_I64`."""
    return expr.cast(pl.Int64).fill_null(_NULL_I64).alias(name)


def _read_flag_counts(batches: Iterable[pl.DataFrame], files: pl.Series) -> pl.DataFrame:
    """Per (file, size) of the reads: n, ``__seq`` and ``__con`` (how many are Darshan-sequential
    and consecutive): :func:`flag_reads_lazy`'s flags counted, in one pass in C
    (``read_flags``) over the rows in time order, without its sort or a row per read.

    ``batches``: the opens and reads of :func:`_read_flag_columns` in table order (a batch
    of rows after another, or of whole processes); ``files``: the names their file codes
    name, in their Categorical type (the result's ``file``).
    """
    state = _KERNELS.read_flags_new()
    for rows in batches:
        _KERNELS.read_flags(state, *(np.ascontiguousarray(rows[c].to_numpy()) for c in _READ_FLAG_COLUMNS))
        del rows
    kinds = {"__code": np.uint32, "size": np.int64, "n": np.int64, "__seq": np.int64, "__con": np.int64}
    groups = pl.DataFrame({c: np.frombuffer(b, t) for (c, t), b in
                           zip(kinds.items(), _KERNELS.read_flag_groups(state), strict=True)})
    names = files.to_frame().with_columns(pl.col("file").to_physical().alias("__code"))
    return groups.join(names, on="__code", how="left").select("file", "size", "n", "__seq", "__con")


#: What ``read_flags`` takes, as :func:`_read_flag_columns` names it.
_READ_FLAG_COLUMNS = ("__pid", "__code", "__kind", "__off", "__size")


def _read_flag_columns() -> list[pl.Expr]:
    """The columns ``read_flags`` takes (see :func:`_read_flag_counts`): pid, the file's code,
    the kind (2: a read that counts, as in :func:`flag_reads_lazy`; 1: an open; 0: neither),
    offset and size (nulls as 0 where they do not count)."""
    name = pl.col("name")
    read = name.is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("offset").is_not_null()
    kind = pl.when(read.fill_null(False)).then(2).when(name.is_in(OPEN_OPS)).then(1).otherwise(0)
    return [_i64(pl.col("pid"), "__pid"), pl.col("file").to_physical().cast(pl.UInt32).alias("__code"),
            kind.cast(pl.UInt8).alias("__kind"), pl.col("offset").cast(pl.Int64).fill_null(0).alias("__off"),
            pl.col("size").cast(pl.Int64).fill_null(0).alias("__size")]


def _intervals(frame: pl.DataFrame, key: pl.Expr, end: pl.Expr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key, start, end) of the intervals ``frame`` holds (start: ``ts``) as int64 arrays,
    sorted by (key, start) and stably (of equal starts the last in ``frame`` is the one an
    as-of join takes); rows with a null key or start left out, a null end as
    :data:`_NULL_I64` (encloses nothing)."""
    iv = frame.lazy().select(key.cast(pl.Int64).alias("k"), pl.col("ts").cast(pl.Int64).alias("s"),
                             _i64(end, "e")).drop_nulls(["k", "s"]).collect()
    k, s, e = (iv[c].to_numpy() for c in ("k", "s", "e"))
    # (numpy's stable sorts: one key where the starts are in order already, as a table's are)
    order = np.argsort(k, kind="stable") if bool(np.all(s[1:] >= s[:-1])) else np.lexsort((s, k))
    return k[order], s[order], e[order]


def _interval_sums(rows: pl.DataFrame, iv: tuple[np.ndarray, np.ndarray, np.ndarray], counts: np.ndarray,
                   sums: np.ndarray, *, overlap: bool = False) -> None:
    """Add ``rows`` (``k``, ``t``, ``v``: int64, no nulls; nulls of ``k`` and ``t`` as
    :data:`_NULL_I64`) into ``counts`` and ``sums`` (int64, one per interval of ``iv``, see
    :func:`_intervals`), each row into the last interval of its key started at or before
    its ``t`` (polars' backward ``join_asof`` by key), in one pass in C (``interval_sums``):
    the rows inside it (``t`` <= its end) and their ``v``; with ``overlap``, every row
    matched and the µs of [t, t + v) inside the interval."""
    _KERNELS.interval_sums(*(np.ascontiguousarray(rows[c].to_numpy(), dtype=np.int64) for c in ("k", "t", "v")),
                           *iv, overlap, counts, sums)


def _stats(values: pl.Series) -> dict[str, float | int | None]:
    """count/min/max/mean/median of a numeric series (JSON-safe)."""
    v = values.drop_nulls()
    if v.is_empty():
        return {"count": 0, "min": None, "max": None, "mean": None, "median": None}
    return {"count": int(v.len()), "min": _f(v.min()), "max": _f(v.max()), "mean": _f(v.mean()),
            "median": _f(v.median())}


def _hist_stats(hist: pl.DataFrame) -> dict[str, float | int | None]:
    """:func:`_stats` of the read sizes counted in ``hist`` (``size``, ``n``: how many reads of
    that size), with ``bytes_weighted_median``: the transfer size that moves the median byte
    (half the bytes go in reads at most this big). The same figures as from one row per
    read, from a table of distinct sizes."""
    h = hist.filter(pl.col("size").is_not_null()).sort("size")
    count = int(h["n"].sum() or 0)
    if not count:
        return {"count": 0, "min": None, "max": None, "mean": None, "median": None, "bytes_weighted_median": None}
    sizes, n = h["size"].to_numpy(), h["n"].to_numpy()
    cum = np.cumsum(n)
    lower, upper = sizes[np.searchsorted(cum, (count - 1) // 2, "right")], sizes[np.searchsorted(cum, count // 2, "right")]
    moved = np.cumsum(sizes.astype(np.float64) * n)
    total = int((h["size"].cast(pl.Int64) * h["n"]).sum())
    return {"count": count, "min": _f(sizes[0]), "max": _f(sizes[-1]), "mean": _f(total / count),
            "median": _f((float(lower) + float(upper)) / 2),
            "bytes_weighted_median": _f(sizes[int(np.searchsorted(moved, total / 2, "left"))]) if total else None}


# ---------------------------------------------------------------------------------------
# Passes


def pass_overview(v: TraceView) -> dict:
    """The summary (operations, top files, Darshan histograms, dataset bytes)."""
    return v.summary.to_dict()


def pass_access(v: TraceView) -> dict:
    """Darshan's sequential / consecutive / random read fractions, overall and per file (dataset)."""
    # Per (file, read size) at once, one batch of processes at a time (a read's predecessor
    # is of its own process): the flagged reads are never held whole. The totals and each
    # file's median read are taken from the merged counts.
    ops = pl.col("name").is_in(OPEN_OPS) | pl.col("name").is_in(READ_OPS)
    counts = []
    if _KERNELS is not None:  # one pass in C over the rows in time order
        # (the dataset's names in the table's Categorical type: the codes its rows carry)
        files = pl.Series("file", v.dataset_files, pl.String).cast(v.scan.collect_schema()["file"])
        counts.append(_read_flag_counts(v.row_batches(_read_flag_columns(), ops), files))
    else:
        for batch in v.pid_batches:
            io = v.ordered_dataset(("pid", "file", "name", "size", "offset"), ops if batch is None else ops & batch)
            counts.append(flag_reads_lazy(io, packed=v.pids_packable).group_by("file", "size").agg(
                pl.len().alias("n"), pl.col("seq").sum().alias("__seq"), pl.col("consec").sum().alias("__con"))
                .collect())
            del io
    hist = pl.concat(counts).group_by("file", "size").agg(pl.col("n", "__seq", "__con").sum()).sort("file", "size")
    del counts
    n_all = pl.col("n").sum()
    cum = pl.col("n").cum_sum()
    # the median as polars takes it: the middle value, or the mean of the two middle values
    lower = pl.col("size").filter(cum > (n_all - 1) // 2).first()
    upper = pl.col("size").filter(cum > n_all // 2).first()
    per_file = hist.group_by("file", maintain_order=True).agg(
        n_all.alias("reads"), pl.col("__seq").sum(), pl.col("__con").sum(),
        ((lower + upper) / 2).alias("median_read"))
    if per_file.is_empty() and not v.collect(v.dataset_query().select(pl.len())).item():
        return {"reads": 0, "sequential": None, "consecutive": None, "random": None, "per_file": [],
                "missing": "no dataset reads"}
    if per_file.is_empty():
        return {"reads": 0, "sequential": None, "consecutive": None, "random": None, "per_file": [],
                "missing": "read offsets unknown"}
    n = int(per_file["reads"].sum())
    seq = int(per_file["__seq"].sum())
    con = int(per_file["__con"].sum())
    per_file = per_file.select(
        "file", "reads", (pl.col("__seq") / pl.col("reads")).alias("sequential"),
        (pl.col("__con") / pl.col("reads")).alias("consecutive"), "median_read",
    ).sort(["reads", "file"], descending=[True, False])
    return {
        "reads": n, "sequential": _f(seq / n, 4), "consecutive": _f(con / n, 4), "random": _f((n - seq) / n, 4),
        "per_file": [{k: (_f(x, 4) if isinstance(x, float) else x) for k, x in r.items()}
                     for r in per_file.head(20).iter_rows(named=True)],
    }


def _in_items(v: TraceView, rows: pl.LazyFrame, items: pl.DataFrame) -> pl.LazyFrame:
    """``rows`` (pid, ts, ...: rows of the table in table order) with ``item_ts``: the start
    of the item (sample) event of the same process that encloses each row, null outside
    items (what :func:`~.distill._assign_items` gives, as a query, without the sample index)."""
    it = items.lazy().select("pid", pl.col("ts").alias("item_ts"), (pl.col("ts") + pl.col("dur")).alias("__end")) \
        .sort("item_ts")
    joined = v.by_ts(rows).join_asof(it, left_on="ts", right_on="item_ts", by="pid", strategy="backward",
                                     check_sortedness=False)
    return joined.with_columns(pl.when(pl.col("ts") <= pl.col("__end")).then(pl.col("item_ts")).alias("item_ts")) \
        .drop("__end")


def pass_transfer(v: TraceView) -> dict:
    """Dataset read sizes (bytes), reads and bytes per sample, which calls and which format."""
    # counted per distinct size: one row per read is never held
    # (one query: reads per (call, size), then per size and per call)
    per = v.collect(v.dataset_query(_DATA_READ).group_by("name", "size").agg(pl.len().cast(pl.Int64).alias("n")))
    hist = per.group_by("size").agg(pl.col("n").sum())
    out: dict[str, Any] = {"read_size": _hist_stats(hist), "calls": {}}
    n_reads = int(hist["n"].sum() or 0)
    calls = per.group_by("name").agg(pl.col("n").sum().alias("len"))
    out["calls"] = {n: c for n, c in calls.sort(["len", "name"], descending=[True, False]).iter_rows()}
    exts = [os.path.splitext(f)[1].lower() for f in v.dataset_files]
    out["extensions"] = dict(pl.Series(exts, dtype=pl.Utf8).value_counts(sort=True).iter_rows()) if exts else {}
    items = v.items
    if items.height and n_reads:
        out.update((_sample_reads if _KERNELS is not None else _sample_reads_polars)(v, items))
    else:
        out["samples_with_reads"] = 0
        out["reads_per_sample"] = None
        out["bytes_per_sample"] = None
        out["missing"] = "no item events: sample size unknown" if n_reads else "no dataset reads"
    return out


def _sample_reads(v: TraceView, items: pl.DataFrame) -> dict[str, Any]:
    """:func:`pass_transfer`'s samples (with reads), reads and bytes per sample (medians):
    each dataset read counted into the item (sample) event that encloses it, in C."""
    iv = _intervals(items, pl.col("pid"), pl.col("ts") + pl.col("dur"))
    reads, nbytes = np.zeros(len(iv[0]), np.int64), np.zeros(len(iv[0]), np.int64)
    for rows in v.row_batches([_i64(pl.col("pid"), "k"), _i64(pl.col("ts"), "t"), pl.col("size").alias("v")],
                              _DATA_READ):
        _interval_sums(rows, iv, reads, nbytes)
        del rows
    got = reads > 0
    n = int(got.sum())
    return {"samples_with_reads": n, "reads_per_sample": _f(np.median(reads[got]), 2) if n else None,
            "bytes_per_sample": _f(np.median(nbytes[got]), 1) if n else None}


def _sample_reads_polars(v: TraceView, items: pl.DataFrame) -> dict[str, Any]:
    """:func:`_sample_reads` as polars queries (the definition; without the C kernels)."""
    samples = []  # per sample (pid, item): reads and bytes, one batch of processes at a time
    for batch in v.pid_batches:
        reads = v.dataset_query(_DATA_READ if batch is None else _DATA_READ & batch).select("pid", "ts", "size")
        samples.append(v.collect(_in_items(v, reads, items).filter(pl.col("item_ts").is_not_null())
                                 .group_by("pid", "item_ts")
                                 .agg(pl.len().alias("reads"), pl.col("size").sum().alias("bytes"))))
        del reads
    n, reads_med, bytes_med = pl.concat(samples).select(
        pl.len().alias("n"), pl.col("reads").median(), pl.col("bytes").median()).row(0)
    return {"samples_with_reads": int(n), "reads_per_sample": _f(reads_med, 2), "bytes_per_sample": _f(bytes_med, 1)}


def pass_bandwidth(v: TraceView) -> dict:
    """Bytes read per time bin over the run (dataset and all files), in bytes/s."""
    t0, t1 = v.span
    width = max((t1 - t0) / TIMELINE_BINS, 1.0)
    ds = v.role_files("dataset")
    binned = v.collect(
        v.io_lazy.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0))
        .select(((pl.col("ts") - t0) / width).floor().cast(pl.Int64).clip(0, TIMELINE_BINS - 1).alias("b"),
                "size", pl.col("file").is_in(ds).alias("ds"))
        .group_by("b").agg(pl.col("size").sum().alias("all"), pl.col("size").filter(pl.col("ds")).sum().alias("dsb"))
    )
    if binned.is_empty() or t1 <= t0:
        return {"bin_s": None, "t_s": [], "dataset_bps": [], "all_bps": [], "peak_bps": None,
                "missing": "no reads"}
    full = pl.DataFrame({"b": np.arange(TIMELINE_BINS, dtype=np.int64)}).join(binned, on="b", how="left").fill_null(0)
    sec = width * _US
    all_bps = (full["all"] / sec).to_list()
    return {
        "bin_s": _f(sec), "t_s": [_f(i * sec, 4) for i in range(TIMELINE_BINS)],
        "dataset_bps": [_f(x, 1) for x in (full["dsb"] / sec).to_list()], "all_bps": [_f(x, 1) for x in all_bps],
        "peak_bps": _f(max(all_bps), 1),
    }


def _first_ppid(v: TraceView) -> pl.DataFrame:
    """(host, pid, ppid) over a lazy table: the ppid of each (host, pid)'s first event with one,
    in table order (what ``ppid.drop_nulls().first()`` gives in memory).

    The ppid is constant per trace file and pid, so each (host, pid) has few candidates:
    the one with the earliest ``ts`` wins; a tie (or only null ``ts``) is settled by the
    order column over that (host, pid)'s tied rows only.
    """
    cand = v.collect(v.scan.filter(pl.col("ppid").is_not_null())
                     .group_by("host", "pid", "ppid").agg(pl.col("ts").min().alias("m")))
    out = []
    for (host, pid), g in cand.group_by("host", "pid"):
        g = g.sort("m", nulls_last=True)
        m = g["m"][0]
        tied = g.filter(pl.col("m").eq_missing(m))
        if tied.height == 1:
            out.append((host, pid, tied["ppid"][0]))
            continue
        at = pl.col("ts").is_null() if m is None else pl.col("ts") == m
        first = v.collect(v.scan.filter(pl.col("host").eq_missing(host) & (pl.col("pid") == pid)
                                        & pl.col("ppid").is_not_null() & at)
                          .select("ppid", ORDER_COL).sort(ORDER_COL).head(1))
        out.append((host, pid, first["ppid"][0]))
    return pl.DataFrame(out, schema={c: EVENT_SCHEMA[c] for c in ("host", "pid", "ppid")}, orient="row")


def pass_processes(v: TraceView) -> dict:
    """Per process: role (consumer / worker / other), lifetime, I/O and item busy time."""
    if not v.height:
        return {"processes": []}
    is_io = pl.col("cat").is_in(IO_CATEGORIES)
    is_item = pl.col("role") == voc.ITEM
    aggs = [
        pl.len().alias("events"),
        pl.col("ts").min().alias("t0"), (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("t1"),
        pl.col("dur").filter(is_io).sum().alias("io_us"),
        pl.col("dur").filter(is_item).sum().alias("item_us"),
        is_item.sum().alias("items"),
        pl.col("size").filter(pl.col("name").is_in(READ_OPS)).sum().alias("bytes_read"),
    ]
    if isinstance(v.events, pl.DataFrame):  # a query: polars' eager group_by held ~55 bytes per event more
        per = v.events.lazy().group_by("host", "pid").agg(pl.col("ppid").drop_nulls().first().alias("ppid"),
                                                          *aggs).collect()
    else:
        per = v.collect(v.events.group_by("host", "pid").agg(*aggs)).join(
            _first_ppid(v), on=["host", "pid"], how="left", nulls_equal=True)
    per = per.sort("t0", "pid")
    cons, work = set(v.consumers), set(v.workers)
    rows = []
    for r in per.iter_rows(named=True):  # one row per process, not per event
        life = max(r["t1"] - r["t0"], 1)
        role = "consumer" if r["pid"] in cons else "worker" if r["pid"] in work else "other"
        rows.append({
            "host": r["host"], "pid": r["pid"], "ppid": r["ppid"], "role": role, "events": r["events"],
            "lifetime_s": _f(life * _US), "io_time_s": _f(_i(r["io_us"]) * _US),
            "item_time_s": _f(_i(r["item_us"]) * _US), "items": _i(r["items"]), "bytes_read": _i(r["bytes_read"]),
            "busy": _f(_i(r["item_us"]) / life, 4) if role == "worker" else None,
        })
    return {"processes": rows}


def _step_table(v: TraceView) -> pl.DataFrame:
    """One row per training step of each consumer: data wait, compute, checkpoint, other time.

    :func:`~.vocabulary.training_steps` (whichever convention annotated the loop) plus
    ``warm`` (bool: a warm-up step, see :func:`warmup_steps`, per consumer). Columns:
    pid, epoch, step, ts (anchor start), end, wait_us, compute_us, ckpt_us, other_us,
    batch_size, epoch_first, block_first, basis, warm.
    """
    s = voc.training_steps(v.annotations)
    if s.is_empty():
        return s.with_columns(pl.lit(None, pl.Boolean).alias("warm"))
    warm = {p: warmup_steps(g["compute_us"].to_numpy() * _US)
            for (p,), g in s.sort("ts").group_by("pid", maintain_order=True)}
    k = pl.int_range(pl.len()).over("pid")
    return s.sort("pid", "ts").with_columns((k < pl.col("pid").replace_strict(warm, default=1)).alias("warm"))


def _au(fr: pl.DataFrame, data_only: bool = False) -> float | None:
    """compute / (compute + data wait + checkpoint + other) over the steps of ``fr``; with
    ``data_only``, compute / (compute + data wait): what the input pipeline alone costs."""
    c, w, k, o = (int(fr[x].sum()) for x in ("compute_us", "wait_us", "ckpt_us", "other_us"))
    if data_only:
        k = o = 0
    return _f(c / (c + w + k + o), 4) if c + w + k + o else None


def au_dlio(st: pl.DataFrame) -> float | None:
    """AU as DLIO 2.0's statistics compute it, from the trace (0..1).

    Per block (an epoch's steps up to a checkpoint, and after each): the compute of
    every step but the block's first, over the block's time less the first step's
    processing time, where DLIO starts a block after the checkpoint and the first batch
    of the block, yet its first step's time runs from the end of the checkpoint: the
    wait after a checkpoint is subtracted twice (a block's AU can pass 100 %). An
    epoch's AU is the blocks' mean weighted by their steps; the result is the mean over
    epochs and consumers. ``st`` is a :func:`_step_table`. None without two steps in a block.
    """
    if st.height < 2:
        return None
    b = st.sort("pid", "ts").with_columns(pl.col("block_first").cast(pl.Int64).cum_sum().over("pid").alias("blk"))
    # a block after a checkpoint: DLIO's t0 is the checkpoint's end, its block starts after the fetch
    post = pl.when(pl.col("block_first") & ~pl.col("epoch_first")).then(pl.col("after_ckpt_us"))
    # a save inside a step's loop body (not DLIO's: its saves come after the step) ends the block before it
    end = pl.col("end") - pl.when(~pl.col("block_first") & (pl.col("basis") != "compute events")) \
        .then(pl.col("ckpt_us")).otherwise(0)
    per = b.group_by("pid", "epoch", "blk").agg(
        pl.col("compute_us").filter(~pl.col("block_first")).sum().alias("c"),
        (end.max() - pl.col("end").filter(pl.col("block_first")).first()
         - post.filter(pl.col("block_first")).first().fill_null(0)).alias("t"),
        pl.len().alias("n")).filter((pl.col("n") > 1) & (pl.col("t") > 0))
    if per.is_empty():
        return None
    ep = per.group_by("pid", "epoch").agg(((pl.col("c") / pl.col("t")) * pl.col("n")).sum() / pl.col("n").sum())
    return _f(ep.group_by("pid").agg(pl.col("c").mean())["c"].mean(), 4)


def pass_steps(v: TraceView) -> dict:
    """Data wait vs compute per training step, AU overall and per epoch (from the trace).

    AU = compute / (compute + data wait + checkpoint time + other time), warm-up steps
    excluded (the first step, and following steps longer than WARMUP_FACTOR x the
    median). ``au_steady`` also leaves out each epoch's first step; ``au_data`` and
    ``au_data_steady`` count data wait only (compute / (compute + wait): checkpoints and
    other loop time left out), which the data-loader findings read; ``au_dlio`` is
    :func:`au_dlio` (what DLIO prints for the same run).
    """
    st = v.step_table
    if st.is_empty():
        return {"steps": 0, "au": None, "per_epoch": [],
                "missing": "no training-loop events (fetch, step or compute; capture with `dlreplay capture`, "
                           "or annotate with DFTracer's AI conventions)"}
    s = st.filter(~pl.col("warm"))
    if s.is_empty():
        s = st

    per_epoch = (
        s.group_by("epoch").agg(pl.len().alias("steps"), pl.col("compute_us").sum(), pl.col("wait_us").sum(),
                                pl.col("ckpt_us").sum(), pl.col("other_us").sum()).sort("epoch")
    )
    waits = s["wait_us"]
    comp_med = _num(s["compute_us"].median())
    starved = s.filter(pl.col("wait_us") > pl.col("compute_us"))
    worst = s.sort(["wait_us", "ts"], descending=[True, False]).head(5)
    steady = s.filter(~pl.col("epoch_first"))
    return {
        "steps": st.height, "warmup_steps": int(st["warm"].sum()), "au": _au(s),
        # without the first batch of each epoch (worker start-up, first prefetch)
        "au_steady": _au(steady) if steady.height else None,
        "au_data": _au(s, data_only=True),
        "au_data_steady": _au(steady, data_only=True) if steady.height else None,
        "au_dlio": au_dlio(st),
        "basis": st["basis"][0],
        "epoch_start_wait_s": _f(_num(s.filter(pl.col("epoch_first"))["wait_us"].sum()) * _US),
        "epoch_lead_in_s": _f(_num(st["lead_in_us"].sum()) * _US),
        "compute_s": _f(_num(s["compute_us"].sum()) * _US), "wait_s": _f(_num(waits.sum()) * _US),
        "checkpoint_s": _f(_num(s["ckpt_us"].sum()) * _US), "other_s": _f(_num(s["other_us"].sum()) * _US),
        "median_compute_s": _f(comp_med * _US), "median_wait_s": _f(_num(waits.median()) * _US),
        "steps_waiting_longer_than_compute": starved.height,
        "worst_waits": [{"pid": r["pid"], "epoch": r["epoch"], "wait_s": _f(r["wait_us"] * _US),
                         "compute_s": _f(r["compute_us"] * _US)} for r in worst.iter_rows(named=True)],
        "per_epoch": [{"epoch": r["epoch"], "steps": r["steps"], "compute_s": _f(r["compute_us"] * _US),
                       "wait_s": _f(r["wait_us"] * _US), "checkpoint_s": _f(r["ckpt_us"] * _US),
                       "other_s": _f(r["other_us"] * _US), "au": _au(pl.DataFrame([r]))}
                      for r in per_epoch.iter_rows(named=True)],
        "warmup_factor": WARMUP_FACTOR,
    }


def pass_epochs(v: TraceView) -> dict:
    """Epoch wall times (s) per consumer, and where they come from (``basis``)."""
    ep = v.epochs.sort("ts")
    return {"epochs": [{"pid": r["pid"], "epoch": r["epoch"], "time_s": _f(r["dur"] * _US)}
                       for r in ep.iter_rows(named=True)],
            "basis": ep["basis"][0] if ep.height else None}


def pass_overlap(v: TraceView) -> dict:
    """Share of dataset I/O time spent while the consumer computes (overlapped).

    Each dataset I/O call belongs to a consumer (itself, or its parent for a loader
    worker); the part of the call inside one of that consumer's step intervals
    counts as overlapped. Loader workers overlap; a loader without workers cannot.
    """
    st = v.steps
    n_io, io_us = v.collect(v.dataset_query().select(pl.len(), pl.col("dur").sum())).row(0)
    if not n_io or st.is_empty():
        return {"overlap": None, "io_time_s": _f(_num(io_us) * _US) if n_io else 0.0,
                "missing": "no dataset I/O" if not n_io else "no step events"}
    cons = v.consumers or st["pid"].unique().to_list()
    overlapped, total = (_overlapped if _KERNELS is not None else _overlapped_polars)(v, st, cons)
    in_consumer = _num(v.collect(v.dataset_query(pl.col("pid").is_in(cons)).select(pl.col("dur").sum())).item())
    return {"overlap": _f(overlapped / total, 4) if total else None, "io_time_s": _f(total * _US),
            "overlapped_s": _f(overlapped * _US),
            "io_in_consumer_s": _f(in_consumer * _US)}


def _overlapped(v: TraceView, st: pl.DataFrame, cons: list[int]) -> tuple[int, int]:
    """:func:`pass_overlap`'s sums (µs): dataset I/O time inside its owner's steps, and all of
    it; each call matched to its step in C."""
    iv = _intervals(st, pl.col("pid"), pl.col("ts") + pl.col("dur"))
    owner = pl.when(pl.col("pid").is_in(cons)).then(pl.col("pid")).otherwise(pl.col("ppid"))
    counts, inside = np.zeros(len(iv[0]), np.int64), np.zeros(len(iv[0]), np.int64)
    total = 0
    for calls in v.row_batches([_i64(owner, "k"), _i64(pl.col("ts"), "t"), pl.col("dur").fill_null(0).alias("v")],
                               pl.lit(True)):
        _interval_sums(calls, iv, counts, inside, overlap=True)
        total += int(calls["v"].sum() or 0)
        del calls
    return int(inside.sum()), total


def _overlapped_polars(v: TraceView, st: pl.DataFrame, cons: list[int]) -> tuple[int, int]:
    """:func:`_overlapped` as polars queries (the definition; without the C kernels): each
    call's step by a backward ``join_asof``, one batch of processes at a time."""
    steps = st.lazy().select(pl.col("pid").alias("owner"), pl.col("ts").alias("s_ts"),
                             (pl.col("ts") + pl.col("dur")).alias("s_end")).sort("s_ts")
    # (min_horizontal skips nulls: a call before any step must count 0, not its whole duration)
    inside = pl.when(pl.col("s_end").is_not_null()).then(
        (pl.min_horizontal(pl.col("ts") + pl.col("dur"), pl.col("s_end")) - pl.col("ts")).clip(lower_bound=0))
    overlapped = total = 0
    for batch in v.pid_batches:  # the sums add up
        calls = v.by_ts(v.dataset_query(batch).select(
            pl.when(pl.col("pid").is_in(cons)).then(pl.col("pid")).otherwise(pl.col("ppid")).alias("owner"),
            "ts", pl.col("dur").fill_null(0),
        ))
        j = calls.join_asof(steps, left_on="ts", right_on="s_ts", by="owner", strategy="backward",
                            check_sortedness=False)
        ov, every = v.collect(j.select(inside.fill_null(0).sum().alias("ov"), pl.col("dur").sum().alias("all"))).row(0)
        overlapped += int(ov or 0)
        total += int(every or 0)
        del calls, j
    return overlapped, total


def pass_metadata(v: TraceView) -> dict:
    """Metadata (open/close/stat/seek) vs data calls on the dataset files: counts, time, per sample."""
    per_name = v.collect(v.dataset_query().group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum().alias("us")))
    if per_name.is_empty():
        return {"meta_calls": 0, "data_calls": 0, "meta_share": None, "missing": "no dataset I/O"}
    name = pl.col("name")
    kinds = per_name.select(
        pl.when(name.is_in(OPEN_OPS)).then(pl.lit("open")).when(name.is_in(CLOSE_OPS)).then(pl.lit("close"))
        .when(name.is_in(STAT_OPS)).then(pl.lit("stat")).when(name.is_in(SEEK_OPS)).then(pl.lit("seek"))
        .when(name.is_in(READ_OPS + WRITE_OPS)).then(pl.lit("data")).otherwise(pl.lit("other")).alias("k"),
        "n", "us",
    ).group_by("k").agg(pl.col("n").sum(), pl.col("us").sum())
    d = {k: (n, us) for k, n, us in kinds.iter_rows()}
    meta_n = sum(d.get(k, (0, 0))[0] for k in ("open", "close", "stat", "seek"))
    meta_us = sum(d.get(k, (0, 0))[1] for k in ("open", "close", "stat", "seek"))
    data_n, data_us = d.get("data", (0, 0))
    files = v.files.filter(pl.col("role") == "dataset")
    items = v.items.height
    sizes = v.dataset_file_sizes
    return {
        "meta_calls": int(meta_n), "data_calls": int(data_n),
        "meta_time_s": _f(meta_us * _US), "data_time_s": _f(data_us * _US),
        "meta_share": _f(meta_us / (meta_us + data_us), 4) if meta_us + data_us else None,
        "meta_call_share": _f(meta_n / (meta_n + data_n), 4) if meta_n + data_n else None,
        "opens": int(d.get("open", (0, 0))[0]), "seeks": int(d.get("seek", (0, 0))[0]),
        "stats": int(d.get("stat", (0, 0))[0]), "files": files.height,
        "opens_per_sample": _f(d.get("open", (0, 0))[0] / items, 3) if items else None,
        "seeks_per_read": _f(d.get("seek", (0, 0))[0] / data_n, 3) if data_n else None,
        "mean_file_size": _f(sizes["size"].mean(), 1) if sizes.height else None,
    }


def pass_checkpoints(v: TraceView) -> dict:
    """Checkpoint saves: count, bytes, time, share of the run, write calls, fsync."""
    saves = v.saves
    ck_files = sorted(set(v.role_files("checkpoint")) | set(saves["file"].drop_nulls().to_list()))
    ck_io = v.collect(v.io_lazy.filter(pl.col("file").is_in(ck_files)).select("name", "size"))
    writes = ck_io.filter(pl.col("name").is_in(WRITE_OPS) & (pl.col("size") > 0))
    syncs = ck_io.filter(pl.col("name").is_in(SYNC_OPS)).height
    cons = set(v.consumers)
    save_s = _num(saves["dur"].sum()) * _US
    blocked = float(saves.filter(pl.col("pid").is_in(list(cons)))["dur"].sum() or 0) * _US if cons else save_s
    # share of the training loop (steps + waits); the run's wall time also holds start-up
    st = v.step_table
    loop_us = int(st.select(pl.col("wait_us").sum() + pl.col("compute_us").sum() + pl.col("ckpt_us").sum()).item()
                  or 0) if st.height else 0
    dur = loop_us * _US if loop_us else v.duration_s
    nbytes = int(saves["size"].sum() or 0) if saves.height else int(writes["size"].sum() or 0)
    return {
        "saves": saves.height, "loads": v.role(voc.CKPT_LOAD).height, "files": len(ck_files),
        "bytes": nbytes, "time_s": _f(save_s), "blocked_s": _f(blocked),
        "share_of_training": _f(blocked / dur, 4) if dur else None,
        "training_s": _f(dur), "training_basis": "steps + data waits" if loop_us else "whole trace",
        "save_time": _stats(saves["dur"] * _US), "bandwidth_bps": _f(nbytes / save_s, 1) if save_s else None,
        "write_calls": writes.height, "write_size": _stats(writes["size"]), "fsyncs": syncs,
        "writes_visible": writes.height > 0,
    }


def pass_balance(v: TraceView) -> dict:
    """Balance across ranks (consumers) and loader workers: items, busy time, max/median ratios."""
    items = v.items
    out: dict[str, Any] = {}
    if v.workers:
        w = (items.filter(pl.col("pid").is_in(v.workers)).group_by("pid")
             .agg(pl.len().alias("items"), pl.col("dur").sum().alias("busy_us"), pl.col("ppid").first())
             .sort("pid"))  # a fixed order: the mean of busy_s is a float sum
        med = _num(w["busy_us"].median())
        out["workers"] = {"count": w.height, "items": _stats(w["items"]), "busy_s": _stats(w["busy_us"] * _US),
                          "max_over_median": _f(_num(w["busy_us"].max()) / med, 3) if med else None}
    rank_rows = []
    st = v.step_table
    if len(v.consumers) > 1 and st.height:
        per = st.group_by("pid").agg(pl.col("wait_us").sum(), pl.col("compute_us").sum(), pl.len().alias("steps"))
        ep = v.epochs.group_by("pid").agg(pl.col("dur").sum().alias("epoch_us"))
        per = per.join(ep, on="pid", how="left").sort("pid")
        med = _num(per["epoch_us"].median())
        rank_rows = [{"pid": r["pid"], "steps": r["steps"], "wait_s": _f(r["wait_us"] * _US),
                      "compute_s": _f(r["compute_us"] * _US), "epoch_s": _f((r["epoch_us"] or 0) * _US)}
                     for r in per.iter_rows(named=True)]
        out["ranks"] = {"count": per.height, "per_rank": rank_rows,
                        "max_over_median": _f(_num(per["epoch_us"].max()) / med, 3) if med else None,
                        "wait_max_over_median": _f(_num(per["wait_us"].max()) / _num(per["wait_us"].median()),
                                                   3) if per["wait_us"].median() else None}
    return out


def _io_in_items(v: TraceView, items: pl.DataFrame, loaders: pl.Expr) -> int:
    """:func:`pass_preprocess`'s I/O time (µs) of the ``loaders``' calls inside their item
    events: each call counted into the item that encloses it, in C."""
    iv = _intervals(items, pl.col("pid"), pl.col("ts") + pl.col("dur"))
    counts, inside = np.zeros(len(iv[0]), np.int64), np.zeros(len(iv[0]), np.int64)
    for rows in v.row_batches([_i64(pl.col("pid"), "k"), _i64(pl.col("ts"), "t"), pl.col("dur").fill_null(0).alias("v")],
                              _IO & loaders, dataset=False):
        _interval_sums(rows, iv, counts, inside)
        del rows
    return int(inside.sum())


def _io_in_items_polars(v: TraceView, items: pl.DataFrame, loaders: pl.Expr) -> int:
    """:func:`_io_in_items` as polars queries (the definition; without the C kernels)."""
    io_us = 0
    for batch in v.pid_batches:  # one batch of processes at a time: the sums add up
        io = v.io_lazy.filter(loaders if batch is None else loaders & batch).select("pid", "ts", "dur")
        io_us += int(v.collect(_in_items(v, io, items).filter(pl.col("item_ts").is_not_null())
                               .select(pl.col("dur").sum())).item() or 0)
        del io
    return io_us


def pass_preprocess(v: TraceView) -> dict:
    """Time inside ``Dataset.__getitem__`` vs the POSIX time inside it (deserialisation, decode)."""
    items = v.items
    if items.is_empty():
        return {"item_time_s": None, "io_in_items_s": None, "ratio": None, "missing": "no item events"}
    item_us = int(items["dur"].sum() or 0)
    loaders = pl.col("pid").is_in(items["pid"].unique().implode())
    io_us = (_io_in_items if _KERNELS is not None else _io_in_items_polars)(v, items, loaders)
    return {"items": items.height, "item_time_s": _f(item_us * _US), "io_in_items_s": _f(io_us * _US),
            "non_io_s": _f(max(item_us - io_us, 0) * _US),
            "ratio": _f(item_us / io_us, 3) if io_us else None,
            "per_item_s": _f(item_us / items.height * _US)}


def _host_memory(manifest: dict | None) -> tuple[int | None, str]:
    """RAM of the traced host: from the capture manifest, else this host's when it is the same."""
    mem = (manifest or {}).get("mem_total_bytes")
    if mem:
        return int(mem), "capture manifest"
    host = (manifest or {}).get("host")
    if host and host == socket.gethostname() and host_memory_bytes():
        return host_memory_bytes(), "this host (same as the capture's)"
    return None, "unknown"


def pass_page_cache(v: TraceView) -> dict:
    """Signs that reads came from the page cache: in-call bandwidth, dataset size vs RAM, re-reads."""
    big = pl.col("size") >= (64 << 10)
    n, us, nbytes, n_big, big_us, big_bytes = v.collect(v.dataset_query(_DATA_READ).select(
        pl.len().alias("n"), pl.col("dur").sum().alias("us"), pl.col("size").sum().alias("b"),
        big.sum().alias("nbig"), pl.col("dur").filter(big).sum().alias("bus"),
        pl.col("size").filter(big).sum().alias("bb"))).row(0)
    if not n:
        return {"in_call_bps": None, "missing": "no dataset reads"}
    us, nbytes, big_us = int(us or 0), int(nbytes), int(big_us or 0)
    ds_size = int(v.dataset_file_sizes["size"].sum() or 0)
    mem, mem_src = _host_memory(v.manifest)
    return {"in_call_bps": _f(nbytes / (us * _US), 1) if us else None,
            "large_read_bps": _f(int(big_bytes or 0) / (big_us * _US), 1) if big_us else None,
            "large_reads": int(n_big),
            "dataset_bytes": ds_size, "bytes_read": nbytes,
            "reread_factor": _f(nbytes / ds_size, 3) if ds_size else None,
            "host_memory_bytes": mem, "host_memory_source": mem_src}


PassFn = Callable[[TraceView], dict]
#: Every pass, in report order.
PASSES: dict[str, PassFn] = {
    "overview": pass_overview,
    "access": pass_access,
    "transfer": pass_transfer,
    "bandwidth": pass_bandwidth,
    "processes": pass_processes,
    "steps": pass_steps,
    "epochs": pass_epochs,
    "overlap": pass_overlap,
    "metadata": pass_metadata,
    "checkpoints": pass_checkpoints,
    "balance": pass_balance,
    "preprocess": pass_preprocess,
    "page_cache": pass_page_cache,
}


@dataclass
class Characterization:
    """The passes' results by pass name (JSON-safe), plus the view they ran on."""

    results: dict[str, dict]
    view: TraceView = field(repr=False)
    #: the report's figures once drawn (see :func:`~dlreplay.analyze.report.figures`)
    figures: dict[str, tuple[str, bytes | None]] | None = field(default=None, repr=False)

    def __getitem__(self, key: str) -> dict:
        return self.results[key]

    def to_dict(self) -> dict:
        return dict(self.results)


def characterize(events: pl.DataFrame | pl.LazyFrame | TraceView, *, manifest: dict | None = None,
                 data_dirs: list[str] | None = None, passes: Iterable[str] | None = None,
                 per_process: pl.DataFrame | None = None) -> Characterization:
    """Run the characterisation ``passes`` (default: all of :data:`PASSES`) over an event table.

    ``per_process`` is the table's :func:`file_process_table` when already known (e.g.
    :attr:`~.load.LoadedTrace.per_process`).
    """
    view = events if isinstance(events, TraceView) else TraceView(events, manifest, data_dirs, per_process)
    names = list(passes) if passes is not None else list(PASSES)
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise KeyError(f"unknown pass(es): {', '.join(unknown)}; known: {', '.join(PASSES)}")
    out = {}
    for n in names:
        out[n] = PASSES[n](view)
        release_free_memory()  # what the pass built and dropped, before the next allocates its own
    return Characterization(out, view)
