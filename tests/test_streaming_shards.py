"""Streaming shards (#43 item 4): real captures of ``examples/shards_tar.py`` (an IterableDataset
over WebDataset-style tar shards read with ``tarfile`` and with ``webdataset``, and over Arrow
IPC stream shards read with ``pyarrow``) distil to their shards, samples and bytes per shard,
members, library, split over workers and shuffle buffer; ``generate`` writes shards with the
same inside; a replay streams each shard whole, once per epoch, split over workers as the job.

The two tar jobs differ in every parameter the distill infers (shards, samples per shard,
member bytes, library, workers, persistent workers, split, shuffle buffer, batch size).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.distill import distill
from dlreplay.capture import CaptureConfig, run_capture
from dlreplay.replay import ReplayConfig, run_replay
from dlreplay.replay.generate import GenerateConfig, generate_dataset
from dlreplay.schema import OPEN_OPS, READ_OPS

pytest.importorskip("torch")
pytest.importorskip("webdataset")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "shards_tar.py"

#: name -> (the job's arguments, what distill must find)
JOBS = {
    "tarfile": (
        ("--num-files", "6", "--samples-per-shard", "8", "--sample-bytes", "4096",
         "--workers", "2", "--batch-size", "4", "--split", "interleaved"),
        {"shards": 6, "spf": 8, "npy": 128 + 4096, "library": "tarfile", "workers": 2,
         "split": "interleaved", "buffer": (0, 0), "batch": 4, "steps": 12},
    ),
    "webdataset": (
        ("--num-files", "6", "--samples-per-shard", "12", "--sample-bytes", "2048",
         "--workers", "3", "--batch-size", "6", "--split", "contiguous",
         "--reader", "webdataset", "--shuffle-buffer", "12", "--persistent-workers"),
        {"shards": 6, "spf": 12, "npy": 128 + 2048, "library": "webdataset", "workers": 3,
         "split": "contiguous", "buffer": (8, 16), "batch": 6, "steps": 12,
         "persistent": True},
    ),
    "arrow": (
        ("--format", "arrow", "--num-files", "4", "--samples-per-shard", "10",
         "--sample-bytes", "1024", "--rows-per-batch", "5", "--workers", "1",
         "--batch-size", "5"),
        {"shards": 4, "spf": 10, "library": "pyarrow", "workers": 1, "rows": 5, "batch": 5},
    ),
}  # fmt: skip


def _example():
    spec = importlib.util.spec_from_file_location("_dlreplay_shards_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    return mod


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """name -> (data dir, the job's report, the trace's events, the distilled model)."""
    out = {}
    for name, (args, _) in JOBS.items():
        root = tmp_path_factory.mktemp(name)
        data = root / "data"
        cmd = [sys.executable, str(EXAMPLE), "--data-dir", str(data), "--epochs", "2",
               "--threads", "1", "--compute-scale", "0.25", "--quiet",
               "--report", str(root / "report.json"), *args]  # fmt: skip
        got = run_capture(
            CaptureConfig(
                command=tuple(cmd),
                out=root / "trace",
                data_dirs=(str(data),),
                job_output=root / "job.log",
            )  # fmt: skip
        )
        assert got.exit_code == 0, (root / "job.log").read_text()
        loaded = load_trace(root / "trace")
        model = distill(loaded.events, manifest=loaded.manifest, source=str(root / "trace"))
        report = json.loads((root / "report.json").read_text())
        out[name] = (data, report, loaded.events, model)
    return out


def _shards(data: Path) -> list[Path]:
    return sorted(p for p in data.iterdir() if p.suffix in (".tar", ".arrow"))


def _members(path: Path) -> list[tuple[str, int]]:
    """(suffix, bytes) of a tar shard's members, in order (the obvious reference)."""
    with tarfile.open(path) as tf:
        return [(m.name.partition(".")[2], m.size) for m in tf]


