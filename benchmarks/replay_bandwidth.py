"""Replay read bandwidth against ``fio`` at the same parameters, cold, in the same run; and the
replay client's own ceiling on a memory-backed directory.

The dataset: ``--files`` raw files of ``--size-mb`` MB in all, one sample each; compute 0;
``--threads`` loader workers each reading whole files with ``os.pread`` of ``--transfer``
bytes (``--io posix``, buffered). Measured, every pass with the dataset's pages dropped first
(``posix_fadvise(POSIX_FADV_DONTNEED)``; the replays by their own ``--cold``):

- **fio** (``ioengine=psync``, ``rw=read``, ``bs`` = the transfer, ``direct=0``,
  ``fadvise_hint=0``: no ``POSIX_FADV_SEQUENTIAL``, as the replay and the job it replays give
  none; fio's default hint, which doubles Linux's readahead window, is run beside it): as many jobs
  as the replay has workers, job *w* reading files ``w::W`` one after the other (the replay's
  worker *w* reads batch ``i`` with ``i % W == w``: the same files, the same streams);
- **the replay**, with dlreplay's loader and with PyTorch's DataLoader: MB/s over its epoch
  (bytes / epoch time: the drop before the epoch is outside it; worker start-up inside, as in
  the job), steady (DLIO's throughput: the epoch less its first step) and over the whole call;
- **served vs the device**: the cold replay's ``served_bytes`` (its readers' /proc/<pid>/io)
  against the dataset device's own sectors read in the epoch (``/sys/dev/block``, every
  process on the host: other traffic there counts too);
- **the client's ceiling**: the same replay and fio on a copy in ``--shm-dir`` (tmpfs: no
  storage at all), in GB/s and in GB/s per core (bytes / CPU seconds: the replay's by
  ``getrusage`` of this process and its reaped children over the whole call, its set-up
  included; fio's by its own usr+sys CPU over its run); and the replay's read primitive alone
  (one thread) against one fio job, which tells the reads from the loader around them.

Direct I/O (``direct=1``) is not compared: the replay's ``--io posix`` reads are buffered.

``--s3``: instead, an S3 replay against a plain loop of ranged GETs at the same concurrency and
request size, on a real S3 server started here (s3rver on 127.0.0.1, its objects in
``--data-dir``; see tests/s3server.py): ``--s3-objects`` objects of ``--s3-object-mb`` MB,
uploaded by the replay's own ``generate``; the replay (``storage.client: boto3``, ranged GETs of
``--s3-request`` bytes, ``--threads`` loader workers, the builtin loader and PyTorch's) against
``--threads`` processes each with its own boto3 client reading objects ``w::W`` in the same
ranged GETs (``Body.read()`` of each), timed from a barrier after their clients were made to the
last one's end. Interleaved, ``--repeat`` times; also the replay's served bytes (what its GETs
returned) against the bytes it asked for. The server runs on the same host and competes for its
CPUs with both sides. The default, 128 objects of 4 MB (512 MB, an epoch of about 2 s here), keeps
the workers' start and their clients (about 0.1 s, in the epoch of the replay as of the job it
stands for) from weighing as much as the reads: at 32 objects the same replay read 81 % of the
loop over its epoch and 100 % steady.

MB = 10^6 bytes, GB = 10^9 bytes.

    python benchmarks/replay_bandwidth.py --size-mb 1024 --repeat 2 [--data-dir bench-data/replay-bw]
    python benchmarks/replay_bandwidth.py --s3 --repeat 3 [--s3-objects 128 --s3-object-mb 4]
"""

from __future__ import annotations

import argparse
import functools
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


def fio(
    files: list[Path], data: Path, jobs: int, transfer: int, hint: bool = False
) -> tuple[float, float]:
    """(MB/s, CPU seconds) of fio reading *files* as the replay's *jobs* workers do, cold.
    *hint*: fio's default ``fadvise_hint=1`` (``POSIX_FADV_SEQUENTIAL`` on each file: Linux
    doubles its readahead window); without it ``fadvise_hint=0``, as the replay and the job it
    replays read (no hint)."""
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
        f"--fadvise_hint={1 if hint else 0}",
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
        # DLIO's throughput: the epoch less its first step (worker start-up, first batch)
        "steady_mbps": e.get("io_mb_per_s") or float("nan"),
        "call_mbps": e["bytes_read"] / wall / 1e6,
        "cpu_s": cpu,
        "bytes": e["bytes_read"],
        "served": e.get("served_bytes"),
        "device": e.get("device_read_bytes"),
    }


