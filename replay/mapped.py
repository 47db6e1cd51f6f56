"""Replay of a loop without a DataLoader over a memory-mapped file (``reader.mapped_access``):
every step maps the generated file (``np.memmap``, anew each step when the job did), takes
``windows_per_step`` windows of ``window_bytes`` at random (or sequential) offsets as the job's
``slices_per_window`` slices of ``slice_bytes`` each, and copies them out, so the pages the job
faulted in from storage are faulted in again; the rest of the job's data time is slept, then
the step's compute. Every ``eval_every_steps`` steps a validation pass maps the validation
file (``mapped-eval.bin`` in the data directory, written once at the first epoch's start when
missing) and takes its windows the same way.

Events, as the capture hooks write them for the job: ``compute/compute`` per step,
``pipeline/evaluate`` per validation pass; under ``dlreplay capture`` the ``mapped`` hooks record
the windows (``data/io.window``) as they do the job's. Seconds, bytes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.capture import REGIONS
from dlreplay.interrupt import INTERRUPT
from dlreplay.model import WorkloadModel
from dlreplay.model.sections import MappedAccess

from .common import ReplayError
from .plan import epoch_compute

__all__ = [
    "EVAL_FILE",
    "ensure_eval_file",
    "mapped_path",
    "mapped_step_count",
    "mapped_steps",
    "take_windows",
    "window_offsets",
]

#: The validation file a mapped replay maps (in the data directory).
EVAL_FILE = "mapped-eval.bin"


def mapped_step_count(model: WorkloadModel, global_step: int) -> int:
    """Steps of an epoch of the mapped loop: ``train.steps_per_epoch`` (the job's steps), at most
    what ``train.total_training_steps`` leaves."""
    steps = model.train.steps_per_epoch or 1
    cap = model.train.total_training_steps
    return steps if cap is None else max(0, min(steps, cap - global_step))


def mapped_path(run: Any) -> Path:
    """The generated file the replay maps: the dataset's first (largest, when several) file."""
    spec = run.plan.spec
    if not spec.paths:
        raise ReplayError("reader.mapped_access: the dataset has no file to map; generate it first")
    k = int(np.argmax(spec.file_bytes)) if spec.file_bytes else 0
    return Path(spec.data_dir) / spec.paths[k]


def ensure_eval_file(data_dir: Path, nbytes: int, seed: int) -> Path | None:
    """The validation file of *nbytes* (written when missing or of another size); None for 0."""
    if nbytes <= 0:
        return None
    path = data_dir / EVAL_FILE
    if path.is_file() and path.stat().st_size == nbytes:
        return path
    rng = np.random.default_rng([seed, 0xE7A1])
    tmp = path.with_suffix(".tmp")
    rng.integers(0, 256, size=nbytes, dtype=np.uint8).tofile(tmp)
    os.replace(tmp, path)
    return path


def window_offsets(
    access: MappedAccess, size: int, n: int, rng: np.random.Generator, at: int = 0
) -> np.ndarray:
    """*n* window offsets (bytes) in a file of *size* bytes: uniform random draws from *rng*, or
    for sequential ones the windows after the *at*-th."""
    span = max(size - access.window_bytes, 0)
    if access.offsets == "sequential":
        return (at * n + np.arange(n, dtype=np.int64)) * access.window_bytes % max(span, 1)
    return rng.integers(0, span + 1, size=n, dtype=np.int64)


def take_windows(
    mm: np.ndarray, access: MappedAccess, n: int, rng: np.random.Generator, at: int = 0
) -> int:
    """Take *n* windows of the mapping *mm* (``np.memmap`` of bytes) as the job's slices and copy
    each out (its pages are faulted in); returns the bytes of the slices taken."""
    slices = max(access.slices_per_window, 1)
    piece = min(access.slice_bytes or access.window_bytes, access.window_bytes)
    stride = (access.window_bytes - piece) // (slices - 1) if slices > 1 else 0
    total = 0
    for start in window_offsets(access, mm.shape[0], n, rng, at):
        for j in range(slices):
            lo = int(start) + j * stride
            total += mm[lo : lo + piece].copy().nbytes
    return total


def _mapped_windows(
    path: Path, access: MappedAccess, n: int, rng: np.random.Generator, at: int = 0
) -> int:
    """Map *path* (a new mapping, as the job made one per batch) and take *n* windows of it."""
    # by its name, as a job passes it (numpy resolves a pathlib.Path: a stat per path component)
    mm = np.memmap(os.fspath(path), dtype=np.uint8, mode="r")
    try:
        return take_windows(mm, access, n, rng, at)
    finally:
        del mm


def _evaluate(run: Any, path: Path | None, access: MappedAccess, rng: np.random.Generator) -> int:
    """One validation pass: its batches' windows, the rest of each batch's time slept."""
    if path is None or access.eval_steps <= 0:
        return 0
    ev = REGIONS.begin("evaluate", "pipeline", epoch=0, step=run.global_step)
    taken = 0
    for t in access.eval_step_time.sample(rng, access.eval_steps, stratified=True):
        t0 = time.perf_counter()
        taken += _mapped_windows(path, access, access.eval_windows_per_step, rng)
        run.sleeper.sleep(max(0.0, float(t)), spent=time.perf_counter() - t0)
    REGIONS.end(ev)
    return taken


def mapped_steps(run: Any, epoch: int, rec: dict[str, Any], steps: int) -> float:
    """The epoch's *steps* of a mapped-access loop on the accelerator *run* (its plan, model,
    sleeper, random generators and global step); fills the epoch's record *rec* and returns
    the epoch's start time (``time.perf_counter``)."""
    access = run.model.reader.mapped_access
    path = mapped_path(run)
    eval_path = ensure_eval_file(path.parent, access.eval_file_bytes, run.plan.seed)
    rng = np.random.default_rng([run.plan.seed, run.plan.rank, 0x3A9])
    modelled, _ = epoch_compute(run.model, run.compute_rng, steps, epoch, run.global_step)
    data = access.data_time.sample(rng, steps, stratified=True)
    t_start = time.perf_counter()
    for step in range(steps):
        INTERRUPT.check()
        t0 = time.perf_counter()
        taken = _mapped_windows(path, access, access.windows_per_step, rng, at=step)
        run.sleeper.sleep(
            max(0.0, float(data[step])) if step else 0.0, spent=time.perf_counter() - t0
        )
        t1 = time.perf_counter()
        ev = REGIONS.begin("compute", "compute", epoch=0, step=step, count=step + 1)
        compute = run.sleeper.sleep(float(modelled[step]))
        REGIONS.end(ev)
        run.global_step += 1
        rec["steps"] += 1
        rec["samples"] += access.windows_per_step
        rec["bytes_read"] += taken
        if step:  # the run's first step is left out of AU, as the job's analysis does
            rec["compute_s"] += compute
            rec["modelled_compute_s"] += float(modelled[step])
            rec["io_wait_s"] += t1 - t0
            rec["window_s"] += time.perf_counter() - t0
            rec["samples_in_window"] += access.windows_per_step
            rec["bytes_in_window"] += taken
        every = access.eval_every_steps
        if every and (step + 1) % every == 0:
            e0 = time.perf_counter()
            rec["bytes_read"] += _evaluate(run, eval_path, access, rng)
            rec["evaluation_s"] += time.perf_counter() - e0
        rec["epoch_time_s"] = time.perf_counter() - t_start
    return t_start
