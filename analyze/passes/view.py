"""The view of a trace the passes share (:class:`TraceView`: the event table and the frames
every pass reads), and the per-event loops a pass runs over it: Darshan's flags of each
dataset read, and the loops that match every read or call to the sample or step enclosing
it, in C (:mod:`dlreplay.analyze._kernels`) where the extension is built; each pass keeps
the polars query that defines its loop beside it, and runs it without the extension
(:func:`kernels_loaded`)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl

from dlreplay.schema import EVENT_SCHEMA, IO_CATEGORIES, OPEN_OPS, READ_OPS, SEEK_OPS

from ..distill.measure import file_ends, file_sizes, warmup_steps
from ..files import classify_files, file_process_table
from ..summary import Summary, summarize
from ..trace import vocabulary as voc
from .mapped import mapped_reads
from .numbers import US, rounded

__all__ = [
    "DATASET_IO_COLUMNS",
    "DATA_READ",
    "PID_BATCHES",
    "PID_BATCH_MIN_ROWS",
    "ROW_BATCH",
    "TraceView",
    "darshan_pattern",
    "flag_reads",
    "flag_reads_lazy",
    "in_items",
    "kernel_io_in_items",
    "kernel_overlapped",
    "kernel_read_flags",
    "kernel_sample_reads",
    "kernels_loaded",
    "sessions",
]

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
#: Reads of a file that moved bytes.
DATA_READ = pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0)

try:  # the passes' per-event loops in C (``_kernels.c``); without it, the polars queries below
    _KERNELS: Any = importlib.import_module(".._kernels", __package__)
except ImportError:  # pragma: no cover - the extension is optional
    _KERNELS = None
#: A null in the int64 columns handed to :mod:`._kernels` (no trace's pid or µs timestamp).
_NULL_I64 = int(np.iinfo(np.int64).min)


def kernels_loaded() -> bool:
    """True when the per-event loops run in C (the extension is built, and ``_KERNELS`` was
    not set to None to run the polars queries instead)."""
    return _KERNELS is not None


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
    #: the ``io.mmap``/``io.window`` events of the trace's mapped hooks
    #: (:func:`~..distill.mapped.mapped_events`: read from the trace files, as the event table
    #: keeps no offset or bytes of annotation events); None when not read
    mapped_events: pl.DataFrame | None = None
    #: classify the files with the loader rule when the trace has loader events (see
    #: :func:`classify_files`); False in a comparison with a trace that has none
    by_loader: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.events, pl.DataFrame):
            self.events = voc.ensure_roles(
                self.events
            )  # a table built by hand or by an older dlreplay
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
        """The one-screen summary (see :func:`~dlreplay.analyze.summary.summarize`), with
        the mapped data (:attr:`mapped`) where the trace has mapped windows."""
        if self.known_summary is not None:
            return self.known_summary
        s = summarize(self.events, data_dirs=self.data_dirs, per_process=self.per_process)
        return dataclasses.replace(s, mapped=self.mapped) if self.mapped.get("maps") else s

    @cached_property
    def mapped(self) -> dict[str, Any]:
        """What the job read through memory maps (:func:`.mapped.mapped_reads`, from
        :attr:`mapped_events`)."""
        return mapped_reads(self)

    @cached_property
    def per_process(self) -> pl.DataFrame:
        """Per (file, host, pid): bytes and calls (see :func:`file_process_table`)."""
        if self.known_per_process is not None:
            return self.known_per_process
        return file_process_table(self.events)

    @cached_property
    def files(self) -> pl.DataFrame:
        """Per file: role, bytes, call counts (see :func:`classify_files`)."""
        return classify_files(
            self.events, self.data_dirs, per_process=self.per_process, by_loader=self.by_loader
        )

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
        file against the dataset's names again (a match per row, repeated by every
        filter). None over a spilled table."""
        if not isinstance(self.events, pl.DataFrame):
            return None
        return self.events.select(
            (_IO & pl.col("file").is_in(self.dataset_files)).fill_null(False)
        ).to_series()

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
        shared frame of every column a pass reads would be held through the whole
        analysis). Over a spilled table, a streaming query of those columns."""
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
        weights = pp.group_by("pid").agg(
            (pl.col("reads") + pl.col("writes") + pl.col("opens")).sum().alias("w")
        )
        total = int(weights["w"].sum() or 0)
        n = min(PID_BATCHES, weights.height)
        if n < 2 or total < PID_BATCH_MIN_ROWS:
            return [None]
        loads = [0] * n
        members: list[list[int]] = [[] for _ in range(n)]
        for pid, w in weights.sort(
            ["w", "pid"], descending=[True, False], nulls_last=True
        ).iter_rows():
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

    def row_batches(
        self, exprs: list[pl.Expr], cond: pl.Expr, *, dataset: bool = True
    ) -> Iterator[pl.DataFrame]:
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
        lo, hi = self.collect(
            self.scan.select(pl.col("pid").min().alias("lo"), pl.col("pid").max().alias("hi"))
        ).row(0)
        return lo is None or (_PACKED_PIDS[0] <= int(lo) and int(hi) <= _PACKED_PIDS[1])

    @property
    def dataset_io(self) -> pl.DataFrame:
        """I/O events on dataset files with :data:`DATASET_IO_COLUMNS` (built on each use:
        the passes read :meth:`dataset_rows` with their own columns)."""
        return self.dataset_rows(DATASET_IO_COLUMNS)

    @property
    def dataset_reads(self) -> pl.DataFrame:
        """Reads of dataset files that moved bytes, with :data:`DATASET_IO_COLUMNS` (built on each use)."""
        return self.dataset_rows(DATASET_IO_COLUMNS, DATA_READ)

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
        return voc.epoch_spans(self.annotations).with_columns(
            (pl.col("end") - pl.col("ts")).alias("dur")
        )

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
        if sized.height == len(
            self.dataset_files
        ):  # every file has an end: no per-open sums to add
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
        row = self.collect(
            self.scan.select(
                pl.col("ts").min().alias("a"),
                (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("b"),
            )
        ).row(0)
        if row[0] is None or row[1] is None:
            return (0, 0)
        return int(row[0]), int(row[1])

    @property
    def duration_s(self) -> float:
        return (self.span[1] - self.span[0]) * US


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
    warm = {
        p: warmup_steps(g["compute_us"].to_numpy() * US)
        for (p,), g in s.sort("ts").group_by("pid", maintain_order=True)
    }
    k = pl.int_range(pl.len()).over("pid")
    return s.sort("pid", "ts").with_columns(
        (k < pl.col("pid").replace_strict(warm, default=1)).alias("warm")
    )


# ---------------------------------------------------------------------------------------
# Darshan's flags of the dataset reads


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
    r = reads.sort("ts").with_columns(
        pl.col("session").fill_null(0) if "session" in reads.columns else pl.lit(0).alias("session")
    )
    grp = [*keys, "session"]
    prev_end = (pl.col("offset") + pl.col("size")).shift(1).over(grp).fill_null(0)
    return r.with_columns(
        (pl.col("offset") >= prev_end).alias("seq"),
        (pl.col("offset") == prev_end).alias("consec"),
    )


def sessions(io: pl.DataFrame) -> pl.DataFrame:
    """``io`` with ``session``: the number of opens of (pid, file) up to each event."""
    return io.sort("ts").with_columns(
        pl.col("name").is_in(OPEN_OPS).cast(pl.Int64).cum_sum().over("pid", "file").alias("session")
    )


def flag_reads(io: pl.DataFrame) -> pl.DataFrame:
    """The reads (bytes > 0, offset known) of ``io`` (pid, file, name, size, offset; in
    time order) with Darshan's ``seq``/``consec`` flags, compared within each open of a
    (process, file): what :func:`darshan_pattern` of :func:`sessions` gives, row order
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
    and file code packed (a two-key sort row-encodes its keys: more bytes a row);
    a null pid sorts first, as in the two-key sort.
    """
    read = pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("offset").is_not_null()
    rows = io.select(
        "pid", "file", "name", "size", "offset", read.fill_null(False).alias("__r")
    ).filter(pl.col("__r") | pl.col("name").is_in(OPEN_OPS))
    code = pl.col("file").to_physical().cast(pl.Int64)
    if packed:
        key = pl.col("pid").cast(pl.Int64).fill_null(-1) * (1 << 32) + code
        rows = rows.with_columns(key.alias("__k")).sort("__k", maintain_order=True)
        same = pl.col("__k") == pl.col("__k").shift(1)
    else:
        rows = rows.with_columns(code.alias("__k")).sort("pid", "__k", maintain_order=True)
        same = pl.col("pid").eq_missing(pl.col("pid").shift(1)) & (
            pl.col("__k") == pl.col("__k").shift(1)
        )
    prev = (same & pl.col("__r").shift(1)).fill_null(False)
    prev_end = pl.when(prev).then((pl.col("offset") + pl.col("size")).shift(1)).otherwise(0)
    return (
        rows.with_columns(
            (pl.col("offset") >= prev_end).alias("seq"),
            (pl.col("offset") == prev_end).alias("consec"),
        )
        .filter(pl.col("__r"))
        .drop("__k", "__r")
    )


# ---------------------------------------------------------------------------------------
# The loops in C


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
        _KERNELS.read_flags(
            state, *(np.ascontiguousarray(rows[c].to_numpy()) for c in _READ_FLAG_COLUMNS)
        )
        del rows
    kinds = {
        "__code": np.uint32,
        "size": np.int64,
        "n": np.int64,
        "__seq": np.int64,
        "__con": np.int64,
    }
    groups = pl.DataFrame(
        {
            c: np.frombuffer(b, t)
            for (c, t), b in zip(kinds.items(), _KERNELS.read_flag_groups(state), strict=True)
        }
    )
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
    return [
        _i64(pl.col("pid"), "__pid"),
        pl.col("file").to_physical().cast(pl.UInt32).alias("__code"),
        kind.cast(pl.UInt8).alias("__kind"),
        pl.col("offset").cast(pl.Int64).fill_null(0).alias("__off"),
        pl.col("size").cast(pl.Int64).fill_null(0).alias("__size"),
    ]


def _intervals(
    frame: pl.DataFrame, key: pl.Expr, end: pl.Expr
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key, start, end) of the intervals ``frame`` holds (start: ``ts``) as int64 arrays,
    sorted by (key, start) and stably (of equal starts the last in ``frame`` is the one an
    as-of join takes); rows with a null key or start left out, a null end as
    :data:`_NULL_I64` (encloses nothing)."""
    iv = (
        frame.lazy()
        .select(
            key.cast(pl.Int64).alias("k"), pl.col("ts").cast(pl.Int64).alias("s"), _i64(end, "e")
        )
        .drop_nulls(["k", "s"])
        .collect()
    )
    k, s, e = (iv[c].to_numpy() for c in ("k", "s", "e"))
    # (numpy's stable sorts: one key where the starts are in order already, as a table's are)
    order = np.argsort(k, kind="stable") if bool(np.all(s[1:] >= s[:-1])) else np.lexsort((s, k))
    return k[order], s[order], e[order]


