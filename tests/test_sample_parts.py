"""Samples made of several files, each read whole (an image and its mask: MLPerf unet3d's
``case_x.npy`` and ``case_y.npy``): distill finds how many files a sample reads and in which
order (``dataset.files_per_sample``), generate writes each sample's files with their own
sizes, and the replay reads the same groups. Before, the model said "48 files of 1 sample,
batch 2, 12 steps an epoch", and the replay read 24 of the 48 files an epoch: half the bytes.

Traces: ``traces/parts/`` (``traces/make_parts_traces.py``): 2 and 3 files a sample, NPY and
PNG, the image or the mask read first, 2 workers or none, batch 2 or 3, shuffled or not, the
parts named by a suffix or a folder, with the loader hooks or POSIX calls alone (``_posix``)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.errors import ModelError
from dlreplay.schema import READ_OPS

from .parts import PARTS
from .parts import model as _model
from .parts import reads_of as _reads_of
from .parts import truth as _truth

NAMES = ["npy_pairs", "png_triples"]


def _reads(lt, pattern: str = r"/(case|img)_[^/]*\.(npy|png)$") -> pl.DataFrame:
    """A trace's reads of its dataset files (the example's ``case_*``, the replay's ``img_*``;
    or the files whose path matches *pattern*)."""
    return lt.events.filter(
        pl.col("name").is_in(list(READ_OPS))
        & (pl.col("size") > 0)
        & pl.col("file").cast(pl.String).str.contains(pattern)
    )


@pytest.mark.parametrize("name", NAMES)
def test_files_a_sample_reads_found_in_their_order(name: str) -> None:
    """The files each item event reads, and their order: the layout's first structure is the
    part the job read first (the image, 12 KiB, or the mask, 0.3 KiB)."""
    truth = _truth(name)
    m, _ = _model(name)
    ds, f = m.dataset, m.provenance.fields
    assert ds.files_per_sample == truth["files_per_sample"]
    assert f["dataset.files_per_sample"].confidence == "measured"
    assert ds.num_files == truth["num_files"] and ds.num_samples_per_file == 1
    assert ds.format == truth["format"]
    assert m.reader.batch_size == truth["batch_size"]
    assert m.reader.read_threads == truth["read_threads"]
    assert m.train.epochs == truth["epochs"]
    assert m.train.steps_per_epoch == -(-truth["samples"] // truth["batch_size"])
    structures = ds.layout.arrays or ds.layout.images
    assert len(structures) == truth["files_per_sample"]
    sizes = [s.bytes for s in structures]
    first_is_largest = sizes[0] == max(sizes)
    assert first_is_largest == (truth["first_part"] == "image")
    assert any("each sample reads" in n for n in m.provenance.notes)


@pytest.mark.parametrize("name", NAMES)
def test_replay_reads_each_samples_files(name: str, tmp_path: Path) -> None:
    """The replay reads every file an epoch, as the job did (it read half of them), and the
    generated files take each part's size in turn."""
    from dlreplay.analyze.compare import compare_traces
    from dlreplay.replay import ReplayConfig, run_replay

    truth = _truth(name)
    m, lt = _model(name)
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    assert res.metrics["overall"]["samples"] == truth["samples"] * truth["epochs"]
    # both traced alike: numpy's and Pillow's reads as DFTracer sees them
    job, replay = _reads(lt), _reads(load_trace(tmp_path / "out"))
    assert replay["file"].n_unique() == job["file"].n_unique() == truth["num_files"]
    assert replay["size"].sum() == pytest.approx(job["size"].sum(), rel=0.02)
    # (compare's similarity weighs I/O times too, which the machine's speed moves: not here)
    cmp = compare_traces(PARTS / name, tmp_path / "out")
    assert cmp.features_b["files"] == cmp.features_a["files"]
    assert cmp.features_b["bytes_read"] == pytest.approx(cmp.features_a["bytes_read"], rel=0.02)
    # the generated files: each sample's group in the layout's order, each part its own size
    manifest = json.loads(next((tmp_path / "d").glob(".dlreplay-dataset.json")).read_text())
    files = sorted(manifest["files"], key=lambda f: f["path"])
    k = truth["files_per_sample"]
    want = [s.bytes for s in (m.dataset.layout.arrays or m.dataset.layout.images)]
    for i, f in enumerate(files):
        assert f["bytes"] == pytest.approx(want[i % k], rel=0.25), (i, f)


