"""DLIO traces replay as DLIO ran: its generator's layout, its readers' samples, its checkpoint files.

What DLIO 2.0.0 writes is reproduced here with DLIO's own calls (``dlio_benchmark/data_generator``,
quoted in :mod:`dlreplay.dlio.generator`), so the tests hold without DLIO installed. No timing is asserted.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import h5py
import numpy as np
import polars as pl
import pytest
from PIL import Image

from dlreplay.analyze import load_trace
from dlreplay.analyze.compare import compare_traces
from dlreplay.analyze.distill import distill
from dlreplay.analyze.layout import layout_from_fingerprint
from dlreplay.capture.fingerprint import fingerprint_dataset
from dlreplay.dlio import dlio_to_model, model_to_dlio
from dlreplay.dlio.generator import (
    array_file_bytes,
    dims_from_file_bytes,
    dims_from_image_bytes,
    generated_dims,
    generated_layout,
    image_file_bytes,
)
from dlreplay.errors import ModelError
from dlreplay.model import Checkpoint, Distribution, apply_overrides, load_yaml_file
from dlreplay.replay import ReplayConfig, run_replay
from dlreplay.replay.common import plan_dataset
from dlreplay.replay.loader import WorkerSpec, dlio_index_files

from .conftest import TRACES

DLIO_TRACES = {
    "dlio_npz_starved": "npz",
    "dlio_h5_multi": "hdf5",
    "dlio_jpeg_ckpt": "jpeg",
    "dlio_npz_2ranks": "npz",
    "dlio_npz_eval": "npz",
}


def _dlio_generate(fmt: str, folder: Path, files: int, spf: int, side: int) -> list[Path]:
    """A dataset written with the calls DLIO 2.0.0's generators make (record_length_stdev 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.random.seed(10)
    paths = []
    for i in range(files):
        path = folder / f"img_{i}_of_{files}.{fmt}"
        if fmt == "npz":  # npz_generator.py
            records = np.random.randint(255, size=(side, side, spf), dtype=np.uint8)
            np.savez(path, x=records, y=[0] * spf)
        elif fmt == "npy":  # npy_generator.py
            np.save(path, np.random.randint(255, size=(side, side, spf), dtype=np.uint8))
        elif fmt == "hdf5":  # hdf5_generator.py (no chunking, no compression)
            records = np.random.randint(255, size=(spf, side, side), dtype=np.uint8)
            hf = h5py.File(path, "w")
            dset = hf.create_dataset(
                "records",
                (spf, side, side),
                chunks=None,
                compression=None,
                compression_opts=None,
                dtype=np.uint8,
            )
            dset[0:spf] = records
            hf.create_dataset("labels", data=[0] * spf)
            hf.close()
        else:  # jpeg_generator.py / png_generator.py
            records = np.random.randint(255, size=(side, side), dtype=np.uint8)
            Image.fromarray(records).save(path, format="JPEG" if fmt == "jpeg" else "PNG", bits=8)
        paths.append(path)
    np.random.seed()
    return paths


@pytest.mark.parametrize(
    ("fmt", "spf", "side"),
    [
        ("npz", 1, 64),
        ("npz", 3, 40),
        ("npy", 2, 32),
        ("hdf5", 4, 48),
        ("jpeg", 1, 64),
        ("png", 1, 40),
    ],
)
def test_generated_layout_is_what_dlio_writes(tmp_path, fmt, spf, side):
    paths = _dlio_generate(fmt, tmp_path / "train", 3, spf, side)
    doc = fingerprint_dataset([str(tmp_path / "train")])
    seen = layout_from_fingerprint(doc, fmt, [str(p) for p in paths], spf, "test")
    assert seen is not None
    # the fingerprint of DLIO's files is a layout DLIO's generator makes, for these sides
    assert generated_dims(fmt, spf, seen.layout) == (side, side)
    ours = generated_layout(fmt, spf, (side, side))
    assert ours is not None and ours.source == "dlio"
    if fmt in ("npz", "npy", "hdf5"):
        key = [
            (m.name, m.dtype, list(m.shape), m.storage or "stored" if fmt == "npz" else m.storage)
            for m in ours.arrays[0].members
        ]
        got = [
            (m.name, m.dtype, list(m.shape), m.storage or "stored" if fmt == "npz" else m.storage)
            for m in seen.layout.arrays[0].members
        ]
        assert sorted(got, key=str) == sorted(key, key=str)
        # the exact size DLIO's file has, and the sides found back from it
        sizes = {p.stat().st_size for p in paths}
        assert sizes == {array_file_bytes(fmt, spf, (side, side))}
        assert dims_from_file_bytes(fmt, spf, sizes.pop()) == (side, side)
    else:
        a, b = seen.layout.images[0], ours.images[0]
        assert (a.width, a.height, a.mode) == (b.width, b.height, b.mode) == (side, side, "L")
        if fmt == "jpeg":
            assert a.quality == b.quality == 75
        median = float(np.median([p.stat().st_size for p in paths]))
        assert abs(image_file_bytes(fmt, (side, side)) - median) <= 0.02 * median
        found = dims_from_image_bytes(fmt, median)
        assert found is not None and abs(found[0] - side) < (8 if fmt == "jpeg" else 1)