def _interval_sums(
    rows: pl.DataFrame,
    iv: tuple[np.ndarray, np.ndarray, np.ndarray],
    counts: np.ndarray,
    sums: np.ndarray,
    *,
    overlap: bool = False,
) -> None:
    """Add ``rows`` (``k``, ``t``, ``v``: int64, no nulls; nulls of ``k`` and ``t`` as
    :data:`_NULL_I64`) into ``counts`` and ``sums`` (int64, one per interval of ``iv``, see
    :func:`_intervals`), each row into the last interval of its key started at or before
    its ``t`` (polars' backward ``join_asof`` by key), in one pass in C (``interval_sums``):
    the rows inside it (``t`` <= its end) and their ``v``; with ``overlap``, every row
    matched and the µs of [t, t + v) inside the interval."""
    _KERNELS.interval_sums(
        *(np.ascontiguousarray(rows[c].to_numpy(), dtype=np.int64) for c in ("k", "t", "v")),
        *iv,
        overlap,
        counts,
        sums,
    )


def in_items(v: TraceView, rows: pl.LazyFrame, items: pl.DataFrame) -> pl.LazyFrame:
    """``rows`` (pid, ts, ...: rows of the table in table order) with ``item_ts``: the start
    of the item (sample) event of the same process that encloses each row, null outside
    items (what :func:`~..distill.observe.assign_items` gives, as a query, without the sample index)."""
    it = (
        items.lazy()
        .select("pid", pl.col("ts").alias("item_ts"), (pl.col("ts") + pl.col("dur")).alias("__end"))
        .sort("item_ts")
    )
    joined = v.by_ts(rows).join_asof(
        it, left_on="ts", right_on="item_ts", by="pid", strategy="backward", check_sortedness=False
    )
    return joined.with_columns(
        pl.when(pl.col("ts") <= pl.col("__end")).then(pl.col("item_ts")).alias("item_ts")
    ).drop("__end")


