"""Replay read bandwidth vs a plain sequential read of the same files, in the same run.

computation_time 0, ``--io posix``, large transfer size (default 4 MiB). Between runs the
page cache of every dataset file is dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)``.
Baseline: ``cat FILES > /dev/null`` (argv, no shell). Prints both in MB/s (10^6 bytes/s)
and the ratio replay / baseline (target >= 90 %).

    python benchmarks/replay_bandwidth.py --data-dir bench-data/replay-bw --size-mb 1024
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlreplay.model import apply_overrides, model_from_dict
from dlreplay.replay import GenerateConfig, ReplayConfig, generate_dataset, run_replay


def drop_cache(files: list[Path]) -> None:
    """Evict *files* from the page cache (fdatasync first so dirty pages can go)."""
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=Path("bench-data/replay-bw"))
    ap.add_argument("--size-mb", type=int, default=512, help="dataset size in MB (10^6 bytes)")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--transfer", type=int, default=4 << 20, help="bytes per pread")
    ap.add_argument("--threads", type=int, default=2, help="reader.read_threads")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    record = args.size_mb * 1_000_000 // args.files
    model = model_from_dict({
        "schema": "dlreplay.workload", "format_version": 1, "model": {"name": "bandwidth"},
        "dataset": {"format": "raw", "num_files": args.files, "num_samples_per_file": 1, "record_length": record},
        "reader": {"batch_size": 1, "read_threads": args.threads, "open_per_sample": True},
        "train": {"epochs": 1, "computation_time": 0},
    })
    model = apply_overrides(model, [f"reader.transfer_size={args.transfer}"])
    generate_dataset(GenerateConfig(model=model, data_dir=args.data_dir, progress=False))
    files = sorted(p for p in (args.data_dir / "train").rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)

    replay_rates, cat_rates = [], []
    with tempfile.TemporaryDirectory(prefix="dlreplay-bw-") as tmp:
        for i in range(args.repeat):
            drop_cache(files)
            t0 = time.perf_counter()
            subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
            cat_rates.append(total / (time.perf_counter() - t0) / 1e6)
            drop_cache(files)
            t0 = time.perf_counter()
            res = run_replay(ReplayConfig(model=model, data_dir=args.data_dir, out=Path(tmp) / f"r{i}",
                                          trace=False, io="posix"))
            wall = time.perf_counter() - t0
            nbytes = res.metrics["overall"]["bytes_read"]
            assert nbytes == total, (nbytes, total)
            # whole-run rate (incl. the first step and worker start-up), comparable to cat's wall time
            replay_rates.append(nbytes / wall / 1e6)
            print(f"run {i}: cat {cat_rates[-1]:8.1f} MB/s   replay {replay_rates[-1]:8.1f} MB/s "
                  f"(metrics window {res.metrics['overall']['io_mb_per_s'] or 0:8.1f} MB/s)")
    cat, rep = max(cat_rates), max(replay_rates)
    ratio = rep / cat
    print(f"dataset {total / 1e6:.0f} MB in {len(files)} files, transfer {args.transfer} B, "
          f"{args.threads} reader worker(s)")
    print(f"baseline cat: {cat:.1f} MB/s   replay: {rep:.1f} MB/s   ratio {ratio:.1%} (target >= 90 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