def test_hdf5_sides_found_when_the_trace_never_read_the_labels():
    size = array_file_bytes("hdf5", 4, (512, 512))
    assert dims_from_file_bytes("hdf5", 4, size - 32) is None  # exact sizes only, unless told
    assert dims_from_file_bytes("hdf5", 4, size - 32, unseen=32 + 64) == (512, 512)
    assert dims_from_file_bytes("npz", 1, 12345) is None  # not a file DLIO writes


@pytest.mark.parametrize("name", sorted(DLIO_TRACES))
def test_distill_infers_dlio_layout_from_its_trace(name):
    """The layout distilled from a DLIO trace (no fingerprint) is the one DLIO's generator wrote
    for the workload's record length, and the sample its reader hands over is DLIO's resized one."""
    trace = TRACES / name
    exp = json.loads((trace / "expected.json").read_text())["model"]
    loaded = load_trace(trace)
    m = distill(loaded.events, manifest=loaded.manifest, source=str(trace))
    side = int(math.sqrt(exp["record_length"]))
    lay = m.dataset.layout
    assert lay.source == "inferred"
    assert generated_dims(exp["format"], exp["num_samples_per_file"], lay) == (side, side)
    assert m.dataset.record_length_resize == side * side
    prov = m.provenance.fields
    assert (
        prov["dataset.layout"].confidence == "inferred"
        and "DLIO 2.0.0" in prov["dataset.layout"].method
    )
    assert prov["dataset.record_length_resize"].confidence == "inferred"
    # exported, it is DLIO's own workload again
    cfg, _ = model_to_dlio(m)
    assert cfg["dataset"]["record_length_bytes"] == exp["record_length"]


def test_jpeg_file_sizes_from_whole_file_reads():
    """A DLIO 2.0.0 trace (DFTracer 1.x) has no offsets and Pillow never seeks to an image's end:
    each file's size is the bytes read between an open and the next."""
    loaded = load_trace(TRACES / "dlio_jpeg_ckpt")
    m = distill(loaded.events, manifest=loaded.manifest, source=str(TRACES / "dlio_jpeg_ckpt"))
    ev = loaded.events
    reads = ev.filter(
        pl.col("name").cast(pl.String).is_in(["read"])
        & pl.col("file").cast(pl.String).str.ends_with(".jpeg")
    )
    per_file = reads.group_by("file").agg(pl.col("size").sum() / pl.len() * 3)  # 3 reads per open
    assert m.dataset.file_size.is_known
    assert m.dataset.file_size.max == pytest.approx(per_file["size"].max())
    assert m.dataset.record_length.mean == pytest.approx(m.dataset.file_size.mean)


def test_checkpoint_file_writes_are_dlios_calls():
    loaded = load_trace(TRACES / "dlio_jpeg_ckpt")
    m = distill(loaded.events, manifest=loaded.manifest, source=str(TRACES / "dlio_jpeg_ckpt"))
    c = m.checkpoint
    # DLIO 2.0.0: torch.save of the model state (10240 B) and of layer 0 (DLIO's default layer parameters)
    assert c.file_writes == [
        [[704, 1], [10240, 1], [873, 1]],
        [[768, 1], [17371, 1], [101, 1], [24740228, 1], [929, 1]],
    ]
    assert c.files_per_checkpoint == 2 and c.bytes_per_checkpoint == 24771214
    assert c.file_write_plan() == [[704, 10240, 873], [768, 17371, 101, 24740228, 929]]


