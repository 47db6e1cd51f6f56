"""Parsed rows -> the compact columns a part keeps until it is resolved (:data:`~.shapes.CHUNK_SCHEMA`).

:func:`_compact_exprs` defines the columns (strings Categorical, sizes computed, the
file-position model's inputs ``op``/``pos``/``parg`` without nulls); the reference
parser's rows are compacted by polars (:func:`compact_rows`), the scanner's by the C pass
``compact`` straight from its buffers (:func:`native_compact`). Both set aside the
``start`` records and each process's first host hash, and count the values read as null
(ids beyond 32 bits, odd byte counts and durations) per file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import polars as pl

from dlreplay.schema import (
    CAT_CHECKPOINT,
    WRITE_OPS,
)

from . import native
from .shapes import (
    CAT,
    CHUNK_SCHEMA,
    FSEEK,
    FTELL,
    HOSTS_SCHEMA,
    I16,
    I32,
    INT,
    LSEEK,
    MAX_CALL_BYTES,
    NARROW,
    NATIVE_INTS,
    NATIVE_STRS,
    NUL,
    NULL_BYTES,
    NULL_IDS,
    POS_APPEND,
    POS_CUR,
    POS_IO,
    POS_OK,
    POS_RDONLY,
    POS_SET,
    POS_STDIO,
    POS_WRITE,
    PXFER,
    SRC,
    STARTS_SCHEMA,
    STR,
    SXFER,
    XFER,
    NullProblems,
)

__all__ = [
    "F63",
    "FLAGGED_FIELDS",
    "MAX_DUR_US",
    "SFLAG",
    "SF_MODE_A",
    "SF_MODE_R",
    "SF_WRITE",
    "WRITE_NAMES",
    "compact_rows",
    "native_compact",
    "one_frame",
]


#: Bit of the scanner's validity word set on a row with a byte count read as null.
_V_ODDBYTES = 1 << 15


#: The longest duration an event may have, either way, in µs: 2^45 µs, 407 days (no event
#: of a training job lasts a year). Beyond, ``dur`` reads as null and is counted
#: (:data:`ODD_DUR`): summed, such durations wrapped (two of 2^62 µs already).
MAX_DUR_US = 1 << 45


#: The float nearest 2^63 below it: a time scaled to µs is clipped to it (then cast to Int64).
F63 = float(2**63 - 1024)


_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


_I16_MAX = (1 << 15) - 1


_O_APPEND = 0o2000


_SEEK_SET, _SEEK_CUR = 0, 1


def _item(col: Callable[[str], pl.Expr]) -> pl.Expr:
    """Bytes per item of a transfer: fread/fwrite's item size (else 1)."""
    return pl.when(col("op") == SXFER).then(col("isize").fill_null(1)).otherwise(1)


def _call_bytes_ok(n: pl.Expr, item: pl.Expr | int) -> pl.Expr:
    """``n`` items of ``item`` bytes are a byte count one call can move: both non-negative,
    the product at most :data:`MAX_CALL_BYTES` (``call_bytes`` in ``_pfwscan.c``)."""
    item = pl.lit(item, dtype=INT) if isinstance(item, int) else item.cast(INT)
    most = pl.lit(MAX_CALL_BYTES, dtype=INT) // item.clip(lower_bound=1)
    return (n >= 0) & (item >= 0) & ((item == 0) | (n <= most))


def _odd_bytes(col: Callable[[str], pl.Expr]) -> pl.Expr:
    """Rows whose byte count :func:`_compact_exprs` reads as null as damage (a count
    negative or beyond :data:`MAX_CALL_BYTES`; a failed call's negative ``ret`` is none)."""
    ret, item, count = col("ret"), _item(col), col("count")
    xfer = ((ret >= 0) & ~_call_bytes_ok(ret, item)) | ~_call_bytes_ok(count, item)
    return (
        pl.when(col("op") >= XFER)
        .then(xfer)
        .when(col("cat") == CAT_CHECKPOINT)
        .then(~_call_bytes_ok(col("abytes"), 1))
    ).fill_null(False)


