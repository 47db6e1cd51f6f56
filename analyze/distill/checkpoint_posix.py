"""Checkpoints from POSIX writes alone, for traces without annotations (DFTracer's preload
alone): a job's ``torch.save`` or ``dcp.save`` leaves no checkpoint event there, only the
writes of its files.

A checkpoint file is a file outside the dataset (and outside the interpreter's and the
system's files) that a process writes whole in one go: its writes after one open, not
spread over the training loop like a log's. The k-th write of each (process, name pattern)
(the file's name with its digits masked: ``ckpt_step000004.pt``, ``step_000004/__1_0.distcp``,
or one name written again and again) is part of checkpoint k, so a checkpoint is the k-th
file of every pattern that was written as often as the pattern of the most bytes. They count
as checkpoints when written at least twice with :data:`MIN_REPEATED_CHECKPOINT_BYTES` or
more each time, or once with more than :data:`~dlreplay.analyze.files.CHECKPOINT_WRITE_BYTES`.
A checkpoint's place in the loop comes from the epochs the reads show: after an epoch's
reads at most once an epoch, every N epochs; more often, steps per epoch over checkpoints
per epoch. Reads of the checkpoint folder before the first dataset read are the restore.
Every field is inferred (or a default), never measured; a capture that traced only the
data directories (``dlreplay capture --data-dir``) cannot show checkpoints written
elsewhere, and says so."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import polars as pl

from dlreplay.model import Checkpoint, WorkloadModel
from dlreplay.schema import CLOSE_OPS, OPEN_OPS, READ_OPS, SYNC_OPS, WRITE_OPS

from ..files import CHECKPOINT_WRITE_BYTES, LIBRARY_PATTERN
from ..infer_steps import per_epoch
from ..trace.sidecar import fields_of, matching_lines, register
from .base import US, Facts, Observed, mode, num, observed
from .checkpoint import file_writes_of
from .dataset import MMAP_OPS

__all__ = ["MIN_REPEATED_CHECKPOINT_BYTES", "posix_checkpoints", "unannotated_checkpoints"]

#: Bytes a checkpoint written again and again must have (smaller: logs, metrics, markers).
MIN_REPEATED_CHECKPOINT_BYTES = 4096
#: A burst of writes overlapping more than this share of the dataset reads' span is a log.
LOG_OVERLAP = 0.5
#: Opens whose writes DFTracer may not see: a C stream's (``torch.save``'s ``std::ofstream``
#: writes through the descriptor of an ``fopen`` that the tracer does not follow); the writes
#: through a descriptor of ``open(2)`` are always seen, so such a file without them is empty.
STREAM_OPENS = ("fopen", "fopen64", "freopen", "freopen64")
_STREAM_OPEN = register(
    re.compile(
        rb'^\{[^\n]*"name":"(?:fopen|fopen64|freopen|freopen64)","cat":"STDIO"[^\n]*"mode":[^\n]*$',
        re.M,
    ),
    *(b'"name":"%s","cat":"STDIO"' % n.encode() for n in STREAM_OPENS),
)


def read_only_streams(source: str | Path | None) -> pl.DataFrame:
    """(pid, ts µs) of the ``fopen`` calls of the trace at *source* whose mode only reads
    (``r``, ``rb``: ``torch.load``'s stream, whose reads are as unseen as ``torch.save``'s
    writes); empty where the trace records no mode."""
    modes = fields_of(
        matching_lines(source, _STREAM_OPEN),
        {"pid": ("$.pid", pl.Int64), "ts": ("$.ts", pl.Int64), "mode": ("$.args.mode", pl.String)},
    ).drop_nulls()
    return modes.filter(~pl.col("mode").str.contains(r"[wa+]")).select("pid", "ts")


def unannotated_checkpoints(
    events: pl.DataFrame,
    obs: Observed,
    model: WorkloadModel,
    manifest: dict[str, Any] | None,
    facts: Facts,
    source: str | None = None,
) -> Checkpoint:
    """:func:`posix_checkpoints` of a trace without annotations, ``model`` the sections
    distilled so far (the replay's steps per epoch), ``manifest`` the capture's (the
    directories it traced), ``source`` the trace."""
    from dlreplay.errors import DlreplayError
    from dlreplay.replay.plan import steps_per_epoch

    try:
        steps: int | None = steps_per_epoch(model, model.processes.ranks)
    except DlreplayError:
        steps = None
    batch = facts.fields.get("reader.batch_size")
    return posix_checkpoints(
        events,
        obs.paths,
        obs.posix.epoch_spans if obs.posix is not None else [],
        (steps, batch.confidence if batch else "default"),
        list((manifest or {}).get("data_dirs") or []) or None,
        facts,
        source,
    )


def posix_checkpoints(
    events: pl.DataFrame,
    paths: list[str],
    epoch_spans: list[tuple[int, int, int]],
    steps_per_epoch: tuple[int | None, str],
    traced_dirs: list[str] | None,
    facts: Facts,
    source: str | None = None,
) -> Checkpoint:
    """``checkpoint`` from the POSIX writes in ``events`` (see the module doc): ``paths``
    the dataset's files, ``epoch_spans`` (epoch, start µs, end µs) the epochs the reads
    show, ``steps_per_epoch`` (steps, the batch size's confidence), ``traced_dirs`` the only
    directories the capture traced (None: every file), ``source`` the trace (its streams'
    open modes)."""
    bursts = _bursts(events, paths, read_only_streams(source))
    ckpt = _checkpoint_bursts(bursts)
    if ckpt is None:
        if traced_dirs:
            facts.put(
                "checkpoint.enabled",
                "no checkpoint writes, but the capture traced only "
                + ", ".join(traced_dirs)
                + ": writes elsewhere are not in the trace",
                "default",
            )
            facts.notes.append(
                "guess: checkpoint.enabled false: the trace has no annotations and its capture "
                "traced only the data directories (add the checkpoint directory to --data-dir)"
            )
        else:
            how = "outside the dataset" if bursts.height else "at all"
            facts.put("checkpoint.enabled", f"no writes {how}: no checkpoints", "inferred")
        return Checkpoint(enabled=False)
    files = ckpt["file"].unique().to_list()
    first = ckpt.sort("ts").group_by("ckpt", maintain_order=True).first()
    starts = first["ts"].to_list()
    spans = _savers_epochs(events, paths, epoch_spans, first["pid"].unique().to_list())
    root = _folder(files)
    return Checkpoint(
        enabled=True,
        **_sizes(events, ckpt, facts),
        **_schedule(starts, spans, steps_per_epoch, facts),
        **_restore(events, paths, root, facts),
        fsync=events.filter(pl.col("name").is_in(SYNC_OPS) & pl.col("file").is_in(files)).height
        > 0,
        layout="dcp" if any(str(f).endswith(".distcp") for f in files) else "parts",
        checkpoint_folder=root,
    )


def _sizes(events: pl.DataFrame, ckpt: pl.DataFrame, facts: Facts) -> dict:
    """The checkpoint fields of what a checkpoint writes: files, bytes, write calls and the
    rank of each file; without visible writes (``torch.save``'s writer, which DFTracer does
    not see: only its ``fopen``/``fclose``), the files and the time from open to close."""
    n = int(num(ckpt["ckpt"].max())) + 1
    files_per = int(num(ckpt.group_by("ckpt").len()["len"].median(), 1))
    seen = bool((ckpt["bytes"] > 0).any())
    facts.put(
        "checkpoint.enabled",
        f"{n} checkpoint(s) of {files_per} file(s) "
        + ("written whole" if seen else "opened and closed, writes not visible,")
        + " outside the dataset (POSIX calls; no checkpoint events in the trace)",
        "inferred",
    )
    facts.put(
        "checkpoint.files_per_checkpoint", "files of each name pattern, per checkpoint", "inferred"
    )
    facts.put("checkpoint.fsync", "fsync/fdatasync on the checkpoint files", "inferred")
    if not seen:
        # the save's time is what the replay can spend, as serialisation, with nothing to write
        spans = ckpt.group_by("ckpt", "pid").agg((pl.col("end").max() - pl.col("ts").min()) * US)
        facts.put("checkpoint.bytes_per_checkpoint", "writes not visible: unknown", "default")
        facts.put(
            "checkpoint.serialization_time",
            "open to close of a checkpoint's files (their writes are not visible)",
            "inferred",
        )
        return {
            "files_per_checkpoint": max(files_per, 1),
            "serialization_time": observed(spans["end"]),
        }
    writes = _writes(events).join(
        ckpt.select("pid", "file", "open_ts", "ckpt"), on=["pid", "file", "open_ts"]
    )
    file_writes, file_ranks = file_writes_of(writes.select("pid", "ts", "file", "size", "ckpt"))
    nbytes = int(num(ckpt.group_by("ckpt").agg(pl.col("bytes").sum())["bytes"].median()))
    if file_writes is not None:
        nbytes = sum(size * calls for runs in file_writes for size, calls in runs)
        facts.put("checkpoint.file_writes", "write calls per file of one checkpoint", "inferred")
        facts.put(
            "checkpoint.file_ranks",
            "the processes in the order of their first file's name (DCP's names)",
            "inferred",
        )
    facts.put("checkpoint.bytes_per_checkpoint", "bytes written to one checkpoint", "inferred")
    facts.put("checkpoint.write_transfer_size", "POSIX writes to the checkpoint files", "inferred")
    facts.put(
        "checkpoint.serialization_time",
        "no save events: the replay's writes stand for the whole save",
        "default",
    )
    return {
        "files_per_checkpoint": max(files_per, 1),
        "bytes_per_checkpoint": nbytes,
        "write_transfer_size": observed(writes["size"]),
        "file_writes": file_writes,
        "file_ranks": file_ranks,
    }


def _writes(events: pl.DataFrame) -> pl.DataFrame:
    """(pid, ts, end, file, size, open_ts) of the POSIX writes of bytes, each with the open of
    its file by its process that came last before it (-1: none traced)."""
    w = (
        events.filter(
            pl.col("name").is_in(WRITE_OPS) & pl.col("file").is_not_null() & (pl.col("size") > 0)
        )
        .select(
            "pid",
            "ts",
            (pl.col("ts") + pl.col("dur").fill_null(0)).alias("end"),
            pl.col("file").cast(pl.String),
            "size",
        )
        .sort("ts")
    )
    return w.join_asof(
        _calls(events, OPEN_OPS, "open_ts"),
        left_on="ts",
        right_on="open_ts",
        by=["pid", "file"],
        strategy="backward",
        check_sortedness=False,
    ).with_columns(pl.col("open_ts").fill_null(-1))


def _calls(events: pl.DataFrame, ops: tuple[str, ...], name: str) -> pl.DataFrame:
    """(pid, file, *name*: ts) of the calls *ops* naming a file, in time order."""
    return (
        events.filter(pl.col("name").is_in(ops) & pl.col("file").is_not_null())
        .select("pid", pl.col("file").cast(pl.String), pl.col("ts").alias(name))
        .sort(name)
    )


def checkpoint_spans(
    events: pl.DataFrame, paths: list[str], source: str | None = None
) -> pl.DataFrame:
    """(ts, end) µs of each checkpoint file's burst, from its open (or first write) to its
    close (or last write), as :func:`posix_checkpoints` finds them: the time the loop spent
    saving, also where the writes are not visible (``torch.save``: its open and close only).
    ``paths``: the dataset's files; ``source``: the trace. Empty when the trace shows no
    checkpoints."""
    ckpt = _checkpoint_bursts(_bursts(events, paths, read_only_streams(source)))
    if ckpt is None:
        return pl.DataFrame(schema={"ts": pl.Int64, "end": pl.Int64})
    return ckpt.select(pl.col("ts").cast(pl.Int64), pl.col("end").cast(pl.Int64))


def _bursts(
    events: pl.DataFrame, paths: list[str], read_only: pl.DataFrame | None = None
) -> pl.DataFrame:
    """One row per (process, file, open) outside the dataset and the interpreter's and
    system's files that wrote bytes, or was opened as a C stream (:data:`STREAM_OPENS`) for
    writing and closed without a read or a write seen in a file nobody read (a write DFTracer
    does not see), not spread over the dataset reads like a log: pid, file, open_ts, ts, end
    µs, bytes, calls. ``read_only``: (pid, ts) of the streams opened only to read."""
    mine = events.filter(
        ~pl.col("file").is_in(paths)
        & pl.col("file").is_not_null()
        & ~pl.col("file").cast(pl.String).str.contains(LIBRARY_PATTERN)
    )
    writes = _writes(mine)
    # a file read, or mapped (its reads are page faults), is no checkpoint whose writes are unseen
    read = (
        mine.filter(pl.col("name").is_in([*READ_OPS, *MMAP_OPS]))["file"].cast(pl.String).unique()
    )
    # where no write is seen, only a C stream opened for writing can have written unseen
    streams = _calls(mine, STREAM_OPENS, "open_ts").with_columns(pl.lit(True).alias("stream"))
    if read_only is not None and not read_only.is_empty():
        streams = streams.join(
            read_only.select(
                pl.col("pid").cast(streams.schema["pid"]), pl.col("ts").alias("open_ts")
            ),
            on=["pid", "open_ts"],
            how="anti",
        )
    opens = (
        _calls(mine, OPEN_OPS, "open_ts")
        .filter(~pl.col("file").is_in(read.implode()))
        .join(streams.unique(), on=["pid", "file", "open_ts"], how="left")
        .with_columns(pl.col("stream").fill_null(False))
        .join_asof(
            _calls(mine, CLOSE_OPS, "close_ts"),
            left_on="open_ts",
            right_on="close_ts",
            by=["pid", "file"],
            strategy="forward",
            check_sortedness=False,
        )
    )
    keys = ["pid", "file", "open_ts"]
    written = writes.group_by(keys).agg(
        pl.col("ts").min().alias("w_ts"),
        pl.col("end").max().alias("w_end"),
        pl.col("size").sum().alias("bytes"),
        pl.len().alias("calls"),
    )
    bursts = (
        opens.join(written, on=keys, how="full", coalesce=True)
        .select(
            *keys,
            pl.min_horizontal(
                pl.when(pl.col("open_ts") >= 0).then(pl.col("open_ts")), pl.col("w_ts")
            ).alias("ts"),
            pl.max_horizontal("close_ts", "w_end").alias("end"),
            pl.col("bytes").fill_null(0),
            pl.col("calls").fill_null(0),
            pl.col("stream").fill_null(False),
        )
        .filter(pl.col("ts").is_not_null() & ((pl.col("bytes") > 0) | pl.col("stream")))
        .drop("stream")
        .with_columns(pl.col("end").fill_null(pl.col("ts")))
    )
    data = events.filter(pl.col("file").is_in(paths) & pl.col("name").is_in(READ_OPS))
    if data.is_empty() or bursts.is_empty():
        return bursts
    lo, hi = int(num(data["ts"].min())), int(num((data["ts"] + data["dur"].fill_null(0)).max()))
    overlap = pl.min_horizontal(pl.col("end"), pl.lit(hi)) - pl.max_horizontal(
        pl.col("ts"), pl.lit(lo)
    )
    return bursts.filter((pl.col("calls") == 1) | (overlap <= LOG_OVERLAP * max(hi - lo, 1)))


def _checkpoint_bursts(bursts: pl.DataFrame) -> pl.DataFrame | None:
    """The bursts that make checkpoints, each with ``ckpt`` (0-based), or None: the k-th
    burst of every (pid, name pattern) written as often as the pattern of the most bytes,
    only files written, when they weigh enough; else, where ``torch.save`` wrote them unseen,
    the k-th burst of every pattern opened as often as the pattern opened most often without
    a visible write (twice or more). A small file written beside them (a report, a
    launcher's marker) does not hide unseen checkpoints: both kinds are weighed apart."""
    if bursts.is_empty():
        return None
    keyed = bursts.with_columns(
        pl.col("file").str.replace_all(r"\d+", "#").alias("pattern")
    ).with_columns(
        (pl.col("ts").rank("ordinal").over("pid", "pattern") - 1).cast(pl.Int64).alias("ckpt"),
        pl.len().over("pid", "pattern").alias("times"),
        pl.col("bytes").sum().over("pid", "pattern").alias("key_bytes"),
    )
    drop = ("pattern", "times", "key_bytes")
    seen = keyed.filter(pl.col("key_bytes") > 0)
    if not seen.is_empty():
        n = int(num(seen.sort(["key_bytes", "times"], descending=True)["times"][0]))
        ckpt = seen.filter(pl.col("times") == n)
        least = int(num(ckpt.group_by("ckpt").agg(pl.col("bytes").sum())["bytes"].min()))
        if (n >= 2 and least >= MIN_REPEATED_CHECKPOINT_BYTES) or least > CHECKPOINT_WRITE_BYTES:
            return ckpt.drop(drop)
    unseen = keyed.filter(pl.col("key_bytes") == 0)
    n = int(num(unseen["times"].max(), 0))
    if n >= 2:  # the writes are not visible: repeated opens of files nobody read
        return unseen.filter(pl.col("times") == n).drop(drop)
    return None


def _savers_epochs(
    events: pl.DataFrame,
    paths: list[str],
    epoch_spans: list[tuple[int, int, int]],
    savers: list[int],
) -> list[tuple[int, int, int]]:
    """The epochs (epoch, start µs, end µs) of the processes that save, from their own
    dataset reads and their workers' (each read placed in the latest epoch begun, by any
    rank, before it); ``epoch_spans`` where they read nothing. A rank that saves after its
    epoch may save after another rank began the next one (torchrun's ranks do not wait for
    rank 0's save), so the whole job's epochs would put the save inside the next epoch."""
    if not epoch_spans or "ppid" not in events.columns:
        return epoch_spans
    reads = events.filter(
        pl.col("file").is_in(paths)
        & pl.col("name").is_in(READ_OPS)
        & (pl.col("pid").is_in(savers) | pl.col("ppid").is_in(savers))
    ).select("ts", (pl.col("ts") + pl.col("dur").fill_null(0)).alias("end"))
    if reads.is_empty():
        return epoch_spans
    own = (
        per_epoch(reads, epoch_spans)
        .group_by("epoch")
        .agg(pl.col("ts").min().alias("a"), pl.col("end").max().alias("b"))
        .sort("epoch")
    )
    return [(int(e), int(a), int(b)) for e, a, b in own.iter_rows()]


def _schedule(
    starts: list[int],
    epoch_spans: list[tuple[int, int, int]],
    steps_per_epoch: tuple[int | None, str],
    facts: Facts,
) -> dict:
    """The checkpoint fields of when the saves happen (first write µs of each in ``starts``):
    after an epoch's reads, at most once an epoch: every N epochs; more often: steps per
    epoch over checkpoints per epoch; without epochs: unknown (once an epoch, the default)."""
    spans = sorted(epoch_spans, key=lambda s: s[1])
    if not spans:
        facts.put(
            "checkpoint.epochs_between_checkpoints",
            "the reads show no epochs: once an epoch assumed",
            "default",
        )
        return {}
    at = pl.DataFrame({"ts": starts}, schema={"ts": pl.Int64}).sort("ts")
    ep = pl.DataFrame(
        {
            "e": list(range(1, len(spans) + 1)),
            "e_ts": [s[1] for s in spans],
            "e_end": [s[2] for s in spans],
        },
        schema={"e": pl.Int64, "e_ts": pl.Int64, "e_end": pl.Int64},
    )
    tagged = at.join_asof(ep, left_on="ts", right_on="e_ts", strategy="backward").with_columns(
        pl.col("e").fill_null(1), pl.col("e_end").fill_null(spans[0][2])
    )
    per_epoch = tagged.group_by("e").len()
    after = bool((tagged["ts"] >= tagged["e_end"]).all())
    if after and int(num(per_epoch["len"].max())) == 1:
        epochs = tagged["e"].sort()
        every = mode(epochs.diff().drop_nulls()) if epochs.len() > 1 else len(spans)
        facts.put(
            "checkpoint.epochs_between_checkpoints",
            "checkpoint writes after the reads of an epoch, at most one an epoch",
            "inferred",
        )
        facts.put(
            "checkpoint.checkpoint_after_epoch",
            "first epoch followed by checkpoint writes",
            "inferred",
        )
        return {
            "epochs_between_checkpoints": max(int(every or 1), 1),
            "checkpoint_after_epoch": int(epochs[0]),
        }
    steps, batch_confidence = steps_per_epoch
    # the run's steps over its checkpoints (an epoch of 8 steps saving every 3: 2 or 3 an epoch)
    n = len(starts)
    interval = max(steps * len(spans) // n, 1) if steps and n else None
    facts.put(
        "checkpoint.steps_between_checkpoints",
        f"{len(spans)} epoch(s) of {steps} steps over {n} checkpoint(s)"
        if interval
        else "checkpoints inside epochs, steps per epoch unknown: once an epoch assumed",
        "inferred" if interval and batch_confidence != "default" else "default",
    )
    return {"steps_between_checkpoints": interval} if interval else {}


def _folder(files: list[str]) -> str | None:
    """The folder that holds every checkpoint file (the common one of their paths)."""
    absolute = [f for f in files if f.startswith("/")]
    if not absolute:
        return None
    root = os.path.commonpath(absolute)
    return os.path.dirname(root) if root in absolute else root


def _restore(events: pl.DataFrame, paths: list[str], root: str | None, facts: Facts) -> dict:
    """The restore: reads of files in the checkpoint folder ``root`` before the first read
    of the dataset (bytes per reading process, read sizes); nothing without them."""
    data = events.filter(pl.col("file").is_in(paths) & pl.col("name").is_in(READ_OPS))
    if root is None or data.is_empty():
        return {}
    first = int(num(data["ts"].min()))
    reads = events.filter(
        pl.col("name").is_in(READ_OPS)
        & (pl.col("size") > 0)
        & pl.col("file").cast(pl.String).str.starts_with(root.rstrip("/") + "/")
        & (pl.col("ts") < first)
    )
    if reads.is_empty():
        facts.put(
            "checkpoint.read_at_start",
            "no reads of the checkpoint folder before the dataset's",
            "inferred",
        )
        return {}
    per_pid = reads.group_by("pid").agg(pl.col("size").sum())
    facts.put(
        "checkpoint.read_at_start",
        "reads of the checkpoint folder before the dataset's",
        "inferred",
    )
    facts.put("checkpoint.read_bytes_per_rank", "bytes each process read from it then", "inferred")
    facts.put(
        "checkpoint.read_transfer_size", "POSIX reads of the checkpoint folder then", "inferred"
    )
    return {
        "read_at_start": True,
        "read_bytes_per_rank": int(num(per_pid["size"].median())),
        "read_transfer_size": observed(reads["size"]),
    }