POSIX = ["npy_pairs_posix", "png_triples_posix"]


@pytest.mark.parametrize("name", POSIX)
def test_files_a_sample_reads_from_posix_calls_alone(name: str) -> None:
    """DFTracer's POSIX calls alone (no item events): the groups come from the files' names (a
    suffix token, ``case_00007_image.npy``; a folder, ``mask/00007.png``) and the reads taking
    each group's files one after another (inferred). Before: "48 files x 1 sample, batch 4,
    in order" for 24 shuffled pairs in batches of 2. Files, batch, order, epochs and the
    first part all the job's."""
    truth = _truth(name)
    m, _ = _model(name)
    ds, f = m.dataset, m.provenance.fields
    assert ds.files_per_sample == truth["files_per_sample"]
    assert f["dataset.files_per_sample"].confidence == "inferred"
    assert ds.num_files == truth["num_files"] and ds.num_samples_per_file == 1
    assert m.reader.batch_size == truth["batch_size"]
    assert (m.reader.read_threads, m.train.epochs) == (truth["read_threads"], truth["epochs"])
    assert (m.reader.sample_shuffle != "off") is truth["sample_shuffle"]
    structures = ds.layout.arrays or ds.layout.images
    sizes = [s.bytes for s in structures]
    assert (sizes[0] == max(sizes)) == (truth["first_part"] == "image")


def test_replay_of_posix_groups_reads_every_file(tmp_path: Path) -> None:
    """The replay of the POSIX-only pairs reads all 48 files an epoch, the job's bytes within
    2 % (as 48 one-file samples in batches of 4 it read them too, but in name order)."""
    from dlreplay.replay import ReplayConfig, run_replay

    name = "npy_pairs_posix"
    truth = _truth(name)
    m, lt = _model(name)
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    assert res.metrics["overall"]["samples"] == truth["samples"] * truth["epochs"]
    pattern = r"\.(npy|png)$"  # the example's names either way, the replay's
    job, replay = _reads(lt, pattern), _reads(load_trace(tmp_path / "out"), pattern)
    assert replay["file"].n_unique() == job["file"].n_unique() == truth["num_files"]
    assert replay["size"].sum() == pytest.approx(job["size"].sum(), rel=0.02)


def test_names_alone_or_reads_alone_make_no_group() -> None:
    """A group needs both: one-file samples read in name order (``img_00001.jpg`` then
    ``img_00002.jpg``: runs of one file) and files named in pairs whose pairs the reads do not
    keep together (all images, then all masks) are no groups."""
    from dlreplay.analyze.infer_parts import sample_groups

    def visits(files: list[str]) -> pl.DataFrame:
        return pl.DataFrame(
            {"pid": [1] * len(files), "file": files, "ts": list(range(len(files)))},
            schema={"pid": pl.Int32, "file": pl.String, "ts": pl.Int64},
        )

    single = [f"/d/img_{i:05d}.jpg" for i in range(32)]
    assert sample_groups(visits(single * 2)) is None
    images = [f"/d/case_{i:05d}_image.npy" for i in range(16)]
    masks = [f"/d/case_{i:05d}_mask.npy" for i in range(16)]
    assert sample_groups(visits(images + masks)) is None
    pairs = [f for i in range(16) for f in (images[i], masks[i])]
    got = sample_groups(visits(pairs))
    assert got is not None and (got.k, got.names) == (2, ["image", "mask"])


def test_a_group_needs_whole_files_and_whole_samples() -> None:
    """A model whose groups do not divide its files, or whose files hold several samples, is
    refused with the field named."""
    from dataclasses import replace

    m, _ = _model("npy_pairs")
    assert replace(m.dataset, num_files=46).files_per_sample == 2
    with pytest.raises(ModelError, match="files_per_sample"):
        replace(m.dataset, num_files=47)
    with pytest.raises(ModelError, match="files_per_sample"):
        replace(m.dataset, num_samples_per_file=2)