@pytest.mark.parametrize("name", ["tarfile", "webdataset"])
def test_tar_shards_distil_to_their_layout(captured, name):
    data, report, _, model = captured[name]
    want = JOBS[name][1]
    ds, rd = model.dataset, model.reader
    assert ds.format == "tar" and ds.num_files == want["shards"]
    assert ds.num_samples_per_file == want["spf"]
    members = {m.name: m.bytes for m in ds.layout.shard_members}
    assert list(members) == ["npy", "cls"]
    assert members["npy"].mean == want["npy"] and members["cls"].mean == 1
    sizes = [p.stat().st_size for p in _shards(data)]
    assert ds.record_length.mean == pytest.approx(np.mean(sizes) / want["spf"])
    assert rd.streaming is not None and rd.streaming.library == want["library"]
    assert rd.streaming.split == want["split"]
    lo, hi = want["buffer"]
    assert lo <= rd.streaming.shuffle_buffer <= hi
    assert rd.read_threads == want["workers"] and rd.batch_size == want["batch"]
    assert rd.persistent_workers == want.get("persistent", False)
    assert rd.open_per_sample is False
    # the job's own count: every sample of every shard, once per epoch
    assert report["samples"] == 2 * want["shards"] * want["spf"]


def test_arrow_shards_distil_to_their_layout(captured):
    data, _, _, model = captured["arrow"]
    want = JOBS["arrow"][1]
    ds = model.dataset
    assert ds.format == "arrow" and ds.num_files == want["shards"]
    assert ds.num_samples_per_file == want["spf"] and ds.layout.rows_per_batch == want["rows"]
    members = {m.name: m.bytes.mean for m in ds.layout.shard_members}
    assert members["label"] == 8 and members["data"] == 128 + 1024
    assert model.reader.streaming.library == "pyarrow"
    assert model.reader.read_threads == 1


@pytest.mark.parametrize("name", ["tarfile", "webdataset"])
def test_each_worker_streams_its_split_of_whole_shards(captured, name):
    """Per worker process: the shards it opened are those the job's split gives one worker, each
    opened once per epoch and read through (tarfile to the file's end; webdataset to the
    archive's end marker)."""
    data, _, events, _ = captured[name]
    want = JOBS[name][1]
    ex = _example()
    shards = [str(p) for p in _shards(data)]
    io = events.filter(pl.col("file").cast(pl.String).is_in(shards)).with_columns(
        pl.col("file").cast(pl.String)
    )
    reads = io.filter(pl.col("name").is_in(READ_OPS))
    # the loader's workers (the job's main process wrote the shards first, inside the capture)
    per_pid = (
        io.filter(
            pl.col("name").is_in(OPEN_OPS) & pl.col("pid").is_in(reads["pid"].unique().to_list())
        )
        .group_by("pid")
        .agg(pl.col("file"))
    )
    splits = [
        sorted(ex.split_shards(shards, 0, 1, w, want["workers"], want["split"]))
        for w in range(want["workers"])
    ]
    got = sorted(sorted(f) for f in per_pid["file"].to_list())
    if want.get("persistent"):  # 2 epochs by the same workers
        assert got == sorted(sorted(split * 2) for split in splits)
    else:  # 2 epochs, new workers each
        assert got == sorted(splits * 2)
    per_open = reads.group_by("pid", "file").agg(pl.col("size").sum())
    size = {s: Path(s).stat().st_size for s in shards}
    opens = 2 if want.get("persistent") else 1  # a persistent worker's each epoch
    for f, n in per_open.select("file", "size").iter_rows():
        assert size[f] - 2 * tarfile.RECORDSIZE <= n / opens <= size[f]


def test_replay_split_matches_the_jobs_over_ranks_and_workers():
    """The replay's split (replay.streaming) is the example's for any ranks x workers."""
    from dlreplay.replay.streaming import split_shards

    ex = _example()
    names = [f"s{i}" for i in range(11)]
    for how in ("interleaved", "contiguous"):
        for ranks in (1, 2, 3):
            for workers in (1, 2, 4):
                for r in range(ranks):
                    for w in range(workers):
                        job = ex.split_shards(names, r, ranks, w, workers, how)
                        mine = [names[i] for i in split_shards(11, r, ranks, w, workers, how)]
                        assert mine == job, (how, ranks, workers, r, w)


