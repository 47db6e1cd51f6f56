"""``dataset.side_files``: the files in the data folder a job reads outside its samples.

A job often reads a few small files beside its samples: the marker its data preparation
left (``.done``, a JSON of the files it wrote), a label list, a class index, a metadata
file. They are few bytes, but they are files and read calls of the dataset's folder, and a
replay without them differs from its job in the number of files and the largest read.

A side file here is a file under the dataset's folder that the job read (bytes > 0), that is
not a sample file nor a sample file's record index, that the job never wrote (logs,
checkpoints), and that is not dlreplay's own (``.dlreplay-*``). For each: its size (the
largest byte position read or seeked), the read calls of its first visit (requested bytes,
as runs of [bytes per call, calls]), and how often each rank opens it: as the run starts,
or at each epoch when some opens came after the training's first sample read and its opens
per rank are a multiple of the epochs.

Sizes are bytes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath

import polars as pl

from dlreplay.model import Dataset, SideFile
from dlreplay.model.sections import MAX_SIDE_FILES
from dlreplay.schema import OPEN_OPS, READ_OPS, WRITE_OPS

from .base import Facts
from .measure import file_sizes

#: Most read runs kept per side file (a file read in varied chunk sizes): the rest are one run.
MAX_READ_RUNS = 256


def with_side_files(
    dataset: Dataset,
    events: pl.DataFrame,
    paths: list[str],
    epochs: int,
    ranks: int,
    facts: Facts,
    data_dirs: list[str] | None = None,
) -> Dataset:
    """``dataset`` with the side files of its folder (``events``: the whole trace's, so a
    file read before the training loop counts; ``paths``: the sample files). With
    ``data_dirs`` (the capture's), the folder is the data dir that holds the dataset's folder
    (``data/labels.csv`` beside ``data/train/``), and each side file's path is relative to
    it; the replay puts it at that path in its data folder. Files of the samples' extension
    are not side files (another split's samples: ``data/valid/``)."""
    folder = dataset.data_folder
    if not folder or folder.startswith("s3://") or not paths:
        return dataset
    top = _side_root(folder, data_dirs)
    io = events.filter(
        pl.col("cat").is_in(["POSIX", "STDIO"])
        & pl.col("file").is_not_null()
        & pl.col("file").cast(pl.String).str.starts_with(top + "/")
    ).with_columns(pl.col("file").cast(pl.String), pl.col("name").cast(pl.String))
    candidates = _candidates(io, paths)
    if not candidates:
        return dataset
    if len(candidates) > MAX_SIDE_FILES:
        facts.notes.append(
            f"{len(candidates)} files under {top} read outside the samples: more than "
            f"{MAX_SIDE_FILES}, so not modelled as side files (the dataset may be of several kinds)"
        )
        return dataset
    out = _side_files(io, candidates, paths, top, epochs, ranks)
    facts.put(
        "dataset.side_files",
        f"files under the dataset's folder read outside the samples ({len(out)}: "
        + ", ".join(s.path for s in out[:5])
        + ("" if len(out) <= 5 else ", ...")
        + "), their size, first visit's read calls and opens per rank",
        "measured",
    )
    return replace(dataset, side_files=out)


def _side_root(folder: str, data_dirs: list[str] | None) -> str:
    """The deepest local data dir that holds *folder*, else *folder* (no trailing slash)."""
    holders = [
        d.rstrip("/")
        for d in data_dirs or []
        if (folder + "/").startswith(d.rstrip("/") + "/") and not d.startswith("s3://")
    ]
    return (max(holders, key=len) if holders else folder).rstrip("/")


def _candidates(io: pl.DataFrame, paths: list[str]) -> list[str]:
    """Files of *io* read (bytes > 0), never written, not samples, not of the samples'
    extension, not a sample's record index nor dlreplay's own; sorted."""
    if io.is_empty():
        return []
    samples = set(paths)
    exts = {PurePosixPath(p).suffix.lower() for p in paths}
    per_file = io.group_by("file").agg(
        (pl.col("name").is_in(READ_OPS) & (pl.col("size").fill_null(0) > 0)).any().alias("read"),
        pl.col("name").is_in(WRITE_OPS).any().alias("written"),
    )
    return sorted(
        f
        for f, read, written in per_file.iter_rows()
        if read
        and not written
        and f not in samples
        and PurePosixPath(f).suffix.lower() not in exts
        and not _own_or_index(f, samples)
    )


def _side_files(
    io: pl.DataFrame, candidates: list[str], paths: list[str], top: str, epochs: int, ranks: int
) -> list[SideFile]:
    """The model's entries of *candidates* (paths relative to *top*)."""
    side = io.filter(pl.col("file").is_in(candidates))
    sizes = dict(file_sizes(side).select("file", "size").iter_rows())
    # the training's first sample read: a side file opened only before it is read as the run starts
    first = io.filter(pl.col("file").is_in(paths) & pl.col("name").is_in(READ_OPS))["ts"].min()
    opens = (
        side.filter(pl.col("name").is_in(OPEN_OPS))
        .group_by("file")
        .agg(
            pl.len().alias("n"),
            (pl.col("ts") > first).sum().alias("later") if first is not None else pl.lit(0),
        )
    )
    counts = {f: (int(n), int(later)) for f, n, later in opens.iter_rows()}
    reads = _first_visit_reads(side)
    out = []
    for f in candidates:
        visits, when = _visits(*counts.get(f, (0, 0)), epochs, ranks)
        out.append(
            SideFile(
                path=str(PurePosixPath(f).relative_to(top)),
                size=int(sizes.get(f) or 0),
                reads=reads.get(f, []),
                visits=visits,
                when=when,
            )
        )
    return out


def _own_or_index(f: str, samples: set[str]) -> bool:
    """dlreplay's own files, and a sample file's record index (``<sample>.idx``, ...)."""
    name = PurePosixPath(f).name
    if name.startswith(".dlreplay-"):
        return True
    stem = f
    for _ in range(3):  # <file>.idx, <file>.off.idx: up to three suffixes
        stem, dot, _suffix = stem.rpartition(".")
        if not dot:
            return False
        if stem in samples:
            return True
    return False


def _first_visit_reads(side: pl.DataFrame) -> dict[str, list[list[int]]]:
    """Per file: the read calls (requested bytes, else returned) of the first process's first
    visit (from its first open to its next), as runs of [bytes per call, calls]."""
    calls = (
        side.filter(pl.col("name").is_in(OPEN_OPS) | pl.col("name").is_in(READ_OPS))
        .sort("ts")
        .with_columns(
            pl.col("name").is_in(OPEN_OPS).cum_sum().over("pid", "file").alias("__visit"),
            pl.col("pid").first().over("file").alias("__first_pid"),
        )
        .filter(
            pl.col("name").is_in(READ_OPS)
            & (pl.col("pid") == pl.col("__first_pid"))
            & (pl.col("__visit") <= 1)
        )
        .with_columns(
            pl.coalesce(
                pl.when(pl.col("size_requested") > 0).then(pl.col("size_requested")),
                pl.col("size"),
            )
            .fill_null(0)
            .alias("__bytes")
        )
        .filter(pl.col("__bytes") > 0)
        .with_columns((pl.col("__bytes") != pl.col("__bytes").shift(1)).over("file").alias("__new"))
        .with_columns(pl.col("__new").fill_null(True).cum_sum().over("file").alias("__run"))
        .group_by("file", "__run", maintain_order=True)
        .agg(pl.col("__bytes").first(), pl.len().alias("n"))
        .sort("file", "__run")
    )
    out: dict[str, list[list[int]]] = {}
    for f, runs in (
        calls.group_by("file", maintain_order=True)
        .agg(pl.concat_list(pl.col("__bytes"), pl.col("n").cast(pl.Int64)).alias("runs"))
        .iter_rows()
    ):
        runs = [[int(b), int(n)] for b, n in runs]
        if len(runs) > MAX_READ_RUNS:  # the rest as one run of their mean size
            rest = runs[MAX_READ_RUNS - 1 :]
            n = sum(r[1] for r in rest)
            runs = [*runs[: MAX_READ_RUNS - 1], [max(1, sum(b * c for b, c in rest) // n), n]]
        out[f] = runs
    return out


def _visits(opens: int, later: int, epochs: int, ranks: int) -> tuple[int, str]:
    """(opens per rank at each reading, when) of a file opened ``opens`` times, ``later`` of
    them after the training's first sample read: ``epoch`` when some opens came later and the
    opens per rank are a multiple of the epochs (>= 2), else all as the run starts."""
    per_rank = max(1, round(opens / max(ranks, 1)))
    if later and epochs >= 2 and per_rank >= epochs and per_rank % epochs == 0:
        return per_rank // epochs, "epoch"
    return per_rank, "start"
