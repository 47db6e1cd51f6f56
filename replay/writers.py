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

Units: bytes; shapes and chunks in elements.
"""

from __future__ import annotations

import ast
import io
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.checksums import crc32c, masked_crc32c
from dlreplay.model import ArrayFile, ArrayMember, ImageFile, Layout, TableFile

from .common import TMP_SUFFIX, ReplayError

__all__ = [
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
    return length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))


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


# --------------------------------------------------------------------------- compressible content


def _block_pattern(n: int, share: float, block: int) -> np.ndarray:
    """Boolean per block of *block* bytes over *n* bytes: True = random, spread evenly, *share* of them."""
    nb = max(1, -(-n // block))
    k = int(round(min(max(share, 0.0), 1.0) * nb))
    mask = np.zeros(nb, dtype=bool)
    if k:
        mask[np.unique(np.floor(np.arange(k) * nb / k).astype(np.int64))] = True
    return mask


def _fill(n: int, share: float, rng: np.random.Generator, block: int) -> np.ndarray:
    """*n* bytes (uint8): *share* of blocks random, the rest a constant byte."""
    if share >= 1.0:
        return np.frombuffer(rng.bytes(n), dtype=np.uint8).copy()
    mask = _block_pattern(n, share, block)
    out = np.full(mask.size * block, 0x2A, dtype=np.uint8)
    idx = np.flatnonzero(mask)
    if idx.size:
        rand = np.frombuffer(rng.bytes(idx.size * block), dtype=np.uint8).reshape(idx.size, block)
        out.reshape(-1, block)[idx] = rand
    return out[:n]


def _block_for(n: int) -> int:
    """Block size of the random/constant pattern for *n* bytes: small enough to spread evenly."""
    return int(min(4096, max(16, 1 << int(math.log2(max(n // 64, 16))))))


def _calibrate(measure: Callable[[float], float], target: float, tol: float = 0.005) -> float:
    """The random share s in [0, 1] with measure(s) ~= target (a ratio), by secant/bisection."""
    lo, hi = 0.0, 1.0
    m_lo, m_hi = measure(lo), measure(hi)
    if target <= m_lo:
        return lo
    if target >= m_hi:
        return hi
    s = (target - m_lo) / (m_hi - m_lo)
    for _ in range(8):
        m = measure(s)
        if abs(m - target) <= tol * max(target, 1e-3):
            return s
        if m < target:
            lo, m_lo = s, m
        else:
            hi, m_hi = s, m
        s = lo + (target - m_lo) * (hi - lo) / max(m_hi - m_lo, 1e-12)
        s = min(max(s, lo + 1e-6), hi - 1e-6)
    return s


@lru_cache(maxsize=256)
def _deflate_share(n: int, ratio: float, level: int, header: bytes = b"") -> float:
    """Random share of *n* content bytes giving a raw-deflate ratio of *ratio* at *level* for
    the stream *header* + content (an NPZ member: the NPY header, then the array)."""
    probe = min(n, 4 << 20)
    block = _block_for(n)
    rng = np.random.default_rng(12345)

    def measure(share: float) -> float:
        data = header + _fill(probe, share, rng, block).tobytes()
        c = zlib.compressobj(level, zlib.DEFLATED, -15)
        return (len(c.compress(data)) + len(c.flush())) / len(data)

    return _calibrate(measure, ratio)


# --------------------------------------------------------------------------- arrays


def _dtype(spec: str) -> np.dtype:
    if spec.startswith("["):
        return np.dtype(ast.literal_eval(spec))
    return np.dtype(spec)


def _member_shape(m: ArrayMember, samples_from: int | None, samples_to: int) -> tuple[int, ...]:
    shape = list(m.shape)
    if samples_from is not None and shape and shape[0] == samples_from and samples_from != samples_to:
        shape[0] = samples_to
    return tuple(shape)


def _nbytes(shape: Sequence[int], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def structure_bytes(s: ArrayFile) -> int:
    """Logical bytes of a structure's arrays (the file size without headers and compression)."""
    total = 0
    for m in s.members:
        if m.dtype in ("vlen-str", "vlen"):
            continue
        total += int(_nbytes(m.shape, _dtype(m.dtype)) * (m.compression_ratio or 1.0))
    return total


def choose_structure(structures: Sequence[Any], target: int, rng: np.random.Generator) -> int:
    """Index of the structure for a file of *target* bytes.

    The structure of the sampled file nearest in size (``file_bytes``), so the plan's
    sizes, drawn from the real size distribution, bring each structure in its share and
    with its sizes; else the nearest median ``bytes``; else one drawn by ``weight``.
    """
    if len(structures) == 1:
        return 0
    files = [(abs(int(b) - target), i) for i, s in enumerate(structures) for b in (s.file_bytes or ())]
    if files:
        best = min(d for d, _ in files)
        tied = sorted({i for d, i in files if d == best})
        return tied[int(rng.integers(len(tied)))] if len(tied) > 1 else tied[0]
    known = [(abs(int(s.bytes) - target), -s.weight, i) for i, s in enumerate(structures) if s.bytes is not None]
    if known:
        return min(known)[2]
    p = np.asarray([s.weight for s in structures], dtype=float)
    return int(rng.choice(len(p), p=p / p.sum()))


