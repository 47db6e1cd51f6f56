"""The run's tables and its event table: ``FH`` paths and processes across all files
(:func:`run_tables`; a pid seen on two hosts numbered anew, :func:`renumbered`), the parts'
rows merged into (``ts``, file, line) order (the C k-way merge ``merge_runs`` where it is
built, else a stable sort) and given the :data:`~dlreplay.schema.EVENT_SCHEMA` columns
(:func:`finalize`), and the summary's per-(file, host, pid) table from the parts' counts
(:func:`per_process_from_counts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl

from dlreplay.allocator import release_free_memory
from dlreplay.schema import (
    EVENT_SCHEMA,
)

from . import native, shapes, vocabulary
from .compact import one_frame
from .counts import file_process_table_counted
from .inputs import available_cores
from .offsets import RANK_PIDS
from .resolve import gather_columns, lookup, row_index
from .shapes import (
    CAT,
    COUNTS_SCHEMA,
    FH_SCHEMA,
    MARKER_SCHEMA,
    PART_SCHEMA,
    PROCESS_SCHEMA,
    RENUMBERED,
    STR,
    FileReport,
    TracePart,
    count_problem,
    counted_problem,
    int_stat,
)

__all__ = [
    "RunTables",
    "add_reports",
    "canonical",
    "finalize",
    "merge_parts",
    "per_process_from_counts",
    "renumbered",
    "run_tables",
]


def add_reports(a: FileReport, b: FileReport) -> FileReport:
    """The report of a file from the reports of two of its byte ranges (in file order)."""
    problems = list(a.problems)
    for p in b.problems:  # the counts of values read as null: one line per kind
        got = counted_problem(p)
        if got is not None:
            count_problem(problems, *got)
        else:
            problems.append(p)
    return FileReport(
        path=a.path,
        bytes=a.bytes + b.bytes,
        members=a.members + b.members,
        lines=a.lines + b.lines,
        events=0,
        dropped_lines=a.dropped_lines + b.dropped_lines,
        dropped_bytes=a.dropped_bytes + b.dropped_bytes,
        problems=problems,
    )


@dataclass(frozen=True)
class RunTables:
    """What the rows of every part need from the whole run (:func:`run_tables`): the
    processes (one row per (``src``, ``pid``) in the order of the parts' ``__p`` indices
    plus each part's offset, with ``ppid``, ``host``, ``source`` and the working
    directory ``__cwd``), and the path of every file hash that an ``FH`` record names,
    by the hash's category code (``path_by_code``, Categorical, null where none)."""

    processes: pl.DataFrame
    path_by_code: pl.Series


def run_tables(
    processes: Sequence[pl.DataFrame],
    fh: Sequence[pl.DataFrame],
    names: Sequence[str],
    top_id: int = 0,
) -> RunTables:
    """The :class:`RunTables` of parts whose processes and ``FH`` records are ``processes``
    and ``fh`` (in part order: a part's ``__p`` plus the processes of the parts before it
    index the result); ``names[src]`` is the source name of file ``src``; ``top_id`` the
    largest pid or tid of the parts' rows (see :func:`_host_pids`)."""
    records = (
        one_frame(list(fh), FH_SCHEMA)
        .sort("src", "seq")
        .unique(subset="hash", keep="first", maintain_order=True)
    )
    procs = one_frame(list(processes), PROCESS_SCHEMA).rechunk()
    # working directory of every process (its start record's cwd hash, resolved by FH)
    procs = procs.with_columns(
        lookup(pl.col("cwdhash"), records["hash"], records["name"], STR).alias("__cwd"),
        pl.Series(names, dtype=CAT).gather(procs["src"]).alias("source"),
        pl.col("host").cast(CAT),
    ).rechunk()
    paths = records.join(
        procs.select("src", "pid", "__cwd"), on=["src", "pid"], how="left", maintain_order="left"
    ).select(
        pl.col("hash").cast(CAT).to_physical().alias("code"),
        _absolute(pl.col("name")).cast(CAT).alias("path"),
    )
    size = (int_stat(paths["code"].max()) or -1) + 1
    by_code = pl.DataFrame({"code": np.arange(size, dtype=np.uint32)}).join(
        paths, on="code", how="left", maintain_order="left"
    )["path"]
    return RunTables(processes=_host_pids(procs, top_id), path_by_code=by_code.rechunk())


