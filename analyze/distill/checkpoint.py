"""The checkpoint section of the model: when the job saved (every N steps or epochs), how many
files and bytes a save wrote and in which calls, fsync, and the time a save spends outside
its writes."""

from __future__ import annotations

from pathlib import PurePosixPath

import polars as pl

from dlreplay.model import Checkpoint, Distribution
from dlreplay.schema import SYNC_OPS, WRITE_OPS

from .base import US, Facts, mode, num, observed

__all__ = ["MAX_CHECKPOINT_WRITE_RUNS", "checkpoint_section", "checkpoint_writes"]


def checkpoint_section(
    events: pl.DataFrame,
    saves: pl.DataFrame,
    batches: pl.DataFrame,
    facts: Facts,
    epochs: pl.DataFrame | None = None,
) -> Checkpoint:
    """``checkpoint`` from the checkpoint saves (``saves``), the training steps that count
    them (``batches``), the consumer's epochs and the writes in ``events``."""
    if saves.height == 0:
        facts.put("checkpoint.enabled", "no checkpoint events", "measured")
        return Checkpoint(enabled=False)
    interval, every_epochs, after_epoch = _schedule(saves, batches, epochs)
    if every_epochs is not None:
        interval = None
        facts.put(
            "checkpoint.epochs_between_checkpoints",
            "torch.save events after epochs end",
            "measured",
        )
        facts.put(
            "checkpoint.checkpoint_after_epoch", "first epoch followed by a torch.save", "measured"
        )
    else:
        facts.put(
            "checkpoint.steps_between_checkpoints",
            "training steps between checkpoint saves",
            "measured",
        )
    nbytes = int(num(saves["size"].drop_nulls().mean()))
    facts.put("checkpoint.bytes_per_checkpoint", "bytes of each checkpoint save", "measured")
    ckpt_files, files_per = _saved_files(events, saves)
    fsync = (
        events.filter(pl.col("name").is_in(SYNC_OPS) & pl.col("file").is_in(ckpt_files)).height > 0
    )
    facts.put("checkpoint.fsync", "fsync/fdatasync on checkpoint files", "measured")
    writes = events.filter(
        pl.col("name").is_in(WRITE_OPS) & pl.col("file").is_in(ckpt_files) & (pl.col("size") > 0)
    )
    wts = observed(writes["size"])
    facts.put(
        "checkpoint.write_transfer_size",
        "POSIX writes to checkpoint files"
        if writes.height
        else "torch.save writes are not visible to DFTracer",
        "measured" if writes.height else "default",
    )
    serialization = _serialization(events, saves, ckpt_files, writes.height > 0, nbytes, facts)
    folders = {str(PurePosixPath(f).parent) for f in ckpt_files}
    file_writes = _file_writes(events, saves, max(files_per, 1))
    if file_writes is not None:
        nbytes = sum(size * calls for runs in file_writes for size, calls in runs)
        facts.put(
            "checkpoint.file_writes",
            "write calls per file of the first save of the most common size "
            "(files in order of their first write)",
            "measured",
        )
        facts.put(
            "checkpoint.bytes_per_checkpoint", "bytes written by the most common save", "measured"
        )
    return Checkpoint(
        enabled=True,
        steps_between_checkpoints=interval,
        epochs_between_checkpoints=every_epochs,
        checkpoint_after_epoch=after_epoch,
        files_per_checkpoint=max(files_per, 1),
        bytes_per_checkpoint=nbytes,
        write_transfer_size=wts,
        file_writes=file_writes,
        fsync=fsync,
        serialization_time=serialization,
        checkpoint_folder=folders.pop() if len(folders) == 1 else None,
    )


