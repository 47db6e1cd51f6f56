"""A trace's inputs: which files (:func:`find_trace_inputs`: runs in subdirectories and
byte-identical copies left out, the manifest read), what a reader must know about them
(:func:`trace_warnings`), and how they are shared out for parsing: groups of whole files
by stored size (:func:`file_groups`, :func:`groups_of`) and byte ranges of a large gzip
file cut at member headers (:func:`split_file`, :func:`member_ranges`).
"""

from __future__ import annotations

import json
import os
import signal
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from dlreplay.errors import TraceError
from dlreplay.pfw import GZIP_MAGIC

from .shapes import RENUMBERED, STRAY_IO, FileReport, TraceDamageWarning, counted_problem

__all__ = [
    "MANIFEST_NAME",
    "TRACE_SUFFIXES",
    "TraceInputs",
    "available_cores",
    "file_groups",
    "find_inputs",
    "find_trace_inputs",
    "groups_of",
    "member_ranges",
    "range_share",
    "source_name",
    "split_file",
    "stored_size",
    "TraceNotes",
    "trace_gaps",
    "trace_notes",
    "trace_warnings",
]

TRACE_SUFFIXES = (".pfw", ".pfw.gz")


def source_name(path: Path) -> str:
    """The file's name as the table's ``source`` holds it: text that can be printed and
    written anywhere. A name that is not UTF-8 (Python keeps its bytes as surrogates, which
    polars and every output refuse) shows its undecodable bytes as ``\\xNN``."""
    return os.fsencode(path.name).decode("utf-8", "backslashreplace")


MANIFEST_NAME = "manifest.json"


#: Stored bytes of the files parsed together by one :func:`parse_part` call of
#: :func:`load_trace` (a larger file is a group of its own).
_GROUP_BYTES = 4 << 20


#: Stored bytes below which a file is never split into byte ranges.
_SPLIT_MIN_BYTES = 2 << 20


def groups_of(jobs: list[tuple[int, Path]], target: int) -> list[list[tuple[int, Path]]]:
    """Consecutive (src, path) groups of about ``target`` stored bytes; a file is never split."""
    groups: list[list[tuple[int, Path]]] = []
    current: list[tuple[int, Path]] = []
    size = 0
    for job in jobs:
        n = stored_size(job[1])
        if current and size + n > target:
            groups.append(current)
            current, size = [], 0
        current.append(job)
        size += n
    if current:
        groups.append(current)
    return groups


