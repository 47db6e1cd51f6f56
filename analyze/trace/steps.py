"""The training loop read from the roles: one row per epoch of each consumer
(:func:`epoch_spans`) and one per training step (:func:`training_steps`: data wait,
compute, checkpoint and other time, whichever spelling gave them), and the events of
evaluation passes (:func:`evaluation_phase`). Times are microseconds (as in the event
table). Part of the one event vocabulary (:mod:`.vocabulary`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from .roles import CKPT_SAVE, COMPUTE, EPOCH, EVALUATE, FETCH, STEP, TRAIN

__all__ = [
    "STEP_SCHEMA",
    "epoch_spans",
    "evaluation_phase",
    "training_step_count",
    "training_steps",
    "unmeasured_loop_events",
]


def unmeasured_loop_events(events: pl.DataFrame, pid: int | None = None) -> int:
    """Training-loop events (fetch waits, loop bodies, compute; of process ``pid`` alone
    where given) whose duration is unknown: read as null at load, being negative or
    impossible (:mod:`.plausible`). The loop's times would take them as 0 s: whatever
    reports data wait, compute or AU refuses to measure them where this is not 0."""
    if "role" not in events.columns:
        return 0
    loop = pl.col("role").is_in([FETCH, STEP, COMPUTE]) & pl.col("dur").is_null()
    if pid is not None:
        loop = loop & (pl.col("pid") == pid)
    return int(events.select(loop.fill_null(False).sum()).item())


def _spans(loop: pl.DataFrame, role: str) -> pl.DataFrame:
    return loop.filter(pl.col("role") == role).select(
        "pid",
        pl.col("ts").alias("s_ts"),
        (pl.col("ts") + pl.col("dur").fill_null(0)).alias("s_end"),
        pl.col("epoch").alias("s_epoch"),
    )


def epoch_spans(events: pl.DataFrame) -> pl.DataFrame:
    """One row per epoch of each consumer: (pid, epoch, ts, end, basis) in µs, epochs 0-based.

    From ``epoch`` events; else from training phases (DLIO writes one ``_train`` per epoch)
    when a process has more than one, or one and no epoch numbers on its loop events;
    else from the loop events' epoch numbers (first event to last end). ``events`` need
    only the annotation rows (with ``role``).
    """
    schema = {
        "pid": pl.Int32,
        "epoch": pl.Int32,
        "ts": pl.Int64,
        "end": pl.Int64,
        "basis": pl.String,
    }
    ann = events.filter(pl.col("role").is_not_null())
    if ann.is_empty():
        return pl.DataFrame(schema=schema)
    ep = _numbered(_spans(ann, EPOCH))
    have = ep["pid"].unique()
    tr = _numbered(_spans(ann.filter(~pl.col("pid").is_in(have.implode())), TRAIN))
    loop = ann.filter(pl.col("role").is_in([FETCH, STEP, COMPUTE]))
    numbered = (
        loop.filter(pl.col("epoch").is_not_null())
        .group_by("pid")
        .agg(pl.col("epoch").n_unique().alias("n"))
    )
    # a single training phase is the whole run when the loop numbers several epochs itself
    multi = numbered.filter(pl.col("n") > 1)["pid"]
    tr = (
        tr.join(tr.group_by("pid").len(), on="pid")
        .filter((pl.col("len") > 1) | ~pl.col("pid").is_in(multi.implode()))
        .drop("len")
    )
    have = pl.concat([have, tr["pid"].unique()])
    by_loop = (
        loop.filter(pl.col("epoch").is_not_null() & ~pl.col("pid").is_in(have.implode()))
        .group_by("pid", "epoch")
        .agg(
            pl.col("ts").min().alias("s_ts"),
            (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("s_end"),
        )
    )
    parts = [
        ep.with_columns(pl.lit("epoch events").alias("basis")),
        tr.with_columns(pl.lit("training phases").alias("basis")),
        by_loop.select("pid", "epoch", "s_ts", "s_end", pl.lit("loop events").alias("basis")),
    ]
    out = pl.concat(
        [
            p.select(
                "pid", "epoch", pl.col("s_ts").alias("ts"), pl.col("s_end").alias("end"), "basis"
            ).cast(schema)  # type: ignore[arg-type]
            for p in parts
        ]
    )
    return out.sort("pid", "ts")


def _numbered(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans with ``epoch``: their own numbers rebased to 0 when every span has one, else their order."""
    if spans.is_empty():
        return spans.select("pid", pl.col("s_epoch").alias("epoch"), "s_ts", "s_end")
    s = spans.sort("pid", "s_ts").with_columns(pl.int_range(pl.len()).over("pid").alias("__k"))
    own = s.group_by("pid").agg(
        pl.col("s_epoch").null_count().alias("nulls"),
        pl.col("s_epoch").n_unique().alias("distinct"),
        pl.len().alias("n"),
    )
    ok = own.filter((pl.col("nulls") == 0) & (pl.col("distinct") == pl.col("n")))["pid"]
    epoch = (
        pl.when(pl.col("pid").is_in(ok.implode()))
        .then(pl.col("s_epoch") - pl.col("s_epoch").min().over("pid"))
        .otherwise(pl.col("__k"))
    )
    return s.select("pid", epoch.cast(pl.Int32).alias("epoch"), "s_ts", "s_end")


