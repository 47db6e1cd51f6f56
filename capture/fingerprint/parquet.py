"""Parquet files: rows, row groups, columns with their types, codecs and dictionary
encoding, and what the page headers say about the writer's data pages (read with a small
reader of Thrift's compact protocol)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np


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
            n = (
                8 if kind == 7 else self.varint()
            )  # (read before pos: ``pos += varint()`` would lose its bytes)
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
        if (
            not isinstance(kind, int)
            or not isinstance(raw, int)
            or not isinstance(stored, int)
            or stored < 0
        ):
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
                column, budget = _column_pages(fh, meta, j, budget)
                per.append(column)
    except (OSError, _ThriftError):
        return {}
    return _writer_pages(per)


def _column_pages(fh: Any, meta: Any, j: int, budget: int) -> tuple[dict[str, Any], int]:
    """Column *j*'s pages over its chunks, reading at most *budget* page headers, and the
    budget left. ``_values`` lists the values of the pages the writer cut at its page size."""
    full: list[int] = []
    values: list[int] = []
    counts: list[int] = []
    versions: set[int] = set()
    for i in range(meta.num_row_groups):
        if budget <= 0:
            break
        c = meta.row_group(i).column(j)
        starts = [
            x for x in (c.dictionary_page_offset, c.data_page_offset) if x is not None and x > 0
        ]
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
    column = {
        "data_pages": round(float(np.mean(counts)), 3) if counts else None,
        "page_bytes": int(np.median(full)) if full else None,
        "page_values": int(np.median(values)) if values else None,
        "page_version": max(versions) if versions else None,
        "_values": values,
    }
    return column, budget


def _writer_pages(per: list[dict[str, Any]]) -> dict[str, Any]:
    """The writer's data page settings from the columns' pages (each column's ``_values``
    is dropped here)."""
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
    return {
        "columns": per,
        "data_page_size": first["page_bytes"] if first else None,
        "data_page_values": first["page_values"] if first else None,
        "data_page_batch": batch,
        "data_page_version": max(versions) if versions else None,
    }


#: Row groups whose column chunks' places a file's fingerprint lists (``chunk_spans``), and
#: the chunks it lists at most (a wide table's: fewer groups).
_MAX_SPAN_GROUPS, _MAX_SPANS = 64, 1024


def _chunk_span(c: Any) -> list[int]:
    """``[start, stored bytes]`` of column chunk *c* in its file (its dictionary page first,
    where it has one): the bytes a reader of that column in that row group reads."""
    starts = [x for x in (c.dictionary_page_offset, c.data_page_offset) if x is not None and x > 0]
    return [int(min(starts)) if starts else 0, int(c.total_compressed_size)]


def _columns_without_pyarrow(path: str) -> dict[str, Any]:
    """The columns' names and types alone, through polars (no pyarrow: no row groups)."""
    import polars as pl

    schema = pl.read_parquet_schema(path)
    names = {
        "Int64": "int64",
        "Int32": "int32",
        "Float64": "double",
        "Float32": "float",
        "Boolean": "boolean",
        "Binary": "binary",
        "String": "string",
    }
    return {
        "columns": [
            {"name": k, "type": names.get(str(v), str(v).lower())} for k, v in schema.items()
        ],
        "note": "row groups and codecs need pyarrow (pip install 'dlreplay[parquet]')",
    }


def inspect_parquet(path: str) -> dict[str, Any]:
    """Rows, row groups and columns from the footer (with pyarrow; only the columns with
    polars), each column's chunks' places in the file (``chunk_spans``: ``[start, bytes]`` of
    the first :data:`_MAX_SPAN_GROUPS` row groups', :data:`_MAX_SPANS` chunks at most), and
    the data pages from the page headers."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return _columns_without_pyarrow(path)
    meta = pq.ParquetFile(path).metadata
    columns: list[dict[str, Any]] = []
    rg_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    comp = uncomp = 0
    per_column: Counter[int] = Counter()
    per_column_disk: Counter[int] = Counter()
    spans: dict[int, list[list[int]]] = {}
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            c = rg.column(j)
            comp += c.total_compressed_size
            uncomp += c.total_uncompressed_size
            per_column[j] += c.total_uncompressed_size
            per_column_disk[j] += c.total_compressed_size
            if i < min(_MAX_SPAN_GROUPS, max(1, _MAX_SPANS // max(1, rg.num_columns))):
                spans.setdefault(j, []).append(_chunk_span(c))
            if i == 0:
                codec = c.compression.lower()
                columns.append(
                    {
                        "name": c.path_in_schema,
                        "type": str(meta.schema.column(j).logical_type)
                        if str(meta.schema.column(j).logical_type) not in ("None", "")
                        else c.physical_type.lower(),
                        "physical_type": c.physical_type.lower(),
                        "compression": None if codec == "uncompressed" else codec,
                        "dictionary": c.dictionary_page_offset is not None,
                    }
                )
    pages = _parquet_pages(path, meta)
    for j, col in enumerate(columns):
        col["row_bytes"] = round(per_column[j] / meta.num_rows, 3) if meta.num_rows else None
        col["disk_row_bytes"] = (
            round(per_column_disk[j] / meta.num_rows, 3) if meta.num_rows else None
        )
        col["chunk_spans"] = spans.get(j, [])
        if pages:
            col.update({k: v for k, v in pages["columns"][j].items() if v is not None})
    out = {
        "rows": int(meta.num_rows),
        "row_groups": int(meta.num_row_groups),
        "row_group_rows": rg_rows[:64],
        "columns": columns,
        "compression_ratio": round(comp / uncomp, 6) if uncomp else None,
        "created_by": meta.created_by,
    }
    out.update(
        {
            k: pages[k]
            for k in ("data_page_size", "data_page_values", "data_page_batch", "data_page_version")
            if pages.get(k) is not None
        }
    )
    return out
