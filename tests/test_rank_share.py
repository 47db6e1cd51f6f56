"""Each replay rank's share of the samples follows the sampler the model says the job used:
PyTorch's ``DistributedSampler`` (``reader.sample_order`` pytorch) pads every rank to
``ceil(n / N)`` samples by repeating from the start (``drop_last`` False, its default) or
drops the tail to ``floor(n / N)`` (``reader.drop_last``); DLIO's own sampler (sample_order
dlio) keeps its contiguous blocks and whole batches. Checked against torch's real sampler and
DataLoader, and in a real two-accelerator replay."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from dlreplay.model import apply_overrides, model_from_dict
from dlreplay.replay import ReplayConfig, run_replay
from dlreplay.replay.engine import RankPlan, epoch_batches, run_rank, steps_per_epoch
from dlreplay.replay.plan import rank_share
from dlreplay.replay.prepare import ensure_dataset, worker_spec

BASE = {
    "schema": "dlreplay.workload",
    "format_version": 1,
    "model": {"name": "ranks"},
    "dataset": {
        "format": "npy",
        "num_files": 6,
        "num_samples_per_file": 1,
        "record_length": {"type": "fixed", "value": 2048},
    },
    "reader": {"batch_size": 2, "read_threads": 1, "file_shuffle": "off", "sample_shuffle": "off"},
    "train": {"epochs": 2, "computation_time": 0.0005},
}


def make_model(*sets: str):
    return apply_overrides(model_from_dict(BASE), list(sets))


def planned(model, size: int, epoch: int = 1) -> list[list[int]]:
    """Global sample indices each of *size* ranks reads in *epoch*."""
    spf = model.dataset.num_samples_per_file
    return [
        [
            f * spf + k
            for b in epoch_batches(RankPlan(model, None, r, size, 0, "", False), epoch)
            for f, k in b
        ]  # type: ignore[arg-type]
        for r in range(size)
    ]


def sampler(n: int, size: int, rank: int, drop_last: bool) -> DistributedSampler:
    return DistributedSampler(
        range(n),  # type: ignore[arg-type]  # a sized sequence is all the sampler needs
        num_replicas=size,
        rank=rank,
        shuffle=False,
        drop_last=drop_last,
    )


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("n", "size", "batch"), [(12, 3, 2), (10, 3, 3), (7, 2, 2), (9, 4, 2)])
def test_share_is_distributed_samplers(n, size, batch, drop_last):
    """One sample a file: each rank reads exactly the indices torch's DistributedSampler gives
    it (own files r::N, then the padding from the start), in as many steps as torch's
    DataLoader over that sampler takes with the same drop_last."""
    m = make_model(
        f"dataset.num_files={n}",
        f"reader.batch_size={batch}",
        f"reader.drop_last={str(drop_last).lower()}",
    )
    got = planned(m, size)
    for r in range(size):
        s = sampler(n, size, r, drop_last)
        loader = DataLoader(range(n), batch_size=batch, sampler=s, drop_last=drop_last)  # type: ignore[arg-type]
        assert got[r] == [int(i) for b in loader for i in b]
        assert steps_per_epoch(m, size) == len(loader)
        assert len(s) == rank_share(m, size)
    assert rank_share(m, size) == (n // size if drop_last else -(-n // size))
    counts = Counter(i for share in got for i in share)
    if n % size == 0:  # nothing padded, nothing dropped: every sample once
        assert counts == Counter(range(n))
    elif drop_last:  # the tail dropped, nothing read twice
        assert max(counts.values()) == 1 and len(counts) == size * steps_per_epoch(m, size) * batch
    else:  # every sample read, the first ones twice to fill the short ranks
        assert set(counts) == set(range(n))
        assert sorted(i for i, c in counts.items() if c == 2) == list(range(size - n % size))


@pytest.mark.parametrize("drop_last", [False, True])
def test_share_with_shuffle_and_several_samples_a_file(drop_last):
    """Shuffled files and samples, 3 samples a file (5 files, 15 samples, 4 ranks): each rank
    reads the sampler's count in every epoch (in as many steps as torch's loader), the short
    ranks padded with what rank 0's two files hold beyond its share, then the first sample."""
    m = make_model(
        "dataset.num_files=5",
        "dataset.num_samples_per_file=3",
        "reader.batch_size=2",
        "reader.file_shuffle=seed",
        "reader.sample_shuffle=seed",
        f"reader.drop_last={str(drop_last).lower()}",
    )
    for epoch in (1, 2):
        got = planned(m, 4, epoch)
        for r, share in enumerate(got):
            s = sampler(15, 4, r, drop_last)
            loader = DataLoader(range(15), batch_size=2, sampler=s, drop_last=drop_last)  # type: ignore[arg-type]
            assert len(share) == sum(len(b) for b in loader) and len(s) == rank_share(m, 4)
            assert steps_per_epoch(m, 4) == len(loader)
        if drop_last:  # 3 a rank (12 of 15), each once
            assert Counter(i for share in got for i in share).most_common(1)[0][1] == 1
        else:  # 4 a rank: all 15 samples read, one twice (the sampler pads 1)
            counts = Counter(i for share in got for i in share)
            assert set(counts) == set(range(15)) and sum(counts.values()) == 16
    assert planned(m, 4, 1) != planned(m, 4, 2)  # the shuffle draws anew each epoch


