"""Direct and hybrid I/O (``reader.direct_io``, ``reader.direct_io_threshold``): whether the job's
reads of its dataset files bypassed the page cache, from the ``flags`` DFTracer records on
every ``open``/``open64``/``openat`` call (the ``open(2)`` flags as the process passed them).

The event table keeps no open flags, so the open events are read from the trace files
themselves (:func:`open_flags`, through :mod:`..trace.sidecar`: the matching lines only, each
decoded on its own). Each read of a dataset file is given the flags of the last open of the same
file (``fhash``) in the same process before it (an as-of join); its call size is the bytes it
asked for. Then:

* no read or open with ``O_DIRECT``: ``off``; every read direct: ``on``;
* direct reads all larger than the buffered ones: ``hybrid``, the threshold the smallest power
  of two above the largest buffered read (at most the smallest direct read);
* direct and buffered reads of overlapping sizes: not a size threshold; the mode of most of
  the bytes, said in a note.

DFTracer 2.2 records no ``readv``/``preadv`` call (DLIO's odirect reader and most direct-I/O
readers in Python read with them): a file opened with ``O_DIRECT`` whose reads are not in the
trace still counts by its opens (``on`` when every open of a dataset file is direct). Opens
made by C code that DFTracer's preload does not see (a library linked statically against its
own syscall wrappers) leave no flags: without any open flags of dataset files the field keeps
its default. ``O_DIRECT`` is read as Linux's generic value (x86, the value of this host's
``os.O_DIRECT`` where it has one). Bytes.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import polars as pl

from dlreplay.model import Reader

from ..trace.sidecar import fields_of, matching_lines, register
from .base import Facts, Observed

__all__ = [
    "OPEN_SCHEMA",
    "O_DIRECT",
    "classify_reads",
    "direct_io_of",
    "open_flags",
    "with_direct_io",
]

#: Linux's ``O_DIRECT`` bit (the x86 and generic value where this host has none).
O_DIRECT = getattr(os, "O_DIRECT", 0o40000)
#: Columns of :func:`open_flags`: process, start (µs), DFTracer file hash, ``open(2)`` flags.
OPEN_SCHEMA = {"pid": pl.Int64, "ts": pl.Int64, "fhash": pl.String, "flags": pl.Int64}
_LINE = register(
    re.compile(
        rb'^\{[^\n]*"name":"(?:open|open64|openat|openat64)","cat":"POSIX"[^\n]*"flags":[^\n]*$',
        re.M,
    ),
    *(b'"name":"%s","cat":"POSIX"' % n for n in (b"open", b"open64", b"openat", b"openat64")),
)
_FIELDS = {"pid": "$.pid", "ts": "$.ts", "fhash": "$.args.fhash", "flags": "$.args.flags"}


def open_flags(source: str | Path | None) -> pl.DataFrame:
    """The open calls with recorded flags in the trace at *source* (a capture directory or a
    trace file): :data:`OPEN_SCHEMA`, by time. Empty without any."""
    lines = matching_lines(source, _LINE)
    if not lines:
        return pl.DataFrame(schema=OPEN_SCHEMA)
    out = fields_of(lines, {k: (path, OPEN_SCHEMA[k]) for k, path in _FIELDS.items()})
    return out.drop_nulls().sort("ts")


def classify_reads(reads: pl.DataFrame, opens: pl.DataFrame) -> pl.DataFrame:
    """*reads* (``pid``, ``fhash``, ``ts`` and ``size_requested`` or ``size``) as ``bytes`` (the
    call's size) and ``direct`` (its file was opened with ``O_DIRECT``; null: no open of it
    with flags before it in its process)."""
    size = pl.coalesce(
        *(pl.col(c).cast(pl.Int64) for c in ("size_requested", "size") if c in reads.columns)
    )
    r = (
        reads.select(
            pl.col("pid").cast(pl.Int64),
            pl.col("fhash").cast(pl.String),
            pl.col("ts").cast(pl.Int64),
            size.alias("bytes"),
        )
        .drop_nulls(["fhash", "ts"])
        .sort("ts")
    )
    o = opens.select("pid", "fhash", "ts", ((pl.col("flags") & O_DIRECT) != 0).alias("direct"))
    # both sorted by time, so within each (pid, fhash) too
    return r.join_asof(o, on="ts", by=["pid", "fhash"], strategy="backward", check_sortedness=False)


def _threshold(largest_buffered: int, smallest_direct: int) -> int:
    """The smallest power of two above *largest_buffered*, at most *smallest_direct* (bytes)."""
    return min(1 << max(0, int(largest_buffered)).bit_length(), int(smallest_direct))


def direct_io_of(
    classified: pl.DataFrame, opens: pl.DataFrame
) -> tuple[str, int | None, str, str] | None:
    """(``direct_io``, hybrid threshold in bytes or None, how, confidence) from the classified
    reads (:func:`classify_reads`) and the dataset files' opens with flags; None without any
    open flags of the dataset files."""
    if opens.is_empty():
        return None
    n_direct_opens = int(((opens["flags"] & O_DIRECT) != 0).sum())
    n_opens = opens.height
    known = classified.filter(pl.col("direct").is_not_null() & pl.col("bytes").is_not_null())
    d = known.filter(pl.col("direct"))
    b = known.filter(~pl.col("direct"))
    if n_direct_opens == 0:
        return (
            "off",
            None,
            f"no O_DIRECT in the flags of {n_opens} opens of dataset files",
            "measured",
        )
    if d.is_empty():  # the direct opens' reads are not in the trace (readv/preadv)
        mode = "on" if n_direct_opens * 2 >= n_opens else "off"
        return (
            mode,
            None,
            f"{n_direct_opens} of {n_opens} opens of dataset files with O_DIRECT; their reads are "
            "not in the trace (DFTracer records no readv/preadv)",
            "measured" if n_direct_opens == n_opens else "inferred",
        )
    if b.is_empty():
        return (
            "on",
            None,
            f"all {d.height} reads of dataset files on files opened with O_DIRECT",
            "measured",
        )
    small_direct, large_buffered = int(d["bytes"].min()), int(b["bytes"].max())  # type: ignore[arg-type]
    if large_buffered < small_direct:
        return (
            "hybrid",
            _threshold(large_buffered, small_direct),
            f"{d.height} reads of >= {small_direct} bytes through O_DIRECT opens, {b.height} of "
            f"<= {large_buffered} bytes buffered",
            "measured",
        )
    share = float(d["bytes"].sum()) / max(1.0, float(known["bytes"].sum()))
    return (
        "on" if share >= 0.5 else "off",
        None,
        f"{share:.0%} of the read bytes through O_DIRECT opens; direct and buffered reads of "
        "overlapping sizes (not a size threshold)",
        "inferred",
    )


def with_direct_io(reader: Reader, obs: Observed, source: str | None, facts: Facts) -> Reader:
    """*reader* with ``direct_io`` (and its hybrid threshold) as the open flags in the trace at
    *source* show for the dataset files' reads (*obs*); unchanged without open flags of them."""
    if obs.io.is_empty() or "fhash" not in obs.io.columns:
        return reader
    files = obs.io.select(pl.col("fhash").cast(pl.String)).drop_nulls().unique()
    opens = open_flags(source).join(files, on="fhash", how="semi")
    found = direct_io_of(classify_reads(obs.reads, opens), opens)
    if found is None:
        return reader
    mode, threshold, how, confidence = found
    facts.put("reader.direct_io", f"open flags: {how}", confidence)
    if mode != "off" and confidence == "inferred":
        facts.notes.append(f"reader.direct_io {mode}: {how}")
    if threshold is None:
        return replace(reader, direct_io=mode)
    facts.put("reader.direct_io_threshold", f"open flags: {how}", confidence)
    return replace(reader, direct_io=mode, direct_io_threshold=threshold)
