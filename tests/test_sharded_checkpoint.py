"""Sharded checkpoints, save and restore (issue 43, item 6).

One real job (examples/dcp_sharded.py: 2 ranks under torchrun, gloo, DDP, ``dcp.save`` every N
steps, ``dcp.load`` of the latest checkpoint at start) is captured with ``dlreplay capture``,
distilled and replayed: the model holds each rank's shard files, rank 0's metadata, their
write calls and the restore; the replay writes the same files with the same bytes per rank
and reads the restore back. The distill rules are also checked on event tables of other
shapes (3 ranks of per-rank ``torch.save`` shards, another interval and other sizes), and a
DLIO checkpoint-only workload (MLPerf Storage's) replays writes then reads at fewer ranks
with each rank's shard kept.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze.distill.base import Facts
from dlreplay.analyze.distill.checkpoint import checkpoint_section, save_io
from dlreplay.analyze.trace import load_trace
from dlreplay.model import load_model, model_from_dict
from dlreplay.replay.checkpoint import file_names, restore_reads, scaling
from dlreplay.schema import EVENT_SCHEMA

from .conftest import REPO

pytest.importorskip("torch.distributed.checkpoint")

EXAMPLE = REPO / "examples" / "dcp_sharded.py"
ARGS = ["--volume", "8", "--num-files", "8", "--hidden", "16", "--batch-size", "2"]


@pytest.fixture(scope="module")
def job(
    tmp_path_factory,
) -> dict:
    """A first run (one rank) leaves a checkpoint; the captured run (2 ranks) restores it,
    then saves every 2 steps; its model, distilled."""
    import subprocess

    from .conftest import run_cli

    tmp = tmp_path_factory.mktemp("dcp")
    common = [*ARGS, "--data-dir", str(tmp / "data"), "--checkpoint-dir", str(tmp / "ck")]
    first = subprocess.run(
        [sys.executable, str(EXAMPLE), *common, "--epochs", "1", "--checkpoint-every", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    report = tmp / "report.json"
    first_ck = tmp / "ck-first"
    shutil.copytree(tmp / "ck", first_ck)
    for attempt in range(2):
        if attempt:  # the retry restores what the first run left, as the first attempt did
            shutil.rmtree(tmp / "ck")
            shutil.copytree(first_ck, tmp / "ck")
            report.unlink(missing_ok=True)
        cap = run_cli(
            "capture",
            "--out",
            str(tmp / "trace"),
            "--force",
            "--",
            *cmd,
            str(EXAMPLE),
            *common,
            "--epochs",
            "1",
            "--checkpoint-every",
            "2",
            "--fsync",
            "--keep",
            "0",
            "--report",
            str(report),
            cwd=tmp,
        )
        # gloo's teardown at process exit still aborts a rank now and then (SIGABRT,
        # "terminate called without an active exception"; 1 of about 45 runs with the
        # barrier before destroy_process_group): the job's own exit, after its report. Once
        # more then; any other failure, or the abort twice, fails the test
        if cap.returncode == 0 or "terminate called without an active exception" not in cap.stderr:
            break
    assert cap.returncode == 0, cap.stderr
    run_cli("distill", str(tmp / "trace"), "-o", str(tmp / "model.yaml"), "-q", check=True)
    return {
        "tmp": tmp,
        "report": json.loads(report.read_text()),
        "model": load_model(tmp / "model.yaml"),
        "trace": tmp / "trace",
    }


def test_dcp_under_capture_records_each_ranks_save_and_restore(job: dict) -> None:
    report = job["report"]
    assert report["world_size"] == 2 and report["restored"]["step"] == 4
    ev = load_trace(job["trace"]).events
    ck = ev.filter(pl.col("cat") == "checkpoint").select(
        pl.col("name").cast(pl.String), pl.col("file").cast(pl.String), "size", "pid", "ts"
    )
    saves = ck.filter(pl.col("name") == "capture")
    restores = ck.filter(pl.col("name") == "restart")
    # one event per rank and checkpoint, named by the checkpoint directory
    assert saves.height == 2 * len(report["checkpoints"]) and restores.height == 2
    for c in report["checkpoints"]:
        mine = saves.filter(pl.col("file") == c["path"])
        assert mine["pid"].n_unique() == 2
        assert int(mine["size"].sum()) == sum(c["files"].values())  # shards and .metadata
    assert set(restores["file"]) == {report["restored"]["path"]}
    # DDP's state is whole on each rank: each rank reads the shards and .metadata of both
    assert restores["size"].to_list() == [report["restored"]["bytes"]] * 2
    # each save and restore carries its storage writer's/reader's own time, inside the call
    timed = (
        ev.filter(pl.col("cat") == "checkpoint")
        .select(pl.col("pid").cast(pl.Int64), pl.col("ts").cast(pl.Int64), "dur")
        .join(save_io(job["trace"]), on=["pid", "ts"], how="left")
    )
    assert timed.height == saves.height + restores.height
    assert timed["io_us"].null_count() == 0
    assert (timed["io_us"] > 0).all() and (timed["io_us"] <= timed["dur"]).all()
    # each save names its writer's sync_files (the job ran with --fsync); the .metadata's
    # bytes are on the one rank that wrote it, and the loads carry neither
    args = save_io(job["trace"]).join(
        saves.select(pl.col("pid").cast(pl.Int64), pl.col("ts").cast(pl.Int64)), on=["pid", "ts"]
    )
    assert args.height == saves.height and args["fsync"].to_list() == [1] * saves.height
    for c in report["checkpoints"]:
        mine = args.join(
            saves.filter(pl.col("file") == c["path"]).select(
                pl.col("pid").cast(pl.Int64), pl.col("ts").cast(pl.Int64)
            ),
            on=["pid", "ts"],
        )
        assert mine["metadata_bytes"].drop_nulls().to_list() == [c["files"][".metadata"]]


def test_distill_models_per_rank_shards_and_the_restore(job: dict) -> None:
    c = job["model"].checkpoint
    assert job["model"].processes.ranks == 2
    files = job["report"]["checkpoints"][0]["files"]
    assert c.enabled and c.layout == "dcp" and c.fsync and c.read_at_start
    assert c.steps_between_checkpoints == 2
    assert c.files_per_checkpoint == 3 and c.file_ranks == [0, 0, 1]
    assert c.bytes_per_checkpoint == sum(files.values())
    assert c.read_bytes_per_rank == job["report"]["restored"]["bytes"]
    plan = c.file_write_plan()
    assert plan is not None
    sizes = [sum(calls) for calls in plan]
    assert sizes == [files["__0_0.distcp"], files[".metadata"], files["__1_0.distcp"]]
    assert file_names(job["model"]) == ["__0_0.distcp", ".metadata", "__1_0.distcp"]


def test_replay_writes_each_ranks_shards_and_reads_the_restore(job: dict) -> None:
    from .conftest import run_cli

    tmp, model = job["tmp"], job["model"]
    out = tmp / "replay"
    res = run_cli(
        "replay",
        str(tmp / "model.yaml"),
        "--data-dir",
        str(tmp / "rdata"),
        "--out",
        str(out),
        "--keep-checkpoints",
        check=True,
    )
    assert "scaled" not in res.stdout  # as many ranks as the job
    files = job["report"]["checkpoints"][0]["files"]
    written = sorted((out / "checkpoints").glob("checkpoint-*"))
    assert len(written) == len(job["report"]["checkpoints"])
    for folder in written:
        got = {f.name: f.stat().st_size for f in folder.iterdir()}
        assert got == files  # the same files, the same bytes, each by its rank
    every = load_trace(out).events
    ev = every.filter(pl.col("cat") == "checkpoint")
    restarts = ev.filter(pl.col("name") == "restart")
    assert restarts["size"].to_list() == [model.checkpoint.read_bytes_per_rank] * 2
    # as in dcp.save, the ranks meet inside each save: before their shards, after them (rank 0
    # then writes the .metadata) and after that
    saves = ev.filter(pl.col("name") == "save").select(
        "pid", pl.col("ts").alias("s"), (pl.col("ts") + pl.col("dur")).alias("e")
    )
    meets = every.filter((pl.col("cat") == "comm") & (pl.col("name") == "barrier"))
    inside = meets.join(saves, on="pid").filter(pl.col("ts").is_between("s", "e"))
    assert inside.group_by("pid", "s").len()["len"].to_list() == [3] * saves.height
    first = every.filter(pl.col("file").cast(pl.String).str.contains("/checkpoint-0001/"))
    meta = first.filter(pl.col("file").cast(pl.String).str.ends_with(".metadata.tmp"))["ts"]
    shard1 = first.filter(pl.col("file").cast(pl.String).str.ends_with("__1_0.distcp"))
    assert meta.min() > (shard1["ts"] + shard1["dur"]).max()  # after rank 1's whole shard
    shutil.rmtree(out / "checkpoints")


#: A model to name a checkpoint's files with (file_names reads its checkpoint section only).
_BASE = {
    "schema": "dlreplay.workload",
    "format_version": 1,
    "dataset": {"format": "npy", "num_files": 4, "num_samples_per_file": 1, "record_length": 64},
    "reader": {"batch_size": 1},
}


def _table(rows: list[dict]) -> pl.DataFrame:
    cols = {
        k: [r.get(k) for r in rows] for k in ("pid", "ts", "dur", "cat", "name", "file", "size")
    }
    df = pl.DataFrame(cols).with_columns(
        [pl.col(k).cast(EVENT_SCHEMA[k]) for k in cols if k in EVENT_SCHEMA]
    )
    role = (
        pl.when((pl.col("cat") == "checkpoint") & (pl.col("name") == "capture"))
        .then(pl.lit("checkpoint.save"))
        .when((pl.col("cat") == "checkpoint") & (pl.col("name") == "restart"))
        .then(pl.lit("checkpoint.load"))
    )
    return df.with_columns(role.alias("role"))


@pytest.mark.parametrize(
    ("ranks", "every", "shard", "restore"),
    [(3, 5, 3000, True), (2, 3, 1200, False), (12, 4, 500, False)],
)
def test_distill_per_rank_torch_save_shards(ranks: int, every: int, shard: int, restore: bool):
    """Each rank torch.saves its own shard (ckpt_rank<r>.pt, rank r's shard r*shard + shard
    bytes in two writes) every *every* steps; rank 1 loads its shard at start when *restore*."""
    rows: list[dict] = []
    steps = pl.DataFrame({"pid": [100] * 20, "ts": [1000 + 100 * i for i in range(20)]})
    for k, step in enumerate(range(every, 20, every)):
        for r in range(ranks):
            ts = 1000 + 100 * (step - 1) + 50 + r
            size = shard * (r + 1)
            path = f"/ck/step{k}/ckpt_rank{r}.pt"
            pid = 100 + (ranks - 1 - r)  # pids in another order than ranks
            rows.append(
                dict(pid=pid, ts=ts, dur=20, cat="checkpoint", name="capture", file=path, size=size)
            )
            rows.append(
                dict(pid=pid, ts=ts + 1, dur=1, cat="POSIX", name="write", file=path, size=64)
            )
            rows.append(
                dict(
                    pid=pid, ts=ts + 2, dur=1, cat="POSIX", name="write", file=path, size=size - 64
                )
            )
    if restore:
        rows.append(
            dict(
                pid=101, ts=500, dur=30, cat="checkpoint", name="restart", file="/ck/x.pt", size=777
            )
        )
        rows.append(
            dict(pid=101, ts=505, dur=1, cat="POSIX", name="read", file="/ck/x.pt", size=777)
        )
    ev = _table(rows).sort("ts")
    saves = ev.filter(pl.col("role") == "checkpoint.save")
    ck = checkpoint_section(ev, saves, steps.with_columns(pl.col("pid").cast(pl.Int32)), Facts())
    assert ck.steps_between_checkpoints == every
    assert ck.files_per_checkpoint == ranks and ck.layout == "parts"
    assert ck.bytes_per_checkpoint == shard * ranks * (ranks + 1) // 2
    # files by rank: rank r's file is r's (its name sorts r-th, ckpt_rank2 before ckpt_rank10),
    # whatever the pids
    assert ck.file_ranks == list(range(ranks))
    assert ck.file_writes == [[[64, 1], [shard * (r + 1) - 64, 1]] for r in range(ranks)]
    assert ck.read_at_start is restore
    assert ck.read_bytes_per_rank == (777 if restore else None)


LLAMA = """\
model:
  name: llama_like
  type: transformer
  num_layers: {layers}
  parallelism: {{tensor: 1, pipeline: 1, data: {ranks}, zero_stage: 3}}
  transformer: {{vocab_size: 512, hidden_size: {hidden}, ffn_hidden_size: 256}}
