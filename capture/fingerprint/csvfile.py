"""CSV and other delimited text: rows, delimiter, header and columns, and line lengths, from
the file's first bytes; JSON lines: the lines counted and their lengths."""

from __future__ import annotations

import csv
import os
from typing import Any

import numpy as np

from .common import FingerprintLimits, quantiles


def inspect_csv(path: str, limits: FingerprintLimits) -> dict[str, Any]:
    """Rows, delimiter, header and line lengths from the first ``limits.text_bytes`` bytes
    (rows estimated from the file's size when it is longer)."""
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
    return {
        "rows": int(rows),
        "rows_exact": complete,
        "header": header,
        "delimiter": delimiter,
        "header_bytes": len(lines[0]) + 1 if header else 0,
        "columns": [{"name": n, "type": "str"} for n in names],
        "line_bytes": quantiles(lengths),
        "line_bytes_sample": [int(x) for x in lengths[:64]],
    }


#: Bytes of a JSON-lines file whose lines :func:`inspect_jsonl` counts (past it: estimated
#: from them; the fingerprint samples up to 24 files a group, read at the capture's end)
JSONL_COUNT_BYTES = 8 << 20


def inspect_jsonl(path: str, limits: FingerprintLimits) -> dict[str, Any]:
    """A JSON-lines file (``.jsonl``, ``.ndjson``; a record a line): its lines, counted over
    the whole file up to :data:`JSONL_COUNT_BYTES` (``lines_exact``; past it estimated from
    the bytes counted), and the lengths (bytes, newline included) of the lines in the first
    ``limits.text_bytes``."""
    lines = counted = 0
    head = b""
    with open(path, "rb") as fh:
        while counted < JSONL_COUNT_BYTES and (block := fh.read(1 << 20)):
            if len(head) < limits.text_bytes:
                head += block[: limits.text_bytes - len(head)]
            lines += block.count(b"\n")
            counted += len(block)
            last = block[-1:]
        complete = not fh.read(1)
    if counted and complete and last != b"\n":
        lines += 1  # a last line without its newline
    size = os.path.getsize(path)
    whole = [x for x in head.split(b"\n")[:-1]] if head else []
    lengths = np.asarray([len(x) + 1 for x in whole] or [0], dtype=np.int64)
    return {
        "lines": int(lines if complete else round(lines * size / max(counted, 1))),
        "lines_exact": complete,
        "line_bytes": quantiles(lengths),
        "line_bytes_sample": [int(x) for x in lengths[:64]],
    }
