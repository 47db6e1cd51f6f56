"""The replay's read primitives (``dlreplay.replay.formats``): reads into one reused
buffer count exactly the bytes a plain ``os.pread`` loop returns, for every transfer size,
range and end of file, buffered and with ``O_DIRECT`` (or its fallback where the file
system has none)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlreplay.replay.formats import (
    DIRECT_ALIGN,
    LibraryReader,
    PosixReader,
    ReadBuffer,
    pread_direct,
    pread_into,
)

SIZE = 3 * DIRECT_ALIGN + 1234


def _reference(path: Path, offset: int, length: int, transfer: int) -> int:
    """Bytes a loop of ``os.pread`` calls returns (what the reader did before)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, end, total = offset, offset + length, 0
        while pos < end:
            got = len(os.pread(fd, min(transfer, end - pos), pos))
            if got == 0:
                break
            total, pos = total + got, pos + got
        return total
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("read") / "f.bin"
    path.write_bytes(os.urandom(SIZE))
    return path


@settings(max_examples=80, deadline=None)
@given(st.integers(0, SIZE + 100), st.integers(0, SIZE + 100), st.integers(1, 2 * DIRECT_ALIGN + 7))
def test_pread_into_counts_what_pread_returns(
    data: Path, offset: int, length: int, transfer: int
) -> None:
    buf = ReadBuffer(16)
    fd = os.open(data, os.O_RDONLY)
    try:
        assert pread_into(fd, buf, offset, length, transfer) == _reference(
            data, offset, length, transfer
        )
        # the buffer holds the bytes of the last call
        if 0 < length and offset < SIZE:
            last = min(offset + length, SIZE)
            got = (last - offset) % transfer or min(transfer, last - offset)
            assert bytes(buf.view(got)) == data.read_bytes()[last - got : last]
    finally:
        os.close(fd)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, SIZE + 100), st.integers(0, SIZE + 100), st.integers(1, 3 * DIRECT_ALIGN))
def test_pread_direct_counts_the_bytes_of_the_range(
    data: Path, offset: int, length: int, transfer: int
) -> None:
    fd = os.open(data, os.O_RDONLY)  # the aligned reads work on any descriptor
    try:
        want = max(0, min(offset + length, SIZE) - offset) if offset < SIZE else 0
        assert pread_direct(fd, ReadBuffer(), offset, length, transfer) == want
    finally:
        os.close(fd)


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("per_sample", [False, True])
def test_posix_reader(data: Path, direct: bool, per_sample: bool) -> None:
    r = PosixReader("raw", per_sample, stats_per_sample=0.5, lseeks_per_sample=1.0, direct=direct)
    try:
        for off, n, t in (
            (0, SIZE, 4096),
            (17, 5000, 1000),
            (SIZE - 10, 100, 64),
            (SIZE + 5, 10, 4),
        ):
            assert r.read(str(data), off, n, t) == _reference(data, off, n, t)
        # O_DIRECT where the file system has it (not tmpfs): then used, else the plain reads
        assert not r.direct_used or direct
    finally:
        r.close()


def test_library_record_reads(data: Path) -> None:
    r = LibraryReader("raw", open_per_sample=False)
    try:
        assert r.read(str(data), 0, [100, 5000]) == 5000
        assert r.read(str(data), 1, [SIZE - 10, 50]) == 10
    finally:
        r.close()


def test_posix_samples_are_read_into_the_reused_buffer_and_not_handed_over(tmp_path: Path) -> None:
    """``--io posix`` in a replay worker: every sample is read into the reader's one buffer and
    the sample handed to the consumer is empty (no new array per sample, no bytes for PyTorch's
    collate to copy), whatever the sample size; the bytes counted are the file's."""
    from dlreplay.model import apply_overrides, model_from_dict
    from dlreplay.replay import GenerateConfig, ReplayConfig, generate_dataset
    from dlreplay.replay.common import read_dataset_manifest
    from dlreplay.replay.loader import SampleReader
    from dlreplay.replay.prepare import worker_spec as _worker_spec

    model = model_from_dict(
        {
            "schema": "dlreplay.workload",
            "format_version": 1,
            "model": {"name": "posix"},
            "dataset": {
                "format": "raw",
                "num_files": 3,
                "num_samples_per_file": 2,
                "record_length": 300_000,
            },
            "reader": {"batch_size": 1, "read_threads": 1},
            "train": {"epochs": 1, "computation_time": 0},
        }
    )
    model = apply_overrides(model, ["reader.transfer_size=65536"])
    generate_dataset(GenerateConfig(model=model, data_dir=tmp_path / "d"))
    spec = _worker_spec(
        ReplayConfig(model=model, data_dir=tmp_path / "d", io="posix"),
        read_dataset_manifest(tmp_path / "d"),
    )
    reader = SampleReader(spec, 0, item_events=False)
    buffers = set()
    for f in range(3):
        for k in range(2):
            nbytes, handed = reader.read_sample(f, k)
            assert nbytes == 300_000 and handed.size == 0
            buffers.add(id(reader.reader.buffer()))
    assert len(buffers) == 1