def test_generate_writes_the_same_inside(captured, tmp_path):
    data, _, _, model = captured["tarfile"]
    generate_dataset(GenerateConfig(model=model, data_dir=tmp_path / "gen", seed=1, jobs=1))
    real = _shards(data)
    made = sorted((tmp_path / "gen" / "train").glob("*.tar"))
    assert len(made) == len(real)
    for r, g in zip(real, made, strict=True):
        assert [s for _, s in _members(g)] == [s for _, s in _members(r)]
        assert [e for e, _ in _members(g)] == [e for e, _ in _members(r)]
        assert g.stat().st_size == r.stat().st_size


@pytest.mark.parametrize("name", ["tarfile", "arrow"])
def test_replay_streams_each_shard_whole_once_per_epoch(captured, tmp_path, name):
    _, report, _, model = captured[name]
    want = JOBS[name][1]
    traced = name == "tarfile"  # (the Arrow replay's reads are counted by its metrics only)
    res = run_replay(
        ReplayConfig(model=model, data_dir=tmp_path / "data", out=tmp_path / "out", trace=traced)
    )
    assert res.complete
    made = sorted(
        str(p) for p in (tmp_path / "data" / "train").iterdir() if p.suffix in (".tar", ".arrow")
    )
    total = sum(Path(p).stat().st_size for p in made)
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["overall"]["bytes_read"] == 2 * total
    assert m["overall"]["samples"] == report["samples"]
    assert [e["steps"] for e in m["epochs"]] == _steps(report)  # each worker's last batch short
    if not traced:
        return
    events = load_trace(tmp_path / "out").events
    io = events.filter(pl.col("file").cast(pl.String).is_in(made)).with_columns(
        pl.col("file").cast(pl.String)
    )
    opens = io.filter(pl.col("name").is_in(OPEN_OPS)).group_by("file").len()
    assert sorted(opens["len"].to_list()) == [2] * len(made)  # once per epoch
    per_pid = io.filter(pl.col("name").is_in(OPEN_OPS)).group_by("pid").agg(pl.col("file"))
    assert per_pid.height == 2 * want["workers"]  # new workers each epoch, as the job's
    reads = io.filter(pl.col("name").is_in(READ_OPS))
    assert int(reads["size"].sum()) == 2 * total
    # the dataset (what compare scores) is the shards the workers read, not the replay's own
    # .dlreplay-dataset.json read by its main process (compare's read_size_min was that file's)
    assert _dataset_files(events) == set(made)


def _dataset_files(events: pl.DataFrame) -> set[str]:
    """The files analyze classifies as the dataset."""
    from dlreplay.analyze.files import classify_files

    files = classify_files(events)
    return set(files.filter(pl.col("role") == "dataset")["file"].to_list())


@pytest.mark.parametrize("name", list(JOBS))
def test_the_jobs_dataset_is_its_shards(captured, name):
    """An IterableDataset's workers emit batch fetches (data/items), no items of their own: they
    are the loader processes, so the dataset is the shards they read, not a file the main
    process read in the data folder (the example's .dataset-done marker)."""
    data, _, events, _ = captured[name]
    assert _dataset_files(events) == {str(p) for p in _shards(data)}


