"""Mapped access: the windows a loop without a DataLoader takes of a memory-mapped file
(``reader.mapped_access``), from the ``data/io.mmap`` and ``data/io.window`` events of
``dlreplay capture``'s ``mapped`` hooks.

The event table keeps no ``offset``/``bytes`` of annotation events, so these events are read
from the trace files themselves (:func:`mapped_events`, through :mod:`..trace.sidecar`: the
matching lines only, each decoded on its own). Each window is put in the step whose compute follows it (the steps of
:func:`~dlreplay.analyze.trace.vocabulary.training_steps`); a step's overlapping slices (an
input and its target shifted by one token) merge into one window. Offsets, bytes; seconds.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from dlreplay.model import Distribution, Reader
from dlreplay.model.sections import MappedAccess

from ..trace import vocabulary as voc
from ..trace.sidecar import fields_of, matching_lines, register
from .base import US, Facts

__all__ = [
    "MAPPED_SCHEMA",
    "mapped_access",
    "mapped_events",
    "mapped_summary",
    "merged_windows",
    "with_mapped_access",
    "with_mapped_reads",
]

#: Columns of :func:`mapped_events` (µs, bytes; ``cold``: pages not resident at the slice).
MAPPED_SCHEMA = {
    "pid": pl.Int64,
    "ts": pl.Int64,
    "name": pl.String,
    "path": pl.String,
    "offset": pl.Int64,
    "bytes": pl.Int64,
    "cold": pl.Int64,
}
_LINE = register(
    re.compile(rb'^\{[^\n]*"name":"io\.(?:window|mmap)","cat":"data"[^\n]*$', re.M),
    *(b'"name":"io.%s","cat":"data"' % n for n in (b"window", b"mmap")),
)


def mapped_events(source: str | Path | None) -> pl.DataFrame:
    """The ``io.mmap``/``io.window`` events of the trace at *source* (a capture directory or
    a trace file): :data:`MAPPED_SCHEMA`, by time. Empty without any."""
    lines = matching_lines(source, _LINE)
    if not lines:
        return pl.DataFrame(schema=MAPPED_SCHEMA)
    top = ("pid", "ts", "name")
    schema = {k: (f"$.{k}" if k in top else f"$.args.{k}", t) for k, t in MAPPED_SCHEMA.items()}
    out = fields_of(lines, schema)
    return out.drop_nulls(["ts", "path"]).sort("ts", maintain_order=True)


def _step_of(windows: pl.DataFrame, starts: np.ndarray) -> pl.DataFrame:
    """*windows* with ``step``: the index of the first compute starting after each."""
    idx = np.searchsorted(starts, windows["ts"].to_numpy(), side="left")
    return windows.with_columns(pl.Series("step", idx, dtype=pl.Int64))


def merged_windows(windows: pl.DataFrame) -> pl.DataFrame:
    """One row per window (a step's overlapping slices merged; *windows*: io.window events with a
    ``step`` column): step, offset, bytes (file offset, bytes), slices, slice_bytes."""
    w = windows.with_columns((pl.col("offset") + pl.col("bytes")).alias("end")).sort(
        "step", "offset"
    )
    w = w.with_columns(pl.col("end").cum_max().shift(1).over("step").alias("__reach"))
    w = w.with_columns(
        (pl.col("__reach").is_null() | (pl.col("offset") >= pl.col("__reach")))
        .cast(pl.Int64)
        .cum_sum()
        .over("step")
        .alias("__w")
    )
    return (
        w.group_by("step", "__w")
        .agg(
            pl.col("offset").min(),
            (pl.col("end").max() - pl.col("offset").min()).alias("bytes"),
            pl.len().alias("slices"),
            pl.col("bytes").median().alias("slice_bytes"),
        )
        .sort("step", "offset")
    )


def _offsets(merged: pl.DataFrame) -> str:
    """``sequential`` when most windows start where the one before ended, else ``uniform``."""
    if merged.height < 3:
        return "uniform"
    m = merged.sort("step", "offset")
    follows = (m["offset"].shift(-1) == m["offset"] + m["bytes"]).drop_nulls()
    return "sequential" if follows.mean() >= 0.9 else "uniform"  # type: ignore[operator]


def _median_int(s: pl.Series) -> int:
    return int(round(float(s.median() or 0)))  # type: ignore[arg-type]


def _evaluation(
    windows: pl.DataFrame, maps: pl.DataFrame, events: pl.DataFrame, starts: np.ndarray
) -> dict[str, object]:
    """The validation passes' fields of :class:`MappedAccess` from the ``evaluate`` spans."""
    spans = events.filter(pl.col("role") == voc.EVALUATE).select(
        pl.col("ts").cast(pl.Int64),
        (pl.col("ts") + pl.col("dur").fill_null(0)).cast(pl.Int64).alias("end"),
    )
    if spans.is_empty() or windows.is_empty():
        return {}
    sp = spans.sort("ts").with_row_index("pass")
    inside = (
        windows.sort("ts")
        .join_asof(sp, on="ts", strategy="backward")
        .filter(pl.col("end").is_not_null() & (pl.col("ts") < pl.col("end")))
    )
    if inside.is_empty():
        return {}
    per = merged_windows(
        inside.rename({"pass": "step"}).drop("end").with_columns(pl.col("step").cast(pl.Int64))
    )
    eval_maps = maps.filter(pl.col("path").is_in(inside["path"].unique().implode()))
    per_pass = per.group_by("step").len()["len"]
    batches = max(
        1,
        _median_int(
            eval_maps.join_asof(sp, on="ts", strategy="backward")
            .filter(pl.col("ts") < pl.col("end"))
            .group_by("pass")
            .len()["len"]
        )
        if eval_maps.height
        else 1,
    )
    before = np.searchsorted(starts, sp["ts"].to_numpy(), side="left")
    every = int(np.median(np.diff(np.concatenate([[0], before])))) if before.size else 0
    durs = (sp["end"] - sp["ts"]).to_numpy() * US
    return {
        "eval_file_bytes": int(eval_maps["bytes"].max() or 0) if eval_maps.height else 0,  # type: ignore[arg-type]
        "eval_every_steps": max(0, every),
        "eval_steps": batches,
        "eval_windows_per_step": max(1, round(_median_int(per_pass) / batches)),
        "eval_step_time": Distribution.from_values(durs / batches),
    }


