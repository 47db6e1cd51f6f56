"""File positions per stream, and the stray transfers of DFTracer's close race.

A stray transfer is a read or write its process logged on a file it had opened and
closed again, with no descriptor of it open at the time (the opens and closes of the
stream counted in output order; a close never takes the count below zero, so closing
an inherited descriptor changes nothing); or a write on a file its process had opened
before, read-only every time (``flags`` without write access, or an fopen mode ``r``
without ``+``). DFTracer's ``close`` closes the descriptor before it forgets the file it
named: a socket or pipe another thread opens in between gets the number, and its calls
are logged as the file's (a PyTorch DataLoader worker's handshake with the training
process, a few bytes written to a dataset file). Stray transfers keep no file
(:func:`unname_stray`) and are counted in their file's report.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from dlreplay.allocator import release_free_memory

from . import native, shapes, vocabulary
from .shapes import (
    CLOSE,
    FSEEK,
    FTELL,
    LSEEK,
    NUL,
    OPEN,
    POS_APPEND,
    POS_CUR,
    POS_IO,
    POS_OK,
    POS_RDONLY,
    POS_SET,
    POS_STDIO,
    POS_WRITE,
    PXFER,
    REWIND,
    STRAY_IO,
    SXFER,
    XFER,
    count_problem,
)

__all__ = ["RANK_PIDS", "file_offsets", "unname_stray"]


def _position_rules() -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """(reset, base, advance) expressions of the file-position model, over ``op``, ``pos``
    and ``parg`` (see :data:`CHUNK_SCHEMA`).

    open/fopen reset the position to 0 (unknown with O_APPEND or mode "a"); lseek sets it
    to its ``ret``; fseek(SEEK_SET) to its offset (other whence: unknown); ftell reports
    it; rewind sets 0; close makes it unknown. Stream reads/writes advance it by the bytes
    transferred, fseek(SEEK_CUR) by its offset. A failed call (ret < 0) changes nothing.
    """
    op, pos = pl.col("op"), pl.col("pos")
    arg = pl.when(pl.col("parg") != NUL).then(pl.col("parg"))

    def has(bit: int) -> pl.Expr:
        return (pos & bit) != 0

    ok, is_cur = has(POS_OK), has(POS_CUR)
    reset = (
        ((op == OPEN) & ok)
        | (op.is_in((LSEEK, FTELL)) & (arg >= 0).fill_null(False))
        | ((op == FSEEK) & ~is_cur & ok)
        | op.is_in((REWIND, CLOSE))
    )
    base = (
        pl.when(op == OPEN)
        .then(pl.when(has(POS_APPEND)).then(None).otherwise(0))
        .when(op.is_in((LSEEK, FTELL)))
        .then(arg)
        .when(op == FSEEK)
        .then(pl.when(has(POS_SET)).then(arg))
        .when(op == REWIND)
        .then(0)
    )
    advance = (
        pl.when(op.is_in((XFER, SXFER)))
        .then(arg.fill_null(0))
        .when((op == FSEEK) & is_cur & ok)
        .then(arg.fill_null(0))
        .otherwise(0)
    )
    return reset.fill_null(False), base, advance


def unname_stray(
    rows: pl.DataFrame, stray: np.ndarray, problems: dict[int, list[str]]
) -> pl.DataFrame:
    """``rows`` with the file of each stray transfer (``stray``, by row) taken away (file
    hash and path null: the call stays, on no file), counted in its file's ``problems``."""
    mask = pl.Series(stray)
    for src, n in rows.select("src").filter(mask).group_by("src").len().sort("src").iter_rows():
        if src in problems:
            count_problem(problems[src], n, STRAY_IO)
    return rows.with_columns(
        pl.when(mask).then(None).otherwise(pl.col(c)).alias(c) for c in ("fhash", "__path")
    )