def _pos_flags(col: Callable[[str], pl.Expr]) -> pl.Expr:
    """The ``pos`` column of :func:`_compact_exprs` (UInt8): the file-position model's
    flags of a row (``POS_*``: the call succeeded, whence, append mode, an I/O call on a
    file, STDIO, read-only open, a write)."""
    ret = col("ret")
    whence = col("whence")
    append = ((col("flags").fill_null(0) & _O_APPEND) != 0) | col("mode").cast(CAT).cat.starts_with(
        "a"
    ).fill_null(False)
    mode = col("mode").cast(pl.String)
    rdonly = ((col("flags") & 3) == 0).fill_null(False) | (
        mode.str.starts_with("r") & ~mode.str.contains("+", literal=True)
    ).fill_null(False)

    def flag(cond: pl.Expr, bit: int) -> pl.Expr:
        return (
            pl.when(cond.fill_null(False))
            .then(pl.lit(bit, dtype=pl.UInt8))
            .otherwise(pl.lit(0, dtype=pl.UInt8))
        )

    pos = (
        flag(ret.is_null() | (ret >= 0), POS_OK)
        | flag(whence == _SEEK_CUR, POS_CUR)
        | flag(whence == _SEEK_SET, POS_SET)
        | flag(append, POS_APPEND)
        | flag(
            pl.any_horizontal(
                col("fhash").is_not_null(), col("path").is_not_null(), col("fname").is_not_null()
            )
            & col("cat").is_in(("POSIX", "STDIO")),
            POS_IO,
        )
        | flag(col("cat") == "STDIO", POS_STDIO)
        | flag(rdonly, POS_RDONLY)
        | flag(col("name").cast(pl.String).is_in(list(WRITE_NAMES)), POS_WRITE)
    )
    return pos


def _compact_exprs(col: Callable[[str], pl.Expr]) -> list[pl.Expr]:
    """The :data:`CHUNK_SCHEMA` columns of raw event rows whose :data:`RAW_SCHEMA` column
    ``c`` is ``col(c)`` (strings as String or Categorical): the values one row gives,
    ``size``/``size_requested`` (fread/fwrite: items x item size; checkpoints: their bytes),
    the file-position inputs ``pos`` and ``parg``, and the ``path`` (else ``fname``)
    argument. One definition for the Python path (a frame) and the scanner's (its buffers)."""
    op, ret = col("op"), col("ret")
    is_xfer = op >= XFER
    item = _item(col)
    size = (
        pl.when(is_xfer)
        .then(pl.when((ret >= 0) & _call_bytes_ok(ret, item)).then(ret * item))
        .when(col("cat") == CAT_CHECKPOINT)
        .then(pl.when(_call_bytes_ok(col("abytes"), 1)).then(col("abytes")))
    )
    pos = _pos_flags(col)
    parg = (
        pl.when(op.is_in((LSEEK, FTELL)))
        .then(ret)
        .when(op.is_in((FSEEK, PXFER)))
        .then(col("aoffset"))
        .when(op.is_in((XFER, SXFER)))
        .then(size)
    )
    return [
        col("src").alias("src"),
        col("seq").alias("seq"),
        col("pid").cast(I32, strict=False).alias("pid"),
        col("tid").cast(I32, strict=False).alias("tid"),
        *(col(c).alias(c) for c in ("ts", "dur")),
        *(col(c).cast(CAT).alias(c) for c in ("cat", "name", "fhash")),
        ret.alias("ret"),
        pl.when(is_xfer & _call_bytes_ok(col("count"), item))
        .then(col("count") * item)
        .alias("size_requested"),
        size.alias("size"),
        op.alias("op"),
        pos.alias("pos"),
        parg.fill_null(NUL).alias("parg"),
        # loop counters, 32-bit: a value beyond is no counter (null)
        *(
            pl.when(col(c).is_between(_I32_MIN, _I32_MAX)).then(col(c)).cast(I32).alias(c)
            for c in ("epoch", "step")
        ),
        col("batch_size").alias("batch_size"),  # 64-bit: summed to samples, which may pass 2^31
        col("image_idx").alias("sample_index"),
        # measured quantities, 32-bit: a value that is negative or beyond is no measurement (null)
        *(
            pl.when(col(c).is_between(lo, _I32_MAX)).then(col(c)).cast(I32).alias(c)
            for c, lo in (("cpu_time", 0), ("cpu_threads", 1))
        ),
        pl.when(col("tensors").is_between(0, _I16_MAX))
        .then(col("tensors"))
        .cast(I16)
        .alias("tensors"),
        pl.coalesce(col("path"), col("fname")).cast(CAT).alias("__path"),
    ]


