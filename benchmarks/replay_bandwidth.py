"""Replay read bandwidth against ``fio`` at the same parameters, cold, in the same run; and the
replay client's own ceiling on a memory-backed directory.

The dataset: ``--files`` raw files of ``--size-mb`` MB in all, one sample each; compute 0;
``--threads`` loader workers each reading whole files with ``os.pread`` of ``--transfer``
bytes (``--io posix``, buffered). Measured, every pass with the dataset's pages dropped first
(``posix_fadvise(POSIX_FADV_DONTNEED)``; the replays by their own ``--cold``):

- **fio** (``ioengine=psync``, ``rw=read``, ``bs`` = the transfer, ``direct=0``): as many jobs
  as the replay has workers, job *w* reading files ``w::W`` one after the other (the replay's
  worker *w* reads batch ``i`` with ``i % W == w``: the same files, the same streams);
- **the replay**, with dlreplay's loader and with PyTorch's DataLoader: MB/s over its epoch
  (bytes / epoch time: the drop before the epoch is outside it) and over the whole call;
- **served vs the device**: the cold replay's ``served_bytes`` (its readers' /proc/<pid>/io)
  against the dataset device's own sectors read in the epoch (``/sys/dev/block``, every
  process on the host: other traffic there counts too);
- **the client's ceiling**: the same replay and fio on a copy in ``--shm-dir`` (tmpfs: no
  storage at all), in GB/s and in GB/s per core (bytes / CPU seconds: the replay's by
  ``getrusage`` of this process and its reaped children over the whole call, its set-up
  included; fio's by its own usr+sys CPU over its run); and the replay's read primitive alone
  (one thread) against one fio job, which tells the reads from the loader around them.

Direct I/O (``direct=1``) is not compared: the replay's ``--io posix`` reads are buffered.
MB = 10^6 bytes, GB = 10^9 bytes.

    python benchmarks/replay_bandwidth.py --size-mb 1024 --repeat 2 [--data-dir bench-data/replay-bw]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
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
from dlreplay.replay.served import drop_pages  # noqa: E402


def _model(files: int, size_mb: int, transfer: int, threads: int):
    record = size_mb * 1_000_000 // files
    model = model_from_dict(
        {
            "schema": "dlreplay.workload",
            "format_version": 1,
            "model": {"name": "bandwidth"},
            "dataset": {
                "format": "raw",
                "num_files": files,
                "num_samples_per_file": 1,
                "record_length": record,
            },
            "reader": {"batch_size": 1, "read_threads": threads, "open_per_sample": True},
            "train": {"epochs": 1, "computation_time": 0},
        }
    )
    return apply_overrides(model, [f"reader.transfer_size={transfer}"])


def _files(data: Path) -> list[Path]:
    return sorted(
        p for p in (data / "train").rglob("*") if p.is_file() and not p.name.startswith(".")
    )


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and its reaped children."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def fio(files: list[Path], data: Path, jobs: int, transfer: int) -> tuple[float, float]:
    """(MB/s, CPU seconds) of fio reading *files* as the replay's *jobs* workers do, cold."""
    drop_pages(str(data), [str(p.relative_to(data)) for p in files], "fadvise")
    cmd = [
        "fio",
        "--output-format=json",
        "--ioengine=psync",
        "--rw=read",
        f"--bs={transfer}",
        "--direct=0",
        "--invalidate=1",
        "--file_service_type=sequential",
        "--group_reporting",
    ]
    for w in range(jobs):
        mine = files[w::jobs]
        size = sum(p.stat().st_size for p in mine)
        cmd += [f"--name=w{w}", "--filename=" + ":".join(map(str, mine)), f"--size={size}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    rd = job["read"]
    secs = rd["runtime"] / 1000.0
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * secs  # percent of one CPU over the run
    return rd["io_bytes"] / secs / 1e6 if secs else float("nan"), cpu


def primitive(files: list[Path], transfer: int) -> tuple[float, float]:
    """(GB/s, GB/s per core) of the replay's read primitive alone (PosixReader into its reused
    buffer), one thread, the files one after the other."""
    r = PosixReader("raw", open_per_sample=True)
    c0, t0 = time.process_time(), time.perf_counter()
    try:
        n = sum(r.read(str(p), 0, p.stat().st_size, transfer) for p in files)
    finally:
        r.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return n / wall / 1e9, n / cpu / 1e9 if cpu > 0 else float("nan")


def replay(model, data: Path, out: Path, loader: str, cold: bool) -> dict:
    """One replay; its MB/s over the epoch and the whole call, CPU seconds, served and device bytes."""
    c0, t0 = _cpu_s(), time.perf_counter()
    res = run_replay(
        ReplayConfig(
            model=model,
            data_dir=data,
            out=out,
            trace=False,
            io="posix",
            loader=loader,
            cold="fadvise" if cold else "",
        )
    )
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    e = res.metrics["epochs"][0]
    return {
        "epoch_mbps": e["bytes_read"] / e["epoch_time_s"] / 1e6,
        "call_mbps": e["bytes_read"] / wall / 1e6,
        "cpu_s": cpu,
        "bytes": e["bytes_read"],
        "served": e.get("served_bytes"),
        "device": e.get("device_read_bytes"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data-dir", type=Path, default=Path("bench-data/replay-bw"))
    ap.add_argument("--shm-dir", type=Path, default=Path("/dev/shm"))
    ap.add_argument("--size-mb", type=int, default=512, help="dataset size in MB (10^6 bytes)")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--transfer", type=int, default=4 << 20, help="bytes per pread (fio's bs)")
    ap.add_argument("--threads", type=int, default=2, help="loader workers = fio jobs")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if shutil.which("fio") is None:
        print("fio is not installed (apt-get install -y fio)", file=sys.stderr)
        return 2
    model = _model(args.files, args.size_mb, args.transfer, args.threads)
    generate_dataset(
        GenerateConfig(model=model, data_dir=args.data_dir, progress=False, force=True)
    )
    files = _files(args.data_dir)
    loaders = ["builtin"] + (["torch"] if importlib.util.find_spec("torch") is not None else [])
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(
        f"dataset {sum(p.stat().st_size for p in files) / 1e6:.0f} MB in {len(files)} files, "
        f"transfer {args.transfer} B, {args.threads} stream(s), buffered, cold; "
        f"{os.cpu_count()} CPU(s), load average {load:.2f}"
    )
    rates: dict[str, list[float]] = {}
    served: list[tuple[int, int]] = []
    ceiling: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="dlreplay-bw-") as tmp:
        for i in range(args.repeat):
            rates.setdefault("fio", []).append(
                fio(files, args.data_dir, args.threads, args.transfer)[0]
            )
            for loader in loaders:
                r = replay(model, args.data_dir, Path(tmp) / f"r{i}-{loader}", loader, True)
                rates.setdefault(f"replay {loader} (epoch)", []).append(r["epoch_mbps"])
                rates.setdefault(f"replay {loader} (whole call)", []).append(r["call_mbps"])
                if r["served"] is not None and r["device"]:
                    served.append((r["served"], r["device"]))
            print(f"run {i}: " + "  ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()))
        shm = args.shm_dir / f"dlreplay-bw-ceiling-{os.getpid()}"
        try:
            generate_dataset(GenerateConfig(model=model, data_dir=shm, progress=False))
            shm_files = _files(shm)
            for i in range(args.repeat):
                mbps, cpu = fio(shm_files, shm, args.threads, args.transfer)
                total = sum(p.stat().st_size for p in shm_files)
                ceiling.setdefault("fio GB/s", []).append(mbps / 1e3)
                ceiling.setdefault("fio GB/s per core", []).append(total / cpu / 1e9)
                mbps, cpu = fio(shm_files, shm, 1, args.transfer)
                ceiling.setdefault("fio 1 job GB/s", []).append(mbps / 1e3)
                ceiling.setdefault("fio 1 job GB/s per core", []).append(total / cpu / 1e9)
                gbps, per_core = primitive(shm_files, args.transfer)
                ceiling.setdefault("replay's reader, 1 thread GB/s", []).append(gbps)
                ceiling.setdefault("replay's reader, 1 thread GB/s per core", []).append(per_core)
                for loader in loaders:
                    r = replay(model, shm, Path(tmp) / f"shm{i}-{loader}", loader, False)
                    ceiling.setdefault(f"replay {loader} GB/s", []).append(r["epoch_mbps"] / 1e3)
                    ceiling.setdefault(f"replay {loader} GB/s per core", []).append(
                        r["bytes"] / r["cpu_s"] / 1e9
                    )
        finally:
            shutil.rmtree(shm, ignore_errors=True)
    _report(rates, served, ceiling)
    return 0


def _report(
    rates: dict[str, list[float]], served: list[tuple[int, int]], ceiling: dict[str, list[float]]
) -> None:
    best = {k: max(v) for k, v in rates.items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("cold, on the dataset's disk: best / median MB/s, and the ratio to fio's best / median:")
    for key in rates:
        ratio = (
            ""
            if key == "fio"
            else f"   {best[key] / best['fio']:6.1%} / {med[key] / med['fio']:6.1%} of fio"
        )
        print(f"  {key:30s} {best[key]:8.1f} / {med[key]:8.1f}{ratio}")
    print("target: replay (epoch) >= 90 % of fio at the same block size, streams and mode")
    for s, d in served:
        print(
            f"  served by the storage {s / 1e6:.1f} MB vs the device's own count {d / 1e6:.1f} MB "
            f"({s / d:.1%}; the device counts every process on the host)"
        )
    print("the client's ceiling on a memory-backed directory (no storage), best / median:")
    for key, v in ceiling.items():
        print(f"  {key:32s} {max(v):7.2f} / {statistics.median(v):7.2f}")


if __name__ == "__main__":
    sys.exit(main())
