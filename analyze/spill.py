"""Bounded-memory analysis: a trace whose event table would not fit is spilled to Parquet.

``dlreplay analyze TRACE --memory-limit SIZE`` first estimates (:func:`plan_memory`)
how many events the trace holds (stored bytes x decoded lines per stored byte, sampled
from the files' first megabyte) and what the in-memory analysis would need (events x
:data:`ROW_BYTES` x :data:`EAGER_FACTOR`). When that fits in the limit the normal
path runs. Otherwise :func:`spilled_trace` loads the trace in groups of whole trace
files, with the two stages of :mod:`.load` as they are:

1. every group is parsed (:func:`~.load.parse_part`) and its raw event rows written
   to Parquet in a temporary spill directory; its metadata rows (``FH``/``HH``/``CM``)
   are kept in memory, reduced to the rows :func:`~.load.combine_parts` can use (the
   first record of each file hash, of each host hash per file, the first time unit per
   file, the first host hash per process; see :func:`_reduce_meta`), together with the
   processes' ``start`` records;
2. every group is then combined (:func:`~.load.combine_parts`) with the metadata of
   the whole run, which resolves file names (an ``FH`` record may sit in another
   process's file), hosts, time units and offsets exactly as the whole-trace path
   does: offset streams are per (trace file, pid, file hash) and a trace file is never
   split between groups. The one thing the combine of a group cannot see is the
   working directory of a process in another group that wrote an ``FH`` record with a
   relative name; such names are made absolute beforehand (:func:`_absolute_fh`). The
   group's event table, in (``ts``, file, line) order, is written to Parquet with an
   order column ``__o`` (group << 40 | row), so sorting any subset by (``ts``, ``__o``)
   gives the order of the whole-trace table.

The passes then run over a :class:`~.passes.TraceView` of ``pl.scan_parquet`` of the
spill: aggregations are lazy queries collected with polars' streaming engine; only the
subsets a pass needs row by row (data-loader events, dataset I/O with the columns the
passes use) are collected. What bounds memory then: one group's parse and combine
(sized from the limit; a single trace file larger than that is still one group), and
the narrow dataset-I/O table (9 columns, file and op names categorical: ~40 bytes per
dataset I/O event instead of ~220 per event of the whole table; with the access pass's
sorts and polars' buffers the passes grow the peak by ~180 bytes per dataset I/O event,
:data:`DATASET_IO_BYTES`; a note says when that alone exceeds the limit). The spill
directory is removed
afterwards, also on errors, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import signal
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from dlreplay.errors import TraceError
from dlreplay.schema import EVENT_SCHEMA
from dlreplay.units import human_bytes

from .load import FileDamage, FileReport, TracePart, _find_inputs, combine_parts, parse_part
from .passes import ORDER_COL

__all__ = [
    "EAGER_FACTOR", "GROUP_FACTOR", "ORDER_COL", "ROW_BYTES", "MemoryPlan", "SpilledTrace", "plan_memory",
    "spilled_trace",
]

#: Bytes per event of the in-memory event table (polars ``estimated_size`` of the corpus
#: traces and of the benchmark trace: 213-222).
ROW_BYTES = 220
#: Peak RSS of the in-memory path (load + all passes) over the table's size, measured
#: on the 5.1 M-event benchmark trace (see ``benchmarks/memory.py``).
EAGER_FACTOR = 5.0
#: Peak memory of parsing and combining one group over its event table's size
#: (measured: 1 M events in 1, 6 and 17 groups).
GROUP_FACTOR = 3.0
#: Memory taken whatever the trace: the interpreter with polars, numpy and matplotlib
#: (~120 MB) and the parser's buffers and polars' pools for even one small group (bytes).
BASE_BYTES = 250 << 20
#: Bytes per dataset I/O event the passes hold over a spilled table: the narrow
#: dataset-I/O frame, the sorts of the access pass and the streaming engine's buffers (peak
#: RSS growth over the passes of the 5.1 M-event benchmark trace: ~180 per dataset I/O event).
DATASET_IO_BYTES = 180
_ROW_BITS = 40
#: Stored bytes read from each sampled file to estimate lines per stored byte.
_SAMPLE_BYTES = 1 << 20
_SAMPLE_FILES = 16


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
        head = (f"memory limit {human_bytes(self.limit)}: about {self.events:,} events in {self.files} file(s) "
                f"({human_bytes(self.stored_bytes)} stored), event table ~{human_bytes(self.table_bytes)}, "
                f"in-memory analysis ~{human_bytes(self.eager_bytes)}")
        if not self.spill:
            return head + ": fits, analysing in memory"
        return head + (f": does not fit, spilling to Parquet in groups of ~{human_bytes(self.group_stored_bytes)} "
                       "of trace files")


def _lines_per_byte(path: Path) -> tuple[int, int] | None:
    """(decoded lines, stored bytes they came from) of the first ~1 MiB of ``path``;
    None when it cannot be read or decoded (a damaged file: the others estimate it)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(_SAMPLE_BYTES)
    except OSError:
        return None
    if not data:
        return None
    if not data.startswith(b"\x1f"):
        return data.count(b"\n") or 1, len(data)
    lines = used = 0
    view = data
    try:
        while view:
            d = zlib.decompressobj(wbits=31)
            out = d.decompress(view)
            lines += out.count(b"\n")
            consumed = len(view) - len(d.unused_data)
            used += consumed
            if not d.eof:
                break  # the sample ends inside a member: its decoded part counts
            view = d.unused_data
    except zlib.error:
        return None
    return (lines, used) if used else None


