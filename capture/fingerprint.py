"""Dataset fingerprint: the layout of a dataset's files, without their content.

A replay reproduces a job's I/O only if the regenerated files have the real files'
inside: an NPZ's members and whether they are deflated, an HDF5 file's chunking and
filters, a JPEG's dimensions, quantization tables and subsampling. The format's
library decides what to read from that layout. While the job's dataset is reachable
(``dlreplay capture``, or ``dlreplay distill --data-dir``), this module reads it:

* the dataset trees are listed (hidden files skipped) and their files grouped by root
  and extension; each group's format comes from the files' magic bytes;
* a bounded number of files per group (:class:`FingerprintLimits`), spread evenly over
  the sorted listing, are opened with the formats' own readers (``zipfile`` + numpy's
  header reader, h5py, Pillow, pyarrow) or by walking the container's framing (PNG
  chunks, TFRecord headers, JPEG markers before the first scan); no sample data is
  kept, only structure: names, dtypes, shapes, storage, filters, sizes;
* file sizes come from ``stat`` (all files up to a bound, then a spread subset).

The result is a JSON document (:data:`FINGERPRINT_SCHEMA`, ``format_version``)
written as ``dataset-fingerprint.json`` in the trace directory. It is plain JSON,
readable without dlreplay; units: bytes, shapes and chunks in elements, seconds.
Files or trees that cannot be read, and files of unknown formats, are listed under
``problems`` (one line each) and never stop a capture.

Public API: :func:`fingerprint_dataset`, :func:`write_fingerprint`,
:func:`read_fingerprint`, :func:`opened_files`, :class:`FingerprintLimits`.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import os
import re
import struct
import time
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import dlreplay
from dlreplay.errors import ArtifactVersionError
from dlreplay.osutil import atomic_write_text

__all__ = [
    "FINGERPRINT_FORMAT_VERSION",
    "FINGERPRINT_NAME",
    "FINGERPRINT_SCHEMA",
    "FingerprintLimits",
    "detect_format",
    "fingerprint_dataset",
    "fingerprint_file",
    "jpeg_quality",
    "opened_files",
    "read_fingerprint",
    "write_fingerprint",
]

FINGERPRINT_NAME = "dataset-fingerprint.json"
FINGERPRINT_SCHEMA = "dlreplay.dataset-fingerprint"
FINGERPRINT_FORMAT_VERSION = 1

#: Extensions of files that are never a dataset (the job's code, logs, our own artifacts).
_NOT_DATA = {".py", ".pyc", ".so", ".log", ".pfw", ".gz", ".yaml", ".yml", ".md", ".lock", ".pid"}
#: Extensions the fingerprint treats as dataset files when picking opened files.
DATASET_EXTENSIONS = {
    ".npz", ".npy", ".h5", ".hdf5", ".hdf", ".he5", ".nc", ".jpg", ".jpeg", ".png", ".tfrecord",
    ".tfrecords", ".csv", ".tsv", ".parquet", ".pq", ".bin", ".idx", ".raw", ".dat", ".zip",
}
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class FingerprintLimits:
    """Bounds that keep a fingerprint to seconds on any dataset size.

    ``files_per_group``: files opened per group (root x extension); ``max_listed``:
    directory entries listed per root and ``list_seconds`` the time budget for it;
    ``max_stat``: files whose size is read per group (beyond it, totals are estimated
    from a spread subset); ``records_per_file``: TFRecord headers walked per file;
    ``text_bytes``: bytes of a CSV read for line lengths; ``chunks_per_dataset``: HDF5
    chunk addresses inspected per dataset; ``level_probe_bytes``: largest NPZ member
    recompressed to estimate its deflate level (bytes).
    """

    files_per_group: int = 24
    max_listed: int = 2_000_000
    list_seconds: float = 10.0
    max_stat: int = 20_000
    records_per_file: int = 4096
    text_bytes: int = 1 << 20
    chunks_per_dataset: int = 20_000
    level_probe_bytes: int = 4 << 20
    max_objects: int = 256


class _Unreadable(Exception):
    """A file could not be inspected; the message says why (one line)."""


# --------------------------------------------------------------------------- listing


@dataclass
class _Listing:
    root: str
    groups: dict[str, list[str]]
    listed: int = 0
    complete: bool = True
    problem: str | None = None


def _list_tree(root: str, limits: FingerprintLimits, skip: frozenset[str]) -> _Listing:
    """Regular files under *root* grouped by extension (hidden names and *skip* left out)."""
    out = _Listing(root=root, groups={})
    if os.path.isfile(root):
        out.groups.setdefault(Path(root).suffix.lower(), []).append(root)
        out.listed = 1
        return out
    deadline = time.monotonic() + limits.list_seconds
    stack = [root]
    denied = 0
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if e.path not in skip:
                                stack.append(e.path)
                            continue
                        if not e.is_file():
                            if not (e.is_symlink() and not os.path.exists(e.path)):
                                continue  # a broken link is listed: reading it reports the problem
                    except OSError:
                        continue
                    out.groups.setdefault(os.path.splitext(e.name)[1].lower(), []).append(e.path)
                    out.listed += 1
                    if out.listed >= limits.max_listed or (out.listed & 1023 == 0 and time.monotonic() > deadline):
                        out.complete = False
                        return out
        except FileNotFoundError:
            if d == root:
                out.problem = f"{root}: no such directory"
        except PermissionError:
            if d == root:
                out.problem = f"{root}: permission denied"
            denied += 1
        except NotADirectoryError:
            out.problem = f"{root}: not a directory"
        except OSError as exc:
            if d == root:
                out.problem = f"{root}: cannot list ({exc.strerror or exc})"
            denied += 1
    if denied and out.problem is None:
        out.problem = f"{root}: {denied} director{'y' if denied == 1 else 'ies'} could not be listed (permission)"
    return out


def _spread(n: int, k: int) -> list[int]:
    """*k* indices spread evenly over range(n) (first and last included)."""
    if n <= k:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, k)})


# --------------------------------------------------------------------------- formats


def detect_format(head: bytes, ext: str) -> str | None:
    """The dataset format of a file from its first bytes (and extension for text/TFRecord).

    Returns a DLIO format name (npz, npy, hdf5, jpeg, png, parquet, tfrecord, csv), ``zip``
    for a zip that is not an NPZ (decided later from its members), or None (unknown).
    """
    if head.startswith(_ZIP_MAGIC):
        return "npz" if ext == ".npz" else "zip"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(_HDF5_MAGIC):
        return "hdf5"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(_PNG_MAGIC):
        return "png"
    if head.startswith(b"PAR1"):
        return "parquet"
    if len(head) >= 12 and _is_tfrecord_header(head[:12]):
        return "tfrecord"
    if ext in (".h5", ".hdf5", ".hdf", ".he5", ".nc"):
        return "hdf5"  # a user block before the superblock: h5py decides
    if ext in (".csv", ".tsv", ".txt") and _looks_text(head):
        return "csv"
    return None


def _is_tfrecord_header(head: bytes) -> bool:
    from dlreplay.checksums import masked_crc32c

    (length,) = struct.unpack("<Q", head[:8])
    return length > 0 and masked_crc32c(head[:8]) == struct.unpack("<I", head[8:12])[0]


def _looks_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        try:
            head[:-3].decode("utf-8")  # a multi-byte character cut at the end
        except UnicodeDecodeError:
            return False
    return b"\x00" not in head


def fingerprint_file(path: str, fmt: str, limits: FingerprintLimits = FingerprintLimits(),
                     probe_level: bool = True) -> dict[str, Any]:
    """The layout of one file as a JSON-ready dict (``bytes``, ``format`` and format fields).

    Raises :class:`_Unreadable` (a one-line reason) when the file cannot be inspected.
    """
    try:
        size = os.path.getsize(path)
        if fmt in ("npz", "zip"):
            entry = _inspect_zip(path, limits, probe_level)
        elif fmt == "npy":
            entry = _inspect_npy(path)
        elif fmt == "hdf5":
            entry = _inspect_hdf5(path, limits)
        elif fmt == "jpeg":
            entry = _inspect_jpeg(path)
        elif fmt == "png":
            entry = _inspect_png(path)
        elif fmt == "tfrecord":
            entry = _inspect_tfrecord(path, limits)
        elif fmt == "parquet":
            entry = _inspect_parquet(path)
        elif fmt == "csv":
            entry = _inspect_csv(path, limits)
        else:
            entry = {}
    except _Unreadable:
        raise
    except PermissionError:
        raise _Unreadable("permission denied") from None
    except OSError as exc:
        raise _Unreadable(exc.strerror or str(exc)) from None
    except Exception as exc:  # a library refusing a damaged or unexpected file
        raise _Unreadable(f"{type(exc).__name__}: {exc}".splitlines()[0][:200]) from None
    return {"bytes": size, "format": entry.pop("format", fmt), **entry}


# -- NPZ / ZIP -------------------------------------------------------------------


_ZIP64_EXTRA = 0x0001


def _local_extra_ids(fh: io.BufferedReader, header_offset: int) -> list[int]:
    """Extra-field ids of the local header at *header_offset* (zip64 is 0x0001)."""
    fh.seek(header_offset)
    head = fh.read(30)
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        return []
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    fh.seek(name_len, 1)
    extra = fh.read(extra_len)
    ids, pos = [], 0
    while pos + 4 <= len(extra):
        hid, hlen = struct.unpack("<HH", extra[pos:pos + 4])
        ids.append(hid)
        pos += 4 + hlen
    return ids


def _deflate_level(data: bytes, compressed_size: int) -> int | None:
    """The zlib level (1..9) whose raw deflate output of *data* is closest to *compressed_size*."""
    best: tuple[int, int] | None = None
    seen: dict[int, int] = {}
    for level in (6, 1, 9, 2, 3, 4, 5, 7, 8):
        c = zlib.compressobj(level, zlib.DEFLATED, -15)
        n = len(c.compress(data)) + len(c.flush())
        seen[level] = n
        diff = abs(n - compressed_size)
        if best is None or diff < best[0]:
            best = (diff, level)
        if diff == 0:
            break
    return best[1] if best else None


def _inspect_zip(path: str, limits: FingerprintLimits, probe_level: bool) -> dict[str, Any]:
    members: list[dict[str, Any]] = []
    with open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
        infos = zf.infolist()
        all_npy = bool(infos) and all(i.filename.endswith(".npy") for i in infos)
        for info in infos[: limits.max_objects]:
            m: dict[str, Any] = {
                "name": info.filename,
                "storage": {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}.get(
                    info.compress_type, f"method-{info.compress_type}"),
                "stored_bytes": info.compress_size,
                "logical_bytes": info.file_size,
                "offset": info.header_offset,
                "data_descriptor": bool(info.flag_bits & 0x08),
            }
            m["zip64"] = _ZIP64_EXTRA in _local_extra_ids(fh, info.header_offset)
            if info.filename.endswith(".npy"):
                with zf.open(info) as f:
                    version, shape, fortran, dtype = _npy_header(f)
                    m.update(dtype=dtype.str if dtype.names is None else str(dtype.descr), shape=list(shape),
                             fortran_order=bool(fortran), npy_version=list(version),
                             npy_header_bytes=f.tell() if info.compress_type == zipfile.ZIP_STORED else None)
            if (probe_level and info.compress_type == zipfile.ZIP_DEFLATED
                    and 0 < info.file_size <= limits.level_probe_bytes):
                m["level"] = _deflate_level(zf.read(info), info.compress_size)
            members.append(m)
    out: dict[str, Any] = {"format": "npz" if all_npy or path.endswith(".npz") else "zip", "members": members}
    if len(infos) > limits.max_objects:
        out["members_omitted"] = len(infos) - limits.max_objects
    return out


def _npy_header(fh: Any) -> tuple[tuple[int, int], tuple[int, ...], bool, np.dtype]:
    """(version, shape, fortran order, dtype) from an NPY header, with numpy's own readers."""
    from numpy.lib import format as npformat

    version = npformat.read_magic(fh)
    reader = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
    shape, fortran, dtype = reader(fh)
    return version, shape, fortran, dtype