def test_dlio_export_keeps_the_files_and_steps(tmp_path: Path) -> None:
    """DLIO reads each file as a sample: the export's batch is the job's times the files a
    sample, so DLIO reads the same files in the same steps, and says so."""
    import yaml

    from dlreplay.dlio import export_dlio

    m, _ = _model("png_triples")
    warnings = export_dlio(m, tmp_path / "w.yaml")
    cfg = yaml.safe_load((tmp_path / "w.yaml").read_text())
    assert cfg["reader"]["batch_size"] == 3 * 3
    assert cfg["dataset"]["num_files_train"] == 54
    assert any("files_per_sample=3" in w for w in warnings)


PT = ["pt_w2_b4", "pt_w0_b2"]


@pytest.mark.parametrize("name", PT)
def test_torch_load_of_a_sample_is_no_checkpoint(name: str) -> None:
    """A Dataset whose samples are ``torch.save``\\ d files read by ``torch.load`` in
    ``__getitem__``: each load inside an item event is the sample's read (role ``data.io``),
    not a checkpoint restore. Before, every sample file was a checkpoint and distill found no
    dataset ("no dataset reads"). The format is ``pt``, its layout one structure (the members
    named without torch's per-file archive folder: 24 structures before)."""
    truth = _truth(name)
    m, lt = _model(name)
    roles = lt.events.filter(pl.col("cat") == "checkpoint")["role"].cast(pl.String)
    assert roles.len() == truth["samples"] * truth["epochs"]
    assert set(roles.to_list()) == {"data.io"}
    ds = m.dataset
    assert ds.format == "pt" and ds.num_files == truth["num_files"]
    assert m.reader.batch_size == truth["batch_size"]
    assert m.reader.read_threads == truth["read_threads"]
    assert m.train.epochs == truth["epochs"]
    assert not m.checkpoint.enabled and not m.checkpoint.read_at_start
    assert len(ds.layout.arrays) == 1
    names = [a.name for a in ds.layout.arrays[0].members]
    assert "data.pkl" in names and "data/0" in names


@pytest.mark.parametrize("name", PT)
def test_pt_samples_replayed_through_torch_load(name: str, tmp_path: Path) -> None:
    """The replay writes ``torch.save`` archives with the job's storages and reads them with
    ``torch.load``: the same bytes and read sizes as the job (numpy's reads of the archive as
    an NPZ were 20 % fewer bytes, their mean 6.7 KiB against 5.3)."""
    from dlreplay.replay import ReplayConfig, run_replay

    truth = _truth(name)
    m, lt = _model(name)
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    assert res.metrics["overall"]["samples"] == truth["samples"] * truth["epochs"]
    pt = r"/(sample|img)_[^/]*\.pt$"
    job, replay = (
        t.events.filter(
            pl.col("name").is_in(list(READ_OPS))
            & (pl.col("size") > 0)
            & pl.col("file").cast(pl.String).str.contains(pt)
        )
        for t in (lt, load_trace(tmp_path / "out"))
    )
    assert replay["file"].n_unique() == job["file"].n_unique() == truth["num_files"]
    assert replay["size"].sum() == pytest.approx(job["size"].sum(), rel=0.02)
    assert replay.height == pytest.approx(job.height, rel=0.02)
    assert replay["size"].median() == pytest.approx(job["size"].median(), rel=0.05)


ROWS = ["rows_w2_b8", "rows_w0_b4"]


