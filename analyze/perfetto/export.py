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

The pieces: :mod:`.tracks` (process and thread tracks), :mod:`.slices` (nesting order and
args), :mod:`.counters`, :mod:`.flows`, and the two writers :mod:`.json_writer` and
:mod:`.proto_writer`; this module picks the format and writes the file atomically.
"""

from __future__ import annotations

import gzip
import io
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

from dlreplay.errors import DlreplayError

from ..trace import vocabulary as voc
from .flows import flows as flow_arrows
from .json_writer import write_json
from .slices import ARG_COLUMNS, CHUNK_ROWS
from .stats import MAX_TS_US, ExportStats
from .tracks import Layout
from .tracks import layout as track_layout

__all__ = ["CHUNK_ROWS", "ExportError", "ExportStats", "export_trace", "format_for"]

PROTO_SUFFIXES = (".perfetto-trace", ".pftrace")
JSON_SUFFIXES = (".json", ".json.gz")


class ExportError(DlreplayError):
    """The timeline cannot be written (unknown format, empty table, unwritable output)."""


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
    events, dropped, repaired = _prepared(events)
    layout = track_layout(events, manifest)
    stats = ExportStats(path=out, format=fmt, process_names=dict(layout.process_names))
    stats.dropped, stats.repaired = dropped, repaired
    stats.processes = len(layout.process_names)
    stats.threads = len(layout.thread_names)
    flow_table = flow_arrows(events, layout) if flows else None
    _write(out, fmt, events, layout, stats, flow_table)
    stats.bytes_written = out.stat().st_size
    stats.seconds = time.perf_counter() - t0
    return stats


def _prepared(events: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
    """The rows to write, every column the writers read present; raises :class:`ExportError`
    when there is nothing to write."""
    if events.is_empty():
        raise ExportError("the trace has no events: nothing to export")
    missing = {"pid", "tid", "ts", "dur", "cat", "name"} - set(events.columns)
    if missing:
        raise ExportError(f"the event table lacks column(s) {sorted(missing)}")
    events = voc.ensure_roles(events)
    for c in ARG_COLUMNS + ("ppid", "host"):
        if c not in events.columns:
            events = events.with_columns(pl.lit(None).alias(c))
    events, dropped, repaired = _usable(events)
    if events.is_empty():
        raise ExportError(
            f"none of the {dropped} event(s) has a pid, tid and a timestamp in 0..{MAX_TS_US} µs: "
            "nothing to export"
        )
    return events, dropped, repaired


def _write(
    out: Path,
    fmt: str,
    events: pl.DataFrame,
    layout: Layout,
    stats: ExportStats,
    flow_table: pl.DataFrame | None,
) -> None:
    """Write through a new temporary file beside *out* (never a file of the user's, such as an
    ``<out>.part``), renamed to ``out`` once complete."""
    tmp: Path | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
        tmp = Path(name)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # the usual mode, not mkstemp's 0600
        if fmt == "perfetto":
            from .proto_writer import write_proto  # the protobuf classes load only when needed

            with open(fd, "wb") as fh:
                write_proto(fh, events, layout, stats, flow_table)
        else:
            gz = out.name.lower().endswith(".gz")
            with open(fd, "wb") as raw, gzip.open(raw, "wb") if gz else raw as stream:
                with io.TextIOWrapper(stream, encoding="utf-8", write_through=False) as fh:
                    write_json(fh, events, layout, stats, flow_table)
        os.replace(tmp, out)
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)  # never leave a partial timeline (a full disk)
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from exc


def _usable(events: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
    """Rows a timeline can hold, and (rows dropped, durations repaired).

    Dropped: no pid, tid or timestamp, or a timestamp outside 0..MAX_TS_US. Repaired: a
    negative duration becomes 0, one ending after MAX_TS_US ends there.
    """
    ts, dur = pl.col("ts"), pl.col("dur")
    ok = (
        pl.col("pid").is_not_null() & pl.col("tid").is_not_null() & ts.is_between(0, MAX_TS_US)
    ).fill_null(False)
    kept = events.filter(ok)
    bad_dur = ((dur < 0) | (dur > MAX_TS_US - ts)).fill_null(False)
    repaired = int(kept.select(bad_dur.sum()).item())
    if repaired:
        kept = kept.with_columns(
            pl.when(dur < 0)
            .then(0)
            .when(dur > MAX_TS_US - ts)
            .then(MAX_TS_US - ts)
            .otherwise(dur)
            .alias("dur")
        )
    return kept, events.height - kept.height, repaired
