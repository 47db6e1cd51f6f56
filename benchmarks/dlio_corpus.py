"""What dlreplay recovers from the DLIO corpus: the table in docs/dlio.md.

For every DLIO trace in ``traces/`` (and the DFTracer-annotated job): the distilled
model against the workload DLIO ran (``expected.json``), ``analyze``'s AU and AU by
DLIO's formula against the AU DLIO printed, and a traced replay of the distilled model
compared with the DLIO trace (similarity, steady-state epoch time: epochs after the first).

    python benchmarks/dlio_corpus.py [--dir bench-data/dlio] [--no-replay] [--only NAME]

The committed traces were made on a shared VM whose load at the time shows in them (sleeps
that overshoot, slow page-cache writes): a replay today is compared with DLIO as it ran
then. ``--paired N`` measures what the replay is for, on the same machine at the same
time: for each DLIO workload (``traces/make_dlio_corpus.py``; DLIO 2.0.0 in its own
virtualenv, ``--dlio-venv``), N rounds of {DLIO traced run, distill of that trace, replay,
compare}, rounds back to back, and the medians over rounds (DLIO's run-to-run spread shown
beside them: its steady epoch time's min..max over the rounds).

    python benchmarks/dlio_corpus.py --paired 3 [--dlio-venv /work/dlio-venv] [--only dlio_npz_starved]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from layout_fidelity import settled_dataset  # noqa: E402  (benchmarks/, this script's directory)

import dlreplay  # noqa: E402

dlreplay.prepare_process()  # polars' allocator and one BLAS thread, as the CLI sets them

from dlreplay.analyze import load_trace  # noqa: E402
from dlreplay.analyze.compare import compare_traces  # noqa: E402
from dlreplay.analyze.distill import distill  # noqa: E402
from dlreplay.analyze.passes import characterize  # noqa: E402
from dlreplay.dlio import dlio_to_model  # noqa: E402
from dlreplay.model import save_model  # noqa: E402
from dlreplay.replay import ReplayConfig, run_replay  # noqa: E402

TRACES = [*sorted((REPO / "traces").glob("dlio_*")), REPO / "traces" / "ai_annotated"]


def _pair(got: object, want: object) -> str:
    return f"{got}" if got == want else f"{got} (true {want}) ✗"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data" / "dlio")
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--only", action="append", help="trace name (repeatable)")
    ap.add_argument(
        "--paired",
        type=int,
        default=0,
        metavar="N",
        help="N rounds of a fresh DLIO run and the replay of its distilled trace, per workload",
    )
    ap.add_argument("--dlio-venv", type=Path, default=Path("/work/dlio-venv"))
    args = ap.parse_args()
    if args.paired:
        paired(args)
        return
    print(
        "| trace | format | files | samples/file | batch | read threads | epochs | compute s (true) | "
        "AU / AU DLIO formula (DLIO printed) | replay similarity | read-size KS | bytes read replay/DLIO | "
        "steady epoch s DLIO / replay | AU DLIO formula: trace / replay |"
    )
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
            f"`{trace.name}`",
            _pair("mmap_indexed_binary" if m.reader.memory_map else m.dataset.format, t["format"]),
            _pair(m.dataset.num_files, t["num_files"]),
            _pair(m.dataset.num_samples_per_file, t["num_samples_per_file"]),
            _pair(m.reader.batch_size, t["batch_size"]),
            _pair(m.reader.read_threads, t["read_threads"]),
            _pair(m.train.epochs, t["epochs"]),
            f"{comp:.4f} ({t['computation_time']:.4f}, {(comp - t['computation_time']) / t['computation_time']:+.1%})",
            f"{st['au']:.1%} / {st['au_dlio']:.1%} ({printed:.1f} %)"
            if printed is not None
            else f"{st['au']:.1%} / {st['au_dlio']:.1%} (-)",
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
            cells += [
                f"{cmp.similarity:.3f}",
                f"{cmp.ks_read_sizes:.3f}" if cmp.ks_read_sizes is not None else "-",
                f"{got / real:.3f}" if real else "-",
                f"{a:.3f} / {b:.3f} ({(b - a) / a:+.1%})",
                f"{au_a:.1%} / {au_b:.1%}" if au_a is not None and au_b is not None else "-",
            ]
        print("| " + " | ".join(cells) + " |", flush=True)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def paired(args: argparse.Namespace) -> None:
    """Fresh DLIO runs and their replays, back to back (see the module doc)."""
    sys.path.insert(0, str(REPO / "traces"))
    import make_dlio_corpus as mk  # type: ignore[import-not-found]

    if not (args.dlio_venv / "bin" / "dlio_benchmark").exists():
        sys.exit(
            f"{args.dlio_venv}/bin/dlio_benchmark not found: install DLIO 2.0.0 there (traces/make_dlio_corpus.py)"
        )
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(
        "| workload | rounds | replay similarity | read-size KS | bytes read replay/DLIO | steady epoch s DLIO "
        "(min..max) / replay | epoch error | AU DLIO formula: DLIO / replay | DLIO printed AU | "
        "import-dlio replay: similarity, steady epoch s (error), AU DLIO formula |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in [n for n in sorted(mk.WORKLOADS) if not args.only or n in args.only]:
        job = args.dir / "paired" / name
        data = job / "data"
        if not (data / "train").is_dir():
            data.mkdir(parents=True, exist_ok=True)
            mk.run_dlio(
                args.dlio_venv,
                mk.workload_yaml(name, data, job / "gen-out", job / "ckpt", generate=True),
                job / "conf-gen",
                job,
                trace=False,
                ranks=mk.RANKS.get(name, 1),
            )
        rows = []
        for r in range(args.paired):
            out = job / f"dlio-{r}"
            shutil.rmtree(out, ignore_errors=True)
            # DLIO reads its dataset from the page cache, as the replays read theirs: this VM reclaims
            # page cache left untouched for a while, and DLIO read its dataset, generated minutes
            # before, from disk in its first epoch (0.84 s against the replay's 0.54 s)
            mk.settle(data)
            text = mk.run_dlio(
                args.dlio_venv,
                mk.workload_yaml(name, data, out, job / "ckpt", generate=False),
                job / "conf",
                job,
                trace=True,
                ranks=mk.RANKS.get(name, 1),
            )
            printed = mk.metrics(text).get("Training Accelerator Utilization [AU] (%)")
            shutil.rmtree(job / "ckpt", ignore_errors=True)
            lt = load_trace(out)
            m = distill(lt.events, manifest=lt.manifest, source=str(out))
            save_model(m, job / f"model-{r}.yaml")
            replay = job / f"replay-{r}"
            shutil.rmtree(replay, ignore_errors=True)
            settled_dataset(m, job / "replay-data")
            run_replay(
                ReplayConfig(model=m, data_dir=job / "replay-data", out=replay), echo=lambda s: None
            )
            cmp = compare_traces(out, replay)
            # the workload file DLIO ran, imported (no trace): DLIO's configured times and generator
            # (with DLIO 2.0.0's checkpoint sizing: the release that ran it)
            imported = dlio_to_model(
                mk.workload_yaml(name, data, out, job / "ckpt", generate=False),
                source=f"{name} workload",
                dlio_version="2.0.0",
            )
            imp_out = job / f"import-{r}"
            shutil.rmtree(imp_out, ignore_errors=True)
            settled_dataset(imported, job / "import-data")
            run_replay(
                ReplayConfig(model=imported, data_dir=job / "import-data", out=imp_out),
                echo=lambda s: None,
            )
            cmp_imp = compare_traces(out, imp_out)
            real, got = cmp.features_a.get("bytes_read") or 0, cmp.features_b.get("bytes_read") or 0
            rows.append(
                {
                    "sim": cmp.similarity,
                    "ks": cmp.ks_read_sizes,
                    "bytes": got / real if real else None,
                    "a": cmp.timing_a["steady_epoch_s"],
                    "b": cmp.timing_b["steady_epoch_s"],
                    "au_a": cmp.timing_a.get("au_dlio"),
                    "au_b": cmp.timing_b.get("au_dlio"),
                    "printed": printed,
                    "imp_sim": cmp_imp.similarity,
                    "imp_b": cmp_imp.timing_b["steady_epoch_s"],
                    "imp_au": cmp_imp.timing_b.get("au_dlio"),
                }
            )
            print(
                f"  {name} round {r}: similarity {cmp.similarity:.3f}, steady epoch {rows[-1]['a']:.3f} / "
                f"{rows[-1]['b']:.3f} s, load {os.getloadavg()[0]:.2f}",
                file=sys.stderr,
                flush=True,
            )
        a, b = [x["a"] for x in rows], [x["b"] for x in rows]
        err = [(y - x) / x for x, y in zip(a, b, strict=True)]
        print(
            f"| `{name}` | {len(rows)} | {_median([x['sim'] for x in rows]):.3f} | "
            f"{_median([x['ks'] for x in rows if x['ks'] is not None]):.3f} | "
            f"{_median([x['bytes'] for x in rows if x['bytes'] is not None]):.3f} | "
            f"{_median(a):.3f} ({min(a):.3f}..{max(a):.3f}) / {_median(b):.3f} | {_median(err):+.1%} | "
            f"{_median([x['au_a'] for x in rows if x['au_a'] is not None]):.1%} / "
            f"{_median([x['au_b'] for x in rows if x['au_b'] is not None]):.1%} | "
            f"{_median([x['printed'] for x in rows if x['printed'] is not None]):.1f} % | "
            f"{_median([x['imp_sim'] for x in rows]):.3f}, {_median([x['imp_b'] for x in rows]):.3f} "
            f"({_median([(x['imp_b'] - x['a']) / x['a'] for x in rows]):+.1%}), "
            f"{_median([x['imp_au'] for x in rows if x['imp_au'] is not None]):.1%} |",
            flush=True,
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
