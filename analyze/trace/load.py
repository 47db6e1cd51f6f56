"""Load DFTracer traces (``*.pfw`` / ``*.pfw.gz``) into the dlreplay event table.

One engine, three stages, run by :func:`parse_parts` on ``jobs`` threads (zlib/ISA-L,
the C scanner and polars release the GIL) for :func:`load_trace` and the bounded-memory
path (:mod:`.spill`), and as Dask tasks for the distributed one (:mod:`.distributed`):

**Parse** (:func:`parse_part`, per group of whole files, or per byte range of one file's
gzip members: a file larger than its share is cut at member headers found near equal
offsets, :func:`_split_file`):

1. **Decompress** one ``decompressobj`` per gzip member (:mod:`dlreplay.pfw`). Damage is
   salvaged, never fatal: a truncated file keeps everything decoded before the cut; a
   corrupt member keeps what decoded cleanly and decoding resumes at the next member
   header (``1f 8b 08``). The partial line at each damage point is dropped and counted.
   Decoded text is handed on as lists of the decoder's output pieces, never joined: the
   scanner reads each piece's lines where they lie (only a line spanning two pieces is
   copied); the Python path joins a chunk's pieces once.
2. **Scan** (when the C extension :mod:`._pfwscan` is built, and ``DLREPLAY_PARSER`` is
   not ``python``): a strict scanner reads each decoded text without the GIL straight
   into raw columns (strings dictionary-encoded, no Python object per line). It accepts
   only lines it fully understands (a JSON object with integer/string values of the kept
   keys, an ``args`` object, DFTracer 1.x quoting and trailing commas); every other
   non-blank line, and any text that is not UTF-8, goes through steps 3-5 below, the
   Python path, at the same points, so both paths give identical tables and reports
   (``tests/test_native_parser.py``). Without the extension, steps 3-5 parse everything.
3. **Tokenise** decoded text with polars' CSV reader (separator ``,``, no quoting): one
   row per line, one column per ``"key":value`` token. The text of many small files is
   tokenised and parsed as one batch (up to about ``_CHUNK_BYTES`` of text; rows are
   attributed to files by their counted lines).
4. **Layouts**: rows are grouped by (name token, category token, token count); one
   sample row per group is parsed in Python into a *layout* (key path, prefix, quoting,
   closing braces of every token); the group's values are extracted with vectorised
   string expressions and checked (line start and end, argument keys, numbers parse).
5. **Fallback**: rows without a usable layout are re-read from their line bytes with
   polars' JSON reader; a failing batch is bisected down to the malformed lines, which
   are dropped and counted against their own file.
6. **Compact** (every parsed batch at once; the scanner's rows by the C pass ``compact``,
   :func:`_native_compact`, the Python path's by :func:`_compact`, both as
   :func:`_compact_exprs` defines them): the rows kept are :data:`CHUNK_SCHEMA` (strings
   Categorical, sizes computed, the file-position inputs narrowed); ``start`` records and
   first host hashes are set aside per process.

**Resolve per file** (:func:`_resolve`, in the same job for whole files; for the ranges of
a split file once they are all parsed, :func:`resolve_ranges`, which first checks the
cuts and parses the file whole when a range was damaged or cut a line): everything one
file decides: the time unit (``CM``), each process's ppid, working-directory hash and
host (``start``/``HH`` records of its own file), offsets reconstructed per (file, pid,
POSIX or STDIO, file hash) in time order (open/seek reset the position; one C pass when
the extension is built, else cumulative sums over segments in numpy), the stray
transfers of the same streams taken off their file (a read or write logged on a file its
process had opened and closed again, none of its descriptors open, or a write on a file it
only ever opened read-only: DFTracer's close race, :func:`_offsets`; counted in the
file's report), and the order (``ts``, file, line). The result is a :class:`TracePart`:
rows of :data:`PART_SCHEMA`, the part's processes and its ``FH`` records.

**Combine** (:func:`combine`, once): the run's tables (:func:`run_tables`: ``FH`` paths
across all files, a record may sit in another process's file, relative names use the
writing process's working directory), the parts merged by a stable sort on (``ts``,
file) (each is in order already), and the :data:`~dlreplay.schema.EVENT_SCHEMA` columns
(:func:`finalize`: ppid, host and source per process, file per file-hash category
code). Columns are gathered a few at a time, their sources dropped before the next, so
the rows are never held twice; the event table is compact (no string per event:
Categorical names, categories, files, hosts and sources; Int32 where values fit). The
summary's per-(file, host, pid) table (:attr:`LoadedTrace.per_process`) is counted over
integer file and process keys.

Units: ``ts``/``dur`` microseconds (a ``CM`` time metric of ``NS``/``MS``/``S`` is
converted), sizes and offsets bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import mmap
import os
import queue
import re
import threading
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import polars as pl

from dlreplay.allocator import prepare_release, release_free_memory
from dlreplay.errors import TraceError
from dlreplay.pfw import GZIP_MAGIC, PlainFile, Slabs, anonymous_map
from dlreplay.pfw import DecodeStats as _Stats
from dlreplay.pfw import decoded_spans as _decoded_spans
from dlreplay.schema import (
    CAT_CHECKPOINT,
    CAT_DATA,
    CLOSE_OPS,
    EVENT_SCHEMA,
    OPEN_OPS,
    READ_OPS,
    WRITE_OPS,
)

from . import vocabulary
from .counts import file_process_table_counted, row_class

__all__ = [
    "CHUNK_SCHEMA", "PART_SCHEMA", "FileDamage", "FileReport", "LoadedTrace", "RangePart", "RunTables",
    "TraceDamageWarning", "TracePart", "available_cores", "combine", "combine_parts", "finalize", "load",
    "load_trace", "member_ranges", "parse_part", "parse_parts", "resolve_ranges", "run_tables", "trace_warnings",
]

TRACE_SUFFIXES = (".pfw", ".pfw.gz")
MANIFEST_NAME = "manifest.json"

#: Decoded text per parse batch (bytes). Large batches amortise per-layout overhead; each
#: thread holds one batch's text and scan at a time (32 MiB: a load's peak 244-257 B/event
#: on 2 threads, 16 MiB: 222-235, at the same speed).
_CHUNK_BYTES = 16 << 20
#: Longest line kept (bytes): a longer one is dropped as it streams by (see :func:`_text_chunks`).
_MAX_LINE_BYTES = 4 << 20
#: Stored bytes of the files parsed together by one :func:`parse_part` call of
#: :func:`load_trace` (a larger file is a group of its own).
_GROUP_BYTES = 4 << 20
#: Token columns read per line; the last one must be empty for a line to be complete.
_NTOK = 15
#: Lines per JSON batch on the fallback path.
_JSON_BATCH = 4096
#: Layout groups smaller than this go to the JSON path (cheaper than a layout query).
_MIN_GROUP = 24

_TOKEN_SCHEMA = {f"c{i}": pl.String() for i in range(_NTOK)}

# ---------------------------------------------------------------------------------------
# Raw (pre-resolution) columns shared by the fast and the fallback path.

_INT = pl.Int64()
_STR = pl.String()
_SRC = pl.UInt32()

#: Top-level keys kept, with their raw type.
_TOP_FIELDS: dict[str, pl.DataType] = {
    "name": _STR, "cat": _STR, "ph": _STR, "pid": _INT, "tid": _INT, "ts": _INT, "dur": _INT,
}
#: ``args`` keys kept -> raw column name and type.
_ARG_FIELDS: dict[str, tuple[str, pl.DataType]] = {
    "hhash": ("hhash", _STR), "fhash": ("fhash", _STR),
    "ret": ("ret", _INT), "count": ("count", _INT), "size": ("isize", _INT),
    "offset": ("aoffset", _INT), "whence": ("whence", _INT), "flags": ("flags", _INT),
    "mode": ("mode", _STR), "ppid": ("ppid", _INT), "cwd": ("cwd", _STR),
    "name": ("a_name", _STR), "value": ("a_value", _STR),
    "epoch": ("epoch", _INT), "step": ("step", _INT), "batch_size": ("batch_size", _INT),
    "image_idx": ("image_idx", _INT), "bytes": ("abytes", _INT),
    "path": ("path", _STR), "fname": ("fname", _STR),
    "cpu_time": ("cpu_time", _INT), "cpu_threads": ("cpu_threads", _INT), "tensors": ("tensors", _INT),
}
#: Arg keys whose values may be written as JSON strings even in DFTracer 2.x.
_LOOSE_INT_ARGS = {"epoch", "step", "batch_size", "image_idx", "bytes", "ppid", "cpu_time", "cpu_threads",
                   "tensors"}
#: String args that may hold arbitrary text (checked for JSON escapes).
_TEXT_ARGS = {"a_name", "path", "fname", "mode"}

_OPEN, _LSEEK, _FSEEK, _FTELL, _REWIND, _CLOSE, _XFER, _SXFER, _PXFER = range(1, 10)
_POSITIONAL = ("pread", "pread64", "pwrite", "pwrite64", "preadv", "preadv2", "pwritev", "pwritev2")
#: Operation class per name: what an event does to the file position.
_OP_CODE: dict[str, int] = {
    **{n: _OPEN for n in OPEN_OPS}, "lseek": _LSEEK, "lseek64": _LSEEK,
    "fseek": _FSEEK, "fseeko": _FSEEK, "fseeko64": _FSEEK, "ftell": _FTELL, "rewind": _REWIND,
    **{n: _CLOSE for n in CLOSE_OPS},
    **{n: _XFER for n in READ_OPS + WRITE_OPS if n not in _POSITIONAL},
    "fread": _SXFER, "fwrite": _SXFER, **{n: _PXFER for n in _POSITIONAL},
}
#: Columns of a :class:`TracePart`'s frames: the trace file index (``src``), the line
#: number in that file (``seq``, blank lines counted), the raw fields, and ``op``, the
#: operation class of ``name`` (:data:`_OP_CODE`; a constant of each layout).
#: ``fhash`` (on most rows, with few distinct values) is Categorical: its integer codes
#: are concatenated, filtered and mapped to file indices without hashing strings.
RAW_SCHEMA: dict[str, pl.DataType] = {"src": _SRC, "seq": _INT, **_TOP_FIELDS}
RAW_SCHEMA.update({col: dt for col, dt in _ARG_FIELDS.values()})
RAW_SCHEMA["fhash"] = pl.Categorical()
RAW_SCHEMA["op"] = pl.Int8()

#: Bits of a packed non-negative Int64 sort key (value-sorted instead of an argsort).
_PACK_BITS = 63
_META_PH = ("4", "M")  # metadata records: consumed, not rows
_TIME_SCALE = {"US": 1.0, "NS": 1e-3, "MS": 1e3, "S": 1e6, "SEC": 1e6}
_SCALAR_RE = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null")


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
        """Something was lost: lines, bytes, or values read as null (:data:`BEYOND_32_BITS`,
        :data:`ODD_BYTES`, :data:`ODD_DUR`)."""
        return self.dropped_lines > 0 or self.dropped_bytes > 0 or any(READ_AS_NULL in p for p in self.problems)

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
    records and first host hashes say (:func:`_compact`). ``clean_end`` is False when the
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


# =======================================================================================
# Public entry points


def load_trace(path: str | os.PathLike | Sequence[str | os.PathLike], *,
               jobs: int | None = None) -> LoadedTrace:
    """Load a trace directory (all ``*.pfw``/``*.pfw.gz`` below it), one file, or a list of files.

    ``jobs`` is how many threads decompress, parse and resolve at once (default:
    :func:`available_cores`): groups of small files, whole files, and byte ranges of
    whole gzip members of a file larger than its share (:func:`parse_parts`). The table
    is the same whatever ``jobs`` is. Raises :class:`~dlreplay.errors.TraceError` when
    the path does not exist or holds no trace file. Damage never raises: see
    :attr:`LoadedTrace.files`.
    """
    files, manifest = _find_inputs(path)
    parts: list[TracePart | RangePart] = list(parse_parts(files, jobs=jobs))
    release_free_memory(keep_large=True)  # the parse's buffers, before the merge builds the table
    loaded = _combine_owned(parts, [p.name for p in files])
    release_free_memory()  # the merge's, before the passes
    return dataclasses.replace(loaded, manifest=manifest)


#: Stored bytes below which a file is never split into byte ranges.
_SPLIT_MIN_BYTES = 2 << 20


def parse_parts(files: Sequence[Path], *, jobs: int | None = None,
                group_bytes: int | None = None, ordered: bool = False) -> Iterator[TracePart]:
    """The resolved parts of the trace ``files`` (the run's files, ``src`` = position), as
    they are done, parsed by ``jobs`` threads (default: :func:`available_cores`).

    A file holding more than its share of the stored bytes (:func:`_range_bytes`) is
    parsed as byte ranges (:func:`_split_file`) and then resolved whole
    (:func:`resolve_ranges`); the other files in groups of consecutive files of about
    ``group_bytes`` stored bytes (default: enough groups to keep the threads busy). At
    most two jobs per thread are in flight, so with ``group_bytes`` the memory held is
    bounded by the groups being parsed plus the parts not yet consumed (one job per
    thread is in flight then). ``ordered``: each part's rows gathered into (``ts``, file,
    line) order (:attr:`TracePart.order` None), for a caller that keeps parts apart;
    :func:`combine` gathers unordered parts once, into the run's order.
    """
    workers = max(1, jobs or available_cores())
    prepare_release()  # before the parse holds memory (see its doc)
    indexed = list(enumerate(files))
    if workers == 1 and group_bytes is None:  # one thread: no pool, no ranges
        for group in _groups(indexed, 1):
            yield cast(TracePart, parse_part(group, ordered=ordered))
        return
    sizes = [_stored_size(p) for p in files]
    share = _range_bytes(sizes, workers)
    split: dict[int, list[tuple[int, int]]] = {}
    if workers > 1:
        for (src, p), size in zip(indexed, sizes, strict=True):
            if size >= 2 * share:
                # rounded, not up: a file of the whole trace is 2 ranges per thread (rounding
                # up made it 2 per thread + 1, which ran alone at the end: 0.17 s of 1.4)
                ranges = _split_file(p, size, max(2, round(size / share)))
                if ranges:
                    split[src] = ranges
    rest = [(src, p) for src, p in indexed if src not in split]
    groups = _groups(rest, workers) if group_bytes is None else _groups_of(rest, group_bytes)
    todo: list[tuple[Any, Any]] = [(parse_part, [(src, files[src], a, b, k)])
                                   for src, ranges in split.items() for k, (a, b) in enumerate(ranges)]
    todo += [(parse_part, g) for g in groups]
    todo.reverse()  # popped from the end: in this order
    waiting: dict[int, list[RangePart]] = {}
    flight: set[Future] = set()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dlreplay-load") as pool:
        while todo or flight:
            while todo and len(flight) < (2 * workers if group_bytes is None else workers):
                fn, arg = todo.pop()
                # a helper thread decodes ahead only where a core would otherwise be idle
                kw: dict[str, bool] = {"ordered": ordered}
                if fn is parse_part:
                    kw["prefetch"] = len(todo) + len(flight) + 1 < workers
                flight.add(pool.submit(fn, arg, **kw))
                del fn, arg  # (a list of ranges is emptied by the job as it takes their rows)
            done, flight = wait(flight, return_when=FIRST_COMPLETED)
            for fut in done:
                res = fut.result()
                for part in res if isinstance(res, list) else [res]:
                    if isinstance(part, RangePart):
                        got = waiting.setdefault(part.src, [])
                        got.append(part)
                        if len(got) == len(split[part.src]):  # all ranges of the file: resolve it next
                            todo.append((resolve_ranges, waiting.pop(part.src)))
                    else:
                        yield part
                del res


def _groups_of(jobs: list[tuple[int, Path]], target: int) -> list[list[tuple[int, Path]]]:
    """Consecutive (src, path) groups of about ``target`` stored bytes; a file is never split."""
    groups: list[list[tuple[int, Path]]] = []
    current: list[tuple[int, Path]] = []
    size = 0
    for job in jobs:
        n = _stored_size(job[1])
        if current and size + n > target:
            groups.append(current)
            current, size = [], 0
        current.append(job)
        size += n
    if current:
        groups.append(current)
    return groups


def _range_bytes(sizes: list[int], workers: int) -> int:
    """Stored bytes of a byte range: half a worker's share of the files (so that a file
    twice that size is split and the workers stay busy), at least ``_SPLIT_MIN_BYTES``."""
    return max(_SPLIT_MIN_BYTES, sum(sizes) // (2 * workers))


def _split_file(path: Path, size: int, pieces: int) -> list[tuple[int, int]] | None:
    """Byte ranges covering the gzip file ``path`` (``size`` bytes), cut at member headers
    found near every ``size / pieces`` bytes; None when it is not gzip or no cut was found.

    A cut is a guess until the ranges are parsed: a header is accepted when its flags are
    valid and the next few KiB inflate to text, and :func:`resolve_ranges` checks that
    every range decoded cleanly and ended with a line (a wrong cut leaves a truncated
    member before it or a corrupt one after it) before it uses them.
    """
    cuts = [0]
    try:
        with open(path, "rb") as fh:
            if fh.read(3) != GZIP_MAGIC:
                return None
            for i in range(1, pieces):
                at = _next_member(fh, max(size * i // pieces, cuts[-1] + 1), size)
                if at is None:
                    break
                if at > cuts[-1]:
                    cuts.append(at)
    except OSError:
        return None
    if len(cuts) < 2:
        return None
    return list(zip(cuts, [*cuts[1:], size], strict=True))


#: Bytes read at a time while looking for a member header, and the most looked through.
_SEEK_WINDOW, _SEEK_LIMIT = 256 << 10, 64 << 20
#: Compressed bytes inflated to check a header candidate.
_PROBE_BYTES = 16 << 10


def _next_member(fh: Any, at: int, size: int) -> int | None:
    """Offset of the first plausible gzip member header at or after ``at`` in ``fh``."""
    pos = at
    while pos < min(size, at + _SEEK_LIMIT):
        fh.seek(pos)
        window = fh.read(_SEEK_WINDOW + _PROBE_BYTES)
        k = window.find(GZIP_MAGIC)
        while 0 <= k < _SEEK_WINDOW:
            if len(window) - k >= 10 and not window[k + 3] & 0xE0:  # reserved flag bits clear
                try:
                    d = zlib.decompressobj(31)
                    out = d.decompress(window[k:k + _PROBE_BYTES], 256)
                except zlib.error:
                    out = b""
                if out[:1] in (b"{", b"[", b" ", b"\n", b"\r", b"\t"):
                    return pos + k
            k = window.find(GZIP_MAGIC, k + 1)
        if len(window) <= _SEEK_WINDOW:
            return None
        pos += _SEEK_WINDOW
    return None


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; the CPU count where the
    platform has no affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


def load(path: str | os.PathLike | Sequence[str | os.PathLike], **kw) -> pl.DataFrame:
    """The event table of :func:`load_trace`; warns :class:`TraceDamageWarning` on any loss."""
    loaded = load_trace(path, **kw)
    if loaded.damaged:
        warnings.warn(
            TraceDamageWarning(
                f"trace damaged: dropped {loaded.dropped_lines} line(s) and "
                f"{loaded.dropped_bytes} byte(s); kept {loaded.events.height} event(s).\n"
                + loaded.describe_damage()
            ),
            stacklevel=2,
        )
    return loaded.events


def _groups(jobs: list[tuple[int, Path]], workers: int) -> list[list[tuple[int, Path]]]:
    """Consecutive files grouped by stored size: about ``_GROUP_BYTES`` per group, fewer
    when that leaves idle workers; a file larger than that is a group of its own."""
    sizes = [_stored_size(p) for _, p in jobs]
    target = _GROUP_BYTES if workers == 1 else max(1, min(_GROUP_BYTES, sum(sizes) // (2 * workers)))
    groups: list[list[tuple[int, Path]]] = []
    current: list[tuple[int, Path]] = []
    size = 0
    for job, n in zip(jobs, sizes, strict=True):
        if current and size + n > target:
            groups.append(current)
            current, size = [], 0
        current.append(job)
        size += n
    if current:
        groups.append(current)
    return groups


def _stored_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# =======================================================================================
# Inputs


@dataclass(frozen=True)
class TraceInputs:
    """The trace files of a path, its manifest, and the files left out (one sentence each, naming them)."""

    files: list[Path]
    manifest: dict | None
    skipped: list[str] = field(default_factory=list)


def find_trace_inputs(path) -> TraceInputs:
    """Resolve ``path`` (a trace directory, a file, or a list of files) to its trace files, sorted.

    A directory's files are those below it, except: files under a subdirectory with its own
    ``manifest.json`` (another capture, e.g. a replay's trace kept inside) and files whose
    bytes are identical to an earlier one (the same process's trace twice); both are left
    out and named in ``skipped``, never summed. A directory whose trace files all belong to
    two or more such runs is refused: analyse one run at a time.
    """
    if isinstance(path, (list, tuple)):
        if not path:
            raise TraceError("no trace files given: pass a trace directory or .pfw/.pfw.gz files")
        files = [Path(p) for p in path]
        for p in files:
            if not p.is_file():
                raise TraceError(f"trace file {p} does not exist: check the path")
        return TraceInputs(files, None)
    p = Path(path)
    if p.is_file():
        return TraceInputs([p], None)
    if not p.exists():
        raise TraceError(f"trace path {p} does not exist: pass a directory written by "
                         "'dlreplay capture' or a .pfw/.pfw.gz file")
    if not p.is_dir():
        raise TraceError(f"trace path {p} is neither a file nor a directory")
    found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    if not found:
        raise TraceError(f"no trace files (*.pfw, *.pfw.gz) under {p}: was the job captured "
                         "with DFTracer, and did it run long enough to write its trace?")
    runs = sorted({d for d in (_run_root(f, p) for f in found) if d is not None}, key=str)
    mine = [f for f in found if _run_root(f, p) is None]
    if not mine and len(runs) > 1:
        names = ", ".join(str(r.relative_to(p)) for r in runs[:5]) + (", ..." if len(runs) > 5 else "")
        raise TraceError(f"{p} holds {len(runs)} captured runs ({names}), each with its own {MANIFEST_NAME}: "
                         f"analyse one run at a time (e.g. {runs[0]})")
    if not mine:  # one run in a subdirectory: that run
        return find_trace_inputs(runs[0])
    skipped = [f"{r.relative_to(p)}/: {sum(1 for f in found if _run_root(f, p) == r)} trace file(s) of another "
               f"run (it has its own {MANIFEST_NAME}), left out; analyse {r} on its own" for r in runs]
    files, dupes = _without_duplicates(mine)
    if dupes:
        pairs = "; ".join(f"{f.relative_to(p)} = {g.relative_to(p)}" for f, g in dupes[:5])
        skipped.append(f"{len(dupes)} trace file(s) are byte-identical copies of others (the same process's trace "
                       f"twice), left out: {pairs}{'; ...' if len(dupes) > 5 else ''}")
    return TraceInputs(files, _read_manifest(p / MANIFEST_NAME), skipped)


def _run_root(f: Path, top: Path) -> Path | None:
    """The subdirectory of *top* above *f* that holds another capture's manifest, or None."""
    for d in f.parents:
        if d == top or top not in d.parents:
            return None
        if (d / MANIFEST_NAME).is_file():
            return d
    return None


def _without_duplicates(files: list[Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """*files* without byte-identical copies, and the (copy, original) pairs left out.

    Only files of equal size are hashed; of identical files the one nearest the top of the
    directory (then the first by name) is kept.
    """
    import hashlib

    def digest(f: Path) -> bytes | None:
        h = hashlib.blake2b(digest_size=16)
        try:
            with open(f, "rb") as fh:
                while block := fh.read(1 << 20):
                    h.update(block)
        except OSError:
            return None
        return h.digest()

    by_size: dict[int, list[Path]] = {}
    for f in sorted(files, key=lambda f: (len(f.parts), f)):
        by_size.setdefault(_stored_size(f), []).append(f)
    dupes: list[tuple[Path, Path]] = []
    for size, same in by_size.items():
        if len(same) < 2 or size == 0:
            continue
        first: dict[bytes, Path] = {}
        for f in same:
            key = digest(f)
            if key is None:
                continue
            if key in first:
                dupes.append((f, first[key]))
            else:
                first[key] = f
    gone = {f for f, _ in dupes}
    return [f for f in files if f not in gone], sorted(dupes)


def _find_inputs(path) -> tuple[list[Path], dict | None]:
    """Resolve ``path`` to trace files (sorted) and the manifest of a directory, if any (see
    :func:`find_trace_inputs`)."""
    found = find_trace_inputs(path)
    return found.files, found.manifest


def trace_warnings(path, files: Sequence[FileReport] = ()) -> list[str]:
    """What a reader must know before any number derived from the trace at *path*: a capture
    that did not end (manifest ``running``; a process file cut), files left out (another run,
    duplicates), calls the tracer named after a closed file, and files that hold no events.
    One sentence each, naming the file."""
    found = find_trace_inputs(path)
    out = []
    status = (found.manifest or {}).get("status")
    if status == "running":
        out.append(f"the capture did not end: its {MANIFEST_NAME} still says 'running' (its dlreplay process was "
                   f"killed, or it is still running), so the trace may be incomplete")
    cut = [f for f in files if f.damaged]
    if cut:
        out.append(f"{len(cut)} process file(s) cut or damaged ({', '.join(f.name for f in cut[:5])}"
                   f"{', ...' if len(cut) > 5 else ''}): those processes' traces are incomplete")
    out += found.skipped
    moved = [p for f in files for p in f.problems if RENUMBERED in p]
    if moved:
        said = "; ".join(m.split(": it ")[0] for m in moved[:3])
        out.append(f"{len(moved)} process(es) numbered anew where a pid also ran on another host, so that no two "
                   f"hosts' processes mix: {said}{'; ...' if len(moved) > 3 else ''}")
    stray = [(f.name, got[0]) for f in files for p in f.problems if (got := _counted(p)) and got[1] == STRAY_IO]
    if stray:
        out.append(f"{sum(n for _, n in stray)} read/write call(s) in {len(stray)} process file(s) "
                   f"({', '.join(name for name, _ in stray[:3])}{', ...' if len(stray) > 3 else ''}) were logged on a "
                   f"file their process had already closed, or (writes) on one it never opened for writing: "
                   f"DFTracer forgets a descriptor's file only after closing it, and another thread's socket or "
                   f"pipe got the number in between. They are kept without a file, outside every file's bytes")
    empty = [f for f in files if f.events == 0]
    if empty:
        why = "; ".join(f"{f.name} ({'; '.join(f.problems) or 'no events'})" for f in empty[:5])
        out.append(f"{len(empty)} of {len(files)} trace file(s) hold no events: {why}"
                   f"{'; ...' if len(empty) > 5 else ''}")
    return out


def _read_manifest(path: Path) -> dict | None:
    """The manifest as a dict, or None when absent; a broken one warns and yields None."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.warn(TraceDamageWarning(f"{path} is unreadable ({exc}); loading without it"),
                      stacklevel=3)
        return None
    return data if isinstance(data, dict) else None


# =======================================================================================
# Stage 1: files -> TracePart (decompress with salvage, tokenise, parse in batches)


#: A job of :func:`parse_part`: (src, path) for a whole file, or (src, path, start, end, k)
#: for the byte range [start, end) of a file's gzip members, range number k of the file.
PartJob = tuple[int, str | os.PathLike] | tuple[int, str | os.PathLike, int, int, int]


def parse_part(jobs: Sequence[PartJob], *, prefetch: bool | None = None, ordered: bool = False
               ) -> TracePart | RangePart:
    """Decompress, parse and resolve the trace files ``jobs`` = [(src, path), ...] into a :class:`TracePart`.

    ``src`` is the file's index in the whole run (the position of its name in the
    ``names`` given to :func:`combine`); the indices of all parts of a run must be
    distinct. The result depends only on the files' bytes and their ``src``, never on
    how files are grouped into parts or on other parts, so parts can be computed in any
    order, in threads or processes, and :func:`combine` gives the same table.
    Damage is salvaged and counted in the file's own report; an unreadable file raises
    :class:`~dlreplay.errors.TraceError`.

    ``jobs`` may instead be one byte range of a file's gzip members, [(src, path, start,
    end, k)] (see :data:`PartJob`; :func:`member_ranges` and :func:`_speculative_ranges`
    cut only between members): the result is then a :class:`RangePart`, its rows whole
    lines whose ``seq`` is ``k << 32`` plus the line number in the range (so it orders
    the file's lines), its report counting only its range.

    ``prefetch``: decode a large file's next chunk in a helper thread while this one parses
    the current chunk (:func:`_prefetched`). Only worth it where a core would otherwise be
    idle: where every core runs a parse already, the helpers only compete for the GIL
    (9 files on 2 cores: 1.57 -> 1.49 s without them, 5 %, and 8 B/event less peak; one
    file's ranges and 1 core: the same time). None: when fewer :func:`parse_part` calls
    are parsing than this process has cores.

    ``ordered``: the part's rows gathered into (``ts``, file, line) order here (else they
    stay in their files' order and :attr:`TracePart.order` lists that order).
    """
    ranged = any(len(job) == 5 for job in jobs)
    if ranged and len(jobs) != 1:
        raise ValueError("parse_part: a byte range of a file is parsed alone")
    _PARSING.enter()
    try:
        got = _parse_rows(jobs, ranged, prefetch)
    finally:
        alone = _PARSING.leave()
    if isinstance(got, RangePart):
        return got
    rows, files = got
    events, order, processes, records, counts, markers = _resolve(rows, {src: rep.problems for src, rep in files},
                                                                  alone=alone, ordered=ordered)
    return TracePart(events=events, processes=processes, fh=records, files=files, counts=counts, markers=markers,
                     order=order)


class _Parsing:
    """How many :func:`parse_part` calls of this process are decoding and parsing (not
    resolving): a part resolved while none is returns memory between its steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0

    def enter(self) -> None:
        with self._lock:
            self._n += 1

    def leave(self) -> bool:
        """Done parsing; True when no other call still is."""
        with self._lock:
            if self._n:
                self._n -= 1
            return self._n == 0

    def idle(self) -> bool:
        return self.busy() == 0

    def busy(self) -> int:
        """How many calls are decoding and parsing now (this one included)."""
        with self._lock:
            return self._n


_PARSING = _Parsing()


def _parse_rows(jobs: Sequence[PartJob], ranged: bool, prefetch: bool | None = None
                ) -> RangePart | tuple[_Compacted, list[tuple[int, FileReport]]]:
    """:func:`parse_part` up to the resolve: a range's part, else the compacted rows and the files' reports."""
    batch = _new_batch()
    rows = _Compacted()
    done: list[tuple[int, Path, int, _Stats]] = []
    clean_end = True
    if prefetch is None:  # decided once, as the call starts
        prefetch = _PARSING.busy() < available_cores()
    ahead_ok = prefetch or not _PREFETCH_SPARE_ONLY
    for job in jobs:
        src, p = job[0], job[1]
        path = Path(p)
        stats = _Stats()
        rows.stats[src] = stats
        data: bytes | PlainFile
        try:
            if len(job) == 5:
                start, end = job[2], job[3]  # type: ignore[misc]
                with open(path, "rb") as fh:
                    fh.seek(start)
                    data = fh.read(end - start)
            else:  # plain text is read as it is parsed (garbage costs no memory by its size)
                data = PlainFile.of(path) or path.read_bytes()
        except OSError as exc:
            raise TraceError(f"cannot read trace file {path}: {exc}") from exc
        if not data:
            stats.problems.append("file is empty (0 bytes): the process wrote no trace")
        seq0 = job[4] << 32 if len(job) == 5 else 0  # type: ignore[misc]
        # a large file's text is decoded ahead into slabs, written again once its chunks are
        # flushed (nothing reads a chunk's text after its batch's flush)
        slabs = Slabs(recycle=True, keep_bytes=_CHUNK_BYTES) if ahead_ok and len(data) >= _PREFETCH_BYTES else None
        chunks = _prefetched(data, stats, slabs) if slabs is not None else _text_chunks(data, stats)
        for received, (text, damaged_after, cut) in enumerate(chunks, 1):
            body, tail = _split_tail(text)
            clean_end = not tail
            if tail:
                if damaged_after:
                    stats.drop(1, tail)
                    stats.problems.append(f"dropped a partial line of {tail} bytes at a damage point")
                else:
                    body = text  # last line without newline at a clean end of file: keep it
            if body:
                seq0 += batch.add_pieces(src, seq0, body, stats)
            # a file's chunks are parsed before it decodes further: its problems stay in order
            if damaged_after or cut or batch.nbytes >= _CHUNK_BYTES:
                batch.flush()
                rows.take(batch)
                if slabs is not None:
                    slabs.release(received - 1)
        done.append((src, path, len(data), stats))
        del data, chunks, slabs  # the stored bytes are not needed any more (the resolve below is)
    batch.flush()
    rows.take(batch)
    files = []
    for src, path, size, stats in done:
        if size and not stats.lines and not stats.problems and not ranged:
            stats.problems.append("file holds no trace lines")
        files.append((src, FileReport(
            path=str(path), bytes=size, members=stats.members, lines=stats.lines, events=0,
            dropped_lines=stats.dropped_lines, dropped_bytes=stats.dropped_bytes,
            problems=stats.problems,
        )))
    if ranged:
        job = jobs[0]
        kept, meta, starts, hosts = rows.pop()
        return RangePart(src=job[0], k=job[4], rows=kept, meta=meta, starts=starts,  # type: ignore[misc]
                         hosts=hosts, report=files[0][1], clean_end=clean_end)
    return rows, files


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate raw frames (RAW_SCHEMA); an empty frame when there are none."""
    frames = [f if f.schema == RAW_SCHEMA else f.cast(RAW_SCHEMA) for f in frames if f.height]  # type: ignore[arg-type]
    if not frames:
        return pl.DataFrame(schema=RAW_SCHEMA)
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def _with_events(rep: FileReport, n: int, notes: Sequence[str] = ()) -> FileReport:
    return FileReport(rep.path, rep.bytes, rep.members, rep.lines, n, rep.dropped_lines,
                      rep.dropped_bytes, [*rep.problems, *notes])


#: A piece of decoded text: the bytes [lo, hi) of a bytes object or of a mapping of
#: :class:`~dlreplay.pfw.Slabs` (chunks of text are lists of pieces, so that decoded
#: output is sliced and regrouped without copying it).
_Piece = tuple["bytes | mmap.mmap", int, int]


def _split_tail(text: list[_Piece]) -> tuple[list[_Piece], int]:
    """Split ``text`` after its last newline: (complete lines, length of the trailing partial line)."""
    for i in range(len(text) - 1, -1, -1):
        b, lo, hi = text[i]
        k = b.rfind(b"\n", lo, hi)
        if k >= 0:
            body = [*text[:i], (b, lo, k + 1)]
            return body, hi - k - 1 + sum(p[2] - p[1] for p in text[i + 1:])
    return [], sum(p[2] - p[1] for p in text)


def _line_segments(text: list[_Piece]) -> list[bytes | mmap.mmap | memoryview]:
    """``text`` (complete lines; the last one may lack its newline) as buffers of complete
    lines, each ending with a newline except maybe the last: views of the pieces, and the
    (short) lines that span two pieces joined."""
    out: list[bytes | mmap.mmap | memoryview] = []
    carry: list[memoryview] = []  # the start of a line that continues in the next piece
    for b, lo, hi in text:
        if lo >= hi:
            continue
        mv = memoryview(b)
        if carry:
            k = b.find(b"\n", lo, hi)
            if k < 0:
                carry.append(mv[lo:hi])
                continue
            carry.append(mv[lo:k + 1])
            out.append(b"".join(carry))
            carry, lo = [], k + 1
            if lo == hi:
                continue
        k = b.rfind(b"\n", lo, hi)
        if k >= lo:
            out.append(b if lo == 0 and k + 1 == len(b) else mv[lo:k + 1])
        if k + 1 < hi:
            carry.append(mv[max(lo, k + 1):hi])
    if carry:
        out.append(b"".join(carry))
    return out


def _joined(text: list[_Piece]) -> bytes:
    """The bytes of ``text``."""
    if len(text) == 1 and isinstance(text[0][0], bytes) and text[0][1] == 0 and text[0][2] == len(text[0][0]):
        return text[0][0]
    return b"".join(memoryview(b)[lo:hi] for b, lo, hi in text)


#: Files stored with at least this many bytes decode their next chunk in a helper
#: thread while the current one is parsed (zlib/ISA-L release the GIL), where a core
#: would otherwise be idle (:func:`parse_part`'s ``prefetch``).
_PREFETCH_BYTES = 2 << 20
#: False: every such file decodes ahead, spare core or not (the tests' switch).
_PREFETCH_SPARE_ONLY = True


def _prefetched(data: bytes | PlainFile, stats: _Stats, slabs: Slabs | None = None
                ) -> Iterable[tuple[list[_Piece], bool, bool]]:
    """:func:`_text_chunks`, decoded one chunk ahead in a helper thread, into ``slabs``
    (a new :class:`~dlreplay.pfw.Slabs` when None; the caller's when it releases the
    chunks it has parsed).

    The helper counts into its own stats; what it counted up to each chunk is added to
    ``stats`` when that chunk is handed over, so problems keep the order of a
    sequential decode.
    """
    q: queue.Queue = queue.Queue(maxsize=1)
    mine = _Stats()
    stop = threading.Event()

    def delta(seen: list[int]) -> tuple[int, int, int, list[str]]:
        d = (mine.members - seen[0], mine.dropped_lines - seen[1], mine.dropped_bytes - seen[2],
             mine.problems[seen[3]:])
        seen[:] = [mine.members, mine.dropped_lines, mine.dropped_bytes, len(mine.problems)]
        return d

    def produce() -> None:
        seen = [0, 0, 0, 0]
        mine_slabs = slabs if slabs is not None else Slabs()
        try:
            for chunk in _text_chunks(data, mine, mine_slabs):
                if stop.is_set():
                    return
                q.put((chunk, delta(seen), None))
            mine_slabs.finish()  # (before the end is handed over: the kept slabs go now)
            q.put((None, delta(seen), None))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            q.put((None, delta(seen), exc))
        finally:
            mine_slabs.finish()  # (stopped, or failed)

    helper = threading.Thread(target=produce, name="dlreplay-decode", daemon=True)
    helper.start()
    try:
        while True:
            chunk, (members, lines, nbytes, problems), exc = q.get()
            stats.members += members
            stats.drop(lines, nbytes)
            stats.problems.extend(problems)
            if exc is not None:
                raise exc
            if chunk is None:
                return
            yield chunk
    finally:
        stop.set()
        while helper.is_alive():  # unblock a helper waiting to put
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        helper.join()


def _text_chunks(data: bytes | PlainFile, stats: _Stats, slabs: Slabs | None = None) -> Iterable[tuple[list[_Piece], bool, bool]]:
    """Yield (text, damaged_after, cut) chunks of decoded text of about ``_CHUNK_BYTES``,
    each a list of pieces of the decoder's output (in ``slabs`` when given; never copied
    here).

    Chunks end on a newline except the last one before a damage point (then
    ``damaged_after`` is True and its tail is a partial line) or at the end of input.
    ``cut`` is True for a chunk ended because it reached the size (more may follow).
    A line longer than :data:`_MAX_LINE_BYTES` (no trace event is; a file of NUL bytes or
    other garbage has one) is dropped and counted as it streams by, never held: memory
    stays bounded by the chunk size, whatever the file holds.
    """
    pending: list[_Piece] = []
    size = 0
    skipping = False  # inside an over-long line: drop until its newline
    for buf, lo, hi, damage in _decoded_spans(data, stats, slabs):
        if skipping and hi > lo:
            k = buf.find(b"\n", lo, hi)
            stats.drop(0, (hi if k < 0 else k + 1) - lo)
            if k < 0:
                if damage:
                    skipping = False
                continue
            skipping, lo = False, k + 1
        if hi > lo:
            if pending and pending[-1][0] is buf and pending[-1][2] == lo:  # continues in a slab
                pending[-1] = (buf, pending[-1][1], hi)
            else:
                pending.append((buf, lo, hi))
            size += hi - lo
        if damage:
            if pending:
                if slabs is not None:
                    slabs.seal([])
                yield pending, True, False
            pending, size = [], 0
        elif size >= _CHUNK_BYTES:
            # cut after the last newline, found from the end
            j, k = len(pending) - 1, -1
            while j >= 0 and (k := pending[j][0].rfind(b"\n", pending[j][1], pending[j][2])) < 0:
                j -= 1
            if j >= 0:
                b, lo, hi = pending[j]
                chunk = [*pending[:j], (b, lo, k + 1)]
                pending = [x for x in [(b, k + 1, hi), *pending[j + 1:]] if x[2] > x[1]]
                size = sum(x[2] - x[1] for x in pending)
                if slabs is not None:
                    slabs.seal(pending)  # (before the chunk goes: its parser may release it at once)
                yield chunk, False, True
                del chunk
            if size > _MAX_LINE_BYTES:  # what is left is one unfinished line, already too long
                stats.drop(1, size)
                stats.problems.append(f"dropped a line longer than {_MAX_LINE_BYTES >> 20} MiB (no trace event is; "
                                      f"garbage such as NUL bytes)")
                pending, size, skipping = [], 0, True
    if pending:
        if slabs is not None:
            slabs.seal([])
        yield pending, False, False


# =======================================================================================
# Parsing a batch of complete lines (of one or more files)


@dataclass
class _Segment:
    """Complete lines of one file in a batch: where they are (``src``, first line ``seq0``,
    ``nlines`` lines, blank ones included), their text, and their file's stats."""

    src: int
    seq0: int
    text: bytes
    nlines: int
    stats: _Stats
    lossy: bool = False  # tokenised with invalid UTF-8 replaced


#: A text of the native batch: (src, seq0, text, stats, lines, valid UTF-8).
_Seg = tuple[int, int, "bytes | mmap.mmap | memoryview", _Stats, int, bool]

#: Segments at least this long are tokenised on their own when added (their line count
#: comes from the tokenizer); shorter ones are counted and tokenised together at flush.
_ALONE_BYTES = 1 << 20


class _Batch:
    """Accumulates segments of complete lines; :meth:`flush` parses them together."""

    def __init__(self) -> None:
        self.segments: list[_Segment] = []
        self.toks: list[pl.DataFrame] = []
        self.nbytes = 0
        self.events: list[pl.DataFrame] = []
        self.meta: list[pl.DataFrame] = []

    def add(self, src: int, seq0: int, text: bytes, stats: _Stats) -> int:
        """Add ``text`` (complete lines of file ``src`` from line ``seq0``); returns its lines."""
        text = _blank_garbage(text, stats)
        idx = len(self.segments)
        self.nbytes += len(text)
        if len(text) < _ALONE_BYTES:
            n = text.count(b"\n") + (0 if text.endswith(b"\n") else 1)
            self.segments.append(_Segment(src, seq0, text, n, stats))
            return n
        tok, lossy = _tokenize(text)
        self.segments.append(_Segment(src, seq0, text, tok.height, stats, lossy))
        self.toks.append(_located(tok, [idx], [src], [seq0], [tok.height]))
        return tok.height

    def add_pieces(self, src: int, seq0: int, text: list[_Piece], stats: _Stats) -> int:
        """:meth:`add` of the text of pieces ``text``."""
        return self.add(src, seq0, _joined(text), stats)

    def flush(self) -> None:
        if not self.segments:
            return
        segments, toks = self.segments, self.toks
        self.segments, self.toks, self.nbytes = [], [], 0
        toks += _tokenize_together(segments, [i for i, seg in enumerate(segments)
                                              if len(seg.text) < _ALONE_BYTES])
        ev, me = _parse_segments(segments, pl.concat(toks) if len(toks) > 1 else toks[0])
        self.events.extend(ev)
        self.meta.extend(me)


#: First bytes of a line that may be a trace record: ``{`` (an event or metadata record),
#: ``[`` / ``]`` (DFTracer 1.x's array brackets), or blanks before one of them.
_RECORD_FIRST = np.frombuffer(b"{[] \t\r", dtype=np.uint8)


def _blank_garbage(text: bytes, stats: _Stats) -> bytes:
    """``text`` with every line that cannot be a trace record blanked (its newline kept, so
    line numbers hold), dropped and counted: a line whose first byte is none of
    :data:`_RECORD_FIRST`, or that holds a NUL byte (JSON text never does).

    Garbage (random bytes, a binary file named ``.pfw``) then costs one vectorised pass
    instead of the tokenizer and a JSON bisection per line: time and memory stay bounded by
    the chunk size. Well-formed text is returned as is.
    """
    arr = np.frombuffer(text, dtype=np.uint8)
    if not len(arr):
        return text
    nl = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(arr)]))  # exclusive; the newline itself (if any) is at ends
    if starts[-1] == len(arr):  # no line after a final newline
        starts, ends = starts[:-1], ends[:-1]
    filled = ends > starts
    bad = filled & ~np.isin(arr[np.minimum(starts, len(arr) - 1)], _RECORD_FIRST)
    nuls = np.flatnonzero(arr == 0)
    if len(nuls):
        bad[np.searchsorted(starts, nuls, side="right") - 1] = True
    bad &= filled
    if not bad.any():
        return text
    lo, hi = starts[bad], ends[bad]
    stats.lines += int(bad.sum())
    _drop_malformed(stats, int(bad.sum()), int((hi - lo).sum() + np.count_nonzero(hi < len(arr))))
    edge = np.zeros(len(arr) + 1, dtype=np.int8)
    edge[lo] += 1
    edge[hi] -= 1
    return arr[np.cumsum(edge[:-1], dtype=np.int8) == 0].tobytes()


