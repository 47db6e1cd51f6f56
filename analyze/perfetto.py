"""Perfetto timeline of a trace: export, PerfettoSQL queries, and a local viewer.

>>> from dlreplay.analyze import load
>>> from dlreplay.analyze.perfetto import export_trace, query
>>> stats = export_trace(load("traces/npz_fork"), "out.perfetto-trace")   # doctest: +SKIP
>>> query("out.perfetto-trace", "select count(*) n from slice")            # doctest: +SKIP

Layout of the exported timeline:

* one process track per traced process, named ``consumer (pid N)`` (or ``rank R
  consumer (pid N)`` when several processes fetch batches), ``loader worker K (pid N)``
  for the data-loader workers of a consumer (K in start order), else the command;
* one thread track per thread; every event is a slice on its thread, nested
  (``epoch`` contains ``fetch``/``step``; ``item`` contains the POSIX calls it makes).
  A slice that would end after its parent is clipped to the parent's end (counted in
  :attr:`ExportStats.clipped`), so nesting is always valid;
* slice args: ``file``, ``bytes`` (transferred), ``offset``, ``operation`` and the
  data-loader fields (``epoch``, ``step``, ``batch_size``, ``sample_index``);
* global counter tracks ``read bandwidth (MB/s)`` (100 ms bins) and ``reads in flight``;
* flow arrows from the last ``item`` of a batch in a worker to the consumer's ``fetch``
  of that batch, where the batch can be matched (round-robin hand-over of PyTorch's
  DataLoader).

Formats, chosen by the output name: ``.perfetto-trace``/``.pftrace`` (native protobuf,
``TrackEvent`` with interned strings) and ``.json``/``.json.gz`` (Chrome JSON). Both are
written in chunks of :data:`CHUNK_ROWS` events, so memory stays bounded by the event
table plus one chunk.

Units: the event table is in microseconds; the protobuf format is in nanoseconds, the
JSON format in microseconds; sizes are bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import polars as pl

from dlreplay.errors import DlreplayError
from dlreplay.schema import READ_OPS

from . import vocabulary as voc

__all__ = [
    "CHUNK_ROWS",
    "ExportError",
    "ExportStats",
    "NAMED_QUERIES",
    "QueryError",
    "Timeline",
    "TraceProcessorUnavailable",
    "export_trace",
    "format_for",
    "open_timeline",
    "query",
]

#: Event rows converted to Python objects at a time while writing.
CHUNK_ROWS = 50_000
#: Width of the read-bandwidth bins (microseconds).
BANDWIDTH_BIN_US = 100_000
#: Latest time a timeline can hold (µs): nanoseconds must fit a signed 64-bit integer.
MAX_TS_US = (2**63 - 1) // 1000

PROTO_SUFFIXES = (".perfetto-trace", ".pftrace")
JSON_SUFFIXES = (".json", ".json.gz")

# Tie-break when two events of one thread start at the same microsecond: the outer one first.
_CAT_RANK = {"pipeline": 0, "compute": 1, "dataloader": 1, "checkpoint": 2, "data": 3}
_ARG_COLUMNS = (
    "file",
    "size",
    "offset",
    "size_requested",
    "ret",
    "epoch",
    "step",
    "batch_size",
    "sample_index",
    "role",  # the event's meaning in dlreplay's vocabulary (analyze/vocabulary.py)
)
_ARG_NAMES = {"size": "bytes"}
_COUNTER_PID = 0  # the JSON format needs a process for counters: pid 0, "I/O counters"


class ExportError(DlreplayError):
    """The timeline cannot be written (unknown format, empty table, unwritable output)."""


@dataclass
class ExportStats:
    """What :func:`export_trace` wrote. Times are seconds, sizes bytes."""

    path: Path
    format: str  # "perfetto" or "json"
    slices: int = 0  # events written as slices (one per event row)
    clipped: int = 0  # slices shortened to end with their parent (nesting repair)
    dropped: int = 0  # rows without pid, tid or timestamp, or with a timestamp out of range (not written)
    repaired: int = 0  # negative durations (set to 0) or durations ending past MAX_TS_US (shortened)
    processes: int = 0
    threads: int = 0
    counter_points: int = 0  # values on the two counter tracks
    flows: int = 0  # item -> fetch arrows
    bytes_written: int = 0
    seconds: float = 0.0
    process_names: dict[int, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for the CLI."""
        line = (
            f"{self.path}: {self.format}, {self.slices} slices on {self.threads} threads of "
            f"{self.processes} processes, {self.flows} flows, {self.counter_points} counter values, "
            f"{self.clipped} clipped to nest, {self.bytes_written / 1e6:.1f} MB in {self.seconds:.1f} s"
        )
        if self.dropped:
            line += (f"; {self.dropped} event(s) not written (no pid, tid or timestamp, or a timestamp "
                     f"outside 0..{MAX_TS_US} µs)")
        if self.repaired:
            line += f"; {self.repaired} negative or overlong duration(s) repaired"
        return line


