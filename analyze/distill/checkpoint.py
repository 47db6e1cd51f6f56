"""The checkpoint section of the model: when the job saved (every N steps or epochs), how many
files and bytes a checkpoint wrote and in which calls, which rank wrote each file, fsync, the
time a save spends outside its writes, and the restore (the checkpoint read back).

A checkpoint is the k-th save of every process that saves: the ranks of a sharded checkpoint
(DCP's ``dcp.save``, or each rank's own ``torch.save``) each save at the same steps, so their
k-th saves are one checkpoint, its files the union of theirs. The rank of a saving process is
the one its DCP shard files name (``__<rank>_<n>.distcp``); without them, the one its launcher
gave it (its ``init_process_group`` record); without that, processes are ranked by the first
file each wrote, numbers as numbers (``ckpt_rank2.pt`` before ``ckpt_rank10.pt``). A load before
the training process's first step is a restore at start (``read_at_start``; bytes per rank,
read sizes); loads after it are checkpoints read back (``num_checkpoints_read``)."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import polars as pl

from dlreplay.model import Checkpoint, Distribution
from dlreplay.schema import READ_OPS, SYNC_OPS, WRITE_OPS

from ..infer import natural_key
from ..passes.ranks import rank_table
from ..trace import vocabulary as voc
from ..trace.sidecar import fields_of, matching_lines, register
from .base import US, Facts, mode, num, observed

__all__ = [
    "MAX_CHECKPOINT_WRITE_RUNS",
    "checkpoint_section",
    "checkpoint_writes",
    "file_writes_of",
    "save_io",
    "with_save_io",
]


#: A checkpoint event whose hook measured its storage calls (``io_us``, DCP's FileSystemWriter)
_IO_LINE = register(
    re.compile(rb'^\{[^\n]*"cat":"checkpoint"[^\n]*"io_us":[^\n]*$', re.M), b'"cat":"checkpoint"'
)


#: What the DCP hook records on a save beside ``io_us`` (null where a save has none).
_SAVE_ARGS = ("fsync", "metadata_bytes")


def save_io(source: str | Path | None) -> pl.DataFrame:
    """(pid, ts, io_us, fsync, metadata_bytes) of the checkpoint events of the trace at
    *source* whose capture hook measured the time in their storage writer's or reader's calls
    (see :mod:`dlreplay.capture.inject.checkpoint`): ``fsync`` the DCP writer's
    ``sync_files`` (0/1), ``metadata_bytes`` the ``.metadata`` it wrote (null where the event
    has none); empty without any."""
    schema = {"pid": pl.Int64, "ts": pl.Int64, "io_us": pl.Int64}
    schema.update(dict.fromkeys(_SAVE_ARGS, pl.Int64))
    lines = matching_lines(source, _IO_LINE)
    if not lines:
        return pl.DataFrame(schema=schema)
    out = fields_of(
        lines,
        {
            "pid": ("$.pid", pl.Int64),
            "ts": ("$.ts", pl.Int64),
            "io_us": ("$.args.io_us", pl.Int64),
            **{a: (f"$.args.{a}", pl.Int64) for a in _SAVE_ARGS},
        },
    )
    return out.drop_nulls(["pid", "ts", "io_us"]).unique(["pid", "ts"])


def with_save_io(saves: pl.DataFrame, io: pl.DataFrame) -> pl.DataFrame:
    """*saves* with ``io_us``, ``fsync`` and ``metadata_bytes`` (null where unmeasured) from
    :func:`save_io`'s *io*."""
    if io.is_empty() or saves.is_empty():
        return saves
    extra = [a for a in _SAVE_ARGS if a in io.columns]
    return saves.join(
        io.select(
            pl.col("pid").cast(saves.schema["pid"]),
            pl.col("ts").cast(saves.schema["ts"]),
            "io_us",
            *extra,
        ),
        on=["pid", "ts"],
        how="left",
    )


