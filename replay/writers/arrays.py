"""NPZ and NPY files: members (names, dtypes, shapes), each stored or deflated at its level as
the real files are; without a layout, arrays of the plan's sizes. Also the array helpers the
HDF5 writer shares: dtypes, shapes per sample count, and member contents."""

from __future__ import annotations

import ast
import io
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.model import ArrayFile, ArrayMember, Layout

from .content import block_for, deflate_share, fill_noise


def array_dtype(spec: str) -> np.dtype:
    if spec.startswith("["):
        return np.dtype(ast.literal_eval(spec))
    return np.dtype(spec)


def member_shape(m: ArrayMember, samples_from: int | None, samples_to: int) -> tuple[int, ...]:
    shape = list(m.shape)
    if (
        samples_from is not None
        and shape
        and shape[0] == samples_from
        and samples_from != samples_to
    ):
        shape[0] = samples_to
    return tuple(shape)


def array_nbytes(shape: Sequence[int], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def structure_bytes(s: ArrayFile) -> int:
    """Logical bytes of a structure's arrays (the file size without headers and compression)."""
    total = 0
    for m in s.members:
        if m.dtype in ("vlen-str", "vlen"):
            continue
        total += int(array_nbytes(m.shape, array_dtype(m.dtype)) * (m.compression_ratio or 1.0))
    return total


def choose_structure(structures: Sequence[Any], target: int, rng: np.random.Generator) -> int:
    """Index of the structure for a file of *target* bytes.

    The structure of the sampled file nearest in size (``file_bytes``), so the plan's
    sizes, drawn from the real size distribution, bring each structure in its share and
    with its sizes; else the nearest median ``bytes``; else one drawn by ``weight``.
    """
    if len(structures) == 1:
        return 0
    files = [
        (abs(int(b) - target), i) for i, s in enumerate(structures) for b in (s.file_bytes or ())
    ]
    if files:
        best = min(d for d, _ in files)
        tied = sorted({i for d, i in files if d == best})
        return tied[int(rng.integers(len(tied)))] if len(tied) > 1 else tied[0]
    known = [
        (abs(int(s.bytes) - target), -s.weight, i)
        for i, s in enumerate(structures)
        if s.bytes is not None
    ]
    if known:
        return min(known)[2]
    p = np.asarray([s.weight for s in structures], dtype=float)
    return int(rng.choice(len(p), p=p / p.sum()))


def array_data(
    m: ArrayMember, shape: tuple[int, ...], rng: np.random.Generator, share: float
) -> np.ndarray:
    dt = array_dtype(m.dtype)
    n = array_nbytes(shape, dt)
    raw = fill_noise(n, share, rng, block_for(n))
    arr = raw.view(dt) if dt.itemsize and n else np.zeros(shape, dtype=dt)
    return arr.reshape(shape, order="F") if m.fortran_order else arr.reshape(shape)


def _npy_header(m: ArrayMember, shape: tuple[int, ...]) -> bytes:
    """The NPY header numpy writes for member *m* of *shape*."""
    from numpy.lib import format as npformat

    buf = io.BytesIO()
    arr = np.lib.stride_tricks.as_strided(
        np.zeros(1, dtype=array_dtype(m.dtype)), shape=shape, strides=(0,) * len(shape)
    )
    header = npformat.header_data_from_array_1_0(arr)
    header["fortran_order"] = m.fortran_order
    try:
        npformat.write_array_header_1_0(buf, header)
    except ValueError:  # too large for a version 1.0 header
        npformat.write_array_header_2_0(buf, header)
    return buf.getvalue()


def write_npz(fh: Any, s: ArrayFile, spf: int, rng: np.random.Generator) -> str:
    """One NPZ with the structure's members; returns the writer used."""
    members = s.members
    storages = {m.storage or "stored" for m in members}
    levels = {m.compression_level for m in members if m.storage == "deflated"}
    plain = (
        all(m.name.endswith(".npy") and m.zip64 for m in members)
        and len(storages) == 1
        and levels <= {None, 6}
    )
    datas = [_npz_member_data(m, member_shape(m, s.samples, spf), rng) for m in members]
    if plain:
        arrays: dict[str, Any] = {m.name[:-4]: d for m, d in zip(members, datas, strict=True)}
        if storages == {"deflated"}:
            np.savez_compressed(fh, **arrays)
            return "numpy.savez_compressed"
        np.savez(fh, **arrays)
        return "numpy.savez"
    _write_zip_members(fh, members, datas)
    return "zipfile + numpy.lib.format.write_array"


def _npz_member_data(
    m: ArrayMember, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """A member's content: an array (``.npy`` members, or unnamed) or raw bytes, compressible
    like the real member when it is deflated."""
    share = 1.0
    if m.storage == "deflated" and m.compression_ratio is not None and m.compression_ratio < 0.98:
        share = deflate_share(
            max(array_nbytes(shape, array_dtype(m.dtype)), 1),
            round(m.compression_ratio, 4),
            m.compression_level if m.compression_level is not None else 6,
            _npy_header(m, shape) if m.name.endswith(".npy") else b"",
        )
    return (
        array_data(m, shape, rng, share)
        if m.name.endswith(".npy") or not m.name
        else fill_noise(max(int(np.prod(shape)) if shape else 0, 0), share, rng, 4096)
    )


def _write_zip_members(
    fh: Any, members: Sequence[ArrayMember], datas: Sequence[np.ndarray]
) -> None:
    """The members through :mod:`zipfile`, each stored or deflated at its level, with its zip64
    header as the real file has it (``.npy`` members by ``numpy.lib.format.write_array``)."""
    from numpy.lib import format as npformat

    with zipfile.ZipFile(fh, "w", allowZip64=True) as zf:
        for m, d in zip(members, datas, strict=True):
            info = zipfile.ZipInfo(m.name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = (
                zipfile.ZIP_DEFLATED if m.storage == "deflated" else zipfile.ZIP_STORED
            )
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


def write_array_legacy(
    fmt: str, tmp: Path, sizes: Sequence[int], layout: Layout, rng: np.random.Generator
) -> None:
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
            kw["chunks"] = tuple(
                max(1, min(c, d)) for c, d in zip(layout.hdf5_chunk_shape, arr.shape, strict=False)
            )
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
