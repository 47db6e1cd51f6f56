"""What a trace's reads never touched in the dataset's files: the arrays of NPZ and HDF5 files
and the columns of Parquet files a job has in its files but never reads per sample (DLIO's
HDF5 ``/labels``, a reader's ``columns=[...]``), found by laying the trace's reads over the
fingerprint's byte places of each array or column chunk. Distill marks them
``read_per_sample: false`` in ``dataset.layout``; the replay leaves them unread too."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import polars as pl


def mark_unread(
    summary: dict[str, Any],
    files: list[dict[str, Any]],
    root: str,
    fmt: str,
    reads: pl.DataFrame,
    fields: dict[str, tuple[str, str]],
) -> None:
    """Mark in *summary* (a layout's fields) what no read of *reads* touched in the sampled
    *files* (paths under *root*): NPZ and HDF5 arrays, Parquet columns, with the evidence in
    *fields* (a field's dotted path -> (method, confidence))."""
    if summary.get("arrays") and fmt in ("npz", "zip", "hdf5"):
        _mark_unread(summary, files, root, fmt, reads, fields)
    if summary.get("tables") and fmt == "parquet":
        _mark_unread_columns(summary, files, root, reads, fields)


def _member_spans(f: dict[str, Any], fmt: str) -> dict[str, list[tuple[int, int]]]:
    """Each array's bytes in fingerprint file *f*, ``[start, end)`` spans: an HDF5 contiguous
    dataset's data, an NPZ member's local header and data, a Parquet column's chunks (the
    first row groups'). Arrays whose bytes are not known (chunked, compact) are left out."""
    if fmt == "hdf5":
        return {
            str(d["name"]): [(int(d["offset"]), int(d["offset"]) + int(d.get("stored_bytes") or 0))]
            for d in f.get("datasets", [])
            if d.get("offset") is not None and d.get("stored_bytes")
        }
    if fmt == "parquet":
        return {
            str(c["name"]): [
                (int(x[0]), int(x[0]) + int(x[1]))
                for x in c["chunk_spans"]
                if isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) for v in x)
            ]
            for c in f.get("columns", [])
            if isinstance(c, dict) and "name" in c and isinstance(c.get("chunk_spans"), list)
        }
    out = {}
    for m in f.get("members", []):
        if m.get("offset") is None or m.get("stored_bytes") is None:
            continue
        # local header (30 bytes, the name, numpy's zip64 extra field of 20), then the data;
        # the central directory after the last member is not the member's
        head = 30 + len(str(m["name"]).encode()) + (20 if m.get("zip64") else 0)
        start = int(m["offset"])
        out[str(m["name"])] = [(start, start + head + int(m["stored_bytes"]))]
    return out


def unread_members(
    files: list[dict[str, Any]], root: str, fmt: str, reads: pl.DataFrame
) -> tuple[set[str], int]:
    """(the arrays no read touched, files that tell): in each sampled file (*files*, paths
    under *root*) the trace read (*reads*: its ``file``, ``offset``, ``size``), the arrays
    whose bytes no read overlapped while another array's were read; an array is unread when
    it was so in every such file (*fmt* hdf5, npz, or parquet: its columns). HDF5's sieve
    buffer reading past a small array counts as a read of it (the array is then kept), as
    does a Parquet reader's read coalescing two columns' chunks."""
    if reads.is_empty() or not {"file", "offset", "size"} <= set(reads.columns):
        return set(), 0
    got = reads.filter(pl.col("offset").is_not_null() & (pl.col("size") > 0)).select(
        pl.col("file").cast(pl.String), "offset", "size"
    )
    by_file = {str(k[0]): v for k, v in got.partition_by("file", as_dict=True).items()}
    unread: set[str] | None = None
    told = 0
    for f in files:
        spans = _member_spans(f, fmt)
        mine = by_file.get(os.path.normpath(os.path.join(root, str(f.get("path", "")))))
        if len(spans) < 2 or mine is None:
            continue
        lo = mine["offset"].to_numpy()
        hi = lo + mine["size"].to_numpy()
        if fmt == "parquet" and f.get("bytes"):  # a read to the file's end reads its footer
            # (pyarrow reads the last 64 KiB, a small file's chunks with it), not a column
            keep = hi < int(f["bytes"])
            lo, hi = lo[keep], hi[keep]
        touched = {
            n
            for n, parts in spans.items()
            if any(bool(((lo < b) & (hi > a)).any()) for a, b in parts)
        }
        if not touched:  # no array's bytes read here (a mapped file, metadata only)
            continue
        told += 1
        here = set(spans) - touched
        unread = here if unread is None else unread & here
    return unread or set(), told


def _mark_unread(
    summary: dict[str, Any],
    files: list[dict[str, Any]],
    root: str,
    fmt: str,
    reads: pl.DataFrame,
    fields: dict[str, tuple[str, str]],
) -> None:
    """The arrays of ``summary["arrays"]`` no read of the trace touched (:func:`unread_members`)
    marked ``read_per_sample: false``, with the evidence."""
    unread, told = unread_members(files, root, "hdf5" if fmt == "hdf5" else "npz", reads)
    if not unread:
        return
    summary["arrays"] = [
        replace(
            a,
            members=[
                replace(m, read_per_sample=False) if m.name in unread else m for m in a.members
            ],
        )
        for a in summary["arrays"]
    ]
    how, confidence = fields["dataset.layout.arrays"]
    fields["dataset.layout.arrays"] = (
        f"{how}; never read per sample: {', '.join(sorted(unread))} (no read of the "
        f"{told} sampled file(s) the trace read touched their bytes)",
        confidence,
    )


def _mark_unread_columns(
    summary: dict[str, Any],
    files: list[dict[str, Any]],
    root: str,
    reads: pl.DataFrame,
    fields: dict[str, tuple[str, str]],
) -> None:
    """The Parquet columns no read of the trace touched (a job's ``columns=[...]``: pyarrow
    reads the chunks of those alone) marked ``read_per_sample: false``, with the evidence."""
    unread, told = unread_members(files, root, "parquet", reads)
    names = {c.name for t in summary["tables"] for c in t.columns or ()}
    if not unread or not names - unread:  # a column read, or the trace cannot tell
        return
    summary["tables"] = [
        replace(
            t,
            columns=[
                replace(c, read_per_sample=False) if c.name in unread else c
                for c in t.columns or ()
            ],
        )
        for t in summary["tables"]
    ]
    how, confidence = fields["dataset.layout.tables"]
    fields["dataset.layout.tables"] = (
        f"{how}; columns never read: {', '.join(sorted(unread))} (no read of the {told} "
        "sampled file(s) the trace read touched their chunks)",
        confidence,
    )