def test_csv_is_read_in_chunks_like_pandas(tmp_path: Path) -> None:
    """A CSV sample: the whole file in reads of ``text_chunk`` bytes and a last read that returns
    nothing (pandas' ``read_csv`` reads 256 KiB at a time), then the row parsed."""
    path = tmp_path / "a.csv"
    rows = ["data"] + [f"{i:0>900}" for i in range(40)]
    path.write_text("\n".join(rows) + "\n")
    size = path.stat().st_size
    r = LibraryReader("csv", open_per_sample=True, text_chunk=8192)
    nbytes, row = r.read_decoded(str(path), 3, None)
    assert nbytes == size and r.meter.calls == -(-size // 8192) + 1
    assert row.tobytes().decode().lstrip("0") == "3"
    r.close()


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"
)
def test_a_samples_arrays_are_handed_over_as_the_jobs_dataset_returned_them(tmp_path: Path) -> None:
    """An NPZ file of two members (a volume and its label map, as UNet3D's): the torch replay's
    Dataset returns them as two tensors, as the job's returned them (joining them was a copy of
    every sample that the job's workers did not make), then the scalars of the job's other
    tensors, up to the model's batch_tensors; collated, each is one tensor of the batch. More
    arrays than the job's batch had tensors are handed over as one flat array, as before."""
    import numpy as np
    import torch

    from dlreplay.model import Distribution
    from dlreplay.replay.formats import joined
    from dlreplay.replay.loader import WorkerSpec
    from dlreplay.replay.torchloader import ReplayDataset, collate

    rng = np.random.default_rng(3)
    names, sizes = [], []
    for i in range(2):
        x = rng.random((1, 8, 8, 8), dtype=np.float32)
        y = rng.integers(0, 4, (1, 8, 8, 8), dtype=np.uint8)
        np.savez(tmp_path / f"v{i}.npz", x=x, y=y)
        names.append(f"v{i}.npz")
        sizes.append((tmp_path / f"v{i}.npz").stat().st_size)

    def spec(tensors: int) -> WorkerSpec:
        return WorkerSpec(
            data_dir=str(tmp_path),
            fmt="npz",
            io="library",
            paths=tuple(names),
            file_bytes=tuple(sizes),
            records=(None, None),
            samples_per_file=1,
            open_per_sample=True,
            transfer_size=Distribution.unknown(),
            preprocess_time=Distribution.fixed(0.0),
            stats_per_sample=0.0,
            lseeks_per_sample=0.0,
            seed=0,
            batch_tensors=tensors,
        )

    ds = ReplayDataset(spec(5))  # the job's (x, y, bytes, calls, pid)
    samples = [ds[0], ds[1]]
    for i, s in enumerate(samples):
        assert (
            len(s) == 2 + 5 and s[0] >= sizes[i]
        )  # (zipfile reads the directory, then each member)
        with np.load(tmp_path / names[i]) as z:
            assert np.array_equal(s[2].numpy(), z["x"]) and np.array_equal(s[3].numpy(), z["y"])
        assert all(t.shape == () for t in s[4:])
    batch = collate(samples)
    assert batch[0] == [samples[0][0], samples[1][0]] and len(batch) == 2 + 5
    assert batch[2].shape == (2, 1, 8, 8, 8) and batch[2].dtype == torch.float32
    assert batch[3].shape == (2, 1, 8, 8, 8) and batch[3].dtype == torch.uint8
    assert all(t.shape == (2,) for t in batch[4:])
    # the job's batch had one tensor: both arrays as one flat array of their bytes
    one = ReplayDataset(spec(1))[1]
    assert len(one) == 3 and one[2].dtype == torch.uint8 and one[2].numel() == 8**3 * 5
    assert np.array_equal(one[2].numpy(), joined((samples[1][2].numpy(), samples[1][3].numpy())))
    # a file without one of the arrays the others have: that column is concatenated as bytes
    short = (
        samples[1][0],
        samples[1][1],
        samples[1][2],
        *samples[1][4:],
        torch.zeros((), dtype=torch.int64),
    )
    mixed = collate([samples[0], short])
    assert len(mixed) == 2 + 5 and mixed[2].shape == (2, 1, 8, 8, 8)
    assert (
        mixed[3].dtype == torch.uint8 and mixed[3].numel() == 8**3 + 8
    )  # the label map's bytes + a scalar's
    ds.close()
