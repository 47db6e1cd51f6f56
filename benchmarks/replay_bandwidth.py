"""Replay read bandwidth vs a plain sequential read of the same files, in the same run.

computation_time 0, large transfer size (default 4 MiB), ``--threads`` reader workers. Between
runs the page cache of every dataset file is dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)``.
Baselines, measured in the same run: ``cat FILES > /dev/null`` (argv, no shell; the storage's
own buffered figure) and ``dd iflag=direct bs=TRANSFER`` over the files (the storage without
the page cache). Measured:

- ``replay --io posix`` and ``replay --io library`` (the whole replay: workers, batches,
  metrics), each with dlreplay's loader and with PyTorch's DataLoader (``--loader``), against
  ``cat``;
- the read primitive alone, one thread, the files one after the other
  (:class:`~dlreplay.replay.formats.PosixReader`): a plain ``os.pread`` loop (a new
  ``bytes`` per call, what the reader did before), reads into one reused buffer, and
  ``O_DIRECT`` against ``dd iflag=direct``.

Prints MB/s (10^6 bytes/s), best and median of ``--repeat`` runs, and the ratios (target >= 90 % of cat).

    python benchmarks/replay_bandwidth.py --size-mb 2048 --repeat 3 [--data-dir bench-data/replay-bw]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dlreplay

dlreplay.prepare_process()  # polars' allocator and one BLAS thread, as the CLI sets them

from dlreplay.model import apply_overrides, model_from_dict  # noqa: E402
from dlreplay.replay import GenerateConfig, ReplayConfig, generate_dataset, run_replay  # noqa: E402
from dlreplay.replay.formats import PosixReader  # noqa: E402


def drop_cache(files: list[Path]) -> None:
    """Evict *files* from the page cache (fdatasync first so dirty pages can go)."""
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(files: list[Path], fn) -> float:
    """MB/s of ``fn()`` (which returns the bytes it read) with the files' pages dropped first."""
    drop_cache(files)
    t0 = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - t0) / 1e6


def _pread_loop(files: list[Path], transfer: int) -> int:
    total = 0
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            pos = 0
            while True:
                got = len(os.pread(fd, transfer, pos))
                if not got:
                    break
                total, pos = total + got, pos + got
        finally:
            os.close(fd)
    return total


def _reader(files: list[Path], transfer: int, direct: bool) -> int:
    r = PosixReader("raw", open_per_sample=True, direct=direct)
    try:
        return sum(r.read(str(p), 0, p.stat().st_size, transfer) for p in files)
    finally:
        r.close()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data-dir", type=Path, default=Path("bench-data/replay-bw"))
    ap.add_argument("--size-mb", type=int, default=512, help="dataset size in MB (10^6 bytes)")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--transfer", type=int, default=4 << 20, help="bytes per pread")
    ap.add_argument("--threads", type=int, default=2, help="reader.read_threads")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    record = args.size_mb * 1_000_000 // args.files
    model = model_from_dict(
        {
            "schema": "dlreplay.workload",
            "format_version": 1,
            "model": {"name": "bandwidth"},
            "dataset": {
                "format": "raw",
                "num_files": args.files,
                "num_samples_per_file": 1,
                "record_length": record,
            },
            "reader": {"batch_size": 1, "read_threads": args.threads, "open_per_sample": True},
            "train": {"epochs": 1, "computation_time": 0},
        }
    )
    model = apply_overrides(model, [f"reader.transfer_size={args.transfer}"])
    # the benchmark's own directory: a dataset of another --size-mb/--files there is replaced
    # (force deletes only files dlreplay generated)
    generate_dataset(
        GenerateConfig(model=model, data_dir=args.data_dir, progress=False, force=True)
    )
    files = sorted(
        p
        for p in (args.data_dir / "train").rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )
    total = sum(p.stat().st_size for p in files)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(
        f"dataset {total / 1e6:.0f} MB in {len(files)} files, transfer {args.transfer} B, "
        f"{args.threads} reader worker(s); load average {load:.2f}"
    )

    rates: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rates.setdefault(key, []).append(value)

    # dlreplay's own loader, and PyTorch's DataLoader where torch is installed (``--loader auto``
    # picks it for this model): with --io library it hands each decoded sample to the training
    # process (collated into shared memory) as the job's DataLoader does; with --io posix nothing
    loaders = ["builtin"] + (["torch"] if importlib.util.find_spec("torch") is not None else [])
    with tempfile.TemporaryDirectory(prefix="dlreplay-bw-") as tmp:
        for i in range(args.repeat):
            add(
                "cat",
                _timed(
                    files,
                    lambda: (
                        subprocess.run(
                            ["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True
                        )
                        and total
                    ),
                ),
            )
            for io, loader in [(io, loader) for io in ("posix", "library") for loader in loaders]:
                drop_cache(files)
                t0 = time.perf_counter()
                res = run_replay(
                    ReplayConfig(
                        model=model,
                        data_dir=args.data_dir,
                        out=Path(tmp) / f"r{i}-{io}-{loader}",
                        trace=False,
                        io=io,
                        loader=loader,
                    )
                )
                wall = time.perf_counter() - t0
                nbytes = res.metrics["overall"]["bytes_read"]
                assert nbytes == total, (io, nbytes, total)
                # whole-run rate (incl. the first step and worker start-up), comparable to cat's wall time
                add(f"replay --io {io} --loader {loader}", nbytes / wall / 1e6)
            add(
                "pread loop (new bytes per call)",
                _timed(files, lambda: _pread_loop(files, args.transfer)),
            )
            add(
                "PosixReader (reused buffer)",
                _timed(files, lambda: _reader(files, args.transfer, False)),
            )
            add(
                "dd iflag=direct",
                _timed(
                    files,
                    lambda: sum(
                        subprocess.run(
                            [
                                "dd",
                                f"if={p}",
                                "of=/dev/null",
                                f"bs={args.transfer}",
                                "iflag=direct",
                            ],
                            capture_output=True,
                            check=True,
                        )
                        and p.stat().st_size
                        for p in files
                    ),
                ),
            )
            add("PosixReader O_DIRECT", _timed(files, lambda: _reader(files, args.transfer, True)))
            print(f"run {i}: " + "  ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()))
    best = {k: max(v) for k, v in rates.items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("best / median of each, MB/s, and their ratios to the baseline of its kind:")
    for key, value in best.items():
        base = "dd iflag=direct" if "direct" in key.lower() and key != "dd iflag=direct" else "cat"
        ratio = (
            ""
            if key in ("cat", "dd iflag=direct")
            else f"   {value / best[base]:6.1%} / {med[key] / med[base]:6.1%} of {base}"
        )
        print(f"  {key:34s} {value:9.1f} / {med[key]:9.1f}{ratio}")
    print("target: replay >= 90 % of cat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
