"""The loader's hook (:func:`canonicalize`): the event table given its roles, DLIO's
rank-numbered processes split by thread (:func:`_rank_pids`), start/stop markers made
events (:func:`marker_spans`), and the loop's epoch, step and sample numbers filled in
(:func:`_fill_loop`); :func:`ensure_roles` for tables built without it. Part of the one
event vocabulary (:mod:`.vocabulary`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from dlreplay.schema import READ_OPS, WRITE_OPS

from .roles import (
    AI_CONVENTIONS,
    BACKWARD,
    CKPT_IO,
    CKPT_LOAD,
    CKPT_SAVE,
    COMPUTE,
    DATA_IO,
    FORWARD,
    ITEM,
    ITEMS,
    LOOP_ROLES,
    OPTIMIZER,
    SAMPLE_READ,
    STEP,
    role_expr,
)
from .steps import epoch_spans

__all__ = [
    "RANK_PIDS_BELOW",
    "RunThreads",
    "canonicalize",
    "ensure_roles",
    "marker_spans",
    "run_threads",
    "thread_firsts",
]


#: Process ids a rank-numbered trace gives its MPI ranks (see :func:`_rank_pids`).
RANK_PIDS_BELOW = 1024


@dataclass(frozen=True)
class RunThreads:
    """What :func:`_rank_pids` reads of a whole run, to split one part of it as the whole:
    ``threads`` (host, pid, tid, ts): each thread of a process id below
    :data:`RANK_PIDS_BELOW` with its first timestamp; ``pid0``: some event has pid 0;
    ``top``: the largest pid, tid or ppid (new ids go above it)."""

    threads: pl.DataFrame
    pid0: bool
    top: int


def thread_firsts(ev: pl.DataFrame, host: str = "host") -> pl.DataFrame:
    """(``host``, pid, tid, ts) of :class:`RunThreads` for the rows of ``ev``: per thread of a
    process id below :data:`RANK_PIDS_BELOW`, its first timestamp (a few rows a process)."""
    return (
        ev.lazy()
        .filter((pl.col("pid") < RANK_PIDS_BELOW) & pl.col("tid").is_not_null())
        .group_by(host, "pid", "tid")
        .agg(pl.col("ts").min())
        .collect()
    )


def run_threads(ev: pl.DataFrame) -> RunThreads:
    """:class:`RunThreads` of a whole table."""
    top = max(
        _int(ev["pid"].max()),
        _int(ev["tid"].max()),
        _int(ev["ppid"].max()) if "ppid" in ev.columns else 0,
    )
    return RunThreads(thread_firsts(ev), bool((ev["pid"] == 0).any()), top)


def _rank_pids(ev: pl.DataFrame, run: RunThreads | None = None) -> tuple[pl.DataFrame, bool]:
    """Give each thread of a rank-numbered process its own pid (DFTracer 1.x Python API).

    pydftracer 1.x initialised with ``process_id=rank`` (as DLIO does) writes the MPI rank
    as ``pid`` in every event, and DLIO's forked reader workers keep writing into the
    rank's file: only the thread id tells the processes apart (a process's main thread id
    is its pid). A trace is rank-numbered when some event has pid 0, which no real
    process has; then every pid below 1024 with no event of its own main thread
    (``tid == pid``) is a rank. Its events get ``pid = tid``, and the threads other than
    the rank's first (the reader workers) get the first thread's id as ``ppid``.

    ``run``: what the whole run holds (:class:`RunThreads`), where ``ev`` is one part of it
    (the spilled loader canonicalises part by part: rank 0's pid 0 lies in its own file);
    default: ``ev``'s own.
    """
    if ev.height == 0 or "tid" not in ev.columns:
        return ev, False
    if run is None:
        if not (ev["pid"] == 0).any():
            return ev, False
        run = run_threads(ev)
    if not run.pid0:
        return ev, False
    th = run.threads
    g = th.group_by("pid").agg((pl.col("tid") == pl.col("pid")).any().alias("own"))
    ranks = g.filter(~pl.col("own"))["pid"]
    if ranks.is_empty():
        return ev, False
    is_rank = pl.col("pid").is_in(ranks.implode())
    threads = th.filter(is_rank)
    # each (host, rank, thread) its own process id: the thread id, unless another rank has a
    # thread of that id too, on this host (the forked reader workers of two DLIO ranks on one
    # node, traced by pydftracer 1.0.2, both wrote tid 22386 at the same time) or another
    # (thread ids are per node): then new ids above every id in the trace
    keys = (
        threads.select("host", "pid", "tid")
        .unique()
        .with_columns((pl.len().over("tid") > 1).alias("__dup"))
        .sort("host", "pid", "tid", nulls_last=True)
    )
    keys = keys.with_columns(
        pl.when(pl.col("__dup"))
        .then(run.top + pl.col("__dup").cast(pl.Int64).cum_sum())
        .otherwise(pl.col("tid"))
        .cast(pl.Int32, strict=False)
        .alias("__new")
    ).drop("__dup")
    # the rank's first thread (of equal first timestamps, the lowest id)
    main = (
        threads.sort("ts", "tid", nulls_last=True)
        .group_by("host", "pid", maintain_order=True)
        .agg(pl.col("tid").first().alias("tid"))
        .join(keys, on=["host", "pid", "tid"], how="left", nulls_equal=True)
        .select("host", "pid", pl.col("__new").alias("__main"))
    )
    ev = ev.join(
        keys, on=["host", "pid", "tid"], how="left", nulls_equal=True, maintain_order="left"
    ).join(main, on=["host", "pid"], how="left", nulls_equal=True, maintain_order="left")
    ev = ev.with_columns(
        pl.when(is_rank & pl.col("tid").is_not_null() & (pl.col("__new") != pl.col("__main")))
        .then(pl.col("__main"))
        .otherwise(pl.col("ppid"))
        .cast(pl.Int32, strict=False)
        .alias("ppid"),
        pl.when(is_rank & pl.col("tid").is_not_null())
        .then(pl.col("__new"))
        .otherwise(pl.col("pid"))
        .cast(pl.Int32, strict=False)
        .alias("pid"),  # thread ids are pid_t too
    ).drop("__main", "__new")
    return ev, True


def _int(x: object) -> int:
    return int(x) if isinstance(x, (int, float)) else 0


def _legacy_steps(ev: pl.DataFrame, role: pl.Series) -> pl.Series:
    """``compute/step`` is a whole training step (STEP), not an optimizer step, in traces of
    dlreplay's format_version 1 and in replays: per process, when the process also has
    plain ``dataloader/fetch`` events and no other ``compute`` events."""
    opt = role == OPTIMIZER
    if not opt.any():
        return role
    info = ev.select("pid", "cat", "name").with_columns(role.alias("__role"))
    plain_fetch = (pl.col("cat") == "dataloader") & (pl.col("name") == "fetch")
    # only the rows either test can be true of (annotations: a tenth of a trace or less)
    per = (
        info.filter(pl.col("__role").is_not_null() | plain_fetch)
        .group_by("pid")
        .agg(
            plain_fetch.any().alias("plain_fetch"),
            pl.col("__role").is_in([COMPUTE, FORWARD, BACKWARD]).any().alias("parent"),
        )
        .filter(pl.col("plain_fetch") & ~pl.col("parent"))
    )
    if per.is_empty():
        return role
    legacy = info.select(
        pl.col("pid").is_in(per["pid"].implode()) & (pl.col("__role") == OPTIMIZER)
    ).to_series()
    return pl.select(pl.when(legacy).then(pl.lit(STEP)).otherwise(role)).to_series().alias("role")


def marker_spans(meta: pl.DataFrame) -> pl.DataFrame:
    """Spans of the start/stop metadata form (``ai.X.start(metadata=True)`` / ``stop``).

    ``meta`` holds DFTracer ``CM`` records with ``a_name`` ``<name>.start`` / ``<name>.end``
    and the time in ``a_value``, and ``pid``, ``tid``, ``src``. The k-th start of a name in
    a process pairs with its k-th end. Returns (src, pid, tid, name, ts, dur).
    """
    schema = pl.Schema(
        {
            "src": pl.UInt32(),
            "pid": pl.Int32(),
            "tid": pl.Int32(),
            "name": pl.String(),
            "ts": pl.Int64(),
            "dur": pl.Int64(),
        }
    )
    if meta.height == 0 or "a_name" not in meta.columns:
        return pl.DataFrame(schema=schema)
    m = (
        meta.filter((pl.col("name") == "CM") & pl.col("a_name").str.contains(r"\.(start|end)$"))
        .select(
            pl.col("src").cast(pl.UInt32),
            pl.col("pid").cast(pl.Int32, strict=False),
            pl.col("tid").cast(pl.Int32, strict=False),
            pl.col("a_name").str.replace(r"\.(start|end)$", "").alias("name"),
            pl.col("a_name").str.ends_with(".start").alias("start"),
            pl.col("a_value").cast(pl.Int64, strict=False).alias("t"),
        )
        .filter(pl.col("t").is_not_null())
    )
    if m.is_empty():
        return pl.DataFrame(schema=schema)
    m = m.sort("t").with_columns(pl.int_range(pl.len()).over("pid", "name", "start").alias("k"))
    starts = m.filter(pl.col("start")).select(
        "src", "pid", "tid", "name", "k", pl.col("t").alias("ts")
    )
    ends = m.filter(~pl.col("start")).select("pid", "name", "k", pl.col("t").alias("end"))
    return (
        starts.join(ends, on=["pid", "name", "k"], how="inner")
        .select("src", "pid", "tid", "name", "ts", (pl.col("end") - pl.col("ts")).alias("dur"))
        .cast(schema)
    )


#: name of a start/stop marker -> (category, role) under the AI conventions
def _marker_role(name: str) -> tuple[str, str] | None:
    for cat, names in AI_CONVENTIONS.items():
        if name in names and cat != "ai_root":
            return cat, names[name]
    return None


def _marker_rows(
    ev: pl.DataFrame, markers: pl.DataFrame, sources: list[str] | None
) -> pl.DataFrame | None:
    """Event rows for marker spans whose role the process has no events of."""
    if markers.is_empty():
        return None
    known: dict[str, tuple[str, str]] = {}
    for n in markers["name"].unique().to_list():
        hit = _marker_role(n)
        if hit is not None:
            known[n] = hit
    if not known:
        return None
    mk = markers.filter(pl.col("name").is_in(list(known))).with_columns(
        pl.col("name")
        .replace_strict({n: c for n, (c, _) in known.items()}, return_dtype=pl.String)
        .alias("cat"),
        pl.col("name")
        .replace_strict({n: r for n, (_, r) in known.items()}, return_dtype=pl.String)
        .alias("role"),
    )
    present = (
        ev.filter(pl.col("role").is_not_null())
        .select("pid", pl.col("role").cast(pl.String))
        .unique()
    )
    mk = mk.join(present, on=["pid", "role"], how="anti")
    if mk.is_empty():
        return None
    hosts = ev.group_by("pid").agg(
        pl.col("host").drop_nulls().first(), pl.col("ppid").drop_nulls().first()
    )
    mk = mk.join(hosts, on="pid", how="left")
    src = (
        pl.Series(sources, dtype=pl.String).gather(mk["src"])
        if sources
        else pl.Series([None] * mk.height, dtype=pl.String)
    )
    rows = mk.with_columns(src.alias("source")).select(
        [
            pl.col(c) if c in mk.columns or c == "source" else pl.lit(None).alias(c)
            for c in ev.columns
        ]
        if "source" in ev.columns
        else [pl.col(c) if c in mk.columns else pl.lit(None).alias(c) for c in ev.columns]
    )
    return rows.cast(ev.schema)  # type: ignore[arg-type]


def canonicalize(
    ev: pl.DataFrame,
    markers: pl.DataFrame | None = None,
    sources: list[str] | None = None,
    run: RunThreads | None = None,
) -> tuple[pl.DataFrame, bool]:
    """The loader's hook: the event table with ``role`` and the loop's numbers filled in.

    * ``role`` for every row (:func:`classify`; compute/step of old dlreplay traces per
      :func:`_legacy_steps`);
    * rank-numbered processes split by thread (:func:`_rank_pids`; ``run``: what the whole
      run holds, where ``ev`` is one part of it);
    * spans of start/stop metadata markers (``markers``, from :func:`marker_spans`) added
      as events, for roles the process has no events of (``sources[src]`` names their file);
    * ``epoch`` and ``step`` where a consumer's loop event has none (:func:`_fill_loop`),
      and the ``sample_index`` of item events from the reader call inside them.

    Returns (table, processes_changed): the second is True when pids were rewritten,
    events added, or items or checkpoints spelled otherwise than by dlreplay's capture, so
    per-process tables computed from the spellings before the hook are stale.
    """
    # ids and loop counters in the event table's 32-bit types (a table built by hand or by an
    # older dlreplay has 64-bit ones): the joins below match them by type
    narrow = {
        c: dt
        for c, dt in _NEEDED.items()
        if dt == pl.Int32() and c in ev.columns and ev.schema[c] != dt
    }
    if narrow:
        ev = ev.with_columns(pl.col(c).cast(dt, strict=False) for c, dt in narrow.items())
    ev, changed = _rank_pids(ev, run)
    role = role_expr(ev)
    role = _legacy_steps(ev, role)
    ev = ev.with_columns(role.alias("role"))
    if markers is not None and markers.height:
        extra = _marker_rows(ev, markers, sources)
        if extra is not None and extra.height:
            ev = pl.concat([ev, extra]).sort("ts", nulls_last=True, maintain_order=True)
            changed = True
    if ev["role"].null_count() < ev.height:
        ev = _fill_loop(ev)
        relabeled = _loads_in_items(ev)
        if relabeled is not None:
            ev, changed = relabeled, True
        # the loader's per-process table counts items and checkpoints by dlreplay's spellings
        changed = changed or bool(
            ev.select(
                (
                    pl.col("role").is_in([ITEM, ITEMS, CKPT_SAVE, CKPT_LOAD, CKPT_IO])
                    & ~(
                        ((pl.col("cat") == "data") & pl.col("name").is_in(["item", "items"]))
                        | (
                            (pl.col("cat") == "checkpoint")
                            & pl.col("name").is_in(["save", "load", "capture", "restart"])
                        )
                    )
                ).any()
            ).item()
        )
    return ev, changed


def _loads_in_items(ev: pl.DataFrame) -> pl.DataFrame | None:
    """``ev`` with the checkpoint loads made inside a sample's item event (same process) given
    the role of the sample's data I/O: a Dataset whose samples are ``torch.save``\\ d files
    read by ``torch.load`` in ``__getitem__`` loads no checkpoint (its files read as
    checkpoints, the trace had no dataset). None where no load is inside an item."""
    loads = ev.select(pl.arg_where(pl.col("role") == CKPT_LOAD).alias("__r")).to_series()
    if loads.is_empty():
        return None
    items = (
        ev.filter(pl.col("role") == ITEM)
        .select("pid", pl.col("ts").alias("i_ts"), (pl.col("ts") + pl.col("dur")).alias("i_end"))
        .sort("i_ts")
    )
    if items.is_empty():
        return None
    inside = (
        ev.select("pid", "ts")[loads]
        .insert_column(0, loads)
        .sort("ts")
        .join_asof(
            items,
            left_on="ts",
            right_on="i_ts",
            by="pid",
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("i_end").is_not_null() & (pl.col("ts") <= pl.col("i_end")))["__r"]
    )
    if inside.is_empty():
        return None
    role = ev["role"].cast(pl.String).scatter(inside, DATA_IO).cast(ev.schema["role"])
    return ev.with_columns(role.alias("role"))


def _fill_loop(ev: pl.DataFrame) -> pl.DataFrame:
    """Epoch and step numbers where a consumer loop event has none; item sample indices.

    Loop events (:data:`LOOP_ROLES`) without an epoch get the epoch of the span they fall
    in (:func:`epoch_spans`; before the first span: the first), and a step number: their
    order among the process's events of that role in that epoch. Item events without a
    sample index take the one of the first reader call inside them (DLIO's
    ``read_index``, which has ``image_idx``). Checkpoint events without a byte count
    (DLIO's) get the bytes of the POSIX writes (saves) or reads (loads) inside them.
    """
    # only the columns read here, of the annotation rows, gathered by their row numbers: a
    # row index of the whole table and all its columns raised the load's peak
    rows = ev.select(pl.arg_where(pl.col("role").is_not_null()).alias("__r")).to_series()
    ann = ev.select("pid", "ts", "dur", "role", "epoch", "sample_index", "size")[
        rows
    ].insert_column(0, rows)
    # only the columns that change are replaced (taking one out of the table would turn a
    # column of one value, all null, into a value per row)
    filled: dict[str, pl.Series] = {}
    filled.update(_fill_steps(ev, ann))
    filled.update(_fill_samples(ev, ann))
    filled.update(_fill_checkpoint_bytes(ev, ann))
    return ev.with_columns(s.alias(c) for c, s in filled.items()) if filled else ev


def _fill_steps(ev: pl.DataFrame, ann: pl.DataFrame) -> dict[str, pl.Series]:
    """:func:`_fill_loop`'s ``epoch`` and ``step`` columns of ``ev`` (none when nothing is
    filled): the loop events of ``ann`` (its annotation rows, ``__r`` their row numbers in
    ``ev``) without an epoch numbered by the epoch span they fall in."""
    filled: dict[str, pl.Series] = {}
    spans = epoch_spans(ann)
    todo = ann.filter(pl.col("role").is_in(LOOP_ROLES) & pl.col("epoch").is_null())
    if todo.height and spans.height:
        sp = spans.select("pid", pl.col("ts").alias("e_ts"), pl.col("epoch").alias("e"))
        first = sp.group_by("pid").agg(pl.col("e").sort_by("e_ts").first().alias("e0"))
        got = (
            todo.select("__r", "pid", "ts", "role")
            .sort("ts")
            .join_asof(
                sp.sort("e_ts"),
                left_on="ts",
                right_on="e_ts",
                by="pid",
                strategy="backward",
                check_sortedness=False,
            )
            .join(first, on="pid", how="left")
            .with_columns(pl.coalesce("e", "e0").alias("e"))
            .filter(pl.col("e").is_not_null())
            .with_columns(pl.int_range(pl.len()).over("pid", "e", "role").alias("k"))
        )
        if got.height:
            idx = got["__r"]
            filled["epoch"] = ev["epoch"].scatter(idx, got["e"])
            filled["step"] = ev["step"].scatter(idx, got["k"])
    return filled


def _fill_samples(ev: pl.DataFrame, ann: pl.DataFrame) -> dict[str, pl.Series]:
    """:func:`_fill_loop`'s ``sample_index`` column of ``ev`` (none when nothing is filled):
    item events of ``ann`` without one take the first reader call's inside them."""
    filled: dict[str, pl.Series] = {}
    items = ann.filter((pl.col("role") == ITEM) & pl.col("sample_index").is_null())
    if items.height:
        reads = (
            ann.filter((pl.col("role") == SAMPLE_READ) & pl.col("sample_index").is_not_null())
            .select("pid", pl.col("ts").alias("r_ts"), pl.col("sample_index").alias("r_idx"))
            .sort("r_ts")
        )
        if reads.height:
            got = (
                items.select(
                    "__r", "pid", "ts", (pl.col("ts") + pl.col("dur").fill_null(0)).alias("end")
                )
                .sort("ts")
                .join_asof(
                    reads,
                    left_on="ts",
                    right_on="r_ts",
                    by="pid",
                    strategy="forward",
                    check_sortedness=False,
                )
                .filter(pl.col("r_ts").is_not_null() & (pl.col("r_ts") <= pl.col("end")))
            )
            if got.height:
                filled["sample_index"] = ev["sample_index"].scatter(got["__r"], got["r_idx"])
    return filled


def _fill_checkpoint_bytes(ev: pl.DataFrame, ann: pl.DataFrame) -> dict[str, pl.Series]:
    """:func:`_fill_loop`'s ``size`` column of ``ev`` (none when nothing is filled):
    checkpoint events of ``ann`` without a byte count get the POSIX transfers' inside them."""
    filled: dict[str, pl.Series] = {}
    ckpts = ann.filter(pl.col("role").is_in([CKPT_SAVE, CKPT_LOAD]) & pl.col("size").is_null())
    if ckpts.height:
        # bytes of a checkpoint that names none: the POSIX transfers inside it, in its process
        xfer = (
            ev.filter(
                pl.col("pid").is_in(ckpts["pid"].unique().implode())
                & pl.col("name").is_in(READ_OPS + WRITE_OPS)
                & (pl.col("size") > 0)
            )
            .select(
                "pid",
                pl.col("ts").alias("x_ts"),
                pl.col("name").is_in(WRITE_OPS).alias("w"),
                "size",
            )
            .sort("x_ts")
        )
        if xfer.height:
            spans = ckpts.select(
                "__r",
                "pid",
                pl.col("ts").alias("c_ts"),
                (pl.col("ts") + pl.col("dur").fill_null(0)).alias("c_end"),
                (pl.col("role") == CKPT_SAVE).alias("w"),
            ).sort("c_ts")
            got = (
                xfer.join_asof(
                    spans,
                    left_on="x_ts",
                    right_on="c_ts",
                    by=["pid", "w"],
                    strategy="backward",
                    check_sortedness=False,
                )
                .filter(pl.col("__r").is_not_null() & (pl.col("x_ts") <= pl.col("c_end")))
                .group_by("__r")
                .agg(pl.col("size").sum())
            )
            if got.height:
                filled["size"] = ev["size"].scatter(got["__r"], got["size"])
    return filled


#: Columns :func:`canonicalize` reads, with their types (see dlreplay.schema.EVENT_SCHEMA).
_NEEDED: dict[str, pl.DataType] = {
    "pid": pl.Int32(),
    "tid": pl.Int32(),
    "ppid": pl.Int32(),
    "host": pl.String(),
    "ts": pl.Int64(),
    "dur": pl.Int64(),
    "cat": pl.String(),
    "name": pl.String(),
    "file": pl.String(),
    "size": pl.Int64(),
    "epoch": pl.Int32(),
    "step": pl.Int32(),
    "batch_size": pl.Int64(),
    "sample_index": pl.Int64(),
}


def ensure_roles(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` with roles: as loaded (the loader adds them), or classified now for a table
    built by hand or by an older dlreplay (no ``role`` column, or one left all null)."""
    if "role" in events.columns and (
        events.height == 0 or events["role"].null_count() < events.height
    ):
        return events
    if (
        "role" in events.columns
        and not events.select(
            pl.col("cat").is_not_null() & ~pl.col("cat").is_in(["POSIX", "STDIO", "dftracer"])
        )
        .to_series()
        .any()
    ):
        return events
    base = events.drop("role", strict=False)
    cols = base.columns
    missing = [c for c in _NEEDED if c not in cols]
    if missing:  # a partial table: the columns the hook reads, null, dropped again after
        base = base.with_columns(pl.lit(None, dtype=_NEEDED[c]).alias(c) for c in missing)
    return canonicalize(base)[0].select([*cols, "role"])