def format_for(path: str | os.PathLike[str]) -> str:
    """``"perfetto"`` or ``"json"`` from the output file name; raises :class:`ExportError`."""
    name = Path(path).name.lower()
    if name.endswith(PROTO_SUFFIXES):
        return "perfetto"
    if name.endswith(JSON_SUFFIXES):
        return "json"
    raise ExportError(
        f"{path}: unknown timeline format; name the output *.perfetto-trace (native, preferred), "
        "*.pftrace, *.json or *.json.gz"
    )


# =======================================================================================
# Processes and threads


@dataclass
class _Layout:
    """Names and ids of the process and thread tracks."""

    process_names: dict[int, str]
    process_order: dict[int, int]
    thread_names: dict[tuple[int, int], str]
    consumers: list[int]
    workers: dict[int, list[int]]  # consumer pid -> worker pids in start order


def _layout(events: pl.DataFrame, manifest: dict[str, Any] | None) -> _Layout:
    """Name every process: consumers (fetch events), their loader workers (item events), others."""
    procs = (
        events.group_by("pid")
        .agg(
            pl.col("ts").min().alias("start"),
            pl.col("ppid").drop_nulls().first().alias("ppid"),
            pl.col("role").is_in([voc.FETCH, voc.STEP, voc.COMPUTE]).any().alias("is_consumer"),
            (pl.col("role") == voc.ITEM).any().alias("is_worker"),
            pl.col("host").drop_nulls().first().alias("host"),
        )
        .sort("start", "pid", nulls_last=True)
    )
    rows = procs.to_dicts()
    ppid = {r["pid"]: r["ppid"] for r in rows}
    consumers = [r["pid"] for r in rows if r["is_consumer"]]
    hosts = {r["host"] for r in rows}
    names: dict[int, str] = {}
    for rank, pid in enumerate(consumers):
        names[pid] = (
            f"rank {rank} consumer (pid {pid})" if len(consumers) > 1 else f"consumer (pid {pid})"
        )

    def owner(pid: int) -> int | None:
        seen: set[int] = set()
        p = ppid.get(pid)
        while p is not None and p not in seen:
            if p in names and p in consumers:
                return p
            seen.add(p)
            p = ppid.get(p)
        return consumers[0] if len(consumers) == 1 else None

    workers: dict[int, list[int]] = {c: [] for c in consumers}
    orphans: list[int] = []
    for r in rows:
        if r["is_worker"] and not r["is_consumer"]:
            c = owner(r["pid"])
            (workers[c] if c is not None else orphans).append(r["pid"])
    for c, ws in workers.items():
        prefix = f"rank {consumers.index(c)} " if len(consumers) > 1 else ""
        for k, w in enumerate(ws):
            names[w] = f"{prefix}loader worker {k} (pid {w})"
    for k, w in enumerate(orphans):
        names[w] = f"loader worker {k} (pid {w})"
    command = (manifest or {}).get("command") or []
    cmd = " ".join(Path(str(c)).name for c in command[:2]) if command else ""
    traced = set(ppid)
    for r in rows:
        pid = r["pid"]
        if pid in names:
            continue
        root = ppid.get(pid) not in traced
        names[pid] = f"{cmd} (pid {pid})" if cmd and root else f"process (pid {pid})"
    if len(hosts) > 1:
        for r in rows:
            if r["host"]:
                names[r["pid"]] += f" @{r['host']}"
    order = {r["pid"]: i for i, r in enumerate(rows)}
    threads = events.group_by("pid", "tid").agg(pl.col("ts").min()).sort("ts", nulls_last=True)
    thread_names: dict[tuple[int, int], str] = {}
    for pid, tid, _ in threads.iter_rows():
        label = names[pid].split(" (pid")[0]
        thread_names[(pid, tid)] = f"{label} main" if tid == pid else f"{label} thread {tid}"
    return _Layout(names, order, thread_names, consumers, workers)


