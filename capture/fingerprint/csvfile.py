"""CSV and other delimited text: rows, delimiter, header and columns, and line lengths, from
the file's first bytes."""

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
