"""Replay fidelity: capture an example job, distill it, replay the model on the same machine.

Prints the real job's epoch times (measured by the job itself) next to the replay's
(metrics.json), and the ratio of their steady-state means (epochs after the first, whose
time holds framework warm-up that the model excludes on purpose). Target (replay issue):
replay epoch time within 10 % of the real one.

    python benchmarks/fidelity.py [--job unet3d_npz] [--dir bench-data/fidelity]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlreplay.analyze import load_trace  # noqa: E402
from dlreplay.analyze.distill import distill  # noqa: E402
from dlreplay.capture import CaptureConfig, run_capture  # noqa: E402
from dlreplay.replay import ReplayConfig, run_replay  # noqa: E402

JOBS = {
    "unet3d_npz": ["--num-files", "48", "--batch-size", "4", "--workers", "2", "--epochs", "4"],
    "cosmoflow_h5": ["--num-files", "16", "--samples-per-file", "4", "--batch-size", "8", "--workers", "2",
                     "--epochs", "4"],
    "resnet_jpeg": ["--num-files", "512", "--batch-size", "32", "--workers", "2", "--epochs", "4"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=sorted(JOBS), default="unet3d_npz")
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data" / "fidelity")
    args = ap.parse_args()
    work = args.dir / args.job
    for sub in ("trace", "replay", "replay-data", "ck"):
        if (work / sub).exists():
            shutil.rmtree(work / sub)
    data = work / "data"
    job = [sys.executable, str(REPO / "examples" / f"{args.job}.py"), "--data-dir", str(data), *JOBS[args.job],
           "--checkpoint-dir", str(work / "ck"), "--report", str(work / "report.json"), "--quiet"]
    subprocess.run([*job, "--generate-only"], check=True, stdout=subprocess.DEVNULL)
    captured = run_capture(CaptureConfig(command=tuple(job), out=work / "trace", data_dirs=(str(data),), force=True))
    if captured.exit_code:
        sys.exit(f"job failed ({captured.exit_code})")
    real = json.loads((work / "report.json").read_text())["epoch_times_s"]
    loaded = load_trace(work / "trace")
    model = distill(loaded.events, manifest=loaded.manifest)
    result = run_replay(ReplayConfig(model=model, data_dir=work / "replay-data", out=work / "replay", trace=True),
                        echo=lambda s: None)
    replay = [e["epoch_time_s"] for e in result.metrics["epochs"]]
    print(f"job: {args.job} {' '.join(JOBS[args.job])}")
    print("epoch   real s   replay s")
    for i, (a, b) in enumerate(zip(real, replay, strict=False), 1):
        print(f"{i:5d}   {a:6.3f}   {b:8.3f}")
    r, p = statistics.fmean(real[1:]), statistics.fmean(replay[1:])
    print(f"steady state (epochs 2..{len(real)}): real {r:.3f} s, replay {p:.3f} s, "
          f"replay/real = {p / r:.3f} ({100 * (p - r) / r:+.1f} %, target within 10 %)")
    print(f"model: compute {model.train.computation_time.mean * 1e3:.1f} ms/step, "
          f"{model.reader.read_threads} workers, persistent={model.reader.persistent_workers}")


if __name__ == "__main__":
    main()
