"""The event table: the typed polars schema every stage agrees on.

One row per traced event (POSIX/STDIO call, data-loader event, checkpoint event).
Metadata records of DFTracer (``FH`` file hashes, ``HH`` host hashes, ``PR`` etc.)
are consumed while loading and are not rows.

Units: ``ts`` and ``dur`` are microseconds (``ts`` since the Unix epoch, as DFTracer
writes them with its default ``US`` time metric); every size and offset is bytes.
"""

from __future__ import annotations

import polars as pl

TRACE_SCHEMA_NAME = "dlreplay.trace"
TRACE_FORMAT_VERSION = 1

#: Columns of the table returned by :func:`dlreplay.analyze.load`, in order. Compact: no
#: string per event (names, categories, files, hosts, sources and roles are Categorical,
#: 4 bytes a row; ids and loop counters Int32), so that a large trace's table fits in memory.
EVENT_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.Int32(),  # process id (C pid_t)
    "tid": pl.Int32(),  # thread id (C pid_t)
    "ppid": pl.Int32(),  # parent process id (from DFTracer's per-process start record), null if unknown
    "host": pl.Categorical(),  # host name (resolved from HH records), else the host hash
    "ts": pl.Int64(),  # start, microseconds since the Unix epoch
    "dur": pl.Int64(),  # duration, microseconds
    "cat": pl.Categorical(),  # POSIX, STDIO, dataloader, data, pipeline, compute, checkpoint, ...
    "name": pl.Categorical(),  # operation: read, pread64, open64, lseek64, fetch, item, epoch, step, ...
    "file": pl.Categorical(),  # resolved file path (FH record of any file of the run), null if none
    "fhash": pl.Categorical(),  # DFTracer file hash as written (hex string), null if none
    "size_requested": pl.Int64(),  # bytes asked for (read/write ``count``), null if n/a
    "size": pl.Int64(),  # bytes transferred (``ret`` of read/write >= 0; checkpoint bytes)
    "offset": pl.Int64(),  # file offset where the transfer starts (given or reconstructed)
    "ret": pl.Int64(),  # raw return value where recorded (lseek: the new offset)
    # loop counters, 32-bit (a value beyond reads as null)
    "epoch": pl.Int32(),  # data-loader epoch (0-based), null when not a data-loader event
    "step": pl.Int32(),  # batch index within the epoch (fetch/step events)
    # samples in the batch (fetch events); 64-bit, as sums of it count a run's samples (polars
    # sums an Int32 column in 32 bits)
    "batch_size": pl.Int64(),
    "sample_index": pl.Int64(),  # dataset index of the sample (item events)
    # CPU time of the process, all its threads, during the event (microseconds) and the threads
    # that shared it (process CPU over the recording thread's): where the tracer measured them
    # (the training steps of dlreplay captures, ``cpu_time``/``cpu_threads`` args); else null
    "cpu_time": pl.Int32(),
    "cpu_threads": pl.Int32(),
    # tensors in the batch a fetch returned (dlreplay captures' ``tensors`` arg: each is one
    # worker -> main transfer); else null
    "tensors": pl.Int16(),
    "source": pl.Categorical(),  # trace file the event came from (basename)
    # what an annotation event means, whoever spelled it (DFTracer's AI conventions, DLIO,
    # dlreplay): epoch, fetch, step, compute, item, checkpoint.save, ... (see
    # dlreplay.analyze.trace.vocabulary); null for POSIX/STDIO calls and unknown annotations
    "role": pl.Categorical(),
}

#: Operation groups used across analyses (names as DFTracer writes them).
READ_OPS = ("read", "pread", "pread64", "readv", "preadv", "preadv2", "fread")
WRITE_OPS = ("write", "pwrite", "pwrite64", "writev", "pwritev", "pwritev2", "fwrite")
OPEN_OPS = ("open", "open64", "openat", "openat64", "creat", "creat64", "fopen", "fopen64")
CLOSE_OPS = ("close", "fclose")
SEEK_OPS = ("lseek", "lseek64", "fseek", "fseeko", "fseeko64")
STAT_OPS = (
    "stat",
    "stat64",
    "lstat",
    "lstat64",
    "fstat",
    "fstat64",
    "xstat",
    "xstat64",
    "__xstat",
    "__xstat64",
    "__lxstat",
    "__lxstat64",
    "__fxstat",
    "__fxstat64",
    "statx",
    "fstatat",
    "fstatat64",
    "newfstatat",
    "access",
    "faccessat",
)
SYNC_OPS = ("fsync", "fdatasync", "sync_file_range", "msync")
IO_CATEGORIES = ("POSIX", "STDIO")

# Data-loader events of ``dlreplay capture`` before it wrote DFTracer's AI conventions
# (format_version 1 traces, replays); read through dlreplay.analyze.trace.vocabulary's roles.
CAT_DATALOADER = "dataloader"  # name "fetch": consumer waits for one batch
CAT_DATA = "data"  # name "item": one Dataset.__getitem__ in a worker
CAT_PIPELINE = "pipeline"  # name "epoch": one pass over a DataLoader
CAT_COMPUTE = "compute"  # name "step": consumer time between two batches
CAT_CHECKPOINT = "checkpoint"  # names "save" / "load": torch.save / torch.load


def empty_events() -> pl.DataFrame:
    """An event table with no rows and the full schema."""
    return pl.DataFrame(schema=EVENT_SCHEMA)