def _s3_model(objects: int, object_mb: float, request: int, threads: int):
    """An S3 model: *objects* raw objects of *object_mb* MB, one sample each, read in ranged GETs
    of *request* bytes by *threads* workers through boto3; compute 0."""
    record = int(object_mb * 1_000_000)
    return model_from_dict(
        {
            "schema": "dlreplay.workload",
            "format_version": 1,
            "model": {"name": "s3-bandwidth"},
            "dataset": {
                "format": "raw",
                "num_files": objects,
                "num_samples_per_file": 1,
                "record_length": record,
            },
            "reader": {"batch_size": 1, "read_threads": threads, "transfer_size": request},
            "train": {"epochs": 1, "computation_time": 0},
            "storage": {
                "storage_type": "s3",
                "storage_root": "dlreplay-bandwidth",
                "prefix": "train/",
                "client": "boto3",
                "object_bytes": record,
                "request_bytes": request,
                "ranged": True,
            },
        }
    )


def _get_worker(bucket: str, objects: list, request: int, barrier, conn) -> None:
    """One stream of the GET loop: its own boto3 client, then ranged GETs of *request* bytes over
    *objects* ((key, size) each), one after the other; sends (start, end, bytes)."""
    import boto3

    s3 = boto3.session.Session().client("s3")
    barrier.wait()
    t0, n = time.perf_counter(), 0
    for key, size in objects:
        for off in range(0, size, request):
            last = min(off + request, size) - 1
            n += len(
                s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={off}-{last}")["Body"].read()
            )
    conn.send((t0, time.perf_counter(), n))
    conn.close()


def get_loop(bucket: str, prefix: str, streams: int, request: int) -> tuple[float, float]:
    """MB/s of *streams* processes reading every object under *prefix* in ranged GETs (stream *w*
    the objects ``w::streams``): from the moment all had their clients to the last one's end,
    and from before the processes started (their start and clients counted, as a replay's
    epoch counts its workers' start and clients)."""
    import multiprocessing

    import boto3

    listed = boto3.session.Session().client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)
    objects = sorted((o["Key"], int(o["Size"])) for o in listed.get("Contents", ()))
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(streams)
    pipes, procs = [], []
    t_start = time.perf_counter()
    for w in range(streams):
        here, there = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_get_worker, args=(bucket, objects[w::streams], request, barrier, there)
        )
        p.start()
        pipes.append(here)
        procs.append(p)
    got = [c.recv() for c in pipes]
    for p in procs:
        p.join()
    end, total = max(g[1] for g in got), sum(g[2] for g in got)
    return total / (end - min(g[0] for g in got)) / 1e6, total / (end - t_start) / 1e6