def range_share(sizes: list[int], workers: int) -> int:
    """Stored bytes of a byte range: half a worker's share of the files (so that a file
    twice that size is split and the workers stay busy), at least ``_SPLIT_MIN_BYTES``."""
    return max(_SPLIT_MIN_BYTES, sum(sizes) // (2 * workers))


def split_file(path: Path, size: int, pieces: int) -> list[tuple[int, int]] | None:
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
                    out = d.decompress(window[k : k + _PROBE_BYTES], 256)
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


def file_groups(jobs: list[tuple[int, Path]], workers: int) -> list[list[tuple[int, Path]]]:
    """Consecutive files grouped by stored size: about ``_GROUP_BYTES`` per group, fewer
    when that leaves idle workers; a file larger than that is a group of its own."""
    sizes = [stored_size(p) for _, p in jobs]
    target = (
        _GROUP_BYTES if workers == 1 else max(1, min(_GROUP_BYTES, sum(sizes) // (2 * workers)))
    )
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


def stored_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass(frozen=True)
class TraceInputs:
    """The trace files of a path, its manifest, and the files left out (one sentence each, naming them)."""

    files: list[Path]
    manifest: dict | None
    skipped: list[str] = field(default_factory=list)
    #: the trace directory (None: files given), where its manifest's listed files belong
    root: Path | None = None


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
        raise TraceError(
            f"trace path {p} does not exist: pass a directory written by "
            "'dlreplay capture' or a .pfw/.pfw.gz file"
        )
    if not p.is_dir():
        raise TraceError(f"trace path {p} is neither a file nor a directory")
    found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    if not found:
        _no_trace_files(p)
    runs = sorted({d for d in (_run_root(f, p) for f in found) if d is not None}, key=str)
    mine = [f for f in found if _run_root(f, p) is None]
    if not mine and len(runs) > 1:
        names = ", ".join(str(r.relative_to(p)) for r in runs[:5]) + (
            ", ..." if len(runs) > 5 else ""
        )
        raise TraceError(
            f"{p} holds {len(runs)} captured runs ({names}), each with its own {MANIFEST_NAME}: "
            f"analyse one run at a time (e.g. {runs[0]})"
        )
    if not mine:  # one run in a subdirectory: that run
        return find_trace_inputs(runs[0])
    skipped = [
        f"{r.relative_to(p)}/: {sum(1 for f in found if _run_root(f, p) == r)} trace file(s) of another "
        f"run (it has its own {MANIFEST_NAME}), left out; analyse {r} on its own"
        for r in runs
    ]
    files, dupes = _without_duplicates(mine)
    if dupes:
        pairs = "; ".join(f"{f.relative_to(p)} = {g.relative_to(p)}" for f, g in dupes[:5])
        skipped.append(
            f"{len(dupes)} trace file(s) are byte-identical copies of others (the same process's trace "
            f"twice), left out: {pairs}{'; ...' if len(dupes) > 5 else ''}"
        )
    return TraceInputs(files, _read_manifest(p / MANIFEST_NAME), skipped, p)


def _no_trace_files(p: Path) -> NoReturn:
    """Refuse directory *p*, which holds no trace file: why, from its manifest where it has one."""
    listed = (_read_manifest(p / MANIFEST_NAME) or {}).get("files")
    if isinstance(listed, list) and listed:  # the capture wrote them: they were removed since
        raise TraceError(
            f"no trace files (*.pfw, *.pfw.gz) under {p}, though its {MANIFEST_NAME} lists "
            f"{len(listed)}: they were moved or deleted after the capture; restore them or capture again"
        )
    raise TraceError(
        f"no trace files (*.pfw, *.pfw.gz) under {p}: was the job captured "
        "with DFTracer, and did it run long enough to write its trace?"
    )


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
        by_size.setdefault(stored_size(f), []).append(f)
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


def find_inputs(path) -> tuple[list[Path], dict | None]:
    """Resolve ``path`` to trace files (sorted) and the manifest of a directory, if any (see
    :func:`find_trace_inputs`)."""
    found = find_trace_inputs(path)
    return found.files, found.manifest


@dataclass(frozen=True)
class TraceNotes:
    """What a reader must know before any number derived from a trace (``warnings``, one
    sentence each, naming the file), and of those the ones that say the capture is missing
    parts (``gaps``: it did not end, its job was stopped, killed or failed, a process file is
    gone, shorter than at capture, cut or damaged). ``gaps`` come first in ``warnings``."""

    warnings: list[str]
    gaps: list[str]

    @property
    def incomplete(self) -> bool:
        return bool(self.gaps)


def trace_warnings(path, files: Sequence[FileReport] = ()) -> list[str]:
    """What a reader must know before any number derived from the trace at *path* (see
    :func:`trace_notes`)."""
    return trace_notes(path, files).warnings


def trace_gaps(path, files: Sequence[FileReport] = ()) -> list[str]:
    """What is missing from the capture at *path* (see :func:`trace_notes`)."""
    return trace_notes(path, files).gaps


def trace_notes(path, files: Sequence[FileReport] = ()) -> TraceNotes:
    """What a reader must know before any number derived from the trace at *path*: a capture
    that did not end, was stopped, or whose job was killed or failed (the manifest's
    ``status``); trace files the manifest lists that are gone or shorter than it recorded; a
    process file cut; files left out (another run, duplicates), calls the tracer named after
    a closed file, and files that hold no events. One sentence each, naming the file."""
    found = find_trace_inputs(path)
    gaps = _status_gaps(found.manifest or {})
    listed, short = _listed_gaps(found, {f.name: f.events for f in files})
    gaps += listed
    cut = [f for f in files if f.damaged]
    if cut:
        gaps.append(
            f"{len(cut)} process file(s) cut or damaged ({', '.join(f.name for f in cut[:5])}"
            f"{', ...' if len(cut) > 5 else ''}): those processes' traces are incomplete"
        )
    out = [*gaps, *found.skipped]
    moved = [p for f in files for p in f.problems if RENUMBERED in p]
    if moved:
        said = "; ".join(m.split(": it ")[0] for m in moved[:3])
        out.append(
            f"{len(moved)} process(es) numbered anew where a pid also ran on another host, so that no two "
            f"hosts' processes mix: {said}{'; ...' if len(moved) > 3 else ''}"
        )
    stray = [
        (f.name, got[0])
        for f in files
        for p in f.problems
        if (got := counted_problem(p)) and got[1] == STRAY_IO
    ]
    if stray:
        out.append(
            f"{sum(n for _, n in stray)} read/write call(s) in {len(stray)} process file(s) "
            f"({', '.join(name for name, _ in stray[:3])}{', ...' if len(stray) > 3 else ''}) were logged on a "
            f"file their process had already closed, or (writes) on one it never opened for writing: "
            f"DFTracer forgets a descriptor's file only after closing it, and another thread's socket or "
            f"pipe got the number in between. They are kept without a file, outside every file's bytes"
        )
    empty = [
        f for f in files if f.events == 0 and f.name not in short
    ]  # a shrunk one is said above
    if empty:
        why = "; ".join(f"{f.name} ({'; '.join(f.problems) or 'no events'})" for f in empty[:5])
        out.append(
            f"{len(empty)} of {len(files)} trace file(s) hold no events: {why}"
            f"{'; ...' if len(empty) > 5 else ''}"
        )
    return TraceNotes(out, gaps)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _count(value: Any) -> int | None:
    """*value* as a count (a non-negative int, never a bool), else None: manifests are input."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _status_gaps(manifest: dict) -> list[str]:
    """How the captured job ended, where that leaves the trace short of a whole run."""
    status = manifest.get("status")
    sig = _count(manifest.get("killed_by_signal"))
    code = _count(manifest.get("exit_code"))
    by = f" by {_signal_name(sig)}" if sig else ""
    if status == "running":
        return [
            f"the capture did not end: its {MANIFEST_NAME} still says 'running' (its dlreplay process was "
            f"killed, or it is still running), so the trace may be incomplete"
        ]
    if status == "interrupted":
        return [
            f"the capture was interrupted: its {MANIFEST_NAME} says 'interrupted' (the job was stopped{by} "
            f"before its end), so the trace holds only the part of the run before that"
        ]
    if sig:
        return [
            f"the captured job was killed{by} (its {MANIFEST_NAME} says so): a process killed that way "
            f"cannot write the trace events DFTracer still held in memory, so the trace is incomplete"
        ]
    if status == "failed":
        return [
            f"the captured job failed (exit code {code if code is not None else 'unknown'}; its "
            f"{MANIFEST_NAME} says 'failed'): the trace holds the run up to its failure, not a whole run"
        ]
    if isinstance(status, str) and status != "complete":
        return [
            f"its {MANIFEST_NAME} says the capture's status is {status[:40]!r}, not 'complete': the "
            f"trace may be incomplete"
        ]
    return []


def _shorter(f: Path, entry: dict, events_now: int | None) -> tuple[int, int, str] | None:
    """(now, at capture, unit) when the listed file ``f`` holds less than its manifest
    ``entry`` recorded: fewer events where both counts are known, else fewer bytes."""
    had = _count(entry.get("events"))
    if events_now is not None and had is not None:
        return (events_now, had, "events") if events_now < had else None
    recorded = _count(entry.get("bytes"))
    if recorded is not None and (now := stored_size(f)) < recorded:
        return now, recorded, "bytes"
    return None


def _listed_gaps(found: TraceInputs, events: dict[str, int]) -> tuple[list[str], set[str]]:
    """Trace files the manifest lists that are gone or shorter than it recorded (one sentence
    each kind), and the names of the shorter ones.

    Where the file was read (``events``: its events now) and the manifest counted its
    events, fewer events is what makes it short: a file compressed again (more gzip
    members, another level) has other bytes and the same events. Otherwise its bytes."""
    if found.root is None or not isinstance(found.manifest, dict):
        return [], set()
    entries = found.manifest.get("files")
    gone: list[tuple[str, int | None]] = []
    short: list[tuple[str, int, int, str]] = []
    for e in entries if isinstance(entries, list) else []:
        name = e.get("name") if isinstance(e, dict) else None
        # a plain file name of the capture's own directory, nothing a manifest could point elsewhere
        if not isinstance(name, str) or not name or name != Path(name).name or name in (".", ".."):
            continue
        f = found.root / name
        if not f.is_file():
            gone.append((name, _count(e.get("events"))))
        elif (shorter := _shorter(f, e, events.get(name))) is not None:
            short.append((name, *shorter))
    out = []
    if gone:
        lost = sum(n or 0 for _, n in gone)
        out.append(
            f"{len(gone)} trace file(s) that the {MANIFEST_NAME} lists are gone "
            f"({', '.join(n for n, _ in gone[:5])}{', ...' if len(gone) > 5 else ''}): the "
            f"{lost:,} event(s) they held at capture are missing, so the trace is incomplete"
        )
    if short:
        said = "; ".join(
            f"{n}: {'emptied' if now == 0 else f'{now:,} of {was:,} {unit}'}"
            for n, now, was, unit in short[:5]
        )
        out.append(
            f"{len(short)} trace file(s) are shorter than the {MANIFEST_NAME} recorded at capture ({said}"
            f"{'; ...' if len(short) > 5 else ''}): those processes' events are partly or wholly missing"
        )
    return out, {n for n, _, _, _ in short}


def _read_manifest(path: Path) -> dict | None:
    """The manifest as a dict, or None when absent; a broken one warns and yields None."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # (RecursionError: nested too deep)
        warnings.warn(
            TraceDamageWarning(f"{path} is unreadable ({exc}); loading without it"), stacklevel=3
        )
        return None
    return data if isinstance(data, dict) else None


def member_ranges(path: str | os.PathLike, target_bytes: int) -> list[tuple[int, int]] | None:
    """Byte ranges of about ``target_bytes`` (stored) cut at gzip member headers, covering
    the file; None when it is not gzip or holds one member (see :func:`split_file`: the
    cuts are checked when the ranges are resolved, :func:`resolve_ranges`)."""
    size = stored_size(Path(path))
    return split_file(Path(path), size, max(1, -(-size // max(1, target_bytes))))
