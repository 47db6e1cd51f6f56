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

One more pass is not a check but runs here for the same reason (the whole table, every
loading path): the array reads and writes numpy makes through a duplicated descriptor,
which DFTracer does not see, are added from their seek trails and named per file
(:mod:`.hidden`).

Both parsers give the same table, so the checks give the same reports whichever parsed it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

import numpy as np
import polars as pl

from dlreplay.schema import READ_OPS, WRITE_OPS

from .hidden import RECOVERED, recover_hidden
from .shapes import READ_AS_NULL, SET_ASIDE, FileReport, LoadedTrace, int_stat

__all__ = [
    "WINDOW_SLACK_US",
    "capture_window",
    "check_table",
    "check_values",
    "copied_files",
    "file_spans",
    "noted_reports",
    "set_aside_copies",
]

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
    if loaded.events.height == 0:
        return loaded
    ev, notes, aside = check_table(loaded.events, loaded.manifest)
    if not notes:
        return loaded
    files = noted_reports(loaded.files, notes)
    # the loader's per-process counts included the rows set aside (and not the rows added):
    # counted again from the table where it is used (TraceView.per_process, summarize), as
    # after a changed role
    per_process = None if aside else loaded.per_process
    return dataclasses.replace(loaded, events=ev, files=files, per_process=per_process)


def check_table(
    ev: pl.DataFrame, manifest: dict | None, spans: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, dict[str, list[str]], bool]:
    """:func:`check_values` of an event table (or of the files wholly in it): (the table with
    the implausible values set aside or read as null and numpy's unseen transfers added
    (:func:`~.hidden.recover_hidden`), each file's notes by name, whether rows were set aside
    or added). ``spans``: :func:`file_spans` of the whole run where ``ev`` holds only
    some of its files (a spilled part), to find the files far from the rest of the run."""
    window = capture_window(manifest)
    notes: dict[str, list[str]] = {}
    aside = _aside_mask(ev, window, notes, spans) if ev.height else None
    if aside is not None:
        ev = ev.filter(~aside)
    ev = _null_durations(ev, window, notes)
    _count(ev, _no_ret(), NO_RET, notes)
    _count(ev, pl.col("cat").is_null(), NO_CAT, notes)
    before = ev.height
    ev, recovered = recover_hidden(ev)
    for name, said in recovered.items():
        notes.setdefault(name, []).extend(said)
    return ev, notes, aside is not None or ev.height != before


def noted_reports(files: Sequence[FileReport], notes: dict[str, list[str]]) -> list[FileReport]:
    """``files`` with :func:`check_table`'s ``notes`` among their problems, their events counted
    again where some were set aside."""
    return [_noted(f, notes.get(f.name, [])) for f in files]


def file_spans(ev: pl.DataFrame, signed: bool = False) -> pl.DataFrame:
    """Per file (``source``): the first and last timestamp (µs) of its events with a
    non-negative one (``lo``, ``hi``) and their number (``n``); with ``signed``, ``sig``: a
    sum of its rows' hashes (process, thread, time, call, duration, result), the same for a
    file holding the same events (:func:`copied_files`)."""
    row = pl.struct("ts", "pid", "tid", "dur", pl.col("name").cast(pl.String), pl.col("ret")).hash()
    return (
        ev.select("source", "ts", *((row.alias("__h"),) if signed else ()))
        .filter(pl.col("ts") >= 0)
        .group_by("source")
        .agg(
            pl.col("ts").min().alias("lo"),
            pl.col("ts").max().alias("hi"),
            pl.len().alias("n"),
            *((pl.col("__h").sum().alias("sig"),) if signed else ()),
        )
    )


def copied_files(spans: pl.DataFrame, order: Sequence[str]) -> dict[str, int]:
    """The files of signed ``spans`` holding the same events as a file before them in
    ``order`` (the trace's files): their events by name (a whole copy of a file)."""
    rank = {name: k for k, name in enumerate(order)}
    out: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    rows = sorted(spans.select("source", "sig", "n").iter_rows(), key=lambda r: rank.get(r[0], 0))
    for source, sig, n in rows:
        if (sig, n) in seen:
            out[source] = n
        seen.add((sig, n))
    return out


