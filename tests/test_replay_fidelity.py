"""Replay fidelity mechanisms (exact, never timings): loader lifecycle, the timing model's
components in the replay trace, reads per JPEG, DLIO's sample order, distill's attribution."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dlreplay.model import Distribution, Evaluation, apply_overrides, model_from_dict
from dlreplay.replay import GenerateConfig, ReplayConfig, generate_dataset, run_replay
from dlreplay.replay.engine import RankPlan, choose_loader, epoch_batches, steps_per_epoch

from .conftest import run_cli

BASE = {
    "schema": "dlreplay.workload",
    "format_version": 1,
    "model": {"name": "fidelity"},
    "dataset": {"format": "raw", "num_files": 8, "num_samples_per_file": 1, "record_length": 2048},
    "reader": {
        "batch_size": 2,
        "read_threads": 2,
        "file_shuffle": "seed",
        "sample_shuffle": "seed",
    },
    "train": {"epochs": 3, "computation_time": 0.0},
}

LOADERS = [
    "builtin",
    pytest.param(
        "torch",
        marks=pytest.mark.skipif(
            __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"
        ),
    ),
]


def make_model(*sets: str):
    return apply_overrides(model_from_dict(BASE), sets)


# --------------------------------------------------------------------------- loader lifecycle


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_pids_per_epoch_follow_persistent_workers(tmp_path, loader, persistent):
    model = make_model(f"reader.persistent_workers={str(persistent).lower()}")
    res = run_replay(
        ReplayConfig(
            model=model, data_dir=tmp_path / "d", out=tmp_path / "o", trace=False, loader=loader
        )
    )
    assert res.metrics["loader"] == loader
    pids = [frozenset(e["worker_pids"]) for e in res.metrics["epochs"]]
    assert len(pids) == 3 and all(len(p) == 2 for p in pids)  # both workers read in every epoch
    if persistent:
        assert pids[0] == pids[1] == pids[2]
    else:  # PyTorch's default: new worker processes every epoch
        assert not (pids[0] & pids[1]) and not (pids[1] & pids[2]) and not (pids[0] & pids[2])


@pytest.mark.parametrize("loader", LOADERS)
def test_both_loaders_read_the_planned_order(tmp_path, loader):
    model = make_model("reader.read_threads=3", "reader.batch_size=1", "dataset.num_files=9")
    run_replay(
        ReplayConfig(
            model=model,
            data_dir=tmp_path / "d",
            out=tmp_path / "o",
            trace=False,
            record_order=True,
            loader=loader,
        )
    )
    order = json.loads((tmp_path / "o" / "sample-order.json").read_text())["0"]
    plan = RankPlan(model, None, 0, 1, 0, "", False)  # type: ignore[arg-type]
    for e in (1, 2, 3):
        assert order[str(e)] == [f for b in epoch_batches(plan, e) for f, _ in b]


def test_loader_choice():
    m = make_model()
    assert (
        choose_loader(ReplayConfig(model=m, data_dir=Path("x"), loader="builtin"))[0] == "builtin"
    )
    thread = make_model("reader.worker_kind=thread")
    assert choose_loader(ReplayConfig(model=thread, data_dir=Path("x")))[0] == "builtin"
    tf = make_model("framework=tensorflow", "reader.data_loader=tensorflow")
    kind, why = choose_loader(ReplayConfig(model=tf, data_dir=Path("x")))
    assert kind == "builtin" and "tensorflow" in why


# --------------------------------------------------------------------------- timing components


def _component_model():
    m = make_model(
        "reader.read_threads=1",
        "reader.persistent_workers=false",
        "reader.sample_shuffle=off",
        "reader.file_shuffle=off",
        "train.computation_time=0.002",
        "train.warmup_computation_time=[0.02, 0.01]",
        "train.epoch_warmup_computation_time=[0.015]",
        "train.epoch_end_time=0.01",
        "reader.preprocess_time=0.001",
        "checkpoint.enabled=true",
        "checkpoint.epochs_between_checkpoints=1",
        "checkpoint.bytes_per_checkpoint=100000",
        "checkpoint.serialization_time=0.005",
        "dataset.num_files_eval=4",
    )
    return dataclasses.replace(
        m,
        train=dataclasses.replace(
            m.train, evaluation=Evaluation(steps=2, computation_time=Distribution.fixed(0.003))
        ),
    )


@pytest.mark.slow
@pytest.mark.parametrize("loader", LOADERS)
def test_every_timing_component_is_in_the_replay_trace(tmp_path, loader):
    from dlreplay.analyze import load_trace
    from dlreplay.model import save_model

    model = _component_model()
    path = tmp_path / "model.yaml"
    save_model(model, path)
    out = tmp_path / "trace"
    proc = run_cli(
        "replay",
        str(path),
        "--data-dir",
        str(tmp_path / "d"),
        "--out",
        str(out),
        "--loader",
        loader,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["loader"] == loader
    from dlreplay.analyze import vocabulary as voc

    ev = voc.ensure_roles(load_trace(out).events)
    ann = ev.filter(pl.col("role").is_not_null())
    main = ann.filter(pl.col("role") == voc.EPOCH)["pid"].unique().to_list()
    assert len(main) == 1

    def count(role: str) -> int:
        return ann.filter(pl.col("role") == role).height

    def named(cat: str, name: str) -> int:
        return ev.filter((pl.col("cat") == cat) & (pl.col("name") == name)).height

    epochs, steps = 3, 4  # 8 files, batch 2
    assert count(voc.EPOCH) == epochs
    assert count(voc.FETCH) == epochs * (steps + 1)  # each epoch's end probe too
    assert voc.training_steps(ann).height == epochs * steps
    assert (
        named("compute", "warmup") == 2 + (epochs - 1) * 1
    )  # the run's 2 warm-up steps, each later epoch's 1
    assert named("pipeline", "epoch_end") == epochs
    assert count(voc.EVALUATE) == epochs
    assert count(voc.CKPT_SAVE) == epochs
    # preprocess sleeps inside items (a sample whose decode already spent the modelled time has none)
    assert count(voc.ITEM) == epochs * 8 and 0 < count(voc.PREPROCESS) <= epochs * 8
    # the checkpoints come after each epoch's loop, as a training script saves
    e = voc.epoch_spans(ann).sort("ts")
    s = ann.filter(pl.col("role") == voc.CKPT_SAVE).sort("ts")
    assert (s["ts"].to_numpy() >= e["end"].to_numpy()).all()
    # the checkpoint files are deleted after the trace ends: their deletion is not the workload's I/O
    assert not (out / "checkpoints").exists()
    gone = ev.filter(
        pl.col("name").cast(pl.String).is_in(["unlink", "unlinkat", "rmdir"])
        & pl.col("file").cast(pl.String).str.contains("/checkpoints/")
    )
    assert gone.height == 0, gone
    # the replay's own distill gives the components back
    from dlreplay.analyze.distill import distill

    lt = load_trace(out)
    back = distill(lt.events, manifest=lt.manifest)
    assert len(back.train.warmup_computation_time) >= 1
    assert back.checkpoint.enabled and back.checkpoint.epochs_between_checkpoints == 1
    assert back.checkpoint.steps_between_checkpoints is None


def test_components_in_metrics_without_trace(tmp_path):
    model = _component_model()
    res = run_replay(
        ReplayConfig(
            model=model, data_dir=tmp_path / "d", out=tmp_path / "o", trace=False, loader="builtin"
        )
    )
    for e in res.metrics["epochs"]:
        assert e["epoch_end_s"] > 0 and e["evaluation_s"] > 0 and e["checkpoint_s"] > 0
        assert e["checkpoint_bytes"] == 100000
    assert not any("evaluation" in w and "not included" in w for w in res.warnings)


def test_au_first_steps(tmp_path):
    run_first = run_replay(
        ReplayConfig(
            model=make_model(),
            data_dir=tmp_path / "d",
            out=tmp_path / "a",
            trace=False,
            loader="builtin",
        )
    )
    every_epoch = run_replay(
        ReplayConfig(
            model=make_model("train.au_first_steps=epoch"),
            data_dir=tmp_path / "d",
            out=tmp_path / "b",
            trace=False,
            loader="builtin",
        )
    )
    assert [e["samples"] for e in run_first.metrics["epochs"]] == [8, 8, 8]
    window = [e["samples_per_s"] is not None for e in every_epoch.metrics["epochs"]]
    assert all(window)
    # samples in the AU window: the run's first step left out, or every epoch's
    assert run_first.metrics["overall"]["samples"] == 24
    a = sum(e["steps"] for e in run_first.metrics["epochs"])
    assert a == 12


# --------------------------------------------------------------------------- readers like the job's libraries


@pytest.mark.parametrize("buffering", ["buffered", "unbuffered"])
def test_reads_per_jpeg_match_the_jobs_loader(tmp_path, buffering):
    """A JPEG is read the way torchvision's default loader (``PIL.Image.open(path).convert('RGB')``)
    reads it: the same read(2) calls, a handful per file, never one per byte. A job that handed
    Pillow an unbuffered file (``reader.file_buffering: unbuffered``) is read that way."""
    from PIL import Image

    from dlreplay.replay.formats import LibraryReader, ReadMeter

    model = make_model("dataset.format=jpeg", "dataset.record_length=30000")
    data = tmp_path / "d"
    generate_dataset(GenerateConfig(model=model, data_dir=data))
    files = sorted((data / "train").rglob("*.jpg"))
    reader, meter = LibraryReader("jpeg", True, buffered=buffering == "buffered"), ReadMeter()
    mode = -1 if buffering == "buffered" else 0

    def job_loader(path: Path) -> None:
        with open(path, "rb", buffering=mode) as fh:  # torchvision.datasets.folder.pil_loader
            Image.open(fh).convert("RGB")

    for _ in range(
        2
    ):  # Pillow imports its format plugins on first use: those reads are not the file's
        job_loader(files[0])
        reader.read_decoded(str(files[0]), 0, None)
    for f in files:
        meter.start()
        job_loader(f)
        ref_bytes, ref_calls = meter.stop()
        reader.read_decoded(str(f), 0, None)
        assert (reader.meter.bytes, reader.meter.calls) == (ref_bytes, ref_calls)
        assert ref_bytes >= f.stat().st_size
        if buffering == "buffered":
            assert ref_calls <= 2 + math.ceil(f.stat().st_size / 4096)
        else:
            assert ref_calls > f.stat().st_size / 4096


def test_npz_is_read_as_numpy_load_on_the_path(tmp_path):
    from dlreplay.replay.formats import LibraryReader, ReadMeter

    model = make_model("dataset.format=npz", "dataset.record_length=300000")
    data = tmp_path / "d"
    generate_dataset(GenerateConfig(model=model, data_dir=data))
    f = sorted((data / "train").rglob("*.npz"))[0]
    meter, reader = ReadMeter(), LibraryReader("npz", True)
    with np.load(
        f
    ) as z:  # first use imports (zipfile, numpy's format module): not the file's reads
        z["x"]
    reader.read_decoded(str(f), 0, None)
    meter.start()
    with np.load(f) as z:  # a one-sample file: its members are the sample
        ref = [z[name] for name in z.files]
    expected = meter.stop()
    nbytes, decoded = reader.read_decoded(str(f), 0, None)
    assert (nbytes, reader.meter.calls) == expected
    assert len(ref) == 1 and np.array_equal(decoded, ref[0])


# --------------------------------------------------------------------------- DLIO


def _dlio_sampler_reference(
    rank: int, size: int, num_samples: int, shuffle: str, seed: int, epochs: int
):
    """DLIO 2.0.0's ``dlio_sampler.__iter__``, line for line (numpy's global generator)."""
    per = int(math.ceil(num_samples / size))
    indices = list(range(rank * per, (rank + 1) * per))
    state = np.random.get_state()
    try:
        out = []
        for _ in range(epochs):
            if shuffle != "off":
                if shuffle == "seed":
                    np.random.seed(seed)
                np.random.shuffle(indices)
            out.append(list(indices))
        return out
    finally:
        np.random.set_state(state)


@pytest.mark.parametrize("shuffle", ["off", "seed"])
def test_dlio_sample_order_is_dlios(shuffle):
    m = make_model(
        "reader.sample_order=dlio",
        f"reader.sample_shuffle={shuffle}",
        "reader.file_shuffle=seed",
        # a seed with nothing shuffled cannot take effect: such an override is refused (#45)
        *(["reader.shuffle_seed=7"] if shuffle == "seed" else []),
        "dataset.num_files=10",
        "dataset.num_samples_per_file=2",
        "reader.batch_size=3",
    )
    for rank in (0, 1):
        plan = RankPlan(m, None, rank, 2, 0, "", False)  # type: ignore[arg-type]
        ref = _dlio_sampler_reference(rank, 2, 20, shuffle, 7, 3)
        assert steps_per_epoch(m, 2) == 20 // 3 // 2  # DLIO's max_steps: whole batches only
        for e in (1, 2, 3):
            got = [f * 2 + k for b in epoch_batches(plan, e) for f, k in b]
            assert got == ref[e - 1][: 3 * 3]
    if shuffle == "seed":  # the seeded shuffle is applied again each epoch: a new order every epoch
        assert ref[0] != ref[1]
    else:  # file_shuffle has no effect on DLIO's PyTorch path: the same order every epoch
        assert ref[0] == ref[1] == ref[2]


def test_dlio_import_replays_the_way_dlio_runs(tmp_path):
    from dlreplay.dlio import dlio_to_model

    cfg = {
        "framework": "pytorch",
        "dataset": {"format": "npz", "num_files_train": 8, "record_length_bytes": 4096},
        "reader": {
            "data_loader": "pytorch",
            "read_threads": 2,
            "batch_size": 2,
            "file_shuffle": "seed",
            "sample_shuffle": "seed",
        },
        "train": {"epochs": 2, "computation_time": 0.001},
    }
    m = dlio_to_model(cfg)
    rd = m.reader
    assert (rd.persistent_workers, rd.pin_memory, rd.drop_last, rd.sample_order) == (
        True,
        True,
        True,
        "dlio",
    )
    assert m.train.au_first_steps == "epoch"
    assert any("file_shuffle" in n for n in m.provenance.notes)
    res = run_replay(
        ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "o", trace=False)
    )
    assert res.metrics["complete"] and res.metrics["overall"]["samples"] == 16
    # the user overrides: the PyTorch default order and non-persistent workers
    mine = apply_overrides(m, ["reader.sample_order=pytorch", "reader.persistent_workers=false"])
    assert mine.reader.sample_order == "pytorch" and not mine.reader.persistent_workers


# --------------------------------------------------------------------------- distill's attribution


def _events(rows: list[tuple]) -> pl.DataFrame:
    cols = ("cat", "name", "ts", "dur", "epoch", "step", "batch_size")
    return pl.DataFrame(
        [dict(zip(cols, r, strict=True)) | {"pid": 1} for r in rows],
        schema={
            "cat": pl.Utf8,
            "name": pl.Utf8,
            "ts": pl.Int64,
            "dur": pl.Int64,
            "epoch": pl.Int64,
            "step": pl.Int64,
            "batch_size": pl.Int64,
            "pid": pl.Int64,
        },
    )


def test_timing_model_attributes_every_microsecond():
    """Two epochs by hand (us), in DFTracer's AI conventions as a capture writes them: worker
    start and first batch, waits, a slow first step of the run and of the second epoch, the
    end probe, checkpoints after each epoch, a gap of other work between the epochs."""
    from dlreplay.analyze import vocabulary as voc
    from dlreplay.analyze.distill import timing_model

    F, B = ("dataloader", "fetch.iter"), ("dataloader", "fetch.block")
    rows = [
        ("pipeline", "epoch", 0, 10_000, 0, None, None),
        (*F, 1_000, 1_000, 0, 0, 4),
        (*B, 2_000, 3_000, 0, 0, None),
        (*F, 5_000, 500, 0, 1, 4),
        (*B, 5_500, 1_000, 0, 1, None),
        (*F, 6_500, 500, 0, 2, 4),
        (*B, 7_000, 1_000, 0, 2, None),
        ("dataloader", "fetch.stop", 8_000, 1_500, 0, 3, 0),
        ("checkpoint", "capture", 10_200, 800, None, None, None),
        ("pipeline", "epoch", 12_000, 8_000, 1, None, None),
        (*F, 12_500, 500, 1, 0, 4),
        (*B, 13_000, 3_500, 1, 0, None),
        (*F, 16_500, 500, 1, 1, 4),
        (*B, 17_000, 1_000, 1, 1, None),
        (*F, 18_000, 500, 1, 2, 4),
        (*B, 18_500, 1_000, 1, 2, None),
        ("dataloader", "fetch.stop", 19_500, 500, 1, 3, 0),
        ("checkpoint", "capture", 20_100, 900, None, None, None),
    ]
    ev = voc.ensure_roles(_events(rows))
    ann = ev.filter(pl.col("role").is_not_null())
    fetch = ann.filter(pl.col("role") == voc.FETCH)
    t = timing_model(
        voc.training_steps(ann),
        voc.epoch_spans(ann),
        fetch.filter(pl.col("batch_size").fill_null(1) == 0),
        ann.filter(pl.col("role") == voc.CKPT_SAVE),
    )
    assert t is not None
    ms = {k: round(v * 1e3, 6) for k, v in t.components.items()}
    assert ms == {
        "epoch_start": 3.0,
        "fetch_wait": 4.0,
        "step_compute": 7.5,
        "warmup_compute": 3.0,
        "checkpoint": 1.7,
        "epoch_end": 1.3,
        "unattributed": 0.5,
    }
    assert round(t.total_s * 1e3, 6) == 21.0 == round(sum(ms.values()), 6)
    assert t.warmup_computation_time == [0.003]
    assert t.epoch_warmup_computation_time == [0.0035]
    assert t.computation_time.mean == pytest.approx(0.001)
    assert t.epoch_end_time.mean == pytest.approx(0.0012)
    assert "unattributed 0.001 s" in t.describe()


def test_runnable_seconds_counts_a_decode_right_after_a_sleep() -> None:
    """The worker's measure of the library's decode (subtracted from the modelled preprocess
    time) holds all of the CPU the decode took, also right after a sleep. schedstat's CPU
    field, read by the running thread, lags by up to a scheduler tick: around a short burst
    after a sleep it came out short (often 0), and the replay slept the decode twice."""
    import time
    import zlib

    from dlreplay.replay.loader import runnable_seconds

    packed = zlib.compress(
        np.random.default_rng(0).integers(0, 4, 4 << 20, dtype=np.uint8).tobytes()
    )
    for _ in range(20):
        time.sleep(0.002)
        r0, c0 = runnable_seconds(), time.thread_time()
        zlib.decompress(packed)  # one call into C, as a library's decode: no clock read meanwhile
        r1 = runnable_seconds()
        cpu = time.thread_time() - c0
        # cpu runs on to a clock read after r1's, so it also holds r1's own read of schedstat (a
        # /proc file: up to ~100 us of CPU seen on one busy core); the bug this guards against
        # came out 1.6-2 ms short per decode, often the whole decode
        assert r1 - r0 >= cpu - 500e-6


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"
)
def test_batches_hold_the_jobs_tensor_count(tmp_path):
    """Every tensor of a job's batch is one more worker -> main handover (its shared-memory
    file descriptor); the torch replay hands over as many, and its own trace says so."""
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill import distill
    from dlreplay.model import save_model

    path = tmp_path / "model.yaml"
    save_model(make_model("reader.batch_tensors=4"), path)
    out = tmp_path / "trace"
    proc = run_cli(
        "replay",
        str(path),
        "--data-dir",
        str(tmp_path / "d"),
        "--out",
        str(out),
        "--loader",
        "torch",
    )
    assert proc.returncode == 0, proc.stderr
    lt = load_trace(out)
    fetched = lt.events.filter((pl.col("name") == "fetch.iter") & (pl.col("batch_size") > 0))
    assert fetched.height == 3 * 4 and fetched["tensors"].to_list() == [4] * 12
    assert distill(lt.events, manifest=lt.manifest).reader.batch_tensors == 4


@pytest.mark.parametrize(
    "loader", ["builtin", pytest.param("torch", marks=[pytest.mark.slow, *LOADERS[1].marks])]
)
def test_workers_start_as_the_jobs_did(tmp_path, loader):
    """A job whose workers were spawned (a new interpreter each, importing its modules again at
    every epoch's start) is replayed with spawned workers; distill tells it from the trace."""
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill import distill

    model = make_model("reader.multiprocessing_context=spawn", "train.epochs=2")
    res = run_replay(
        ReplayConfig(
            model=model, data_dir=tmp_path / "d", out=tmp_path / "o", trace=True, loader=loader
        )
    )
    assert res.complete and res.metrics["loader"] == loader
    lt = load_trace(tmp_path / "o")
    assert distill(lt.events, manifest=lt.manifest).reader.multiprocessing_context == "spawn"
    # and the default, forked workers, is told as well
    res = run_replay(
        ReplayConfig(
            model=make_model("train.epochs=2"),
            data_dir=tmp_path / "d",
            out=tmp_path / "f",
            trace=True,
            loader=loader,
        )
    )
    lt = load_trace(tmp_path / "f")
    assert distill(lt.events, manifest=lt.manifest).reader.multiprocessing_context == "fork"


# --------------------------------------------------------------------------- the step's own overhead


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"
)
@pytest.mark.parametrize("persistent", [False, True])
def test_arrival_stamp_is_when_torch_had_the_batch(persistent: bool) -> None:
    """The torch loader counts a step from when torch had its batch (the iterator's
    ``_next_data`` returned), not from when ``__next__`` came back: that return can wait for
    the GIL, and the job's step as its hooks measure it holds that wait already. Every batch
    gets its own stamp, at or before its receipt; a persistent iterator is wrapped once; an
    iterator without ``_next_data`` gets no stamp and still works."""
    import time

    import torch

    from dlreplay.replay.torchloader import arrival_stamps as _arrival_stamps

    loader = torch.utils.data.DataLoader(
        list(range(8)), batch_size=2, num_workers=1, persistent_workers=persistent
    )
    seen_lists = []
    for _epoch in range(2):
        it = iter(loader)
        stamp = _arrival_stamps(it)
        seen_lists.append(stamp)
        got = []
        for batch in it:
            received = time.perf_counter()
            assert 0.0 < stamp[0] <= received
            got.append(batch.tolist())
            stamp[0] = 0.0
        assert got == [[0, 1], [2, 3], [4, 5], [6, 7]]
    if persistent:  # one iterator for both epochs: its _next_data wrapped once, one stamp list
        assert seen_lists[0] is seen_lists[1]
    plain = iter([1, 2])
    assert _arrival_stamps(plain) == [0.0] and list(plain) == [1, 2]


