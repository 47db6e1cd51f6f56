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


def _multi_member(tmp_path: Path, members: int) -> Path:
    """npz_fork with its biggest file rewritten as ``members`` gzip members (whole lines each)."""
    import gzip

    d = tmp_path / f"mm{members}"
    shutil.copytree(TRACES / "npz_fork", d)
    big = max(d.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    lines = gzip.decompress(big.read_bytes()).splitlines(keepends=True)
    per = -(-len(lines) // members)
    big.write_bytes(b"".join(gzip.compress(b"".join(lines[i:i + per]), mtime=0)
                             for i in range(0, len(lines), per)))
    return d


def test_large_file_split_by_gzip_member(client, tmp_path: Path) -> None:
    from dlreplay.analyze.load import member_ranges

    d = _multi_member(tmp_path, 12)
    big = max(d.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    ranges = member_ranges(big, 1)
    assert ranges is not None and len(ranges) == 12 and ranges[-1][1] == big.stat().st_size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous, whole members
    single = load_trace(d)
    dist, info = load_trace_distributed(d, client, split_bytes=1, range_bytes=1)
    assert info.tasks >= 12
    assert_frame_equal(dist.events, single.events)
    assert dist.files == single.files  # the ranges' reports add up to the file's


def test_damaged_large_file_is_parsed_whole(client, tmp_path: Path) -> None:
    from dlreplay.analyze.load import member_ranges

    d = _multi_member(tmp_path, 6)
    big = max(d.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    raw = big.read_bytes()
    big.write_bytes(raw[: len(raw) * 2 // 3])
    assert member_ranges(big, 1) is None
    single = load_trace(d)
    dist, _ = load_trace_distributed(d, client, split_bytes=1, range_bytes=1)
    assert single.damaged and dist.files == single.files
    assert_frame_equal(dist.events, single.events)
