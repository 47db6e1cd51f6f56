"""Shared fixtures. Tests write only under tmp_path and leave no tracer env behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def run_cli(*args: str, cwd: Path | None = None, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (``python -m dlreplay``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dlreplay", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dlreplay {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def cli():
    return run_cli
