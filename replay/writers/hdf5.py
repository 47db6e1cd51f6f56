"""HDF5 files through h5py with the real files' inside: groups, datasets, storage, chunk shapes,
filters, fill values, attributes, chunk write order and the file-level settings (libver, user
block, alignment, metadata block size, file-space strategy)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.model import ArrayFile, ArrayMember, Layout

from .arrays import array_data, array_dtype, array_nbytes, member_shape
from .content import block_for, calibrate, fill_noise

_SLAB_BYTES = 64 << 20


def _slab_rows(shape: tuple[int, ...], dt: np.dtype, multiple: int) -> int:
    """Rows per slab: about :data:`_SLAB_BYTES`, a multiple of *multiple* (chunk rows)."""
    if not shape:
        return 1
    row = max(array_nbytes(shape[1:], dt), 1)
    rows = max(1, _SLAB_BYTES // row)
    return max(multiple, rows // multiple * multiple)


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
def _h5_share(
    dtype: str,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    filters: tuple[tuple[str, Any], ...],
    fill: float | None,
    ratio: float,
) -> float:
    """Random share per chunk giving stored/logical bytes = *ratio* through h5py's own filters.

    Measured on an in-memory file with the dataset's chunks and edge chunks (the first
    axis cut to about 4 MiB), since padding in edge chunks compresses too.
    """
    import h5py

    dt = array_dtype(dtype)
    row = max(array_nbytes(shape[1:], dt), 1)
    rows = min(shape[0], max(chunks[0], ((4 << 20) // row) // chunks[0] * chunks[0]))
    probe = (rows, *shape[1:])
    rng = np.random.default_rng(12345)
    kw = {"fillvalue": fill} if fill is not None else {}

    def measure(share: float) -> float:
        arr = _chunked_fill(probe, chunks, dt, share, rng)
        with h5py.File(
            f"dlreplay-calibration-{os.getpid()}.h5", "w", driver="core", backing_store=False
        ) as f:
            ds = f.create_dataset("x", data=arr, chunks=chunks, **kw, **dict(filters))
            return ds.id.get_storage_size() / max(arr.nbytes, 1)

    return calibrate(measure, ratio)


def _chunked_fill(
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dt: np.dtype,
    share: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """An array whose every chunk holds the random/constant pattern in chunk-local order."""
    grid = [-(-s // c) for s, c in zip(shape, chunks, strict=True)]
    n_chunk = array_nbytes(chunks, dt)
    count = int(np.prod(grid, dtype=np.int64))
    flat = (
        np.concatenate([fill_noise(n_chunk, share, rng, block_for(n_chunk)) for _ in range(count)])
        if share < 1.0
        else np.frombuffer(rng.bytes(n_chunk * count), dtype=np.uint8)
    )
    blocks = flat.view(dt).reshape(*grid, *chunks)
    nd = len(shape)
    order = [a for i in range(nd) for a in (i, nd + i)]
    padded = blocks.transpose(order).reshape([g * c for g, c in zip(grid, chunks, strict=True)])
    return padded[tuple(slice(0, s) for s in shape)]


def _chunk_slices(shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[tuple[slice, ...]]:
    grid = [range(0, s, c) for s, c in zip(shape, chunks, strict=True)]
    out = []
    for idx in np.ndindex(*[len(g) for g in grid]):
        out.append(
            tuple(
                slice(g[i], min(g[i] + c, s))
                for g, i, c, s in zip(grid, idx, chunks, shape, strict=True)
            )
        )
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


def write_hdf5(tmp: Path, s: ArrayFile, layout: Layout, spf: int, rng: np.random.Generator) -> str:
    import h5py

    h = layout.hdf5
    kw: dict[str, Any] = {}
    if h is not None:
        if h.superblock_version in _LIBVER:
            kw["libver"] = _LIBVER[h.superblock_version]
        if h.userblock_size:
            kw["userblock_size"] = h.userblock_size
        if h.alignment_interval:
            kw.update(
                alignment_threshold=max(h.alignment_threshold or 1, 1),
                alignment_interval=h.alignment_interval,
            )
        if h.meta_block_size:
            kw["meta_block_size"] = h.meta_block_size
        if h.file_space_strategy in ("page", "aggr", "none"):  # fsm_aggr is HDF5's default
            kw["fs_strategy"] = {"page": "page", "aggr": "aggregate", "none": "none"}[
                h.file_space_strategy
            ]
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


def _write_h5_dataset(
    f: Any, m: ArrayMember, s: ArrayFile, spf: int, rng: np.random.Generator
) -> None:
    shape = member_shape(m, s.samples, spf)
    if m.dtype in ("vlen-str", "vlen"):
        _write_h5_strings(f, m, shape, rng)
        return
    dt = array_dtype(m.dtype)
    kw, chunks = _h5_dataset_kw(m, shape)
    ds = f.create_dataset(m.name, shape=shape, dtype=dt, **kw)
    _attrs(ds, m.attributes, m.attribute_bytes, m.vlen_attributes)
    if not array_nbytes(shape, dt):
        return
    if chunks is None:
        _write_h5_contiguous(ds, m, shape, dt, rng)
    else:
        _write_h5_chunks(ds, m, shape, chunks, dt, rng)


def _write_h5_strings(
    f: Any, m: ArrayMember, shape: tuple[int, ...], rng: np.random.Generator
) -> None:
    """A dataset of variable-length strings (random hex)."""
    import h5py

    n = int(np.prod(shape, dtype=np.int64))
    ds = f.create_dataset(m.name, shape=shape, dtype=h5py.string_dtype())
    if n:
        ds[...] = np.array([rng.bytes(4).hex() for _ in range(n)], dtype=object).reshape(shape)
    _attrs(ds, m.attributes, m.attribute_bytes, m.vlen_attributes)


def _h5_dataset_kw(
    m: ArrayMember, shape: tuple[int, ...]
) -> tuple[dict[str, Any], tuple[int, ...] | None]:
    """(``create_dataset`` keywords for the member's storage, fill value and filters, its chunk
    shape or None when it is not chunked)."""
    import h5py

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
    return kw, chunks


def _write_h5_contiguous(
    ds: Any, m: ArrayMember, shape: tuple[int, ...], dt: np.dtype, rng: np.random.Generator
) -> None:
    """A contiguous or compact dataset's values, in slabs of rows."""
    if not shape:  # a scalar
        ds[()] = array_data(m, (), rng, 1.0)
        return
    rows = _slab_rows(shape, dt, 1)
    for r0 in range(0, shape[0], rows):  # bounded memory for large datasets
        part = (min(rows, shape[0] - r0), *shape[1:])
        ds[r0 : r0 + part[0]] = array_data(m, part, rng, 1.0)