def file_offsets(
    ev: pl.DataFrame, order: np.ndarray, release: bool = False
) -> tuple[pl.Series, np.ndarray | None]:
    """The offset of each row of ``ev``, in ``ev``'s own row order (``order`` lists the rows
    in output order, in which the streams are followed): given for pread/pwrite,
    reconstructed for stream reads and writes; and which rows are stray transfers (a bool
    array by row, None when none is), which have no offset.

    Stray transfers: see the module's doc.

    Rows of one (trace file, pid, POSIX or STDIO, file hash) in (ts, line) order form a
    stream; a reset or the stream start begins a segment; within a segment the offset of
    a transfer is the segment's base plus the bytes advanced before it (exclusive running
    sum). A segment with an unknown base yields null offsets. ``ev`` has ``__p`` (the
    process index) and the model's inputs ``op``, ``pos``, ``parg``. With the C extension
    the rules and the scan are one pass over the rows in output order (``file_offsets`` in
    ``_pfwscan.c``, reading polars' buffers where they are); without it, polars rule
    columns (:func:`_position_rules`) and a few vectorised numpy passes over the I/O rows
    sorted by (stream, output position). ``release``: return what the inputs' copies held
    to the system before the column is built (see :func:`resolve_part`'s ``alone``).
    """
    if native.NATIVE is not None:  # the whole model in one C pass (file_offsets in _pfwscan.c)
        return _native_offsets(ev, order, release)
    return _polars_offsets(ev, order)


def _native_offsets(
    ev: pl.DataFrame, order: np.ndarray, release: bool
) -> tuple[pl.Series, np.ndarray | None]:
    """:func:`file_offsets` with the C extension: the rules and the scan in one pass over the
    rows in output order (``file_offsets`` in ``_pfwscan.c``)."""
    n = ev.height
    values = np.empty(n, dtype=np.int64)
    valid = np.empty(n, dtype=np.bool_)
    stray = np.empty(n, dtype=np.bool_)
    proc = _stream_processes(ev).to_numpy()
    fcode = ev.select(_file_key()).to_series().to_numpy()
    native.NATIVE.file_offsets(
        np.ascontiguousarray(order, dtype=np.int64),
        np.ascontiguousarray(proc, dtype=np.uint32),
        np.ascontiguousarray(fcode, dtype=np.uint32),
        *(
            np.ascontiguousarray(ev[c].rechunk().to_numpy(), dtype=dt)
            for c, dt in (("op", np.int8), ("pos", np.uint8), ("parg", np.int64))
        ),
        values,
        valid,
        stray,
    )
    del proc, fcode
    _seek_targets(ev, values, valid)
    if release:  # the inputs' copies, before the column is built beside the values
        release_free_memory(keep_large=True)
    found = bool(stray.any())
    if found:  # on no file: no offset
        valid &= ~stray
    offset = pl.select(
        pl.when(pl.lit(pl.Series(valid))).then(pl.lit(pl.Series(values))).alias("offset")
    )
    return offset.to_series(), (stray if found else None)


def _seek_targets(ev: pl.DataFrame, values: np.ndarray, valid: np.ndarray) -> None:
    """Give each successful ``lseek(fd, off, SEEK_SET)`` its target as its offset (``values`` /
    ``valid`` by row, in place): an lseek relative to the position or the end keeps none, so
    the table tells a seek to a place from a ``tell`` (numpy's trail, :mod:`.hidden`)."""
    op = ev["op"].to_numpy()
    pos = ev["pos"].to_numpy()
    hit = (op == LSEEK) & ((pos & POS_SET) != 0) & ((pos & POS_OK) != 0)
    if hit.any():
        at = np.flatnonzero(hit)
        target = ev["parg"].to_numpy()[at]
        known = target != NUL  # (an lseek without its result has no place)
        values[at[known]] = target[known]
        valid[at[known]] = True


