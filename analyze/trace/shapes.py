"""What the loader's stages hand each other: the raw and compact row schemas
(:data:`RAW_SCHEMA`, :data:`CHUNK_SCHEMA`, :data:`PART_SCHEMA` ...), the operation and
position codes the C scanner shares (:data:`OP_CODE`, ``POS_*``), the parts
(:class:`TracePart`, :class:`RangePart`), the per-file reports (:class:`FileReport`) and
the wording of their problems (values read as null, stray transfers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import polars as pl

from dlreplay.schema import (
    CLOSE_OPS,
    OPEN_OPS,
    READ_OPS,
    WRITE_OPS,
)

__all__ = [
    "AGGREGATED_PH",
    "ARG_FIELDS",
    "BEYOND_32_BITS",
    "CAT",
    "CHUNK_SCHEMA",
    "CLOSE",
    "COUNTS_SCHEMA",
    "DUP_KEY",
    "FH_SCHEMA",
    "FSEEK",
    "FTELL",
    "FileDamage",
    "FileReport",
    "HOSTS_SCHEMA",
    "I16",
    "I32",
    "INT",
    "LOOSE_INT_ARGS",
    "LSEEK",
    "MAX_CALL_BYTES",
    "LoadedTrace",
    "MARKER_SCHEMA",
    "MAX_CALLS",
    "META_PH",
    "NARROW",
    "NATIVE_INTS",
    "NATIVE_STRS",
    "NUL",
    "NULL_BYTES",
    "NULL_DUR",
    "NULL_IDS",
    "NullProblems",
    "ODD_BYTES",
    "ODD_DUR",
    "OPEN",
    "OP_CODE",
    "PACK_BITS",
    "PART_SCHEMA",
    "POS_APPEND",
    "POS_CUR",
    "POS_IO",
    "POS_OK",
    "POS_RDONLY",
    "POS_SET",
    "POS_STDIO",
    "POS_WRITE",
    "PROCESS_SCHEMA",
    "PXFER",
    "PartJob",
    "RAW_SCHEMA",
    "READ_AS_NULL",
    "RENUMBERED",
    "REWIND",
    "RangePart",
    "SRC",
    "STARTS_SCHEMA",
    "STR",
    "STRAY_IO",
    "SUMMED_ARGS",
    "SET_ASIDE",
    "SXFER",
    "TOP_FIELDS",
    "TraceDamageWarning",
    "TracePart",
    "XFER",
    "concat_raw",
    "count_problem",
    "counted_problem",
    "int_stat",
    "with_events",
]

#: The dtypes the tables use, by short name.
INT = pl.Int64()
STR = pl.String()
SRC = pl.UInt32()
CAT = pl.Categorical()
I32 = pl.Int32()
I16 = pl.Int16()


#: Top-level keys kept, with their raw type.
TOP_FIELDS: dict[str, pl.DataType] = {
    "name": STR,
    "cat": STR,
    "ph": STR,
    "pid": INT,
    "tid": INT,
    "ts": INT,
    "dur": INT,
}


#: ``args`` keys kept -> raw column name and type.
ARG_FIELDS: dict[str, tuple[str, pl.DataType]] = {
    "hhash": ("hhash", STR),
    "fhash": ("fhash", STR),
    "ret": ("ret", INT),
    "count": ("count", INT),
    "size": ("isize", INT),
    "offset": ("aoffset", INT),
    "whence": ("whence", INT),
    "flags": ("flags", INT),
    "mode": ("mode", STR),
    "ppid": ("ppid", INT),
    "cwd": ("cwd", STR),
    "name": ("a_name", STR),
    "value": ("a_value", STR),
    "epoch": ("epoch", INT),
    "step": ("step", INT),
    "batch_size": ("batch_size", INT),
    "image_idx": ("image_idx", INT),
    "bytes": ("abytes", INT),
    "path": ("path", STR),
    "fname": ("fname", STR),
    "cpu_time": ("cpu_time", INT),
    "cpu_threads": ("cpu_threads", INT),
    "tensors": ("tensors", INT),
}


#: Arg keys whose values may be written as JSON strings even in DFTracer 2.x.
LOOSE_INT_ARGS = {
    "epoch",
    "step",
    "batch_size",
    "image_idx",
    "bytes",
    "ppid",
    "cpu_time",
    "cpu_threads",
    "tensors",
}


#: The most bytes one call moves (``MAX_CALL_BYTES`` in ``_pfwscan.c``), 1 TiB: Linux moves
#: at most 2 GiB - 4 KiB in one read or write, and an fread/fwrite or one checkpoint save of
#: more would need a buffer beyond a node's memory. A byte count that is negative or larger
#: is damage, read as null and counted (:data:`ODD_BYTES`): summed, 8 M of them would pass
#: int64, and one of 2^63 - 1 made a trace's total read -8192 PiB.
MAX_CALL_BYTES = 1 << 40

OPEN, LSEEK, FSEEK, FTELL, REWIND, CLOSE, XFER, SXFER, PXFER = range(1, 10)


_POSITIONAL = ("pread", "pread64", "pwrite", "pwrite64", "preadv", "preadv2", "pwritev", "pwritev2")


#: Operation class per name: what an event does to the file position.
OP_CODE: dict[str, int] = {
    **{n: OPEN for n in OPEN_OPS},
    "lseek": LSEEK,
    "lseek64": LSEEK,
    "fseek": FSEEK,
    "fseeko": FSEEK,
    "fseeko64": FSEEK,
    "ftell": FTELL,
    "rewind": REWIND,
    **{n: CLOSE for n in CLOSE_OPS},
    **{n: XFER for n in READ_OPS + WRITE_OPS if n not in _POSITIONAL},
    "fread": SXFER,
    "fwrite": SXFER,
    **{n: PXFER for n in _POSITIONAL},
}


#: Columns of a :class:`TracePart`'s frames: the trace file index (``src``), the line
#: number in that file (``seq``, blank lines counted), the raw fields, and ``op``, the
#: operation class of ``name`` (:data:`OP_CODE`; a constant of each layout).
#: ``fhash`` (on most rows, with few distinct values) is Categorical: its integer codes
#: are concatenated, filtered and mapped to file indices without hashing strings.
RAW_SCHEMA: dict[str, pl.DataType] = {"src": SRC, "seq": INT, **TOP_FIELDS}


RAW_SCHEMA.update({col: dt for col, dt in ARG_FIELDS.values()})


RAW_SCHEMA["fhash"] = pl.Categorical()


RAW_SCHEMA["op"] = pl.Int8()


#: Bits of a packed non-negative Int64 sort key (value-sorted instead of an argsort).
PACK_BITS = 63


META_PH = ("4", "M")  # metadata records: consumed, not rows


#: ``ph`` of DFTracer's aggregated records (``DFTRACER_ENABLE_AGGREGATION=1``): ``3`` since
#: DFTracer 2.2 (docs/trace_format.rst, "Record Phases"), the counter phase ``2``/``C``
#: before it; a record of these phases is aggregated when its ``args`` hold ``dft_cnt`` (the
#: calls folded into it). Each is read as ``dft_cnt`` calls (:mod:`.reference`).
AGGREGATED_PH = ("3", "A", "2", "C")


#: ``args`` keys of an aggregated record whose ``<key>_sum`` is split over its calls when no
#: plain value is given (``dur`` too, at the top level of other records): bytes returned and
#: requested, a checkpoint's bytes.
SUMMED_ARGS = ("ret", "count", "bytes")


#: The most calls one aggregated record may fold (``dft_cnt``): more is no count DFTracer
#: writes (one interval of one thread), and the record is dropped as malformed.
MAX_CALLS = 10_000_000


class TraceDamageWarning(UserWarning):
    """Some lines or bytes of a trace could not be used; counts are in the message."""


@dataclass(frozen=True)
class FileReport:
    """What loading one trace file found.

    ``bytes`` is the stored file size; ``members`` the gzip members seen; ``lines`` the
    non-blank lines decoded (events, metadata and dropped lines); ``events`` the rows
    produced; ``dropped_lines`` lines discarded (malformed JSON, partial line at a damage
    point); ``dropped_bytes`` bytes discarded: decoded bytes of dropped lines (with their
    newline) plus stored bytes skipped while resynchronising on a gzip member header.
    """

    path: str
    bytes: int
    members: int
    lines: int
    events: int
    dropped_lines: int
    dropped_bytes: int
    problems: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        """Something was lost: lines, bytes, values read as null (:data:`BEYOND_32_BITS`,
        :data:`ODD_BYTES`, :data:`ODD_DUR`) or events set aside (:data:`SET_ASIDE`)."""
        return (
            self.dropped_lines > 0
            or self.dropped_bytes > 0
            or any(READ_AS_NULL in p or SET_ASIDE in p for p in self.problems)
        )

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


class FileDamage:
    """What was lost, from the per-file reports in ``files`` (shared by every loaded form
    of a trace: :class:`LoadedTrace`, :class:`~.spill.SpilledTrace`)."""

    files: list[FileReport]

    @property
    def dropped_lines(self) -> int:
        return sum(f.dropped_lines for f in self.files)

    @property
    def dropped_bytes(self) -> int:
        return sum(f.dropped_bytes for f in self.files)

    @property
    def damaged(self) -> bool:
        return any(f.damaged for f in self.files)

    def describe_damage(self) -> str:
        """One sentence per damaged file naming it; empty string when nothing was lost."""
        out = []
        for f in self.files:
            if not f.damaged:
                continue
            detail = "; ".join(f.problems) if f.problems else "malformed content"
            out.append(
                f"{f.name}: dropped {f.dropped_lines} line(s) and {f.dropped_bytes} byte(s), "
                f"kept {f.events} event(s) ({detail})."
            )
        return "\n".join(out)


@dataclass(frozen=True)
class LoadedTrace(FileDamage):
    """A loaded trace: the event table (sorted by ``ts``), per-file reports, manifest."""

    events: pl.DataFrame
    files: list[FileReport]
    manifest: dict | None = None
    #: :func:`~.files.file_process_table` of ``events`` (row order unspecified), computed
    #: while loading from integer file and process keys; None when not computed
    per_process: pl.DataFrame | None = None


@dataclass(frozen=True)
class TracePart:
    """Whole trace files parsed and resolved as far as the files themselves allow: the
    output of :func:`parse_part` for whole files, the input of :func:`combine`.

    ``events`` has the columns of :data:`PART_SCHEMA`, in the order ``order`` gives (the
    row indices in (``ts``, file, line) order; None: the rows are in that order):
    ``ts``/``dur`` in microseconds, sizes and offsets reconstructed (every offset stream
    lies in one trace file), strings Categorical. ``__p`` indexes ``processes`` (one row
    per (``src``, ``pid``): ``ppid``, ``cwdhash``, ``host`` from the process's own file),
    ``__path`` is the event's ``path``/``fname`` argument (used where no ``FH`` record
    names its file hash). ``fh`` holds the part's ``FH`` records (``hash``, ``name``,
    ``src``, ``seq``, ``pid``), the first of each hash in (file, line) order: a record
    may name the file of another part's events. ``files`` has one report per file of the
    part with ``events`` still 0 (:func:`combine` fills it in); ``counts`` the rows and
    bytes per (file, process, row class) for the summary, counted where the part was.
    """

    events: pl.DataFrame
    processes: pl.DataFrame
    fh: pl.DataFrame
    files: list[tuple[int, FileReport]]
    #: the summary's per-process counts of the rows (:func:`_part_counts`)
    counts: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=COUNTS_SCHEMA))
    #: the start/stop markers of DFTracer's AI conventions (``CM`` records ``X.start`` /
    #: ``X.end``; :data:`MARKER_SCHEMA`), for :func:`~..vocabulary.marker_spans`
    markers: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=MARKER_SCHEMA))
    #: ``events``' rows in (``ts``, file, line) order (unsigned indices); None: they are in it
    order: np.ndarray | None = None


@dataclass(frozen=True)
class RangePart:
    """A byte range of one trace file's gzip members, parsed but not resolved (its offset
    streams continue in the file's other ranges): the output of :func:`parse_part` for a
    range job. :func:`resolve_ranges` turns all ranges of a file into a :class:`TracePart`.

    ``rows`` has the columns of :data:`CHUNK_SCHEMA` (any order); ``meta`` the metadata
    records (:data:`RAW_SCHEMA`); ``starts`` and ``hosts`` what the processes' ``start``
    records and first host hashes say (:func:`compact_rows`). ``clean_end`` is False when the
    range's text did not end with a newline (a line continues in the next range).
    """

    src: int
    k: int
    rows: pl.DataFrame
    meta: pl.DataFrame
    starts: pl.DataFrame
    hosts: pl.DataFrame
    report: FileReport
    clean_end: bool


#: A job of :func:`parse_part`: (src, path) for a whole file, or (src, path, start, end, k)
#: for the byte range [start, end) of a file's gzip members, range number k of the file.
PartJob = tuple[int, str | os.PathLike] | tuple[int, str | os.PathLike, int, int, int]


def concat_raw(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate raw frames (RAW_SCHEMA); an empty frame when there are none."""
    frames = [f if f.schema == RAW_SCHEMA else f.cast(RAW_SCHEMA) for f in frames if f.height]  # type: ignore[arg-type]
    if not frames:
        return pl.DataFrame(schema=RAW_SCHEMA)
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def with_events(rep: FileReport, n: int, notes: Sequence[str] = ()) -> FileReport:
    return FileReport(
        rep.path,
        rep.bytes,
        rep.members,
        rep.lines,
        n,
        rep.dropped_lines,
        rep.dropped_bytes,
        [*rep.problems, *notes],
    )


