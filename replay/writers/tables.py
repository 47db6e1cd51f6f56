"""Parquet (pyarrow when installed, else polars) and CSV files with the real files' columns,
types, codecs, row groups and pages, or delimiter and header."""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.model import TableFile

from .content import block_for, calibrate, deflate_share, fill_noise

#: Bytes per value of Parquet's fixed-width column types.
_FIXED_WIDTH = {
    "int64": 8,
    "double": 8,
    "float": 4,
    "int32": 4,
    "boolean": 1,
    "int16": 2,
    "int8": 1,
}


def write_parquet(
    tmp: Path, sizes: Sequence[int], t: TableFile | None, rng: np.random.Generator
) -> str:
    import polars as pl

    rows = len(sizes)
    cols = t.columns if t and t.columns else []
    if not cols:
        pl.DataFrame(
            {"data": [rng.bytes(s) for s in sizes]}, schema={"data": pl.Binary}
        ).write_parquet(tmp, compression="uncompressed")
        return "polars"
    assert t is not None  # cols come from it
    data, var = _parquet_columns(t, sizes, rng)
    # the writer's row group size (its last group the rest: 30/30/30/10), else an even split
    row_group = t.row_group_rows or max(1, -(-rows // (t.row_groups or 1)))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        codecs = {c.compression for c in cols if c.compression}
        codec: Any = next(iter(codecs)) if len(codecs) == 1 else "uncompressed"
        pl.DataFrame(data).write_parquet(
            tmp, compression=codec, row_group_size=row_group, data_page_size=t.data_page_size
        )
        return "polars (pyarrow not installed: one codec for all columns, its own page cuts)"
    fitted = _fit_disk_bytes(t, data, var, min(row_group, rows), rng)
    table = pa.table(
        {
            c.name: pa.array(data[c.name], type=pa.binary()) if c in var else pa.array(data[c.name])
            for c in cols
        }
    )
    options: dict[str, Any] = {
        "row_group_size": row_group,
        "compression": {c.name: (c.compression or "none") for c in cols},
        "use_dictionary": [c.name for c in cols if c.dictionary] or False,
        **_pyarrow_pages(t),
    }
    pq.write_table(table, tmp, **options)
    target = int(sum(sizes))
    for _ in range(2 if fitted else 0):
        # columns fitted to their chunks on disk: the rest of the file is its footer, which
        # another writer makes larger (polars: 3.5 KiB of an 11 KiB file against pyarrow's
        # 2.3); a key-value entry of the difference in the footer brings the file to its size
        short = target - tmp.stat().st_size
        if short <= 0.01 * target:
            break
        pad = (table.schema.metadata or {}).get(_PAD_KEY, b"")
        # (pyarrow stores the schema's metadata twice: as a key-value entry and inside the
        # base64 of its ARROW:schema entry, 7/3 bytes a byte)
        table = table.replace_schema_metadata({_PAD_KEY: b"." * (len(pad) + short * 3 // 7)})
        pq.write_table(table, tmp, **options)
    return f"pyarrow {pa.__version__}" + (
        f"; {fitted} column(s) fitted to their bytes on disk" if fitted else ""
    )


#: the footer entry that brings a generated Parquet file to its real size
_PAD_KEY = b"dlreplay.padding"


def _fit_disk_bytes(
    t: TableFile, data: dict[str, Any], var: list[Any], group: int, rng: np.random.Generator
) -> int:
    """Fit each column with its bytes on disk per row (``disk_row_bytes``) to them, in *data*
    (changed in place): a binary column's share of random blocks, an integer column's number of
    distinct values, each found by writing one row group of the column alone with its codec and
    encoding and reading its chunk's size. The table's one compression ratio, calibrated with
    deflate, gave a snappy column of half noise, half zeros 46 KiB a row group against its 37,
    and random labels 573 B against 131: a job reading row groups read 26 % more. Returns the
    columns fitted."""
    fitted = 0
    for c in t.columns:
        rows = len(data[c.name])
        if not c.disk_row_bytes or not rows or not group:
            continue
        # the file's own row groups (a short last one costs more a row), up to 16 of them
        n = min(rows, 16 * group)
        if c in var:
            widths = [len(v) for v in data[c.name]]
            block = block_for(max(int(np.median(widths)), 16))
            share = calibrate(
                functools.partial(_binary_chunk, c, widths[:n], block=block, group=group),
                c.disk_row_bytes,
                tol=0.01,
            )
            data[c.name] = [fill_noise(x, share, rng, block).tobytes() for x in widths]
            fitted += 1
        elif c.type in ("int64", "int32"):
            dtype = np.int64 if c.type == "int64" else np.int32
            bits = 30 * calibrate(
                functools.partial(_int_chunk, c, n, dtype=dtype, group=group),
                c.disk_row_bytes,
                0.02,
            )
            data[c.name] = rng.integers(0, max(1, int(round(2**bits))), rows).astype(dtype)
            fitted += 1
    return fitted


def _chunk_bytes(col: Any, values: Any, rows: int, group: int) -> float:
    """Bytes per row of the column chunks of *values* (a pyarrow array of *rows* values)
    written alone in row groups of *group* rows with *col*'s codec and dictionary encoding."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(
        pa.table({col.name: values}),
        buf,
        row_group_size=max(group, 1),
        compression=col.compression or "none",
        use_dictionary=bool(col.dictionary),
    )
    meta = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata
    disk = sum(
        meta.row_group(g).column(0).total_compressed_size for g in range(meta.num_row_groups)
    )
    return disk / max(rows, 1)


def _binary_chunk(
    col: Any, widths: list[int], share: float, block: int = 16, group: int = 1
) -> float:
    """:func:`_chunk_bytes` of binary values of *widths* bytes, *share* of their blocks random."""
    import pyarrow as pa

    probe = np.random.default_rng(0xF17)
    vals = [fill_noise(x, share, probe, block).tobytes() for x in widths]
    return _chunk_bytes(col, pa.array(vals, type=pa.binary()), len(widths), group)


def _int_chunk(col: Any, rows: int, share: float, dtype: Any, group: int = 1) -> float:
    """:func:`_chunk_bytes` of *rows* integers drawn from 2**(30 *share*) distinct values."""
    import pyarrow as pa

    probe = np.random.default_rng(0xF17)
    top = max(1, int(round(2 ** (30 * share))))
    return _chunk_bytes(col, pa.array(probe.integers(0, top, rows).astype(dtype)), rows, group)


def _parquet_columns(
    t: TableFile, sizes: Sequence[int], rng: np.random.Generator
) -> tuple[dict[str, Any], list[Any]]:
    """(each column's values, the variable-width columns): binary columns of the real widths (or
    sharing the plan's bytes per row), compressible like the real file; numbers at random."""
    rows, cols = len(sizes), t.columns
    ratio = t.compression_ratio if t.compression_ratio else 1.0
    var = [c for c in cols if c.type not in _FIXED_WIDTH] or [cols[-1]]
    if all(c.row_bytes is not None for c in var):
        # the real columns' widths (a length prefix of 4 bytes per value in Parquet's plain encoding)
        per_var_col = {c.name: [max(0, int(round((c.row_bytes or 0) - 4)))] * rows for c in var}
    else:  # the plan's bytes per row, less the fixed-width columns, shared by the variable ones
        width = sum(_FIXED_WIDTH.get(c.type, 0) for c in cols)
        share_var = [max(0, (s - width) // len(var)) for s in sizes]
        per_var_col = {c.name: share_var for c in var}
    share = 1.0 if ratio >= 0.98 else deflate_share(max(sum(sizes), 1), round(ratio, 4), 6)
    data: dict[str, Any] = {}
    for c in cols:
        if c in var:
            data[c.name] = [
                fill_noise(n, share, rng, block_for(max(n, 16))).tobytes()
                for n in per_var_col[c.name]
            ]
        elif c.type in ("double", "float"):
            data[c.name] = rng.standard_normal(rows).astype(
                np.float64 if c.type == "double" else np.float32
            )
        elif c.type == "boolean":
            data[c.name] = rng.integers(0, 2, rows).astype(bool)
        else:
            data[c.name] = rng.integers(0, 1 << 30, rows).astype(
                np.int64 if c.type == "int64" else np.int32
            )
    return data, var


def _pyarrow_pages(t: TableFile) -> dict[str, Any]:
    """``pyarrow.parquet.write_table``'s page options for the real file's data pages."""
    pages: dict[str, Any] = {}
    if t.data_page_size:
        # pyarrow adds values in batches and cuts a page once a batch brings it to the page
        # size: with the real writer's batch, a size half a batch below the real column's
        # pages cuts them after the same number of batches (and a wide column's after each)
        size, batch = t.data_page_size, t.data_page_batch
        if batch:
            pages["write_batch_size"] = batch
            if t.data_page_values:
                size = max(1, size - size * batch // t.data_page_values // 2)
        pages["data_page_size"] = size
    if t.data_page_version in (1, 2):
        pages["data_page_version"] = f"{t.data_page_version}.0"
    return pages


def write_csv(
    tmp: Path, sizes: Sequence[int], t: TableFile | None, rng: np.random.Generator
) -> str:
    import polars as pl

    if t is None or not t.columns:
        rows = [rng.bytes(max(1, s // 2)).hex() + ("0" if s % 2 and s > 1 else "") for s in sizes]
        pl.DataFrame({"data": rows}).write_csv(tmp)
        return "polars"
    delim = t.delimiter or ","
    ncols = len(t.columns)
    lines = []
    if t.header:
        lines.append(delim.join(c.name for c in t.columns))
    for s in sizes:
        body = max(ncols, s - 1 - (ncols - 1))  # newline and delimiters
        widths = [body // ncols + (1 if i < body % ncols else 0) for i in range(ncols)]
        digits = rng.integers(0, 10, size=sum(widths)).astype(np.uint8) + ord("0")
        text = digits.tobytes().decode()
        parts, pos = [], 0
        for w in widths:
            parts.append(text[pos : pos + w])
            pos += w
        lines.append(delim.join(parts))
    tmp.write_text("\n".join(lines) + "\n")
    return "text"