# ---------------------------------------------------------------------------------------
# Native scanner (C extension ``_pfwscan``): strict DFTracer lines straight into columns


_NATIVE: Any
try:  # optional: built by setup.py when a C compiler is available
    _NATIVE = importlib.import_module("._pfwscan", __package__)
except ImportError:  # pragma: no cover - depends on the build
    _NATIVE = None

if _NATIVE is not None:
    # polars imports numpy lazily, on first use, through a proxy that is not thread-safe
    # (two loader threads building their first frame from numpy arrays at once raised
    # "TypeError: 'module' object does not support item assignment"): resolve it now.
    pl.DataFrame({"x": np.zeros(1, dtype=np.int64)})

#: Environment variable selecting the parser: ``python`` forces the Python/polars path.
PARSER_ENV = "DLREPLAY_PARSER"
#: Raw columns of the scanner's int and string fields, in the order of its C enums.
_NATIVE_INTS = ("pid", "tid", "ts", "dur", "ret", "count", "isize", "aoffset", "whence", "flags", "ppid",
                "epoch", "step", "batch_size", "image_idx", "abytes", "cpu_time", "cpu_threads", "tensors")
_NATIVE_STRS = ("name", "cat", "ph", "hhash", "fhash", "mode", "cwd", "a_name", "a_value", "path", "fname")


