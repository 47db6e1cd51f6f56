"""Shards streamed by an ``IterableDataset``: WebDataset-style tar shards and Arrow IPC stream
files. What is inside one: its samples and the parts of each (tar members sharing a key, or
Arrow columns), read from its headers without its payload.

Distill reads the same from the shards where they are at hand, and from the fingerprint made at
capture where they are not (a trace distilled on another machine): a trace without the loader's
events says nothing of the samples inside a shard.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from .common import FingerprintLimits, Unreadable

#: Arrow IPC: the continuation marker that starts a stream's messages; a file's magic.
ARROW_STREAM, ARROW_FILE = b"\xff\xff\xff\xff", b"ARROW1"
#: Extensions whose leading continuation marker is an Arrow stream's (the marker alone is too
#: common a prefix to tell a format by).
ARROW_EXTENSIONS = (".arrow", ".feather", ".ipc")


def is_tar_header(head: bytes) -> bool:
    """Whether a file's first bytes (at least 262) are a POSIX (ustar) tar header."""
    return head[257:262] == b"ustar"


def is_arrow_header(head: bytes, ext: str) -> bool:
    """Whether a file's first bytes start an Arrow IPC file, or a stream (by its extension)."""
    return head.startswith(ARROW_FILE) or (
        head.startswith(ARROW_STREAM) and ext.lower() in ARROW_EXTENSIONS
    )


def tar_parts(path: str, limit: int | None = None) -> tuple[int, dict[str, list[int]]]:
    """(samples, part name -> bytes of each) of a tar shard from its headers (seeking past the
    members' data): members sharing a key (the name up to its first dot, in its folder) are one
    sample, named by the rest (``000001.npy`` and ``000001.cls``: parts ``npy`` and ``cls``).
    *limit*: members read at most (the samples then estimated from the bytes they span)."""
    parts: dict[str, list[int]] = {}
    keys: set[str] = set()
    members = 0
    end = 0
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            if not m.isreg():
                continue
            key, _, ext = PurePosixPath(m.name).name.partition(".")
            keys.add(str(PurePosixPath(m.name).parent / key))
            parts.setdefault(ext, []).append(m.size)
            members += 1
            end = m.offset_data + m.size
            if limit is not None and members >= limit:
                return round(len(keys) * os.path.getsize(path) / max(end, 1)), parts
    return len(keys), parts


def arrow_parts(path: str) -> tuple[int, dict[str, list[int]], list[int]]:
    """(rows, column -> bytes per row of each, rows of each record batch) of an Arrow IPC stream
    (or file) shard: binary and string columns by each value's length, the others by their
    type's width."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts: dict[str, list[int]] = {}
    rows: list[int] = []
    with pa.OSFile(path, "rb") as f:
        head = f.read(6)
        f.seek(0)
        reader = pa.ipc.open_file(f) if head == ARROW_FILE else pa.ipc.open_stream(f)
        batches = (
            (reader.get_batch(i) for i in range(reader.num_record_batches))
            if head == ARROW_FILE
            else reader
        )
        for batch in batches:
            rows.append(batch.num_rows)
            for name, col in zip(batch.schema.names, batch.columns, strict=True):
                if pa.types.is_binary(col.type) or pa.types.is_string(col.type):
                    per = np.asarray(pc.binary_length(col).to_numpy(zero_copy_only=False))
                else:
                    per = np.full(batch.num_rows, max(1, col.type.bit_width // 8))
                parts.setdefault(name, []).extend(int(v) for v in per)
    return sum(rows), parts, rows


def inspect_shard(path: str, fmt: str, limits: FingerprintLimits) -> dict[str, Any]:
    """The fingerprint entry of a tar or Arrow shard: ``samples``, ``parts`` (name -> bytes of
    each, the first ``limits.records_per_file`` of each part) and, for Arrow, ``rows_per_batch``
    (each record batch's rows, as many)."""
    keep = limits.records_per_file
    if fmt == "tar":
        try:
            samples, parts = tar_parts(path, limit=keep * 8)
        except tarfile.TarError as exc:
            raise Unreadable(f"tar: {exc}") from None
        return {"samples": samples, "parts": {k: v[:keep] for k, v in parts.items()}}
    try:
        samples, parts, rows = arrow_parts(path)
    except ImportError:
        raise Unreadable("pyarrow is not installed (pip install pyarrow)") from None
    return {
        "samples": samples,
        "parts": {k: v[:keep] for k, v in parts.items()},
        "rows_per_batch": rows[:keep],
    }
