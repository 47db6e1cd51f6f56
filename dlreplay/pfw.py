"""Low-level reading of DFTracer trace files (``.pfw`` and multi-member ``.pfw.gz``).

DFTracer writes each buffer flush as its own gzip member, and a job killed while
writing leaves a truncated last member. :func:`decoded_pieces` yields everything
decodable (inside a corrupt member too, up to the bad byte), resynchronises on the
next gzip member header, and counts what it had to drop. The trace loader
(:mod:`dlreplay.analyze.trace.load`) and capture's event counts both read through it.

Intact members are inflated with ISA-L (``isal``) when it is installed, which is about
twice as fast as :mod:`zlib` here; a member that does not decode cleanly that way is
decoded again with :mod:`zlib`, so what is salvaged and counted never depends on which
library is installed. Both release the GIL: files decode in parallel threads.
"""

from __future__ import annotations

import mmap
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

GZIP_MAGIC = b"\x1f\x8b\x08"
_FEED_BYTES = 1 << 20  # compressed bytes fed to the decompressor at a time
_OUT_BYTES = (
    8 << 20
)  # most decoded bytes one zlib call returns (memory stays bounded on a "zip bomb")
#: Decoded bytes of one member kept back on the fast path (the member is yielded only
#: once it decoded cleanly); a larger member is decoded with zlib, streaming.
_FAST_MEMBER_LIMIT = 64 << 20
#: Decoded bytes per output of the fast path. A new multi-MB buffer per member had its
#: pages faulted in afresh each time (decoding the ingest benchmark took 0.73 s of CPU
#: that way, 0.45 s of it page faults); small outputs come from malloc's free lists, and
#: copied into :class:`Slabs` at once, the same buffer serves every output. Not smaller:
#: every piece costs Python steps under the GIL (decode, line split, the scanner's line
#: count, which keeps the GIL below 64 KiB), and parse threads wait for each other's
#: (9 files on 2 cores: 1.53 -> 1.44 s with 256 KiB pieces instead of 64 KiB, the same
#: page faults and peak; one file, or 1 core: the same time).
_PIECE_BYTES = 256 << 10


def _fast_inflate():
    """The module used for intact members: ISA-L's ``igzip_lib``, else zlib (no fast path)."""
    try:
        from isal import igzip_lib
    except ImportError:  # optional speed-up
        return zlib
    return igzip_lib


_FAST = _fast_inflate()


def zlib_compatible_inflate() -> tuple[Any, tuple[type[BaseException], ...]]:
    """ISA-L's zlib-compatible module (``isal_zlib``: ``decompressobj`` with ``max_length``
    and ``unconsumed_tail``, about twice zlib's speed) and the errors it raises, else
    zlib's; for callers that inflate a bounded sample rather than whole members."""
    try:
        from isal import isal_zlib
    except ImportError:  # optional speed-up
        return zlib, (zlib.error,)
    return isal_zlib, (
        cast(type[BaseException], isal_zlib.error),
        zlib.error,
    )  # (its stubs type it an instance)


@dataclass
class DecodeStats:
    """Mutable per-file counters: gzip members, lines, what was dropped (bytes), problems."""

    members: int = 0
    lines: int = 0
    dropped_lines: int = 0
    dropped_bytes: int = 0
    problems: list[str] = field(default_factory=list)

    def drop(self, lines: int, nbytes: int) -> None:
        self.dropped_lines += lines
        self.dropped_bytes += nbytes


#: Anonymous mappings at least this large are backed by transparent huge pages when the
#: kernel allows it (one page fault per 2 MiB instead of per 4 KiB).
_HUGE_BYTES = 2 << 20


def anonymous_map(nbytes: int) -> mmap.mmap:
    """A private anonymous mapping of ``nbytes`` zero bytes (huge pages when large), unmapped
    when the last reference (a view of it included) goes."""
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buf = mmap.mmap(-1, nbytes, flags=private) if private else mmap.mmap(-1, nbytes)
    if nbytes >= _HUGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP not available: ordinary pages
            pass
    return buf


