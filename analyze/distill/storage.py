"""The storage section of the model (``storage``, DLIO's keys): where the dataset lives. A job
whose samples are S3 objects read through boto3 (``dlreplay capture``'s ``S3``/``GetObject``
events, :mod:`dlreplay.capture.inject.s3`) gets ``storage_type: s3``, the bucket as
``storage_root``, the objects' key prefix, the client library, the median object size and the
median bytes one GET asks for (``ranged`` when most GETs carry a ``Range``).

The event table keeps no ``offset``/``bytes`` of these events, so they are read from the trace
files themselves (:func:`object_reads`: the matching lines only, decoded as NDJSON by polars).
For the rest of distill each GET is a read of a file named ``s3://<bucket>/<key>`` at its byte
range (:func:`with_object_reads`): the dataset, its object sizes, the reads per sample, the
request sizes and the workers come out of the same inferences as for files. Bytes; µs.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import polars as pl

from dlreplay.model import Dataset
from dlreplay.model.sections import Storage

from ..trace.sidecar import fields_of, matching_lines, register

__all__ = [
    "OBJECT_SCHEMA",
    "object_folder",
    "object_reads",
    "storage_section",
    "with_object_dirs",
    "with_object_reads",
    "without_object_dirs",
]

#: Columns of :func:`object_reads`: µs (``ts``, ``dur``), bytes (``offset`` and ``length``
#: asked for, ``bytes`` answered, ``object_size``); ``error`` 1 when the call raised.
OBJECT_SCHEMA = {
    "pid": pl.Int64,
    "tid": pl.Int64,
    "ts": pl.Int64,
    "dur": pl.Int64,
    "bucket": pl.String,
    "key": pl.String,
    "offset": pl.Int64,
    "length": pl.Int64,
    "bytes": pl.Int64,
    "object_size": pl.Int64,
    "client": pl.String,
    "error": pl.Int64,
}
_ARGS = ("bucket", "key", "offset", "length", "bytes", "object_size", "client", "error")
_LINE = register(
    re.compile(rb'^\{[^\n]*"name":"GetObject","cat":"S3"[^\n]*$', re.M),
    b'"name":"GetObject","cat":"S3"',
)
#: The read call a GET stands for in the event table (a positioned read: its offset counts).
READ_AS = "pread64"


def object_reads(source: str | Path | None) -> pl.DataFrame:
    """The ``S3``/``GetObject`` events of the trace at *source* (a capture directory or a trace
    file): :data:`OBJECT_SCHEMA`, by time. Empty without any."""
    lines = matching_lines(source, _LINE)
    if not lines:
        return pl.DataFrame(schema=OBJECT_SCHEMA)
    schema = {k: (f"$.args.{k}" if k in _ARGS else f"$.{k}", t) for k, t in OBJECT_SCHEMA.items()}
    out = fields_of(lines, schema)
    return out.drop_nulls(["ts", "bucket", "key"]).sort("ts")


def with_object_reads(events: pl.DataFrame, objects: pl.DataFrame) -> pl.DataFrame:
    """*events* with each successful GET of *objects* as a POSIX ``pread64`` of the file
    ``s3://<bucket>/<key>``: ``offset`` the range's start (0 for a whole GET), ``size`` and
    ``ret`` the bytes answered, ``size_requested`` the range's length (else the bytes). The
    process's ``ppid`` and ``host`` are those of its other events. *events* unchanged
    without any GET."""
    ok = objects.filter(pl.col("error").is_null() & pl.col("bytes").is_not_null())
    if ok.is_empty():
        return events
    procs = events.group_by("pid").agg(pl.col("ppid").first(), pl.col("host").first())
    rows = ok.select(
        pl.col("pid").cast(pl.Int32),
        pl.col("tid").cast(pl.Int32),
        "ts",
        "dur",
        pl.lit("POSIX").alias("cat"),
        pl.lit(READ_AS).alias("name"),
        pl.format("s3://{}/{}", "bucket", "key").alias("file"),
        pl.coalesce("length", "bytes").alias("size_requested"),
        pl.col("bytes").alias("size"),
        pl.col("offset").fill_null(0).alias("offset"),
        pl.col("bytes").alias("ret"),
    ).join(procs, on="pid", how="left")
    missing = [c for c in events.columns if c not in rows.columns]
    rows = rows.with_columns(pl.lit(None).alias(c) for c in missing).select(events.columns)
    return pl.concat(
        [events, rows.cast(events.schema)],  # type: ignore[arg-type]
        how="vertical",
    ).sort("ts", maintain_order=True)


def with_object_dirs(data_dirs: list[str] | None, objects: pl.DataFrame) -> list[str] | None:
    """The dataset's directories for the rest of the analysis: *data_dirs*, or None (the dataset
    is what the loader's workers read) when the job read objects: ``s3://`` names are under no
    directory (a replay's manifest names its local copy of the dataset, which it does not read)."""
    return data_dirs if objects.is_empty() else None


def without_object_dirs(manifest: dict | None, objects: pl.DataFrame) -> dict | None:
    """A capture's manifest, without its ``data_dirs`` when the job read objects (see
    :func:`with_object_dirs`; the analysis passes take the manifest's when given none)."""
    if objects.is_empty() or not manifest:
        return manifest
    return {**manifest, "data_dirs": []}


def object_folder(dataset: Dataset, storage: Storage | None) -> Dataset:
    """*dataset* with ``data_folder`` the objects' key prefix (without its last ``/``), as DLIO
    reads it under ``storage_root`` with ``storage_type: s3``; unchanged for a POSIX job."""
    if storage is None or storage.storage_type != "s3":
        return dataset
    return replace(dataset, data_folder=(storage.prefix or "").rstrip("/") or ".")


def storage_section(objects: pl.DataFrame) -> Storage | None:
    """``storage: s3`` from the job's GETs (None without any): the bucket most bytes came
    from, its keys' common prefix (up to a ``/``), the client, the median object size (bytes,
    over objects) and the median bytes asked per GET; ``ranged`` when most GETs had a Range."""
    ok = objects.filter(pl.col("error").is_null() & pl.col("bytes").is_not_null())
    if ok.is_empty():
        return None
    bucket = (
        ok.group_by("bucket")
        .agg(pl.col("bytes").sum())
        .sort(["bytes", "bucket"], descending=[True, False])
    )["bucket"][0]
    mine = ok.filter(pl.col("bucket") == bucket)
    keys = mine["key"].unique().sort().to_list()
    prefix = _common_prefix(keys)
    sizes = mine.group_by("key").agg(
        pl.coalesce(
            pl.col("object_size").max(), (pl.col("offset").fill_null(0) + pl.col("bytes")).max()
        )
    )
    asked = mine.select(pl.coalesce("length", "bytes"))
    client = mine["client"].drop_nulls().mode().sort()
    return Storage(
        storage_type="s3",
        storage_root=bucket,
        prefix=prefix or None,
        client=client[0] if len(client) else None,
        object_bytes=int(sizes[:, 1].median()),  # type: ignore[arg-type]
        request_bytes=max(1, int(asked.to_series().median())),  # type: ignore[arg-type]
        ranged=bool(mine["length"].is_not_null().mean() > 0.5),  # type: ignore[operator]
    )


def _common_prefix(keys: list[str]) -> str:
    """The longest common prefix of *keys* that ends at a ``/`` ("" when none)."""
    if not keys:
        return ""
    first, last = keys[0], keys[-1]  # sorted: their common prefix is everyone's
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[: first.rfind("/", 0, n) + 1] if "/" in first[:n] else ""
