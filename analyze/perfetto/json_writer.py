"""The Chrome JSON timeline (``.json``/``.json.gz``): one JSON object per line inside
``traceEvents``, written in chunks of :data:`~.slices.CHUNK_ROWS` events. Times are
microseconds, as in the event table."""

from __future__ import annotations

import json
from typing import IO, Any

import polars as pl

from .counters import bandwidth, in_flight
from .slices import CHUNK_ROWS, Sweep, event_chunks, nest, slice_args, sorted_for_nesting
from .stats import ExportStats
from .tracks import Layout

__all__ = ["COUNTER_PID", "write_json"]

#: The JSON format needs a process for counters: pid 0, "I/O counters".
COUNTER_PID = 0

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class _Lines:
    """The ``traceEvents`` array: lists of encoded events, comma-separated across calls."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self.first = True

    def emit(self, lines: list[str]) -> None:
        if not lines:
            return
        if not self.first:
            self.fh.write(",\n")
        self.fh.write(",\n".join(lines))
        self.first = False


def write_json(
    fh: IO[str],
    events: pl.DataFrame,
    layout: Layout,
    stats: ExportStats,
    flow_table: pl.DataFrame | None,
) -> None:
    """Write the timeline to ``fh``: track names, slices, counters, then flows."""
    fh.write('{"displayTimeUnit":"ms","traceEvents":[\n')
    out = _Lines(fh)
    out.emit(_metadata(layout))
    _write_slices(out, events, stats)
    _write_counters(out, events, stats)
    if flow_table is not None and not flow_table.is_empty():
        out.emit(_flow_events(flow_table))
        stats.flows = flow_table.height
    fh.write("\n]}\n")


def _meta(pid: int, tid: int, name: str, args: dict[str, Any]) -> str:
    return _dumps({"ph": "M", "pid": pid, "tid": tid, "name": name, "args": args})


def _metadata(layout: Layout) -> list[str]:
    """Process names and sort order, thread names, and the counters' process."""
    meta: list[str] = []
    for pid, name in layout.process_names.items():
        meta.append(_meta(pid, pid, "process_name", {"name": name}))
        meta.append(
            _meta(pid, pid, "process_sort_index", {"sort_index": layout.process_order[pid]})
        )
    for (pid, tid), name in layout.thread_names.items():
        meta.append(_meta(pid, tid, "thread_name", {"name": name}))
    meta.append(_meta(COUNTER_PID, COUNTER_PID, "process_name", {"name": "I/O counters"}))
    return meta


def _write_slices(out: _Lines, events: pl.DataFrame, stats: ExportStats) -> None:
    """Every event as a complete (``X``) slice, clipped to nest in its parent."""
    sweep = Sweep()
    ends: list[tuple[int, int, int]] = []
    for chunk in event_chunks(sorted_for_nesting(events)):
        lines = []
        pid_c, tid_c, ts_c, dur_c, cat_c, name_c = (
            chunk[c] for c in ("pid", "tid", "ts", "dur", "cat", "name")
        )
        for i in range(len(ts_c)):
            pid, tid, ts = pid_c[i], tid_c[i], ts_c[i]
            end = nest(sweep, pid, tid, ts, dur_c[i], ends)
            lines.append(
                _dumps(
                    {
                        "ph": "X",
                        "pid": pid,
                        "tid": tid,
                        "ts": ts,
                        "dur": end - ts,
                        "cat": cat_c[i] or "",
                        "name": name_c[i] or "",
                        "args": dict(slice_args(chunk, i)),
                    }
                )
            )
        ends.clear()
        stats.slices += len(lines)
        out.emit(lines)
    stats.clipped = sweep.clipped


def _write_counters(out: _Lines, events: pl.DataFrame, stats: ExportStats) -> None:
    # The JSON importer names a counter track "<name> <arg key>": split the track names so.
    for (track, key), table in (
        (("read bandwidth", "(MB/s)"), bandwidth(events)),
        (("reads", "in flight"), in_flight(events)),
    ):
        for part in table.iter_slices(CHUNK_ROWS):
            out.emit(
                [
                    _dumps(
                        {
                            "ph": "C",
                            "pid": COUNTER_PID,
                            "tid": COUNTER_PID,
                            "name": track,
                            "ts": t,
                            "args": {key: v},
                        }
                    )
                    for t, v in part.iter_rows()
                ]
            )
            stats.counter_points += part.height


def _flow_events(flow_table: pl.DataFrame) -> list[str]:
    """A start (``s``) and an end (``f``, bound to the enclosing slice) per hand-over."""
    lines = []
    for n, (sp, st, sts, dp, dt, dts) in enumerate(flow_table.iter_rows(), start=1):
        lines.append(
            _dumps(
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
            _dumps(
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
    return lines