def _polars_offsets(ev: pl.DataFrame, order: np.ndarray) -> tuple[pl.Series, np.ndarray | None]:
    """:func:`file_offsets` without the C extension: polars rule columns
    (:func:`_position_rules`) and vectorised numpy passes over the I/O rows sorted by
    (stream, output position)."""
    n = ev.height
    io = (pl.col("pos") & POS_IO) != 0
    stream = (
        pl.col("__sp").cast(pl.Int64) * 2 + ((pl.col("pos") & POS_STDIO) != 0).cast(pl.Int64)
    ) * (1 << 32) + _file_key().cast(pl.Int64)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    reset, base, advance = _position_rules()
    narrow = (
        ev.lazy()
        .with_row_index("__row")
        .with_columns(_stream_processes(ev).alias("__sp"))
        .filter(io)
        .select(
            "__row",
            stream.alias("g"),
            reset.alias("reset"),
            # a negative base (or none) is an unknown position
            base.fill_null(-1).alias("base"),
            advance.alias("adv"),
            pl.col("op").is_in((XFER, SXFER)).alias("xfer"),
            # the descriptors opened (+1) and closed (-1), and the transfers that need one
            pl.when((pl.col("op") == OPEN) & ((pl.col("pos") & POS_OK) != 0))
            .then(1)
            .when(pl.col("op") == CLOSE)
            .then(-1)
            .otherwise(0)
            .cast(pl.Int8)
            .alias("fd"),
            pl.col("op").is_in((XFER, SXFER, PXFER)).alias("acc"),
            # the opens that could write, and the transfers that write
            (
                (pl.col("op") == OPEN)
                & ((pl.col("pos") & POS_OK) != 0)
                & ((pl.col("pos") & POS_RDONLY) == 0)
            ).alias("wopen"),
            ((pl.col("pos") & POS_WRITE) != 0).alias("wr"),
        )
        .collect()
    )
    values = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    # pread/pwrite: the offset argument
    given = (
        ev.lazy()
        .with_row_index("__row")
        .filter((pl.col("op") == PXFER) & (pl.col("parg") != NUL))
        .select("__row", "parg")
        .collect()
    )
    if given.height:
        at = rank[given["__row"].to_numpy()]
        values[at] = given["parg"].to_numpy()
        valid[at] = True
    stray = np.zeros(n, dtype=bool)
    if narrow.height:
        _stream_offsets(narrow, rank, values, valid, stray)
    values, valid = values[rank], valid[rank]  # (by output position: back to the rows' order)
    _seek_targets(ev, values, valid)
    valid &= ~stray  # a stray transfer is on no file: no offset
    offset = pl.select(
        pl.when(pl.lit(pl.Series(valid))).then(pl.lit(pl.Series(values))).alias("offset")
    )
    return offset.to_series(), (stray if stray.any() else None)


def _file_key() -> pl.Expr:
    """The file of a row's position stream (UInt32, 0 for none): its file hash's category code
    (DFTracer 2.x), else the code of its ``path``/``fname`` argument (DFTracer 1.x names
    files by ``fname``; hashes and paths are different strings, so their codes never meet)."""
    return (
        pl.coalesce(pl.col("fhash").to_physical(), pl.col("__path").to_physical())
        .fill_null(0)
        .alias("__fk")
    )


#: Process ids below which a process without events of its own main thread is taken for
#: an MPI rank number (see :func:`_stream_processes`).
RANK_PIDS = vocabulary.RANK_PIDS_BELOW