def mapped_access(mapped: pl.DataFrame, events: pl.DataFrame) -> MappedAccess | None:
    """The :class:`MappedAccess` of a loop whose steps (*events*, with roles) took the
    windows in *mapped* (:func:`mapped_events`); None without windows or steps."""
    windows = mapped.filter(pl.col("name") == "io.window").drop_nulls(["offset", "bytes"])
    maps = mapped.filter(pl.col("name") == "io.mmap")
    steps = voc.training_steps(events)
    if windows.is_empty() or steps.height == 0:
        return None
    starts = np.sort(steps["ts"].to_numpy())
    spans = (
        events.filter(pl.col("role") == voc.EVALUATE)
        .select(
            pl.col("ts").cast(pl.Int64),
            (pl.col("ts") + pl.col("dur").fill_null(0)).cast(pl.Int64).alias("end"),
        )
        .sort("ts")
    )
    in_eval = (
        windows.sort("ts").join_asof(spans, on="ts", strategy="backward")["end"]
        > windows.sort("ts")["ts"]
    ).fill_null(False)
    train_w = windows.sort("ts").filter(~in_eval)
    if train_w.is_empty():
        return None
    path = train_w["path"].mode().sort()[0]
    train_w = train_w.filter(pl.col("path") == path)
    merged = merged_windows(_step_of(train_w, starts))
    per_step = merged.group_by("step").len()["len"]
    train_maps = maps.filter(pl.col("path") == path)
    gap = (steps.sort("ts")["wait_us"] + steps.sort("ts")["other_us"]).to_numpy() * US
    # the first step's gap is the loop's start; a step after a validation pass waited for it too
    keep = np.ones(gap.size, dtype=bool)
    keep[0] = False
    keep[np.searchsorted(starts, spans["ts"].to_numpy(), side="left").clip(0, gap.size - 1)] = False
    gaps = gap[keep]
    return MappedAccess(
        file_bytes=int(train_maps["bytes"].max() or 0) if train_maps.height else 0,  # type: ignore[arg-type]
        window_bytes=_median_int(merged["bytes"]),
        windows_per_step=max(1, _median_int(per_step)),
        slices_per_window=max(1, _median_int(merged["slices"])),
        slice_bytes=_median_int(merged["slice_bytes"]),
        offsets=_offsets(merged),
        map_per_step=train_maps.height >= steps.height,
        data_time=Distribution.from_values(gaps) if gaps.size else Distribution.fixed(0.0),
        **_evaluation(windows.sort("ts").filter(in_eval), maps, events, starts),  # type: ignore[arg-type]
    )