def _schedule(
    saves: pl.DataFrame, batches: pl.DataFrame, epochs: pl.DataFrame | None
) -> tuple[int | None, int | None, int]:
    """(steps between saves, epochs between saves, the first epoch followed by one): the
    epochs' when every save falls after its epoch's end, else the steps'."""
    bt = batches.sort("ts").with_row_index("global_step").select("ts", "global_step")
    # the saves of the process whose steps count them (each rank of a multi-rank job saves at the
    # same steps: interleaved, two ranks' saves were 0 steps apart)
    mine = saves.filter(pl.col("pid").is_in(batches["pid"].unique().implode()))
    at = (
        (mine if mine.height else saves)
        .sort("ts")
        .join_asof(bt, on="ts", strategy="backward")
        .with_columns((pl.col("global_step") + 1).fill_null(0).alias("step_count"))
    )
    gaps = at["step_count"].diff().drop_nulls()
    first = int(at["step_count"][0])
    interval = mode(gaps) if gaps.len() else (first if first > 0 else None)
    if interval is not None and interval <= 0:  # saves at the same step: no step interval to replay
        interval = None
    every_epochs: int | None = None
    after_epoch = 1
    if epochs is not None and epochs.height:
        # saves outside every epoch (after the loop over the DataLoader): epoch-based checkpoints
        win = (
            epochs.sort("ts")
            .with_row_index("e")
            .select("e", pl.col("ts").alias("e_ts"), pl.col("end").alias("e_end"))
        )
        tagged = at.sort("ts").join_asof(
            win, left_on="ts", right_on="e_ts", strategy="backward", check_sortedness=False
        )
        if tagged["e"].null_count() == 0 and (tagged["ts"] >= tagged["e_end"]).all():
            per_epoch = tagged["e"].cast(pl.Int64)
            every_epochs = mode(per_epoch.diff().drop_nulls()) or 1
            after_epoch = int(num(per_epoch.min())) + 1
    return interval, every_epochs, after_epoch


def _saved_files(events: pl.DataFrame, saves: pl.DataFrame) -> tuple[list[str], int]:
    """(the checkpoint files, files per save): those the saves name, and those written inside
    saves that name none (DLIO's, ``ai.checkpoint.capture``)."""
    ckpt_files = saves["file"].drop_nulls().unique().to_list()
    per_save = _written_inside(events, saves)
    files_per = 1
    if per_save.height:
        # saves that name no file (DLIO's, ai.checkpoint.capture): the files written inside them
        ckpt_files = sorted(set(ckpt_files) | set(per_save["file"].unique().to_list()))
        files_per = int(
            num(per_save.unique(["save", "file"]).group_by("save").len()["len"].median(), 1)
        )
    return ckpt_files, files_per


def _serialization(
    events: pl.DataFrame,
    saves: pl.DataFrame,
    ckpt_files: list[str],
    writes_seen: bool,
    nbytes: int,
    facts: Facts,
) -> Distribution:
    """A save's time outside the calls on its files (pickling, copies), per save; its whole
    time when neither its writes nor its size is in the trace; else 0."""
    if writes_seen:
        # a save's time outside the calls on its file (pickling, copies) is not the storage's
        posix = events.filter(
            pl.col("file").is_in(ckpt_files) & pl.col("cat").is_in(["POSIX", "STDIO"])
        )
        sv = saves.sort("ts").select(
            "pid",
            pl.col("ts").alias("save_ts"),
            (pl.col("ts") + pl.col("dur")).alias("save_end"),
            "dur",
        )
        inside = (
            posix.sort("ts")
            .join_asof(
                sv,
                left_on="ts",
                right_on="save_ts",
                by="pid",
                strategy="backward",
                check_sortedness=False,
            )
            .filter(pl.col("ts") < pl.col("save_end"))
            .group_by("save_ts")
            .agg(pl.col("dur").sum().alias("io"))
        )
        per = sv.join(inside, on="save_ts", how="left").select(
            ((pl.col("dur") - pl.col("io").fill_null(0)).clip(lower_bound=0) * US).alias("s")
        )
        facts.put(
            "checkpoint.serialization_time", "torch.save duration minus its POSIX calls", "measured"
        )
        return observed(per["s"])
    if nbytes <= 0 and saves["dur"].drop_nulls().len():
        # neither the writes nor the size is in the trace (an ai.checkpoint.capture region around
        # a save to a directory the tracer did not watch): the saves' whole time is what the
        # replay can spend, as serialisation, with nothing to write
        facts.put(
            "checkpoint.serialization_time",
            "the checkpoint saves' whole duration: their writes are not "
            "visible and their size is unknown",
            "measured",
        )
        return observed(saves["dur"].drop_nulls() * US)
    facts.put(
        "checkpoint.serialization_time",
        "torch.save writes are not visible: the replay's writes stand for the whole save",
        "default",
    )
    return Distribution.fixed(0.0)