@pytest.mark.parametrize("name", list(JOBS))
def test_worker_cpu_per_sample_is_measured(captured, name):
    """Every batch fetch of the workers carries the CPU time the worker spent in it; distill
    splits the fetches' time and CPU time into a start per worker process (its first fetch beyond its later ones) and a time per sample, which add
    up to the fetches' (their reads apart)."""
    data, report, events, model = captured[name]
    items = events.filter((pl.col("cat") == "data") & (pl.col("name") == "items"))
    assert items.height and items["cpu_time"].null_count() == 0  # (every job has workers)
    # (the worker process's CPU clock: its other threads too, so a fetch may hold more than its
    # wall time)
    assert (items["cpu_time"] >= 0).all() and items["cpu_time"].sum() > 0
    rd, st = model.reader, model.reader.streaming
    samples, procs = report["samples"], items["pid"].n_unique()
    cpu = rd.preprocess_host_cpu.mean * samples + st.worker_start_cpu.mean * procs
    assert cpu == pytest.approx(items["cpu_time"].sum() * 1e-6, rel=1e-6)
    assert 0 < rd.preprocess_host_cpu.mean and st.worker_start_cpu.mean >= 0
    reads = events.filter(
        pl.col("name").is_in(READ_OPS)
        & pl.col("pid").is_in(items["pid"].unique().to_list())
        & pl.col("file").cast(pl.String).is_in([str(p) for p in _shards(data)])
    )
    wall = rd.preprocess_time.mean * samples + st.worker_start_time.mean * procs
    assert wall == pytest.approx((items["dur"].sum() - reads["dur"].sum()) * 1e-6, abs=1e-4)


def test_sample_work_is_cpu_then_sleep():
    """Per sample: the model's CPU seconds busy, the rest of its wall time asleep; the worker's
    own work on the sample (here 1 ms of CPU, as a library's parsing) counts towards both."""
    from dlreplay.model import Distribution
    from dlreplay.replay.hostcpu import burn
    from dlreplay.replay.streaming import _SampleWork

    n = 40
    for cpu, own, want_cpu in ((0.0005, 0.0, 0.0005), (0.0005, 0.001, 0.001), (0.0, 0.0, 0.0)):
        work = _SampleWork(Distribution.fixed(0.003), Distribution.fixed(cpu), [1, 2])
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            burn(own)
            work.spend()
            work.resume()
        got_cpu = (time.process_time() - c0) / n
        got_wall = (time.perf_counter() - t0) / n
        assert got_wall >= 0.003 * 0.95, (cpu, own, got_wall)
        # at least the model's CPU (or the worker's own, when more), not the whole wall time busy
        assert want_cpu * 0.95 <= got_cpu <= max(want_cpu * 1.5, want_cpu + 0.0004), (
            cpu,
            own,
            got_cpu,
        )


def test_worker_start_is_spent_once_per_process(monkeypatch):
    """A worker process's first sample carries the model's worker start (40 ms, 10 ms of it CPU);
    the next epoch's stream in the same process (a persistent worker) does not."""
    from dlreplay.model import Distribution
    from dlreplay.replay import streaming
    from dlreplay.replay.streaming import _SampleWork

    monkeypatch.setattr(streaming, "_STARTED", [False])
    start = (Distribution.fixed(0.04), Distribution.fixed(0.01))
    took = []
    for epoch in (1, 2):
        work = _SampleWork(Distribution.fixed(0.001), Distribution.fixed(0.0), [epoch], start)
        c0, t0 = time.process_time(), time.perf_counter()
        work.spend()
        took.append((time.process_time() - c0, time.perf_counter() - t0))
    (cpu1, wall1), (cpu2, wall2) = took
    assert wall1 >= 0.041 * 0.95 and cpu1 >= 0.01 * 0.95
    assert cpu2 < 0.005 and wall2 < wall1