@pytest.mark.parametrize("name", ROWS)
def test_rows_of_a_mapped_file_are_the_samples(name: str) -> None:
    """A Dataset that maps one NPY file (``np.load(mmap_mode="r")``) and copies a row per
    item: its rows are page faults, and only the header's reads show. The windows the item
    events take are the samples: rows a file, their bytes, the file mapped (the replay maps it
    too). Before, the samples were the header reads inside items: "1 file of 6 samples of 683
    KiB" against 256 rows of 16 KiB."""
    truth = _truth(name)
    m, _ = _model(name)
    ds, f = m.dataset, m.provenance.fields
    assert ds.format == "npy" and ds.num_files == 1
    assert ds.num_samples_per_file == truth["samples"]
    assert ds.record_length.mean == truth["record_length"]
    assert f["dataset.num_samples_per_file"].confidence == "measured"
    assert "windows" in f["dataset.num_samples_per_file"].method
    assert m.reader.memory_map is True and m.reader.open_per_sample is False
    assert m.reader.batch_size == truth["batch_size"]
    assert m.reader.read_threads == truth["read_threads"]
    assert m.train.epochs == truth["epochs"]


@pytest.mark.parametrize("name", ROWS)
def test_mapped_rows_replayed_by_faulting_them_in(name: str, tmp_path: Path) -> None:
    """The replay maps the generated file once a process and copies each sample's row out of
    it: the windows it takes (its own mapped hooks record them) are the job's in count and
    bytes, and a read call touches no row."""
    from dlreplay.analyze.distill.mapped import mapped_events
    from dlreplay.replay import ReplayConfig, run_replay

    truth = _truth(name)
    m, _ = _model(name)
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    assert res.metrics["overall"]["samples"] == truth["samples"] * truth["epochs"]
    job = mapped_events(PARTS / name).filter(pl.col("name") == "io.window")
    replay = mapped_events(tmp_path / "out").filter(pl.col("name") == "io.window")
    assert replay.height == job.height == truth["samples"] * truth["epochs"]
    assert replay["bytes"].sum() == job["bytes"].sum()
    # read calls: the header's at each mapping, as the job's; no row is read by a call
    reads = _reads_of(load_trace(tmp_path / "out"), r"\.npy$")
    assert reads["size"].sum() < 0.05 * replay["bytes"].sum()
    assert reads.height <= 2 * _reads_of(load_trace(PARTS / name), r"\.npy$").height


def test_rows_of_mapped_files_from_posix_calls_alone() -> None:
    """The same job with DFTracer's POSIX calls alone: the workers map the file and read its
    header, no row. Distill takes the mapped array's rows (fingerprint) for the samples and
    says it is a guess, maps the file in the replay, and tells no batch (each visit is a
    mapping, no sample); the compute is spread over the rows' steps. Before: "1 file of 6
    samples of 683 KiB, batch 2", inferred, and a replay 15x the job's epoch."""
    truth = _truth("rows_w2_b8_posix")
    m, _ = _model("rows_w2_b8_posix")
    f = m.provenance.fields
    assert m.dataset.num_samples_per_file == truth["samples"]
    assert m.dataset.record_length.mean == truth["record_length"]
    for k in ("dataset.num_samples_per_file", "dataset.record_length", "reader.batch_size"):
        assert f[k].confidence == "default", k
    assert any(n.startswith("guess: dataset.num_samples_per_file") for n in m.provenance.notes)
    assert m.reader.memory_map is True
    assert m.reader.read_threads == truth["read_threads"] and m.train.epochs == truth["epochs"]
    # the modelled compute of an epoch: a good share of the workers' epochs, and no more
    lt = load_trace(PARTS / "rows_w2_b8_posix")
    workers = (
        lt.events.filter(pl.col("name") == "read")
        .group_by("pid")
        .agg(pl.col("ts").min().alias("a"), (pl.col("ts") + pl.col("dur")).max().alias("b"))
    )
    run_s = (workers["b"].max() - workers["a"].min()) * 1e-6
    steps = truth["samples"] / m.reader.batch_size
    per_epoch = steps * (m.train.computation_time.mean or 0)
    assert 0.1 * run_s / truth["epochs"] < per_epoch < run_s