def plan_memory(trace: str | os.PathLike | Sequence[str | os.PathLike], limit: int) -> MemoryPlan:
    """Estimate the events and memory of ``trace`` and decide whether to spill under ``limit``."""
    files, _ = _find_inputs(trace)
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
    group = max(1, int(budget / (GROUP_FACTOR * ROW_BYTES * max(per_byte, 1e-9))))
    return MemoryPlan(limit=limit, files=len(files), stored_bytes=stored, events=events, table_bytes=table,
                      eager_bytes=eager, spill=eager > limit, group_stored_bytes=group)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def spill_groups(files: Sequence[Path], target: int) -> list[list[tuple[int, Path]]]:
    """Consecutive (src, path) groups of about ``target`` stored bytes; a file is never split."""
    groups: list[list[tuple[int, Path]]] = []
    current: list[tuple[int, Path]] = []
    size = 0
    for src, p in enumerate(files):
        n = _size(p)
        if current and size + n > target:
            groups.append(current)
            current, size = [], 0
        current.append((src, p))
        size += n
    if current:
        groups.append(current)
    return groups


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

    def collect(self) -> pl.DataFrame:
        """The whole event table in memory, in the order of :func:`~.load.load_trace`'s (for tests)."""
        return self.events.sort("ts", ORDER_COL, nulls_last=True).drop(ORDER_COL).collect()


# ---------------------------------------------------------------------------------------
# Metadata kept in memory


def _reduce_meta(meta: pl.DataFrame) -> pl.DataFrame:
    """The metadata rows :func:`~.load.combine_parts` can use, in (src, seq) order.

    combine_parts reads metadata only as "the first record in (file, line) order" of a
    key: an ``FH`` record per file hash, an ``HH`` record per (file, host hash), the
    ``CM`` time_metric per file, the first host hash per (file, pid). Keeping the first
    row of every such key keeps its result; the reduction of reductions is the same.
    """
    if meta.height == 0:
        return meta
    m = meta.sort("src", "seq").with_row_index("__r")
    name, value = pl.col("name"), pl.col("a_value")
    keep = pl.concat([
        m.filter((name == "FH") & value.is_not_null()).unique("a_value", keep="first")["__r"],
        m.filter((name == "HH") & value.is_not_null()).unique(["src", "a_value"], keep="first")["__r"],
        m.filter((name == "CM") & (pl.col("a_name") == "time_metric")).unique("src", keep="first")["__r"],
        m.filter(pl.col("hhash").is_not_null()).unique(["src", "pid"], keep="first")["__r"],
        # start/stop markers of DFTracer's AI conventions (vocabulary.marker_spans): every one
        m.filter((name == "CM") & pl.col("a_name").str.contains(r"\.(start|end)$"))["__r"],
    ]).unique()
    return m.filter(pl.col("__r").is_in(keep.implode())).drop("__r")


def _starts(events: pl.DataFrame) -> pl.DataFrame:
    """The processes' ``start`` records (src, seq, pid, cwd hash): their working directory."""
    return events.filter((pl.col("name") == "start") & (pl.col("cat") == "dftracer")).select(
        "src", "seq", "pid", "cwd")


def _absolute_fh(meta: pl.DataFrame, starts: pl.DataFrame) -> pl.DataFrame:
    """``meta`` with the relative names of its ``FH`` records made absolute with the
    working directory of the process that wrote them, as combine_parts does when that
    process is in the same part (its ``start`` record's cwd hash, resolved through the
    first ``FH`` record of that hash). Records of hashes that are some process's working
    directory keep their name (combine_parts resolves working directories unchanged)."""
    if meta.height == 0 or starts.height == 0:
        return meta
    fh = meta.filter((pl.col("name") == "FH") & pl.col("a_value").is_not_null()).unique(
        "a_value", keep="first", maintain_order=True).select(pl.col("a_value").alias("cwd"),
                                                             pl.col("a_name").alias("__cwd"))
    cwd = (
        starts.sort("src", "seq").group_by("src", "pid", maintain_order=True).agg(pl.col("cwd").drop_nulls().first())
        .join(fh, on="cwd", how="left").filter(pl.col("__cwd").is_not_null())
    )
    if cwd.height == 0:
        return meta
    cwd_hashes = cwd["cwd"].unique().implode()
    relative = ((pl.col("name") == "FH") & pl.col("a_value").is_not_null() & ~pl.col("a_name").str.starts_with("/")
                & ~pl.col("a_value").is_in(cwd_hashes) & pl.col("__cwd").is_not_null())
    joined = meta.join(cwd.select("src", "pid", "__cwd"), on=["src", "pid"], how="left", maintain_order="left")
    return joined.with_columns(
        pl.when(relative).then(pl.concat_str([pl.col("__cwd").str.strip_suffix("/"), pl.col("a_name")],
                                             separator="/"))
        .otherwise(pl.col("a_name")).alias("a_name")
    ).drop("__cwd")


