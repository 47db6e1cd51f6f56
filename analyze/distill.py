"""Distill: infer a workload model (``dlreplay.workload``) from an event table.

Every inference is a small function over the polars event table (no Python loops
over events) that returns a value and how it was obtained::

    (value, method, confidence)   confidence in measured | inferred | default

Traces captured by ``dlreplay capture``, DLIO's traces and code annotated with
DFTracer's AI conventions carry data-loader events (epoch, fetch, step, compute, item,
checkpoint; read by role, see :mod:`.vocabulary`), which give batch size, workers,
epochs, samples per file and step compute time directly (``measured``). Plain DFTracer
traces (POSIX only) fall back to POSIX-level inference (``inferred``, see
:mod:`.infer`) or defaults.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any, TypeVar

import numpy as np
import polars as pl

import dlreplay
from dlreplay.errors import DlreplayError, TraceError
from dlreplay.model import (
    AccessPattern,
    Checkpoint,
    Dataset,
    Distribution,
    Evaluation,
    FieldProvenance,
    Layout,
    MetadataPerSample,
    Processes,
    Provenance,
    Reader,
    Train,
    WorkloadModel,
)
from dlreplay.schema import CLOSE_OPS, OPEN_OPS, READ_OPS, SEEK_OPS, STAT_OPS, SYNC_OPS, WRITE_OPS

from .infer import infer_posix_loop
from .trace import vocabulary as voc

#: File extension -> dataset format (DLIO names).
EXTENSION_FORMATS = {
    ".npz": "npz",
    ".npy": "npy",
    ".h5": "hdf5",
    ".hdf5": "hdf5",
    ".hdf": "hdf5",
    ".he5": "hdf5",
    ".jpg": "jpeg",
    ".jpeg": "jpeg",
    ".png": "png",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".idx": "indexed_binary",
    ".bin": "indexed_binary",
    ".indexed_binary": "indexed_binary",
    ".mmap_indexed_binary": "indexed_binary",
}

_US = 1e-6
#: Formats a Dataset reads through a Python file object (its buffering shows in the read sizes).
PYTHON_FILE_FORMATS = ("npz", "npy", "jpeg", "png")
#: Below this median read size (bytes) the job's file object was unbuffered.
UNBUFFERED_MEDIAN_READ = 256


class DistillError(TraceError):
    """The trace has nothing to distill (no events, no dataset reads, no file names)."""


@dataclass
class _Facts:
    """Field path -> provenance, collected while inferring."""

    fields: dict[str, FieldProvenance] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def put(self, path: str, method: str, confidence: str) -> None:
        self.fields[path] = FieldProvenance(method=method, confidence=confidence)


def _role(ev: pl.DataFrame, *roles: str) -> pl.DataFrame:
    """Events of these vocabulary roles (whatever their spelling)."""
    return ev.filter(voc.has_role(roles))


def _num(value: Any, default: float = 0.0) -> float:
    """A polars aggregate (typed loosely by polars) as a float; None -> default."""
    return default if value is None else float(value)


def _observed(values: Any) -> Distribution:
    """Empirical distribution of observed values (array or Series); ``unknown`` when there are none."""
    arr = np.asarray(values.to_numpy() if isinstance(values, pl.Series) else values, dtype=float)
    return Distribution.from_values(arr) if arr.size else Distribution.unknown()


def _mode(series: pl.Series) -> int | None:
    s = series.drop_nulls()
    if s.is_empty():
        return None
    counts = s.value_counts(sort=True)
    return int(counts[s.name][0])


def dataset_files(events: pl.DataFrame, data_dirs: list[str] | None) -> pl.DataFrame:
    """Dataset files with their roles, from :func:`classify_files`."""
    from dlreplay.analyze.files import classify_files

    files = classify_files(events, data_dirs=data_dirs)
    return files.filter(pl.col("role") == "dataset")


#: Side files holding an indexed-binary file's record index, by suffix: DLIO 2.0's generator
#: writes ``<file>.off.idx`` and ``<file>.sz.idx``, dlreplay's ``<file>.idx``.
INDEX_SUFFIXES = {".off.idx": "dlio", ".sz.idx": "dlio", ".idx": "dlreplay"}


#: Calls that map a file into memory (its reads are then page faults, which a tracer does not see).
MMAP_OPS = ("mmap", "mmap64")


def _mapped_dataset(events: pl.DataFrame, data_dirs: list[str] | None) -> pl.DataFrame:
    """Dataset files of a job whose loader maps them (``mmap``) instead of reading: files
    mapped more than once or by more than one process, under ``data_dirs`` when given. One
    column, ``file``; empty when there are none."""
    maps = events.filter(pl.col("name").is_in(MMAP_OPS) & pl.col("file").is_not_null())
    if data_dirs:
        maps = maps.filter(pl.any_horizontal(pl.col("file").cast(pl.String).str.starts_with(d.rstrip("/") + "/")
                                             for d in data_dirs))
    if maps.is_empty():
        return pl.DataFrame(schema={"file": pl.String})
    per = maps.group_by("file").agg(pl.len().alias("n"), pl.col("pid").n_unique().alias("procs"))
    return per.filter((pl.col("n") > 1) | (pl.col("procs") > 1)).select(pl.col("file").cast(pl.String)).sort("file")


def _record_indexes(paths: list[str], facts: _Facts) -> tuple[list[str], str | None]:
    """``paths`` without the record-index side files of other paths among them, and the index
    style they show (None: none). An index is read when a reader starts, not per sample: as
    dataset files it made a DLIO indexed-binary dataset of 8 files into 24, and its 64-byte
    reads a third of the read sizes."""
    have = set(paths)
    found: dict[str, str] = {}  # side file -> its suffix
    for p in paths:
        suffix = next((x for x in INDEX_SUFFIXES if p.endswith(x) and p[:-len(x)] in have), None)
        if suffix is not None:
            found[p] = suffix
    if not found:
        return paths, None
    suffixes = sorted(set(found.values()))
    style = "dlio" if any(INDEX_SUFFIXES[x] == "dlio" for x in suffixes) else "dlreplay"
    facts.notes.append(f"{len(found)} record-index file(s) ({', '.join(suffixes)}) beside the data files: each "
                       f"one's index ({'DLIO' if style == 'dlio' else 'dlreplay'}'s), not samples")
    return [p for p in paths if p not in found], style


def _homogeneous(paths: list[str], facts: _Facts) -> list[str]:
    """Keep the files of the dominant extension when it covers >= 90 % of them.

    Datasets are homogeneous; a stray file under the data dir (a generator's marker,
    an index) would otherwise count as a sample file.
    """
    hidden = [p for p in paths if PurePosixPath(p).name.startswith(".")]
    if hidden and len(hidden) < len(paths):  # markers and temporary files (.done, .lock), never samples
        facts.notes.append(f"ignored {len(hidden)} hidden file(s) under the dataset: "
                           + ", ".join(PurePosixPath(h).name for h in sorted(hidden)[:5]))
        paths = [p for p in paths if p not in set(hidden)]
    exts = pl.Series("ext", [PurePosixPath(p).suffix.lower() for p in paths])
    counts = exts.value_counts(sort=True)
    top, n = counts[0, 0], counts[0, 1]
    if n == len(paths) or n < 0.9 * len(paths):
        return paths
    kept = [p for p, e in zip(paths, exts.to_list(), strict=True) if e == top]
    dropped = sorted(set(paths) - set(kept))
    facts.notes.append(
        f"ignored {len(dropped)} non-{top or 'extensionless'} file(s) under the dataset: "
        + ", ".join(PurePosixPath(d).name for d in dropped[:5])
    )
    return kept


def infer_format(paths: list[str], reads: pl.DataFrame) -> tuple[str, str, str]:
    """Format from the dataset files' extensions; else from the read pattern.

    Pattern fallback: a read of the last 22 bytes (zip end-of-central-directory)
    means zip (npz); an 8-byte read at offset 0 then reads far into the file means
    HDF5's superblock probe.
    """
    exts = pl.Series([PurePosixPath(p).suffix.lower() for p in paths])
    fmt = exts.replace_strict(EXTENSION_FORMATS, default=None, return_dtype=pl.Utf8).drop_nulls()
    if not fmt.is_empty():
        best = fmt.value_counts(sort=True)[0, 0]
        return str(best), f"file extension of {fmt.len()} of {len(paths)} dataset files", "measured"
    if reads.filter(pl.col("size") == 22).height > 0:
        return "npz", "read pattern: zip end-of-central-directory reads (22 B)", "inferred"
    if reads.filter((pl.col("offset") == 0) & (pl.col("size") == 8)).height > 0:
        return "hdf5", "read pattern: 8-byte superblock probe at offset 0", "inferred"
    return "raw", "no known extension or read pattern", "default"


_Frame = TypeVar("_Frame", pl.DataFrame, pl.LazyFrame)


def _assign_items(reads: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
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


def _preprocess_time(tagged_io: pl.DataFrame, items: pl.DataFrame) -> Distribution:
    """Per-sample CPU time in the loader worker (s): item duration minus the POSIX time inside it.

    DLIO's ``preprocess_time``: decoding, conversion, augmentation. ``tagged_io`` is the
    dataset I/O with its enclosing item (:func:`_assign_items`). Unknown without items.
    """
    if items.is_empty():
        return Distribution.unknown()
    tagged = tagged_io.filter(pl.col("item_ts").is_not_null())
    io_time = tagged.group_by("pid", "item_ts").agg(pl.col("dur").sum().alias("io_us"))
    per_item = (
        items.select("pid", pl.col("ts").alias("item_ts"), "dur")
        .join(io_time, on=["pid", "item_ts"], how="left")
        .select(((pl.col("dur") - pl.col("io_us").fill_null(0)).clip(lower_bound=0) * _US).alias("s"))
    )
    return _observed(per_item["s"])


def _preprocess_cpu(items: pl.DataFrame) -> Distribution | None:
    """Per-sample CPU time of the loader worker (s), the library's read and decode included:
    ``data/item`` events' ``cpu_time`` (µs, written by dlreplay capture); None when the
    trace did not measure it."""
    if items.is_empty() or "cpu_time" not in items.columns:
        return None
    cpu = items["cpu_time"].drop_nulls()
    if cpu.len() < max(1, items.height // 2):
        return None
    return _observed(cpu.cast(pl.Float64) * _US)


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


def _file_ends(io: _Frame) -> _Frame:
    """Per file of ``io``: the largest byte position seen (the end of a read, or an lseek
    result), where one is (the first case of :func:`_file_sizes`)."""
    ends = io.select(
        "file",
        pl.when(pl.col("name").is_in(READ_OPS))
        .then(pl.col("offset") + pl.col("size"))
        .when(pl.col("name").is_in(SEEK_OPS))
        .then(pl.col("ret"))
        .otherwise(None)
        .alias("end"),
    )
    return ends.group_by("file").agg(pl.col("end").max().alias("size")).filter(pl.col("size") > 0)


def _file_sizes(io: _Frame, sized: _Frame | None = None) -> _Frame:
    """Per file: the largest byte position seen (end of a read, or an lseek result); for a file
    with neither (a trace without offsets and no seek to its end), the most bytes one process
    read between an open of it and the next (a file read whole, as Pillow reads an image).

    ``io`` needs the opens as well as the reads and seeks for the second case; eager or lazy.
    ``sized``: :func:`_file_ends` of ``io``, when already computed."""
    if sized is None:
        sized = _file_ends(io)
    rest = io.join(sized.select("file"), on="file", how="anti")
    per_open = (
        rest.filter(pl.col("name").is_in(OPEN_OPS) | pl.col("name").is_in(READ_OPS))
        .sort("ts")
        .with_columns(pl.col("name").is_in(OPEN_OPS).cum_sum().over("pid", "file").alias("__open"))
        .filter(pl.col("name").is_in(READ_OPS) & (pl.col("__open") > 0))
        .group_by("pid", "file", "__open").agg(pl.col("size").sum().alias("size"))
        .group_by("file").agg(pl.col("size").max())
        .filter(pl.col("size") > 0)
    )
    return pl.concat([sized, per_open.select("file", "size")], how="vertical_relaxed")


def _dlio_reader(annotated: pl.DataFrame) -> str | None:
    """DLIO's reader class when the trace's sample reads are DLIO's (``reader/NPZReader.read_index``)."""
    from dlreplay.dliogen import DLIO_READER_FORMATS

    reads = annotated.filter((pl.col("role") == voc.SAMPLE_READ) & (pl.col("cat") == "reader"))
    classes = {str(n).split(".")[0] for n in reads["name"].unique().to_list()}
    known = sorted(classes & set(DLIO_READER_FORMATS))
    return known[0] if len(known) == 1 else None