def with_mapped_access(
    reader: Reader, events: pl.DataFrame, source: str | None, facts: Facts
) -> Reader:
    """*reader* with ``mapped_access`` where the trace at *source* holds mapped windows taken
    by a loop without a DataLoader (*events*: the whole trace, with roles)."""
    mapped = mapped_events(source)
    if mapped.is_empty() or (events["role"] == voc.FETCH).any():
        return reader
    access = mapped_access(mapped, events)
    if access is None:
        return reader
    facts.put(
        "reader.mapped_access",
        "io.window/io.mmap events of the mapped hooks, windows per step between compute events",
        "measured",
    )
    facts.notes.append(
        f"mapped access: {access.windows_per_step} window(s) of {access.window_bytes} B per step "
        f"({access.slices_per_window} slice(s) each), offsets {access.offsets}, of a "
        f"{access.file_bytes} B file; data time {access.data_time.mean or 0:.4f} s/step"
    )
    return replace(reader, mapped_access=access)


def with_mapped_reads(
    features: dict[str, float | None], sizes: np.ndarray, mapped: pl.DataFrame
) -> tuple[dict[str, float | None], np.ndarray]:
    """A trace's compare features and dataset read sizes with its mapped windows counted as
    reads (*mapped*: :func:`mapped_events`): each slice taken of a mapping is one read of its
    bytes (a mapped file has no read calls to count; the pages its slices cover are what
    storage serves); ``io_time_s`` is then not compared (page faults are not timed).
    Unchanged without windows."""
    windows = mapped.filter(pl.col("name") == "io.window").drop_nulls("bytes")
    if windows.is_empty():
        return features, sizes
    all_sizes = np.concatenate([np.asarray(sizes, dtype=float), windows["bytes"].to_numpy()])
    out = dict(features)
    out["bytes_read"] = float(out.get("bytes_read") or 0.0) + float(windows["bytes"].sum())
    out["io_time_s"] = None  # a page fault is not timed: the I/O time of mapped reads is unknown
    out["read_size_min"] = float(all_sizes.min())
    out["read_size_max"] = float(all_sizes.max())
    out["read_size_mean"] = float(all_sizes.mean())
    out["read_size_median"] = float(np.median(all_sizes))
    # the mapped files are dataset files (the same ones, where the trace also read them)
    out["files"] = max(float(out.get("files") or 0.0), float(windows["path"].n_unique()))
    return out, all_sizes


def mapped_summary(source: str | Path | None) -> dict[str, int] | None:
    """What a trace's mapped hooks saw: ``files`` mapped, ``windows`` taken, their ``bytes``,
    and ``cold_bytes`` (their pages not in the page cache when taken: what storage served at
    most); None without mapped files."""
    mapped = mapped_events(source)
    if mapped.is_empty():
        return None
    windows = mapped.filter(pl.col("name") == "io.window")
    return {
        "files": int(mapped["path"].n_unique()),
        "windows": windows.height,
        "bytes": int(windows["bytes"].sum() or 0),
        "cold_bytes": int(windows["cold"].sum() or 0) * _page_size(),
    }


def _page_size() -> int:
    import mmap

    return mmap.PAGESIZE


#: Fewest maps of one file by one process for a loop that maps its training file every step.
MIN_STEP_MAPS = 3


