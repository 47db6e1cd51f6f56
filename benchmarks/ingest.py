"""Ingest benchmark: ``load_trace()`` + ``summarize()`` against ``gzip -dc`` on the same trace.

Builds (once, cached under ``--dir``) a synthetic DFTracer 2.x trace of a PyTorch-style
data-loading job: one main process (fetch/step/epoch/checkpoint events, some STDIO) and
persistent loader workers that, per sample, open one ``.npz`` file, seek around its
zip directory, read it, close it and emit an ``item`` event. Lines use the exact
DFTracer 2.x layout of the real samples (``FH``/``HH``/``CM``/``thread_name`` metadata,
``start``/``end`` records, ``"ph":1`` events), buffered into multi-member gzip files the
way DFTracer flushes its write buffer.

Then it measures, in one run: the wall time of ``gzip -dc FILES > /dev/null`` and of
``load_trace()`` + ``summarize()`` with the loader's per-process table, as ``dlreplay analyze``
does (runs interleaved, so both sides see the same machine load),
and prints events, both rates (events/s; best and median run), their ratio, the CPU time
of each side and the peak RSS of the loading process.

    python benchmarks/ingest.py [--dir bench-data/ingest] [--events 2200000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

HOST_HASH = "6882804a826580cd"
HOST = "bench-node"
MEMBER_BYTES = 8 << 20  # uncompressed bytes per gzip member (DFTracer flushes its buffer)
CKPT_DIR = "/bench/checkpoints"
DATA_DIR = "/bench/data"


def _h(x: int) -> str:
    """A 16-hex-digit hash like DFTracer's."""
    return f"{(x * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF:016x}"


class _Proc:
    """Writes the lines of one process into a multi-member gzip file."""

    def __init__(self, path: Path, pid: int, ppid: int, t0: int) -> None:
        self.path, self.pid, self.ppid = path, pid, ppid
        self.ts = t0
        self.id = 0
        self.lines: list[str] = []
        self.size = 0
        self.fh_seen: set[str] = set()
        self.out = path.open("wb")
        self.events = 0
        p = pid
        for name, a_name, a_value in (("HH", HOST, HOST_HASH), ("thread_name", str(pid), "thread_name"),
                                      ("CM", "time_metric", "US"), ("FH", "/bench", _h(1))):
            self._add(f'{{"name":"{name}","cat":"dftracer","type":1,"pid":{p},"tid":{p},"ph":4,'
                      f'"args":{{"hhash":"{HOST_HASH}","name":"{a_name}","value":"{a_value}"}}}}')
        self.event("start", "dftracer", 0, f'"ppid":{ppid},"cmd_hash":"{_h(2)}","exec_hash":"{_h(3)}",'
                   f'"version":20003,"date":"Sun Nov 22 02:14:52 2026","cwd":"{_h(1)}"', typ=1)

    def _add(self, line: str) -> None:
        self.lines.append(line)
        self.size += len(line) + 1
        if self.size >= MEMBER_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.lines:
            comp = zlib.compressobj(6, zlib.DEFLATED, 31)
            self.out.write(comp.compress(("\n".join(self.lines) + "\n").encode()) + comp.flush())
            self.lines, self.size = [], 0

    def fh(self, path: str, fhash: str) -> None:
        if fhash not in self.fh_seen:
            self.fh_seen.add(fhash)
            self._add(f'{{"name":"FH","cat":"dftracer","type":1,"pid":{self.pid},"tid":{self.pid},"ph":4,'
                      f'"args":{{"hhash":"{HOST_HASH}","name":"{path}","value":"{fhash}"}}}}')

    def event(self, name: str, cat: str, dur: int, args: str, typ: int = 3, ts: int | None = None) -> None:
        self.id += 1
        self.events += 1
        t = self.ts if ts is None else ts
        self._add(f'{{"id":{self.id},"name":"{name}","cat":"{cat}","type":{typ},"pid":{self.pid},'
                  f'"tid":{self.pid},"ts":{t},"dur":{dur},"ph":1,"args":{{"hhash":"{HOST_HASH}"'
                  + (f",{args}" if args else "") + "}}")
        if ts is None:
            self.ts += dur + 3

    def close(self) -> None:
        self.event("end", "dftracer", 0, f'"app":{{}},"used":{{"C_APP":1,"LIBC_IO":1}},'
                   f'"cfg":{{"enable":1,"time_metric":"US","compression":1}},"num_events":{self.id}', typ=1)
        self.flush()
        self.out.close()


