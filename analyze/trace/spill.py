"""Bounded-memory analysis: a trace whose event table would not fit is spilled to Parquet.

``dlreplay analyze TRACE --memory-limit SIZE`` first estimates (:func:`plan_memory`)
how many events the trace holds (stored bytes x decoded lines per stored byte, sampled
from the files' first megabyte) and what the in-memory analysis would need (events x
:data:`ROW_BYTES` x :data:`EAGER_FACTOR`). When that fits in the limit the normal
path runs. Otherwise :func:`spilled_trace` runs the same loader with a Parquet sink
instead of the in-memory merge (one engine: :func:`~.load.parse_parts`,
:func:`~.load.run_tables`, :func:`~.load.finalize`):

1. the trace is parsed and resolved in groups of whole trace files, sized from the
   limit (:func:`~.load.parse_parts` with ``group_bytes``; a file larger than a group
   is still one part), and every part's rows, already in (``ts``, file, line) order
   with their offsets, are written to Parquet as soon as the part is done; only its
   processes and ``FH`` records stay in memory;
2. the run's tables are built from those (:func:`~.load.run_tables`: ``FH`` paths,
   working directories, hosts), and every part's rows are read back, one part at a
   time, given their :data:`~dlreplay.schema.EVENT_SCHEMA` columns
   (:func:`~.load.finalize`, as in memory) and written again with an order column
   ``__o`` (part << 40 | row); parts are numbered in trace-file order, so sorting any
   subset by (``ts``, ``__o``) gives the order of the in-memory table.

The passes then run over a :class:`~.passes.TraceView` of ``pl.scan_parquet`` of the
spill: aggregations are lazy queries collected with polars' streaming engine; only the
subsets a pass needs row by row (data-loader events, dataset I/O with the columns the
passes use) are collected. What bounds memory then: the parts being parsed (sized from
the limit), and the narrow dataset-I/O table (9 columns, file and op names
categorical; with polars' buffers the passes grow the peak by at most
:data:`DATASET_IO_BYTES` per dataset I/O event, a cautious figure; a note says when that
alone may exceed the limit). The spill directory is removed afterwards, also on errors, Ctrl-C and
SIGTERM.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl

from dlreplay.allocator import release_free_memory
from dlreplay.errors import TraceError
from dlreplay.interrupt import sigterm_as_exit
from dlreplay.pfw import zlib_compatible_inflate
from dlreplay.schema import EVENT_SCHEMA
from dlreplay.units import human_bytes

from . import vocabulary
from .compact import one_frame
from .inputs import available_cores, find_inputs, source_name
from .load import parse_parts
from .merge import (
    RunTables,
    canonical,
    finalize,
    per_process_from_counts,
    renumbered,
    run_tables,
)
from .plausible import check_table, copied_files, file_spans, noted_reports, set_aside_copies
from .shapes import COUNTS_SCHEMA, PART_SCHEMA, FileDamage, FileReport, int_stat, with_events

__all__ = [
    "EAGER_FACTOR",
    "GROUP_FACTOR",
    "ORDER_COL",
    "ROW_BYTES",
    "MemoryPlan",
    "SpilledTrace",
    "plan_memory",
    "spilled_trace",
]

#: Bytes per event of the in-memory event table (the compact EVENT_SCHEMA: polars
#: ``estimated_size`` of the benchmark and corpus traces (measured: benchmarks/RESULTS.md)).
ROW_BYTES = 110
#: Peak RSS of the in-memory path (load + all passes) over the table's size, measured
#: on the ingest benchmark traces (``benchmarks/ingest.py``) and the scale trace (measured: benchmarks/RESULTS.md),
#: with headroom until measured on more traces: freed pages are returned
#: at each stage's end and every pass reads only its columns.
EAGER_FACTOR = 4.0
#: Peak memory of parsing and resolving one group over its event table's size.
GROUP_FACTOR = 3.0
#: Memory taken whatever the trace: the interpreter with polars, numpy and matplotlib
#: and the parser's buffers and polars' pools for even one small group (bytes).
BASE_BYTES = 250 << 20
#: Bytes per dataset I/O event the largest pass holds over a spilled table: the few columns
#: of the dataset I/O it collects in table order, a batch of processes at a time, and the
#: streaming engine's buffers (peak RSS growth over the passes of the scale benchmark
#: trace, the summary's streaming queries the largest; a margin kept above it (measured: benchmarks/RESULTS.md)).
DATASET_IO_BYTES = 180
_ROW_BITS = 40
#: Order column of a spilled table: sorting by (ts, it) gives the order of the in-memory
#: table (part << 40 | row in the part; parts in trace-file order).
ORDER_COL = "__o"


#: the samples are inflated with ISA-L where installed (faster than zlib)
_INFLATE, _INFLATE_ERRORS = zlib_compatible_inflate()

#: Stored bytes read from each sampled file to estimate lines per stored byte.
_SAMPLE_BYTES = 1 << 20
_SAMPLE_FILES = 16
#: Decoded bytes of a sample inflated at a time, and at most in all (DFTracer's gzip
#: inflates ~10x: a 1 MiB sample is ~10 MiB of text).
_SAMPLE_PIECE = 1 << 20
_SAMPLE_DECODED = 64 << 20


@dataclass(frozen=True)
class MemoryPlan:
    """What :func:`plan_memory` estimated and decided (sizes in bytes)."""

    limit: int
    files: int
    stored_bytes: int
    events: int
    table_bytes: int
    eager_bytes: int
    spill: bool
    #: stored bytes of trace files per spill group (a larger file is a group alone)
    group_stored_bytes: int

    def describe(self) -> str:
        head = (
            f"memory limit {human_bytes(self.limit)}: about {self.events:,} events in {self.files} file(s) "
            f"({human_bytes(self.stored_bytes)} stored), event table ~{human_bytes(self.table_bytes)}, "
            f"in-memory analysis ~{human_bytes(self.eager_bytes)}"
        )
        if not self.spill:
            return head + ": fits, analysing in memory"
        return head + (
            f": does not fit, spilling to Parquet in groups of ~{human_bytes(self.group_stored_bytes)} "
            "of trace files"
        )


def _lines_per_byte(path: Path) -> tuple[int, int] | None:
    """(decoded lines, stored bytes they came from) of the first ~1 MiB of ``path``;
    None when it cannot be read or decoded (a damaged file: the others estimate it).

    Inflated :data:`_SAMPLE_PIECE` at a time, at most :data:`_SAMPLE_DECODED` in all: a
    megabyte of deflated NUL bytes inflates to a gigabyte, which the estimate of a run
    under ``--memory-limit`` must not hold (it held hundreds of MB for such a file)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(_SAMPLE_BYTES)
    except OSError:
        return None
    if not data:
        return None
    if not data.startswith(b"\x1f"):
        return data.count(b"\n") or 1, len(data)
    lines = used = decoded = 0
    view = data
    try:
        while view and decoded < _SAMPLE_DECODED:
            d = _INFLATE.decompressobj(wbits=31)
            tail = view
            while tail and not d.eof and decoded < _SAMPLE_DECODED:
                out = d.decompress(tail, _SAMPLE_PIECE)
                tail = d.unconsumed_tail
                if not out and tail:
                    break  # (no progress: cannot happen, but never loop)
                lines += out.count(b"\n")
                decoded += len(out)
            rest = len(d.unused_data) if d.eof else len(tail)
            used += len(view) - rest
            if not d.eof:
                break  # the sample (or the decoded budget) ends inside a member: its decoded part counts
            view = d.unused_data
    except _INFLATE_ERRORS:
        return None
    return (lines, used) if used else None


