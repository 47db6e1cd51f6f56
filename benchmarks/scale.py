"""Scale benchmark: a many-rank trace loaded single-process vs on a Dask LocalCluster.

Builds (once, cached under ``--dir``) a synthetic DFTracer 2.x trace with the layout of
the real samples (see ``benchmarks/ingest.py``): one consumer and ``--files`` loader
processes, one multi-member ``.pfw.gz`` each, ``--events`` events in all. Then, in one
run, it loads the trace with ``load_trace`` (one process, its threads) and with the
parse stage on a ``LocalCluster`` of ``--workers`` processes, runs the
characterisation passes on each table, and prints both times and both event counts,
which must be equal (exit 1 otherwise), along with the dataset bytes read.

    python benchmarks/scale.py [--dir bench-data/scale] [--files 64] [--events 5300000] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import build  # noqa: E402

from dlreplay.analyze import load_trace  # noqa: E402
from dlreplay.analyze.distributed import cluster, load_trace_distributed  # noqa: E402
from dlreplay.analyze.passes import characterize  # noqa: E402


def _analyse(loaded) -> tuple[int, int]:
    c = characterize(loaded.events, manifest=loaded.manifest, passes=["overview", "access", "metadata"])
    return loaded.events.height, int(c["overview"]["dataset_bytes_read"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="bench-data/scale", help="cache directory for the trace")
    ap.add_argument("--files", type=int, default=64, help="loader processes (trace files besides the consumer's)")
    ap.add_argument("--events", type=int, default=5_300_000, help="events to generate (the builder lands a few % under)")
    ap.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    ap.add_argument("--rebuild", action="store_true", help="regenerate even if cached")
    args = ap.parse_args(argv)
    out = Path(args.dir) / f"f{args.files}-e{args.events}"
    if args.rebuild or not (out / "manifest.json").is_file():
        t = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        build(out, args.events, workers=args.files)
        print(f"built {out} in {time.perf_counter() - t:.1f} s")
    files = sorted(out.glob("*.pfw.gz"))
    stored = sum(f.stat().st_size for f in files)
    print(f"trace: {len(files)} files, {stored / 1e6:.1f} MB stored")

    t = time.perf_counter()
    single = load_trace(out)
    n1, b1 = _analyse(single)
    t_single = time.perf_counter() - t
    del single

    with cluster(workers=args.workers) as client:
        t = time.perf_counter()
        dist, info = load_trace_distributed(out, client)
        n2, b2 = _analyse(dist)
        t_dist = time.perf_counter() - t
    print(f"single process     : {t_single:7.2f} s  {n1:,} events  {b1:,} dataset bytes read")
    print(f"LocalCluster x{args.workers:<4} : {t_dist:7.2f} s  {n2:,} events  {b2:,} dataset bytes read "
          f"({info.tasks} tasks)")
    print(f"ratio single/distributed: {t_single / t_dist:.2f}x")
    if (n1, b1) != (n2, b2):
        print("MISMATCH: the two paths disagree", file=sys.stderr)
        return 1
    print("event counts and bytes: equal")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