def test_import_with_dlio_2_0_checkpoint_sizing_writes_what_dlio_wrote(tmp_path: Path):
    """The corpus config sets ``model.model_size``, which DLIO 2.0.0 does not read: it wrote its
    default model state (10240 B) and a layer file of its default layer parameters. Imported
    with DLIO 2.0.0's sizing, the checkpoint is what its trace shows, torch.save's framing
    (3,375 B of 24.8 MB) aside; later releases' reading gives the 4 MiB the key says."""
    from dlreplay.dlio import DLIO_2_0_LAYER_PARAMETERS, dlio_2_0_checkpoint, import_dlio

    config = TRACES / "dlio_jpeg_ckpt" / "dlio_config.yaml"
    old = import_dlio(config, dlio_version="2.0.0").checkpoint
    loaded = load_trace(TRACES / "dlio_jpeg_ckpt")
    wrote = distill(loaded.events, manifest=loaded.manifest, source=str(config.parent)).checkpoint
    assert old.files_per_checkpoint == wrote.files_per_checkpoint == 2
    assert old.bytes_per_checkpoint == 10240 + sum(DLIO_2_0_LAYER_PARAMETERS)
    assert 0 < wrote.bytes_per_checkpoint - old.bytes_per_checkpoint < 4096
    later = import_dlio(config, dlio_version="later")
    assert (later.checkpoint.bytes_per_checkpoint, later.checkpoint.files_per_checkpoint) == (
        4 << 20,
        1,
    )
    assert (
        import_dlio(config).checkpoint.bytes_per_checkpoint == 4 << 20
    )  # auto: the model section sizes it
    assert any(
        "model.model_size is not read by DLIO 2.0.0" in n
        for n in import_dlio(config, dlio_version="2.0.0").provenance.notes
    )
    # optimizer groups (two tensors each and their sum), layers + tensor parallelism, no layers
    assert dlio_2_0_checkpoint(
        model_size=0,
        optimization_groups=[5, 0, 7],
        num_layers=2,
        layer_parameters=[3, 4],
        tensor_parallelism=2,
    ) == (3 * 12 + 4 * 7, 1 + 4)
    assert dlio_2_0_checkpoint(layer_parameters=[]) == (10240, 1)
    assert dlio_2_0_checkpoint(num_layers=0, optimization_groups=[1]) == (10240 + 3, 2)
    with pytest.raises(ModelError, match="unknown DLIO version"):
        import_dlio(config, dlio_version="1.0")


def test_file_writes_checked_and_used_only_when_they_add_up():
    with pytest.raises(ModelError, match=r"file_writes\.0\.1"):
        Checkpoint(enabled=True, bytes_per_checkpoint=10, file_writes=[[[5, 1], [5]]])
    c = Checkpoint(
        enabled=True,
        files_per_checkpoint=1,
        bytes_per_checkpoint=10,
        file_writes=[[[4, 2], [2, 1]]],
    )
    assert c.file_write_plan() == [[4, 4, 2]]
    # an override of the size (or the file count) leaves the recorded calls out
    assert (
        Checkpoint(
            enabled=True,
            files_per_checkpoint=1,
            bytes_per_checkpoint=11,
            file_writes=[[[4, 2], [2, 1]]],
        ).file_write_plan()
        is None
    )
    assert (
        Checkpoint(
            enabled=True,
            files_per_checkpoint=2,
            bytes_per_checkpoint=10,
            file_writes=[[[4, 2], [2, 1]]],
        ).file_write_plan()
        is None
    )


def test_import_dlio_writes_dlios_generator_layout():
    cfg = load_yaml_file(TRACES / "dlio_jpeg_ckpt" / "dlio_config.yaml")
    m = dlio_to_model(cfg, source="dlio_config.yaml")
    assert generated_dims("jpeg", 1, m.dataset.layout) == (256, 256)
    assert m.dataset.layout.source == "dlio"
    # DLIO's record length is the decoded image; on disk it is the encoded one
    assert m.dataset.record_length.value == image_file_bytes("jpeg", (256, 256))
    assert m.dataset.record_length_resize == 65536
    out, warnings = model_to_dlio(m)
    assert out["dataset"]["record_length_bytes"] == 65536
    assert not [w for w in warnings if "layout" in w]
    npz = dlio_to_model(
        load_yaml_file(TRACES / "dlio_npz_starved" / "dlio_config.yaml"), source="npz"
    )
    assert npz.dataset.file_size.value == array_file_bytes("npz", 1, (2048, 2048))


