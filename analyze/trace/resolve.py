"""Resolve one file's compact rows into a :class:`~.shapes.TracePart` (:func:`resolve_part`):
the time unit (``CM``), each process's ppid, working directory and host (its ``start`` and
``HH`` records), the offsets (:mod:`.offsets`) and the rows' (``ts``, file, line) order
(:func:`_output_order`, a packed sort key where it fits).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from dlreplay.allocator import release_free_memory
from dlreplay.schema import (
    CAT_DATA,
)

from . import shapes
from .batches import Compacted
from .compact import F63, MAX_DUR_US
from .counts import row_class
from .offsets import file_offsets, unname_stray
from .shapes import (
    COUNTS_SCHEMA,
    I32,
    MARKER_SCHEMA,
    NULL_DUR,
    PART_SCHEMA,
    PROCESS_SCHEMA,
    SRC,
    count_problem,
    int_stat,
)

__all__ = ["gather_columns", "lookup", "resolve_part", "row_index"]

_TIME_SCALE = {"US": 1.0, "NS": 1e-3, "MS": 1e3, "S": 1e6, "SEC": 1e6}


#: Columns gathered together into output order (polars gathers the columns of one call in
#: parallel); each group's source columns are dropped before the next, so that the rows
#: are never held twice. 3: with the columns of one value constants (which a gather skips),
#: faster than 2 at the same peaks (measured: benchmarks/RESULTS.md).
_GATHER_GROUP = 3


#: Bytes freed by a step of the merge above which the allocators' free pages are returned
#: (:func:`~dlreplay.allocator.release_free_memory`, a few ms) before the next step.
_RELEASE_BYTES = 32 << 20


#: Rows of a part below which its resolve returns nothing between its steps (they free
#: some 30 bytes a row: the sort key, the offsets' inputs, the dropped columns).
_RELEASE_ROWS = _RELEASE_BYTES // 32


def resolve_part(
    compacted: Compacted,
    problems: dict[int, list[str]],
    *,
    alone: bool = False,
    ordered: bool = False,
) -> tuple[pl.DataFrame, np.ndarray | None, pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(events, order, processes, fh, counts, markers) of a :class:`TracePart` from the compact rows of whole files.
    ``problems``: each file's (``src``) problems, to which the values read as null here are
    added (durations, :func:`_apply_time_metric`).

    Everything that one file decides is resolved here: the time unit (``CM``), each
    process's ppid, working-directory hash and host (its ``start`` and ``HH`` records),
    and the offsets, reconstructed per (trace file, pid, POSIX or STDIO, file hash) in
    (``ts``, line) order; ``order`` lists the rows in (``ts``, file, line) order (they stay
    in their files' order: the run's merge gathers them once), or with ``ordered`` the rows
    are gathered into that order here and ``order`` is None.
    ``alone``: no other thread of the process is parsing (:class:`_Parsing`; a load on one
    thread, the byte ranges of one large file resolved after all of them were parsed, the
    last group) and the part has :data:`_RELEASE_ROWS` rows or more: what the sort keys,
    the offsets' inputs and the dropped columns held is returned to the system between
    the steps, lowering the load's peak. A part resolved while other threads parse does
    not: they would fault their pages in again (slower). Nor does a smaller part: it
    returns little, and the pages other steps had freed are faulted in again, for the
    same peak (measured: benchmarks/RESULTS.md).
    """
    rows, meta, starts, hosts = compacted.pop()
    meta = meta.sort("src", "seq")
    fh, markers = _file_records(meta)
    if rows.height == 0:
        return (
            pl.DataFrame(schema=PART_SCHEMA),
            None,
            pl.DataFrame(schema=PROCESS_SCHEMA),
            fh,
            pl.DataFrame(schema=COUNTS_SCHEMA),
            markers,
        )
    release = alone and rows.height >= _RELEASE_ROWS
    rows = _apply_time_metric(rows, meta, problems)
    every, pidx = _process_keys(rows)
    processes = _process_table(every, meta, starts, hosts)
    rows = rows.with_columns(pidx.alias("__p"))
    order = _output_order(rows)
    if release:
        release_free_memory(
            keep_large=True
        )  # the sort keys (numpy's, in the C heap once glibc's mmap threshold has grown)
    offset, stray = file_offsets(rows, order, release=release)
    if stray is not None:
        rows = unname_stray(rows, stray, problems)
    # the rows stay in their files' order, their output order beside them: the run's merge
    # gathers every part's columns once, into the run's order (a gather here as well cost
    # every column of a part a copy)
    held = [rows.select(c for c in PART_SCHEMA if c != "offset")]
    del rows
    if release:
        release_free_memory(keep_large=True)  # the columns only the order and the offsets needed
    if ordered:  # gathered here, the source columns freed as they go
        # (the offsets, in the rows' order, gathered on their own)
        events = gather_columns(held, [order], [c for c in PART_SCHEMA if c != "offset"])
        events.insert_column(
            list(PART_SCHEMA).index("offset"), offset.gather(row_index(order)).alias("offset")
        )
        return events, None, processes, fh, _part_counts(events), markers
    # one chunk per column (the merge concatenates the parts' columns, whose chunk lengths
    # differ otherwise, and polars' gather from one chunk is several times as fast), a few columns
    # at a time, each group's source chunks freed before the next is copied
    events = gather_columns(held, None, [c for c in PART_SCHEMA if c != "offset"])
    events.insert_column(list(PART_SCHEMA).index("offset"), offset.alias("offset"))
    return events, _narrow_order(order), processes, fh, _part_counts(events), markers