STEP_SCHEMA = {
    "pid": pl.Int32,
    "epoch": pl.Int32,
    "step": pl.Int32,
    "ts": pl.Int64,
    "end": pl.Int64,
    "wait_us": pl.Int64,
    "compute_us": pl.Int64,
    "ckpt_us": pl.Int64,
    "other_us": pl.Int64,
    "after_ckpt_us": pl.Int64,
    "lead_in_us": pl.Int64,
    "cpu_us": pl.Int64,
    "cpu_threads": pl.Int64,
    "batch_size": pl.Int64,
    "epoch_first": pl.Boolean,
    "block_first": pl.Boolean,
    "basis": pl.String,
}


def evaluation_phase(events: pl.DataFrame) -> pl.Series:
    """True for the events of evaluation passes: those of a process inside one of its own
    ``evaluate`` spans (DLIO's ``DLIOBenchmark._eval``, ``pipeline/evaluate``; the span
    itself excluded), and those of its children (the evaluation loader's workers) inside
    their parent's. All False when the trace has no evaluation spans."""
    if "role" not in events.columns or not (events["role"] == EVALUATE).any():
        return pl.Series("evaluation", [False] * events.height, dtype=pl.Boolean)
    spans = (
        events.filter(pl.col("role") == EVALUATE)
        .select(
            pl.col("pid").alias("__owner"),
            pl.col("ts").alias("__v0"),
            (pl.col("ts") + pl.col("dur").fill_null(0)).alias("__v1"),
        )
        .drop_nulls()
        .sort("__v0")
    )
    owners = spans["__owner"].unique().implode()
    parent = (
        pl.col("ppid") if "ppid" in events.columns else pl.lit(None, dtype=events.schema["pid"])
    )
    ev = (
        events.select("pid", parent.alias("ppid"), "ts", "role")
        .with_row_index("__row")
        .with_columns(
            pl.when(pl.col("pid").is_in(owners))
            .then(pl.col("pid"))
            .when(pl.col("ppid").is_in(owners))
            .then(pl.col("ppid"))
            .alias("__owner")
        )
    )
    hit = (
        ev.filter(pl.col("__owner").is_not_null() & pl.col("ts").is_not_null())
        .sort("ts")
        .join_asof(
            spans,
            left_on="ts",
            right_on="__v0",
            by="__owner",
            strategy="backward",
            check_sortedness=False,
        )
        .filter(
            (pl.col("ts") < pl.col("__v1"))
            & (pl.col("role").is_null() | (pl.col("role") != EVALUATE))
        )
    )
    mask = np.zeros(events.height, dtype=bool)
    mask[hit["__row"].to_numpy()] = True
    return pl.Series("evaluation", mask)


