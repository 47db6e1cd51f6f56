"""Distill speed on a >= 1 M-event trace: time of ``distill`` vs ``load`` alone, same run.

The trace is built (once, cached under ``--dir``) from a real corpus capture
(``traces/jpeg_small``, 22.6 k events) replicated as N independent ranks: every
copy's pids and tids are shifted, so the result looks like a many-rank job with
data-loader events. Target (distill issue): distill <= 2 s.

    python benchmarks/distill.py [--events 1000000] [--dir bench-data/distill]
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import dlreplay  # noqa: E402

dlreplay.prepare_process()  # polars' allocator and one BLAS thread, as the CLI sets them

from dlreplay.analyze import load_trace  # noqa: E402
from dlreplay.analyze.distill import distill  # noqa: E402
from dlreplay.pfw import decompress  # noqa: E402

_ID = re.compile(rb'"(pid|tid|ppid)":(\d+)')


def build(src: Path, dest: Path, target_events: int) -> int:
    """Write ceil(target / events(src)) shifted copies of src's files into dest."""
    texts = {p.name: decompress(p).data for p in sorted(src.glob("*.pfw.gz")) if p.stat().st_size}
    per_copy = sum(t.count(b'"ts":') for t in texts.values())
    copies = -(-target_events // per_copy)
    dest.mkdir(parents=True, exist_ok=True)
    for k in range(copies):
        shift = (k + 1) * 1_000_000

        def bump(m: re.Match[bytes], shift: int = shift) -> bytes:
            return b'"%s":%d' % (m.group(1), int(m.group(2)) + shift)

        for name, text in texts.items():
            with gzip.open(dest / f"rank{k:03d}-{name}", "wb", compresslevel=1) as fh:
                fh.write(_ID.sub(bump, text))
    return copies * per_copy


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data" / "distill")
    ap.add_argument("--source", type=Path, default=REPO / "traces" / "jpeg_small")
    args = ap.parse_args()
    trace = args.dir / f"trace-{args.events}"
    if not trace.is_dir():
        print(f"building {trace} from {args.source} …")
        build(args.source, trace, args.events)
    t0 = time.perf_counter()
    loaded = load_trace(trace)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = distill(loaded.events, data_dirs=None, source=str(trace))
    t_distill = time.perf_counter() - t0
    n = loaded.events.height
    print(f"events: {n:,} in {len(list(trace.glob('*.pfw.gz')))} files")
    print(f"load:    {t_load:6.2f} s  ({n / t_load / 1e6:.2f} M events/s)")
    print(
        f"distill: {t_distill:6.2f} s  (target <= 2 s)  ratio distill/load = {t_distill / t_load:.2f}"
    )
    print(
        f"model: {model.dataset.format}, {model.dataset.num_files} files, batch {model.reader.batch_size}, "
        f"{model.processes.ranks} ranks x {model.reader.read_threads} workers"
    )


if __name__ == "__main__":
    main()