def native_parser_available() -> bool:
    """True when the C scanner is built and not disabled by ``DLREPLAY_PARSER=python``."""
    return _NATIVE is not None and os.environ.get(PARSER_ENV, "").strip().lower() != "python"


def _new_batch() -> _Batch | _NativeBatch:
    return _NativeBatch() if native_parser_available() else _Batch()


class _NativeBatch:
    """:class:`_Batch` with the C scanner: at the flush, all texts are scanned in one call
    (without the GIL, where they lie: no copy) into raw columns; the lines
    the scanner does not accept go to an inner :class:`_Batch`, the Python path, and when
    any text of the batch is not UTF-8 the whole batch does (the Python path decodes it
    lossily and groups lines across the batch's texts, as before). Flush points are those
    of :class:`_Batch`, so what is salvaged and counted, and in which order problems are
    reported, stays the same."""

    def __init__(self) -> None:
        self.nbytes = 0
        self.events: list[pl.DataFrame] = []
        self.meta: list[pl.DataFrame | _MetaRows] = []
        self.rest = _Batch()
        #: texts waiting for the flush, one list per added text, of its line segments:
        #: (src, seq0, text, stats, lines, valid UTF-8)
        self.pending: list[list[_Seg]] = []
        #: (src, line number in the inner batch's text, line number in the file) of rejected lines
        self.remap: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.buffers = _ScanBuffers()

    def add_pieces(self, src: int, seq0: int, text: list[_Piece], stats: _Stats) -> int:
        """Add the text of pieces ``text`` (complete lines of file ``src`` from line ``seq0``);
        returns its lines. They are scanned where they lie (only a line spanning two
        pieces is copied)."""
        assert _NATIVE is not None
        segs: list[_Seg] = []
        n = 0
        for seg in _line_segments(text):
            newlines, valid = _NATIVE.text_info(seg)  # one C pass: lines and the UTF-8 check
            k = newlines + (0 if seg[-1] == 10 else 1)  # 10: "\n"
            segs.append((src, seq0 + n, seg, stats, k, valid))
            n += k
            self.nbytes += len(seg)
        if segs:
            self.pending.append(segs)
        return n

    def _scan(self, segs: list[_Seg]) -> None:
        """Scan the texts of ``segs`` in one scanner call (their lines numbered on across them)."""
        counts = np.fromiter((seg[4] for seg in segs), dtype=np.int64, count=len(segs))
        first = np.cumsum(counts) - counts  # first line of each segment in the scanned text
        scanned = _scan([seg[2] for seg in segs], int(counts.sum()), first,
                        np.fromiter((seg[0] for seg in segs), dtype=np.uint32, count=len(segs)),
                        np.fromiter((seg[1] for seg in segs), dtype=np.int64, count=len(segs)), checked=True,
                        compact=True, buffers=self.buffers, defer_meta=True)
        if scanned is None:
            raise AssertionError("the scanner refused text its own UTF-8 check accepted")
        events, meta, per_seg, rejected = scanned
        for seg, k in zip(segs, per_seg.tolist(), strict=True):
            seg[3].lines += k
        if events is not None:  # compacted already (rows, starts, hosts, problems)
            self.events.append(events)
        if meta.height:
            self.meta.append(meta)
        if not len(rejected):
            return
        owner = np.searchsorted(first, rejected[:, 0], side="right") - 1
        for i in np.unique(owner).tolist():
            src, seq0, text, stats, _, _ = segs[i]
            mine = rejected[owner == i]  # (line, start, end in the segment's own text)
            sub = b"\n".join([text[a:b] for a, b in mine[:, 1:].tolist()]) + b"\n"
            self.rest.add(src, seq0, sub, stats)
            self.remap.append((src, seq0 + np.arange(len(mine), dtype=np.int64), seq0 + mine[:, 0] - first[i]))

    def flush(self) -> None:
        added, self.pending = self.pending, []
        if not all(seg[5] for segs in added for seg in segs):
            for segs in added:  # as added: the Python path sees the texts it saw without this batch
                src, seq0, _, stats, _, _ = segs[0]
                self.rest.add(src, seq0, b"".join([seg[2] for seg in segs]), stats)
            added = []
        segs = [seg for segs in added for seg in segs]
        if segs:  # all texts in one call, where they lie (no copy)
            self._scan(segs)
        self.nbytes = 0
        self.rest.flush()
        if not (self.rest.events or self.rest.meta):
            self.remap = []
            return
        if self.remap:
            where = pl.DataFrame({
                "src": np.concatenate([np.full(len(a), s, dtype=np.uint32) for s, a, _ in self.remap]),
                "seq": np.concatenate([a for _, a, _ in self.remap]),
                "__real": np.concatenate([b for _, _, b in self.remap]),
            })
            cols = list(RAW_SCHEMA)

            def fix(df: pl.DataFrame) -> pl.DataFrame:
                return df.join(where, on=["src", "seq"], how="left").with_columns(
                    pl.coalesce("__real", "seq").alias("seq")).select(cols)

            self.rest.events = [fix(df) for df in self.rest.events]
            self.rest.meta = [fix(df) for df in self.rest.meta]
        self.events.extend(self.rest.events)
        self.meta.extend(self.rest.meta)
        self.rest.events, self.rest.meta, self.remap = [], [], []


class _ScanBuffers:
    """The C scanner's output buffers, kept by one :class:`_NativeBatch` for all its scans.

    Nothing built from a scan views them (:func:`_native_frame` and
    :func:`_native_compact` copy what they keep; the scanner writes each row's masks and
    string codes, and the integers its mask marks, which are the only ones read), so the
    next scan can overwrite them. A fresh mapping per scan had the kernel zero ~13 MB of
    huge pages for every 16 MiB batch (4-10 % of the parse's CPU time on a VM); the batch,
    and so the buffers, go with the parse job, before the rows are resolved.
    """

    def __init__(self) -> None:
        self._buf: mmap.mmap | None = None

    def get(self, nbytes: int) -> mmap.mmap:
        """A mapping of at least ``nbytes`` bytes (the kept one when it is large enough)."""
        if self._buf is None or len(self._buf) < nbytes:
            self._buf = None  # (the old one goes first)
            self._buf = anonymous_map(nbytes)
        return self._buf


def _scan(text: bytes | memoryview | list[Any], nlines: int, first: np.ndarray, srcs: np.ndarray,
          seq0s: np.ndarray, checked: bool = False, compact: bool = False,
          buffers: _ScanBuffers | None = None, defer_meta: bool = False
          ) -> tuple[Any, pl.DataFrame | _MetaRows, np.ndarray, np.ndarray] | None:
    """Scan ``text`` (one buffer, or a list of buffers of complete lines scanned as one text;
    segment k: lines from ``first[k]``, of file ``srcs[k]`` from its line ``seq0s[k]``) with
    the C scanner: (event rows, metadata rows, accepted lines per segment, rejected lines as
    rows of (line in the whole text, start, end in the line's own buffer)); None when
    ``text`` is not valid UTF-8 (not checked again when ``checked``: the caller found it valid).
    With ``compact``, the event rows come compacted (:func:`_native_compact`; None when none).
    ``buffers``: where the scanner writes (reused from scan to scan; else a new mapping).
    ``defer_meta``: the metadata rows come as :class:`_MetaRows` (made a frame per part)."""
    cap = max(nlines, 1)
    ni, ns = len(_NATIVE_INTS), len(_NATIVE_STRS)
    # The output buffers are one anonymous mapping (large short-lived malloc'd buffers
    # would raise glibc's mmap threshold and fragment the heap across loads: peak RSS grew
    # ~15% per repeated load), unmapped when the last array viewing it goes.
    need = cap * (ni * 8 + 4 + ns * 4 + 8)
    scratch = buffers.get(need) if buffers is not None else anonymous_map(need)
    ints = np.frombuffer(scratch, dtype=np.int64, count=ni * cap).reshape(ni, cap)
    imask = np.frombuffer(scratch, dtype=np.uint32, count=cap, offset=ni * cap * 8)
    strs = np.frombuffer(scratch, dtype=np.int32, count=ns * cap, offset=ni * cap * 8 + cap * 4).reshape(ns, cap)
    rows = np.frombuffer(scratch, dtype=np.int64, count=cap, offset=ni * cap * 8 + cap * 4 + ns * cap * 4)
    assert _NATIVE is not None
    out = _NATIVE.scan(text, ints, imask, strs, rows, checked)
    if out is None:
        return None
    nev, nmeta, rejected, uniques, any_mask, fields = out
    rej = np.frombuffer(rejected, dtype=np.int64).reshape(-1, 3)
    values = pl.Series(uniques, dtype=_STR)
    # what the compaction needs of a string, for the strings that were a name, category or
    # mode (most strings are file hashes and paths)
    op_of = np.zeros(len(uniques), dtype=np.int8)
    sflag = np.zeros(len(uniques), dtype=np.uint8)
    for k in np.flatnonzero(np.frombuffer(fields, dtype=np.uint16) & _FLAGGED_FIELDS).tolist():
        u = uniques[k]
        op_of[k] = _OP_CODE.get(u, 0)
        sflag[k] = (_SFLAG.get(u, 0) | (_SF_MODE_A if u[:1] == "a" else 0)
                    | (_SF_MODE_R if u[:1] == "r" and "+" not in u else 0) | (_SF_WRITE if u in _WRITE_NAMES else 0))
    # events are rows [0, nev), metadata records rows [cap - nmeta, cap)
    frames: list[Any] = []
    per_seg = np.zeros(len(first), dtype=np.int64)
    # segments that continue each other (one file's decoder outputs, in order: the usual
    # batch) number their lines as one text does: no per-row segment lookup (a binary
    # search and two gathers per row, under the GIL); their accepted lines are counted on
    # the first one (the file's count is the same)
    along = len(first) == 1 or (bool((srcs == srcs[0]).all()) and bool((seq0s - first == seq0s[0] - first[0]).all()))
    for sl in (slice(0, nev), slice(cap - nmeta, cap)):
        lines = rows[sl]
        if along:
            src: int | np.ndarray = int(srcs[0])
            seq = lines + (seq0s[0] - first[0])
            per_seg[0] += len(lines)
        else:
            seg = np.searchsorted(first, lines, side="right") - 1
            src, seq = srcs[seg], seq0s[seg] + (lines - first[seg])
            per_seg += np.bincount(seg, minlength=len(first))
        if not frames and compact:  # events
            frames.append(_native_compact(sl, ints, imask, strs, values, uniques, op_of, sflag, src, seq)
                          if sl.stop > sl.start else None)
        elif defer_meta:
            frames.append(_MetaRows(sl, ints, imask, strs, values, op_of, any_mask, src, seq))
        else:
            frames.append(_native_frame(sl, ints, imask, strs, values, op_of, any_mask, src, seq,
                                        categorical=not frames))
    return frames[0], frames[1], per_seg, rej


class _MetaRows:
    """A batch's metadata rows as the scanner wrote them (copied out of its buffers, which
    the next scan overwrites), made into frames together (:func:`_meta_frame`): a part's
    batches hold a few thousand metadata rows, and a frame per batch cost ~2 ms of polars
    expressions built in Python, under the GIL, each (9 files on 2 cores: 22 ms a load of
    the parse threads' GIL time)."""

    __slots__ = ("ints", "imask", "strs", "values", "op_of", "any_mask", "src", "seq")

    def __init__(self, sl: slice, ints: np.ndarray, imask: np.ndarray, strs: np.ndarray, values: pl.Series,
                 op_of: np.ndarray, any_mask: int, src: int | np.ndarray, seq: np.ndarray) -> None:
        n = sl.stop - sl.start
        self.ints, self.imask, self.strs = ints[:, sl].copy(), imask[sl].copy(), strs[:, sl].copy()
        self.values, self.op_of, self.any_mask = values, op_of, any_mask
        self.src = src.astype(np.uint32) if isinstance(src, np.ndarray) else np.full(n, src, dtype=np.uint32)
        self.seq = seq

    @property
    def height(self) -> int:
        return len(self.imask)


