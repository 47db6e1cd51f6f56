"""Memory benchmark: ``dlreplay analyze`` in memory vs ``--memory-limit`` (spilled) on one trace.

Uses the trace of ``benchmarks/scale.py`` (built once and cached under ``--dir``: one
consumer and ``--files`` loader processes, one ``.pfw.gz`` each, >= 5 M events). Runs,
in one invocation, ``dlreplay analyze TRACE --json`` twice in child processes (the real
CLI; each child prints its own peak RSS, ``VmHWM``): once in memory and once
with ``--memory-limit`` (default 1GiB, below the event table's ~1 GB). Prints wall time,
peak RSS and event count of each, and exits 1 unless the event counts, the
characterisation and the findings are identical.

    python benchmarks/memory.py [--dir bench-data/scale] [--files 64] [--events 5300000] [--limit 1GiB]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import build  # noqa: E402

#: The child's own peak RSS is VmHWM (per address space): getrusage's ru_maxrss keeps the
#: high-water mark of the process that forked it (Linux carries it across exec), so a
#: child of a large parent reported the parent's peak.
CHILD = """
import sys, time
t = time.perf_counter()
code = 0
try:
    from dlreplay.cli import main
    main(sys.argv[1:], prog_name="dlreplay")
except SystemExit as exc:
    code = exc.code or 0
finally:
    with open("/proc/self/status") as fh:
        hwm = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM"))
    print(f"RSS_KB={hwm} WALL={time.perf_counter() - t:.2f}", file=sys.stderr)
sys.exit(code)
"""


def _run(args: list[str]) -> tuple[dict, int, float, str]:
    """(--json output, peak RSS bytes, wall s, stderr) of ``dlreplay analyze ARGS --json`` in a child."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "analyze", *args, "--json"], capture_output=True, text=True
    )
    m = re.search(r"RSS_KB=(\d+) WALL=([\d.]+)", proc.stderr)
    if proc.returncode != 0 or not m:
        raise SystemExit(
            f"dlreplay analyze {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout), int(m.group(1)) * 1024, float(m.group(2)), proc.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dir", default="bench-data/scale", help="cache directory of the scale benchmark's trace"
    )
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
    ap.add_argument("--limit", default="1GiB", help="--memory-limit of the bounded run")
    ap.add_argument("--rebuild", action="store_true", help="regenerate even if cached")
    args = ap.parse_args(argv)
    out = Path(args.dir) / f"f{args.files}-e{args.events}"
    if args.rebuild or not (out / "bench.json").is_file():
        t = time.perf_counter()
        build(out, args.events, workers=args.files)
        print(f"built {out} in {time.perf_counter() - t:.1f} s")
    files = sorted(out.glob("*.pfw.gz"))
    print(f"trace: {len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB stored")

    eager, rss_e, t_e, _ = _run([str(out)])
    with tempfile.TemporaryDirectory(prefix="dlreplay-bench-spill-") as spill:
        bounded, rss_b, t_b, err = _run(
            [str(out), "--memory-limit", args.limit, "--spill-dir", spill]
        )
        left = list(Path(spill).iterdir())
    print(
        f"in memory              : {t_e:7.2f} s  peak RSS {rss_e / 2**20:7.0f} MiB  {eager['events']:,} events"
    )
    print(
        f"--memory-limit {args.limit:<8}: {t_b:7.2f} s  peak RSS {rss_b / 2**20:7.0f} MiB  {bounded['events']:,} events"
    )
    for line in err.splitlines():
        if line.startswith(("memory limit", "spill:")):
            print(f"  {line}")
    for note in bounded.get("notes", []):
        if note.startswith("memory limit"):
            print(f"  note: {note}")
    print(
        f"peak RSS bounded/in-memory: {rss_b / rss_e:.2f}   time bounded/in-memory: {t_b / t_e:.2f}"
    )
    same = (
        eager["events"] == bounded["events"]
        and eager["characterization"] == bounded["characterization"]
        and [f["id"] for f in eager["findings"]] == [f["id"] for f in bounded["findings"]]
    )
    if not same:
        print("MISMATCH: the two paths disagree", file=sys.stderr)
        return 1
    if left:
        print(f"spill directory left behind: {left}", file=sys.stderr)
        return 1
    print("event counts, characterisation and findings: equal; spill directory removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
