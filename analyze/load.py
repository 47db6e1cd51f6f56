"""Load DFTracer traces (``*.pfw`` / ``*.pfw.gz``) into the dlreplay event table.

Per trace file (files run in parallel threads; zlib and polars release the GIL):

1. **Decompress** with :mod:`zlib`, one ``decompressobj`` per gzip member. Damage is
   salvaged, never fatal: a truncated file keeps everything decoded before the cut; a
   corrupt member keeps what decoded cleanly and decoding resumes at the next member
   header (``1f 8b 08``). The partial line at each damage point is dropped and counted.
2. **Tokenise** large text chunks with polars' CSV reader (separator ``,``, no quoting):
   one row per line, one column per ``"key":value`` token. With the fields needed here
   this costs about half of what polars' JSON reader does per DFTracer line.
3. **Layouts**: rows are grouped by (name token, category token, token count). DFTracer
   writes every event of one function with the same keys in the same order, so one
   sample row per group is parsed in Python into a *layout* (key path, prefix, quoting,
   closing braces of every token); the group's values are extracted with vectorised
   string expressions and checked (line start and end, argument keys, numbers parse).
4. **Fallback**: rows without a usable layout (nested values, commas or escapes inside
   strings, lines longer than the tokens read, small groups, garbage) are re-read from
   their line bytes with polars' JSON reader; a failing batch is bisected down to the
   malformed lines, which are dropped and counted. No Python code runs per line on the
   happy path.
5. **Per file**: time unit (``CM``), ppid and host (``start``/``HH``), sizes, and file
   offsets: read/write/fread/fwrite offsets are reconstructed per (pid, POSIX or STDIO,
   file hash) in time order with cumulative sums over segments (open/seek reset the
   position), never with a Python loop over events.

Across all files of the run: ``FH`` file hashes are resolved to paths (the record may
sit in another process's file; relative names use the writing process's working
directory), and the table is sorted by ``ts``.

Units: ``ts``/``dur`` microseconds (a ``CM`` time metric of ``NS``/``MS``/``S`` is
converted), sizes and offsets bytes.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

import numpy as np
import polars as pl

from dlreplay.errors import TraceError
from dlreplay.pfw import DecodeStats as _Stats
from dlreplay.pfw import decoded_pieces as _decoded_pieces
from dlreplay.schema import CAT_CHECKPOINT, CLOSE_OPS, EVENT_SCHEMA, OPEN_OPS, READ_OPS, WRITE_OPS

__all__ = ["FileReport", "LoadedTrace", "TraceDamageWarning", "load", "load_trace"]

TRACE_SUFFIXES = (".pfw", ".pfw.gz")
MANIFEST_NAME = "manifest.json"

#: Stored bytes fed to zlib per call (bounds the copy of ``unused_data``).
#: Decoded text per parse chunk (bytes). Large chunks amortise per-layout overhead.
_CHUNK_BYTES = 32 << 20
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

RAW_SCHEMA: dict[str, pl.DataType] = {"seq": _INT, **_TOP_FIELDS}
RAW_SCHEMA.update({col: dt for col, dt in _ARG_FIELDS.values()})

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


@dataclass(frozen=True)
class LoadedTrace:
    """A loaded trace: the event table (sorted by ``ts``), per-file reports, manifest."""

    events: pl.DataFrame
    files: list[FileReport]
    manifest: dict | None = None

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


# =======================================================================================
# Public entry points


def load_trace(path: str | os.PathLike | Sequence[str | os.PathLike], *,
               threads: int | None = None) -> LoadedTrace:
    """Load a trace directory (all ``*.pfw``/``*.pfw.gz`` below it), one file, or a list of files.

    ``threads`` bounds how many files are decompressed and parsed concurrently (default:
    the CPU count, at most 8). Raises :class:`~dlreplay.errors.TraceError` when the path
    does not exist or holds no trace file. Damage never raises: see :attr:`LoadedTrace.files`.
    """
    files, manifest = _find_inputs(path)
    workers = max(1, min(threads or min(os.cpu_count() or 1, 8), len(files)))
    jobs = list(enumerate(files))
    if workers == 1:
        results = [_load_file(j) for j in jobs]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dlreplay-load") as pool:
            results = list(pool.map(_load_file, jobs))
    events = _build_events(results, [p.name for p in files])
    reports = [_with_events(r.report, r.events.height) for r in results]
    return LoadedTrace(events=events, files=reports, manifest=manifest)


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


# =======================================================================================
# Inputs


def _find_inputs(path) -> tuple[list[Path], dict | None]:
    """Resolve ``path`` to trace files (sorted) and the manifest of a directory, if any."""
    if isinstance(path, (list, tuple)):
        if not path:
            raise TraceError("no trace files given: pass a trace directory or .pfw/.pfw.gz files")
        files = [Path(p) for p in path]
        for p in files:
            if not p.is_file():
                raise TraceError(f"trace file {p} does not exist: check the path")
        return files, None
    p = Path(path)
    if p.is_file():
        return [p], None
    if not p.exists():
        raise TraceError(f"trace path {p} does not exist: pass a directory written by "
                         "'dlreplay capture' or a .pfw/.pfw.gz file")
    if not p.is_dir():
        raise TraceError(f"trace path {p} is neither a file nor a directory")
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise TraceError(f"no trace files (*.pfw, *.pfw.gz) under {p}: was the job captured "
                         "with DFTracer, and did it run long enough to write its trace?")
    return files, _read_manifest(p / MANIFEST_NAME)


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
# One file: decompress with salvage, then parse chunks



@dataclass
class _FileResult:
    events: pl.DataFrame  # RAW_SCHEMA + src + per-file columns (see _per_file), event rows
    meta: pl.DataFrame  # RAW_SCHEMA + src, metadata rows (FH, HH, CM, ...)
    procs: pl.DataFrame  # src, pid, cwdhash: one row per process of the file
    report: FileReport


def _load_file(job: tuple[int, Path]) -> _FileResult:
    """Decompress and parse one trace file (``job`` = (file index, path))."""
    src, path = job
    stats = _Stats()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc}") from exc
    if not data:
        stats.problems.append("file is empty (0 bytes): the process wrote no trace")
    events: list[pl.DataFrame] = []
    meta: list[pl.DataFrame] = []
    seq0 = 0
    for text, damaged_after in _text_chunks(data, stats):
        body, tail = _split_tail(text)
        if tail:
            if damaged_after:
                stats.drop(1, len(tail))
                stats.problems.append(f"dropped a partial line of {len(tail)} bytes at a damage point")
            else:
                body = text  # last line without newline at a clean end of file: keep it
        if body:
            ev, me, nlines = _parse_chunk(body, seq0, stats)
            seq0 += nlines
            events.extend(ev)
            meta.extend(me)
    if data and not stats.lines and not stats.problems:
        stats.problems.append("file holds no trace lines")
    report = FileReport(
        path=str(path), bytes=len(data), members=stats.members, lines=stats.lines, events=0,
        dropped_lines=stats.dropped_lines, dropped_bytes=stats.dropped_bytes, problems=stats.problems,
    )
    meta_df = _concat(meta, src)
    ev_df, procs = _per_file(_concat(events, src), meta_df)
    procs = procs.select(pl.lit(src, dtype=pl.UInt32).alias("src"), "pid", "cwdhash")
    return _FileResult(ev_df, meta_df, procs, report)


def _concat(frames: list[pl.DataFrame], src: int | None = None) -> pl.DataFrame:
    """Concatenate raw frames; with ``src``, tag every part with the file index first, so
    that all columns share one chunk layout (column-wise operations then need no copy)."""
    empty = frames[0].clear() if frames else pl.DataFrame(schema=RAW_SCHEMA)
    frames = [f for f in frames if f.height]
    if src is not None:
        frames = [f.with_columns(pl.lit(src, dtype=pl.UInt32).alias("src")) for f in frames]
        empty = empty.with_columns(pl.lit(src, dtype=pl.UInt32).alias("src"))
    if not frames:
        return empty
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def _with_events(rep: FileReport, n: int) -> FileReport:
    return FileReport(rep.path, rep.bytes, rep.members, rep.lines, n, rep.dropped_lines,
                      rep.dropped_bytes, list(rep.problems))


def _split_tail(text: bytes) -> tuple[bytes, bytes]:
    """Split ``text`` after its last newline: (complete lines, trailing partial line)."""
    cut = text.rfind(b"\n") + 1
    return text[:cut], text[cut:]


def _text_chunks(data: bytes, stats: _Stats) -> Iterable[tuple[bytes, bool]]:
    """Yield (text, damaged_after) chunks of decoded text of about ``_CHUNK_BYTES``.

    Chunks end on a newline except the last one before a damage point (then
    ``damaged_after`` is True and its tail is a partial line) or at the end of input.
    """
    pending: list[bytes] = []
    size = 0
    for piece, damage in _decoded_pieces(data, stats):
        if piece:
            pending.append(piece)
            size += len(piece)
        if damage:
            if pending:
                yield b"".join(pending), True
            pending, size = [], 0
        elif size >= _CHUNK_BYTES:
            text = b"".join(pending)
            body, tail = _split_tail(text)
            if body:
                yield body, False
                pending, size = ([tail], len(tail)) if tail else ([], 0)
            else:
                pending, size = [text], len(text)
    if pending:
        yield b"".join(pending), False




# =======================================================================================
# Parsing one chunk of complete lines


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
        return pl.DataFrame({"c0": ["?" if ln.strip() else None for ln in lines]}).with_columns(
            [pl.lit(None, dtype=pl.String).alias(c) for c in list(_TOKEN_SCHEMA)[1:]]), True


def _parse_chunk(text: bytes, seq0: int, stats: _Stats) -> tuple[list[pl.DataFrame], list[pl.DataFrame], int]:
    """Parse complete lines: (event frames, metadata frames, lines incl. blank ones)."""
    tok, lossy = _tokenize(text)
    nlines = tok.height
    tok = tok.with_columns(
        pl.int_range(seq0, seq0 + nlines, dtype=pl.Int64).alias("seq"),
        pl.sum_horizontal([pl.col(c).is_not_null() for c in _TOKEN_SCHEMA]).cast(pl.Int32).alias("ntok"),
    )
    queries: list[pl.LazyFrame] = []
    kinds: list[bool] = []
    fallback: list[pl.DataFrame] = []
    for part in tok.partition_by("c1", "c2", "ntok", maintain_order=False):
        if part["ntok"][0] == 0:  # blank lines
            continue
        if part["ntok"][0] == 1:  # the bare "[" / "]" lines of the DFTracer 1.x array form
            part = part.filter(~pl.col("c0").str.strip_chars().is_in(["[", "]"]))
            if not part.height:
                continue
        stats.lines += part.height
        sample = part.row(0, named=True)
        layout = _parse_layout(sample) if part.height >= _MIN_GROUP else None
        if layout is None:
            fallback.append(part)
            continue
        ok, exprs, is_meta = _layout_exprs(layout, sample)
        queries.append(part.lazy().select(*exprs, ok.alias("__ok")))
        kinds.append(is_meta)
    events: list[pl.DataFrame] = []
    meta: list[pl.DataFrame] = []
    bad: list[pl.Series] = []
    for df, is_meta in zip(pl.collect_all(queries) if queries else [], kinds, strict=True):
        good = df["__ok"]
        if not good.all():
            bad.append(df.filter(~good)["seq"])
            df = df.filter(good)
        (meta if is_meta else events).append(_conform(df.drop("__ok")))
    if bad:
        fallback.append(tok.filter(pl.col("seq").is_in(pl.concat(bad).implode())))
    if fallback:
        rows = pl.concat(fallback)
        if rows.height:
            df = _parse_fallback(text, rows, seq0, stats, exact=lossy)
            meta_rows = pl.col("ph").is_in(_META_PH).fill_null(False)
            events.append(df.filter(~meta_rows))
            meta.append(df.filter(meta_rows))
    return events, meta, nlines


def _conform(df: pl.DataFrame) -> pl.DataFrame:
    """Add missing raw columns as nulls and order them like RAW_SCHEMA."""
    return df.select(
        [pl.col(c).cast(dt) if c in df.columns else pl.lit(None, dtype=dt).alias(c)
         for c, dt in RAW_SCHEMA.items()]
    )


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


def _layout_exprs(layout: list[_Tok], sample: dict) -> tuple[pl.Expr, list[pl.Expr], bool]:
    """(row check, extraction expressions, is-metadata) for the rows of one layout group.

    Checked per row: the first token's prefix, the last token's closing braces, the key
    of every extracted argument, and that every extracted number parses. The name and
    category tokens are partition keys (identical in the group); ``ph`` is taken from the
    sample. Top-level keys are fixed by DFTracer's writer and not re-checked.
    """
    values = {t.path: _token_value(sample[f"c{t.slot}"], t) for t in layout}
    ph = values.get(("ph",))
    cat = values.get(("cat",))
    is_meta = ph in _META_PH
    want_hhash = is_meta or cat == "dftracer"
    checks: list[pl.Expr] = [pl.col("c0").str.starts_with(layout[0].prefix)]
    last = layout[-1]
    checks.append(pl.col(f"c{last.slot}").str.ends_with(('"' if last.quoted else "") + last.suffix))
    exprs: list[pl.Expr] = [pl.col("seq")]
    for t in layout:
        target = _field_of(t.path)
        if target is None or (target[0] == "hhash" and not want_hhash):
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
            val = v.cast(pl.Int64, strict=False)
            checks.append(val.is_not_null())
            exprs.append(val.alias(col))
        else:
            if col in _TEXT_ARGS:
                checks.append(~v.str.contains("\\", literal=True))
            exprs.append(v.alias(col) if t.quoted else pl.when(v != "null").then(v).alias(col))
    return pl.all_horizontal(checks).fill_null(False), exprs, is_meta


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


def _fallback_lines(text: bytes, rows: pl.DataFrame, seq0: int, exact: bool) -> tuple[list[bytes], list[int]]:
    """Exact line bytes of the given token rows, sorted by line.

    A line whose tokens were all read is re-joined from them; a longer line (or one with
    an empty token) is cut out of ``text`` by its line number.
    """
    cols = list(_TOKEN_SCHEMA)
    last = pl.max_horizontal([pl.when(pl.col(c).is_not_null()).then(i) for i, c in enumerate(cols)])
    rows = rows.sort("seq").with_columns(
        ((pl.col("ntok") < _NTOK) & (last == pl.col("ntok") - 1) & (not exact)).alias("__whole"),
        pl.concat_str(cols, separator=",", ignore_nulls=True).alias("__line"),
    )
    lines = [ln.encode() for ln in rows["__line"].to_list()]
    cut = rows.with_row_index("__i").filter(~pl.col("__whole"))
    if cut.height:
        found = _lines_at(text, (cut["seq"] - seq0).to_list())
        for i, ln in zip(cut["__i"].to_list(), found, strict=True):
            lines[i] = ln
    return lines, rows["seq"].to_list()


def _lines_at(text: bytes, rows: list[int]) -> list[bytes]:
    """Lines number ``rows`` (0-based) of ``text``, without newline.

    Lines near either end (a trace's ``start`` and ``end`` records) are reached by
    stepping over a few newlines; otherwise one vectorised newline index is built.
    """
    total = text.count(b"\n") + 1
    out = []
    for r in rows:
        if r < 256:
            start = 0
            for _ in range(r):
                start = text.index(b"\n", start) + 1
        elif total - 1 - r < 256:
            start = len(text)
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


def _parse_fallback(text: bytes, rows: pl.DataFrame, seq0: int, stats: _Stats, *,
                    exact: bool = False) -> pl.DataFrame:
    """Parse the given token rows' lines with the JSON reader, dropping malformed ones.

    ``exact`` takes every line from ``text`` rather than re-joining its tokens.
    """
    lines, seqs = _fallback_lines(text, rows, seq0, exact)
    # DFTracer 1.x lines may end with "," (elements of one JSON array)
    lines = [ln.rstrip().rstrip(b",") for ln in lines]
    frames: list[pl.DataFrame] = []
    for i in range(0, len(lines), _JSON_BATCH):
        frames.extend(_json_bisect(lines[i:i + _JSON_BATCH], seqs[i:i + _JSON_BATCH], stats))
    return _concat(frames)


def _json_bisect(lines: list[bytes], seqs: list[int], stats: _Stats) -> list[pl.DataFrame]:
    """Parse lines as NDJSON; on failure split in halves until the bad lines are isolated."""
    if not lines:
        return []
    try:
        df = pl.read_ndjson(b"\n".join(lines), schema=_JSON_SCHEMA)
    except Exception:  # noqa: BLE001 - polars raises several exception types for bad JSON
        df = None
    if df is not None and df.height == len(lines):
        return [_json_to_raw(df, seqs)]
    if len(lines) == 1:
        if lines[0].strip():
            if not stats.dropped_lines or not any("malformed" in p for p in stats.problems):
                stats.problems.append("dropped malformed JSON line(s)")
            stats.drop(1, len(lines[0]) + 1)
        return []
    mid = len(lines) // 2
    return _json_bisect(lines[:mid], seqs[:mid], stats) + _json_bisect(lines[mid:], seqs[mid:], stats)


def _json_to_raw(df: pl.DataFrame, seqs: list[int]) -> pl.DataFrame:
    """Cast the all-text JSON frame to RAW_SCHEMA."""
    exprs: list[pl.Expr] = [pl.lit(pl.Series("seq", seqs, dtype=pl.Int64))]
    exprs += [_cast_loose(pl.col(k), dt).alias(k) for k, dt in _TOP_FIELDS.items()]
    exprs += [_cast_loose(pl.col("args").struct.field(k), dt).alias(col)
              for k, (col, dt) in _ARG_FIELDS.items()]
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
# Resolution across files and the final event table


# =======================================================================================
# Per-file stage (runs in the file's thread): time unit, process info, sizes, offsets


def _per_file(ev: pl.DataFrame, meta: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Add what one trace file determines on its own; also return its process table.

    ``ppid_``/``host`` (the process's ``start``/``HH`` records are in its own file),
    ``__op`` (operation class), ``size``/``size_requested`` and ``offset`` (a file
    position is per process). ts/dur are converted to µs first.
    """
    if ev.height == 0:
        empty = pl.DataFrame(schema={"pid": pl.Int64, "ppid": pl.Int64, "cwdhash": pl.String, "host": pl.String})
        return ev.with_columns(
            pl.lit(None, dtype=pl.Int64).alias("ppid_"), pl.lit(None, dtype=pl.String).alias("host"),
            pl.lit(0, dtype=pl.Int8).alias("__op"), pl.lit(None, dtype=pl.Int64).alias("size"),
            pl.lit(None, dtype=pl.Int64).alias("size_requested"), pl.lit(None, dtype=pl.Int64).alias("offset"),
        ), empty
    ev = _apply_time_metric(ev, meta)
    procs = _process_table(ev, meta)
    pidx = _lookup(pl.col("pid"), procs["pid"], range(procs.height), pl.UInt32)
    ev = ev.with_columns(
        pidx.alias("__p"),
        pl.col("name").replace_strict(_OP_CODE, default=0, return_dtype=pl.Int8).alias("__op"),
    ).with_columns(
        pl.lit(procs["ppid"]).gather(pl.col("__p")).alias("ppid_"),
        pl.lit(procs["host"]).gather(pl.col("__p")).alias("host"),
    )
    return _offsets(_sizes(ev)), procs


def _lookup(key: pl.Expr, keys, values, dtype) -> pl.Expr:
    """``key`` mapped through (keys -> values), null when absent."""
    keys = keys.to_list() if isinstance(keys, pl.Series) else list(keys)
    values = values.to_list() if isinstance(values, pl.Series) else list(values)
    if not keys:
        return pl.lit(None, dtype=dtype)
    return key.replace_strict(keys, values, default=None, return_dtype=dtype)


def _hash_map(meta: pl.DataFrame, kind: str) -> pl.DataFrame:
    """(hash, name, src, pid) of ``FH`` or ``HH`` records, one per hash (first seen)."""
    return (
        meta.filter((pl.col("name") == kind) & pl.col("a_value").is_not_null())
        .select(pl.col("a_value").alias("hash"), pl.col("a_name").alias("name"), "src", "pid")
        .unique(subset="hash", keep="first", maintain_order=True)
    )


def _process_table(ev: pl.DataFrame, meta: pl.DataFrame) -> pl.DataFrame:
    """Per pid of one file: ppid, host (HH-resolved host hash), cwd hash (``start`` record)."""
    starts = (
        ev.filter(pl.col("name") == "start")
        .filter(pl.col("cat") == "dftracer")
        .group_by("pid")
        .agg(pl.col("ppid").drop_nulls().first(), pl.col("cwd").drop_nulls().first().alias("cwdhash"),
             pl.col("hhash").drop_nulls().first().alias("h1"))
    )
    cols = ["pid", "hhash"]
    hosts = (
        pl.concat([meta.select(cols), ev.filter(pl.col("hhash").is_not_null()).select(cols)])
        .filter(pl.col("hhash").is_not_null())
        .group_by("pid")
        .agg(pl.col("hhash").first().alias("h2"))
    )
    hh = _hash_map(meta, "HH")
    every = ev.select(pl.col("pid").unique())
    table = every.join(starts, on="pid", how="left").join(hosts, on="pid", how="left")
    hhash = pl.coalesce("h1", "h2")
    return table.select(
        "pid", "ppid", "cwdhash",
        pl.coalesce(_lookup(hhash, hh["hash"], hh["name"], pl.String), hhash).alias("host"),
    )


def _apply_time_metric(ev: pl.DataFrame, meta: pl.DataFrame) -> pl.DataFrame:
    """Convert ts/dur to µs when the file's ``CM`` time_metric is not ``US``."""
    cm = meta.filter((pl.col("name") == "CM") & (pl.col("a_name") == "time_metric"))
    if cm.height == 0:
        return ev
    factor = _TIME_SCALE.get((cm["a_value"][0] or "US").upper(), 1.0)
    if factor == 1.0:
        return ev
    return ev.with_columns(
        (pl.col("ts") * factor).round().cast(pl.Int64),
        (pl.col("dur") * factor).round().cast(pl.Int64),
    )


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
_O_APPEND = 0o2000
_SEEK_SET, _SEEK_CUR = 0, 1


def _sizes(ev: pl.DataFrame) -> pl.DataFrame:
    """``size`` (bytes transferred) and ``size_requested`` (bytes asked) for I/O and checkpoints.

    fread/fwrite return items, so bytes = items x item size (their ``size`` argument).
    """
    op = pl.col("__op")
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
    op, ret = pl.col("__op"), pl.col("ret")
    ok = ret.is_null() | (ret >= 0)
    appending = ((pl.col("flags").fill_null(0) & _O_APPEND) != 0) | pl.col("mode").str.starts_with("a").fill_null(False)
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


def _order_key(ev: pl.DataFrame, extra: list[str]) -> tuple[list[pl.Expr], list[str]]:
    """Sort expressions for (ts, *extra ints, seq): one packed Int64 when the bits fit."""
    tmin, tmax = _int_stat(ev["ts"].min()), _int_stat(ev["ts"].max())
    if tmin is None or tmax is None:
        return [pl.col("seq")], ["seq"]
    bits = [max(_int_stat(ev[c].max()) or 0, 1).bit_length() for c in extra]
    b_seq = max(_int_stat(ev["seq"].max()) or 0, 1).bit_length()
    if (tmax - tmin + 1).bit_length() + sum(bits) + b_seq <= 62:
        key = (pl.col("ts").fill_null(tmax + 1) - tmin).cast(pl.Int64)
        for c, b in zip(extra, bits, strict=True):
            key = key * (1 << b) + pl.col(c).cast(pl.Int64)
        return [(key * (1 << b_seq) + pl.col("seq")).alias("__key")], ["__key"]
    return [pl.col("ts").fill_null(tmax + 1).alias("__ts"), *map(pl.col, extra), pl.col("seq")], \
        ["__ts", *extra, "seq"]


def _int_stat(value: object) -> int | None:
    """An integer Series statistic (``min``/``max``) as int; None when empty or all null."""
    return None if value is None else int(cast(int, value))


def _offsets(ev: pl.DataFrame) -> pl.DataFrame:
    """Add ``offset``: given for pread/pwrite, reconstructed for stream reads and writes.

    Rows of one (pid, POSIX or STDIO, file hash) of one trace file in (ts, line) order
    form a stream; a reset or the stream start begins a segment; within a segment the
    offset of a transfer is the segment's base plus the bytes advanced before it
    (exclusive running sum). A segment with an unknown base yields null offsets.
    """
    reset, base, advance = _position_rules()
    io = pl.col("fhash").is_not_null() & pl.col("cat").is_in(("POSIX", "STDIO"))
    narrow = ev.lazy().with_row_index("__row").filter(io).select(
        "__row", "ts", "seq", pl.struct("pid", pl.col("cat") == "STDIO", "fhash").hash().alias("__g"),
        reset.alias("__reset"), base.alias("__base"), advance.alias("__adv"),
        pl.col("__op").is_in((_XFER, _SXFER)).alias("__stream"),
    ).collect()
    offset = pl.Series("offset", [], dtype=pl.Int64).extend_constant(None, ev.height)
    if narrow.height:
        keys, by = _order_key(narrow.select("ts", "seq"), [])
        # streams (64-bit hash of their key), each in time order: a time sort, then a
        # stable sort by stream (two one-key sorts beat one multi-key sort)
        narrow = narrow.with_columns(keys).sort(by).sort("__g", maintain_order=True)
        recon = (
            narrow.lazy()
            .with_columns(
                (pl.col("__reset") | (pl.col("__g") != pl.col("__g").shift(1)).fill_null(True)).alias("__break"),
                (pl.col("__adv").cum_sum() - pl.col("__adv")).alias("__cs"),
            )
            .with_columns(
                pl.when("__break").then("__cs").forward_fill().alias("__cs0"),
                # -1 marks an unknown base so forward_fill never carries a base across a break
                pl.when("__break").then(pl.when("__reset").then("__base").fill_null(-1)).forward_fill().alias("__b"),
            )
            .filter(pl.col("__stream"))
            .select("__row", pl.when(pl.col("__b") >= 0).then(pl.col("__b") + pl.col("__cs") - pl.col("__cs0")).alias("o"))
            .collect()
        )
        if recon.height:
            offset = offset.scatter(recon["__row"], recon["o"])
    positional = pl.when(pl.col("__op") == _PXFER).then(pl.col("aoffset"))
    return ev.with_columns(offset).with_columns(pl.coalesce(positional, pl.col("offset")).alias("offset"))


# =======================================================================================
# Global stage: file paths across all files of the run, time order, final table


def _build_events(results: list[_FileResult], names: list[str]) -> pl.DataFrame:
    """Resolve file hashes over all files of the run and build the EVENT_SCHEMA table (by ts)."""
    ev = _concat([r.events for r in results if r.events.height])
    if ev.height == 0:
        return pl.DataFrame(schema=EVENT_SCHEMA)
    meta = _concat([r.meta for r in results])
    fh = _hash_map(meta, "FH")
    # working directory of every process (its start record's cwd hash, resolved by FH)
    procs = pl.concat([r.procs for r in results]).with_columns(
        _lookup(pl.col("cwdhash"), fh["hash"], fh["name"], pl.String).alias("__cwd"))
    fh = fh.join(procs.select("src", "pid", "__cwd"), on=["src", "pid"], how="left").select(
        "hash", _absolute(pl.col("name")).alias("path"))
    files = ev.select(pl.col("fhash").drop_nulls().unique().alias("hash")).join(fh, on="hash", how="left")
    fidx = _lookup(pl.col("fhash"), files["hash"], range(files.height), pl.UInt32)
    ev = ev.with_columns(pl.lit(files["path"]).gather(fidx).alias("file"))
    # rows without an FH-resolved file but a path argument (checkpoint events, 1.x fname)
    named = pl.col("file").is_null() & (pl.col("path").is_not_null() | pl.col("fname").is_not_null())
    rows = ev.select(pl.arg_where(named)).to_series()
    if rows.len():
        sub = ev[rows].join(procs.select("src", "pid", "__cwd"), on=["src", "pid"], how="left")
        paths = sub.select(pl.coalesce(_absolute(pl.col("path")), _absolute(pl.col("fname")))).to_series()
        ev = ev.with_columns(ev["file"].scatter(rows, paths))
    keys, _ = _order_key(ev.select("ts", "src", "seq"), ["src"])
    order = ev.select(pl.arg_sort_by(keys) if len(keys) > 1 else keys[0].arg_sort()).to_series()
    out = ev.select(
        "pid", "tid", pl.col("ppid_").alias("ppid"), "host", "ts", "dur", "cat", "name", "file",
        "fhash", "size_requested", "size", "offset", "ret", "epoch", "step", "batch_size",
        pl.col("image_idx").alias("sample_index"), "src",
    )[order]
    out = out.with_columns(pl.lit(pl.Series(names, dtype=pl.String)).gather(pl.col("src")).alias("source"))
    return out.drop("src").cast(pl.Schema(EVENT_SCHEMA))


def _absolute(path: pl.Expr) -> pl.Expr:
    """A path made absolute with the process working directory (``__cwd``) when relative."""
    return (
        pl.when(path.str.starts_with("/") | pl.col("__cwd").is_null())
        .then(path)
        .otherwise(pl.concat_str([pl.col("__cwd").str.strip_suffix("/"), path], separator="/"))
    )
