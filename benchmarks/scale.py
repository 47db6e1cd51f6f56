"""Scale benchmark: a many-rank trace loaded single-process vs on a Dask LocalCluster.

Builds (once, cached under ``--dir``) a synthetic DFTracer 2.x trace with the layout of
the real samples (see ``benchmarks/ingest.py``): one consumer and ``--files`` loader
processes, one multi-member ``.pfw.gz`` each, ``--events`` events in all. Then, in one
run, it loads the trace with ``load_trace`` (one process, its threads) and with the
parse stage on a ``LocalCluster`` of ``--workers`` processes (combine, passes and rules
then run in a task on a worker: ``analyze_distributed``), runs every characterisation
pass and the findings rules on each, and prints both times, both event counts, dataset
bytes read and finding ids, which must be equal (exit 1 otherwise), and the client's
peak RSS on each path (the Dask path runs first, so its peak is its own).

    python benchmarks/scale.py [--dir bench-data/scale] [--files 64] [--events 5300000] [--workers 2]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import build  # noqa: E402

import dlreplay  # noqa: E402

dlreplay.prepare_process()  # polars' allocator and one BLAS thread, as the CLI sets them

from dlreplay.analyze import load_trace  # noqa: E402
from dlreplay.analyze.distributed import analyze_distributed, cluster  # noqa: E402
from dlreplay.analyze.findings import find  # noqa: E402
from dlreplay.analyze.passes import characterize  # noqa: E402


def _key(c, findings) -> tuple[int, int, list[str]]:
    return (
        int(c["overview"]["events"]),
        int(c["overview"]["dataset_bytes_read"]),
        [f.id for f in findings],
    )


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="bench-data/scale", help="cache directory for the trace")
    ap.add_argument(
        "--files",
        type=int,
        default=64,
        help="loader processes (trace files besides the consumer's)",
    )
    ap.add_argument(
        "--events",
        type=int,
        default=5_300_000,
        help="events to generate (the builder lands a few %% under)",
    )
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

    with cluster(workers=args.workers) as client:
        t = time.perf_counter()
        remote = analyze_distributed(out, client, figures=False)
        k2 = _key(remote.characterization, remote.findings)
        t_dist = time.perf_counter() - t
    rss_dist = _peak_rss_mb()

    t = time.perf_counter()
    single = load_trace(out)
    c = characterize(single.events, manifest=single.manifest)
    k1 = _key(c, find(c))
    t_single = time.perf_counter() - t
    rss_single = _peak_rss_mb()
    print(
        f"single process     : {t_single:7.2f} s  {k1[0]:,} events  {k1[1]:,} dataset bytes read  "
        f"client peak RSS {rss_single:,.0f} MB"
    )
    print(
        f"LocalCluster x{args.workers:<4} : {t_dist:7.2f} s  {k2[0]:,} events  {k2[1]:,} dataset bytes read  "
        f"client peak RSS {rss_dist:,.0f} MB ({remote.info.tasks} tasks)"
    )
    print(f"ratio single/distributed: {t_single / t_dist:.2f}x; findings {', '.join(k1[2]) or '-'}")
    if k1 != k2:
        print(f"MISMATCH: the two paths disagree: {k1} vs {k2}", file=sys.stderr)
        return 1
    print("event counts, bytes and findings: equal")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
