"""Bad conditions while generating, replaying and capturing (issue #7, bad-input suite).

Real processes, real signals, real file systems: Ctrl-C (SIGINT to the process group, as
a terminal sends it, or to the one process, as ``kill -INT`` does) during generation and
replay; a full file system (a small tmpfs mounted for the test, else skipped); a
read-only target; a traced command that fails or is killed.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dlreplay.replay.common import JOURNAL_NAME, MANIFEST_NAME

from .conftest import run_cli
from .test_replay import digest_dir, write_model

PY = sys.executable


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Exception ignored" not in text, text


def start_cli(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    """``python -m dlreplay ARGS`` in its own process group (so a "terminal" Ctrl-C reaches all of it)."""
    return subprocess.Popen([PY, "-m", "dlreplay", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = 120.0) -> list[str]:
    """Read the process's stderr until a line contains ``needle``; returns the lines read."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if needle in line:
                return lines
        elif proc.poll() is not None:
            break
    raise AssertionError(f"{needle!r} never printed (exit {proc.poll()}):\n{''.join(lines)}")


def ctrl_c(proc: subprocess.Popen[str], target: str) -> None:
    if target == "group":  # what a terminal's Ctrl-C does
        os.killpg(proc.pid, signal.SIGINT)
    else:  # kill -INT PID: the main process only
        proc.send_signal(signal.SIGINT)


# --------------------------------------------------------------------------- Ctrl-C: replay

LONG = ("dataset.format=raw", "dataset.num_files=8", "dataset.num_samples_per_file=1", "dataset.record_length=4096",
        "reader.batch_size=1", "reader.read_threads=2", "train.epochs=400", "train.computation_time=0.002")


@pytest.mark.parametrize(("accelerators", "target"), [(1, "group"), (1, "pid"), (2, "group"), (2, "pid")])
def test_ctrl_c_during_replay_keeps_partial_metrics(tmp_path: Path, accelerators: int, target: str) -> None:
    """Exit 130, metrics.json with the epochs done and ``complete: false``; no traceback.

    400 epochs of 8 steps, each epoch forking 2 loader workers: Ctrl-C lands while workers
    start or stop as often as not (the case that was once ignored entirely).
    """
    model, data, out = write_model(tmp_path, *LONG), tmp_path / "d", tmp_path / "o"
    run_cli("generate", str(model), "--data-dir", str(data), check=True)
    proc = start_cli("replay", str(model), "--data-dir", str(data), "--out", str(out), "--no-trace",
                     "--accelerators", str(accelerators))
    wait_for_line(proc, "replay started")
    time.sleep(1.0)
    ctrl_c(proc, target)
    stdout, stderr = proc.communicate(timeout=120)
    no_traceback(stderr)
    assert proc.returncode == 130, stderr
    assert "(incomplete)" in stdout and "incomplete run" in stdout
    m = json.loads((out / "metrics.json").read_text())
    assert m["complete"] is False and m["interrupted"] is True and m["errors"] == []
    assert 0 < len(m["epochs"]) < 400 and m["accelerators"] == accelerators
    assert not (out / "checkpoints").exists()


REPLAY_SWALLOWED = """
import os, signal, sys, time, weakref
from pathlib import Path
from dlreplay.model import load_model
from dlreplay.replay import GenerateConfig, ReplayConfig, generate_dataset, run_replay

where, tmp = sys.argv[1], Path(sys.argv[2])
model = load_model(tmp / "model.yaml")
generate_dataset(GenerateConfig(model=model, data_dir=tmp / "d", jobs=1))
calls = {"sleep": 0, "fork": 0}
real_sleep = time.sleep

class Garbage:
    pass

def sleep(seconds):  # compute step 3: Ctrl-C arrives while a finalizer runs (garbage collection)
    calls["sleep"] += 1
    if where == "finalizer" and calls["sleep"] == 3:
        g = Garbage()
        weakref.finalize(g, signal.raise_signal, signal.SIGINT)
        del g  # KeyboardInterrupt is raised inside the finalizer, and Python discards it there
    real_sleep(seconds)

def after_fork():  # epoch 2: Ctrl-C arrives while a loader worker is being forked
    calls["fork"] += 1
    if where == "fork" and calls["fork"] == 3:
        signal.raise_signal(signal.SIGINT)  # raised inside an at-fork callback: discarded too

time.sleep = sleep
os.register_at_fork(after_in_parent=after_fork)
res = run_replay(ReplayConfig(model=model, data_dir=tmp / "d", out=tmp / "o", trace=False))
print(res.complete, len(res.metrics["epochs"]), res.metrics["interrupted"])
"""


@pytest.mark.parametrize("where", ["finalizer", "fork"])
def test_swallowed_keyboard_interrupt_still_stops_the_replay(tmp_path: Path, where: str) -> None:
    """Regression: a KeyboardInterrupt that Python discards (raised inside a finalizer or an
    at-fork callback) used to be lost, and the replay ran every epoch and exited 0."""
    script = tmp_path / "swallow.py"
    script.write_text(REPLAY_SWALLOWED)
    write_model(tmp_path, "dataset.format=raw", "reader.batch_size=1", "reader.read_threads=2", "train.epochs=20",
                "train.computation_time=0.001")
    proc = subprocess.run([PY, str(script), where, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    complete, epochs, interrupted = proc.stdout.split()
    assert (complete, interrupted) == ("False", "True"), proc.stdout
    assert int(epochs) <= 3
    no_traceback(proc.stderr)