def _host_pids(procs: pl.DataFrame, top_id: int) -> pl.DataFrame:
    """``procs`` with ``__pid`` and ``ppid`` renumbered where one pid runs on several hosts.

    A process is (host, pid), but the event table and its passes key processes by pid: two
    nodes' processes of one pid (likely across many nodes: pid_max is often 32768) would be
    one process there, their epochs and steps mixed. The host whose trace file comes first
    keeps the pid; each other host's processes of it get a new id above every pid, ppid
    and tid of the run (``top_id``: the rows' largest pid or tid), in (pid, file) order,
    and the ppid of that host's processes follows. Pids below :data:`RANK_PIDS` (DLIO's
    rank numbers, split by thread later) and processes without a host keep theirs. No
    ``__pid`` column where no pid is shared (the rows keep their pid)."""
    hosts = (
        procs.filter(pl.col("host").is_not_null() & (pl.col("pid") >= RANK_PIDS))
        .group_by("pid", "host")
        .agg(pl.col("src").min().alias("__s"))
    )
    shared = hosts.filter(pl.len().over("pid") > 1)
    if shared.is_empty():
        return procs
    top = max(top_id, int_stat(procs["pid"].max()) or 0, int_stat(procs["ppid"].max()) or 0)
    moved = (
        shared.sort("pid", "__s", "host")
        .filter(pl.int_range(pl.len()).over("pid") > 0)
        .with_columns(
            (top + 1 + pl.int_range(pl.len(), dtype=pl.Int64)).cast(pl.Int32).alias("__new")
        )
        .select("host", "pid", "__new")
    )
    return (
        procs.join(moved, on=["host", "pid"], how="left", maintain_order="left")
        .join(
            moved.rename({"pid": "ppid", "__new": "__newp"}),
            on=["host", "ppid"],
            how="left",
            maintain_order="left",
        )
        .with_columns(
            pl.coalesce("__new", "pid").alias("__pid"), pl.coalesce("__newp", "ppid").alias("ppid")
        )
        .drop("__new", "__newp")
    )


def renumbered(procs: pl.DataFrame) -> dict[int, list[str]]:
    """Per trace file (``src``): a sentence per process of it that :func:`_host_pids` numbered
    anew (for the file's report, and so the run's warnings)."""
    if "__pid" not in procs.columns:
        return {}
    out: dict[int, list[str]] = {}
    moved = (
        procs.filter(pl.col("__pid") != pl.col("pid"))
        .select("src", "host", "pid", "__pid")
        .unique()
    )
    for src, host, pid, new in moved.sort("src", "pid").iter_rows():
        out.setdefault(int(src), []).append(f"pid {pid} on {host} is {new} here: it {RENUMBERED}")
    return out


def finalize(
    events: pl.DataFrame | list[pl.DataFrame],
    order: np.ndarray | list[np.ndarray | None] | None,
    tables: RunTables,
) -> tuple[pl.DataFrame, pl.Series]:
    """(event table, process index per row): the :data:`~dlreplay.schema.EVENT_SCHEMA` table
    but ``role`` (:func:`canonical` adds it) of parts' rows ``events`` (:data:`PART_SCHEMA`, ``__p`` indexing ``tables``' processes;
    or a list holding that frame, taken out of it so that its columns are freed as they
    are gathered), gathered in ``order`` (None: as they are). ``file`` is the path the
    run's ``FH`` records give the file hash, else the event's path argument, made
    absolute with the process's working directory."""
    held = events if isinstance(events, list) else [events]
    del events
    out = gather_columns(held, order, list(PART_SCHEMA))
    procs = tables.processes
    file = _file_column(out, tables)
    release_free_memory(
        keep_large=True
    )  # the gather's last group and the file lookup's, before the new columns
    pid = _per_process(procs["__pid"], "pid") if "__pid" in procs.columns else pl.col("pid")
    table = out.select(
        pid,
        "tid",
        _per_process(procs["ppid"], "ppid"),
        _per_process(procs["host"], "host"),
        "ts",
        "dur",
        "cat",
        "name",
        pl.lit(file).alias("file"),
        "fhash",
        "size_requested",
        "size",
        "offset",
        "ret",
        "epoch",
        "step",
        "batch_size",
        "sample_index",
        "cpu_time",
        "cpu_threads",
        "tensors",
        _per_process(procs["source"], "source"),
    ).cast(pl.Schema({c: dt for c, dt in EVENT_SCHEMA.items() if c != "role"}))  # type: ignore[arg-type]
    return table, out["__p"]