def checkpoint_section(
    events: pl.DataFrame,
    saves: pl.DataFrame,
    batches: pl.DataFrame,
    facts: Facts,
    epochs: pl.DataFrame | None = None,
) -> Checkpoint:
    """``checkpoint`` from the checkpoint saves (``saves``, with ``io_us`` where the capture's
    hooks measured their storage time: :func:`with_save_io`), the training steps that count
    them (``batches``), the consumer's epochs and the writes in ``events``."""
    if saves.height == 0:
        facts.put("checkpoint.enabled", "no checkpoint events", "measured")
        return Checkpoint(enabled=False)
    facts.put("checkpoint.enabled", f"{saves.height} checkpoint save event(s)", "measured")
    interval, every_epochs, after_epoch = _schedule_facts(saves, batches, epochs, facts)
    saves = _numbered(saves)
    # a checkpoint's bytes: its ranks' saves' (a rank's save of unknown size wrote nothing seen)
    per_ckpt = saves.group_by("ckpt").agg(
        pl.col("size").sum().alias("total"), pl.col("size").is_not_null().any().alias("known")
    )
    nbytes = int(num(per_ckpt.filter(pl.col("known"))["total"].mean()))
    how = "bytes of each checkpoint (the saves of every rank)"
    facts.put("checkpoint.bytes_per_checkpoint", how, "measured")
    inside = _save_writes(events, saves)
    ckpt_files, files_per = _saved_files(inside, saves)
    writes = events.filter(
        pl.col("name").is_in(WRITE_OPS) & pl.col("file").is_in(ckpt_files) & (pl.col("size") > 0)
    )
    fsync = _fsync(events, saves, ckpt_files, writes.height > 0, facts)
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
    file_writes, file_ranks = _file_writes(inside, max(files_per, 1), _launcher_ranks(events))
    if file_writes is not None:
        nbytes = sum(size * calls for runs in file_writes for size, calls in runs)
        facts.put(
            "checkpoint.file_ranks",
            "the rank of the process that wrote each file (DCP's __<rank>_<n>.distcp names, "
            "else the launcher's rank of the process, else the processes in the order of their "
            "first file's name, numbers as numbers)",
            "inferred",
        )
        facts.put(
            "checkpoint.file_writes",
            "write calls per file of the first save of the most common size "
            "(files in order of their first write)",
            "measured",
        )
        facts.put(
            "checkpoint.bytes_per_checkpoint", "bytes written by the most common save", "measured"
        )
    layout = _layout(saves, ckpt_files, writes.height > 0, facts)
    restore = _restore(events, batches, facts)
    return Checkpoint(
        **restore,
        layout=layout,
        file_ranks=file_ranks,
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


def _layout(saves: pl.DataFrame, ckpt_files: list[str], seen: bool, facts: Facts) -> str:
    """``dcp`` where the files are DCP's shards (``__<rank>_<n>.distcp``), or where the saves
    went through DCP's ``FileSystemWriter`` and their files are not in the trace; else
    ``parts``."""
    if any(str(f).endswith(".distcp") for f in ckpt_files):
        facts.put("checkpoint.layout", "file names of the saves (dcp)", "measured")
        return "dcp"
    if not seen and _dcp_writer(saves):
        facts.put(
            "checkpoint.layout",
            "dcp.save events through a FileSystemWriter (the capture hook's); the checkpoint "
            "files are not in the trace",
            "measured",
        )
        return "dcp"
    facts.put("checkpoint.layout", "file names of the saves (parts)", "measured")
    return "parts"


def _dcp_writer(saves: pl.DataFrame) -> bool:
    """Whether the saves went through DCP's ``FileSystemWriter`` (the capture hook recorded
    its storage time, ``io_us``, and its ``sync_files``, ``fsync``)."""
    return "fsync" in saves.columns and saves["fsync"].is_not_null().any()


def _fsync(
    events: pl.DataFrame, saves: pl.DataFrame, ckpt_files: list[str], seen: bool, facts: Facts
) -> bool:
    """Whether the job fsynced its checkpoint files: the fsync/fdatasync calls on them where
    their writes are in the trace, else the DCP writer's ``sync_files`` as the capture hook
    recorded it; else not known (false, a guess)."""
    if seen:
        facts.put("checkpoint.fsync", "fsync/fdatasync on checkpoint files", "measured")
        return (
            events.filter(pl.col("name").is_in(SYNC_OPS) & pl.col("file").is_in(ckpt_files)).height
            > 0
        )
    if _dcp_writer(saves):
        on = saves["fsync"].drop_nulls()
        facts.put(
            "checkpoint.fsync",
            f"the DCP FileSystemWriter's sync_files (capture hook; {int(on.sum())} of {on.len()} "
            "saves), the checkpoint files not being in the trace",
            "measured",
        )
        return bool(on.sum() * 2 > on.len())
    facts.put(
        "checkpoint.fsync",
        "not known: the checkpoint files' calls are not in the trace (their directory was not "
        "traced); taken as no fsync",
        "default",
    )
    return False


def _schedule_facts(
    saves: pl.DataFrame, batches: pl.DataFrame, epochs: pl.DataFrame | None, facts: Facts
) -> tuple[int | None, int | None, int]:
    """:func:`_schedule`, its facts put (a step interval only without an epoch one)."""
    interval, every_epochs, after_epoch = _schedule(saves, batches, epochs)
    if every_epochs is not None:
        facts.put(
            "checkpoint.epochs_between_checkpoints",
            "torch.save events after epochs end",
            "measured",
        )
        facts.put(
            "checkpoint.checkpoint_after_epoch", "first epoch followed by a torch.save", "measured"
        )
        return None, every_epochs, after_epoch
    facts.put(
        "checkpoint.steps_between_checkpoints",
        "training steps between checkpoint saves",
        "measured",
    )
    return interval, every_epochs, after_epoch


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


def _numbered(saves: pl.DataFrame) -> pl.DataFrame:
    """*saves* with ``ckpt``: the checkpoint each is part of (its process's k-th save)."""
    return saves.sort("ts").with_columns(
        (pl.col("ts").rank("ordinal").over("pid") - 1).cast(pl.Int64).alias("ckpt")
    )


def _saved_files(inside: pl.DataFrame, saves: pl.DataFrame) -> tuple[list[str], int]:
    """(the checkpoint files, files per checkpoint): those the saves name, and those written
    inside them (DCP's shards, DLIO's ``ai.checkpoint.capture``); a checkpoint's files are the
    union of its ranks' saves'."""
    ckpt_files = saves["file"].drop_nulls().unique().to_list()
    files_per = 1
    if inside.height:
        ckpt_files = sorted(set(ckpt_files) | set(inside["file"].unique().to_list()))
        files_per = int(
            num(inside.group_by("ckpt").agg(pl.col("file").n_unique())["file"].median(), 1)
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
    io_known = "io_us" in saves.columns and saves["io_us"].is_not_null().any()
    if writes_seen or io_known:
        # a save's time outside the calls on its files (pickling, copies) is not the storage's;
        # nor is its ranks' wait for each other in its collectives (DCP gathers the ranks' plans
        # and write results): the replay's ranks meet there themselves
        sv = saves.sort("ts").select(
            "pid",
            "ckpt",
            pl.col("ts").alias("save_ts"),
            (pl.col("ts") + pl.col("dur")).alias("save_end"),
            "dur",
            *(["io_us"] if io_known else []),
        )
        if writes_seen:
            posix = events.filter(
                pl.col("file").is_in(ckpt_files) & pl.col("cat").is_in(["POSIX", "STDIO"])
            )
            io = _inside_saves(posix, sv).rename({"spent": "io"})
            how = "the save's duration minus its POSIX calls and its wait in collectives"
        else:  # the directory was not traced: the storage writer's own time (DCP's, the hook's)
            io = sv.select("save_ts", pl.col("io_us").alias("io"))
            how = (
                "the save's duration minus its storage writer's write and finish calls (the "
                "capture hook's io_us: the checkpoint directory was not traced) and its wait "
                "in collectives"
            )
        comm = _inside_saves(_collectives(events), sv)
        per = (
            sv.join(io, on="save_ts", how="left")
            .join(comm, on="save_ts", how="left")
            .with_columns(pl.col("io", "spent").fill_null(0))
            # a collective's own time is the least any rank of the checkpoint spent in them
            .with_columns((pl.col("spent") - pl.col("spent").min().over("ckpt")).alias("wait"))
            .select(
                ((pl.col("dur") - pl.col("io") - pl.col("wait")).clip(lower_bound=0) * US).alias(
                    "s"
                )
            )
        )
        facts.put("checkpoint.serialization_time", how, "measured")
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


def _collectives(events: pl.DataFrame) -> pl.DataFrame:
    """The collective calls (``comm`` role, not the process group's set-up) of the trace."""
    if "role" not in events.columns:
        return events.clear()
    return events.filter(
        (pl.col("role") == voc.COMM) & ~pl.col("name").cast(pl.String).str.contains("init")
    )


def _inside_saves(calls: pl.DataFrame, sv: pl.DataFrame) -> pl.DataFrame:
    """(save_ts, spent: µs of *calls* of the save's process while it ran) per save in *sv*."""
    return (
        calls.select("pid", "ts", pl.col("dur").fill_null(0))
        .sort("ts")
        .join_asof(
            sv.select("pid", "save_ts", "save_end"),
            left_on="ts",
            right_on="save_ts",
            by="pid",
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("ts") < pl.col("save_end"))
        .group_by("save_ts")
        .agg(pl.col("dur").sum().alias("spent"))
    )


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


def file_writes_of(
    inside: pl.DataFrame,
) -> tuple[list[list[list[int]]] | None, list[int] | None]:
    """(the write calls of each file of one checkpoint as runs of ``[bytes, calls]``, the rank
    writing each file) from *inside* (pid, ts, file, size, ckpt: the writes of each
    checkpoint), in the most common number of files per checkpoint (see :func:`_file_writes`)."""
    if inside.is_empty():
        return None, None
    files_per = int(num(inside.group_by("ckpt").agg(pl.col("file").n_unique())["file"].median(), 1))
    return _file_writes(inside, max(files_per, 1))


def _file_writes(
    inside: pl.DataFrame, files_per: int, launcher: pl.DataFrame | None = None
) -> tuple[list[list[list[int]]] | None, list[int] | None]:
    """(the write calls of each file of one checkpoint as runs of ``[bytes, calls]``, the rank
    that wrote each file): those of the first checkpoint that wrote the most common total in
    *files_per* files, files by rank (:func:`_pid_ranks`, *launcher* the launcher's ranks) then
    first write. (None, None) when no save's writes are visible or they take too many runs."""
    if inside.is_empty():
        return None, None
    totals = inside.group_by("ckpt").agg(
        pl.col("size").sum().alias("total"), pl.col("file").n_unique().alias("files")
    )
    totals = totals.filter(pl.col("files") == files_per)
    if totals.is_empty():
        return None, None
    common = totals["total"].mode().sort()[0]
    first = totals.filter(pl.col("total") == common)["ckpt"].min()
    mine = (
        inside.filter(pl.col("ckpt") == first)
        .join(_pid_ranks(inside, launcher), on="pid", how="left")
        .sort("ts")
        .with_columns(pl.col("ts").min().over("file").alias("f_ts"))
    )
    # runs of equal sizes per file, files by rank, then in order of their first write
    runs = (
        mine.with_columns(
            (pl.col("size") != pl.col("size").shift(1).over("file"))
            .fill_null(True)
            .cum_sum()
            .over("file")
            .alias("run")
        )
        .group_by("rank", "f_ts", "file", "run", maintain_order=True)
        .agg(pl.col("size").first(), pl.len().alias("calls"))
        .sort("rank", "f_ts", "run")
    )
    if runs.height > MAX_CHECKPOINT_WRITE_RUNS:
        return None, None
    out: list[list[list[int]]] = []
    ranks: list[int] = []
    for part in runs.partition_by("rank", "f_ts", maintain_order=True):
        out.append([[int(a), int(b)] for a, b in zip(part["size"], part["calls"], strict=True)])
        ranks.append(int(part["rank"][0]))
    return out, ranks


_DCP_SHARD = re.compile(r"__(\d+)_\d+\.distcp$")


def _launcher_ranks(events: pl.DataFrame) -> pl.DataFrame | None:
    """(pid, rank) of the processes the launcher made ranks (their ``init_process_group``
    records, :func:`~..passes.ranks.rank_table`); None without such records, or where two
    hosts' processes share a pid (a pid then names no one process)."""
    if not {"cat", "role", "name", "host"} <= set(events.columns):
        return None
    rt = rank_table(events)
    if rt.is_empty() or rt["pid"].n_unique() < rt.height:
        return None
    return rt.select(pl.col("pid").cast(pl.Int32), pl.col("rank").cast(pl.Int64))


def _pid_ranks(inside: pl.DataFrame, launcher: pl.DataFrame | None = None) -> pl.DataFrame:
    """(pid, rank) of the processes that wrote checkpoint files: the rank their DCP shard
    files name, else the rank *launcher* gives the process (:func:`_launcher_ranks`), else the
    next free rank in the order of the first file each wrote, numbers as numbers
    (``ckpt_rank2.pt`` before ``ckpt_rank10.pt``, ``rank-of-pid-998`` before
    ``rank-of-pid-1002``)."""
    first = (
        inside.sort("ts")
        .group_by("pid", maintain_order=True)
        .agg(pl.col("file").sort().first().alias("first"), pl.col("file").unique().alias("files"))
    )
    # one row per writing process: a few, so the names are ordered here, not in polars
    order = sorted(range(first.height), key=lambda i: natural_key(str(first["first"][i])))
    first = first[order]
    named: dict[int, int] = {}
    for pid, files in zip(first["pid"], first["files"], strict=True):
        for f in files:
            m = _DCP_SHARD.search(str(f))
            if m:
                named[int(pid)] = int(m.group(1))
                break
    if launcher is not None:
        given = dict(zip(launcher["pid"].to_list(), launcher["rank"].to_list(), strict=True))
        for pid in first["pid"].to_list():
            if int(pid) not in named and int(pid) in given:
                named[int(pid)] = int(given[int(pid)])
    free = (r for r in range(len(first) + len(named) + 1) if r not in named.values())
    ranks = [named[int(pid)] if int(pid) in named else next(free) for pid in first["pid"]]
    return pl.DataFrame(
        {"pid": first["pid"], "rank": pl.Series(ranks, dtype=pl.Int64)},
    )


def _save_writes(events: pl.DataFrame, saves: pl.DataFrame) -> pl.DataFrame:
    """(pid, ts, file, size, ckpt): the writes of a save's process while the save runs."""
    w = (
        events.filter(
            pl.col("name").is_in(WRITE_OPS)
            & pl.col("file").is_not_null()
            & (pl.col("size") > 0)
            & pl.col("pid").is_in(saves["pid"].unique().implode())
        )
        .select("pid", "ts", pl.col("file").cast(pl.String), "size")
        .sort("ts")
    )
    schema = {"pid": pl.Int32, "ts": pl.Int64, "file": pl.String, "size": pl.Int64}
    if w.is_empty():
        return _shard_saves(saves, schema)
    sv = saves.sort("ts").select(
        "ckpt",
        "pid",
        pl.col("ts").alias("s_ts"),
        (pl.col("ts") + pl.col("dur").fill_null(0)).alias("s_end"),
    )
    got = w.join_asof(
        sv, left_on="ts", right_on="s_ts", by="pid", strategy="backward", check_sortedness=False
    )
    got = got.filter(pl.col("ckpt").is_not_null() & (pl.col("ts") <= pl.col("s_end")))
    if got.is_empty():
        return _shard_saves(saves, schema)
    return got.select("pid", "ts", "file", "size", "ckpt")


def _shard_saves(saves: pl.DataFrame, schema: dict) -> pl.DataFrame:
    """Writes not visible (a capture that traced only the data directories) and the k-th
    saves of several processes name one directory (``dcp.save``: each rank writes its shards
    there): one write per save of its bytes into a file of its own, so each rank keeps its
    share; where the DCP hook recorded the ``.metadata`` a rank wrote (``metadata_bytes``), a
    second write of those bytes into a metadata file of its own after its shard, else the
    rank's one file holds them too. None otherwise."""
    k = saves.filter(pl.col("size").is_not_null() & pl.col("file").is_not_null())
    shared = k.group_by("ckpt").agg(
        pl.col("file").n_unique().alias("paths"), pl.col("pid").n_unique().alias("ranks")
    )
    md = (
        pl.col("metadata_bytes").fill_null(0).clip(0, pl.col("size")).cast(pl.Int64)
        if "metadata_bytes" in k.columns
        else pl.lit(0, pl.Int64)
    )
    # a DCP save of one rank too, where the hook tells its .metadata from its shard
    one = "metadata_bytes" in k.columns and bool(k.select((md > 0).any()).item())
    if k.is_empty() or not ((shared["paths"] == 1) & ((shared["ranks"] > 1) | one)).all():
        return pl.DataFrame(schema={**schema, "ckpt": pl.Int64})
    folder = pl.col("file").cast(pl.String)
    shards = k.select(
        pl.col("pid").cast(pl.Int32),
        "ts",
        (folder + "/rank-of-pid-" + pl.col("pid").cast(pl.String)).alias("file"),
        (pl.col("size").cast(pl.Int64) - md).alias("size"),
        "ckpt",
    )
    # each writer's own (DCP without collectives writes a __<rank>.metadata in every rank)
    metadata = k.filter(md > 0).select(
        pl.col("pid").cast(pl.Int32),
        pl.col("ts") + 1,
        (folder + "/rank-of-pid-" + pl.col("pid").cast(pl.String) + ".metadata").alias("file"),
        md.alias("size"),
        "ckpt",
    )
    return pl.concat([shards.filter(pl.col("size") > 0), metadata]).sort("ts")


def _restore(events: pl.DataFrame, batches: pl.DataFrame, facts: Facts) -> dict:
    """The checkpoint fields of the loads: a load before the training process's first step
    is a restore at start (``read_at_start``, ``read_bytes_per_rank``, ``read_transfer_size``:
    the POSIX reads inside it); loads after it, checkpoints read back."""
    loads = events.filter(pl.col("role") == voc.CKPT_LOAD) if "role" in events.columns else None
    if loads is None or loads.is_empty():
        facts.put("checkpoint.read_at_start", "no checkpoint loads", "measured")
        return {}
    start = batches["ts"].min() if batches.height else None
    early = loads if start is None else loads.filter(pl.col("ts") < start)
    late = loads.filter(pl.col("ts") >= start) if start is not None else loads.clear()
    out: dict = {"read_at_start": early.height > 0}
    facts.put("checkpoint.read_at_start", "checkpoint loads before the first step", "measured")
    if early.height:
        out["read_bytes_per_rank"] = int(num(early["size"].drop_nulls().median()))
        facts.put("checkpoint.read_bytes_per_rank", "bytes of each process's restore", "measured")
        reads = _reads_inside(events, early)
        if reads.len():
            out["read_transfer_size"] = observed(reads)
            facts.put("checkpoint.read_transfer_size", "POSIX reads inside restores", "measured")
    if late.height:
        out["num_checkpoints_read"] = int(num(late.group_by("pid").len()["len"].max()))
        facts.put(
            "checkpoint.num_checkpoints_read", "checkpoint loads after the first step", "measured"
        )
    return out


def _reads_inside(events: pl.DataFrame, loads: pl.DataFrame) -> pl.Series:
    """Bytes of the POSIX reads a process made while one of its *loads* ran."""
    r = (
        events.filter(
            pl.col("name").is_in(READ_OPS)
            & (pl.col("size") > 0)
            & pl.col("pid").is_in(loads["pid"].unique().implode())
        )
        .select("pid", "ts", "size")
        .sort("ts")
    )
    if r.is_empty():
        return pl.Series("size", [], dtype=pl.Int64)
    spans = loads.sort("ts").select(
        "pid",
        pl.col("ts").alias("l_ts"),
        (pl.col("ts") + pl.col("dur").fill_null(0)).alias("l_end"),
    )
    got = r.join_asof(
        spans, left_on="ts", right_on="l_ts", by="pid", strategy="backward", check_sortedness=False
    )
    return got.filter(pl.col("l_ts").is_not_null() & (pl.col("ts") <= pl.col("l_end")))["size"]
