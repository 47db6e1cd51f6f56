"""Bounded-memory analysis (``analyze --memory-limit``): the spilled path gives the same
table, characterisation and findings as the in-memory path, with a lower peak RSS, and
leaves no spill directory behind (success, error, Ctrl-C)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from dlreplay import JEMALLOC_ENV
from dlreplay.analyze import load_trace
from dlreplay.analyze.analysis import analyze_trace
from dlreplay.analyze.passes import TraceView, characterize
from dlreplay.analyze.trace.load import trace_warnings
from dlreplay.analyze.trace.spill import plan_memory, spilled_trace
from dlreplay.units import parse_bytes

from .conftest import REPO, TRACES, check_no_traceback, run_cli

#: every trace of the corpus: our captures (with a manifest) and the foreign ones (DLIO's, an
#: annotated job's), whose rank-numbered pids the spill must split as the whole run does
CORPUS = sorted(p for p in TRACES.iterdir() if p.is_dir() and any(p.glob("*.pfw*")))


def _json(x):
    """A JSON round trip (tuples become lists, keys strings): how --json output compares."""
    return json.loads(json.dumps(x, default=str))


def _spills(d: Path) -> list[Path]:
    return sorted(d.glob("dlreplay-spill-*")) if d.exists() else []


def test_parse_bytes():
    assert parse_bytes("2GiB") == 2 << 30
    assert parse_bytes("500MB") == 500_000_000
    assert parse_bytes("1.5G") == 1_500_000_000
    assert parse_bytes("64 kib") == 64 << 10
    assert parse_bytes("4096") == 4096
    for bad in ("", "abc", "5 parsecs", "-1GB", "0"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


@pytest.mark.parametrize("trace", CORPUS, ids=lambda p: p.name)
def test_spilled_table_equals_loaded_table(trace, tmp_path):
    """Combining each trace file alone (with the whole run's metadata) gives the whole-trace table."""
    loaded = load_trace(trace)
    for group in (1, 1 << 30):  # every file its own group; one group
        with spilled_trace(trace, group_stored_bytes=group, spill_dir=tmp_path) as sp:
            assert sp.groups == (len(loaded.files) if group == 1 else 1)
            assert_frame_equal(sp.collect(), loaded.events)
            # the view's subsets: scan order + a stable sort by ts is the table's order
            assert_frame_equal(TraceView(sp.events).rows(pl.lit(True)), loaded.events)
            assert sp.files == loaded.files
            assert sp.height == loaded.events.height
            # the per-process table made from the parts' counts, as in memory (None alike where
            # the vocabulary changed processes or roles)
            assert (sp.per_process is None) == (loaded.per_process is None)
            if sp.per_process is not None:
                assert_frame_equal(sp.per_process, loaded.per_process, check_row_order=False)
    assert _spills(tmp_path) == []


def _write(path: Path, lines: list[dict]) -> None:
    with gzip.open(path, "wt") as fh:
        for line in lines:
            fh.write(json.dumps(line, separators=(",", ":")) + "\n")


def _meta(pid: int, name: str, a_name: str, value: str) -> dict:
    return {
        "name": name,
        "cat": "dftracer",
        "type": 1,
        "pid": pid,
        "tid": pid,
        "ph": 4,
        "args": {"hhash": "aa", "name": a_name, "value": value},
    }


def _ev(pid: int, i: int, name: str, cat: str, ts: int, **args) -> dict:
    return {
        "id": i,
        "name": name,
        "cat": cat,
        "type": 3,
        "pid": pid,
        "tid": pid,
        "ts": ts,
        "dur": 5,
        "ph": 1,
        "args": {"hhash": "aa", **args},
    }


def test_relative_fh_name_written_by_a_process_in_another_group(tmp_path):
    """An FH record with a relative name, written by process A (file 0) and used by
    process B (file 1): the name is resolved with A's working directory whether or not
    A's file is combined together with B's."""
    trace = tmp_path / "trace"
    trace.mkdir()
    a, b = 100, 200
    _write(
        trace / "a.pfw.gz",
        [
            _meta(a, "HH", "nodeA", "aa"),
            _meta(a, "CM", "time_metric", "US"),
            _meta(a, "FH", "/home/u/run/", "c1"),
            _meta(a, "FH", "data/x.bin", "f1"),
            _ev(a, 1, "start", "dftracer", 1000, ppid=1, cwd="c1"),
            _ev(a, 2, "open64", "POSIX", 1010, fhash="f1", ret=3, flags=0),
            _ev(a, 3, "read", "POSIX", 1020, fhash="f1", ret=100, count=100),
        ],
    )
    _write(
        trace / "b.pfw.gz",
        [
            _meta(b, "HH", "nodeA", "aa"),
            _meta(b, "FH", "/srv/b", "c2"),
            _ev(b, 1, "start", "dftracer", 1001, ppid=a, cwd="c2"),
            _ev(b, 2, "open64", "POSIX", 1011, fhash="f1", ret=3, flags=0),
            _ev(b, 3, "read", "POSIX", 1021, fhash="f1", ret=50, count=50),
            _ev(b, 4, "read", "POSIX", 1031, fhash="f1", ret=50, count=50),
        ],
    )
    loaded = load_trace(trace)
    reads = loaded.events.filter(loaded.events["name"] == "read")
    assert reads["file"].to_list() == ["/home/u/run/data/x.bin"] * 3
    assert reads["offset"].to_list() == [0, 0, 50]
    with spilled_trace(trace, group_stored_bytes=1) as sp:
        assert sp.groups == 2
        assert_frame_equal(sp.collect(), loaded.events)


@pytest.mark.parametrize("trace", CORPUS, ids=lambda p: p.name)
def test_spilled_analysis_equals_in_memory_analysis(trace, tmp_path):
    """The corpus through the spilled path (1 byte limit: every file its own group):
    the same characterisation (JSON) and findings as in memory; the path is named."""
    eager = analyze_trace(trace)
    figs = trace.name == "npz_checkpoint"  # drawing is slow: one trace checks it
    spilled = analyze_trace(trace, memory_limit=1, spill_dir=tmp_path, figures=figs)
    assert _json(spilled.characterization.to_dict()) == _json(eager.characterization.to_dict())
    assert _json([f.to_dict() for f in spilled.findings]) == _json(
        [f.to_dict() for f in eager.findings]
    )
    assert any("does not fit, spilling to Parquet" in n for n in spilled.notes)
    assert (
        spilled.characterization.figures is not None
    ) == figs  # drawn before the spill went away
    assert _spills(tmp_path) == []


def test_fitting_trace_stays_in_memory(tmp_path):
    trace = TRACES / "npz_fork"
    plan = plan_memory(trace, 8 << 30)
    assert not plan.spill and plan.events > 0
    # the estimate is of the right size: the sampled lines include metadata records
    assert load_trace(trace).events.height <= plan.events <= 2 * load_trace(trace).events.height
    r = run_cli(
        "analyze", str(trace), "--memory-limit", "8GiB", "--spill-dir", str(tmp_path / "sp")
    )
    assert r.returncode == 0, r.stderr
    assert "fits, analysing in memory" in r.stderr
    assert _spills(tmp_path / "sp") == []


def test_the_estimate_inflates_a_bounded_sample_of_a_gzip_bomb(tmp_path, monkeypatch):
    """A megabyte of deflated NUL bytes inflates to a gigabyte: the estimate's sample of a
    file is inflated a piece at a time, at most _SAMPLE_DECODED in all (built in here
    small, 4 MiB, with a 48 MiB bomb: the code before held all 48 MiB at once)."""
    import tracemalloc
    import zlib

    from dlreplay.analyze.trace import spill

    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    bomb = b"".join(comp.compress(zeros) for _ in range(48)) + comp.flush()
    assert len(bomb) < spill._SAMPLE_BYTES  # the whole bomb is in the sample
    trace = tmp_path / "bomb"
    trace.mkdir()
    (trace / "t.pfw.gz").write_bytes(bomb)
    monkeypatch.setattr(spill, "_SAMPLE_PIECE", 1 << 20)
    monkeypatch.setattr(spill, "_SAMPLE_DECODED", 4 << 20)
    tracemalloc.start()
    try:
        lines, used = spill._lines_per_byte(trace / "t.pfw.gz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines == 0 and 0 < used < len(bomb)  # stopped inside the member, at the budget
    assert peak < 12 << 20, peak
    plan = plan_memory(trace, 1 << 30)
    assert plan.events == 0 and not plan.spill
    # a real file's estimate is the same as inflating its whole sample
    real = next((TRACES / "npz_fork").glob("*.pfw.gz"))
    monkeypatch.setattr(spill, "_SAMPLE_DECODED", 1 << 40)
    whole = spill._lines_per_byte(real)
    monkeypatch.setattr(spill, "_SAMPLE_PIECE", 4096)
    assert spill._lines_per_byte(real) == whole and whole[0] > 0


def test_memory_limit_cli_errors(tmp_path):
    trace = str(TRACES / "npz_fork")
    r = run_cli("analyze", trace, "--memory-limit", "lots")
    assert r.returncode == 2 and "--memory-limit" in r.stderr and "not a size" in r.stderr
    r = run_cli("analyze", trace, "--memory-limit", "1MB", "--verify", "--spill-dir", str(tmp_path))
    assert r.returncode == 2 and "--verify" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("analyze", trace, "--memory-limit", "1MB", "--workers", "2")
    assert r.returncode == 2 and "cannot be combined" in r.stderr
    assert _spills(tmp_path) == []


def test_spill_dir_removed_after_success_and_after_an_error(tmp_path):
    trace = TRACES / "h5_tiny_chunks"
    with spilled_trace(trace, group_stored_bytes=1, spill_dir=tmp_path) as sp:
        (d,) = _spills(tmp_path)
        assert sp.directory == d and len(list(d.glob("events-*.parquet"))) == sp.groups
        characterize(sp.events, manifest=sp.manifest)
    assert _spills(tmp_path) == []
    with pytest.raises(RuntimeError, match="a pass failed"):
        with spilled_trace(trace, group_stored_bytes=1, spill_dir=tmp_path) as sp:
            assert _spills(tmp_path)
            raise RuntimeError("a pass failed")
    assert _spills(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------
# A multi-file synthetic trace whose in-memory analysis takes about a gigabyte


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from ingest import build
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("big") / "trace"
    build(out, 1_000_000, workers=16)
    return out


def _measured(*args: str) -> tuple[dict, int, float]:
    """(--json output, peak RSS in bytes, wall s) of ``dlreplay analyze ... --json`` in a child
    (the memory benchmark's child script: the real CLI, printing its own peak RSS)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from memory import CHILD
    finally:
        sys.path.pop(0)
    # Peak RSS of live memory: jemalloc returns freed pages at once (dlreplay's own 10 s decay
    # keeps them for a time that depends on the machine's speed and load), and two jobs
    # whatever the cores, so the bound holds on any machine.
    env = {**os.environ, JEMALLOC_ENV: "dirty_decay_ms:0,muzzy_decay_ms:0"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "analyze", *args, "--jobs", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"RSS_KB=(\d+) WALL=([\d.]+)", proc.stderr)
    assert m, proc.stderr[-2000:]
    return json.loads(proc.stdout), int(m.group(1)) * 1024, float(m.group(2))


def test_memory_limit_lowers_peak_rss_with_identical_results(big_trace, tmp_path):
    from dlreplay.analyze.trace.spill import BASE_BYTES, DATASET_IO_BYTES, ROW_BYTES

    eager, rss_eager, _ = _measured(str(big_trace))
    table = eager["events"] * ROW_BYTES  # bytes of this trace's compact table
    limit = table // 2  # below the table itself
    spilled, rss_spilled, _ = _measured(
        str(big_trace), "--memory-limit", str(limit), "--spill-dir", str(tmp_path)
    )
    assert eager["events"] > 900_000 and spilled["events"] == eager["events"]
    assert any("does not fit, spilling" in n for n in spilled["notes"])
    # what --memory-limit promises: the interpreter and its libraries, the groups sized from
    # the limit, and the passes' narrow dataset I/O rows (at most one per event); the
    # in-memory path (~430 bytes per event at its peak, the compact table ~110) is above it
    assert rss_spilled <= BASE_BYTES + limit + eager["events"] * DATASET_IO_BYTES, (
        rss_spilled,
        limit,
    )
    assert rss_spilled < rss_eager, (rss_spilled, rss_eager)
    for key in (
        "events",
        "bytes_read",
        "bytes_written",
        "operations",
        "dataset_bytes_read",
        "read_histogram",
    ):
        assert spilled[key] == eager[key], key
    assert [f["id"] for f in spilled["findings"]] == [f["id"] for f in eager["findings"]]
    assert spilled["characterization"] == eager["characterization"]
    assert spilled["files"] == eager["files"]
    assert _spills(tmp_path) == []


def _signal_while_spilling(trace: Path, spill_dir: Path, signum: int) -> tuple[int, str]:
    """Start a spilling ``analyze``, send ``signum`` once a Parquet file exists: (exit code, stderr)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlreplay",
            "analyze",
            str(trace),
            "--memory-limit",
            "1MB",
            "--spill-dir",
            str(spill_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(d.glob("*.parquet") for d in _spills(spill_dir)):
            assert proc.poll() is None and time.monotonic() < deadline, "no spill appeared"
            time.sleep(0.05)
        os.kill(proc.pid, signum)
        _out, err = proc.communicate(timeout=120)
        check_no_traceback(_out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_ctrl_c_while_spilling_removes_the_spill(big_trace, tmp_path):
    code, err = _signal_while_spilling(big_trace, tmp_path, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err
    assert _spills(tmp_path) == []


def test_sigterm_while_spilling_removes_the_spill(big_trace, tmp_path):
    code, _err = _signal_while_spilling(big_trace, tmp_path, signal.SIGTERM)
    assert code == 143
    assert _spills(tmp_path) == []


def test_damaged_and_empty_files_through_the_spill(tmp_path):
    """Salvage is per file: a truncated file and an empty one give the same table,
    reports and damage summary through the spilled path."""
    import shutil

    trace = tmp_path / "trace"
    shutil.copytree(TRACES / "npz_fork", trace)
    victim = sorted(trace.glob("*.pfw.gz"))[1]
    data = victim.read_bytes()
    victim.write_bytes(data[: int(len(data) * 0.45)])
    (trace / "trace-empty.pfw.gz").write_bytes(b"")
    loaded = load_trace(trace)
    assert loaded.damaged
    with spilled_trace(trace, group_stored_bytes=1, spill_dir=tmp_path / "sp") as sp:
        assert_frame_equal(sp.collect(), loaded.events)
        assert sp.files == loaded.files
        assert sp.describe_damage() == loaded.describe_damage()
    eager = analyze_trace(trace)
    spilled = analyze_trace(trace, memory_limit=1, spill_dir=tmp_path / "sp")
    assert spilled.damage == eager.damage and spilled.damage
    assert (spilled.dropped_lines, spilled.dropped_bytes) == (
        eager.dropped_lines,
        eager.dropped_bytes,
    )
    assert _json(spilled.characterization.to_dict()) == _json(eager.characterization.to_dict())
    assert _spills(tmp_path / "sp") == []


@pytest.mark.parametrize("nodes", [1, 2])
def test_rank_numbered_files_split_as_the_whole_run(tmp_path, nodes):
    """DLIO's rank-numbered pids (pydftracer 1.x writes the rank as pid; its forked readers
    write into the rank's file): each rank's file in its own spill group gives the table of
    the whole run. Only rank 0's file has pid 0, which marks the run as rank-numbered; the
    two ranks' readers share a thread id, on one node or on two (thread ids are per node),
    so they get new ids above every id of the run (one of them in the other file)."""
    trace = tmp_path / "trace"
    trace.mkdir()

    def ev(rank: int, tid: int, i: int, ts: int, name: str = "read") -> dict:
        return {
            "id": i,
            "name": name,
            "cat": "POSIX",
            "pid": rank,
            "tid": tid,
            "ts": ts,
            "dur": 5,
            "args": {"hhash": hh, "fhash": "f1", "ret": 10, "count": 10},
        }

    for rank, main in ((0, 4100), (1, 9100)):
        hh, node = ("bb", "nodeB") if nodes == 2 and rank else ("aa", "nodeA")
        _write(
            trace / f"trace-{rank}-of-2.pfw.gz",
            [
                {
                    **_meta(rank, "HH", node, hh),
                    "tid": main,
                    "args": {"hhash": hh, "name": node, "value": hh},
                },
                {
                    **_meta(rank, "FH", "/data/x.bin", "f1"),
                    "tid": main,
                    "args": {"hhash": hh, "name": "/data/x.bin", "value": "f1"},
                },
                ev(rank, main, 1, 1000 + rank, "open64"),
                ev(rank, main, 2, 1010 + rank),
                ev(rank, 7777, 3, 1020 + rank),
                ev(rank, 7777, 4, 1030 + rank),
            ],
        )
    loaded = load_trace(trace)
    pids = loaded.events.group_by("pid").agg(pl.col("ppid").first()).sort("pid").rows()
    assert pids == [
        (4100, None),
        (9100, None),
        (9101, 4100),
        (9102, 9100),
    ]  # the readers: above tid 9100
    with spilled_trace(trace, group_stored_bytes=1, spill_dir=tmp_path) as sp:
        assert sp.groups == 2
        assert_frame_equal(sp.collect(), loaded.events)


def test_one_pid_on_two_hosts_is_two_processes(tmp_path):
    """Two nodes' processes with one pid (pid_max is often 32768: likely across many nodes)
    stay two processes: the host whose file comes first keeps the pid, the other's gets a
    new id above every id of the run, and its children's ppid follows; in memory and
    spilled file by file alike. Each keeps its own epochs and reads."""
    trace = tmp_path / "trace"
    trace.mkdir()

    def ev(pid: int, hh: str, i: int, name: str, cat: str, ts: int, dur: int = 5, **args) -> dict:
        return {
            "id": i,
            "name": name,
            "cat": cat,
            "pid": pid,
            "tid": pid,
            "ts": ts,
            "dur": dur,
            "ph": 1,
            "args": {"hhash": hh, **args},
        }

    for node, hh, t0, nbytes in (("nodeA", "aa", 1000, 100), ("nodeB", "bb", 5000, 300)):
        main, worker = 4242, 4343
        _write(
            trace / f"{node}-main.pfw.gz",
            [
                _meta(main, "HH", node, hh) | {"args": {"hhash": hh, "name": node, "value": hh}},
                _meta(main, "FH", f"/data/{node}.bin", "f1")
                | {"args": {"hhash": hh, "name": f"/data/{node}.bin", "value": "f1"}},
                ev(main, hh, 1, "start", "dftracer", t0, ppid=1),
                ev(main, hh, 2, "epoch.block", "pipeline", t0 + 10, 500, epoch=1),
                ev(main, hh, 3, "fetch.block", "dataloader", t0 + 20, 50, epoch=1, step=1),
                ev(main, hh, 4, "forward", "compute", t0 + 80, 100, epoch=1, step=1),
            ],
        )
        _write(
            trace / f"{node}-worker.pfw.gz",
            [
                _meta(worker, "HH", node, hh) | {"args": {"hhash": hh, "name": node, "value": hh}},
                ev(worker, hh, 1, "start", "dftracer", t0 + 1, ppid=main),
                ev(worker, hh, 2, "open64", "POSIX", t0 + 30, fhash="f1", ret=3, flags=0),
                ev(worker, hh, 3, "read", "POSIX", t0 + 40, fhash="f1", ret=nbytes, count=nbytes),
            ],
        )
    loaded = load_trace(trace)
    procs = (
        loaded.events.group_by("host", "pid")
        .agg(pl.col("ppid").drop_nulls().first())
        .sort("host", "pid")
    )
    assert procs.select(pl.col("host").cast(pl.String), "pid", "ppid").rows() == [
        ("nodeA", 4242, 1),
        ("nodeA", 4343, 4242),
        ("nodeB", 4344, 1),
        ("nodeB", 4345, 4344),
    ]
    reads = (
        loaded.events.filter(pl.col("name") == "read")
        .group_by("pid")
        .agg(pl.col("size").sum())
        .sort("pid")
    )
    assert reads.rows() == [(4343, 100), (4345, 300)]
    per = loaded.per_process
    assert per is None or sorted(per.filter(pl.col("rb") > 0).select("pid", "rb").rows()) == [
        (4343, 100),
        (4345, 300),
    ]
    with spilled_trace(trace, group_stored_bytes=1, spill_dir=tmp_path) as sp:
        assert sp.groups == 4
        assert_frame_equal(sp.collect(), loaded.events)
        assert sp.files == loaded.files
    epochs = characterize(loaded.events, passes=["epochs"])["epochs"]["epochs"]
    assert sorted(e["pid"] for e in epochs) == [4242, 4344]
    # said, not silent: in the files' reports and the run's warnings, naming pid, host and new id
    notes = {f.name: f.problems for f in loaded.files}
    assert notes["nodeB-main.pfw.gz"] == [
        "pid 4242 on nodeB is 4344 here: it also ran on another host"
    ]
    assert notes["nodeB-worker.pfw.gz"] == [
        "pid 4343 on nodeB is 4345 here: it also ran on another host"
    ]
    assert notes["nodeA-main.pfw.gz"] == [] and not any(f.damaged for f in loaded.files)
    warned = [w for w in trace_warnings(trace, loaded.files) if "another host" in w]
    assert warned == [
        "2 process(es) numbered anew where a pid also ran on another host, so that no two hosts' "
        "processes mix: pid 4242 on nodeB is 4344 here; pid 4343 on nodeB is 4345 here"
    ]