def _per_process(values: pl.Series, name: str) -> pl.Expr:
    """The column ``name`` of the rows (with ``__p``) from their process's ``values``: one
    value (one host, one trace file, no ppid) is a constant column, of no size."""
    if values.len() and values.n_unique() == 1:
        return pl.lit(values[0], dtype=values.dtype).alias(name)
    return pl.lit(values).gather(pl.col("__p")).alias(name)


def _file_column(rows: pl.DataFrame, tables: RunTables) -> pl.Series:
    """The ``file`` of ``rows`` (with ``fhash``, ``__path`` and ``__p``): the path the run's
    ``FH`` records give the file hash, else (checkpoint events, 1.x ``fname``) the path
    argument made absolute with the process's working directory; Categorical."""
    nfile = tables.path_by_code.len()
    code = pl.col("fhash").to_physical()
    file = (
        rows.select(
            pl.lit(tables.path_by_code).gather(pl.when(code < nfile).then(code)).alias("file")
        ).to_series()
        if nfile
        else pl.Series("file", [None] * rows.height, dtype=CAT)
    )
    named = (
        rows.lazy()
        .with_row_index("__row")
        .filter(pl.col("__path").is_not_null())
        .select("__row", "__p", "__path")
        .collect()
    )
    if named.height:
        named = named.filter(file.gather(named["__row"]).is_null())
    if named.height:
        sub = named.join(
            tables.processes.with_row_index("__p").select("__p", "__cwd"),
            on="__p",
            how="left",
            maintain_order="left",
        )
        paths = sub.select(_absolute(pl.col("__path").cast(STR))).to_series().cast(CAT)
        file = file.scatter(named["__row"], paths)
    return file.alias("file")


def per_process_from_counts(counts: pl.DataFrame, tables: RunTables) -> pl.DataFrame:
    """The summary's per-(file, host, pid) table (:func:`~.counts.file_process_table_counted`)
    from the parts' :func:`_part_counts` (``__p`` indexing ``tables``' processes)."""
    file = _file_column(counts, tables)
    counted = counts.with_columns(file)
    paths = _distinct_categorical(file)
    none = paths.len()
    procs = tables.processes
    if "__pid" in procs.columns:  # (pids shared by hosts, renumbered: see _host_pids)
        procs = procs.with_columns(pl.col("__pid").alias("pid"))
    hosts = procs.select("host", "pid").unique(maintain_order=True)
    pkey = procs.join(
        hosts.with_row_index("__h"),
        on=["host", "pid"],
        how="left",
        nulls_equal=True,
        maintain_order="left",
    )["__h"]
    counted = counted.select(
        _code_index(pl.col("file"), paths).alias("__file"),
        pl.lit(pkey).gather(pl.col("__p")).alias("__proc"),
        "cls",
        "n",
        "b",
        "item",
    )
    loaders = (
        counted.filter(pl.col("item"))["__proc"].unique().to_numpy()
    )  # item events have no file
    return file_process_table_counted(
        counted.filter(pl.col("__file") != none), paths, hosts, loaders
    )


