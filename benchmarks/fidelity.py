"""Replay fidelity on real jobs: capture -> distill -> replay on the same machine, repeated.

For each benchmark job (real PyTorch training scripts in ``examples/``) and each repeat:

1. the job runs under ``dlreplay capture`` (its own report gives its epoch times);
2. the trace is distilled into a workload model;
3. the model is replayed (traced) on a dataset generated from it, on the same machine;
4. the two traces are compared (``dlreplay compare``'s similarity and KS distances).

Printed per job (median over repeats, with the spread):

* steady-state epoch error: mean replay epoch time over epochs 2.. vs the job's, in % (the
  whole run for a job of one epoch, e.g. a loop without epochs);
* first-epoch error: replay vs job epoch 1, in %;
* delta AU: replay AU - job AU, in percentage points, both computed from the traces
  by the same pass (``analyze``'s steps pass);
* similarity: DLIO's cosine similarity of the I/O feature vectors;
* read-size KS: Kolmogorov-Smirnov distance of the dataset read sizes;
* bytes ratio: dataset bytes read by the replay / by the job;
* pass/fail against the replay-fidelity targets: steady epoch within 5 %, first epoch
  within 10 %, |delta AU| <= 3 points (bytes and read sizes are reported, not judged).

The jobs run torch with one intra-op thread (``--threads 1``): on a small shared machine
torch's default thread pool makes step times swing by 10x with other load, which would
measure the machine, not the replay. Timings on a shared machine are noisy: the job's own repeat-to-repeat spread of its
steady-state epoch time is printed next to the errors, as the noise floor.

    python benchmarks/fidelity.py [--jobs npz_ckpt,h5_tiles] [--repeats 3] [--dir bench-data/fidelity]
        [--json results.json] [--baseline-python OTHER_VENV/bin/python] [--sleep]

With ``--baseline-python``, every capture is also distilled and replayed by another
installation of dlreplay (a venv of an earlier commit): before/after on the same real runs.
With ``--sleep``, every model is also replayed with ``train.computation_host_cpu=0`` (the step a
pure sleep): what the host CPU model itself changes on the same runs. Each repeat's line also
shows the host CPU the capture measured in the job and in the replay (the training process's
CPU per step, the workers' per sample, ms) and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from layout_fidelity import settled_dataset, warm_page_cache  # noqa: E402  (benchmarks/, this script's directory)

from dlreplay.analyze import load_trace  # noqa: E402
from dlreplay.analyze.compare import compare_traces  # noqa: E402
from dlreplay.analyze.distill import distill  # noqa: E402
from dlreplay.capture import CaptureConfig, run_capture  # noqa: E402
from dlreplay.model import apply_overrides  # noqa: E402
from dlreplay.replay import ReplayConfig, run_replay  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Job:
    """One benchmark job: an example script and its arguments (epochs included)."""

    script: str
    args: tuple[str, ...]
    what: str
    #: interpreter arguments before the script: a launcher module (``-m torch.distributed.run ...``)
    launcher: tuple[str, ...] = ()


#: The benchmark jobs (replay-fidelity issue): each stresses one part of the timing model.
JOBS: dict[str, Job] = {
    "npz_ckpt": Job(
        "unet3d_npz",
        (
            "--num-files",
            "64",
            "--volume",
            "48",
            "--batch-size",
            "4",
            "--workers",
            "2",
            "--epochs",
            "4",
            "--by-path",
            "--checkpoint-every-epoch",
            "--threads",
            "1",
        ),
        "NPZ volumes, 2 non-persistent workers, torch.save every epoch",
    ),
    "h5_tiles": Job(
        "tiles_h5",
        (
            "--num-files",
            "6144",
            "--tile",
            "32",
            "--batch-size",
            "64",
            "--workers",
            "3",
            "--epochs",
            "4",
            "--by-path",
            "--threads",
            "1",
        ),
        "one HDF5 file of 32x32 tiles, one tile per chunk, shuffled, 3 workers (h5py)",
    ),
    "jpeg_varied": Job(
        "resnet_jpeg",
        (
            "--num-files",
            "2048",
            "--image-size",
            "48",
            "--source-size",
            "32",
            "160",
            "--batch-size",
            "32",
            "--workers",
            "2",
            "--persistent-workers",
            "--epochs",
            "4",
            "--by-path",
            "--threads",
            "1",
        ),
        "JPEG folder, varying sizes, PIL decode + resize, 2 persistent workers",
    ),
    "npz_starved": Job(
        "unet3d_npz",
        (
            "--num-files",
            "128",
            "--volume",
            "64",
            "--batch-size",
            "4",
            "--workers",
            "2",
            "--epochs",
            "4",
            "--compressed",
            "--arch",
            "pointwise",
            "--by-path",
            "--threads",
            "1",
        ),
        "compressed NPZ, decode-bound: 2 workers starve a tiny model",
    ),
    "ddp_2rank": Job(
        "ddp_torchrun",
        (
            "--num-files",
            "64",
            "--volume",
            "48",
            "--batch-size",
            "4",
            "--workers",
            "2",
            "--epochs",
            "4",
            "--by-path",
            "--checkpoint-every-epoch",
            "--threads",
            "1",
        ),
        "torchrun, 2 ranks (gloo DDP), DistributedSampler, 2 workers per rank, rank-0 torch.save",
        ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
    ),
    "ddp_3rank": Job(
        "ddp_torchrun",
        (
            "--num-files",
            "90",
            "--volume",
            "32",
            "--batch-size",
            "3",
            "--workers",
            "1",
            "--epochs",
            "4",
            "--by-path",
            "--threads",
            "1",
        ),
        "torchrun, 3 ranks (gloo DDP), DistributedSampler, 1 worker per rank, batch 3",
        ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"),
    ),
    "tar_stream": Job(
        "shards_tar",
        (
            "--num-files",
            "64",
            "--samples-per-shard",
            "64",
            "--sample-bytes",
            "16384",
            "--batch-size",
            "16",
            "--workers",
            "2",
            "--epochs",
            "4",
            "--threads",
            "1",
        ),
        "WebDataset-style tar shards streamed by an IterableDataset (tarfile r|), 2 workers, "
        "shards interleaved over workers",
    ),
    "wds_shuffle": Job(
        "shards_tar",
        (
            "--num-files",
            "12",
            "--samples-per-shard",
            "48",
            "--member",
            "jpeg",
            "--image-size",
            "48",
            "--reader",
            "webdataset",
            "--split",
            "contiguous",
            "--shuffle-buffer",
            "32",
            "--batch-size",
            "12",
            "--workers",
            "3",
            "--epochs",
            "4",
            "--threads",
            "1",
        ),
        "tar shards of JPEG + label through webdataset, 3 workers, contiguous split, "
        "shuffle buffer 32",
    ),
    "arrow_stream": Job(
        "shards_tar",
        (
            "--format",
            "arrow",
            "--num-files",
            "40",
            "--samples-per-shard",
            "96",
            "--sample-bytes",
            "8192",
            "--rows-per-batch",
            "16",
            "--batch-size",
            "16",
            "--workers",
            "2",
            "--epochs",
            "4",
            "--threads",
            "1",
        ),
        "Arrow IPC stream shards (HF datasets' format) read with pyarrow, 2 workers",
    ),
    "tar_persistent": Job(
        "shards_tar",
        (
            "--num-files",
            "10",
            "--samples-per-shard",
            "40",
            "--member",
            "jpeg",
            "--image-size",
            "32",
            "--split",
            "contiguous",
            "--batch-size",
            "10",
            "--workers",
            "3",
            "--persistent-workers",
            "--epochs",
            "4",
            "--threads",
            "1",
        ),
        "tar shards of JPEG + label through tarfile, 3 persistent workers (each starts once), "
        "contiguous split",
    ),
    "tokens_block128": Job(
        "tokens_memmap",
        (
            "--tokens",
            "4000000",
            "--block",
            "128",
            "--batch",
            "8",
            "--steps",
            "120",
            "--eval-interval",
            "40",
            "--eval-iters",
            "4",
            "--threads",
            "1",
        ),
        "no DataLoader: np.memmap of a uint16 token file anew every batch, 8 random windows of "
        "128 tokens, validation every 40 steps",
    ),
    "tokens_block1024": Job(
        "tokens_memmap",
        (
            "--tokens",
            "8000000",
            "--block",
            "1024",
            "--batch",
            "2",
            "--steps",
            "60",
            "--eval-interval",
            "20",
            "--eval-iters",
            "2",
            "--threads",
            "1",
        ),
        "no DataLoader: np.memmap of a uint16 token file anew every batch, 2 random windows of "
        "1024 tokens, validation every 20 steps",
    ),
    "dcp_sharded": Job(
        "dcp_sharded",
        (
            "--num-files",
            "32",
            "--volume",
            "16",
            "--batch-size",
            "2",
            "--workers",
            "1",
            "--epochs",
            "3",
            "--checkpoint-every",
            "4",
            "--fsync",
            "--keep",
            "0",
            "--by-path",
            "--threads",
            "1",
        ),
        "torchrun, 2 ranks, torch.distributed.checkpoint: dcp.save every 4 steps with fsync "
        "(each rank its shard, rank 0 the .metadata)",
        ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
    ),
    "npy_pairs": Job(
        "paired_files",
        ("--format", "npy", "--parts", "2", "--num-files", "256", "--edge", "64")
        + ("--batch-size", "8", "--workers", "2", "--epochs", "4", "--threads", "1"),
        "every sample two NPY files read whole (image, mask: MLPerf unet3d's case_x/case_y), "
        "2 workers",
    ),
    "png_triples": Job(
        "paired_files",
        ("--format", "png", "--parts", "3", "--part-order", "mask-first", "--num-files", "192")
        + ("--batch-size", "6", "--workers", "2", "--persistent-workers", "--epochs", "4")
        + ("--threads", "1"),
        "every sample three PNG files (mask, image, weight map), 2 persistent workers",
    ),
    "pt_samples": Job(
        "pt_samples",
        ("--tensors", "2", "--edge", "96", "--num-files", "256", "--batch-size", "8")
        + ("--workers", "2", "--epochs", "4", "--threads", "1"),
        "a torch.save'd file a sample (image and mask) read by torch.load, 2 workers",
    ),
    "mapped_rows": Job(
        "mapped_rows",
        ("--num-files", "2048", "--row-bytes", "65536", "--batch-size", "16", "--workers", "2")
        + ("--epochs", "4", "--threads", "1"),
        "rows of one NPY file mapped in each worker (np.load(mmap_mode='r')), 64 KiB a row",
    ),
    "jsonl_lines": Job(
        "jsonl_lines",
        ("--num-files", "4", "--lines", "1024", "--min-line", "512", "--max-line", "6144")
        + ("--batch-size", "16", "--workers", "2", "--shuffle", "--epochs", "4", "--threads", "1"),
        "JSON lines read by seek + readline, 0.5-6 KiB a line, the lines indexed by a pass "
        "over the files as the Dataset is made, 2 workers",
    ),
    "parquet_rows": Job(
        "parquet_rows",
        ("--num-files", "4", "--rows", "1024", "--row-group", "64", "--row-bytes", "2048")
        + ("--batch-size", "16", "--workers", "2", "--shuffle", "--epochs", "4", "--threads", "1"),
        "Parquet rows read by the row group holding them (pyarrow read_row_group, the last "
        "group kept), snappy, 2 workers",
    ),
    "parquet_columns": Job(
        "parquet_rows",
        ("--num-files", "3", "--rows", "1024", "--row-group", "128", "--row-bytes", "1024")
        + ("--compression", "zstd", "--columns", "features")
        + ("--batch-size", "32", "--workers", "2", "--persistent-workers", "--shuffle")
        + ("--epochs", "4", "--threads", "1"),
        "Parquet rows read by row group for one column of three (read_row_group columns=), "
        "zstd, 2 persistent workers",
    ),
}

TARGETS = {"steady_pct": 5.0, "first_pct": 10.0, "au_points": 3.0}


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _steady(epochs: list[float]) -> float:
    """Mean of epochs 2.. (s); a run of one epoch (a loop without epochs) is its whole run."""
    return _mean(epochs[1:]) if len(epochs) > 1 else _mean(epochs)


def _score(
    name: str,
    repeat: int,
    pipeline: str,
    real: list[float],
    replay: list[float],
    trace: Path,
    replay_dir: Path,
    data: Path,
    loader: str,
) -> dict[str, Any]:
    cmp = compare_traces(trace, replay_dir, data_dirs_a=[str(data)])
    au_a, au_b = cmp.timing_a.get("au"), cmp.timing_b.get("au")
    bytes_a, bytes_b = cmp.features_a.get("bytes_read"), cmp.features_b.get("bytes_read")
    return {
        "job": name,
        "repeat": repeat,
        "pipeline": pipeline,
        "real_epochs_s": real,
        "replay_epochs_s": replay,
        "steady_pct": 100.0 * (_steady(replay) / _steady(real) - 1.0),
        "first_pct": 100.0 * (replay[0] / real[0] - 1.0),
        "au_real": au_a,
        "au_replay": au_b,
        "au_points": 100.0 * (au_b - au_a)
        if au_a is not None and au_b is not None
        else float("nan"),
        "similarity": cmp.similarity,
        "ks_read_sizes": cmp.ks_read_sizes,
        "bytes_ratio": bytes_b / bytes_a if bytes_a and bytes_b is not None else float("nan"),
        "loader": loader,
    }


def _host_cpu(trace: Path) -> dict[str, float | None]:
    """Host CPU of a trace, as the capture measures it: the training process's CPU per step and
    the workers' CPU per sample (ms; None where the trace has no measurement)."""
    from dlreplay.analyze.trace import vocabulary as voc

    ev = voc.ensure_roles(load_trace(trace).events)
    steps = voc.training_steps(ev)
    items = ev.filter(pl.col("role") == voc.ITEM)
    step_cpu, item_cpu = steps["cpu_us"].mean(), items["cpu_time"].mean() if items.height else None
    return {
        "step_cpu_ms": step_cpu / 1e3 if step_cpu is not None else None,  # type: ignore[operator]
        "item_cpu_ms": item_cpu / 1e3 if item_cpu is not None else None,
    }  # type: ignore[operator]