def _meta_frame(rows: Sequence[_MetaRows]) -> pl.DataFrame:
    """The RAW_SCHEMA frame of the metadata rows ``rows``, in their order (each batch's
    string codes moved past the strings of the batches before it)."""
    offsets = np.cumsum([0] + [r.values.len() for r in rows[:-1]])
    strs = np.concatenate([np.where(r.strs >= 0, r.strs + off, -1) for r, off in zip(rows, offsets, strict=True)],
                          axis=1).astype(np.int32)
    src = np.concatenate([r.src for r in rows])
    any_mask = 0
    for r in rows:
        any_mask |= r.any_mask
    return _native_frame(slice(0, len(src)), np.concatenate([r.ints for r in rows], axis=1),
                         np.concatenate([r.imask for r in rows]), strs,
                         pl.concat([r.values for r in rows]).rechunk(), np.concatenate([r.op_of for r in rows]),
                         any_mask, int(src[0]) if len(src) and (src == src[0]).all() else src,
                         np.concatenate([r.seq for r in rows]))


def _meta_frames(meta: list[pl.DataFrame | _MetaRows]) -> list[pl.DataFrame]:
    """``meta`` as frames: the :class:`_MetaRows` among them as one."""
    rows = [m for m in meta if isinstance(m, _MetaRows)]
    return [m for m in meta if isinstance(m, pl.DataFrame)] + ([_meta_frame(rows)] if rows else [])


def _native_frame(sl: slice, ints: np.ndarray, imask: np.ndarray, strs: np.ndarray, values: pl.Series,
                  op_of: np.ndarray, any_mask: int, src: int | np.ndarray, seq: np.ndarray,
                  categorical: bool = False) -> pl.DataFrame:
    """The RAW_SCHEMA frame of the scanner's output rows ``sl`` (of file ``src``, a constant
    or one per row, lines ``seq``); with ``categorical``, its string columns are
    Categorical (gathered by the scanner's codes: no string is hashed per row). The frame
    never views the scanner's buffers, which are freed once it is built."""
    if sl.stop <= sl.start:
        return pl.DataFrame(schema=RAW_SCHEMA)
    mask = imask[sl]
    all_mask = int(np.bitwise_and.reduce(mask))
    data: dict[str, np.ndarray] = {"__m": mask}
    exprs: dict[str, pl.Expr] = {}
    for k, col in enumerate(_NATIVE_INTS):
        bit = 1 << k
        if not any_mask & bit:
            exprs[col] = pl.lit(None, dtype=_INT)
            continue
        # a copy: a column passed through, or masked (polars' when/then keeps the values
        # buffer and adds a validity mask), would view, and keep alive, all the buffers
        data[col] = ints[k, sl].copy()
        exprs[col] = pl.col(col) if all_mask & bit else pl.when((pl.col("__m") & bit) != 0).then(pl.col(col))
    if categorical:
        values = values.cast(pl.Categorical)
    for k, col in enumerate(_NATIVE_STRS):
        codes = strs[k, sl]
        lo, hi = int(codes.min()), int(codes.max())
        dtype = pl.Categorical() if categorical else RAW_SCHEMA[col]
        if hi < 0:
            exprs[col] = pl.lit(None, dtype=dtype)
        elif lo == hi:  # one value (cat, ph, host hash of a file): a constant
            exprs[col] = pl.lit(values[lo], dtype=dtype)
        else:
            data[col] = codes
            exprs[col] = pl.lit(values if dtype == values.dtype else values.cast(dtype)).gather(
                pl.when(pl.col(col) >= 0).then(pl.col(col)) if lo < 0 else pl.col(col))
    name = strs[_NATIVE_STRS.index("name"), sl]
    data["op"] = np.where(name >= 0, op_of[np.maximum(name, 0)], 0).astype(np.int8) if len(op_of) \
        else np.zeros(len(name), dtype=np.int8)
    data["seq"] = seq
    if isinstance(src, np.ndarray):
        data["src"] = src
    return pl.DataFrame(data).select(
        pl.col("src") if isinstance(src, np.ndarray) else pl.lit(src, dtype=_SRC).alias("src"), "seq",
        *(exprs[c].alias(c) for c in RAW_SCHEMA if c not in ("src", "seq", "op")), "op",
    )


def _located(tok: pl.DataFrame, idx: list[int], src: list[int], seq0: list[int],
             nlines: list[int]) -> pl.DataFrame:
    """Tokens of consecutive segments (``nlines`` rows each) with their ``src``, ``seq``
    (line number in the file) and ``__seg`` (segment index in the batch)."""
    if len(idx) == 1:
        return tok.with_columns(
            pl.lit(src[0], dtype=_SRC).alias("src"),
            pl.int_range(seq0[0], seq0[0] + tok.height, dtype=pl.Int64).alias("seq"),
            pl.lit(idx[0], dtype=pl.UInt32).alias("__seg"),
        )
    counts = np.asarray(nlines, dtype=np.int64)
    first = np.cumsum(counts) - counts  # first row of each segment
    shift = np.repeat(np.asarray(seq0, dtype=np.int64) - first, counts)
    return tok.with_columns(
        pl.Series("src", np.repeat(np.asarray(src, dtype=np.uint32), counts)),
        pl.Series("seq", np.arange(tok.height, dtype=np.int64) + shift),
        pl.Series("__seg", np.repeat(np.asarray(idx, dtype=np.uint32), counts)),
    )


def _tokenize_together(segments: list[_Segment], which: list[int]) -> list[pl.DataFrame]:
    """Tokens of the segments ``which``: one tokenizer call over their joined text when
    that reads cleanly and yields exactly their counted lines, else one call each."""
    if not which:
        return []
    if len(which) > 1:
        text = b"".join(segments[i].text if segments[i].text.endswith(b"\n") else segments[i].text + b"\n"
                        for i in which)
        tok, lossy = _tokenize(text)
        if not lossy and tok.height == sum(segments[i].nlines for i in which):
            return [_located(tok, which, [segments[i].src for i in which], [segments[i].seq0 for i in which],
                             [segments[i].nlines for i in which])]
    out = []
    for i in which:
        seg = segments[i]
        tok, seg.lossy = _tokenize(seg.text)  # rows == counted lines: both split on "\n" only
        out.append(_located(tok, [i], [seg.src], [seg.seq0], [tok.height]))
    return out


def _tokenize(text: bytes) -> tuple[pl.DataFrame, bool]:
    """One row per line (blank lines included), one String column per ``,``-separated token.

    Returns (tokens, lossy): invalid UTF-8 (corrupt data) is replaced, and then ``lossy``
    tells the fallback to take lines from the original bytes.
    """
    def read(encoding: Literal["utf8", "utf8-lossy"]) -> pl.DataFrame:
        return pl.read_csv(
            text, has_header=False, separator=",", quote_char=None, truncate_ragged_lines=True,
            missing_columns="insert", extra_columns="ignore", schema=_TOKEN_SCHEMA, raise_if_empty=False,
            encoding=encoding,
        )

    try:
        return read("utf8"), False
    except pl.exceptions.PolarsError:
        pass
    try:
        return read("utf8-lossy"), True
    except pl.exceptions.PolarsError:  # unreadable as text: every line goes to the JSON path
        lines = text.split(b"\n")
        if text.endswith(b"\n"):  # like the CSV reader: no row after the last newline
            lines.pop()
        return pl.DataFrame({"c0": ["?" if ln.strip() else None for ln in lines]}).with_columns(
            [pl.lit(None, dtype=pl.String).alias(c) for c in list(_TOKEN_SCHEMA)[1:]]), True


def _parse_segments(segments: list[_Segment], tok: pl.DataFrame) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Parse the tokens ``tok`` of ``segments`` together: (event frames, metadata frames).

    Counts each file's lines and its dropped lines into that file's stats.
    """
    # tokens fill columns from the left: the count is the number of non-null columns
    ntok = pl.fold(pl.lit(0, dtype=pl.Int32), lambda acc, x: acc + x,
                   [pl.col(c).is_not_null().cast(pl.Int32) for c in _TOKEN_SCHEMA])
    tok = tok.with_columns(ntok.alias("ntok"))
    stats = {s.src: s.stats for s in segments}
    queries: list[pl.LazyFrame] = []
    kinds: list[bool] = []
    fallback: list[pl.DataFrame] = []
    for part in tok.partition_by("c1", "c2", "ntok", maintain_order=False):
        ntoks = part["ntok"][0]
        if ntoks == 0:  # blank lines are not lines
            continue
        if ntoks == 1:  # nor are the bare "[" / "]" lines of the DFTracer 1.x array form
            part = part.filter(~pl.col("c0").str.strip_chars().is_in(["[", "]"]))
            if not part.height:
                continue
        if len(stats) == 1:
            next(iter(stats.values())).lines += part.height
        else:
            for src, n in part.group_by("src").len().iter_rows():
                stats[src].lines += n
        sample = part.row(0, named=True)
        layout = _parse_layout(sample) if part.height >= _MIN_GROUP else None
        if layout is None:
            fallback.append(part)
            continue
        query, is_meta = _layout_query(part.lazy(), layout, sample)
        queries.append(query)
        kinds.append(is_meta)
    events: list[pl.DataFrame] = []
    meta: list[pl.DataFrame] = []
    bad: list[pl.DataFrame] = []
    for df, is_meta in zip(pl.collect_all(queries) if queries else [], kinds, strict=True):
        good = df["__ok"]
        if not good.all():
            bad.append(df.filter(~good).select("src", "seq"))
            df = df.filter(good)
        (meta if is_meta else events).append(df.drop("__ok"))
    if bad:
        fallback.append(tok.join(pl.concat(bad), on=["src", "seq"], how="semi"))
    if fallback:
        rows = pl.concat(fallback)
        if rows.height:
            df = _parse_fallback(segments, rows)
            meta_rows = pl.col("ph").is_in(_META_PH).fill_null(False)
            events.append(df.filter(~meta_rows))
            meta.append(df.filter(meta_rows))
    return events, meta


# ---------------------------------------------------------------------------------------
# Layouts


@dataclass(frozen=True)
class _Tok:
    """One token of a layout: ``prefix`` (text up to the value), key path, value form."""

    slot: int
    path: tuple[str, ...]
    prefix: str
    quoted: bool
    suffix: str  # closing braces after the value


def _parse_layout(row: dict) -> list[_Tok] | None:
    """Parse one sample row's tokens into a layout, or None if it needs the JSON path."""
    n = row["ntok"]
    if n >= _NTOK:  # may have been cut by the tokenizer
        return None
    tokens = [row[f"c{i}"] for i in range(n)]
    if any(t is None for t in tokens) or not tokens[0].startswith("{"):
        return None
    stack: list[str] = []
    out: list[_Tok] = []
    for j, tok in enumerate(tokens):
        parsed = _parse_token(tok, 1 if j == 0 else 0, stack)
        if parsed is None:
            return None
        path, pos = parsed
        value = tok[pos:]
        closers = len(value) - len(value.rstrip("}"))
        core = value[:len(value) - closers]
        quoted = core.startswith('"')
        if quoted:
            if len(core) < 2 or not core.endswith('"') or '"' in core[1:-1] or "\\" in core:
                return None
        elif not _SCALAR_RE.fullmatch(core):
            return None
        out.append(_Tok(j, path, tok[:pos], quoted, "}" * closers))
        depth_after = len(stack) - closers  # the top-level object is not on the stack
        if depth_after < -1 or (depth_after == -1 and j != n - 1):
            return None
        del stack[max(depth_after, 0):]
        if depth_after == -1:
            return out
    return None  # the line never closed its top-level object


def _parse_token(tok: str, pos: int, stack: list[str]) -> tuple[tuple[str, ...], int] | None:
    """Parse ``"key":`` (and nested ``"key":{"key2":``) from ``pos``: (key path, value start)."""
    while True:
        if not tok.startswith('"', pos):
            return None
        end = tok.find('"', pos + 1)
        if end < 0 or tok[end + 1:end + 2] != ":":
            return None
        key = tok[pos + 1:end]
        if "\\" in key:
            return None
        pos = end + 2
        if tok.startswith("{", pos):
            stack.append(key)
            pos += 1
            continue
        return (*stack, key), pos


def _field_of(path: tuple[str, ...]) -> tuple[str, pl.DataType, bool] | None:
    """Raw column, dtype and 'ints may be quoted' for a key path; None if the key is not kept."""
    if len(path) == 1 and path[0] in _TOP_FIELDS:
        return path[0], _TOP_FIELDS[path[0]], False
    if len(path) == 2 and path[0] == "args" and path[1] in _ARG_FIELDS:
        col, dt = _ARG_FIELDS[path[1]]
        return col, dt, path[1] in _LOOSE_INT_ARGS
    return None


#: Built extraction expressions per (layout, constant tokens); building them costs more
#: Python time than a small group's query. Bounded: cleared when it grows large.
_QUERY_CACHE: dict[tuple, tuple[list[pl.Expr], list[str], pl.Expr, bool]] = {}


def _layout_query(rows: pl.LazyFrame, layout: list[_Tok], sample: dict) -> tuple[pl.LazyFrame, bool]:
    """(query, is-metadata) extracting the rows of one layout group (see :func:`_layout_exprs`)."""
    # everything _layout_exprs reads from the sample: the constant tokens, name, cat, ph
    key = (tuple(layout), sample.get("c1"), sample.get("c2"),
           *(sample[f"c{t.slot}"] for t in layout if t.path in (("name",), ("cat",), ("ph",))))
    built = _QUERY_CACHE.get(key)
    if built is None:
        if len(_QUERY_CACHE) > 4096:
            _QUERY_CACHE.clear()
        built = _QUERY_CACHE[key] = _layout_exprs(layout, sample)
    exprs, names, ok, is_meta = built
    # the raw columns in RAW_SCHEMA order (absent ones null) and the row check
    return rows.with_columns(exprs).select(
        *(pl.col(c).cast(dt) if c in names else pl.lit(None, dtype=dt).alias(c) for c, dt in RAW_SCHEMA.items()),
        ok,
    ), is_meta


def _layout_exprs(layout: list[_Tok], sample: dict) -> tuple[list[pl.Expr], list[str], pl.Expr, bool]:
    """(value expressions, output columns, row check ``__ok``, is-metadata) for one layout group.

    Checked per row: the first token's prefix, the last token's closing braces, the key
    of every extracted argument, and that every extracted number parses. The name and
    category tokens are partition keys (identical in the group); ``ph`` is taken from the
    sample. Top-level keys are fixed by DFTracer's writer and not re-checked. Each value
    is computed once; the checks read the computed columns.
    """
    values = {t.path: _token_value(sample[f"c{t.slot}"], t) for t in layout}
    ph = values.get(("ph",))
    is_meta = ph in _META_PH
    checks: list[pl.Expr] = [pl.col("c0").str.starts_with(layout[0].prefix)]
    last = layout[-1]
    checks.append(pl.col(f"c{last.slot}").str.ends_with(('"' if last.quoted else "") + last.suffix))
    exprs: list[pl.Expr] = [pl.col("src"), pl.col("seq")]
    for t in layout:
        target = _field_of(t.path)
        if target is None:
            continue
        col, dt, loose = target
        c = pl.col(f"c{t.slot}")
        if t.slot in (1, 2) or col == "ph":  # constant over the group (ph is fixed per function)
            exprs.append(pl.lit(_convert_scalar(values[t.path], dt), dtype=dt).alias(col))
            continue
        if t.path[0] == "args" and t.slot != layout[0].slot:
            checks.append(c.str.starts_with(t.prefix))
        lead = len(t.prefix) + (1 if t.quoted else 0)
        trail = len(t.suffix) + (1 if t.quoted else 0)
        v = c.str.slice(lead, c.str.len_bytes() - (lead + trail)) if trail else c.str.slice(lead)
        if dt == _INT:
            if loose and not t.quoted:
                v = v.str.strip_chars('"')
            exprs.append(v.cast(pl.Int64, strict=False).alias(col))
            checks.append(pl.col(col).is_not_null())
        else:
            if col in _TEXT_ARGS:
                checks.append(~pl.col(col).str.contains("\\", literal=True).fill_null(False))
            exprs.append(v.alias(col) if t.quoted else pl.when(v != "null").then(v).alias(col))
    # the operation class: a constant when the name is (a partition key, else per row)
    name_tok = next((t for t in layout if t.path == ("name",)), None)
    if name_tok is not None and name_tok.slot in (1, 2):
        op = pl.lit(_OP_CODE.get(values[("name",)], 0), dtype=pl.Int8)
    elif name_tok is not None:  # (rare) recomputed from the name's value expression
        name_expr = next(e for e in exprs if e.meta.output_name() == "name")
        op = name_expr.replace_strict(_OP_CODE, default=0, return_dtype=pl.Int8)
    else:
        op = pl.lit(0, dtype=pl.Int8)
    exprs.append(op.alias("op"))
    names = [e.meta.output_name() for e in exprs]
    return exprs, names, pl.all_horizontal(checks).fill_null(False).alias("__ok"), is_meta


def _token_value(tok: str, t: _Tok) -> str:
    """Value text of one token (quotes and closing braces removed)."""
    v = tok[len(t.prefix):len(tok) - len(t.suffix)]
    return v[1:-1] if t.quoted else v


def _convert_scalar(raw: str | None, dt: pl.DataType):
    if raw is None or raw == "null":
        return None
    if dt == _INT:
        try:
            return int(raw)
        except ValueError:
            return None
    return raw


# ---------------------------------------------------------------------------------------
# JSON fallback


_JSON_SCHEMA = {
    **{k: pl.String() for k in _TOP_FIELDS},
    "args": pl.Struct({k: pl.String() for k in _ARG_FIELDS}),
}


def _fallback_lines(segments: list[_Segment], rows: pl.DataFrame) -> list[bytes]:
    """Exact line bytes of the given token rows (in the rows' order), cut out of their
    segment's text by line number (never re-joined from tokens: the tokenizer does not
    keep every byte of a line, e.g. blanks at its end)."""
    lines: list[bytes] = [b""] * rows.height
    for (seg_idx,), part in rows.with_row_index("__i").group_by("__seg"):
        seg = segments[cast(int, seg_idx)]
        found = _lines_at(seg.text, (part["seq"] - seg.seq0).to_list(), seg.nlines)
        for i, ln in zip(part["__i"].to_list(), found, strict=True):
            lines[i] = ln
    return lines


def _lines_at(text: bytes, rows: list[int], total: int) -> list[bytes]:
    """Lines number ``rows`` (0-based) of ``text`` (``total`` lines), without newline.

    Lines near either end (a trace's ``start`` and ``end`` records) are reached by
    stepping over a few newlines; otherwise one vectorised newline index is built.
    """
    out = []
    for r in rows:
        if r < 256:
            start = 0
            for _ in range(r):
                start = text.index(b"\n", start) + 1
        elif total - 1 - r < 256:
            # the tokenizer's last row is the text's last line (with or without newline)
            start = len(text) - (1 if text.endswith(b"\n") else 0)
            for _ in range(total - r):
                start = text.rindex(b"\n", 0, start)
            start += 1
        else:
            break
        end = text.find(b"\n", start)
        out.append(text[start:end if end >= 0 else len(text)])
    if len(out) == len(rows):
        return out
    nl = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(text)]))
    return [text[starts[r]:ends[r]] for r in rows]