# =======================================================================================
# Nesting sweep


@dataclass
class _Sweep:
    """Per-thread stack state carried across chunks (times in microseconds)."""

    key: tuple[int, int] | None = None
    stack: list[int] = field(default_factory=list)  # open slices' end times, innermost last
    clipped: int = 0


def _sorted_for_nesting(events: pl.DataFrame) -> pl.DataFrame:
    """Events per thread by start, outer (longer) first at equal starts."""
    rank = pl.col("cat").replace_strict(_CAT_RANK, default=9, return_dtype=pl.Int8)
    return (
        events.lazy()
        .filter(pl.col("ts").is_not_null())
        .with_columns(pl.col("dur").fill_null(0).clip(lower_bound=0), rank.alias("_rank"))
        .sort(["pid", "tid", "ts", "dur", "_rank"], descending=[False, False, False, True, False])
        .drop("_rank")
        .collect()
    )


def _nest(
    sweep: _Sweep, pid: int, tid: int, ts: int, dur: int, ends: list[tuple[int, int, int]]
) -> int:
    """Close slices ending by ``ts``; clip this slice into its parent; return its end (µs).

    Appends ``(end_ts, pid, tid)`` for every closed slice to ``ends`` (in closing order).
    """
    key = (pid, tid)
    if key != sweep.key:
        _close_all(sweep, ends)
        sweep.key = key
    stack = sweep.stack
    while stack and stack[-1] <= ts:
        ends.append((stack.pop(), pid, tid))
    end = ts + dur
    if stack and end > stack[-1]:
        end = stack[-1]
        sweep.clipped += 1
    stack.append(end)
    return end


def _close_all(sweep: _Sweep, ends: list[tuple[int, int, int]]) -> None:
    if sweep.key is None:
        return
    pid, tid = sweep.key
    while sweep.stack:
        ends.append((sweep.stack.pop(), pid, tid))


def _chunks(frame: pl.DataFrame) -> Iterator[dict[str, list[Any]]]:
    """Column lists of ``frame`` in slices of :data:`CHUNK_ROWS` rows."""
    cols = ["pid", "tid", "ts", "dur", "cat", "name", *_ARG_COLUMNS]
    for part in frame.select(cols).iter_slices(CHUNK_ROWS):
        yield {c: part.get_column(c).to_list() for c in cols}


def _args(chunk: dict[str, list[Any]], i: int) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("operation", chunk["name"][i])]
    for c in _ARG_COLUMNS:
        v = chunk[c][i]
        if v is not None:
            out.append((_ARG_NAMES.get(c, c), v))
    return out


# =======================================================================================
# Counters and flows (small polars tables)


