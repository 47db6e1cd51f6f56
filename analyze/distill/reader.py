"""The reader section of the model: batch size, loader workers (how many, persistent, how
started), sample order, metadata calls and transfer sizes per sample, preprocessing time
and the access pattern."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from dlreplay.model import AccessPattern, Dataset, Distribution, MetadataPerSample, Reader
from dlreplay.schema import CLOSE_OPS, OPEN_OPS, READ_OPS, SEEK_OPS, STAT_OPS

from ..infer_pools import Inferred
from .base import US, Facts, Observed, mode, num, observed
from .dataset import posix_mapped_rows, posix_row_groups
from .measure import file_sizes, workers_per_rank

__all__ = [
    "PYTHON_FILE_FORMATS",
    "UNBUFFERED_MEDIAN_READ",
    "access_pattern",
    "preprocess_cpu",
    "reader_section",
]

#: Formats a Dataset reads through a Python file object (its buffering shows in the read sizes).
PYTHON_FILE_FORMATS = ("npz", "npy", "jpeg", "png")
#: Below this median read size (bytes) the job's file object was unbuffered.
UNBUFFERED_MEDIAN_READ = 256
#: HDF5 read through a Python file object: below this median read size (bytes) it was
#: unbuffered (a buffered one reads blocks of io.DEFAULT_BUFFER_SIZE, 8 KiB, or more)
HDF5_UNBUFFERED_MEDIAN_READ = 4096


def reader_section(obs: Observed, dataset: Dataset, facts: Facts) -> Reader:
    """``reader``: the loader's batch size and workers from the training-loop events (else
    the POSIX inference), what a sample costs from the dataset I/O."""
    # NPY files mapped and read in their headers alone, in a trace without items: once, here
    mapped_rows = posix_mapped_rows(obs, dataset)
    # and Parquet files read a row group at a time through files kept open
    row_groups = not mapped_rows and posix_row_groups(obs, dataset)
    if obs.has_loader:
        batch_size, read_threads, persistent, start_method = _loader_from_events(obs, facts)
    else:
        batch_size, read_threads, persistent, start_method = _loader_from_posix(
            obs, mapped_rows or row_groups, facts
        )
    if start_method is None:
        facts.put(
            "reader.multiprocessing_context",
            "no worker process files to tell: fork (PyTorch's default on Linux)",
            "default",
        )
    items = obs.items
    shuffled = _shuffled(items) if items.height else None
    order_how = "order of sample indices in item events, per process"
    if shuffled is None and obs.posix is not None and obs.posix.shuffled.value is not None:
        shuffled, order_how = bool(obs.posix.shuffled.value), obs.posix.shuffled.evidence
    if persistent is None:
        persistent = False
        facts.put(
            "reader.persistent_workers",
            "needs >= 2 epochs with worker events (PyTorch default)",
            "default",
        )
    shuffle_mode = "seed" if shuffled else "off"
    facts.put(
        "reader.sample_shuffle",
        order_how if shuffled is not None else "no item events",
        ("measured" if items.height else "inferred") if shuffled is not None else "default",
    )
    facts.put(
        "reader.file_shuffle",
        "follows sample order (one decision per job)" if shuffled is not None else "no item events",
        "inferred" if shuffled is not None else "default",
    )
    meta, open_per_sample = _metadata(obs, facts)
    preprocess, preprocess_cpu = _preprocessing(obs, facts)
    transfer, buffering, pattern = _transfers(obs, dataset.format, facts)
    facts.put("reader.prefetch_factor", "not visible in a trace (PyTorch default)", "default")
    batch_tensors = _batch_tensors(obs.fetch)
    facts.put(
        "reader.batch_tensors",
        "tensors per batch of the consumer's fetches (median)"
        if batch_tensors
        else "not in this trace: 1",
        "measured" if batch_tensors else "default",
    )
    reader = Reader(
        data_loader="pytorch" if obs.has_loader else "native",
        batch_size=batch_size,
        read_threads=read_threads,
        file_shuffle=shuffle_mode,
        sample_shuffle=shuffle_mode,
        shuffle_seed=0 if shuffled else None,
        open_per_sample=open_per_sample,
        file_buffering=buffering,
        persistent_workers=persistent,
        multiprocessing_context=start_method or "fork",
        batch_tensors=batch_tensors or 1,
        preprocess_time=preprocess if preprocess.is_known else Distribution.fixed(0.0),
        preprocess_host_cpu=preprocess_cpu
        if preprocess_cpu is not None
        else Distribution.fixed(0.0),
        transfer_size=transfer,
        access_pattern=pattern,
        metadata_per_sample=meta,
    )
    reader = _row_group_reads(reader, obs, dataset, row_groups, facts)
    return _as_dlio_reads(reader, obs, dataset.format, mapped_rows, facts)


def _row_group_reads(
    reader: Reader, obs: Observed, dataset: Dataset, posix_groups: bool, facts: Facts
) -> Reader:
    """``reader`` with ``row_group_reads`` where the item events of a Parquet dataset of
    several samples a file read less than half a file each (pyarrow's ``read_row_group``: the
    column chunks of the group holding the sample), measured; DLIO's and pandas' readers
    read the whole file a sample, as the replay does otherwise (a job of 8 row groups a file
    replayed so: 1.1 GiB read against 103 MiB). Without item events: *posix_groups*
    (:func:`~.dataset.posix_row_groups`), inferred."""
    if dataset.format != "parquet" or dataset.num_samples_per_file < 2:
        return reader
    if not obs.items.height:
        if not posix_groups:
            return reader
        facts.put(
            "reader.row_group_reads",
            "several reads a visit of the files, under half a file each (POSIX calls alone)",
            "inferred",
        )
        facts.put(
            "reader.open_per_sample",
            "the files' row groups were read through handles kept open (several reads an open)",
            "inferred",
        )
        return replace(reader, row_group_reads=True, open_per_sample=False)
    reads = obs.tagged_io.filter(
        pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("item_ts").is_not_null()
    )
    sizes = file_sizes(obs.io)
    if reads.is_empty() or sizes.is_empty():
        return reader
    per_item = reads.group_by("pid", "item_ts").agg(pl.col("size").sum())["size"]
    item, file = num(per_item.median(), 0.0), num(sizes["size"].median(), 0.0)
    if not file or item >= 0.5 * file:
        return reader
    facts.put(
        "reader.row_group_reads",
        f"the {per_item.len()} item events that read read {item:,.0f} B each (median), of files "
        f"of {file:,.0f} B: a row group each, not the file",
        "measured",
    )
    return replace(reader, row_group_reads=True)


def _loader_from_events(obs: Observed, facts: Facts) -> tuple[int, int, bool | None, str | None]:
    """(batch size, workers per rank, persistent workers, start method) from the loop's and
    the workers' events; None where the trace does not tell."""
    batch_size, how = _batch_size(obs.fetch, obs.items, obs.steps, obs.epochs, obs.main_pid)
    facts.put("reader.batch_size", how, "measured" if batch_size else "default")
    batch_size = batch_size or 1
    worker_items = obs.items.filter(~pl.col("pid").is_in(obs.consumers))
    if not worker_items.height:
        facts.put(
            "reader.read_threads", "items read in the consumer process (no workers)", "measured"
        )
        return batch_size, 0, None, None
    read_threads = workers_per_rank(worker_items, obs.epochs, obs.consumers)
    mine = obs.steps.filter(pl.col("pid") == obs.main_pid)
    batches = int(num(mine.group_by("epoch").len()["len"].max())) if mine.height else 0
    if batches and batches <= read_threads:
        # a worker builds whole batches: with no more batches per epoch than workers, every
        # batch had a worker of its own and more workers may have idled, unseen
        facts.put(
            "reader.read_threads",
            f"at least {read_threads}: worker processes (with item events) in one epoch, but an "
            f"epoch has only {batches} batch(es) per rank, one per worker: more workers may have "
            "idled",
            "inferred",
        )
    else:
        facts.put(
            "reader.read_threads",
            "most worker processes (with item events) in one epoch",
            "measured",
        )
    persistent = None
    n_epochs_seen = int(obs.steps.filter(pl.col("pid") == obs.main_pid)["epoch"].n_unique())
    if n_epochs_seen >= 2:
        per_rank = (
            worker_items.filter(pl.col("ppid") == obs.main_pid)["pid"].n_unique()
            or worker_items["pid"].n_unique()
        )
        persistent = per_rank <= read_threads
        facts.put(
            "reader.persistent_workers",
            "worker pids reused across epochs" if persistent else "new worker pids every epoch",
            "measured",
        )
    start_method, how = _start_method(worker_items, obs.consumers)
    if start_method is not None:
        facts.put("reader.multiprocessing_context", how, "inferred")
    return batch_size, read_threads, persistent, start_method


