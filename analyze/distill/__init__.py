"""Distill: infer a workload model (``dlreplay.workload``) from an event table.

Every inference is a small function over the polars event table (no Python loops
over events) that returns a value and how it was obtained::

    (value, method, confidence)   confidence in measured | inferred | default

Traces captured by ``dlreplay capture``, DLIO's traces and code annotated with
DFTracer's AI conventions carry data-loader events (epoch, fetch, step, compute, item,
checkpoint; read by role, see :mod:`.vocabulary`), which give batch size, workers,
epochs, samples per file and step compute time directly (``measured``). Plain DFTracer
traces (POSIX only) fall back to POSIX-level inference (``inferred``, see
:mod:`.infer`) or defaults.

One module per section of the model: :mod:`.observe` finds the dataset and the training
loop in the trace, :mod:`.dataset`, :mod:`.reader`, :mod:`.train` (with :mod:`.timing`)
and :mod:`.checkpoint` build their sections; :mod:`.measure` holds the measurements the
characterisation passes share.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

import dlreplay
from dlreplay.errors import DlreplayError
from dlreplay.model import Processes, Provenance, Reader, Train, WorkloadModel

from ..passes.ranks import ranks_of
from ..trace import vocabulary as voc
from .base import DistillError, Facts, Observed
from .checkpoint import MAX_CHECKPOINT_WRITE_RUNS, checkpoint_section, save_io, with_save_io
from .checkpoint_posix import unannotated_checkpoints
from .dataset import (
    EXTENSION_FORMATS,
    INDEX_SUFFIXES,
    MMAP_OPS,
    dataset_files,
    dataset_section,
    infer_format,
)
from .direct import with_direct_io
from .mapped import posix_mapped_loop, with_mapped_access
from .measure import WARMUP_FACTOR, warmup_steps
from .observe import observe, split_evaluation
from .reader import PYTHON_FILE_FORMATS, UNBUFFERED_MEDIAN_READ, access_pattern, reader_section
from .scan import with_start_scan
from .shards import streamed_shards
from .side import with_side_files
from .storage import (
    object_folder,
    object_reads,
    storage_section,
    with_object_dirs,
    with_object_reads,
)
from .timing import TimingModel, timing_model
from .train import evaluation_section, train_section, with_timing

__all__ = [
    "EXTENSION_FORMATS",
    "INDEX_SUFFIXES",
    "MAX_CHECKPOINT_WRITE_RUNS",
    "MMAP_OPS",
    "PYTHON_FILE_FORMATS",
    "UNBUFFERED_MEDIAN_READ",
    "WARMUP_FACTOR",
    "DistillError",
    "TimingModel",
    "access_pattern",
    "dataset_files",
    "distill",
    "infer_format",
    "timing_model",
    "warmup_steps",
]


def distill(
    events: pl.DataFrame,
    *,
    manifest: dict[str, Any] | None = None,
    data_dirs: list[str] | None = None,
    source: str | None = None,
    fingerprint: dict[str, Any] | None = None,
    fingerprint_origin: str | None = None,
) -> WorkloadModel:
    """Infer a :class:`WorkloadModel` from an event table (see module doc).

    ``dataset.layout`` comes from *fingerprint* (a dataset fingerprint document), else
    from ``dataset-fingerprint.json`` in the trace directory *source*, else from what
    the reads show (:mod:`dlreplay.analyze.layout`).
    """
    if events.is_empty():
        raise DistillError(
            f"{source or 'the trace'} has no events; capture the job again (`dlreplay capture`)."
        )
    facts = Facts()
    objects = object_reads(source)  # S3 GETs: reads of files s3://bucket/key from here on
    events = with_object_reads(events, objects)
    # the rest of distill sees the training phase only
    every = voc.ensure_roles(events)
    events, eval_events = split_evaluation(every)
    data_dirs = with_object_dirs(data_dirs or (manifest or {}).get("data_dirs") or None, objects)
    obs = observe(events, data_dirs, fingerprint, source, facts)
    dataset = dataset_section(obs, facts, fingerprint, fingerprint_origin, source)
    reader = reader_section(obs, dataset, facts)
    shard_doc = fingerprint or _capture_fingerprint(source)  # the shards' and files' insides
    dataset, reader, obs.posix = streamed_shards(  # IterableDataset over shards
        obs, dataset, reader, facts, shard_doc
    )
    reader = with_mapped_access(reader, every, source, facts)
    reader = with_direct_io(reader, obs, source, facts)  # O_DIRECT in the open flags
    train, timing = train_section(obs, dataset, reader, facts, manifest)
    if eval_events is not None:
        evaluation, eval_files, eval_batch = evaluation_section(eval_events, obs, facts)
        if evaluation is not None:
            train = replace(train, evaluation=evaluation)
            dataset = replace(dataset, num_files_eval=eval_files)
            reader = replace(reader, batch_size_eval=eval_batch)
    train = with_timing(train, timing)
    reader, train = _posix_mapped(obs, every, reader, train, data_dirs, shard_doc, facts)
    main_pid = obs.main_pid
    processes = _processes(obs, reader.read_threads, facts)
    if obs.saves.is_empty() and obs.annotated.is_empty():  # DFTracer's preload alone: writes
        sofar = WorkloadModel(dataset=dataset, reader=reader, train=train, processes=processes)
        checkpoint = unannotated_checkpoints(events, obs, sofar, manifest, facts, source)
    else:
        checkpoint = checkpoint_section(
            events,
            with_save_io(obs.saves, save_io(source)),  # DCP's own storage time per save
            obs.steps.filter(pl.col("pid") == main_pid) if main_pid else obs.steps,
            facts,
            obs.epochs.filter(pl.col("pid") == main_pid) if main_pid else None,
        )
    storage = storage_section(objects)
    dataset = with_side_files(
        dataset, every, obs.paths, train.epochs, processes.ranks, facts, data_dirs
    )
    dataset = with_start_scan(dataset, every, obs, facts)
    return WorkloadModel(
        dataset=object_folder(dataset, storage),
        reader=reader,
        train=train,
        checkpoint=checkpoint,
        processes=processes,
        storage=storage,
        provenance=Provenance(
            source_trace=source,
            capture_host=(manifest or {}).get("host"),
            dlreplay_version=dlreplay.__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            fields=facts.fields,
            notes=facts.notes,
        ),
    )


def _posix_mapped(
    obs: Observed,
    events: pl.DataFrame,
    reader: Reader,
    train: Train,
    data_dirs: list[str] | None,
    fingerprint: dict[str, Any] | None,
    facts: Facts,
) -> tuple[Reader, Train]:
    """(reader, train) of a loop that maps its training file every step, where DFTracer's POSIX
    calls alone show one (:func:`.mapped.posix_mapped_loop`): one pass of its steps, each the
    interval between two maps; unchanged otherwise."""
    if reader.mapped_access is not None or obs.has_loader or not obs.mapped:
        return reader, train
    roots = tuple(data_dirs or {str(Path(p).parent) for p in obs.paths})
    mapped = (
        events.filter(pl.col("name").is_in(["mmap", "mmap64"]) & pl.col("file").is_not_null())
        .select(pl.col("file").cast(pl.String))
        .unique()["file"]
        .to_list()
    )
    found = posix_mapped_loop(
        events, [f for f in mapped if f.startswith(roots)], _listed_sizes(fingerprint), facts
    )
    if found is None:
        return reader, train
    access, steps, step = found
    facts.put("train.epochs", "a loop without epochs: one pass of its steps", "default")
    facts.put("train.steps_per_epoch", "maps of the training file", "inferred")
    # the map-style reading of the same calls (one epoch per map, DLIO's mapped reader) is gone
    facts.notes[:] = [n for n in facts.notes if "were memory-mapped (mmap)" not in n]
    facts.notes[:] = [n for n in facts.notes if not n.startswith("guess: reader.batch_size")]
    return (
        replace(reader, mapped_access=access, read_threads=0),
        replace(train, epochs=1, steps_per_epoch=steps, computation_time=step),
    )


def _listed_sizes(fingerprint: dict[str, Any] | None) -> dict[str, int]:
    """Path -> bytes of the files a dataset fingerprint lists with their sizes."""
    out: dict[str, int] = {}
    for group in (fingerprint or {}).get("groups", []):
        listed = group.get("file_bytes") if isinstance(group, dict) else None
        if isinstance(listed, dict):
            root = str(group.get("root", ""))
            out.update(
                {str(Path(root) / k): v for k, v in listed.items() if isinstance(v, int) and v >= 0}
            )
    return out


def _capture_fingerprint(source: str | None) -> dict[str, Any] | None:
    """The dataset fingerprint a capture left in the trace directory *source* (None without one,
    or when it cannot be read: the sections that use it say so)."""
    from dlreplay.analyze.layout import resolve_fingerprint

    if not source:
        return None
    try:
        return resolve_fingerprint(source)[0]
    except DlreplayError:
        return None


def _processes(obs: Observed, read_threads: int, facts: Facts) -> Processes:
    """``processes``: one rank per consumer (or per process whose workers read the samples)."""
    ranks, how = ranks_of(obs.annotated, obs.consumers)
    if obs.consumers or how != "processes with fetch events":
        facts.put("processes.ranks", how, "measured")
    elif obs.posix is not None and obs.posix.consumers > 1:
        ranks = obs.posix.consumers
        whose = "whose worker processes read" if read_threads else "reading their own"
        facts.put("processes.ranks", f"{ranks} processes {whose} samples", "inferred")
    else:
        facts.put("processes.ranks", "single process assumed", "default")
    return Processes(ranks=ranks, workers_per_rank=read_threads)
