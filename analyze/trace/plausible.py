"""Implausible values: what no run can have produced, found over the whole event table once
the files are parsed and merged (:func:`check_values`, called by :func:`~.load.load_trace`).

A value that cannot be true is never summed as a fact. Each check is a few polars
expressions over the table (no loop over events); what it finds is said per file in the
file's report (:attr:`~.shapes.FileReport.problems`), so the plain output, ``--json`` and
``distill`` name it:

* **set aside** (the row leaves the table, counted): a negative timestamp; a timestamp
  outside the capture (the manifest's start and end, with :data:`WINDOW_SLACK_US`), or,
  without a manifest, a file whose events lie hours from the rest of the run (another run's
  file, a file in another time unit); a timestamp outside its own process's lifetime (its
  ``start`` and ``end`` records); a name that is a number (no call is named so); an exact
  repeat of an earlier event (same process, thread, time, call, duration and result: a gzip
  member appended twice, a recompressed copy of a file);
* **read as null** (the row stays, the value does not count): a negative duration, a
  duration that ends after the capture, a read or write without a byte count (``ret``
  missing, null, ``true`` or not a number);
* **named**: events without a category (``cat`` null): their bytes count by their name.

Both parsers give the same table, so the checks give the same reports whichever parsed it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

import numpy as np
import polars as pl

from dlreplay.schema import READ_OPS, WRITE_OPS

from .shapes import READ_AS_NULL, SET_ASIDE, FileReport, LoadedTrace

__all__ = ["WINDOW_SLACK_US", "capture_window", "check_values"]

#: Seconds (in µs) an event may lie outside the capture's start and end as the manifest
#: records them (the clocks of other nodes of a multi-node job may differ a little).
WINDOW_SLACK_US = 300_000_000

#: Seconds (in µs) an event may lie outside its process's ``start`` and ``end`` records.
LIFE_SLACK_US = 1_000_000

#: Without a manifest: files whose events lie further than this from the rest of the run are
#: another run's (or in another unit).
RUN_GAP_US = 3600 * 1_000_000

NEG_TS = f"a negative timestamp {SET_ASIDE}"
OUTSIDE_LIFE = f"a timestamp outside its process's lifetime (its start and end records) {SET_ASIDE}"
FAR_FROM_RUN = (
    "a timestamp hours away from the rest of the run (another run's file, or a time in another "
    f"unit; no manifest.json to tell the capture's start and end) {SET_ASIDE}"
)
NUMBER_NAME = f"a number for a name (no call is named so) {SET_ASIDE}"
REPEAT = (
    "the same process, thread, time, call, duration and result as an earlier event "
    f"(the same events twice: a copied file or gzip member) {SET_ASIDE}"
)
NEG_DUR = f"a negative duration {READ_AS_NULL}"
LATE_DUR = f"a duration ending after the capture ended {READ_AS_NULL}"
NO_RET = f"a read or write without a byte count (ret missing, null or not a number) {READ_AS_NULL}"
NO_CAT = f"no category (cat missing or null; counted by the call's name) {READ_AS_NULL}"

_TRANSFERS = list(READ_OPS + WRITE_OPS)


def check_values(loaded: LoadedTrace) -> LoadedTrace:
    """``loaded`` with the implausible values of its table set aside or read as null and
    each file's report saying what and why (see the module); the same object when all
    values are plausible."""
    ev = loaded.events
    if ev.height == 0:
        return loaded
    window = capture_window(loaded.manifest)
    notes: dict[str, list[str]] = {}
    aside = _aside_mask(ev, window, notes)
    if aside is not None:
        ev = ev.filter(~aside)
    ev = _null_durations(ev, window, notes)
    _count(ev, _no_ret(), NO_RET, notes)
    _count(ev, pl.col("cat").is_null(), NO_CAT, notes)
    if not notes:
        return loaded
    files = [_noted(f, notes.get(f.name, []), ev) for f in loaded.files]
    return dataclasses.replace(
        loaded,
        events=ev,
        files=files,
        per_process=None if aside is not None else loaded.per_process,
    )


def capture_window(manifest: dict | None) -> tuple[int, int] | None:
    """(start, end) of the capture in µs from its manifest, None when it does not say."""
    if not isinstance(manifest, dict):
        return None
    start, end = manifest.get("start_time_us"), manifest.get("end_time_us")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (start, end))
    return (int(start), int(end)) if ok and start <= end else None  # type: ignore[arg-type,operator]


def _when(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _aside_mask(
    ev: pl.DataFrame, window: tuple[int, int] | None, notes: dict[str, list[str]]
) -> pl.Series | None:
    """The rows to set aside (None: none), their counts per file and reason in ``notes``.
    The first reason that holds names a row."""
    ts = pl.col("ts")
    checks: list[tuple[pl.Expr, str]] = [(ts < 0, NEG_TS)]
    if window is not None:
        lo, hi = window[0] - WINDOW_SLACK_US, window[1] + WINDOW_SLACK_US
        what = (
            f"a timestamp outside the capture ({_when(window[0])} to {_when(window[1])}, "
            f"manifest.json: another run's event, or a time in another unit) {SET_ASIDE}"
        )
        checks.append((~ts.is_between(lo, hi), what))
    else:
        far = _far_files(ev, ts >= 0)
        if far:
            checks.append((pl.col("source").cast(pl.String).is_in(list(far)), FAR_FROM_RUN))
    life = _outside_life(ev)
    if life is not None:
        checks.append((life, OUTSIDE_LIFE))
    numbers = _number_names(ev)
    if numbers:
        checks.append((pl.col("name").is_in(numbers), NUMBER_NAME))
    reason = pl.lit(0, dtype=pl.Int8)
    for k, (cond, _) in reversed(list(enumerate(checks, 1))):
        reason = pl.when(cond.fill_null(False)).then(pl.lit(k, dtype=pl.Int8)).otherwise(reason)
    code = ev.select(reason.alias("__why")).to_series()
    repeat = _repeats(ev, code == 0)
    if repeat is not None:
        k = len(checks) + 1
        code = pl.select(pl.when(repeat).then(pl.lit(k, dtype=pl.Int8)).otherwise(code)).to_series()
        checks.append((pl.lit(False), REPEAT))
    if not (code > 0).any():
        return None
    counted = (
        ev.select("source", code.alias("__why"))
        .filter(pl.col("__why") > 0)
        .group_by("source", "__why")
        .len()
        .sort("__why")
    )
    for source, why, n in counted.iter_rows():
        notes.setdefault(str(source), []).append(f"{n} event(s) with {checks[why - 1][1]}")
    return code > 0


def _far_files(ev: pl.DataFrame, ok: pl.Expr) -> dict[str, tuple[int, int]]:
    """Without a manifest: the files (``source``) whose events lie more than
    :data:`RUN_GAP_US` from the group of files holding most events: (first, last) µs."""
    spans = (
        ev.filter(ok)
        .group_by("source")
        .agg(pl.col("ts").min().alias("lo"), pl.col("ts").max().alias("hi"), pl.len().alias("n"))
        .sort("lo")
    )
    if spans.height < 2:
        return {}
    lo, hi, n = (spans[c].to_numpy() for c in ("lo", "hi", "n"))
    reach = np.maximum.accumulate(hi)
    group = np.concatenate([[0], np.cumsum(lo[1:] > reach[:-1] + RUN_GAP_US)])
    if group[-1] == 0:
        return {}
    main = int(np.argmax(np.bincount(group, weights=n)))
    names = spans["source"].cast(pl.String).to_list()
    return {names[i]: (int(lo[i]), int(hi[i])) for i in np.flatnonzero(group != main).tolist()}


def _outside_life(ev: pl.DataFrame) -> pl.Expr | None:
    """Rows whose ``ts`` lies outside their process's ``start`` and ``end`` records (of its own
    trace file), None when no process has such records or every row lies within them."""
    marks = pl.col("name").cast(pl.String)
    life = (
        ev.filter((pl.col("cat") == "dftracer") & marks.is_in(["start", "end"]))
        .group_by("source", "pid")
        .agg(
            pl.col("ts").filter(marks == "start").min().alias("__born"),
            pl.col("ts").filter(marks == "end").max().alias("__gone"),
        )
    )
    if life.is_empty():
        return None
    seen = (
        ev.group_by("source", "pid")
        .agg(pl.col("ts").min().alias("__lo"), pl.col("ts").max().alias("__hi"))
        .join(life, on=["source", "pid"], how="inner")
        .filter(
            (pl.col("__lo") < pl.col("__born") - LIFE_SLACK_US)
            | (pl.col("__hi") > pl.col("__gone") + LIFE_SLACK_US)
        )
    )
    if seen.is_empty():
        return None
    keyed = ev.select("source", "pid").join(
        seen.select("source", "pid", "__born", "__gone"),
        on=["source", "pid"],
        how="left",
        maintain_order="left",
    )
    out = (pl.col("ts") < keyed["__born"] - LIFE_SLACK_US) | (
        pl.col("ts") > keyed["__gone"] + LIFE_SLACK_US
    )
    return out


def _number_names(ev: pl.DataFrame) -> list[str]:
    """The event names that are numbers (a ``name`` written as a JSON number)."""
    names = ev.select(pl.col("name").unique().cast(pl.String)).to_series().drop_nulls()
    return names.filter(names.str.contains(r"^[-+]?[0-9][0-9.eE+-]*$")).to_list()


#: The columns that make two events the same event (with ``ts``).
#: (Not ``offset``: the loader's position model runs on through a repeated block, so the
#: repeats of reads and seeks get other offsets than the events they repeat.)
_SAME = ("pid", "tid", "dur", "cat", "name", "fhash", "size_requested", "size", "ret")


def _repeats(ev: pl.DataFrame, open_rows: pl.Series) -> pl.Series | None:
    """Rows (among ``open_rows``) that repeat an earlier row exactly (:data:`_SAME` and
    ``ts``); None when none does. The table is in time order, so a repeat has the
    timestamp of the row before it or after it: only such rows are compared."""
    ts = pl.col("ts")
    near = ev.select(
        ((ts == ts.shift(1)) | (ts == ts.shift(-1))).fill_null(False) & open_rows
    ).to_series()
    if not near.any():
        return None
    idx = near.arg_true()
    sub = ev.select("ts", *_SAME)[idx]
    again = ~sub.select(pl.struct(pl.all()).is_first_distinct()).to_series()
    if not again.any():
        return None
    out = np.zeros(ev.height, dtype=bool)
    out[idx.filter(again).to_numpy()] = True
    return pl.Series(out)


def _null_durations(
    ev: pl.DataFrame, window: tuple[int, int] | None, notes: dict[str, list[str]]
) -> pl.DataFrame:
    """``ev`` with negative durations, and those ending after the capture, read as null."""
    dur = pl.col("dur")
    neg = dur < 0
    late = (
        (pl.col("ts") + dur > window[1] + WINDOW_SLACK_US) if window is not None else pl.lit(False)
    )
    found = ev.select(neg.any().alias("neg"), late.any().alias("late")).row(0)
    if not any(found):
        return ev
    _count(ev, neg, NEG_DUR, notes)
    _count(ev, late & ~neg, LATE_DUR, notes)
    return ev.with_columns(pl.when(neg | late).then(None).otherwise(dur).alias("dur"))


def _no_ret() -> pl.Expr:
    return (
        pl.col("ret").is_null()
        & pl.col("name").cast(pl.String).is_in(_TRANSFERS)
        & (pl.col("cat").is_in(["POSIX", "STDIO"]) | pl.col("cat").is_null())
    )


def _count(ev: pl.DataFrame, cond: pl.Expr, what: str, notes: dict[str, list[str]]) -> None:
    """Add "N event(s) with ``what``" to ``notes`` for each file holding rows where ``cond``."""
    counted = ev.filter(cond.fill_null(False)).group_by("source").len().sort("source")
    for source, n in counted.iter_rows():
        notes.setdefault(str(source), []).append(f"{n} event(s) with {what}")


def _noted(rep: FileReport, notes: Sequence[str], ev: pl.DataFrame) -> FileReport:
    """``rep`` with ``notes`` among its problems and its events counted again where some
    were set aside."""
    if not notes:
        return rep
    aside = sum(int(n.split(" ", 1)[0]) for n in notes if n.endswith(SET_ASIDE))
    problems = [*rep.problems, *notes]
    if aside and aside >= rep.events:
        problems.append("every event of this file set aside")
    return dataclasses.replace(rep, events=max(rep.events - aside, 0), problems=problems)
