"""Text samples as the lines of JSON-lines files (``examples/jsonl_lines.py``), read by ``seek``
+ ``readline`` on a file each process keeps open: the reads are the file's buffer (4 KiB from
the line's offset), so their sizes say nothing of the lines'. Distill takes each line's size
from the offsets the items seek to (``dataset.record_length``: all lines the mean before,
1755 B for 516-3070 B lines), and the pass a Dataset makes over its files to index the lines
as it is made (``dataset.scan_read_size``: 0.9 of the job's 6.8 MiB the replay did not read).

Traces: ``traces/parts/jsonl_*`` (``traces/make_parts_traces.py``): 2 or 3 files, 256 or 96
lines a file of 512-3072 or 200-1200 B, the index a scan or ``.idx.npy`` side files, 2
workers or none, batch 8 or 4, 3 or 2 epochs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dlreplay.analyze import load_trace

from .parts import model as _model
from .parts import reads_of as _reads_of
from .parts import truth as _truth

NAMES = ["jsonl_w2_b8", "jsonl_w0_b4"]


@pytest.mark.parametrize("name", NAMES)
def test_lines_sizes_and_the_index_pass_found(name: str) -> None:
    """Each line's size from the seeks (the quartiles within 3 % of the files' own lines), the
    index pass (4 KiB reads of every file before the first batch) where the Dataset scanned
    its files and none where it loaded its offsets from side files, which are side files and
    not samples (with no worker their reads are the loader process's too)."""
    truth = _truth(name)
    m, _ = _model(name)
    ds, rd, f = m.dataset, m.reader, m.provenance.fields
    assert (ds.format, ds.num_files, ds.num_samples_per_file) == (
        truth["format"], truth["num_files"], truth["samples_per_file"]
    )  # fmt: skip
    assert f["dataset.format"].confidence == "measured"  # .jsonl
    assert ds.scan_read_size == truth["scan_read_size"]
    assert len(ds.side_files or []) == truth["side_files"]
    assert (rd.batch_size, rd.read_threads, m.train.epochs) == (
        truth["batch_size"], truth["read_threads"], truth["epochs"]
    )  # fmt: skip
    lines = np.asarray(truth["line_bytes"], dtype=float)
    rl = ds.record_length
    assert f["dataset.record_length"].confidence == "measured"
    assert rl.mean == pytest.approx(lines.mean(), rel=0.01)
    got = rl.quantile([0.25, 0.5, 0.75])
    want = np.percentile(lines, [25, 50, 75])
    assert np.allclose(got, want, rtol=0.03), (got, want)
    assert rl.max == pytest.approx(lines.max(), rel=0.01)


def test_replay_reads_the_lines_and_the_index_pass(tmp_path: Path) -> None:
    """The replay's lines take the job's sizes, each read through the 4 KiB buffer, and its
    rank reads every file through before the first epoch: the bytes the job read within 2 %
    (without the pass and with the mean line, 12 % short)."""
    from dlreplay.replay import ReplayConfig, run_replay

    name = "jsonl_w2_b8"
    truth = _truth(name)
    m, lt = _model(name)
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    replay = load_trace(tmp_path / "out")
    job_reads = _reads_of(lt, r"/shard_\d+\.jsonl$")
    got = _reads_of(replay, r"/train/[^/]+$")
    assert got["size"].sum() == pytest.approx(job_reads["size"].sum(), rel=0.02)
    # the pass: before the rank's first item, one process read each file whole
    first_item = replay.events.filter(pl.col("role") == "item")["ts"].min()
    early = got.filter(pl.col("ts") < first_item)
    manifest = json.loads(next((tmp_path / "d").glob(".dlreplay-dataset.json")).read_text())
    sizes = {Path(f["path"]).name: f["bytes"] for f in manifest["files"]}
    per_file = early.group_by(pl.col("file").cast(pl.String)).agg(pl.col("size").sum())
    assert per_file.height == truth["num_files"]
    for file, nbytes in per_file.iter_rows():
        assert nbytes == sizes[Path(file).name]
    assert set(early["size"].to_list()) <= {4096, *(s % 4096 for s in sizes.values())}
    # the lines: the job's spread, not one size
    records = [b for f in manifest["files"] for _, b in f["records"]]
    assert np.std(records) > 0.3 * np.mean(records)


def test_lines_from_posix_calls_alone() -> None:
    """With DFTracer's POSIX calls alone: the files were opened once a worker, so their opens
    had made "2 files of 2 samples" (claimed, not said to be a guess); now each 4 KiB read at
    a place is a sample, the seeks' targets give the lines (all of them) and their sizes, and
    the pass before the workers' first epoch is the Dataset's index scan (inferred)."""
    name = "jsonl_w2_b8_posix"
    truth = _truth(name)
    m, _ = _model(name)
    ds, rd, f = m.dataset, m.reader, m.provenance.fields
    assert (ds.num_files, ds.num_samples_per_file) == (
        truth["num_files"],
        truth["samples_per_file"],
    )
    assert ds.scan_read_size == truth["scan_read_size"]
    assert f["dataset.scan_read_size"].confidence == "inferred"
    assert rd.open_per_sample is False
    assert (rd.read_threads, m.train.epochs) == (truth["read_threads"], truth["epochs"])
    lines = np.asarray(truth["line_bytes"], dtype=float)
    assert ds.record_length.mean == pytest.approx(lines.mean(), rel=0.01)
    assert np.allclose(
        ds.record_length.quantile([0.25, 0.5, 0.75]), np.percentile(lines, [25, 50, 75]), rtol=0.03
    )