#: Bytes of one :class:`Slabs` mapping.
SLAB_BYTES = 4 << 20

#: Decoded bytes: ``buf[lo:hi]`` (``buf`` a bytes object or a :class:`Slabs` mapping).
Span = tuple["bytes | mmap.mmap", int, int]


class Slabs:
    """Where the fast path puts decoded text of a large file: each small decoder output is
    copied at once into the current 4 MiB mapping (huge pages), so the decoder's own
    output buffer is freed and reused by malloc for the next one.

    Decoded text held in many fresh malloc'd buffers until it was parsed had every page
    faulted in anew (in a VM, a fault costs microseconds): 75k of the ~100k page faults of
    parsing the ingest benchmark's trace. A mapping is unmapped when no span of it is
    referenced any more.

    Mappings are written again once their text is parsed, where the parser says so: the
    text is handed over in chunks (numbered from 0 in order); :meth:`seal` (the producer,
    before it hands chunk ``k`` over) marks the mappings that the chunks after ``k`` may
    still use, and :meth:`release` (the parser, once it has parsed chunks up to ``k`` and
    reads none of them again) lets the next mappings reuse every other mapping those
    chunks used. Each fresh 4 MiB mapping had the kernel zero its huge pages (4-13 % of
    the parse's CPU time on a VM); with ``recycle`` a range of the ingest benchmark's
    single file took 52 mappings instead of 104, and loading it on 2 cores 1.15 -> 1.12 s
    (medians of 8). Without ``recycle`` (or without ``release`` calls, which then keep
    every mapping until the :class:`Slabs` goes) nothing is reused.
    """

    def __init__(
        self, size: int | None = None, *, recycle: bool = False, keep_bytes: int = 0
    ) -> None:
        self.size = size or SLAB_BYTES
        self.recycle = recycle
        #: the most released mappings kept for reuse (``keep_bytes`` of them, at least one:
        #: more, and those released after :meth:`finish`, are unmapped; they would only add
        #: to the peak)
        self.keep = max(1, keep_bytes // self.size)
        self._finished = False
        self._cur: mmap.mmap | None = None
        self._pos = 0
        self._lock = threading.Lock()
        self._chunk = 0  # the chunk being assembled: every span put now is in it or a later one
        #: the last chunk that may hold a span of each mapping in use (by id), and the mappings
        self._last: dict[int, int] = {}
        self._used: dict[int, mmap.mmap] = {}
        self._free: list[mmap.mmap] = []

    def put(self, out: bytes) -> Span:
        """The span where ``out`` now is (``out`` itself when larger than a mapping)."""
        n = len(out)
        if n > self.size:
            return out, 0, n
        with self._lock:
            if self._cur is None or self._pos + n > self.size:
                self._cur = self._free.pop() if self._free else anonymous_map(self.size)
                self._pos = 0
                if self.recycle:
                    self._used[id(self._cur)] = self._cur
            if self.recycle:
                self._last[id(self._cur)] = self._chunk
            cur = self._cur
        lo = self._pos
        # numpy's copy releases the GIL (an mmap slice assignment holds it through the
        # copy and the page faults of a fresh mapping: a fifth of the time the parse
        # threads held the GIL, serialising them)
        np.frombuffer(cur, dtype=np.uint8, count=n, offset=lo)[:] = np.frombuffer(
            out, dtype=np.uint8
        )
        self._pos = lo + n
        return cur, lo, lo + n

    def seal(self, rest: Sequence[tuple[object, int, int]]) -> None:
        """Chunk ``k`` (the one being assembled) is handed over next; ``rest`` are the
        spans put so far that are not in it (they go to a later chunk)."""
        if not self.recycle:
            return
        with self._lock:
            self._chunk += 1
            for buf, _lo, _hi in rest:
                if id(buf) in self._used and self._used[id(buf)] is buf:
                    self._last[id(buf)] = self._chunk
            if self._cur is not None:
                self._last[id(self._cur)] = self._chunk

    def release(self, through: int) -> None:
        """Chunks ``0 .. through`` are parsed and none of their text is read again."""
        if not self.recycle:
            return
        with self._lock:
            for key in [k for k, last in self._last.items() if last <= through]:
                if self._used[key] is not self._cur:  # (sealed past ``through``: never the case)
                    slab = self._used.pop(key)
                    del self._last[key]
                    if not self._finished and len(self._free) < self.keep:
                        self._free.append(slab)

    def finish(self) -> None:
        """Nothing more will be put (the producer's end): the kept mappings go."""
        with self._lock:
            self._finished = True
            self._free.clear()
            self._cur = None


def decoded_pieces(data: bytes, stats: DecodeStats) -> Iterable[tuple[bytes, bool]]:
    """Decode ``data`` (gzip members, or plain text); yield (bytes, damage_follows)."""
    for buf, lo, hi, damage in decoded_spans(data, stats):
        yield (
            buf if isinstance(buf, bytes) and lo == 0 and hi == len(buf) else bytes(buf[lo:hi]),
            damage,
        )


#: Plain (not gzip) trace text is handed on in spans of this many bytes.
PLAIN_SPAN_BYTES = 4 << 20


class PlainFile:
    """A plain-text (not gzip) trace file that :func:`decoded_spans` reads in spans of
    :data:`PLAIN_SPAN_BYTES` as they are parsed, instead of all of it first: a file of
    garbage costs memory by the parse chunk, never by its size. ``len()`` is its size."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.size = self.path.stat().st_size

    def __len__(self) -> int:
        return self.size

    def spans(self) -> Iterable[tuple[bytes, int, int, bool]]:
        with open(self.path, "rb") as fh:
            while block := fh.read(PLAIN_SPAN_BYTES):
                yield block, 0, len(block), False

    @staticmethod
    def of(path: str | Path) -> PlainFile | None:
        """A :class:`PlainFile` for *path* when it does not start like gzip, else None."""
        with open(path, "rb") as fh:
            head = fh.read(1)
        return PlainFile(path) if head and head != GZIP_MAGIC[:1] else None


def decoded_spans(
    data: bytes | PlainFile, stats: DecodeStats, slabs: Slabs | None = None
) -> Iterable[tuple[bytes | mmap.mmap, int, int, bool]]:
    """:func:`decoded_pieces` as (buf, lo, hi, damage_follows): the decoded bytes are
    ``buf[lo:hi]``; with ``slabs``, the fast path's output is copied there."""
    if isinstance(data, PlainFile):  # read as it is parsed: memory bounded by the parse chunks
        yield from data.spans()
        return
    if not data.startswith(GZIP_MAGIC[:1]):  # JSON text never starts with 0x1f
        # in spans, so a large plain text is parsed in chunks like a gzip one (and a long
        # line of garbage is dropped as it streams by), not as one text of its whole size
        for lo in range(0, len(data), PLAIN_SPAN_BYTES):
            yield data, lo, min(lo + PLAIN_SPAN_BYTES, len(data)), False
        return
    mv = memoryview(data)
    n = len(data)
    pos = 0
    while pos < n:
        if n - pos < 10 and GZIP_MAGIC.startswith(
            data[pos : pos + 3]
        ):  # cut inside a member header
            stats.problems.append(f"file is truncated inside a gzip member header at byte {pos}")
            return
        if data[pos : pos + 3] != GZIP_MAGIC:
            nxt = data.find(GZIP_MAGIC, pos)
            skip_to = n if nxt < 0 else nxt
            if data[pos:skip_to].strip(b"\x00"):  # zero padding after the last member is benign
                stats.drop(0, skip_to - pos)
                stats.problems.append(
                    f"skipped {skip_to - pos} bytes that are not gzip data at byte {pos}"
                )
            pos = skip_to
            continue
        stats.members += 1
        start = pos
        if _FAST is not zlib:
            fast = _fast_member(mv, pos, slabs)  # a damaged member's spans in slabs are left unused
            if fast is not None:
                spans, pos = fast
                for buf, lo, hi in spans:
                    yield buf, lo, hi, False
                continue
        d = zlib.decompressobj(31)
        while True:
            chunk = mv[pos : pos + _FEED_BYTES]
            if not chunk:  # input ended inside the member
                stats.problems.append(
                    f"file is truncated: gzip member {stats.members} (at byte {start}) is incomplete"
                )
                out = d.flush()
                yield out, 0, len(out), True
                return
            before = d.copy()
            try:  # output bounded per call: 1 MiB of deflated NUL bytes inflates to 1 GiB
                out = d.decompress(chunk, _OUT_BYTES)
            except zlib.error as exc:
                good, err_at = _salvage_chunk(before, chunk)
                err_pos = pos + err_at
                nxt = data.find(GZIP_MAGIC, start + 1)
                resume = n if nxt < 0 else nxt
                stats.drop(0, max(0, resume - err_pos))
                stats.problems.append(
                    f"corrupt gzip member {stats.members} at byte {err_pos} ({exc}); "
                    + (
                        f"resumed at the next member header at byte {resume}"
                        if nxt >= 0
                        else "no later member header"
                    )
                )
                yield good, 0, len(good), True
                pos = resume
                break
            if d.eof:
                pos = pos + len(chunk) - len(d.unused_data)
                yield out, 0, len(out), False
                break
            yield out, 0, len(out), False
            pos += len(chunk) - len(d.unconsumed_tail)  # the rest is fed again


def _fast_member(
    mv: memoryview, pos: int, slabs: Slabs | None = None
) -> tuple[list[Span], int] | None:
    """Decode the member at ``pos`` with the fast library: (spans of at most
    ``_PIECE_BYTES``, in ``slabs`` when given; end offset), or None when it is damaged,
    truncated or too large (the caller then decodes it with zlib)."""
    d = _FAST.IgzipDecompressor(_FAST.DECOMP_GZIP)
    pieces: list[Span] = []
    size = 0
    end = pos  # end of the input fed so far (the decompressor keeps what it did not use yet)
    try:
        while True:
            data: memoryview | bytes = b""
            if d.needs_input:
                data = mv[end : end + _FEED_BYTES]
                if not data:
                    return None
                end += len(data)
            out = d.decompress(data, _PIECE_BYTES)
            pieces.append(slabs.put(out) if slabs is not None else (out, 0, len(out)))
            size += len(out)
            if d.eof:
                return pieces, end - len(d.unused_data)
            if size > _FAST_MEMBER_LIMIT:
                return None
    except Exception:  # noqa: BLE001 - isal raises its own error type; zlib decides what to salvage
        return None


def _salvage_chunk(before, chunk: memoryview) -> tuple[bytes, int]:
    """Output decodable from ``chunk`` before a zlib error, and the error's byte offset.

    Bisects the prefix length: feeding a prefix that stops before the bad code raises
    nothing, a longer one raises (deflate decodes sequentially).
    """
    lo, hi = 0, len(chunk)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            before.copy().decompress(chunk[:mid])
            lo = mid
        except zlib.error:
            hi = mid
    return before.copy().decompress(chunk[:lo]), lo


@dataclass
class Decoded:
    """Decompressed text of one trace file and what was lost on the way."""

    data: bytes
    stats: DecodeStats

    @property
    def damaged(self) -> bool:
        return bool(self.stats.problems)


def decompress(path: str | Path) -> Decoded:
    """Read and decode one trace file (``.pfw`` plain text or ``.pfw.gz``), salvaging damage."""
    stats = DecodeStats()
    data = b"".join(piece for piece, _ in decoded_pieces(Path(path).read_bytes(), stats))
    return Decoded(data=data, stats=stats)


@dataclass(frozen=True)
class EventCount:
    events: int
    lines: int
    damaged: bool


def count_events(path: str | Path) -> EventCount:
    """Count events (lines with a timestamp) and all lines of a trace file, tolerating damage."""
    dec = decompress(path)
    data = dec.data
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return EventCount(events=data.count(b'"ts":'), lines=lines, damaged=dec.damaged)
