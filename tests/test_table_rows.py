"""Tabular samples as the rows of Parquet files (``examples/parquet_rows.py``), read by the row
group holding them (pyarrow's ``ParquetFile.read_row_group``: each file opened once a process,
the last group kept). The replay had read the whole file a sample (DLIO's and pandas' way):
1.1 GiB against the job's 103 MiB, epochs +226 %. Distill now sets ``reader.row_group_reads``
where the items read less than half a file each, the replay reads row groups, and generate
fits each column's bytes on disk (the table's one deflate-calibrated ratio gave a snappy
column 46 KiB a group for 37).

Traces: ``traces/parts/parquet_*`` (``traces/make_parts_traces.py``): 2 or 3 files, 512 or
256 rows, 64 or 32 rows a group, 1024 or 512 B a row, snappy or zstd, all columns, two of
three or one, 2 workers or none, batch 16 or 8, shuffled or not, 3 or 2 epochs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.schema import READ_OPS

from .parts import model as _model
from .parts import reads_of as _reads_of
from .parts import truth as _truth

pytest.importorskip("pyarrow")

NAMES = ["parquet_w2_b16", "parquet_w0_b8"]


@pytest.mark.parametrize("name", NAMES)
def test_row_group_reads_found(name: str) -> None:
    """Row-group reads (measured), the rows and groups a file from the fingerprint, the
    columns' bytes on disk, and the loop."""
    truth = _truth(name)
    m, _ = _model(name)
    ds, rd, f = m.dataset, m.reader, m.provenance.fields
    assert (ds.format, ds.num_files, ds.num_samples_per_file) == (
        truth["format"], truth["num_files"], truth["samples_per_file"]
    )  # fmt: skip
    assert rd.row_group_reads is truth["row_group_reads"]
    assert f["reader.row_group_reads"].confidence == "measured"
    table = ds.layout.tables[0]
    assert (table.rows, table.row_groups) == (truth["samples_per_file"], truth["row_groups"])
    assert all(c.disk_row_bytes for c in table.columns)
    assert (rd.batch_size, rd.read_threads, m.train.epochs) == (
        truth["batch_size"], truth["read_threads"], truth["epochs"]
    )  # fmt: skip


def test_whole_file_reads_stay_whole() -> None:
    """Items that read a whole Parquet file each (a reader of whole files) keep whole-file
    reads: the rule is the items' bytes against the files', not the format."""
    from dlreplay.analyze.distill.base import Facts
    from dlreplay.analyze.distill.reader import _row_group_reads

    m, lt = _model("parquet_w0_b8")
    # the same items, each made to read its whole file: every read as large as the file
    events = lt.events.with_columns(
        pl.when(pl.col("name").cast(pl.String).is_in(list(READ_OPS)) & (pl.col("size") > 0))
        .then(pl.lit(10**6))
        .otherwise(pl.col("size"))
        .alias("size")
    )
    from dlreplay.analyze.distill.observe import observe

    obs = observe(events, lt.manifest.get("data_dirs"), None, None, Facts())
    got = _row_group_reads(m.reader.__class__(), obs, m.dataset, False, Facts())
    assert got.row_group_reads is False


def test_replay_reads_row_groups_of_the_jobs_size(tmp_path: Path) -> None:
    """The replay's reads: one row group's chunks an item, of the job's size (within 2 %), and
    its bytes the job's (within 2 %), where whole files read 10x them."""
    from dlreplay.replay import ReplayConfig, run_replay

    name = "parquet_w2_b16"
    m, lt = _model(name)
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    job = _reads_of(lt, r"/part-\d+\.parquet$")
    got = _reads_of(load_trace(tmp_path / "out"), r"/train/[^/]+\.parquet$")
    assert got["size"].sum() == pytest.approx(job["size"].sum(), rel=0.02)
    assert got["size"].median() == pytest.approx(job["size"].median(), rel=0.02)
    # generated files: the columns' chunks as the job's on disk
    import pyarrow.parquet as pq

    files = sorted((tmp_path / "d" / "train").glob("*.parquet"))
    meta = pq.ParquetFile(files[0]).metadata
    table = m.dataset.layout.tables[0]
    for j, col in enumerate(table.columns):
        disk = sum(
            meta.row_group(g).column(j).total_compressed_size for g in range(meta.num_row_groups)
        )
        assert disk / meta.num_rows == pytest.approx(col.disk_row_bytes, rel=0.05), col.name