def _sample(w: _Proc, idx: int, epoch: int, rng: np.random.Generator, fsize: int) -> None:
    """One Dataset.__getitem__ reading an npz file the way numpy.load does."""
    path = f"{DATA_DIR}/vol_{idx:06d}.npz"
    fh = _h(1000 + idx)
    w.fh(path, fh)
    t_item = w.ts
    w.event("open64", "POSIX", int(rng.integers(5, 30)), f'"flags":524288,"fhash":"{fh}"')
    w.event("read", "POSIX", 4, f'"ret":6,"count":6,"fhash":"{fh}"')
    w.event("lseek64", "POSIX", 1, f'"ret":0,"whence":1,"offset":0,"fhash":"{fh}"')
    w.event("lseek64", "POSIX", 1, f'"ret":{fsize},"whence":2,"offset":0,"fhash":"{fh}"')
    w.event("lseek64", "POSIX", 1, f'"ret":{fsize - 22},"whence":2,"offset":-22,"fhash":"{fh}"')
    w.event("read", "POSIX", 2, f'"ret":22,"count":22,"fhash":"{fh}"')
    w.event("lseek64", "POSIX", 1, f'"ret":{fsize - 124},"whence":0,"offset":{fsize - 124},"fhash":"{fh}"')
    w.event("read", "POSIX", 2, f'"ret":102,"count":102,"fhash":"{fh}"')
    w.event("lseek64", "POSIX", 1, f'"ret":0,"whence":0,"offset":0,"fhash":"{fh}"')
    w.event("read", "POSIX", 3, f'"ret":30,"count":30,"fhash":"{fh}"')
    body = fsize - 256
    pos = 30
    while body > 0:
        n = min(body, 1 << 20)
        w.event("read", "POSIX", int(rng.integers(50, 400)), f'"ret":{n},"count":{1 << 20},"fhash":"{fh}"')
        body -= n
        pos += n
    w.event("read", "POSIX", 1, f'"ret":0,"count":{1 << 20},"fhash":"{fh}"')
    w.event("close", "POSIX", 3, f'"ret":0,"fhash":"{fh}"')
    w.event("item", "data", w.ts - t_item, f'"image_idx":{idx},"epoch":{epoch}', typ=2, ts=t_item)
    w.ts += int(rng.integers(100, 2000))