def _evaluation(ev: pl.DataFrame, train_events: pl.DataFrame, epochs: pl.DataFrame, main_pid: int | None,
                train_files: set[str], facts: _Facts) -> tuple[Evaluation | None, int, int]:
    """(train.evaluation, dataset.num_files_eval, reader.batch_size_eval) from the events of the
    evaluation passes (:func:`~.trace.vocabulary.evaluation_phase`): when they run (the
    training epochs that end before each), their steps (the consumer's ``compute`` events in
    them) and step time, the samples per step (item events), and the files they read."""
    spans = train_events.filter(pl.col("role") == voc.EVALUATE)
    if main_pid is not None:
        spans = spans.filter(pl.col("pid") == main_pid)
        ev = ev.filter((pl.col("pid") == main_pid) | (pl.col("ppid") == main_pid))
    if spans.is_empty():
        return None, 0, 1
    spans = spans.sort("ts").select(pl.col("ts").alias("v0"), (pl.col("ts") + pl.col("dur").fill_null(0)).alias("v1"))
    ends = sorted((epochs.filter(pl.col("pid") == main_pid) if main_pid is not None else epochs)["end"].to_list())
    after = [sum(1 for e in ends if e <= v0) for v0 in spans["v0"].to_list()]  # epochs done before each pass
    every = int(np.median(np.diff(after))) if len(after) > 1 and min(np.diff(after)) > 0 else 1
    first = max(after[0], 1) if after else 1
    compute = ev.filter(pl.col("role") == voc.COMPUTE)
    per_pass = compute.sort("ts").join_asof(spans, left_on="ts", right_on="v0", strategy="backward") \
        .group_by("v0").len()["len"]
    steps = int(_num(per_pass.median())) if per_pass.len() else 0
    items = ev.filter(pl.col("role") == voc.ITEM)
    samples = items.height / max(len(after), 1)
    batch = max(1, round(samples / steps)) if steps and items.height else 1
    reads = ev.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("file").is_not_null())
    files = set(reads["file"].cast(pl.String).unique().to_list()) - train_files
    # the evaluation set sits beside the training set (DLIO: <data>/valid beside <data>/train)
    root = str(PurePosixPath(os.path.commonpath(sorted(train_files))).parent) if train_files else "/"
    nfiles = len({f for f in files if f.startswith(root.rstrip("/") + "/")})
    times = compute["dur"].drop_nulls().to_numpy() * _US
    comp = Distribution.from_values(times) if times.size else Distribution.fixed(0.0)
    what = f"{len(after)} evaluation pass(es) (evaluate spans)"
    facts.put("train.evaluation", f"{what}: after training epochs {after}; {steps} step(s) each (compute events)",
              "measured")
    facts.put("dataset.num_files_eval", f"files read in the evaluation passes only: {nfiles}", "measured")
    facts.put("reader.batch_size_eval", f"{items.height} samples (item events) over {len(after)} x {steps} steps"
              if steps and items.height else "no item or compute events in the evaluation passes: 1",
              "measured" if steps and items.height else "default")
    facts.notes.append(f"{what} modelled apart: their loop, workers and files are not training's")
    return (Evaluation(every_n_epochs=max(every, 1), after_epoch=first, steps=steps or None, computation_time=comp),
            nfiles, batch)


def _dlio_torch(annotated: pl.DataFrame) -> bool:
    """True when the trace's loader is DLIO's PyTorch one (events of its ``TorchDataset`` or
    ``TorchDataLoader`` classes)."""
    names = annotated["name"].cast(pl.String).unique()
    return bool(names.str.starts_with("TorchDataset.").any() or names.str.starts_with("TorchDataLoader.").any())


def _shuffled(items: pl.DataFrame) -> bool | None:
    """True when samples are visited out of index order within epochs.

    Workers interleave batches, so even an unshuffled loader is not perfectly
    ordered in time: call it shuffled when under 75 % of successive samples
    (by start time) increase.
    """
    s = items.filter(pl.col("sample_index").is_not_null()).sort("ts")
    if s.height < 4:
        return None
    inc = s.select((pl.col("sample_index").diff() > 0).mean()).item()
    return bool(inc is not None and inc < 0.75)


