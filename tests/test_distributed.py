"""Dask-distributed loading gives the same event table as the single-process path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from dlreplay.analyze import load_trace
from dlreplay.analyze.distributed import cluster, load_trace_distributed
from dlreplay.errors import UsageError

from .conftest import TRACES


@pytest.fixture(scope="module")
def client():
    with cluster(workers=2) as c:
        yield c


@pytest.mark.parametrize("name", ["npz_fork", "jpeg_small", "h5_tiny_chunks"])
def test_same_table_as_single_process(client, name: str) -> None:
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
    assert single.damaged and (dist.dropped_lines, dist.dropped_bytes) == (single.dropped_lines, single.dropped_bytes)
    assert_frame_equal(dist.events, single.events)


def test_cli_workers_matches_single(cli) -> None:
    a = json.loads(cli("analyze", str(TRACES / "npz_fork"), "--json", check=True).stdout)
    b = json.loads(cli("analyze", str(TRACES / "npz_fork"), "--json", "--workers", "2", check=True).stdout)
    for key in ("events", "bytes_read", "dataset_bytes_read", "operations", "read_histogram"):
        assert a[key] == b[key], key
    assert [f["id"] for f in a["findings"]] == [f["id"] for f in b["findings"]]


def test_bad_scheduler_is_a_clear_error(cli) -> None:
    proc = cli("analyze", str(TRACES / "npz_fork"), "--scheduler", "tcp://127.0.0.1:1")
    assert proc.returncode == 2 and "cannot reach the Dask scheduler" in proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(UsageError):
        with cluster("tcp://127.0.0.1:1", 2):
            pass
