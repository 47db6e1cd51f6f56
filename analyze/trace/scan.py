"""The glue around the C scanner (``_pfwscan.scan``): :class:`NativeBatch` collects a batch's
decoded texts where they lie and scans them in one call without the GIL
(:func:`_scan`, into buffers kept per batch, :class:`_ScanBuffers`); the rows come back
compacted (:func:`~.compact.native_compact`), metadata records as :class:`MetaRows` made
one frame per part (:func:`meta_frames`), and the lines the scanner does not accept (or a
batch that is not UTF-8) go to the reference parser (:mod:`.reference`), their line
numbers mapped back.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from dlreplay.pfw import DecodeStats as _Stats
from dlreplay.pfw import anonymous_map

from . import native
from .compact import (
    FLAGGED_FIELDS,
    SF_MODE_A,
    SF_MODE_R,
    SF_WRITE,
    SFLAG,
    WRITE_NAMES,
    native_compact,
)
from .decompress import Piece, line_segments
from .reference import Batch
from .shapes import INT, NATIVE_INTS, NATIVE_STRS, OP_CODE, RAW_SCHEMA, SRC, STR

__all__ = ["MetaRows", "NativeBatch", "meta_frames"]

#: A text of the native batch: (src, seq0, text, stats, lines, valid UTF-8).
_Seg = tuple[int, int, "bytes | mmap.mmap | memoryview", _Stats, int, bool]


class NativeBatch:
    """:class:`Batch` with the C scanner: at the flush, all texts are scanned in one call
    (without the GIL, where they lie: no copy) into raw columns; the lines
    the scanner does not accept go to an inner :class:`Batch`, the Python path, and when
    any text of the batch is not UTF-8 the whole batch does (the Python path decodes it
    lossily and groups lines across the batch's texts, as before). Flush points are those
    of :class:`Batch`, so what is salvaged and counted, and in which order problems are
    reported, stays the same."""

    def __init__(self) -> None:
        self.nbytes = 0
        self.events: list[pl.DataFrame] = []
        self.meta: list[pl.DataFrame | MetaRows] = []
        self.rest = Batch()
        #: texts waiting for the flush, one list per added text, of its line segments:
        #: (src, seq0, text, stats, lines, valid UTF-8)
        self.pending: list[list[_Seg]] = []
        #: (src, line number in the inner batch's text, line number in the file) of rejected lines
        self.remap: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.buffers = _ScanBuffers()

    def add_pieces(self, src: int, seq0: int, text: list[Piece], stats: _Stats) -> int:
        """Add the text of pieces ``text`` (complete lines of file ``src`` from line ``seq0``);
        returns its lines. They are scanned where they lie (only a line spanning two
        pieces is copied)."""
        assert native.NATIVE is not None
        segs: list[_Seg] = []
        n = 0
        for seg in line_segments(text):
            newlines, valid = native.NATIVE.text_info(seg)  # one C pass: lines and the UTF-8 check
            k = newlines + (0 if seg[-1] == 10 else 1)  # 10: "\n"
            segs.append((src, seq0 + n, seg, stats, k, valid))
            n += k
            self.nbytes += len(seg)
        if segs:
            self.pending.append(segs)
        return n

    def _scan(self, segs: list[_Seg]) -> None:
        """Scan the texts of ``segs`` in one scanner call (their lines numbered on across them)."""
        counts = np.fromiter((seg[4] for seg in segs), dtype=np.int64, count=len(segs))
        first = np.cumsum(counts) - counts  # first line of each segment in the scanned text
        scanned = _scan(
            [seg[2] for seg in segs],
            int(counts.sum()),
            first,
            np.fromiter((seg[0] for seg in segs), dtype=np.uint32, count=len(segs)),
            np.fromiter((seg[1] for seg in segs), dtype=np.int64, count=len(segs)),
            checked=True,
            compact=True,
            buffers=self.buffers,
            defer_meta=True,
        )
        if scanned is None:
            raise AssertionError("the scanner refused text its own UTF-8 check accepted")
        events, meta, per_seg, rejected = scanned
        for seg, k in zip(segs, per_seg.tolist(), strict=True):
            seg[3].lines += k
        if events is not None:  # compacted already (rows, starts, hosts, problems)
            self.events.append(events)
        if meta.height:
            self.meta.append(meta)
        if not len(rejected):
            return
        owner = np.searchsorted(first, rejected[:, 0], side="right") - 1
        for i in np.unique(owner).tolist():
            src, seq0, text, stats, _, _ = segs[i]
            mine = rejected[owner == i]  # (line, start, end in the segment's own text)
            sub = b"\n".join([text[a:b] for a, b in mine[:, 1:].tolist()]) + b"\n"
            self.rest.add(src, seq0, sub, stats)
            self.remap.append(
                (src, seq0 + np.arange(len(mine), dtype=np.int64), seq0 + mine[:, 0] - first[i])
            )

    def flush(self) -> None:
        added, self.pending = self.pending, []
        if not all(seg[5] for segs in added for seg in segs):
            for segs in added:  # as added: the Python path sees the texts it saw without this batch
                src, seq0, _, stats, _, _ = segs[0]
                self.rest.add(src, seq0, b"".join([seg[2] for seg in segs]), stats)
            added = []
        segs = [seg for segs in added for seg in segs]
        if segs:  # all texts in one call, where they lie (no copy)
            self._scan(segs)
        self.nbytes = 0
        self.rest.flush()
        if not (self.rest.events or self.rest.meta):
            self.remap = []
            return
        if self.remap:
            where = pl.DataFrame(
                {
                    "src": np.concatenate(
                        [np.full(len(a), s, dtype=np.uint32) for s, a, _ in self.remap]
                    ),
                    "seq": np.concatenate([a for _, a, _ in self.remap]),
                    "__real": np.concatenate([b for _, _, b in self.remap]),
                }
            )
            cols = list(RAW_SCHEMA)

            def fix(df: pl.DataFrame) -> pl.DataFrame:
                return (
                    df.join(where, on=["src", "seq"], how="left")
                    .with_columns(pl.coalesce("__real", "seq").alias("seq"))
                    .select(cols)
                )

            self.rest.events = [fix(df) for df in self.rest.events]
            self.rest.meta = [fix(df) for df in self.rest.meta]
        self.events.extend(self.rest.events)
        self.meta.extend(self.rest.meta)
        self.rest.events, self.rest.meta, self.remap = [], [], []


class _ScanBuffers:
    """The C scanner's output buffers, kept by one :class:`NativeBatch` for all its scans.

    Nothing built from a scan views them (:func:`_native_frame` and
    :func:`native_compact` copy what they keep; the scanner writes each row's masks and
    string codes, and the integers its mask marks, which are the only ones read), so the
    next scan can overwrite them. A fresh mapping per scan had the kernel zero huge pages
    for every batch, a share of the parse's CPU time (measured: benchmarks/RESULTS.md); the batch,
    and so the buffers, go with the parse job, before the rows are resolved.
    """

    def __init__(self) -> None:
        self._buf: mmap.mmap | None = None

    def get(self, nbytes: int) -> mmap.mmap:
        """A mapping of at least ``nbytes`` bytes (the kept one when it is large enough)."""
        if self._buf is None or len(self._buf) < nbytes:
            self._buf = None  # (the old one goes first)
            self._buf = anonymous_map(nbytes)
        return self._buf


def _scan(
    text: bytes | memoryview | list[Any],
    nlines: int,
    first: np.ndarray,
    srcs: np.ndarray,
    seq0s: np.ndarray,
    checked: bool = False,
    compact: bool = False,
    buffers: _ScanBuffers | None = None,
    defer_meta: bool = False,
) -> tuple[Any, pl.DataFrame | MetaRows, np.ndarray, np.ndarray] | None:
    """Scan ``text`` (one buffer, or a list of buffers of complete lines scanned as one text;
    segment k: lines from ``first[k]``, of file ``srcs[k]`` from its line ``seq0s[k]``) with
    the C scanner: (event rows, metadata rows, accepted lines per segment, rejected lines as
    rows of (line in the whole text, start, end in the line's own buffer)); None when
    ``text`` is not valid UTF-8 (not checked again when ``checked``: the caller found it valid).
    With ``compact``, the event rows come compacted (:func:`native_compact`; None when none).
    ``buffers``: where the scanner writes (reused from scan to scan; else a new mapping).
    ``defer_meta``: the metadata rows come as :class:`MetaRows` (made a frame per part)."""
    cap = max(nlines, 1)
    ni, ns = len(NATIVE_INTS), len(NATIVE_STRS)
    # The output buffers are one anonymous mapping (large short-lived malloc'd buffers
    # would raise glibc's mmap threshold and fragment the heap across loads: peak RSS grew
    # with each repeated load), unmapped when the last array viewing it goes.
    need = cap * (ni * 8 + 4 + ns * 4 + 8)
    scratch = buffers.get(need) if buffers is not None else anonymous_map(need)
    ints, imask, strs, rows = _scan_views(scratch, cap, ni, ns)
    assert native.NATIVE is not None
    out = native.NATIVE.scan(text, ints, imask, strs, rows, checked)
    if out is None:
        return None
    nev, nmeta, rejected, uniques, any_mask, fields = out
    rej = np.frombuffer(rejected, dtype=np.int64).reshape(-1, 3)
    values = pl.Series(uniques, dtype=STR)
    op_of, sflag = _string_flags(uniques, fields)
    # events are rows [0, nev), metadata records rows [cap - nmeta, cap)
    frames: list[Any] = []
    per_seg = np.zeros(len(first), dtype=np.int64)
    # segments that continue each other (one file's decoder outputs, in order: the usual
    # batch) number their lines as one text does: no per-row segment lookup (a binary
    # search and two gathers per row, under the GIL); their accepted lines are counted on
    # the first one (the file's count is the same)
    along = len(first) == 1 or (
        bool((srcs == srcs[0]).all()) and bool((seq0s - first == seq0s[0] - first[0]).all())
    )
    for sl in (slice(0, nev), slice(cap - nmeta, cap)):
        lines = rows[sl]
        if along:
            src: int | np.ndarray = int(srcs[0])
            seq = lines + (seq0s[0] - first[0])
            per_seg[0] += len(lines)
        else:
            seg = np.searchsorted(first, lines, side="right") - 1
            src, seq = srcs[seg], seq0s[seg] + (lines - first[seg])
            per_seg += np.bincount(seg, minlength=len(first))
        if not frames and compact:  # events
            frames.append(
                native_compact(sl, ints, imask, strs, values, uniques, op_of, sflag, src, seq)
                if sl.stop > sl.start
                else None
            )
        elif defer_meta:
            frames.append(MetaRows(sl, ints, imask, strs, values, op_of, any_mask, src, seq))
        else:
            frames.append(
                _native_frame(
                    sl, ints, imask, strs, values, op_of, any_mask, src, seq, categorical=not frames
                )
            )
    return frames[0], frames[1], per_seg, rej


def _scan_views(
    scratch: mmap.mmap, cap: int, ni: int, ns: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The scanner's output arrays (ints, imask, strs, rows) for ``cap`` rows, ``ni`` integer
    and ``ns`` string fields, viewing the one mapping ``scratch`` (no copy)."""
    ints = np.frombuffer(scratch, dtype=np.int64, count=ni * cap).reshape(ni, cap)
    imask = np.frombuffer(scratch, dtype=np.uint32, count=cap, offset=ni * cap * 8)
    strs = np.frombuffer(
        scratch, dtype=np.int32, count=ns * cap, offset=ni * cap * 8 + cap * 4
    ).reshape(ns, cap)
    rows = np.frombuffer(
        scratch, dtype=np.int64, count=cap, offset=ni * cap * 8 + cap * 4 + ns * cap * 4
    )
    return ints, imask, strs, rows


def _string_flags(uniques: list[str], fields: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(op_of, sflag) of a scan's distinct strings ``uniques``: what the compaction needs of
    a string (its operation code; its ``SF_*`` flags), for the strings that were a name,
    category or mode (``fields``: each string's fields, as the scanner returns them; most
    strings are file hashes and paths, left 0)."""
    op_of = np.zeros(len(uniques), dtype=np.int8)
    sflag = np.zeros(len(uniques), dtype=np.uint8)
    for k in np.flatnonzero(np.frombuffer(fields, dtype=np.uint16) & FLAGGED_FIELDS).tolist():
        u = uniques[k]
        op_of[k] = OP_CODE.get(u, 0)
        sflag[k] = (
            SFLAG.get(u, 0)
            | (SF_MODE_A if u[:1] == "a" else 0)
            | (SF_MODE_R if u[:1] == "r" and "+" not in u else 0)
            | (SF_WRITE if u in WRITE_NAMES else 0)
        )
    return op_of, sflag


class MetaRows:
    """A batch's metadata rows as the scanner wrote them (copied out of its buffers, which
    the next scan overwrites), made into frames together (:func:`_meta_frame`): a part's
    batches hold a few thousand metadata rows, and a frame per batch cost polars
    expressions built in Python, under the GIL, each."""

    __slots__ = ("ints", "imask", "strs", "values", "op_of", "any_mask", "src", "seq")

    def __init__(
        self,
        sl: slice,
        ints: np.ndarray,
        imask: np.ndarray,
        strs: np.ndarray,
        values: pl.Series,
        op_of: np.ndarray,
        any_mask: int,
        src: int | np.ndarray,
        seq: np.ndarray,
    ) -> None:
        n = sl.stop - sl.start
        self.ints, self.imask, self.strs = ints[:, sl].copy(), imask[sl].copy(), strs[:, sl].copy()
        self.values, self.op_of, self.any_mask = values, op_of, any_mask
        self.src = (
            src.astype(np.uint32)
            if isinstance(src, np.ndarray)
            else np.full(n, src, dtype=np.uint32)
        )
        self.seq = seq

    @property
    def height(self) -> int:
        return len(self.imask)


def _meta_frame(rows: Sequence[MetaRows]) -> pl.DataFrame:
    """The RAW_SCHEMA frame of the metadata rows ``rows``, in their order (each batch's
    string codes moved past the strings of the batches before it)."""
    offsets = np.cumsum([0] + [r.values.len() for r in rows[:-1]])
    strs = np.concatenate(
        [np.where(r.strs >= 0, r.strs + off, -1) for r, off in zip(rows, offsets, strict=True)],
        axis=1,
    ).astype(np.int32)
    src = np.concatenate([r.src for r in rows])
    any_mask = 0
    for r in rows:
        any_mask |= r.any_mask
    return _native_frame(
        slice(0, len(src)),
        np.concatenate([r.ints for r in rows], axis=1),
        np.concatenate([r.imask for r in rows]),
        strs,
        pl.concat([r.values for r in rows]).rechunk(),
        np.concatenate([r.op_of for r in rows]),
        any_mask,
        int(src[0]) if len(src) and (src == src[0]).all() else src,
        np.concatenate([r.seq for r in rows]),
    )


def meta_frames(meta: list[pl.DataFrame | MetaRows]) -> list[pl.DataFrame]:
    """``meta`` as frames: the :class:`MetaRows` among them as one."""
    rows = [m for m in meta if isinstance(m, MetaRows)]
    return [m for m in meta if isinstance(m, pl.DataFrame)] + ([_meta_frame(rows)] if rows else [])


def _native_frame(
    sl: slice,
    ints: np.ndarray,
    imask: np.ndarray,
    strs: np.ndarray,
    values: pl.Series,
    op_of: np.ndarray,
    any_mask: int,
    src: int | np.ndarray,
    seq: np.ndarray,
    categorical: bool = False,
) -> pl.DataFrame:
    """The RAW_SCHEMA frame of the scanner's output rows ``sl`` (of file ``src``, a constant
    or one per row, lines ``seq``); with ``categorical``, its string columns are
    Categorical (gathered by the scanner's codes: no string is hashed per row). The frame
    never views the scanner's buffers, which are freed once it is built."""
    if sl.stop <= sl.start:
        return pl.DataFrame(schema=RAW_SCHEMA)
    mask = imask[sl]
    all_mask = int(np.bitwise_and.reduce(mask))
    data: dict[str, np.ndarray] = {"__m": mask}
    exprs: dict[str, pl.Expr] = {}
    for k, col in enumerate(NATIVE_INTS):
        bit = 1 << k
        if not any_mask & bit:
            exprs[col] = pl.lit(None, dtype=INT)
            continue
        # a copy: a column passed through, or masked (polars' when/then keeps the values
        # buffer and adds a validity mask), would view, and keep alive, all the buffers
        data[col] = ints[k, sl].copy()
        exprs[col] = (
            pl.col(col) if all_mask & bit else pl.when((pl.col("__m") & bit) != 0).then(pl.col(col))
        )
    if categorical:
        values = values.cast(pl.Categorical)
    for k, col in enumerate(NATIVE_STRS):
        codes = strs[k, sl]
        lo, hi = int(codes.min()), int(codes.max())
        dtype = pl.Categorical() if categorical else RAW_SCHEMA[col]
        if hi < 0:
            exprs[col] = pl.lit(None, dtype=dtype)
        elif lo == hi:  # one value (cat, ph, host hash of a file): a constant
            exprs[col] = pl.lit(values[lo], dtype=dtype)
        else:
            data[col] = codes
            exprs[col] = pl.lit(values if dtype == values.dtype else values.cast(dtype)).gather(
                pl.when(pl.col(col) >= 0).then(pl.col(col)) if lo < 0 else pl.col(col)
            )
    name = strs[NATIVE_STRS.index("name"), sl]
    data["op"] = (
        np.where(name >= 0, op_of[np.maximum(name, 0)], 0).astype(np.int8)
        if len(op_of)
        else np.zeros(len(name), dtype=np.int8)
    )
    data["seq"] = seq
    if isinstance(src, np.ndarray):
        data["src"] = src
    return pl.DataFrame(data).select(
        pl.col("src") if isinstance(src, np.ndarray) else pl.lit(src, dtype=SRC).alias("src"),
        "seq",
        *(exprs[c].alias(c) for c in RAW_SCHEMA if c not in ("src", "seq", "op")),
        "op",
    )