def test_replay_spends_the_jobs_cpu_and_sleeps_the_rest(captured, tmp_path):
    """A model of 6 ms per sample outside the reads, 1.5 ms of it CPU: the replay's workers
    spend about 1.5 ms of CPU per sample (not the whole 6 ms busy, which on a busy host would
    ask for more CPU than the job used) and take at least the 6 ms."""
    from dataclasses import replace

    from dlreplay.model import Distribution

    _, _, _, model = captured["tarfile"]
    # a start (50 ms, 40 of CPU) that holds the replay worker's own (its first shard's open)
    start = {
        "worker_start_time": Distribution.fixed(0.05),
        "worker_start_cpu": Distribution.fixed(0.04),
    }
    rd = replace(
        model.reader,
        preprocess_time=Distribution.fixed(0.006),
        preprocess_host_cpu=Distribution.fixed(0.0015),
        streaming=replace(model.reader.streaming, **start),
    )
    res = run_replay(
        ReplayConfig(
            model=replace(model, reader=rd), data_dir=tmp_path / "data", out=tmp_path / "out"
        )
    )
    assert res.complete
    items = load_trace(tmp_path / "out").events.filter(
        (pl.col("cat") == "data") & (pl.col("name") == "items")
    )
    # each worker's fetches but its first (its own start: importing the library) and its last
    # (the end of its shards)
    mid = (
        items.sort("ts")
        .group_by("pid")
        .agg(pl.col("cpu_time", "dur").slice(1, pl.len() - 2))
        .explode("cpu_time", "dur")
        .drop_nulls()
    )
    assert mid.height >= 3
    samples = mid.height * model.reader.batch_size  # (6 whole batches per worker and epoch)
    cpu, wall = mid["cpu_time"].sum() * 1e-6 / samples, mid["dur"].sum() * 1e-6 / samples
    assert wall >= 0.006 * 0.7  # (overshoots of the start and earlier sleeps are carried)
    assert 0.0015 * 0.7 <= cpu < 0.6 * wall, (cpu, wall)


def _steps(report: dict) -> list[int]:
    """The job's steps in each epoch (its report counts them all)."""
    per = report["steps"] // report["epochs"]
    return [per] * report["epochs"]


def test_unknown_member_layout_still_streams(tmp_path, captured):
    """A model without shard_members (a trace whose shards were not at hand): one part per
    sample of the record length; the replay reads every shard whole."""
    from dataclasses import replace

    from dlreplay.model import Layout

    _, _, _, model = captured["tarfile"]
    bare = replace(model, dataset=replace(model.dataset, layout=Layout()))
    generate_dataset(GenerateConfig(model=bare, data_dir=tmp_path / "gen", seed=2, jobs=1))
    made = sorted((tmp_path / "gen" / "train").glob("*.tar"))
    assert len(made) == model.dataset.num_files
    with tarfile.open(made[0]) as tf:
        names = tf.getnames()
    assert len(names) == model.dataset.num_samples_per_file
    assert all(n.endswith(".bin") for n in names)


