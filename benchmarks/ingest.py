"""Ingest benchmark: ``dlreplay analyze``'s loading on 1, 2 and all cores against as many parallel ``gzip -dc``.

Builds (once, cached under ``--dir``) two synthetic DFTracer 2.x traces of a PyTorch-style
data-loading job: a *multi-file* trace (one main process with fetch/step/epoch/checkpoint
events and some STDIO, and 8 persistent loader workers that, per sample, open one ``.npz``
file, seek around its zip directory, read it, close it and emit an ``item`` event: 9
process files) and a *single-file* trace (the main process reads the samples itself).
Lines use the exact DFTracer 2.x layout of the real samples (``FH``/``HH``/``CM``/
``thread_name`` metadata, ``start``/``end`` records, ``"ph":1`` events), buffered into
multi-member gzip files the way DFTracer flushes its write buffer.

Then, for each trace and each core count N (1, 2 and all the cores this process may
use, without repeats), in one run and interleaved so that both sides see the same
machine load:

- ``gzip -dc`` as N parallel processes: the files dealt out by size (a single file is
  decompressed by each of the N); its rate is the events decoded by all N over the wall
  time;
- on N > 1 cores, also one ``gzip -dc`` of the whole trace (the issue's second baseline:
  the load on 2 cores against a single decompressor, measured in the same run);
- a child process pinned to N cores (``sched_setaffinity``, ``POLARS_MAX_THREADS=N``)
  that runs ``load_trace(jobs=N)`` + ``summarize()`` (as ``dlreplay analyze`` does) and
  then the passes and rules (``characterize`` + ``find``, given that summary: ``dlreplay
  analyze`` computes it once, with the side read of the trace's text for the arguments the
  table has no column for: mapped windows, open flags, S3 GETs); it reports the wall time of
  each phase (after its imports) and its peak RSS (``VmHWM``) minus its RSS after the
  imports, per event.

Printed per (trace, N): both rates (events/s; best and median run), their ratio (and on
N > 1 cores the single ``gzip -dc``'s rate and the load's ratio to it), the
peak bytes per event of the load + summarize and of the whole analysis: over the RSS after
the imports, and over that plus the fixed cost of a process that has analysed any trace
(the peak of a few-thousand-event trace's analysis, printed in MiB), and the CPU time (user
and system) and minor page faults of the load + summarize (medians).
Targets (issue #19): >= 0.5x N parallel ``gzip -dc`` on N cores, >= 1.0x one ``gzip -dc``
on 2 cores, <= 200 bytes per event at peak.

    python benchmarks/ingest.py [--dir bench-data/ingest] [--events 2200000] [--repeat 3] [--cores 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
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
        for name, a_name, a_value in (
            ("HH", HOST, HOST_HASH),
            ("thread_name", str(pid), "thread_name"),
            ("CM", "time_metric", "US"),
            ("FH", "/bench", _h(1)),
        ):
            self._add(
                f'{{"name":"{name}","cat":"dftracer","type":1,"pid":{p},"tid":{p},"ph":4,'
                f'"args":{{"hhash":"{HOST_HASH}","name":"{a_name}","value":"{a_value}"}}}}'
            )
        self.event(
            "start",
            "dftracer",
            0,
            f'"ppid":{ppid},"cmd_hash":"{_h(2)}","exec_hash":"{_h(3)}",'
            f'"version":20003,"date":"Sun Nov 22 02:14:52 2026","cwd":"{_h(1)}"',
            typ=1,
        )

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
            self._add(
                f'{{"name":"FH","cat":"dftracer","type":1,"pid":{self.pid},"tid":{self.pid},"ph":4,'
                f'"args":{{"hhash":"{HOST_HASH}","name":"{path}","value":"{fhash}"}}}}'
            )

    def event(
        self, name: str, cat: str, dur: int, args: str, typ: int = 3, ts: int | None = None
    ) -> None:
        self.id += 1
        self.events += 1
        t = self.ts if ts is None else ts
        self._add(
            f'{{"id":{self.id},"name":"{name}","cat":"{cat}","type":{typ},"pid":{self.pid},'
            f'"tid":{self.pid},"ts":{t},"dur":{dur},"ph":1,"args":{{"hhash":"{HOST_HASH}"'
            + (f",{args}" if args else "")
            + "}}"
        )
        if ts is None:
            self.ts += dur + 3

    def close(self) -> None:
        self.event(
            "end",
            "dftracer",
            0,
            f'"app":{{}},"used":{{"C_APP":1,"LIBC_IO":1}},'
            f'"cfg":{{"enable":1,"time_metric":"US","compression":1}},"num_events":{self.id}',
            typ=1,
        )
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
    w.event(
        "lseek64",
        "POSIX",
        1,
        f'"ret":{fsize - 124},"whence":0,"offset":{fsize - 124},"fhash":"{fh}"',
    )
    w.event("read", "POSIX", 2, f'"ret":102,"count":102,"fhash":"{fh}"')
    w.event("lseek64", "POSIX", 1, f'"ret":0,"whence":0,"offset":0,"fhash":"{fh}"')
    w.event("read", "POSIX", 3, f'"ret":30,"count":30,"fhash":"{fh}"')
    body = fsize - 256
    pos = 30
    while body > 0:
        n = min(body, 1 << 20)
        w.event(
            "read",
            "POSIX",
            int(rng.integers(50, 400)),
            f'"ret":{n},"count":{1 << 20},"fhash":"{fh}"',
        )
        body -= n
        pos += n
    w.event("read", "POSIX", 1, f'"ret":0,"count":{1 << 20},"fhash":"{fh}"')
    w.event("close", "POSIX", 3, f'"ret":0,"fhash":"{fh}"')
    w.event("item", "data", w.ts - t_item, f'"image_idx":{idx},"epoch":{epoch}', typ=2, ts=t_item)
    w.ts += int(rng.integers(100, 2000))


def build(out: Path, target_events: int, workers: int = 8, seed: int = 7) -> list[Path]:
    """Write the synthetic trace into ``out``; returns the .pfw.gz files.

    ``workers`` loader processes read the samples, one trace file each; with 0 the main
    process reads them itself and the trace is one file."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.pfw.gz"):
        old.unlink()
    rng = np.random.default_rng(seed)
    t0 = 1_795_313_692_000_000
    main = _Proc(out / "trace-main-preload.pfw.gz", 1000, 999, t0)
    procs = [
        _Proc(out / f"trace-w{w}-fork.pfw.gz", 1001 + w, 1000, t0 + 1000) for w in range(workers)
    ]
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
            for k, idx in enumerate(order[b : b + batch]):
                _sample(
                    procs[(b // batch + k) % workers] if workers else main,
                    int(idx),
                    epoch,
                    rng,
                    int(sizes[idx]),
                )
            main.event(
                "fetch",
                "dataloader",
                int(rng.integers(100, 5000)),
                f'"batch_size":{batch},"step":{b // batch},"epoch":{epoch}',
                typ=2,
            )
            main.event(
                "step",
                "compute",
                int(rng.integers(5000, 20000)),
                f'"step":{b // batch},"epoch":{epoch}',
                typ=2,
            )
        ck = f"{CKPT_DIR}/ckpt_{epoch:03d}.pt"
        main.fh(ck, _h(90000 + epoch))
        main.event(
            "save",
            "checkpoint",
            50000,
            f'"bytes":{3 << 30},"path":"{ck}","fhash":"{_h(90000 + epoch)}"',
            typ=2,
        )
        main.event("fopen64", "STDIO", 10, f'"mode":"rb","fhash":"{_h(5)}"')
        main.fh("/proc/self/status", _h(5))
        main.event("fread", "STDIO", 10, f'"ret":1200,"count":4096,"size":1,"fhash":"{_h(5)}"')
        main.event("fclose", "STDIO", 3, f'"fhash":"{_h(5)}"')
    for p in [main, *procs]:
        p.close()
    files = sorted(out.glob("*.pfw.gz"))
    events = main.events + sum(p.events for p in procs)
    (out / "bench.json").write_text(
        json.dumps(
            {
                "events": events,
                "target": target_events,
                "version": 2,
                "files": [f.name for f in files],
            }
        )
    )
    return files


CHILD = r"""
import json, os, resource, sys, time
cores = int(sys.argv[2])
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
def rss(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
import dlreplay
dlreplay.prepare_process()  # as the CLI does, before polars is first imported
from dlreplay.analyze import load_trace, summarize
from dlreplay.analyze.findings import find
from dlreplay.analyze.passes import TraceView, characterize
from dlreplay.analyze.distill.mapped import mapped_events
base = rss("VmRSS")
u0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
loaded = load_trace(sys.argv[1], jobs=cores)
t1 = time.perf_counter()
summary = summarize(loaded.events, data_dirs=(loaded.manifest or {}).get("data_dirs"), per_process=loaded.per_process)
t2 = time.perf_counter()
u1 = resource.getrusage(resource.RUSAGE_SELF)
peak_load = rss("VmHWM")
# the passes take the summary already made (dlreplay analyze computes it once, in them)
# and the mapped windows, read from the trace's text as `dlreplay analyze` does (its one
# read of the files serves every side pattern: 25 s of a 1 M-event analysis before 2026-12-08)
find(characterize(TraceView(loaded.events, loaded.manifest, None, loaded.per_process,
                            known_summary=summary, mapped_events=mapped_events(sys.argv[1]))))
t3 = time.perf_counter()
print(json.dumps({"events": loaded.events.height, "load": t1 - t0, "summarize": t2 - t1, "passes": t3 - t2,
                  "user": u1.ru_utime - u0.ru_utime, "sys": u1.ru_stime - u0.ru_stime,
                  "faults": u1.ru_minflt - u0.ru_minflt,
                  "base": base, "peak_load": peak_load, "peak": rss("VmHWM"),
                  "table": loaded.events.estimated_size()}))
"""


def _deal(files: list[Path], n: int) -> list[list[Path]]:
    """``files`` dealt into ``n`` lists of about equal stored size (largest first); a single
    file goes to every list."""
    if len(files) == 1:
        return [files] * n
    out: list[list[Path]] = [[] for _ in range(n)]
    load = [0] * n
    for f in sorted(files, key=lambda f: -f.stat().st_size):
        i = load.index(min(load))
        out[i].append(f)
        load[i] += f.stat().st_size
    return [x for x in out if x]


def _gzip(files: list[Path], n: int) -> tuple[float, int]:
    """(wall seconds, copies of the trace decoded) of ``n`` parallel ``gzip -dc``."""
    shares = _deal(files, n)
    t = time.perf_counter()
    with open(os.devnull, "wb") as null:
        procs = [
            subprocess.Popen(["gzip", "-dc", *map(str, share)], stdout=null) for share in shares
        ]
        for p in procs:
            if p.wait() != 0:
                raise SystemExit("gzip -dc failed")
    return time.perf_counter() - t, (len(shares) if len(files) == 1 else 1)


def _analyze(trace: Path, n: int) -> dict:
    env = {**os.environ, "POLARS_MAX_THREADS": str(n)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(trace), str(n)], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"the analysis child failed on {trace}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: A committed trace of a few thousand events: its whole analysis measures what a process
#: takes whatever the trace (polars' thread pool and caches, the parser's buffers), which
#: the bytes per event of a 2 M-event trace would otherwise carry (about 15 B/event).
_SMALL = Path(__file__).resolve().parents[1] / "traces" / "npz_fork"


def _fixed_cost(n: int) -> int:
    """Peak RSS above the imports (bytes) of the whole analysis of :data:`_SMALL` on ``n`` cores, median of 3."""
    return int(
        statistics.median(r["peak"] - r["base"] for r in (_analyze(_SMALL, n) for _ in range(3)))
    )


def _trace(out: Path, events: int, workers: int, rebuild: bool) -> list[Path]:
    meta = out / "bench.json"
    info = json.loads(meta.read_text()) if meta.is_file() else {}
    cached = (
        info.get("target") == events and info.get("version") == 3 and info.get("workers") == workers
    )
    if rebuild or not cached:
        t = time.perf_counter()
        build(out, events, workers=workers)
        info = json.loads(meta.read_text())
        meta.write_text(json.dumps({**info, "version": 3, "workers": workers}))
        print(f"built {out} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return sorted(out.glob("*.pfw.gz"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="bench-data/ingest", help="cache directory for the traces")
    ap.add_argument("--events", type=int, default=2_200_000, help="events per trace (>= 2M)")
    ap.add_argument("--rebuild", action="store_true", help="regenerate even if cached")
    ap.add_argument(
        "--repeat", type=int, default=3, help="timed runs of each side (best and median shown)"
    )
    ap.add_argument(
        "--cores", default=None, help="core counts, comma-separated (default: 1, 2 and all)"
    )
    ap.add_argument("--traces", default="single,multi", help="which traces: single, multi or both")
    args = ap.parse_args(argv)

    avail = len(os.sched_getaffinity(0))
    cores = sorted(
        {int(c) for c in args.cores.split(",")} if args.cores else {1, min(2, avail), avail}
    )
    try:
        load_avg = os.getloadavg()
    except OSError:
        load_avg = (float("nan"),) * 3
    print(
        f"machine: {avail} core(s) available, load average {load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f}"
    )
    root = Path(args.dir)
    for kind in args.traces.split(","):
        workers = 0 if kind == "single" else 8
        files = _trace(root / kind, args.events, workers, args.rebuild)
        stored = sum(f.stat().st_size for f in files)
        for n in cores:
            gz: list[float] = []
            one: list[float] = []  # a single gzip -dc, the second baseline on N > 1 cores
            an: list[dict] = []
            for _ in range(args.repeat):
                wall, copies = _gzip(files, n)
                gz.append(wall / copies)
                if n > 1:
                    one.append(_gzip(files, 1)[0])
                an.append(_analyze(root / kind, n))
            ev = an[0]["events"]
            ld = [r["load"] + r["summarize"] for r in an]
            full = [r["load"] + r["summarize"] + r["passes"] for r in an]
            per_load = statistics.median((r["peak_load"] - r["base"]) / ev for r in an)
            per_all = statistics.median((r["peak"] - r["base"]) / ev for r in an)
            fixed = _fixed_cost(n)
            gz_b, gz_m = min(gz), statistics.median(gz)
            ld_b, ld_m = min(ld), statistics.median(ld)
            print(
                f"{kind}-file trace ({len(files)} file(s), {stored / 1e6:.1f} MB stored, {ev:,} events), "
                f"{n} core(s), {args.repeat} runs (best / median):"
            )
            print(
                f"  {n} x gzip -dc        : {ev / gz_b / 1e6:6.2f} / {ev / gz_m / 1e6:6.2f} M events/s"
            )
            print(
                f"  load + summarize     : {ev / ld_b / 1e6:6.2f} / {ev / ld_m / 1e6:6.2f} M events/s   "
                f"ratio {gz_b / ld_b:.2f} / {gz_m / ld_m:.2f}"
            )
            if one:
                one_b, one_m = min(one), statistics.median(one)
                print(
                    f"  1 x gzip -dc         : {ev / one_b / 1e6:6.2f} / {ev / one_m / 1e6:6.2f} M events/s   "
                    f"load + summarize vs it {one_b / ld_b:.2f} / {one_m / ld_m:.2f}"
                )
            print(
                f"  + passes and rules   : {ev / min(full) / 1e6:6.2f} / {ev / statistics.median(full) / 1e6:6.2f} "
                f"M events/s   ratio {gz_b / min(full):.2f} / {gz_m / statistics.median(full):.2f}"
            )
            print(
                f"  peak bytes/event     : {per_load:6.0f} load + summarize, {per_all:6.0f} whole analysis "
                f"(table {an[0]['table'] / ev:.0f}; peak RSS {statistics.median(r['peak'] for r in an) / 2**20:,.0f} MiB)"
            )
            print(
                f"  above the fixed cost : {per_load - fixed / ev:6.0f} load + summarize, {per_all - fixed / ev:6.0f} "
                f"whole analysis (fixed: {fixed / 2**20:.0f} MiB, the whole analysis of a "
                f"{_SMALL.name} trace; the same in a process of any trace size)"
            )
            print(
                f"  CPU of load + summ.  : {statistics.median(r['user'] for r in an):.2f} s user, "
                f"{statistics.median(r['sys'] for r in an):.2f} s system, "
                f"{statistics.median(r['faults'] for r in an):,.0f} page faults (median; system time is mostly "
                f"the faults of memory returned between stages and used again)"
            )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
