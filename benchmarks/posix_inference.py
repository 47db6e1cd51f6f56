"""POSIX-only inference against the data-loader hooks: the table in docs/fidelity.md.

For every committed trace, ``distill`` runs twice: on the whole trace (the hooks' or
DLIO's loop events: measured) and on its POSIX/STDIO events alone (what DFTracer's
preload records without annotations: inferred). With ``--capture``, example jobs are
also captured twice with the same arguments, once with ``--no-loader-hooks`` (inferred)
and once with the hooks (measured), including the hard cases: 4 workers, and the
default prefetching (``prefetch_factor`` 2) at every epoch start.

Prints one markdown row per trace: epochs, read threads, samples per file, batch size
(hooks / inferred; "?" when inference says it cannot tell) and the compute time per step
(median, seconds; inferred error in %).

    python benchmarks/posix_inference.py [--capture] [--dir bench-data/posix]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlreplay.analyze import load_trace  # noqa: E402
from dlreplay.analyze.distill import distill  # noqa: E402
from dlreplay.capture import CaptureConfig, run_capture  # noqa: E402

#: name -> (example, arguments): captured with and without the hooks
JOBS = {
    "unet3d_npz w2": (
        "unet3d_npz.py",
        [
            "--num-files",
            "32",
            "--volume",
            "48",
            "--batch-size",
            "4",
            "--workers",
            "2",
            "--epochs",
            "3",
            "--persistent-workers",
        ],
    ),
    "unet3d_npz w4": (
        "unet3d_npz.py",
        [
            "--num-files",
            "48",
            "--volume",
            "48",
            "--batch-size",
            "4",
            "--workers",
            "4",
            "--epochs",
            "3",
            "--persistent-workers",
        ],
    ),
    "cosmoflow_h5 w4": (
        "cosmoflow_h5.py",
        [
            "--num-files",
            "16",
            "--samples-per-file",
            "4",
            "--batch-size",
            "4",
            "--workers",
            "4",
            "--epochs",
            "3",
        ],
    ),
    "resnet_jpeg w2": (
        "resnet_jpeg.py",
        [
            "--num-files",
            "256",
            "--batch-size",
            "16",
            "--workers",
            "2",
            "--epochs",
            "3",
            "--persistent-workers",
        ],
    ),
}


def _row(name: str, hooks, posix, job_compute: float | None = None) -> str:
    f = posix.provenance.fields

    def pair(h, p, field):
        shown = "?" if f[field].confidence == "default" else str(p)
        mark = "" if shown == str(h) else " ✗"
        return f"{h} / {shown}{mark}"

    hc = (
        hooks.train.computation_time.quantiles.get("p50")
        if hooks.train.computation_time.is_known
        else None
    )
    pc = (
        posix.train.computation_time.quantiles.get("p50")
        if f["train.computation_time"].confidence != "default"
        else None
    )
    comp = (
        f"{hc:.3f} / {pc:.3f} ({(pc - hc) / hc:+.0%})"
        if hc and pc
        else f"{hc:.3f} / ?"
        if hc
        else "- / -"
    )
    if job_compute and pc:  # two runs: the POSIX run's own median step, as the job measured it
        comp += f"; that run's own {job_compute:.3f} ({(pc - job_compute) / job_compute:+.0%})"
    return (
        f"| {name} | {pair(hooks.train.epochs, posix.train.epochs, 'train.epochs')} | "
        f"{pair(hooks.reader.read_threads, posix.reader.read_threads, 'reader.read_threads')} | "
        f"{pair(hooks.dataset.num_samples_per_file, posix.dataset.num_samples_per_file, 'dataset.num_samples_per_file')} | "
        f"{pair(hooks.reader.batch_size, posix.reader.batch_size, 'reader.batch_size')} | {comp} |"
    )


def corpus_rows() -> list[str]:
    rows = []
    for trace in sorted(p.parent for p in (REPO / "traces").glob("*/expected.json")):
        lt = load_trace(trace)
        posix = lt.events.filter(pl.col("cat").is_in(["POSIX", "STDIO"])).with_columns(
            pl.lit(None, pl.String).alias("role")
        )
        rows.append(
            _row(
                f"`{trace.name}` (same run)",
                distill(lt.events, manifest=lt.manifest),
                distill(posix, manifest=lt.manifest),
            )
        )
    return rows


def capture_rows(work: Path) -> list[str]:
    rows = []
    for name, (script, args) in JOBS.items():
        job_dir = work / name.replace(" ", "_")
        if job_dir.exists():
            shutil.rmtree(job_dir)
        data = job_dir / "data"
        base = [
            sys.executable,
            str(REPO / "examples" / script),
            "--data-dir",
            str(data),
            *args,
            "--quiet",
        ]
        subprocess.run([*base, "--generate-only"], check=True, stdout=subprocess.DEVNULL)
        models, job_compute = [], None
        for hooks in (True, False):
            out = job_dir / ("hooks" if hooks else "posix")
            report = job_dir / f"report-{out.name}.json"
            res = run_capture(
                CaptureConfig(
                    command=(*base, "--report", str(report)),
                    out=out,
                    data_dirs=(str(data),),
                    name=name,
                    loader_hooks=hooks,
                )
            )
            if res.exit_code != 0:
                raise SystemExit(f"{name}: job failed ({res.exit_code})")
            lt = load_trace(out)
            models.append(distill(lt.events, manifest=lt.manifest))
            steps = json.loads(report.read_text())["step_compute_s"]
            job_compute = statistics.median(steps[1:] or steps)
        rows.append(_row(f"{name} (two runs)", *models, job_compute=job_compute))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--capture", action="store_true", help="also capture the example jobs twice (minutes)"
    )
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data" / "posix")
    args = ap.parse_args()
    print("| trace | epochs | read threads | samples/file | batch size | compute/step s (error) |")
    print("|---|---|---|---|---|---|")
    for r in corpus_rows():
        print(r, flush=True)
    if args.capture:
        for r in capture_rows(args.dir):
            print(r, flush=True)


if __name__ == "__main__":
    main()
