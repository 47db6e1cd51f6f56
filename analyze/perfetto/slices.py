"""The timeline's slices: events in nesting order, read in chunks, with the stack sweep that
keeps every slice inside its parent, and the args each slice carries.

Both writers walk the events per thread by start time (outer first at equal starts) and
call :func:`nest` for each: a slice that would end after its parent is clipped to the
parent's end (counted in :attr:`Sweep.clipped`), so nesting is always valid. Times are
microseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import polars as pl

__all__ = [
    "ARG_COLUMNS",
    "CHUNK_ROWS",
    "Sweep",
    "close_all",
    "event_chunks",
    "nest",
    "slice_args",
    "sorted_for_nesting",
]

#: Event rows converted to Python objects at a time while writing.
CHUNK_ROWS = 50_000

# Tie-break when two events of one thread start at the same microsecond: the outer one first.
_CAT_RANK = {"pipeline": 0, "compute": 1, "dataloader": 1, "checkpoint": 2, "data": 3}
#: Event columns written as slice args (when not null).
ARG_COLUMNS = (
    "file",
    "size",
    "offset",
    "size_requested",
    "ret",
    "epoch",
    "step",
    "batch_size",
    "sample_index",
    "role",  # the event's meaning in dlreplay's vocabulary (analyze/trace/vocabulary.py)
)
_ARG_NAMES = {"size": "bytes"}


@dataclass
class Sweep:
    """Per-thread stack state carried across chunks (times in microseconds)."""

    key: tuple[int, int] | None = None
    stack: list[int] = field(default_factory=list)  # open slices' end times, innermost last
    clipped: int = 0


def sorted_for_nesting(events: pl.DataFrame) -> pl.DataFrame:
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


def nest(
    sweep: Sweep, pid: int, tid: int, ts: int, dur: int, ends: list[tuple[int, int, int]]
) -> int:
    """Close slices ending by ``ts``; clip this slice into its parent; return its end (µs).

    Appends ``(end_ts, pid, tid)`` for every closed slice to ``ends`` (in closing order).
    """
    key = (pid, tid)
    if key != sweep.key:
        close_all(sweep, ends)
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


def close_all(sweep: Sweep, ends: list[tuple[int, int, int]]) -> None:
    """Close every slice still open on the sweep's thread (appended to ``ends``)."""
    if sweep.key is None:
        return
    pid, tid = sweep.key
    while sweep.stack:
        ends.append((sweep.stack.pop(), pid, tid))


def event_chunks(frame: pl.DataFrame) -> Iterator[dict[str, list[Any]]]:
    """Column lists of ``frame`` in slices of :data:`CHUNK_ROWS` rows."""
    cols = ["pid", "tid", "ts", "dur", "cat", "name", *ARG_COLUMNS]
    for part in frame.select(cols).iter_slices(CHUNK_ROWS):
        yield {c: part.get_column(c).to_list() for c in cols}


def slice_args(chunk: dict[str, list[Any]], i: int) -> list[tuple[str, Any]]:
    """The args of row ``i`` of ``chunk``: its operation, then every non-null arg column."""
    out: list[tuple[str, Any]] = [("operation", chunk["name"][i])]
    for c in ARG_COLUMNS:
        v = chunk[c][i]
        if v is not None:
            out.append((_ARG_NAMES.get(c, c), v))
    return out