def _starts_and_hosts(wide: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(starts, hosts) of compacted rows with ``__ppid``, ``__cwd`` and ``__hhash``: the
    processes' ``start`` records (ppid, working-directory hash, host hash), and the first
    host hash of each (``src``, ``pid``) by line."""
    starts = wide.filter((pl.col("name") == "start") & (pl.col("cat") == "dftracer")).select(
        "src",
        "seq",
        "pid",
        pl.col("__ppid").alias("ppid"),
        pl.col("__cwd").cast(STR).alias("cwd"),
        pl.col("__hhash").cast(STR).alias("hhash"),
    )
    hosts = (
        wide.filter(pl.col("__hhash").is_not_null())
        .group_by("src", "pid")
        .agg(
            pl.col("seq").min(),
            pl.col("__hhash").sort_by("seq").first().cast(STR).alias("hhash"),
        )
        .select("src", "pid", "seq", "hhash")
    )
    return starts, hosts


def _null_problems(beyond: dict[int, int], odd: dict[int, int]) -> NullProblems:
    """The rows with a pid, ppid or tid beyond 32 bits (``beyond``) and those with a byte
    count read as null (``odd``), each counted per ``src``."""
    out: NullProblems = {}
    for what, counts in ((NULL_IDS, beyond), (NULL_BYTES, odd)):
        for src, n in counts.items():
            out.setdefault(src, {})[what] = n
    return out


def compact_rows(
    raw: pl.DataFrame,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, NullProblems]:
    """(rows, starts, hosts, problems) of raw event rows (:data:`RAW_SCHEMA`, strings as
    String or Categorical): the :data:`CHUNK_SCHEMA` rows (:func:`_compact_exprs`), the
    processes' ``start`` records and first host hashes (:func:`_starts_and_hosts`), and per
    ``src`` the counts of rows with a :data:`NARROW` value beyond 32 bits or a byte count
    read as null (:func:`_null_problems`)."""
    wide = raw.select(
        *_compact_exprs(pl.col),
        pl.col("ppid").alias("__ppid"),
        pl.col("cwd").cast(CAT).alias("__cwd"),
        pl.col("hhash").cast(CAT).alias("__hhash"),
    )
    starts, hosts = _starts_and_hosts(wide)
    lims = raw.select(
        *(
            e
            for c in NARROW
            for e in (pl.col(c).min().alias(c + "_lo"), pl.col(c).max().alias(c + "_hi"))
        )
    )
    beyond: dict[int, int] = {}
    if any(
        (lo is not None and lo < _I32_MIN) or (hi is not None and hi > _I32_MAX)
        for lo, hi in zip(lims.row(0)[::2], lims.row(0)[1::2], strict=True)
    ):
        out_of_range = pl.any_horizontal(
            *((pl.col(c) < _I32_MIN) | (pl.col(c) > _I32_MAX) for c in NARROW)
        )
        beyond = dict(raw.filter(out_of_range.fill_null(False)).group_by("src").len().iter_rows())
    odd = dict(raw.filter(_odd_bytes(pl.col)).group_by("src").len().iter_rows())
    return wide.drop("__ppid", "__cwd", "__hhash"), starts, hosts, _null_problems(beyond, odd)


#: :func:`native_compact`'s outputs, in the order of the C ``OUT_*`` enum: (column, dtype,
#: validity bit of ``OUT_VALID``; 0 for a column without nulls).
_COMPACT_OUT: tuple[tuple[str, Any, int], ...] = (
    ("ts", np.int64, 1 << 0),
    ("dur", np.int64, 1 << 1),
    ("ret", np.int64, 1 << 2),
    ("size_requested", np.int64, 1 << 3),
    ("size", np.int64, 1 << 4),
    ("parg", np.int64, 0),
    ("batch_size", np.int64, 1 << 5),
    ("sample_index", np.int64, 1 << 6),
    ("__ppid", np.int64, 1 << 7),
    ("pid", np.int32, 1 << 8),
    ("tid", np.int32, 1 << 9),
    ("epoch", np.int32, 1 << 10),
    ("step", np.int32, 1 << 11),
    ("cpu_time", np.int32, 1 << 12),
    ("cpu_threads", np.int32, 1 << 13),
    ("tensors", np.int16, 1 << 14),
    ("op", np.int8, 0),
    ("pos", np.uint8, 0),
    ("cat", np.int32, 0),
    ("name", np.int32, 0),
    ("fhash", np.int32, 0),
    ("__path", np.int32, 0),
)


#: Flags of a scanned string for :func:`native_compact` (``SF_*`` in ``_pfwscan.c``).
SFLAG: dict[str, int] = {CAT_CHECKPOINT: 1, "POSIX": 2, "STDIO": 2 | 4, "start": 16, "dftracer": 32}


SF_MODE_A = 8


SF_MODE_R = 64


SF_WRITE = 128


WRITE_NAMES = frozenset(WRITE_OPS)


_CODE_COLUMNS = ("cat", "name", "fhash", "__path")


#: The scanner's string fields (bits of its ``fields``) whose values get ``op_of`` and ``SFLAG``.
FLAGGED_FIELDS = sum(1 << NATIVE_STRS.index(c) for c in ("name", "cat", "mode"))


_EMPTY_U32 = np.zeros(0, dtype=np.uint32)


@functools.cache
def _column_expr(c: str, bit: int, kind: Literal["null", "all", "masked"]) -> pl.Expr:
    """:func:`native_compact`'s expression of column ``c`` (validity ``bit`` of ``__v``):
    all null, all valid, or valid where its bit is set. Built once: the Python side of
    building them for every batch held the GIL the other parse threads wait for."""
    if kind == "null":
        return pl.lit(None, dtype=CHUNK_SCHEMA[c]).alias(c)
    if kind == "all":
        return pl.col(c)
    return pl.when((pl.col("__v") & bit) != 0).then(pl.col(c)).alias(c)


def native_compact(
    sl: slice,
    ints: np.ndarray,
    imask: np.ndarray,
    strs: np.ndarray,
    values: pl.Series,
    uniques: list[str],
    op_of: np.ndarray,
    sflag: np.ndarray,
    src: int | np.ndarray,
    seq: np.ndarray,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, NullProblems]:
    """:func:`compact_rows` of the scanner's event rows ``sl`` straight from its buffers (of
    file ``src``, a constant or one per row, lines ``seq``): the C pass ``compact`` computes
    the :data:`CHUNK_SCHEMA` columns as :func:`_compact_exprs` defines them, into arrays of
    their own (so that a column dropped later frees its memory), and finds the ``start``
    records and each process's first host hash; polars only adds the validity masks and
    maps the string codes to categories.

    One piece: the scanner path's compaction, run under the GIL once per parse batch and
    tuned with the C pass it drives: it hands that pass a dozen output arrays and builds
    one polars select from all of them (every branch picks a column's form: constant,
    all valid, masked), so a split would pass the same arrays through each piece without
    making any piece readable alone; the C path's Python is moved here unchanged.
    """
    assert native.NATIVE is not None
    n = sl.stop - sl.start
    col = {c: np.empty(n, dtype=dt) for c, dt, _ in _COMPACT_OUT}
    valid, special = np.empty(n, dtype=np.uint32), np.empty(2 * n, dtype=np.int64)
    srcs = src.astype(np.uint32, copy=False) if isinstance(src, np.ndarray) else _EMPTY_U32
    vand, vor, beyond_rows, odd_rows, nstarts, nhosts = native.NATIVE.compact(
        ints, imask, strs, sl.start, sl.stop, op_of, sflag, srcs, (*col.values(), valid, special)
    )
    data: dict[str, np.ndarray] = {"__v": valid}
    exprs: dict[str, pl.Expr] = {}
    cats = None
    for c, _, bit in _COMPACT_OUT:
        arr = col[c]
        if c == "__ppid":
            continue
        if c in _CODE_COLUMNS:
            lo, hi = (int(arr.min()), int(arr.max())) if n else (-1, -1)
            if hi < 0:
                exprs[c] = pl.lit(None, dtype=CAT)
            elif lo == hi:
                exprs[c] = pl.lit(values[lo], dtype=CAT)
            else:
                if cats is None:
                    cats = values.cast(CAT)
                data[c] = arr
                exprs[c] = pl.lit(cats).gather(
                    pl.when(pl.col(c) >= 0).then(pl.col(c)) if lo < 0 else pl.col(c)
                )
            continue
        if bit and not vor & bit:
            exprs[c] = _column_expr(c, bit, "null")
            continue
        data[c] = arr
        exprs[c] = _column_expr(c, bit, "all" if not bit or vand & bit else "masked")
    data["seq"] = seq
    exprs["seq"] = pl.col("seq")
    if isinstance(src, np.ndarray):
        data["src"] = src
        exprs["src"] = pl.col("src")
    else:
        exprs["src"] = pl.lit(src, dtype=SRC)
    rows = pl.DataFrame(data).select(*(exprs[c].alias(c) for c in CHUNK_SCHEMA))
    del data, exprs
    # the processes' start records and first host hashes: a few rows each
    cwd, hhash = strs[NATIVE_STRS.index("cwd"), sl], strs[NATIVE_STRS.index("hhash"), sl]

    def few(at: np.ndarray, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        if not len(at):  # (most batches hold no start record: 1-2 ms a frame otherwise)
            return pl.DataFrame(schema=schema)
        # built from Python lists of the few rows (a frame and a select of polars
        # expressions cost a pass through polars' pool, for a row or two)
        ok = valid[at].tolist()
        got = {
            "src": src[at].tolist() if isinstance(src, np.ndarray) else [int(src)] * len(at),
            "seq": seq[at].tolist(),
            "pid": [
                v if m & (1 << 8) else None
                for v, m in zip(col["pid"][at].tolist(), ok, strict=True)
            ],
            "ppid": [
                v if m & (1 << 7) else None
                for v, m in zip(col["__ppid"][at].tolist(), ok, strict=True)
            ],
            "cwd": [uniques[k] if k >= 0 else None for k in cwd[at].tolist()],
            "hhash": [uniques[k] if k >= 0 else None for k in hhash[at].tolist()],
        }
        return pl.DataFrame({c: got[c] for c in schema}, schema=schema)

    starts, hosts = (
        few(special[:nstarts], STARTS_SCHEMA),
        few(special[n : n + nhosts], HOSTS_SCHEMA),
    )
    beyond: dict[int, int] = {}
    if beyond_rows:
        mask = imask[sl]
        out_of_range = np.zeros(n, dtype=bool)
        for c in NARROW:
            k = NATIVE_INTS.index(c)
            v = ints[k, sl]
            out_of_range |= ((mask >> k) & 1).astype(bool) & ((v < _I32_MIN) | (v > _I32_MAX))
        srcs_out = (
            src[out_of_range]
            if isinstance(src, np.ndarray)
            else np.full(int(out_of_range.sum()), src)
        )
        beyond = {
            int(s_): int(k) for s_, k in zip(*np.unique(srcs_out, return_counts=True), strict=True)
        }
    odd: dict[int, int] = {}
    if odd_rows:
        if isinstance(src, np.ndarray):
            srcs_odd = src[(valid & _V_ODDBYTES) != 0]
            odd = {
                int(s_): int(k)
                for s_, k in zip(*np.unique(srcs_odd, return_counts=True), strict=True)
            }
        else:
            odd = {int(src): odd_rows}
    return rows, starts, hosts, _null_problems(beyond, odd)


def one_frame(frames: list[pl.DataFrame], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """``frames`` as one frame (their chunks kept; no copy), or an empty one of ``schema``."""
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame(schema=schema)
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical", rechunk=False)