def _inspect_npy(path: str) -> dict[str, Any]:
    with open(path, "rb") as fh:
        version, shape, fortran, dtype = _npy_header(fh)
        header = fh.tell()
    member = {"name": "", "dtype": dtype.str if dtype.names is None else str(dtype.descr), "shape": list(shape),
              "fortran_order": bool(fortran), "npy_version": list(version), "npy_header_bytes": header}
    return {"members": [member]}


# -- HDF5 -----------------------------------------------------------------------


_FS_STRATEGIES = {0: "fsm_aggr", 1: "page", 2: "aggr", 3: "none"}
_LAYOUTS = {0: "compact", 1: "contiguous", 2: "chunked", 3: "virtual"}


def _chunk_addresses(dset: Any, grid: Sequence[int], limit: int
                     ) -> tuple[list[tuple[tuple[int, ...], int, int]], int, bool]:
    """(logical offset, file address, stored bytes) of chunks, the chunks allocated, and
    whether that count is estimated.

    Up to *limit* chunks in the grid, every allocated chunk (one pass over the chunk
    index); beyond, *limit* chunks spread over the grid looked up by coordinate, so a
    dataset of millions of chunks costs what *limit* index lookups cost.
    """
    dsid = dset.id
    total = int(np.prod(grid, dtype=np.int64)) if len(grid) else 1
    out: list[tuple[tuple[int, ...], int, int]] = []
    if total <= limit:
        if hasattr(dsid, "chunk_iter"):
            dsid.chunk_iter(lambda info: out.append((tuple(info.chunk_offset), info.byte_offset, info.size)))
        else:
            for i in range(dsid.get_num_chunks()):
                info = dsid.get_chunk_info(i)
                out.append((tuple(info.chunk_offset), info.byte_offset, info.size))
        return out, len(out), False
    probes = _spread(total, min(limit, 1024))
    for i in probes:
        coord = tuple(int(c) * int(k) for c, k in zip(np.unravel_index(i, grid), dset.chunks, strict=True))
        info = dsid.get_chunk_info_by_coord(coord)
        if info.byte_offset is not None:
            out.append((coord, info.byte_offset, info.size))
    return out, round(len(out) * total / max(len(probes), 1)), True