def set_aside_copies(
    ev: pl.DataFrame, copies: dict[str, int], notes: dict[str, list[str]]
) -> pl.DataFrame:
    """``ev`` without the rows of the files in ``copies`` (:func:`copied_files`) it still
    holds, each counted in ``notes`` as a repeat."""
    held = [s for s in copies if s in set(ev["source"].cast(pl.String).unique().to_list())]
    if not held:
        return ev
    gone = pl.col("source").cast(pl.String).is_in(held)
    _count(ev, gone, REPEAT, notes)
    return ev.filter(~gone)


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
    ev: pl.DataFrame,
    window: tuple[int, int] | None,
    notes: dict[str, list[str]],
    spans: pl.DataFrame | None = None,
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
        far = _far_files(file_spans(ev) if spans is None else spans)
        if far:
            checks.append((pl.col("source").cast(pl.String).is_in(list(far)), FAR_FROM_RUN))
    life = _outside_life(ev)
    if life is not None:
        checks.append((life, OUTSIDE_LIFE))
    numbers = _number_names(ev)
    if numbers:
        checks.append((pl.col("name").is_in(numbers), NUMBER_NAME))
    held = ev.select(pl.any_horizontal(c.fill_null(False) for c, _ in checks).any()).item()
    if held:
        reason = pl.lit(0, dtype=pl.Int8)
        for k, (cond, _) in reversed(list(enumerate(checks, 1))):
            reason = pl.when(cond.fill_null(False)).then(pl.lit(k, dtype=pl.Int8)).otherwise(reason)
        code = ev.select(reason.alias("__why")).to_series()
        repeat = _repeats(ev, code == 0)
    else:  # (the common case: one pass of comparisons, no column of reasons)
        repeat = _repeats(ev, None)
        if repeat is None:
            return None
        code = pl.Series("__why", np.zeros(ev.height, dtype=np.int8))
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