def _parse_fallback(segments: list[_Segment], rows: pl.DataFrame) -> pl.DataFrame:
    """Parse the given token rows' lines with the JSON reader, dropping malformed ones.

    A dropped line is counted in the stats of its own file.
    """
    rows = rows.sort("src", "seq")
    lines = _fallback_lines(segments, rows)
    keys = list(zip(rows["src"].to_list(), rows["seq"].to_list(), strict=True))
    stats = {s.src: s.stats for s in segments}
    # the bytes a dropped line costs: as written, with its newline
    sizes = [len(ln) + 1 for ln in lines]
    # DFTracer 1.x lines may end with "," (elements of one JSON array)
    lines = [ln.rstrip().rstrip(b",") for ln in lines]
    frames: list[pl.DataFrame] = []
    for i in range(0, len(lines), _JSON_BATCH):
        sl = slice(i, i + _JSON_BATCH)
        frames.extend(_json_bisect(lines[sl], keys[sl], sizes[sl], stats))
    return _concat(frames)


def _drop_malformed(st: _Stats, lines: int, nbytes: int) -> None:
    if not st.dropped_lines or not any("malformed" in p for p in st.problems):
        st.problems.append("dropped malformed JSON line(s)")
    st.drop(lines, nbytes)


#: A parsed line is an event only with an integer ts and pid and a name (metadata records
#: need none of them); anything else ({}, "pid": true, a ts beyond Int64) is malformed.
def _is_record() -> pl.Expr:
    return pl.col("ph").is_in(_META_PH).fill_null(False) | (
        _cast_loose(pl.col("ts"), _INT).is_not_null() & _cast_loose(pl.col("pid"), _INT).is_not_null()
        & pl.col("name").is_not_null())


def _json_bisect(lines: list[bytes], keys: list[tuple[int, int]], sizes: list[int],
                 stats: dict[int, _Stats]) -> list[pl.DataFrame]:
    """Parse lines as NDJSON; on failure split in halves until the bad lines are isolated.

    ``keys`` are the lines' (src, seq), ``sizes`` their bytes as written (newline
    included), counted as dropped for a malformed line or a JSON object that is no event.
    """
    if not lines:
        return []
    try:
        df = pl.read_ndjson(b"\n".join(lines), schema=_JSON_SCHEMA)
    except Exception:  # noqa: BLE001 - polars raises several exception types for bad JSON
        df = None
    if df is not None and df.height == len(lines):
        ok = df.select(_is_record()).to_series()
        if not ok.all():
            for j in np.flatnonzero(~ok.to_numpy()):
                _drop_malformed(stats[keys[j][0]], 1, sizes[j])
            keep = np.flatnonzero(ok.to_numpy())
            df = df.filter(ok)
            keys = [keys[j] for j in keep]
            if not keys:
                return []
        return [_json_to_raw(df, keys)]
    if len(lines) == 1:
        if lines[0].strip():
            _drop_malformed(stats[keys[0][0]], 1, sizes[0])
        return []
    mid = len(lines) // 2
    return (_json_bisect(lines[:mid], keys[:mid], sizes[:mid], stats)
            + _json_bisect(lines[mid:], keys[mid:], sizes[mid:], stats))


def _json_to_raw(df: pl.DataFrame, keys: list[tuple[int, int]]) -> pl.DataFrame:
    """Cast the all-text JSON frame to RAW_SCHEMA."""
    srcs, seqs = zip(*keys, strict=True)
    exprs: list[pl.Expr] = [pl.lit(pl.Series("src", srcs, dtype=_SRC)),
                            pl.lit(pl.Series("seq", seqs, dtype=pl.Int64))]
    exprs += [_cast_loose(pl.col(k), dt).alias(k) for k, dt in _TOP_FIELDS.items()]
    exprs += [_cast_loose(pl.col("args").struct.field(k), dt).alias(col)
              for k, (col, dt) in _ARG_FIELDS.items()]
    exprs.append(pl.col("name").replace_strict(_OP_CODE, default=0, return_dtype=pl.Int8).alias("op"))
    return df.select(exprs)


def _cast_loose(e: pl.Expr, dt: pl.DataType) -> pl.Expr:
    """Cast a JSON value read as text: ints may be written as strings or floats."""
    if dt == _INT:
        text = e.str.strip_chars()
        return text.cast(pl.Int64, strict=False).fill_null(
            text.cast(pl.Float64, strict=False).cast(pl.Int64, strict=False)
        )
    return e


# =======================================================================================
# Stage 2: compact rows -> resolved parts (per file) -> the event table (across files)

_CAT = pl.Categorical()
_I32 = pl.Int32()
_I16 = pl.Int16()

#: Columns of a parsed batch's event rows as a part keeps them until its files are
#: resolved (:func:`_compact`): ``src``/``seq`` (file, line), the values of the event
#: table that one row gives (strings Categorical; ``size``/``size_requested`` in bytes,
#: fread/fwrite items times item size), and the inputs of the file-position model,
#: without nulls so that they reach the C pass uncopied: ``op`` (the class), ``pos``
#: (:data:`_POS_OK` ... flags) and ``parg`` (the one argument the class needs, or
#: :data:`_NUL`). ``__path`` is the ``path`` (else ``fname``) argument.
CHUNK_SCHEMA: dict[str, pl.DataType] = {
    "src": _SRC, "seq": _INT, "pid": _I32, "tid": _I32, "ts": _INT, "dur": _INT,
    "cat": _CAT, "name": _CAT, "fhash": _CAT, "ret": _INT, "size_requested": _INT, "size": _INT,
    "op": pl.Int8(), "pos": pl.UInt8(), "parg": _INT,
    "epoch": _I32, "step": _I32, "batch_size": _INT, "sample_index": _INT, "cpu_time": _I32, "cpu_threads": _I32,
    "tensors": _I16, "__path": _CAT,
}
#: Columns of a resolved part's events (:attr:`TracePart.events`), in order.
PART_SCHEMA: dict[str, pl.DataType] = {
    "pid": _I32, "tid": _I32, "ts": _INT, "dur": _INT, "cat": _CAT, "name": _CAT, "fhash": _CAT,
    "size_requested": _INT, "size": _INT, "offset": _INT, "ret": _INT, "epoch": _I32, "step": _I32,
    "batch_size": _INT, "sample_index": _INT, "cpu_time": _I32, "cpu_threads": _I32, "tensors": _I16,
    "__p": pl.UInt32(),
    "__path": _CAT,
}
#: A part's processes: one row per (``src``, ``pid``), indexed by the events' ``__p``.
PROCESS_SCHEMA: dict[str, pl.DataType] = {
    "src": _SRC, "pid": _I32, "ppid": _I32, "cwdhash": _STR, "host": _STR,
}
#: A part's start/stop marker records (:attr:`TracePart.markers`).
MARKER_SCHEMA: dict[str, pl.DataType] = {"src": _SRC, "seq": _INT, "pid": _INT, "tid": _INT, "name": _STR,
                                         "a_name": _STR, "a_value": _STR}
#: A part's per-process counts (:func:`_part_counts`).
COUNTS_SCHEMA: dict[str, pl.DataType] = {
    "fhash": _CAT, "__path": _CAT, "__p": pl.UInt32(), "cls": pl.Int64(), "item": pl.Boolean(), "n": pl.Int64(),
    "b": pl.Int64(),
}
FH_SCHEMA: dict[str, pl.DataType] = {"hash": _STR, "name": _STR, "src": _SRC, "seq": _INT, "pid": _I32}
_STARTS_SCHEMA: dict[str, pl.DataType] = {"src": _SRC, "seq": _INT, "pid": _I32, "ppid": _INT, "cwd": _STR,
                                          "hhash": _STR}
_HOSTS_SCHEMA: dict[str, pl.DataType] = {"src": _SRC, "pid": _I32, "seq": _INT, "hhash": _STR}
#: Integer fields kept as Int32 while loading (process and thread ids are C ``pid_t``): a value beyond
#: 32 bits reads as null, and the file's report says so.
_NARROW = ("pid", "ppid", "tid")
#: How a file's report names events kept with a value read as null (a loss the plain output names).
READ_AS_NULL = "(read as null)"
BEYOND_32_BITS = f"beyond 32 bits {READ_AS_NULL}"
#: The most bytes one call moves (``MAX_CALL_BYTES`` in ``_pfwscan.c``), 1 TiB: Linux moves
#: at most 2 GiB - 4 KiB in one read or write, and an fread/fwrite or one checkpoint save of
#: more would need a buffer beyond a node's memory. A byte count that is negative or larger
#: is damage, read as null and counted (:data:`ODD_BYTES`): summed, 8 M of them would pass
#: int64, and one of 2^63 - 1 made a trace's total read -8192 PiB.
_MAX_CALL_BYTES = 1 << 40
ODD_BYTES = f"negative or beyond 1 TiB in one call {READ_AS_NULL}"
#: Bit of the scanner's validity word set on a row with a byte count read as null.
_V_ODDBYTES = 1 << 15
#: The longest duration an event may have, either way, in µs: 2^45 µs, 407 days (no event
#: of a training job lasts a year). Beyond, ``dur`` reads as null and is counted
#: (:data:`ODD_DUR`): summed, such durations wrapped (two of 2^62 µs already).
_MAX_DUR_US = 1 << 45
ODD_DUR = f"beyond \u00b1407 days {READ_AS_NULL}"
#: The float nearest 2^63 below it: a time scaled to µs is clipped to it (then cast to Int64).
_F63 = float(2**63 - 1024)
#: A file's problem (not damage) when a pid of its processes also ran on another host and was
#: numbered anew (see :func:`_host_pids`).
RENUMBERED = "also ran on another host"
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I16_MAX = (1 << 15) - 1
_O_APPEND = 0o2000
_SEEK_SET, _SEEK_CUR = 0, 1
#: Flags of ``pos`` (as ``POS_*`` in ``_pfwscan.c``): the call succeeded (``ret`` null or
#: >= 0), whence SEEK_CUR, whence SEEK_SET, opened for appending (``O_APPEND`` or mode
#: "a"), an I/O call with a file hash (POSIX or STDIO), STDIO, opened read-only (flags
#: without write access, or mode "r" without "+"), a write call (write, pwrite, fwrite).
_POS_OK, _POS_CUR, _POS_SET, _POS_APPEND, _POS_IO, _POS_STDIO, _POS_RDONLY, _POS_WRITE = 1, 2, 4, 8, 16, 32, 64, 128
#: ``parg`` of a row without the argument its class needs.
_NUL = -(1 << 63)
#: Columns gathered together into output order (polars gathers the columns of one call in
#: parallel); each group's source columns are dropped before the next, so that the rows
#: are never held twice. 3: with the columns of one value constants (which a gather skips),
#: 2.5 % faster than 2 on the 9-file benchmark trace on 1 and 2 cores at the same peaks.
_GATHER_GROUP = 3
#: Bytes freed by a step of the merge above which the allocators' free pages are returned
#: (:func:`~dlreplay.allocator.release_free_memory`, a few ms) before the next step.
_RELEASE_BYTES = 32 << 20
#: Rows of a part below which its resolve returns nothing between its steps (they free
#: some 30 bytes a row: the sort key, the offsets' inputs, the dropped columns).
_RELEASE_ROWS = _RELEASE_BYTES // 32


def _item(col: Callable[[str], pl.Expr]) -> pl.Expr:
    """Bytes per item of a transfer: fread/fwrite's item size (else 1)."""
    return pl.when(col("op") == _SXFER).then(col("isize").fill_null(1)).otherwise(1)


def _call_bytes_ok(n: pl.Expr, item: pl.Expr | int) -> pl.Expr:
    """``n`` items of ``item`` bytes are a byte count one call can move: both non-negative,
    the product at most :data:`_MAX_CALL_BYTES` (``call_bytes`` in ``_pfwscan.c``)."""
    item = pl.lit(item, dtype=_INT) if isinstance(item, int) else item.cast(_INT)
    most = pl.lit(_MAX_CALL_BYTES, dtype=_INT) // item.clip(lower_bound=1)
    return (n >= 0) & (item >= 0) & ((item == 0) | (n <= most))


def _odd_bytes(col: Callable[[str], pl.Expr]) -> pl.Expr:
    """Rows whose byte count :func:`_compact_exprs` reads as null as damage (a count
    negative or beyond :data:`_MAX_CALL_BYTES`; a failed call's negative ``ret`` is none)."""
    ret, item, count = col("ret"), _item(col), col("count")
    xfer = ((ret >= 0) & ~_call_bytes_ok(ret, item)) | ~_call_bytes_ok(count, item)
    return (pl.when(col("op") >= _XFER).then(xfer)
            .when(col("cat") == CAT_CHECKPOINT).then(~_call_bytes_ok(col("abytes"), 1))).fill_null(False)


def _compact_exprs(col: Callable[[str], pl.Expr]) -> list[pl.Expr]:
    """The :data:`CHUNK_SCHEMA` columns of raw event rows whose :data:`RAW_SCHEMA` column
    ``c`` is ``col(c)`` (strings as String or Categorical): the values one row gives,
    ``size``/``size_requested`` (fread/fwrite: items x item size; checkpoints: their bytes),
    the file-position inputs ``pos`` and ``parg``, and the ``path`` (else ``fname``)
    argument. One definition for the Python path (a frame) and the scanner's (its buffers)."""
    op, ret = col("op"), col("ret")
    is_xfer = op >= _XFER
    item = _item(col)
    size = (
        pl.when(is_xfer).then(pl.when((ret >= 0) & _call_bytes_ok(ret, item)).then(ret * item))
        .when(col("cat") == CAT_CHECKPOINT).then(pl.when(_call_bytes_ok(col("abytes"), 1)).then(col("abytes")))
    )
    whence = col("whence")
    append = ((col("flags").fill_null(0) & _O_APPEND) != 0) \
        | col("mode").cast(_CAT).cat.starts_with("a").fill_null(False)
    mode = col("mode").cast(pl.String)
    rdonly = ((col("flags") & 3) == 0).fill_null(False) \
        | (mode.str.starts_with("r") & ~mode.str.contains("+", literal=True)).fill_null(False)

    def flag(cond: pl.Expr, bit: int) -> pl.Expr:
        return pl.when(cond.fill_null(False)).then(pl.lit(bit, dtype=pl.UInt8)).otherwise(pl.lit(0, dtype=pl.UInt8))

    pos = (flag(ret.is_null() | (ret >= 0), _POS_OK) | flag(whence == _SEEK_CUR, _POS_CUR)
           | flag(whence == _SEEK_SET, _POS_SET) | flag(append, _POS_APPEND)
           | flag(pl.any_horizontal(col("fhash").is_not_null(), col("path").is_not_null(), col("fname").is_not_null())
                  & col("cat").is_in(("POSIX", "STDIO")), _POS_IO)
           | flag(col("cat") == "STDIO", _POS_STDIO) | flag(rdonly, _POS_RDONLY)
           | flag(col("name").cast(pl.String).is_in(list(_WRITE_NAMES)), _POS_WRITE))
    parg = (
        pl.when(op.is_in((_LSEEK, _FTELL))).then(ret)
        .when(op.is_in((_FSEEK, _PXFER))).then(col("aoffset"))
        .when(op.is_in((_XFER, _SXFER))).then(size)
    )
    return [
        col("src").alias("src"), col("seq").alias("seq"), col("pid").cast(_I32, strict=False).alias("pid"),
        col("tid").cast(_I32, strict=False).alias("tid"), *(col(c).alias(c) for c in ("ts", "dur")),
        *(col(c).cast(_CAT).alias(c) for c in ("cat", "name", "fhash")), ret.alias("ret"),
        pl.when(is_xfer & _call_bytes_ok(col("count"), item)).then(col("count") * item).alias("size_requested"),
        size.alias("size"), op.alias("op"),
        pos.alias("pos"), parg.fill_null(_NUL).alias("parg"),
        # loop counters, 32-bit: a value beyond is no counter (null)
        *(pl.when(col(c).is_between(_I32_MIN, _I32_MAX)).then(col(c)).cast(_I32).alias(c)
          for c in ("epoch", "step")),
        col("batch_size").alias("batch_size"),  # 64-bit: summed to samples, which may pass 2^31
        col("image_idx").alias("sample_index"),
        # measured quantities, 32-bit: a value that is negative or beyond is no measurement (null)
        *(pl.when(col(c).is_between(lo, _I32_MAX)).then(col(c)).cast(_I32).alias(c)
          for c, lo in (("cpu_time", 0), ("cpu_threads", 1))),
        pl.when(col("tensors").is_between(0, _I16_MAX)).then(col("tensors")).cast(_I16).alias("tensors"),
        pl.coalesce(col("path"), col("fname")).cast(_CAT).alias("__path"),
    ]