#: Raw columns of the scanner's int and string fields, in the order of its C enums.
NATIVE_INTS = (
    "pid",
    "tid",
    "ts",
    "dur",
    "ret",
    "count",
    "isize",
    "aoffset",
    "whence",
    "flags",
    "ppid",
    "epoch",
    "step",
    "batch_size",
    "image_idx",
    "abytes",
    "cpu_time",
    "cpu_threads",
    "tensors",
)


NATIVE_STRS = (
    "name",
    "cat",
    "ph",
    "hhash",
    "fhash",
    "mode",
    "cwd",
    "a_name",
    "a_value",
    "path",
    "fname",
)


#: Columns of a parsed batch's event rows as a part keeps them until its files are
#: resolved (:func:`compact_rows`): ``src``/``seq`` (file, line), the values of the event
#: table that one row gives (strings Categorical; ``size``/``size_requested`` in bytes,
#: fread/fwrite items times item size), and the inputs of the file-position model,
#: without nulls so that they reach the C pass uncopied: ``op`` (the class), ``pos``
#: (:data:`POS_OK` ... flags) and ``parg`` (the one argument the class needs, or
#: :data:`NUL`). ``__path`` is the ``path`` (else ``fname``) argument.
CHUNK_SCHEMA: dict[str, pl.DataType] = {
    "src": SRC,
    "seq": INT,
    "pid": I32,
    "tid": I32,
    "ts": INT,
    "dur": INT,
    "cat": CAT,
    "name": CAT,
    "fhash": CAT,
    "ret": INT,
    "size_requested": INT,
    "size": INT,
    "op": pl.Int8(),
    "pos": pl.UInt8(),
    "parg": INT,
    "epoch": I32,
    "step": I32,
    "batch_size": INT,
    "sample_index": INT,
    "cpu_time": I32,
    "cpu_threads": I32,
    "tensors": I16,
    "__path": CAT,
}