framework: pytorch
workflow: {{generate_data: False, train: False, checkpoint: True}}
checkpoint:
  checkpoint_folder: checkpoints/llama_like
  num_checkpoints_write: {writes}
  num_checkpoints_read: {reads}
  fsync: True
"""


@pytest.mark.parametrize(
    ("ranks", "layers", "hidden", "writes", "reads", "replay_ranks", "run"),
    [(8, 2, 128, 3, 2, 2, True), (4, 3, 96, 2, 3, 1, False)],
)
def test_dlio_checkpoint_workload_writes_then_reads_scaled(
    tmp_path: Path, cli, ranks, layers, hidden, writes, reads, replay_ranks, run
) -> None:
    """An MLPerf Storage-like checkpoint workload (DLIO: no training, num_checkpoints_write
    then _read, fsync) of *ranks* ranks replayed at fewer: each replay rank writes the files
    of the job's rank of its number (the shard kept), then reads its own back; the output
    says how it was scaled and what the full run writes (one variant is run, both checked)."""
    config = tmp_path / "llama.yaml"
    config.write_text(
        LLAMA.format(ranks=ranks, layers=layers, hidden=hidden, writes=writes, reads=reads)
    )
    cli("model", "import-dlio", str(config), "-o", str(tmp_path / "m.yaml"), check=True)
    model = load_model(tmp_path / "m.yaml")
    c = model.checkpoint
    assert model.processes.ranks == ranks and not model.train.enabled
    share = c.bytes_per_checkpoint // c.files_per_checkpoint
    per_rank = share * (c.files_per_checkpoint // ranks)
    note = scaling(model, replay_ranks)
    assert note is not None and f"scaled from {ranks} to {replay_ranks} rank(s)" in note
    assert f"in {c.files_per_checkpoint} files from {ranks} ranks" in note
    assert scaling(model, ranks) is None
    # each rank reads its own files back, whole
    for r in range(replay_ranks):
        assert abs(sum(n for _j, n in restore_reads(model, r)) - per_rank) < ranks
    if not run:
        return
    res = cli(
        "replay",
        str(tmp_path / "m.yaml"),
        "--data-dir",
        str(tmp_path / "data"),
        "--accelerators",
        str(replay_ranks),
        "--no-trace",
        "--out",
        str(tmp_path / "r"),
        check=True,
    )
    assert note in res.stdout
    doc = json.loads((tmp_path / "r" / "metrics.json").read_text())["checkpoint_workload"]
    assert abs(doc["bytes_written"] - writes * replay_ranks * per_rank) <= writes * ranks
    assert doc["bytes_read"] == reads * sum(
        n for r in range(replay_ranks) for _j, n in restore_reads(model, r)
    )
    assert doc["checkpoints_written"] == writes and doc["checkpoints_read"] == reads
    assert doc["full_bytes_per_checkpoint"] == c.bytes_per_checkpoint
    assert f"checkpoints: {writes} written by {replay_ranks} rank(s)" in res.stdout
    # its result is the checkpoints' throughput, per rank and in all, not an AU verdict
    assert "AU threshold" not in res.stdout and "AU %" not in res.stdout
    table = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines() if ln.split()}
    for side, nbytes, secs in (
        ("write", doc["bytes_written"], doc["write_s"]),
        ("read", doc["bytes_read"], doc["read_s"]),
    ):
        assert table[side][2] == f"{nbytes:,}"
        assert abs(float(table[side][4]) - nbytes / secs / 1e9) < 1e-3
        assert doc[f"{side}_gb_per_s"] == pytest.approx(nbytes / secs / 1e9)
    assert table["write"][-1] == "(fsync)"
    assert [p["rank"] for p in doc["per_rank"]] == list(range(replay_ranks))
    assert sum(p["bytes_written"] for p in doc["per_rank"]) == doc["bytes_written"]
    # the dataset it never reads is not generated
    assert "none generated" in res.stderr + res.stdout
    data = tmp_path / "data"
    assert not data.exists() or not any(f.is_file() for f in data.rglob("*"))
    left = tmp_path / "r" / "checkpoints"
    assert not left.exists() or not any(f.is_file() for f in left.rglob("*"))


def _untraced_saves(ranks: int, shard: int, extra: int) -> pl.DataFrame:
    """Three checkpoints' dcp.save events of *ranks* ranks naming the checkpoint directory,
    rank r's of ``shard * (r + 1)`` bytes and rank 0's *extra* more, no write in the trace."""
    rows = [
        dict(
            pid=100 + r,
            ts=1000 * (k + 1) + r,
            dur=20,
            cat="checkpoint",
            name="capture",
            file=f"/ck/step_{k}",
            size=shard * (r + 1) + (extra if r == 0 else 0),
        )
        for k in range(3)
        for r in range(ranks)
    ]
    return _table(rows).sort("ts")


@pytest.mark.parametrize(("ranks", "shard"), [(2, 3000), (3, 1200)])
def test_distill_dcp_saves_whose_writes_are_not_traced(ranks: int, shard: int) -> None:
    """A capture that traced only the data directories: each rank's dcp.save event names the
    checkpoint directory with its bytes, and no write is in the trace. Each rank keeps its
    share (it was one file of all the bytes, written by rank 0 alone)."""
    ev = _untraced_saves(ranks, shard, 77)
    steps = pl.DataFrame({"pid": [100] * 12, "ts": [300 * i for i in range(12)]})
    saves = ev.filter(pl.col("role") == "checkpoint.save")
    ck = checkpoint_section(ev, saves, steps.with_columns(pl.col("pid").cast(pl.Int32)), Facts())
    assert ck.files_per_checkpoint == ranks and ck.file_ranks == list(range(ranks))
    sizes = [shard * (r + 1) + (77 if r == 0 else 0) for r in range(ranks)]
    assert ck.file_writes == [[[n, 1]] for n in sizes]
    assert ck.bytes_per_checkpoint == sum(sizes)


@pytest.mark.parametrize(
    ("ranks", "shard", "fsync", "metadata"), [(2, 3000, 1, 700), (3, 1200, 0, 250), (1, 900, 1, 90)]
)
def test_untraced_dcp_saves_keep_their_layout_fsync_and_metadata(
    ranks: int, shard: int, fsync: int, metadata: int
) -> None:
    """The checkpoint directory was not traced, but the DCP hook recorded each save's
    FileSystemWriter: its ``sync_files`` (``fsync``) and the ``.metadata`` rank 0 wrote
    (``metadata_bytes``, part of its bytes). The model is DCP's layout (each rank's shard,
    rank 0's ``.metadata`` after its shard) with the writer's fsync, not per-rank parts
    without fsync, for 1, 2 and 3 ranks; a save without those args says fsync is not known."""
    ev = _untraced_saves(ranks, shard, metadata)
    steps = pl.DataFrame({"pid": [100] * 12, "ts": [300 * i for i in range(12)]})
    steps = steps.with_columns(pl.col("pid").cast(pl.Int32))
    saves = ev.filter(pl.col("role") == "checkpoint.save").with_columns(
        pl.lit(5, pl.Int64).alias("io_us"),
        pl.lit(fsync, pl.Int64).alias("fsync"),
        pl.when(pl.col("pid") == 100).then(pl.lit(metadata, pl.Int64)).alias("metadata_bytes"),
    )
    facts = Facts()
    ck = checkpoint_section(ev, saves, steps, facts)
    assert ck.layout == "dcp" and ck.fsync is bool(fsync)
    assert facts.fields["checkpoint.fsync"].confidence == "measured"
    assert ck.file_ranks == [0, 0, *range(1, ranks)]
    want = [[[shard, 1]], [[metadata, 1]], *([[shard * (r + 1), 1]] for r in range(1, ranks))]
    assert ck.file_writes == want
    assert ck.bytes_per_checkpoint == sum(shard * (r + 1) for r in range(ranks)) + metadata
    base = model_from_dict(_BASE)
    names = file_names(replace(base, checkpoint=ck))
    assert names == ["__0_0.distcp", ".metadata", *(f"__{r}_0.distcp" for r in range(1, ranks))]
    # without the hook's args (an older capture): the layout as the names say, fsync unknown
    facts = Facts()
    ck = checkpoint_section(ev, saves.drop("fsync", "metadata_bytes"), steps, facts)
    assert ck.layout == "parts" and not ck.fsync
    assert facts.fields["checkpoint.fsync"].confidence == "default"


@pytest.mark.parametrize("launcher", [True, False])
@pytest.mark.parametrize(("pids", "ranks"), [((9998, 10001, 9999), (2, 0, 1)), ((7, 12), (1, 0))])
def test_untraced_dcp_saves_ranked_by_the_launcher_else_by_pid_as_a_number(
    pids: tuple[int, ...], ranks: tuple[int, ...], launcher: bool
) -> None:
    """Untraced dcp.save events of processes whose pids sort one way as text and another as
    numbers, and whose launcher ranks follow neither. With the ranks' init_process_group
    records each file is its launcher rank's; without them the processes are ranked by pid
    as a number (9998, 9999, 10001), not as text (10001 first)."""
    rows = [
        dict(
            pid=pid,
            ts=1000 * (k + 1) + i,
            dur=20,
            cat="checkpoint",
            name="capture",
            file=f"/ck/step_{k}",
            size=1000 * (rank + 1),
        )
        for k in range(3)
        for i, (pid, rank) in enumerate(zip(pids, ranks, strict=True))
    ]
    if launcher:
        rows += [
            dict(pid=pid, ts=10 + i, dur=5, cat="comm", name=f"comm.rank{r}.world{len(pids)}.init")
            for i, (pid, r) in enumerate(zip(pids, ranks, strict=True))
        ]
    ev = _table(rows).with_columns(
        pl.lit("host-a").alias("host"),
        pl.when(pl.col("cat") == "comm")
        .then(pl.lit("init"))
        .otherwise(pl.col("role"))
        .alias("role"),
    )
    ev = ev.sort("ts")
    steps = pl.DataFrame({"pid": [pids[0]] * 12, "ts": [300 * i for i in range(12)]})
    saves = ev.filter(pl.col("role") == "checkpoint.save")
    ck = checkpoint_section(ev, saves, steps.with_columns(pl.col("pid").cast(pl.Int32)), Facts())
    assert ck.file_ranks == list(range(len(pids)))
    by_pid = dict(zip(pids, ranks, strict=True))
    if launcher:  # file r is launcher rank r's: its bytes 1000 * (r + 1)
        want = [1000 * (r + 1) for r in range(len(pids))]
    else:  # file i is the i-th pid's, as numbers
        want = [1000 * (by_pid[p] + 1) for p in sorted(pids)]
    assert ck.file_writes == [[[n, 1]] for n in want]


def test_untraced_dcp_saves_of_ranks_that_each_write_metadata() -> None:
    """DCP without collectives: every rank writes its own ``__<rank>.metadata``. Each rank
    keeps its shard and its metadata as files of its own (none shared between ranks)."""
    ev = _untraced_saves(2, 2000, 0)
    steps = pl.DataFrame({"pid": [100] * 12, "ts": [300 * i for i in range(12)]})
    saves = ev.filter(pl.col("role") == "checkpoint.save").with_columns(
        pl.lit(5, pl.Int64).alias("io_us"),
        pl.lit(1, pl.Int64).alias("fsync"),
        pl.lit(100, pl.Int64).alias("metadata_bytes"),
    )
    ck = checkpoint_section(ev, saves, steps.with_columns(pl.col("pid").cast(pl.Int32)), Facts())
    assert ck.layout == "dcp" and ck.fsync and ck.file_ranks == [0, 0, 1, 1]
    assert ck.file_writes == [[[1900, 1]], [[100, 1]], [[3900, 1]], [[100, 1]]]
    assert ck.bytes_per_checkpoint == 2000 + 4000


@pytest.mark.parametrize(("ranks", "io", "waits"), [(2, 300, (0, 150)), (3, 120, (40, 0, 90))])
def test_dcp_save_time_outside_its_writer_when_writes_are_not_traced(
    ranks: int, io: int, waits: tuple[int, ...]
) -> None:
    """The checkpoint directory was not traced, but the DCP hook measured each save's time in
    its FileSystemWriter (``io_us``): the serialisation is the save's duration less that time
    and less the rank's wait in the save's collectives beyond the least any rank spent."""
    dur, comm = 1000, 50
    rows: list[dict] = []
    for k in range(3):
        for r in range(ranks):
            ts = 10_000 * (k + 1) + r
            rows.append(
                dict(
                    pid=100 + r,
                    ts=ts,
                    dur=dur,
                    cat="checkpoint",
                    name="capture",
                    file=f"/ck/step_{k}",
                    size=4096,
                )
            )
            rows.append(
                dict(pid=100 + r, ts=ts + 10, dur=comm + waits[r], cat="comm", name="gather")
            )
    ev = _table(rows).sort("ts")
    ev = ev.with_columns(
        pl.when(pl.col("cat") == "comm")
        .then(pl.lit("comm"))
        .otherwise(pl.col("role"))
        .alias("role")
    )
    saves = ev.filter(pl.col("role") == "checkpoint.save").with_columns(
        pl.lit(io, pl.Int64).alias("io_us")
    )
    steps = pl.DataFrame({"pid": [100] * 12, "ts": [3000 * i for i in range(12)]})
    facts = Facts()
    ck = checkpoint_section(ev, saves, steps.with_columns(pl.col("pid").cast(pl.Int32)), facts)
    st = ck.serialization_time
    low = min(waits)
    expected = sorted((dur - io - (w - low)) * 1e-6 for w in waits)
    assert st.min == pytest.approx(expected[0]) and st.max == pytest.approx(expected[-1])
    assert facts.fields["checkpoint.serialization_time"].confidence == "measured"
    assert "io_us" in facts.fields["checkpoint.serialization_time"].method


@pytest.mark.parametrize("stamped", [True, False])
def test_dcp_save_takes_its_meetings_latency_out_of_its_serialisation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stamped: bool
) -> None:
    """A DCP save of 2 ranks meets three times; a meeting that returns when the last rank
    arrived (local ranks) and then took at least 30 ms to wake this rank has that latency of
    the replay's own, which comes out of the save's serialisation time (0.2 s), as a step
    barrier's comes out of the next sleeps. A meeting that cannot say when the last rank
    arrived (MPI ranks) is all meeting, and the serialisation is slept whole. (The save's
    sleeps are recorded, not timed.)"""
    from types import SimpleNamespace

    import dlreplay.replay.checkpoint as rc
    from dlreplay.replay.plan import RankPlan

    slept: list[float] = []
    monkeypatch.setattr(
        rc,
        "time",
        SimpleNamespace(
            perf_counter=time.perf_counter, monotonic=time.monotonic, sleep=slept.append
        ),
    )
    model = model_from_dict(
        {
            **_BASE,
            "checkpoint": {
                "enabled": True,
                "layout": "dcp",
                "steps_between_checkpoints": 1,
                "files_per_checkpoint": 3,
                "bytes_per_checkpoint": 3000,
                "file_ranks": [0, 0, 1],
                "file_writes": [[[1000, 1]], [[500, 1]], [[1500, 1]]],
                "serialization_time": 0.2,
            },
            "processes": {"ranks": 2},
        }
    )
    plan = RankPlan(model, None, 0, 2, 0, str(tmp_path / "ck"), False)  # type: ignore[arg-type]
    ck = rc.Checkpointer(plan)
    meetings: list[float] = []

    def meet() -> float | None:
        arrived = time.perf_counter()  # every rank is here: the rest is waking this one
        time.sleep(0.03)
        meetings.append(arrived)
        return arrived if stamped else None

    ck.meet = meet
    try:
        assert ck.save() == 1500  # rank 0: its shard and the .metadata
    finally:
        ck.cleanup()
    assert len(meetings) == 3
    if stamped:  # 0.2 s less at least 3 x 30 ms (none when the latency passed 0.2 s)
        assert len(slept) <= 1 and sum(slept) <= 0.2 - 0.09 + 1e-9, slept
    else:
        assert slept == [0.2]
