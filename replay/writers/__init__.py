"""Writing dataset files through the formats' real libraries, with the real files' layout.

:func:`write_file` writes one file of the dataset plan. When the model's
``dataset.layout`` describes the files' inside (a fingerprint of the real dataset, see
:mod:`dlreplay.capture.fingerprint`), the file gets that inside:

* NPZ: the same members in the same order (names, dtypes, shapes), each stored or
  deflated at its level, with numpy's zip64 local headers: ``np.savez`` /
  ``np.savez_compressed`` when that is what the real files look like, else
  :mod:`zipfile` with ``numpy.lib.format.write_array`` (what numpy itself does);
* NPY: ``np.save`` of the dtype and shape;
* HDF5 (h5py): the same groups and datasets, storage (contiguous, chunked, compact),
  chunk shapes, filters (gzip/lzf/szip, shuffle, fletcher32, scale-offset), fill value,
  attributes, chunks written in the real file's order (sequential or scattered),
  superblock version (libver), user block, alignment, metadata block size and file-space strategy;
* JPEG/PNG (Pillow): the dimensions, mode, quantization tables, subsampling,
  progressive/optimized coding, restart interval, PNG interlacing and IDAT chunk size;
* Parquet: columns, types, codecs, dictionary encoding, row groups, and data pages
  (page size, values per write batch, page format version) (pyarrow when installed,
  else polars); CSV: delimiter, header and columns; TFRecord: framed records.

Content is seeded noise shaped to compress like the real content: a share of
incompressible blocks among constant ones, calibrated with the same codec (zlib for
NPZ, an in-memory HDF5 file through h5py for HDF5 filters, Pillow for images), so
deflated members, filtered chunks and images have the real files' sizes. Array formats
whose layout lists several structures pick, per file, the structure nearest the plan's
target size. Without a layout the files are the plan's sizes of random bytes, as before.

One module per kind of file: :mod:`.arrays` (NPZ, NPY), :mod:`.hdf5`, :mod:`.images` (JPEG,
PNG), :mod:`.tables` (Parquet, CSV); :mod:`.content` makes the compressible noise they share.
Record formats (raw, TFRecord, indexed binary) are written here.

Units: bytes; shapes and chunks in elements.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlreplay.checksums import crc32c, masked_crc32c
from dlreplay.model import Layout

from ..common import TMP_SUFFIX, ReplayError
from .arrays import array_data, choose_structure, member_shape, write_array_legacy, write_npz
from .hdf5 import write_hdf5
from .images import image_for, image_legacy
from .shards import write_arrow, write_tar
from .tables import write_csv, write_parquet
from .torchfiles import storage_bytes, write_pt

__all__ = [
    "AUX_SUFFIXES",
    "Written",
    "choose_structure",
    "crc32c",
    "masked_crc32c",
    "tfrecord_frame",
    "write_file",
]


def tfrecord_frame(payload: bytes) -> bytes:
    """One TFRecord: uint64 length, masked CRC of the length, payload, masked CRC of the payload."""
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


# --------------------------------------------------------------------------- results


#: Suffixes of the side files an indexed_binary file may have (its record index).
AUX_SUFFIXES = (".idx", ".off.idx", ".sz.idx")


@dataclass
class Written:
    """One file written: its bytes, record byte ranges (record formats), side-file bytes,
    and what layout it got (``structure``: index into the layout's structures)."""

    bytes: int
    records: list[list[int]] | None = None
    aux_bytes: int = 0
    #: side files by suffix (bytes each) when not one ``.idx`` of ``aux_bytes``
    aux: dict[str, int] | None = None
    structure: int | None = None
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- entry point


def write_file(
    fmt: str, path: Path, sizes: Sequence[int], layout: Layout, rng: np.random.Generator
) -> Written:
    """Write one dataset file at *path* (via a temporary name, then renamed).

    *sizes* are the plan's bytes per sample. Returns a :class:`Written`. OSError
    propagates (the caller names the path).
    """
    tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
    out = Written(bytes=0)
    target = int(sum(sizes))
    if fmt in ("npz", "npy", "hdf5"):
        _write_arrays(fmt, tmp, sizes, layout, rng, out)
    elif fmt in ("jpeg", "png"):
        target = int(sizes[0])  # one image; each of the file's samples reads it whole
        if layout.images:
            i = choose_structure(layout.images, target, rng)
            out.structure = i
            tmp.write_bytes(image_for(layout.images[i], fmt, target, rng))

        else:
            tmp.write_bytes(image_legacy(rng, sizes[0], fmt))
    elif fmt in ("raw", "tfrecord", "indexed_binary"):
        out.records = _write_records(fmt, tmp, sizes, rng)
        if fmt == "indexed_binary":
            _write_index(path, out.records, layout, out)
    elif fmt == "pt":  # a sample's tensors, torch.save'd
        st = None
        if layout.arrays:
            out.structure = choose_structure(layout.arrays, target, rng)
            st = layout.arrays[out.structure]
        out.notes.append(write_pt(tmp, storage_bytes(st, target), rng))
    elif fmt in ("tar", "arrow"):  # shards streamed whole (see .shards)
        out.notes.append((write_tar if fmt == "tar" else write_arrow)(tmp, sizes, layout, rng))
    elif fmt in ("csv", "parquet"):
        t = None
        if layout.tables:
            i = choose_structure(layout.tables, target, rng)
            out.structure, t = i, layout.tables[i]
        out.notes.append(
            write_csv(tmp, sizes, t, rng) if fmt == "csv" else write_parquet(tmp, sizes, t, rng)
        )
    else:  # pragma: no cover - validated by the model
        raise ReplayError(f"unsupported dataset format {fmt!r}")
    _fsync_path(tmp)
    os.replace(tmp, path)
    out.bytes = path.stat().st_size
    return out


def _write_arrays(
    fmt: str,
    tmp: Path,
    sizes: Sequence[int],
    layout: Layout,
    rng: np.random.Generator,
    out: Written,
) -> None:
    """Write an NPZ, NPY or HDF5 file at *tmp*: with the layout's structure nearest the plan's
    size when the layout has arrays (noted in *out*), else the plan's sizes of random bytes."""
    spf = len(sizes)
    target = int(sum(sizes))
    if layout.arrays:
        i = choose_structure(layout.arrays, target, rng)
        s = layout.arrays[i]
        out.structure = i
        if fmt == "npz":
            with open(tmp, "wb") as fh:
                out.notes.append(write_npz(fh, s, spf, rng))
        elif fmt == "npy":
            m = s.members[0]
            with open(tmp, "wb") as fh:
                np.save(fh, array_data(m, member_shape(m, s.samples, spf), rng, 1.0))
        else:
            out.notes.append(write_hdf5(tmp, s, layout, spf, rng))
    else:
        write_array_legacy(fmt, tmp, sizes, layout, rng)


def _write_records(
    fmt: str, tmp: Path, sizes: Sequence[int], rng: np.random.Generator
) -> list[list[int]]:
    """Write a record file (raw, TFRecord, indexed binary) of one record of random bytes per
    sample at *tmp*; returns each record's [offset, length]."""
    records: list[list[int]] = []
    pos = 0
    with open(tmp, "wb") as fh:
        for sz in sizes:
            payload = rng.bytes(sz)
            blob = tfrecord_frame(payload) if fmt == "tfrecord" else payload
            fh.write(blob)
            records.append([pos, len(blob)])
            pos += len(blob)
    return records


def _write_index(path: Path, records: list[list[int]], layout: Layout, out: Written) -> None:
    """Write the record index of the indexed binary file *path* beside it (each side file via a
    temporary name, then renamed); its bytes go into *out*."""
    rec = np.asarray(records, dtype="<u8").reshape(-1, 2)
    # dlreplay's index: (offset, length) pairs in one file; DLIO 2.0's: offsets and
    # sizes in two (its generator's struct 'Q', little-endian here)
    sides = (
        {".off.idx": rec[:, 0], ".sz.idx": rec[:, 1]} if layout.index == "dlio" else {".idx": rec}
    )
    for suffix, values in sides.items():
        side = path.with_name(path.name + suffix)
        side_tmp = side.with_name(f".{side.name}{TMP_SUFFIX}")
        side_tmp.write_bytes(np.ascontiguousarray(values).tobytes())
        _fsync_path(side_tmp)
        os.replace(side_tmp, side)
    sizes_of = {suffix: path.with_name(path.name + suffix).stat().st_size for suffix in sides}
    out.aux_bytes = sum(sizes_of.values())
    if layout.index == "dlio":
        out.aux = sizes_of


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