#: Columns of a resolved part's events (:attr:`TracePart.events`), in order.
PART_SCHEMA: dict[str, pl.DataType] = {
    "pid": I32,
    "tid": I32,
    "ts": INT,
    "dur": INT,
    "cat": CAT,
    "name": CAT,
    "fhash": CAT,
    "size_requested": INT,
    "size": INT,
    "offset": INT,
    "ret": INT,
    "epoch": I32,
    "step": I32,
    "batch_size": INT,
    "sample_index": INT,
    "cpu_time": I32,
    "cpu_threads": I32,
    "tensors": I16,
    "__p": pl.UInt32(),
    "__path": CAT,
}


#: A part's processes: one row per (``src``, ``pid``), indexed by the events' ``__p``.
PROCESS_SCHEMA: dict[str, pl.DataType] = {
    "src": SRC,
    "pid": I32,
    "ppid": I32,
    "cwdhash": STR,
    "host": STR,
}


#: A part's start/stop marker records (:attr:`TracePart.markers`).
MARKER_SCHEMA: dict[str, pl.DataType] = {
    "src": SRC,
    "seq": INT,
    "pid": INT,
    "tid": INT,
    "name": STR,
    "a_name": STR,
    "a_value": STR,
}


#: A part's per-process counts (:func:`_part_counts`).
COUNTS_SCHEMA: dict[str, pl.DataType] = {
    "fhash": CAT,
    "__path": CAT,
    "__p": pl.UInt32(),
    "cls": pl.Int64(),
    "item": pl.Boolean(),
    "n": pl.Int64(),
    "b": pl.Int64(),
}