def merge_parts(
    parts: list[TracePart], names: Sequence[str]
) -> tuple[pl.DataFrame, pl.DataFrame | None, dict[int, int], dict[int, list[str]]]:
    """(event table, per-process table, events per src, notes per src: :func:`renumbered`) of
    resolved parts (``parts`` is emptied)."""
    frames, orders, processes, fh, counts, markers, base = [], [], [], [], [], [], 0
    for p in parts:
        fh.append(p.fh)
        markers.append(p.markers)
        if not p.events.height:
            continue
        frames.append(_shift_processes(p.events, base))
        orders.append(p.order)
        counts.append(p.counts.with_columns(pl.col("__p") + base) if base else p.counts)
        processes.append(p.processes)
        base += p.processes.height
    del p
    parts.clear()
    if not frames:
        return (
            pl.DataFrame(schema=EVENT_SCHEMA),
            None,
            {},
            {},
        )  # (a trace of markers only has no processes)
    tables = run_tables(
        processes,
        fh,
        names,
        max((int_stat(f[c].max()) or 0) for f in frames for c in ("pid", "tid")),
    )
    # the per-process table needs only the parts' counts: built in a thread beside the order
    # and the gather, which leave a core idle at times
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlreplay-merge") as side:
        per_process_job = side.submit(
            per_process_from_counts, one_frame(counts, COUNTS_SCHEMA), tables
        )
        del counts
        proc_src = tables.processes["src"].to_numpy()
        runs = len(frames)
        # each part's rows are in (ts, file) order as its order lists them: merge the parts
        # by (ts, file) into row indices of their concatenation, gathered once below
        order = _merged_runs(frames, orders, proc_src) if runs > 1 else orders[0]
        if runs > 1 and order is None:  # each part into its order, then a stable sort of them all
            for i, o in enumerate(orders):
                if o is not None:
                    frames[i] = gather_columns([frames[i]], o, list(frames[i].columns))
        del orders
        ev = frames[0] if runs == 1 else pl.concat(frames, how="vertical", rechunk=False)
        del frames
        if runs > 1 and order is None:
            order = _merge_order(ev["ts"], proc_src[ev["__p"].to_numpy()])
        held, kept = [ev], [order]
        del ev, order
        events, pidx = finalize(held, kept, tables)
        # rows per process (a small table: not a source index per row), then per file
        per_p = pidx.value_counts()
        per_src = np.bincount(
            proc_src[per_p[pidx.name].to_numpy()],
            weights=per_p["count"].to_numpy(),
            minlength=len(names),
        ).astype(np.int64)
        del pidx, per_p
        per_file = {int(i): int(per_src[i]) for i in np.flatnonzero(per_src)}
        per_process = per_process_job.result()
    release_free_memory(keep_large=True)
    events, changed = canonical(events, one_frame(markers, MARKER_SCHEMA), names)
    # processes or roles other than the raw rows said: the per-process table is counted
    # again, by role, where it is used (TraceView.per_process, summarize)
    return events, (None if changed else per_process), per_file, renumbered(tables.processes)


def _shift_processes(events: pl.DataFrame, base: int) -> pl.DataFrame:
    """``events`` with ``base`` added to ``__p``, its other columns as they are (where a
    part's columns lie in chunks of different lengths, ``with_columns`` copied them all
    into one chunk each first)."""
    if not base:
        return events
    out = events.clone()  # (shallow: the caller's frame stays as it was)
    out.replace_column(out.get_column_index("__p"), out.get_column("__p") + base)
    return out


def canonical(
    events: pl.DataFrame,
    markers: pl.DataFrame,
    names: Sequence[str],
    run: vocabulary.RunThreads | None = None,
) -> tuple[pl.DataFrame, bool]:
    """The one event vocabulary (:func:`~..vocabulary.canonicalize`: roles, DLIO's rank pids,
    start/stop markers) over :func:`finalize`'s table, in :data:`~dlreplay.schema.EVENT_SCHEMA`
    (``role`` Categorical); True when it changed processes or roles the loader's own
    per-process counts relied on. ``run``: what the whole run holds, where ``events`` is
    one part of it (the spilled loader)."""
    table, changed = vocabulary.canonicalize(
        events, vocabulary.marker_spans(markers), list(names), run
    )
    return table.cast(pl.Schema(EVENT_SCHEMA), strict=False), changed  # type: ignore[arg-type]


#: Rows of the merge's output below which its slices are not merged in threads of their own.
_MERGE_SLICE_ROWS = 1 << 19


