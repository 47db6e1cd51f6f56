"""classify_files / summarize / render_text on hand-built traces and tables."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import Summary, classify_files, load, summarize
from dlreplay.analyze.summary import HISTOGRAM_BUCKETS, histogram, human_bytes, render_text
from dlreplay.schema import EVENT_SCHEMA

from .test_load import T0, Proc, dataloader_job, write_gz


def table(rows: list[dict]) -> pl.DataFrame:
    """An event table from partial rows (missing columns are null)."""
    full = [{c: r.get(c) for c in EVENT_SCHEMA} for r in rows]
    return pl.DataFrame(full, schema=EVENT_SCHEMA)


def io(
    name: str, file: str, size: int | None = None, pid: int = 1, ts: int = T0, cat: str = "POSIX"
) -> dict:
    return {
        "pid": pid,
        "tid": pid,
        "host": "h",
        "ts": ts,
        "dur": 1,
        "cat": cat,
        "name": name,
        "file": file,
        "size": size,
        "source": "t.pfw.gz",
    }


def roles(df: pl.DataFrame) -> dict[str, str]:
    return dict(df.select("file", "role").iter_rows())


# ---------------------------------------------------------------------------------------
# Histogram


@pytest.mark.parametrize(
    ("size", "bucket"),
    [
        (0, "0-100"),
        (100, "0-100"),
        (101, "100-1K"),
        (1024, "100-1K"),
        (1025, "1K-10K"),
        (10240, "1K-10K"),
        (102400, "10K-100K"),
        (1 << 20, "100K-1M"),
        ((1 << 20) + 1, "1M-4M"),
        (4 << 20, "1M-4M"),
        (10 << 20, "4M-10M"),
        (100 << 20, "10M-100M"),
        (1 << 30, "100M-1G"),
        ((1 << 30) + 1, "1G+"),
    ],
)
def test_darshan_buckets(size: int, bucket: str) -> None:
    h = histogram(pl.Series([size], dtype=pl.Int64))
    assert list(h) == [label for label, _ in HISTOGRAM_BUCKETS]
    assert h[bucket] == 1 and sum(h.values()) == 1


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 << 30) == "3.0 GiB"


# ---------------------------------------------------------------------------------------
# Roles


def test_roles_by_rule() -> None:
    ev = table(
        [
            io("read", "/usr/lib/python3.11/os.py", 100),
            io("read", "/venv/lib/python3.11/site-packages/torch/_C.so", 10),
            io("read", "/proc/self/status", 10),
            io("read", "/data/a.npz", 5000, pid=2),
            io("read", "/data/b.npz", 5000, pid=2),
            io("read", "/data/.done", 10, pid=1),  # marker read only by the main process
            {**io("item", None, pid=2), "cat": "data", "sample_index": 0},
            io("write", "/ckpt/big.pt", 2 << 20),
            io("write", "/logs/run.log", 100),
            {**io("save", "/ckpt/small.pt", 1000), "cat": "checkpoint"},
        ]
    )
    r = roles(classify_files(ev))
    assert r["/usr/lib/python3.11/os.py"] == "library"
    assert r["/venv/lib/python3.11/site-packages/torch/_C.so"] == "library"
    assert r["/proc/self/status"] == "library"
    assert r["/data/a.npz"] == r["/data/b.npz"] == "dataset"  # read by the item-emitting process
    assert r["/data/.done"] == "other"
    assert r["/ckpt/big.pt"] == r["/ckpt/small.pt"] == "checkpoint"
    assert r["/logs/run.log"] == "other"
    with_dirs = roles(classify_files(ev, ["/data", "/ckpt"]))
    assert with_dirs["/data/.done"] == "other" and with_dirs["/data/a.npz"] == "dataset"
    assert with_dirs["/ckpt/small.pt"] == "checkpoint"


def test_dataset_without_loader_events() -> None:
    ev = table(
        [
            io("open64", "/d/x"),
            io("read", "/d/x", 10),
            io("open64", "/d/x"),
            io("read", "/d/x", 10),  # re-read
            io("read", "/d/y", 10, pid=1),
            io("read", "/d/y", 10, pid=2),  # two processes
            io("read", "/d/z", 10),  # read once
        ]
    )
    r = roles(classify_files(ev))
    assert r == {"/d/x": "dataset", "/d/y": "dataset", "/d/z": "other"}
    r = roles(classify_files(ev, data_dirs=["/d"]))
    assert set(r.values()) == {"dataset"}


def test_classify_counts() -> None:
    ev = table(
        [io("open64", "/f"), io("read", "/f", 7), io("read", "/f", 3, pid=2), io("write", "/f", 5)]
    )
    row = classify_files(ev).row(0, named=True)
    assert row == {
        "file": "/f",
        "role": "dataset",
        "bytes_read": 10,
        "bytes_written": 5,
        "reads": 2,
        "writes": 1,
        "opens": 1,
        "processes": 2,
    }
    assert classify_files(table([])).height == 0


# ---------------------------------------------------------------------------------------
# Summary


def test_summary_of_a_dataloader_job(tmp_path: Path) -> None:
    d, truth = dataloader_job(tmp_path)
    ev = load(d)
    s = summarize(ev, data_dirs=["/data/set"])
    assert isinstance(s, Summary)
    assert s.events == truth["events"] and s.processes == 3
    assert s.dataset_files == 8
    assert s.dataset_bytes_read == sum(truth["bytes_per_pid"].values())
    assert s.dataset_bytes_read_per_pid == truth["bytes_per_pid"]
    assert s.dataset_read_calls == len(truth["reads"])
    assert s.item_events == 40 and s.fetch_events == 10 and s.epochs == 3
    assert s.checkpoint_saves == 1 and s.checkpoint_save_bytes == 3 << 30
    assert sum(s.read_histogram.values()) == len(truth["reads"])
    assert s.read_histogram["1K-10K"] == 40 and s.read_histogram["0-100"] == 80
    ops = {(o.cat, o.name): o for o in s.operations}
    assert ops[("POSIX", "read")].count == len(truth["reads"])
    assert ops[("POSIX", "read")].bytes == s.dataset_bytes_read
    assert 0 < s.duration_s < 1
    assert s.top_files[0].role == "dataset" and len(s.top_files) == 8
    payload = json.loads(json.dumps(s.to_dict()))
    assert payload["dataset_bytes_read_per_pid"] == {
        str(k): v for k, v in truth["bytes_per_pid"].items()
    }
    text = render_text(s)
    assert "Dataset: 8 file(s)" in text and "3.0 GiB" in text
    lines = text.splitlines()
    header = next(
        i for i, ln in enumerate(lines) if ln.strip().startswith("cat ") and "count" in ln
    )
    block = lines[header : lines.index("", header)]
    assert len(block) == 2 + len(s.operations)
    assert len({len(ln) for ln in block}) == 1  # right-aligned last column: one width for all rows


def test_summary_says_what_is_missing(tmp_path: Path) -> None:
    p = Proc(pid=5)
    p.read("/etc/hosts", 10)
    write_gz(tmp_path / "t.pfw.gz", p.lines())
    s = summarize(load(tmp_path))
    text = render_text(s)
    assert s.dataset_files == 0 and s.dataset_bytes_read == 0
    assert "no dataset reads found" in text
    assert "no data-loader events found" in text and "no checkpoint events found" in text
    empty = summarize(pl.DataFrame(schema=EVENT_SCHEMA))
    assert empty.events == 0 and empty.duration_s == 0.0
    assert "no file reads found" in render_text(empty)
