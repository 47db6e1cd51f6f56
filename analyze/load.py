"""Load DFTracer traces (``*.pfw`` / ``*.pfw.gz``) into the dlreplay event table.

Loading has two stages with a narrow interface between them, so that the first can run
anywhere (threads here; later, workers of a distributed scheduler) and the second once:

:func:`parse_part` (per group of trace files, several groups in parallel threads;
zlib/ISA-L and polars release the GIL) turns files into a :class:`TracePart`:

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
   row per line, one column per ``"key":value`` token. With the fields needed here this
   costs about half of what polars' JSON reader does per DFTracer line. The text of many
   small files is tokenised and parsed as one batch (up to about ``_CHUNK_BYTES`` of
   text; rows are attributed to files by their counted lines), so a trace of hundreds of
   small files costs little more than one file of the same size.
4. **Layouts**: rows are grouped by (name token, category token, token count). DFTracer
   writes every event of one function with the same keys in the same order, so one
   sample row per group is parsed in Python into a *layout* (key path, prefix, quoting,
   closing braces of every token); the group's values are extracted with vectorised
   string expressions and checked (line start and end, argument keys, numbers parse).
5. **Fallback**: rows without a usable layout (nested values, commas or escapes inside
   strings, lines longer than the tokens read, small groups, garbage) are re-read from
   their line bytes with polars' JSON reader; a failing batch is bisected down to the
   malformed lines, which are dropped and counted against their own file. No Python code
   runs per line on the happy path.

:func:`combine_parts` (once, over all parts of the run; every step is vectorised over all
files at once, never a per-file query): time unit (``CM``) per file, ppid and host
(``start``/``HH`` records of the process's own file), sizes, and file offsets:
read/write/fread/fwrite offsets are reconstructed per (file, pid, POSIX or STDIO, file
hash) in time order (open/seek reset the position; one C pass over the output order when
the extension is built, else cumulative sums over segments in numpy).
``FH`` file hashes are resolved to paths across all files (the record may sit in
another process's file; relative names use the writing process's working directory).
``fhash`` is Categorical in the raw rows, so rows map to file indices through their
category codes, never by hashing strings. The output order is (``ts``, file, line):
packed integer keys are value-sorted with numpy, every dense output column is gathered
once, and repeated strings (host, path, hash, source) come from small per-process and
per-file tables. Meanwhile, in a second thread, the summary's per-(file, host, pid)
table (:attr:`LoadedTrace.per_process`) is counted over integer file and process keys.

Units: ``ts``/``dur`` microseconds (a ``CM`` time metric of ``NS``/``MS``/``S`` is
converted), sizes and offsets bytes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import mmap
import os
import queue
import re
import threading
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import polars as pl

from dlreplay.errors import TraceError
from dlreplay.pfw import DecodeStats as _Stats
from dlreplay.pfw import PlainFile, Slabs, anonymous_map
from dlreplay.pfw import decoded_spans as _decoded_spans
from dlreplay.schema import CAT_CHECKPOINT, CLOSE_OPS, EVENT_SCHEMA, OPEN_OPS, READ_OPS, WRITE_OPS

from . import vocabulary
from .files import file_process_table, file_process_table_keyed

__all__ = [
    "FileReport", "LoadedTrace", "TraceDamageWarning", "TracePart", "combine", "combine_parts", "load",
    "load_trace", "parse_part",
]

TRACE_SUFFIXES = (".pfw", ".pfw.gz")
MANIFEST_NAME = "manifest.json"

#: Decoded text per parse batch (bytes). Large batches amortise per-layout overhead.
_CHUNK_BYTES = 32 << 20
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
}
#: Arg keys whose values may be written as JSON strings even in DFTracer 2.x.
_LOOSE_INT_ARGS = {"epoch", "step", "batch_size", "image_idx", "bytes", "ppid"}
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
        return self.dropped_lines > 0 or self.dropped_bytes > 0

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
    """Parsed, not yet resolved rows of some trace files: the output of :func:`parse_part`.

    ``events`` and ``meta`` have the columns of :data:`RAW_SCHEMA`: ``src`` (the file's
    index in the run, as given to :func:`parse_part`), ``seq`` (line number in that file,
    0-based, blank lines counted) and the raw values as written (``ts``/``dur`` in the
    file's own time unit, hashes unresolved). ``events`` holds event rows, ``meta`` the
    metadata records (``FH``, ``HH``, ``CM``, ...; ``ph`` 4 or ``M``). Row order is
    unspecified. ``files`` has one report per file of the part, in the order given, with
    ``events`` still 0 (:func:`combine_parts` fills it in).
    """

    events: pl.DataFrame
    meta: pl.DataFrame
    files: list[tuple[int, FileReport]]


# =======================================================================================
# Public entry points


def load_trace(path: str | os.PathLike | Sequence[str | os.PathLike], *,
               threads: int | None = None) -> LoadedTrace:
    """Load a trace directory (all ``*.pfw``/``*.pfw.gz`` below it), one file, or a list of files.

    ``threads`` bounds how many groups of files are decompressed and parsed concurrently
    (default: the CPU count, at most 8). Raises :class:`~dlreplay.errors.TraceError` when
    the path does not exist or holds no trace file. Damage never raises: see
    :attr:`LoadedTrace.files`.
    """
    files, manifest = _find_inputs(path)
    workers = max(1, threads or min(os.cpu_count() or 1, 8))
    groups = _groups(list(enumerate(files)), workers)
    workers = min(workers, len(groups))
    if workers == 1:
        parts = [parse_part(g) for g in groups]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dlreplay-load") as pool:
            parts = list(pool.map(parse_part, groups))
    return dataclasses.replace(combine(parts, [p.name for p in files]), manifest=manifest)


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
    duplicates) and files that hold no events. One sentence each, naming the file."""
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


def parse_part(jobs: Sequence[PartJob]) -> TracePart:
    """Decompress and parse the trace files ``jobs`` = [(src, path), ...] into a :class:`TracePart`.

    ``src`` is the file's index in the whole run (the position of its name in the
    ``names`` given to :func:`combine_parts`); the indices of all parts of a run must be
    distinct. The result depends only on the files' bytes and their ``src``, never on
    how files are grouped into parts or on other parts, so parts can be computed in any
    order, in threads or processes, and :func:`combine_parts` gives the same table.
    Damage is salvaged and counted in the file's own report; an unreadable file raises
    :class:`~dlreplay.errors.TraceError`.

    A job may also be a byte range of one file's gzip members (see :data:`PartJob` and
    :func:`member_ranges`, which only cuts after a member that ends a line): its rows
    are whole lines, their ``seq`` is ``k << 32`` plus the line number in the range (so
    it orders the file's lines), and its report counts only its range;
    :func:`combine_parts` adds up the reports of a file's ranges.
    """
    batch = _new_batch()
    done: list[tuple[int, Path, int, _Stats]] = []
    for job in jobs:
        src, p = job[0], job[1]
        path = Path(p)
        stats = _Stats()
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
        chunks = _prefetched(data, stats) if len(data) >= _PREFETCH_BYTES else _text_chunks(data, stats)
        for text, damaged_after, cut in chunks:
            body, tail = _split_tail(text)
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
        done.append((src, path, len(data), stats))
    batch.flush()
    files = []
    for src, path, size, stats in done:
        if size and not stats.lines and not stats.problems:
            stats.problems.append("file holds no trace lines")
        files.append((src, FileReport(
            path=str(path), bytes=size, members=stats.members, lines=stats.lines, events=0,
            dropped_lines=stats.dropped_lines, dropped_bytes=stats.dropped_bytes,
            problems=stats.problems,
        )))
    # chunks as scanned (zero-copy views of the scanner's output): the combine stage makes
    # one chunk of all parts' rows in one copy (a copy per part here as well cost ~0.1 s
    # of wall time and ~10 % more peak memory on the ingest benchmark)
    return TracePart(events=_concat(batch.events), meta=_concat(batch.meta), files=files)


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate raw frames (RAW_SCHEMA); an empty frame when there are none."""
    frames = [f if f.schema == RAW_SCHEMA else f.cast(RAW_SCHEMA) for f in frames if f.height]  # type: ignore[arg-type]
    if not frames:
        return pl.DataFrame(schema=RAW_SCHEMA)
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def _with_events(rep: FileReport, n: int) -> FileReport:
    return FileReport(rep.path, rep.bytes, rep.members, rep.lines, n, rep.dropped_lines,
                      rep.dropped_bytes, list(rep.problems))


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
#: thread while the current one is parsed (zlib/ISA-L release the GIL).
_PREFETCH_BYTES = 2 << 20


def _prefetched(data: bytes | PlainFile, stats: _Stats) -> Iterable[tuple[list[_Piece], bool, bool]]:
    """:func:`_text_chunks`, decoded one chunk ahead in a helper thread.

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
        try:
            for chunk in _text_chunks(data, mine, Slabs()):
                if stop.is_set():
                    return
                q.put((chunk, delta(seen), None))
            q.put((None, delta(seen), None))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            q.put((None, delta(seen), exc))

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
                yield pending, True, False
            pending, size = [], 0
        elif size >= _CHUNK_BYTES:
            # cut after the last newline, found from the end
            j, k = len(pending) - 1, -1
            while j >= 0 and (k := pending[j][0].rfind(b"\n", pending[j][1], pending[j][2])) < 0:
                j -= 1
            if j >= 0:
                b, lo, hi = pending[j]
                yield [*pending[:j], (b, lo, k + 1)], False, True
                pending = [x for x in [(b, k + 1, hi), *pending[j + 1:]] if x[2] > x[1]]
                size = sum(x[2] - x[1] for x in pending)
            if size > _MAX_LINE_BYTES:  # what is left is one unfinished line, already too long
                stats.drop(1, size)
                stats.problems.append(f"dropped a line longer than {_MAX_LINE_BYTES >> 20} MiB (no trace event is; "
                                      f"garbage such as NUL bytes)")
                pending, size, skipping = [], 0, True
    if pending:
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
                "epoch", "step", "batch_size", "image_idx", "abytes")
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
        self.meta: list[pl.DataFrame] = []
        self.rest = _Batch()
        #: texts waiting for the flush, one list per added text, of its line segments:
        #: (src, seq0, text, stats, lines, valid UTF-8)
        self.pending: list[list[_Seg]] = []
        #: (src, line number in the inner batch's text, line number in the file) of rejected lines
        self.remap: list[tuple[int, np.ndarray, np.ndarray]] = []

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
                        np.fromiter((seg[1] for seg in segs), dtype=np.int64, count=len(segs)), checked=True)
        if scanned is None:
            raise AssertionError("the scanner refused text its own UTF-8 check accepted")
        events, meta, per_seg, rejected = scanned
        for seg, k in zip(segs, per_seg.tolist(), strict=True):
            seg[3].lines += k
        if events.height:
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


