"""What dlreplay recovers from the DLIO corpus: the README's table.

For every DLIO trace in ``traces/`` (and the DFTracer-annotated job): the distilled
model against the workload DLIO ran (``expected.json``), ``analyze``'s AU and AU by
DLIO's formula against the AU DLIO printed, and a traced replay of the distilled model
compared with the DLIO trace (similarity, steady-state epoch time: epochs after the first).

    python benchmarks/dlio_corpus.py [--dir bench-data/dlio] [--no-replay]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlreplay.analyze import load_trace  # noqa: E402
from dlreplay.analyze.compare import compare_traces  # noqa: E402
from dlreplay.analyze.distill import distill  # noqa: E402
from dlreplay.analyze.passes import characterize  # noqa: E402
from dlreplay.model import save_model  # noqa: E402
from dlreplay.replay import ReplayConfig, run_replay  # noqa: E402

TRACES = [*sorted((REPO / "traces").glob("dlio_*")), REPO / "traces" / "ai_annotated"]


def _pair(got: object, want: object) -> str:
    return f"{got}" if got == want else f"{got} (true {want}) ✗"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data" / "dlio")
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--only", action="append", help="trace name (repeatable)")
    args = ap.parse_args()
    print("| trace | format | files | samples/file | batch | read threads | epochs | compute s (true) | "
          "AU / AU DLIO formula (DLIO printed) | replay similarity | read-size KS | bytes read replay/DLIO | "
          "steady epoch s DLIO / replay | AU DLIO formula: trace / replay |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for trace in [t for t in TRACES if not args.only or t.name in args.only]:
        exp = json.loads((trace / "expected.json").read_text())
        t = exp["model"]
        lt = load_trace(trace)
        m = distill(lt.events, manifest=lt.manifest, source=str(trace))
        st = characterize(lt.events, passes=["steps"])["steps"]
        printed = exp.get("dlio_metrics", {}).get("Training Accelerator Utilization [AU] (%)")
        comp = m.train.computation_time.mean or 0.0
        cells = [
            f"`{trace.name}`", _pair(m.dataset.format, t["format"]), _pair(m.dataset.num_files, t["num_files"]),
            _pair(m.dataset.num_samples_per_file, t["num_samples_per_file"]), _pair(m.reader.batch_size, t["batch_size"]),
            _pair(m.reader.read_threads, t["read_threads"]), _pair(m.train.epochs, t["epochs"]),
            f"{comp:.4f} ({t['computation_time']:.4f}, {(comp - t['computation_time']) / t['computation_time']:+.1%})",
            f"{st['au']:.1%} / {st['au_dlio']:.1%} ({printed:.1f} %)" if printed is not None else
            f"{st['au']:.1%} / {st['au_dlio']:.1%} (-)",
        ]
        if args.no_replay:
            cells += ["-"] * 5
        else:
            work = args.dir / trace.name
            if work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True)
            save_model(m, work / "model.yaml")  # kept for inspection
            run_replay(ReplayConfig(model=m, data_dir=work / "data", out=work / "replay"))
            cmp = compare_traces(trace, work / "replay")
            a, b = cmp.timing_a["steady_epoch_s"], cmp.timing_b["steady_epoch_s"]
            real, got = cmp.features_a.get("bytes_read") or 0, cmp.features_b.get("bytes_read") or 0
            au_a, au_b = cmp.timing_a.get("au_dlio"), cmp.timing_b.get("au_dlio")
            cells += [f"{cmp.similarity:.3f}", f"{cmp.ks_read_sizes:.3f}" if cmp.ks_read_sizes is not None else "-",
                      f"{got / real:.3f}" if real else "-", f"{a:.3f} / {b:.3f} ({(b - a) / a:+.1%})",
                      f"{au_a:.1%} / {au_b:.1%}" if au_a is not None and au_b is not None else "-"]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