def _this_pipeline(
    name: str,
    run_dir: Path,
    work: Path,
    repeat: int,
    real: list[float],
    data: Path,
    loader: str | None,
    sets: tuple[str, ...] = (),
    pipeline: str = "this",
) -> dict[str, Any]:
    loaded = load_trace(run_dir / "trace")
    model = apply_overrides(
        distill(loaded.events, manifest=loaded.manifest, source=str(run_dir / "trace")), sets
    )
    extra = {"loader": loader} if loader else {}
    out = run_dir / ("replay" if pipeline == "this" else f"replay-{pipeline}")
    cfg = ReplayConfig(model=model, data_dir=work / "replay-data", out=out, trace=True, **extra)
    # the replay's dataset, kept from an earlier repeat or run, read from the page cache as the
    # job's was (warm_page_cache before the capture): a dataset the VM had reclaimed made the
    # replay read from disk (io time 0.53 s against the job's 0.10 s, similarity 0.92); and the
    # job's checkpoints written back first: their writeback would throttle the replay's writes
    settled_dataset(model, work / "replay-data")
    with contextlib.redirect_stdout(io.StringIO()):
        result = run_replay(cfg, echo=lambda s: None)
    replay = [e["epoch_time_s"] for e in result.metrics["epochs"]]
    row = _score(
        name,
        repeat,
        pipeline,
        real,
        replay,
        run_dir / "trace",
        out,
        data,
        result.metrics.get("loader", "builtin"),
    )
    job_cpu, replay_cpu = _host_cpu(run_dir / "trace"), _host_cpu(out)
    row["host_cpu"] = {"job": job_cpu, "replay": replay_cpu}
    row["model"] = {
        "workers": model.reader.read_threads,
        "persistent": model.reader.persistent_workers,
        "compute_ms": round(1e3 * (model.train.computation_time.mean or 0.0), 2),
        "warmup_steps": len(model.train.warmup_computation_time),
        "epoch_end_ms": round(1e3 * (model.train.epoch_end_time.mean or 0.0), 2),
        "preprocess_ms": round(1e3 * (model.reader.preprocess_time.mean or 0.0), 2),
        "host_cpu_ms": round(1e3 * (model.train.computation_host_cpu.mean or 0.0), 2),
        "host_threads": model.train.computation_host_threads,
    }
    return row