def s3_main(args: argparse.Namespace) -> int:
    """The S3 half (see the module doc): replay vs a loop of ranged GETs on s3rver here."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.s3server import find_s3rver, s3_server

    if find_s3rver() is None or importlib.util.find_spec("boto3") is None:
        print("needs s3rver (node + npm s3rver, see tests/s3server.py) and boto3", file=sys.stderr)
        return 2
    model = _s3_model(args.s3_objects, args.s3_object_mb, args.s3_request, args.threads)
    loaders = ["builtin"] + (["torch"] if importlib.util.find_spec("torch") is not None else [])
    rates: dict[str, list[float]] = {}
    served: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory(prefix="dlreplay-s3bw-") as tmp:
        state = args.data_dir.resolve() / "s3rver-state"
        shutil.rmtree(state, ignore_errors=True)
        with s3_server(state) as srv:
            os.environ.update(srv.env())
            data = Path(tmp) / "data"
            generate_dataset(GenerateConfig(model=model, data_dir=data, progress=False))
            print(
                f"S3 (s3rver on 127.0.0.1, same host): {args.s3_objects} objects of "
                f"{args.s3_object_mb:g} MB, ranged GETs of {args.s3_request} B, {args.threads} "
                f"stream(s); {os.cpu_count()} CPU(s), load average {_load():.2f}"
            )
            for i in range(args.repeat):
                loop, started = get_loop(
                    "dlreplay-bandwidth", "train/", args.threads, args.s3_request
                )
                rates.setdefault("GET loop", []).append(loop)
                rates.setdefault("GET loop, with its start", []).append(started)
                for loader in loaders:
                    r = replay(model, data, Path(tmp) / f"s3-{i}-{loader}", loader, False)
                    rates.setdefault(f"replay {loader} (epoch)", []).append(r["epoch_mbps"])
                    rates.setdefault(f"replay {loader} (steady)", []).append(r["steady_mbps"])
                    rates.setdefault(f"replay {loader} (whole call)", []).append(r["call_mbps"])
                    served.append((r["served"] or 0, r["bytes"]))
                print(
                    f"run {i}: "
                    + "  ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items())
                    + f"  (load {_load():.2f})"
                )
        shutil.rmtree(state, ignore_errors=True)
    _report_ratios(rates, "GET loop")
    print(
        "target: S3 replay (epoch) >= 90 % of the GET loop at the same concurrency and request size"
    )
    for s, asked in served:
        print(
            f"  served by the object store (its GETs' bytes) {s / 1e6:.1f} MB of {asked / 1e6:.1f} MB asked"
        )
    return 0


def _disk_run(
    i: int,
    args: argparse.Namespace,
    model,
    files: list[Path],
    loaders: list[str],
    tmp: Path,
    rates: dict[str, list[float]],
    served: list[tuple[int, int]],
) -> None:
    """Run *i* on the disk, cold: fio without and with its hint, and the replay with each loader,
    in an order rotated by one each run (a storage that caches below the page cache, as a
    virtual disk's host may, favours whoever reads the same bytes soon after another)."""

    def fio_plain() -> None:
        rates.setdefault("fio", []).append(
            fio(files, args.data_dir, args.threads, args.transfer)[0]
        )

    def fio_hint() -> None:
        rates.setdefault("fio, its SEQUENTIAL hint", []).append(
            fio(files, args.data_dir, args.threads, args.transfer, hint=True)[0]
        )

    def one(loader: str) -> None:
        r = replay(model, args.data_dir, tmp / f"r{i}-{loader}", loader, True)
        rates.setdefault(f"replay {loader} (epoch)", []).append(r["epoch_mbps"])
        rates.setdefault(f"replay {loader} (steady)", []).append(r["steady_mbps"])
        rates.setdefault(f"replay {loader} (whole call)", []).append(r["call_mbps"])
        if r["served"] is not None and r["device"]:
            served.append((r["served"], r["device"]))

    steps = [fio_plain, fio_hint, *(functools.partial(one, loader) for loader in loaders)]
    first = i % len(steps)
    for step in steps[first:] + steps[:first]:
        step()
    print(
        f"run {i}: "
        + "  ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items())
        + f"  (load {_load():.2f})"
    )


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


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
    ap.add_argument("--s3", action="store_true", help="the S3 comparison instead (module doc)")
    ap.add_argument("--s3-objects", type=int, default=128)
    ap.add_argument("--s3-object-mb", type=float, default=4.0)
    ap.add_argument("--s3-request", type=int, default=1 << 20, help="bytes per ranged GET")
    args = ap.parse_args()
    if args.s3:
        return s3_main(args)
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
            _disk_run(i, args, model, files, loaders, Path(tmp), rates, served)
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
    print("cold, on the dataset's disk:", end=" ")
    _report_ratios(rates, "fio")
    print("target: replay (epoch) >= 90 % of fio at the same block size, streams and mode")
    for s, d in served:
        print(
            f"  served by the storage {s / 1e6:.1f} MB vs the device's own count {d / 1e6:.1f} MB "
            f"({s / d:.1%}; the device counts every process on the host)"
        )
    print("the client's ceiling on a memory-backed directory (no storage), best / median:")
    for key, v in ceiling.items():
        print(f"  {key:32s} {max(v):7.2f} / {statistics.median(v):7.2f}")


def _report_ratios(rates: dict[str, list[float]], base: str) -> None:
    """Best / median MB/s of each, the ratio to *base*'s best / median, and the median of the
    runs' own ratios (each run's replay against the same run's *base*, taken beside it)."""
    best = {k: max(v) for k, v in rates.items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"best / median MB/s; ratio to {base}'s best / median; median of the runs' ratios:")
    for key, v in rates.items():
        paired = statistics.median(x / y for x, y in zip(v, rates[base], strict=True))
        ratio = (
            ""
            if key == base
            else f"   {best[key] / best[base]:6.1%} / {med[key] / med[base]:6.1%} / {paired:6.1%}"
        )
        print(f"  {key:30s} {best[key]:8.1f} / {med[key]:8.1f}{ratio}")


if __name__ == "__main__":
    sys.exit(main())