def test_host_cpu_work_leaves_time_to_repay_earlier_overruns(tmp_path, monkeypatch) -> None:
    """A step whose host CPU fills its compute time has no sleep to take earlier steps'
    overrun (loop overhead, late wake-ups) out of: its CPU work ends that much earlier.
    With an overrun larger than every step (a debt of 10 s), no step spends any CPU."""
    from dlreplay.replay import accelerator

    real_init = accelerator._Sleeper.__init__

    def indebted(self) -> None:
        real_init(self)
        self.debt = 10.0

    monkeypatch.setattr(accelerator._Sleeper, "__init__", indebted)
    model = make_model(
        "train.computation_time=0.02", "train.computation_host_cpu=0.01", "train.epochs=1"
    )
    res = run_replay(
        ReplayConfig(
            model=model, data_dir=tmp_path / "d", out=tmp_path / "o", trace=False, loader="builtin"
        )
    )
    (ep,) = res.metrics["epochs"]
    assert ep["modelled_host_cpu_s"] > 0 and ep["host_cpu_s"] == 0.0


def test_a_checkpoint_of_unknown_size_is_its_time_alone(tmp_path):
    """A save whose writes and size the trace does not show (an annotated ``checkpoint.capture``
    around a save to an untraced directory): distill makes its duration the serialisation
    time, and the replay spends it at each due step and writes nothing."""
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill import distill

    from .conftest import TRACES

    lt = load_trace(TRACES / "ai_annotated")
    m = distill(lt.events, manifest=lt.manifest, source="ai_annotated")
    saves = lt.events.filter((pl.col("cat") == "checkpoint") & (pl.col("name") == "capture"))
    assert m.checkpoint.bytes_per_checkpoint == 0 and saves.height == 4
    assert m.checkpoint.serialization_time.mean == pytest.approx(saves["dur"].mean() * 1e-6)
    assert m.provenance.fields["checkpoint.serialization_time"].confidence == "measured"

    model = make_model(
        "checkpoint.enabled=true",
        "checkpoint.steps_between_checkpoints=2",
        "checkpoint.bytes_per_checkpoint=0",
        "checkpoint.serialization_time=0.02",
    )
    res = run_replay(
        ReplayConfig(
            model=model,
            data_dir=tmp_path / "d",
            out=tmp_path / "o",
            trace=False,
            loader="builtin",
            keep_checkpoints=True,
        )
    )
    saves_per_epoch = steps_per_epoch(model, 1) // 2
    for e in res.metrics["epochs"]:
        assert e["checkpoint_bytes"] == 0
        assert e["checkpoint_s"] >= saves_per_epoch * 0.02 * 0.95
    assert not [p for p in (tmp_path / "o").rglob("part-*")]


