"""The train section of the model: epochs, steps per epoch and the compute time per step
(with its warm-up and host CPU), and the evaluation passes between epochs."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import polars as pl

from dlreplay.model import Dataset, Distribution, Evaluation, Reader, Train
from dlreplay.schema import READ_OPS

from ..passes.ranks import own_compute_steps
from ..trace import vocabulary as voc
from .base import US, Facts, Observed, num
from .lines import json_lines
from .measure import WARMUP_FACTOR, file_sizes
from .timing import TimingModel, timing_model

__all__ = ["evaluation_section", "train_section", "with_timing"]


def train_section(
    obs: Observed,
    dataset: Dataset,
    reader: Reader,
    facts: Facts,
    manifest: dict[str, Any] | None = None,
) -> tuple[Train, TimingModel | None]:
    """``train`` (epochs, steps per epoch, compute per step) from the main consumer's loop,
    else from the POSIX inference; and the consumer's :class:`TimingModel` (None without
    loop events), whose fields :func:`with_timing` adds. ``manifest``: the capture's, whose
    ``accelerators`` tell a job that computed on the host CPU."""
    host: Distribution | None = None
    if obs.has_loader and obs.main_pid is not None:
        n_epochs, steps_per_epoch = _epochs_from_loop(obs, dataset, reader, facts)
        compute, timing = _loop_timing(obs, facts)
    else:
        timing = None
        n_epochs, compute = _from_posix(obs, facts)
        compute = _per_streamed_step(compute, obs, dataset, reader, n_epochs, facts)
        steps_per_epoch = None
        host = _cpu_host_compute(compute, manifest, facts)
    if not compute.is_known:
        compute = Distribution.fixed(0.0)
    train = Train(epochs=n_epochs, steps_per_epoch=steps_per_epoch, computation_time=compute)
    if host is not None:
        train = replace(train, computation_host_cpu=host, computation_host_threads=1)
    if timing is None and _timed_between_reads(obs, facts):
        train = replace(train, timed_between_reads=True)
    return train, timing


def _timed_between_reads(obs: Observed, facts: Facts) -> bool:
    """Whether the compute (and the preprocessing) came from the silences of a training process
    that reads its own samples (a POSIX-only trace without workers): the job's collate and loop
    are in them."""
    posix = obs.posix
    if posix is None or not posix.compute_samples or posix.read_threads.value:
        return False
    facts.put(
        "train.timed_between_reads",
        "the compute is the reading process's idle time before its batches, and the "
        "preprocessing its silence between a batch's samples: the job's loader work is in both",
        "measured",
    )
    return True


def _cpu_host_compute(
    compute: Distribution, manifest: dict[str, Any] | None, facts: Facts
) -> Distribution | None:
    """The host CPU a POSIX-only trace's steps spent, where its capture says the host had no
    accelerator (the manifest's ``accelerators`` is []): the job computed on its CPU, so a
    replay that only sleeps leaves its loader the whole machine the job's loader shared.
    One thread busy for the step's time (the loader hooks measure the real CPU and threads:
    1-1.7x the step's time in the examples); None where the trace cannot tell."""
    nodes = (manifest or {}).get("accelerators")
    if not isinstance(nodes, list) or nodes or not compute.is_known or not (compute.mean or 0):
        return None
    facts.put(
        "train.computation_host_cpu",
        "the capture's host had no accelerator (no GPU, ROCm or accel device node): the job "
        "computed on its CPU; one thread busy for each step's compute assumed (a POSIX-only "
        "trace does not measure it; the loader hooks do)",
        "inferred",
    )
    facts.put("train.computation_host_threads", "one thread assumed (POSIX-only trace)", "default")
    return compute


def with_timing(train: Train, timing: TimingModel | None) -> Train:
    """``train`` with the warm-up, epoch-end and host CPU fields of ``timing``."""
    if timing is None:
        return train
    train = replace(
        train,
        warmup_computation_time=timing.warmup_computation_time,
        epoch_warmup_computation_time=timing.epoch_warmup_computation_time,
        epoch_end_time=timing.epoch_end_time,
    )
    if timing.computation_host_cpu is not None:
        train = replace(
            train,
            computation_host_cpu=timing.computation_host_cpu,
            computation_host_threads=timing.computation_host_threads or 1,
        )
    return train


def _epochs_from_loop(
    obs: Observed, dataset: Dataset, reader: Reader, facts: Facts
) -> tuple[int, int | None]:
    """(epochs, steps per epoch or None for full passes) of the main consumer."""
    main_pid = obs.main_pid
    loop = obs.steps.filter(pl.col("pid") == main_pid)
    mine = obs.epochs.filter(pl.col("pid") == main_pid)
    n_epochs = mine.height if mine.height else int(loop["epoch"].n_unique())
    n_epochs = max(n_epochs, 1)
    facts.put(
        "train.epochs",
        f"epochs of the consumer ({mine['basis'][0]})"
        if mine.height
        else "epoch numbers of its steps",
        "measured",
    )
    per_epoch_steps = loop.group_by("epoch").len()["len"]
    steps_per_epoch = int(num(per_epoch_steps.median())) or None
    # per rank, as the replay shares the samples out (replay.engine.steps_per_epoch)
    size, b = max(len(obs.consumers), 1), max(reader.batch_size, 1)
    spf = dataset.num_samples_per_file
    if reader.sample_order == "dlio":  # whole batches only, floor(samples / batch / ranks)
        natural = dataset.num_files * spf // b // size
    else:
        # DistributedSampler's share: ceil(samples / ranks), floor with drop_last (replay.plan)
        total = dataset.num_files * spf
        share = total // size if reader.drop_last else -(-total // size)
        natural = share // b if reader.drop_last else -(-share // b)
    if steps_per_epoch == natural:
        steps_per_epoch = None
    facts.put("train.steps_per_epoch", "training steps per epoch (null = full passes)", "measured")
    return n_epochs, steps_per_epoch


def _unmeasured(obs: Observed, facts: Facts) -> bool:
    """True (and said in ``facts``) when the main consumer's loop events have durations the
    loader read as null: taken as 0 s, they would be written as a measured compute time of 0."""
    unknown = voc.unmeasured_loop_events(obs.events, obs.main_pid)
    if unknown:
        facts.put(
            "train.computation_time",
            f"not measured: {unknown} training-loop event(s) of the consumer with a negative "
            "or impossible duration (read as null)",
            "default",
        )
        facts.notes.append(
            f"computation_time not measured: {unknown} training-loop event(s) with a negative or "
            "impossible duration in the trace; set train.computation_time by hand"
        )
    return bool(unknown)


def _loop_timing(obs: Observed, facts: Facts) -> tuple[Distribution, TimingModel | None]:
    """(compute per step, the timing model) of the main consumer's steps."""
    main_pid = obs.main_pid
    # each step's own compute: a rank's wait for the other ranks is made anew by the replay
    mine_steps = own_compute_steps(obs.steps, main_pid).sort("ts")
    if _unmeasured(obs, facts):
        return Distribution.unknown(), None
    timing = timing_model(
        mine_steps,
        obs.epochs.filter(pl.col("pid") == main_pid),
        obs.fetch.filter((pl.col("pid") == main_pid) & (pl.col("batch_size").fill_null(1) == 0)),
        obs.saves.filter(pl.col("pid") == main_pid),
    )
    compute = timing.computation_time if timing else Distribution.unknown()
    facts.put(
        "train.computation_time",
        (
            "consumer compute events"
            if mine_steps["basis"][0] == "compute events"
            else "consumer loop bodies minus checkpoint time"
        )
        + ", warm-up steps excluded"
        if compute.is_known
        else "fewer than two training steps",
        "measured" if compute.is_known else "default",
    )
    if timing is not None:
        facts.put(
            "train.warmup_computation_time",
            "the run's first step and the leading steps longer "
            f"than {WARMUP_FACTOR:g}x the steady median",
            "measured",
        )
        facts.put(
            "train.epoch_warmup_computation_time",
            "median per position of later epochs' leading "
            f"steps longer than {WARMUP_FACTOR:g}x the steady median",
            "measured",
        )
        facts.put(
            "train.epoch_end_time",
            "consumer time from an epoch's end to the next epoch's start, "
            "checkpoint saves excluded",
            "measured" if timing.epochs >= 2 else "default",
        )
        if len(timing.warmup_computation_time) > 1:
            facts.notes.append(
                f"{len(timing.warmup_computation_time)} warm-up step(s) "
                f"({sum(timing.warmup_computation_time):.3f} s) modelled apart from computation_time"
            )
        facts.notes.append(timing.describe())
    if timing is not None and timing.computation_host_cpu is not None:
        facts.put(
            "train.computation_host_cpu",
            "CPU time of the training process (all its threads) in its "
            "steady steps' compute, measured by the capture",
            "measured",
        )
        facts.put(
            "train.computation_host_threads",
            "median over those steps of the process's CPU time over its training thread's",
            "measured",
        )
    else:
        facts.put(
            "train.computation_host_cpu",
            "not measured by this trace: 0, the compute is a pure sleep "
            "(DLIO's model of an accelerator)",
            "default",
        )
    return compute, timing


def _from_posix(obs: Observed, facts: Facts) -> tuple[int, Distribution]:
    """(epochs, compute per step) as the POSIX inference found them."""
    posix = obs.posix
    assert posix is not None
    n_epochs = int(posix.epochs.value or _posix_epochs(obs.io, obs.paths))
    # E passes of k whole-file visits a file read like E/d passes of k*d: a guess, said so
    facts.put(
        "train.epochs", posix.epochs.evidence, "default" if posix.passes_guessed else "inferred"
    )
    if posix.compute_samples:
        compute = Distribution.from_values(np.asarray(posix.compute_samples))
        # without a batch size the idle time per sample stands for a step's: a guess
        guess = not posix.batch_size.value or "a guess" in str(posix.computation_time.evidence)
        evidence = str(posix.computation_time.evidence)
        if posix.read_threads.value:
            # read by workers: the consumer's pace, seen in when the workers read, holds the
            # compute and the loop's hand-over (and the loader's period where it is the
            # slower): an upper bound, the time a replay must spend, not the compute. Over
            # the inference sweep's worker runs it was within 5 % of the job's compute clock
            # in 0 of 40 (1.3-10x it): a guess, said so
            guess = True
            evidence = (
                "an upper bound on the compute, not the compute: a POSIX-only trace of "
                f"workers' reads does not split a step's compute from the loop's own time; {evidence}"
            )
        elif not guess:
            # read by the consumer itself: its idle time before each batch holds the compute
            # and the loop's own work between its reads (the batch's collation, the step's
            # Python, the odd descheduling): the time a replay must spend, an upper bound on
            # the compute. Over the sweep's 16 runs without workers whose batch was found it
            # was within 5 % of the job's compute clock in 7 (the rest 5-30 % over; and with
            # 4 steps of 4-145 ms, 4x under the job's median of 7): a guess, said so
            guess = True
            evidence = (
                "the compute and the loop's own work, not the compute alone: the reading "
                f"process's idle time holds its work between reads too; {evidence}"
            )
        sure = "default" if guess else "inferred"
        facts.put("train.computation_time", evidence, sure)
    else:
        compute = Distribution.fixed(0.0)
        facts.put(
            "train.computation_time",
            f"no data-loader events, and {posix.computation_time.evidence}",
            "default",
        )
    facts.put(
        "train.computation_host_cpu",
        "not measured by a POSIX-only trace: 0, the compute is a pure "
        "sleep (DLIO's model of an accelerator)",
        "default",
    )
    return n_epochs, compute


def _per_streamed_step(
    compute: Distribution,
    obs: Observed,
    dataset: Dataset,
    reader: Reader,
    epochs: int,
    facts: Facts,
) -> Distribution:
    """The POSIX inference's compute per step (s), over the steps of streamed shards: it counted
    one sample per visit (a shard's open), where a shard holds many, in batches of its own
    batch size; the same epoch's compute over the streamed samples' steps, in batches of the
    reader's. Likewise over a mapped file's rows (a visit is a mapping), a Parquet file's rows
    and a JSON-lines file's lines (a visit is a buffer's read). Unchanged for other reads."""
    posix = obs.posix
    # (the rows of mapped files: the visits are the files' mappings, no sample either; the
    # lines of a JSON-lines file: a visit is a read of its buffer, a few lines, or none where
    # the line was in the buffer already)
    lines = json_lines(obs.paths)
    rows = not obs.items.height and (
        (reader.memory_map and dataset.format == "npy") or reader.row_group_reads or lines
    )
    if (reader.streaming is None and not rows) or posix is None or not posix.visits:
        return compute
    if not compute.is_known:
        return compute
    samples = dataset.num_files * dataset.num_samples_per_file
    visits = posix.visits / max(epochs, 1)
    steps_then = visits / max(int(posix.batch_size.value or 1), 1)
    scale = steps_then / max(samples / max(reader.batch_size, 1), 1)
    if not posix.compute_samples or abs(scale - 1) < 0.05:  # already per streamed step
        return compute
    what = (
        ("mappings" if reader.memory_map else "buffer reads" if lines else "visits")
        if rows
        else "shard visits"
    )
    facts.put(
        "train.computation_time",
        f"{facts.fields['train.computation_time'].method}; over the samples' steps "
        f"({visits:.0f} {what} an epoch, {samples} samples in batches of {reader.batch_size})",
        facts.fields["train.computation_time"].confidence,
    )
    return Distribution.from_values(np.asarray(posix.compute_samples) * scale)


def _posix_epochs(io: pl.DataFrame, paths: list[str]) -> int:
    """Median number of full passes over each dataset file (bytes read / file size)."""
    sizes = file_sizes(io)
    got = (
        io.filter(pl.col("name").is_in(READ_OPS))
        .group_by("file")
        .agg(pl.col("size").sum().alias("read"))
    )
    j = got.join(sizes, on="file").filter(pl.col("size") > 0)
    if j.is_empty():
        return 1
    passes = (j["read"] / j["size"]).median()
    return max(int(np.floor(num(passes, 1.0) + 0.05)), 1)


def evaluation_section(
    ev: pl.DataFrame, obs: Observed, facts: Facts
) -> tuple[Evaluation | None, int, int]:
    """(train.evaluation, dataset.num_files_eval, reader.batch_size_eval) from the events of the
    evaluation passes (:func:`~..trace.vocabulary.evaluation_phase`): when they run (the
    training epochs that end before each), their steps (the consumer's ``compute`` events in
    them) and step time, the samples per step (item events), and the files they read."""
    main_pid, epochs, train_files = obs.main_pid, obs.epochs, set(obs.paths)
    spans = obs.events.filter(pl.col("role") == voc.EVALUATE)
    if main_pid is not None:
        spans = spans.filter(pl.col("pid") == main_pid)
        ev = ev.filter((pl.col("pid") == main_pid) | (pl.col("ppid") == main_pid))
    if spans.is_empty():
        return None, 0, 1
    spans = spans.sort("ts").select(
        pl.col("ts").alias("v0"), (pl.col("ts") + pl.col("dur").fill_null(0)).alias("v1")
    )
    ends = sorted(
        (epochs.filter(pl.col("pid") == main_pid) if main_pid is not None else epochs)[
            "end"
        ].to_list()
    )
    after = [
        sum(1 for e in ends if e <= v0) for v0 in spans["v0"].to_list()
    ]  # epochs done before each pass
    every = int(np.median(np.diff(after))) if len(after) > 1 and min(np.diff(after)) > 0 else 1
    first = max(after[0], 1) if after else 1
    compute = ev.filter(pl.col("role") == voc.COMPUTE)
    per_pass = (
        compute.sort("ts")
        .join_asof(spans, left_on="ts", right_on="v0", strategy="backward")
        .group_by("v0")
        .len()["len"]
    )
    steps = int(num(per_pass.median())) if per_pass.len() else 0
    items = ev.filter(pl.col("role") == voc.ITEM)
    samples = items.height / max(len(after), 1)
    batch = max(1, round(samples / steps)) if steps and items.height else 1
    reads = ev.filter(
        pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("file").is_not_null()
    )
    files = set(reads["file"].cast(pl.String).unique().to_list()) - train_files
    # the evaluation set sits beside the training set (DLIO: <data>/valid beside <data>/train)
    root = (
        str(PurePosixPath(os.path.commonpath(sorted(train_files))).parent) if train_files else "/"
    )
    nfiles = len({f for f in files if f.startswith(root.rstrip("/") + "/")})
    times = compute["dur"].drop_nulls().to_numpy() * US
    comp = Distribution.from_values(times) if times.size else Distribution.fixed(0.0)
    what = f"{len(after)} evaluation pass(es) (evaluate spans)"
    facts.put(
        "train.evaluation",
        f"{what}: after training epochs {after}; {steps} step(s) each (compute events)",
        "measured",
    )
    facts.put(
        "dataset.num_files_eval", f"files read in the evaluation passes only: {nfiles}", "measured"
    )
    facts.put(
        "reader.batch_size_eval",
        f"{items.height} samples (item events) over {len(after)} x {steps} steps"
        if steps and items.height
        else "no item or compute events in the evaluation passes: 1",
        "measured" if steps and items.height else "default",
    )
    facts.notes.append(f"{what} modelled apart: their loop, workers and files are not training's")
    return (
        Evaluation(
            every_n_epochs=max(every, 1),
            after_epoch=first,
            steps=steps or None,
            computation_time=comp,
        ),
        nfiles,
        batch,
    )