def kernel_read_flags(v: TraceView, ops: pl.Expr) -> pl.DataFrame:
    """:func:`~.reads.pass_access`'s counts per (file, read size) of the dataset reads among the
    rows that match ``ops`` (opens and reads): :func:`_read_flag_counts`, in C."""
    # (the dataset's names in the table's Categorical type: the codes its rows carry)
    files = pl.Series("file", v.dataset_files, pl.String).cast(v.scan.collect_schema()["file"])
    return _read_flag_counts(v.row_batches(_read_flag_columns(), ops), files)


def kernel_sample_reads(v: TraceView, items: pl.DataFrame) -> dict[str, Any]:
    """:func:`~.reads.pass_transfer`'s samples (with reads), reads and bytes per sample (medians):
    each dataset read counted into the item (sample) event that encloses it, in C."""
    iv = _intervals(items, pl.col("pid"), pl.col("ts") + pl.col("dur"))
    reads, nbytes = np.zeros(len(iv[0]), np.int64), np.zeros(len(iv[0]), np.int64)
    for rows in v.row_batches(
        [_i64(pl.col("pid"), "k"), _i64(pl.col("ts"), "t"), pl.col("size").alias("v")], DATA_READ
    ):
        _interval_sums(rows, iv, reads, nbytes)
        del rows
    got = reads > 0
    n = int(got.sum())
    return {
        "samples_with_reads": n,
        "reads_per_sample": rounded(np.median(reads[got]), 2) if n else None,
        "bytes_per_sample": rounded(np.median(nbytes[got]), 1) if n else None,
    }