def _file_records(meta: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(fh, markers) of :func:`resolve_part` from its metadata rows ``meta`` (sorted by file
    and line): the file-hash records (``FH``: hash, name, src, seq, pid; the first of each
    hash) and the start/stop markers (``CM`` records ``X.start``/``X.end``)."""
    fh = (
        meta.filter((pl.col("name") == "FH") & pl.col("a_value").is_not_null())
        .select(
            pl.col("a_value").alias("hash"),
            pl.col("a_name").alias("name"),
            "src",
            "seq",
            pl.col("pid").cast(I32, strict=False),
        )
        .unique(subset="hash", keep="first", maintain_order=True)
    )
    markers = meta.filter(
        (pl.col("name") == "CM") & pl.col("a_name").str.contains(r"\.(start|end)$")
    ).select(list(MARKER_SCHEMA))
    return fh, markers


def _narrow_order(order: np.ndarray) -> np.ndarray:
    """A row order as 32-bit indices where they fit (half the memory of numpy's argsort)."""
    if len(order) < (1 << 32) and order.dtype != np.uint32:
        return order.astype(np.uint32)
    return order


def gather_columns(
    held: list[pl.DataFrame],
    order: np.ndarray | list[np.ndarray | None] | None,
    columns: Sequence[str],
) -> pl.DataFrame:
    """The ``columns`` of the frame in ``held`` (taken out of the list) in the row order
    ``order`` (None: as they are; a list holding the order is emptied once it is turned
    into polars' index), one chunk each.

    Gathers a few columns at a time and drops them from the frame before the next, so
    the rows are not held twice (when no one else holds the frame: hence the lists)."""
    frame = held.pop()
    rows = order.pop() if isinstance(order, list) else order
    del order
    idx = None if rows is None else row_index(rows)
    del rows
    # frames, not series: a column of one value (all null: the annotation fields of a
    # trace without annotations) stays a constant, of no size, and its gather costs nothing
    # (its Series would be materialised, a value per row)
    out: list[pl.DataFrame] = []
    todo = list(columns)
    while todo:
        group, todo = todo[:_GATHER_GROUP], todo[_GATHER_GROUP:]
        # one chunk first: a gather from the many chunks of a part's batches costs more than
        # a copy and a gather from one
        sub = frame.select(group).rechunk()
        frame = frame.drop(group)
        out.append(sub if idx is None else sub[idx])
        freed = sub.estimated_size()
        del sub
        if freed >= _RELEASE_BYTES:
            release_free_memory(
                keep_large=True
            )  # the source columns, before the next group is built in another arena
    return pl.concat(out, how="horizontal") if out else pl.DataFrame()


def _part_counts(events: pl.DataFrame) -> pl.DataFrame:
    """The summary's per-process counts of a part's rows before their files are known
    (:data:`COUNTS_SCHEMA`): rows (``n``) and bytes (``b``) per (file hash, path argument,
    process, :func:`~.counts.row_class`, ``item`` event)."""
    item = ((pl.col("cat") == CAT_DATA) & pl.col("name").is_in(["item", "items"])).fill_null(False)
    # grouped by name and category codes first (the classes are computed on the groups),
    # on one packed integer key when the codes fit in 64 bits (twice as fast as five keys)
    keys = ("fhash", "__path", "__p", "name", "cat")
    tops = events.select(*(pl.col(c).to_physical().max().alias(c) for c in keys)).row(0)
    bits = [(int(m) + 2).bit_length() if m is not None else 1 for m in tops]  # + a value for null
    if events.height and sum(bits) <= 64:
        # packed in place in one numpy array, a key's 32-bit codes at a time (as polars
        # expressions, each step was a new 64-bit column)
        packed = np.zeros(events.height, dtype=np.uint64)
        for c, nbits, top in zip(keys, bits, tops, strict=True):
            # (through a select: events[c] would materialise a column of one value, and keep it)
            codes = events.select(pl.col(c).to_physical()).to_series()
            if codes.null_count():
                codes = codes.fill_null((int(top) + 1) if top is not None else 0)
            packed <<= np.uint64(nbits)
            packed |= codes.to_numpy()
            del codes
        first = (
            events.with_columns(pl.Series("__k", packed))
            .group_by("__k")
            .agg(
                *(pl.col(c).first() for c in keys),
                pl.len().cast(pl.Int64).alias("n"),
                pl.col("size").fill_null(0).sum().alias("b"),
            )
            .drop("__k")
        )
        del packed
    else:
        first = events.group_by(*keys).agg(
            pl.len().cast(pl.Int64).alias("n"), pl.col("size").fill_null(0).sum().alias("b")
        )
    return (
        first.group_by("fhash", "__path", "__p", row_class().alias("cls"), item.alias("item"))
        .agg(pl.col("n").sum(), pl.col("b").sum())
        .cast(pl.Schema(COUNTS_SCHEMA))
    )  # type: ignore[arg-type]


def lookup(key: pl.Expr, keys, values, dtype) -> pl.Expr:
    """``key`` mapped through (keys -> values), null when absent."""
    keys = keys.to_list() if isinstance(keys, pl.Series) else list(keys)
    values = values.to_list() if isinstance(values, pl.Series) else list(values)
    if not keys:
        return pl.lit(None, dtype=dtype)
    return key.replace_strict(keys, values, default=None, return_dtype=dtype)


def _hash_map(meta: pl.DataFrame, kind: str, by: Sequence[str] = ()) -> pl.DataFrame:
    """(*by, hash, name, src, pid) of ``FH`` or ``HH`` records, one per (*by, hash): the
    first in (file, line) order (``meta`` is sorted so)."""
    return (
        meta.filter((pl.col("name") == kind) & pl.col("a_value").is_not_null())
        .select(pl.col("a_value").alias("hash"), pl.col("a_name").alias("name"), "src", "pid")
        .unique(subset=[*by, "hash"], keep="first", maintain_order=True)
    )


def _process_keys(ev: pl.DataFrame) -> tuple[pl.DataFrame, pl.Expr]:
    """The (src, pid) pairs of ``ev`` (in no particular order) and an expression mapping each
    row of ``ev`` to its pair's index (UInt32)."""
    smin, smax = int_stat(ev["src"].min()), int_stat(ev["src"].max())
    pmin, pmax = int_stat(ev["pid"].min()), int_stat(ev["pid"].max())
    if smin == smax and pmin == pmax and pmin is not None and ev["pid"].null_count() == 0:
        # one process (the common case of a part of one file): no per-row lookup
        every = pl.DataFrame({"src": [smin], "pid": [pmin]}, schema={"src": SRC, "pid": I32})
        return every, pl.lit(0, dtype=pl.UInt32)
    if pmin is not None and pmax is not None and 0 <= pmin and ev["pid"].null_count() == 0:
        packed = pl.col("src").cast(pl.Int64) * (1 << 32) + pl.col("pid")
        keys = ev.select(packed.unique().alias("__k"))["__k"]
        every = pl.DataFrame(
            {"src": (keys // (1 << 32)).cast(SRC), "pid": (keys % (1 << 32)).cast(I32)}
        )
        return every, lookup(packed, keys, range(keys.len()), pl.UInt32)
    every = ev.select("src", "pid").unique()  # negative or null pids: a struct key
    idx = pl.struct("src", "pid").replace_strict(
        every.to_struct().to_list(), range(every.height), default=None, return_dtype=pl.UInt32
    )
    return every, idx


def _process_table(
    every: pl.DataFrame, meta: pl.DataFrame, starts: pl.DataFrame, hosts: pl.DataFrame
) -> pl.DataFrame:
    """Per (src, pid) of ``every`` (same order): ppid, cwd hash (``start`` record), host
    (HH-resolved host hash).

    Everything comes from the process's own trace file; "first" is in line order.
    """
    key = ["src", "pid"]
    first = (
        starts.sort("src", "seq")
        .group_by(key, maintain_order=True)
        .agg(
            pl.col("ppid").drop_nulls().first(),
            pl.col("cwd").drop_nulls().first().alias("cwdhash"),
            pl.col("hhash").drop_nulls().first().alias("h1"),
        )
    )
    # the first host hash of the metadata records, else (rare) of the events, in line order
    found = (
        meta.filter(pl.col("hhash").is_not_null())
        .select("src", pl.col("pid").cast(I32, strict=False), "hhash")
        .group_by(key, maintain_order=True)
        .agg(pl.col("hhash").first().alias("h2"))
    )
    missing = every.join(found, on=key, how="anti")
    if missing.height:
        found = pl.concat(
            [
                found,
                hosts.join(missing, on=key, how="semi")
                .sort("seq")
                .group_by(key, maintain_order=True)
                .agg(pl.col("hhash").first().alias("h2")),
            ]
        )
    hh = _hash_map(meta, "HH", ["src"]).select("src", "hash", pl.col("name").alias("__hname"))
    table = (
        every.join(first, on=key, how="left", maintain_order="left", nulls_equal=True)
        .join(found, on=key, how="left", maintain_order="left", nulls_equal=True)
        .with_columns(pl.coalesce("h1", "h2").alias("__hhash"))
        .join(
            hh,
            left_on=["src", "__hhash"],
            right_on=["src", "hash"],
            how="left",
            maintain_order="left",
        )
    )
    return table.select(
        "src",
        "pid",
        pl.col("ppid").cast(I32, strict=False),
        "cwdhash",
        pl.coalesce("__hname", "__hhash").alias("host"),
    ).cast(pl.Schema(PROCESS_SCHEMA))  # type: ignore[arg-type]


def _apply_time_metric(
    ev: pl.DataFrame, meta: pl.DataFrame, problems: dict[int, list[str]]
) -> pl.DataFrame:
    """Convert ts/dur to µs in files whose (first) ``CM`` time_metric is not ``US`` (a
    time beyond Int64 in µs is clipped to it); then a duration beyond
    ±:data:`MAX_DUR_US` reads as null, counted in ``problems[src]``."""
    cm = (
        meta.filter((pl.col("name") == "CM") & (pl.col("a_name") == "time_metric"))
        .group_by("src", maintain_order=True)
        .agg(pl.col("a_value").first())
    )
    factors = {src: _TIME_SCALE.get((unit or "US").upper(), 1.0) for src, unit in cm.iter_rows()}
    scaled = {src: f for src, f in factors.items() if f != 1.0}
    if scaled:
        factor = pl.col("src").replace_strict(
            list(scaled), list(scaled.values()), default=None, return_dtype=pl.Float64
        )
        ev = ev.with_columns(
            pl.when(factor.is_not_null())
            .then((pl.col(c) * factor).round().clip(-F63, F63).cast(pl.Int64))
            .otherwise(pl.col(c))
            .alias(c)
            for c in ("ts", "dur")
        )
    lo, hi = ev.select(pl.col("dur").min().alias("lo"), pl.col("dur").max().alias("hi")).row(0)
    if (lo is None or lo >= -MAX_DUR_US) and (hi is None or hi <= MAX_DUR_US):
        return ev
    odd = ~pl.col("dur").is_between(-MAX_DUR_US, MAX_DUR_US)
    for src, n in ev.filter(odd).group_by("src").len().sort("src").iter_rows():
        if src in problems:
            count_problem(problems[src], n, NULL_DUR)
    return ev.with_columns(pl.when(odd).then(None).otherwise(pl.col("dur")).alias("dur"))


#: Rows of the sort key built at a time (:func:`_output_order`).
_KEY_STEP = 1 << 18


def _output_order(ev: pl.DataFrame) -> np.ndarray:
    """Row indices of ``ev`` in output order: by ``ts`` (null last), then ``src``, then ``seq``.

    (src, seq) is unique per row. When (ts, src, seq) packs into one non-negative Int64,
    numpy argsorts the packed keys (its stable sort merges the runs the rows already
    come in: each layout group is in line order); otherwise a three-key argsort. The
    ``seq`` of a byte range's rows (range ``k`` above bit 32, plus the line in the range)
    packs as ``k`` above as many bits as the longest range's lines need. The key is
    built :data:`_KEY_STEP` rows at a time from slices of the columns (views of polars'
    buffers within a chunk): one array of 8 B/event besides the argsort's. Whole-column
    copies of ``ts`` and ``seq`` and their temporaries took most of its time and page
    faults (measured: benchmarks/RESULTS.md).
    """
    tmin, tmax = int_stat(ev["ts"].min()), int_stat(ev["ts"].max())
    src_max = int_stat(ev["src"].max()) or 0
    b_src = max(src_max, 1).bit_length()
    seq_max, seq_min = int_stat(ev["seq"].max()) or 0, int_stat(ev["seq"].min()) or 0
    n = ev.height
    ts_s, seq_s, src_s = ev["ts"], ev["seq"], ev["src"]
    steps = [(at, min(_KEY_STEP, n - at)) for at in range(0, n, _KEY_STEP)]
    b_line = 0  # ranges: bits of the line within a range (0: seq packs as it is)
    if seq_max >> 32 and seq_min >= 0:
        low = max(
            (int((seq_s.slice(at, m).to_numpy() & 0xFFFFFFFF).max()) for at, m in steps), default=0
        )
        b_line = max(low, 1).bit_length()
        b_seq = (seq_max >> 32).bit_length() + b_line
    else:
        b_seq = max(seq_max, 1).bit_length()
    span = 1 if tmin is None or tmax is None else tmax - tmin + 2  # +1 for null ts
    if span.bit_length() + b_src + b_seq > shapes.PACK_BITS or seq_min < 0:
        order = ev.select(pl.arg_sort_by(pl.col("ts").fill_null((tmax or 0) + 1), "src", "seq"))
        return order.to_series().to_numpy().astype(np.int64)
    null_ts = (tmax + 1) if tmax is not None else 0
    key = np.empty(n, dtype=np.int64)
    for at, m in steps:
        out = key[at : at + m]
        t = ts_s.slice(at, m)
        np.subtract((t.fill_null(null_ts) if t.null_count() else t).to_numpy(), tmin or 0, out=out)
        out <<= b_src + b_seq
        if src_max:  # (a part of one file, src 0, adds nothing)
            out |= src_s.slice(at, m).to_numpy().astype(np.int64) << b_seq
        seq = seq_s.slice(at, m).to_numpy()
        if b_line:
            out |= (seq >> 32) << b_line
            out |= seq & 0xFFFFFFFF
        else:
            out |= seq
    return np.argsort(key, kind="stable")


def row_index(rows: np.ndarray) -> pl.Series:
    """``rows`` as a polars gather index: UInt32 (polars' own index type) when it fits; an
    Int64 index is converted and bounds-checked again for every column (13 columns of
    2.1 M rows: 73 vs 52 ms)."""
    return pl.Series(rows.astype(np.uint32, copy=False) if len(rows) < (1 << 32) else rows)