def checkpoint_writes(events: pl.DataFrame, data_dirs: list[str] | None) -> pl.DataFrame:
    """(ts, end) µs of the write bursts to checkpoint files (first write to last, per process
    and file): time a POSIX-only trace shows the loop was not computing."""
    from dlreplay.analyze.files import classify_files

    files = classify_files(events, data_dirs=data_dirs).filter(pl.col("role") == "checkpoint")[
        "file"
    ]
    w = events.filter(pl.col("file").is_in(files.implode()) & pl.col("name").is_in(WRITE_OPS))
    return (
        w.group_by("pid", "file")
        .agg(pl.col("ts").min(), (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("end"))
        .select("ts", "end")
    )


#: Most runs of equal write calls kept for one checkpoint (all files); more: the write-size distribution.
MAX_CHECKPOINT_WRITE_RUNS = 1024


def _file_writes(
    events: pl.DataFrame, saves: pl.DataFrame, files_per: int
) -> list[list[list[int]]] | None:
    """The write calls of each file of one checkpoint, as runs of ``[bytes, calls]``: those of the
    first save that wrote the most common total in *files_per* files (files in the order of their
    first write). None when no save's writes are visible or they take too many runs."""
    w = events.filter(
        pl.col("name").is_in(WRITE_OPS)
        & pl.col("file").is_not_null()
        & (pl.col("size") > 0)
        & pl.col("pid").is_in(saves["pid"].unique().implode())
    ).select("pid", "ts", "file", "size")
    if w.is_empty():
        return None
    sv = (
        saves.sort("ts")
        .with_row_index("save")
        .select(
            "save",
            "pid",
            pl.col("ts").alias("s_ts"),
            (pl.col("ts") + pl.col("dur").fill_null(0)).alias("s_end"),
        )
    )
    got = (
        w.sort("ts")
        .join_asof(
            sv, left_on="ts", right_on="s_ts", by="pid", strategy="backward", check_sortedness=False
        )
        .filter(pl.col("save").is_not_null() & (pl.col("ts") <= pl.col("s_end")))
    )
    totals = got.group_by("save").agg(
        pl.col("size").sum().alias("total"), pl.col("file").n_unique().alias("files")
    )
    totals = totals.filter(pl.col("files") == files_per)
    if totals.is_empty():
        return None
    common = totals["total"].mode().sort()[0]
    first = totals.filter(pl.col("total") == common)["save"].min()
    mine = (
        got.filter(pl.col("save") == first)
        .sort("ts")
        .with_columns(pl.col("ts").min().over("file").alias("f_ts"))
    )
    # runs of equal sizes per file, files in order of their first write
    runs = (
        mine.with_columns(
            (pl.col("size") != pl.col("size").shift(1).over("file"))
            .fill_null(True)
            .cum_sum()
            .over("file")
            .alias("run")
        )
        .group_by("f_ts", "file", "run", maintain_order=True)
        .agg(pl.col("size").first(), pl.len().alias("calls"))
        .sort("f_ts", "run")
    )
    if runs.height > MAX_CHECKPOINT_WRITE_RUNS:
        return None
    out: list[list[list[int]]] = []
    for part in runs.partition_by("f_ts", maintain_order=True):
        out.append([[int(a), int(b)] for a, b in zip(part["size"], part["calls"], strict=True)])
    return out


def _written_inside(events: pl.DataFrame, saves: pl.DataFrame) -> pl.DataFrame:
    """(save, file): files written by a save's process while the save runs."""
    w = (
        events.filter(
            pl.col("name").is_in(WRITE_OPS)
            & pl.col("file").is_not_null()
            & (pl.col("size") > 0)
            & pl.col("pid").is_in(saves["pid"].unique().implode())
        )
        .select("pid", "ts", "file")
        .sort("ts")
    )
    if w.is_empty():
        return pl.DataFrame(schema={"save": pl.UInt32, "file": pl.String})
    sv = (
        saves.sort("ts")
        .with_row_index("save")
        .select(
            "save",
            "pid",
            pl.col("ts").alias("s_ts"),
            (pl.col("ts") + pl.col("dur").fill_null(0)).alias("s_end"),
        )
    )
    got = w.join_asof(
        sv, left_on="ts", right_on="s_ts", by="pid", strategy="backward", check_sortedness=False
    )
    return got.filter(pl.col("save").is_not_null() & (pl.col("ts") <= pl.col("s_end"))).select(
        "save", "file"
    )
