"""Text samples as the lines of JSON-lines files (``examples/jsonl_lines.py``), read by ``seek``
+ ``readline`` on a file each process keeps open: the reads are the file's buffer (4 KiB from
the line's offset), so their sizes say nothing of the lines'. Distill takes each line's size
from the offsets the items seek to (``dataset.record_length``: all lines the mean before,
1755 B for 516-3070 B lines), and the pass a Dataset makes over its files to index the lines
as it is made (``dataset.scan_read_size``: 0.9 of the job's 6.8 MiB the replay did not read).

Traces: ``traces/parts/jsonl_*`` (``traces/make_parts_traces.py``): 2 or 3 files, 256, 200,
160, 128 or 96 lines a file of 150-600 to 512-3072 B, the index a scan or ``.idx.npy`` side
files, 2 workers or none, batch 8, 4 or 2, shuffled or in order, 3 or 2 epochs, with the
loader hooks or DFTracer's POSIX calls alone (``_posix``)."""

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


NO_WORKERS = [
    "jsonl_w0_scan_posix",
    "jsonl_w0_b2_posix",
    "jsonl_w0_sorted_posix",
    "jsonl_w0_sidecar_posix",
]


@pytest.mark.parametrize("name", NO_WORKERS)
def test_lines_of_a_process_without_workers_from_posix_calls_alone(name: str) -> None:
    """No workers and DFTracer's POSIX calls alone: the training process's index pass (each
    file's first open read through, then a second open kept for the lines) had been one more
    epoch and its 4 KiB reads samples (3 files x 275 for 128 lines, 1 epoch for 2); lines hit
    inside the buffer had made the epochs uneven (1 found); lines read in order make no seek
    (the fingerprint counts them: 47 buffers a file had been the samples for 160 lines); and
    the ``.idx.npy`` side files read once before the first line had been samples (6 files x 1).
    Files, lines, epochs, the pass and side files all right, the lines' mean within 3 %."""
    truth = _truth(name)
    m, _ = _model(name)
    ds, rd, f = m.dataset, m.reader, m.provenance.fields
    assert (ds.format, ds.num_files, ds.num_samples_per_file) == (
        truth["format"], truth["num_files"], truth["samples_per_file"]
    )  # fmt: skip
    assert (rd.read_threads, m.train.epochs) == (truth["read_threads"], truth["epochs"])
    assert ds.scan_read_size == truth["scan_read_size"]
    if truth["scan_read_size"]:
        assert f["dataset.scan_read_size"].confidence == "inferred"
    assert len(ds.side_files or []) == truth["side_files"]
    lines = np.asarray(truth["line_bytes"], dtype=float)
    assert ds.record_length.mean == pytest.approx(lines.mean(), rel=0.03)
    # the lines' spread too: from the seeks, or (in order: no seek) the fingerprint's first
    # lines, scaled to the files' bytes over their lines (every line the mean before)
    assert ds.record_length.stdev == pytest.approx(lines.std(), rel=0.15)
    assert f["dataset.num_samples_per_file"].confidence != "measured"


def test_index_pass_is_not_a_whole_file_epoch() -> None:
    """The index pass needs a second open that reads its file at other places or over and
    over: files read through once an open, epoch after epoch (NPZ samples, a whole-file reader
    without workers), keep every pass an epoch."""
    from dlreplay.analyze.distill.scan import index_pass

    rows = []
    t = 0
    for _epoch in range(3):
        for f in ("/d/a.jsonl", "/d/b.jsonl"):
            rows.append(("open64", f, t, None, None))
            for k in range(4):
                t += 10
                rows.append(("read", f, t, k * 4096, 4096))
            t += 10
    io = pl.DataFrame(
        rows, schema=["name", "file", "ts", "offset", "size"], orient="row"
    ).with_columns(
        pl.lit(7, pl.Int32).alias("pid"),
        pl.lit(0).alias("dur"),
        pl.lit(None, pl.Int64).alias("ret"),
    )
    assert index_pass(io, ["/d/a.jsonl", "/d/b.jsonl"]) is None
    # the same files read through once, then at other places through one kept open: a pass
    shuffled = [r for r in rows if r[2] < 100] + [("open64", "/d/a.jsonl", 200, None, None)]
    shuffled += [("open64", "/d/b.jsonl", 201, None, None)]
    shuffled += [("read", f, 300 + i, off, 4096) for i, (f, off) in enumerate(
        [("/d/a.jsonl", 8192), ("/d/b.jsonl", 0), ("/d/a.jsonl", 4096), ("/d/b.jsonl", 12288),
         ("/d/a.jsonl", 0), ("/d/b.jsonl", 4096)])]  # fmt: skip
    io2 = pl.DataFrame(
        shuffled, schema=["name", "file", "ts", "offset", "size"], orient="row"
    ).with_columns(
        pl.lit(7, pl.Int32).alias("pid"),
        pl.lit(0).alias("dur"),
        pl.lit(None, pl.Int64).alias("ret"),
    )
    found = index_pass(io2, ["/d/a.jsonl", "/d/b.jsonl"])
    assert found is not None and found.height == 2