# ---------------------------------------------------------------------------------------
# Spilling


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) while the spill exists (so it is removed); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def spilled_trace(trace: str | os.PathLike | Sequence[str | os.PathLike], *, group_stored_bytes: int,
                  spill_dir: str | os.PathLike | None = None,
                  echo: Callable[[str], None] | None = None) -> Iterator[SpilledTrace]:
    """Load ``trace`` into a temporary spill directory (under ``spill_dir``, default the
    system temp) in groups of about ``group_stored_bytes`` of trace files; yields a
    :class:`SpilledTrace`. The directory is removed when the block ends, however it ends.
    """
    base = Path(spill_dir) if spill_dir is not None else None
    if base is not None:
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TraceError(f"cannot use the spill directory {base}: {exc.strerror or exc}") from exc
    with _sigterm_as_exit():
        tmp = Path(tempfile.mkdtemp(prefix="dlreplay-spill-", dir=base))

        def at_exit() -> None:  # a second interrupt can land before the finally removes it
            shutil.rmtree(tmp, ignore_errors=True)

        atexit.register(at_exit)
        try:
            yield _spill(trace, tmp, group_stored_bytes, echo)
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
        full = "No space left" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC or _nearly_full(path)
        why = "no space left on the device" if full else str(exc).splitlines()[0]
        raise TraceError(f"{path.parent}: cannot spill the trace ({why}); free space, choose another --spill-dir "
                         f"or raise --memory-limit (the spill directory was removed)") from None


def _nearly_full(path: Path) -> bool:
    """polars does not always say a write failed for want of space ("Invalid thrift"): ask the file system."""
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20


def _spill(trace, tmp: Path, target: int, echo: Callable[[str], None] | None) -> SpilledTrace:
    files, manifest = _find_inputs(trace)
    names = [p.name for p in files]
    groups = spill_groups(files, target)
    say = echo or (lambda _s: None)
    t0 = time.perf_counter()
    metas: list[pl.DataFrame] = []
    starts: list[pl.DataFrame] = []
    reports: dict[int, list[tuple[int, FileReport]]] = {}
    for g, group in enumerate(groups):
        part = parse_part(group)
        _write_spill(part.events, tmp / f"raw-{g:05d}.parquet")
        metas.append(_reduce_meta(part.meta))
        starts.append(_starts(part.events))
        reports[g] = part.files
        del part
    meta = _reduce_meta(pl.concat(metas, how="vertical"))
    meta = _absolute_fh(meta, pl.concat(starts, how="vertical"))
    t1 = time.perf_counter()
    say(f"spill: parsed {len(files)} file(s) in {len(groups)} group(s) in {t1 - t0:.1f} s; combining")
    out_files: list[FileReport] = []
    paths: list[Path] = []
    height = 0
    for g in range(len(groups)):
        raw_path = tmp / f"raw-{g:05d}.parquet"
        raw = pl.read_parquet(raw_path)
        table, reps = combine_parts([TracePart(events=raw, meta=meta, files=reports[g])], names)
        del raw
        raw_path.unlink()
        out_files.extend(reps)
        table = table.with_columns(
            (pl.int_range(pl.len(), dtype=pl.Int64) + (g << _ROW_BITS)).alias(ORDER_COL))
        path = tmp / f"events-{g:05d}.parquet"
        _write_spill(table, path)
        paths.append(path)
        height += table.height
        del table
    t2 = time.perf_counter()
    nbytes = sum(p.stat().st_size for p in paths)
    say(f"spill: {height:,} events, {human_bytes(nbytes)} of Parquet in {tmp}, combined in {t2 - t1:.1f} s")
    schema = {**EVENT_SCHEMA, ORDER_COL: pl.Int64()}
    scan = pl.scan_parquet(paths, schema=schema) if paths else pl.LazyFrame(schema=schema)
    return SpilledTrace(events=scan, files=out_files, manifest=manifest, height=height, groups=len(groups),
                        directory=tmp, spill_bytes=nbytes, timings={"parse_s": t1 - t0, "combine_s": t2 - t1})
