"""pyparse"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import polars as pl

from dlreplay.pfw import DecodeStats as _Stats

from .decompress import Piece, joined
from .shapes import (
    ARG_FIELDS,
    INT,
    LOOSE_INT_ARGS,
    META_PH,
    OP_CODE,
    RAW_SCHEMA,
    SRC,
    TOP_FIELDS,
    concat_raw,
)

__all__ = ['Batch']

#: Token columns read per line; the last one must be empty for a line to be complete.
_NTOK = 15


#: Lines per JSON batch on the fallback path.
_JSON_BATCH = 4096


#: Layout groups smaller than this go to the JSON path (cheaper than a layout query).
_MIN_GROUP = 24


_TOKEN_SCHEMA = {f"c{i}": pl.String() for i in range(_NTOK)}


#: String args that may hold arbitrary text (checked for JSON escapes).
_TEXT_ARGS = {"a_name", "path", "fname", "mode"}


_SCALAR_RE = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null")


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


#: Segments at least this long are tokenised on their own when added (their line count
#: comes from the tokenizer); shorter ones are counted and tokenised together at flush.
_ALONE_BYTES = 1 << 20


class Batch:
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

    def add_pieces(self, src: int, seq0: int, text: list[Piece], stats: _Stats) -> int:
        """:meth:`add` of the text of pieces ``text``."""
        return self.add(src, seq0, joined(text), stats)

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


def _located(tok: pl.DataFrame, idx: list[int], src: list[int], seq0: list[int],
             nlines: list[int]) -> pl.DataFrame:
    """Tokens of consecutive segments (``nlines`` rows each) with their ``src``, ``seq``
    (line number in the file) and ``__seg`` (segment index in the batch)."""
    if len(idx) == 1:
        return tok.with_columns(
            pl.lit(src[0], dtype=SRC).alias("src"),
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
            meta_rows = pl.col("ph").is_in(META_PH).fill_null(False)
            events.append(df.filter(~meta_rows))
            meta.append(df.filter(meta_rows))
    return events, meta


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
    if len(path) == 1 and path[0] in TOP_FIELDS:
        return path[0], TOP_FIELDS[path[0]], False
    if len(path) == 2 and path[0] == "args" and path[1] in ARG_FIELDS:
        col, dt = ARG_FIELDS[path[1]]
        return col, dt, path[1] in LOOSE_INT_ARGS
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
    is_meta = ph in META_PH
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
        if dt == INT:
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
        op = pl.lit(OP_CODE.get(values[("name",)], 0), dtype=pl.Int8)
    elif name_tok is not None:  # (rare) recomputed from the name's value expression
        name_expr = next(e for e in exprs if e.meta.output_name() == "name")
        op = name_expr.replace_strict(OP_CODE, default=0, return_dtype=pl.Int8)
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
    if dt == INT:
        try:
            return int(raw)
        except ValueError:
            return None
    return raw


_JSON_SCHEMA = {
    **{k: pl.String() for k in TOP_FIELDS},
    "args": pl.Struct({k: pl.String() for k in ARG_FIELDS}),
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
    return concat_raw(frames)


def _drop_malformed(st: _Stats, lines: int, nbytes: int) -> None:
    if not st.dropped_lines or not any("malformed" in p for p in st.problems):
        st.problems.append("dropped malformed JSON line(s)")
    st.drop(lines, nbytes)


#: A parsed line is an event only with an integer ts and pid and a name (metadata records
#: need none of them); anything else ({}, "pid": true, a ts beyond Int64) is malformed.
def _is_record() -> pl.Expr:
    return pl.col("ph").is_in(META_PH).fill_null(False) | (
        _cast_loose(pl.col("ts"), INT).is_not_null() & _cast_loose(pl.col("pid"), INT).is_not_null()
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
    exprs: list[pl.Expr] = [pl.lit(pl.Series("src", srcs, dtype=SRC)),
                            pl.lit(pl.Series("seq", seqs, dtype=pl.Int64))]
    exprs += [_cast_loose(pl.col(k), dt).alias(k) for k, dt in TOP_FIELDS.items()]
    exprs += [_cast_loose(pl.col("args").struct.field(k), dt).alias(col)
              for k, (col, dt) in ARG_FIELDS.items()]
    exprs.append(pl.col("name").replace_strict(OP_CODE, default=0, return_dtype=pl.Int8).alias("op"))
    return df.select(exprs)


def _cast_loose(e: pl.Expr, dt: pl.DataType) -> pl.Expr:
    """Cast a JSON value read as text: ints may be written as strings or floats."""
    if dt == INT:
        text = e.str.strip_chars()
        return text.cast(pl.Int64, strict=False).fill_null(
            text.cast(pl.Float64, strict=False).cast(pl.Int64, strict=False)
        )
    return e