def _start_method(workers: pl.DataFrame, consumers: list[int]) -> tuple[str | None, str]:
    """How the loader workers started, from DFTracer's trace file names (``-fork`` for a process
    forked by a traced one, ``-preload`` for a new program: a spawned interpreter) and their
    parents: forked by the consumer (fork), forked by another process (forkserver), or new
    interpreters (spawn). (None, why) when the file names do not tell."""
    if "source" not in workers.columns or workers.is_empty():
        return None, ""
    procs = workers.group_by("pid").agg(pl.col("source").first().cast(pl.String), pl.col("ppid").first())
    kind = procs["source"].str.extract(r"-(fork|preload)\.pfw", 1)
    if kind.null_count() == kind.len():
        return None, ""
    forked = int((kind == "fork").sum())
    spawned = int((kind == "preload").sum())
    n = procs.height
    if spawned > forked:
        return "spawn", f"{spawned} of {n} worker processes are new programs (DFTracer '-preload' files)"
    by_consumer = int(procs.filter(kind == "fork")["ppid"].is_in(consumers).sum())
    if by_consumer * 2 >= forked:
        return "fork", f"{by_consumer} of {n} worker processes forked by the training process ('-fork' files)"
    return "forkserver", f"{forked - by_consumer} of {n} worker processes forked by another process ('-fork' files)"


def _batch_tensors(fetch: pl.DataFrame) -> int | None:
    """Tensors per batch (the median over batch fetches that recorded it), or None."""
    if "tensors" not in fetch.columns:
        return None
    got = fetch.filter((pl.col("batch_size").fill_null(1) > 0) & (pl.col("tensors") > 0))["tensors"]
    return int(round(float(got.median()))) if got.len() else None  # type: ignore[arg-type]