def _loader_from_posix(
    obs: Observed, rows: bool, facts: Facts
) -> tuple[int, int, bool | None, str | None]:
    """(batch size, workers per rank, persistent workers or None, None) as the POSIX inference
    found them (no batch where the samples are *rows* of the files, which no visit shows:
    rows faulted in from mapped files, or read a row group at a time)."""
    posix = obs.posix
    assert posix is not None
    if rows:
        posix = replace(
            posix,
            batch_size=Inferred(
                None,
                "the samples are rows of the files (faulted in from mappings, or read a row "
                "group at a time): no visit is a sample",
            ),
        )
    batch_size = int(posix.batch_size.value or 1)
    facts.put(
        "reader.batch_size",
        posix.batch_size.evidence
        if posix.batch_size.value
        else f"no fetch events (POSIX-only trace), and {posix.batch_size.evidence}",
        "inferred" if posix.batch_size.value else "default",
    )
    if not posix.batch_size.value:
        facts.notes.append(
            f"guess: reader.batch_size 1, and no compute time per step: the trace cannot tell the "
            f"batch size ({posix.batch_size.evidence}); set it with --set reader.batch_size=N, or "
            "capture with the loader hooks"
        )
    read_threads = int(posix.read_threads.value or 0)
    facts.put("reader.read_threads", posix.read_threads.evidence, "inferred")
    persistent = posix.persistent.value if read_threads else None
    if persistent is not None:
        facts.put("reader.persistent_workers", posix.persistent.evidence, "inferred")
    return batch_size, read_threads, None if persistent is None else bool(persistent), None


