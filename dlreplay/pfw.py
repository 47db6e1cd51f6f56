"""Low-level reading of DFTracer trace files (``.pfw`` and multi-member ``.pfw.gz``).

DFTracer writes each buffer flush as its own gzip member, and a job killed while
writing leaves a truncated last member. :func:`decompress` returns everything
decodable, skips a corrupt member by resynchronising on the next gzip header,
and counts what it had to drop, in bytes of the compressed file.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

_GZIP_MAGIC = b"\x1f\x8b\x08"


@dataclass
class Decoded:
    """Decompressed text of one trace file and what was lost on the way.

    ``dropped_bytes`` counts compressed bytes that could not be decoded;
    ``truncated`` is True when the file ended inside a gzip member.
    """

    data: bytes
    members: int = 0
    dropped_bytes: int = 0
    truncated: bool = False
    problems: list[str] = field(default_factory=list)


def decompress_bytes(raw: bytes, name: str = "<bytes>") -> Decoded:
    """Decode all gzip members of ``raw`` (or return it as-is if it is not gzip)."""
    if not raw.startswith(_GZIP_MAGIC[:2]):
        return Decoded(data=raw)
    chunks: list[bytes] = []
    pos = 0
    members = 0
    dropped = 0
    truncated = False
    problems: list[str] = []
    n = len(raw)
    while pos < n:
        if raw[pos : pos + 3] != _GZIP_MAGIC:
            nxt = raw.find(_GZIP_MAGIC, pos + 1)
            skip_to = n if nxt < 0 else nxt
            if raw[pos:skip_to].strip(b"\x00"):
                problems.append(f"{name}: {skip_to - pos} bytes of garbage at offset {pos} skipped")
                dropped += skip_to - pos
            pos = skip_to
            continue
        d = zlib.decompressobj(31)
        try:
            out = d.decompress(raw[pos:])
        except zlib.error as exc:
            nxt = raw.find(_GZIP_MAGIC, pos + 1)
            skip_to = n if nxt < 0 else nxt
            problems.append(f"{name}: corrupt gzip member at offset {pos} ({exc}); {skip_to - pos} bytes skipped")
            dropped += skip_to - pos
            pos = skip_to
            continue
        if not d.eof:
            # Truncated last member: keep what decoded, report the rest.
            chunks.append(out + d.flush())
            truncated = True
            problems.append(f"{name}: truncated inside gzip member at offset {pos}")
            members += 1
            break
        chunks.append(out)
        members += 1
        consumed = n - pos - len(d.unused_data)
        pos += consumed
    return Decoded(data=b"".join(chunks), members=members, dropped_bytes=dropped, truncated=truncated, problems=problems)


def decompress(path: str | Path) -> Decoded:
    """Read and decode one trace file (``.pfw`` plain text or ``.pfw.gz``)."""
    p = Path(path)
    return decompress_bytes(p.read_bytes(), p.name)


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
    events = data.count(b'"ts":')
    return EventCount(events=events, lines=lines, damaged=bool(dec.problems))
