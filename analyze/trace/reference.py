"""The reference parser: DFTracer lines read one at a time with :func:`json.loads`.

It parses everything where the C scanner (:mod:`.scan`) is not built or is switched off
(``DLREPLAY_PARSER=python``), and, where it is, the lines the scanner does not accept
and every batch of text that is not valid UTF-8. ``tests/test_native_parser.py`` loads
traces both ways and requires the same tables and reports: this module is the oracle
the scanner is held to.

One line at a time:

* a line whose first byte cannot start a record (none of ``{ [ ] space tab CR``) or that
  holds a NUL byte is garbage: counted, dropped;
* an empty line (a lone CR included) and the bare ``[`` / ``]`` lines of DFTracer 1.x's
  array form are not lines;
* any other line is counted and read as JSON after its trailing blanks and commas (1.x
  array elements end with ``,``). Bytes that are not UTF-8 are replaced (U+FFFD). A line
  that is no JSON object, whose ``args`` is neither an object nor null, or that is not a
  record (a metadata record, ``ph`` ``4``/``M``, or an integer ``ts`` and ``pid`` and a
  ``name``) is dropped and counted; so is one that JSON rejects (NaN, a number beyond a
  float, a control character in a string).

The kept values (:data:`~.shapes.TOP_FIELDS`, :data:`~.shapes.ARG_FIELDS`) are read as
text, as polars' JSON reader reads them into a String column (the loader's first JSON
path; the scanner keeps its results): the last of duplicated keys (as Python's json, jq
and JavaScript read them; each record holding a kept key twice counted in its file's
report, :data:`~.shapes.DUP_KEY`), numbers as written
in plain decimal notation, ``true``/``false``, nested values as JSON text. Integer fields
are then cast from that text, strings holding integers or floats included
(:func:`cast_loose`).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import numpy as np
import polars as pl

from dlreplay.pfw import DecodeStats as _Stats

from .decompress import Piece, joined
from .shapes import (
    AGGREGATED_PH,
    ARG_FIELDS,
    DUP_KEY,
    INT,
    MAX_CALLS,
    META_PH,
    OP_CODE,
    SRC,
    SUMMED_ARGS,
    TOP_FIELDS,
    concat_raw,
    count_problem,
)

__all__ = ["Batch", "cast_loose", "drop_malformed"]

#: First bytes of a line that may be a trace record: ``{`` (an event or metadata record),
#: ``[`` / ``]`` (DFTracer 1.x's array brackets), or blanks before one of them.
_RECORD_FIRST = frozenset(b"{[] \t\r")
#: Raw column of each kept key: top-level keys by name, ``args`` keys by their column.
_ARG_COLUMNS = {key: col for key, (col, _) in ARG_FIELDS.items()}
_TEXT_COLUMNS = [*TOP_FIELDS, *_ARG_COLUMNS.values()]
#: Text columns of an aggregated record: its calls, and the columns read from sums.
_CALLS, _SUMS = "__calls", "__sums"
#: A record's flag: it held a kept key twice (those the scanner hands to this module).
_TWICE = "__twice"
_KEPT_TOP = frozenset([*TOP_FIELDS, "args"])
_KEPT_ARGS = frozenset(ARG_FIELDS)


class Batch:
    """Complete lines of one or more files; :meth:`flush` parses them, line by line."""

    def __init__(self) -> None:
        self.texts: list[tuple[int, int, bytes, _Stats]] = []
        self.nbytes = 0
        self.events: list[pl.DataFrame] = []
        self.meta: list[pl.DataFrame] = []

    def add(self, src: int, seq0: int, text: bytes, stats: _Stats) -> int:
        """Add ``text`` (complete lines of file ``src`` from line ``seq0``); returns its lines."""
        self.texts.append((src, seq0, text, stats))
        self.nbytes += len(text)
        return text.count(b"\n") + (0 if text.endswith(b"\n") else 1)

    def add_pieces(self, src: int, seq0: int, text: list[Piece], stats: _Stats) -> int:
        """:meth:`add` of the text of pieces ``text``."""
        return self.add(src, seq0, joined(text), stats)

    def flush(self) -> None:
        """Parse the lines added since the last flush into :attr:`events` and :attr:`meta`."""
        texts, self.texts, self.nbytes = self.texts, [], 0
        keys: list[tuple[int, int]] = []
        values: list[dict[str, str | None]] = []
        for src, seq0, text, stats in texts:
            lines = text.split(b"\n")
            if text.endswith(b"\n"):
                lines.pop()
            last = len(lines) - 1 if not text.endswith(b"\n") else -1
            for i, line in enumerate(lines):
                record = _read_line(line, stats, newline=i != last)
                if record is not None:
                    keys.append((src, seq0 + i))
                    values.append(record)
        if not keys:
            return
        stats_of = {src: stats for src, _, _, stats in texts}
        raw = _to_raw(keys, values, stats_of)
        if raw is None:
            return
        meta = pl.col("ph").is_in(META_PH).fill_null(False)
        self.events.append(raw.filter(~meta))
        self.meta.append(raw.filter(meta))


def drop_malformed(st: _Stats, lines: int, nbytes: int) -> None:
    """Count ``lines`` dropped lines of ``nbytes`` bytes in ``st`` (the problem named once)."""
    if not st.dropped_lines or not any("malformed" in p for p in st.problems):
        st.problems.append("dropped malformed JSON line(s)")
    st.drop(lines, nbytes)


def _read_line(line: bytes, stats: _Stats, newline: bool = True) -> dict[str, Any] | None:
    """The kept values of one line as text (plus ``__size``, its bytes and a newline), or
    None: not a line, or dropped (and counted; garbage costs its newline only where it has one)."""
    if line and (line[0] not in _RECORD_FIRST or 0 in line):
        stats.lines += 1
        drop_malformed(stats, 1, len(line) + newline)
        return None
    body = line[:-1] if line.endswith(b"\r") else line
    fields = body.split(b",")
    if not any(fields) or (sum(1 for f in fields if f) == 1 and fields[0].strip() in (b"[", b"]")):
        return None  # a blank line, or a bracket of the 1.x array form
    stats.lines += 1
    text = line.rstrip().rstrip(b",")
    if not text:
        return None
    record = _json_record(text.decode("utf-8", errors="replace"))
    if record is None:
        drop_malformed(stats, 1, len(line) + 1)
        return None
    record["__size"] = len(line) + 1
    if record.pop(_TWICE):
        count_problem(stats.problems, 1, DUP_KEY)
    return record


def _json_record(text: str) -> dict[str, Any] | None:
    """The kept keys of a JSON object line as text (None: not a JSON object, or ``args`` no object)."""
    try:
        obj = json.loads(
            text, object_pairs_hook=_Object, parse_constant=_refuse, parse_float=_finite
        )
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, _Object):
        return None
    args = obj.get("args")
    if args is not None and not isinstance(args, dict):
        return None
    twice = bool(obj.twice & _KEPT_TOP) or (
        isinstance(args, _Object) and bool(args.twice & _KEPT_ARGS)
    )
    out: dict[str, Any] = {key: _text(obj.get(key)) for key in TOP_FIELDS}
    for key, col in _ARG_COLUMNS.items():
        out[col] = _text(args.get(key)) if args else None
    out[_CALLS] = out[_SUMS] = None
    if args and "dft_cnt" in args and out["ph"] in AGGREGATED_PH:
        _aggregated(out, args)
    if any(isinstance(v, str) and not _encodable(v) for v in out.values()):
        return None  # a lone surrogate escape: no text
    out[_TWICE] = twice
    return out


def _aggregated(out: dict[str, Any], args: dict[str, Any]) -> None:
    """Read an aggregated record's ``args`` into ``out`` (see :data:`AGGREGATED_PH`): its calls
    (``dft_cnt``), and each summed field's total (``<key>_sum``) where no plain value is given,
    the fields so read listed in ``out[_SUMS]``; a fread/fwrite item size that varied
    (``size_sum``) is read as its mean. Minima and maxima are not kept."""
    out[_CALLS] = _text(args["dft_cnt"])
    summed = []
    for key, col in (("dur", "dur"), *((k, _ARG_COLUMNS[k]) for k in SUMMED_ARGS)):
        if key not in args and f"{key}_sum" in args:
            out[col] = _text(args[f"{key}_sum"])
            summed.append(col)
        elif key == "dur":
            out[col] = _text(args.get(key))
    if "size" not in args and "size_sum" in args:
        out["isize"] = _text(args["size_sum"])
        summed.append("isize")
    out[_SUMS] = "|" + "|".join(summed) + "|"


class _Object(dict):
    """A JSON object as :func:`json.loads` makes it (the last of duplicated keys wins), with
    the keys it held more than once (:attr:`twice`)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.twice: set[str] = (
            {k for k, _ in pairs if sum(1 for j, _ in pairs if j == k) > 1}
            if len(self) < len(pairs)
            else set()
        )