def test_fingerprint_counts_json_lines(tmp_path: Path) -> None:
    """The dataset fingerprint knows ``.jsonl`` files and counts their lines (a last line
    without its newline too) with their lengths; past its byte budget the count is an
    estimate, said so."""
    from dlreplay.capture.fingerprint import csvfile, fingerprint_dataset

    rng = np.random.default_rng(3)
    lengths = rng.integers(20, 400, size=(2, 150))
    for i, row in enumerate(lengths):
        text = "\n".join('{"t": "' + "x" * int(n) + '"}' for n in row)
        (tmp_path / f"s{i}.jsonl").write_text(text + ("\n" if i == 0 else ""))
    doc = fingerprint_dataset(files=sorted(str(p) for p in tmp_path.glob("*.jsonl")))
    (group,) = doc["groups"]
    assert group["format"] == "jsonl"
    got = {f["path"]: f for f in group["files_sampled"]}
    for i in range(2):
        f = got[f"s{i}.jsonl"]
        assert (f["lines"], f["lines_exact"]) == (150, True)
        assert f["line_bytes_sample"][:5] == [int(n) + 10 for n in lengths[i][:5]]
    big = tmp_path / "big.jsonl"
    big.write_text(("x" * 99 + "\n") * 20000)  # 2 MB, 20000 lines
    old = csvfile.JSONL_COUNT_BYTES
    csvfile.JSONL_COUNT_BYTES = 1  # one block of 1 MiB counted, then estimated
    try:
        from dlreplay.capture.fingerprint.common import FingerprintLimits

        est = csvfile.inspect_jsonl(str(big), FingerprintLimits())
    finally:
        csvfile.JSONL_COUNT_BYTES = old
    assert est["lines_exact"] is False
    assert est["lines"] == pytest.approx(20000, rel=0.01)


def test_replay_of_a_process_without_workers_reads_the_jobs_bytes(tmp_path: Path) -> None:
    """The replay of the POSIX-only capture of a process without workers that scans its files
    then reads its lines in order: its bytes and read calls the job's within 2 % (the model
    had been 47 samples of 4.1 KiB a file and one epoch more)."""
    from dlreplay.replay import ReplayConfig, run_replay

    m, lt = _model("jsonl_w0_sorted_posix")
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    job = _reads_of(lt, r"/shard_\d+\.jsonl$")
    got = _reads_of(load_trace(tmp_path / "out"), r"/train/[^/]+$")
    assert got["size"].sum() == pytest.approx(job["size"].sum(), rel=0.02)
    assert got.height == pytest.approx(job.height, rel=0.02)


@pytest.mark.parametrize("name", ["jsonl_w0_sorted_posix", "jsonl_w0_b2_posix"])
def test_posix_compute_per_step_is_the_epochs_over_its_lines(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From POSIX calls alone a JSON-lines consumer's visits are its buffer's reads, a few lines
    each (none for a line in the buffer already): the idle time before each read is a few
    steps' compute. The model's steps are the lines, so the compute per step is the epoch's
    idle time over its lines (a batch-1 replay of the sweep's 2048 lines had spent 1.04 ms a
    line for 537 reads: its epoch +269 %). Conserved: compute x steps = the visits' idle time."""
    import dlreplay.analyze.distill.train as train

    raw: list = []
    orig = train._from_posix
    monkeypatch.setattr(
        train, "_from_posix", lambda obs, facts: raw.append(orig(obs, facts)) or raw[-1]
    )
    m, _lt = _model(name)
    t = _truth(name)
    ((epochs, per_visit),) = raw
    samples = t["num_files"] * t["samples_per_file"]
    got = m.train.computation_time.mean
    method = m.provenance.fields["train.computation_time"].method
    reads = int(method.split("(")[-1].split(" buffer reads an epoch")[0])
    assert m.reader.batch_size == 1 and reads < 0.95 * samples  # premise: lines share reads
    assert got == pytest.approx(per_visit.mean * reads / samples, rel=0.02)
    assert got * samples == pytest.approx(per_visit.mean * reads, rel=0.02)