def kernel_overlapped(v: TraceView, st: pl.DataFrame, cons: list[int]) -> tuple[int, int]:
    """:func:`~.loop.pass_overlap`'s sums (µs): dataset I/O time inside its owner's steps, and all of
    it; each call matched to its step in C."""
    iv = _intervals(st, pl.col("pid"), pl.col("ts") + pl.col("dur"))
    owner = pl.when(pl.col("pid").is_in(cons)).then(pl.col("pid")).otherwise(pl.col("ppid"))
    counts, inside = np.zeros(len(iv[0]), np.int64), np.zeros(len(iv[0]), np.int64)
    total = 0
    for calls in v.row_batches(
        [_i64(owner, "k"), _i64(pl.col("ts"), "t"), pl.col("dur").fill_null(0).alias("v")],
        pl.lit(True),
    ):
        _interval_sums(calls, iv, counts, inside, overlap=True)
        total += int(calls["v"].sum() or 0)
        del calls
    return int(inside.sum()), total


def kernel_io_in_items(v: TraceView, items: pl.DataFrame, loaders: pl.Expr) -> int:
    """:func:`~.processes.pass_preprocess`'s I/O time (µs) of the ``loaders``' calls inside their item
    events: each call counted into the item that encloses it, in C."""
    iv = _intervals(items, pl.col("pid"), pl.col("ts") + pl.col("dur"))
    counts, inside = np.zeros(len(iv[0]), np.int64), np.zeros(len(iv[0]), np.int64)
    for rows in v.row_batches(
        [_i64(pl.col("pid"), "k"), _i64(pl.col("ts"), "t"), pl.col("dur").fill_null(0).alias("v")],
        _IO & loaders,
        dataset=False,
    ):
        _interval_sums(rows, iv, counts, inside)
        del rows
    return int(inside.sum())
