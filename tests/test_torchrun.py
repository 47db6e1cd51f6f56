"""torchrun jobs: real ``dlreplay capture -- torchrun`` of a DDP job (gloo, DistributedSampler),
its ranks, shares and collectives found, in two variants that differ in every parameter
inferred here (rank count 2 / 3, per-rank batch 2 / 3)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.distill import distill
from dlreplay.analyze.passes import TraceView
from dlreplay.analyze.passes.ranks import own_compute_steps, pass_ranks, rank_table
from dlreplay.analyze.trace import vocabulary as voc
from dlreplay.capture import CaptureConfig, run_capture
from dlreplay.replay import ReplayConfig, run_replay
from dlreplay.replay.plan import model_accelerators, steps_per_epoch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_torchrun.py"
FILES = 12  # shared evenly by 2 and by 3 ranks: DistributedSampler pads nothing
EPOCHS = 2

#: variant -> (ranks, per-rank batch, workers per rank)
VARIANTS = {"two": (2, 2, 1), "three": (3, 3, 0)}


def _capture(root: Path, ranks: int, batch: int, workers: int) -> dict:
    data, out = root / "data", root / "trace"
    cmd = (
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free rendezvous port: runs beside other torchrun jobs
        "--nproc-per-node",
        str(ranks),
        str(EXAMPLE),
        "--data-dir",
        str(data),
        "--num-files",
        str(FILES),
        "--volume",
        "8",
        "--batch-size",
        str(batch),
        "--workers",
        str(workers),
        "--epochs",
        str(EPOCHS),
        "--threads",
        "1",
        "--checkpoint-every-epoch",
        "--checkpoint-dir",
        str(root / "ck"),
        "--report",
        str(root / "report.json"),
        "--quiet",
    )
    result = run_capture(
        CaptureConfig(command=cmd, out=out, data_dirs=(str(data),), job_output=root / "job.log")
    )
    assert result.exit_code == 0, (root / "job.log").read_text()[-3000:]
    lt = load_trace(out)
    events = voc.ensure_roles(lt.events)
    return {
        "ranks": ranks,
        "batch": batch,
        "workers": workers,
        "result": result,
        "events": events,
        "view": TraceView(events, lt.manifest),
        "model": distill(lt.events, manifest=lt.manifest, source=str(out)),
        "report": json.loads((root / "report.json").read_text()),
    }


@pytest.fixture(scope="module", params=list(VARIANTS))
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    ranks, batch, workers = VARIANTS[request.param]
    return _capture(tmp_path_factory.mktemp(f"torchrun-{request.param}"), ranks, batch, workers)


def _agent(events: pl.DataFrame) -> int:
    """The launcher's process: the traced process whose parent is not traced."""
    procs = events.group_by("pid").agg(pl.col("ppid").drop_nulls().first())
    traced = set(procs["pid"].to_list())
    roots = [p for p, pp in procs.iter_rows() if pp not in traced]
    assert len(roots) == 1, procs
    return int(roots[0])


def test_ranks_from_the_launcher(job: dict) -> None:
    """Every rank process recorded its rank and world size; the agent is no rank or reader."""
    ev, n = job["events"], job["ranks"]
    rt = rank_table(ev)
    assert rt["rank"].to_list() == list(range(n))
    assert set(rt["world_size"].to_list()) == {n}
    agent = _agent(ev)
    assert agent not in rt["pid"].to_list()
    assert agent not in job["view"].consumers
    assert agent not in job["view"].workers
    # the ranks are the agent's children; their workers theirs
    parents = dict(ev.group_by("pid").agg(pl.col("ppid").drop_nulls().first()).iter_rows())
    assert {parents[p] for p in rt["pid"].to_list()} == {agent}
    assert sorted(job["view"].consumers) == sorted(rt["pid"].to_list())
    assert job["model"].processes.ranks == n
    assert model_accelerators(job["model"]) == n
    assert job["model"].provenance.fields["processes.ranks"].method.startswith("init_process_group")