def test_row_groups_from_posix_calls_alone() -> None:
    """With DFTracer's POSIX calls alone no sample shows: each worker opened each file once and
    read a row group at a time (2 opens a file an epoch for 512 rows, which had made 2 samples
    a file, and the replay read the whole file each: 1.3 MiB an epoch for the job's 34). The
    rows come from the fingerprint, said to be a guess; the row groups are read through files
    kept open; the batch is unknown."""
    name = "parquet_w2_b16_posix"
    truth = _truth(name)
    m, _ = _model(name)
    ds, rd, f = m.dataset, m.reader, m.provenance.fields
    assert ds.num_samples_per_file == truth["samples_per_file"]
    assert f["dataset.num_samples_per_file"].confidence == "default"
    assert rd.row_group_reads is True and rd.open_per_sample is False
    assert f["reader.row_group_reads"].confidence == "inferred"
    assert f["reader.batch_size"].confidence == "default"
    assert (rd.read_threads, m.train.epochs) == (truth["read_threads"], truth["epochs"])
    assert any("row group at a time" in n for n in m.provenance.notes)


@pytest.mark.parametrize("name", [*NAMES, "parquet_w2_b16_posix"])
def test_columns_the_job_never_reads_are_marked(name: str) -> None:
    """The columns whose chunks no read touched (the job's ``columns=[...]``: one of three, two
    of three, all) are marked ``read_per_sample: false`` from the fingerprint's chunk places,
    with the hooks and from POSIX calls alone; pyarrow's read of a file's last 64 KiB (its
    footer, and a small file's chunks with it) does not count as a column's read."""
    truth = _truth(name)
    m, _ = _model(name)
    cols = m.dataset.layout.tables[0].columns
    assert sorted(c.name for c in cols if not c.read_per_sample) == truth["columns_unread"]
    ev = m.provenance.fields["dataset.layout.tables"].method
    assert ("columns never read" in ev) is bool(truth["columns_unread"]), ev


def test_replay_reads_the_jobs_columns_alone(tmp_path: Path) -> None:
    """The replay's row groups are read for the job's columns alone: its reads are the job's
    in number and size (within 2 %; reading the third column too made a third more calls of
    171 B and ended pyarrow's coalesced read elsewhere)."""
    from dlreplay.replay import ReplayConfig, run_replay

    name = "parquet_w0_b8"
    m, lt = _model(name)
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    job = _reads_of(lt, r"/part-\d+\.parquet$")
    got = _reads_of(load_trace(tmp_path / "out"), r"/train/[^/]+\.parquet$")
    assert got.height == pytest.approx(job.height, rel=0.02)
    assert got["size"].sum() == pytest.approx(job["size"].sum(), rel=0.02)
    assert got["size"].median() == pytest.approx(job["size"].median(), rel=0.02)


def _torch_loaded(q) -> None:  # (module level: pickled by reference to the forkserver)
    import sys

    q.put("torch" in sys.modules)


def test_table_workers_fork_with_torch_loaded(tmp_path: Path) -> None:
    """The workers of a Parquet or CSV replay come from a forkserver (polars' thread pool does
    not survive a fork): it preloads torch, so a worker forked at each epoch's start has it
    (each imported it itself: 1.5-4 s an epoch), and it runs before the first epoch."""
    from dlreplay.model import Distribution
    from dlreplay.replay.loader import WorkerSpec, start_worker_server, worker_context

    spec = WorkerSpec(
        data_dir=str(tmp_path),
        fmt="parquet",
        io="library",
        paths=("a.parquet",),
        file_bytes=(1,),
        records=(None,),
        samples_per_file=1,
        open_per_sample=False,
        transfer_size=Distribution.fixed(4096.0),
        preprocess_time=Distribution.fixed(0.0),
        stats_per_sample=0.0,
        lseeks_per_sample=0.0,
        seed=0,
    )
    start_worker_server(spec, torch=True)
    ctx = worker_context(spec, torch=True)
    assert ctx.get_start_method() == "forkserver"
    q = ctx.Queue()
    p = ctx.Process(target=_torch_loaded, args=(q,))
    p.start()
    try:
        assert q.get(timeout=120) is True
    finally:
        p.join(timeout=60)
