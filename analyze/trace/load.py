"""Load DFTracer traces (``*.pfw`` / ``*.pfw.gz``) into the dlreplay event table.

One engine, three stages, run by :func:`parse_parts` on ``jobs`` threads (zlib/ISA-L,
the C scanner and polars release the GIL) for :func:`load_trace` and the bounded-memory
path (:mod:`.spill`), and as Dask tasks for the distributed one (:mod:`.distributed`):

**Parse** (:func:`parse_part`, per group of whole files, or per byte range of one file's
gzip members: a file larger than its share is cut at member headers found near equal
offsets, :func:`.inputs.split_file`):

1. **Decompress** one ``decompressobj`` per gzip member (:mod:`dlreplay.pfw`). Damage is
   salvaged, never fatal: a truncated file keeps everything decoded before the cut; a
   corrupt member keeps what decoded cleanly and decoding resumes at the next member
   header (``1f 8b 08``). The partial line at each damage point is dropped and counted.
   Decoded text is handed on as lists of the decoder's output pieces, never joined: the
   scanner reads each piece's lines where they lie (only a line spanning two pieces is
   copied); the reference parser joins a chunk's pieces once.
2. **Scan** (when the C extension :mod:`._pfwscan` is built, and ``DLREPLAY_PARSER`` is
   not ``python``): a strict scanner reads each decoded text without the GIL straight
   into raw columns (strings dictionary-encoded, no Python object per line). It accepts
   only lines it fully understands (a JSON object with integer/string values of the kept
   keys, an ``args`` object, DFTracer 1.x quoting and trailing commas); every other
   non-blank line, and any text that is not UTF-8, goes to the reference parser (step 3)
   at the same points, so both paths give identical tables and reports
   (``tests/test_native_parser.py``). Without the extension, step 3 parses everything.
3. **Reference parser** (:mod:`.reference`): each line read with :func:`json.loads`;
   garbage and malformed lines are dropped and counted against their own file.
4. **Compact** (every parsed batch at once; the scanner's rows by the C pass ``compact``,
   :func:`.compact.native_compact`, the reference parser's by :func:`.compact.compact_rows`, both as
   :func:`.compact._compact_exprs` defines them): the rows kept are :data:`~.shapes.CHUNK_SCHEMA` (strings
   Categorical, sizes computed, the file-position inputs narrowed); ``start`` records and
   first host hashes are set aside per process.

**Resolve per file** (:func:`.resolve.resolve_part`, in the same job for whole files; for the ranges of
a split file once they are all parsed, :func:`resolve_ranges`, which first checks the
cuts and parses the file whole when a range was damaged or cut a line): everything one
file decides: the time unit (``CM``), each process's ppid, working-directory hash and
host (``start``/``HH`` records of its own file), offsets reconstructed per (file, pid,
POSIX or STDIO, file hash) in time order (open/seek reset the position; one C pass when
the extension is built, else cumulative sums over segments in numpy), the stray
transfers of the same streams taken off their file (a read or write logged on a file its
process had opened and closed again, none of its descriptors open, or a write on a file it
only ever opened read-only: DFTracer's close race, :func:`.offsets.file_offsets`; counted in the
file's report), and the order (``ts``, file, line). The result is a :class:`TracePart`:
rows of :data:`~.shapes.PART_SCHEMA`, the part's processes and its ``FH`` records.

**Combine** (:func:`combine`, once): the run's tables (:func:`.merge.run_tables`: ``FH`` paths
across all files, a record may sit in another process's file, relative names use the
writing process's working directory), the parts merged by a stable sort on (``ts``,
file) (each is in order already), and the :data:`~dlreplay.schema.EVENT_SCHEMA` columns
(:func:`.merge.finalize`: ppid, host and source per process, file per file-hash category
code). Columns are gathered a few at a time, their sources dropped before the next, so
the rows are never held twice; the event table is compact (no string per event:
Categorical names, categories, files, hosts and sources; Int32 where values fit). The
summary's per-(file, host, pid) table (:attr:`LoadedTrace.per_process`) is counted over
integer file and process keys.

The stages' modules: :mod:`.inputs` (a trace's files, their groups and byte ranges),
:mod:`.decompress` (gzip members, salvage), :mod:`.scan` (the C scanner's glue),
:mod:`.reference` (the plain parser: the fallback without the scanner, and its lines),
:mod:`.compact` (rows -> compact columns), :mod:`.batches`, :mod:`.resolve` and
:mod:`.offsets` (per file), :mod:`.merge` (the run's tables and the k-way merge);
:mod:`.shapes` holds what they hand each other. This module runs them and re-exports
the public names it always had.

Units: ``ts``/``dur`` microseconds (a ``CM`` time metric of ``NS``/``MS``/``S`` is
converted), sizes and offsets bytes.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, cast

import polars as pl

from dlreplay.allocator import prepare_release, release_free_memory
from dlreplay.errors import TraceError
from dlreplay.pfw import DecodeStats as _Stats
from dlreplay.pfw import PlainFile, Slabs

from . import decompress
from .batches import Compacted, new_batch
from .decompress import prefetched, split_tail, text_chunks

# the public names this module always had, from the modules that own them now
from .inputs import (
    MANIFEST_NAME,
    TRACE_SUFFIXES,
    TraceInputs,
    available_cores,
    file_groups,
    find_inputs,
    find_trace_inputs,
    groups_of,
    member_ranges,
    range_share,
    source_name,
    split_file,
    stored_size,
    trace_warnings,
)
from .merge import RunTables, add_reports, canonical, finalize, merge_parts, renumbered, run_tables
from .native import PARSER_ENV, native_parser_available
from .plausible import check_values
from .reference import Batch
from .resolve import resolve_part
from .scan import NativeBatch
from .shapes import (
    BEYOND_32_BITS,
    CHUNK_SCHEMA,
    COUNTS_SCHEMA,
    FH_SCHEMA,
    MARKER_SCHEMA,
    ODD_BYTES,
    ODD_DUR,
    PART_SCHEMA,
    PROCESS_SCHEMA,
    RAW_SCHEMA,
    READ_AS_NULL,
    RENUMBERED,
    STRAY_IO,
    FileDamage,
    FileReport,
    LoadedTrace,
    PartJob,
    RangePart,
    TraceDamageWarning,
    TracePart,
    with_events,
)

__all__ = [
    "CHUNK_SCHEMA",
    "PART_SCHEMA",
    "FileDamage",
    "FileReport",
    "LoadedTrace",
    "RangePart",
    "RunTables",
    "TraceDamageWarning",
    "TracePart",
    "available_cores",
    "combine",
    "combine_parts",
    "finalize",
    "load",
    "load_trace",
    "member_ranges",
    "parse_part",
    "parse_parts",
    "resolve_ranges",
    "run_tables",
    "trace_warnings",
    # also importable from here, as before the split
    "BEYOND_32_BITS",
    "COUNTS_SCHEMA",
    "FH_SCHEMA",
    "MANIFEST_NAME",
    "MARKER_SCHEMA",
    "ODD_BYTES",
    "ODD_DUR",
    "PARSER_ENV",
    "PROCESS_SCHEMA",
    "RAW_SCHEMA",
    "READ_AS_NULL",
    "RENUMBERED",
    "STRAY_IO",
    "TRACE_SUFFIXES",
    "PartJob",
    "TraceInputs",
    "canonical",
    "find_trace_inputs",
    "native_parser_available",
    "renumbered",
]


def load_trace(
    path: str | os.PathLike | Sequence[str | os.PathLike], *, jobs: int | None = None
) -> LoadedTrace:
    """Load a trace directory (all ``*.pfw``/``*.pfw.gz`` below it), one file, or a list of files.

    ``jobs`` is how many threads decompress, parse and resolve at once (default:
    :func:`available_cores`, fewer for a small trace: :data:`THREAD_MIN_BYTES`): groups of
    small files, whole files, and byte ranges of whole gzip members of a file larger than
    its share (:func:`parse_parts`). The table
    is the same whatever ``jobs`` is. Raises :class:`~dlreplay.errors.TraceError` when
    the path does not exist or holds no trace file. Damage never raises: see
    :attr:`LoadedTrace.files`.
    """
    files, manifest = find_inputs(path)
    parts: list[TracePart | RangePart] = list(parse_parts(files, jobs=jobs))
    release_free_memory(keep_large=True)  # the parse's buffers, before the merge builds the table
    loaded = _combine_owned(parts, [source_name(p) for p in files])
    release_free_memory()  # the merge's, before the passes
    # what no run can have produced is set aside or read as null, and named per file
    return check_values(dataclasses.replace(loaded, manifest=manifest))


#: Stored bytes a thread must have before :func:`parse_parts` starts one more by default: under
#: it, the pool's start and the threads' turns at the GIL cost more than they parse (on the
#: 2-core VM, one thread against two: a 52 kB capture 0.13 against 0.28 s, 0.9 MB 0.22
#: against 0.33 s, 2.7 MB 0.45 against 0.38 s). An explicit ``jobs`` is kept as given.
THREAD_MIN_BYTES = 1 << 20


def parse_parts(
    files: Sequence[Path],
    *,
    jobs: int | None = None,
    group_bytes: int | None = None,
    ordered: bool = False,
) -> Iterator[TracePart]:
    """The resolved parts of the trace ``files`` (the run's files, ``src`` = position), as
    they are done, parsed by ``jobs`` threads (default: :func:`available_cores`, one for each
    :data:`THREAD_MIN_BYTES` of the files' stored bytes, at least one).

    A file holding more than its share of the stored bytes (:func:`range_share`) is
    parsed as byte ranges (:func:`split_file`) and then resolved whole
    (:func:`resolve_ranges`); the other files in groups of consecutive files of about
    ``group_bytes`` stored bytes (default: enough groups to keep the threads busy). At
    most two jobs per thread are in flight, so with ``group_bytes`` the memory held is
    bounded by the groups being parsed plus the parts not yet consumed (one job per
    thread is in flight then). ``ordered``: each part's rows gathered into (``ts``, file,
    line) order (:attr:`TracePart.order` None), for a caller that keeps parts apart;
    :func:`combine` gathers unordered parts once, into the run's order.
    """
    sizes = [stored_size(p) for p in files]
    workers = max(1, jobs or min(available_cores(), sum(sizes) // THREAD_MIN_BYTES))
    prepare_release()  # before the parse holds memory (see its doc)
    indexed = list(enumerate(files))
    if workers == 1 and group_bytes is None:  # one thread: no pool, no ranges
        for group in file_groups(indexed, 1):
            yield cast(TracePart, parse_part(group, ordered=ordered))
        return
    split = _large_files(indexed, sizes, range_share(sizes, workers)) if workers > 1 else {}
    rest = [(src, p) for src, p in indexed if src not in split]
    groups = file_groups(rest, workers) if group_bytes is None else groups_of(rest, group_bytes)
    todo: list[tuple[Any, Any]] = [
        (parse_part, [(src, files[src], a, b, k)])
        for src, ranges in split.items()
        for k, (a, b) in enumerate(ranges)
    ]
    todo += [(parse_part, g) for g in groups]
    todo.reverse()  # popped from the end: in this order
    waiting: dict[int, list[RangePart]] = {}
    flight: set[Future] = set()
    limit = 2 * workers if group_bytes is None else workers
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dlreplay-load") as pool:
        while todo or flight:
            while todo and len(flight) < limit:
                fn, arg = todo.pop()
                # a helper thread decodes ahead only where a core would otherwise be idle
                kw: dict[str, bool] = {"ordered": ordered}
                if fn is parse_part:
                    kw["prefetch"] = len(todo) + len(flight) + 1 < workers
                flight.add(pool.submit(fn, arg, **kw))
                del fn, arg  # (a list of ranges is emptied by the job as it takes their rows)
            done, flight = wait(flight, return_when=FIRST_COMPLETED)
            for fut in done:
                yield from _finished(fut.result(), split, waiting, todo)


def _large_files(
    indexed: list[tuple[int, Path]], sizes: list[int], share: int
) -> dict[int, list[tuple[int, int]]]:
    """The byte ranges of each file of at least twice ``share`` stored bytes whose gzip
    members could be cut (by ``src``)."""
    split: dict[int, list[tuple[int, int]]] = {}
    for (src, p), size in zip(indexed, sizes, strict=True):
        if size >= 2 * share:
            # rounded, not up: a file of the whole trace is 2 ranges per thread (rounding
            # up made it 2 per thread + 1, which ran alone at the end)
            ranges = split_file(p, size, max(2, round(size / share)))
            if ranges:
                split[src] = ranges
    return split


def _finished(
    res: TracePart | RangePart | list[TracePart],
    split: dict[int, list[tuple[int, int]]],
    waiting: dict[int, list[RangePart]],
    todo: list[tuple[Any, Any]],
) -> list[TracePart]:
    """The resolved parts of a finished job; a byte range waits for the file's others, and
    once all are parsed their resolve is the next job."""
    out = []
    for part in res if isinstance(res, list) else [res]:
        if isinstance(part, RangePart):
            got = waiting.setdefault(part.src, [])
            got.append(part)
            if len(got) == len(split[part.src]):  # all ranges of the file: resolve it next
                todo.append((resolve_ranges, waiting.pop(part.src)))
        else:
            out.append(part)
    return out


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


def parse_part(
    jobs: Sequence[PartJob], *, prefetch: bool | None = None, ordered: bool = False
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
    the current chunk (:func:`prefetched`). Only worth it where a core would otherwise be
    idle: where every core runs a parse already, the helpers only compete for the GIL
    (faster and a lower peak without them (measured: benchmarks/RESULTS.md)). None: when fewer :func:`parse_part` calls
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
    events, order, processes, records, counts, markers = resolve_part(
        rows, {src: rep.problems for src, rep in files}, alone=alone, ordered=ordered
    )
    return TracePart(
        events=events,
        processes=processes,
        fh=records,
        files=files,
        counts=counts,
        markers=markers,
        order=order,
    )


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


def _parse_rows(
    jobs: Sequence[PartJob], ranged: bool, prefetch: bool | None = None
) -> RangePart | tuple[Compacted, list[tuple[int, FileReport]]]:
    """:func:`parse_part` up to the resolve: a range's part, else the compacted rows and the files' reports."""
    batch = new_batch()
    rows = Compacted()
    done: list[tuple[int, Path, int, _Stats]] = []
    clean_end = True
    if prefetch is None:  # decided once, as the call starts
        prefetch = _PARSING.busy() < available_cores()
    ahead_ok = prefetch or not _PREFETCH_SPARE_ONLY
    for job in jobs:
        src, path = job[0], Path(job[1])
        stats = _Stats()
        rows.stats[src] = stats
        data = _read_job(job, path)
        if not data:
            stats.problems.append("file is empty (0 bytes): the process wrote no trace")
        seq0 = job[4] << 32 if len(job) == 5 else 0  # type: ignore[misc]
        clean_end = _parse_text(data, src, seq0, stats, batch, rows, ahead_ok)
        done.append((src, path, len(data), stats))
        del data  # the stored bytes are not needed any more (the resolve below is)
    batch.flush()
    rows.take(batch)
    files = _file_reports(done, ranged)
    if ranged:
        job = jobs[0]
        kept, meta, starts, hosts = rows.pop()
        return RangePart(
            src=job[0],
            k=job[4],  # type: ignore[misc]
            rows=kept,
            meta=meta,
            starts=starts,
            hosts=hosts,
            report=files[0][1],
            clean_end=clean_end,
        )
    return rows, files


def _read_job(job: PartJob, path: Path) -> bytes | PlainFile:
    """The stored bytes of a job: its byte range, or the whole file (plain text is read as
    it is parsed: garbage costs no memory by its size)."""
    try:
        if len(job) == 5:
            start, end = job[2], job[3]  # type: ignore[misc]
            with open(path, "rb") as fh:
                fh.seek(start)
                return fh.read(end - start)
        return PlainFile.of(path) or path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc}") from exc


def _parse_text(
    data: bytes | PlainFile,
    src: int,
    seq0: int,
    stats: _Stats,
    batch: Batch | NativeBatch,
    rows: Compacted,
    ahead_ok: bool,
) -> bool:
    """Decode one job's ``data`` and add its lines (file ``src`` from line ``seq0``) to
    ``batch``, flushed into ``rows`` at damage, at each cut chunk and when full; True when
    its text ended with a whole line."""
    clean_end = True
    # a large file's text is decoded ahead into slabs, written again once its chunks are
    # flushed (nothing reads a chunk's text after its batch's flush)
    slabs = (
        Slabs(recycle=True, keep_bytes=decompress.CHUNK_BYTES)
        if ahead_ok and len(data) >= _PREFETCH_BYTES
        else None
    )
    chunks = prefetched(data, stats, slabs) if slabs is not None else text_chunks(data, stats)
    for received, (text, damaged_after, cut) in enumerate(chunks, 1):
        body, tail = split_tail(text)
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
        if damaged_after or cut or batch.nbytes >= decompress.CHUNK_BYTES:
            batch.flush()
            rows.take(batch)
            if slabs is not None:
                slabs.release(received - 1)
    return clean_end


def _file_reports(
    done: list[tuple[int, Path, int, _Stats]], ranged: bool
) -> list[tuple[int, FileReport]]:
    """(src, report) of each parsed file (its events still 0: counted when the parts combine)."""
    files = []
    for src, path, size, stats in done:
        if size and not stats.lines and not stats.problems and not ranged:
            stats.problems.append("file holds no trace lines")
        files.append(
            (
                src,
                FileReport(
                    path=str(path),
                    bytes=size,
                    members=stats.members,
                    lines=stats.lines,
                    events=0,
                    dropped_lines=stats.dropped_lines,
                    dropped_bytes=stats.dropped_bytes,
                    problems=stats.problems,
                ),
            )
        )
    return files


#: Files stored with at least this many bytes decode their next chunk in a helper
#: thread while the current one is parsed (zlib/ISA-L release the GIL), where a core
#: would otherwise be idle (:func:`parse_part`'s ``prefetch``).
_PREFETCH_BYTES = 2 << 20


#: False: every such file decodes ahead, spare core or not (the tests' switch).
_PREFETCH_SPARE_ONLY = True


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
            rep = add_reports(rep, r.report)
        if rep.bytes and not rep.lines and not rep.problems:
            rep.problems.append("file holds no trace lines")
        held = Compacted()
        held.rows = [r.rows for r in rs]
        held.meta = [r.meta for r in rs if r.meta.height]
        held.starts = [r.starts for r in rs]
        held.hosts = [r.hosts for r in rs]
        del rs
        events, order, processes, fh, counts, markers = resolve_part(
            held, {src: rep.problems}, alone=_PARSING.idle(), ordered=ordered
        )
        out.append(
            TracePart(
                events=events,
                processes=processes,
                fh=fh,
                files=[(src, rep)],
                counts=counts,
                markers=markers,
                order=order,
            )
        )
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
    events, per_process, counts, notes = merge_parts(whole, names)
    files = [with_events(reports[i], counts.get(i, 0), notes.get(i, [])) for i in sorted(reports)]
    return LoadedTrace(events=events, files=files, per_process=per_process)


def combine_parts(
    parts: Sequence[TracePart | RangePart], names: Sequence[str]
) -> tuple[pl.DataFrame, list[FileReport]]:
    """(event table, per-file reports) of :func:`combine`."""
    loaded = combine(parts, names)
    return loaded.events, loaded.files
