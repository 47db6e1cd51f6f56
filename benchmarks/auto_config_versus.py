"""DLIO's auto_config (argonne-lcf/dlio_benchmark PR #344) against distill on the same traces.

auto_config is not shipped with dlreplay nor on PyPI (its branch, ``feat/auto-config``, is
not in any dlio-benchmark release): put its source tree somewhere outside this repository,
so that ``DIR/dlio_benchmark/auto_config/cli.py`` exists (with an empty
``DIR/dlio_benchmark/__init__.py``; it imports nothing else of DLIO, only PyYAML), then::

    python benchmarks/auto_config_versus.py --auto-config DIR [--work DIR2]

For each trace of ``inference_sweep.VERSUS`` and a few POSIX-only example captures, its
``analyze`` command runs twice, each time given the job's data folder as ``--data-roots``:

* ``as is``: on the committed ``.pfw.gz`` files;
* ``shimmed``: on the same events rewritten to the layout its parser reads (DFTracer 0.0.x /
  1.x JSON: ``ph`` "X", numbers as numbers, the path as ``args.filename``): DFTracer 2.2's
  numeric phases become "X" and its ``fhash`` the path of its ``FH`` record, DLIO 2.0.0's
  quoted numbers numbers and its ``fname`` ``filename``. Nothing else is changed (names and
  categories stay: its epoch and batch markers are its own tracer's ``APP`` events).

The seven fields of the head-to-head (epochs, workers, samples per file, files, batch,
format, compute per step in s) are read from each YAML it writes and scored as
``inference_sweep.py`` scores distill (exact, compute within 5 %) against ``expected.json``.
Prints a markdown table; outputs under ``--work`` (default ``bench-data/auto_config_versus``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inference_sweep import FIELDS, REPO, VERSUS, distilled, right  # noqa: E402

#: POSIX-only captures of the example jobs (no compute truth), beside VERSUS
POSIX_TRACES = (
    "sweep/cosmo_w2_s1",
    "sweep/cosmo_w0_s1",
    "sweep/tiles_w2_t128",
    "sweep/tiles_w4_t24",
)
#: compared field: (distill model path, expected.json key, auto_config YAML path)
COMPARED = (
    ("train.epochs", "epochs", "train.epochs"),
    ("reader.read_threads", "read_threads", "reader.read_threads"),
    ("dataset.num_samples_per_file", "num_samples_per_file", "dataset.num_samples_per_file"),
    ("dataset.num_files", "num_files", "dataset.num_files_train"),
    ("reader.batch_size", "batch_size", "reader.batch_size"),
    ("dataset.format", "format", "dataset.format"),
    ("train.computation_time", "computation_time", "train.computation_time.mean"),
)
_NUMERIC_ARGS = ("ret", "size", "count", "offset")


def data_root(trace: Path) -> str | None:
    """The job's data folder: DLIO's config, the capture's command, or DFTracer's SH record."""
    import yaml

    cfg = trace / "dlio_config.yaml"
    if cfg.exists():
        return (yaml.safe_load(cfg.read_text()).get("dataset") or {}).get("data_folder")
    argv: list[str] = []
    man = trace / "manifest.json"
    if man.exists():
        argv = json.loads(man.read_text()).get("command", [])
    else:
        for f in sorted(trace.glob("*.pfw.gz")):
            for rec in _records(f):
                if rec.get("name") == "SH":
                    argv = str(rec.get("args", {}).get("name", "")).split(";")
                    break
    return argv[argv.index("--data-dir") + 1] if "--data-dir" in argv else None


def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    with gzip.open(path, "rt", errors="replace") as fh:
        for line in fh:
            line = line.strip().rstrip(",")
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


def _num(v: Any) -> Any:
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return v


def shim(trace: Path, out: Path) -> int:
    """Rewrite ``trace``'s events into the layout auto_config's parser reads (see the module
    docstring) as plain ``.pfw`` files under ``out``; returns the complete events written."""
    files = sorted(trace.glob("*.pfw.gz"))
    recs = {f: _records(f) for f in files}
    paths = {
        r["args"]["value"]: r["args"]["name"]
        for rs in recs.values()
        for r in rs
        if r.get("name") == "FH" and isinstance(r.get("args"), dict)
    }
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for f, rs in recs.items():
        lines = []
        for r in rs:
            if r.get("ph") not in (1, "1", "X"):
                continue
            r = {**r, "ph": "X", **{k: _num(r[k]) for k in ("ts", "dur", "pid", "tid") if k in r}}
            a = dict(r.get("args") or {})
            a.update({k: _num(a[k]) for k in _NUMERIC_ARGS if k in a})
            if "fname" in a:
                a["filename"] = a.pop("fname")
            elif a.get("fhash") in paths:
                a["filename"] = paths[a["fhash"]]
            r["args"] = a
            lines.append(json.dumps(r))
        n += len(lines)
        (out / f.name.replace(".pfw.gz", ".pfw")).write_text("\n".join(lines) + "\n")
    return n


def run_auto_config(tool_dir: Path, traces: Path, root: str | None, out: Path) -> dict[str, Any]:
    """auto_config's ``analyze`` on the trace files in ``traces``: its YAML (None when it
    wrote none), the events it parsed and its last error line."""
    import yaml

    cmd = [sys.executable, "-m", "dlio_benchmark.auto_config.cli", "analyze"]
    cmd += ["--trace-dir", str(traces), "--output", str(out)]
    if root:
        cmd += ["--data-roots", root]
    env = {**os.environ, "PYTHONPATH": str(tool_dir)}
    out.unlink(missing_ok=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    log = p.stdout + p.stderr
    parsed = [ln for ln in log.splitlines() if "Parsed " in ln and " events from " in ln]
    err = [ln for ln in log.splitlines() if "Error" in ln or "error" in ln]
    return {
        "rc": p.returncode,
        "yaml": yaml.safe_load(out.read_text()) if out.exists() else None,
        "parsed": parsed[-1].split("Parsed ")[1].split(" events")[0] if parsed else "?",
        "error": err[-1].strip() if err else "",
    }


def _get(d: Any, path: str) -> Any:
    for part in path.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def score(cfg: dict[str, Any] | None, truth: dict[str, Any]) -> tuple[int, int, int, list]:
    """(fields recovered, right, scored) of COMPARED and each value it wrote."""
    got, ok, scored = 0, 0, 0
    values = []
    for path, key, theirs in COMPARED:
        v = _get(cfg, theirs) if cfg else None
        values.append(v)
        got += v is not None
        if key in truth:
            scored += 1
            ok += int(v is not None and right(FIELDS[path], v, truth[key]))
    return got, ok, scored, values


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--auto-config",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder holding dlio_benchmark/auto_config/ (outside this repository)",
    )
    ap.add_argument("--work", type=Path, default=REPO / "bench-data" / "auto_config_versus")
    args = ap.parse_args()
    if not (args.auto_config / "dlio_benchmark" / "auto_config" / "cli.py").exists():
        sys.exit(f"no dlio_benchmark/auto_config/cli.py under {args.auto_config}")
    print(
        "| trace | truth: epochs / workers / samples per file / files / batch / format / "
        "compute s | distill: right | distill, POSIX only | auto_config as is: parsed events, "
        "recovered, right | auto_config shimmed: recovered, right | its values |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in VERSUS + POSIX_TRACES:
        print(row(name, args.auto_config, args.work / name.replace("/", "_")), flush=True)


def row(name: str, tool_dir: Path, work: Path) -> str:
    """One markdown row of the head-to-head for the committed trace ``traces/<name>``."""
    trace = REPO / "traces" / name
    truth = json.loads((trace / "expected.json").read_text())["model"]
    root = data_root(trace)
    (work / "asis").mkdir(parents=True, exist_ok=True)
    for f in trace.glob("*.pfw.gz"):
        (work / "asis" / f.name).write_bytes(f.read_bytes())
    asis = run_auto_config(tool_dir, work / "asis", root, work / "asis.yaml")
    shim(trace, work / "shimmed")
    shimmed = run_auto_config(tool_dir, work / "shimmed", root, work / "shimmed.yaml")
    cells = []
    for posix_only in (False, True):
        d = distilled(trace, posix_only)["fields"]
        scored = [(p, k) for p, k, _ in COMPARED if k in truth]
        ok = sum(int(right(FIELDS[p], d[p]["value"], truth[k])) for p, k in scored)
        cells.append(f"{ok} of {len(scored)}")
    a_got, a_ok, n, _ = score(asis["yaml"], truth)
    s_got, s_ok, _, vals = score(shimmed["yaml"], truth)
    a_note = f"; {asis['error'][-90:]}" if asis["error"] else ""
    want = " / ".join(
        (f"{truth[k]:.3g}" if isinstance(truth[k], float) else str(truth[k])) if k in truth else "-"
        for _, k, _ in COMPARED
    )
    its = " / ".join("-" if v is None else str(v) for v in vals)
    return (
        f"| {name} | {want} | {cells[0]} | {cells[1]} | {asis['parsed']} events, "
        f"{a_got} of {len(COMPARED)}, {a_ok} right{a_note} | {s_got} of {len(COMPARED)}, "
        f"{s_ok} of {n} right | {its} |"
    )


if __name__ == "__main__":
    main()
