"""NPZ, NPY and other zip files: members, their storage (stored or deflated, and the deflate
level), zip64 and data-descriptor framing, and each NPY member's header."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

from .common import FingerprintLimits

#: The zip64 extended-information extra field id.
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
        hid, hlen = struct.unpack("<HH", extra[pos : pos + 4])
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


def inspect_zip(path: str, limits: FingerprintLimits, probe_level: bool) -> dict[str, Any]:
    """A zip's members (up to ``limits.max_objects``): storage, sizes, framing, NPY headers, and
    with *probe_level* the deflate level of members up to ``limits.level_probe_bytes``."""
    members: list[dict[str, Any]] = []
    with open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
        infos = zf.infolist()
        all_npy = bool(infos) and all(i.filename.endswith(".npy") for i in infos)
        for info in infos[: limits.max_objects]:
            m: dict[str, Any] = {
                "name": info.filename,
                "storage": {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}.get(
                    info.compress_type, f"method-{info.compress_type}"
                ),
                "stored_bytes": info.compress_size,
                "logical_bytes": info.file_size,
                "offset": info.header_offset,
                "data_descriptor": bool(info.flag_bits & 0x08),
            }
            m["zip64"] = _ZIP64_EXTRA in _local_extra_ids(fh, info.header_offset)
            if info.filename.endswith(".npy"):
                with zf.open(info) as f:
                    version, shape, fortran, dtype = _npy_header(f)
                    m.update(
                        dtype=dtype.str if dtype.names is None else str(dtype.descr),
                        shape=list(shape),
                        fortran_order=bool(fortran),
                        npy_version=list(version),
                        npy_header_bytes=f.tell()
                        if info.compress_type == zipfile.ZIP_STORED
                        else None,
                    )
            if (
                probe_level
                and info.compress_type == zipfile.ZIP_DEFLATED
                and 0 < info.file_size <= limits.level_probe_bytes
            ):
                m["level"] = _deflate_level(zf.read(info), info.compress_size)
            members.append(m)
    out: dict[str, Any] = {
        "format": "npz" if all_npy or path.endswith(".npz") else "zip",
        "members": members,
    }
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


def inspect_npy(path: str) -> dict[str, Any]:
    """An NPY file as one member: its header's dtype, shape, order and version."""
    with open(path, "rb") as fh:
        version, shape, fortran, dtype = _npy_header(fh)
        header = fh.tell()
    member = {
        "name": "",
        "dtype": dtype.str if dtype.names is None else str(dtype.descr),
        "shape": list(shape),
        "fortran_order": bool(fortran),
        "npy_version": list(version),
        "npy_header_bytes": header,
    }
    return {"members": [member]}