def _baseline_pipeline(
    name: str, python: Path, run_dir: Path, work: Path, repeat: int, real: list[float], data: Path
) -> dict[str, Any]:
    """Distill and replay the same trace with another installation's CLI (e.g. the main branch)."""
    model = run_dir / "baseline-model.yaml"
    # cwd: not this checkout, whose dlreplay `python -m` would import first
    subprocess.run(
        [str(python), "-m", "dlreplay", "distill", str(run_dir / "trace"), "-o", str(model), "-q"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=run_dir,
    )
    out = run_dir / "replay-baseline"
    subprocess.run(
        [
            str(python),
            "-m",
            "dlreplay",
            "replay",
            str(model),
            "--data-dir",
            str(work / "replay-data-baseline"),
            "--out",
            str(out),
            "-q",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=run_dir,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    replay = [e["epoch_time_s"] for e in metrics["epochs"]]
    return _score(
        name,
        repeat,
        "baseline",
        real,
        replay,
        run_dir / "trace",
        out,
        data,
        metrics.get("loader", "builtin"),
    )


def run_once(
    name: str,
    job: Job,
    work: Path,
    repeat: int,
    loader: str | None,
    baseline: Path | None = None,
    sleep: bool = False,
) -> list[dict[str, Any]]:
    """Capture one job once, then distill, replay and compare it (also with *baseline*'s
    installation, and with the step's host CPU set to 0 when *sleep*: the replays in an order
    rotated by repeat); returns one row per pipeline."""
    run_dir = work / f"r{repeat}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    data = work / "data"
    cmd = [
        sys.executable,
        *job.launcher,
        str(REPO / "examples" / f"{job.script}.py"),
        "--data-dir",
        str(data),
        *job.args,
        "--checkpoint-dir",
        str(run_dir / "ck"),
        "--report",
        str(run_dir / "report.json"),
        "--quiet",
    ]
    if data.exists():
        warm_page_cache(data)  # as the replay's freshly generated dataset is
    captured = run_capture(
        CaptureConfig(command=tuple(cmd), out=run_dir / "trace", data_dirs=(str(data),), force=True)
    )
    if captured.exit_code:
        raise SystemExit(f"{name}: job failed (exit {captured.exit_code})")
    real = json.loads((run_dir / "report.json").read_text())["epoch_times_s"]
    rows = []
    steps = [lambda: _this_pipeline(name, run_dir, work, repeat, real, data, loader)]
    if baseline is not None:
        steps.append(lambda: _baseline_pipeline(name, baseline, run_dir, work, repeat, real, data))
    if sleep:
        steps.append(
            lambda: _this_pipeline(
                name,
                run_dir,
                work,
                repeat,
                real,
                data,
                loader,
                ("train.computation_host_cpu=0",),
                "sleep",
            )
        )
    k = repeat % len(steps)
    steps = steps[k:] + steps[:k]
    for step in steps:
        rows.append(step())
    return rows


def _median(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


def summarize(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of one job and pipeline."""
    med = {
        k: _median(rows, k)
        for k in (
            "steady_pct",
            "first_pct",
            "au_points",
            "similarity",
            "ks_read_sizes",
            "bytes_ratio",
            "au_real",
            "au_replay",
        )
    }
    steady_real = [_steady(r["real_epochs_s"]) for r in rows]
    noise = (
        100.0 * (max(steady_real) - min(steady_real)) / statistics.median(steady_real)
        if rows
        else 0.0
    )
    ok = (
        abs(med["steady_pct"]) <= TARGETS["steady_pct"]
        and abs(med["first_pct"]) <= TARGETS["first_pct"]
        and abs(med["au_points"]) <= TARGETS["au_points"]
    )
    return {
        "job": name,
        "pipeline": rows[-1]["pipeline"],
        **med,
        "real_spread_pct": noise,
        "pass": ok,
        "loader": rows[-1]["loader"],
        "real_steady_s": statistics.median(steady_real),
    }


def render(summaries: list[dict[str, Any]]) -> str:
    head = (
        f"{'job':<12} {'pipeline':<9} {'loader':<8} {'steady %':>9} {'first %':>8} {'dAU pt':>7} {'AU real':>8} "
        f"{'simil.':>7} {'KS rd':>6} {'bytes':>6} {'noise %':>8}  verdict"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        lines.append(
            f"{s['job']:<12} {s['pipeline']:<9} {s['loader']:<8} {s['steady_pct']:>+9.1f} {s['first_pct']:>+8.1f} "
            f"{s['au_points']:>+7.1f} {100 * (s['au_real'] or 0):>8.1f} {s['similarity']:>7.3f} "
            f"{s['ks_read_sizes']:>6.3f} {s['bytes_ratio']:>6.2f} {s['real_spread_pct']:>8.1f}  "
            f"{'PASS' if s['pass'] else 'FAIL'}"
        )
    lines.append(
        f"targets: steady epoch within {TARGETS['steady_pct']:.0f} %, first epoch within "
        f"{TARGETS['first_pct']:.0f} %, |dAU| <= {TARGETS['au_points']:.0f} points (median of repeats); "
        "noise % = the real job's own steady-epoch spread (max-min)/median over repeats"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--jobs", default=",".join(JOBS), help=f"comma-separated subset of {', '.join(JOBS)}"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data" / "fidelity")
    ap.add_argument(
        "--loader", default=None, help="replay loader (auto, torch, builtin); default: the replay's"
    )
    ap.add_argument(
        "--json", type=Path, default=None, help="write every measurement and the summary here"
    )
    ap.add_argument(
        "--sleep",
        action="store_true",
        help="also replay every capture's model with train.computation_host_cpu=0 (the step a pure "
        "sleep, as DLIO): the host CPU model's own effect on the same runs",
    )
    ap.add_argument(
        "--baseline-python",
        type=Path,
        default=None,
        help="also distill and replay every capture with this interpreter's dlreplay (e.g. a venv of "
        "the main branch): a before/after on the same real runs",
    )
    args = ap.parse_args()
    names = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        ap.error(f"unknown job(s) {', '.join(unknown)}; choose from {', '.join(JOBS)}")
    all_rows: list[dict[str, Any]] = []
    summaries = []
    for name in names:
        job = JOBS[name]
        work = args.dir / name
        data = work / "data"
        subprocess.run(
            [
                sys.executable,
                str(REPO / "examples" / f"{job.script}.py"),
                "--data-dir",
                str(data),
                *job.args,
                "--generate-only",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        rows: list[dict[str, Any]] = []
        for r in range(args.repeats):
            for row in run_once(name, job, work, r, args.loader, args.baseline_python, args.sleep):
                rows.append(row)
                print(
                    f"{name} #{r + 1} {row['pipeline']}: real epochs "
                    f"{' '.join(f'{t:.2f}' for t in row['real_epochs_s'])} s, replay "
                    f"{' '.join(f'{t:.2f}' for t in row['replay_epochs_s'])} s; steady {row['steady_pct']:+.1f} %, "
                    f"first {row['first_pct']:+.1f} %, dAU {row['au_points']:+.1f} pt"
                    + (f"; model {row['model']}" if "model" in row else "")
                    + (f"; host CPU {row['host_cpu']}" if "host_cpu" in row else "")
                    + f"; load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        all_rows.extend(rows)
        for pipeline in ("baseline", "sleep", "this"):
            mine = [r for r in rows if r["pipeline"] == pipeline]
            if mine:
                summaries.append(summarize(name, mine))
    print()
    print(render(summaries))
    if args.json:
        args.json.write_text(
            json.dumps({"runs": all_rows, "summary": summaries}, indent=1, default=str)
        )


if __name__ == "__main__":
    main()
