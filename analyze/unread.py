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

#: per format: the layout's structures, the attribute holding their parts, what a part is
_PARTS = {
    "npz": ("arrays", "members", "never read per sample", "their bytes"),
    "hdf5": ("arrays", "members", "never read per sample", "their bytes"),
    "parquet": ("tables", "columns", "columns never read", "their chunks"),
}


def mark_unread(
    summary: dict[str, Any],
    files: list[dict[str, Any]],
    root: str,
    fmt: str,
    reads: pl.DataFrame,
    fields: dict[str, tuple[str, str]],
) -> None:
    """Mark in *summary* (a layout's fields) what no read of *reads* touched in the sampled
    *files* (paths under *root*): NPZ and HDF5 arrays, Parquet columns (a job's
    ``columns=[...]``: pyarrow reads those columns' chunks alone) become
    ``read_per_sample: false``, with the evidence in *fields* (a field's dotted path ->
    (method, confidence)). Unchanged where every part is unread (the trace cannot tell)."""
    kind = "npz" if fmt == "zip" else fmt
    if kind not in _PARTS:
        return
    key, attr, said, what = _PARTS[kind]
    if not summary.get(key):
        return
    unread, told = unread_members(files, root, kind, reads)
    names = {m.name for st in summary[key] for m in getattr(st, attr) or ()}
    if not unread or not names - unread:
        return
    summary[key] = [
        replace(
            st,
            **{
                attr: [
                    replace(m, read_per_sample=False) if m.name in unread else m
                    for m in getattr(st, attr) or ()
                ]
            },
        )
        for st in summary[key]
    ]
    how, confidence = fields[f"dataset.layout.{key}"]
    fields[f"dataset.layout.{key}"] = (
        f"{how}; {said}: {', '.join(sorted(unread))} (no read of the {told} sampled file(s) "
        f"the trace read touched {what})",
        confidence,
    )


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
