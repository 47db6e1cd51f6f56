"""Records a line each (JSON lines, text): where each begins and how many a file holds, from
the offsets a job seeks to before its reads (a Dataset's ``seek`` + ``readline``), or from
the lines the dataset fingerprint counted in the files (a job that reads its lines in order
makes no seek: its reads are its buffer's). Sizes are bytes."""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import polars as pl

from dlreplay.model import Distribution
from dlreplay.schema import READ_OPS

from .base import Facts, Observed, num


def json_lines(paths: list[str]) -> bool:
    """Whether the dataset's files are JSON lines (``.jsonl``, ``.ndjson``)."""
    return bool(paths) and all(
        PurePosixPath(p).suffix.lower() in (".jsonl", ".ndjson") for p in paths
    )


def record_spans(obs: Observed, sizes: pl.DataFrame, spf: int) -> np.ndarray | None:
    """Each record's bytes (a line of a JSON-lines or text file, a record of a raw file) where
    the records were read at their own offsets: the spans between the distinct offsets the
    item events seeked to or first read each file at, the last one's to the file's end (a
    POSIX-only trace: the seeks' targets, where a seek came before most reads). A Dataset
    that ``seek``\\ s to a line and ``readline``\\ s it reads its buffer from the line's
    offset, so the reads' sizes are the buffer's, not the line's. None unless nearly every
    record of nearly every file was seen (a record never read would merge into the one
    before it)."""
    if not sizes.height or "offset" not in obs.tagged_io.columns:
        return None
    firsts = _record_starts(obs)
    if firsts is None:
        return None
    starts = firsts.unique(["file", "offset"]).join(sizes.select("file", "size"), on="file")
    if starts.is_empty():
        return None
    spans = starts.sort("file", "offset").with_columns(
        (
            pl.col("offset").shift(-1).over("file").fill_null(pl.col("size")) - pl.col("offset")
        ).alias("span"),
        pl.len().over("file").alias("n"),
    )
    whole = spans.filter(pl.col("n") >= _SPAN_COVERAGE * spf)
    if whole["file"].n_unique() < _SPAN_COVERAGE * sizes.height:
        return None
    values = whole.filter(pl.col("span") > 0)["span"].to_numpy().astype(float)
    return values if values.size else None


def seeked_records(obs: Observed, spf: int, facts: Facts) -> int:
    """Records a file of a POSIX-only trace whose reads follow seeks to each record (see
    :func:`_record_starts`): the distinct seek targets a file, where they are more than and
    near the *spf* the visits gave (a seek that lands in the buffer of a read before makes no
    read: 253 of 256 lines a file); else *spf*."""
    starts = _record_starts(obs)
    if starts is None or starts.is_empty():
        return spf
    per_file = int(
        num(starts.group_by("file").agg(pl.col("offset").n_unique())["offset"].median(), 0)
    )
    # each target seeked to once an epoch: the targets are the records (small lines fall in
    # the buffer more often, 178 reads for 200 lines), else near the reads' count alone
    epochs = obs.posix.epochs.value if obs.posix is not None else None
    again = num(starts.group_by("file", "offset").len()["len"].median(), 0)
    every_epoch = bool(epochs) and again == epochs
    if not (spf < per_file <= 1.1 * spf or (every_epoch and per_file > spf)):
        return spf
    facts.put(
        "dataset.num_samples_per_file",
        f"distinct offsets a file the job seeked to before its reads ({per_file}"
        + (f", each seeked to once in each of the {epochs} epochs" if every_epoch else "")
        + f"; the reads of a record's size at distinct places gave {spf}: a seek inside the "
        "buffer of the read before makes no read)",
        "inferred",
    )
    return per_file


