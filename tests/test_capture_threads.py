"""Capture is transparent at a process's end (issue 43, item 1): a multiprocessing child whose
other threads still read traced files when its target returns ends as it does without capture,
and the trace keeps every thread's events.

dlreplay's hooks finalize DFTracer at the end of every multiprocessing child (forked ones leave
through ``os._exit``, which would drop the events DFTracer buffered). DFTracer frees its buffers
there while another thread may be logging a call on a traced file. Before the hooks kept the
other threads out of it, such children died of SIGSEGV under capture: 296 of 300 forked and 54
of 100 spawned ones with this job's reader, 7 of 24 spawned ones in this test. It is the one
way found for the SIGSEGV of a spawned DataLoader worker in a traced replay in CI (2 runs in
about 8; no core was kept there)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import load_trace

from .conftest import run_cli, run_plain

JOB = r'''
import multiprocessing as mp, os, sys, threading, time

DATA = sys.argv[3]


def reader(stop):
    """A reader thread: a little work in Python, then a traced file's open, read, close."""
    path = os.path.join(DATA, "shard.bin")
    while not stop.is_set():
        sum(range(3000))
        with open(path, "rb") as f:
            f.read(64)


def child(k):
    stop = threading.Event()
    threading.Thread(target=reader, args=(stop,), daemon=True).start()
    with open(os.path.join(DATA, f"own-{k}.bin"), "wb") as f:  # the child's own traced write
        f.write(b"x" * 100)
    time.sleep(0.02)
    # the target returns with the reader still running: the child's end finalizes DFTracer


def main():
    ctx = mp.get_context(sys.argv[1])
    codes = []
    for k in range(int(sys.argv[2])):
        p = ctx.Process(target=child, args=(k,))
        p.start()
        p.join()
        codes.append(p.exitcode)
    print("exit codes", codes)


if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_child_ends_while_its_threads_read_traced_files(tmp_path: Path, context: str) -> None:
    children = 16
    (tmp_path / "job.py").write_text(JOB)
    runs = {}
    for run in ("plain", "captured"):
        data = tmp_path / run / "data"
        data.mkdir(parents=True)
        (data / "shard.bin").write_bytes(bytes(4096))
        runs[run] = data
    plain = run_plain(
        "job.py", context, str(children), str(runs["plain"]), cwd=tmp_path, timeout=300
    )
    out = tmp_path / "trace"
    captured = run_cli(
        "capture",
        "-q",
        "--data-dir",
        str(runs["captured"]),
        "--out",
        str(out),
        "--",
        sys.executable,
        "job.py",
        context,
        str(children),
        str(runs["captured"]),
        cwd=tmp_path,
        timeout=300,
    )
    assert plain.returncode == captured.returncode == 0, captured.stderr
    assert plain.stdout == captured.stdout == f"exit codes {[0] * children}\n", captured.stdout
    # every child's trace was written: its own write and its reader thread's reads, each from
    # its own thread
    ev = load_trace(out).events.filter(
        (pl.col("cat") == "POSIX") & pl.col("name").is_in(["write", "read"])
    )
    kinds = ev.with_columns(
        own=pl.col("file").cast(pl.String).str.contains(r"/own-\d+\.bin$"),
        reader=pl.col("file").cast(pl.String).str.ends_with("/shard.bin"),
    )
    per_pid = (
        kinds.group_by("pid")
        .agg(
            own=pl.col("tid").filter(pl.col("own")).unique(),
            reader=pl.col("tid").filter(pl.col("reader")).unique(),
        )
        .filter(pl.col("own").list.len() > 0)
    )
    assert per_pid.height == children, per_pid
    for row in per_pid.iter_rows(named=True):
        assert row["reader"], row  # the reader thread's events, flushed at the child's end
        assert not set(row["own"]) & set(row["reader"]), row  # from another thread


SIGNAL_JOB = r"""
import ctypes, os, signal, sys
from dlreplay.capture.inject import hooks

how = sys.argv[1]
libc = ctypes.CDLL(None)


def disposition():
    buf = ctypes.create_string_buffer(512)
    assert libc.sigaction(signal.SIGTERM, None, buf) == 0
    raw = buf.raw  # glibc's struct sigaction on Linux: the handler, the kernel's part of the
    return raw[:16] + raw[136:140] + raw[144:152]  # mask, the flags, the restorer


def python_handler(signum, frame):
    print("python handler ran", flush=True)
    sys.exit(7)


if how == "torch":  # a DataLoader worker's: PyTorch's SIGTERM handler, in C
    from torch.utils.data._utils import signal_handling
    signal_handling._set_worker_signal_handlers()
elif how == "python":
    signal.signal(signal.SIGTERM, python_handler)
elif how == "ignored":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
before, table = disposition(), signal.getsignal(signal.SIGTERM)
with hooks._signals_held(True):
    os.kill(os.getpid(), signal.SIGTERM)  # arrives while DFTracer would be finalized
    print("alive after the signal", flush=True)
print("after the hold", flush=True)  # only where nothing ends the process at the hold's end
assert disposition() == before and signal.getsignal(signal.SIGTERM) is table
"""


@pytest.mark.parametrize(
    ("how", "code", "lines"),
    [
        ("torch", -15, ["alive after the signal"]),
        ("default", -15, ["alive after the signal"]),
        ("python", 7, ["alive after the signal", "python handler ran"]),
        ("ignored", 0, ["alive after the signal", "after the hold"]),
    ],
)
def test_a_signal_at_a_childs_end_waits_for_the_trace(
    tmp_path: Path, how: str, code: int, lines: list[str]
) -> None:
    """A signal that ends the process, arriving while a child's end finalizes DFTracer, is held
    until it has (then delivered to the handler it had, which the kernel holds byte for byte as
    before): PyTorch's worker handler calls ``_exit``, which DFTracer intercepts to finalize again
    inside the finalization under way, and the worker aborted ("Resource deadlock avoided") in
    about one in five Ctrl-C'd traced replays (3 of 20 before, 0 of 25 after, by hand). The
    crash itself needs the signal inside DFTracer's call, which no test can time; this checks the
    hold."""
    (tmp_path / "job.py").write_text(SIGNAL_JOB)
    run = run_plain("job.py", how, cwd=tmp_path, timeout=120)
    assert run.returncode == code, run.stderr
    assert run.stdout.splitlines() == lines, run.stderr
