"""Direct and hybrid I/O: capture and distill ``reader.direct_io`` from a real job's open flags,
the replay's O_DIRECT reads (traced open flags, /proc/self/fdinfo, alignment), and DLIO's
``reader.odirect`` both ways.

One real capture (module fixture) of one PyTorch job that runs four DataLoader loops over four
datasets: every file opened with O_DIRECT (``on``), none (``off``), and two hybrids that open a
file with O_DIRECT when it is at least 64 KiB (16 KiB and 256 KiB files) or 128 KiB (64 KiB and
256 KiB files); each model is distilled from the same trace with its dataset's --data-dir.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from dlreplay.analyze import load_trace
from dlreplay.analyze.distill import distill
from dlreplay.analyze.distill.direct import O_DIRECT, open_flags
from dlreplay.dlio.exporting import model_to_dlio
from dlreplay.dlio.importing import dlio_to_model
from dlreplay.errors import ModelError
from dlreplay.model import model_from_dict
from dlreplay.replay.direct import direct_plan, fd_is_direct
from dlreplay.replay.formats import (
    DIRECT_ALIGN,
    LibraryReader,
    PosixReader,
    ReadBuffer,
    pread_direct,
)

from .conftest import run_cli

KIB = 1024
#: variant -> (mode the job opens files with, its size threshold, the two file sizes)
VARIANTS = {
    "on": ("on", 0, (16 * KIB, 64 * KIB)),
    "off": ("off", 0, (16 * KIB, 64 * KIB)),
    "hybrid64k": ("hybrid", 64 * KIB, (16 * KIB, 256 * KIB)),
    "hybrid128k": ("hybrid", 128 * KIB, (64 * KIB, 256 * KIB)),
}

JOB = textwrap.dedent(
    """
    import mmap, os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Files(Dataset):
        def __init__(self, root, mode, threshold):
            self.paths = sorted(os.path.join(root, p) for p in os.listdir(root))
            self.mode, self.threshold, self.buf = mode, threshold, None

        def __len__(self):
            return len(self.paths)

        def __getitem__(self, i):
            path = self.paths[i]
            size = os.path.getsize(path)
            direct = self.mode == "on" or (self.mode == "hybrid" and size >= self.threshold)
            if self.buf is None:
                self.buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT wants
            fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
            with os.fdopen(fd, "rb", buffering=0) as f:  # one read(2) of the whole file
                return torch.tensor(f.readinto(memoryview(self.buf)[:size]))

    for spec in sys.argv[1:]:
        root, mode, threshold = spec.split(":")
        for batch in DataLoader(Files(root, mode, int(threshold)), batch_size=2, num_workers=1):
            pass
    """
)


def _direct_ok(path: Path) -> bool:
    probe = path / ".odirect-probe"
    probe.write_bytes(b"\0" * DIRECT_ALIGN)
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("direct")
    if not hasattr(os, "O_DIRECT") or not _direct_ok(root):
        pytest.skip(f"the file system of {root} refuses O_DIRECT: nothing to capture or replay")
    return root


@pytest.fixture(scope="module")
def captured(work: Path) -> tuple[Path, object]:
    specs = []
    for name, (mode, threshold, sizes) in VARIANTS.items():
        data = work / name
        data.mkdir()
        for i in range(6):
            (data / f"s{i}.bin").write_bytes(os.urandom(sizes[i % 2]))
        specs.append(f"{data}:{mode}:{threshold}")
    (work / "job.py").write_text(JOB)
    trace = work / "trace"
    run_cli(
        "capture",
        "-q",
        "-o",
        str(trace),
        "--",
        sys.executable,
        "job.py",
        *specs,
        cwd=work,
        check=True,
    )
    return trace, load_trace(trace)


def _model(captured: tuple[Path, object], name: str):
    trace, loaded = captured
    return distill(
        loaded.events,  # type: ignore[attr-defined]
        manifest=loaded.manifest,  # type: ignore[attr-defined]
        data_dirs=[str(trace.parent / name)],
        source=str(trace),
    )


def test_capture_detects_direct_buffered_and_hybrid_reads(captured: tuple[Path, object]) -> None:
    on, off = _model(captured, "on"), _model(captured, "off")
    assert on.reader.direct_io == "on"
    assert on.provenance.fields["reader.direct_io"].confidence == "measured"
    assert off.reader.direct_io == "off"
    h64, h128 = _model(captured, "hybrid64k"), _model(captured, "hybrid128k")
    # the largest buffered read is 16 KiB (64 KiB): the next power of two goes direct
    assert (h64.reader.direct_io, h64.reader.direct_io_threshold) == ("hybrid", 32 * KIB)
    assert (h128.reader.direct_io, h128.reader.direct_io_threshold) == ("hybrid", 128 * KIB)
    assert "reader.direct_io_threshold" in h64.provenance.fields


def _model_dict(direct_io: str | bool, threshold: int = 1 << 20) -> dict:
    return {
        "schema": "dlreplay.workload",
        "format_version": 1,
        "dataset": {
            "format": "npz",
            "num_files": 8,
            "num_samples_per_file": 1,
            "record_length": 65536,
        },
        "reader": {"direct_io": direct_io, "direct_io_threshold": threshold, "batch_size": 2},
        "train": {"epochs": 1, "computation_time": 0.0},
    }


def test_replay_with_direct_io_on_opens_the_dataset_with_o_direct(
    work: Path, tmp_path: Path
) -> None:
    model = tmp_path / "m.yaml"
    model.write_text(yaml.safe_dump(_model_dict("on")))
    out, data = tmp_path / "out", work / "replay-data"
    proc = run_cli(
        "replay",
        str(model),
        "--data-dir",
        str(data),
        "--io",
        "posix",
        "--loader",
        "builtin",
        "-o",
        str(out),
        check=True,
    )
    events = load_trace(out).events
    opens = events.filter(pl.col("name").cast(pl.String).str.starts_with("open")).select(
        pl.col("fhash").cast(pl.String), "file", pl.col("ts"), pl.col("pid").cast(pl.Int64)
    )
    flags = opens.join(open_flags(out), on=["pid", "ts", "fhash"])
    # the reads bypass the page cache: no warning that it served them
    assert "served from memory" not in proc.stdout + proc.stderr
    samples = flags.filter(pl.col("file").cast(pl.String).str.contains(str(data / "train")))
    assert samples.height >= 8  # one open per sample read
    assert ((samples["flags"] & O_DIRECT) != 0).all()
    # npz through its library is read whole through O_DIRECT; hdf5 through h5py is not, and says so
    assert direct_plan(model_from_dict(_model_dict("on")), "library", None) == ("on", [])
    h5 = _model_dict("on")
    h5["dataset"]["format"] = "hdf5"
    plan = direct_plan(model_from_dict(h5), "library", None)
    assert plan[0] == "off" and "--io posix" in plan[1][0]


def _storage_read_bytes() -> int:
    """Bytes this thread has had read from storage (``/proc/thread-self/io`` ``read_bytes``)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/thread-self/io")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_library_npz_reads_whole_files_through_o_direct(work: Path, mode: str) -> None:
    f = work / f"sample-{mode}.npz"
    arrays = {"x": np.arange(50_000, dtype=np.int32), "y": np.ones(3)}
    np.savez(f, **arrays)
    reader = LibraryReader("npz", open_per_sample=True, direct_io=mode, direct_io_threshold=1)
    try:
        first = reader.read_decoded(str(f), 0, None)[1]
        before = _storage_read_bytes()
        reader.read_decoded(str(f), 0, None)  # the file's pages are cached now
        again = _storage_read_bytes() - before
    finally:
        reader.close()
    plain = LibraryReader("npz", open_per_sample=True)
    try:  # the same sample as the library reading the file itself
        expected = plain.read_decoded(str(f), 0, None)[1]
    finally:
        plain.close()
    assert [a.tolist() for a in first] == [a.tolist() for a in expected]
    if mode == "on":  # every read goes to the storage, whatever the page cache holds
        assert again >= f.stat().st_size
    else:
        assert again < f.stat().st_size