def test_two_rank_replay_streams_each_ranks_split(captured, tmp_path):
    """Two accelerators (ranks): rank r's workers stream shards r::2, each worker its w::W of
    those (the job's split_by_node then split_by_worker); every shard once per epoch in all."""
    from dlreplay.replay.prepare import ORDER_NAME

    _, _, _, model = captured["tarfile"]
    res = run_replay(
        ReplayConfig(
            model=model,
            data_dir=tmp_path / "data",
            out=tmp_path / "out",
            trace=False,
            accelerators=2,
            record_order=True,
        )  # fmt: skip
    )
    assert res.complete
    order = json.loads((tmp_path / "out" / ORDER_NAME).read_text())
    spf, shards = model.dataset.num_samples_per_file, model.dataset.num_files
    for rank in ("0", "1"):
        for epoch, ids in order[rank].items():
            got = sorted({i // spf for i in ids})
            assert got == list(range(int(rank), shards, 2)), (rank, epoch)
            assert len(ids) == len(got) * spf  # each of its shards streamed whole


def test_streaming_batches_carry_when_torch_had_them(captured, tmp_path):
    """The streaming loader stamps each batch with when torch had it (the iterator's
    ``_next_data`` returned), as the map-style torch loader does: the replay's step counts from
    there, so the handover to the training loop comes out of the step's sleep instead of
    lengthening its loop body past the model. Every batch of both epochs has its own stamp, at
    or before the loop received it, and after the previous batch's receipt."""
    from dlreplay.replay.accelerator import make_loader
    from dlreplay.replay.plan import RankPlan, epoch_batches
    from dlreplay.replay.prepare import ensure_dataset, worker_spec

    _, report, _, model = captured["tarfile"]
    config = ReplayConfig(model=model, data_dir=tmp_path / "data", out=tmp_path / "o", jobs=1)
    manifest, _ = ensure_dataset(config, lambda s: None)
    plan = RankPlan(model, worker_spec(config, manifest), 0, 1, 0, "", False, "torch")
    loader = make_loader(plan)
    try:
        for epoch in (1, 2):
            prev, stamps = 0.0, []
            for res in loader.epoch(epoch_batches(plan, epoch)):
                now = time.perf_counter()
                assert res.received is not None and prev < res.received <= now
                stamps.append(res.received)
                prev = now
            assert len(stamps) == _steps(report)[epoch - 1]
    finally:
        loader.close()


RANKS_TRACES = REPO / "traces" / "streams"


@pytest.mark.parametrize("name", ["r2_fresh", "r2_persistent"])
def test_each_ranks_workers_are_told_apart_from_the_other_ranks_epochs(name):
    """2 ranks under torchrun (committed captures, traces/make_stream_traces.py): workers per
    rank and whether they persist, with the ranks' epochs apart. In ``r2_fresh`` a re-forked
    worker of one rank still read after the other rank's next epoch began; placed in the epochs
    of both ranks by time alone it read in two, and the rank's 2 workers a epoch were taken for
    6 persistent ones. The two traces differ in workers, persistence, library, split and epochs."""
    expected = json.loads((RANKS_TRACES / name / "expected.json").read_text())
    truth = expected["truth"]
    if not truth["persistent"]:
        assert expected["premise_workers_across_ranks_epochs"] > 0
    loaded = load_trace(RANKS_TRACES / name)
    model = distill(loaded.events, manifest=loaded.manifest)
    assert model.processes.ranks == truth["ranks"]
    assert model.train.epochs == truth["epochs"]
    assert model.reader.read_threads == truth["workers_per_rank"]
    assert model.reader.persistent_workers is truth["persistent"]
    args = expected["command"]
    assert model.reader.streaming.split == args[args.index("--split") + 1]
    assert model.reader.streaming.library == args[args.index("--reader") + 1]


def _write_tar(path: Path, samples: int, parts: dict[str, int]) -> None:
    import io

    with tarfile.open(path, "w") as tf:
        for i in range(samples):
            for ext, size in parts.items():
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = size + i  # sizes differ from sample to sample
                tf.addfile(info, io.BytesIO(bytes(info.size)))


@pytest.mark.parametrize(
    ("samples", "parts"), [(7, {"npy": 300, "cls": 1}), (13, {"jpg": 900, "json": 40, "cls": 2})]
)
def test_the_fingerprint_reads_a_tar_shards_inside(tmp_path, samples, parts):
    """The capture's fingerprint of tar shards: samples per shard and each part's sizes, from the
    headers (what distill needs when the shards are not at hand)."""
    from dlreplay.capture.fingerprint import fingerprint_dataset

    for k in range(3):
        _write_tar(tmp_path / f"shard-{k}.tar", samples, parts)
    doc = fingerprint_dataset([str(tmp_path)])
    (group,) = doc["groups"]
    assert group["format"] == "tar" and group["sampled"] == 3 and not doc["problems"]
    entry = group["files_sampled"][0]
    assert entry["samples"] == samples
    assert {k: len(v) for k, v in entry["parts"].items()} == dict.fromkeys(parts, samples)
    assert entry["parts"][next(iter(parts))] == [
        parts[next(iter(parts))] + i for i in range(samples)
    ]


def test_the_fingerprint_reads_an_arrow_shards_inside(tmp_path):
    pa = pytest.importorskip("pyarrow")
    from dlreplay.capture.fingerprint import fingerprint_dataset

    schema = pa.schema([("data", pa.binary()), ("label", pa.int64())])
    with pa.OSFile(str(tmp_path / "shard-0.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, schema) as writer:
            for b in range(3):  # 3 record batches of 4 rows
                rows = [bytes(100 + 4 * b + r) for r in range(4)]
                writer.write_batch(pa.record_batch([rows, list(range(4))], schema=schema))
    doc = fingerprint_dataset([str(tmp_path)])
    entry = doc["groups"][0]["files_sampled"][0]
    assert doc["groups"][0]["format"] == "arrow"
    assert entry["samples"] == 12 and entry["rows_per_batch"] == [4, 4, 4]
    assert entry["parts"]["data"] == [100 + i for i in range(12)]
    assert entry["parts"]["label"] == [8] * 12


STREAMS = REPO / "traces" / "streams"


@pytest.mark.parametrize(
    "name",
    [
        "posix_tarfile",
        "posix_wds",
        "posix_wds_npy",
        "posix_tar_b3",
        "posix_arrow",
        "posix_whole_shards",
        "posix_w0",
        "posix_r2_w0",
    ],
)
def test_shards_streamed_in_a_posix_only_trace(name):
    """DFTracer's POSIX calls alone (committed captures, traces/make_stream_traces.py): the shards
    each read through at every open are streamed shards; their insides come from the capture's
    fingerprint; workers, persistence, library, split, epochs and (where the workers wait at
    their batches' ends) the batch size from the calls. The traces differ in each of these; in
    two the batch does not show (samples smaller than the reads; webdataset reading a shard's
    samples in one burst), and distill must say it guessed. ``posix_r2_w0``: 2 ranks under
    torchrun stream their shards themselves, out of step: each rank's opens cut into its
    epochs, the whole trace's in time order do not."""
    expected = json.loads((STREAMS / name / "expected.json").read_text())
    truth, args = expected["truth"], expected["command"]
    loaded = load_trace(STREAMS / name)
    model = distill(loaded.events, manifest=loaded.manifest, source=str(STREAMS / name))
    assert model.dataset.format == truth.get("format", "tar")
    assert model.dataset.num_files == truth["shards"]
    assert model.dataset.num_samples_per_file == truth["samples_per_shard"]
    assert sorted(m.name for m in model.dataset.layout.shard_members) == truth["parts"]
    assert model.processes.ranks == truth["ranks"]
    assert model.train.epochs == truth["epochs"]
    assert model.reader.read_threads == truth["workers_per_rank"]
    assert model.reader.persistent_workers is truth["persistent"]
    assert model.reader.open_per_sample is False
    if truth["workers_per_rank"] > 1:  # one reader reads every shard in order: either split
        assert model.reader.streaming.split == args[args.index("--split") + 1]
    else:
        assert model.provenance.fields["reader.streaming.split"].confidence == "default"
    assert model.reader.streaming.library == args[args.index("--reader") + 1]
    fields = model.provenance.fields
    if truth["batch"] is None:  # not in this trace: said so
        assert fields["reader.batch_size"].confidence == "default"
        assert any(n.startswith("guess: reader.batch_size") for n in model.provenance.notes)
    else:
        assert model.reader.batch_size == truth["batch"]
        assert fields["reader.batch_size"].confidence == "inferred"
        assert "streamed shards" in fields["reader.batch_size"].method
        if truth["batch"] % truth["samples_per_shard"] == 0:  # whole shards: in the opens
            assert "shard(s) a batch" in fields["reader.batch_size"].method
    assert fields["reader.streaming.shuffle_buffer"].confidence == "default"


def test_a_posix_only_trace_takes_the_shards_inside_from_the_fingerprint():
    """Where the shards are not at hand (a trace distilled on another machine), their samples
    and members come from the capture's fingerprint, and distill says so."""
    from dlreplay.analyze.distill.shards import _inside

    doc = json.loads((STREAMS / "posix_wds" / "dataset-fingerprint.json").read_text())
    got = _inside(["/nonexistent/shard-00000.tar"], "tar", doc)
    assert got is not None
    spf, members, _, where = got
    assert spf == 20 and sorted(m.name for m in members) == ["cls", "jpg"]
    assert "fingerprint" in where
    assert _inside(["/nonexistent/shard-00000.tar"], "tar", None) is None


def test_a_damaged_fingerprint_entry_is_skipped_not_trusted():
    from dlreplay.analyze.distill.shards import _inside

    doc = json.loads((STREAMS / "posix_wds" / "dataset-fingerprint.json").read_text())
    for group in doc["groups"]:
        for entry in group["files_sampled"]:
            entry["parts"] = {"jpg": ["x", None]}
    assert _inside(["/nonexistent/shard-00000.tar"], "tar", doc) is None


def test_a_posix_only_streamed_model_replays_through_torch_with_one_epoch_each(tmp_path):
    """A model distilled from POSIX calls alone has a 'native' loader; its shards still stream
    through PyTorch's DataLoader, and the replay says so. Its trace has one epoch event per
    epoch: the hooks' (the replay's own had come too, and compare counted 4 epochs of 2)."""
    from dlreplay.replay.prepare import choose_loader

    loaded = load_trace(STREAMS / "posix_w0")
    model = distill(loaded.events, manifest=loaded.manifest, source=str(STREAMS / "posix_w0"))
    assert model.reader.data_loader != "pytorch"
    cfg = ReplayConfig(model=model, data_dir=tmp_path / "data", out=tmp_path / "out", trace=True)
    assert choose_loader(cfg)[0] == "torch"
    assert run_replay(cfg).complete
    events = load_trace(tmp_path / "out").events
    epochs = events.filter((pl.col("cat") == "pipeline") & (pl.col("name") == "epoch"))
    assert epochs.height == model.train.epochs == 2


@pytest.mark.parametrize(
    ("member", "reader", "shards", "samples"),
    [("npy", "tarfile", 6, 5), ("jpeg", "webdataset", 4, 8)],
)
def test_a_capture_of_every_file_fingerprints_the_shards_it_opened(
    tmp_path, member, reader, shards, samples
):
    """Without --data-dir the capture fingerprints the dataset files the job opened: tar shards
    among them (they had been left out, so a POSIX-only trace of every file, distilled where the
    shards are gone, was "raw, 1 sample a file"). Two layouts: npy and JPEG members, tarfile
    and webdataset, 6 shards of 5 samples and 4 of 8."""
    data = tmp_path / "data"
    cmd = [sys.executable, str(EXAMPLE), "--data-dir", str(data), "--epochs", "2",
           "--threads", "1", "--quiet", "--num-files", str(shards), "--samples-per-shard",
           str(samples), "--member", member, "--reader", reader, "--workers", "1",
           "--batch-size", "2"]  # fmt: skip
    if member == "jpeg":
        cmd += ["--image-size", "24"]
    subprocess.run([*cmd, "--generate-only"], check=True, capture_output=True)
    got = run_capture(
        CaptureConfig(
            command=tuple(cmd),
            out=tmp_path / "trace",
            loader_hooks=False,
            job_output=tmp_path / "job.log",
        )
    )
    assert got.exit_code == 0, (tmp_path / "job.log").read_text()
    doc = json.loads((tmp_path / "trace" / "dataset-fingerprint.json").read_text())
    (group,) = [g for g in doc["groups"] if g["extension"] == ".tar"]
    assert group["files"] == shards
    shutil.rmtree(data)  # distilled where the shards are not at hand: the fingerprint tells
    loaded = load_trace(tmp_path / "trace")
    model = distill(loaded.events, manifest=loaded.manifest, source=str(tmp_path / "trace"))
    assert model.dataset.format == "tar"
    assert model.dataset.num_files == shards
    assert model.dataset.num_samples_per_file == samples