FH_SCHEMA: dict[str, pl.DataType] = {"hash": STR, "name": STR, "src": SRC, "seq": INT, "pid": I32}


STARTS_SCHEMA: dict[str, pl.DataType] = {
    "src": SRC,
    "seq": INT,
    "pid": I32,
    "ppid": INT,
    "cwd": STR,
    "hhash": STR,
}


HOSTS_SCHEMA: dict[str, pl.DataType] = {"src": SRC, "pid": I32, "seq": INT, "hhash": STR}


#: Integer fields kept as Int32 while loading (process and thread ids are C ``pid_t``): a value beyond
#: 32 bits reads as null, and the file's report says so.
NARROW = ("pid", "ppid", "tid")


#: How a file's report names events kept with a value read as null (a loss the plain output names).
READ_AS_NULL = "(read as null)"


#: How a file's report names events left out of the table as impossible (:mod:`.plausible`).
SET_ASIDE = "(set aside)"


BEYOND_32_BITS = f"beyond 32 bits {READ_AS_NULL}"


ODD_BYTES = f"negative or beyond 1 TiB in one call {READ_AS_NULL}"


ODD_DUR = f"beyond \u00b1407 days {READ_AS_NULL}"


#: A file's problem (not damage) when a pid of its processes also ran on another host and was
#: numbered anew (see :func:`_host_pids`).
RENUMBERED = "also ran on another host"


