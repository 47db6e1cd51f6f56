"""POSIX-only inference: the loop's parameters from the I/O alone, against what the hooks recorded.

The corpus captures hold both: the POSIX/STDIO events (what DFTracer's preload alone
records) and the data-loader events of the same run. Inference runs on the first and is
compared with the second; a capture made with ``--no-loader-hooks`` checks the real thing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.distill import distill

from .conftest import EXAMPLES, TRACES

CAPTURES = sorted(p.parent for p in TRACES.glob("*/manifest.json"))
DLIO = sorted(p.parent for p in TRACES.glob("dlio_*/dlio_config.yaml"))
#: Runs where a worker's batches leave no period in its gaps (it reads continuously, or
#: has too few batches per epoch) and no position of the long gaps stands out enough: the
#: batch size is reported unknown, never wrong (jpeg_small, npz_checkpoint, and at the 1e-2
#: level h5_shuffle and npz_spawn, chance 0.007-0.008: found by the position of the long gaps
#: in every worker's epoch, analyze/infer_batch.py)
NO_BATCH_PERIOD = {
    "h5_tiny_chunks",  # chance 0.02
}


def posix_only(events: pl.DataFrame) -> pl.DataFrame:
    """The events DFTracer's preload alone would have recorded for the same run."""
    return events.filter(pl.col("cat").is_in(["POSIX", "STDIO"])).with_columns(
        pl.lit(None, pl.String).alias("role")
    )


#: Runs POSIX-only inference cannot match: an evaluation loader's workers and files (its passes
#: are annotated spans; the reads alone look like training's: 40 files and 4 workers for 32 and 2).
NOT_POSIX_INFERABLE = {
    "dlio_npz_eval",
    # a reader that maps its files: no reads, nothing for the inference to count
    "dlio_ib_mmap",
}


@pytest.mark.parametrize(
    "trace",
    CAPTURES + [d for d in DLIO if d.name not in NOT_POSIX_INFERABLE] + [TRACES / "ai_annotated"],
    ids=lambda p: p.name,
)
def test_posix_inference_matches_the_hooks(trace: Path) -> None:
    lt = load_trace(trace)
    hooks = distill(lt.events, manifest=lt.manifest)
    posix = distill(posix_only(lt.events), manifest=lt.manifest)
    f = posix.provenance.fields
    assert posix.train.epochs == hooks.train.epochs
    assert posix.reader.read_threads == hooks.reader.read_threads
    assert posix.dataset.num_samples_per_file == hooks.dataset.num_samples_per_file
    assert posix.dataset.num_files == hooks.dataset.num_files
    assert (
        posix.processes.ranks == hooks.processes.ranks
    )  # a 2-rank DLIO run: 2 consumers with 1 worker each
    for field in ("train.epochs", "reader.read_threads", "dataset.num_samples_per_file"):
        assert f[field].confidence == "inferred", field
        assert f[field].method  # the evidence, in words and numbers
    if trace.name in NO_BATCH_PERIOD:
        assert f["reader.batch_size"].confidence == "default"
        assert "no batch period" in f["reader.batch_size"].method
    else:
        assert posix.reader.batch_size == hooks.reader.batch_size
        assert f["reader.batch_size"].confidence == "inferred"


def test_posix_compute_time_of_compute_bound_runs() -> None:
    """A step's compute from the interval between a worker's batches: within 35 % of the
    hooks' median step where the loop is compute-bound and steady (AU >= 0.9), and said to be
    an upper bound (a guess): the workers' pace holds the loop's own time too."""
    for name in ("dlio_h5_multi", "dlio_jpeg_ckpt", "ai_annotated"):
        lt = load_trace(TRACES / name)
        hooks = distill(lt.events)
        posix = distill(posix_only(lt.events))
        f = posix.provenance.fields["train.computation_time"]
        assert f.confidence == "default" and "upper bound" in f.method
        got, want = (
            posix.train.computation_time.quantiles["p50"],
            hooks.train.computation_time.quantiles["p50"],
        )
        assert got == pytest.approx(want, rel=0.35), name


@pytest.mark.slow
def test_capture_without_loader_hooks(tmp_path: Path, cli) -> None:
    """A real capture with the hooks off: POSIX only, and distill infers the loop."""
    data, out = tmp_path / "data", tmp_path / "trace"
    job = [
        sys.executable,
        str(EXAMPLES / "unet3d_npz.py"),
        "--data-dir",
        str(data),
        "--num-files",
        "16",
        "--volume",
        "32",
        "--batch-size",
        "2",
        "--workers",
        "2",
        "--epochs",
        "3",
        "--quiet",
        "--report",
        str(tmp_path / "report.json"),
    ]
    subprocess.run([*job, "--generate-only"], check=True, capture_output=True)
    cli(
        "capture",
        "--no-loader-hooks",
        "--data-dir",
        str(data),
        "--out",
        str(out),
        "-q",
        "--",
        *job,
        check=True,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["loader_hooks"] is False
    lt = load_trace(out)
    assert lt.events.filter(pl.col("role").is_not_null()).height == 0
    report = json.loads((tmp_path / "report.json").read_text())
    model = distill(lt.events, manifest=lt.manifest)
    assert model.train.epochs == report["epochs"] == 3
    assert model.reader.read_threads == 2
    assert model.dataset.num_files == 16 and model.dataset.num_samples_per_file == 1
    assert model.provenance.fields["train.epochs"].confidence == "inferred"
    if model.provenance.fields["reader.batch_size"].confidence == "inferred":
        assert model.reader.batch_size == 2