def _refuse(name: str) -> None:
    raise ValueError(f"{name} is no JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is beyond a float")
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(value: Any) -> str | None:
    """``value`` as text: strings as they are, nested values as JSON, numbers in plain decimals."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        plain = format(Decimal(repr(value)), "f")  # the shortest digits that read back, no exponent
        return plain.rstrip("0").rstrip(".") if "." in plain else plain
    if isinstance(value, list):
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    return (
        "{"
        + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_nested(v)}" for k, v in value.items())
        + "}"
    )


def _nested(value: Any) -> str:
    return (
        json.dumps(value, ensure_ascii=False)
        if value is None or isinstance(value, str)
        else str(_text(value))
    )


def _to_raw(
    keys: list[tuple[int, int]], values: list[dict[str, Any]], stats_of: dict[int, _Stats]
) -> pl.DataFrame | None:
    """The raw frame (:data:`~.shapes.RAW_SCHEMA`) of the records; those that are no
    record (see the module) dropped and counted. None when none is left."""
    cols = [*_TEXT_COLUMNS, _CALLS, _SUMS]
    texts = pl.DataFrame(
        {c: [v[c] for v in values] for c in cols}, schema=dict.fromkeys(cols, pl.String())
    )
    calls = cast_loose(pl.col(_CALLS), INT)
    ok = (
        texts.select(
            pl.col("ph").is_in(META_PH).fill_null(False)
            | (
                cast_loose(pl.col("ts"), INT).is_not_null()
                & cast_loose(pl.col("pid"), INT).is_not_null()
                & pl.col("name").is_not_null()
                & (pl.col(_CALLS).is_null() | calls.is_between(1, MAX_CALLS)).fill_null(False)
            )
        )
        .to_series()
        .to_numpy()
    )
    for j in np.flatnonzero(~ok).tolist():
        drop_malformed(stats_of[keys[j][0]], 1, values[j]["__size"])
    if not ok.any():
        return None
    kept = [keys[j] for j in np.flatnonzero(ok).tolist()]
    srcs, seqs = zip(*kept, strict=True)
    raw = texts.filter(pl.Series(ok)).select(
        pl.lit(pl.Series("src", srcs, dtype=SRC)),
        pl.lit(pl.Series("seq", seqs, dtype=pl.Int64)),
        *(cast_loose(pl.col(k), dt).alias(k) for k, dt in TOP_FIELDS.items()),
        *(cast_loose(pl.col(col), dt).alias(col) for col, dt in ARG_FIELDS.values()),
        pl.col("name").replace_strict(OP_CODE, default=0, return_dtype=pl.Int8).alias("op"),
        calls.alias(_CALLS),
        _SUMS,
    )
    if raw[_CALLS].is_not_null().any():
        raw = _unfold(raw)
    return concat_raw([raw.drop(_CALLS, _SUMS)])


def _unfold(raw: pl.DataFrame) -> pl.DataFrame:
    """``raw`` with each aggregated record (``__calls`` not null) as that many rows of one
    call each, so that every total counts its calls, bytes and time: a field read from its
    sum (``__sums``) split over the calls (as even as integers are: the totals stay exact),
    a fread/fwrite item size read from its sum taken as the mean, a plain value (one every
    call had) repeated. The calls lie one after another from the record's ``ts`` (the start
    of its interval) over its summed duration, at least one time unit apart (a record
    carries no call's own time: these are placed, not measured)."""
    n = pl.col(_CALLS).fill_null(1)
    i = pl.col("__i")

    def summed(col: str) -> pl.Expr:
        return pl.col(_SUMS).str.contains(f"|{col}|", literal=True).fill_null(False)

    whole = pl.max_horizontal(pl.col("dur").fill_null(0), n).cast(pl.Float64)
    out = raw.with_columns(pl.int_ranges(0, n, dtype=pl.Int64).alias("__i")).explode("__i")
    return out.with_columns(
        *(
            pl.when(summed(col))
            .then(pl.col(col) // n + (i < pl.col(col) % n).cast(pl.Int64))
            .otherwise(pl.col(col))
            .alias(col)
            for col in ("dur", *(ARG_FIELDS[k][0] for k in SUMMED_ARGS))
        ),
        pl.when(summed("isize"))
        .then(pl.col("isize") // n)
        .otherwise(pl.col("isize"))
        .alias("isize"),
        (pl.col("ts") + (i.cast(pl.Float64) * whole / n).cast(pl.Int64)).alias("ts"),
    ).drop("__i")


def cast_loose(e: pl.Expr, dt: pl.DataType) -> pl.Expr:
    """Cast a JSON value read as text: ints may be written as strings or floats."""
    if dt == INT:
        text = e.str.strip_chars()
        return text.cast(pl.Int64, strict=False).fill_null(
            text.cast(pl.Float64, strict=False).cast(pl.Int64, strict=False)
        )
    return e
