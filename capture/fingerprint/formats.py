"""Which format a file is (from its first bytes), and the layout of one file read with that
format's inspector."""

from __future__ import annotations

import os
from typing import Any

from .common import DEFAULT_LIMITS, FingerprintLimits, Unreadable
from .csvfile import inspect_csv, inspect_jsonl
from .hdf5 import inspect_hdf5
from .jpeg import inspect_jpeg
from .npz import inspect_npy, inspect_zip
from .parquet import inspect_parquet
from .png import PNG_MAGIC, inspect_png
from .shards import inspect_shard, is_arrow_header, is_tar_header
from .tfrecord import inspect_tfrecord, is_tfrecord_header

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def detect_format(head: bytes, ext: str) -> str | None:
    """The dataset format of a file from its first bytes (and extension for text/TFRecord).

    Returns a DLIO format name (npz, npy, hdf5, jpeg, png, parquet, tfrecord, csv), ``tar``
    or ``arrow`` for streamed shards, ``jsonl`` for JSON lines (a record a line) (*head* of at least 262 bytes for a tar's header), ``zip``
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
    if head.startswith(PNG_MAGIC):
        return "png"
    if head.startswith(b"PAR1"):
        return "parquet"
    if is_tar_header(head):
        return "tar"
    if is_arrow_header(head, ext):
        return "arrow"
    if len(head) >= 12 and is_tfrecord_header(head[:12]):
        return "tfrecord"
    if ext in (".h5", ".hdf5", ".hdf", ".he5", ".nc"):
        return "hdf5"  # a user block before the superblock: h5py decides
    if ext in (".csv", ".tsv", ".txt") and _looks_text(head):
        return "csv"
    if ext in (".jsonl", ".ndjson") and _looks_text(head):
        return "jsonl"
    return None


def _looks_text(head: bytes) -> bool:
    """UTF-8 without NUL bytes (a character cut at the end allowed)."""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        try:
            head[:-3].decode("utf-8")  # a multi-byte character cut at the end
        except UnicodeDecodeError:
            return False
    return b"\x00" not in head


def fingerprint_file(
    path: str, fmt: str, limits: FingerprintLimits = DEFAULT_LIMITS, probe_level: bool = True
) -> dict[str, Any]:
    """The layout of one file as a JSON-ready dict (``bytes``, ``format`` and format fields).

    Raises :class:`Unreadable` (a one-line reason) when the file cannot be inspected.
    """
    try:
        size = os.path.getsize(path)
        if fmt in ("npz", "zip"):
            entry = inspect_zip(path, limits, probe_level)
        elif fmt == "npy":
            entry = inspect_npy(path)
        elif fmt == "hdf5":
            entry = inspect_hdf5(path, limits)
        elif fmt == "jpeg":
            entry = inspect_jpeg(path)
        elif fmt == "png":
            entry = inspect_png(path)
        elif fmt == "tfrecord":
            entry = inspect_tfrecord(path, limits)
        elif fmt == "parquet":
            entry = inspect_parquet(path)
        elif fmt == "csv":
            entry = inspect_csv(path, limits)
        elif fmt == "jsonl":
            entry = inspect_jsonl(path, limits)
        elif fmt in ("tar", "arrow"):
            entry = inspect_shard(path, fmt, limits)
        else:
            entry = {}
    except Unreadable:
        raise
    except PermissionError:
        raise Unreadable("permission denied") from None
    except OSError as exc:
        raise Unreadable(exc.strerror or str(exc)) from None
    except Exception as exc:  # a library refusing a damaged or unexpected file
        raise Unreadable(f"{type(exc).__name__}: {exc}".splitlines()[0][:200]) from None
    return {"bytes": size, "format": entry.pop("format", fmt), **entry}