def test_empirical_sizes_are_drawn_stratified():
    """N files drawn from the real files' sizes have their quantiles, not N random draws' noise."""
    real = np.random.default_rng(1).normal(36700, 40, 400).round()
    model = apply_overrides(_small_model(), [])
    from dataclasses import replace

    ds = replace(model.dataset, num_files=64, record_length=Distribution.from_values(real))
    plan = plan_dataset(replace(model, dataset=ds), seed=7)
    sizes = np.sort([f.sizes[0] for f in plan])
    want = ds.record_length.quantile((np.arange(64) + 0.5) / 64)
    # each drawn size lies in its own 1/64 of the probabilities: the ECDFs differ by at most 1/64
    grid = np.concatenate([sizes, want])
    gap = np.abs(
        np.searchsorted(sizes, grid, side="right") - np.searchsorted(want, grid, side="right")
    ).max()
    assert gap <= 1


def _small_model():
    from dlreplay.model import model_from_dict

    return model_from_dict(
        {
            "schema": "dlreplay.workload",
            "format_version": 1,
            "framework": "pytorch",
            "dataset": {
                "format": "jpeg",
                "num_files": 8,
                "num_samples_per_file": 1,
                "record_length": {"type": "fixed", "value": 4096},
            },
            "reader": {"batch_size": 2, "read_threads": 0},
            "train": {"epochs": 1, "computation_time": {"type": "fixed", "value": 0.0}},
        }
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dlio_jpeg_ckpt", "dlio_h5_multi"])
def test_replay_of_a_distilled_dlio_trace_reads_and_writes_as_dlio(tmp_path, name):
    """The traced replay of a DLIO trace's model makes DLIO's reads (read-size KS, bytes) and its
    checkpoint write calls, file by file."""
    trace = TRACES / name
    loaded = load_trace(trace)
    model = distill(loaded.events, manifest=loaded.manifest, source=str(trace))
    model = apply_overrides(model, ["train.computation_time=0.001"])  # timing is not what is tested
    run_replay(
        ReplayConfig(model=model, data_dir=tmp_path / "data", out=tmp_path / "replay"),
        echo=lambda s: None,
    )
    cmp = compare_traces(trace, tmp_path / "replay")
    assert cmp.ks_read_sizes is not None and cmp.ks_read_sizes <= 0.10
    assert cmp.features_b["bytes_read"] == pytest.approx(cmp.features_a["bytes_read"], rel=0.02)
    assert cmp.features_b["bytes_written"] == cmp.features_a["bytes_written"]
    if model.checkpoint.file_writes:
        ev = load_trace(tmp_path / "replay").events
        writes = ev.filter(
            (pl.col("name").cast(pl.String) == "write")
            & pl.col("file").cast(pl.String).str.contains("/checkpoints/")
        )
        per_file = writes.sort("ts").group_by("file", maintain_order=True).agg(pl.col("size"))
        plan = model.checkpoint.file_write_plan()
        assert per_file.height == 2 * 6  # 2 files x 6 checkpoints
        assert sorted(per_file["size"].to_list()) == sorted(plan * 6)


@pytest.mark.slow
def test_dlio_indexed_binary_replays_its_record_index(tmp_path):
    """DLIO 2.0.0 writes an indexed-binary file's record index beside it (``<file>.off.idx``,
    ``<file>.sz.idx``) and every reader of a one-rank run reads all of them when it starts. Distill keeps them out
    of the dataset (8 files, not 24) and records the index; generate writes it; the replay's
    workers read every index whole, then each record with a seek and one read, as DLIO's do."""
    trace = TRACES / "dlio_ib_multi"
    exp = json.loads((trace / "expected.json").read_text())["model"]
    loaded = load_trace(trace)
    model = distill(loaded.events, manifest=loaded.manifest, source=str(trace))
    d = model.dataset
    assert (d.format, d.num_files, d.num_samples_per_file) == (
        "indexed_binary",
        exp["num_files"],
        exp["num_samples_per_file"],
    )
    assert d.record_length.mean == exp["record_length"] and d.layout.index == "dlio"
    assert model.provenance.fields["dataset.layout.index"].confidence == "measured"
    model = apply_overrides(model, ["train.computation_time=0.001"])  # timing is not what is tested
    run_replay(
        ReplayConfig(model=model, data_dir=tmp_path / "data", out=tmp_path / "replay"),
        echo=lambda s: None,
    )
    sides = sorted(p.name for p in (tmp_path / "data").rglob("*.idx"))
    assert len(sides) == 2 * exp["num_files"] and {s.rsplit(".", 2)[-2] for s in sides} == {
        "off",
        "sz",
    }
    cmp = compare_traces(trace, tmp_path / "replay")
    assert cmp.ks_read_sizes is not None and cmp.ks_read_sizes <= 0.10
    assert cmp.features_b["bytes_read"] == pytest.approx(cmp.features_a["bytes_read"], rel=0.02)
    ev = load_trace(tmp_path / "replay").events
    reads = ev.filter(
        pl.col("name").cast(pl.String).is_in(["read", "pread64"]) & (pl.col("size") > 0)
    )
    index = reads.filter(pl.col("file").cast(pl.String).str.ends_with(".idx"))
    # each of the 2 workers read both index files of all 8 data files once, 8 values each
    assert (
        index.group_by("pid").len()["len"].to_list() == [2 * exp["num_files"]] * exp["read_threads"]
    )
    assert set(index["size"].to_list()) == {8 * exp["num_samples_per_file"]}
    data = reads.filter(
        pl.col("file").cast(pl.String).str.starts_with(str(tmp_path / "data" / "train"))
        & ~pl.col("file").cast(pl.String).str.ends_with(".idx")
    )
    assert set(data["size"].to_list()) == {exp["record_length"]}


def _data_read_sizes(trace: Path, files: str) -> dict[int, int]:
    """Read calls of *trace* on the files whose path contains *files*: bytes -> calls."""
    ev = load_trace(trace).events
    reads = ev.filter(
        pl.col("name").cast(pl.String).is_in(["read", "pread", "pread64"])
        & (pl.col("size") > 0)
        & pl.col("file").cast(pl.String).str.contains(files, literal=True)
    )
    return dict(reads.group_by("size").len().rows())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dlio_h5_multi", "sweep/dlio_hdf5_2spf"])
def test_dlio_hdf5_replay_reads_the_records_not_the_labels(tmp_path, name):
    """DLIO 2.0.0's HDF5 files hold ``/records`` and, after them, ``/labels``; its reader reads a
    sample's row of ``/records`` and never ``/labels``. The replay's files put the records
    first too and its workers read the records alone, never opening the labels: the same read
    calls as DLIO's, per size (the replay read the labels too: a 512-byte header and the
    labels' 8-byte values a sample, and its records lay behind them)."""
    trace = TRACES / name
    loaded = load_trace(trace)
    model = distill(loaded.events, manifest=loaded.manifest, source=str(trace))
    members = model.dataset.layout.arrays[0].members
    assert [(m.name, m.read_per_sample) for m in members] == [
        ("/records", True),
        ("/labels", False),
    ]
    model = apply_overrides(model, ["train.computation_time=0.001"])  # timing is not what is tested
    run_replay(
        ReplayConfig(model=model, data_dir=tmp_path / "data", out=tmp_path / "replay"),
        echo=lambda s: None,
    )
    job = _data_read_sizes(trace, "/train/")
    mine = _data_read_sizes(tmp_path / "replay", str(tmp_path / "data" / "train"))
    # the labels are never opened, not even to find the sample arrays: DLIO's calls exactly
    assert mine == job
    with h5py.File(next((tmp_path / "data" / "train").glob("*.h5")), "r") as f:
        assert f["records"].id.get_offset() < f["labels"].id.get_offset()


def _index_reads(trace: Path) -> dict[int, list[str]]:
    """Per reading process of *trace*: the record-index files it read, by name."""
    ev = load_trace(trace).events
    reads = ev.filter(
        pl.col("name").cast(pl.String).is_in(["read", "pread64"])
        & (pl.col("size") > 0)
        & pl.col("file").cast(pl.String).str.ends_with(".idx")
    )
    got = reads.group_by("pid").agg(
        pl.col("file").cast(pl.String).str.extract(r"([^/]+)$").sort().alias("f")
    )
    return {int(p): f for p, f in zip(got["pid"], got["f"], strict=True)}


@pytest.mark.slow
def test_dlio_indexed_binary_ranks_load_the_index_of_their_own_files(tmp_path):
    """DLIO 2.0.0's PyTorch reader loads the record index of the files its rank's block of
    samples is in (``get_global_map_index``), not of every file: 2 ranks over 8 files of 2
    samples load 4 files' indexes each, 8 index reads a worker. The replay's ranks did 16."""
    trace = TRACES / "sweep" / "dlio_ib_2spf_r2"
    exp = json.loads((trace / "expected.json").read_text())["model"]
    job = _index_reads(trace)
    assert sorted(len(v) for v in job.values()) == [8, 8]  # the premise: DLIO's own trace
    loaded = load_trace(trace)
    model = distill(loaded.events, manifest=loaded.manifest, source=str(trace))
    assert (model.processes.ranks, model.dataset.layout.index) == (2, "dlio")
    model = apply_overrides(model, ["train.computation_time=0.001"])  # timing is not what is tested
    run_replay(
        ReplayConfig(model=model, data_dir=tmp_path / "data", out=tmp_path / "replay"),
        echo=lambda s: None,
    )
    mine = _index_reads(tmp_path / "replay")
    assert sorted(len(v) for v in mine.values()) == [8, 8]
    # each worker's 4 files are a rank's block: together every file, none twice
    stems = [sorted({n.rsplit(".", 3)[0] for n in v}) for v in mine.values()]
    assert sorted(len(s) for s in stems) == [4, 4]
    assert sorted(stems[0] + stems[1]) == sorted({n for s in stems for n in s})
    assert len(set(stems[0] + stems[1])) == exp["num_files"]
    cmp = compare_traces(trace, tmp_path / "replay")
    assert cmp.ks_read_sizes is not None and cmp.ks_read_sizes <= 0.10


@pytest.mark.parametrize(
    ("files", "spf", "ranks", "want"),
    [
        (8, 2, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (5, 3, 2, [[0, 1, 2], [2, 3, 4]]),  # 8 samples a rank: file 2 is in both blocks
        (4, 1, 3, [[0, 1], [2, 3], []]),  # 2 a rank: the third rank's block is past the end
        (3, 4, 1, [[0, 1, 2]]),
    ],
)
def test_dlio_index_files_of_each_rank(files, spf, ranks, want):
    base = WorkerSpec(
        data_dir="/d",
        fmt="indexed_binary",
        io="library",
        paths=tuple(f"f{i}" for i in range(files)),
        file_bytes=(0,) * files,
        records=(None,) * files,
        samples_per_file=spf,
        open_per_sample=False,
        transfer_size=Distribution.fixed(1.0),
        preprocess_time=Distribution.fixed(0.0),
        stats_per_sample=0.0,
        lseeks_per_sample=0.0,
        seed=0,
    )
    got = [dlio_index_files(dataclasses.replace(base, rank=r, ranks=ranks)) for r in range(ranks)]
    assert got == want


@pytest.mark.slow
def test_dlio_mmap_indexed_binary_is_mapped_not_read(tmp_path):
    """DLIO 2.0.0's mmap_indexed_binary reader maps each file and its index (np.memmap) and
    takes views of the records that nothing touches: its trace has opens and mmaps, no reads.
    Distill finds the dataset by those maps (it used to stop: "no dataset reads") and marks
    ``reader.memory_map``; the replay maps the files as well and reads nothing either."""
    trace = TRACES / "dlio_ib_mmap"
    exp = json.loads((trace / "expected.json").read_text())["model"]
    loaded = load_trace(trace)
    model = distill(loaded.events, manifest=loaded.manifest, source=str(trace))
    d = model.dataset
    assert (d.format, d.num_files, d.num_samples_per_file, d.layout.index) == (
        "indexed_binary",
        exp["num_files"],
        exp["num_samples_per_file"],
        "dlio",
    )
    assert model.reader.memory_map and d.record_length.mean == exp["record_length"]
    assert model_to_dlio(model)[0]["dataset"]["format"] == "mmap_indexed_binary"
    model = apply_overrides(model, ["train.computation_time=0.001"])  # timing is not what is tested
    run_replay(
        ReplayConfig(model=model, data_dir=tmp_path / "data", out=tmp_path / "replay"),
        echo=lambda s: None,
    )
    ev = load_trace(tmp_path / "replay").events
    data = ev.filter(
        pl.col("file").cast(pl.String).str.starts_with(str(tmp_path / "data" / "train"))
    )
    names = data.group_by(pl.col("name").cast(pl.String)).len()
    assert "mmap64" in names["name"].to_list() or "mmap" in names["name"].to_list()
    assert data.filter(
        pl.col("name").cast(pl.String).is_in(["read", "pread64"]) & (pl.col("size") > 0)
    ).is_empty()
    cmp = compare_traces(trace, tmp_path / "replay")
    assert cmp.similarity >= 0.97
