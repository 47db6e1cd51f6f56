"""The package's rooms: the trace layer (``dlreplay.analyze.trace``) and the Perfetto pieces
(``dlreplay.analyze.perfetto``) are sub-packages, no module of ``dlreplay.analyze`` is in an
import cycle (lazy imports inside functions included), the trace layer imports nothing
above it, and the public imports the README uses keep working."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from .conftest import REPO

ROOT = REPO / "analyze"


def _imports() -> dict[str, set[str]]:
    """Module -> the ``dlreplay.analyze`` modules it imports (anywhere in its source);
    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module."""
    files = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        files[".".join(("dlreplay.analyze", *(p for p in parts if p != "__init__")))] = f
    out: dict[str, set[str]] = {}
    for name, f in files.items():
        pkg = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("dlreplay.analyze"):
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in files]
            deps.update(subs or [target])
        deps.discard(name)
        out[name] = deps
    return out


def test_no_import_cycles() -> None:
    graph = _imports()

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph.get(start, ()))
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return seen

    assert [m for m in graph if m in reach(m)] == []


def test_the_trace_layer_imports_nothing_above_it() -> None:
    graph = _imports()
    for module, deps in graph.items():
        if module.startswith("dlreplay.analyze.trace"):
            assert all(d.startswith("dlreplay.analyze.trace") for d in deps), (module, deps)
    assert (ROOT / "trace" / "_pfwscan.c").is_file() and (ROOT / "perfetto" / "tp_shell.js").is_file()


def test_readme_imports() -> None:
    from dlreplay.analyze import load, load_trace, summarize  # noqa: F401
    from dlreplay.analyze.analysis import analyze_trace, render_findings_text  # noqa: F401
    from dlreplay.analyze.findings import Thresholds  # noqa: F401
    from dlreplay.analyze.passes import PASSES  # noqa: F401
    from dlreplay.analyze.perfetto import export_trace, query  # noqa: F401

    assert callable(load) and callable(query)
    for name in ("dlreplay.analyze.trace.load", "dlreplay.analyze.trace.spill", "dlreplay.analyze.trace.vocabulary",
                 "dlreplay.analyze.vocabulary", "dlreplay.analyze.perfetto.view"):
        importlib.import_module(name)
    assert Path(importlib.import_module("dlreplay.analyze.perfetto.processor").TP_SHELL_JS).is_file()


def test_every_benchmark_says_how_to_run_it() -> None:
    """``python benchmarks/X.py --help`` prints its options and exits 0 for every benchmark
    (a literal ``%`` in an option's help once made argparse raise a traceback instead)."""
    import subprocess
    import sys

    scripts = sorted((REPO / "benchmarks").glob("*.py"))
    assert len(scripts) >= 10
    for script in scripts:
        proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "usage:" in proc.stdout and "Traceback" not in proc.stderr, script.name
