"""The package's rooms: the trace layer (``dlreplay.analyze.trace``) and the Perfetto pieces
(``dlreplay.analyze.perfetto``) are sub-packages, no module of ``dlreplay.analyze`` is in an
import cycle (lazy imports inside functions included), the trace layer imports nothing
above it, and the public imports docs/commands.md shows keep working."""

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
    assert (ROOT / "trace" / "_pfwscan.c").is_file() and (
        ROOT / "perfetto" / "tp_shell.js"
    ).is_file()


def test_readme_imports() -> None:
    from dlreplay.analyze import load, load_trace, summarize  # noqa: F401
    from dlreplay.analyze.analysis import analyze_trace, render_findings_text  # noqa: F401
    from dlreplay.analyze.findings import Thresholds  # noqa: F401
    from dlreplay.analyze.passes import PASSES  # noqa: F401
    from dlreplay.analyze.perfetto import export_trace, query  # noqa: F401

    assert callable(load) and callable(query)
    for name in (
        "dlreplay.analyze.trace.load",
        "dlreplay.analyze.trace.spill",
        "dlreplay.analyze.trace.vocabulary",
        "dlreplay.analyze.vocabulary",
        "dlreplay.analyze.perfetto.view",
    ):
        importlib.import_module(name)
    assert Path(
        importlib.import_module("dlreplay.analyze.perfetto.processor").TP_SHELL_JS
    ).is_file()


def test_every_benchmark_says_how_to_run_it() -> None:
    """``python benchmarks/X.py --help`` prints its options and exits 0 for every benchmark
    (a literal ``%`` in an option's help once made argparse raise a traceback instead)."""
    import subprocess
    import sys

    scripts = sorted((REPO / "benchmarks").glob("*.py"))
    assert len(scripts) >= 10
    for script in scripts:
        proc = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
        )
        assert (
            proc.returncode == 0 and "usage:" in proc.stdout and "Traceback" not in proc.stderr
        ), script.name


# --- the house's rules over the whole package (issue #42) -------------------------------------

#: Top-level source folders and the import package each is installed as.
PACKAGES = {
    "dlreplay": "dlreplay",
    "capture": "dlreplay.capture",
    "analyze": "dlreplay.analyze",
    "replay": "dlreplay.replay",
}

#: The stages, in the order data flows through the tool. A module may import its own stage and
#: those before it, never one after it. The core (the workload model, the event schema, errors,
#: units) depends on nothing of ours; replay needs only the model; analyze reads the traces of
#: capture and replay (and drives replays to verify a fix); the commands (the CLI and the demo)
#: sit on top and nothing imports them.
STAGES = ("core", "dlreplay.capture", "dlreplay.replay", "dlreplay.analyze", "commands")
COMMANDS = ("dlreplay.cli", "dlreplay.commands", "dlreplay.demo", "dlreplay.__main__")


def _stage(module: str) -> str:
    if module.startswith(COMMANDS):
        return "commands"
    for stage in STAGES[1:4]:
        if module == stage or module.startswith(stage + "."):
            return stage
    return "core"


def _package_modules() -> dict[str, Path]:
    out = {}
    for top, name in PACKAGES.items():
        for f in (REPO / top).rglob("*.py"):
            parts = f.relative_to(REPO / top).with_suffix("").parts
            out[".".join((name, *(p for p in parts if p != "__init__")))] = f
    return out


def _resolved_imports(name: str, f: Path):
    """Yield (line, target module, imported name or None) for every dlreplay import in ``f``,
    relative ones resolved; lazy imports inside functions included."""
    pkg = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("dlreplay"):
                    yield node.lineno, a.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("dlreplay"):
                for a in node.names:
                    yield node.lineno, target, a.name


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def test_no_private_name_crosses_a_module() -> None:
    """A ``_name`` is its module's own: no other module imports it. A private module
    (``pkg/_impl.py``, a C extension) may be imported from its own package only."""
    modules = _package_modules()
    bad = []
    for name, f in modules.items():
        for line, target, imported in _resolved_imports(name, f):
            where = f"{f.relative_to(REPO)}:{line}"
            parts = target.split(".")
            for i, part in enumerate(parts):
                owner = ".".join(parts[:i])
                if _private(part) and not (name == owner or name.startswith(owner + ".")):
                    bad.append(f"{where} imports the private module {target}")
            if imported and _private(imported) and target != name:
                full = f"{target}.{imported}"
                if full in modules or full.rsplit(".", 1)[1] in ("_pfwscan", "_kernels"):
                    if not (name == target or name.startswith(target + ".")):
                        bad.append(f"{where} imports the private module {full}")
                else:
                    bad.append(
                        f"{where} imports {target}.{imported}, a private name of another module"
                    )
    assert bad == [], "\n".join(bad)


def test_imports_point_one_way_through_the_stages() -> None:
    """core <- capture <- replay <- analyze <- commands: no module imports a later stage."""
    rank = {s: i for i, s in enumerate(STAGES)}
    bad = []
    for name, f in _package_modules().items():
        for line, target, _ in _resolved_imports(name, f):
            if rank[_stage(target)] > rank[_stage(name)]:
                bad.append(
                    f"{f.relative_to(REPO)}:{line}: {name} ({_stage(name)}) imports "
                    f"{target} ({_stage(target)})"
                )
    assert bad == [], "\n".join(bad)


def _function_sizes():
    """(lines, cyclomatic complexity, where, docstring) of every function in the package."""
    branches = (
        ast.If,
        ast.For,
        ast.AsyncFor,
        ast.While,
        ast.IfExp,
        ast.ExceptHandler,
        ast.With,
        ast.AsyncWith,
        ast.Assert,
        ast.comprehension,
        ast.match_case,
    )
    for f in _package_modules().values():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                cc = 1
                for sub in ast.walk(node):
                    if isinstance(sub, branches):
                        cc += 1
                    elif isinstance(sub, ast.BoolOp):
                        cc += len(sub.values) - 1
                yield (
                    node.end_lineno - node.lineno + 1,
                    cc,
                    f"{f.relative_to(REPO)}:{node.lineno} {node.name}",
                    ast.get_docstring(node) or "",
                )


def test_functions_are_short_or_say_why() -> None:
    """No function over 80 lines or a cyclomatic complexity over 25, unless its docstring says
    why it is one piece (a line starting ``One piece:``)."""
    bad = [
        f"{where}: {lines} lines, complexity {cc}"
        for lines, cc, where, doc in _function_sizes()
        if (lines > 80 or cc > 25) and "One piece:" not in doc
    ]
    assert bad == [], "\n".join(bad)


def test_modules_stay_small() -> None:
    """No module of the package over 800 lines (the C scanner is not Python and not counted)."""
    big = {
        str(f.relative_to(REPO)): n
        for f in _package_modules().values()
        if (n := len(f.read_text().splitlines())) > 800
    }
    assert big == {}


def test_importing_dlreplay_changes_no_environment() -> None:
    """Importing the package and its stages sets no environment variable (they are set where
    the work that needs them starts)."""
    import subprocess
    import sys

    # polars sets its own allocator variable when it is first imported: import the libraries
    # first, so that only what dlreplay itself does is seen.
    code = (
        "import os, numpy, polars; before = dict(os.environ); "
        "import dlreplay, dlreplay.capture, dlreplay.replay, "
        "dlreplay.analyze, dlreplay.cli; after = dict(os.environ); "
        "print(sorted(set(before.items()) ^ set(after.items())))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
