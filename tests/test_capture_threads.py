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