def _direct_fds(path: Path) -> list[bool]:
    """O_DIRECT of each of this process's descriptors open on *path*."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                out.append(fd_is_direct(int(fd)))
        except OSError:
            continue
    return out


def test_hybrid_reader_opens_large_reads_direct_and_reads_aligned(work: Path) -> None:
    f = work / "aligned.bin"
    payload = os.urandom(40_000)
    f.write_bytes(payload)
    reader = PosixReader("npz", open_per_sample=False, direct=True)
    try:
        # an unaligned range through O_DIRECT: widened to the alignment, only its bytes counted
        assert reader.read(str(f), 1000, 30_000, 8192, True) == 30_000
        assert _direct_fds(f) == [True]
        assert reader.read(str(f), 0, 100, 100, False) == 100  # a small call: buffered fd too
        assert sorted(_direct_fds(f)) == [False, True]
    finally:
        reader.close()
    fd, buf = os.open(f, os.O_RDONLY | os.O_DIRECT), ReadBuffer()
    try:
        assert pread_direct(fd, buf, 1000, 30_000, 64 * KIB) == 30_000
        assert bytes(buf.view(32 * KIB)[1000:31_000]) == payload[1000:31_000]
    finally:
        os.close(fd)
        buf.close()


def test_dlio_odirect_round_trip() -> None:
    config, warnings = model_to_dlio(model_from_dict(_model_dict("on")))
    assert config["reader"]["odirect"] is True
    back = dlio_to_model(config)
    assert back.reader.direct_io == "on"
    assert back.provenance.fields["reader.direct_io"].method == "DLIO reader.odirect"
    config, _ = model_to_dlio(model_from_dict(_model_dict("off")))
    assert "odirect" not in config["reader"]
    assert dlio_to_model(config).reader.direct_io == "off"
    config, warnings = model_to_dlio(model_from_dict(_model_dict("hybrid")))
    assert "odirect" not in config["reader"]
    assert any("reader.direct_io=hybrid" in w for w in warnings)


def test_yaml_on_and_off_read_as_the_modes() -> None:
    # YAML 1.1 reads a bare `on` as true and `off` as false (as `--set reader.direct_io=on` does)
    d = yaml.safe_load("direct_io: on\nfile_shuffle: off\n")
    assert model_from_dict(_model_dict(d["direct_io"])).reader.direct_io == "on"
    assert model_from_dict(_model_dict(False)).reader.direct_io == "off"  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="direct_io"):
        model_from_dict(_model_dict("sometimes"))