def _metadata(obs: Observed, facts: Facts) -> tuple[MetadataPerSample, bool]:
    """(metadata calls per sample, whether each sample opens its file) from the calls on the
    dataset files."""
    io, items = obs.io, obs.items
    # samples read: the item events, else the POSIX inference's visits (a held-open HDF5 file's
    # sample regions: its few opens are no open per sample), else the opens
    samples_read = (
        items.height
        if items.height
        else obs.posix.visits
        if obs.posix is not None and obs.posix.visits
        else max(io.filter(pl.col("name").is_in(OPEN_OPS)).height, 1)
    )

    def per_sample(ops: tuple[str, ...]) -> float:
        return round(io.filter(pl.col("name").is_in(ops)).height / samples_read, 3)

    meta = MetadataPerSample(
        opens=per_sample(OPEN_OPS),
        closes=per_sample(CLOSE_OPS),
        stats=per_sample(STAT_OPS),
        lseeks=per_sample(SEEK_OPS),
    )
    facts.put(
        "reader.metadata_per_sample",
        "calls on dataset files / samples read",
        "measured" if items.height else "inferred",
    )
    kept = not items.height and obs.posix is not None and obs.posix.kept_open
    open_per_sample = meta.opens is not None and meta.opens >= 0.5 and not kept
    facts.put(
        "reader.open_per_sample",
        "files read again through handles kept open (the first read of an open repeated "
        f"without an open; {meta.opens} opens per sample)"
        if kept
        else "dataset opens per sample >= 0.5",
        "measured" if items.height else "inferred",
    )
    return meta, open_per_sample


def _preprocessing(obs: Observed, facts: Facts) -> tuple[Distribution, Distribution | None]:
    """(preprocess time, its host CPU time or None) per sample, from the item events (a
    POSIX-only trace: the reader's silence between two samples of a batch, taken as CPU)."""
    preprocess = _preprocess_time(obs.tagged_io, obs.items)
    posix = obs.posix.preprocess_time if obs.posix is not None else None
    preprocess_known = preprocess.is_known
    if preprocess.is_known:
        facts.put(
            "reader.preprocess_time", "item duration minus its POSIX time, per sample", "measured"
        )
    elif posix is not None and posix.value is not None:
        # a POSIX-only trace of a consumer that reads its own samples: its silence between them
        preprocess = Distribution.fixed(float(posix.value))
        facts.put("reader.preprocess_time", f"no item events; {posix.evidence}", "inferred")
    else:
        facts.put("reader.preprocess_time", "no item events", "default")
    cpu = preprocess_cpu(obs.items)
    if cpu is not None:
        facts.put(
            "reader.preprocess_host_cpu",
            "CPU time of the loader worker process in each item (data/item cpu_time), per sample",
            "measured",
        )
    elif posix is not None and posix.value is not None and not preprocess_known:
        # the reader's silence between samples is its decoding: CPU, which a replay's readers
        # spend too (idle readers would leave the job's CPU contention out of the replay)
        cpu = preprocess
        facts.put(
            "reader.preprocess_host_cpu",
            "the reader's silence between two samples of a batch, taken as its CPU (decoding)",
            "inferred",
        )
    else:
        facts.put(
            "reader.preprocess_host_cpu",
            "not measured by this trace: 0, the preprocessing is a sleep (as DLIO's)",
            "default",
        )
    return preprocess, cpu


