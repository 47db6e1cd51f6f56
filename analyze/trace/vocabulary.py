"""One event vocabulary: what each annotation event of a trace means to dlreplay.

Traces name the same things in several ways. The loader gives every event a ``role``
(a column of the event table; null for POSIX/STDIO calls and for events with no
meaning to dlreplay), and every stage (passes, findings, distill, compare, export)
selects events by role, never by a spelling. The spellings understood:

* **DFTracer's AI logging conventions** (``dftracer.python.ai``; ``from dftracer.logger
  import ai`` in older pydftracer; DFTracer docs, "AI/DL Logging"): the categories
  ``compute`` (``forward``, ``backward``, ``step``), ``data`` (``preprocess``, ``item``,
  ``io.*``), ``dataloader`` (``fetch``), ``comm`` (``send`` ... ``all_to_all``),
  ``device`` (``transfer``), ``pipeline`` (``epoch``, ``train``, ``evaluate``, ``test``),
  ``checkpoint`` (``capture``, ``restart``, ``io.*``) and ``other``, each as the
  category's own name (``@ai.compute``), a child, a ``derive``\\d child
  (``preprocess.collate``), in the iterator forms (``X.iter``: waiting for the next
  element; ``X.block``: one element's loop body; ``X.yield`` is pydftracer 1.x's name
  for ``.block``), ``X.init`` (constructor hooks), and the start/stop metadata form
  (``CM`` records ``X.start`` / ``X.end`` with a timestamp, see :func:`marker_spans`).
* **DLIO** 2.0.0 as published on PyPI (traced by pydftracer 1.0.x): categories
  ``dlio_benchmark`` (``DLIOBenchmark._train`` per epoch, ``<module>.iter`` /
  ``<module>.yield`` around each batch), ``ai_framework`` (``TorchFramework.compute``),
  ``data_loader`` (``TorchDataset.__getitem__`` in the reader workers), ``reader``
  (``NPZReader.read_index`` with the sample index, ``FormatReader.preprocess``),
  ``checkpoint`` (``PyTorchCheckpointing.checkpoint``), and its internals
  (``config``, ``storage``, ``generator``). DLIO's development branch writes the AI
  conventions above (``pipeline/epoch.block``, ``dataloader/fetch.iter`` and
  ``fetch.block``, ``compute/compute``, ``data/item``) plus the same reader events.
  DLIO's tracer writes the MPI rank as ``pid`` and its forked reader workers into the
  rank's file: :func:`canonicalize` gives each thread id its own process (see there).
* **dlreplay's own capture**: today the AI conventions (``pipeline/epoch``,
  ``dataloader/fetch.iter`` and ``fetch.block``, ``data/item``, ``checkpoint/capture``
  and ``restart``); traces of format_version 1 and replays use ``dataloader/fetch``,
  ``compute/step`` (the whole loop body, not an optimizer step: recognised per process,
  see :func:`_legacy_steps`), ``checkpoint/save`` and ``load``.

Events of annotation-like categories (not all upper case like ``POSIX``/``STDIO``/
``MPI``, not ``dftracer``'s own records) that none of these explain are listed by
:func:`unknown_annotations`, and ``analyze`` prints them.

:func:`training_steps` turns the roles into one row per training step of each consumer
(rank): data wait, compute, checkpoint and other time, whichever spelling gave them.
Times are microseconds (as in the event table).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl

from dlreplay.schema import READ_OPS, WRITE_OPS

__all__ = [
    "CKPT_LOAD",
    "CKPT_SAVE",
    "COMPUTE",
    "EPOCH",
    "FETCH",
    "ITEM",
    "LOOP_ROLES",
    "ROLES",
    "STEP",
    "canonicalize",
    "classify",
    "ensure_roles",
    "epoch_spans",
    "has_role",
    "marker_spans",
    "role_expr",
    "training_step_count",
    "training_steps",
    "unknown_annotations",
]

# --------------------------------------------------------------------------- roles

EPOCH = "epoch"  #: one pass of a consumer (rank) over its data
EPOCH_GAP = (
    "epoch.gap"  #: between two epochs (``epoch.iter``: the epoch loop waiting for its next value)
)
TRAIN = "train"  #: a training phase (DLIO: one per epoch; AI conventions: any training region)
EVALUATE = "evaluate"
TEST = "test"
FETCH = "fetch"  #: the consumer blocked until the next batch arrives (data wait)
STEP = "step"  #: the consumer's loop body for one batch (compute, communication, checkpoints, ...)
COMPUTE = "compute"  #: the accelerator work of one step
FORWARD = "compute.forward"
BACKWARD = "compute.backward"
OPTIMIZER = "compute.optimizer"  #: ``ai.compute.step``: the optimizer's parameter update
ITEM = "item"  #: one sample loaded (``Dataset.__getitem__``), in a loader worker or the consumer
ITEMS = "items"  #: a whole batch loaded by one ``Dataset.__getitems__`` call
SAMPLE_READ = "sample.read"  #: a reader call for one sample index (DLIO's ``read_index``)
PREPROCESS = "preprocess"
DATA_IO = "data.io"
CKPT_SAVE = "checkpoint.save"
CKPT_LOAD = "checkpoint.load"
CKPT_IO = "checkpoint.io"
COMM = "comm"
DEVICE = "device.transfer"
INIT = "init"
INTERNAL = (
    "internal"  #: understood, and carries nothing the analyses use (DLIO's config, ai_root, ...)
)

ROLES = (
    EPOCH,
    EPOCH_GAP,
    TRAIN,
    EVALUATE,
    TEST,
    FETCH,
    STEP,
    COMPUTE,
    FORWARD,
    BACKWARD,
    OPTIMIZER,
    ITEM,
    ITEMS,
    SAMPLE_READ,
    PREPROCESS,
    DATA_IO,
    CKPT_SAVE,
    CKPT_LOAD,
    CKPT_IO,
    COMM,
    DEVICE,
    INIT,
    INTERNAL,
)
#: Roles of the consumer's training loop: epoch, step and sample numbers are filled in for these.
LOOP_ROLES = (
    FETCH,
    STEP,
    COMPUTE,
    FORWARD,
    BACKWARD,
    OPTIMIZER,
    DEVICE,
    COMM,
    CKPT_SAVE,
    CKPT_LOAD,
)

# --------------------------------------------------------------- the spellings

_COMM = (
    "send",
    "receive",
    "barrier",
    "bcast",
    "reduce",
    "all_reduce",
    "gather",
    "all_gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
)
#: DFTracer AI conventions: category -> {name (without form suffix) -> role}; the
#: category's own name is the category used as a whole (``@ai.compute``).
AI_CONVENTIONS: dict[str, dict[str, str]] = {
    "compute": {"compute": COMPUTE, "forward": FORWARD, "backward": BACKWARD, "step": OPTIMIZER},
    "data": {
        "data": INTERNAL,
        "preprocess": PREPROCESS,
        "item": ITEM,
        "items": ITEMS,
        "io": DATA_IO,
    },
    "dataloader": {"dataloader": FETCH, "fetch": FETCH},
    "comm": {"comm": COMM, **{n: COMM for n in _COMM}},
    "device": {"device": DEVICE, "transfer": DEVICE},
    "pipeline": {
        "pipeline": INTERNAL,
        "epoch": EPOCH,
        "train": TRAIN,
        "evaluate": EVALUATE,
        "test": TEST,
    },
    "checkpoint": {
        "checkpoint": CKPT_SAVE,
        "capture": CKPT_SAVE,
        "restart": CKPT_LOAD,
        "save": CKPT_SAVE,
        "load": CKPT_LOAD,
        "io": CKPT_IO,
    },
    "other": {"other": INTERNAL, "log": INTERNAL, "io": INTERNAL},
    "ai_root": {"ai_root": INTERNAL},
}
#: The two iterator forms with a meaning of their own: (category, base) -> (role of ``.iter``, of ``.block``).
_ITER_FORMS: dict[tuple[str, str], tuple[str, str]] = {
    ("dataloader", "fetch"): (FETCH, STEP),
    ("dataloader", "dataloader"): (FETCH, STEP),
    ("pipeline", "epoch"): (EPOCH_GAP, EPOCH),
}
#: DLIO's module categories (``dlio_benchmark.common.constants``), spelled ``Class.method``.
DLIO_CATEGORIES = (
    "dlio_benchmark",
    "ai_framework",
    "data_loader",
    "reader",
    "checkpoint",
    "storage",
    "config",
    "generator",
)
_DLIO_RULES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("dlio_benchmark", re.compile(r".*\._train$"), TRAIN),
    ("dlio_benchmark", re.compile(r".*\._eval$"), EVALUATE),
    ("dlio_benchmark", re.compile(r".*\.iter$"), FETCH),  # pydftracer 1.x dlp.iter(loader.next())
    ("dlio_benchmark", re.compile(r".*\.yield$"), STEP),
    ("ai_framework", re.compile(r".*\.compute$"), COMPUTE),
    ("data_loader", re.compile(r".*\.__getitem__$"), ITEM),
    ("reader", re.compile(r".*\.read_index$"), SAMPLE_READ),
    ("reader", re.compile(r".*\.preprocess$"), PREPROCESS),
    ("checkpoint", re.compile(r".*\.(checkpoint|save_checkpoint)$"), CKPT_SAVE),
    ("checkpoint", re.compile(r".*\.load_checkpoint$"), CKPT_LOAD),
    ("checkpoint", re.compile(r".*\.save_state$"), CKPT_IO),
)
_FORMS = ("iter", "block", "yield", "init")
#: Categories of DFTracer's own records and of system-call layers: not annotations.
_SYSTEM_CATS = ("dftracer",)


def _is_annotation_category(cat: str | None) -> bool:
    """Categories a person or a framework wrote (``compute``, ``reader``); not ``POSIX``/``STDIO``/``MPI``."""
    return cat is not None and cat != "" and cat not in _SYSTEM_CATS and not cat.isupper()


@lru_cache(maxsize=4096)
def classify(cat: str | None, name: str | None) -> str | None:
    """The role of events spelled (``cat``, ``name``); None when not an understood annotation.

    One call per distinct spelling of a trace, not per event.
    """
    if not cat or not name or not _is_annotation_category(cat):
        return None
    names = AI_CONVENTIONS.get(cat)
    if names is not None:
        base, _, form = (
            name.rpartition(".") if name.rpartition(".")[2] in _FORMS else (name, "", "")
        )
        if form in ("iter", "block", "yield"):
            special = _ITER_FORMS.get((cat, base))
            if special is not None:
                return special[0] if form == "iter" else special[1]
        if form == "init":
            return INIT if (base in names or base.split(".")[0] in names) else None
        if base in names:
            return names[base] if form != "iter" else INTERNAL
        head = base.split(".")[0]  # derived children: preprocess.collate, io.read
        if head in names:
            return names[head]
    for rule_cat, pattern, role in _DLIO_RULES:
        if cat == rule_cat and pattern.match(name):
            return role
    if cat in DLIO_CATEGORIES and re.match(r"^[A-Za-z_<][\w<>]*\.", name):
        return INTERNAL  # DLIO's other Class.method events (open/close/get_sample, get_uri, ...)
    return None


def _pairs_roles(pairs: pl.DataFrame) -> pl.DataFrame:
    """(cat, name, role) for distinct (cat, name) pairs."""
    roles = [classify(c, n) for c, n in pairs.select("cat", "name").iter_rows()]
    return pairs.with_columns(pl.Series("role", roles, dtype=pl.String))


def role_expr(frame: pl.DataFrame) -> pl.Series:
    """The role of each row of ``frame`` (with ``cat`` and ``name``): a Categorical series
    (4 bytes a row: a String one cost 16), null for rows that are not annotations of a
    known spelling. Only annotation-like rows are looked up."""
    nulls = pl.select(
        pl.repeat(None, frame.height, dtype=pl.Categorical()).alias("role")
    ).to_series()
    if frame.height == 0:
        return nulls
    ann = frame.select(
        pl.col("cat").is_not_null() & ~pl.col("cat").is_in(["POSIX", "STDIO", "dftracer"])
    ).to_series()
    if not ann.any():
        return nulls
    sub = frame.select(pl.arg_where(ann).alias("__r")).to_series()
    del ann
    rows = frame.select("cat", "name")[sub]
    pairs = _pairs_roles(rows.unique())
    roles = rows.join(
        pairs, on=["cat", "name"], how="left", nulls_equal=True, maintain_order="left"
    )["role"]
    return nulls.scatter(sub, roles.cast(pl.Categorical()))


def has_role(role: str | Iterable[str]) -> pl.Expr:
    """Rows of one role (or of any of several)."""
    if isinstance(role, str):
        return pl.col("role") == role
    return pl.col("role").is_in(list(role))


# ------------------------------------------------------------------- the loader hook


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
        # the loader's per-process table counts items and checkpoints by dlreplay's spellings
        changed = changed or bool(
            ev.select(
                (
                    pl.col("role").is_in([ITEM, CKPT_SAVE, CKPT_LOAD, CKPT_IO])
                    & ~(
                        ((pl.col("cat") == "data") & (pl.col("name") == "item"))
                        | (
                            (pl.col("cat") == "checkpoint")
                            & pl.col("name").is_in(["save", "load", "capture", "restart"])
                        )
                    )
                ).any()
            ).item()
        )
    return ev, changed


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
            ).cast(schema)
            for p in parts
        ]
    )  # type: ignore[arg-type]
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
    spans = epoch_spans(ann)
    todo = ann.filter(pl.col("role").is_in(LOOP_ROLES) & pl.col("epoch").is_null())
    # only the columns that change are replaced (taking one out of the table would turn a
    # column of one value, all null, into a value per row)
    filled: dict[str, pl.Series] = {}
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
    return ev.with_columns(s.alias(c) for c, s in filled.items()) if filled else ev


# ------------------------------------------------------------------- reading roles


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


def unknown_annotations(events: pl.DataFrame | pl.LazyFrame, limit: int = 20) -> list[dict]:
    """Annotation-like events no convention explains: [{cat, name, count}], most frequent first."""
    q = (
        events.lazy()
        .filter(
            pl.col("role").is_null()
            & pl.col("cat").is_not_null()
            & ~pl.col("cat").is_in(["POSIX", "STDIO", "dftracer"])
        )
        .group_by("cat", "name")
        .len()
        .sort(["len", "cat", "name"], descending=[True, False, False])
    )
    df = q.collect(engine="streaming") if isinstance(events, pl.LazyFrame) else q.collect()
    # one row per spelling, a handful: filtered in Python (polars' map_elements imports its
    # bytecode inspector, a cost to every analyze, to say so)
    rows = [(c, n, k) for c, n, k in df.iter_rows() if _is_annotation_category(c)]
    return [{"cat": c, "name": n, "count": int(k)} for c, n, k in rows[:limit]]


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
    a = _step_saves(a, ann)
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
    a = _step_cpu(a, ann)
    return a.select(list(STEP_SCHEMA)).cast(STEP_SCHEMA)  # type: ignore[arg-type]


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
