"""TFRecord files: the number of records and their lengths, from the records' headers."""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from .common import FingerprintLimits, Unreadable, quantiles


def is_tfrecord_header(head: bytes) -> bool:
    """Whether 12 bytes are a TFRecord header: a length and its masked CRC-32C."""
    from dlreplay.checksums import masked_crc32c

    (length,) = struct.unpack("<Q", head[:8])
    return length > 0 and masked_crc32c(head[:8]) == struct.unpack("<I", head[8:12])[0]


def inspect_tfrecord(path: str, limits: FingerprintLimits) -> dict[str, Any]:
    """Record lengths from the headers of the first ``limits.records_per_file`` records (the
    count estimated from the bytes they span when the file holds more)."""
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
        raise Unreadable("no TFRecord record")
    complete = pos >= size
    arr = np.asarray(lengths, dtype=np.int64)
    records = len(lengths) if complete else round(len(lengths) * size / max(pos, 1))
    return {
        "records": int(records),
        "records_exact": complete,
        "record_bytes": quantiles(arr),
        "record_bytes_sample": [int(x) for x in arr[:64]],
    }
