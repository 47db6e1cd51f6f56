"""What distill reads from a trace before it builds any section: the training phase apart
from the evaluation passes, the dataset's files and the I/O on them, and the training
loop's events (or the loop inferred from the I/O when the trace has none)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import polars as pl

from dlreplay.schema import READ_OPS, WRITE_OPS

from ..infer import infer_posix_loop
from ..trace import vocabulary as voc
from ..trace.programs import programs
from .base import DistillError, Facts, Observed, mode, num, role_events
from .checkpoint import checkpoint_writes
from .checkpoint_posix import checkpoint_spans
from .dataset import dlio_reader, find_dataset, infer_format
from .in_memory import in_memory
from .lines import json_lines
from .mapped import mapped_events
from .scan import index_pass, without_pass
from .side_posix import read_ahead_side_files

__all__ = ["assign_items", "observe", "split_evaluation"]


def split_evaluation(events: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """(the training phase's events, the evaluation passes' or None): the evaluation passes
    (their own loader, files and steps) are modelled apart."""
    in_eval = voc.evaluation_phase(events)
    eval_events = events.filter(in_eval) if in_eval.any() else None
    if eval_events is not None:
        events = events.filter(~in_eval)
    return events, eval_events


def observe(
    events: pl.DataFrame,
    data_dirs: list[str] | None,
    fingerprint: dict[str, Any] | None,
    source: str | None,
    facts: Facts,
) -> Observed:
    """Find the dataset and the training loop in ``events`` (the training phase, with roles)."""
    paths, index_style, mapped = find_dataset(events, data_dirs, fingerprint, source, facts)
    io = _after_generation(
        events.filter(pl.col("file").is_in(paths) & pl.col("cat").is_in(["POSIX", "STDIO"])),
        facts,
    )
    reads = io.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0))

    annotated = events.filter(pl.col("role").is_not_null())
    items = role_events(annotated, voc.ITEM)
    if not mapped:
        paths, io, reads = _samples_files(paths, io, reads, items, source, facts)
    # one row per training step of each consumer, whichever convention annotated the loop
    loop = voc.training_steps(annotated)
    has_loader = loop.height > 0
    fmt = infer_format(paths, reads)[0]
    # (JSON lines read by seek + readline from a file each worker keeps open: each read of the
    # buffer at a line is a sample, as an HDF5 file's chunk; tar shards, raw too here, are
    # streamed whole)
    held = fmt == "hdf5" or json_lines(paths)
    # a pass that indexes the records, made by the process that then reads them (no workers):
    # not an epoch (:func:`.scan.index_pass`)
    scan = None if has_loader or not held else index_pass(io, paths)
    # no training-loop events (DFTracer's preload alone): the loop inferred from the I/O
    posix = (
        None
        if has_loader
        else infer_posix_loop(
            _without_launchers(io if scan is None else without_pass(io, scan), programs(source)),
            traced_pids=set(events["pid"].unique().to_list()),
            pauses=_pauses(events, data_dirs, paths, source),
            held_open_regions=held,
            whole_file_samples=fmt in WHOLE_FILE_FORMATS,
            lifetimes=events.group_by("pid").agg(
                pl.col("ts").min().alias("a"),
                (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("b"),
                # DFTracer's end record: the process's last event is its exit
                ((pl.col("cat") == "dftracer") & (pl.col("name") == "end")).any().alias("ended"),
            ),
        )
    )
    if posix is not None and posix.sample_files and len(posix.sample_files) < len(paths):
        stray = sorted(set(paths) - set(posix.sample_files))
        facts.notes.append(
            f"left out {len(stray)} file(s) not visited like the samples: "
            + ", ".join(PurePosixPath(d).name for d in stray[:5])
        )
        paths = posix.sample_files
        io = io.filter(pl.col("file").is_in(paths))
        reads = reads.filter(pl.col("file").is_in(paths))
    if items.height and not mapped:
        paths, io, reads = _read_in_items(paths, io, reads, items, facts)
    return Observed(
        events=events,
        paths=paths,
        io=io,
        reads=reads,
        mapped=mapped,
        index_style=index_style,
        annotated=annotated,
        fetch=role_events(annotated, voc.FETCH),
        items=items,
        epochs=voc.epoch_spans(annotated),
        saves=role_events(annotated, voc.CKPT_SAVE),
        steps=loop,
        consumers=loop["pid"].unique().sort().to_list() if has_loader else [],
        main_pid=mode(loop["pid"]) if has_loader else None,
        posix=posix,
        tagged_io=assign_items(io, items),  # every dataset I/O call with its enclosing sample, once
        dlio_reader=dlio_reader(annotated),
        item_windows=item_windows(source, items, paths),
        index_pass=scan is not None,
    )


def item_windows(source: str | None, items: pl.DataFrame, paths: list[str]) -> pl.DataFrame:
    """The ``io.window`` events (:func:`~.mapped.mapped_events`) on the dataset files *paths*
    inside an item event of the same process: pid, ts, file, offset, bytes. Empty unless such
    windows are in at least half of the items (a Dataset that takes its samples as rows of a
    mapped file)."""
    if items.is_empty() or not paths:
        return pl.DataFrame()
    w = mapped_events(source)
    w = w.filter((pl.col("name") == "io.window") & pl.col("path").is_in(paths)).drop_nulls(
        ["offset", "bytes"]
    )
    if w.is_empty():
        return pl.DataFrame()
    tagged = assign_items(w.with_columns(pl.col("pid").cast(items.schema["pid"])), items)
    inside = tagged.filter(pl.col("item_ts").is_not_null())
    if inside["item_ts"].n_unique() < 0.5 * items.height:
        return pl.DataFrame()
    return inside.select("pid", "ts", pl.col("path").alias("file"), "offset", "bytes")


#: Formats of one sample a file, read whole (a kept handle re-reads the file's start).
WHOLE_FILE_FORMATS = ("npz", "npy", "jpeg", "png")


def _after_generation(io: pl.DataFrame, facts: Facts) -> pl.DataFrame:
    """``io`` (the dataset's POSIX/STDIO calls) from the end of the dataset's generation: a
    job that writes its dataset before it reads any of it (an example or synthetic benchmark
    run on an empty folder) made those files in the trace, and their opens and writes are no
    visits; unchanged when the dataset was not written, or written while it was read."""
    writes = io.filter(pl.col("name").is_in(WRITE_OPS) & (pl.col("size") > 0))
    if writes.is_empty():
        return io
    done = int(num((writes["ts"] + writes["dur"].fill_null(0)).max()))
    reads = io.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0))
    if reads.is_empty() or int(num(reads["ts"].min())) < done:
        return io
    made = writes["file"].n_unique()
    took = (done - int(num(writes["ts"].min()))) / 1e6
    facts.notes.append(
        f"left out the dataset's generation: the job wrote {made} of its files ({took:.2f} s) "
        "before it read any"
    )
    return io.filter(pl.col("ts") >= done)


def _without_launchers(io: pl.DataFrame, launched: set[int]) -> pl.DataFrame:
    """``io`` with no parent for the processes started as programs of their own
    (:func:`~dlreplay.analyze.trace.programs.programs`: torchrun's ranks, python under a
    shell), so that a rank reading its own samples is a consumer, not its launcher's worker."""
    if not launched:
        return io
    return io.with_columns(
        pl.when(pl.col("pid").is_in(list(launched)))
        .then(pl.lit(None, io.schema["ppid"]))
        .otherwise(pl.col("ppid"))
        .alias("ppid")
    )


def _pauses(
    events: pl.DataFrame, data_dirs: list[str] | None, paths: list[str], source: str | None
) -> pl.DataFrame:
    """(ts, end) µs the loop spent on checkpoints: the write bursts to checkpoint files, and
    each checkpoint file's open to close (``torch.save``'s writes are not visible)."""
    return pl.concat(
        [
            checkpoint_writes(events, data_dirs).select(
                pl.col("ts").cast(pl.Int64), pl.col("end").cast(pl.Int64)
            ),
            checkpoint_spans(events, paths, source),
        ]
    )


def _samples_files(
    paths: list[str],
    io: pl.DataFrame,
    reads: pl.DataFrame,
    items: pl.DataFrame,
    source: str | None,
    facts: Facts,
) -> tuple[list[str], pl.DataFrame, pl.DataFrame]:
    """(paths, io, reads) without the side files read ahead of the samples (POSIX calls
    alone: :func:`.side_posix.read_ahead_side_files`). Raises :class:`DistillError` where the
    item events read nothing and every read came before the first: the dataset is in memory."""
    if items.is_empty():
        return read_ahead_side_files(paths, io, reads, facts)
    if reads.height and reads["ts"].max() < items["ts"].min():  # type: ignore[operator]
        raise DistillError(
            f"{source or 'the trace'} has no dataset reads while it trains: its samples read "
            "no file." + in_memory(sorted(set(reads["file"].cast(pl.String).to_list())))
        )
    return paths, io, reads


def _read_in_items(
    paths: list[str], io: pl.DataFrame, reads: pl.DataFrame, items: pl.DataFrame, facts: Facts
) -> tuple[list[str], pl.DataFrame, pl.DataFrame]:
    """(paths, io, reads) without the files of another extension than the samples' that no
    item event read (a Dataset's own index of the samples, ``shard_00000.idx.npy``, loaded
    as it is made: with no worker that process is the loader's, so its reads looked like the
    loader's): they are side files, not samples. Unchanged where every extension was read in
    items."""
    inside = assign_items(reads, items).filter(pl.col("item_ts").is_not_null())
    if inside.is_empty():
        return paths, io, reads
    exts = {PurePosixPath(f).suffix.lower() for f in inside["file"].unique().to_list()}
    keep = [p for p in paths if PurePosixPath(p).suffix.lower() in exts]
    if len(keep) == len(paths) or not keep:
        return paths, io, reads
    stray = sorted(set(paths) - set(keep))
    facts.notes.append(
        f"left out {len(stray)} file(s) of the dataset's folder that no sample read (read "
        "outside the item events, of another extension: the Dataset's own side files): "
        + ", ".join(PurePosixPath(d).name for d in stray[:5])
    )
    return keep, io.filter(pl.col("file").is_in(keep)), reads.filter(pl.col("file").is_in(keep))


def assign_items(reads: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """Attach to each read the item (sample) event enclosing it in the same process."""
    if items.is_empty() or reads.is_empty():
        return reads.with_columns(
            pl.lit(None, pl.Int64).alias("item_index"), pl.lit(None, pl.Int64).alias("item_ts")
        )
    it = items.select(
        "pid",
        pl.col("ts").alias("item_ts"),
        (pl.col("ts") + pl.col("dur")).alias("item_end"),
        pl.col("sample_index").alias("item_index"),
    ).sort("item_ts")
    joined = reads.sort("ts").join_asof(
        it, left_on="ts", right_on="item_ts", by="pid", strategy="backward", check_sortedness=False
    )
    inside = pl.col("ts") <= pl.col("item_end")
    return joined.with_columns(
        pl.when(inside).then(pl.col("item_index")).otherwise(None).alias("item_index"),
        pl.when(inside).then(pl.col("item_ts")).otherwise(None).alias("item_ts"),
    ).drop("item_end")
