"""Dataset fingerprint cost: what fingerprinting adds to a capture of an N-file dataset.

Writes a dataset of N small files (default 10,000, spread over 100 folders) with the
format's library, then times :func:`dlreplay.capture.fingerprint.fingerprint_dataset`
on it (what ``dlreplay capture --data-dir`` runs after the job) against a baseline
measured in the same run: ``os.walk`` + ``stat`` of every file (the least any tool that
sizes a dataset does). Target (dataset layout issue): < 2 s for 10,000 files.

    python benchmarks/fingerprint.py [--files 10000] [--format npz|jpeg|hdf5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import dlreplay  # noqa: E402

dlreplay.prepare_process()  # polars' allocator and one BLAS thread, as the CLI sets them

from dlreplay.capture.fingerprint import fingerprint_dataset  # noqa: E402


def make_dataset(root: Path, files: int, fmt: str) -> None:
    rng = np.random.default_rng(0)
    for i in range(files):
        d = root / f"class_{i % 100:03d}"
        d.mkdir(exist_ok=True)
        if fmt == "npz":
            np.savez(
                d / f"s_{i:06d}.npz",
                x=rng.random((1, 8, 8), dtype=np.float32),
                y=np.zeros(1, np.int64),
            )
        elif fmt == "jpeg":
            from PIL import Image

            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                d / f"s_{i:06d}.jpg"
            )
        else:
            import h5py

            with h5py.File(d / f"s_{i:06d}.h5", "w") as f:
                f.create_dataset("x", data=rng.random((4, 16), dtype=np.float32), chunks=(1, 16))


def walk_and_stat(root: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            total += os.stat(os.path.join(dirpath, n)).st_size
    return total


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--format", choices=("npz", "jpeg", "hdf5"), default="npz")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to write the dataset (default: a temp dir)"
    )
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dlreplay-fp-bench-", dir=args.dir))
    try:
        t0 = time.perf_counter()
        make_dataset(base, args.files, args.format)
        print(
            f"dataset: {args.files:,} {args.format} files in {base} (written in {time.perf_counter() - t0:.1f} s)"
        )
        walks, prints = [], []
        doc = None
        for _ in range(args.repeat):
            t = time.perf_counter()
            walk_and_stat(base)
            walks.append(time.perf_counter() - t)
            t = time.perf_counter()
            doc = fingerprint_dataset([base])
            prints.append(time.perf_counter() - t)
        assert doc is not None
        g = doc["groups"][0]
        w, p = statistics.median(walks), statistics.median(prints)
        print(
            f"baseline os.walk + stat of every file: median {w:.3f} s (runs: {', '.join(f'{x:.3f}' for x in walks)})"
        )
        print(
            f"fingerprint ({g['sampled']} files opened, {g['files']:,} listed): median {p:.3f} s "
            f"(runs: {', '.join(f'{x:.3f}' for x in prints)})"
        )
        print(
            f"fingerprint / baseline = {p / w:.2f}x; target: < 2 s added to a capture of 10,000 files: "
            f"{'PASS' if p < 2.0 else 'FAIL'}"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
