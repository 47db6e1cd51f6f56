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
def test_pread_into_counts_what_pread_returns(data: Path, offset: int, length: int, transfer: int) -> None:
    buf = ReadBuffer(16)
    fd = os.open(data, os.O_RDONLY)
    try:
        assert pread_into(fd, buf, offset, length, transfer) == _reference(data, offset, length, transfer)
        # the buffer holds the bytes of the last call
        if 0 < length and offset < SIZE:
            last = min(offset + length, SIZE)
            got = (last - offset) % transfer or min(transfer, last - offset)
            assert bytes(buf.view(got)) == data.read_bytes()[last - got:last]
    finally:
        os.close(fd)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, SIZE + 100), st.integers(0, SIZE + 100), st.integers(1, 3 * DIRECT_ALIGN))
def test_pread_direct_counts_the_bytes_of_the_range(data: Path, offset: int, length: int, transfer: int) -> None:
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
        for off, n, t in ((0, SIZE, 4096), (17, 5000, 1000), (SIZE - 10, 100, 64), (SIZE + 5, 10, 4)):
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
    from dlreplay.replay.engine import _worker_spec
    from dlreplay.replay.loader import SampleReader

    model = model_from_dict({
        "schema": "dlreplay.workload", "format_version": 1, "model": {"name": "posix"},
        "dataset": {"format": "raw", "num_files": 3, "num_samples_per_file": 2, "record_length": 300_000},
        "reader": {"batch_size": 1, "read_threads": 1}, "train": {"epochs": 1, "computation_time": 0}})
    model = apply_overrides(model, ["reader.transfer_size=65536"])
    generate_dataset(GenerateConfig(model=model, data_dir=tmp_path / "d"))
    spec = _worker_spec(ReplayConfig(model=model, data_dir=tmp_path / "d", io="posix"),
                        read_dataset_manifest(tmp_path / "d"))
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