def _starts_and_hosts(wide: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(starts, hosts) of compacted rows with ``__ppid``, ``__cwd`` and ``__hhash``: the
    processes' ``start`` records (ppid, working-directory hash, host hash), and the first
    host hash of each (``src``, ``pid``) by line."""
    starts = wide.filter((pl.col("name") == "start") & (pl.col("cat") == "dftracer")).select(
        "src", "seq", "pid", pl.col("__ppid").alias("ppid"), pl.col("__cwd").cast(_STR).alias("cwd"),
        pl.col("__hhash").cast(_STR).alias("hhash"))
    hosts = wide.filter(pl.col("__hhash").is_not_null()).group_by("src", "pid").agg(
        pl.col("seq").min(), pl.col("__hhash").sort_by("seq").first().cast(_STR).alias("hhash"),
    ).select("src", "pid", "seq", "hhash")
    return starts, hosts


#: Per trace file (``src``), the counts of a batch's rows with values read as null, by what
#: was read as null (:func:`_compact`).
_NullProblems = dict[int, dict[str, int]]
_NULL_IDS = f"a pid, ppid or tid {BEYOND_32_BITS}"
_NULL_BYTES = f"a byte count {ODD_BYTES}"
_NULL_DUR = f"a duration {ODD_DUR}"
#: How a file's report counts the transfers DFTracer named after a file their process had
#: closed (see :func:`_offsets`): not damage, and not I/O on that file.
STRAY_IO = ("a file their process had closed or never opened for writing (DFTracer's close race: another thread "
            "reused the descriptor), kept without a file")


def _null_problems(beyond: dict[int, int], odd: dict[int, int]) -> _NullProblems:
    """The rows with a pid, ppid or tid beyond 32 bits (``beyond``) and those with a byte
    count read as null (``odd``), each counted per ``src``."""
    out: _NullProblems = {}
    for what, counts in ((_NULL_IDS, beyond), (_NULL_BYTES, odd)):
        for src, n in counts.items():
            out.setdefault(src, {})[what] = n
    return out


def _counted(problem: str) -> tuple[int, str] | None:
    """(events, what) of a problem "N event(s) with WHAT" (values read as null, stray
    transfers), else None."""
    for what in (_NULL_IDS, _NULL_BYTES, _NULL_DUR, STRAY_IO):
        n = problem.removesuffix(f" event(s) with {what}")
        if n != problem and n.isdigit():
            return int(n), what
    return None


def _count_problem(problems: list[str], n: int, what: str) -> None:
    """Add ``n`` events "with ``what``" to the file's problems: one line per kind, its count
    summed over the batches and byte ranges the file was parsed in."""
    for k, p in enumerate(problems):
        got = _counted(p)
        if got is not None and got[1] == what:
            n += got[0]
            problems[k] = f"{n} event(s) with {what}"
            return
    problems.append(f"{n} event(s) with {what}")


def _compact(raw: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, _NullProblems]:
    """(rows, starts, hosts, problems) of raw event rows (:data:`RAW_SCHEMA`, strings as
    String or Categorical): the :data:`CHUNK_SCHEMA` rows (:func:`_compact_exprs`), the
    processes' ``start`` records and first host hashes (:func:`_starts_and_hosts`), and per
    ``src`` the counts of rows with a :data:`_NARROW` value beyond 32 bits or a byte count
    read as null (:func:`_null_problems`)."""
    wide = raw.select(*_compact_exprs(pl.col), pl.col("ppid").alias("__ppid"), pl.col("cwd").cast(_CAT).alias("__cwd"),
                      pl.col("hhash").cast(_CAT).alias("__hhash"))
    starts, hosts = _starts_and_hosts(wide)
    lims = raw.select(*(e for c in _NARROW for e in (pl.col(c).min().alias(c + "_lo"), pl.col(c).max().alias(c + "_hi"))))
    beyond: dict[int, int] = {}
    if any((lo is not None and lo < _I32_MIN) or (hi is not None and hi > _I32_MAX)
           for lo, hi in zip(lims.row(0)[::2], lims.row(0)[1::2], strict=True)):
        out_of_range = pl.any_horizontal(*((pl.col(c) < _I32_MIN) | (pl.col(c) > _I32_MAX) for c in _NARROW))
        beyond = dict(raw.filter(out_of_range.fill_null(False)).group_by("src").len().iter_rows())
    odd = dict(raw.filter(_odd_bytes(pl.col)).group_by("src").len().iter_rows())
    return wide.drop("__ppid", "__cwd", "__hhash"), starts, hosts, _null_problems(beyond, odd)


#: :func:`_native_compact`'s outputs, in the order of the C ``OUT_*`` enum: (column, dtype,
#: validity bit of ``OUT_VALID``; 0 for a column without nulls).
_COMPACT_OUT: tuple[tuple[str, Any, int], ...] = (
    ("ts", np.int64, 1 << 0), ("dur", np.int64, 1 << 1), ("ret", np.int64, 1 << 2),
    ("size_requested", np.int64, 1 << 3), ("size", np.int64, 1 << 4), ("parg", np.int64, 0),
    ("batch_size", np.int64, 1 << 5), ("sample_index", np.int64, 1 << 6), ("__ppid", np.int64, 1 << 7),
    ("pid", np.int32, 1 << 8), ("tid", np.int32, 1 << 9), ("epoch", np.int32, 1 << 10), ("step", np.int32, 1 << 11),
    ("cpu_time", np.int32, 1 << 12), ("cpu_threads", np.int32, 1 << 13), ("tensors", np.int16, 1 << 14),
    ("op", np.int8, 0), ("pos", np.uint8, 0),
    ("cat", np.int32, 0), ("name", np.int32, 0), ("fhash", np.int32, 0), ("__path", np.int32, 0),
)
#: Flags of a scanned string for :func:`_native_compact` (``SF_*`` in ``_pfwscan.c``).
_SFLAG: dict[str, int] = {CAT_CHECKPOINT: 1, "POSIX": 2, "STDIO": 2 | 4, "start": 16, "dftracer": 32}
_SF_MODE_A = 8
_SF_MODE_R = 64
_SF_WRITE = 128
_WRITE_NAMES = frozenset(WRITE_OPS)
_CODE_COLUMNS = ("cat", "name", "fhash", "__path")
#: The scanner's string fields (bits of its ``fields``) whose values get ``op_of`` and ``_SFLAG``.
_FLAGGED_FIELDS = sum(1 << _NATIVE_STRS.index(c) for c in ("name", "cat", "mode"))
_EMPTY_U32 = np.zeros(0, dtype=np.uint32)


@functools.cache
def _column_expr(c: str, bit: int, kind: Literal["null", "all", "masked"]) -> pl.Expr:
    """:func:`_native_compact`'s expression of column ``c`` (validity ``bit`` of ``__v``):
    all null, all valid, or valid where its bit is set. Built once: the Python side of
    building them for every batch held the GIL the other parse threads wait for."""
    if kind == "null":
        return pl.lit(None, dtype=CHUNK_SCHEMA[c]).alias(c)
    if kind == "all":
        return pl.col(c)
    return pl.when((pl.col("__v") & bit) != 0).then(pl.col(c)).alias(c)


def _native_compact(sl: slice, ints: np.ndarray, imask: np.ndarray, strs: np.ndarray, values: pl.Series,
                    uniques: list[str], op_of: np.ndarray, sflag: np.ndarray, src: int | np.ndarray,
                    seq: np.ndarray) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, _NullProblems]:
    """:func:`_compact` of the scanner's event rows ``sl`` straight from its buffers (of
    file ``src``, a constant or one per row, lines ``seq``): the C pass ``compact`` computes
    the :data:`CHUNK_SCHEMA` columns as :func:`_compact_exprs` defines them, into arrays of
    their own (so that a column dropped later frees its memory), and finds the ``start``
    records and each process's first host hash; polars only adds the validity masks and
    maps the string codes to categories."""
    assert _NATIVE is not None
    n = sl.stop - sl.start
    col = {c: np.empty(n, dtype=dt) for c, dt, _ in _COMPACT_OUT}
    valid, special = np.empty(n, dtype=np.uint32), np.empty(2 * n, dtype=np.int64)
    srcs = src.astype(np.uint32, copy=False) if isinstance(src, np.ndarray) else _EMPTY_U32
    vand, vor, beyond_rows, odd_rows, nstarts, nhosts = _NATIVE.compact(
        ints, imask, strs, sl.start, sl.stop, op_of, sflag, srcs, (*col.values(), valid, special))
    data: dict[str, np.ndarray] = {"__v": valid}
    exprs: dict[str, pl.Expr] = {}
    cats = None
    for c, _, bit in _COMPACT_OUT:
        arr = col[c]
        if c == "__ppid":
            continue
        if c in _CODE_COLUMNS:
            lo, hi = (int(arr.min()), int(arr.max())) if n else (-1, -1)
            if hi < 0:
                exprs[c] = pl.lit(None, dtype=_CAT)
            elif lo == hi:
                exprs[c] = pl.lit(values[lo], dtype=_CAT)
            else:
                if cats is None:
                    cats = values.cast(_CAT)
                data[c] = arr
                exprs[c] = pl.lit(cats).gather(pl.when(pl.col(c) >= 0).then(pl.col(c)) if lo < 0 else pl.col(c))
            continue
        if bit and not vor & bit:
            exprs[c] = _column_expr(c, bit, "null")
            continue
        data[c] = arr
        exprs[c] = _column_expr(c, bit, "all" if not bit or vand & bit else "masked")
    data["seq"] = seq
    exprs["seq"] = pl.col("seq")
    if isinstance(src, np.ndarray):
        data["src"] = src
        exprs["src"] = pl.col("src")
    else:
        exprs["src"] = pl.lit(src, dtype=_SRC)
    rows = pl.DataFrame(data).select(*(exprs[c].alias(c) for c in CHUNK_SCHEMA))
    del data, exprs
    # the processes' start records and first host hashes: a few rows each
    cwd, hhash = strs[_NATIVE_STRS.index("cwd"), sl], strs[_NATIVE_STRS.index("hhash"), sl]

    def few(at: np.ndarray, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        if not len(at):  # (most batches hold no start record: 1-2 ms a frame otherwise)
            return pl.DataFrame(schema=schema)
        # built from Python lists of the few rows (a frame and a select of polars
        # expressions cost ~0.5 ms, a pass through polars' pool, for a row or two)
        ok = valid[at].tolist()
        got = {
            "src": src[at].tolist() if isinstance(src, np.ndarray) else [int(src)] * len(at),
            "seq": seq[at].tolist(),
            "pid": [v if m & (1 << 8) else None for v, m in zip(col["pid"][at].tolist(), ok, strict=True)],
            "ppid": [v if m & (1 << 7) else None for v, m in zip(col["__ppid"][at].tolist(), ok, strict=True)],
            "cwd": [uniques[k] if k >= 0 else None for k in cwd[at].tolist()],
            "hhash": [uniques[k] if k >= 0 else None for k in hhash[at].tolist()],
        }
        return pl.DataFrame({c: got[c] for c in schema}, schema=schema)

    starts, hosts = few(special[:nstarts], _STARTS_SCHEMA), few(special[n:n + nhosts], _HOSTS_SCHEMA)
    beyond: dict[int, int] = {}
    if beyond_rows:
        mask = imask[sl]
        out_of_range = np.zeros(n, dtype=bool)
        for c in _NARROW:
            k = _NATIVE_INTS.index(c)
            v = ints[k, sl]
            out_of_range |= ((mask >> k) & 1).astype(bool) & ((v < _I32_MIN) | (v > _I32_MAX))
        srcs_out = src[out_of_range] if isinstance(src, np.ndarray) else np.full(int(out_of_range.sum()), src)
        beyond = {int(s_): int(k) for s_, k in zip(*np.unique(srcs_out, return_counts=True), strict=True)}
    odd: dict[int, int] = {}
    if odd_rows:
        if isinstance(src, np.ndarray):
            srcs_odd = src[(valid & _V_ODDBYTES) != 0]
            odd = {int(s_): int(k) for s_, k in zip(*np.unique(srcs_odd, return_counts=True), strict=True)}
        else:
            odd = {int(src): odd_rows}
    return rows, starts, hosts, _null_problems(beyond, odd)


class _Compacted:
    """What one part keeps of its parsed batches, in the compact forms of :func:`_compact`;
    the lists are handed over (emptied) by :meth:`pop`, so their memory is freed as
    soon as the resolved columns no longer need it."""

    def __init__(self) -> None:
        self.stats: dict[int, _Stats] = {}
        self.rows: list[pl.DataFrame] = []
        self.meta: list[pl.DataFrame | _MetaRows] = []
        self.starts: list[pl.DataFrame] = []
        self.hosts: list[pl.DataFrame] = []

    def take(self, batch: _Batch | _NativeBatch) -> None:
        """Compact the rows the batch parsed since the last call (and forget them there)."""
        events, batch.events = batch.events, []
        self.meta.extend(m for m in batch.meta if m.height)
        batch.meta = []
        while events:
            raw = events.pop(0)
            if isinstance(raw, tuple):  # compacted by the scanner's path
                rows, starts, hosts, nulled = raw
            elif not raw.height:
                continue
            else:
                rows, starts, hosts, nulled = _compact(raw)
            del raw
            self.rows.append(rows)
            if starts.height:
                self.starts.append(starts)
            if hosts.height:
                self.hosts.append(hosts)
            for src, counts in nulled.items():
                for what, n in counts.items():
                    _count_problem(self.stats[src].problems, n, what)

    def pop(self) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """(rows, meta, starts, hosts), each one frame; the lists are emptied."""
        out = (_frames(self.rows, CHUNK_SCHEMA), _concat(_meta_frames(self.meta)), _frames(self.starts, _STARTS_SCHEMA),
               _frames(self.hosts, _HOSTS_SCHEMA))
        self.rows, self.meta, self.starts, self.hosts = [], [], [], []
        return out


def _frames(frames: list[pl.DataFrame], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """``frames`` as one frame (their chunks kept; no copy), or an empty one of ``schema``."""
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame(schema=schema)
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical", rechunk=False)


def _resolve(compacted: _Compacted, problems: dict[int, list[str]], *, alone: bool = False, ordered: bool = False
             ) -> tuple[pl.DataFrame, np.ndarray | None, pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(events, order, processes, fh, counts, markers) of a :class:`TracePart` from the compact rows of whole files.
    ``problems``: each file's (``src``) problems, to which the values read as null here are
    added (durations, :func:`_apply_time_metric`).

    Everything that one file decides is resolved here: the time unit (``CM``), each
    process's ppid, working-directory hash and host (its ``start`` and ``HH`` records),
    and the offsets, reconstructed per (trace file, pid, POSIX or STDIO, file hash) in
    (``ts``, line) order; ``order`` lists the rows in (``ts``, file, line) order (they stay
    in their files' order: the run's merge gathers them once), or with ``ordered`` the rows
    are gathered into that order here and ``order`` is None.
    ``alone``: no other thread of the process is parsing (:class:`_Parsing`; a load on one
    thread, the byte ranges of one large file resolved after all of them were parsed, the
    last group) and the part has :data:`_RELEASE_ROWS` rows or more: what the sort keys,
    the offsets' inputs and the dropped columns held is returned to the system between
    the steps, lowering the load's peak (one file on 2 threads: 255-262 -> 212 B/event).
    A part resolved while other threads parse does not: they would fault their pages in
    again (10 % slower). Nor does a smaller part: it returns little, and the pages other
    steps had freed are faulted in again (9 files on 2 cores: 44 k of 232 k faults, 4 % of
    the CPU time, for the same peak).
    """
    rows, meta, starts, hosts = compacted.pop()
    meta = meta.sort("src", "seq")
    fh = (
        meta.filter((pl.col("name") == "FH") & pl.col("a_value").is_not_null())
        .select(pl.col("a_value").alias("hash"), pl.col("a_name").alias("name"), "src", "seq",
                pl.col("pid").cast(_I32, strict=False))
        .unique(subset="hash", keep="first", maintain_order=True)
    )
    markers = meta.filter((pl.col("name") == "CM") & pl.col("a_name").str.contains(r"\.(start|end)$")).select(
        list(MARKER_SCHEMA))
    if rows.height == 0:
        return (pl.DataFrame(schema=PART_SCHEMA), None, pl.DataFrame(schema=PROCESS_SCHEMA), fh,
                pl.DataFrame(schema=COUNTS_SCHEMA), markers)
    release = alone and rows.height >= _RELEASE_ROWS
    rows = _apply_time_metric(rows, meta, problems)
    every, pidx = _process_keys(rows)
    processes = _process_table(every, meta, starts, hosts)
    rows = rows.with_columns(pidx.alias("__p"))
    order = _output_order(rows)
    if release:
        release_free_memory(keep_large=True)  # the sort keys (numpy's, in the C heap once glibc's mmap threshold has grown)
    offset, stray = _offsets(rows, order, release=release)
    if stray is not None:
        rows = _unname_stray(rows, stray, problems)
    # the rows stay in their files' order, their output order beside them: the run's merge
    # gathers every part's columns once, into the run's order (a gather here as well cost
    # every column of a part a copy: 9 files on 2 cores, 0.16 s more CPU and 4 % more time)
    held = [rows.select(c for c in PART_SCHEMA if c != "offset")]
    del rows
    if release:
        release_free_memory(keep_large=True)  # the columns only the order and the offsets needed
    if ordered:  # gathered here, the source columns freed as they go
        # (the offsets, in the rows' order, gathered on their own)
        events = _gather(held, [order], [c for c in PART_SCHEMA if c != "offset"])
        events.insert_column(list(PART_SCHEMA).index("offset"), offset.gather(_row_index(order)).alias("offset"))
        return events, None, processes, fh, _part_counts(events), markers
    # one chunk per column (the merge concatenates the parts' columns, whose chunk lengths
    # differ otherwise, and polars' gather from one chunk is 3-5x as fast), a few columns
    # at a time, each group's source chunks freed before the next is copied
    events = _gather(held, None, [c for c in PART_SCHEMA if c != "offset"])
    events.insert_column(list(PART_SCHEMA).index("offset"), offset.alias("offset"))
    return events, _narrow_order(order), processes, fh, _part_counts(events), markers


def _narrow_order(order: np.ndarray) -> np.ndarray:
    """A row order as 32-bit indices where they fit (half the memory of numpy's argsort)."""
    if len(order) < (1 << 32) and order.dtype != np.uint32:
        return order.astype(np.uint32)
    return order


def _gather(held: list[pl.DataFrame], order: np.ndarray | list[np.ndarray | None] | None,
            columns: Sequence[str]) -> pl.DataFrame:
    """The ``columns`` of the frame in ``held`` (taken out of the list) in the row order
    ``order`` (None: as they are; a list holding the order is emptied once it is turned
    into polars' index), one chunk each.

    Gathers a few columns at a time and drops them from the frame before the next, so
    the rows are not held twice (when no one else holds the frame: hence the lists)."""
    frame = held.pop()
    rows = order.pop() if isinstance(order, list) else order
    del order
    idx = None if rows is None else _row_index(rows)
    del rows
    # frames, not series: a column of one value (all null: the annotation fields of a
    # trace without annotations) stays a constant, of no size, and its gather costs nothing
    # (its Series would be materialised, a value per row)
    out: list[pl.DataFrame] = []
    todo = list(columns)
    while todo:
        group, todo = todo[:_GATHER_GROUP], todo[_GATHER_GROUP:]
        # one chunk first: a gather from the many chunks of a part's batches costs 3-5x
        # a copy and a gather from one
        sub = frame.select(group).rechunk()
        frame = frame.drop(group)
        out.append(sub if idx is None else sub[idx])
        freed = sub.estimated_size()
        del sub
        if freed >= _RELEASE_BYTES:
            release_free_memory(keep_large=True)  # the source columns, before the next group is built in another arena
    return pl.concat(out, how="horizontal") if out else pl.DataFrame()


def resolve_ranges(ranges: Sequence[RangePart], *, ordered: bool = False) -> list[TracePart]:
    """One :class:`TracePart` per file of the byte ranges ``ranges`` (all ranges of each file).

    The cuts between ranges are checked first: every range must have decoded without
    damage and every range but the last must end with a whole line. Otherwise a cut was
    wrong (inside a member, or after a member that ends inside a line) or the file is
    damaged, and the file is parsed again whole, where the salvage rules apply.
    """
    by_src: dict[int, list[RangePart]] = {}
    for r in ranges:
        by_src.setdefault(r.src, []).append(r)
    del r
    if isinstance(ranges, list):  # taken over: the ranges' rows are freed as they are gathered
        ranges.clear()
    del ranges
    out = []
    for src in sorted(by_src):
        rs = by_src.pop(src)
        rs.sort(key=lambda r: r.k)
        if any(r.report.problems for r in rs) or not all(r.clean_end for r in rs[:-1]):
            path = rs[0].report.path
            del rs
            out.append(cast(TracePart, parse_part([(src, path)], ordered=ordered)))
            continue
        rep = rs[0].report
        for r in rs[1:]:
            rep = _add_reports(rep, r.report)
        if rep.bytes and not rep.lines and not rep.problems:
            rep.problems.append("file holds no trace lines")
        held = _Compacted()
        held.rows = [r.rows for r in rs]
        held.meta = [r.meta for r in rs if r.meta.height]
        held.starts = [r.starts for r in rs]
        held.hosts = [r.hosts for r in rs]
        del rs
        events, order, processes, fh, counts, markers = _resolve(held, {src: rep.problems}, alone=_PARSING.idle(),
                                                                 ordered=ordered)
        out.append(TracePart(events=events, processes=processes, fh=fh, files=[(src, rep)], counts=counts,
                             markers=markers, order=order))
    return out


def combine(parts: Sequence[TracePart | RangePart], names: Sequence[str]) -> LoadedTrace:
    """Combine the parts of one run (:func:`parse_part`) into a :class:`LoadedTrace` (no manifest).

    ``names[src]`` is the ``source`` of file ``src`` (its basename); every file of the run
    must be in exactly one :class:`TracePart` or in :class:`RangePart` s that cover it.
    This resolves what needs more than one file: ``FH`` paths (the record may sit in
    another process's file; relative names use the writing process's working directory)
    and the order of all rows. The result has the :data:`~dlreplay.schema.EVENT_SCHEMA`
    table sorted by (``ts``, file, line), the reports in ``src`` order with their event
    counts and the per-(file, host, pid) table of the summary. It does not depend on how
    the files were split into parts, nor on the parts' order.
    """
    return _combine_owned(list(parts), names)


def _combine_owned(parts: list[TracePart | RangePart], names: Sequence[str]) -> LoadedTrace:
    """:func:`combine`, emptying ``parts`` as their rows are taken (so the caller's list
    does not keep them alive while the output table is built)."""
    ranges = [p for p in parts if isinstance(p, RangePart)]
    whole = [p for p in parts if isinstance(p, TracePart)]
    parts.clear()
    if ranges:
        whole += resolve_ranges(ranges)
        del ranges
    # (a comprehension: a loop's variable kept the last part, its rows, alive through the merge)
    reports = {src: rep for p in whole for src, rep in p.files}
    whole.sort(key=lambda p: min((src for src, _ in p.files), default=0))
    events, per_process, counts, notes = _merge(whole, names)
    files = [_with_events(reports[i], counts.get(i, 0), notes.get(i, [])) for i in sorted(reports)]
    return LoadedTrace(events=events, files=files, per_process=per_process)