def test_rows_of_a_mapped_arrow_file(tmp_path: Path) -> None:
    """Hugging Face ``datasets``' map-style access: each worker maps the Arrow stream
    (``pa.ipc.open_stream(pa.memory_map(path))``) and takes a row an item. Nothing is read by
    a call: the trace has its opens and mmaps alone, and distill stopped with an unknown
    record length. The rows a file and their columns come from the fingerprint; the replay
    maps the generated stream in each worker (not the streaming loader of shards) and copies
    each row out."""
    from dlreplay.replay import ReplayConfig, run_replay

    name = "rows_arrow_w2_b4"
    truth = _truth(name)
    m, _ = _model(name)
    ds, f = m.dataset, m.provenance.fields
    assert ds.format == "arrow" and ds.num_files == 1
    assert ds.num_samples_per_file == truth["samples"]
    assert ds.record_length.mean == truth["record_length"]
    assert f["dataset.num_samples_per_file"].confidence == "measured"
    assert m.reader.memory_map is True and m.reader.streaming is None
    assert ds.layout.rows_per_batch == 48
    assert m.reader.batch_size == truth["batch_size"]
    assert m.reader.read_threads == truth["read_threads"]
    res = run_replay(ReplayConfig(model=m, data_dir=tmp_path / "d", out=tmp_path / "out"))
    assert res.complete
    assert res.metrics["overall"]["samples"] == truth["samples"] * truth["epochs"]
    import pyarrow as pa

    (made,) = (tmp_path / "d" / "train").glob("*.arrow")
    table = pa.ipc.open_stream(pa.memory_map(str(made))).read_all()
    assert table.num_rows == truth["samples"]
    assert len(table.column("x")[0].as_py()) == truth["record_length"] - 8


def test_raw_records_read_through_a_buffer_as_the_job_did(tmp_path: Path) -> None:
    """A JSON-lines file read by ``seek`` + ``readline`` on ``open(path, "rb")``: each sample
    is one read of the file's 4 KiB buffer from the line's offset, more bytes than the line.
    The replay read the record's bytes alone (a JSON-lines job of 512 lines: 2.7 MiB against
    the job's 6.9, similarity 0.85; now 6.0 MiB, 0.92). Where the job's reads were larger
    than its records, the replay's raw reader reads through a buffer of their size (the
    kernel's count of the bytes read: 4096 a record, not 1800)."""
    import os

    from dlreplay.replay.formats import LibraryReader

    path = tmp_path / "train.raw"
    data = os.urandom(64 << 10)
    path.write_bytes(data)
    plain = LibraryReader("raw", open_per_sample=False)
    buffered = LibraryReader("raw", open_per_sample=False, record_buffer=4096)
    try:
        n_plain, got_plain = plain.read_decoded(str(path), 3, (10000, 1800))
        n_buf, got_buf = buffered.read_decoded(str(path), 3, (10000, 1800))
        n_next, _ = buffered.read_decoded(str(path), 9, (30000, 1800))
    finally:
        plain.close()
        buffered.close()
    assert bytes(got_plain) == bytes(got_buf) == data[10000:11800]
    assert n_plain == 1800
    assert n_buf == n_next == 4096
    # only raw records: other formats keep their own reads
    assert LibraryReader("npz", open_per_sample=True, record_buffer=4096).record_buffer == 0


@pytest.mark.parametrize(
    ("fmt", "buffering", "read", "want"),
    [("raw", "buffered", 4096, 4096), ("raw", "buffered", 1024, 0), ("raw", "unbuffered", 4096, 0),
     ("tfrecord", "buffered", 4096, 0)],
)  # fmt: skip
def test_the_record_buffer_is_the_jobs_read_where_it_read_more(
    fmt: str, buffering: str, read: int, want: int
) -> None:
    """The buffer a replay reads raw records through: the job's median read where it exceeded
    the records (1800 B here) and the files were buffered; else none."""
    from dlreplay.model import Distribution
    from dlreplay.replay.loader import WorkerSpec, _record_buffer

    spec = WorkerSpec(
        data_dir="/nonexistent",
        fmt=fmt,
        io="library",
        paths=("a",),
        file_bytes=(18000,),
        records=(tuple((i * 1800, 1800) for i in range(10)),),
        samples_per_file=10,
        open_per_sample=False,
        transfer_size=Distribution.fixed(float(read)),
        preprocess_time=Distribution.fixed(0.0),
        stats_per_sample=0.0,
        lseeks_per_sample=0.0,
        seed=0,
        file_buffering=buffering,
    )
    assert _record_buffer(spec) == want