def _record_starts(obs: Observed) -> pl.DataFrame | None:
    """file, offset: where the records the job read begin (see :func:`_record_spans`)."""
    items = obs.items.height
    io = obs.tagged_io.filter(pl.col("item_ts").is_not_null()) if items else obs.io
    # lseek returns the new offset (fseek 0 or -1)
    seeks = io.filter(pl.col("name").is_in(("lseek", "lseek64")) & pl.col("ret").is_not_null())
    if items and seeks.height and seeks.n_unique(["pid", "item_ts"]) >= 0.5 * items:
        # a buffered file's seek lands the next read on the record; a seek inside the
        # buffer makes no call, and the read that follows (if any) starts at the buffer's
        # end, mid-record: the seeks' targets alone are the records' starts
        return seeks.select("file", pl.col("ret").alias("offset"))
    if not items:  # no samples to tell: the seeks, where one came before most reads
        return (
            seeks.select("file", pl.col("ret").alias("offset"))
            if seeks.height >= 0.5 * obs.reads.height > 0
            else None
        )
    # records read at their offsets (pread): each item's first read of the file
    return (
        io.filter(
            pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("offset").is_not_null()
        )
        .sort("ts")
        .group_by("pid", "item_ts", "file")
        .agg(pl.col("offset").first())
    )


#: share of a file's records (and of the files) whose offsets items must have read for the
#: spans between them to be the records' sizes
_SPAN_COVERAGE = 0.9


def _jsonl_entries(obs: Observed, fingerprint: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The dataset fingerprint's entries of the trace's own JSON-lines files."""
    mine = set(obs.paths)
    return [
        f
        for g in (fingerprint or {}).get("groups", [])
        if isinstance(g, dict) and g.get("format") == "jsonl"
        for f in g.get("files_sampled") or []
        if isinstance(f, dict)
        and isinstance(f.get("lines"), int)
        and os.path.normpath(os.path.join(str(g.get("root", "")), str(f.get("path", "")))) in mine
    ]


def counted_lines(
    obs: Observed,
    spf: int,
    fingerprint: dict[str, Any] | None,
    facts: Facts,
) -> int:
    """The lines a JSON-lines file holds (the median over the trace's own files the dataset
    fingerprint counted, or estimated past its first 8 MiB), where they differ from *spf*: a
    record a line. POSIX calls alone show a job that reads its lines in order as its buffer's
    reads (47 reads of 4 KiB a file an epoch for 160 lines); no seek tells the lines. Else
    *spf*."""
    entries = _jsonl_entries(obs, fingerprint)
    counts = [int(f["lines"]) for f in entries]
    if not counts:
        return spf
    estimated = sum(1 for f in entries if not f.get("lines_exact"))
    lines = int(np.median(counts))
    if lines == spf or lines < 1:
        return spf
    facts.put(
        "dataset.num_samples_per_file",
        f"the lines of the {len(counts)} JSON-lines file(s) the dataset fingerprint counted "
        f"({lines}, median; {min(counts)}-{max(counts)}"
        + (f"; {estimated} estimated from their first 8 MiB" if estimated else "")
        + f"): a record a line (the reads gave {spf} a file: a line read in order makes no "
        "call of its own)",
        "inferred",
    )
    return lines


#: the fingerprint's first lines stand for the files' lines where their mean is within this
#: share of the files' bytes over their lines
LINE_SAMPLE_AGREEMENT = 0.1


def line_lengths(
    obs: Observed,
    record: Distribution,
    fingerprint: dict[str, Any] | None,
    facts: Facts,
) -> Distribution:
    """The lines' sizes (bytes) from the lengths of the first lines of the JSON-lines files
    the dataset fingerprint read, scaled to *record*'s mean (the files' bytes over their
    lines, every line the mean: the trace showed no line) where they agree within
    :data:`LINE_SAMPLE_AGREEMENT`; else *record*."""
    sample = [
        int(x)
        for f in _jsonl_entries(obs, fingerprint)
        for x in f.get("line_bytes_sample") or []
        if isinstance(x, int) and x > 0
    ]
    mean = record.mean or 0.0
    if len(sample) < 8 or not mean:
        return record
    got = float(np.mean(sample))
    if abs(got - mean) > LINE_SAMPLE_AGREEMENT * mean:
        return record
    facts.put(
        "dataset.record_length",
        f"the lengths of {len(sample)} lines, the first of each JSON-lines file the dataset "
        f"fingerprint read (mean {got:,.0f} B), scaled to the files' bytes over their lines "
        f"({mean:,.0f} B)",
        "inferred",
    )
    return Distribution.from_values(np.asarray(sample, dtype=float) * (mean / got))
