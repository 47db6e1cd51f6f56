"""Dask-distributed loading gives the same event table as the single-process path."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from dlreplay.analyze import load_trace
from dlreplay.analyze.distributed import (
    CONNECT_TIMEOUT_S,
    cluster,
    connect_timeout,
    load_trace_distributed,
)
from dlreplay.errors import UsageError

from .conftest import TRACES


@pytest.fixture(scope="module")
def client():
    with cluster(workers=2) as c:
        yield c


@pytest.mark.parametrize(
    "name", ["npz_fork", "jpeg_small", "h5_tiny_chunks", "dlio_npz_2ranks", "ai_annotated"]
)
def test_same_table_as_single_process(client, name: str) -> None:
    """Our captures, DLIO's 2-rank trace (its rank-numbered pids split as the whole run
    splits them) and a trace annotated in DFTracer's AI conventions."""
    single = load_trace(TRACES / name)
    dist, info = load_trace_distributed(TRACES / name, client)
    assert info.workers == 2 and info.tasks >= 1
    assert_frame_equal(dist.events, single.events)
    assert dist.files == single.files and dist.manifest == single.manifest


def test_damaged_trace_same_salvage_counts(client, tmp_path: Path) -> None:
    dst = tmp_path / "npz_fork"
    shutil.copytree(TRACES / "npz_fork", dst)
    biggest = max(dst.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    raw = biggest.read_bytes()
    biggest.write_bytes(raw[: len(raw) // 2])
    (dst / "trace-empty.pfw.gz").write_bytes(b"")
    single = load_trace(dst)
    dist, _ = load_trace_distributed(dst, client)
    assert single.damaged and (dist.dropped_lines, dist.dropped_bytes) == (
        single.dropped_lines,
        single.dropped_bytes,
    )
    assert_frame_equal(dist.events, single.events)


def test_cli_workers_matches_single(cli) -> None:
    a = json.loads(cli("analyze", str(TRACES / "npz_fork"), "--json", check=True).stdout)
    b = json.loads(
        cli("analyze", str(TRACES / "npz_fork"), "--json", "--workers", "2", check=True).stdout
    )
    for key in ("events", "bytes_read", "dataset_bytes_read", "operations", "read_histogram"):
        assert a[key] == b[key], key
    assert [f["id"] for f in a["findings"]] == [f["id"] for f in b["findings"]]


def test_bad_scheduler_is_a_clear_error(cli, monkeypatch) -> None:
    # Dask's own connect timeout, which --scheduler honours where it is set: 1 s instead of 10
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "1s")
    t0 = time.monotonic()
    proc = cli("analyze", str(TRACES / "npz_fork"), "--scheduler", "tcp://127.0.0.1:1")
    assert proc.returncode == 2 and "cannot reach the Dask scheduler" in proc.stderr
    assert "after 1 s" in proc.stderr, proc.stderr  # the setting was used
    assert "Traceback" not in proc.stderr
    print(f"refused scheduler: exit 2 after {time.monotonic() - t0:.1f} s")
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "soon")
    proc = cli("analyze", str(TRACES / "npz_fork"), "--scheduler", "tcp://127.0.0.1:1")
    assert (
        proc.returncode == 2
        and "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT='soon' is not a duration" in proc.stderr
    )
    monkeypatch.delenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT")
    assert connect_timeout() == CONNECT_TIMEOUT_S
    with pytest.raises(UsageError):
        with cluster("tcp://127.0.0.1:1", 2):
            pass


def test_a_dask_setting_it_cannot_parse_is_named(cli, monkeypatch) -> None:
    """A DASK_* variable Dask cannot parse stopped its local cluster's start with a
    traceback ("RuntimeError: Cluster failed to start", or a KeyError for a comm timeout,
    which Dask reports after ~10 s): now exit 2 naming it."""
    var = "DASK_DISTRIBUTED__SCHEDULER__IDLE_TIMEOUT"
    monkeypatch.setenv(var, "soon")
    proc = cli("analyze", str(TRACES / "npz_fork"), "--workers", "2")
    assert proc.returncode == 2, proc.stderr
    assert (
        "cannot start a local Dask cluster: Invalid time unit: soon" in proc.stderr
        and var in proc.stderr
    )
    assert (
        proc.stderr.count("\n") == 1 and "Valid units" not in proc.stderr
    )  # one line, not Dask's list


def _multi_member(tmp_path: Path, members: int) -> Path:
    """npz_fork with its biggest file rewritten as ``members`` gzip members (whole lines each)."""
    import gzip

    d = tmp_path / f"mm{members}"
    shutil.copytree(TRACES / "npz_fork", d)
    big = max(d.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    lines = gzip.decompress(big.read_bytes()).splitlines(keepends=True)
    per = -(-len(lines) // members)
    big.write_bytes(
        b"".join(
            gzip.compress(b"".join(lines[i : i + per]), mtime=0) for i in range(0, len(lines), per)
        )
    )
    return d


def test_large_file_split_by_gzip_member(client, tmp_path: Path) -> None:
    from dlreplay.analyze.trace.load import member_ranges

    d = _multi_member(tmp_path, 12)
    big = max(d.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    ranges = member_ranges(big, 1)
    assert ranges is not None and len(ranges) == 12 and ranges[-1][1] == big.stat().st_size
    assert all(
        a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)
    )  # contiguous, whole members
    single = load_trace(d)
    dist, info = load_trace_distributed(d, client, split_bytes=1, range_bytes=1)
    assert info.tasks >= 12
    assert_frame_equal(dist.events, single.events)
    assert dist.files == single.files  # the ranges' reports add up to the file's


def test_damaged_large_file_is_parsed_whole(client, tmp_path: Path) -> None:
    from dlreplay.analyze.trace.load import member_ranges

    d = _multi_member(tmp_path, 6)
    big = max(d.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    raw = big.read_bytes()
    big.write_bytes(raw[: len(raw) * 2 // 3])
    ranges = member_ranges(big, 1)
    assert ranges is not None and len(ranges) > 1  # cut, then parsed whole once the damage shows
    single = load_trace(d)
    dist, _ = load_trace_distributed(d, client, split_bytes=1, range_bytes=1)
    assert single.damaged and dist.files == single.files
    assert_frame_equal(dist.events, single.events)


# --- passes, rules and figures on a worker (analyze --workers/--scheduler) ---------------


@pytest.mark.parametrize("name", ["npz_starved", "h5_tiny_chunks"])
def test_passes_on_a_worker_equal_single_process(client, name: str) -> None:
    from dlreplay.analyze.distributed import RemoteView, analyze_distributed
    from dlreplay.analyze.findings import find
    from dlreplay.analyze.passes import characterize
    from dlreplay.analyze.report import figures

    single = load_trace(TRACES / name)
    c = characterize(single.events, manifest=single.manifest)
    expected = find(c)
    remote = analyze_distributed(TRACES / name, client, figures=True, distill_model=True)
    # the table never came back: the client holds only the results
    assert isinstance(remote.characterization.view, RemoteView)
    assert remote.loaded.events.height == 0
    assert json.dumps(remote.characterization.to_dict(), sort_keys=True, default=str) == json.dumps(
        c.to_dict(), sort_keys=True, default=str
    )
    assert [f.to_dict() for f in remote.findings] == [f.to_dict() for f in expected]
    assert remote.files == single.files and remote.manifest == single.manifest
    assert remote.characterization.view.summary == c.view.summary
    # figures rendered on the worker: same keys, and the ones with data are real PNGs
    here, there = figures(c), figures(remote.characterization)
    assert here.keys() == there.keys()
    for key, (title, png) in there.items():
        assert title == here[key][0] and (png is None) == (here[key][1] is None), key
        assert png is None or png.startswith(b"\x89PNG"), key
    # the model for --verify was distilled where the table is
    from dlreplay.analyze.distill import distill
    from dlreplay.model import model_to_dict

    assert remote.model is not None
    local = distill(single.events, manifest=single.manifest, source="the trace")
    there_m, here_m = model_to_dict(remote.model), model_to_dict(local)
    (
        there_m["provenance"].pop("created"),
        here_m["provenance"].pop("created"),
    )  # wall-clock time of distilling
    assert there_m == here_m


def test_remote_without_figures_refuses_a_report(client, tmp_path: Path) -> None:
    from dlreplay.analyze.distributed import analyze_distributed
    from dlreplay.analyze.report import figures

    remote = analyze_distributed(TRACES / "npz_fork", client, figures=False)
    with pytest.raises(UsageError, match="without figures"):
        figures(remote.characterization)


def test_cli_workers_report_has_the_figures(cli, tmp_path: Path) -> None:
    a, b = tmp_path / "single.html", tmp_path / "dask.html"
    cli("analyze", str(TRACES / "npz_fork"), "--report", str(a), check=True)
    proc = cli(
        "analyze", str(TRACES / "npz_fork"), "--report", str(b), "--workers", "2", check=True
    )
    assert "stays on the cluster" in proc.stderr
    ha, hb = a.read_text(), b.read_text()
    assert hb.count("data:image/png;base64,") == ha.count("data:image/png;base64,") >= 4


def test_a_closed_local_cluster_leaves_this_process_logging_as_it_was() -> None:
    """The cluster's shutdown is logged quietly (its races log tracebacks that would end a
    clean run's output) and the levels of the loggers silenced for it come back after; a
    second cluster at the same time does not clash with the first."""
    import logging
    import warnings

    for name in ("asyncio", "tornado"):
        logging.getLogger(name).setLevel(logging.INFO)
    # two analyses at once on one machine: no port clash ("Port 8787 is already in use")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cluster(workers=1) as a, cluster(workers=1) as b:
            assert a.submit(sum, [1, 2]).result() == b.submit(sum, [3]).result() == 3
    assert [logging.getLogger(n).level for n in ("asyncio", "tornado")] == [logging.INFO] * 2