def _write_h5_chunks(
    ds: Any,
    m: ArrayMember,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dt: np.dtype,
    rng: np.random.Generator,
) -> None:
    """A chunked dataset's chunks, compressible like the real ones through its filters: in slabs of
    whole chunk rows, or chunk by chunk in the real file's order (scattered, or only the share
    of chunks the real file allocated)."""
    share = 1.0
    filters = tuple(sorted(_h5_filters(m).items()))
    if filters and m.compression_ratio is not None:
        share = _h5_share(
            m.dtype, shape, chunks, filters, m.fill_value, round(m.compression_ratio, 4)
        )
    sparse = m.chunks_allocated is not None and m.chunks_allocated < 1.0
    if not sparse and m.chunk_order != "scattered":
        rows = _slab_rows(shape, dt, chunks[0])  # whole chunk rows, so each chunk holds the pattern
        for r0 in range(0, shape[0], rows):
            part = (min(rows, shape[0] - r0), *shape[1:])
            ds[r0 : r0 + part[0]] = _chunked_fill(part, chunks, dt, share, rng)
        return
    slices = _chunk_slices(shape, chunks)
    if sparse:
        keep = int(round((m.chunks_allocated or 0.0) * len(slices)))
        slices = [slices[i] for i in sorted(rng.choice(len(slices), size=keep, replace=False))]
    order = rng.permutation(len(slices)) if m.chunk_order == "scattered" else range(len(slices))
    for i in order:
        sl = slices[i]
        block = tuple(x.stop - x.start for x in sl)
        ds[sl] = (
            _chunked_fill(block, chunks, dt, share, rng)
            if block == chunks
            else _chunked_fill(chunks, chunks, dt, share, rng)[tuple(slice(0, b) for b in block)]
        )