#: Flags of ``pos`` (as ``POS_*`` in ``_pfwscan.c``): the call succeeded (``ret`` null or
#: >= 0), whence SEEK_CUR, whence SEEK_SET, opened for appending (``O_APPEND`` or mode
#: "a"), an I/O call with a file hash (POSIX or STDIO), STDIO, opened read-only (flags
#: without write access, or mode "r" without "+"), a write call (write, pwrite, fwrite).
POS_OK, POS_CUR, POS_SET, POS_APPEND, POS_IO, POS_STDIO, POS_RDONLY, POS_WRITE = (
    1,
    2,
    4,
    8,
    16,
    32,
    64,
    128,
)


#: ``parg`` of a row without the argument its class needs.
NUL = -(1 << 63)


#: Per trace file (``src``), the counts of a batch's rows with values read as null, by what
#: was read as null (:func:`compact_rows`).
NullProblems = dict[int, dict[str, int]]


NULL_IDS = f"a pid, ppid or tid {BEYOND_32_BITS}"


NULL_BYTES = f"a byte count {ODD_BYTES}"


NULL_DUR = f"a duration {ODD_DUR}"


#: How a file's report counts the transfers DFTracer named after a file their process had
#: closed (see :func:`file_offsets`): not damage, and not I/O on that file.
STRAY_IO = (
    "a file their process had closed or never opened for writing (DFTracer's close race: another thread "
    "reused the descriptor), kept without a file"
)


#: How a file's report counts the records holding a kept key twice (``{"name":"read","name":
#: "open"}``, twice ``args``, a key twice in ``args``): read as JSON readers (Python's, jq,
#: JavaScript) read them, the last value winning; not damage. Both parsers alike (the scanner
#: hands such lines to :mod:`.reference`).
DUP_KEY = "a key given twice (the last value read, as JSON readers do)"


def counted_problem(problem: str) -> tuple[int, str] | None:
    """(events, what) of a problem "N event(s) with WHAT" (values read as null, stray
    transfers, duplicated keys), else None."""
    for what in (NULL_IDS, NULL_BYTES, NULL_DUR, STRAY_IO, DUP_KEY):
        n = problem.removesuffix(f" event(s) with {what}")
        if n != problem and n.isdigit():
            return int(n), what
    return None


def count_problem(problems: list[str], n: int, what: str) -> None:
    """Add ``n`` events "with ``what``" to the file's problems: one line per kind, its count
    summed over the batches and byte ranges the file was parsed in."""
    for k, p in enumerate(problems):
        got = counted_problem(p)
        if got is not None and got[1] == what:
            n += got[0]
            problems[k] = f"{n} event(s) with {what}"
            return
    problems.append(f"{n} event(s) with {what}")


def int_stat(value: object) -> int | None:
    """An integer Series statistic (``min``/``max``) as int; None when empty or all null."""
    return None if value is None else int(cast(int, value))
