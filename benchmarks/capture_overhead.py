"""Capture overhead on the NPZ example: untraced vs traced wall time, median of N runs.

Both runs start the same interpreter with the same arguments on the same (pre-generated)
dataset; the traced run goes through ``dlreplay capture`` with ``--data-dir``. Prints
both medians and the overhead in percent. Target (foundation issue): <= 5 %.

    python benchmarks/capture_overhead.py [--runs 3] [--dir bench-data/overhead]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import dlreplay  # noqa: E402

dlreplay.prepare_process()  # polars' allocator and one BLAS thread, as the CLI sets them

from dlreplay.capture import CaptureConfig, run_capture  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data" / "overhead")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--num-files", type=int, default=48)
    args = ap.parse_args()

    data = args.dir / "data"
    job = [
        sys.executable,
        str(REPO / "examples" / "unet3d_npz.py"),
        "--data-dir",
        str(data),
        "--num-files",
        str(args.num_files),
        "--epochs",
        str(args.epochs),
        "--workers",
        "2",
    ]
    subprocess.run([*job, "--generate-only"], check=True, stdout=subprocess.DEVNULL)

    untraced, traced = [], []
    for i in range(args.runs):
        t0 = time.perf_counter()
        subprocess.run(job, check=True, stdout=subprocess.DEVNULL)
        untraced.append(time.perf_counter() - t0)
        out = args.dir / f"trace-{i}"
        if out.exists():
            shutil.rmtree(out)
        t0 = time.perf_counter()
        result = run_capture(
            CaptureConfig(command=tuple(job), out=out, data_dirs=(str(data),), force=True)
        )
        traced.append(time.perf_counter() - t0)
        if result.exit_code != 0:
            sys.exit(f"traced run failed with exit code {result.exit_code}")
        print(
            f"run {i + 1}: untraced {untraced[-1]:.2f} s   traced {traced[-1]:.2f} s   events {result.events:,}"
        )

    u, t = statistics.median(untraced), statistics.median(traced)
    print(f"median untraced: {u:.3f} s")
    print(f"median traced:   {t:.3f} s")
    print(f"capture overhead: {100 * (t - u) / u:+.1f} % (target <= 5 %)")


if __name__ == "__main__":
    main()