def distill(
    events: pl.DataFrame,
    *,
    manifest: dict[str, Any] | None = None,
    data_dirs: list[str] | None = None,
    source: str | None = None,
    fingerprint: dict[str, Any] | None = None,
    fingerprint_origin: str | None = None,
) -> WorkloadModel:
    """Infer a :class:`WorkloadModel` from an event table (see module doc).

    ``dataset.layout`` comes from *fingerprint* (a dataset fingerprint document), else
    from ``dataset-fingerprint.json`` in the trace directory *source*, else from what
    the reads show (:mod:`dlreplay.analyze.layout`).
    """
    if events.is_empty():
        raise DistillError(
            f"{source or 'the trace'} has no events; capture the job again (`dlreplay capture`)."
        )
    facts = _Facts()
    events = voc.ensure_roles(events)
    # evaluation passes (their own loader, files and steps) are modelled apart; the rest of
    # distill sees the training phase only
    in_eval = voc.evaluation_phase(events)
    eval_events = events.filter(in_eval) if in_eval.any() else None
    if eval_events is not None:
        events = events.filter(~in_eval)
    data_dirs = data_dirs or (manifest or {}).get("data_dirs") or None
    has_files = events["file"].drop_nulls().len() > 0
    if not has_files:
        raise DistillError(
            f"{source or 'the trace'} has no file names (no DFTracer FH records): recapture with "
            "DFTRACER_INC_METADATA=1 (dlreplay capture sets it)."
        )
    ds_files = dataset_files(events, data_dirs)
    if ds_files.is_empty() and data_dirs and fingerprint is not None:
        # --data-dir names where the dataset is now (a trace captured elsewhere): it served the
        # fingerprint; the trace's own dataset files are found by how they were read
        ds_files = dataset_files(events, None)
        if not ds_files.is_empty():
            facts.notes.append(f"no file of the trace is under {', '.join(data_dirs)}: the dataset was found by "
                               f"its reads; the directory was used for the dataset fingerprint")
    mapped = False
    if ds_files.is_empty():
        ds_files = _mapped_dataset(events, data_dirs)
        mapped = not ds_files.is_empty()
        if mapped:
            facts.notes.append(
                f"no dataset file was read: the samples' {ds_files.height} files were memory-mapped (mmap) by the "
                "loader's workers, whose page faults a tracer does not see (DLIO 2.0's mmap_indexed_binary reader "
                "maps each file and takes a view of the record, never touched); the replay maps them as well "
                "(reader.memory_map)")
    if ds_files.is_empty():
        raise DistillError(
            f"{source or 'the trace'} has no dataset reads: no file was read by data-loader workers or "
            "repeatedly. Pass --data-dir with the dataset's path, or check the capture's --data-dir."
        )
    paths, index_style = _record_indexes(ds_files["file"].to_list(), facts)
    paths = _homogeneous(paths, facts)
    io = events.filter(pl.col("file").is_in(paths) & pl.col("cat").is_in(["POSIX", "STDIO"]))
    reads = io.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0))

    annotated = events.filter(pl.col("role").is_not_null())
    fetch = _role(annotated, voc.FETCH)
    items = _role(annotated, voc.ITEM)
    epochs_ev = voc.epoch_spans(annotated)
    saves = _role(annotated, voc.CKPT_SAVE)
    # one row per training step of each consumer, whichever convention annotated the loop
    loop = voc.training_steps(annotated)
    batches = loop
    has_loader = loop.height > 0
    consumers = loop["pid"].unique().sort().to_list() if has_loader else []
    main_pid = _mode(loop["pid"]) if has_loader else None
    # no training-loop events (DFTracer's preload alone): the loop inferred from the I/O
    posix = None if has_loader else infer_posix_loop(io, traced_pids=set(events["pid"].unique().to_list()),
                                                      pauses=_checkpoint_writes(events, data_dirs))
    if posix is not None and posix.sample_files and len(posix.sample_files) < len(paths):
        stray = sorted(set(paths) - set(posix.sample_files))
        facts.notes.append(f"left out {len(stray)} file(s) not visited like the samples: "
                           + ", ".join(PurePosixPath(d).name for d in stray[:5]))
        paths = posix.sample_files
        io = io.filter(pl.col("file").is_in(paths))
        reads = reads.filter(pl.col("file").is_in(paths))

    # ---------------------------------------------------------------- dataset
    fmt, how, conf = infer_format(paths, reads)
    facts.put("dataset.format", how, conf)
    facts.put("dataset.num_files", "distinct dataset files read", "measured")
    sizes = _file_sizes(io)
    file_size = _observed(sizes["size"])
    facts.put(
        "dataset.file_size",
        "largest byte position read or seeked per file",
        "measured" if sizes.height else "default",
    )

    tagged_io = _assign_items(io, items)  # every dataset I/O call with its enclosing sample, once
    # the calls that touch a sample: its reads, or (a mapped dataset) the maps of its file
    tagged = tagged_io.filter(pl.col("name").is_in(MMAP_OPS) if mapped else
                              pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0))
    spf: int = 1
    if items.height and tagged["item_index"].drop_nulls().len():
        per_file = (
            tagged.filter(pl.col("item_index").is_not_null())
            .group_by("file")
            .agg(pl.col("item_index").n_unique().alias("samples"))
        )
        spf = int(_num(per_file["samples"].median(), 1))
        facts.put(
            "dataset.num_samples_per_file",
            "distinct sample indices read per file (item events)",
            "measured",
        )
    elif posix is not None and posix.samples_per_file.value:
        spf = int(posix.samples_per_file.value)
        facts.put("dataset.num_samples_per_file", posix.samples_per_file.evidence, "inferred")
    else:
        facts.put(
            "dataset.num_samples_per_file", "no item events: one sample per file assumed", "default"
        )
    if sizes.height:
        record = Distribution.from_values(sizes["size"].to_numpy() / spf)
        facts.put(
            "dataset.record_length",
            "file size / samples per file",
            "measured" if items.height else "inferred",
        )
    else:
        per_read = reads["size"].to_numpy()
        record = _observed(per_read)
        facts.put("dataset.record_length", "read sizes (no file sizes seen)", "inferred")
    dlio_reader = _dlio_reader(annotated)
    parents = {str(PurePosixPath(p).parent) for p in paths}
    folder = os.path.commonpath(paths) if len(paths) > 1 else str(PurePosixPath(paths[0]).parent)
    if len(paths) > 1 and folder in paths:
        folder = str(PurePosixPath(folder).parent)
    facts.put("dataset.num_subfolders", "distinct parent directories of dataset files", "measured")
    dataset = Dataset(
        format=fmt,
        num_files=len(paths),
        num_samples_per_file=spf,
        record_length=record,
        file_size=file_size,
        num_subfolders=len(parents) if len(parents) > 1 else 0,
        data_folder=folder,
        layout=_dataset_layout(fmt, paths, spf, reads, record, fingerprint, fingerprint_origin, source, facts,
                               dlio_reader, sizes["size"].to_list()),
    )
    if fmt == "indexed_binary" and index_style is not None:
        dataset = replace(dataset, layout=replace(dataset.layout, index=index_style))
        facts.put("dataset.layout.index", f"the data files' record-index side files ({index_style}'s naming)",
                  "measured")
    if dlio_reader is not None and (dataset.layout.source == "inferred" or fingerprint is not None):
        from dlreplay.dliogen import resized_sample_bytes

        resized = resized_sample_bytes(fmt, dataset.layout)
        if resized:
            dataset = replace(dataset, record_length_resize=resized)
            facts.put("dataset.record_length_resize",
                      f"DLIO's {dlio_reader} hands over its resized_image for every sample: max_dimension^2 = "
                      f"{resized:,} B, the sample's side as DLIO sizes it (a record_length_resize in its config is "
                      f"not visible in a trace)", "inferred")
    per_record = _layout_record_length(dataset.layout, fmt)
    if per_record is not None:
        dataset = replace(dataset, record_length=per_record)
        facts.put("dataset.record_length", "TFRecord payload / CSV line lengths of the sampled files (dataset "
                                           "fingerprint)", "measured")

    # ---------------------------------------------------------------- reader
    if has_loader:
        batch_size, how = _batch_size(fetch, items, loop, epochs_ev, main_pid)
        facts.put("reader.batch_size", how, "measured" if batch_size else "default")
        batch_size = batch_size or 1
        worker_items = items.filter(~pl.col("pid").is_in(consumers))
        if worker_items.height:
            read_threads = _workers_per_rank(worker_items, epochs_ev, consumers)
            facts.put(
                "reader.read_threads",
                "most worker processes (with item events) in one epoch",
                "measured",
            )
            n_epochs_seen = int(loop.filter(pl.col("pid") == main_pid)["epoch"].n_unique())
            if n_epochs_seen >= 2:
                per_rank = (
                    worker_items.filter(pl.col("ppid") == main_pid)["pid"].n_unique()
                    or worker_items["pid"].n_unique()
                )
                persistent = per_rank <= read_threads
                facts.put(
                    "reader.persistent_workers",
                    "worker pids reused across epochs"
                    if persistent
                    else "new worker pids every epoch",
                    "measured",
                )
            start_method, how = _start_method(worker_items, consumers)
            if start_method is not None:
                facts.put("reader.multiprocessing_context", how, "inferred")
        else:
            read_threads = 0
            facts.put(
                "reader.read_threads", "items read in the consumer process (no workers)", "measured"
            )
    else:
        assert posix is not None
        batch_size = int(posix.batch_size.value or 1)
        facts.put("reader.batch_size", posix.batch_size.evidence if posix.batch_size.value else
                  f"no fetch events (POSIX-only trace), and {posix.batch_size.evidence}",
                  "inferred" if posix.batch_size.value else "default")
        read_threads = int(posix.read_threads.value or 0)
        facts.put("reader.read_threads", posix.read_threads.evidence, "inferred")

    if "reader.multiprocessing_context" not in facts.fields:
        start_method = None
        facts.put("reader.multiprocessing_context", "no worker process files to tell: fork (PyTorch's default "
                  "on Linux)", "default")
    shuffled = _shuffled(items) if items.height else None
    if "reader.persistent_workers" not in facts.fields:
        persistent = False
        facts.put(
            "reader.persistent_workers",
            "needs >= 2 epochs with worker events (PyTorch default)",
            "default",
        )
    shuffle_mode = "seed" if shuffled else "off"
    facts.put(
        "reader.sample_shuffle",
        "order of sample indices in item events" if shuffled is not None else "no item events",
        "measured" if shuffled is not None else "default",
    )
    facts.put(
        "reader.file_shuffle",
        "follows sample order (one decision per job)" if shuffled is not None else "no item events",
        "inferred" if shuffled is not None else "default",
    )

    samples_read = (
        items.height if items.height else max(io.filter(pl.col("name").is_in(OPEN_OPS)).height, 1)
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
    open_per_sample = meta.opens is not None and meta.opens >= 0.5
    facts.put(
        "reader.open_per_sample",
        "dataset opens per sample >= 0.5",
        "measured" if items.height else "inferred",
    )
    preprocess = _preprocess_time(tagged_io, items)
    facts.put(
        "reader.preprocess_time",
        "item duration minus its POSIX time, per sample" if preprocess.is_known else "no item events",
        "measured" if preprocess.is_known else "default",
    )
    preprocess_cpu = _preprocess_cpu(items)
    if preprocess_cpu is not None:
        facts.put("reader.preprocess_host_cpu", "CPU time of the loader worker process in each item "
                  "(data/item cpu_time), per sample", "measured")
    else:
        facts.put("reader.preprocess_host_cpu", "not measured by this trace: 0, the preprocessing is a "
                  "sleep (as DLIO's)", "default")
    transfer = _observed(reads["size"])
    facts.put("reader.transfer_size", "sizes of read calls on dataset files", "measured")
    buffering = "buffered"
    if fmt in PYTHON_FILE_FORMATS and reads.height:
        # Python's buffered files read >= 4-8 KiB at a time; an unbuffered handle passes the library's
        # own small reads (zip headers, JPEG markers: a few bytes each) straight to read(2)
        median = _num(reads["size"].median())
        buffering = "unbuffered" if median < UNBUFFERED_MEDIAN_READ else "buffered"
        facts.put("reader.file_buffering", f"median dataset read {median:.0f} B "
                  f"({'<' if buffering == 'unbuffered' else '>='} {UNBUFFERED_MEDIAN_READ} B)", "inferred")
    pattern = access_pattern(reads)
    facts.put(
        "reader.access_pattern",
        "Darshan sequential/consecutive over reads per process and file",
        "measured",
    )
    facts.put("reader.prefetch_factor", "not visible in a trace (PyTorch default)", "default")
    batch_tensors = _batch_tensors(fetch)
    facts.put("reader.batch_tensors", "tensors per batch of the consumer's fetches (median)" if batch_tensors
              else "not in this trace: 1", "measured" if batch_tensors else "default")
    reader = Reader(
        data_loader="pytorch" if has_loader else "native",
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
        preprocess_host_cpu=preprocess_cpu if preprocess_cpu is not None else Distribution.fixed(0.0),
        transfer_size=transfer,
        access_pattern=pattern,
        metadata_per_sample=meta,
    )
    if mapped and fmt == "indexed_binary":
        reader = replace(reader, memory_map=True)
        facts.put("reader.memory_map", "the dataset files were mapped (mmap) and never read", "measured")
    if dlio_reader is not None and has_loader and _dlio_torch(annotated):
        # DLIO 2.0's TorchDataLoader: DataLoader(sampler=dlio_sampler, drop_last=True); a trace holds
        # no config, but its events name DLIO's classes
        reader = replace(reader, sample_order="dlio", drop_last=True)
        facts.put("reader.sample_order", f"DLIO's PyTorch sampler: the trace's events are DLIO's "
                  f"(TorchDataset, {dlio_reader})", "inferred")
        facts.put("reader.drop_last", "DLIO's PyTorch loader sets drop_last=True", "inferred")

    # ---------------------------------------------------------------- train
    if has_loader and main_pid is not None:
        mine = epochs_ev.filter(pl.col("pid") == main_pid)
        n_epochs = mine.height if mine.height else int(loop.filter(pl.col("pid") == main_pid)["epoch"].n_unique())
        n_epochs = max(n_epochs, 1)
        facts.put(
            "train.epochs",
            f"epochs of the consumer ({mine['basis'][0]})" if mine.height else "epoch numbers of its steps",
            "measured",
        )
        per_epoch_steps = loop.filter(pl.col("pid") == main_pid).group_by("epoch").len()["len"]
        steps_per_epoch = int(_num(per_epoch_steps.median())) or None
        # per rank, as the replay shares the samples out (replay.engine.steps_per_epoch)
        size, b = max(len(consumers), 1), max(batch_size, 1)
        if reader.sample_order == "dlio":  # whole batches only, floor(samples / batch / ranks)
            natural = dataset.num_files * spf // b // size
        else:
            share = (dataset.num_files // size) * spf
            natural = share // b if reader.drop_last else -(-share // b)
        if steps_per_epoch == natural:
            steps_per_epoch = None
        facts.put(
            "train.steps_per_epoch", "training steps per epoch (null = full passes)", "measured"
        )
        mine_steps = loop.filter(pl.col("pid") == main_pid).sort("ts")
        timing = timing_model(
            mine_steps,
            epochs_ev.filter(pl.col("pid") == main_pid),
            fetch.filter((pl.col("pid") == main_pid) & (pl.col("batch_size").fill_null(1) == 0)),
            saves.filter(pl.col("pid") == main_pid),
        )
        compute = timing.computation_time if timing else Distribution.unknown()
        facts.put(
            "train.computation_time",
            ("consumer compute events" if mine_steps["basis"][0] == "compute events" else
             "consumer loop bodies minus checkpoint time") + ", warm-up steps excluded"
            if compute.is_known
            else "fewer than two training steps",
            "measured" if compute.is_known else "default",
        )
        if timing is not None:
            facts.put("train.warmup_computation_time", "the run's first step and the leading steps longer "
                      f"than {WARMUP_FACTOR:g}x the steady median", "measured")
            facts.put("train.epoch_warmup_computation_time", "median per position of later epochs' leading "
                      f"steps longer than {WARMUP_FACTOR:g}x the steady median", "measured")
            facts.put("train.epoch_end_time", "consumer time from an epoch's end to the next epoch's start, "
                      "checkpoint saves excluded", "measured" if timing.epochs >= 2 else "default")
            if len(timing.warmup_computation_time) > 1:
                facts.notes.append(
                    f"{len(timing.warmup_computation_time)} warm-up step(s) "
                    f"({sum(timing.warmup_computation_time):.3f} s) modelled apart from computation_time")
            facts.notes.append(timing.describe())
        if timing is not None and timing.computation_host_cpu is not None:
            facts.put("train.computation_host_cpu", "CPU time of the training process (all its threads) in its "
                      "steady steps' compute, measured by the capture", "measured")
            facts.put("train.computation_host_threads", "median over those steps of the process's CPU time over "
                      "its training thread's", "measured")
        else:
            facts.put("train.computation_host_cpu", "not measured by this trace: 0, the compute is a pure sleep "
                      "(DLIO's model of an accelerator)", "default")
    else:
        timing = None
        assert posix is not None
        n_epochs = int(posix.epochs.value or _posix_epochs(io, paths))
        steps_per_epoch = None
        facts.put("train.epochs", posix.epochs.evidence, "inferred")
        if posix.compute_samples:
            compute = Distribution.from_values(np.asarray(posix.compute_samples))
            facts.put("train.computation_time", posix.computation_time.evidence, "inferred")
        else:
            compute = Distribution.fixed(0.0)
            facts.put("train.computation_time",
                      f"no data-loader events, and {posix.computation_time.evidence}", "default")
        facts.put("train.computation_host_cpu", "not measured by a POSIX-only trace: 0, the compute is a pure "
                  "sleep (DLIO's model of an accelerator)", "default")
    if not compute.is_known:
        compute = Distribution.fixed(0.0)
    train = Train(epochs=n_epochs, steps_per_epoch=steps_per_epoch, computation_time=compute)
    if eval_events is not None:
        evaluation, eval_files, eval_batch = _evaluation(eval_events, events, epochs_ev, main_pid, set(paths), facts)
        if evaluation is not None:
            train = replace(train, evaluation=evaluation)
            dataset = replace(dataset, num_files_eval=eval_files)
            reader = replace(reader, batch_size_eval=eval_batch)
    if timing is not None:
        train = replace(
            train,
            warmup_computation_time=timing.warmup_computation_time,
            epoch_warmup_computation_time=timing.epoch_warmup_computation_time,
            epoch_end_time=timing.epoch_end_time,
        )
        if timing.computation_host_cpu is not None:
            train = replace(train, computation_host_cpu=timing.computation_host_cpu,
                            computation_host_threads=timing.computation_host_threads or 1)

    # ---------------------------------------------------------------- checkpoint
    checkpoint = _checkpoint(
        events, saves, batches.filter(pl.col("pid") == main_pid) if main_pid else batches, facts,
        epochs_ev.filter(pl.col("pid") == main_pid) if main_pid else None,
    )

    # ---------------------------------------------------------------- processes
    ranks = max(len(consumers), 1)
    if consumers:
        facts.put("processes.ranks", "processes with fetch events", "measured")
    elif posix is not None and posix.consumers > 1:
        ranks = posix.consumers
        facts.put("processes.ranks", f"{ranks} processes whose worker processes read the samples", "inferred")
    else:
        facts.put("processes.ranks", "single process assumed", "default")
    processes = Processes(ranks=ranks, workers_per_rank=read_threads)

    provenance = Provenance(
        source_trace=source,
        capture_host=(manifest or {}).get("host"),
        dlreplay_version=dlreplay.__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        fields=facts.fields,
        notes=facts.notes,
    )
    return WorkloadModel(
        dataset=dataset,
        reader=reader,
        train=train,
        checkpoint=checkpoint,
        processes=processes,
        provenance=provenance,
    )


def _layout_record_length(layout: Layout, fmt: str) -> Distribution | None:
    """Bytes per sample from the fingerprint where a file's records differ (TFRecord payloads,
    CSV lines): the file size / samples per file would make every record alike."""
    if fmt == "tfrecord" and layout.record_bytes is not None:
        return layout.record_bytes
    if fmt == "csv" and layout.tables and layout.tables[0].line_bytes is not None:
        return layout.tables[0].line_bytes
    return None


def _dataset_layout(fmt: str, paths: list[str], spf: int, reads: pl.DataFrame, record: Distribution,
                    fingerprint: dict[str, Any] | None, origin: str | None, source: str | None,
                    facts: _Facts, dlio_reader: str | None = None, file_sizes: list[float] | None = None) -> Layout:
    """``dataset.layout``: the fingerprint's, else (a DLIO trace, *dlio_reader* naming its reader
    class) what DLIO's generator writes for the files' sizes, else inferred from reads
    (provenance into *facts*)."""
    from dlreplay.analyze.layout import (
        infer_dlio_layout,
        infer_layout,
        layout_from_fingerprint,
        resolve_fingerprint,
    )

    where = origin or "given to distill"
    if fingerprint is None and source and os.path.isdir(source):
        try:
            fingerprint, where = resolve_fingerprint(source)
        except DlreplayError as exc:
            facts.notes.append(f"dataset fingerprint ignored: {exc}")
    result = layout_from_fingerprint(fingerprint, fmt, paths, spf, where or "") if fingerprint else None
    if fingerprint and result is None:
        facts.notes.append(f"the dataset fingerprint ({where}) has no {fmt} files: layout inferred from the trace")
    if result is None and dlio_reader is not None:
        result = infer_dlio_layout(fmt, dlio_reader, spf, file_sizes)
    if result is None:
        result = infer_layout(fmt, reads, record.mean)
    for path, (how, confidence) in result.fields.items():
        facts.put(path, how, confidence)
    facts.notes.extend(result.notes)
    return result.layout


#: A leading step longer than this many times the median step is warm-up (JIT, allocator, caches).
WARMUP_FACTOR = 3.0


def warmup_steps(step_seconds: np.ndarray | list[float]) -> int:
    """How many leading steps are warm-up: the first, plus the leading run of steps
    longer than ``WARMUP_FACTOR`` x the median step."""
    values = np.asarray(step_seconds, dtype=float)
    if values.size < 2:
        return min(values.size, 1)
    slow = values[1:] > WARMUP_FACTOR * float(np.median(values))
    return 1 + (int(np.argmin(slow)) if not slow.all() else 0)


def _compute_values(values: np.ndarray, facts: _Facts | None = None) -> Distribution:
    """Per-step compute times (s) of one consumer in time order, warm-up excluded (see
    :func:`warmup_steps`)."""
    if values.size < 2:
        return Distribution.unknown()
    warm = warmup_steps(values)
    if facts is not None and warm > 1:
        facts.notes.append(
            f"excluded {warm} warm-up step(s) ({values[:warm].sum():.3f} s) from computation_time"
        )
    return Distribution.from_values(values[warm:])


def _batch_size(fetch: pl.DataFrame, items: pl.DataFrame, loop: pl.DataFrame, epochs: pl.DataFrame,
                main_pid: int | None) -> tuple[int | None, str]:
    """Samples per batch: the fetch events' ``batch_size``; else the consumer's samples per
    step (item events in its workers or itself, per epoch, over its steps in that epoch)."""
    sized = fetch.filter(pl.col("batch_size") > 0)
    if sized.height:
        return _mode(sized["batch_size"]), "most common batch size of fetch events"
    mine = loop.filter(pl.col("pid") == main_pid)
    its = items.filter((pl.col("pid") == main_pid) | (pl.col("ppid") == main_pid))
    if its.is_empty() and loop["pid"].n_unique() == 1:
        its = items
    if its.is_empty() or mine.is_empty():
        return None, "no fetch sizes and no item events"
    spans = epochs.filter(pl.col("pid") == main_pid).select(pl.col("ts").alias("e_ts"), "epoch").sort("e_ts")
    its = its.drop("epoch")  # a worker's own epoch numbers are its iterator's (persistent workers: stale)
    if spans.height:
        its = its.sort("ts").join_asof(spans, left_on="ts", right_on="e_ts", strategy="backward")
        its = its.with_columns(pl.col("epoch").fill_null(spans["epoch"][0]))
    else:
        its = its.with_columns(pl.lit(0, pl.Int64).alias("epoch"))
    per = (its.group_by("epoch").len().join(mine.group_by("epoch").len().rename({"len": "steps"}), on="epoch")
           .with_columns((pl.col("len") / pl.col("steps")).alias("per")))
    if per.is_empty():
        return None, "no item events inside the consumer's epochs"
    # ceil: a last, partial batch (drop_last=False) leaves the ratio just under the batch size
    return int(np.ceil(float(_num(per["per"].median())) - 1e-9)), "item events per training step, per epoch"


def _compute_time(
    steps: pl.DataFrame, saves: pl.DataFrame, facts: _Facts | None = None
) -> Distribution:
    """Step durations (s) minus checkpoint saves inside them, warm-up excluded.

    The first step always counts as warm-up (as DLIO excludes it); so does every
    following step of the leading run longer than ``WARMUP_FACTOR`` x the median
    step (first kernels of a framework are 10-30x slower than steady state).
    """
    if steps.height < 2:
        return Distribution.unknown()
    s = steps.sort("ts").with_columns((pl.col("ts") + pl.col("dur")).alias("end"))
    if saves.height:
        sv = saves.select(
            "pid", pl.col("ts").alias("save_ts"), pl.col("dur").alias("save_dur")
        ).sort("save_ts")
        inside = (
            sv.join_asof(
                s.select("pid", "ts", "end").sort("ts"),
                left_on="save_ts",
                right_on="ts",
                by="pid",
                strategy="backward",
                check_sortedness=False,
            )
            .filter(pl.col("save_ts") <= pl.col("end"))
            .group_by("ts")
            .agg(pl.col("save_dur").sum().alias("ckpt"))
        )
        s = s.join(inside, on="ts", how="left").with_columns(pl.col("ckpt").fill_null(0))
    else:
        s = s.with_columns(pl.lit(0).alias("ckpt"))
    values = (s["dur"] - s["ckpt"]).clip(lower_bound=0).to_numpy() * _US
    warm = warmup_steps(values)
    if facts is not None and warm > 1:
        facts.notes.append(
            f"excluded {warm} warm-up step(s) ({values[:warm].sum():.3f} s) from computation_time"
        )
    return Distribution.from_values(values[warm:])


@dataclass
class TimingModel:
    """Where a consumer's epochs spent their time (seconds) and the model fields that replay it.

    Components, on the consumer's timeline: ``epoch_start`` (from the epoch's start to its
    first batch: creating the iterator, starting workers, the first fetch; the replay's loader
    spends it itself), ``fetch_wait`` (waits for the other batches, and the end-of-epoch
    ``next()`` that joins non-persistent workers), ``step_compute`` and ``warmup_compute``
    (the steps' compute, checkpoints left out), ``checkpoint`` (saves inside the loop and
    between epochs), ``epoch_end`` (after the epoch's last batch until the next epoch, besides
    checkpoints), ``unattributed`` (inside epochs, outside all of the above: barriers, logging).
    """

    computation_time: Distribution
    computation_host_cpu: Distribution | None  # None: the trace did not measure it
    computation_host_threads: int | None
    warmup_computation_time: list[float]
    epoch_warmup_computation_time: list[float]
    epoch_end_time: Distribution
    components: dict[str, float]
    total_s: float
    epochs: int

    def describe(self) -> str:
        c = self.components
        parts = ", ".join(f"{k.replace('_', ' ')} {v:.3f} s" for k, v in c.items() if k != "unattributed")
        un = c.get("unattributed", 0.0)
        share = 100.0 * un / self.total_s if self.total_s > 0 else 0.0
        return (f"timing: {self.total_s:.3f} s in {self.epochs} epoch(s) on the training process: {parts}; "
                f"unattributed {un:.3f} s ({share:.1f} %)")


def _host_cpu(steps: pl.DataFrame, steady: np.ndarray) -> tuple[Distribution | None, int | None]:
    """(CPU seconds per steady step, threads that shared it) of a consumer's *steps* (rows of
    :func:`~dlreplay.analyze.trace.vocabulary.training_steps` in time order) where *steady*
    is true and the trace measured them; (None, None) when it did not (DLIO's traces,
    POSIX-only ones, captures older than the measurement)."""
    cpu = steps["cpu_us"].to_numpy()
    measured = steady & ~np.isnan(cpu.astype(float))
    if not measured.any():
        return None, None
    threads = steps["cpu_threads"].to_numpy().astype(float)[measured]
    threads = threads[~np.isnan(threads)]
    return (Distribution.from_values(cpu[measured].astype(float) * _US),
            max(1, int(round(float(np.median(threads))))) if threads.size else 1)


def _leading_warmup(values: np.ndarray, steady: float) -> int:
    """Leading steps longer than ``WARMUP_FACTOR`` x the steady median step."""
    if values.size == 0 or steady <= 0:
        return 0
    slow = values > WARMUP_FACTOR * steady
    return int(np.argmin(slow)) if not slow.all() else int(values.size)


def timing_model(
    loop: pl.DataFrame, epochs: pl.DataFrame, probes: pl.DataFrame, saves: pl.DataFrame
) -> TimingModel | None:
    """Attribute every second of one consumer's epochs (see :class:`TimingModel`).

    ``loop``: its training steps (:func:`~dlreplay.analyze.vocabulary.training_steps`, µs);
    ``epochs``: its epoch spans (``ts``, ``end``); ``probes``: its end-of-epoch fetches (the
    ``next()`` that finds the loader exhausted); ``saves``: its checkpoint saves. None
    without two steps.
    """
    if loop.height < 2:
        return None
    st = loop.sort("ts").with_columns(pl.int_range(pl.len()).over("epoch").alias("pos"))
    values = st["compute_us"].fill_null(0).to_numpy() * _US
    warm = warmup_steps(values)
    idx = np.arange(values.size)
    steady_mask = idx >= warm if values.size > warm else np.ones(values.size, dtype=bool)
    steady = values[steady_mask]
    steady_median = float(np.median(steady))
    # later epochs' leading steps, position by position (median over those epochs)
    first_epoch = st["epoch"].min()
    later = st.with_columns(pl.Series("s", values)).filter(pl.col("epoch") != first_epoch)
    epoch_warm: list[float] = []
    if later.height:
        pos = later.group_by("pos").agg(pl.col("s").median()).sort("pos")["s"].to_numpy()
        n = _leading_warmup(pos, steady_median)
        epoch_warm = [round(float(v), 6) for v in pos[: min(n, max(1, pos.size // 2))]]
        if epoch_warm:  # those steps are modelled by position: keep them out of the steady state
            keep = (idx >= warm) & ~((st["epoch"] != first_epoch).to_numpy() & (st["pos"].to_numpy() < len(epoch_warm)))
            if keep.any():
                steady_mask = keep
                steady = values[keep]
    comps = {"epoch_start": 0.0, "fetch_wait": 0.0, "step_compute": float(values[warm:].sum()),
             "warmup_compute": float(values[:warm].sum()), "checkpoint": 0.0, "epoch_end": 0.0, "unattributed": 0.0}
    end_gaps = np.array([])
    total = 0.0
    ep = epochs.sort("ts").select(pl.col("ts").alias("e_ts"), pl.col("end").alias("e_end"))
    if ep.height:
        ep = ep.with_columns(pl.col("e_ts").shift(-1).alias("next_ts")).with_row_index("e")
        stamp = ep.select("e", "e_ts")

        def tag(frame: pl.DataFrame) -> pl.DataFrame:
            return frame.sort("ts").join_asof(stamp, left_on="ts", right_on="e_ts", strategy="backward",
                                              check_sortedness=False).filter(pl.col("e").is_not_null())

        first = pl.col("pos") == 0
        per = tag(st).group_by("e").agg(
            (pl.col("lead_in_us").fill_null(0) + pl.col("wait_us").fill_null(0)).filter(first).sum().alias("start_us"),
            pl.col("wait_us").fill_null(0).filter(~first).sum().alias("wait_us"),
            pl.col("compute_us").fill_null(0).sum().alias("compute_us"),
            pl.col("ckpt_us").fill_null(0).sum().alias("ckpt_us"))
        pr = tag(probes.select("ts", pl.col("dur").fill_null(0))).group_by("e").agg(pl.col("dur").sum().alias("probe_us"))
        sv = tag(saves.select("ts", pl.col("dur").fill_null(0))).join(ep.select("e", "e_end"), on="e")
        after = sv.filter(pl.col("ts") >= pl.col("e_end")).group_by("e").agg(
            pl.col("dur").sum().alias("sv_after"), (pl.col("ts") + pl.col("dur")).max().alias("sv_last"))
        t = (ep.join(per, on="e", how="left").join(pr, on="e", how="left").join(after, on="e", how="left")
             .with_columns(pl.col("start_us", "wait_us", "compute_us", "ckpt_us", "probe_us", "sv_after").fill_null(0)))
        t = t.with_columns(
            # the epoch ends when the next one begins; the last one after its trailing saves
            pl.coalesce("next_ts", pl.max_horizontal("e_end", "sv_last")).alias("stop"),
        ).with_columns(
            (pl.col("stop") - pl.col("e_end") - pl.col("sv_after")).clip(lower_bound=0).alias("end_us"),
            (pl.col("e_end") - pl.col("e_ts") - pl.col("start_us") - pl.col("wait_us") - pl.col("probe_us")
             - pl.col("compute_us") - pl.col("ckpt_us")).clip(lower_bound=0).alias("un_us"),
        )
        comps["epoch_start"] = _num(t["start_us"].sum()) * _US
        comps["fetch_wait"] = _num((t["wait_us"] + t["probe_us"]).sum()) * _US
        comps["checkpoint"] = _num((t["ckpt_us"] + t["sv_after"]).sum()) * _US
        comps["epoch_end"] = _num(t["end_us"].sum()) * _US
        comps["unattributed"] = _num(t["un_us"].sum()) * _US
        total = _num((t["stop"] - t["e_ts"]).sum()) * _US
        end_gaps = t.filter(pl.col("next_ts").is_not_null())["end_us"].to_numpy() * _US
    host_cpu, host_threads = _host_cpu(st, steady_mask)
    return TimingModel(
        computation_time=Distribution.from_values(steady),
        computation_host_cpu=host_cpu,
        computation_host_threads=host_threads,
        warmup_computation_time=[round(float(v), 6) for v in values[:warm]],
        epoch_warmup_computation_time=epoch_warm,
        epoch_end_time=Distribution.from_values(end_gaps) if end_gaps.size else Distribution.fixed(0.0),
        components=comps,
        total_s=total,
        epochs=ep.height,
    )


def _checkpoint(
    events: pl.DataFrame, saves: pl.DataFrame, batches: pl.DataFrame, facts: _Facts,
    epochs: pl.DataFrame | None = None,
) -> Checkpoint:
    if saves.height == 0:
        facts.put("checkpoint.enabled", "no checkpoint events", "measured")
        return Checkpoint(enabled=False)
    bt = batches.sort("ts").with_row_index("global_step").select("ts", "global_step")
    # the saves of the process whose steps count them (each rank of a multi-rank job saves at the
    # same steps: interleaved, two ranks' saves were 0 steps apart)
    mine = saves.filter(pl.col("pid").is_in(batches["pid"].unique().implode()))
    at = (
        (mine if mine.height else saves).sort("ts")
        .join_asof(bt, on="ts", strategy="backward")
        .with_columns((pl.col("global_step") + 1).fill_null(0).alias("step_count"))
    )
    gaps = at["step_count"].diff().drop_nulls()
    first = int(at["step_count"][0])
    interval = _mode(gaps) if gaps.len() else (first if first > 0 else None)
    if interval is not None and interval <= 0:  # saves at the same step: no step interval to replay
        interval = None
    every_epochs: int | None = None
    after_epoch = 1
    if epochs is not None and epochs.height:
        # saves outside every epoch (after the loop over the DataLoader): epoch-based checkpoints
        win = epochs.sort("ts").with_row_index("e").select(
            "e", pl.col("ts").alias("e_ts"), pl.col("end").alias("e_end"))
        tagged = at.sort("ts").join_asof(win, left_on="ts", right_on="e_ts", strategy="backward",
                                         check_sortedness=False)
        if tagged["e"].null_count() == 0 and (tagged["ts"] >= tagged["e_end"]).all():
            per_epoch = tagged["e"].cast(pl.Int64)
            every_epochs = _mode(per_epoch.diff().drop_nulls()) or 1
            after_epoch = int(_num(per_epoch.min())) + 1
    if every_epochs is not None:
        interval = None
        facts.put("checkpoint.epochs_between_checkpoints", "torch.save events after epochs end", "measured")
        facts.put("checkpoint.checkpoint_after_epoch", "first epoch followed by a torch.save", "measured")
    else:
        facts.put("checkpoint.steps_between_checkpoints", "training steps between checkpoint saves", "measured")
    nbytes = int(_num(saves["size"].drop_nulls().mean()))
    facts.put("checkpoint.bytes_per_checkpoint", "bytes of each checkpoint save", "measured")
    ckpt_files = saves["file"].drop_nulls().unique().to_list()
    per_save = _written_inside(events, saves)
    files_per = 1
    if per_save.height:
        # saves that name no file (DLIO's, ai.checkpoint.capture): the files written inside them
        ckpt_files = sorted(set(ckpt_files) | set(per_save["file"].unique().to_list()))
        files_per = int(_num(per_save.unique(["save", "file"]).group_by("save").len()["len"].median(), 1))
    fsync = (
        events.filter(pl.col("name").is_in(SYNC_OPS) & pl.col("file").is_in(ckpt_files)).height > 0
    )
    facts.put("checkpoint.fsync", "fsync/fdatasync on checkpoint files", "measured")
    writes = events.filter(
        pl.col("name").is_in(WRITE_OPS) & pl.col("file").is_in(ckpt_files) & (pl.col("size") > 0)
    )
    wts = _observed(writes["size"])
    facts.put(
        "checkpoint.write_transfer_size",
        "POSIX writes to checkpoint files"
        if writes.height
        else "torch.save writes are not visible to DFTracer",
        "measured" if writes.height else "default",
    )
    serialization = Distribution.fixed(0.0)
    if writes.height:
        # a save's time outside the calls on its file (pickling, copies) is not the storage's
        posix = events.filter(pl.col("file").is_in(ckpt_files) & pl.col("cat").is_in(["POSIX", "STDIO"]))
        sv = saves.sort("ts").select("pid", pl.col("ts").alias("save_ts"),
                                     (pl.col("ts") + pl.col("dur")).alias("save_end"), "dur")
        inside = (posix.sort("ts").join_asof(sv, left_on="ts", right_on="save_ts", by="pid", strategy="backward",
                                             check_sortedness=False)
                  .filter(pl.col("ts") < pl.col("save_end")).group_by("save_ts")
                  .agg(pl.col("dur").sum().alias("io")))
        per = sv.join(inside, on="save_ts", how="left").select(
            ((pl.col("dur") - pl.col("io").fill_null(0)).clip(lower_bound=0) * _US).alias("s"))
        serialization = _observed(per["s"])
        facts.put("checkpoint.serialization_time", "torch.save duration minus its POSIX calls", "measured")
    elif nbytes <= 0 and saves["dur"].drop_nulls().len():
        # neither the writes nor the size is in the trace (an ai.checkpoint.capture region around
        # a save to a directory the tracer did not watch): the saves' whole time is what the
        # replay can spend, as serialisation, with nothing to write
        serialization = _observed(saves["dur"].drop_nulls() * _US)
        facts.put("checkpoint.serialization_time", "the checkpoint saves' whole duration: their writes are not "
                  "visible and their size is unknown", "measured")
    else:
        facts.put("checkpoint.serialization_time", "torch.save writes are not visible: the replay's writes "
                  "stand for the whole save", "default")
    folders = {str(PurePosixPath(f).parent) for f in ckpt_files}
    file_writes = _file_writes(events, saves, max(files_per, 1))
    if file_writes is not None:
        nbytes = sum(size * calls for runs in file_writes for size, calls in runs)
        facts.put("checkpoint.file_writes", "write calls per file of the first save of the most common size "
                  "(files in order of their first write)", "measured")
        facts.put("checkpoint.bytes_per_checkpoint", "bytes written by the most common save", "measured")
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


def _checkpoint_writes(events: pl.DataFrame, data_dirs: list[str] | None) -> pl.DataFrame:
    """(ts, end) µs of the write bursts to checkpoint files (first write to last, per process
    and file): time a POSIX-only trace shows the loop was not computing."""
    from dlreplay.analyze.files import classify_files

    files = classify_files(events, data_dirs=data_dirs).filter(pl.col("role") == "checkpoint")["file"]
    w = events.filter(pl.col("file").is_in(files.implode()) & pl.col("name").is_in(WRITE_OPS))
    return w.group_by("pid", "file").agg(pl.col("ts").min(), (pl.col("ts") + pl.col("dur").fill_null(0)).max()
                                         .alias("end")).select("ts", "end")


#: Most runs of equal write calls kept for one checkpoint (all files); more: the write-size distribution.
MAX_CHECKPOINT_WRITE_RUNS = 1024


def _file_writes(events: pl.DataFrame, saves: pl.DataFrame, files_per: int) -> list[list[list[int]]] | None:
    """The write calls of each file of one checkpoint, as runs of ``[bytes, calls]``: those of the
    first save that wrote the most common total in *files_per* files (files in the order of their
    first write). None when no save's writes are visible or they take too many runs."""
    w = events.filter(pl.col("name").is_in(WRITE_OPS) & pl.col("file").is_not_null() & (pl.col("size") > 0)
                      & pl.col("pid").is_in(saves["pid"].unique().implode())).select("pid", "ts", "file", "size")
    if w.is_empty():
        return None
    sv = saves.sort("ts").with_row_index("save").select(
        "save", "pid", pl.col("ts").alias("s_ts"), (pl.col("ts") + pl.col("dur").fill_null(0)).alias("s_end"))
    got = (w.sort("ts").join_asof(sv, left_on="ts", right_on="s_ts", by="pid", strategy="backward",
                                  check_sortedness=False)
           .filter(pl.col("save").is_not_null() & (pl.col("ts") <= pl.col("s_end"))))
    totals = got.group_by("save").agg(pl.col("size").sum().alias("total"), pl.col("file").n_unique().alias("files"))
    totals = totals.filter(pl.col("files") == files_per)
    if totals.is_empty():
        return None
    common = totals["total"].mode().sort()[0]
    first = totals.filter(pl.col("total") == common)["save"].min()
    mine = got.filter(pl.col("save") == first).sort("ts").with_columns(
        pl.col("ts").min().over("file").alias("f_ts"))
    # runs of equal sizes per file, files in order of their first write
    runs = (mine.with_columns((pl.col("size") != pl.col("size").shift(1).over("file")).fill_null(True)
                              .cum_sum().over("file").alias("run"))
            .group_by("f_ts", "file", "run", maintain_order=True)
            .agg(pl.col("size").first(), pl.len().alias("calls"))
            .sort("f_ts", "run"))
    if runs.height > MAX_CHECKPOINT_WRITE_RUNS:
        return None
    out: list[list[list[int]]] = []
    for part in runs.partition_by("f_ts", maintain_order=True):
        out.append([[int(a), int(b)] for a, b in zip(part["size"], part["calls"], strict=True)])
    return out


def _written_inside(events: pl.DataFrame, saves: pl.DataFrame) -> pl.DataFrame:
    """(save, file): files written by a save's process while the save runs."""
    w = events.filter(pl.col("name").is_in(WRITE_OPS) & pl.col("file").is_not_null() & (pl.col("size") > 0)
                      & pl.col("pid").is_in(saves["pid"].unique().implode())).select("pid", "ts", "file").sort("ts")
    if w.is_empty():
        return pl.DataFrame(schema={"save": pl.UInt32, "file": pl.String})
    sv = saves.sort("ts").with_row_index("save").select(
        "save", "pid", pl.col("ts").alias("s_ts"), (pl.col("ts") + pl.col("dur").fill_null(0)).alias("s_end"))
    got = w.join_asof(sv, left_on="ts", right_on="s_ts", by="pid", strategy="backward", check_sortedness=False)
    return got.filter(pl.col("save").is_not_null() & (pl.col("ts") <= pl.col("s_end"))).select("save", "file")


def _workers_per_rank(
    worker_items: pl.DataFrame, epochs: pl.DataFrame, consumers: list[int]
) -> int:
    """Workers per epoch of each consumer (rank), the most over ranks.

    A DataLoader worker's parent is its consumer, so workers are grouped by ppid
    (one join for all ranks); with a single consumer, every worker is its own.
    """
    if len(consumers) == 1:
        return _workers_per_epoch(worker_items, epochs.filter(pl.col("pid") == consumers[0]))
    mine = worker_items.filter(pl.col("ppid").is_in(consumers))
    if mine.is_empty() or epochs.is_empty():
        return _concurrent_processes(worker_items) // max(len(consumers), 1)
    mids = mine.select("pid", "ppid", "ts")
    starts = epochs.select(
        pl.col("pid").alias("ppid"), pl.col("ts").alias("epoch_ts"), pl.col("epoch").alias("win")
    ).sort("epoch_ts")
    tagged = mids.sort("ts").join_asof(
        starts, left_on="ts", right_on="epoch_ts", by="ppid", strategy="backward", check_sortedness=False
    )
    return int(_num(tagged.group_by("ppid", "win").agg(pl.col("pid").n_unique().alias("n"))["n"].max()))


def _workers_per_epoch(worker_items: pl.DataFrame, epochs: pl.DataFrame) -> int:
    """Most worker processes loading samples in one epoch.

    Each item belongs to the epoch whose window it starts in; a worker counts in an epoch
    where it loaded at least a quarter of the median items per (worker, epoch): persistent
    workers count in every epoch, non-persistent ones in theirs, and a previous epoch's
    worker finishing at a window's edge does not count twice. Without epoch events, fall
    back to processes alive at the same time.
    """
    if epochs.is_empty():
        return _concurrent_processes(worker_items)
    starts = epochs.select(pl.col("ts").alias("epoch_ts"), pl.col("epoch").alias("win")).sort("epoch_ts")
    tagged = worker_items.select("pid", "ts").sort("ts").join_asof(
        starts, left_on="ts", right_on="epoch_ts", strategy="backward"
    ).with_columns(pl.col("win").fill_null(starts["win"][0]))
    n = tagged.group_by("pid", "win").len()
    fair = n.filter(pl.col("len") >= 0.25 * pl.col("len").median())
    return int(_num(fair.group_by("win").len()["len"].max()))


def _concurrent_processes(frame: pl.DataFrame) -> int:
    """Most processes whose event spans (first start .. last end) overlap in time.

    Non-persistent DataLoader workers live for one epoch, so counting distinct pids
    would multiply by the number of epochs; overlap counts the workers of one epoch.
    A single process reading everything is the consumer itself: 0 workers.
    """
    spans = frame.group_by("pid").agg(
        pl.col("ts").min().alias("a"), (pl.col("ts") + pl.col("dur")).max().alias("b")
    )
    if spans.height <= 1:
        return 0
    points = pl.concat(
        [
            spans.select(pl.col("a").alias("t"), pl.lit(1).alias("d")),
            spans.select(pl.col("b").alias("t"), pl.lit(-1).alias("d")),
        ]
    ).sort(["t", "d"], descending=[False, True])
    return int(_num(points["d"].cum_sum().max()))


def _posix_epochs(io: pl.DataFrame, paths: list[str]) -> int:
    """Median number of full passes over each dataset file (bytes read / file size)."""
    sizes = _file_sizes(io)
    got = (
        io.filter(pl.col("name").is_in(READ_OPS))
        .group_by("file")
        .agg(pl.col("size").sum().alias("read"))
    )
    j = got.join(sizes, on="file").filter(pl.col("size") > 0)
    if j.is_empty():
        return 1
    passes = (j["read"] / j["size"]).median()
    return max(int(np.floor(_num(passes, 1.0) + 0.05)), 1)
