"""``dlreplay replay``: replay a workload model on real storage, compute replaced by sleep.

Each simulated accelerator (a local process, or an MPI rank) reads its shard of the
dataset files (rank r reads files r::N) through a :class:`~.loader.Loader` with
PyTorch DataLoader semantics, sleeps ``train.computation_time`` per step, writes
checkpoints as the model says, and synchronises with the other accelerators once per
step (a barrier, like data-parallel training). Metrics (:mod:`.metrics`) go to
``<out>/metrics.json``. Unless ``trace`` is off, the replay runs itself under
:func:`dlreplay.capture.run_capture`, so ``<out>`` is also a trace directory.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import errno
import gc
import importlib.util
import json
import math
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import dlreplay
from dlreplay.capture import REGIONS
from dlreplay.errors import InUseError
from dlreplay.interrupt import INTERRUPT
from dlreplay.model import WorkloadModel, save_model
from dlreplay.osutil import (
    DirectoryClaim,
    claim_directory,
    end_with_parent,
    is_empty_dir,
    share_directory,
)

from .common import ReplayError, check_replay_resources, dataset_digest, read_dataset_manifest
from .generate import GenerateConfig, cache_warnings, dataset_status, generate_dataset
from .hostcpu import HostCpu
from .loader import Loader, WorkerSpec
from .metrics import METRICS_FORMAT_VERSION, METRICS_SCHEMA, aggregate, render_table

METRICS_NAME = "metrics.json"
ORDER_NAME = "sample-order.json"
IO_MODES = ("library", "posix")
#: --loader choices: auto = PyTorch's DataLoader when the model's loader is PyTorch's and torch is installed.
LOADERS = ("auto", "torch", "builtin")
#: Bytes per checkpoint write call when the model does not know it.
DEFAULT_WRITE_TRANSFER = 4 << 20
#: ``keep_checkpoints`` value: keep the files only when the rank succeeded (see ReplayConfig)
KEEP_ON_SUCCESS = "on-success"
BARRIER_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ReplayConfig:
    """One replay. ``model`` already has overrides applied.

    ``accelerators``: local accelerator processes (ignored under MPI, where each rank is
    one; None: the model's ``processes.ranks``, as many as the traced job had); ``out``:
    result/trace directory (None = ``replays/<name>-<UTC time>``);
    ``trace``: run under DFTracer; ``generate``: generate the dataset if missing;
    ``io``: ``library`` or ``posix``; ``au_threshold``: pass/fail AU in percent;
    ``record_order``: write every epoch's sample order to ``sample-order.json``;
    ``loader``: ``auto`` (PyTorch's own DataLoader when the model's framework and data loader
    are PyTorch's, its workers processes, and torch is importable; else the builtin one),
    ``torch`` or ``builtin``.
    """

    model: WorkloadModel
    data_dir: Path
    accelerators: int | None = None
    out: Path | None = None
    trace: bool = True
    generate: bool = True
    io: str = "library"
    au_threshold: float = 90.0
    seed: int = 0
    record_order: bool = False
    #: keep the checkpoint files written (else each rank deletes its own at its end);
    #: :data:`KEEP_ON_SUCCESS`: only when the rank succeeded (a traced replay's files are deleted
    #: after the trace, outside it; a failed rank frees its space at once: the trace is still written)
    keep_checkpoints: bool | str = False
    traced: bool = False  # internal: this process is the captured child
    jobs: int | None = None
    loader: str = "auto"


@dataclass(frozen=True)
class ReplayResult:
    """Outcome: where metrics (and the trace) are, the metrics dict, completeness."""

    out: Path
    metrics: dict[str, Any]
    complete: bool
    traced: bool
    warnings: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- MPI


def _mpi_world() -> Any | None:
    """mpi4py's COMM_WORLD when launched by mpiexec with more than one rank, else None."""
    env_size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMIX_SIZE")
    if not env_size or int(env_size) <= 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ReplayError(f"launched under MPI ({env_size} ranks) but mpi4py is not importable ({exc}); "
                          f"install dlreplay[mpi]") from None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


# --------------------------------------------------------------------------- per accelerator


@dataclass(frozen=True)
class RankPlan:
    """What one accelerator does (picklable, sent to accelerator processes)."""

    model: WorkloadModel
    spec: WorkerSpec
    rank: int
    size: int
    seed: int
    checkpoint_dir: str
    record_order: bool
    loader: str = "builtin"  # torch | builtin (resolved by choose_loader)


def _shuffle(mode: str, seed: int | None, items: list[Any], key: Sequence[int]) -> list[Any]:
    if mode == "off":
        return items
    rng = np.random.default_rng([seed or 0, *key]) if mode == "seed" else np.random.default_rng()
    order = rng.permutation(len(items))
    return [items[i] for i in order]


def model_accelerators(model: WorkloadModel) -> int:
    """The accelerators a replay of ``model`` simulates unless told: the traced job's ranks
    (``processes.ranks``; a 2-rank DLIO run replayed on one accelerator read half its data),
    at most one per dataset file."""
    return max(1, min(model.processes.ranks, model.dataset.num_files))


def steps_per_epoch(model: WorkloadModel, size: int) -> int:
    """Steps per epoch for each of *size* accelerators (all ranks take the same count).

    DLIO's order takes ``floor(samples / batch / ranks)`` steps (its ``max_steps``, whole
    batches only); otherwise each rank's files give its samples, and ``reader.drop_last``
    drops a last partial batch.
    """
    nfiles = model.dataset.num_files
    if nfiles < size:
        raise ReplayError(f"dataset.num_files: {nfiles} file(s) cannot be shared by {size} accelerators "
                          f"(each reads files r::N); use fewer accelerators or more files")
    b = model.reader.batch_size
    if model.reader.sample_order == "dlio":
        steps = nfiles * model.dataset.num_samples_per_file // b // size
    else:
        samples = (nfiles // size) * model.dataset.num_samples_per_file
        steps = samples // b if model.reader.drop_last else math.ceil(samples / b)
    if model.train.steps_per_epoch:
        steps = min(steps, model.train.steps_per_epoch)
    return steps


def _dlio_order(plan: RankPlan, epoch: int) -> list[tuple[int, int]]:
    """DLIO 2.0's PyTorch sampler (``dlio_sampler``): rank r takes the contiguous block of global
    sample indices [r*ceil(N/size), (r+1)*ceil(N/size)); with sample_shuffle ``seed`` the block is
    shuffled in place after seeding numpy's legacy generator with the seed, once per epoch (so
    epoch e's order is that permutation applied e times); ``random`` shuffles unseeded;
    ``file_shuffle`` has no effect on this path."""
    m, rd = plan.model, plan.model.reader
    spf = m.dataset.num_samples_per_file
    total = m.dataset.num_files * spf
    per_rank = math.ceil(total / plan.size)
    indices = list(range(plan.rank * per_rank, min(total, (plan.rank + 1) * per_rank)))
    seed = rd.shuffle_seed if rd.shuffle_seed is not None else plan.seed
    if rd.sample_shuffle != "off":
        rs = np.random.RandomState(seed) if rd.sample_shuffle == "seed" else np.random.RandomState()
        for _ in range(epoch):
            if rd.sample_shuffle == "seed":
                rs.seed(seed)
            rs.shuffle(indices)
    return [divmod(i, spf) for i in indices]


def epoch_batches(plan: RankPlan, epoch: int) -> list[list[tuple[int, int]]]:
    """The batches (lists of (file index, sample in file)) of *epoch* (1-based) on this rank."""
    m, rd = plan.model, plan.model.reader
    if rd.sample_order == "dlio":
        samples = _dlio_order(plan, epoch)
    else:
        seed = rd.shuffle_seed if rd.shuffle_seed is not None else plan.seed
        files = list(range(plan.rank, m.dataset.num_files, plan.size))
        files = _shuffle(rd.file_shuffle, seed, files, (epoch, plan.rank, 1))
        samples = [(f, k) for f in files for k in range(m.dataset.num_samples_per_file)]
        samples = _shuffle(rd.sample_shuffle, seed, samples, (epoch, plan.rank, 2))
    steps = steps_per_epoch(m, plan.size)
    b = rd.batch_size
    batches = [samples[i * b:(i + 1) * b] for i in range(steps)]
    return [x for x in batches if x and (len(x) == b or not (rd.drop_last or rd.sample_order == "dlio"))]


def spends_host_cpu(model: WorkloadModel) -> bool:
    """Whether the model's steps spend host CPU (``train.computation_host_cpu`` not 0)."""
    d = model.train.computation_host_cpu
    return d.is_known and max(d.mean or 0.0, d.max or 0.0, d.value or 0.0) > 0


def epoch_compute(model: WorkloadModel, rng: np.random.Generator, steps: int, epoch: int,
                  first_global_step: int) -> tuple[np.ndarray, np.ndarray]:
    """(compute seconds, host CPU seconds) of each of an epoch's *steps*: the compute time of
    :func:`step_compute` from stratified draws of ``train.computation_time`` (an epoch spends
    close to its steps' mean, see :meth:`Distribution.sample`), and draws of
    ``train.computation_host_cpu`` made with the same random numbers (a copy of *rng*: of two
    empirical distributions a long step is a busy one, as in the job), scaled for warm-up steps
    by their compute time over the draw they replace (a warm-up step spends the share of its
    time a steady one does)."""
    tr = model.train
    cpu_rng = copy.deepcopy(rng)
    draws = tr.computation_time.sample(rng, steps, stratified=True)
    modelled = step_compute(model, draws, epoch, first_global_step)
    if not spends_host_cpu(model):
        return modelled, np.zeros(steps)
    cpu = np.maximum(tr.computation_host_cpu.sample(cpu_rng, steps, stratified=True), 0.0)
    d = np.maximum(np.asarray(draws, dtype=float), 0.0)
    return modelled, cpu * np.divide(modelled, d, out=np.ones_like(cpu), where=d > 0)


def step_compute(model: WorkloadModel, draws: np.ndarray, epoch: int, first_global_step: int) -> np.ndarray:
    """Seconds of compute of each step of *epoch* (1-based): the drawn steady-state times, with the
    run's warm-up steps (``train.warmup_computation_time``) and, in later epochs, each epoch's
    leading steps (``train.epoch_warmup_computation_time``) in place of the draws."""
    out = np.maximum(np.asarray(draws, dtype=float), 0.0).copy()
    tr = model.train
    if epoch > 1 and tr.epoch_warmup_computation_time:
        n = min(len(out), len(tr.epoch_warmup_computation_time))
        out[:n] = tr.epoch_warmup_computation_time[:n]
    run = tr.warmup_computation_time
    if first_global_step < len(run):
        n = min(len(out), len(run) - first_global_step)
        out[:n] = run[first_global_step:first_global_step + n]
    return out


class _Checkpointer:
    """Writes checkpoints as the model says; this rank writes files j with j % N == rank."""

    def __init__(self, plan: RankPlan) -> None:
        self.plan = plan
        self.c = plan.model.checkpoint
        self.count = 0
        self.last_path: str | None = None  # the latest checkpoint's file when it has one (for its trace event)
        self.last_time = time.monotonic()
        self.created: list[Path] = []
        self.rng = np.random.default_rng([plan.seed, plan.rank, 0xC4])
        wts = self.c.write_transfer_size
        self.transfer = wts if wts.is_known else None
        self.file_plan = self.c.file_write_plan()  # each file's write calls as the job made them
        # the bytes to write are made now, not inside the first save (24 MiB of random bytes take
        # tens of milliseconds: time the job's saves did not spend)
        self._buf = b""
        if self._enabled():
            largest = max((max(calls, default=0) for calls in self.file_plan), default=0) if self.file_plan else \
                int(min(self.c.bytes_per_checkpoint, (self.transfer.max or 0) if self.transfer else DEFAULT_WRITE_TRANSFER))
            self._buf = self.rng.bytes(max(largest, 0))

    def _enabled(self) -> bool:
        c = self.c
        st = c.serialization_time
        if not c.enabled or (c.bytes_per_checkpoint <= 0 and not (st.is_known and (st.mean or 0) > 0)):
            return False
        return c.num_checkpoints_write is None or self.count < c.num_checkpoints_write

    @property
    def by_epoch(self) -> bool:
        """Checkpoints at epoch ends (neither steps nor time between them given)."""
        return not (self.c.steps_between_checkpoints or self.c.time_between_checkpoints)

    def due_step(self, global_step: int) -> bool:
        """A step- or time-based checkpoint is due after this step."""
        c = self.c
        if not self._enabled() or self.by_epoch:
            return False
        if c.steps_between_checkpoints:
            return global_step % c.steps_between_checkpoints == 0
        return time.monotonic() - self.last_time >= (c.time_between_checkpoints or 0.0)

    def due_epoch(self, epoch: int) -> bool:
        """An epoch-based checkpoint is due after *epoch* (1-based): after its last batch, as a
        training script saves after its loop over the DataLoader."""
        c = self.c
        if not self._enabled() or not self.by_epoch:
            return False
        every = c.epochs_between_checkpoints or 1
        return epoch >= c.checkpoint_after_epoch and (epoch - c.checkpoint_after_epoch) % every == 0

    def save(self) -> int:
        """One checkpoint as a ``checkpoint/save`` event: the model's serialisation time, then the
        writes; returns bytes written."""
        ev = REGIONS.begin("save", "checkpoint")
        nbytes = 0
        try:
            st = self.c.serialization_time
            seconds = float(st.sample(self.rng, 1)[0]) if st.is_known and (st.mean or 0) > 0 else 0.0
            if seconds > 0:
                time.sleep(seconds)
            # no bytes: a save whose size the trace does not know (its time is the serialisation)
            nbytes = self.write() if self.c.bytes_per_checkpoint > 0 else 0
        finally:
            REGIONS.end(ev, path=self.last_path, bytes=nbytes)
        return nbytes

    def write(self) -> int:
        """Write this rank's files of one checkpoint; returns bytes written."""
        c, p = self.c, self.plan
        self.count += 1
        self.last_time = time.monotonic()
        folder = Path(p.checkpoint_dir) / f"checkpoint-{self.count:04d}"
        nfiles = c.files_per_checkpoint
        mine = range(p.rank, nfiles, p.size)
        # the save event names its file only when there is one: with several, each file's bytes
        # are its writes (a path would credit the save's bytes to one of them)
        self.last_path = None
        total = 0
        for j in mine:
            calls = self.file_plan[j] if self.file_plan is not None else None
            nbytes = sum(calls) if calls is not None else \
                c.bytes_per_checkpoint // nfiles + (c.bytes_per_checkpoint % nfiles if j == nfiles - 1 else 0)
            path = folder / f"part-{j:04d}-of-{nfiles}.bin"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                self.created.append(path)
                if len(mine) == 1:
                    self.last_path = str(path.resolve())
                try:
                    left = nbytes
                    planned = iter(calls or ())
                    while left > 0:
                        if calls is not None:
                            ts = next(planned, left)
                        else:
                            ts = int(self.transfer.sample(self.rng, 1)[0]) if self.transfer else DEFAULT_WRITE_TRANSFER
                        ts = max(1, min(ts, left))
                        if len(self._buf) < ts:
                            self._buf = self.rng.bytes(ts)
                        n = os.write(fd, memoryview(self._buf)[:ts])
                        left -= n
                        total += n
                    if c.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                hint = "; free space or choose another --out" if exc.errno == errno.ENOSPC else ""
                raise ReplayError(f"{exc.filename or path}: cannot write checkpoint ({exc.strerror or exc}){hint}"
                                  ) from None
        return total

    def cleanup(self) -> None:
        """Delete the checkpoint files this run created (and their folders if empty)."""
        for path in self.created:
            try:
                path.unlink()
                path.parent.rmdir()
            except OSError:
                pass


def run_rank(plan: RankPlan, sync: Callable[[], None], keep_checkpoints: bool | str = False) -> dict[str, Any]:
    """Run one accelerator: epochs of (fetch batch, sleep compute, checkpoint, sync), then each
    epoch's end (epoch checkpoint, evaluation, the model's epoch-end time).

    Returns ``{"rank", "epochs": [records], "complete", "error", "order"}``. Times in
    seconds, sizes in bytes. Ctrl-C ends the run early (``complete`` false), at the latest
    after the step in progress (see :mod:`.interrupt`).
    """
    with INTERRUPT.catching():
        return _run_rank(plan, sync, keep_checkpoints)


class _Sleeper:
    """Sleeps modelled seconds; carries each sleep's overshoot into the next, so the total
    slept tracks the model (a VM's sleeps run long by tens of microseconds to milliseconds)."""

    def __init__(self) -> None:
        self.debt = 0.0

    def sleep(self, seconds: float, spent: float = 0.0) -> float:
        """Make up *seconds* of which *spent* have passed already (the step's host CPU work):
        sleep about the rest; returns the seconds taken in all (*spent* included). Time taken
        beyond the model, by a late wake-up or by CPU work that took longer, is carried into
        the next sleeps."""
        if seconds <= 0 and spent <= 0:
            return 0.0
        t0 = time.perf_counter()
        if seconds - spent - self.debt > 0:
            time.sleep(seconds - spent - self.debt)
        took = spent + time.perf_counter() - t0
        self.debt += took - seconds
        return took


def make_loader(plan: RankPlan) -> Any:
    """The run's data loader: PyTorch's DataLoader (``plan.loader == "torch"``) or the builtin one."""
    rd = plan.model.reader
    if plan.loader == "torch":
        from .torchloader import TorchLoader

        return TorchLoader(plan.spec, rd.read_threads, rd.prefetch_factor, rd.persistent_workers, rd.pin_memory)
    # PyTorch starts new worker processes at every epoch unless persistent_workers (and joins them
    # in the next() that ends the epoch): one Loader per epoch then.
    persistent = rd.persistent_workers or rd.read_threads == 0 or rd.worker_kind == "thread"
    return Loader(plan.spec, rd.read_threads, rd.worker_kind, rd.prefetch_factor, one_epoch=not persistent)


def _loader_events_from_hooks(plan: RankPlan) -> bool:
    """A traced torch replay: the capture hooks emit epoch/fetch/step for the DataLoader."""
    if plan.loader != "torch":
        return False
    from .torchloader import loader_events_from_hooks

    return loader_events_from_hooks()


def _new_record(epoch: int) -> dict[str, Any]:
    return {"epoch": epoch, "steps": 0, "samples": 0, "bytes_read": 0, "compute_s": 0.0,
            "modelled_compute_s": 0.0, "host_cpu_s": 0.0, "modelled_host_cpu_s": 0.0, "host_cpu_dropped_s": 0.0,
            "io_wait_s": 0.0, "checkpoint_s": 0.0, "checkpoint_bytes": 0,
            "evaluation_s": 0.0, "epoch_end_s": 0.0, "window_s": 0.0, "samples_in_window": 0,
            "bytes_in_window": 0, "epoch_time_s": 0.0, "worker_pids": []}


def _evaluation_steps(m: WorkloadModel, size: int) -> int:
    ev = m.train.evaluation
    if ev is None:
        return 0
    if ev.steps:
        return ev.steps
    samples = (m.dataset.num_files_eval // max(size, 1)) * m.dataset.num_samples_per_file
    return math.ceil(samples / max(m.reader.batch_size_eval, 1))


def _run_rank(plan: RankPlan, sync: Callable[[], None], keep_checkpoints: bool | str) -> dict[str, Any]:
    m = plan.model
    compute_rng = np.random.default_rng([plan.seed, plan.rank, 0xC0])
    edge_rng = np.random.default_rng([plan.seed, plan.rank, 0xE0])
    epochs: list[dict[str, Any]] = []
    order: dict[str, list[int]] = {}
    result: dict[str, Any] = {"rank": plan.rank, "epochs": epochs, "complete": False, "error": None}
    ckpt = _Checkpointer(plan)
    loader: Any = None
    global_step = 0
    sleeper = _Sleeper()
    # host CPU a step could not spend inside its modelled wall time (the cores were busy), spent
    # by later steps that have time left; at most one mean step's CPU is carried, so a host
    # that is slower than the job's does not pile it up
    cpu_debt, cpu_debt_max = 0.0, float(m.train.computation_host_cpu.mean or 0.0)
    total_cap = m.train.total_training_steps
    ev = m.train.evaluation
    eval_steps = _evaluation_steps(m, plan.size)
    end_time = m.train.epoch_end_time
    per_epoch_au = m.train.au_first_steps == "epoch"
    host = HostCpu(m.train.computation_host_threads) if spends_host_cpu(m) else None
    try:
        # What a training script imports before its first epoch (torch, the format's library) is
        # imported here, not inside the first epoch; forked workers inherit it.
        if plan.loader == "torch":
            from . import torchloader  # noqa: F401
        if plan.spec.io == "library":
            from .formats import prime_library

            prime_library(plan.spec.fmt)
        # The DataLoader's events come from the capture hooks in a traced torch replay; else from here
        # (the same names and args a captured job has, so a replay trace is analysed like the real one).
        own_events = not _loader_events_from_hooks(plan)
        # the interpreter's objects so far (torch, numpy, the formats' libraries: ~10^5) are left
        # out of the garbage collector's scans: a full scan of them takes ~70 ms, a young one ~1 ms,
        # loop overhead a training step of the job did not have in its measured time (collected
        # first, so no garbage is frozen; unfrozen at the rank's end)
        gc.collect()
        gc.freeze()
        for epoch in range(1, m.train.epochs + 1):
            INTERRUPT.check()
            batches = epoch_batches(plan, epoch)
            if total_cap is not None:
                batches = batches[: max(0, total_cap - global_step)]
            if not batches:
                break
            rec = _new_record(epoch)
            epochs.append(rec)
            ids: list[int] = []
            pids: set[int] = set()
            modelled_steps, cpu_steps = epoch_compute(m, compute_rng, len(batches), epoch, global_step)
            t_start = t_prev = time.perf_counter()
            if loader is None or getattr(loader, "closed", False):  # worker start-up is part of the epoch
                loader = make_loader(plan)
            ev_epoch = REGIONS.begin("epoch", "pipeline", epoch=epoch - 1) if own_events else None
            batch_iter = iter(loader.epoch(batches))
            step = -1
            while True:
                step += 1
                ev_fetch = REGIONS.begin("fetch", "dataloader", epoch=epoch - 1, step=step) if own_events else None
                try:
                    res = next(batch_iter)
                except StopIteration:
                    REGIONS.end(ev_fetch, batch_size=0, last=1)
                    break
                REGIONS.end(ev_fetch, batch_size=len(res.samples))
                ev_step = REGIONS.begin("step", "compute", epoch=epoch - 1, step=step) if own_events else None
                clocks = (time.process_time_ns(), time.thread_time_ns()) if ev_step else (0, 0)
                INTERRUPT.check()  # a Ctrl-C whose KeyboardInterrupt was swallowed still stops here
                t_got = time.perf_counter()
                # the step starts when the loader had the batch (what the loader does after that,
                # and the interpreter's garbage collections, are the replay's loop overhead)
                t_recv = min(res.received, t_got) if res.received is not None else t_got
                sleeper.debt += t_got - t_recv  # taken out of this step's sleep
                modelled = float(modelled_steps[step])
                warm = global_step < len(m.train.warmup_computation_time) or (
                    epoch > 1 and step < len(m.train.epoch_warmup_computation_time))
                ev_warm = REGIONS.begin("warmup", "compute", epoch=epoch - 1, step=step) if warm else None
                if host is not None:
                    # the step's host CPU first (it competes with the loader's workers as the job's did),
                    # then a sleep for the rest of its compute time
                    b0 = time.perf_counter()
                    want = float(cpu_steps[step]) + cpu_debt
                    # the CPU work ends where the step's time ends, less what earlier steps overran
                    # (sleeper.debt): a step whose CPU fills its time has no sleep to repay that from
                    spent_cpu = host.spend(want, deadline=b0 + max(0.0, modelled - sleeper.debt))
                    unspent = max(want - spent_cpu, 0.0)
                    cpu_debt = min(unspent, cpu_debt_max)
                    rec["host_cpu_s"] += spent_cpu
                    rec["host_cpu_dropped_s"] += unspent - cpu_debt  # beyond the one step's carried on
                    rec["modelled_host_cpu_s"] += float(cpu_steps[step])
                    compute = sleeper.sleep(modelled, spent=time.perf_counter() - b0)
                else:
                    compute = sleeper.sleep(modelled)
                REGIONS.end(ev_warm)
                global_step += 1
                ck0 = time.perf_counter()
                if ckpt.due_step(global_step):
                    rec["checkpoint_bytes"] += ckpt.save()
                ck = time.perf_counter() - ck0
                sync()
                if ev_step:  # the training process's CPU in the step, as the capture hooks measure it
                    cpu_ns, own_ns = time.process_time_ns() - clocks[0], time.thread_time_ns() - clocks[1]
                    REGIONS.end(ev_step, cpu_time=cpu_ns // 1000,
                                cpu_threads=max(1, round(cpu_ns / own_ns)) if own_ns > 0 else 1)
                rec["steps"] += 1
                rec["samples"] += len(res.samples)
                rec["bytes_read"] += res.nbytes
                rec["checkpoint_s"] += ck
                pids.add(res.worker_pid)
                if plan.record_order:
                    ids.extend(res.samples)
                n_samples, n_bytes = len(res.samples), res.nbytes
                del res  # the batch is let go here, inside the step, as a training loop's is
                t_end = time.perf_counter()
                # The model's compute time is the job's whole loop body, its own overhead included;
                # the replay's (letting go of the batch, bookkeeping) is taken out of the next sleeps
                over = max((t_end - t_got) - compute - ck, 0.0)
                sleeper.debt += over
                compute += over + (t_got - t_recv)
                # DLIO leaves the run's first step out of AU and throughput (its own runs: every epoch's)
                if (step > 0) if per_epoch_au else (global_step > 1):
                    rec["compute_s"] += compute
                    rec["modelled_compute_s"] += modelled
                    rec["io_wait_s"] += t_recv - t_prev
                    rec["window_s"] += t_end - t_prev
                    rec["samples_in_window"] += n_samples
                    rec["bytes_in_window"] += n_bytes
                t_prev = t_end
                rec["epoch_time_s"] = t_end - t_start  # so far (an interrupted epoch keeps it)
            REGIONS.end(ev_epoch, steps=rec["steps"])
            # the epoch's end, after the loop over the loader, as in a training script
            if ckpt.due_epoch(epoch):
                ck0 = time.perf_counter()
                rec["checkpoint_bytes"] += ckpt.save()
                rec["checkpoint_s"] += time.perf_counter() - ck0
                sync()
            if ev is not None and eval_steps and epoch >= ev.after_epoch and (
                    epoch - ev.after_epoch) % ev.every_n_epochs == 0:
                e0 = time.perf_counter()
                ev_eval = REGIONS.begin("evaluate", "pipeline", epoch=epoch - 1, steps=eval_steps)
                for t in ev.computation_time.sample(compute_rng, eval_steps):
                    INTERRUPT.check()
                    sleeper.sleep(max(0.0, float(t)))
                REGIONS.end(ev_eval)
                sync()
                rec["evaluation_s"] += time.perf_counter() - e0
            if end_time.is_known and (end_time.mean or 0) > 0:
                e0 = time.perf_counter()
                ev_end = REGIONS.begin("epoch_end", "pipeline", epoch=epoch - 1)
                sleeper.sleep(max(0.0, float(end_time.sample(edge_rng, 1)[0])))
                REGIONS.end(ev_end)
                rec["epoch_end_s"] += time.perf_counter() - e0
            rec["epoch_time_s"] = time.perf_counter() - t_start
            rec["worker_pids"] = sorted(pids)
            if plan.record_order:
                order[str(epoch)] = ids
        if epochs and cpu_debt:  # carried past the last step: never spent
            epochs[-1]["host_cpu_dropped_s"] += cpu_debt
        INTERRUPT.check()
        result["complete"] = True
    except KeyboardInterrupt:
        result["error"] = None
    except threading.BrokenBarrierError:
        result["error"] = "another accelerator stopped (barrier broken)"
    except ReplayError as exc:
        result["error"] = str(exc)
    finally:
        gc.unfreeze()
        if loader is not None:
            loader.close()
        if host is not None:
            host.close()
        if not (keep_checkpoints is True or (keep_checkpoints == KEEP_ON_SUCCESS and result.get("error") is None)):
            ckpt.cleanup()
    result["order"] = order if plan.record_order else None
    return result


def _rank_process(plan: RankPlan, barrier: Any, results: Any, keep_checkpoints: bool | str) -> None:
    def sync() -> None:
        # A KeyboardInterrupt raised inside the barrier's own locks leaves them half released
        # ("lock is not owned" tracebacks from the rank): while waiting, Ctrl-C only sets the
        # flag, and it is raised here, after the wait, at a safe point.
        with INTERRUPT.catching("flag"):
            try:
                barrier.wait(timeout=BARRIER_TIMEOUT_S)
            except threading.BrokenBarrierError:
                if INTERRUPT.requested:  # a peer stopped for the same Ctrl-C
                    raise KeyboardInterrupt from None
                raise
        INTERRUPT.check()

    # Forked from the parent: its flag (set if a Ctrl-C came before the fork) carries over.
    # The handler stays until the process ends: a second SIGINT must not cut the partial result.
    INTERRUPT.install("first")
    end_with_parent()  # a killed parent cannot stop the ranks: they would wait at its barrier for good
    try:
        res = run_rank(plan, sync, keep_checkpoints)
    except KeyboardInterrupt:
        res = {"rank": plan.rank, "epochs": [], "complete": False, "error": None, "order": None}
    if not res["complete"]:
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001 - best effort to release peers
            pass
    results.put(res)


# --------------------------------------------------------------------------- orchestration


def default_out(model: WorkloadModel) -> Path:
    """``replays/<model name>-<UTC time>``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = (model.model.name or model.dataset.format).replace("/", "_")
    return Path("replays") / f"{name}-{stamp}"


def choose_loader(config: ReplayConfig) -> tuple[str, str]:
    """(``torch`` | ``builtin``, why) for this replay (see :class:`ReplayConfig`)."""
    m = config.model
    have_torch = importlib.util.find_spec("torch") is not None
    if config.loader == "builtin":
        return "builtin", "--loader builtin"
    if config.loader == "torch":
        if not have_torch:
            raise ReplayError("--loader torch: torch is not importable here; install dlreplay[torch] "
                              "(torch==2.13.0) or use --loader builtin")
        if m.reader.worker_kind == "thread":
            raise ReplayError("--loader torch: reader.worker_kind=thread has no PyTorch DataLoader equivalent "
                              "(its workers are processes); use --loader builtin")
        return "torch", "--loader torch"
    if m.framework != "pytorch" or m.reader.data_loader != "pytorch":
        return "builtin", f"the model's loader is {m.framework}/{m.reader.data_loader}, not PyTorch's DataLoader"
    if m.reader.worker_kind == "thread":
        return "builtin", "reader.worker_kind=thread (PyTorch's workers are processes)"
    if not have_torch:
        return "builtin", "torch is not installed (pip install 'dlreplay[torch]' for PyTorch's own DataLoader)"
    return "torch", "the model's loader is PyTorch's DataLoader"


def _import_loader(loader: str) -> None:
    """Import torch before the replay starts (seconds on a loaded machine), as a training script
    does before its first epoch; accelerator processes forked from here inherit it."""
    if loader == "torch":
        from . import torchloader  # noqa: F401


def _worker_spec(config: ReplayConfig, manifest: dict[str, Any]) -> WorkerSpec:
    m = config.model
    files = manifest["files"]
    md = m.reader.metadata_per_sample
    return WorkerSpec(
        data_dir=str(config.data_dir.resolve()), fmt=m.dataset.format, io=config.io,
        paths=tuple(f["path"] for f in files), file_bytes=tuple(int(f["bytes"]) for f in files),
        records=tuple(tuple((int(a), int(b)) for a, b in f["records"]) if f.get("records") else None for f in files),
        samples_per_file=m.dataset.num_samples_per_file, open_per_sample=m.reader.open_per_sample,
        transfer_size=m.reader.transfer_size, preprocess_time=m.reader.preprocess_time,
        stats_per_sample=float(md.stats or 0.0) if config.io == "posix" else 0.0,
        lseeks_per_sample=float(md.lseeks or 0.0) if config.io == "posix" else 0.0, seed=config.seed,
        file_buffering=m.reader.file_buffering, resize_bytes=m.dataset.record_length_resize,
        preprocess_cpu=m.reader.preprocess_host_cpu, start_method=m.reader.multiprocessing_context,
        batch_tensors=m.reader.batch_tensors, index_style=m.dataset.layout.index,
        memory_map=m.reader.memory_map and m.dataset.format == "indexed_binary")


def _ensure_dataset(config: ReplayConfig, echo: Callable[[str], None]) -> tuple[dict[str, Any], list[str]]:
    status = dataset_status(config.model, config.data_dir, config.seed)
    if status != "ready":
        if not config.generate:
            what = ("files were deleted or changed size since it was generated" if status == "damaged" else
                    f"status: {status}")
            raise ReplayError(f"{config.data_dir}: no complete dlreplay dataset for this model and seed "
                              f"({what}); run `dlreplay generate MODEL --data-dir {config.data_dir}` "
                              f"or drop --no-generate")
        echo(f"generating the dataset in {config.data_dir} …")
        res = generate_dataset(GenerateConfig(model=config.model, data_dir=config.data_dir, seed=config.seed,
                                              jobs=config.jobs))
        echo(f"generated {res.generated} file(s), {res.total_bytes / 1e6:,.1f} MB in {res.seconds:.1f} s")
    # Held (shared) until the replay ends: no dlreplay command rewrites the dataset meanwhile.
    try:
        hold = share_directory(config.data_dir, "--data-dir")
    except InUseError as exc:
        raise ReplayError(str(exc)) from None
    except OSError as exc:
        raise ReplayError(f"{config.data_dir}: cannot hold the dataset for reading "
                          f"({exc.strerror or exc})") from None
    if hold is not None:
        _CLAIMS.append(hold)
    if status != "ready" and dataset_status(config.model, config.data_dir, config.seed) != "ready":
        raise ReplayError(f"{config.data_dir}: the dataset changed after it was generated (another command "
                          f"wrote there); run the replay again")
    manifest = read_dataset_manifest(config.data_dir)
    if manifest is None or manifest.get("model_digest") != dataset_digest(config.model):
        raise ReplayError(f"{config.data_dir}: dataset manifest missing or for another model; regenerate it")
    return manifest, [*cache_warnings(int(manifest.get("total_bytes", 0))), *model_warnings(config.model)]


def model_warnings(model: WorkloadModel) -> list[str]:
    """Parts of the model this replay does not reproduce yet (said, never silently dropped)."""
    out = []
    if model.train.evaluation is not None:
        out.append("evaluation phases (train.evaluation) are replayed as their compute time per step; the "
                   "reads of the evaluation files are not (no evaluation files are generated)")
    if model.checkpoint.read_at_start:
        out.append("checkpoint.read_at_start is not replayed (no checkpoint is read before training)")
    return out


#: Output claims taken by the run_replay call in progress (released when it returns).
_CLAIMS: list[DirectoryClaim] = []


def _check_out(out: Path, allow_existing: bool) -> None:
    """Claim *out* (one writer per directory) and refuse it unless empty; ``allow_existing``: the
    traced child writing into the ``--out`` its parent claimed."""
    if out.exists() and not out.is_dir():
        raise ReplayError(f"{out} exists and is not a directory; choose another --out")
    try:
        if allow_existing:
            out.mkdir(parents=True, exist_ok=True)
            return
        _CLAIMS.append(claim_directory(out, "--out"))
    except OSError as exc:
        raise ReplayError(f"{out}: cannot create the output directory ({exc.strerror or exc})") from None
    if not is_empty_dir(out):
        raise ReplayError(f"{out} is not empty; choose another --out (results are never written over)")


def _metrics_doc(config: ReplayConfig, ranks: list[dict[str, Any]], manifest: dict[str, Any], started: str,
                 wall: float, interrupted: bool, warnings: Sequence[str], size: int, mpi: bool) -> dict[str, Any]:
    agg = aggregate(ranks, config.au_threshold)
    complete = not interrupted and all(r["complete"] for r in ranks) and len(ranks) == size
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    m = config.model
    return {
        "schema": METRICS_SCHEMA, "format_version": METRICS_FORMAT_VERSION, "complete": complete,
        "interrupted": interrupted, "errors": errors,
        "model_name": m.model.name, "dataset_format": m.dataset.format, "model_digest": dataset_digest(m),
        "data_dir": str(config.data_dir), "dataset_bytes": int(manifest.get("total_bytes", 0)),
        "io": config.io, "loader": choose_loader(config)[0], "loader_reason": choose_loader(config)[1],
        "accelerators": size, "mpi": mpi, "seed": config.seed,
        "batch_size": m.reader.batch_size, "read_threads": m.reader.read_threads,
        # the step's host CPU model (train.computation_host_cpu): mean CPU seconds per step, threads
        "host_cpu_per_step_s": m.train.computation_host_cpu.mean if spends_host_cpu(m) else 0.0,
        "host_cpu_threads": m.train.computation_host_threads if spends_host_cpu(m) else 0,
        "epochs_planned": m.train.epochs, "dlreplay_version": dlreplay.__version__,
        "started": started, "wall_time_s": wall, "warnings": list(warnings), **agg,
    }


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def run_replay(config: ReplayConfig, echo: Callable[[str], None] | None = None) -> ReplayResult:
    """Replay ``config.model``; writes ``<out>/metrics.json`` (and a trace unless ``trace`` is off).

    Ctrl-C (also one received before the call whose KeyboardInterrupt was swallowed, see
    :mod:`dlreplay.interrupt`) stops the replay and returns partial metrics, ``complete`` false.
    """
    held = len(_CLAIMS)
    try:
        return _run_replay(config, echo)
    finally:
        INTERRUPT.reset()  # this run has answered any Ctrl-C; the next starts clean
        while len(_CLAIMS) > held:
            _CLAIMS.pop().release()


def _run_replay(config: ReplayConfig, echo: Callable[[str], None] | None) -> ReplayResult:
    say = echo or (lambda s: None)
    if config.io not in IO_MODES:
        raise ReplayError(f"--io: expected one of {', '.join(IO_MODES)}, got {config.io!r}")
    if config.loader not in LOADERS:
        raise ReplayError(f"--loader: expected one of {', '.join(LOADERS)}, got {config.loader!r}")
    if config.accelerators is None:
        config = dataclasses.replace(config, accelerators=model_accelerators(config.model))
        if config.accelerators > 1 and not config.traced:
            say(f"{config.accelerators} accelerators, as many as the traced job's ranks (processes.ranks; "
                "--accelerators N to change)")
    assert config.accelerators is not None
    if config.accelerators < 1:
        raise ReplayError(f"--accelerators: expected a positive integer, got {config.accelerators}")
    check_replay_resources(config.model, config.accelerators, config.out)
    comm = _mpi_world()
    if comm is not None:
        return _run_mpi(config, comm, say)
    out = config.out or default_out(config.model)
    if config.trace and not config.traced:
        return _run_traced(config, out, say)
    _check_out(out, allow_existing=config.traced)
    manifest, warnings = _ensure_dataset(config, say)
    spec = _worker_spec(config, manifest)
    size = config.accelerators
    steps_per_epoch(config.model, size)  # validate early
    ckdir = str((out / "checkpoints").resolve())
    loader, why = choose_loader(config)
    _import_loader(loader)
    plans = [RankPlan(config.model, spec, r, size, config.seed, ckdir, config.record_order, loader)
             for r in range(size)]
    # One accelerator runs here: Ctrl-C raises KeyboardInterrupt. With several, this process
    # only waits for results: Ctrl-C sets the flag, polled by _run_local_ranks.
    with INTERRUPT.catching("first" if size == 1 else "flag"):
        say(f"replay started: {size} accelerator(s), {config.model.train.epochs} epoch(s) of "
            f"{steps_per_epoch(config.model, size)} step(s), {loader} loader ({why}); results in {out} "
            f"(Ctrl-C stops it, partial metrics are kept)")
        started, t0 = _now(), time.perf_counter()
        if size == 1:
            try:
                ranks = [run_rank(plans[0], lambda: None, config.keep_checkpoints)]
            except KeyboardInterrupt:
                ranks = [{"rank": 0, "epochs": [], "complete": False, "error": None, "order": None}]
            interrupted = not ranks[0]["complete"] and ranks[0]["error"] is None
        else:
            ranks, interrupted = _run_local_ranks(plans, config.keep_checkpoints)
        wall = time.perf_counter() - t0
        return _finish(config, out, ranks, manifest, started, wall, interrupted, warnings, size, False, say)


def _finish(config: ReplayConfig, out: Path, ranks: list[dict[str, Any]], manifest: dict[str, Any], started: str,
            wall: float, interrupted: bool, warnings: Sequence[str], size: int, mpi: bool,
            say: Callable[[str], None]) -> ReplayResult:
    doc = _metrics_doc(config, ranks, manifest, started, wall, interrupted, warnings, size, mpi)
    from .common import write_json_atomic

    write_json_atomic(out / METRICS_NAME, doc)
    if config.record_order:
        write_json_atomic(out / ORDER_NAME, {str(r["rank"]): r.get("order") for r in ranks})
    if not config.keep_checkpoints:
        try:
            (out / "checkpoints").rmdir()  # only when empty: the ranks deleted their own files
        except OSError:
            pass
    if doc["errors"] and not interrupted:
        raise ReplayError(f"replay failed ({'; '.join(doc['errors'])}); partial metrics in {out / METRICS_NAME}")
    return ReplayResult(out=out, metrics=doc, complete=doc["complete"], traced=False, warnings=tuple(warnings))


def _run_local_ranks(plans: list[RankPlan], keep: bool | str) -> tuple[list[dict[str, Any]], bool]:
    # fork, like PyTorch's default. The replay path never runs polars in this parent before
    # forking (fork after polars' thread pool has run can deadlock csv/parquet readers).
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(len(plans))
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_process, args=(p, barrier, results, keep), name=f"dlreplay-rank-{p.rank}")
             for p in plans]
    for p in procs:
        p.start()
    got: list[dict[str, Any]] = []
    interrupted = False
    deadline: float | None = None
    while len(got) < len(plans):
        try:
            got.append(results.get(timeout=1.0))
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break
            if deadline is not None and time.monotonic() > deadline:
                break
        except KeyboardInterrupt:  # SIGINT handled elsewhere than INTERRUPT's flag-only handler
            INTERRUPT.requested = True
        if INTERRUPT.requested and not interrupted:
            interrupted = True
            deadline = time.monotonic() + 30.0
            for p in procs:  # a Ctrl-C on the terminal reaches them anyway; a signal to us alone must too
                if p.is_alive() and p.pid:
                    try:
                        os.kill(p.pid, signal.SIGINT)
                    except ProcessLookupError:
                        pass
    for p in procs:
        p.join(5.0)
        if p.is_alive():
            p.terminate()
            p.join(1.0)
    dead = {r["rank"] for r in got}
    for p, plan in zip(procs, plans, strict=True):
        if plan.rank not in dead and not interrupted:
            got.append({"rank": plan.rank, "epochs": [], "complete": False,
                        "error": f"accelerator process ended unexpectedly (exit code {p.exitcode})", "order": None})
    got.sort(key=lambda r: r["rank"])
    if any(not r["complete"] and r["error"] is None for r in got):
        interrupted = True
    return got, interrupted


def _run_mpi(config: ReplayConfig, comm: Any, say: Callable[[str], None]) -> ReplayResult:
    rank, size = comm.Get_rank(), comm.Get_size()
    if config.trace and not config.traced:
        if rank == 0:
            raise ReplayError("tracing an MPI replay from inside mpiexec is not supported; run "
                              "`dlreplay capture -- mpiexec -n N python -m dlreplay replay ... --no-trace`, "
                              "or pass --no-trace")
        comm.Abort(1)
    out = Path(comm.bcast(str(config.out or default_out(config.model)) if rank == 0 else None, root=0))
    err: str | None = None
    manifest: dict[str, Any] = {}
    warnings: list[str] = []
    if rank == 0:
        try:
            _check_out(out, allow_existing=config.traced)
            manifest, warnings = _ensure_dataset(config, say)
            steps_per_epoch(config.model, size)
        except ReplayError as exc:
            err = str(exc)
    err = comm.bcast(err, root=0)
    if err:
        if rank == 0:
            raise ReplayError(err)
        sys.exit(1)
    manifest = comm.bcast(manifest if rank == 0 else None, root=0)
    spec = _worker_spec(config, manifest)
    loader, _ = choose_loader(config)
    _import_loader(loader)
    plan = RankPlan(config.model, spec, rank, size, config.seed, str((out / "checkpoints").resolve()),
                    config.record_order, loader)
    comm.Barrier()
    started, t0 = _now(), time.perf_counter()
    res = run_rank(plan, comm.Barrier, config.keep_checkpoints)
    wall = time.perf_counter() - t0
    ranks = comm.gather(res, root=0)
    if rank != 0:
        if res.get("error"):
            sys.exit(1)
        return ReplayResult(out=out, metrics={}, complete=res["complete"], traced=False)
    interrupted = any(not r["complete"] and r["error"] is None for r in ranks)
    return _finish(config, out, sorted(ranks, key=lambda r: r["rank"]), manifest, started, wall, interrupted,
                   warnings, size, True, say)


def _run_traced(config: ReplayConfig, out: Path, say: Callable[[str], None]) -> ReplayResult:
    """Generate outside the trace, then re-run this replay as ``python -m dlreplay replay`` under DFTracer."""
    from dlreplay.capture import CaptureConfig, run_capture

    _check_out(out, allow_existing=False)
    manifest, warnings = _ensure_dataset(config, say)
    model_path = out / "model.yaml"
    save_model(config.model, model_path)
    cmd = [sys.executable, "-m", "dlreplay", "replay", str(model_path.resolve()),
           "--data-dir", str(config.data_dir.resolve()), "--accelerators", str(config.accelerators),
           "--out", str(out.resolve()), "--no-trace", "--_traced", "--no-generate", "--io", config.io,
           "--au-threshold", str(config.au_threshold), "--seed", str(config.seed), "--loader", config.loader,
           "--quiet"]
    if config.record_order:
        cmd.append("--record-order")
    # the replay's checkpoint files are deleted here, after the trace: not the workload's I/O
    cmd.append("--keep-checkpoints" if config.keep_checkpoints else "--_checkpoints-after-trace")
    ckdir = out.resolve() / "checkpoints"
    started = _now()
    try:
        INTERRUPT.check()  # a Ctrl-C so far whose KeyboardInterrupt was swallowed (see dlreplay.interrupt)
        say(f"replay started (traced): {config.accelerators} accelerator(s), {config.model.train.epochs} epoch(s), "
            f"{choose_loader(config)[0]} loader; results and trace in {out} (Ctrl-C stops it, partial metrics "
            f"are kept)")
        cap = run_capture(CaptureConfig(command=tuple(cmd), out=out, force=True,
                                        data_dirs=(str(config.data_dir.resolve()), str(ckdir)),
                                        name=config.model.model.name or "replay"))
    except KeyboardInterrupt:
        return _not_started(config, out, manifest, started, warnings)
    finally:
        if not config.keep_checkpoints:
            shutil.rmtree(ckdir, ignore_errors=True)
    path = out / METRICS_NAME
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError):
        if cap.status == "interrupted":  # stopped before its first step
            return _not_started(config, out, manifest, started, warnings)
        raise ReplayError(f"the traced replay wrote no metrics ({path}); exit code {cap.exit_code}, "
                          f"trace status {cap.status} in {out}") from None
    interrupted = cap.status == "interrupted" or bool(metrics.get("interrupted"))
    if not interrupted and (cap.exit_code != 0 or metrics.get("errors")):  # failed: not a Ctrl-C (exit 130)
        detail = "; ".join(metrics.get("errors") or []) or f"the traced replay exited with code {cap.exit_code}"
        raise ReplayError(f"replay failed ({detail}); partial metrics and trace in {out}")
    return ReplayResult(out=out, metrics=metrics, complete=bool(metrics.get("complete")) and cap.exit_code == 0,
                        traced=True, warnings=tuple(warnings))


def _not_started(config: ReplayConfig, out: Path, manifest: dict[str, Any], started: str,
                 warnings: Sequence[str]) -> ReplayResult:
    """Metrics of a replay interrupted before its first step: no epochs, ``complete`` false."""
    from .common import write_json_atomic

    doc = _metrics_doc(config, [], manifest, started, 0.0, True, warnings, config.accelerators, False)
    write_json_atomic(out / METRICS_NAME, doc)
    return ReplayResult(out=out, metrics=doc, complete=False, traced=config.trace, warnings=tuple(warnings))


# --------------------------------------------------------------------------- find max accelerators


def find_max_accelerators(config: ReplayConfig, limit: int = 64,
                          echo: Callable[[str], None] | None = None) -> list[tuple[int, float | None]]:
    """Largest N whose AU stays >= the threshold: try 1, 2, 4, … then bisect. Returns (N, AU %) measured.

    Each trial is an untraced replay into ``<out>/n<N>``.
    """
    say = echo or (lambda s: None)
    base = config.out or default_out(config.model)
    measured: dict[int, float | None] = {}

    def trial(n: int) -> bool:
        if n > config.model.dataset.num_files:
            return False
        cfg = dataclasses.replace(config, accelerators=n, out=base / f"n{n}", trace=False)
        res = run_replay(cfg, echo=say)
        if not res.complete:  # interrupted: stop searching (partial metrics are in cfg.out)
            raise KeyboardInterrupt
        au = res.metrics["overall"].get("au_percent")
        measured[n] = au
        say(f"accelerators {n}: AU {au if au is None else round(au, 2)} %")
        return au is not None and au >= config.au_threshold

    good, bad = 0, None
    n = 1
    while n <= limit:
        if trial(n):
            good, n = n, n * 2
        else:
            bad = n
            break
    if bad is not None and good:
        lo, hi = good, bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if trial(mid):
                lo = mid
            else:
                hi = mid
    return sorted(measured.items())


def render_result(result: ReplayResult) -> str:
    """The metrics table of a replay."""
    return render_table(result.metrics)