def combine_parts(parts: Sequence[TracePart | RangePart], names: Sequence[str]) -> tuple[pl.DataFrame, list[FileReport]]:
    """(event table, per-file reports) of :func:`combine`."""
    loaded = combine(parts, names)
    return loaded.events, loaded.files


def _add_reports(a: FileReport, b: FileReport) -> FileReport:
    """The report of a file from the reports of two of its byte ranges (in file order)."""
    problems = list(a.problems)
    for p in b.problems:  # the counts of values read as null: one line per kind
        got = _counted(p)
        if got is not None:
            _count_problem(problems, *got)
        else:
            problems.append(p)
    return FileReport(path=a.path, bytes=a.bytes + b.bytes, members=a.members + b.members,
                      lines=a.lines + b.lines, events=0, dropped_lines=a.dropped_lines + b.dropped_lines,
                      dropped_bytes=a.dropped_bytes + b.dropped_bytes, problems=problems)


@dataclass(frozen=True)
class RunTables:
    """What the rows of every part need from the whole run (:func:`run_tables`): the
    processes (one row per (``src``, ``pid``) in the order of the parts' ``__p`` indices
    plus each part's offset, with ``ppid``, ``host``, ``source`` and the working
    directory ``__cwd``), and the path of every file hash that an ``FH`` record names,
    by the hash's category code (``path_by_code``, Categorical, null where none)."""

    processes: pl.DataFrame
    path_by_code: pl.Series


def run_tables(processes: Sequence[pl.DataFrame], fh: Sequence[pl.DataFrame], names: Sequence[str],
               top_id: int = 0) -> RunTables:
    """The :class:`RunTables` of parts whose processes and ``FH`` records are ``processes``
    and ``fh`` (in part order: a part's ``__p`` plus the processes of the parts before it
    index the result); ``names[src]`` is the source name of file ``src``; ``top_id`` the
    largest pid or tid of the parts' rows (see :func:`_host_pids`)."""
    records = _frames(list(fh), FH_SCHEMA).sort("src", "seq").unique(subset="hash", keep="first",
                                                                     maintain_order=True)
    procs = _frames(list(processes), PROCESS_SCHEMA).rechunk()
    # working directory of every process (its start record's cwd hash, resolved by FH)
    procs = procs.with_columns(
        _lookup(pl.col("cwdhash"), records["hash"], records["name"], _STR).alias("__cwd"),
        pl.Series(names, dtype=_CAT).gather(procs["src"]).alias("source"),
        pl.col("host").cast(_CAT),
    ).rechunk()
    paths = records.join(procs.select("src", "pid", "__cwd"), on=["src", "pid"], how="left",
                         maintain_order="left").select(
        pl.col("hash").cast(_CAT).to_physical().alias("code"), _absolute(pl.col("name")).cast(_CAT).alias("path"))
    size = (_int_stat(paths["code"].max()) or -1) + 1
    by_code = pl.DataFrame({"code": np.arange(size, dtype=np.uint32)}).join(
        paths, on="code", how="left", maintain_order="left")["path"]
    return RunTables(processes=_host_pids(procs, top_id), path_by_code=by_code.rechunk())


def _host_pids(procs: pl.DataFrame, top_id: int) -> pl.DataFrame:
    """``procs`` with ``__pid`` and ``ppid`` renumbered where one pid runs on several hosts.

    A process is (host, pid), but the event table and its passes key processes by pid: two
    nodes' processes of one pid (likely across many nodes: pid_max is often 32768) would be
    one process there, their epochs and steps mixed. The host whose trace file comes first
    keeps the pid; each other host's processes of it get a new id above every pid, ppid
    and tid of the run (``top_id``: the rows' largest pid or tid), in (pid, file) order,
    and the ppid of that host's processes follows. Pids below :data:`_RANK_PIDS` (DLIO's
    rank numbers, split by thread later) and processes without a host keep theirs. No
    ``__pid`` column where no pid is shared (the rows keep their pid)."""
    hosts = procs.filter(pl.col("host").is_not_null() & (pl.col("pid") >= _RANK_PIDS)).group_by("pid", "host").agg(
        pl.col("src").min().alias("__s"))
    shared = hosts.filter(pl.len().over("pid") > 1)
    if shared.is_empty():
        return procs
    top = max(top_id, _int_stat(procs["pid"].max()) or 0, _int_stat(procs["ppid"].max()) or 0)
    moved = (shared.sort("pid", "__s", "host").filter(pl.int_range(pl.len()).over("pid") > 0)
             .with_columns((top + 1 + pl.int_range(pl.len(), dtype=pl.Int64)).cast(pl.Int32).alias("__new"))
             .select("host", "pid", "__new"))
    return (procs.join(moved, on=["host", "pid"], how="left", maintain_order="left")
            .join(moved.rename({"pid": "ppid", "__new": "__newp"}), on=["host", "ppid"], how="left",
                  maintain_order="left")
            .with_columns(pl.coalesce("__new", "pid").alias("__pid"), pl.coalesce("__newp", "ppid").alias("ppid"))
            .drop("__new", "__newp"))


def renumbered(procs: pl.DataFrame) -> dict[int, list[str]]:
    """Per trace file (``src``): a sentence per process of it that :func:`_host_pids` numbered
    anew (for the file's report, and so the run's warnings)."""
    if "__pid" not in procs.columns:
        return {}
    out: dict[int, list[str]] = {}
    moved = procs.filter(pl.col("__pid") != pl.col("pid")).select("src", "host", "pid", "__pid").unique()
    for src, host, pid, new in moved.sort("src", "pid").iter_rows():
        out.setdefault(int(src), []).append(f"pid {pid} on {host} is {new} here: it {RENUMBERED}")
    return out