def training_steps(events: pl.DataFrame) -> pl.DataFrame:
    """One row per training step of each consumer (a process with fetch, step or compute events).

    A step is anchored on the consumer's ``compute`` events when it has any (the
    accelerator's work: DLIO's ``TorchFramework.compute``, ``@ai.compute``), else on its
    loop bodies (``fetch.block``; ``compute/step`` of old dlreplay traces), else between
    the ends of successive ``fetch`` waits. The time between one anchor's end and the
    next one's start (the *gap*; for an epoch's first step, from the epoch's start) is
    data wait (the ``fetch`` event ending in it; without one, the whole gap minus
    checkpoint time: DLIO does not log the wait of an epoch's last batch), checkpoint
    time (saves in the gap) and other time (barriers, logging). A save inside a loop
    body is checkpoint time, not compute. ``epoch_first``: the epoch's first step;
    ``block_first``: DLIO's first step of a block (an epoch's first, and the first after
    a checkpoint), which DLIO leaves out of its AU; ``after_ckpt_us``: from the end of
    the checkpoints before a step to its batch's arrival; ``lead_in_us``: for an epoch's
    first step, from the epoch's start to its first fetch (creating the iterator,
    starting workers), part of no step (the ``worker-startup`` finding reads it);
    ``cpu_us``/``cpu_threads``: the host CPU the training process (all its threads) spent in
    the step's compute and the threads that shared it, where the trace measured them (the
    ``cpu_time``/``cpu_threads`` args of dlreplay's ``fetch.block``; null otherwise): the
    measured loop body's CPU times the compute's share of that body's wall time (the whole
    of it for a body without checkpoint saves).

    Columns: :data:`STEP_SCHEMA` (µs), ordered by pid and time. ``basis`` names the anchor.
    """
    ann, a, fetch = _step_anchors(events)
    if a is None or fetch is None:
        return pl.DataFrame(schema=STEP_SCHEMA)
    a = _step_fetches(a, ann, fetch)
    a = _step_saves(a, ann)
    a = _step_times(a)
    a = _step_cpu(a, ann)
    return a.select(list(STEP_SCHEMA)).cast(STEP_SCHEMA)  # type: ignore[arg-type]


def _step_fetches(a: pl.DataFrame, ann: pl.DataFrame, fetch: pl.DataFrame) -> pl.DataFrame:
    """:func:`training_steps`' anchors ``a`` with their epoch's start (``e_ts``), ``epoch_first``,
    the previous step's end (``prev_end``), the fetch wait each step's batch came from
    (``fetch_us``, ``fetch_end``, ``batch_size``), where its gap starts (``gap_start``) and an
    epoch's lead-in (``lead_in_us``), sorted by time."""
    a = a.with_columns(pl.col("epoch").fill_null(0))
    spans = epoch_spans(ann).select("pid", pl.col("epoch"), pl.col("ts").alias("e_ts"))
    a = a.join(spans, on=["pid", "epoch"], how="left", maintain_order="left").with_columns(
        pl.col("end").shift(1).over("pid", "epoch").alias("prev_end")
    )
    a = a.with_columns(
        (pl.col("prev_end").is_null()).alias("epoch_first"),
        pl.when(pl.col("e_ts") <= pl.col("ts")).then(pl.col("e_ts")).alias("e_ts"),
    )
    # the fetch wait of each step: the last one ending at or before the anchor starts, after the previous step
    a = a.sort("ts").join_asof(
        fetch.sort("f_end"),
        left_on="ts",
        right_on="f_end",
        by="pid",
        strategy="backward",
        check_sortedness=False,
    )
    after = pl.coalesce("prev_end", "e_ts")
    own = pl.col("f_end").is_not_null() & (after.is_null() | (pl.col("f_end") > after))
    a = a.with_columns(
        pl.when(own).then(pl.col("f_dur")).alias("fetch_us"),
        pl.when(own).then(pl.col("f_end")).alias("fetch_end"),
        pl.when(own).then(pl.col("f_bs")).alias("batch_size"),
        # an epoch's first step starts at its fetch (the loader's start before it is the epoch's lead-in)
        pl.coalesce("prev_end", pl.when(own).then(pl.col("f_ts")), "e_ts", "ts").alias("gap_start"),
    ).with_columns(
        pl.when(pl.col("epoch_first"))
        .then((pl.col("gap_start") - pl.col("e_ts")).clip(lower_bound=0))
        .fill_null(0)
        .alias("lead_in_us")
    )
    return a