def _scan(text: bytes | memoryview | list[Any], nlines: int, first: np.ndarray, srcs: np.ndarray,
          seq0s: np.ndarray, checked: bool = False) -> tuple[pl.DataFrame, pl.DataFrame, np.ndarray, np.ndarray] | None:
    """Scan ``text`` (one buffer, or a list of buffers of complete lines scanned as one text;
    segment k: lines from ``first[k]``, of file ``srcs[k]`` from its line ``seq0s[k]``) with
    the C scanner: (event rows, metadata rows, accepted lines per segment, rejected lines as
    rows of (line in the whole text, start, end in the line's own buffer)); None when
    ``text`` is not valid UTF-8 (not checked again when ``checked``: the caller found it valid)."""
    cap = max(nlines, 1)
    ni, ns = len(_NATIVE_INTS), len(_NATIVE_STRS)
    # The output buffers are one anonymous mapping, unmapped when the last array viewing
    # it goes (the frames built from them view them, zero-copy). Large short-lived
    # malloc'd buffers would raise glibc's mmap threshold and fragment the heap across
    # loads (peak RSS grew ~15% per repeated load).
    scratch = anonymous_map(cap * (ni * 8 + 4 + ns * 4 + 8))
    ints = np.frombuffer(scratch, dtype=np.int64, count=ni * cap).reshape(ni, cap)
    imask = np.frombuffer(scratch, dtype=np.uint32, count=cap, offset=ni * cap * 8)
    strs = np.frombuffer(scratch, dtype=np.int32, count=ns * cap, offset=ni * cap * 8 + cap * 4).reshape(ns, cap)
    rows = np.frombuffer(scratch, dtype=np.int64, count=cap, offset=ni * cap * 8 + cap * 4 + ns * cap * 4)
    assert _NATIVE is not None
    out = _NATIVE.scan(text, ints, imask, strs, rows, checked)
    if out is None:
        return None
    nev, nmeta, rejected, uniques, any_mask = out
    rej = np.frombuffer(rejected, dtype=np.int64).reshape(-1, 3)
    values = pl.Series(uniques, dtype=_STR)
    op_of = np.fromiter((_OP_CODE.get(u, 0) for u in uniques), dtype=np.int8, count=len(uniques))
    # events are rows [0, nev), metadata records rows [cap - nmeta, cap)
    frames = []
    per_seg = np.zeros(len(first), dtype=np.int64)
    for sl in (slice(0, nev), slice(cap - nmeta, cap)):
        lines = rows[sl]
        if len(first) == 1:
            src: int | np.ndarray = int(srcs[0])
            seq = lines + seq0s[0]
            per_seg[0] += len(lines)
        else:
            seg = np.searchsorted(first, lines, side="right") - 1
            src, seq = srcs[seg], seq0s[seg] + (lines - first[seg])
            per_seg += np.bincount(seg, minlength=len(first))
        frames.append(_native_frame(sl, ints, imask, strs, values, op_of, any_mask, src, seq))
    return frames[0], frames[1], per_seg, rej


