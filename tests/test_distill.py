"""distill: models inferred from real captures match what the jobs did."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.distill import DistillError, distill, warmup_steps
from dlreplay.capture import CaptureConfig, run_capture
from dlreplay.model import load_model
from dlreplay.schema import empty_events

from .conftest import EXAMPLES, TRACES

# dlreplay captures; DLIO and DFTracer-annotated traces: tests/test_vocabulary.py
CORPUS = sorted(p.parent for p in TRACES.glob("*/manifest.json"))


def _check(model, truth: dict) -> None:
    d, r, t, c = model.dataset, model.reader, model.train, model.checkpoint
    assert d.format == truth["format"]
    assert d.num_files == truth["num_files"]
    assert d.num_samples_per_file == truth["num_samples_per_file"]
    assert r.batch_size == truth["batch_size"]
    assert r.read_threads == truth["read_threads"]
    assert t.epochs == truth["epochs"]
    assert d.record_length.mean == pytest.approx(truth["record_length_mean"], rel=0.02)
    # The job's own step timings: what the replay spends per step (warm-up steps as measured,
    # the steady mean elsewhere) adds up to the job's total compute.
    _check_compute(model, truth["step_compute_s"], truth["epochs"])
    if truth["checkpoint_every"]:
        assert c.enabled and c.steps_between_checkpoints == truth["checkpoint_every"]
        assert c.bytes_per_checkpoint == pytest.approx(truth["checkpoint_bytes_mean"], rel=0.05)
    else:
        assert not c.enabled
    assert (r.sample_shuffle != "off") == truth["shuffle"]
    assert model.provenance.fields["reader.batch_size"].confidence == "measured"


def _check_compute(model, job_steps: list[float], epochs: int) -> None:
    from dlreplay.replay.engine import step_compute

    t = model.train
    per_epoch = len(job_steps) // epochs
    modelled = [
        step_compute(model, np.full(per_epoch, t.computation_time.mean), e, (e - 1) * per_epoch)
        for e in range(1, epochs + 1)
    ]
    assert sum(float(m.sum()) for m in modelled) == pytest.approx(sum(job_steps), rel=0.10)
    steady = job_steps[warmup_steps(job_steps) :]
    assert t.computation_time.mean <= 1.10 * sum(steady) / len(steady)


@pytest.mark.parametrize("trace", CORPUS, ids=lambda p: p.name)
def test_corpus_models(trace: Path) -> None:
    truth = json.loads((trace / "expected.json").read_text())["model"]
    loaded = load_trace(trace)
    model = distill(loaded.events, manifest=loaded.manifest, source=str(trace))
    _check(model, truth)
    assert model.provenance.source_trace == str(trace)
    assert model.reader.transfer_size.is_known
    assert model.reader.access_pattern.sequential is not None
    # the workers' start method, as the corpus job was told (examples' --mp-context; fork by default)
    sys.path.insert(0, str(TRACES))
    from make_corpus import CORPUS as JOBS  # type: ignore[import-not-found]

    args = JOBS[trace.name][1]
    ctx = args[args.index("--mp-context") + 1] if "--mp-context" in args else "fork"
    assert model.reader.multiprocessing_context == ctx


@pytest.mark.slow
def test_npz_reads_in_256k_chunks(tmp_path: Path) -> None:
    """np.load reads NPZ members in 262144-byte chunks (the DLIO talk's lesson)."""
    data = tmp_path / "data"
    job = [
        sys.executable,
        str(EXAMPLES / "unet3d_npz.py"),
        "--data-dir",
        str(data),
        "--num-files",
        "4",
        "--volume",
        "64",
        "--batch-size",
        "2",
        "--workers",
        "1",
        "--epochs",
        "1",
        "--quiet",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    assert (
        run_capture(
            CaptureConfig(command=tuple(job), out=tmp_path / "t", data_dirs=(str(data),))
        ).exit_code
        == 0
    )
    loaded = load_trace(tmp_path / "t")
    model = distill(loaded.events, manifest=loaded.manifest)
    assert model.reader.transfer_size.max == 262144
    assert model.reader.metadata_per_sample.lseeks > 5  # zip directory probing per np.load


def test_cli_distill_writes_a_valid_model(tmp_path: Path, cli) -> None:
    out = tmp_path / "model.yaml"
    proc = cli("distill", str(TRACES / "npz_fork"), "-o", str(out), check=True)
    assert "next: dlreplay model export-dlio" in proc.stdout
    model = load_model(out)
    assert model.dataset.format == "npz" and model.reader.batch_size == 2
    again = cli("distill", str(TRACES / "npz_fork"), "-o", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    dlio = tmp_path / "workload.yaml"
    cli("model", "export-dlio", str(out), "-o", str(dlio), check=True)
    assert "num_files_train: 24" in dlio.read_text()


def test_posix_only_fallback_marks_lower_confidence() -> None:
    loaded = load_trace(TRACES / "npz_fork")
    posix = loaded.events.filter(pl.col("cat").is_in(["POSIX", "STDIO"]))
    data_dir = loaded.manifest["data_dirs"][0]
    model = distill(posix, data_dirs=[data_dir])
    assert model.dataset.format == "npz" and model.dataset.num_files == 24
    assert model.train.epochs == 3
    assert model.reader.read_threads >= 2
    # the batch size is inferred from the workers' gaps (analyze/infer.py), marked as such
    assert model.reader.batch_size == 2
    assert model.provenance.fields["reader.batch_size"].confidence == "inferred"
    assert model.provenance.fields["train.epochs"].confidence == "inferred"


def test_bad_inputs_give_clear_messages() -> None:
    with pytest.raises(DistillError, match="no events"):
        distill(empty_events())
    loaded = load_trace(TRACES / "npz_spawn")
    no_fh = loaded.events.with_columns(pl.lit(None, pl.Utf8).alias("file"))
    with pytest.raises(DistillError, match="no file names"):
        distill(no_fh)
    only_meta = loaded.events.filter(~pl.col("name").is_in(["read", "pread64", "fread"]))
    only_meta = only_meta.filter(~pl.col("cat").is_in(["data", "dataloader"]))
    with pytest.raises(DistillError, match="no dataset reads"):
        distill(only_meta, data_dirs=["/nonexistent-dir"])


def test_cli_distill_empty_trace(tmp_path: Path, cli) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "trace-x-preload.pfw.gz").write_bytes(b"")
    proc = cli("distill", str(tmp_path / "t"), "-o", str(tmp_path / "m.yaml"))
    assert proc.returncode == 1
    assert "no events" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_four_workers_with_shuffle(tmp_path: Path) -> None:
    """Prior tools underestimate batch size with many workers; fetch events make it exact."""
    data = tmp_path / "data"
    job = [
        sys.executable,
        str(EXAMPLES / "unet3d_npz.py"),
        "--data-dir",
        str(data),
        "--num-files",
        "16",
        "--batch-size",
        "4",
        "--workers",
        "4",
        "--epochs",
        "2",
        "--shuffle",
        "--report",
        str(tmp_path / "r.json"),
        "--quiet",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    result = run_capture(
        CaptureConfig(command=tuple(job), out=tmp_path / "t", data_dirs=(str(data),))
    )
    assert result.exit_code == 0
    report = json.loads((tmp_path / "r.json").read_text())
    loaded = load_trace(tmp_path / "t")
    model = distill(loaded.events, manifest=loaded.manifest)
    assert model.reader.batch_size == 4
    assert model.reader.read_threads == 4
    assert model.dataset.num_files == 16 and model.train.epochs == 2
    assert model.reader.sample_shuffle != "off"
    _check_compute(model, report["step_compute_s"], 2)


def test_checkpoint_interval_counts_one_ranks_saves() -> None:
    """Two ranks save at the same steps (DLIO: every 4 steps; rank 1's saves write nothing):
    the interval is 4, not the 0 steps between one rank's save and the other's (a model with
    steps_between_checkpoints 0 could not be replayed)."""
    from dlreplay.analyze.distill.base import Facts as _Facts
    from dlreplay.analyze.distill.checkpoint import checkpoint_section as _checkpoint

    steps = pl.DataFrame(
        {"pid": [1] * 12, "ts": [100 * i for i in range(12)]},
        schema={"pid": pl.Int32, "ts": pl.Int64},
    )
    saves = pl.DataFrame(
        {
            "pid": [1, 2] * 3,
            "ts": [350, 352, 750, 752, 1150, 1152],
            "size": [None] * 6,
            "file": [None] * 6,
            "dur": [10] * 6,
        },
        schema={
            "pid": pl.Int32,
            "ts": pl.Int64,
            "size": pl.Int64,
            "file": pl.String,
            "dur": pl.Int64,
        },
    )
    ck = _checkpoint(empty_events(), saves, steps, _Facts())
    assert ck.enabled and ck.steps_between_checkpoints == 4


def _in_memory_capture(tmp_path: Path, workers: int) -> Path:
    """A real capture (loader hooks on) of a job that ``np.load``s two 8 KiB arrays into a
    ``TensorDataset`` as it starts and trains 2 epochs over them with *workers* workers."""
    pytest.importorskip("torch")
    data = tmp_path / "data"
    data.mkdir()
    for name in ("x", "y"):
        np.save(data / f"{name}.npy", np.arange(2048, dtype=np.float32))
    job = (
        "import numpy as np, sys, torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "x, y = (torch.from_numpy(np.load(p)) for p in sys.argv[1:])\n"
        "for epoch in range(2):\n"
        f"    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=256, num_workers={workers}):\n"
        "        (xb * yb).sum()\n"
    )
    run_capture(
        CaptureConfig(
            command=(sys.executable, "-c", job, str(data / "x.npy"), str(data / "y.npy")),
            out=tmp_path / "trace",
            data_dirs=(str(data),),
        )
    )
    return tmp_path / "trace"


def test_a_dataset_loaded_into_memory_at_start_is_named_in_the_error(tmp_path: Path) -> None:
    """A job that loads its arrays into memory as it starts (``np.load`` of each file once)
    reads nothing while it trains: distill stops with an error that names the files it read
    once and why there is nothing to model, not "pass --data-dir" (which the capture had).
    Each array's read, which numpy makes through a duplicated descriptor DFTracer does not
    see, is in the table, recovered from its seeks (analyze/trace/hidden.py): 8 KiB and the
    128-byte header read again, after the header's buffered 4 KiB."""
    from .conftest import run_cli

    trace = _in_memory_capture(tmp_path, workers=2)
    lt = load_trace(trace)
    reads = lt.events.filter(
        pl.col("name").cast(pl.String).is_in(["read", "pread64", "fread"])
        & pl.col("file").cast(pl.String).str.ends_with(".npy")
    )
    recovered = reads.filter(pl.col("name").cast(pl.String) == "fread")["size"].to_list()
    assert recovered == [8192 + 128, 8192 + 128], reads
    proc = run_cli("distill", str(trace), "-o", str(tmp_path / "m.yaml"))
    assert proc.returncode != 0
    err = proc.stderr
    assert "2 file(s) were read before the first sample and none while" in err, err
    assert "(x.npy, y.npy)" in err and "in memory" in err, err
    assert "Pass --data-dir" not in err, err
    assert not (tmp_path / "m.yaml").exists()


def test_samples_that_read_nothing_are_no_dataset(tmp_path: Path) -> None:
    """The same job without workers: its training process read the two files, so they had
    counted as the dataset ("2 files x 1 sample, batch 32, 64 steps an epoch"); every read
    came before the first sample and none in one, so it is the same error."""
    from .conftest import run_cli

    trace = _in_memory_capture(tmp_path, workers=0)
    proc = run_cli("distill", str(trace), "-o", str(tmp_path / "m.yaml"))
    assert proc.returncode != 0, proc.stdout
    assert "its samples read no file" in proc.stderr, proc.stderr
    assert "none while the job trained (x.npy, y.npy)" in proc.stderr, proc.stderr