def _transfers(obs: Observed, fmt: str, facts: Facts) -> tuple[Distribution, str, AccessPattern]:
    """(read sizes, the file object's buffering, the access pattern) of the dataset reads."""
    reads = obs.reads
    transfer = observed(reads["size"])
    facts.put("reader.transfer_size", "sizes of read calls on dataset files", "measured")
    buffering = "buffered"
    if fmt in PYTHON_FILE_FORMATS and reads.height:
        # Python's buffered files read >= 4-8 KiB at a time; an unbuffered handle passes the library's
        # own small reads (zip headers, JPEG markers: a few bytes each) straight to read(2)
        median = num(reads["size"].median())
        buffering = "unbuffered" if median < UNBUFFERED_MEDIAN_READ else "buffered"
        facts.put(
            "reader.file_buffering",
            f"median dataset read {median:.0f} B "
            f"({'<' if buffering == 'unbuffered' else '>='} {UNBUFFERED_MEDIAN_READ} B)",
            "inferred",
        )
    if fmt == "hdf5" and reads.height:
        # HDF5's own (sec2) driver reads with pread; read(2) at the file position is h5py's
        # fileobj driver: the job handed h5py a Python file object (a seek and a read for
        # each of the library's requests when it is unbuffered)
        plain = reads.filter(pl.col("name").is_in(["read", "readv", "fread"])).height
        if plain > reads.height // 2:
            # a buffered Python file reads a block of io.DEFAULT_BUFFER_SIZE (8 KiB) or more at
            # a time; HDF5's own requests (index entries, chunks) are mostly smaller
            median = num(reads["size"].median())
            buffering = "unbuffered" if median < HDF5_UNBUFFERED_MEDIAN_READ else "buffered"
            facts.put(
                "reader.file_buffering",
                f"{plain} of {reads.height} HDF5 reads at the file position (HDF5's own "
                f"driver uses pread): h5py was handed a Python file object; median read "
                f"{median:.0f} B ({'<' if buffering == 'unbuffered' else '>='} "
                f"{HDF5_UNBUFFERED_MEDIAN_READ} B)",
                "inferred",
            )
    pattern = access_pattern(reads)
    facts.put(
        "reader.access_pattern",
        "Darshan sequential/consecutive over reads per process and file",
        "measured",
    )
    return transfer, buffering, pattern


#: Formats whose samples a Dataset can take as rows of a mapped file, as the replay does
MAPPED_ROW_FORMATS = ("npy",)


def _as_dlio_reads(
    reader: Reader, obs: Observed, fmt: str, mapped_rows: bool, facts: Facts
) -> Reader:
    """``reader`` with what a memory-mapped dataset (*mapped_rows*: :func:`posix_mapped_rows`)
    and DLIO's PyTorch loader change."""
    if obs.mapped and fmt == "indexed_binary":
        reader = replace(reader, memory_map=True)
        facts.put(
            "reader.memory_map", "the dataset files were mapped (mmap) and never read", "measured"
        )
    elif fmt in MAPPED_ROW_FORMATS and (obs.item_windows.height or mapped_rows):
        reader = replace(reader, memory_map=True)
        seen = bool(obs.item_windows.height)
        facts.put(
            "reader.memory_map",
            "the item events took windows of the mapped files (np.load(mmap_mode='r'), "
            "np.memmap): each sample's rows faulted in"
            if seen
            else "the files were mapped (mmap) and read in their headers alone",
            "measured" if seen else "inferred",
        )
    if obs.dlio_reader is not None and obs.has_loader and _dlio_torch(obs.annotated):
        # DLIO 2.0's TorchDataLoader: DataLoader(sampler=dlio_sampler, drop_last=True); a trace holds
        # no config, but its events name DLIO's classes
        reader = replace(reader, sample_order="dlio", drop_last=True)
        facts.put(
            "reader.sample_order",
            f"DLIO's PyTorch sampler: the trace's events are DLIO's "
            f"(TorchDataset, {obs.dlio_reader})",
            "inferred",
        )
        facts.put("reader.drop_last", "DLIO's PyTorch loader sets drop_last=True", "inferred")
    return reader


