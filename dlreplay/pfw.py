"""Low-level reading of DFTracer trace files (``.pfw`` and multi-member ``.pfw.gz``).

DFTracer writes each buffer flush as its own gzip member, and a job killed while
writing leaves a truncated last member. :func:`decoded_pieces` yields everything
decodable (inside a corrupt member too, up to the bad byte), resynchronises on the
next gzip member header, and counts what it had to drop. The trace loader
(:mod:`dlreplay.analyze.load`) and capture's event counts both read through it.

Intact members are inflated with ISA-L (``isal``) when it is installed, which is about
twice as fast as :mod:`zlib` here; a member that does not decode cleanly that way is
decoded again with :mod:`zlib`, so what is salvaged and counted never depends on which
library is installed. Both release the GIL: files decode in parallel threads.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b\x08"
_FEED_BYTES = 1 << 20  # compressed bytes fed to zlib at a time
#: Decoded bytes of one member kept back on the fast path (the member is yielded only
#: once it decoded cleanly); a larger member is decoded with zlib, streaming.
_FAST_MEMBER_LIMIT = 64 << 20
#: Decoded bytes per piece on the fast path. Small pieces come from malloc's free lists
#: and are reused after the loader drops them: a new multi-MB buffer per member had its
#: pages faulted in afresh each time (decoding the ingest benchmark took 0.73 s of CPU
#: that way, of which 0.45 s page faults; 64 KiB pieces: 0.3 s, almost no faults).
_PIECE_BYTES = 64 << 10


def _fast_inflate():
    """The module used for intact members: ISA-L's ``igzip_lib``, else zlib (no fast path)."""
    try:
        from isal import igzip_lib
    except ImportError:  # optional speed-up
        return zlib
    return igzip_lib


_FAST = _fast_inflate()


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


def decoded_pieces(data: bytes, stats: DecodeStats) -> Iterable[tuple[bytes, bool]]:
    """Decode ``data`` (gzip members, or plain text); yield (bytes, damage_follows)."""
    if not data.startswith(GZIP_MAGIC[:1]):  # JSON text never starts with 0x1f
        yield data, False
        return
    mv = memoryview(data)
    n = len(data)
    pos = 0
    while pos < n:
        if n - pos < 10 and GZIP_MAGIC.startswith(data[pos:pos + 3]):  # cut inside a member header
            stats.problems.append(f"file is truncated inside a gzip member header at byte {pos}")
            return
        if data[pos:pos + 3] != GZIP_MAGIC:
            nxt = data.find(GZIP_MAGIC, pos)
            skip_to = n if nxt < 0 else nxt
            if data[pos:skip_to].strip(b"\x00"):  # zero padding after the last member is benign
                stats.drop(0, skip_to - pos)
                stats.problems.append(f"skipped {skip_to - pos} bytes that are not gzip data at byte {pos}")
            pos = skip_to
            continue
        stats.members += 1
        start = pos
        if _FAST is not zlib:
            fast = _fast_member(mv, pos)
            if fast is not None:
                pieces, pos = fast
                for piece in pieces:
                    yield piece, False
                continue
        d = zlib.decompressobj(31)
        while True:
            chunk = mv[pos:pos + _FEED_BYTES]
            if not chunk:  # input ended inside the member
                stats.problems.append(
                    f"file is truncated: gzip member {stats.members} (at byte {start}) is incomplete"
                )
                yield d.flush(), True
                return
            before = d.copy()
            try:
                out = d.decompress(chunk)
            except zlib.error as exc:
                good, err_at = _salvage_chunk(before, chunk)
                err_pos = pos + err_at
                nxt = data.find(GZIP_MAGIC, start + 1)
                resume = n if nxt < 0 else nxt
                stats.drop(0, max(0, resume - err_pos))
                stats.problems.append(
                    f"corrupt gzip member {stats.members} at byte {err_pos} ({exc}); "
                    + (f"resumed at the next member header at byte {resume}" if nxt >= 0
                       else "no later member header")
                )
                yield good, True
                pos = resume
                break
            if d.eof:
                pos = pos + len(chunk) - len(d.unused_data)
                yield out, False
                break
            yield out, False
            pos += len(chunk)


def _fast_member(mv: memoryview, pos: int) -> tuple[list[bytes], int] | None:
    """Decode the member at ``pos`` with the fast library: (pieces of at most
    ``_PIECE_BYTES``, end offset), or None when it is damaged, truncated or too large (the
    caller then decodes it with zlib)."""
    d = _FAST.IgzipDecompressor(_FAST.DECOMP_GZIP)
    pieces: list[bytes] = []
    size = 0
    end = pos  # end of the input fed so far (the decompressor keeps what it did not use yet)
    try:
        while True:
            data: memoryview | bytes = b""
            if d.needs_input:
                data = mv[end:end + _FEED_BYTES]
                if not data:
                    return None
                end += len(data)
            out = d.decompress(data, _PIECE_BYTES)
            pieces.append(out)
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
