"""Regenerate the committed trace corpus: real captures of the example jobs.

Each entry is captured with ``dlreplay capture`` into ``traces/<name>/`` and gets an
``expected.json`` built from the job's own report (what the job itself counted: bytes
read through its unbuffered counting file objects, per process; batches; samples;
checkpoint bytes). Tests compare what the loader reads from the trace with it.

    python traces/make_corpus.py [--only NAME] [--work /tmp/dlreplay-corpus]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from dlreplay.capture import CaptureConfig, run_capture  # noqa: E402

sys.path.insert(0, str(HERE))
# Before the captured run: the generator's dirty pages written back and every dataset file
# read once, as before DLIO's traced runs. Unsettled, this VM's writeback and its reclaim of
# page cache left untouched timed the first corpus's reads (jpeg_small's second epoch took
# 6.4 s, its first 3.1 s).
from make_dlio_corpus import settle  # noqa: E402

#: name -> (example script, job arguments). Sizes keep each trace well under 1 MB.
CORPUS: dict[str, tuple[str, list[str]]] = {
    "npz_fork": (
        "unet3d_npz.py",
        [
            "--num-files",
            "24",
            "--batch-size",
            "2",
            "--workers",
            "2",
            "--epochs",
            "3",
            "--checkpoint-every",
            "4",
            "--mp-context",
            "fork",
        ],
    ),
    "npz_spawn": (
        "unet3d_npz.py",
        [
            "--num-files",
            "8",
            "--batch-size",
            "2",
            "--workers",
            "2",
            "--epochs",
            "2",
            "--mp-context",
            "spawn",
        ],
    ),
    # A healthy run: compute outweighs loading on any machine (4x the model width, 1 thread),
    # so the loader keeps up after the workers' start (AU >= 90 %).
    "h5_shuffle": (
        "cosmoflow_h5.py",
        [
            "--num-files",
            "8",
            "--samples-per-file",
            "4",
            "--batch-size",
            "8",
            "--workers",
            "3",
            "--epochs",
            "2",
            "--compute-scale",
            "4",
            "--threads",
            "1",
        ],
    ),
    # Many tiny files, opened per sample, and a model heavy enough that decoding keeps up:
    # metadata dominates the I/O and is the top cause (tests/test_findings.py).
    "jpeg_small": (
        "resnet_jpeg.py",
        [
            "--num-files",
            "256",
            "--batch-size",
            "32",
            "--workers",
            "2",
            "--epochs",
            "2",
            "--compute-scale",
            "4",
            "--threads",
            "1",
        ],
    ),
    # Seeded bottlenecks (tests/test_findings.py): each should trigger its finding.
    # 1 worker, a tiny (pointwise) model: the loader cannot keep up.
    "npz_starved": (
        "unet3d_npz.py",
        [
            "--num-files",
            "32",
            "--volume",
            "48",
            "--batch-size",
            "4",
            "--workers",
            "1",
            "--epochs",
            "2",
            "--arch",
            "pointwise",
            "--threads",
            "1",
        ],
    ),
    # HDF5 with 8^3-voxel chunks written in random order: small random reads.
    "h5_tiny_chunks": (
        "cosmoflow_h5.py",
        [
            "--num-files",
            "4",
            "--samples-per-file",
            "4",
            "--batch-size",
            "4",
            "--workers",
            "2",
            "--epochs",
            "2",
            "--chunked",
            "--chunk-edge",
            "8",
        ],
    ),
    # A wide model on small volumes, torch.save after every step: checkpoint stall.
    "npz_checkpoint": (
        "unet3d_npz.py",
        [
            "--num-files",
            "32",
            "--volume",
            "16",
            "--batch-size",
            "4",
            "--workers",
            "2",
            "--epochs",
            "2",
            "--compute-scale",
            "16",
            "--checkpoint-every",
            "1",
            "--threads",
            "1",
        ],
    ),
}


def expected_from_report(report: dict) -> dict:
    """The values tests check against the trace, from the job's own accounting.

    The ``model`` part is the ground truth for distill: the job's flags, the real
    dataset file sizes, and the compute time per step the job measured itself
    (forward+backward+optimizer, checkpoint time excluded), per step.
    """
    ckpts = report.get("checkpoints", [])
    args = report["args"]
    files = report["dataset_files"]
    spf = int(args.get("samples_per_file", 1) or 1)
    file_bytes = sum(os.path.getsize(f) for f in files)
    model = {
        "format": {"unet3d_npz": "npz", "cosmoflow_h5": "hdf5"}.get(
            report["job"], args.get("format", "jpeg")
        ),
        "num_files": len(files),
        "num_samples_per_file": spf,
        "record_length_mean": file_bytes / (len(files) * spf),
        "batch_size": args["batch_size"],
        "read_threads": args["workers"],
        "epochs": report["epochs"],
        "shuffle": bool(args.get("shuffle", True)),
        "step_compute_s": report["step_compute_s"],
        "checkpoint_every": args.get("checkpoint_every") or 0,
        "checkpoint_bytes_mean": (sum(c["bytes"] for c in ckpts) / len(ckpts)) if ckpts else 0,
    }
    return {
        "model": model,
        "job": report["job"],
        "epochs": report["epochs"],
        "batches": report["steps"],
        "samples": report["samples"],
        "dataset_files": len(report["dataset_files"]),
        "dataset_bytes_read": report["dataset_bytes_read"],
        "bytes_read_per_pid": {str(k): v for k, v in report["bytes_read_per_pid"].items()},
        "dataset_read_calls": report.get("dataset_read_calls"),
        "checkpoints": len(ckpts),
        "checkpoint_bytes": sum(c["bytes"] for c in ckpts),
        "main_pid": report["main_pid"],
    }


def rewrite_expected(name: str, work: Path) -> None:
    """Rebuild expected.json from the job report left in the work dir (no recapture)."""
    report = json.loads((work / name / "report.json").read_text())
    (HERE / name / "expected.json").write_text(
        json.dumps(expected_from_report(report), indent=2) + "\n"
    )
    print(f"{name}: expected.json rewritten")


def make(name: str, work: Path) -> None:
    script, job_args = CORPUS[name]
    job_dir = work / name
    data = job_dir / "data"
    ckpt = job_dir / "checkpoints"
    base = [sys.executable, str(REPO / "examples" / script), "--data-dir", str(data)]
    subprocess.run([*base, *job_args, "--generate-only"], check=True, stdout=subprocess.DEVNULL)
    settle(data)
    if ckpt.exists():
        shutil.rmtree(ckpt)
    report_path = job_dir / "report.json"
    command = [
        *base,
        *job_args,
        "--checkpoint-dir",
        str(ckpt),
        "--report",
        str(report_path),
        "--quiet",
    ]
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    result = run_capture(
        CaptureConfig(command=tuple(command), out=out, data_dirs=(str(data), str(ckpt)), name=name)
    )
    if result.exit_code != 0:
        raise SystemExit(f"{name}: job failed with exit code {result.exit_code}")
    expected = expected_from_report(json.loads(report_path.read_text()))
    (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(
        f"{name}: {result.events:,} events, {len(result.files)} files, {size / 1024:.0f} KiB -> {out}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", action="append", choices=sorted(CORPUS))
    ap.add_argument("--work", type=Path, default=Path("/tmp/dlreplay-corpus"))
    ap.add_argument(
        "--expected-only",
        action="store_true",
        help="only rebuild expected.json from the job reports",
    )
    args = ap.parse_args()
    for name in args.only or sorted(CORPUS):
        (rewrite_expected if args.expected_only else make)(name, args.work)


if __name__ == "__main__":
    main()
