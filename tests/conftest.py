"""Shared fixtures. Tests write only under tmp_path and leave no tracer env behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dlreplay

# The suite runs with the environment the CLI sets up for itself (polars' allocator, one BLAS
# thread), as it did when importing dlreplay set it.
dlreplay.prepare_process()

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
TRACES = REPO / "traces"


@pytest.fixture(autouse=True)
def _no_tracer_leak():
    """Fail a test that leaves DFTracer/LD_PRELOAD variables in this process's env."""
    before = {k: v for k, v in os.environ.items() if k.startswith("DFTRACER_") or k == "LD_PRELOAD"}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("DFTRACER_") or k == "LD_PRELOAD"}
    assert after == before, f"test leaked tracer environment: {set(after) ^ set(before)}"


#: What Python prints when an exception escapes (a traceback naming a source file), when one is
#: discarded, when the site hook fails, or when the interpreter dies. No CLI run may print one.
PYTHON_TRACEBACK = re.compile(
    r'Traceback \(most recent call last\):\n  File "/|Exception ignored in|'
    r"Error in sitecustomize|Fatal Python error"
)
#: How many CLI runs of this test session were checked for Python tracebacks.
CLI_RUNS_CHECKED = [0]


def check_no_traceback(*texts: str, what: str = "") -> None:
    """Fail when the output of a dlreplay command (stdout, stderr) holds a Python traceback."""
    CLI_RUNS_CHECKED[0] += 1
    for text in texts:
        m = PYTHON_TRACEBACK.search(text or "")
        if m:
            raise AssertionError(f"a Python traceback in the output of dlreplay {what}:\n{text}")


def run_cli(
    *args: str, cwd: Path | None = None, check: bool = False, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (``python -m dlreplay``); fails on any Python traceback in its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "dlreplay", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    check_no_traceback(proc.stdout, proc.stderr, what=" ".join(args))
    if check and proc.returncode != 0:
        raise AssertionError(
            f"dlreplay {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def run_plain(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python *args`` in *cwd* without capture (a job's plain run, to hold its capture's
    against); fails on any Python traceback in its output."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    check_no_traceback(proc.stdout, proc.stderr, what="(the job, plain)")
    return proc


def pytest_sessionfinish(session) -> None:
    """An xdist worker hands its count to the controller (``make test`` runs ``-n 2``)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["cli_runs_checked"] = CLI_RUNS_CHECKED[0]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """The controller adds up its workers' counts (an xdist hook: optional without xdist)."""
    CLI_RUNS_CHECKED[0] += int(getattr(node, "workeroutput", {}).get("cli_runs_checked", 0))


def pytest_terminal_summary(terminalreporter) -> None:
    if CLI_RUNS_CHECKED[0]:
        terminalreporter.write_line(
            f"dlreplay CLI runs checked for Python tracebacks: {CLI_RUNS_CHECKED[0]} "
            "(none printed one)"
        )


@pytest.fixture
def cli():
    return run_cli