def _preprocess_time(tagged_io: pl.DataFrame, items: pl.DataFrame) -> Distribution:
    """Per-sample CPU time in the loader worker (s): item duration minus the POSIX time inside it.

    DLIO's ``preprocess_time``: decoding, conversion, augmentation. ``tagged_io`` is the
    dataset I/O with its enclosing item (:func:`~.observe.assign_items`). Unknown without items.
    """
    if items.is_empty():
        return Distribution.unknown()
    tagged = tagged_io.filter(pl.col("item_ts").is_not_null())
    io_time = tagged.group_by("pid", "item_ts").agg(pl.col("dur").sum().alias("io_us"))
    per_item = (
        items.select("pid", pl.col("ts").alias("item_ts"), "dur")
        .join(io_time, on=["pid", "item_ts"], how="left")
        .select(
            ((pl.col("dur") - pl.col("io_us").fill_null(0)).clip(lower_bound=0) * US).alias("s")
        )
    )
    return observed(per_item["s"])


def preprocess_cpu(items: pl.DataFrame) -> Distribution | None:
    """Per-sample CPU time of the loader worker (s), the library's read and decode included:
    ``data/item`` events' ``cpu_time`` (µs, written by dlreplay capture); None when the
    trace did not measure it."""
    if items.is_empty() or "cpu_time" not in items.columns:
        return None
    cpu = items["cpu_time"].drop_nulls()
    if cpu.len() < max(1, items.height // 2):
        return None
    return observed(cpu.cast(pl.Float64) * US)


def access_pattern(reads: pl.DataFrame) -> AccessPattern:
    """Darshan's fractions over reads ordered per (pid, file).

    consecutive: starts exactly where the previous read of that file ended;
    sequential: starts at or past it (includes consecutive); random = 1 - sequential.
    The first read of each (pid, file) has no predecessor and is not counted.
    """
    # Integer keys sort fast; a stable sort keeps each file's reads in time order. The key is
    # the file's path (DFTracer 1.x traces, DLIO's, name files by path and have no hash).
    r = (
        reads.filter(pl.col("offset").is_not_null())
        .select("pid", pl.col("file").cast(pl.String).hash().alias("fkey"), "ts", "offset", "size")
        .sort("ts")
        .sort("pid", "fkey", maintain_order=True)
    )
    same = (pl.col("pid") == pl.col("pid").shift(1)) & (pl.col("fkey") == pl.col("fkey").shift(1))
    prev_end = pl.when(same).then((pl.col("offset") + pl.col("size")).shift(1))
    r = r.with_columns(prev_end.alias("prev_end")).filter(pl.col("prev_end").is_not_null())
    if r.is_empty():
        return AccessPattern()
    n = r.height
    consecutive = r.filter(pl.col("offset") == pl.col("prev_end")).height / n
    sequential = r.filter(pl.col("offset") >= pl.col("prev_end")).height / n
    return AccessPattern(
        sequential=round(sequential, 4),
        consecutive=round(consecutive, 4),
        random=round(1 - sequential, 4),
    )


def _dlio_torch(annotated: pl.DataFrame) -> bool:
    """True when the trace's loader is DLIO's PyTorch one (events of its ``TorchDataset`` or
    ``TorchDataLoader`` classes)."""
    names = annotated["name"].cast(pl.String).unique()
    return bool(
        names.str.starts_with("TorchDataset.").any()
        or names.str.starts_with("TorchDataLoader.").any()
    )


def _shuffled(items: pl.DataFrame) -> bool | None:
    """True when samples are visited out of index order within epochs.

    Each process's samples in time order (workers and ranks interleave, so the merged stream
    of an unshuffled loader is out of order: 2 ranks, or 8 workers, read as shuffled): call it
    shuffled when under 75 % of a process's changes of sample index are increases.
    """
    s = items.filter(pl.col("sample_index").is_not_null()).sort("ts")
    if s.height < 4:
        return None
    step = pl.col("sample_index").diff().over("pid")
    moves = s.select(step.alias("d")).filter(pl.col("d").is_not_null() & (pl.col("d") != 0))
    if moves.height < 3:
        return None
    inc = moves.select((pl.col("d") > 0).mean()).item()
    return bool(inc is not None and inc < 0.75)


def _start_method(workers: pl.DataFrame, consumers: list[int]) -> tuple[str | None, str]:
    """How the loader workers started, from DFTracer's trace file names (``-fork`` for a process
    forked by a traced one, ``-preload`` for a new program: a spawned interpreter) and their
    parents: forked by the consumer (fork), forked by another process (forkserver), or new
    interpreters (spawn). (None, why) when the file names do not tell."""
    if "source" not in workers.columns or workers.is_empty():
        return None, ""
    procs = workers.group_by("pid").agg(
        pl.col("source").first().cast(pl.String), pl.col("ppid").first()
    )
    kind = procs["source"].str.extract(r"-(fork|preload)\.pfw", 1)
    if kind.null_count() == kind.len():
        return None, ""
    forked = int((kind == "fork").sum())
    spawned = int((kind == "preload").sum())
    n = procs.height
    if spawned > forked:
        return (
            "spawn",
            f"{spawned} of {n} worker processes are new programs (DFTracer '-preload' files)",
        )
    by_consumer = int(procs.filter(kind == "fork")["ppid"].is_in(consumers).sum())
    if by_consumer * 2 >= forked:
        return (
            "fork",
            f"{by_consumer} of {n} worker processes forked by the training process ('-fork' files)",
        )
    return (
        "forkserver",
        f"{forked - by_consumer} of {n} worker processes forked by another process ('-fork' files)",
    )


def _batch_tensors(fetch: pl.DataFrame) -> int | None:
    """Tensors per batch (the median over batch fetches that recorded it), or None."""
    if "tensors" not in fetch.columns:
        return None
    got = fetch.filter((pl.col("batch_size").fill_null(1) > 0) & (pl.col("tensors") > 0))["tensors"]
    return int(round(float(got.median()))) if got.len() else None  # type: ignore[arg-type]


def _batch_size(
    fetch: pl.DataFrame,
    items: pl.DataFrame,
    loop: pl.DataFrame,
    epochs: pl.DataFrame,
    main_pid: int | None,
) -> tuple[int | None, str]:
    """Samples per batch: the fetch events' ``batch_size``; else the consumer's samples per
    step (item events in its workers or itself, per epoch, over its steps in that epoch)."""
    sized = fetch.filter(pl.col("batch_size") > 0)
    if sized.height:
        return mode(sized["batch_size"]), "most common batch size of fetch events"
    mine = loop.filter(pl.col("pid") == main_pid)
    its = items.filter((pl.col("pid") == main_pid) | (pl.col("ppid") == main_pid))
    if its.is_empty() and loop["pid"].n_unique() == 1:
        its = items
    if its.is_empty() or mine.is_empty():
        return None, "no fetch sizes and no item events"
    spans = (
        epochs.filter(pl.col("pid") == main_pid)
        .select(pl.col("ts").alias("e_ts"), "epoch")
        .sort("e_ts")
    )
    its = its.drop(
        "epoch"
    )  # a worker's own epoch numbers are its iterator's (persistent workers: stale)
    if spans.height:
        its = its.sort("ts").join_asof(spans, left_on="ts", right_on="e_ts", strategy="backward")
        its = its.with_columns(pl.col("epoch").fill_null(spans["epoch"][0]))
    else:
        its = its.with_columns(pl.lit(0, pl.Int64).alias("epoch"))
    per = (
        its.group_by("epoch")
        .len()
        .join(mine.group_by("epoch").len().rename({"len": "steps"}), on="epoch")
        .with_columns((pl.col("len") / pl.col("steps")).alias("per"))
    )
    if per.is_empty():
        return None, "no item events inside the consumer's epochs"
    # ceil: a last, partial batch (drop_last=False) leaves the ratio just under the batch size
    return int(
        np.ceil(float(num(per["per"].median())) - 1e-9)
    ), "item events per training step, per epoch"