def posix_mapped_loop(
    events: pl.DataFrame, paths: list[str], sizes: dict[str, int], facts: Facts
) -> tuple[MappedAccess, int, Distribution] | None:
    """(mapped access, steps, seconds per step) of a loop without a DataLoader that maps its
    training file anew every step, from DFTracer's POSIX calls alone (no mapped hooks): each
    ``mmap`` of the file by the one process that maps it is a step's; maps of another file in
    bursts between them are validation passes. None where the trace shows other than that
    (workers mapping, samples read, many files: DLIO's mapped reader).

    What such a trace cannot show: the windows taken of each mapping (page faults, no calls).
    The model keeps none (``window_bytes`` 0: the replay maps and touches nothing, as the
    storage saw nothing the trace can count), says so, and takes each step's time as the
    interval between two maps: the windows' page faults, the compute and the loop, a guess.
    *sizes*: the files' sizes where the capture's fingerprint listed them (path -> bytes)."""
    maps = (
        events.filter(pl.col("name").is_in(["mmap", "mmap64"]) & pl.col("file").is_not_null())
        .with_columns(pl.col("file").cast(pl.String))
        .filter(pl.col("file").is_in(paths))
        .sort("ts")
    )
    if maps.is_empty() or maps["pid"].n_unique() != 1 or maps["file"].n_unique() > 2:
        return None
    per_file = maps.group_by("file").len().sort("len", descending=True)
    train = str(per_file["file"][0])
    if int(per_file["len"][0]) < MIN_STEP_MAPS:
        return None
    seq = maps.with_columns(
        is_train=pl.col("file") == train,
        run=(pl.col("file") != pl.col("file").shift(1)).fill_null(True).cum_sum(),
    )
    gaps = seq.with_columns(iv=pl.col("ts").shift(-1) - pl.col("ts"), nxt=pl.col("run").shift(-1))
    steady = gaps.filter(pl.col("is_train") & (pl.col("run") == pl.col("nxt")))["iv"]
    if steady.is_empty():
        return None
    step = Distribution.from_values(steady.to_numpy() * US)
    evals = seq.filter(~pl.col("is_train")).group_by("run").agg(pl.len(), pl.col("ts"))
    access = MappedAccess(file_bytes=_file_bytes(events, train, sizes), map_per_step=True)
    if evals.height:
        trains = seq.filter(pl.col("is_train")).group_by("run").len()
        inner = gaps.filter(~pl.col("is_train") & (pl.col("run") == pl.col("nxt")))["iv"]
        access = replace(
            access,
            eval_file_bytes=_file_bytes(
                events, str(maps.filter(pl.col("file") != train)["file"][0]), sizes
            ),
            eval_every_steps=int(np.median(trains["len"].to_numpy())),
            eval_steps=int(np.median(evals["len"].to_numpy())),
            eval_step_time=Distribution.from_values(inner.to_numpy() * US)
            if inner.len()
            else Distribution.fixed(0.0),
        )
    facts.put(
        "reader.mapped_access",
        f"each mmap of {Path(train).name} by the one process mapping it is a step (DFTracer's "
        "POSIX calls); the windows taken of each mapping are page faults, not in such a trace: "
        "none kept (window_bytes 0), capture with the loader hooks for them",
        "inferred",
    )
    facts.put(
        "train.computation_time",
        "the interval between two maps of the training file: the windows' page faults, the "
        "compute and the loop (a POSIX trace does not split them)",
        "default",
    )
    facts.notes.append(
        f"mapped loop without a DataLoader (POSIX calls alone): {int(per_file['len'][0])} steps "
        f"mapping {Path(train).name}, {evals.height} validation pass(es); the pages each step "
        "touched are not in the trace, so the replay maps the file and touches none"
    )
    return access, int(per_file["len"][0]), step


def _file_bytes(events: pl.DataFrame, path: str, sizes: dict[str, int]) -> int:
    """A file's size: the largest read end on it in the trace, else as the capture's fingerprint
    listed it, else on disk, else 0."""
    on = events.filter(pl.col("file").cast(pl.String) == path)
    ends = on.select((pl.col("offset").fill_null(0) + pl.col("size").fill_null(0)).max()).item()
    if ends:
        return int(ends)
    if path in sizes:
        return sizes[path]
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0