def test_per_rank_share(job: dict) -> None:
    """DistributedSampler's share: each rank loads files / ranks samples per epoch in batches of
    its own size, as the job counted them; the model replays the same steps per rank."""
    n, b = job["ranks"], job["batch"]
    share = FILES // n
    per_rank = pass_ranks(job["view"])["ranks"]
    assert per_rank["count"] == n and per_rank["processes"] == n
    assert [r["samples_per_epoch"] for r in per_rank["per_rank"]] == [share] * n
    assert [r["steps_per_epoch"] for r in per_rank["per_rank"]] == [math.ceil(share / b)] * n
    assert job["report"]["samples_per_rank"] == [share * EPOCHS] * n
    model = job["model"]
    assert model.reader.batch_size == b
    assert model.dataset.num_files == FILES
    assert steps_per_epoch(model, n) == job["report"]["steps_per_rank"][0] // EPOCHS


def test_collectives_inside_steps(job: dict) -> None:
    """The job's per-step dist.all_reduce (its loss) is a comm event in every step of every rank."""
    ev = job["events"]
    rt = rank_table(ev)
    steps = job["report"]["steps_per_rank"][0]
    reduces = ev.filter(
        (pl.col("cat") == "comm") & (pl.col("name") == "all_reduce") & (pl.col("role") == voc.COMM)
    )
    per_pid = dict(reduces.group_by("pid").len().iter_rows())
    assert {per_pid.get(p, 0) for p in rt["pid"].to_list()} == {steps}
    assert reduces["epoch"].null_count() == 0
    ranks = pass_ranks(job["view"])["ranks"]["per_rank"]
    assert all(r["comm_calls"] >= steps and r["comm_s"] > 0 for r in ranks)


def test_own_compute_is_the_last_arrivals(job: dict) -> None:
    """A step's own compute is never longer than any rank's measured step, and equals that of
    the rank whose batch arrived last (it waited for no one)."""
    st = job["view"].step_table
    own = pl.concat(
        [
            own_compute_steps(st, pid).select("pid", "ts", pl.col("compute_us").alias("own"))
            for pid in st["pid"].unique().to_list()
        ]
    ).join(st.select("pid", "ts", "epoch", "compute_us"), on=["pid", "ts"])
    assert own.height == st.height
    assert (own["own"] <= own["compute_us"]).all()
    pos = pl.int_range(pl.len()).over("pid", "epoch").alias("pos")
    late = (
        own.sort("ts")
        .with_columns(pos)
        .group_by("epoch", "pos")
        .agg(pl.col("own").sort_by("ts").last(), pl.col("compute_us").sort_by("ts").last())
    )
    assert (late["own"] == late["compute_us"]).all()


def test_replay_runs_the_ranks_with_their_share(job: dict, tmp_path: Path) -> None:
    """The model's replay runs as many accelerators as the job's ranks, each loading the rank's
    share per epoch."""
    n = job["ranks"]
    model = job["model"]
    result = run_replay(
        ReplayConfig(
            model=model, data_dir=tmp_path / "data", out=tmp_path / "out", trace=False, jobs=1
        )
    )
    assert result.complete and result.metrics["accelerators"] == n
    shares = [r["samples"] for r in sorted(result.metrics["ranks"], key=lambda r: r["rank"])]
    assert shares == job["report"]["samples_per_rank"]


def test_distributed_hooks_are_transparent(tmp_path: Path) -> None:
    """The wrappers call the original once with the job's arguments: same results, same
    exceptions, a failure of the hook's own bookkeeping a counted miss (a gloo group of one)."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    from dlreplay.capture.inject import distributed as hooks
    from dlreplay.capture.inject.hooks import MISSES

    init = hooks._wrap_init(c10d.init_process_group, c10d)
    reduce = hooks._wrap_collective(c10d.all_reduce, "all_reduce")
    gather = hooks._wrap_collective(c10d.all_gather_object, "all_gather")
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    assert init("gloo", store=store, rank=0, world_size=1) is None
    try:
        t = torch.arange(4.0)
        assert reduce(t) is None and t.tolist() == [0.0, 1.0, 2.0, 3.0]
        work = reduce(t, async_op=True)
        work.wait()
        out: list = [None]
        assert gather(out, {"a": 1}) is None and out == [{"a": 1}]
        for fn in (reduce, c10d.all_reduce):  # the job's error, unchanged
            with pytest.raises(TypeError):
                fn("not a tensor")
        assert getattr(hooks._depth, "n", 0) == 0
        before = dict(MISSES.counts)
        broken = hooks._wrap_init(lambda: None, object())  # get_rank() fails in the hook
        assert broken() is None
        key = ("torch.distributed.init_process_group", "error in the hook (AttributeError)")
        assert MISSES.counts.get(key, 0) == before.get(key, 0) + 1
    finally:
        c10d.destroy_process_group()