def _attr_bytes(obj: Any) -> tuple[int, int, int]:
    """(attributes, bytes of their values, variable-length ones) of an HDF5 object, without
    reading the values. Variable-length values (h5py's default for str) live in a global heap."""
    import h5py

    names = list(obj.attrs.keys())
    total = vlen = 0
    for name in names:
        try:
            aid = h5py.h5a.open(obj.id, name.encode() if isinstance(name, str) else name)
            total += aid.get_storage_size()
            text = h5py.check_string_dtype(aid.dtype)
            if (text is not None and text.length is None) or h5py.check_vlen_dtype(aid.dtype) is not None:
                vlen += 1
        except Exception:  # an attribute of a type h5py cannot open
            pass
    return len(names), total, vlen


def _hdf5_dataset(name: str, dset: Any, limits: FingerprintLimits, addresses: list[tuple[int, int]]
                  ) -> dict[str, Any]:
    import h5py

    dcpl = dset.id.get_create_plist()
    layout = _LAYOUTS.get(dcpl.get_layout(), "other")
    dt = dset.dtype
    vlen = h5py.check_string_dtype(dt)
    if vlen is not None and vlen.length is None:
        dtype = "vlen-str"
    elif h5py.check_vlen_dtype(dt) is not None:
        dtype = "vlen"
    else:
        dtype = dt.str if dt.names is None else str(dt.descr)
    itemsize = dt.itemsize if dtype not in ("vlen-str", "vlen") else 16
    logical = int(np.prod(dset.shape, dtype=np.int64)) * itemsize if dset.shape is not None else 0
    d: dict[str, Any] = {
        "name": name,
        "dtype": dtype,
        "shape": list(dset.shape) if dset.shape is not None else [],
        "storage": layout,
        "logical_bytes": logical,
        "track_times": bool(dcpl.get_obj_track_times()),
    }
    if dset.maxshape is not None and tuple(dset.maxshape) != tuple(dset.shape or ()):
        d["maxshape"] = [-1 if m is None else m for m in dset.maxshape]
    if dset.chunks:
        d["chunks"] = list(dset.chunks)
    filters = {"compression": dset.compression, "compression_opts": dset.compression_opts,
               "shuffle": bool(dset.shuffle), "fletcher32": bool(dset.fletcher32), "scaleoffset": dset.scaleoffset}
    d["filters"] = {k: v for k, v in filters.items() if v not in (None, False)}
    nfilters = dcpl.get_nfilters()
    known = {h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32,
             h5py.h5z.FILTER_SZIP, h5py.h5z.FILTER_SCALEOFFSET, 32000}  # 32000: lzf
    others = [dcpl.get_filter(i)[0] for i in range(nfilters) if dcpl.get_filter(i)[0] not in known]
    if others:
        d["filters"]["other_filter_ids"] = others
    fv = dset.fillvalue
    if isinstance(fv, (np.number, int, float, np.bool_)) and np.isfinite(fv):
        d["fill_value"] = float(fv)
    d["attributes"], d["attribute_bytes"], d["vlen_attributes"] = _attr_bytes(dset)
    if layout == "chunked" and dset.chunks:
        grid = [-(-s // c) for s, c in zip(dset.shape, dset.chunks, strict=True)]
        chunks, allocated, estimated = _chunk_addresses(dset, grid, limits.chunks_per_dataset)
        total = int(np.prod(grid, dtype=np.int64)) if grid else 1
        d["chunks_allocated"] = allocated
        d["chunks_total"] = total
        if estimated:  # the stored size of every chunk would read the whole chunk index
            d["chunks_estimated"] = True
            d["stored_bytes"] = round(float(np.mean([c[2] for c in chunks])) * allocated) if chunks else 0
        else:
            d["stored_bytes"] = sum(c[2] for c in chunks)
        if chunks:
            chunks.sort()  # logical (row-major) order
            offsets = np.array([c[1] for c in chunks], dtype=np.int64)
            sizes = np.array([c[2] for c in chunks], dtype=np.int64)
            d["address"] = int(offsets.min())
            inc = float((np.diff(offsets) > 0).mean()) if offsets.size > 1 else 1.0
            d["chunk_order"] = "sequential" if inc >= 0.9 else "scattered"
            d["chunk_increasing"] = round(inc, 4)
            d["chunk_stored_bytes"] = {"min": int(sizes.min()), "median": float(np.median(sizes)),
                                       "max": int(sizes.max())}
            addresses.extend((int(o), int(s)) for o, s in zip(offsets[:64], sizes[:64], strict=True))
    else:
        d["stored_bytes"] = int(dset.id.get_storage_size())
        off = dset.id.get_offset() if layout == "contiguous" else None
        if off is not None:
            d["offset"] = d["address"] = int(off)
            addresses.append((int(off), d["stored_bytes"]))
    return d


def _alignment(addresses: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(threshold, interval) of the writer's ``H5Pset_alignment``, where the file shows it.

    Every raw-data address must be a multiple of a power of two >= 4 KiB, and at least one
    object must have been padded to it: it starts at a multiple past the end of the object
    before it, which did not end on one. Objects packed end to end whose sizes happen to be
    multiples (16 KiB chunks after a 64 KiB metadata block) are not evidence of alignment."""
    if len(addresses) < 3:
        return None
    ordered = sorted(addresses)
    interval = 1 << 24
    while interval >= 4096:
        if all(a % interval == 0 for a, _ in ordered):
            padded = any((a + n) % interval and b > a + n for (a, n), (b, _) in zip(ordered, ordered[1:], strict=False))
            return (min(n for _, n in ordered), interval) if padded else None
        interval >>= 1
    return None


#: HDF5's default metadata block size (H5Pset_meta_block_size), bytes
_DEFAULT_META_BLOCK = 2048


def _meta_block_size(addresses: list[tuple[int, int]], userblock: int, alignment: int | None) -> int | None:
    """The writer's metadata block size (``H5Pset_meta_block_size``; h5py's
    ``File(meta_block_size=)``), where the file shows it: HDF5 allocates metadata (superblock,
    object headers, chunk indexes) from a block of that size and raw data after it, so the
    first raw data sits at the block's end when the first objects' metadata fits in it. The
    setting itself is not stored in the file. Recorded only when that first address (after
    the user block) is a power of two above HDF5's default 2 KiB that alignment does not
    explain; ``None`` otherwise (the default, or a file that does not tell)."""
    if not addresses:
        return None
    rel = min(a for a, _ in addresses) - userblock
    if rel <= _DEFAULT_META_BLOCK or rel & (rel - 1) or (alignment and rel <= alignment):
        return None
    return rel


def _inspect_hdf5(path: str, limits: FingerprintLimits) -> dict[str, Any]:
    import h5py

    datasets: list[dict[str, Any]] = []
    groups: list[str] = []
    addresses: list[tuple[int, int]] = []
    omitted = 0
    with h5py.File(path, "r") as f:
        fcpl = f.id.get_create_plist()
        version = fcpl.get_version()
        out: dict[str, Any] = {"superblock_version": int(version[0]), "userblock_size": int(fcpl.get_userblock()),
                               "offset_bytes": int(fcpl.get_sizes()[0])}
        try:
            strategy, _persist, _threshold = fcpl.get_file_space_strategy()
            out["file_space_strategy"] = _FS_STRATEGIES.get(int(strategy), str(strategy))
            if out["file_space_strategy"] == "page":
                out["file_space_page_size"] = int(fcpl.get_file_space_page_size())
        except Exception:  # older HDF5 without file-space strategies
            pass
        out["root_attributes"], out["root_attribute_bytes"], out["root_vlen_attributes"] = _attr_bytes(f)

        # Links walked depth first in h5py's link order (by name unless track_order), as
        # visititems goes; not visititems itself, whose object info reads every chunk index.
        def walk(group: Any) -> None:
            nonlocal omitted
            for key in group:
                if not isinstance(group.get(key, getlink=True), h5py.HardLink):
                    continue  # soft/external links point at objects listed elsewhere (or in other files)
                obj = group[key]
                if isinstance(obj, h5py.Group):
                    if len(groups) < limits.max_objects:
                        groups.append(obj.name)
                    walk(obj)
                elif isinstance(obj, h5py.Dataset):
                    if len(datasets) < limits.max_objects:
                        datasets.append(_hdf5_dataset(obj.name, obj, limits, addresses))
                    else:
                        omitted += 1

        walk(f)
    if omitted:
        out["datasets_omitted"] = omitted
    aligned = _alignment(addresses)
    if aligned:
        out["alignment_threshold"], out["alignment_interval"] = aligned
    meta_block = _meta_block_size(addresses, out["userblock_size"], aligned[1] if aligned else None)
    if meta_block:
        out["meta_block_size"] = meta_block
    out.update(groups=groups, datasets=datasets)
    return out


# -- JPEG / PNG --------------------------------------------------------------------


#: Payload of libjpeg's standard Huffman tables (DHT segments without their 2-byte length):
#: DC+AC for luminance (29 + 179 bytes), and the same again for chrominance.
_STD_DHT = {1: 29 + 179, 3: 2 * (29 + 179)}
_SAMPLING = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}
_QUALITY_TABLES: dict[int, np.ndarray] = {}


def _reference_luma(quality: int) -> np.ndarray:
    """Pillow's (libjpeg's) luminance table at *quality*, as Pillow reports tables."""
    if quality not in _QUALITY_TABLES:
        from PIL import Image

        buf = io.BytesIO()
        Image.new("L", (8, 8)).save(buf, "JPEG", quality=quality)
        buf.seek(0)
        with Image.open(buf) as im:
            _QUALITY_TABLES[quality] = np.asarray(im.quantization[0], dtype=np.int64)  # type: ignore[attr-defined]
    return _QUALITY_TABLES[quality]


def jpeg_quality(luma: Sequence[int]) -> int:
    """The libjpeg quality (1..100) whose scaled standard luminance table is nearest *luma*."""
    table = np.asarray(luma, dtype=np.int64)
    best = min(range(1, 101), key=lambda q: (int(np.abs(_reference_luma(q) - table).sum()), -q))
    return best


def _jpeg_segments(path: str) -> tuple[dict[str, int], int]:
    """Bytes per marker kind before the first scan (APPn, COM, DHT, DQT, ...) and the restart interval."""
    seen: Counter[str] = Counter()
    restart = 0
    with open(path, "rb") as fh:
        if fh.read(2) != b"\xff\xd8":
            raise _Unreadable("not a JPEG (no SOI marker)")
        while True:
            b = fh.read(1)
            while b == b"\xff":
                b = fh.read(1)
            if not b:
                break
            marker = b[0]
            if marker in (0x01, *range(0xD0, 0xD8)):  # standalone markers
                continue
            raw = fh.read(2)
            if len(raw) < 2:
                break
            (length,) = struct.unpack(">H", raw)
            name = ("APP0" if marker == 0xE0 else "APPn" if 0xE1 <= marker <= 0xEF else "COM" if marker == 0xFE
                    else "DHT" if marker == 0xC4 else "DRI" if marker == 0xDD else "SOS" if marker == 0xDA
                    else f"M{marker:02X}")
            if name == "SOS":
                break
            if name == "DRI":
                restart = struct.unpack(">H", fh.read(2))[0]
                fh.seek(length - 4, 1)
            else:
                fh.seek(length - 2, 1)
            seen[name] += length - 2 if name == "DHT" else length + 2
    return dict(seen), restart


def _inspect_jpeg(path: str) -> dict[str, Any]:
    from PIL import Image, JpegImagePlugin

    with Image.open(path) as im:
        width, height = im.size
        mode = im.mode
        quant = im.quantization  # type: ignore[attr-defined]
        tables = [list(map(int, quant[k])) for k in sorted(quant)]
        sampling = JpegImagePlugin.get_sampling(im) if mode not in ("L", "1") else -1
        progressive = bool(im.info.get("progressive") or im.info.get("progression"))
    segments, restart = _jpeg_segments(path)
    bands = 1 if mode in ("L", "1") else 3
    optimize = (not progressive) and segments.get("DHT", 0) != _STD_DHT.get(bands, -1)
    return {
        "width": width, "height": height, "mode": mode,
        "quality": jpeg_quality(tables[0]) if tables else None, "qtables": tables,
        "subsampling": _SAMPLING.get(sampling), "progressive": progressive, "optimize": optimize,
        "restart_interval": restart,
        "extra_bytes": segments.get("APPn", 0) + segments.get("COM", 0),
    }


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _inspect_png(path: str) -> dict[str, Any]:
    from PIL import Image

    with Image.open(path) as im:
        mode = im.mode
    idat: list[int] = []
    extra = 0
    info: dict[str, Any] = {}
    with open(path, "rb") as fh:
        if fh.read(8) != _PNG_MAGIC:
            raise _Unreadable("not a PNG")
        for _ in range(100_000):
            head = fh.read(8)
            if len(head) < 8:
                break
            length, kind = struct.unpack(">I4s", head)
            if kind == b"IHDR":
                w, h, depth, color, _c, _f, interlace = struct.unpack(">IIBBBBB", fh.read(13))
                info = {"width": w, "height": h, "bits": depth, "color": color, "interlaced": bool(interlace)}
                fh.seek(4, 1)
                continue
            if kind == b"IDAT":
                idat.append(length)
            elif kind == b"IEND":
                break
            elif kind not in (b"PLTE", b"tRNS"):
                extra += length + 12
            fh.seek(length + 4, 1)
    if not info:
        raise _Unreadable("PNG without IHDR")
    channels = _PNG_CHANNELS.get(info["color"], 1)
    raw = info["height"] * (1 + (info["width"] * channels * info["bits"] + 7) // 8)
    return {
        "width": info["width"], "height": info["height"], "mode": mode, "bits": info["bits"],
        "interlaced": info["interlaced"], "idat_chunks": len(idat), "chunk_bytes": max(idat) if idat else None,
        "compression_ratio": round(sum(idat) / raw, 6) if raw else None, "extra_bytes": extra,
    }


# -- TFRecord, Parquet, CSV --------------------------------------------------------


def _inspect_tfrecord(path: str, limits: FingerprintLimits) -> dict[str, Any]:
    lengths: list[int] = []
    size = os.path.getsize(path)
    pos = 0
    with open(path, "rb") as fh:
        while len(lengths) < limits.records_per_file and pos < size:
            head = fh.read(12)
            if len(head) < 12:
                break
            (n,) = struct.unpack("<Q", head[:8])
            lengths.append(n)
            pos += 16 + n
            fh.seek(pos)
    if not lengths:
        raise _Unreadable("no TFRecord record")
    complete = pos >= size
    arr = np.asarray(lengths, dtype=np.int64)
    records = len(lengths) if complete else round(len(lengths) * size / max(pos, 1))
    return {"records": int(records), "records_exact": complete,
            "record_bytes": _quantiles(arr), "record_bytes_sample": [int(x) for x in arr[:64]]}


class _ThriftError(ValueError):
    """A Parquet page header that does not parse as Thrift's compact protocol."""


class _Compact:
    """Just enough of Thrift's compact protocol to read Parquet page headers: field ids,
    integers and nested structs; everything else is skipped by its wire type."""

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def _byte(self) -> int:
        if self.pos >= len(self.buf):
            raise _ThriftError("header runs past the bytes read")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self._byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise _ThriftError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def struct(self, depth: int = 0) -> dict[int, Any]:
        """A struct's integer fields (and nested structs, as dicts) by field id."""
        if depth > _THRIFT_DEPTH:
            raise _ThriftError("structs nested too deep")
        out: dict[int, Any] = {}
        last = 0
        while True:
            head = self._byte()
            if head == 0:  # stop
                return out
            kind, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag()
            last = fid
            if kind in (3, 4, 5, 6):  # byte, i16, i32, i64
                out[fid] = self.zigzag() if kind != 3 else self._byte()
            elif kind == 12:
                out[fid] = self.struct(depth + 1)
            else:
                self._skip(kind, depth)

    def _skip(self, kind: int, depth: int) -> None:
        if depth > _THRIFT_DEPTH:
            raise _ThriftError("containers nested too deep")
        if kind in (1, 2):  # booleans live in the field header
            return
        if kind in (3, 4, 5, 6):
            self.varint() if kind != 3 else self._byte()
        elif kind in (7, 8):
            n = 8 if kind == 7 else self.varint()  # (read before pos: ``pos += varint()`` would lose its bytes)
            self.pos += n
            if self.pos > len(self.buf):
                raise _ThriftError("header runs past the bytes read")
        elif kind in (9, 10):  # list, set
            head = self._byte()
            n, elem = head >> 4, head & 0x0F
            if n == 15:
                n = self.varint()
            for _ in range(n):
                self._skip_elem(elem, depth)
        elif kind == 11:  # map
            n = self.varint()
            if n:
                kv = self._byte()
                for _ in range(n):
                    self._skip_elem(kv >> 4, depth)
                    self._skip_elem(kv & 0x0F, depth)
        elif kind == 12:
            self.struct(depth + 1)
        else:
            raise _ThriftError(f"unknown wire type {kind}")

    def _skip_elem(self, kind: int, depth: int) -> None:
        if kind in (1, 2):  # a boolean element is one byte
            self._byte()
        else:
            self._skip(kind, depth + (kind in (9, 10, 11)))


#: Deepest nesting of structs and containers a page header may have (parquet.thrift's is 3):
#: a damaged or crafted header stops there instead of exhausting Python's stack.
_THRIFT_DEPTH = 16
#: Parquet page types (parquet.thrift PageType).
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
#: Bytes read at a page's start to parse its header (statistics of long values can make
#: one longer: it is read again with more).
_PAGE_HEAD_BYTES = 512
#: Pages whose headers one file's fingerprint reads, at most.
_MAX_PAGES = 256


def _page_headers(fh: Any, start: int, length: int, budget: int) -> list[tuple[int, int, int, int]]:
    """(page type, uncompressed bytes, compressed bytes, values) of the pages of the column
    chunk at ``start`` (``length`` stored bytes) of the open Parquet file ``fh``, at most
    ``budget`` of them. Raises :class:`_ThriftError` when a header does not parse."""
    pages: list[tuple[int, int, int, int]] = []
    pos, end = start, start + length
    while pos < end and len(pages) < budget:
        want = _PAGE_HEAD_BYTES
        while True:
            fh.seek(pos)
            buf = fh.read(want)
            try:
                reader = _Compact(buf)
                head = reader.struct()
                break
            except _ThriftError:
                if len(buf) < want or want >= 1 << 20:
                    raise
                want *= 8
        kind, raw, stored = head.get(1), head.get(2), head.get(3)
        if not isinstance(kind, int) or not isinstance(raw, int) or not isinstance(stored, int) or stored < 0:
            raise _ThriftError("page header without its type and sizes")
        sub = head.get({_DATA_PAGE: 5, _DICTIONARY_PAGE: 7, _DATA_PAGE_V2: 8}.get(kind, -1), {})
        values = sub.get(1, 0) if isinstance(sub, dict) else 0
        pages.append((kind, raw, stored, int(values)))
        pos += reader.pos + stored
    return pages


def _parquet_pages(path: str, meta: Any) -> dict[str, Any]:
    """What the page headers say, per column, over the first row groups (at most
    :data:`_MAX_PAGES` pages in all): data pages per column chunk, the median uncompressed
    bytes and values of a data page that is not its chunk's last (the writer cut it at its
    page size), and the data page format version; and for the file, the writer's data page
    size and values per page (from the column whose pages are smallest among those cut by
    size; None when every chunk is one page), the values it adds at a time (the greatest
    common divisor of the cut pages' values) and the version. Empty when a header does not
    parse."""
    per: list[dict[str, Any]] = []
    budget = _MAX_PAGES
    try:
        with open(path, "rb") as fh:
            for j in range(meta.num_columns):
                full: list[int] = []
                values: list[int] = []
                counts: list[int] = []
                versions: set[int] = set()
                for i in range(meta.num_row_groups):
                    if budget <= 0:
                        break
                    c = meta.row_group(i).column(j)
                    starts = [x for x in (c.dictionary_page_offset, c.data_page_offset) if x is not None and x > 0]
                    if not starts:
                        continue
                    pages = _page_headers(fh, min(starts), c.total_compressed_size, budget)
                    budget -= len(pages)
                    data = [p for p in pages if p[0] in (_DATA_PAGE, _DATA_PAGE_V2)]
                    counts.append(len(data))
                    versions.update(2 if p[0] == _DATA_PAGE_V2 else 1 for p in data)
                    cut = data[:-1] if len(data) > 1 else data
                    full += [p[1] for p in cut]
                    values += [p[3] for p in cut]
                per.append({"data_pages": round(float(np.mean(counts)), 3) if counts else None,
                            "page_bytes": int(np.median(full)) if full else None,
                            "page_values": int(np.median(values)) if values else None,
                            "page_version": max(versions) if versions else None,
                            "_values": values})
    except (OSError, _ThriftError):
        return {}
    # the writer's page size: the pages of a column cut by size (several per chunk); a
    # wide column's pages overshoot it by a whole batch of values, so the smallest
    paged = [c for c in per if c["page_bytes"] and (c["data_pages"] or 0) > 1]
    first = min(paged, key=lambda c: c["page_bytes"]) if paged else None
    # the writer adds values in batches and checks the page size after each: every page
    # that is not a chunk's last holds a whole number of batches
    batches = [v for c in paged for v in c["_values"] if v > 0]
    batch = int(np.gcd.reduce(np.asarray(batches, dtype=np.int64))) if batches else None
    versions = {c["page_version"] for c in per if c["page_version"]}
    for c in per:
        del c["_values"]
    return {"columns": per, "data_page_size": first["page_bytes"] if first else None,
            "data_page_values": first["page_values"] if first else None, "data_page_batch": batch,
            "data_page_version": max(versions) if versions else None}


def _inspect_parquet(path: str) -> dict[str, Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        import polars as pl

        schema = pl.read_parquet_schema(path)
        names = {"Int64": "int64", "Int32": "int32", "Float64": "double", "Float32": "float", "Boolean": "boolean",
                 "Binary": "binary", "String": "string"}
        return {"columns": [{"name": k, "type": names.get(str(v), str(v).lower())} for k, v in schema.items()],
                "note": "row groups and codecs need pyarrow (pip install 'dlreplay[parquet]')"}
    meta = pq.ParquetFile(path).metadata
    columns: list[dict[str, Any]] = []
    rg_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    comp = uncomp = 0
    per_column: Counter[int] = Counter()
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            c = rg.column(j)
            comp += c.total_compressed_size
            uncomp += c.total_uncompressed_size
            per_column[j] += c.total_uncompressed_size
            if i == 0:
                codec = c.compression.lower()
                columns.append({
                    "name": c.path_in_schema, "type": str(meta.schema.column(j).logical_type)
                    if str(meta.schema.column(j).logical_type) not in ("None", "") else c.physical_type.lower(),
                    "physical_type": c.physical_type.lower(),
                    "compression": None if codec == "uncompressed" else codec,
                    "dictionary": c.dictionary_page_offset is not None,
                })
    pages = _parquet_pages(path, meta)
    for j, col in enumerate(columns):
        col["row_bytes"] = round(per_column[j] / meta.num_rows, 3) if meta.num_rows else None
        if pages:
            col.update({k: v for k, v in pages["columns"][j].items() if v is not None})
    out = {"rows": int(meta.num_rows), "row_groups": int(meta.num_row_groups), "row_group_rows": rg_rows[:64],
           "columns": columns, "compression_ratio": round(comp / uncomp, 6) if uncomp else None,
           "created_by": meta.created_by}
    out.update({k: pages[k] for k in ("data_page_size", "data_page_values", "data_page_batch", "data_page_version")
                if pages.get(k) is not None})
    return out


def _inspect_csv(path: str, limits: FingerprintLimits) -> dict[str, Any]:
    with open(path, "rb") as fh:
        head = fh.read(limits.text_bytes)
        complete = not fh.read(1)
    lines = head.split(b"\n")
    if not complete and len(lines) > 1:
        lines = lines[:-1]  # a line cut by the read
    elif lines and lines[-1] == b"":
        lines = lines[:-1]
    if not lines:
        return {"rows": 0, "columns": [], "header": False}
    text = b"\n".join(lines[:50]).decode("utf-8", "replace")
    try:
        dialect = csv.Sniffer().sniff(text)
        delimiter = dialect.delimiter
    except csv.Error:
        delimiter = ","
    try:
        header = csv.Sniffer().has_header(text) if len(lines) > 1 else False
    except csv.Error:
        header = False
    first = next(csv.reader([lines[0].decode("utf-8", "replace")], delimiter=delimiter), [])
    body = lines[1:] if header else lines
    lengths = np.asarray([len(x) + 1 for x in body], dtype=np.int64) if body else np.asarray([0])
    size = os.path.getsize(path)
    rows = len(body) if complete else round(len(body) * size / max(len(head), 1))
    names = first if header else [f"column_{i}" for i in range(len(first))]
    return {"rows": int(rows), "rows_exact": complete, "header": header, "delimiter": delimiter,
            "header_bytes": len(lines[0]) + 1 if header else 0,
            "columns": [{"name": n, "type": "str"} for n in names], "line_bytes": _quantiles(lengths),
            "line_bytes_sample": [int(x) for x in lengths[:64]]}


def _quantiles(arr: np.ndarray) -> dict[str, float]:
    a = np.asarray(arr, dtype=float)
    qs = np.percentile(a, [25, 50, 75, 90, 99])
    return {"min": float(a.min()), "max": float(a.max()), "mean": float(a.mean()), "stdev": float(a.std()),
            **{f"p{q}": float(v) for q, v in zip((25, 50, 75, 90, 99), qs, strict=True)}}


# --------------------------------------------------------------------------- the fingerprint


def _group_sizes(paths: list[str], limits: FingerprintLimits) -> tuple[int, bool, dict[str, float] | None, int]:
    """(total bytes, estimated?, size quantiles, unreadable count) from stat of all or a spread subset."""
    idx = _spread(len(paths), limits.max_stat)
    sizes: list[int] = []
    bad = 0
    for i in idx:
        try:
            sizes.append(os.stat(paths[i]).st_size)
        except OSError:
            bad += 1
    if not sizes:
        return 0, True, None, bad
    arr = np.asarray(sizes, dtype=np.int64)
    estimated = len(idx) < len(paths) or bad > 0
    total = int(arr.sum()) if not estimated else int(round(arr.mean() * len(paths)))
    return total, estimated, _quantiles(arr), bad


def _fingerprint_group(root: str, ext: str, paths: list[str], limits: FingerprintLimits,
                       problems: list[str]) -> dict[str, Any]:
    paths.sort()
    total, estimated, sizes, unstat = _group_sizes(paths, limits)
    group: dict[str, Any] = {"root": root, "extension": ext, "files": len(paths), "bytes": total,
                             "bytes_estimated": estimated, "file_size": sizes}
    files: list[dict[str, Any]] = []
    formats: Counter[str] = Counter()
    unreadable: Counter[str] = Counter()
    unknown = 0
    for n, i in enumerate(_spread(len(paths), limits.files_per_group)):
        path = paths[i]
        try:
            with open(path, "rb") as fh:
                head = fh.read(64)
        except OSError as exc:
            unreadable["permission denied" if isinstance(exc, PermissionError) else (exc.strerror or str(exc))] += 1
            continue
        fmt = detect_format(head, ext)
        if fmt is None:
            unknown += 1
            continue
        try:
            entry = fingerprint_file(path, fmt, limits, probe_level=n < 4)
        except _Unreadable as exc:
            unreadable[str(exc)] += 1
            continue
        formats[entry["format"]] += 1
        files.append({"path": os.path.relpath(path, root) if os.path.isdir(root) else os.path.basename(path),
                      **entry})
    where = f"{root} ({ext or 'no extension'}, {len(paths)} file{'s' if len(paths) != 1 else ''})"
    if unstat and not unreadable:
        problems.append(f"{where}: {unstat} file(s) could not be stat'ed")
    for reason, count in unreadable.items():
        problems.append(f"{where}: {count} sampled file(s) unreadable ({reason})")
    if unknown and not files:
        problems.append(f"{where}: format unknown (no recognised header): sizes only")
    group["format"] = formats.most_common(1)[0][0] if formats else None
    group["sampled"] = len(files)
    group["files_sampled"] = files
    return group


def fingerprint_dataset(roots: Sequence[str | os.PathLike[str]] = (), files: Iterable[str] = (),
                        limits: FingerprintLimits = FingerprintLimits(),
                        skip: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """Fingerprint the dataset trees *roots* and, when no root is given, the listed *files*.

    *files* (e.g. the files a job opened) are grouped by parent directory and extension.
    *skip*: directories left out of the listing (e.g. the trace directory itself).
    Never raises for an unreadable dataset: problems are listed in the document.
    """
    t0 = time.perf_counter()
    skip_set = frozenset(os.path.abspath(os.fspath(s)) for s in skip)
    problems: list[str] = []
    listings: list[_Listing] = []
    for r in roots:
        root = os.path.abspath(os.fspath(r))
        listing = _list_tree(root, limits, skip_set)
        if listing.problem:
            problems.append(listing.problem)
        if not listing.complete:
            problems.append(f"{root}: listing stopped after {listing.listed:,} files "
                            f"({limits.list_seconds:g} s / {limits.max_listed:,} files); sampled from those")
        listings.append(listing)
    if not roots:
        by_dir: dict[str, dict[str, list[str]]] = {}
        for f in files:
            p = os.path.abspath(f)
            if os.path.basename(p).startswith("."):
                continue
            by_dir.setdefault(os.path.dirname(p), {}).setdefault(os.path.splitext(p)[1].lower(), []).append(p)
        for d, by_ext in sorted(by_dir.items()):
            listings.append(_Listing(root=d, groups=by_ext, listed=sum(map(len, by_ext.values()))))
    groups: list[dict[str, Any]] = []
    for listing in listings:
        for ext, paths in sorted(listing.groups.items(), key=lambda kv: -len(kv[1])):
            if ext in _NOT_DATA:
                continue
            groups.append(_fingerprint_group(listing.root, ext, paths, limits, problems))
    return {
        "schema": FINGERPRINT_SCHEMA,
        "format_version": FINGERPRINT_FORMAT_VERSION,
        "dlreplay_version": dlreplay.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "units": "bytes; shapes and chunks in elements; seconds",
        "seconds": round(time.perf_counter() - t0, 4),
        "limits": asdict(limits),
        "roots": [{"path": x.root, "listed": x.listed, "listing": "complete" if x.complete else "partial"}
                  for x in listings],
        "groups": groups,
        "problems": problems,
    }


def write_fingerprint(doc: dict[str, Any], trace_dir: str | os.PathLike[str]) -> Path:
    """Write *doc* as ``dataset-fingerprint.json`` in *trace_dir* (atomically); returns the path."""
    path = Path(trace_dir) / FINGERPRINT_NAME
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def read_fingerprint(trace_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The fingerprint saved in *trace_dir*, or None when there is none.

    Raises :class:`~dlreplay.errors.ArtifactVersionError` naming the file for another
    schema, a newer ``format_version`` or invalid JSON.
    """
    path = Path(trace_dir) / FINGERPRINT_NAME
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtifactVersionError(f"{path}: not a readable dataset fingerprint ({exc}); delete it or "
                                   f"pass --data-dir to fingerprint the dataset again") from None
    if not isinstance(doc, dict) or doc.get("schema") != FINGERPRINT_SCHEMA:
        raise ArtifactVersionError(f"{path}: not a dlreplay dataset fingerprint (schema "
                                   f"{doc.get('schema') if isinstance(doc, dict) else None!r}, expected "
                                   f"{FINGERPRINT_SCHEMA!r})")
    version = doc.get("format_version")
    if not isinstance(version, int) or version > FINGERPRINT_FORMAT_VERSION:
        raise ArtifactVersionError(f"{path}: format_version {version!r} is newer than this dlreplay reads "
                                   f"({FINGERPRINT_FORMAT_VERSION}); upgrade dlreplay")
    if not isinstance(doc.get("groups"), list):
        raise ArtifactVersionError(f"{path}: no 'groups' list; delete it or fingerprint the dataset again")
    return doc


_FH_NAME = re.compile(rb'"name":"FH".*?"name":"((?:[^"\\]|\\.)*)"')


def opened_files(trace_files: Iterable[str | os.PathLike[str]], max_bytes: int = 256 << 20) -> list[str]:
    """Paths of dataset-like files named in DFTracer's ``FH`` records of *trace_files*.

    Only files with a dataset extension (:data:`DATASET_EXTENSIONS`) outside the Python
    installation are kept. Traces larger than *max_bytes* (compressed) are not scanned.
    """
    import sys

    from dlreplay.pfw import decompress

    paths = [Path(p) for p in trace_files]
    if sum(p.stat().st_size for p in paths if p.exists()) > max_bytes:
        return []
    prefixes = tuple({sys.prefix, sys.base_prefix, "/usr/", "/proc/", "/sys/", "/dev/"})
    found: set[str] = set()
    for p in paths:
        try:
            text = decompress(p).data
        except OSError:
            continue
        for m in _FH_NAME.finditer(text):
            name = m.group(1).decode("utf-8", "replace").replace("\\/", "/")
            if os.path.splitext(name)[1].lower() in DATASET_EXTENSIONS and not name.startswith(prefixes):
                found.add(name)
    return sorted(f for f in found if os.path.isfile(f))