# --------------------------------------------------------------------------- times between reads


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("between_reads", [False, True])
def test_loader_work_comes_out_of_times_taken_between_reads(
    monkeypatch, tmp_path, between_reads, loader
):
    """``train.timed_between_reads``: the model's compute and preprocessing are the job's
    silences between its reads, its own loader work in them. The replay's loop that reads its
    own samples then takes its loader's work out of them, measured around the samples: here a
    collate of 60 ms after each batch's reads and 30 ms before each sample after a batch's first
    come out of the step's 100 ms and the sample's 50 ms. Without the flag they are added.
    Checked on the sleeps the replay asks for, not on the time they take."""
    import time as _time

    from dlreplay.replay import loader as loader_mod

    real_sleep, asked = _time.sleep, {"step": [], "sample": []}

    def sleep(seconds):
        caller = __import__("sys")._getframe(1).f_code.co_name
        if caller == "sleep":  # the step's (accelerator._Sleeper.sleep)
            asked["step"].append(seconds)
        elif caller in ("read_sample", "_sleep_preprocess"):  # a sample's preprocessing
            asked["sample"].append(seconds)
        real_sleep(seconds)

    real_read_sample, real_read_batch = (
        loader_mod.SampleReader.read_sample,
        loader_mod.SampleReader.read_batch,
    )

    calls = [0]

    def read_sample(self, f, k, cpu0=None, busy0=None):
        calls[0] += 1
        if calls[0] % 2 == 0:  # a batch's second sample (batch 2): the loader's own work first
            real_sleep(0.03)
        return real_read_sample(self, f, k, cpu0, busy0)

    def read_batch(self, index, samples):
        res = real_read_batch(self, index, samples)
        real_sleep(0.06)  # the job's collate, after the batch's last read
        return res

    monkeypatch.setattr(_time, "sleep", sleep)
    monkeypatch.setattr(loader_mod.SampleReader, "read_sample", read_sample)
    monkeypatch.setattr(loader_mod.SampleReader, "read_batch", read_batch)
    if loader == "torch":  # PyTorch's DataLoader collates the batch itself
        from dlreplay.replay import torchloader

        real_collate = torchloader.collate

        def collate(batch):
            out = real_collate(batch)
            real_sleep(0.06)
            return out

        monkeypatch.setattr(torchloader, "collate", collate)
    model = make_model(
        "reader.read_threads=0",
        "train.epochs=2",
        "train.computation_time=0.1",
        "reader.preprocess_time=0.05",
        f"train.timed_between_reads={str(between_reads).lower()}",
    )
    res = run_replay(
        ReplayConfig(
            model=model, data_dir=tmp_path / "d", out=tmp_path / "o", trace=False, loader=loader
        )
    )
    assert res.complete
    assert len(asked["step"]) == 8 and len(asked["sample"]) == 16
    # a batch's second sample follows the loader's 30 ms; its first, the step (the compute's)
    steps, inner = np.median(asked["step"]), np.median(asked["sample"][1::2])
    first = np.median(asked["sample"][0::2])
    assert first > 0.05 - 0.015, asked
    if between_reads:  # at most what is left of them after the loader's work (less overshoots)
        assert steps <= 0.1 - 0.06 + 0.002 and inner <= 0.05 - 0.03 + 0.002, asked
    else:  # the whole: only a previous sleep's overshoot comes out
        assert steps > 0.1 - 0.03 and inner > 0.05 - 0.015, asked