def _bandwidth(events: pl.DataFrame) -> pl.DataFrame:
    """Read bandwidth per 100 ms bin: columns ``ts`` (µs, bin start), ``value`` (MB/s).

    A read's bytes count in the bin of its midpoint. Runs of equal values are collapsed.
    """
    reads = events.filter(
        pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("ts").is_not_null()
    )
    if reads.is_empty():
        return pl.DataFrame({"ts": [], "value": []}, schema={"ts": pl.Int64, "value": pl.Float64})
    b = (
        reads.select(
            ((pl.col("ts") + pl.col("dur").fill_null(0) // 2) // BANDWIDTH_BIN_US).alias("bin"),
            "size",
        )
        .group_by("bin")
        .agg(pl.col("size").sum())
    )
    # Only bins with reads, and the empty bin after each (the value drops to 0 there): a
    # dense range of bins would need (last - first) / 100 ms rows (a bad timestamp years off
    # made that billions of rows).
    b = b.sort("bin")
    zeros = b.select((pl.col("bin") + 1).alias("bin"), pl.lit(0, dtype=b.schema["size"]).alias("size")).filter(
        ~pl.col("bin").is_in(b["bin"].implode())
    )
    out = (
        pl.concat([b, zeros])
        .sort("bin")
        .select(
            (pl.col("bin") * BANDWIDTH_BIN_US).alias("ts"),
            (pl.col("size") / 1e6 / (BANDWIDTH_BIN_US / 1e6)).alias("value"),
        )
    )
    return out.filter((pl.col("value") != pl.col("value").shift(1)).fill_null(True))


def _in_flight(events: pl.DataFrame) -> pl.DataFrame:
    """Reads in flight over all processes: columns ``ts`` (µs), ``value`` (count) at each change."""
    reads = events.filter(pl.col("name").is_in(READ_OPS) & pl.col("ts").is_not_null()).select(
        "ts", pl.col("dur").fill_null(0)
    )
    if reads.is_empty():
        return pl.DataFrame({"ts": [], "value": []}, schema={"ts": pl.Int64, "value": pl.Float64})
    deltas = pl.concat(
        [
            reads.select(pl.col("ts"), pl.lit(1, pl.Int64).alias("d")),
            reads.select(
                (pl.col("ts") + pl.col("dur")).alias("ts"), pl.lit(-1, pl.Int64).alias("d")
            ),
        ]
    )
    return (
        deltas.group_by("ts")
        .agg(pl.col("d").sum())
        .sort("ts")
        .select("ts", pl.col("d").cum_sum().cast(pl.Float64).alias("value"))
        .filter(pl.col("value") != pl.col("value").shift(1, fill_value=-1.0))
    )


def _flows(events: pl.DataFrame, layout: _Layout) -> pl.DataFrame:
    """Item -> fetch hand-overs: columns ``src_pid, src_tid, src_ts, dst_pid, dst_tid, dst_ts`` (µs).

    PyTorch's DataLoader gives batch ``j`` of an epoch to worker ``j % W`` and each worker
    builds its batches from ``batch_size`` consecutive items. Per consumer and epoch, the
    workers that start inside the epoch (or all of them, if persistent) are numbered in
    start order; a worker's items inside the epoch are cut into batches of the epoch's
    batch size; batch ``k`` of worker ``w`` is fetch step ``k * W + w``. The arrow starts
    at the last item of the batch, ends at that fetch, and is kept only when the item ends
    before the fetch does and begins before the fetch begins (flows attach to slice starts).
    """
    schema = {c: pl.Int64 for c in ("src_pid", "src_tid", "src_ts", "dst_pid", "dst_tid", "dst_ts")}
    out: list[pl.DataFrame] = []
    for consumer, workers in layout.workers.items():
        if not workers:
            continue
        cons = events.filter(pl.col("pid") == consumer)
        fetch = cons.filter(
            (pl.col("role") == voc.FETCH) & (pl.col("batch_size") > 0) & pl.col("step").is_not_null()
        )
        epochs = voc.epoch_spans(cons).with_columns((pl.col("end") - pl.col("ts")).alias("dur"))
        items = events.filter(pl.col("pid").is_in(workers) & (pl.col("role") == voc.ITEM)).select(
            "pid", "tid", "ts", "dur"
        )
        starts = items.group_by("pid").agg(pl.col("ts").min().alias("start"))
        for ep in epochs.iter_rows(named=True):
            e0, e1 = ep["ts"], ep["ts"] + (ep["dur"] or 0)
            f = (
                fetch.filter(pl.col("epoch") == ep["epoch"])
                if ep["epoch"] is not None
                else fetch.head(0)
            )
            if f.is_empty():
                continue
            bs = int(f.select(pl.col("batch_size").max().fill_null(0)).item())
            if bs <= 0:
                continue
            in_ep = starts.filter((pl.col("start") >= e0) & (pl.col("start") <= e1)).sort("start")
            wids = in_ep["pid"].to_list() or starts.sort("start")["pid"].to_list()
            n = len(wids)
            its = (
                items.filter(
                    pl.col("pid").is_in(wids) & (pl.col("ts") >= e0) & (pl.col("ts") <= e1)
                )
                .sort("pid", "ts")
                .with_columns(pl.int_range(pl.len()).over("pid").alias("k"))
                .with_columns(
                    (pl.col("k") // bs).alias("batch"),
                    pl.col("pid")
                    .replace_strict({p: i for i, p in enumerate(wids)}, return_dtype=pl.Int64)
                    .alias("w"),
                )
                .group_by("pid", "batch")
                .agg(
                    pl.col("tid").last(),
                    pl.col("ts").last(),
                    (pl.col("ts") + pl.col("dur").fill_null(0)).last().alias("end"),
                    pl.col("w").first(),
                    pl.len().alias("n"),
                )
                .with_columns((pl.col("batch") * n + pl.col("w")).alias("step"))
            )
            j = its.join(
                f.select(
                    "step",
                    pl.col("tid").alias("dst_tid"),
                    pl.col("ts").alias("dst_ts"),
                    (pl.col("ts") + pl.col("dur").fill_null(0)).alias("dst_end"),
                ),
                on="step",
            )
            # The trace processor needs the arrow's source slice to begin first.
            j = j.filter((pl.col("end") <= pl.col("dst_end")) & (pl.col("ts") <= pl.col("dst_ts")))
            out.append(
                j.select(
                    pl.col("pid").alias("src_pid"),
                    pl.col("tid").alias("src_tid"),
                    pl.col("ts").alias("src_ts"),
                    pl.lit(consumer, pl.Int64).alias("dst_pid"),
                    "dst_tid",
                    "dst_ts",
                ).cast(schema)  # type: ignore[arg-type]
            )
    if not out:
        return pl.DataFrame(schema=schema)
    return pl.concat(out)


# =======================================================================================
# Public entry point


def export_trace(
    events: pl.DataFrame,
    path: str | os.PathLike[str],
    *,
    manifest: dict[str, Any] | None = None,
    flows: bool = True,
) -> ExportStats:
    """Write the event table as a Perfetto timeline; the format follows ``path``'s suffix.

    ``manifest`` (the trace directory's ``manifest.json``) names the root process after
    its command. Raises :class:`ExportError` for an unknown suffix, an empty table or an
    unwritable output. Returns what was written (:class:`ExportStats`).
    """
    t0 = time.perf_counter()
    out = Path(path)
    fmt = format_for(out)
    if events.is_empty():
        raise ExportError("the trace has no events: nothing to export")
    missing = {"pid", "tid", "ts", "dur", "cat", "name"} - set(events.columns)
    if missing:
        raise ExportError(f"the event table lacks column(s) {sorted(missing)}")
    events = voc.ensure_roles(events)
    for c in _ARG_COLUMNS + ("ppid", "host"):
        if c not in events.columns:
            events = events.with_columns(pl.lit(None).alias(c))
    events, dropped, repaired = _usable(events)
    if events.is_empty():
        raise ExportError(f"none of the {dropped} event(s) has a pid, tid and a timestamp in 0..{MAX_TS_US} µs: "
                          "nothing to export")
    layout = _layout(events, manifest)
    stats = ExportStats(path=out, format=fmt, process_names=dict(layout.process_names))
    stats.dropped, stats.repaired = dropped, repaired
    stats.processes = len(layout.process_names)
    stats.threads = len(layout.thread_names)
    flow_table = _flows(events, layout) if flows else None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".part")
        if fmt == "perfetto":
            with open(tmp, "wb") as fh:
                _write_proto(fh, events, layout, stats, flow_table)
        else:
            opener = gzip.open if out.name.lower().endswith(".gz") else open
            with opener(tmp, "wb") as raw:  # type: ignore[operator]
                with io.TextIOWrapper(raw, encoding="utf-8", write_through=False) as fh:
                    _write_json(fh, events, layout, stats, flow_table)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # never leave a partial timeline (a full disk)
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from exc
    stats.bytes_written = out.stat().st_size
    stats.seconds = time.perf_counter() - t0
    return stats


def _usable(events: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
    """Rows a timeline can hold, and (rows dropped, durations repaired).

    Dropped: no pid, tid or timestamp, or a timestamp outside 0..MAX_TS_US. Repaired: a
    negative duration becomes 0, one ending after MAX_TS_US ends there.
    """
    ts, dur = pl.col("ts"), pl.col("dur")
    ok = (pl.col("pid").is_not_null() & pl.col("tid").is_not_null() & ts.is_between(0, MAX_TS_US)).fill_null(False)
    kept = events.filter(ok)
    bad_dur = ((dur < 0) | (dur > MAX_TS_US - ts)).fill_null(False)
    repaired = int(kept.select(bad_dur.sum()).item())
    if repaired:
        kept = kept.with_columns(pl.when(dur < 0).then(0).when(dur > MAX_TS_US - ts).then(MAX_TS_US - ts)
                                 .otherwise(dur).alias("dur"))
    return kept, events.height - kept.height, repaired


# =======================================================================================
# Chrome JSON


def _write_json(
    fh: IO[str],
    events: pl.DataFrame,
    layout: _Layout,
    stats: ExportStats,
    flow_table: pl.DataFrame | None,
) -> None:
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    fh.write('{"displayTimeUnit":"ms","traceEvents":[\n')
    first = True

    def emit(lines: list[str]) -> None:
        nonlocal first
        if not lines:
            return
        if not first:
            fh.write(",\n")
        fh.write(",\n".join(lines))
        first = False

    meta: list[str] = []
    for pid, name in layout.process_names.items():
        meta.append(
            dumps(
                {"ph": "M", "pid": pid, "tid": pid, "name": "process_name", "args": {"name": name}}
            )
        )
        meta.append(
            dumps(
                {
                    "ph": "M",
                    "pid": pid,
                    "tid": pid,
                    "name": "process_sort_index",
                    "args": {"sort_index": layout.process_order[pid]},
                }
            )
        )
    for (pid, tid), name in layout.thread_names.items():
        meta.append(
            dumps(
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
            )
        )
    meta.append(
        dumps(
            {
                "ph": "M",
                "pid": _COUNTER_PID,
                "tid": _COUNTER_PID,
                "name": "process_name",
                "args": {"name": "I/O counters"},
            }
        )
    )
    emit(meta)

    sweep = _Sweep()
    ends: list[tuple[int, int, int]] = []
    for chunk in _chunks(_sorted_for_nesting(events)):
        lines = []
        pid_c, tid_c, ts_c, dur_c, cat_c, name_c = (
            chunk[c] for c in ("pid", "tid", "ts", "dur", "cat", "name")
        )
        for i in range(len(ts_c)):
            pid, tid, ts = pid_c[i], tid_c[i], ts_c[i]
            end = _nest(sweep, pid, tid, ts, dur_c[i], ends)
            lines.append(
                dumps(
                    {
                        "ph": "X",
                        "pid": pid,
                        "tid": tid,
                        "ts": ts,
                        "dur": end - ts,
                        "cat": cat_c[i] or "",
                        "name": name_c[i] or "",
                        "args": dict(_args(chunk, i)),
                    }
                )
            )
        ends.clear()
        stats.slices += len(lines)
        emit(lines)
    stats.clipped = sweep.clipped

    # The JSON importer names a counter track "<name> <arg key>": split the track names so.
    for (track, key), table in (
        (("read bandwidth", "(MB/s)"), _bandwidth(events)),
        (("reads", "in flight"), _in_flight(events)),
    ):
        for part in table.iter_slices(CHUNK_ROWS):
            emit(
                [
                    dumps(
                        {
                            "ph": "C",
                            "pid": _COUNTER_PID,
                            "tid": _COUNTER_PID,
                            "name": track,
                            "ts": t,
                            "args": {key: v},
                        }
                    )
                    for t, v in part.iter_rows()
                ]
            )
            stats.counter_points += part.height

    if flow_table is not None and not flow_table.is_empty():
        lines = []
        for n, (sp, st, sts, dp, dt, dts) in enumerate(flow_table.iter_rows(), start=1):
            lines.append(
                dumps(
                    {
                        "ph": "s",
                        "id": n,
                        "pid": sp,
                        "tid": st,
                        "ts": sts,
                        "cat": "handover",
                        "name": "batch",
                    }
                )
            )
            lines.append(
                dumps(
                    {
                        "ph": "f",
                        "bp": "e",
                        "id": n,
                        "pid": dp,
                        "tid": dt,
                        "ts": dts,
                        "cat": "handover",
                        "name": "batch",
                    }
                )
            )
        stats.flows = flow_table.height
        emit(lines)
    fh.write("\n]}\n")


# =======================================================================================
# Native protobuf (TrackEvent)


def _write_proto(
    fh: IO[bytes],
    events: pl.DataFrame,
    layout: _Layout,
    stats: ExportStats,
    flow_table: pl.DataFrame | None,
) -> None:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
        CounterDescriptor,
        Trace,
        TrackEvent,
    )
    from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

    seq = 1
    cleared = 1  # TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    needs = 2  # TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    builder = StreamingTraceProtoBuilder(fh)

    # Track descriptors: processes, threads, counters (uuids are small positive ints).
    uuid: dict[tuple[int, int], int] = {}
    next_uuid = 1
    for pid, name in layout.process_names.items():
        p = builder.create_packet()
        p.trusted_packet_sequence_id = seq
        if next_uuid == 1:
            p.first_packet_on_sequence = True
            p.sequence_flags = cleared
        p.track_descriptor.uuid = next_uuid
        p.track_descriptor.process.pid = pid
        p.track_descriptor.process.process_name = name
        builder.write_packet(p)
        uuid[(pid, -1)] = next_uuid
        next_uuid += 1
    for (pid, tid), name in layout.thread_names.items():
        p = builder.create_packet()
        p.trusted_packet_sequence_id = seq
        p.track_descriptor.uuid = next_uuid
        p.track_descriptor.parent_uuid = uuid[(pid, -1)]
        p.track_descriptor.thread.pid = pid
        p.track_descriptor.thread.tid = tid
        p.track_descriptor.thread.thread_name = name
        builder.write_packet(p)
        uuid[(pid, tid)] = next_uuid
        next_uuid += 1
    counter_uuid: dict[str, int] = {}
    for track, unit in (("read bandwidth (MB/s)", "MB/s"), ("reads in flight", "reads")):
        p = builder.create_packet()
        p.trusted_packet_sequence_id = seq
        p.track_descriptor.uuid = next_uuid
        p.track_descriptor.name = track
        p.track_descriptor.counter.unit = CounterDescriptor.UNIT_COUNT
        p.track_descriptor.counter.unit_name = unit
        builder.write_packet(p)
        counter_uuid[track] = next_uuid
        next_uuid += 1

    # Interning tables (per sequence; new entries ride on the packet that first uses them).
    interned: dict[str, dict[str, int]] = {"name": {}, "cat": {}, "arg": {}, "str": {}}

    def iid(kind: str, value: str, packet: Any) -> int:
        table = interned[kind]
        got = table.get(value)
        if got is not None:
            return got
        got = len(table) + 1
        table[value] = got
        idata = packet.interned_data
        entry = {
            "name": idata.event_names,
            "cat": idata.event_categories,
            "arg": idata.debug_annotation_names,
            "str": idata.debug_annotation_string_values,
        }[kind].add()
        entry.iid = got
        if kind == "str":
            entry.str = value.encode("utf-8", "surrogateescape")
        else:
            entry.name = value
        return got

    # Flow ids keyed by the (pid, tid, ts) of the slices that carry them.
    flow_out: dict[tuple[int, int, int], list[int]] = {}
    flow_in: dict[tuple[int, int, int], list[int]] = {}
    if flow_table is not None:
        for n, (sp, st, sts, dp, dt, dts) in enumerate(flow_table.iter_rows(), start=1):
            flow_out.setdefault((sp, st, sts), []).append(n)
            flow_in.setdefault((dp, dt, dts), []).append(n)
        stats.flows = flow_table.height

    begin_t, end_t, counter_t = (
        TrackEvent.TYPE_SLICE_BEGIN,
        TrackEvent.TYPE_SLICE_END,
        TrackEvent.TYPE_COUNTER,
    )
    sweep = _Sweep()
    ends: list[tuple[int, int, int]] = []

    def write_ends(trace: Any) -> None:
        for end_ts, epid, etid in ends:
            q = trace.packet.add()
            q.timestamp = end_ts * 1000
            q.trusted_packet_sequence_id = seq
            q.sequence_flags = needs
            q.track_event.type = end_t
            q.track_event.track_uuid = uuid[(epid, etid)]
        ends.clear()

    for chunk in _chunks(_sorted_for_nesting(events)):
        trace = Trace()
        pid_c, tid_c, ts_c, dur_c, cat_c, name_c = (
            chunk[c] for c in ("pid", "tid", "ts", "dur", "cat", "name")
        )
        for i in range(len(ts_c)):
            pid, tid, ts = pid_c[i], tid_c[i], ts_c[i]
            _nest(sweep, pid, tid, ts, dur_c[i], ends)
            if ends:
                write_ends(trace)
            p = trace.packet.add()
            p.timestamp = ts * 1000
            p.trusted_packet_sequence_id = seq
            p.sequence_flags = needs
            te = p.track_event
            te.type = begin_t
            te.track_uuid = uuid[(pid, tid)]
            te.name_iid = iid("name", name_c[i] or "", p)
            te.category_iids.append(iid("cat", cat_c[i] or "", p))
            for key, value in _args(chunk, i):
                a = te.debug_annotations.add()
                a.name_iid = iid("arg", key, p)
                if isinstance(value, str):
                    a.string_value_iid = iid("str", value, p)
                else:
                    a.int_value = value
            if flow_out or flow_in:
                k = (pid, tid, ts)
                if k in flow_out:
                    te.flow_ids.extend(flow_out[k])
                if k in flow_in:
                    te.terminating_flow_ids.extend(flow_in[k])
        stats.slices += len(ts_c)
        fh.write(trace.SerializeToString())
    _close_all(sweep, ends)
    if ends:
        trace = Trace()
        write_ends(trace)
        fh.write(trace.SerializeToString())
    stats.clipped = sweep.clipped

    for track, table in (
        ("read bandwidth (MB/s)", _bandwidth(events)),
        ("reads in flight", _in_flight(events)),
    ):
        for part in table.iter_slices(CHUNK_ROWS):
            trace = Trace()
            for t, v in part.iter_rows():
                q = trace.packet.add()
                q.timestamp = t * 1000
                q.trusted_packet_sequence_id = seq
                q.sequence_flags = needs
                q.track_event.type = counter_t
                q.track_event.track_uuid = counter_uuid[track]
                q.track_event.double_counter_value = v
            stats.counter_points += part.height
            fh.write(trace.SerializeToString())


# Re-exported helpers that live in sibling modules (trace processor, viewer).
from .perfetto_tp import (  # noqa: E402
    NAMED_QUERIES,
    QueryError,
    Timeline,
    TraceProcessorUnavailable,
    open_timeline,
    query,
)