@pytest.mark.parametrize("num_files", [12, 10])
def test_dlio_order_keeps_dlios_sampler(num_files):
    """DLIO's sampler: contiguous blocks of ceil(n / N), whole batches, floor(n / b / N) steps;
    no DistributedSampler padding whether n divides or not."""
    m = make_model(
        "reader.sample_order=dlio",
        f"dataset.num_files={num_files}",
        "reader.batch_size=2",
        "reader.drop_last=true",
    )
    block = -(-num_files // 3)
    got = planned(m, 3)
    assert steps_per_epoch(m, 3) == num_files // 2 // 3
    for r in range(3):
        assert got[r] == list(range(r * block, r * block + 2 * steps_per_epoch(m, 3)))


@pytest.mark.parametrize("drop_last", [False, True])
def test_replay_ranks_read_their_share(tmp_path, drop_last):
    """A real replay of 5 one-sample files on 2 accelerators (builtin loader): rank 1 reads the
    padded sample 0 (drop_last False) or rank 0 leaves file 4 out (drop_last True)."""
    m = make_model(
        "dataset.num_files=5",
        "reader.batch_size=2",
        "train.epochs=1",
        f"reader.drop_last={str(drop_last).lower()}",
    )
    run_replay(
        ReplayConfig(
            model=m,
            data_dir=tmp_path / "d",
            out=tmp_path / "o",
            accelerators=2,
            trace=False,
            record_order=True,
            loader="builtin",
            jobs=1,
        ),
        echo=lambda s: None,
    )
    order = json.loads((tmp_path / "o" / "sample-order.json").read_text())
    want = [[0, 2], [1, 3]] if drop_last else [[0, 2, 4], [1, 3, 0]]
    assert [order[str(r)]["1"] for r in (0, 1)] == want


@pytest.fixture(scope="module")
def twelve_files(tmp_path_factory: pytest.TempPathFactory):
    """A folder for 12 one-sample files, generated by the first test that needs them."""
    return tmp_path_factory.mktemp("twelve") / "d"


@pytest.mark.parametrize(
    ("size", "workers", "persistent"), [(2, 0, False), (2, 1, False), (3, 1, True)]
)
def test_a_rank_that_waited_computes_its_whole_next_step(
    tmp_path, twelve_files, size, workers, persistent
):
    """A replay rank that waited for the others at a step's barrier spends the whole modelled
    compute of its next step before the next barrier, as a job's rank that waited at the
    all-reduce computes its whole next step (the wait is no overhead of the replay to take out
    of later sleeps). Rank 0 of 2 or 3 over 12 files, 2 epochs of 30 ms steps, its peers 40 ms
    later at every barrier; no worker, one started every epoch, one persistent."""
    compute, late = 0.03, 0.04
    m = make_model(
        "dataset.num_files=12",
        "reader.batch_size=1",
        f"reader.read_threads={workers}",
        f"reader.persistent_workers={str(persistent).lower()}",
        "train.epochs=2",
        f"train.computation_time={compute}",
    )
    config = ReplayConfig(model=m, data_dir=twelve_files, out=tmp_path / "o", trace=False, jobs=1)
    manifest, _ = ensure_dataset(config, lambda s: None)
    plan = RankPlan(m, worker_spec(config, manifest), 0, size, 0, str(tmp_path / "ck"), False)
    marks: list[float] = []

    def sync() -> None:  # the slower peers: this rank waits for them at every barrier
        marks.append(time.perf_counter())
        time.sleep(late)
        marks.append(time.perf_counter())

    result = run_rank(plan, sync)
    steps = 12 // size
    assert result["complete"] and [e["steps"] for e in result["epochs"]] == [steps, steps]
    # from leaving one barrier to reaching the next: a fetch and the step's compute (sleeps
    # never end early; a late wake-up is repaid by the next sleeps, hence half of it at least);
    # with the wait taken out, the rank would sleep ~0 a step after its first wait
    between = [marks[i + 1] - marks[i] for i in range(1, len(marks) - 1, 2)]
    assert len(between) == 2 * steps - 1 and sum(between) >= 0.5 * len(between) * compute, between