def plan_memory(
    trace: str | os.PathLike | Sequence[str | os.PathLike], limit: int, *, jobs: int | None = None
) -> MemoryPlan:
    """Estimate the events and memory of ``trace`` and decide whether to spill under ``limit``
    (``jobs`` groups are parsed at once: each gets its share; default the cores available)."""
    files, _ = find_inputs(trace)
    sizes = [_size(p) for p in files]
    stored = sum(sizes)
    step = max(1, len(files) // _SAMPLE_FILES)
    samples = [s for s in (_lines_per_byte(p) for p in files[::step][:_SAMPLE_FILES]) if s]
    lines = sum(n for n, _ in samples)
    used = sum(b for _, b in samples)
    per_byte = lines / used if used else 0.1  # ~10 stored bytes per line: DFTracer's gzip ratio
    events = int(stored * per_byte)
    table = events * ROW_BYTES
    eager = BASE_BYTES + int(table * EAGER_FACTOR)
    budget = max(limit - BASE_BYTES, 1)
    # the passes later hold the dataset I/O events (at most every event): leave them room
    budget -= min(events * DATASET_IO_BYTES, budget // 2)
    group = max(
        1,
        int(
            budget / (GROUP_FACTOR * ROW_BYTES * max(per_byte, 1e-9) * (jobs or available_cores()))
        ),
    )
    return MemoryPlan(
        limit=limit,
        files=len(files),
        stored_bytes=stored,
        events=events,
        table_bytes=table,
        eager_bytes=eager,
        spill=eager > limit,
        group_stored_bytes=group,
    )


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


@dataclass
class SpilledTrace(FileDamage):
    """A trace loaded into a spill directory: a lazy scan of its event table (the
    :data:`~dlreplay.schema.EVENT_SCHEMA` columns plus :data:`ORDER_COL`), the per-file
    reports and the manifest, like :class:`~.load.LoadedTrace`."""

    events: pl.LazyFrame
    files: list[FileReport]
    manifest: dict | None
    height: int
    groups: int
    directory: Path
    spill_bytes: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    #: :func:`~.files.file_process_table` of the events, made from the parts' counts as the
    #: in-memory loader makes it (None where the vocabulary changed processes or roles: the
    #: passes then count it from the spilled table)
    per_process: pl.DataFrame | None = None

    def collect(self) -> pl.DataFrame:
        """The whole event table in memory, in the order of :func:`~.load.load_trace`'s (for tests)."""
        return self.events.sort("ts", ORDER_COL, nulls_last=True).drop(ORDER_COL).collect()


# ---------------------------------------------------------------------------------------
# Spilling


@contextlib.contextmanager
def spilled_trace(
    trace: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    group_stored_bytes: int,
    spill_dir: str | os.PathLike | None = None,
    echo: Callable[[str], None] | None = None,
    jobs: int | None = None,
) -> Iterator[SpilledTrace]:
    """Load ``trace`` into a temporary spill directory (under ``spill_dir``, default the
    system temp) in groups of about ``group_stored_bytes`` of trace files, ``jobs``
    threads at a time (default: the cores available); yields a :class:`SpilledTrace`.
    The directory is removed when the block ends, however it ends.
    """
    base = Path(spill_dir) if spill_dir is not None else None
    if base is not None:
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TraceError(
                f"cannot use the spill directory {base}: {exc.strerror or exc}"
            ) from exc
    with sigterm_as_exit((signal.SIGTERM,)):
        tmp = Path(tempfile.mkdtemp(prefix="dlreplay-spill-", dir=base))

        def at_exit() -> None:  # a second interrupt can land before the finally removes it
            shutil.rmtree(tmp, ignore_errors=True)

        atexit.register(at_exit)
        try:
            yield _spill(trace, tmp, group_stored_bytes, echo, jobs)
        finally:
            _remove(tmp)
            atexit.unregister(at_exit)


def _remove(tmp: Path) -> None:
    """Remove the spill directory, even while Ctrl-C or SIGTERM arrive.

    One Ctrl-C can raise twice: polars cancels a running query with a KeyboardInterrupt
    and Python's own handler raises another at the next line, which would land here;
    and a cancelled query's writer threads may still be closing a Parquet file in the
    directory. So interrupts are held back until the directory is gone (then re-raised),
    and the removal is retried for a few seconds.
    """
    pending: BaseException | None = None
    while True:
        try:
            for _ in range(50):
                shutil.rmtree(tmp, ignore_errors=True)
                if not tmp.exists():
                    break
                time.sleep(0.1)
            break
        except (KeyboardInterrupt, SystemExit) as exc:
            pending = exc
    if pending is not None:
        raise pending


def _write_spill(frame: pl.DataFrame, path: Path) -> None:
    """Write one spill file; a full disk (polars reports it as a ComputeError) names the spill
    directory, which the caller removes."""
    try:
        frame.write_parquet(path, compression="lz4")
    except (OSError, pl.exceptions.ComputeError) as exc:
        full = (
            "No space left" in str(exc)
            or getattr(exc, "errno", None) == errno.ENOSPC
            or _nearly_full(path)
        )
        why = "no space left on the device" if full else str(exc).splitlines()[0]
        raise TraceError(
            f"{path.parent}: cannot spill the trace ({why}); free space, choose another --spill-dir "
            f"or raise --memory-limit (the spill directory was removed)"
        ) from None


def _nearly_full(path: Path) -> bool:
    """polars does not always say a write failed for want of space ("Invalid thrift"): ask the file system."""
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20


class _Kept(NamedTuple):
    """What the spill keeps in memory of a part between its two stages (its rows are on disk)."""

    first: int  #: its first trace file (parts are combined in file order)
    processes: pl.DataFrame
    fh: pl.DataFrame
    files: list[tuple[int, FileReport]]
    path: Path | None  #: its rows in Parquet; None without rows
    markers: pl.DataFrame
    firsts: pl.DataFrame | None  #: :func:`~.vocabulary.thread_firsts` by process index
    counts: pl.DataFrame  #: the summary's per-process counts (:data:`~.load.COUNTS_SCHEMA`)


def _run_threads(
    with_rows: list[_Kept], processes: pl.DataFrame, pid0: bool, top: int
) -> vocabulary.RunThreads:
    """The run's :class:`~.vocabulary.RunThreads` from its parts' thread firsts (by process
    index, in part order: each part's indices follow the processes of the parts before it),
    ``processes`` the run's process table (new ids go above its pids, renumbered ones
    included, and ppids too)."""
    firsts, base = [], 0
    for k in with_rows:
        if k.firsts is not None and k.firsts.height:
            firsts.append(k.firsts.with_columns(pl.col("__p") + base))
        base += k.processes.height
    schema = {"__p": pl.UInt32(), "pid": pl.Int32(), "tid": pl.Int32(), "ts": pl.Int64()}
    f = pl.concat(firsts, how="vertical_relaxed") if firsts else pl.DataFrame(schema=schema)
    threads = (
        f.select(pl.lit(processes["host"]).gather(pl.col("__p")).alias("host"), "pid", "tid", "ts")
        .group_by("host", "pid", "tid")
        .agg(pl.col("ts").min())
    )
    ids = [c for c in ("ppid", "__pid") if c in processes.columns]
    return vocabulary.RunThreads(
        threads, pid0, max([top, *(int_stat(processes[c].max()) or 0 for c in ids)])
    )


def _spill_parts(
    files: list[Path], tmp: Path, target: int, jobs: int | None, names: list[str]
) -> tuple[list[_Kept], bool, int, pl.DataFrame]:
    """:func:`_spill`'s first stage: the parts (resolved per file, in groups of ``target``
    stored bytes) written to Parquet in ``tmp`` as they come, their small tables kept (by
    first file); what the rank-numbering of DLIO's pids reads of the whole run (some
    pid is 0; the largest pid or tid); and each file's :func:`~.plausible.file_spans`."""
    kept: list[_Kept] = []
    spans: list[pl.DataFrame] = []
    pid0, top = False, 0  # what the rank-numbering of DLIO's pids reads of the whole run
    for part in parse_parts(files, jobs=jobs, group_bytes=target, ordered=True):
        first = min(src for src, _ in part.files)
        path = firsts = None
        if part.events.height:
            path = tmp / f"part-{first:09d}.parquet"
            events = part.events  # (in (ts, file, line) order: parsed with ordered=True)
            _write_spill(events, path)
            source = pl.Series([names[s] for s in part.processes["src"].to_list()], dtype=pl.String)
            spans.append(
                file_spans(
                    events.select(
                        pl.lit(source).gather(pl.col("__p")).alias("source"),
                        "ts",
                        "pid",
                        "tid",
                        "dur",
                        "name",
                        "ret",
                    ),
                    signed=True,
                )
            )
            firsts = vocabulary.thread_firsts(events, host="__p")
            pid0 = pid0 or bool((events["pid"] == 0).any())
            top = max(top, *(int_stat(events[c].max()) or 0 for c in ("pid", "tid")))
            del events
        kept.append(
            _Kept(
                first, part.processes, part.fh, part.files, path, part.markers, firsts, part.counts
            )
        )
        del part
        release_free_memory()  # the part's rows, before the next group's are built in another arena
    kept.sort(key=lambda k: k.first)
    schema = {
        "source": pl.String(),
        "lo": pl.Int64(),
        "hi": pl.Int64(),
        "n": pl.UInt32(),
        "sig": pl.UInt64(),
    }
    run_spans = pl.concat(spans, how="vertical_relaxed") if spans else pl.DataFrame(schema=schema)
    return kept, pid0, top, run_spans


def _spill_events(
    with_rows: list[_Kept],
    tables: RunTables,
    run: vocabulary.RunThreads,
    names: list[str],
    tmp: Path,
    checks: tuple[dict | None, pl.DataFrame, dict[str, list[str]]],
) -> tuple[list[Path], np.ndarray, int, bool, list[pl.DataFrame]]:
    """:func:`_spill`'s second stage: each part's rows (``with_rows``, in file order) read
    back, finalised with the run's ``tables`` and given the event vocabulary, its implausible
    values set aside or read as null as in memory (:func:`~.plausible.check_table` with
    ``checks``' manifest and run's file spans; each file's notes into its third item), written
    as :data:`EVENT_SCHEMA` Parquet in ``tmp``, one part at a time. Returns (paths, events per
    trace file, events, processes or their rows changed, the parts' per-process counts)."""
    manifest, spans, notes = checks
    copies = copied_files(spans, names)  # (a copy in another part than its original)
    proc_src = tables.processes["src"].to_numpy()
    counts = np.zeros(len(names), dtype=np.int64)
    paths: list[Path] = []
    height = base = 0
    changed = False
    part_counts = []
    for g, k in enumerate(with_rows):
        processes, raw_path, markers = k.processes, k.path, k.markers
        part_counts.append(k.counts.with_columns(pl.col("__p") + base) if base else k.counts)
        assert raw_path is not None
        raw = [pl.read_parquet(raw_path, schema=PART_SCHEMA).with_columns(pl.col("__p") + base)]
        base += processes.height
        table, pidx = finalize(raw, None, tables)
        raw_path.unlink()
        counts += np.bincount(proc_src[pidx.to_numpy()], minlength=len(names))
        # the event vocabulary per part, as in memory over the whole table: what it reads
        # lies in the process's own file (its markers, a consumer's loop), or is the run's
        # (which pids are DLIO's ranks: rank 0's pid 0 is in rank 0's file)
        table, moved = canonical(table, markers, names, run)
        # (a file's events all lie in one part: its lifetime, repeats and counts are whole here)
        table, found, aside = check_table(table, manifest, spans)
        if copies:
            before = table.height
            table = set_aside_copies(table, copies, found)
            aside = aside or table.height < before
        for name, said in found.items():
            notes.setdefault(name, []).extend(said)
        changed = changed or moved or aside
        table = table.with_columns(
            (pl.int_range(pl.len(), dtype=pl.Int64) + (g << _ROW_BITS)).alias(ORDER_COL)
        )
        path = tmp / f"events-{g:05d}.parquet"
        _write_spill(table, path)
        paths.append(path)
        height += table.height
        del table, pidx
        release_free_memory()
    return paths, counts, height, changed, part_counts


def _spill(
    trace, tmp: Path, target: int, echo: Callable[[str], None] | None, jobs: int | None
) -> SpilledTrace:
    files, manifest = find_inputs(trace)
    names = [source_name(p) for p in files]
    say = echo or (lambda _s: None)
    t0 = time.perf_counter()
    # stage 1: parts (resolved per file) straight to Parquet; their small tables kept
    kept, pid0, top, spans = _spill_parts(files, tmp, target, jobs, names)
    t1 = time.perf_counter()
    say(f"spill: parsed {len(files)} file(s) in {len(kept)} part(s) in {t1 - t0:.1f} s; combining")
    # stage 2: the run's tables, then each part's EVENT_SCHEMA columns, one part at a time
    with_rows = [k for k in kept if k.path is not None]
    tables = run_tables([k.processes for k in with_rows], [k.fh for k in kept], names, top)
    run = _run_threads(with_rows, tables.processes, pid0, top)
    found: dict[str, list[str]] = {}
    paths, counts, height, changed, part_counts = _spill_events(
        with_rows, tables, run, names, tmp, (manifest, spans, found)
    )
    reports = sorted((rep for k in kept for rep in k.files), key=lambda r: r[0])
    del run
    # the per-process table as the in-memory loader makes it: from the parts' counts (a
    # query over the spilled table held more memory per event and took longer)
    per_process = (
        None if changed else per_process_from_counts(one_frame(part_counts, COUNTS_SCHEMA), tables)
    )
    del part_counts
    notes = renumbered(tables.processes)
    out_files = noted_reports(
        [with_events(rep, int(counts[src]), notes.get(src, [])) for src, rep in reports], found
    )
    t2 = time.perf_counter()
    nbytes = sum(p.stat().st_size for p in paths)
    say(
        f"spill: {height:,} events, {human_bytes(nbytes)} of Parquet in {tmp}, combined in {t2 - t1:.1f} s"
    )
    schema = {**EVENT_SCHEMA, ORDER_COL: pl.Int64()}
    scan = pl.scan_parquet(paths, schema=schema) if paths else pl.LazyFrame(schema=schema)
    return SpilledTrace(
        events=scan,
        files=out_files,
        manifest=manifest,
        height=height,
        groups=len(kept),
        directory=tmp,
        spill_bytes=nbytes,
        timings={"parse_s": t1 - t0, "combine_s": t2 - t1},
        per_process=per_process,
    )