def build(out: Path, target_events: int, workers: int = 8, seed: int = 7) -> list[Path]:
    """Write the synthetic trace into ``out``; returns the .pfw.gz files."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.pfw.gz"):
        old.unlink()
    rng = np.random.default_rng(seed)
    t0 = 1_795_313_692_000_000
    main = _Proc(out / "trace-main-preload.pfw.gz", 1000, 999, t0)
    procs = [_Proc(out / f"trace-w{w}-fork.pfw.gz", 1001 + w, 1000, t0 + 1000) for w in range(workers)]
    nfiles = 4096
    sizes = rng.integers(1 << 20, 3 << 20, size=nfiles)  # 1-3 MiB per sample file
    per_sample = 16  # events per sample (FH records are metadata, not events)
    total_samples = target_events // per_sample
    epochs = max(1, total_samples // nfiles)
    batch = 16
    for epoch in range(epochs):
        main.event("epoch", "pipeline", 0, f'"epoch":{epoch}', typ=2)
        order = rng.permutation(nfiles)
        for b in range(0, nfiles, batch):
            for k, idx in enumerate(order[b:b + batch]):
                _sample(procs[(b // batch + k) % workers], int(idx), epoch, rng, int(sizes[idx]))
            main.event("fetch", "dataloader", int(rng.integers(100, 5000)),
                       f'"batch_size":{batch},"step":{b // batch},"epoch":{epoch}', typ=2)
            main.event("step", "compute", int(rng.integers(5000, 20000)), f'"step":{b // batch},"epoch":{epoch}', typ=2)
        ck = f"{CKPT_DIR}/ckpt_{epoch:03d}.pt"
        main.fh(ck, _h(90000 + epoch))
        main.event("save", "checkpoint", 50000, f'"bytes":{3 << 30},"path":"{ck}","fhash":"{_h(90000 + epoch)}"', typ=2)
        main.event("fopen64", "STDIO", 10, f'"mode":"rb","fhash":"{_h(5)}"')
        main.fh("/proc/self/status", _h(5))
        main.event("fread", "STDIO", 10, f'"ret":1200,"count":4096,"size":1,"fhash":"{_h(5)}"')
        main.event("fclose", "STDIO", 3, f'"fhash":"{_h(5)}"')
    for p in [main, *procs]:
        p.close()
    files = sorted(out.glob("*.pfw.gz"))
    events = main.events + sum(p.events for p in procs)
    (out / "bench.json").write_text(json.dumps({"events": events, "target": target_events, "version": 2,
                                                "files": [f.name for f in files]}))
    return files


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="bench-data/ingest", help="cache directory for the trace")
    ap.add_argument("--events", type=int, default=2_200_000, help="events to generate (>= 2M)")
    ap.add_argument("--rebuild", action="store_true", help="regenerate even if cached")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each side (best and median shown)")
    args = ap.parse_args(argv)

    out = Path(args.dir)
    meta = out / "bench.json"
    info = json.loads(meta.read_text()) if meta.is_file() else {}
    cached = info.get("target") == args.events and info.get("events", 0) >= 2_000_000 and info.get("version") == 2
    if args.rebuild or not cached:
        t = time.perf_counter()
        files = build(out, args.events)
        print(f"built {out} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    files = sorted(out.glob("*.pfw.gz"))
    stored = sum(f.stat().st_size for f in files)

    from dlreplay.analyze import load_trace, summarize

    gz: list[tuple[float, float]] = []  # (wall, cpu) per run
    ld: list[tuple[float, float]] = []
    ld_only: list[float] = []
    n_events = 0
    for _ in range(args.repeat):
        c0, t0 = _cpu(), time.perf_counter()
        with open(os.devnull, "wb") as null:
            subprocess.run(["gzip", "-dc", *map(str, files)], stdout=null, check=True)
        gz.append((time.perf_counter() - t0, _cpu() - c0))
        c0, t0 = _cpu(), time.perf_counter()
        loaded = load_trace(out)
        ld_only.append(time.perf_counter() - t0)
        summarize(loaded.events, per_process=loaded.per_process)  # as `dlreplay analyze` does
        ld.append((time.perf_counter() - t0, _cpu() - c0))
        n_events = loaded.events.height
        del loaded
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    gz_best, gz_med = min(w for w, _ in gz), med([w for w, _ in gz])
    ld_best, ld_med = min(w for w, _ in ld), med([w for w, _ in ld])
    print(f"trace: {len(files)} files, {stored / 1e6:.1f} MB stored, {n_events:,} events; "
          f"{args.repeat} runs of each side, interleaved (best / median)")
    print(f"gzip -dc          : {gz_best:6.2f} / {gz_med:6.2f} s wall ({med([c for _, c in gz]):5.2f} s cpu)  "
          f"{n_events / gz_best / 1e6:5.2f} / {n_events / gz_med / 1e6:5.2f} M events/s")
    print(f"load_trace()      : {min(ld_only):6.2f} / {med(ld_only):6.2f} s wall                 "
          f"{n_events / min(ld_only) / 1e6:5.2f} / {n_events / med(ld_only) / 1e6:5.2f} M events/s")
    print(f"load+summarize()  : {ld_best:6.2f} / {ld_med:6.2f} s wall ({med([c for _, c in ld]):5.2f} s cpu)  "
          f"{n_events / ld_best / 1e6:5.2f} / {n_events / ld_med / 1e6:5.2f} M events/s")
    print(f"ratio load+summarize / gzip (events/s): best {gz_best / ld_best:.2f}, median {gz_med / ld_med:.2f}  "
          f"(load only: {gz_best / min(ld_only):.2f} / {gz_med / med(ld_only):.2f})")
    print(f"peak RSS of this process (load+summarize): {peak:,.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