def _step_times(a: pl.DataFrame) -> pl.DataFrame:
    """:func:`training_steps`' anchors ``a`` (with their fetches and saves) with the step's
    times (``wait_us``, ``compute_us``, ``ckpt_us``, ``after_ckpt_us``, ``other_us``), its
    number in the epoch (``step``), ``block_first`` and the ``basis`` of its anchor."""
    gap = (pl.col("ts") - pl.col("gap_start")).clip(lower_bound=0)
    ck_gap, ck_in = pl.col("ck_gap").fill_null(0), pl.col("ck_in").fill_null(0)
    wait = pl.coalesce(pl.min_horizontal("fetch_us", gap), (gap - ck_gap).clip(lower_bound=0))
    a = a.with_columns(
        wait.alias("wait_us"),
        pl.when(pl.col("role") == COMPUTE)
        .then(pl.col("dur"))
        .otherwise((pl.col("dur") - ck_in).clip(lower_bound=0))
        .alias("compute_us"),
        (ck_gap + pl.when(pl.col("role") == COMPUTE).then(0).otherwise(ck_in)).alias("ckpt_us"),
        # from the end of the checkpoints before a step to its batch's arrival (DLIO's t0 .. block start)
        (pl.coalesce("fetch_end", "ts") - pl.col("ck_end"))
        .clip(lower_bound=0)
        .fill_null(0)
        .alias("after_ckpt_us"),
    ).with_columns((gap - pl.col("wait_us") - ck_gap).clip(lower_bound=0).alias("other_us"))
    a = a.with_columns(
        pl.int_range(pl.len()).over("pid", "epoch").alias("step"),
        (pl.col("epoch_first") | (ck_gap > 0) | pl.col("__after_in")).alias("block_first"),
        pl.col("role")
        .replace_strict(
            {COMPUTE: "compute events", STEP: "loop bodies", FETCH: "fetch waits"},
            return_dtype=pl.String,
        )
        .alias("basis"),
    )
    return a


def _step_saves(a: pl.DataFrame, ann: pl.DataFrame) -> pl.DataFrame:
    """:func:`training_steps`' anchors ``a`` with the checkpoint saves of each step: in the
    gap before it (``ck_gap``, ending at ``ck_end``) or inside its body (``ck_in``), and
    ``__after_in``: the step follows a body that saved (sorted by pid and time)."""
    # checkpoint saves of each step: in the gap before it, or inside its body
    saves = (
        ann.filter(pl.col("role") == CKPT_SAVE)
        .select("pid", pl.col("ts").alias("c_ts"), pl.col("dur").fill_null(0).alias("c_dur"))
        .sort("c_ts")
    )
    saves = saves.with_columns((pl.col("c_ts") + pl.col("c_dur")).alias("c_end"))
    a = a.sort("pid", "ts").with_row_index("__k")
    if saves.height:
        hit = (
            saves.join_asof(
                a.select("pid", "__k", "gap_start", "ts", "end").sort("gap_start"),
                left_on="c_ts",
                right_on="gap_start",
                by="pid",
                strategy="backward",
                check_sortedness=False,
            )
            .filter(pl.col("__k").is_not_null() & (pl.col("c_ts") < pl.col("end")))
            .group_by("__k")
            .agg(
                pl.col("c_dur").filter(pl.col("c_ts") < pl.col("ts")).sum().alias("ck_gap"),
                pl.col("c_dur").filter(pl.col("c_ts") >= pl.col("ts")).sum().alias("ck_in"),
                pl.col("c_end").filter(pl.col("c_ts") < pl.col("ts")).max().alias("ck_end"),
                pl.col("c_end").filter(pl.col("c_ts") >= pl.col("ts")).max().alias("ck_in_end"),
            )
        )
        a = a.join(hit, on="__k", how="left", maintain_order="left")
    else:
        a = a.with_columns(
            pl.lit(0, pl.Int64).alias("ck_gap"),
            pl.lit(0, pl.Int64).alias("ck_in"),
            pl.lit(None, pl.Int64).alias("ck_end"),
            pl.lit(None, pl.Int64).alias("ck_in_end"),
        )
    # a save at the end of a loop body (a replay's, a script's) is followed by a block like one in the gap
    a = a.sort("pid", "ts").with_columns(
        pl.coalesce("ck_end", pl.col("ck_in_end").shift(1).over("pid", "epoch")).alias("ck_end"),
        (pl.col("ck_in").shift(1).over("pid", "epoch").fill_null(0) > 0).alias("__after_in"),
    )
    return a