def _stream_processes(ev: pl.DataFrame) -> pl.Series:
    """The process of each row's position stream (UInt32): ``__p``, except in rank-numbered
    processes, whose threads are processes of their own.

    pydftracer 1.x writes the MPI rank as ``pid`` (as DLIO's traces have it) and DLIO's
    forked reader workers keep writing into the rank's file, so only the thread id tells
    their file positions apart (the vocabulary later gives them their own pids:
    :func:`~.vocabulary.canonicalize`). A process numbered below :data:`RANK_PIDS` with no
    event of its own main thread (``tid == pid``) is such a rank: its (process, thread)
    pairs get indices after the processes'."""
    p = ev["__p"]
    if ev.height == 0 or not bool((ev["pid"] < RANK_PIDS).any()):
        return p
    per = (
        ev.lazy()
        .group_by("__p")
        .agg(pl.col("pid").first(), (pl.col("tid") == pl.col("pid")).any().alias("own"))
    )
    ranks = per.filter((pl.col("pid") < RANK_PIDS) & ~pl.col("own").fill_null(False)).collect()[
        "__p"
    ]
    if ranks.is_empty():
        return p
    threads = pl.col("__p").is_in(ranks.implode()) & pl.col("tid").is_not_null()
    key = pl.struct("__p", "tid")
    base = int(p.max() or 0) + 1  # type: ignore[arg-type]
    return ev.select(
        pl.when(threads)
        .then(key.rank("dense").cast(pl.UInt32) - 1 + base)  # ranks of all rows
        .otherwise(pl.col("__p"))
        .cast(pl.UInt32)
        .alias("__sp")
    ).to_series()


def _stream_offsets(
    narrow: pl.DataFrame, rank: np.ndarray, values: np.ndarray, valid: np.ndarray, stray: np.ndarray
) -> None:
    """Fill ``values``/``valid`` (output order) with the reconstructed offsets of the
    stream transfers among the I/O rows ``narrow``, and mark ``stray`` (by row) the stray
    transfers (see :func:`file_offsets`): vectorised numpy (builds without the C extension,
    which does all of :func:`file_offsets` in one pass)."""
    n, m = len(rank), narrow.height
    pos = rank[narrow["__row"].to_numpy()]
    g = narrow["g"].to_numpy()
    # streams, each in output (time) order
    b_pos = max(n, 1).bit_length()
    if (int(g.max()) + 1).bit_length() + b_pos <= shapes.PACK_BITS:
        idx = np.argsort((g << b_pos) | pos)  # keys are unique
    else:
        idx = np.lexsort((pos, g))
    g, pos = g[idx], pos[idx]
    reset_ = narrow["reset"].to_numpy()[idx]
    adv = narrow["adv"].to_numpy()[idx]
    brk = reset_.copy()
    brk[0] = True
    brk[1:] |= g[1:] != g[:-1]
    cs = np.cumsum(adv) - adv  # bytes advanced before each row
    last = np.maximum.accumulate(np.where(brk, np.arange(m), 0))  # the row's segment start
    seg_base = np.where(reset_, narrow["base"].to_numpy()[idx], -1)[last]
    known = narrow["xfer"].to_numpy()[idx] & (seg_base >= 0)
    values[pos[known]] = (seg_base + cs - cs[last])[known]
    valid[pos[known]] = True
    # descriptors open per stream: the running sum of opens and closes held at 0 from below
    # (Lindley: the sum minus its running minimum where that is negative), per stream
    fd = narrow["fd"].to_numpy()[idx].astype(np.int64)
    first = g != np.roll(g, 1)
    first[0] = True
    gid = np.cumsum(first) - 1
    total = np.cumsum(fd)
    run = total - (total - fd)[np.flatnonzero(first)][gid]  # the stream's own running sum
    span = 2 * m + 2  # more than any running sum's range: streams' minima never meet
    low = np.minimum.accumulate(run - gid * span) + gid * span
    held = run - np.minimum(low, 0)
    starts = np.flatnonzero(first)
    opens = np.cumsum(fd > 0)
    opened = (opens - (opens - (fd > 0))[starts][gid]) > 0
    wopen = narrow["wopen"].to_numpy()[idx]
    wopens = np.cumsum(wopen)
    writable = (
        wopens - (wopens - wopen)[starts][gid]
    ) > 0  # an open for writing before (or at) the row
    hit = (
        narrow["acc"].to_numpy()[idx]
        & opened
        & ((held == 0) | (narrow["wr"].to_numpy()[idx] & ~writable))
    )
    stray[narrow["__row"].to_numpy()[idx][hit]] = True
