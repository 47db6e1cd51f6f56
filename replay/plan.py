"""What one accelerator does: its plan, its shard's order of samples, its steps' compute.

Rank r of N reads the dataset files r::N (or, with DLIO's sample order, its block of the
global sample indices), as many samples as PyTorch's ``DistributedSampler`` gives a rank
(:func:`rank_share`: padded to ``ceil`` by repeating samples from the start, or ``floor``
with ``reader.drop_last``); each epoch's batches and each step's modelled compute time are
drawn from the run's seed, so a replay is reproducible.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlreplay.model import WorkloadModel

from .common import ReplayError
from .loader import WorkerSpec


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


def sample_files(model: WorkloadModel) -> int:
    """The dataset's files as the samples see them: every file, or each sample's group of
    ``dataset.files_per_sample`` files (file ``i`` of the plan reads files ``i*k .. i*k+k-1``)."""
    return model.dataset.num_files // max(1, model.dataset.files_per_sample)


def model_accelerators(model: WorkloadModel) -> int:
    """The accelerators a replay of ``model`` simulates unless told: the traced job's ranks
    (``processes.ranks``; a 2-rank DLIO run replayed on one accelerator read half its data),
    at most one per dataset file."""
    return max(1, min(model.processes.ranks, sample_files(model)))


def steps_per_epoch(model: WorkloadModel, size: int) -> int:
    """Steps per epoch for each of *size* accelerators (all ranks take the same count).

    DLIO's order takes ``floor(samples / batch / ranks)`` steps (its ``max_steps``, whole
    batches only); otherwise each rank reads its :func:`rank_share` of the samples, and
    ``reader.drop_last`` drops a last partial batch.
    """
    nfiles = sample_files(model)
    if nfiles < size:
        raise ReplayError(
            f"dataset.num_files: {nfiles} file(s) cannot be shared by {size} accelerators "
            f"(each reads files r::N); use fewer accelerators or more files"
        )
    b = model.reader.batch_size
    if model.reader.sample_order == "dlio":
        steps = nfiles * model.dataset.num_samples_per_file // b // size
    else:
        samples = rank_share(model, size)
        steps = samples // b if model.reader.drop_last else math.ceil(samples / b)
    if model.train.steps_per_epoch:
        steps = min(steps, model.train.steps_per_epoch)
    return steps


def rank_share(model: WorkloadModel, size: int) -> int:
    """Samples each of *size* ranks reads per epoch in PyTorch's order, as
    ``torch.utils.data.DistributedSampler`` shares a dataset of n samples: ``ceil(n / size)``
    (drop_last False, its default: the short ranks padded with samples repeated from the start)
    or ``floor(n / size)`` (``reader.drop_last``: the tail dropped). Not DLIO's order (its own
    sampler: :func:`steps_per_epoch`)."""
    total = sample_files(model) * model.dataset.num_samples_per_file
    return total // size if model.reader.drop_last else math.ceil(total / size)


def _own_samples(plan: RankPlan, rank: int, epoch: int) -> list[tuple[int, int]]:
    """Rank *rank*'s (file, sample) pairs of *epoch* from its own files r::N, shuffled as
    ``reader.file_shuffle`` and ``reader.sample_shuffle`` say."""
    m, rd = plan.model, plan.model.reader
    seed = rd.shuffle_seed if rd.shuffle_seed is not None else plan.seed
    files = list(range(rank, sample_files(m), plan.size))
    files = _shuffle(rd.file_shuffle, seed, files, (epoch, rank, 1))
    samples = [(f, k) for f in files for k in range(m.dataset.num_samples_per_file)]
    return _shuffle(rd.sample_shuffle, seed, samples, (epoch, rank, 2))


def _padding(plan: RankPlan, epoch: int, share: int) -> list[tuple[int, int]]:
    """The (file, sample) pairs this rank adds to its own files' samples to make *share*
    (empty when they hold enough): DistributedSampler's padding, the ranks short of their share
    taking in rank order first the samples other ranks hold beyond theirs (several samples a
    file: whole files r::N do not split as samples do), then the global samples from the
    start (file-major), as the sampler repeats them."""
    nfiles, spf, size = (
        sample_files(plan.model),
        plan.model.dataset.num_samples_per_file,
        plan.size,
    )
    held = [(nfiles - q + size - 1) // size * spf for q in range(size)]  # rank q's files: q::size
    short = [max(0, share - h) for h in held]
    if not short[plan.rank]:
        return []
    pool = [s for q in range(size) if held[q] > share for s in _own_samples(plan, q, epoch)[share:]]
    start = sum(short[: plan.rank])
    need = range(start, start + short[plan.rank])
    return [
        pool[i] if i < len(pool) else divmod((i - len(pool)) % (nfiles * spf), spf) for i in need
    ]


def _dlio_order(plan: RankPlan, epoch: int) -> list[tuple[int, int]]:
    """DLIO 2.0's PyTorch sampler (``dlio_sampler``): rank r takes the contiguous block of global
    sample indices [r*ceil(N/size), (r+1)*ceil(N/size)); with sample_shuffle ``seed`` the block is
    shuffled in place after seeding numpy's legacy generator with the seed, once per epoch (so
    epoch e's order is that permutation applied e times); ``random`` shuffles unseeded;
    ``file_shuffle`` has no effect on this path."""
    m, rd = plan.model, plan.model.reader
    spf = m.dataset.num_samples_per_file
    total = sample_files(m) * spf
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
        share = rank_share(m, plan.size)  # DistributedSampler's count: the last ones padded
        samples = _own_samples(plan, plan.rank, epoch)[:share] + _padding(plan, epoch, share)
    steps = steps_per_epoch(m, plan.size)
    b = rd.batch_size
    batches = [samples[i * b : (i + 1) * b] for i in range(steps)]
    return [
        x for x in batches if x and (len(x) == b or not (rd.drop_last or rd.sample_order == "dlio"))
    ]


def spends_host_cpu(model: WorkloadModel) -> bool:
    """Whether the model's steps spend host CPU (``train.computation_host_cpu`` not 0)."""
    d = model.train.computation_host_cpu
    return d.is_known and max(d.mean or 0.0, d.max or 0.0, d.value or 0.0) > 0


def epoch_compute(
    model: WorkloadModel, rng: np.random.Generator, steps: int, epoch: int, first_global_step: int
) -> tuple[np.ndarray, np.ndarray]:
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


def step_compute(
    model: WorkloadModel, draws: np.ndarray, epoch: int, first_global_step: int
) -> np.ndarray:
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
        out[:n] = run[first_global_step : first_global_step + n]
    return out


def evaluation_steps(m: WorkloadModel, size: int) -> int:
    """Steps of each evaluation on one of *size* accelerators (0: the model has no evaluation)."""
    ev = m.train.evaluation
    if ev is None:
        return 0
    if ev.steps:
        return ev.steps
    samples = (m.dataset.num_files_eval // max(size, 1)) * m.dataset.num_samples_per_file
    return math.ceil(samples / max(m.reader.batch_size_eval, 1))