def _step_anchors(
    events: pl.DataFrame,
) -> tuple[pl.DataFrame, pl.DataFrame | None, pl.DataFrame | None]:
    """(annotation rows, anchors, fetch waits) of :func:`training_steps`: one anchor row per
    training step (pid, epoch, ts, dur, role, end), sorted by pid and time; None when there
    are no steps."""
    ann = (
        events.filter(pl.col("role").is_not_null()) if "role" in events.columns else events.clear()
    )
    if (ann["role"] == EVALUATE).any():  # evaluation passes' loops are not training steps
        ann = ann.filter(~evaluation_phase(ann))
    loop = ann.filter(pl.col("role").is_in([FETCH, STEP, COMPUTE]))
    if loop.is_empty():
        return ann, None, None
    kinds = loop.group_by("pid").agg(
        pl.when((pl.col("role") == COMPUTE).any())
        .then(pl.lit(COMPUTE))
        .when((pl.col("role") == STEP).any())
        .then(pl.lit(STEP))
        .otherwise(pl.lit(FETCH))
        .alias("kind")
    )
    fetch = loop.filter((pl.col("role") == FETCH) & (pl.col("batch_size").fill_null(1) > 0)).select(
        "pid",
        pl.col("ts").alias("f_ts"),
        (pl.col("ts") + pl.col("dur").fill_null(0)).alias("f_end"),
        pl.col("dur").fill_null(0).alias("f_dur"),
        pl.col("batch_size").alias("f_bs"),
        pl.col("epoch").alias("f_ep"),
    )
    body = (
        loop.join(kinds, on="pid")
        .filter(pl.col("role") == pl.col("kind"))
        .filter(pl.col("role") != FETCH)
    )
    anchors = body.select("pid", "epoch", "ts", pl.col("dur").fill_null(0).alias("dur"), "role")
    # consumers with fetch waits only: a step is the time between a batch's arrival and the next wait
    only_fetch = kinds.filter(pl.col("kind") == FETCH)["pid"]
    if only_fetch.len():
        f = (
            fetch.filter(pl.col("pid").is_in(only_fetch.implode()))
            .sort("pid", "f_ts")
            .with_columns(pl.col("f_ts").shift(-1).over("pid", "f_ep").alias("next"))
        )
        anchors = pl.concat(
            [
                anchors,
                f.filter(pl.col("next").is_not_null()).select(
                    "pid",
                    pl.col("f_ep").alias("epoch"),
                    pl.col("f_end").alias("ts"),
                    (pl.col("next") - pl.col("f_end")).clip(lower_bound=0).alias("dur"),
                    pl.lit(FETCH, dtype=anchors.schema["role"]).alias("role"),
                ),
            ]
        )
    if anchors.is_empty():
        return ann, None, fetch
    # nested anchors (a compute inside a compute) count once: keep those starting after the previous end
    a = anchors.sort("pid", "ts").with_columns((pl.col("ts") + pl.col("dur")).alias("end"))
    a = (
        a.with_columns(pl.col("end").cum_max().shift(1).over("pid").alias("__prev_max"))
        .filter(pl.col("__prev_max").is_null() | (pl.col("ts") >= pl.col("__prev_max")))
        .drop("__prev_max")
    )
    return ann, a, fetch


def training_step_count(events: pl.DataFrame) -> int:
    """The number of rows :func:`training_steps` gives (its anchors, without the rest)."""
    a = _step_anchors(events)[1]
    return 0 if a is None else a.height


def _step_cpu(steps: pl.DataFrame, ann: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (with ``compute_us``) with ``cpu_us``/``cpu_threads``: the CPU of the measured
    loop body (``step`` role) each one starts in, times the step's compute share of that
    body's wall time (a body holding a save, or several compute events, shares it out)."""
    none = steps.with_columns(
        pl.lit(None, pl.Int64).alias("cpu_us"), pl.lit(None, pl.Int64).alias("cpu_threads")
    )
    if "cpu_time" not in ann.columns:
        return none
    bodies = ann.filter((pl.col("role") == STEP) & pl.col("cpu_time").is_not_null())
    if bodies.is_empty():
        return none
    bodies = bodies.select(
        "pid",
        pl.col("ts").alias("b_ts"),
        (pl.col("ts") + pl.col("dur").fill_null(0)).alias("b_end"),
        pl.col("cpu_time").cast(pl.Int64).alias("b_cpu"),
        pl.col("cpu_threads").cast(pl.Int64).alias("b_threads"),
    ).sort("b_ts")
    out = steps.sort("ts").join_asof(
        bodies, left_on="ts", right_on="b_ts", by="pid", strategy="backward", check_sortedness=False
    )
    inside = pl.col("b_ts").is_not_null() & (
        (pl.col("ts") < pl.col("b_end")) | (pl.col("ts") == pl.col("b_ts"))
    )
    wall = pl.col("b_end") - pl.col("b_ts")
    share = pl.when(wall > 0).then((pl.col("compute_us") / wall).clip(0.0, 1.0)).otherwise(1.0)
    return (
        out.with_columns(
            pl.when(inside).then((pl.col("b_cpu") * share).round(0).cast(pl.Int64)).alias("cpu_us"),
            pl.when(inside).then(pl.col("b_threads")).alias("cpu_threads"),
        )
        .drop("b_ts", "b_end", "b_cpu", "b_threads")
        .sort("pid", "ts")
    )
