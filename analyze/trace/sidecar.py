"""Events whose arguments the event table keeps no column for, read straight from the trace
files: the ``flags`` of ``open`` calls, S3 ``GetObject`` ranges, mapped-file windows.

The loader's table has one vocabulary of columns for every trace; a pass that needs one more
argument of a few kinds of events finds their lines with a regular expression
(:func:`matching_lines`) and decodes only the fields it names (:func:`fields_of`), each line on
its own: a damaged line, a value of another type or DFTracer 1.x beside 2.x reads as nulls
there and never fails the others; a key given twice takes its last value, as in the loader.
A trace file is read up to :data:`MAX_TRACE_BYTES` (decompressed); a damaged file gives the
lines read before the damage.

Every pattern a module compiles at import goes through :func:`register`; the first
:func:`matching_lines` call on a trace reads (and decompresses) its files once for all of them
and keeps the matched lines of the last two traces, so distill's passes (open flags, S3 GETs,
mapped windows) and `compare`'s two sides do not read the trace again each.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from .inputs import TRACE_SUFFIXES

__all__ = [
    "MAX_TRACE_BYTES",
    "DType",
    "fields_of",
    "matching_lines",
    "register",
    "trace_files",
]

#: A polars type, as a class (``pl.Int64``) or an instance.
DType = pl.DataType | type[pl.DataType]

#: The most bytes (decompressed) read of one trace file.
MAX_TRACE_BYTES = 1 << 31


def trace_files(source: str | Path | None) -> list[Path]:
    """The trace files at *source*: the file itself, or a directory's trace files (any depth),
    sorted; none for ``None`` or a path that is neither."""
    if not source:
        return []
    p = Path(source)
    if p.is_file():
        return [p]
    if not p.is_dir():
        return []
    return sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))


def _read(path: Path) -> bytes:
    """*path*'s bytes, decompressed member by member, up to :data:`MAX_TRACE_BYTES`; of a damaged
    or vanished file, what could be read (nothing, or the members before the damage and what
    the damaged one gave)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_TRACE_BYTES)
    except OSError:
        return b""
    if not path.name.endswith(".gz"):
        return data
    out = bytearray()
    while data and len(out) < MAX_TRACE_BYTES:  # each buffer flush is its own gzip member
        member = zlib.decompressobj(wbits=31)
        try:
            out += member.decompress(data, MAX_TRACE_BYTES - len(out))
            while member.unconsumed_tail and len(out) < MAX_TRACE_BYTES:
                out += member.decompress(member.unconsumed_tail, MAX_TRACE_BYTES - len(out))
        except zlib.error:  # damaged: what came before it
            break
        if not member.eof:
            break
        data = member.unused_data
    return bytes(out)


#: The patterns :func:`matching_lines` looks for in one read of a trace, each with its needles.
_PATTERNS: list[re.Pattern[bytes]] = []
_NEEDLES: dict[re.Pattern[bytes], tuple[bytes, ...]] = {}


def register(pattern: re.Pattern[bytes], *needles: bytes) -> re.Pattern[bytes]:
    """*pattern*, looked for from now on in every read of a trace (call at import, so that one
    read serves every pass). *needles*: literals of which every line *pattern* matches holds
    one (``b'"name":"SH","cat":"dftracer"'``); the lines holding one are found by a plain
    search and only they are matched. Without needles the pattern runs over the whole text,
    which Python's ``re`` does at about 100 MB/s a pattern (a line-anchored pattern is tried
    at every byte): 25 s of a 1 M-event trace's analysis before needles, 0.5 s with them."""
    if pattern not in _PATTERNS:
        _PATTERNS.append(pattern)
    if needles:
        _NEEDLES[pattern] = tuple(needles)
    return pattern


def _lines_with(data: bytes, pattern: re.Pattern[bytes], needles: tuple[bytes, ...]) -> list[bytes]:
    """The lines of *data* that hold one of *needles* and that *pattern* matches, in order."""
    bounds: dict[int, int] = {}  # start -> end of each line holding a needle
    for needle in needles:
        at = data.find(needle)
        while at >= 0:
            end = data.find(b"\n", at)
            end = len(data) if end < 0 else end
            bounds[data.rfind(b"\n", 0, at) + 1] = end
            at = data.find(needle, end)
    return [data[a:b] for a, b in sorted(bounds.items()) if pattern.fullmatch(data, a, b)]


@functools.lru_cache(maxsize=2)
def _scan(
    files: tuple[tuple[str, int, int], ...], patterns: tuple[re.Pattern[bytes], ...]
) -> tuple[list[bytes], ...]:
    """The lines each of *patterns* matches in *files* ((path, size, mtime ns), in order)."""
    found: tuple[list[bytes], ...] = tuple([] for _ in patterns)
    for path, _size, _mtime in files:
        data = _read(Path(path))
        for lines, pattern in zip(found, patterns, strict=True):
            needles = _NEEDLES.get(pattern)
            lines.extend(_lines_with(data, pattern, needles) if needles else pattern.findall(data))
    return found


def _identity(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    """*files* as (path, size, mtime ns): a file rewritten since is read again."""
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            out.append((str(f), -1, -1))
        else:
            out.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return tuple(out)


def matching_lines(source: str | Path | None, pattern: re.Pattern[bytes]) -> list[bytes]:
    """The lines of every trace file at *source* that *pattern* (compiled with ``re.M``,
    anchored at a line's ends: ``^...$``) matches, file by file."""
    register(pattern)
    files = trace_files(source)
    if not files:
        return []
    found = _scan(_identity(files), tuple(_PATTERNS))
    return list(found[_PATTERNS.index(pattern)])


def _as(values: pl.Series, dtype: DType) -> pl.Series:
    """*values* (JSON scalars as text) as *dtype*; what is not one reads as null (an integer
    column also takes a whole number written as a float)."""
    if dtype == pl.Int64:
        as_int = values.cast(pl.Int64, strict=False)
        return as_int.fill_null(values.cast(pl.Float64, strict=False).cast(pl.Int64, strict=False))
    return values.cast(dtype, strict=False)


def fields_of(lines: list[bytes], schema: Mapping[str, tuple[str, DType]]) -> pl.DataFrame:
    """One row per line of *lines* (DFTracer JSON records), one column per entry of *schema*:
    ``name -> (JSONPath, dtype)``, e.g. ``"flags": ("$.args.flags", pl.Int64)``. A field a line
    lacks, or cannot give as its type, is null."""
    # invalid UTF-8 is kept with U+FFFD in place of the bad bytes, as the loader keeps it
    text = pl.Series("line", [ln.decode("utf-8", "replace") for ln in lines], dtype=pl.String)
    return pl.DataFrame(
        {
            name: _as(text.str.json_path_match(path), dtype).alias(name)
            for name, (path, dtype) in schema.items()
        },
        schema={name: dtype for name, (_path, dtype) in schema.items()},
    )