def _far_files(spans: pl.DataFrame) -> dict[str, tuple[int, int]]:
    """Without a manifest: the files (``source``) whose events lie more than
    :data:`RUN_GAP_US` from the group of files holding most events: (first, last) µs
    (``spans``: :func:`file_spans`)."""
    spans = spans.sort("lo")
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
        # (on the Categorical codes first: a cast of every row's name to text costs 5x the pass)
        ev.select("source", "pid", "ts", "cat", "name")
        .filter((pl.col("cat") == "dftracer") & pl.col("name").is_in(["start", "end"]))
        .group_by("source", "pid")
        .agg(
            pl.col("ts").filter(marks == "start").min().alias("__born"),
            pl.col("ts").filter(marks == "end").max().alias("__gone"),
        )
    )
    if life.is_empty():
        return None
    seen = (
        ev.select("source", "pid", "ts")
        .group_by("source", "pid")
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


#: Columns that do not make two events different: where the loader's position model ran on
#: through a repeated block (``offset``: the repeats of reads and seeks get other offsets than
#: the events they repeat), and which file held them (a copy of a file is another file).
_NOT_COMPARED = ("offset", "source")

#: A file's exact repeats are set aside when there are at least this many and this share of
#: its events: a block written twice. Fewer are kept, as two calls of one thread in the same
#: microsecond with the same arguments and result can be real (so a repeated block under a
#: tenth of its file is not found: the table keeps no line numbers to tell it from those).
REPEATS_AT_LEAST, REPEATS_SHARE = 8, 0.1

#: A file whose events repeat another file's is a copy when at least this share of them do
#: (a copy repeats all; a process of a reused pid may share its ``start`` record's values).
COPY_SHARE = 0.5


#: Columns hashed together to find the rows worth comparing whole (:func:`_repeats`), with
#: their odd multipliers (a repeat hashes alike; others rarely, and are then compared whole).
_MIXED = {
    "ts": 0x9E3779B97F4A7C15,
    "pid": 0xC2B2AE3D27D4EB4F,
    "tid": 0x165667B19E3779F9,
    "dur": 0xD6E8FEB86659FD93,
    "name": 0xFF51AFD7ED558CCD,
}


def _mixed(few: pl.DataFrame) -> pl.Series:
    """One UInt64 per row of ``few`` (the :data:`_MIXED` columns; Categorical by its codes)."""
    h = np.zeros(few.height, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for c, k in _MIXED.items():
            col = few[c].to_physical() if few[c].dtype == pl.Categorical else few[c]
            h ^= col.fill_null(-1).cast(pl.Int64).to_numpy().astype(np.uint64) * np.uint64(k)
    return pl.Series(h)


def _repeats(ev: pl.DataFrame, open_rows: pl.Series | None) -> pl.Series | None:
    """Rows (among ``open_rows``) that repeat an earlier row exactly (every column but
    :data:`_NOT_COMPARED`): repeats of another file's rows in a file made mostly of them (a
    copy, :data:`COPY_SHARE`), and a file's repeats of its own rows where it holds enough
    (:data:`REPEATS_AT_LEAST`); None when none is.
    The table is in time order, so a repeat has the timestamp of the row before it or
    after it: only such rows are compared."""
    t = ev["ts"]
    if t.len() < 2:
        return None
    # (numpy over the one Int64 column: a third of polars' shifted comparisons; a null ts,
    # last in the table, is filled with a value that equals nothing before it)
    tv = t.fill_null((int_stat(t.max()) or 0) + 1).to_numpy() if t.null_count() else t.to_numpy()
    same = tv[1:] == tv[:-1]
    near = np.zeros(len(tv), dtype=bool)
    near[1:] |= same
    near[:-1] |= same
    if open_rows is not None:
        near &= open_rows.to_numpy()
    idx = pl.Series(np.flatnonzero(near).astype(np.uint32, copy=False))
    if idx.is_empty():
        return None
    # a hash of a few columns first (numpy: half the time of polars' struct key), every
    # column only where those repeat (far fewer rows)
    idx = idx.filter(_mixed(ev.select(*_MIXED)[idx]).is_duplicated())
    if idx.is_empty():
        return None
    sub = ev.select(pl.exclude(_NOT_COMPARED[0]))[idx]
    again = sub.select(
        ~pl.struct(pl.exclude("source")).is_first_distinct().alias("any"),
        ~pl.struct(pl.all()).is_first_distinct().alias("own"),
    )
    if not again["any"].any():
        return None
    sizes = ev.group_by("source").len().rename({"len": "__all"})
    copied = _enough(ev, idx.filter(again["any"] & ~again["own"]), sizes, 1, COPY_SHARE)
    own = _enough(ev, idx.filter(again["own"]), sizes, REPEATS_AT_LEAST, REPEATS_SHARE)
    if copied.is_empty() and own.is_empty():
        return None
    out = np.zeros(ev.height, dtype=bool)
    out[copied.to_numpy()] = True
    out[own.to_numpy()] = True
    return pl.Series(out)


def _enough(
    ev: pl.DataFrame, rows: pl.Series, sizes: pl.DataFrame, least: int, share: float
) -> pl.Series:
    """The ``rows`` of files holding at least ``least`` of them and ``share`` of their events
    (``sizes``: events per ``source``)."""
    if rows.is_empty():
        return rows
    per_file = ev.select("source")[rows].group_by("source").len()
    many = per_file.join(sizes, on="source").filter(
        (pl.col("len") >= least) & (pl.col("len") >= share * pl.col("__all"))
    )["source"]
    return rows.filter(ev["source"].gather(rows).is_in(many.implode()))


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
        & pl.col("name").is_in(_TRANSFERS)
        & (pl.col("cat").is_in(["POSIX", "STDIO"]) | pl.col("cat").is_null())
    )


def _count(ev: pl.DataFrame, cond: pl.Expr, what: str, notes: dict[str, list[str]]) -> None:
    """Add "N event(s) with ``what``" to ``notes`` for each file holding rows where ``cond``."""
    counted = (
        ev.select("source", cond.fill_null(False).alias("__c"))
        .filter(pl.col("__c"))
        .group_by("source")
        .len()
        .sort("source")
    )
    for source, n in counted.iter_rows():
        notes.setdefault(str(source), []).append(f"{n} event(s) with {what}")


def _noted(rep: FileReport, notes: Sequence[str]) -> FileReport:
    """``rep`` with ``notes`` among its problems and its events counted again where some
    were set aside (or recovered: :mod:`.hidden`)."""
    if not notes:
        return rep
    aside = sum(int(n.split(" ", 1)[0]) for n in notes if n.endswith(SET_ASIDE))
    added = sum(int(n.split(" ", 1)[0]) for n in notes if n.endswith(RECOVERED))
    problems = [*rep.problems, *notes]
    if aside and aside >= rep.events:
        problems.append("every event of this file set aside")
    events = max(rep.events - aside, 0) + added
    return dataclasses.replace(rep, events=events, problems=problems)