def _native_frame(sl: slice, ints: np.ndarray, imask: np.ndarray, strs: np.ndarray, values: pl.Series,
                  op_of: np.ndarray, any_mask: int, src: int | np.ndarray, seq: np.ndarray) -> pl.DataFrame:
    """The RAW_SCHEMA frame of the scanner's output rows ``sl`` (of file ``src``, a constant
    or one per row, lines ``seq``)."""
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
        data[col] = ints[k, sl]
        exprs[col] = pl.col(col) if all_mask & bit else pl.when((pl.col("__m") & bit) != 0).then(pl.col(col))
    for k, col in enumerate(_NATIVE_STRS):
        codes = strs[k, sl]
        lo, hi = int(codes.min()), int(codes.max())
        dtype = RAW_SCHEMA[col]
        if hi < 0:
            exprs[col] = pl.lit(None, dtype=dtype)
        elif lo == hi:  # one value (cat, ph, host hash of a file): a constant
            exprs[col] = pl.lit(values[lo], dtype=dtype)
        else:
            data[col] = codes
            exprs[col] = pl.lit(values if dtype == _STR else values.cast(dtype)).gather(
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
# Stage 2: TraceParts -> the event table


def combine(parts: Sequence[TracePart], names: Sequence[str]) -> LoadedTrace:
    """Combine the :class:`TracePart` s of one run into a :class:`LoadedTrace` (no manifest).

    ``names[src]`` is the ``source`` of file ``src`` (its basename); every file of the run
    must be in exactly one part. This resolves what needs more than one line or file:
    the time unit per file (``CM``), each process's ppid and host (``start``/``HH`` in
    its own file), sizes, offsets reconstructed per (file, pid, POSIX or STDIO, file
    hash) stream, and ``FH`` paths across all files. The result has the
    :data:`~dlreplay.schema.EVENT_SCHEMA` table sorted by (``ts``, file, line), the
    reports in ``src`` order with their event counts and the per-(file, host, pid) table
    of the summary. It does not depend on how the files were split into parts, nor on
    the parts' order.
    """
    ev = _concat([p.events for p in parts])
    meta = _concat([p.meta for p in parts])
    reports: dict[int, FileReport] = {}
    for p in parts:
        for src, rep in p.files:  # a file split into byte ranges has one report per range
            reports[src] = _add_reports(reports[src], rep) if src in reports else rep
    per_src = np.bincount(ev["src"].to_numpy()) if ev.height else np.zeros(0, dtype=np.int64)
    counts = {int(i): int(per_src[i]) for i in np.flatnonzero(per_src)}
    files = [_with_events(reports[i], counts.get(i, 0)) for i in sorted(reports)]
    events, per_process = _build_events(ev, meta, names)
    # the one event vocabulary (roles, DLIO's rank pids, start/stop markers): analyze/vocabulary.py
    events, changed = vocabulary.canonicalize(events, vocabulary.marker_spans(meta), list(names))
    if changed:  # processes or roles other than the raw rows said: count them again, by role
        per_process = file_process_table(events)
    return LoadedTrace(events=events, files=files, per_process=per_process)


def combine_parts(parts: Sequence[TracePart], names: Sequence[str]) -> tuple[pl.DataFrame, list[FileReport]]:
    """(event table, per-file reports) of :func:`combine`."""
    loaded = combine(parts, names)
    return loaded.events, loaded.files


def _add_reports(a: FileReport, b: FileReport) -> FileReport:
    """The report of a file from the reports of two of its byte ranges (in file order)."""
    return FileReport(path=a.path, bytes=a.bytes + b.bytes, members=a.members + b.members,
                      lines=a.lines + b.lines, events=0, dropped_lines=a.dropped_lines + b.dropped_lines,
                      dropped_bytes=a.dropped_bytes + b.dropped_bytes, problems=[*a.problems, *b.problems])


def member_ranges(path: str | os.PathLike, target_bytes: int) -> list[tuple[int, int]] | None:
    """Byte ranges of about ``target_bytes`` (compressed) made of whole gzip members.

    A range ends only after a member whose text ends with a newline, so no line spans
    two ranges. Streams the file once (bounded memory). Returns None for a file that
    does not decode cleanly from start to end (damaged, not gzip): such a file is
    parsed whole, where the salvage rules apply.
    """
    import zlib

    ranges: list[tuple[int, int]] = []
    start = pos = 0  # pos: absolute offset of the next compressed byte fed
    d = zlib.decompressobj(wbits=31)
    last = b""
    member_start = 0
    try:
        with open(path, "rb") as fh:
            pending = b""
            while True:
                chunk = pending or fh.read(1 << 20)
                pending = b""
                if not chunk:
                    break
                out = d.decompress(chunk)
                pos += len(chunk)
                if out:
                    last = out[-1:]
                if d.eof:
                    end = pos - len(d.unused_data)  # this member ends here
                    pending = d.unused_data
                    pos = end
                    if last == b"\n" and end - start >= target_bytes:
                        ranges.append((start, end))
                        start = end
                    d = zlib.decompressobj(wbits=31)
                    last = b""
                    member_start = end
        if not d.eof and pos != member_start:
            return None  # a truncated last member
    except (OSError, zlib.error):
        return None
    if start < pos:
        ranges.append((start, pos))
    return ranges


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
    pmin, pmax = _int_stat(ev["pid"].min()), _int_stat(ev["pid"].max())
    if pmin is not None and pmax is not None and 0 <= pmin and pmax < (1 << 32):
        packed = pl.col("src").cast(pl.Int64) * (1 << 32) + pl.col("pid")
        keys = ev.select(packed.unique().alias("__k"))["__k"]
        every = pl.DataFrame({"src": (keys // (1 << 32)).cast(_SRC), "pid": keys % (1 << 32)})
        return every, _lookup(packed, keys, range(keys.len()), pl.UInt32)
    every = ev.select("src", "pid").unique()  # pids beyond 32 bits (or none): a struct key
    idx = pl.struct("src", "pid").replace_strict(every.to_struct().to_list(), range(every.height),
                                                 default=None, return_dtype=pl.UInt32)
    return every, idx


def _process_table(every: pl.DataFrame, ev: pl.DataFrame, meta: pl.DataFrame) -> pl.DataFrame:
    """Per (src, pid) of ``every`` (same order): ppid, cwd hash (``start`` record), host
    (HH-resolved host hash).

    Everything comes from the process's own trace file; "first" is in line order.
    """
    key = ["src", "pid"]
    starts = (
        ev.filter((pl.col("name") == "start") & (pl.col("cat") == "dftracer"))
        .sort("src", "seq")
        .group_by(key, maintain_order=True)
        .agg(pl.col("ppid").drop_nulls().first(), pl.col("cwd").drop_nulls().first().alias("cwdhash"),
             pl.col("hhash").drop_nulls().first().alias("h1"))
    )
    cols = ["src", "pid", "hhash"]
    # the first host hash of the metadata records, else (rare) of the events, in line order
    hosts = meta.filter(pl.col("hhash").is_not_null()).select(cols).group_by(key, maintain_order=True) \
        .agg(pl.col("hhash").first().alias("h2"))
    missing = every.join(hosts, on=key, how="anti")
    if missing.height:
        hosts = pl.concat([hosts, ev.join(missing, on=key, how="semi").filter(pl.col("hhash").is_not_null())
                           .group_by(key).agg(pl.col("hhash").sort_by("seq").first().alias("h2"))])
    hh = _hash_map(meta, "HH", ["src"]).select("src", "hash", pl.col("name").alias("__hname"))
    table = (
        every.join(starts, on=key, how="left", maintain_order="left")
        .join(hosts, on=key, how="left", maintain_order="left")
        .with_columns(pl.coalesce("h1", "h2").alias("__hhash"))
        .join(hh, left_on=["src", "__hhash"], right_on=["src", "hash"], how="left", maintain_order="left")
    )
    return table.select("src", "pid", "ppid", "cwdhash", pl.coalesce("__hname", "__hhash").alias("host"))


def _apply_time_metric(ev: pl.DataFrame, meta: pl.DataFrame) -> pl.DataFrame:
    """Convert ts/dur to µs in files whose (first) ``CM`` time_metric is not ``US``."""
    cm = (
        meta.filter((pl.col("name") == "CM") & (pl.col("a_name") == "time_metric"))
        .group_by("src", maintain_order=True).agg(pl.col("a_value").first())
    )
    factors = {src: _TIME_SCALE.get((unit or "US").upper(), 1.0) for src, unit in cm.iter_rows()}
    scaled = {src: f for src, f in factors.items() if f != 1.0}
    if not scaled:
        return ev
    factor = pl.col("src").replace_strict(list(scaled), list(scaled.values()), default=None,
                                          return_dtype=pl.Float64)
    return ev.with_columns(
        pl.when(factor.is_not_null()).then((pl.col(c) * factor).round().cast(pl.Int64)).otherwise(pl.col(c)).alias(c)
        for c in ("ts", "dur")
    )


_O_APPEND = 0o2000
_SEEK_SET, _SEEK_CUR = 0, 1


def _sizes(ev: pl.DataFrame) -> pl.DataFrame:
    """``size`` (bytes transferred) and ``size_requested`` (bytes asked) for I/O and checkpoints.

    fread/fwrite return items, so bytes = items x item size (their ``size`` argument).
    """
    op = pl.col("op")
    is_xfer = op >= _XFER
    item = pl.when(op == _SXFER).then(pl.col("isize").fill_null(1)).otherwise(1)
    size = (
        pl.when(is_xfer).then(pl.when(pl.col("ret") >= 0).then(pl.col("ret") * item))
        .when(pl.col("cat") == CAT_CHECKPOINT).then(pl.col("abytes"))
    )
    requested = pl.when(is_xfer).then(pl.col("count") * item)
    return ev.with_columns(size.alias("size"), requested.alias("size_requested"))


def _position_rules() -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """(reset, base, advance) expressions of the file-position model.

    open/fopen reset the position to 0 (unknown with O_APPEND or mode "a"); lseek sets it
    to its ``ret``; fseek(SEEK_SET) to its offset (other whence: unknown); ftell reports
    it; rewind sets 0; close makes it unknown. Stream reads/writes advance it by the bytes
    transferred, fseek(SEEK_CUR) by its offset. A failed call (ret < 0) changes nothing.
    """
    op, ret = pl.col("op"), pl.col("ret")
    ok = ret.is_null() | (ret >= 0)
    appending = _appending()
    is_cur = (pl.col("whence") == _SEEK_CUR).fill_null(False)
    reset = (
        ((op == _OPEN) & ok)
        | (op.is_in((_LSEEK, _FTELL)) & (ret >= 0).fill_null(False))
        | ((op == _FSEEK) & ~is_cur & ok)
        | op.is_in((_REWIND, _CLOSE))
    )
    base = (
        pl.when(op == _OPEN).then(pl.when(appending).then(None).otherwise(0))
        .when(op.is_in((_LSEEK, _FTELL))).then(ret)
        .when(op == _FSEEK).then(pl.when(pl.col("whence") == _SEEK_SET).then(pl.col("aoffset")))
        .when(op == _REWIND).then(0)
    )
    advance = (
        pl.when(op.is_in((_XFER, _SXFER))).then(pl.col("size").fill_null(0))
        .when((op == _FSEEK) & is_cur & ok).then(pl.col("aoffset").fill_null(0))
        .otherwise(0)
    )
    return reset.fill_null(False), base, advance


def _appending() -> pl.Expr:
    """Opened for appending: ``O_APPEND`` in the flags, or a mode starting with "a"."""
    return ((pl.col("flags").fill_null(0) & _O_APPEND) != 0) | pl.col("mode").str.starts_with("a").fill_null(False)


def _output_order(ev: pl.DataFrame) -> np.ndarray:
    """Row indices of ``ev`` in output order: by ``ts`` (null last), then ``src``, then ``seq``.

    (src, seq) is unique per row. When (ts, src, seq) packs into one non-negative Int64,
    numpy argsorts the packed keys (its stable sort merges the runs the rows already
    come in: each layout group is in line order); otherwise a three-key argsort.
    """
    tmin, tmax = _int_stat(ev["ts"].min()), _int_stat(ev["ts"].max())
    b_src = max(_int_stat(ev["src"].max()) or 0, 1).bit_length()
    b_seq = max(_int_stat(ev["seq"].max()) or 0, 1).bit_length()
    span = 1 if tmin is None or tmax is None else tmax - tmin + 2  # +1 for null ts
    if span.bit_length() + b_src + b_seq > _PACK_BITS or (_int_stat(ev["seq"].min()) or 0) < 0:
        order = ev.select(pl.arg_sort_by(pl.col("ts").fill_null((tmax or 0) + 1), "src", "seq"))
        return order.to_series().to_numpy().astype(np.int64)
    ts = ev["ts"].fill_null((tmax + 1) if tmax is not None else 0).to_numpy()
    key = ((ts - (tmin or 0)) << (b_src + b_seq)) | (ev["src"].to_numpy().astype(np.int64) << b_seq) \
        | ev["seq"].to_numpy()
    return np.argsort(key, kind="stable")


def _int_stat(value: object) -> int | None:
    """An integer Series statistic (``min``/``max``) as int; None when empty or all null."""
    return None if value is None else int(cast(int, value))


def _offsets(ev: pl.DataFrame, order: np.ndarray, rank: np.ndarray) -> pl.Series:
    """Offsets in output order (``order`` lists ``ev``'s rows in output order, ``rank[row]``
    is the output position of a row): given for pread/pwrite, reconstructed for stream
    reads and writes.

    Rows of one (trace file, pid, POSIX or STDIO, file hash) in (ts, line) order form a
    stream; a reset or the stream start begins a segment; within a segment the offset of
    a transfer is the segment's base plus the bytes advanced before it (exclusive running
    sum). A segment with an unknown base yields null offsets. ``ev`` has ``__p`` and
    ``__f`` (process and file-hash indices). With the C extension the rules and the
    scan are one pass over the rows in output order (``file_offsets`` in ``_pfwscan.c``);
    without it, polars rule columns (:func:`_position_rules`) and a few vectorised numpy
    passes over the I/O rows sorted by (stream, output position).
    """
    n = ev.height
    io = pl.col("fhash").is_not_null() & pl.col("cat").is_in(("POSIX", "STDIO"))
    nfiles = (_int_stat(ev["__f"].max()) or 0) + 1
    stream = (pl.col("__p").cast(pl.Int64) * 2 + (pl.col("cat") == "STDIO").cast(pl.Int64)) * nfiles \
        + pl.col("__f").cast(pl.Int64)
    if _NATIVE is not None:  # the whole model in one C pass (file_offsets in _pfwscan.c)
        null = np.iinfo(np.int64).min
        cols = ev.select(
            stream.fill_null(-1).alias("g"), "op", *(pl.col(c).fill_null(null) for c in ("ret", "whence", "aoffset", "size")),
            _appending().alias("append"), io.fill_null(False).alias("io"),
        )
        values = np.empty(n, dtype=np.int64)
        valid = np.empty(n, dtype=np.bool_)
        _NATIVE.file_offsets(np.ascontiguousarray(order, dtype=np.int64),
                             *(np.ascontiguousarray(cols[c].to_numpy(), dtype=dt) for c, dt in (
                                 ("g", np.int64), ("op", np.int8), ("ret", np.int64), ("whence", np.int64),
                                 ("aoffset", np.int64), ("size", np.int64), ("append", np.bool_),
                                 ("io", np.bool_))),
                             values, valid)
        return pl.select(pl.when(pl.lit(pl.Series(valid))).then(pl.lit(pl.Series(values))).alias("offset")).to_series()
    reset, base, advance = _position_rules()
    narrow = ev.lazy().with_row_index("__row").filter(io).select(
        "__row", stream.alias("g"), reset.alias("reset"),
        # a negative base (or none) is an unknown position
        base.fill_null(-1).alias("base"), advance.alias("adv"),
        pl.col("op").is_in((_XFER, _SXFER)).alias("xfer"),
    ).collect()
    values = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    # pread/pwrite: the offset argument
    given = ev.lazy().with_row_index("__row").filter((pl.col("op") == _PXFER) & pl.col("aoffset").is_not_null()) \
        .select("__row", "aoffset").collect()
    if given.height:
        at = rank[given["__row"].to_numpy()]
        values[at] = given["aoffset"].to_numpy()
        valid[at] = True
    if narrow.height:
        _stream_offsets(narrow, rank, values, valid)
    return pl.select(pl.when(pl.lit(pl.Series(valid))).then(pl.lit(pl.Series(values))).alias("offset")).to_series()


def _stream_offsets(narrow: pl.DataFrame, rank: np.ndarray, values: np.ndarray, valid: np.ndarray) -> None:
    """Fill ``values``/``valid`` (output order) with the reconstructed offsets of the
    stream transfers among the I/O rows ``narrow`` (see :func:`_offsets`): vectorised
    numpy (builds without the C extension, which does all of :func:`_offsets` in one pass)."""
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


def _build_events(ev: pl.DataFrame, meta: pl.DataFrame,
                  names: Sequence[str]) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The EVENT_SCHEMA table (by ts) from all raw event and metadata rows of a run.

    Per-row work happens on the parsed rows as they are; the output columns are then
    gathered once into (ts, file, line) order, and the strings that repeat (host, file,
    fhash, source) are taken from small per-process and per-file tables.
    """
    if ev.height == 0:
        return pl.DataFrame(schema=EVENT_SCHEMA), None
    # one chunk per column: expressions mixing columns of different chunkings (parts
    # concatenated, computed columns) would realign them again and again
    ev = ev.rechunk()
    meta = meta.sort("src", "seq")
    ev = _apply_time_metric(ev, meta)
    # Two helper threads (polars, numpy's sort and the C passes release the GIL): the
    # output order needs only ts, file and line, so it is sorted while the processes,
    # files and sizes are resolved; the summary's per-(file, process) table needs no
    # output order, so it is counted while the rows are gathered into it.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="dlreplay-combine") as pool:
        ordering = pool.submit(_ordering, ev)
        return _resolved(ev, meta, names, ordering, pool)


def _resolved(ev: pl.DataFrame, meta: pl.DataFrame, names: Sequence[str], ordering: Future,
              pool: ThreadPoolExecutor) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """:func:`_build_events` once ``ev`` is one chunk and in µs, its order sorting in ``ordering``."""
    every, pidx = _process_keys(ev)
    procs = _process_table(every, ev, meta)
    fh = _hash_map(meta, "FH")
    # working directory of every process (its start record's cwd hash, resolved by FH)
    procs = procs.with_columns(
        _lookup(pl.col("cwdhash"), fh["hash"], fh["name"], pl.String).alias("__cwd")).rechunk()
    fh = fh.join(procs.select("src", "pid", "__cwd"), on=["src", "pid"], how="left").select(
        "hash", _absolute(pl.col("name")).alias("path"))
    # every file hash of the run and its path; index nf stands for "no file hash"
    hashes = _distinct_categorical(ev["fhash"])
    files = pl.DataFrame({"hash": hashes.cast(_STR)}).join(fh, on="hash", how="left", maintain_order="left")
    # one chunk per column: gathering 2 M rows from a string column of several chunks was
    # 4x slower (59 vs 14 ms per column on the ingest benchmark)
    files = pl.concat([files, pl.DataFrame({"hash": [None], "path": [None]}, schema=files.schema)]).rechunk()
    ev = _sizes(ev.with_columns(pidx.alias("__p"), _code_index(pl.col("fhash"), hashes).alias("__f")))
    # rows without an FH-resolved file but a path argument (checkpoint events, 1.x fname)
    no_path = files.with_row_index("__i").filter(pl.col("path").is_null())["__i"]
    named = ev.lazy().with_row_index("__row").filter(
        pl.col("__f").is_in(no_path.implode()) & (pl.col("path").is_not_null() | pl.col("fname").is_not_null())
    ).select("__row", "src", "pid", "path", "fname").collect()
    paths = None
    if named.height:
        sub = named.join(procs.select("src", "pid", "__cwd"), on=["src", "pid"], how="left",
                         maintain_order="left")
        paths = sub.select(pl.coalesce(_absolute(pl.col("path")), _absolute(pl.col("fname")))).to_series()
    per_process = pool.submit(_per_process, ev, files["path"],
                              named["__row"].to_numpy() if paths is not None else None, paths, procs)
    order, rank = ordering.result()
    offset = pool.submit(_offsets, ev, order, rank)  # meanwhile: the gather of every other column
    out = _gathered(ev, procs, files, named, paths, names, order, rank)
    out = out.insert_column(list(EVENT_SCHEMA).index("offset"), offset.result().alias("offset"))
    return out, per_process.result()


def _ordering(ev: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(order, rank): the rows of ``ev`` in output order (ts, file, line), and the output
    position of each row (``rank[order[k]] == k``)."""
    order = _output_order(ev)
    rank = np.empty(ev.height, dtype=np.int64)
    rank[order] = np.arange(ev.height, dtype=np.int64)
    return order, rank


def _gathered(ev: pl.DataFrame, procs: pl.DataFrame, files: pl.DataFrame, named: pl.DataFrame,
              paths: pl.Series | None, names: Sequence[str], order: np.ndarray, rank: np.ndarray) -> pl.DataFrame:
    """The columns of the output table but ``offset``, gathered by ``order``."""
    # the data-loader fields are sparse (7 % of the rows on the ingest benchmark), yet one
    # gather with the other columns is cheaper than scattering their rows (34 vs 76 ms)
    out = ev.select(
        "pid", "tid", "ts", "dur", "cat", "name", "size_requested", "size", "ret", "__p", "__f",
        "epoch", "step", "batch_size", pl.col("image_idx").alias("sample_index"),
    ).rechunk()[_row_index(order)]
    file = pl.lit(files["path"]).gather(pl.col("__f"))
    if paths is not None:
        file = pl.lit(out.select(file).to_series().scatter(rank[named["__row"].to_numpy()], paths))
    source = pl.Series(names, dtype=pl.String).gather(procs["src"])
    out = out.select(
        "pid", "tid", pl.lit(procs["ppid"]).gather(pl.col("__p")).alias("ppid"),
        pl.lit(procs["host"]).gather(pl.col("__p")).alias("host"),
        "ts", "dur", "cat", "name", file.alias("file"),
        pl.lit(files["hash"]).gather(pl.col("__f")).alias("fhash"),
        "size_requested", "size", "ret", "epoch", "step", "batch_size", "sample_index",
        pl.lit(source).gather(pl.col("__p")).alias("source"),
    )
    return out.cast(pl.Schema({c: dt for c, dt in EVENT_SCHEMA.items() if c not in ("offset", "role")}))


def _row_index(rows: np.ndarray) -> pl.Series:
    """``rows`` as a polars gather index: UInt32 (polars' own index type) when it fits; an
    Int64 index is converted and bounds-checked again for every column (13 columns of
    2.1 M rows: 73 vs 52 ms)."""
    return pl.Series(rows.astype(np.uint32) if len(rows) < (1 << 32) else rows)


def _per_process(ev: pl.DataFrame, file_paths: pl.Series, named_rows: np.ndarray | None,
                 named_paths: pl.Series | None, procs: pl.DataFrame) -> pl.DataFrame:
    """The summary's per-(file, host, pid) table (:func:`~.files.file_process_table_keyed`)
    of the raw rows ``ev`` (with ``__f``, ``__p`` and ``size``): integer keys for distinct
    paths (``file_paths[__f]``, or ``named_paths`` at ``named_rows``) and (host, pid)."""
    cand = file_paths if named_paths is None else pl.concat([file_paths, named_paths])
    paths = cand.drop_nulls().unique()
    none = paths.len()  # the key of "no file"
    index = pl.DataFrame({"p": cand}).join(
        pl.DataFrame({"p": paths, "i": np.arange(none, dtype=np.uint32)}), on="p", how="left",
        maintain_order="left")["i"].fill_null(none).to_numpy()
    fkey = index[: file_paths.len()][ev["__f"].to_numpy()]
    if named_rows is not None:
        fkey[named_rows] = index[file_paths.len():]
    hosts = procs.select("host", "pid").unique(maintain_order=True)
    pkey = procs.join(hosts.with_row_index("__h"), on=["host", "pid"], how="left", nulls_equal=True,
                      maintain_order="left")["__h"].to_numpy()
    rows = ev.select("name", "cat", "size").with_columns(
        pl.Series("__file", fkey).replace(none, None),
        pl.Series("__proc", pkey[ev["__p"].to_numpy()]),
    )
    return file_process_table_keyed(rows, paths, hosts)


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