def finalize(events: pl.DataFrame | list[pl.DataFrame], order: np.ndarray | list[np.ndarray | None] | None,
             tables: RunTables) -> tuple[pl.DataFrame, pl.Series]:
    """(event table, process index per row): the :data:`~dlreplay.schema.EVENT_SCHEMA` table
    but ``role`` (:func:`canonical` adds it) of parts' rows ``events`` (:data:`PART_SCHEMA`, ``__p`` indexing ``tables``' processes;
    or a list holding that frame, taken out of it so that its columns are freed as they
    are gathered), gathered in ``order`` (None: as they are). ``file`` is the path the
    run's ``FH`` records give the file hash, else the event's path argument, made
    absolute with the process's working directory."""
    held = events if isinstance(events, list) else [events]
    del events
    out = _gather(held, order, list(PART_SCHEMA))
    procs = tables.processes
    file = _file_column(out, tables)
    release_free_memory(keep_large=True)  # the gather's last group and the file lookup's, before the new columns
    pid = _per_process(procs["__pid"], "pid") if "__pid" in procs.columns else pl.col("pid")
    table = out.select(
        pid, "tid", _per_process(procs["ppid"], "ppid"), _per_process(procs["host"], "host"),
        "ts", "dur", "cat", "name", pl.lit(file).alias("file"), "fhash",
        "size_requested", "size", "offset", "ret", "epoch", "step", "batch_size", "sample_index",
        "cpu_time", "cpu_threads", "tensors", _per_process(procs["source"], "source"),
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
    file = rows.select(pl.lit(tables.path_by_code).gather(pl.when(code < nfile).then(code)).alias("file")) \
        .to_series() if nfile else pl.Series("file", [None] * rows.height, dtype=_CAT)
    named = rows.lazy().with_row_index("__row").filter(pl.col("__path").is_not_null()).select(
        "__row", "__p", "__path").collect()
    if named.height:
        named = named.filter(file.gather(named["__row"]).is_null())
    if named.height:
        sub = named.join(tables.processes.with_row_index("__p").select("__p", "__cwd"), on="__p", how="left",
                         maintain_order="left")
        paths = sub.select(_absolute(pl.col("__path").cast(_STR))).to_series().cast(_CAT)
        file = file.scatter(named["__row"], paths)
    return file.alias("file")


def _part_counts(events: pl.DataFrame) -> pl.DataFrame:
    """The summary's per-process counts of a part's rows before their files are known
    (:data:`COUNTS_SCHEMA`): rows (``n``) and bytes (``b``) per (file hash, path argument,
    process, :func:`~.counts.row_class`, ``item`` event)."""
    item = ((pl.col("cat") == CAT_DATA) & (pl.col("name") == "item")).fill_null(False)
    # grouped by name and category codes first (the classes are computed on the groups),
    # on one packed integer key when the codes fit in 64 bits (twice as fast as five keys)
    keys = ("fhash", "__path", "__p", "name", "cat")
    tops = events.select(*(pl.col(c).to_physical().max().alias(c) for c in keys)).row(0)
    bits = [(int(m) + 2).bit_length() if m is not None else 1 for m in tops]  # + a value for null
    if events.height and sum(bits) <= 64:
        # packed in place in one numpy array, a key's 32-bit codes at a time (as polars
        # expressions, each step was a new 64-bit column: 31-44 ms against 21-24)
        packed = np.zeros(events.height, dtype=np.uint64)
        for c, nbits, top in zip(keys, bits, tops, strict=True):
            # (through a select: events[c] would materialise a column of one value, and keep it)
            codes = events.select(pl.col(c).to_physical()).to_series()
            if codes.null_count():
                codes = codes.fill_null((int(top) + 1) if top is not None else 0)
            packed <<= np.uint64(nbits)
            packed |= codes.to_numpy()
            del codes
        first = events.with_columns(pl.Series("__k", packed)).group_by("__k").agg(
            *(pl.col(c).first() for c in keys), pl.len().cast(pl.Int64).alias("n"),
            pl.col("size").fill_null(0).sum().alias("b")).drop("__k")
        del packed
    else:
        first = events.group_by(*keys).agg(pl.len().cast(pl.Int64).alias("n"), pl.col("size").fill_null(0).sum().alias("b"))
    return first.group_by("fhash", "__path", "__p", row_class().alias("cls"), item.alias("item")).agg(
        pl.col("n").sum(), pl.col("b").sum()).cast(pl.Schema(COUNTS_SCHEMA))  # type: ignore[arg-type]


def _per_process_from_counts(counts: pl.DataFrame, tables: RunTables) -> pl.DataFrame:
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
    pkey = procs.join(hosts.with_row_index("__h"), on=["host", "pid"], how="left", nulls_equal=True,
                      maintain_order="left")["__h"]
    counted = counted.select(
        _code_index(pl.col("file"), paths).alias("__file"), pl.lit(pkey).gather(pl.col("__p")).alias("__proc"),
        "cls", "n", "b", "item",
    )
    loaders = counted.filter(pl.col("item"))["__proc"].unique().to_numpy()  # item events have no file
    return file_process_table_counted(counted.filter(pl.col("__file") != none), paths, hosts, loaders)


def _merge(parts: list[TracePart], names: Sequence[str]) -> tuple[pl.DataFrame, pl.DataFrame | None, dict[int, int],
                                                                   dict[int, list[str]]]:
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
        return pl.DataFrame(schema=EVENT_SCHEMA), None, {}, {}  # (a trace of markers only has no processes)
    tables = run_tables(processes, fh, names, max((_int_stat(f[c].max()) or 0) for f in frames for c in ("pid", "tid")))
    # the per-process table needs only the parts' counts: built in a thread beside the order
    # and the gather, which leave a core idle at times (9 files on 2 cores: 1.28 -> 1.23 s)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlreplay-merge") as side:
        per_process_job = side.submit(_per_process_from_counts, _frames(counts, COUNTS_SCHEMA), tables)
        del counts
        proc_src = tables.processes["src"].to_numpy()
        runs = len(frames)
        # each part's rows are in (ts, file) order as its order lists them: merge the parts
        # by (ts, file) into row indices of their concatenation, gathered once below
        order = _merged_runs(frames, orders, proc_src) if runs > 1 else orders[0]
        if runs > 1 and order is None:  # each part into its order, then a stable sort of them all
            for i, o in enumerate(orders):
                if o is not None:
                    frames[i] = _gather([frames[i]], o, list(frames[i].columns))
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
        per_src = np.bincount(proc_src[per_p[pidx.name].to_numpy()], weights=per_p["count"].to_numpy(),
                              minlength=len(names)).astype(np.int64)
        del pidx, per_p
        per_file = {int(i): int(per_src[i]) for i in np.flatnonzero(per_src)}
        per_process = per_process_job.result()
    release_free_memory(keep_large=True)
    events, changed = canonical(events, _frames(markers, MARKER_SCHEMA), names)
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


def canonical(events: pl.DataFrame, markers: pl.DataFrame, names: Sequence[str],
              run: vocabulary.RunThreads | None = None) -> tuple[pl.DataFrame, bool]:
    """The one event vocabulary (:func:`~..vocabulary.canonicalize`: roles, DLIO's rank pids,
    start/stop markers) over :func:`finalize`'s table, in :data:`~dlreplay.schema.EVENT_SCHEMA`
    (``role`` Categorical); True when it changed processes or roles the loader's own
    per-process counts relied on. ``run``: what the whole run holds, where ``events`` is
    one part of it (the spilled loader)."""
    table, changed = vocabulary.canonicalize(events, vocabulary.marker_spans(markers), list(names), run)
    return table.cast(pl.Schema(EVENT_SCHEMA), strict=False), changed  # type: ignore[arg-type]


#: Rows of the merge's output below which its slices are not merged in threads of their own.
_MERGE_SLICE_ROWS = 1 << 19


def _merged_runs(frames: list[pl.DataFrame], orders: Sequence[np.ndarray | None],
                 proc_src: np.ndarray) -> np.ndarray | None:
    """The row order by (``ts``, file) of the concatenation of ``frames`` (resolved parts,
    each in that order as its entry of ``orders`` lists its rows, or as they are where
    that is None; ``__p`` indexing ``proc_src``, the file of each process) as a k-way merge
    in C (``merge_runs``): 27-32 ms for the 9 files' 2.1 M rows where the stable sort of
    packed keys took 48-130 ms, much of it faulting in its 17 MB temporaries; cut into
    slices merged in threads, one a core (36.5 -> 23.6 ms on 2 cores). None where it
    does not apply (no C extension, a null ``ts``, a part out of order): then the parts are
    gathered into order and :func:`_merge_order` gives the same order."""
    if _NATIVE is None:
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
        return out if _NATIVE.merge_runs(ts, procs, src, out, ords) else None
    with ThreadPoolExecutor(max_workers=parts - 1, thread_name_prefix="dlreplay-merge-runs") as pool:
        others = [pool.submit(_NATIVE.merge_runs, ts, procs, src, out, ords, q, parts) for q in range(1, parts)]
        done = [_NATIVE.merge_runs(ts, procs, src, out, ords, 0, parts), *(f.result() for f in others)]
    return out if all(done) else None


def _merge_order(ts: pl.Series, src: np.ndarray) -> np.ndarray:
    """Row order by (``ts``, null last; ``src``) of rows that are in (ts, src, line) order
    within each part and whose parts each hold whole files: a stable sort, so the rows of
    one file keep their line order among equal timestamps."""
    tmin, tmax = _int_stat(ts.min()), _int_stat(ts.max())
    b_src = max(int(src.max()) if len(src) else 0, 1).bit_length()
    span = 1 if tmin is None or tmax is None else tmax - tmin + 2  # +1 for null ts
    if span.bit_length() + b_src > _PACK_BITS:  # lexsort is stable; its last key sorts first
        return np.lexsort((src, ts.fill_null(0).to_numpy(), ts.is_null().to_numpy()))
    t = ts.fill_null((tmax + 1) if tmax is not None else 0).to_numpy()
    key = ((t - (tmin or 0)) << b_src) | src.astype(np.int64)
    return np.argsort(key, kind="stable")


def member_ranges(path: str | os.PathLike, target_bytes: int) -> list[tuple[int, int]] | None:
    """Byte ranges of about ``target_bytes`` (stored) cut at gzip member headers, covering
    the file; None when it is not gzip or holds one member (see :func:`_split_file`: the
    cuts are checked when the ranges are resolved, :func:`resolve_ranges`)."""
    size = _stored_size(Path(path))
    return _split_file(Path(path), size, max(1, -(-size // max(1, target_bytes))))


def _lookup(key: pl.Expr, keys, values, dtype) -> pl.Expr:
    """``key`` mapped through (keys -> values), null when absent."""
    keys = keys.to_list() if isinstance(keys, pl.Series) else list(keys)
    values = values.to_list() if isinstance(values, pl.Series) else list(values)
    if not keys:
        return pl.lit(None, dtype=dtype)
    return key.replace_strict(keys, values, default=None, return_dtype=dtype)


def _hash_map(meta: pl.DataFrame, kind: str, by: Sequence[str] = ()) -> pl.DataFrame:
    """(*by, hash, name, src, pid) of ``FH`` or ``HH`` records, one per (*by, hash): the
    first in (file, line) order (``meta`` is sorted so)."""
    return (
        meta.filter((pl.col("name") == kind) & pl.col("a_value").is_not_null())
        .select(pl.col("a_value").alias("hash"), pl.col("a_name").alias("name"), "src", "pid")
        .unique(subset=[*by, "hash"], keep="first", maintain_order=True)
    )


def _process_keys(ev: pl.DataFrame) -> tuple[pl.DataFrame, pl.Expr]:
    """The (src, pid) pairs of ``ev`` (in no particular order) and an expression mapping each
    row of ``ev`` to its pair's index (UInt32)."""
    smin, smax = _int_stat(ev["src"].min()), _int_stat(ev["src"].max())
    pmin, pmax = _int_stat(ev["pid"].min()), _int_stat(ev["pid"].max())
    if smin == smax and pmin == pmax and pmin is not None and ev["pid"].null_count() == 0:
        # one process (the common case of a part of one file): no per-row lookup
        every = pl.DataFrame({"src": [smin], "pid": [pmin]}, schema={"src": _SRC, "pid": _I32})
        return every, pl.lit(0, dtype=pl.UInt32)
    if pmin is not None and pmax is not None and 0 <= pmin and ev["pid"].null_count() == 0:
        packed = pl.col("src").cast(pl.Int64) * (1 << 32) + pl.col("pid")
        keys = ev.select(packed.unique().alias("__k"))["__k"]
        every = pl.DataFrame({"src": (keys // (1 << 32)).cast(_SRC), "pid": (keys % (1 << 32)).cast(_I32)})
        return every, _lookup(packed, keys, range(keys.len()), pl.UInt32)
    every = ev.select("src", "pid").unique()  # negative or null pids: a struct key
    idx = pl.struct("src", "pid").replace_strict(every.to_struct().to_list(), range(every.height),
                                                 default=None, return_dtype=pl.UInt32)
    return every, idx


def _process_table(every: pl.DataFrame, meta: pl.DataFrame, starts: pl.DataFrame,
                   hosts: pl.DataFrame) -> pl.DataFrame:
    """Per (src, pid) of ``every`` (same order): ppid, cwd hash (``start`` record), host
    (HH-resolved host hash).

    Everything comes from the process's own trace file; "first" is in line order.
    """
    key = ["src", "pid"]
    first = (
        starts.sort("src", "seq")
        .group_by(key, maintain_order=True)
        .agg(pl.col("ppid").drop_nulls().first(), pl.col("cwd").drop_nulls().first().alias("cwdhash"),
             pl.col("hhash").drop_nulls().first().alias("h1"))
    )
    # the first host hash of the metadata records, else (rare) of the events, in line order
    found = meta.filter(pl.col("hhash").is_not_null()).select(
        "src", pl.col("pid").cast(_I32, strict=False), "hhash").group_by(key, maintain_order=True) \
        .agg(pl.col("hhash").first().alias("h2"))
    missing = every.join(found, on=key, how="anti")
    if missing.height:
        found = pl.concat([found, hosts.join(missing, on=key, how="semi").sort("seq")
                           .group_by(key, maintain_order=True).agg(pl.col("hhash").first().alias("h2"))])
    hh = _hash_map(meta, "HH", ["src"]).select("src", "hash", pl.col("name").alias("__hname"))
    table = (
        every.join(first, on=key, how="left", maintain_order="left", nulls_equal=True)
        .join(found, on=key, how="left", maintain_order="left", nulls_equal=True)
        .with_columns(pl.coalesce("h1", "h2").alias("__hhash"))
        .join(hh, left_on=["src", "__hhash"], right_on=["src", "hash"], how="left", maintain_order="left")
    )
    return table.select("src", "pid", pl.col("ppid").cast(_I32, strict=False), "cwdhash",
                        pl.coalesce("__hname", "__hhash").alias("host")).cast(pl.Schema(PROCESS_SCHEMA))  # type: ignore[arg-type]


def _apply_time_metric(ev: pl.DataFrame, meta: pl.DataFrame, problems: dict[int, list[str]]) -> pl.DataFrame:
    """Convert ts/dur to µs in files whose (first) ``CM`` time_metric is not ``US`` (a
    time beyond Int64 in µs is clipped to it); then a duration beyond
    ±:data:`_MAX_DUR_US` reads as null, counted in ``problems[src]``."""
    cm = (
        meta.filter((pl.col("name") == "CM") & (pl.col("a_name") == "time_metric"))
        .group_by("src", maintain_order=True).agg(pl.col("a_value").first())
    )
    factors = {src: _TIME_SCALE.get((unit or "US").upper(), 1.0) for src, unit in cm.iter_rows()}
    scaled = {src: f for src, f in factors.items() if f != 1.0}
    if scaled:
        factor = pl.col("src").replace_strict(list(scaled), list(scaled.values()), default=None,
                                              return_dtype=pl.Float64)
        ev = ev.with_columns(
            pl.when(factor.is_not_null())
            .then((pl.col(c) * factor).round().clip(-_F63, _F63).cast(pl.Int64)).otherwise(pl.col(c)).alias(c)
            for c in ("ts", "dur")
        )
    lo, hi = ev.select(pl.col("dur").min().alias("lo"), pl.col("dur").max().alias("hi")).row(0)
    if (lo is None or lo >= -_MAX_DUR_US) and (hi is None or hi <= _MAX_DUR_US):
        return ev
    odd = ~pl.col("dur").is_between(-_MAX_DUR_US, _MAX_DUR_US)
    for src, n in ev.filter(odd).group_by("src").len().sort("src").iter_rows():
        if src in problems:
            _count_problem(problems[src], n, _NULL_DUR)
    return ev.with_columns(pl.when(odd).then(None).otherwise(pl.col("dur")).alias("dur"))


def _position_rules() -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """(reset, base, advance) expressions of the file-position model, over ``op``, ``pos``
    and ``parg`` (see :data:`CHUNK_SCHEMA`).

    open/fopen reset the position to 0 (unknown with O_APPEND or mode "a"); lseek sets it
    to its ``ret``; fseek(SEEK_SET) to its offset (other whence: unknown); ftell reports
    it; rewind sets 0; close makes it unknown. Stream reads/writes advance it by the bytes
    transferred, fseek(SEEK_CUR) by its offset. A failed call (ret < 0) changes nothing.
    """
    op, pos = pl.col("op"), pl.col("pos")
    arg = pl.when(pl.col("parg") != _NUL).then(pl.col("parg"))

    def has(bit: int) -> pl.Expr:
        return (pos & bit) != 0

    ok, is_cur = has(_POS_OK), has(_POS_CUR)
    reset = (
        ((op == _OPEN) & ok)
        | (op.is_in((_LSEEK, _FTELL)) & (arg >= 0).fill_null(False))
        | ((op == _FSEEK) & ~is_cur & ok)
        | op.is_in((_REWIND, _CLOSE))
    )
    base = (
        pl.when(op == _OPEN).then(pl.when(has(_POS_APPEND)).then(None).otherwise(0))
        .when(op.is_in((_LSEEK, _FTELL))).then(arg)
        .when(op == _FSEEK).then(pl.when(has(_POS_SET)).then(arg))
        .when(op == _REWIND).then(0)
    )
    advance = (
        pl.when(op.is_in((_XFER, _SXFER))).then(arg.fill_null(0))
        .when((op == _FSEEK) & is_cur & ok).then(arg.fill_null(0))
        .otherwise(0)
    )
    return reset.fill_null(False), base, advance


#: Rows of the sort key built at a time (:func:`_output_order`).
_KEY_STEP = 1 << 18


def _output_order(ev: pl.DataFrame) -> np.ndarray:
    """Row indices of ``ev`` in output order: by ``ts`` (null last), then ``src``, then ``seq``.

    (src, seq) is unique per row. When (ts, src, seq) packs into one non-negative Int64,
    numpy argsorts the packed keys (its stable sort merges the runs the rows already
    come in: each layout group is in line order); otherwise a three-key argsort. The
    ``seq`` of a byte range's rows (range ``k`` above bit 32, plus the line in the range)
    packs as ``k`` above as many bits as the longest range's lines need. The key is
    built :data:`_KEY_STEP` rows at a time from slices of the columns (views of polars'
    buffers within a chunk): one array of 8 B/event besides the argsort's. Whole-column
    copies of ``ts`` and ``seq`` and their temporaries took 40 of the 57 ms this took on a
    2 M-event file, and 10 k page faults.
    """
    tmin, tmax = _int_stat(ev["ts"].min()), _int_stat(ev["ts"].max())
    src_max = _int_stat(ev["src"].max()) or 0
    b_src = max(src_max, 1).bit_length()
    seq_max, seq_min = _int_stat(ev["seq"].max()) or 0, _int_stat(ev["seq"].min()) or 0
    n = ev.height
    ts_s, seq_s, src_s = ev["ts"], ev["seq"], ev["src"]
    steps = [(at, min(_KEY_STEP, n - at)) for at in range(0, n, _KEY_STEP)]
    b_line = 0  # ranges: bits of the line within a range (0: seq packs as it is)
    if seq_max >> 32 and seq_min >= 0:
        low = max((int((seq_s.slice(at, m).to_numpy() & 0xFFFFFFFF).max()) for at, m in steps), default=0)
        b_line = max(low, 1).bit_length()
        b_seq = (seq_max >> 32).bit_length() + b_line
    else:
        b_seq = max(seq_max, 1).bit_length()
    span = 1 if tmin is None or tmax is None else tmax - tmin + 2  # +1 for null ts
    if span.bit_length() + b_src + b_seq > _PACK_BITS or seq_min < 0:
        order = ev.select(pl.arg_sort_by(pl.col("ts").fill_null((tmax or 0) + 1), "src", "seq"))
        return order.to_series().to_numpy().astype(np.int64)
    null_ts = (tmax + 1) if tmax is not None else 0
    key = np.empty(n, dtype=np.int64)
    for at, m in steps:
        out = key[at:at + m]
        t = ts_s.slice(at, m)
        np.subtract((t.fill_null(null_ts) if t.null_count() else t).to_numpy(), tmin or 0, out=out)
        out <<= b_src + b_seq
        if src_max:  # (a part of one file, src 0, adds nothing)
            out |= src_s.slice(at, m).to_numpy().astype(np.int64) << b_seq
        seq = seq_s.slice(at, m).to_numpy()
        if b_line:
            out |= (seq >> 32) << b_line
            out |= seq & 0xFFFFFFFF
        else:
            out |= seq
    return np.argsort(key, kind="stable")


def _int_stat(value: object) -> int | None:
    """An integer Series statistic (``min``/``max``) as int; None when empty or all null."""
    return None if value is None else int(cast(int, value))


def _unname_stray(rows: pl.DataFrame, stray: np.ndarray, problems: dict[int, list[str]]) -> pl.DataFrame:
    """``rows`` with the file of each stray transfer (``stray``, by row) taken away (file
    hash and path null: the call stays, on no file), counted in its file's ``problems``."""
    mask = pl.Series(stray)
    for src, n in rows.select("src").filter(mask).group_by("src").len().sort("src").iter_rows():
        if src in problems:
            _count_problem(problems[src], n, STRAY_IO)
    return rows.with_columns(pl.when(mask).then(None).otherwise(pl.col(c)).alias(c) for c in ("fhash", "__path"))


def _offsets(ev: pl.DataFrame, order: np.ndarray, release: bool = False) -> tuple[pl.Series, np.ndarray | None]:
    """The offset of each row of ``ev``, in ``ev``'s own row order (``order`` lists the rows
    in output order, in which the streams are followed): given for pread/pwrite,
    reconstructed for stream reads and writes; and which rows are stray transfers (a bool
    array by row, None when none is), which have no offset.

    A stray transfer is a read or write its process logged on a file it had opened and
    closed again, with no descriptor of it open at the time (the opens and closes of the
    stream counted in output order; a close never takes the count below zero, so closing
    an inherited descriptor changes nothing); or a write on a file its process had opened
    before, read-only every time (``flags`` without write access, or an fopen mode ``r``
    without ``+``). DFTracer's ``close`` closes the descriptor
    before it forgets the file it named: a socket or pipe another thread opens in between
    gets the number, and its calls are logged as the file's (a PyTorch DataLoader worker's
    handshake with the training process: 35 + 13 bytes written to a dataset file).

    Rows of one (trace file, pid, POSIX or STDIO, file hash) in (ts, line) order form a
    stream; a reset or the stream start begins a segment; within a segment the offset of
    a transfer is the segment's base plus the bytes advanced before it (exclusive running
    sum). A segment with an unknown base yields null offsets. ``ev`` has ``__p`` (the
    process index) and the model's inputs ``op``, ``pos``, ``parg``. With the C extension
    the rules and the scan are one pass over the rows in output order (``file_offsets`` in
    ``_pfwscan.c``, reading polars' buffers where they are); without it, polars rule
    columns (:func:`_position_rules`) and a few vectorised numpy passes over the I/O rows
    sorted by (stream, output position). ``release``: return what the inputs' copies held
    to the system before the column is built (see :func:`_resolve`'s ``alone``).
    """
    n = ev.height
    if _NATIVE is not None:  # the whole model in one C pass (file_offsets in _pfwscan.c)
        values = np.empty(n, dtype=np.int64)
        valid = np.empty(n, dtype=np.bool_)
        stray = np.empty(n, dtype=np.bool_)
        proc = _stream_processes(ev).to_numpy()
        fcode = ev.select(_file_key()).to_series().to_numpy()
        _NATIVE.file_offsets(np.ascontiguousarray(order, dtype=np.int64), np.ascontiguousarray(proc, dtype=np.uint32),
                             np.ascontiguousarray(fcode, dtype=np.uint32),
                             *(np.ascontiguousarray(ev[c].rechunk().to_numpy(), dtype=dt) for c, dt in (
                                 ("op", np.int8), ("pos", np.uint8), ("parg", np.int64))),
                             values, valid, stray)
        del proc, fcode
        if release:  # the inputs' copies, before the column is built beside the values
            release_free_memory(keep_large=True)
        found = bool(stray.any())
        if found:  # on no file: no offset
            valid &= ~stray
        offset = pl.select(pl.when(pl.lit(pl.Series(valid))).then(pl.lit(pl.Series(values))).alias("offset"))
        return offset.to_series(), (stray if found else None)
    io = (pl.col("pos") & _POS_IO) != 0
    stream = (pl.col("__sp").cast(pl.Int64) * 2
              + ((pl.col("pos") & _POS_STDIO) != 0).cast(pl.Int64)) * (1 << 32) + _file_key().cast(pl.Int64)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    reset, base, advance = _position_rules()
    narrow = ev.lazy().with_row_index("__row").with_columns(_stream_processes(ev).alias("__sp")).filter(io).select(
        "__row", stream.alias("g"), reset.alias("reset"),
        # a negative base (or none) is an unknown position
        base.fill_null(-1).alias("base"), advance.alias("adv"),
        pl.col("op").is_in((_XFER, _SXFER)).alias("xfer"),
        # the descriptors opened (+1) and closed (-1), and the transfers that need one
        pl.when((pl.col("op") == _OPEN) & ((pl.col("pos") & _POS_OK) != 0)).then(1)
        .when(pl.col("op") == _CLOSE).then(-1).otherwise(0).cast(pl.Int8).alias("fd"),
        pl.col("op").is_in((_XFER, _SXFER, _PXFER)).alias("acc"),
        # the opens that could write, and the transfers that write
        ((pl.col("op") == _OPEN) & ((pl.col("pos") & _POS_OK) != 0) & ((pl.col("pos") & _POS_RDONLY) == 0)).alias("wopen"),
        ((pl.col("pos") & _POS_WRITE) != 0).alias("wr"),
    ).collect()
    values = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    # pread/pwrite: the offset argument
    given = ev.lazy().with_row_index("__row").filter((pl.col("op") == _PXFER) & (pl.col("parg") != _NUL)) \
        .select("__row", "parg").collect()
    if given.height:
        at = rank[given["__row"].to_numpy()]
        values[at] = given["parg"].to_numpy()
        valid[at] = True
    stray = np.zeros(n, dtype=bool)
    if narrow.height:
        _stream_offsets(narrow, rank, values, valid, stray)
    values, valid = values[rank], valid[rank]  # (by output position: back to the rows' order)
    valid &= ~stray  # a stray transfer is on no file: no offset
    offset = pl.select(pl.when(pl.lit(pl.Series(valid))).then(pl.lit(pl.Series(values))).alias("offset"))
    return offset.to_series(), (stray if stray.any() else None)


def _file_key() -> pl.Expr:
    """The file of a row's position stream (UInt32, 0 for none): its file hash's category code
    (DFTracer 2.x), else the code of its ``path``/``fname`` argument (DFTracer 1.x names
    files by ``fname``; hashes and paths are different strings, so their codes never meet)."""
    return pl.coalesce(pl.col("fhash").to_physical(), pl.col("__path").to_physical()).fill_null(0).alias("__fk")


#: Process ids below which a process without events of its own main thread is taken for
#: an MPI rank number (see :func:`_stream_processes`).
_RANK_PIDS = vocabulary.RANK_PIDS_BELOW


def _stream_processes(ev: pl.DataFrame) -> pl.Series:
    """The process of each row's position stream (UInt32): ``__p``, except in rank-numbered
    processes, whose threads are processes of their own.

    pydftracer 1.x writes the MPI rank as ``pid`` (as DLIO's traces have it) and DLIO's
    forked reader workers keep writing into the rank's file, so only the thread id tells
    their file positions apart (the vocabulary later gives them their own pids:
    :func:`~.vocabulary.canonicalize`). A process numbered below :data:`_RANK_PIDS` with no
    event of its own main thread (``tid == pid``) is such a rank: its (process, thread)
    pairs get indices after the processes'."""
    p = ev["__p"]
    if ev.height == 0 or not bool((ev["pid"] < _RANK_PIDS).any()):
        return p
    per = ev.lazy().group_by("__p").agg(pl.col("pid").first(), (pl.col("tid") == pl.col("pid")).any().alias("own"))
    ranks = per.filter((pl.col("pid") < _RANK_PIDS) & ~pl.col("own").fill_null(False)).collect()["__p"]
    if ranks.is_empty():
        return p
    threads = pl.col("__p").is_in(ranks.implode()) & pl.col("tid").is_not_null()
    key = pl.struct("__p", "tid")
    base = int(p.max() or 0) + 1  # type: ignore[arg-type]
    return ev.select(pl.when(threads).then(key.rank("dense").cast(pl.UInt32) - 1 + base)  # ranks of all rows
                     .otherwise(pl.col("__p")).cast(pl.UInt32).alias("__sp")).to_series()


def _stream_offsets(narrow: pl.DataFrame, rank: np.ndarray, values: np.ndarray, valid: np.ndarray,
                    stray: np.ndarray) -> None:
    """Fill ``values``/``valid`` (output order) with the reconstructed offsets of the
    stream transfers among the I/O rows ``narrow``, and mark ``stray`` (by row) the stray
    transfers (see :func:`_offsets`): vectorised numpy (builds without the C extension,
    which does all of :func:`_offsets` in one pass)."""
    n, m = len(rank), narrow.height
    pos = rank[narrow["__row"].to_numpy()]
    g = narrow["g"].to_numpy()
    # streams, each in output (time) order
    b_pos = max(n, 1).bit_length()
    if (int(g.max()) + 1).bit_length() + b_pos <= _PACK_BITS:
        idx = np.argsort((g << b_pos) | pos)  # keys are unique
    else:
        idx = np.lexsort((pos, g))
    g, pos = g[idx], pos[idx]
    reset_ = narrow["reset"].to_numpy()[idx]
    adv = narrow["adv"].to_numpy()[idx]
    brk = reset_.copy()
    brk[0] = True
    brk[1:] |= g[1:] != g[:-1]
    cs = np.cumsum(adv) - adv  # bytes advanced before each row
    last = np.maximum.accumulate(np.where(brk, np.arange(m), 0))  # the row's segment start
    seg_base = np.where(reset_, narrow["base"].to_numpy()[idx], -1)[last]
    known = narrow["xfer"].to_numpy()[idx] & (seg_base >= 0)
    values[pos[known]] = (seg_base + cs - cs[last])[known]
    valid[pos[known]] = True
    # descriptors open per stream: the running sum of opens and closes held at 0 from below
    # (Lindley: the sum minus its running minimum where that is negative), per stream
    fd = narrow["fd"].to_numpy()[idx].astype(np.int64)
    first = g != np.roll(g, 1)
    first[0] = True
    gid = np.cumsum(first) - 1
    total = np.cumsum(fd)
    run = total - (total - fd)[np.flatnonzero(first)][gid]  # the stream's own running sum
    span = 2 * m + 2  # more than any running sum's range: streams' minima never meet
    low = np.minimum.accumulate(run - gid * span) + gid * span
    held = run - np.minimum(low, 0)
    starts = np.flatnonzero(first)
    opens = np.cumsum(fd > 0)
    opened = (opens - (opens - (fd > 0))[starts][gid]) > 0
    wopen = narrow["wopen"].to_numpy()[idx]
    wopens = np.cumsum(wopen)
    writable = (wopens - (wopens - wopen)[starts][gid]) > 0  # an open for writing before (or at) the row
    hit = narrow["acc"].to_numpy()[idx] & opened & ((held == 0) | (narrow["wr"].to_numpy()[idx] & ~writable))
    stray[narrow["__row"].to_numpy()[idx][hit]] = True



def _row_index(rows: np.ndarray) -> pl.Series:
    """``rows`` as a polars gather index: UInt32 (polars' own index type) when it fits; an
    Int64 index is converted and bounds-checked again for every column (13 columns of
    2.1 M rows: 73 vs 52 ms)."""
    return pl.Series(rows.astype(np.uint32, copy=False) if len(rows) < (1 << 32) else rows)



def _distinct_categorical(values: pl.Series) -> pl.Series:
    """The distinct non-null values of the Categorical ``values`` (in code order): one row
    of each code, found with numpy over the integer codes (2.1 M rows: 16 ms, against
    32 ms for ``unique()``)."""
    present = values.drop_nulls()
    codes = present.to_physical().to_numpy()
    if not len(codes):
        return present
    row = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    row[codes] = np.arange(len(codes), dtype=np.int64)  # a row of each code (any one)
    return present.gather(_row_index(row[row >= 0]))


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