def _merged_runs(
    frames: list[pl.DataFrame], orders: Sequence[np.ndarray | None], proc_src: np.ndarray
) -> np.ndarray | None:
    """The row order by (``ts``, file) of the concatenation of ``frames`` (resolved parts,
    each in that order as its entry of ``orders`` lists its rows, or as they are where
    that is None; ``__p`` indexing ``proc_src``, the file of each process) as a k-way merge
    in C (``merge_runs``), faster than the stable sort of packed keys, which faults in
    large temporaries; cut into slices merged in threads, one a core (measured: benchmarks/RESULTS.md). None where it
    does not apply (no C extension, a null ``ts``, a part out of order): then the parts are
    gathered into order and :func:`_merge_order` gives the same order."""
    if native.NATIVE is None:
        return None
    ts, procs = [], []
    for f in frames:
        t, p = f["ts"], f["__p"]
        if t.null_count() or p.null_count() or t.dtype != pl.Int64 or p.dtype != pl.UInt32:
            return None
        ts.append(t.rechunk().to_numpy())
        procs.append(p.rechunk().to_numpy())
    n = sum(len(t) for t in ts)
    out = np.empty(n, dtype=np.uint32 if n < (1 << 32) else np.int64)
    src = np.ascontiguousarray(proc_src, dtype=np.uint32)
    ords = list(orders)
    # slices of the output merged in parallel threads (merge_runs cuts them at keys of the
    # largest run; each slice ~_MERGE_SLICE_ROWS rows or more)
    parts = max(1, min(available_cores(), n // _MERGE_SLICE_ROWS))
    if parts == 1:
        return out if native.NATIVE.merge_runs(ts, procs, src, out, ords) else None
    with ThreadPoolExecutor(
        max_workers=parts - 1, thread_name_prefix="dlreplay-merge-runs"
    ) as pool:
        others = [
            pool.submit(native.NATIVE.merge_runs, ts, procs, src, out, ords, q, parts)
            for q in range(1, parts)
        ]
        done = [
            native.NATIVE.merge_runs(ts, procs, src, out, ords, 0, parts),
            *(f.result() for f in others),
        ]
    return out if all(done) else None


def _merge_order(ts: pl.Series, src: np.ndarray) -> np.ndarray:
    """Row order by (``ts``, null last; ``src``) of rows that are in (ts, src, line) order
    within each part and whose parts each hold whole files: a stable sort, so the rows of
    one file keep their line order among equal timestamps."""
    tmin, tmax = int_stat(ts.min()), int_stat(ts.max())
    b_src = max(int(src.max()) if len(src) else 0, 1).bit_length()
    span = 1 if tmin is None or tmax is None else tmax - tmin + 2  # +1 for null ts
    if span.bit_length() + b_src > shapes.PACK_BITS:  # lexsort is stable; its last key sorts first
        return np.lexsort((src, ts.fill_null(0).to_numpy(), ts.is_null().to_numpy()))
    t = ts.fill_null((tmax + 1) if tmax is not None else 0).to_numpy()
    key = ((t - (tmin or 0)) << b_src) | src.astype(np.int64)
    return np.argsort(key, kind="stable")


def _distinct_categorical(values: pl.Series) -> pl.Series:
    """The distinct non-null values of the Categorical ``values`` (in code order): one row
    of each code, found with numpy over the integer codes (faster than ``unique()``)."""
    present = values.drop_nulls()
    codes = present.to_physical().to_numpy()
    if not len(codes):
        return present
    row = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    row[codes] = np.arange(len(codes), dtype=np.int64)  # a row of each code (any one)
    return present.gather(row_index(row[row >= 0]))


def _code_index(values: pl.Expr, keys: pl.Series) -> pl.Expr:
    """Per row of the Categorical ``values``: the index (UInt32) of its value in ``keys``
    (distinct, Categorical), ``len(keys)`` when null; a lookup table over the category
    codes (an expression, so the column keeps the frame's chunks)."""
    nk = keys.len()
    codes = keys.to_physical().to_numpy()
    size = int(codes.max()) + 2 if nk else 1
    table = np.full(size, nk, dtype=np.uint32)
    table[codes] = np.arange(nk, dtype=np.uint32)
    return pl.lit(pl.Series(table)).gather(values.to_physical().fill_null(size - 1))


def _absolute(path: pl.Expr) -> pl.Expr:
    """A path made absolute with the process working directory (``__cwd``) when relative."""
    return (
        pl.when(path.str.starts_with("/") | pl.col("__cwd").is_null())
        .then(path)
        .otherwise(pl.concat_str([pl.col("__cwd").str.strip_suffix("/"), path], separator="/"))
    )
