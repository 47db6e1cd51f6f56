"""Roles and their spellings: the ``role`` each annotation event gets (:func:`classify`,
:func:`role_expr`), the conventions that spell them (DFTracer's AI logging conventions,
DLIO's ``Class.method`` events, dlreplay's own), and the annotations none of them explains
(:func:`unknown_annotations`). Part of the one event vocabulary (:mod:`.vocabulary`, which
describes the spellings understood).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

import polars as pl

__all__ = [
    "AI_CONVENTIONS",
    "BACKWARD",
    "CKPT_IO",
    "CKPT_LOAD",
    "CKPT_SAVE",
    "COMM",
    "COMPUTE",
    "DATA_IO",
    "DEVICE",
    "DLIO_CATEGORIES",
    "EPOCH",
    "EPOCH_GAP",
    "EVALUATE",
    "FETCH",
    "FORWARD",
    "INIT",
    "INTERNAL",
    "ITEM",
    "ITEMS",
    "LOOP_ROLES",
    "OPTIMIZER",
    "PREPROCESS",
    "ROLES",
    "SAMPLE_READ",
    "STEP",
    "TEST",
    "TRAIN",
    "classify",
    "has_role",
    "role_expr",
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