def _array_data(m: ArrayMember, shape: tuple[int, ...], rng: np.random.Generator, share: float) -> np.ndarray:
    dt = _dtype(m.dtype)
    n = _nbytes(shape, dt)
    raw = _fill(n, share, rng, _block_for(n))
    arr = raw.view(dt) if dt.itemsize and n else np.zeros(shape, dtype=dt)
    return arr.reshape(shape, order="F") if m.fortran_order else arr.reshape(shape)


def _npy_header(m: ArrayMember, shape: tuple[int, ...]) -> bytes:
    """The NPY header numpy writes for member *m* of *shape*."""
    from numpy.lib import format as npformat

    buf = io.BytesIO()
    arr = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=_dtype(m.dtype)), shape=shape, strides=(0,) * len(shape))
    header = npformat.header_data_from_array_1_0(arr)
    header["fortran_order"] = m.fortran_order
    try:
        npformat.write_array_header_1_0(buf, header)
    except ValueError:  # too large for a version 1.0 header
        npformat.write_array_header_2_0(buf, header)
    return buf.getvalue()


def _write_npz(fh: Any, s: ArrayFile, spf: int, rng: np.random.Generator) -> str:
    """One NPZ with the structure's members; returns the writer used."""
    from numpy.lib import format as npformat

    members = s.members
    storages = {m.storage or "stored" for m in members}
    levels = {m.compression_level for m in members if m.storage == "deflated"}
    plain = (all(m.name.endswith(".npy") and m.zip64 for m in members) and len(storages) == 1
             and levels <= {None, 6})
    datas = []
    for m in members:
        shape = _member_shape(m, s.samples, spf)
        share = 1.0
        if m.storage == "deflated" and m.compression_ratio is not None and m.compression_ratio < 0.98:
            share = _deflate_share(max(_nbytes(shape, _dtype(m.dtype)), 1), round(m.compression_ratio, 4),
                                   m.compression_level if m.compression_level is not None else 6,
                                   _npy_header(m, shape) if m.name.endswith(".npy") else b"")
        datas.append(_array_data(m, shape, rng, share) if m.name.endswith(".npy") or not m.name
                     else _fill(max(int(np.prod(shape)) if shape else 0, 0), share, rng, 4096))
    if plain:
        arrays: dict[str, Any] = {m.name[:-4]: d for m, d in zip(members, datas, strict=True)}
        if storages == {"deflated"}:
            np.savez_compressed(fh, **arrays)
            return "numpy.savez_compressed"
        np.savez(fh, **arrays)
        return "numpy.savez"
    with zipfile.ZipFile(fh, "w", allowZip64=True) as zf:
        for m, d in zip(members, datas, strict=True):
            info = zipfile.ZipInfo(m.name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED if m.storage == "deflated" else zipfile.ZIP_STORED
            level = m.compression_level if m.storage == "deflated" else None
            for attr in ("compress_level", "_compresslevel"):
                try:
                    setattr(info, attr, level)
                except AttributeError:
                    pass
            with zf.open(info, "w", force_zip64=m.zip64) as out:
                if m.name.endswith(".npy"):
                    npformat.write_array(out, d, allow_pickle=False)
                else:
                    out.write(d.tobytes())
    return "zipfile + numpy.lib.format.write_array"


# -- HDF5 ------------------------------------------------------------------------


_LIBVER = {2: ("v108", "latest"), 3: ("v110", "latest")}


def _h5_filters(m: ArrayMember) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if m.compression:
        kw["compression"] = m.compression
        if m.compression in ("gzip",) and m.compression_level is not None:
            kw["compression_opts"] = m.compression_level
    if m.shuffle:
        kw["shuffle"] = True
    if m.fletcher32:
        kw["fletcher32"] = True
    if m.scaleoffset is not None:
        kw["scaleoffset"] = m.scaleoffset
    return kw


@lru_cache(maxsize=256)
def _h5_share(dtype: str, shape: tuple[int, ...], chunks: tuple[int, ...], filters: tuple[tuple[str, Any], ...],
              fill: float | None, ratio: float) -> float:
    """Random share per chunk giving stored/logical bytes = *ratio* through h5py's own filters.

    Measured on an in-memory file with the dataset's chunks and edge chunks (the first
    axis cut to about 4 MiB), since padding in edge chunks compresses too.
    """
    import h5py

    dt = _dtype(dtype)
    row = max(_nbytes(shape[1:], dt), 1)
    rows = min(shape[0], max(chunks[0], ((4 << 20) // row) // chunks[0] * chunks[0]))
    probe = (rows, *shape[1:])
    rng = np.random.default_rng(12345)
    kw = {"fillvalue": fill} if fill is not None else {}

    def measure(share: float) -> float:
        arr = _chunked_fill(probe, chunks, dt, share, rng)
        with h5py.File(f"dlreplay-calibration-{os.getpid()}.h5", "w", driver="core", backing_store=False) as f:
            ds = f.create_dataset("x", data=arr, chunks=chunks, **kw, **dict(filters))
            return ds.id.get_storage_size() / max(arr.nbytes, 1)

    return _calibrate(measure, ratio)


def _chunked_fill(shape: tuple[int, ...], chunks: tuple[int, ...], dt: np.dtype, share: float,
                  rng: np.random.Generator) -> np.ndarray:
    """An array whose every chunk holds the random/constant pattern in chunk-local order."""
    grid = [-(-s // c) for s, c in zip(shape, chunks, strict=True)]
    n_chunk = _nbytes(chunks, dt)
    count = int(np.prod(grid, dtype=np.int64))
    flat = np.concatenate([_fill(n_chunk, share, rng, _block_for(n_chunk)) for _ in range(count)]) \
        if share < 1.0 else np.frombuffer(rng.bytes(n_chunk * count), dtype=np.uint8)
    blocks = flat.view(dt).reshape(*grid, *chunks)
    nd = len(shape)
    order = [a for i in range(nd) for a in (i, nd + i)]
    padded = blocks.transpose(order).reshape([g * c for g, c in zip(grid, chunks, strict=True)])
    return padded[tuple(slice(0, s) for s in shape)]


def _chunk_slices(shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[tuple[slice, ...]]:
    grid = [range(0, s, c) for s, c in zip(shape, chunks, strict=True)]
    out = []
    for idx in np.ndindex(*[len(g) for g in grid]):
        out.append(tuple(slice(g[i], min(g[i] + c, s)) for g, i, c, s in zip(grid, idx, chunks, shape, strict=True)))
    return out


def _attrs(obj: Any, count: int, nbytes: int, vlen: int = 0) -> None:
    """*count* attributes on *obj*: *vlen* variable-length strings (h5py's default for str),
    the others fixed-size arrays sharing *nbytes* bytes of values."""
    for i in range(min(vlen, count)):
        obj.attrs[f"text_{i:03d}"] = "x" * 8
    fixed = count - min(vlen, count)
    if fixed <= 0:
        return
    nbytes = max(nbytes - 16 * min(vlen, count), 0)
    each = [nbytes // fixed + (1 if i < nbytes % fixed else 0) for i in range(fixed)]
    for i, n in enumerate(each):
        obj.attrs[f"attr_{i:03d}"] = np.zeros(max(n, 1), dtype=np.uint8) if n != 1 else np.uint8(0)


def _write_hdf5(tmp: Path, s: ArrayFile, layout: Layout, spf: int, rng: np.random.Generator) -> str:
    import h5py

    h = layout.hdf5
    kw: dict[str, Any] = {}
    if h is not None:
        if h.superblock_version in _LIBVER:
            kw["libver"] = _LIBVER[h.superblock_version]
        if h.userblock_size:
            kw["userblock_size"] = h.userblock_size
        if h.alignment_interval:
            kw.update(alignment_threshold=max(h.alignment_threshold or 1, 1), alignment_interval=h.alignment_interval)
        if h.meta_block_size:
            kw["meta_block_size"] = h.meta_block_size
        if h.file_space_strategy in ("page", "aggr", "none"):  # fsm_aggr is HDF5's default
            kw["fs_strategy"] = {"page": "page", "aggr": "aggregate", "none": "none"}[h.file_space_strategy]
            if h.file_space_strategy == "page" and h.file_space_page_size:
                kw["fs_page_size"] = h.file_space_page_size
    with h5py.File(tmp, "w", **kw) as f:
        if h is not None:
            _attrs(f, h.root_attributes, h.root_attribute_bytes, h.root_vlen_attributes)
        for g in s.groups:
            f.require_group(g)
        for m in s.members:
            _write_h5_dataset(f, m, s, spf, rng)
    return f"h5py {h5py.version.version} (HDF5 {h5py.version.hdf5_version})"


def _write_h5_dataset(f: Any, m: ArrayMember, s: ArrayFile, spf: int, rng: np.random.Generator) -> None:
    import h5py

    shape = _member_shape(m, s.samples, spf)
    if m.dtype in ("vlen-str", "vlen"):
        n = int(np.prod(shape, dtype=np.int64))
        ds = f.create_dataset(m.name, shape=shape, dtype=h5py.string_dtype())
        if n:
            ds[...] = np.array([rng.bytes(4).hex() for _ in range(n)], dtype=object).reshape(shape)
        _attrs(ds, m.attributes, m.attribute_bytes, m.vlen_attributes)
        return
    dt = _dtype(m.dtype)
    kw: dict[str, Any] = {"track_times": m.track_times}
    if m.fill_value is not None:
        kw["fillvalue"] = m.fill_value
    chunks = None
    if m.storage == "chunked" and m.chunks:
        chunks = tuple(max(1, min(c, d)) if d else c for c, d in zip(m.chunks, shape, strict=False))
        kw.update(chunks=chunks, **_h5_filters(m))
        if 0 in shape:
            kw["maxshape"] = tuple(None if d == 0 else d for d in shape)
    elif m.storage == "compact":
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        kw["dcpl"] = dcpl
    ds = f.create_dataset(m.name, shape=shape, dtype=dt, **kw)
    _attrs(ds, m.attributes, m.attribute_bytes, m.vlen_attributes)
    if not _nbytes(shape, dt):
        return
    if chunks is None:
        if not shape:  # a scalar
            ds[()] = _array_data(m, (), rng, 1.0)
            return
        rows = _slab_rows(shape, dt, 1)
        for r0 in range(0, shape[0], rows):  # bounded memory for large datasets
            part = (min(rows, shape[0] - r0), *shape[1:])
            ds[r0:r0 + part[0]] = _array_data(m, part, rng, 1.0)
        return
    share = 1.0
    filters = tuple(sorted(_h5_filters(m).items()))
    if filters and m.compression_ratio is not None:
        share = _h5_share(m.dtype, shape, chunks, filters, m.fill_value, round(m.compression_ratio, 4))
    sparse = m.chunks_allocated is not None and m.chunks_allocated < 1.0
    if not sparse and m.chunk_order != "scattered":
        rows = _slab_rows(shape, dt, chunks[0])  # whole chunk rows, so each chunk holds the pattern
        for r0 in range(0, shape[0], rows):
            part = (min(rows, shape[0] - r0), *shape[1:])
            ds[r0:r0 + part[0]] = _chunked_fill(part, chunks, dt, share, rng)
        return
    slices = _chunk_slices(shape, chunks)
    if sparse:
        keep = int(round((m.chunks_allocated or 0.0) * len(slices)))
        slices = [slices[i] for i in sorted(rng.choice(len(slices), size=keep, replace=False))]
    order = rng.permutation(len(slices)) if m.chunk_order == "scattered" else range(len(slices))
    for i in order:
        sl = slices[i]
        block = tuple(x.stop - x.start for x in sl)
        ds[sl] = _chunked_fill(block, chunks, dt, share, rng) if block == chunks else \
            _chunked_fill(chunks, chunks, dt, share, rng)[tuple(slice(0, b) for b in block)]


#: Bytes of array data generated at a time (a slab of rows) when writing an HDF5 dataset.
_SLAB_BYTES = 64 << 20


def _slab_rows(shape: tuple[int, ...], dt: np.dtype, multiple: int) -> int:
    """Rows per slab: about :data:`_SLAB_BYTES`, a multiple of *multiple* (chunk rows)."""
    if not shape:
        return 1
    row = max(_nbytes(shape[1:], dt), 1)
    rows = max(1, _SLAB_BYTES // row)
    return max(multiple, rows // multiple * multiple)


def _write_array_legacy(fmt: str, tmp: Path, sizes: Sequence[int], layout: Layout, rng: np.random.Generator) -> None:
    """Files of random bytes shaped (samples, record length): models without a fingerprint."""
    n = len(sizes)
    arr = np.frombuffer(rng.bytes(n * sizes[0]), dtype=np.uint8).reshape(n, sizes[0])
    if fmt == "npz":
        with open(tmp, "wb") as fh:
            (np.savez_compressed if layout.compressed else np.savez)(fh, x=arr)
    elif fmt == "npy":
        with open(tmp, "wb") as fh:
            np.save(fh, arr)
    else:
        import h5py

        kw: dict[str, Any] = {}
        if layout.hdf5_chunk_shape:
            kw["chunks"] = tuple(max(1, min(c, d)) for c, d in zip(layout.hdf5_chunk_shape, arr.shape, strict=False))
            if len(kw["chunks"]) != arr.ndim:
                kw["chunks"] = (kw["chunks"][0], arr.shape[1])
        elif layout.hdf5_chunk_bytes:
            kw["chunks"] = (max(1, min(n, layout.hdf5_chunk_bytes // sizes[0])), sizes[0])
        if layout.hdf5_compression:
            kw["compression"] = layout.hdf5_compression
            if layout.hdf5_compression == "gzip" and layout.compression_level is not None:
                kw["compression_opts"] = layout.compression_level
        with h5py.File(tmp, "w") as h5:
            h5.create_dataset("records", data=arr, **kw)


# --------------------------------------------------------------------------- images


_MODE_CHANNELS = {"1": 1, "L": 1, "P": 1, "I;16": 1, "I": 1, "F": 1, "LA": 2, "RGB": 3, "YCbCr": 3,
                  "RGBA": 4, "CMYK": 4}


def _image_pixels(width: int, height: int, mode: str, share: float, rng: np.random.Generator,
                  bits: int | None = None) -> Any:
    """A Pillow image of noise whose amplitude is *share* (0: flat grey, 1: full-range noise).

    The encoded size grows continuously with the amplitude, for any image size (tiles of
    noise among flat ones give too few steps on small images). Palette images get a
    palette of 2**bits colours (Pillow writes the PNG bit depth from it).
    """
    from PIL import Image

    channels = _MODE_CHANNELS.get(mode, 3)
    share = min(max(share, 0.0), 1.0)
    if mode in ("I;16", "I"):
        noise = rng.integers(0, 65536, size=(height, width)).astype(np.float64) - 32768
        arr16 = np.clip(np.rint(32768 + share * noise), 0, 65535).astype(np.uint16)
        return Image.fromarray(arr16)  # I;16 (Pillow 13 refuses the mode argument for it)
    noise = rng.integers(0, 256, size=(height, width, channels)).astype(np.float64) - 128
    arr = np.clip(np.rint(128 + share * noise), 0, 255).astype(np.uint8)
    if mode in ("RGBA", "LA"):
        arr[..., -1] = 255  # opaque alpha, as photos with an alpha channel mostly are
    if channels == 1:
        arr = arr[..., 0]
    if mode == "1":
        return Image.fromarray(arr > 127)
    if mode == "P":
        colours = 1 << (bits or 8)
        img = Image.frombytes("P", (width, height), (arr.astype(np.int64) * colours // 256).astype(np.uint8).tobytes())
        img.putpalette([v for c in range(colours) for v in (c, 255 - c, (c * 7) % 256)])
        return img
    if mode == "CMYK":
        return Image.fromarray(arr, "CMYK")
    return Image.fromarray(arr, {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}[channels])


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """The (type, payload) of each chunk of the PNG *data*, in order (the signature skipped)."""
    out, pos = [], 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        out.append((kind, data[pos + 8:pos + 8 + length]))
        pos += 12 + length
    return out


def _png_frame(kind: bytes, payload: bytes) -> bytes:
    """One PNG chunk: length, type, payload, CRC."""
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png_rechunk(data: bytes, chunk_bytes: int | None, extra_bytes: int) -> bytes:
    """The PNG with its IDAT data re-split into *chunk_bytes* chunks and *extra_bytes* of text chunk."""
    chunks = _png_chunks(data)
    kinds = [k for k, _ in chunks]
    first = kinds.index(b"IDAT") if b"IDAT" in kinds else len(chunks)
    idat = b"".join(p for k, p in chunks if k == b"IDAT")
    head = chunks[:first]
    tail = [c for c in chunks[first:] if c[0] != b"IDAT"]
    extras = []
    if extra_bytes >= 12 + len(b"Comment\0") + 1:
        extras.append((b"tEXt", b"Comment\0" + b"x" * (extra_bytes - 12 - len(b"Comment\0"))))
    size = chunk_bytes or max(len(idat), 1)
    pieces = [(b"IDAT", idat[i:i + size]) for i in range(0, max(len(idat), 1), size)]
    return data[:8] + b"".join(_png_frame(k, p) for k, p in [*head, *extras, *pieces, *tail])


#: Adam7's seven passes: (first column, first row, column step, row step).
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _filter_rows(raw: np.ndarray, bpp: int, adaptive: bool) -> np.ndarray:
    """PNG scanlines (filter byte + filtered bytes) of the byte rows *raw* (rows x bytes) whose
    pixels are *bpp* bytes: per row the filter of least absolute sum (libpng's and Pillow's
    heuristic) when *adaptive*, else none (as Pillow writes palette and sub-byte images)."""
    h, n = raw.shape
    out = np.empty((h, n + 1), dtype=np.uint8)
    if not adaptive:
        out[:, 0] = 0
        out[:, 1:] = raw
        return out
    r = raw.astype(np.int16)
    left = np.zeros_like(r)
    left[:, bpp:] = r[:, :-bpp]
    up = np.zeros_like(r)
    up[1:] = r[:-1]
    corner = np.zeros_like(r)
    corner[1:, bpp:] = r[:-1, :-bpp]
    p = left + up - corner
    pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - corner)
    paeth = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, corner))
    cands = (np.stack([r, r - left, r - up, r - (left + up) // 2, r - paeth]) & 0xFF).astype(np.uint8)
    best = np.abs(cands.view(np.int8).astype(np.int16)).sum(axis=2).argmin(axis=0)
    out[:, 0] = best
    out[:, 1:] = cands[best, np.arange(h)]
    return out


def _png_interlaced(data: bytes, img: Any) -> bytes | None:
    """Pillow's PNG *data* of *img* again with Adam7 interlacing (Pillow cannot write it):
    the same chunks, IHDR's interlace method 1, and IDAT the seven passes' scanlines
    deflated at Pillow's default level. None for a pixel layout this does not handle."""
    if data[12:16] != b"IHDR":
        return None
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    px = np.asarray(img)
    if px.dtype == bool:
        px = px.astype(np.uint8)
    if px.ndim == 2:
        px = px[..., None]
    if px.shape[:2] != (height, width) or depth not in (1, 2, 4, 8, 16):
        return None
    if depth == 16:
        px = px.astype(">u2").view(np.uint8).reshape(height, width, -1)
    elif px.dtype != np.uint8:
        return None
    bpp = px.shape[2] if depth >= 8 else 1  # bytes per pixel (16-bit samples are two bytes each by now)
    stream = []
    for x0, y0, dx, dy in _ADAM7:
        sub = px[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        if depth < 8:  # pack the samples of a row into bytes, first pixel in the high bits
            k = 8 // depth
            cols = sub.shape[1]
            padded = np.zeros((sub.shape[0], -(-cols // k) * k), dtype=np.uint16)
            padded[:, :cols] = sub[..., 0]
            shifts = (8 - depth - depth * np.arange(k)).astype(np.uint16)
            rows = (padded.reshape(sub.shape[0], -1, k) << shifts).sum(axis=2).astype(np.uint8)
        else:
            rows = np.ascontiguousarray(sub).reshape(sub.shape[0], -1)
        stream.append(_filter_rows(rows, bpp, adaptive=color != 3 and depth >= 8).tobytes())
    out: list[tuple[bytes, bytes]] = []
    for kind, payload in _png_chunks(data):
        if kind == b"IHDR":
            out.append((kind, payload[:12] + b"\x01"))  # interlace method 1: Adam7
        elif kind != b"IDAT":
            out.append((kind, payload))
        elif not any(k == b"IDAT" for k, _ in out):  # the passes, where the first IDAT was
            out.append((kind, zlib.compress(b"".join(stream), 6)))
    return data[:8] + b"".join(_png_frame(k, p) for k, p in out)


def _encode_image(img: Any, fmt: str, t: ImageFile) -> bytes:
    bio = io.BytesIO()
    if fmt == "jpeg":
        kw: dict[str, Any] = {"progressive": t.progressive, "optimize": t.optimize}
        if t.qtables:
            kw["qtables"] = [list(q) for q in t.qtables]
        elif t.quality:
            kw["quality"] = t.quality
        else:
            kw["quality"] = 90
        if t.subsampling and img.mode not in ("L", "1"):
            kw["subsampling"] = t.subsampling
        if t.restart_interval:
            kw["restart_marker_blocks"] = t.restart_interval
        if t.extra_bytes > 4:
            kw["comment"] = b"x" * (t.extra_bytes - 4)
        img.save(bio, format="JPEG", **kw)
        return bio.getvalue()
    img.save(bio, format="PNG")
    data = bio.getvalue()
    if t.interlaced:
        data = _png_interlaced(data, img) or data
    return _png_rechunk(data, t.chunk_bytes, t.extra_bytes)


#: Noise amplitudes at which each kind of image is encoded once to map amplitude -> bytes.
_CURVE_SHARES = (0.0, 0.05, 0.15, 0.3, 0.5, 0.75, 1.0)


_SIZE_CURVES: dict[str, tuple[tuple[float, int], ...]] = {}


def _size_curve(t: ImageFile, fmt: str) -> tuple[tuple[float, int], ...]:
    """(noise amplitude, encoded bytes) of image kind *t* with a fixed seed: the same in every
    generator process, so where a file's search starts never depends on the files before it."""
    key = f"{fmt}{t!r}"
    if key not in _SIZE_CURVES:
        rng = np.random.default_rng(0x1A6E)
        _SIZE_CURVES[key] = tuple(
            (share, len(_encode_image(_image_pixels(t.width, t.height, t.mode, share, rng, t.bits), fmt, t)))
            for share in _CURVE_SHARES)
    return _SIZE_CURVES[key]


#: Relative distance from its planned size at which an image is kept (the planned sizes come from
#: the real files: a trace's read sizes are these sizes to the byte).
IMAGE_SIZE_TOLERANCE = 0.0002


def _image_for(t: ImageFile, fmt: str, target: int, rng: np.random.Generator) -> bytes:
    """An image of kind *t* whose encoded size is as close to *target* bytes as content allows.

    The amplitude comes from the kind's size curve, then secant steps on this file's own
    encodes; where the size no longer follows the amplitude closely enough (near full-range
    noise, sizes vary with the content by tens of bytes), other content at the best amplitude
    so far. Up to 8 encodes, kept within IMAGE_SIZE_TOLERANCE; the result depends only on
    the file's seed.
    """
    seed = rng.integers(0, 2**63)
    base = list(_size_curve(t, fmt))
    own: list[tuple[float, int]] = []
    content = [0]

    def encode(share: float) -> bytes:
        pixels = _image_pixels(t.width, t.height, t.mode, share, np.random.default_rng([seed, content[0]]), t.bits)
        out = _encode_image(pixels, fmt, t)
        own.append((share, len(out)))
        return out

    best: tuple[float, bytes] | None = None
    for attempt in range(8):
        below = [p for p in own if p[1] <= target]
        above = [p for p in own if p[1] >= target]
        if attempt >= 4 and best is not None:
            content[0] += 1  # the amplitude has done what it can: other noise at the best one
            share = best[0]
        else:
            # this file's own points once they bracket the target; the kind's curve until then
            pts = sorted(set(own)) if below and above else sorted(set(base + own), key=lambda p: p[0])
            shares = np.array([p[0] for p in pts])
            sizes = np.array([p[1] for p in pts], dtype=float)
            order = np.argsort(sizes, kind="stable")
            share = float(np.clip(np.interp(target, sizes[order], shares[order]), 0.0, 1.0))
        out = encode(share)
        if best is None or abs(len(out) - target) < abs(len(best[1]) - target):
            best = (share, out)
        if abs(len(out) - target) <= IMAGE_SIZE_TOLERANCE * target:
            break
        if attempt < 4 and ((share == 1.0 and len(out) < 0.99 * target) or (share == 0.0 and len(out) > 1.01 * target)):
            break  # the target is out of this kind's reach
    assert best is not None
    return best[1]


def _image_legacy(rng: np.random.Generator, target: int, fmt: str) -> bytes:
    """A noise image encoded by Pillow whose size approximates *target* bytes (no layout known)."""
    from PIL import Image

    pil_fmt = "JPEG" if fmt == "jpeg" else "PNG"

    def encode(side: int) -> bytes:
        pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        bio = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(bio, format=pil_fmt, **({"quality": 90} if pil_fmt == "JPEG" else {}))
        return bio.getvalue()

    probe = 64
    sample = encode(probe)
    per_pixel = max(len(sample) / (probe * probe), 0.05)
    side = max(8, int(math.sqrt(max(target, 1) / per_pixel)))
    out = encode(side)
    if abs(len(out) - target) > 0.05 * target and side > 8:
        side = max(8, int(side * math.sqrt(target / len(out))))
        out = encode(side)
    return out


# --------------------------------------------------------------------------- tables


def _write_parquet(tmp: Path, sizes: Sequence[int], t: TableFile | None, rng: np.random.Generator) -> str:
    import polars as pl

    rows = len(sizes)
    cols = t.columns if t and t.columns else []
    if not cols:
        pl.DataFrame({"data": [rng.bytes(s) for s in sizes]}, schema={"data": pl.Binary}).write_parquet(
            tmp, compression="uncompressed")
        return "polars"
    ratio = t.compression_ratio if t and t.compression_ratio else 1.0
    fixed = {"int64": 8, "double": 8, "float": 4, "int32": 4, "boolean": 1, "int16": 2, "int8": 1}
    var = [c for c in cols if c.type not in fixed] or [cols[-1]]
    if all(c.row_bytes is not None for c in var):
        # the real columns' widths (a length prefix of 4 bytes per value in Parquet's plain encoding)
        per_var_col = {c.name: [max(0, int(round((c.row_bytes or 0) - 4)))] * rows for c in var}
    else:  # the plan's bytes per row, less the fixed-width columns, shared by the variable ones
        width = sum(fixed.get(c.type, 0) for c in cols)
        share_var = [max(0, (s - width) // len(var)) for s in sizes]
        per_var_col = {c.name: share_var for c in var}
    share = 1.0 if ratio >= 0.98 else _deflate_share(max(sum(sizes), 1), round(ratio, 4), 6)
    data: dict[str, Any] = {}
    for c in cols:
        if c in var:
            data[c.name] = [_fill(n, share, rng, _block_for(max(n, 16))).tobytes() for n in per_var_col[c.name]]
        elif c.type in ("double", "float"):
            data[c.name] = rng.standard_normal(rows).astype(np.float64 if c.type == "double" else np.float32)
        elif c.type == "boolean":
            data[c.name] = rng.integers(0, 2, rows).astype(bool)
        else:
            data[c.name] = rng.integers(0, 1 << 30, rows).astype(np.int64 if c.type == "int64" else np.int32)
    row_group = max(1, -(-rows // (t.row_groups or 1))) if t else rows
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        codecs = {c.compression for c in cols if c.compression}
        codec: Any = next(iter(codecs)) if len(codecs) == 1 else "uncompressed"
        pl.DataFrame(data).write_parquet(tmp, compression=codec, row_group_size=row_group,
                                         data_page_size=t.data_page_size if t else None)
        return "polars (pyarrow not installed: one codec for all columns, its own page cuts)"
    table = pa.table({c.name: pa.array(data[c.name], type=pa.binary()) if c in var else pa.array(data[c.name])
                      for c in cols})
    pages: dict[str, Any] = {}
    if t and t.data_page_size:
        # pyarrow adds values in batches and cuts a page once a batch brings it to the page
        # size: with the real writer's batch, a size half a batch below the real column's
        # pages cuts them after the same number of batches (and a wide column's after each)
        size, batch = t.data_page_size, t.data_page_batch
        if batch:
            pages["write_batch_size"] = batch
            if t.data_page_values:
                size = max(1, size - size * batch // t.data_page_values // 2)
        pages["data_page_size"] = size
    if t and t.data_page_version in (1, 2):
        pages["data_page_version"] = f"{t.data_page_version}.0"
    pq.write_table(table, tmp, row_group_size=row_group,
                   compression={c.name: (c.compression or "none") for c in cols},
                   use_dictionary=[c.name for c in cols if c.dictionary] or False, **pages)
    return f"pyarrow {pa.__version__}"


def _write_csv(tmp: Path, sizes: Sequence[int], t: TableFile | None, rng: np.random.Generator) -> str:
    import polars as pl

    if t is None or not t.columns:
        rows = [rng.bytes(max(1, s // 2)).hex() + ("0" if s % 2 and s > 1 else "") for s in sizes]
        pl.DataFrame({"data": rows}).write_csv(tmp)
        return "polars"
    delim = t.delimiter or ","
    ncols = len(t.columns)
    lines = []
    if t.header:
        lines.append(delim.join(c.name for c in t.columns))
    for s in sizes:
        body = max(ncols, s - 1 - (ncols - 1))  # newline and delimiters
        widths = [body // ncols + (1 if i < body % ncols else 0) for i in range(ncols)]
        digits = rng.integers(0, 10, size=sum(widths)).astype(np.uint8) + ord("0")
        text = digits.tobytes().decode()
        parts, pos = [], 0
        for w in widths:
            parts.append(text[pos:pos + w])
            pos += w
        lines.append(delim.join(parts))
    tmp.write_text("\n".join(lines) + "\n")
    return "text"


# --------------------------------------------------------------------------- entry point


def write_file(fmt: str, path: Path, sizes: Sequence[int], layout: Layout, rng: np.random.Generator) -> Written:
    """Write one dataset file at *path* (via a temporary name, then renamed).

    *sizes* are the plan's bytes per sample. Returns a :class:`Written`. OSError
    propagates (the caller names the path).
    """
    tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
    out = Written(bytes=0)
    spf = len(sizes)
    target = int(sum(sizes))
    if fmt in ("npz", "npy", "hdf5"):
        if layout.arrays:
            i = choose_structure(layout.arrays, target, rng)
            s = layout.arrays[i]
            out.structure = i
            if fmt == "npz":
                with open(tmp, "wb") as fh:
                    out.notes.append(_write_npz(fh, s, spf, rng))
            elif fmt == "npy":
                m = s.members[0]
                with open(tmp, "wb") as fh:
                    np.save(fh, _array_data(m, _member_shape(m, s.samples, spf), rng, 1.0))
            else:
                out.notes.append(_write_hdf5(tmp, s, layout, spf, rng))
        else:
            _write_array_legacy(fmt, tmp, sizes, layout, rng)
    elif fmt in ("jpeg", "png"):
        if layout.images:
            i = choose_structure(layout.images, target, rng)
            out.structure = i
            tmp.write_bytes(_image_for(layout.images[i], fmt, target, rng))

        else:
            tmp.write_bytes(_image_legacy(rng, sizes[0], fmt))
    elif fmt in ("raw", "tfrecord", "indexed_binary"):
        records: list[list[int]] = []
        pos = 0
        with open(tmp, "wb") as fh:
            for sz in sizes:
                payload = rng.bytes(sz)
                blob = tfrecord_frame(payload) if fmt == "tfrecord" else payload
                fh.write(blob)
                records.append([pos, len(blob)])
                pos += len(blob)
        out.records = records
        if fmt == "indexed_binary":
            rec = np.asarray(records, dtype="<u8").reshape(-1, 2)
            # dlreplay's index: (offset, length) pairs in one file; DLIO 2.0's: offsets and
            # sizes in two (its generator's struct 'Q', little-endian here)
            sides = {".off.idx": rec[:, 0], ".sz.idx": rec[:, 1]} if layout.index == "dlio" else {".idx": rec}
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
    elif fmt in ("csv", "parquet"):
        t = None
        if layout.tables:
            i = choose_structure(layout.tables, target, rng)
            out.structure, t = i, layout.tables[i]
        out.notes.append(_write_csv(tmp, sizes, t, rng) if fmt == "csv" else _write_parquet(tmp, sizes, t, rng))
    else:  # pragma: no cover - validated by the model
        raise ReplayError(f"unsupported dataset format {fmt!r}")
    _fsync_path(tmp)
    os.replace(tmp, path)
    out.bytes = path.stat().st_size
    return out


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
