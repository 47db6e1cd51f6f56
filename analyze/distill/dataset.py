"""The dataset section of the model: which files are the dataset (read, or memory-mapped, by
the loader), their format, count, sizes, samples per file, folder and layout."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import polars as pl

from dlreplay.errors import DlreplayError
from dlreplay.model import Dataset, Distribution, Layout
from dlreplay.schema import OPEN_OPS, READ_OPS

from ..trace import vocabulary as voc
from .base import DistillError, Facts, Observed, num, observed
from .in_memory import read_once
from .lines import counted_lines, json_lines, line_lengths, record_spans, seeked_records
from .measure import file_sizes

__all__ = [
    "EXTENSION_FORMATS",
    "INDEX_SUFFIXES",
    "MMAP_OPS",
    "dataset_files",
    "dataset_section",
    "dlio_reader",
    "find_dataset",
    "infer_format",
]

#: File extension -> dataset format (DLIO names).
EXTENSION_FORMATS = {
    ".npz": "npz",
    ".npy": "npy",
    ".pt": "pt",
    ".pth": "pt",
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
    # JSON lines: raw records of bytes, a line each
    ".jsonl": "raw",
    ".ndjson": "raw",
}


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


def find_dataset(
    events: pl.DataFrame,
    data_dirs: list[str] | None,
    fingerprint: dict[str, Any] | None,
    source: str | None,
    facts: Facts,
) -> tuple[list[str], str | None, bool]:
    """(the dataset's files, their record indexes' style, whether they were memory-mapped):
    the files read by the loader (under ``data_dirs`` when given), else those it mapped,
    without the record-index side files and strays of another extension. Raises
    :class:`DistillError` when the trace names no file or reads no dataset."""
    if events["file"].drop_nulls().len() == 0:
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
            facts.notes.append(
                f"no file of the trace is under {', '.join(data_dirs)}: the dataset was found by "
                f"its reads; the directory was used for the dataset fingerprint"
            )
    mapped = False
    if ds_files.is_empty():
        ds_files = _mapped_dataset(events, data_dirs)
        mapped = not ds_files.is_empty()
        if mapped:
            facts.notes.append(
                f"no dataset file was read: the samples' {ds_files.height} files were memory-mapped (mmap) by the "
                "loader's workers, whose page faults a tracer does not see (DLIO 2.0's mmap_indexed_binary reader "
                "maps each file and takes a view of the record, never touched); the replay maps them as well "
                "(reader.memory_map)"
            )
    if ds_files.is_empty():
        raise DistillError(
            f"{source or 'the trace'} has no dataset reads: no file was read by data-loader workers or "
            "repeatedly." + read_once(events, data_dirs)
        )
    paths, index_style = _record_indexes(ds_files["file"].to_list(), facts)
    return _homogeneous(paths, facts), index_style, mapped


def _mapped_dataset(events: pl.DataFrame, data_dirs: list[str] | None) -> pl.DataFrame:
    """Dataset files of a job whose loader maps them (``mmap``) instead of reading: files
    mapped more than once or by more than one process, under ``data_dirs`` when given. One
    column, ``file``; empty when there are none."""
    maps = events.filter(pl.col("name").is_in(MMAP_OPS) & pl.col("file").is_not_null())
    if data_dirs:
        maps = maps.filter(
            pl.any_horizontal(
                pl.col("file").cast(pl.String).str.starts_with(d.rstrip("/") + "/")
                for d in data_dirs
            )
        )
    if maps.is_empty():
        return pl.DataFrame(schema={"file": pl.String})
    per = maps.group_by("file").agg(pl.len().alias("n"), pl.col("pid").n_unique().alias("procs"))
    return (
        per.filter((pl.col("n") > 1) | (pl.col("procs") > 1))
        .select(pl.col("file").cast(pl.String))
        .sort("file")
    )


def _record_indexes(paths: list[str], facts: Facts) -> tuple[list[str], str | None]:
    """``paths`` without the record-index side files of other paths among them, and the index
    style they show (None: none). An index is read when a reader starts, not per sample: as
    dataset files it made a DLIO indexed-binary dataset of 8 files into 24, and its 64-byte
    reads a third of the read sizes."""
    have = set(paths)
    found: dict[str, str] = {}  # side file -> its suffix
    for p in paths:
        suffix = next((x for x in INDEX_SUFFIXES if p.endswith(x) and p[: -len(x)] in have), None)
        if suffix is not None:
            found[p] = suffix
    if not found:
        return paths, None
    suffixes = sorted(set(found.values()))
    style = "dlio" if any(INDEX_SUFFIXES[x] == "dlio" for x in suffixes) else "dlreplay"
    facts.notes.append(
        f"{len(found)} record-index file(s) ({', '.join(suffixes)}) beside the data files: each "
        f"one's index ({'DLIO' if style == 'dlio' else 'dlreplay'}'s), not samples"
    )
    return [p for p in paths if p not in found], style


def _homogeneous(paths: list[str], facts: Facts) -> list[str]:
    """Keep the files of the dominant extension when it covers >= 90 % of them.

    Datasets are homogeneous; a stray file under the data dir (a generator's marker,
    an index) would otherwise count as a sample file.
    """
    hidden = [p for p in paths if PurePosixPath(p).name.startswith(".")]
    if hidden and len(hidden) < len(
        paths
    ):  # markers and temporary files (.done, .lock), never samples
        facts.notes.append(
            f"ignored {len(hidden)} hidden file(s) under the dataset: "
            + ", ".join(PurePosixPath(h).name for h in sorted(hidden)[:5])
        )
        paths = [p for p in paths if p not in set(hidden)]
    exts = pl.Series("ext", [PurePosixPath(p).suffix.lower() for p in paths])
    counts = exts.value_counts(sort=True)
    top, n = counts[0, 0], counts[0, 1]
    if n == len(paths):
        return paths
    outside = _outside_the_top_folder(paths, exts.to_list(), top)
    if outside and n >= 2:  # a file read twice elsewhere (a launcher's entry points)
        facts.notes.append(
            f"ignored {len(outside)} file(s) outside the folder of the {top or 'extensionless'} "
            "files: " + ", ".join(sorted(outside)[:5])
        )
        paths = [p for p in paths if p not in outside]
        return _homogeneous(paths, facts)
    if n < 0.9 * len(paths):
        return paths
    kept = [p for p, e in zip(paths, exts.to_list(), strict=True) if e == top]
    dropped = sorted(set(paths) - set(kept))
    facts.notes.append(
        f"ignored {len(dropped)} non-{top or 'extensionless'} file(s) under the dataset: "
        + ", ".join(PurePosixPath(d).name for d in dropped[:5])
    )
    return kept


def _outside_the_top_folder(paths: list[str], exts: list[str], top: str) -> set[str]:
    """The files of another extension than ``top`` (the most common one) that lie outside
    the folder holding every ``top`` file (relative paths: none)."""
    tops = [p for p, e in zip(paths, exts, strict=True) if e == top]
    if not all(p.startswith("/") for p in paths):
        return set()
    root = os.path.commonpath([os.path.dirname(p) for p in tops])
    return {
        p
        for p, e in zip(paths, exts, strict=True)
        if e != top and os.path.commonpath([root, p]) != root
    }


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


def dlio_reader(annotated: pl.DataFrame) -> str | None:
    """DLIO's reader class when the trace's sample reads are DLIO's (``reader/NPZReader.read_index``)."""
    from dlreplay.dlio.generator import DLIO_READER_FORMATS

    reads = annotated.filter((pl.col("role") == voc.SAMPLE_READ) & (pl.col("cat") == "reader"))
    classes = {str(n).split(".")[0] for n in reads["name"].unique().to_list()}
    known = sorted(classes & set(DLIO_READER_FORMATS))
    return known[0] if len(known) == 1 else None


def dataset_section(
    obs: Observed,
    facts: Facts,
    fingerprint: dict[str, Any] | None,
    fingerprint_origin: str | None,
    source: str | None,
) -> Dataset:
    """``dataset``: format, files, sizes, samples per file and folder from the trace; the
    layout from the dataset fingerprint, else DLIO's generator, else the reads."""
    paths = obs.paths
    given = fingerprint  # (what the layout details weigh: a fingerprint passed to distill)
    fingerprint, fingerprint_origin = _resolved_fingerprint(
        fingerprint, fingerprint_origin, source, facts
    )
    fmt, how, conf = infer_format(paths, obs.reads)
    facts.put("dataset.format", how, conf)
    facts.put("dataset.num_files", "distinct dataset files read", "measured")
    sizes = file_sizes(obs.io)
    file_size = observed(sizes["size"])
    facts.put(
        "dataset.file_size",
        "largest byte position read or seeked per file",
        "measured" if sizes.height else "default",
    )
    spf = _samples_per_file(obs, facts)
    if fmt == "raw" and not obs.items.height and spf > 1:
        spf = seeked_records(obs, spf, facts)
    if fmt == "raw" and not obs.items.height and json_lines(paths):
        spf = counted_lines(obs, spf, fingerprint, facts)
    parts = _sample_parts(obs, sizes, spf, fmt, len(paths), facts)
    record = _record_length(obs, sizes, spf, facts, fmt)
    if fmt == "raw" and not obs.items.height and json_lines(paths) and spf > 1:
        if facts.fields["dataset.record_length"].method.startswith("file size / samples"):
            record = line_lengths(obs, record, fingerprint, facts)
    parents = {str(PurePosixPath(p).parent) for p in paths}
    folder = os.path.commonpath(paths) if len(paths) > 1 else str(PurePosixPath(paths[0]).parent)
    if len(paths) > 1 and folder in paths:
        folder = str(PurePosixPath(folder).parent)
    facts.put("dataset.num_subfolders", "distinct parent directories of dataset files", "measured")
    dataset = Dataset(
        format=fmt,
        num_files=len(paths),
        num_samples_per_file=spf,
        files_per_sample=max(1, len(parts)),
        record_length=record,
        file_size=file_size,
        num_subfolders=len(parents) if len(parents) > 1 else 0,
        data_folder=folder,
        layout=_dataset_layout(
            fmt,
            paths,
            spf,
            obs.reads,
            record,
            fingerprint,
            fingerprint_origin,
            source,
            facts,
            obs.dlio_reader,
            sizes["size"].to_list(),
        ),
    )
    if len(parts) > 1:
        dataset = replace(dataset, layout=_parts_in_order(dataset.layout, parts))
    if posix_mapped_rows(obs, dataset):
        dataset = _rows_of_mapped_files(dataset, facts)
    elif posix_row_groups(obs, dataset):
        dataset = _rows_of_row_groups(dataset, obs, facts)
    return _with_layout_details(dataset, obs, given, facts)


def posix_row_groups(obs: Observed, dataset: Dataset) -> bool:
    """Whether a trace without item events shows Parquet files of several row groups (the
    fingerprint's) read in pieces: several reads a visit (open), under half the file each,
    as pyarrow's ``read_row_group`` reads a group's column chunks from a file a worker keeps
    open. Its visits are then no samples (2 opens a file an epoch for 512 rows)."""
    tables = dataset.layout.tables or []
    if obs.items.height or dataset.format != "parquet" or len(tables) != 1:
        return False
    t = tables[0]
    if not t.rows or t.rows < 2 or not t.row_groups or t.row_groups < 2 or obs.reads.is_empty():
        return False
    opens = obs.io.filter(pl.col("name").is_in(OPEN_OPS)).height
    size = num(file_sizes(obs.io)["size"].median(), 0.0)
    median_read = num(obs.reads["size"].median(), 0.0)
    return bool(size) and median_read < 0.5 * size and obs.reads.height >= 2 * max(opens, 1)


def _rows_of_row_groups(dataset: Dataset, obs: Observed, facts: Facts) -> Dataset:
    """*dataset* (see :func:`posix_row_groups`) as the rows of its files (the fingerprint's),
    a file's bytes over them each: the layout's guess, said so."""
    rows = int((dataset.layout.tables or [])[0].rows or 1)
    facts.put(
        "dataset.num_samples_per_file",
        f"the files' rows ({rows}; fingerprint): the files were read a row group at a time "
        "through handles kept open, so their opens are no samples and the rows are taken as "
        "the samples",
        "default",
    )
    facts.put("dataset.record_length", "file size / the files' rows (fingerprint)", "default")
    facts.notes.append(
        f"guess: dataset.num_samples_per_file {rows}: the dataset's Parquet files were read a "
        "row group at a time through handles kept open, so the trace shows no sample; one row "
        "a sample assumed (reader.row_group_reads). Capture with the loader hooks for the rows "
        "the job took"
    )
    sizes = file_sizes(obs.io)["size"].to_numpy().astype(float)
    return replace(
        dataset, num_samples_per_file=rows, record_length=Distribution.from_values(sizes / rows)
    )


#: A mapped file read no further than this share of its size was read in its header alone
_HEADER_SHARE = 0.05


def posix_mapped_rows(obs: Observed, dataset: Dataset) -> bool:
    """Whether a trace without item events shows NPY files that their readers mapped (mmap) and
    read in their headers alone (``np.load(mmap_mode="r")``): their samples are rows faulted in
    from the mapping, which no call shows. Needs the files' arrays (the fingerprint)."""
    arrays = dataset.layout.arrays or []
    if obs.items.height or dataset.format != "npy" or len(arrays) != 1:
        return False
    a = arrays[0]
    if not a.bytes or not a.members or len(a.members[0].shape or []) < 2:
        return False
    if obs.io.filter(pl.col("name").is_in(MMAP_OPS)).is_empty():
        return False
    extent = obs.reads.select((pl.col("offset").fill_null(0) + pl.col("size")).max()).item()
    return num(extent, 0.0) < _HEADER_SHARE * a.bytes


def _rows_of_mapped_files(dataset: Dataset, facts: Facts) -> Dataset:
    """*dataset* (see :func:`posix_mapped_rows`) as rows of its mapped arrays: samples a file
    the array's first axis, a row's bytes each: the layout's guess, said so."""
    a = (dataset.layout.arrays or [])[0]
    shape = list(a.members[0].shape)
    rows = int(shape[0])
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(a.members[0].dtype).itemsize
    facts.put(
        "dataset.num_samples_per_file",
        f"the mapped array's first axis ({rows} rows of {row_bytes:,} B; fingerprint): the files "
        "were mapped and read in their headers alone, so the samples are rows faulted in from "
        "the mapping, which no call shows",
        "default",
    )
    facts.put("dataset.record_length", "a row of the mapped array (fingerprint)", "default")
    facts.notes.append(
        f"guess: dataset.num_samples_per_file {rows}: the dataset's NPY files were mapped "
        "(mmap) and read in their headers alone, so their samples are page faults a POSIX "
        "trace does not show; one row of the array a sample assumed (reader.memory_map). "
        "Capture with the loader hooks for the rows the job took"
    )
    layout = replace(dataset.layout, arrays=[replace(a, samples=rows)])
    return replace(
        dataset,
        num_samples_per_file=rows,
        record_length=Distribution.fixed(float(row_bytes)),
        layout=layout,
    )


#: formats whose sample can be a group of files, each read whole (an image and its mask)
_PART_FORMATS = ("npz", "npy", "hdf5", "jpeg", "png")
#: share of the item events that must read the same number of files for it to be the rule
_PARTS_SHARE = 0.9


def _sample_parts(
    obs: Observed, sizes: pl.DataFrame, spf: int, fmt: str, files: int, facts: Facts
) -> list[float]:
    """Each file of a sample's group, in the order the sample reads them: its median size
    (bytes) over the samples; [] where a sample reads one file. A sample reads *k* > 1 files
    where at least 90 % of the item events (a Dataset's ``__getitem__``) read *k* distinct
    dataset files (MLPerf unet3d's ``case_x.npy`` and ``case_y.npy``): measured. POSIX-only
    traces have no items: the groups the names and the reads show (inferred,
    :func:`~..infer_parts.sample_groups`)."""
    if spf != 1 or fmt not in _PART_FORMATS:
        return []
    if not obs.items.height:
        return _posix_parts(obs, sizes, files, facts)
    reads = obs.tagged_io.filter(
        pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("item_ts").is_not_null()
    )
    firsts = reads.group_by("pid", "item_ts", "file").agg(pl.col("ts").min())
    per_item = firsts.group_by("pid", "item_ts").agg(pl.len().alias("k"))
    if per_item.is_empty():
        return []
    k = int(num(per_item["k"].mode().min(), 1))
    share = num((per_item["k"] == k).mean(), 0.0)
    if k < 2 or share < _PARTS_SHARE or files % k:
        return []
    # each item's files in the order it first read them: the part each file is
    order = (
        firsts.join(per_item.filter(pl.col("k") == k), on=["pid", "item_ts"])
        .sort("ts")
        .with_columns(pl.int_range(pl.len()).over("pid", "item_ts").alias("part"))
        .join(sizes.select("file", "size"), on="file", how="left")
    )
    medians = order.group_by("part").agg(pl.col("size").median()).sort("part")["size"].to_list()
    facts.put(
        "dataset.files_per_sample",
        f"{share:.0%} of {per_item.height} item events read {k} dataset files each (median "
        f"sizes in the order read: {', '.join(f'{num(m, 0):.0f}' for m in medians)} B)",
        "measured",
    )
    facts.notes.append(
        f"each sample reads {k} files whole ({files // k} samples of {files} files): the "
        "replay reads the same groups (dataset.files_per_sample; DLIO has no such key, and "
        "its export reads each file as a sample)"
    )
    return [num(m, 0) for m in medians]


def _posix_parts(obs: Observed, sizes: pl.DataFrame, files: int, facts: Facts) -> list[float]:
    """Each part's median size (bytes) in the order a sample reads them, where the POSIX loop
    found samples of several files (:func:`~..infer_parts.sample_groups`); else []."""
    groups = obs.posix.groups if obs.posix is not None else None
    if groups is None or files % groups.k:
        return []
    part = pl.DataFrame(
        {"file": list(groups.part), "part": list(groups.part.values())},
        schema={"file": pl.String, "part": pl.Int64},
    )
    medians = (
        sizes.with_columns(pl.col("file").cast(pl.String))
        .join(part, on="file")
        .group_by("part")
        .agg(pl.col("size").median())
        .sort("part")["size"]
        .to_list()
    )
    if len(medians) != groups.k:
        return []
    facts.put("dataset.files_per_sample", groups.evidence, "inferred")
    facts.notes.append(
        f"each sample reads {groups.k} files ({' + '.join(groups.names)}; {files // groups.k} "
        f"samples of {files} files), from their names and the order they were read: the "
        "replay reads the same groups (dataset.files_per_sample)"
    )
    return [num(m, 0) for m in medians]


def _parts_in_order(layout: Layout, parts: list[float]) -> Layout:
    """*layout* with its structures (arrays or images) in the order of a sample's parts (the
    replay gives file ``i`` of a sample the ``i``-th structure's sizes): each part takes the
    free structure nearest its median size. Unchanged unless there is one structure a part."""
    for key in ("arrays", "images"):
        structures = list(getattr(layout, key) or [])
        if len(structures) != len(parts) or any(st.bytes is None for st in structures):
            continue
        free, ordered = list(range(len(structures))), []
        for size in parts:
            best = min(free, key=lambda i: abs(int(structures[i].bytes) - size))
            free.remove(best)
            ordered.append(structures[best])
        return (
            replace(layout, arrays=ordered) if key == "arrays" else replace(layout, images=ordered)
        )
    return layout


def _samples_per_file(obs: Observed, facts: Facts) -> int:
    """Distinct samples read per file (item events; a mapped file's windows taken inside
    them), else the POSIX inference's, else 1."""
    if obs.item_windows.height:
        per = obs.item_windows.group_by("file").agg(pl.col("offset").n_unique().alias("n"))
        facts.put(
            "dataset.num_samples_per_file",
            "distinct windows the item events took of each mapped file (its rows: page faults, "
            "no read call)",
            "measured",
        )
        return int(num(per["n"].median(), 1))
    # the calls that touch a sample: its reads, or (a mapped dataset) the maps of its file
    tagged = obs.tagged_io.filter(
        pl.col("name").is_in(MMAP_OPS)
        if obs.mapped
        else pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0)
    )
    if obs.items.height and tagged["item_index"].drop_nulls().len():
        per_file = (
            tagged.filter(pl.col("item_index").is_not_null())
            .group_by("file")
            .agg(pl.col("item_index").n_unique().alias("samples"))
        )
        spf = int(num(per_file["samples"].median(), 1))
        every = (
            obs.items["sample_index"].drop_nulls().n_unique()
            if "sample_index" in obs.items.columns
            else 0
        )
        files = max(per_file.height, 1)
        if every >= 2 * spf * files:
            # most items read nothing: their sample came with an earlier item's read (a
            # Parquet row group kept, its rows in order): the samples are the items'
            facts.put(
                "dataset.num_samples_per_file",
                f"distinct sample indices of the item events ({every}) over the {files} files "
                f"read (only {spf} a file read anything: the rest came with an earlier read)",
                "measured",
            )
            return max(1, round(every / files))
        facts.put(
            "dataset.num_samples_per_file",
            "distinct sample indices read per file (item events)",
            "measured",
        )
        return spf
    if obs.posix is not None and obs.posix.samples_per_file.value:
        spf = int(obs.posix.samples_per_file.value)
        if obs.posix.passes_guessed:
            facts.notes.append(
                f"guess: dataset.num_samples_per_file {spf} and train.epochs "
                f"{obs.posix.epochs.value}: every visit read its file whole, so E epochs of k "
                "samples per file look like E/d epochs of k*d samples each read with its whole "
                "file (as DLIO's NPZ reader does); one visit per sample assumed. The trace "
                "cannot tell: capture with the loader hooks, or set both with --set"
            )
        facts.put(
            "dataset.num_samples_per_file",
            obs.posix.samples_per_file.evidence,
            "default" if obs.posix.passes_guessed else "inferred",
        )
        return spf
    facts.put(
        "dataset.num_samples_per_file", "no item events: one sample per file assumed", "default"
    )
    return 1


def _record_length(
    obs: Observed, sizes: pl.DataFrame, spf: int, facts: Facts, fmt: str = ""
) -> Distribution:
    """Bytes per sample: the file sizes over the samples per file (an HDF5 file's metadata
    before its data left out), else the read sizes; a mapped file's windows taken inside the
    item events where the samples are such windows."""
    if obs.item_windows.height:
        rows = obs.item_windows.unique(["file", "offset"])["bytes"].to_numpy().astype(float)
        facts.put(
            "dataset.record_length",
            "bytes of the windows the item events took of the mapped files",
            "measured",
        )
        return Distribution.from_values(rows)
    lines = record_spans(obs, sizes, spf) if fmt == "raw" and spf > 1 else None
    if lines is not None:
        facts.put(
            "dataset.record_length",
            f"the spans between the offsets the {'item events' if obs.items.height else 'job'} "
            "seeked to or began reading at "
            f"({lines.size} records of {sizes.height} files, {lines.min():,.0f}-"
            f"{lines.max():,.0f} B)",
            "measured" if obs.items.height else "inferred",
        )
        return Distribution.from_values(lines)
    if sizes.height and fmt in ("jpeg", "png") and spf > 1:
        # one image a file, which each of its samples reads whole (DLIO's image files of
        # several samples): a sample's bytes are the file's
        facts.put(
            "dataset.record_length",
            f"file size: the file's one image, read whole by each of its {spf} samples",
            "inferred",
        )
        return Distribution.from_values(sizes["size"].to_numpy().astype(float))
    if sizes.height:
        head = _hdf5_head(obs.reads) if fmt == "hdf5" else None
        if head is not None and head.height:
            data = sizes.join(head, on="file").filter(pl.col("size") > pl.col("head"))
            if data.height >= 0.9 * sizes.height:
                facts.put(
                    "dataset.record_length",
                    "(file size - the HDF5 metadata before the first sample-sized read) / "
                    f"samples per file (the metadata: median {num(data['head'].median()):,.0f} B)",
                    "inferred",
                )
                return Distribution.from_values(
                    ((data["size"] - data["head"]) / spf).to_numpy().astype(float)
                )
        # an estimate: the format's own bytes (a zip's headers; an HDF5 file whose data reads
        # were not seen) count in the sample's share
        guessed = obs.posix is not None and obs.posix.passes_guessed and not obs.items.height
        facts.put(
            "dataset.record_length",
            "file size / samples per file (the format's own bytes included)"
            + ("; the samples per file a guess" if guessed else ""),
            "default" if guessed else "inferred",
        )
        return Distribution.from_values(sizes["size"].to_numpy() / spf)
    facts.put("dataset.record_length", "read sizes (no file sizes seen)", "inferred")
    return observed(obs.reads["size"].to_numpy())


def _hdf5_head(reads: pl.DataFrame) -> pl.DataFrame | None:
    """Per HDF5 file, where its data begins (``head``, B): the lowest offset of a read at least
    half the file's largest read (a sample's data, or a chunk or sieve window holding it); the
    superblock, object headers and heaps before it are read in small pieces at every open
    (h5py's files keep 2 KiB of metadata first: 12 % of a one-sample file of 16 KiB)."""
    r = reads.filter(pl.col("offset").is_not_null() & (pl.col("size") > 0))
    if r.is_empty():
        return None
    big = r.filter(pl.col("size") >= 0.5 * pl.col("size").max().over("file"))
    return big.group_by("file").agg(pl.col("offset").min().alias("head"))


def _with_layout_details(
    dataset: Dataset, obs: Observed, fingerprint: dict[str, Any] | None, facts: Facts
) -> Dataset:
    """``dataset`` with what its layout adds: the record-index style, DLIO's resized sample,
    and the per-record lengths of TFRecord and CSV files."""
    fmt = dataset.format
    if fmt == "indexed_binary" and obs.index_style is not None:
        dataset = replace(dataset, layout=replace(dataset.layout, index=obs.index_style))
        facts.put(
            "dataset.layout.index",
            f"the data files' record-index side files ({obs.index_style}'s naming)",
            "measured",
        )
    if obs.dlio_reader is not None and (
        dataset.layout.source == "inferred" or fingerprint is not None
    ):
        from dlreplay.dlio.generator import resized_sample_bytes

        resized = resized_sample_bytes(fmt, dataset.layout)
        if resized:
            dataset = replace(dataset, record_length_resize=resized)
            facts.put(
                "dataset.record_length_resize",
                f"DLIO's {obs.dlio_reader} hands over its resized_image for every sample: max_dimension^2 = "
                f"{resized:,} B, the sample's side as DLIO sizes it (a record_length_resize in its config is "
                f"not visible in a trace)",
                "inferred",
            )
    per_record = _layout_record_length(dataset.layout, fmt)
    if per_record is not None:
        dataset = replace(dataset, record_length=per_record)
        facts.put(
            "dataset.record_length",
            "TFRecord payload / CSV line lengths of the sampled files (dataset fingerprint)",
            "measured",
        )
    return dataset


def _layout_record_length(layout: Layout, fmt: str) -> Distribution | None:
    """Bytes per sample from the fingerprint where a file's records differ (TFRecord payloads,
    CSV lines): the file size / samples per file would make every record alike."""
    if fmt == "tfrecord" and layout.record_bytes is not None:
        return layout.record_bytes
    if fmt == "csv" and layout.tables and layout.tables[0].line_bytes is not None:
        return layout.tables[0].line_bytes
    return None


def _resolved_fingerprint(
    fingerprint: dict[str, Any] | None, origin: str | None, source: str | None, facts: Facts
) -> tuple[dict[str, Any] | None, str | None]:
    """(the dataset fingerprint, where it came from): the one given, else the trace folder's
    (made at capture) or its data dirs' fingerprinted now, read once for the whole section; a
    damaged one is ignored, said so."""
    if fingerprint is not None or not source or not os.path.isdir(source):
        return fingerprint, origin
    from dlreplay.analyze.layout import resolve_fingerprint

    try:
        return resolve_fingerprint(source)
    except DlreplayError as exc:
        facts.notes.append(f"dataset fingerprint ignored: {exc}")
        return None, origin


def _dataset_layout(
    fmt: str,
    paths: list[str],
    spf: int,
    reads: pl.DataFrame,
    record: Distribution,
    fingerprint: dict[str, Any] | None,
    origin: str | None,
    source: str | None,
    facts: Facts,
    dlio_reader: str | None = None,
    file_bytes: list[float] | None = None,
) -> Layout:
    """``dataset.layout``: the fingerprint's, else (a DLIO trace, *dlio_reader* naming its reader
    class) what DLIO's generator writes for the files' sizes, else inferred from reads
    (provenance into *facts*)."""
    from dlreplay.analyze.layout import (
        infer_dlio_layout,
        infer_layout,
        layout_from_fingerprint,
    )

    where = origin or "given to distill"
    result = (
        layout_from_fingerprint(fingerprint, fmt, paths, spf, where or "", reads)
        if fingerprint
        else None
    )
    if fingerprint and result is None and not (fmt == "raw" and json_lines(paths)):
        # (JSON lines: the fingerprint counts their lines, no layout: :func:`.lines.counted_lines`)
        facts.notes.append(
            f"the dataset fingerprint ({where}) holds none of the trace's {fmt} dataset files: "
            "layout inferred from the trace"
        )
    if result is None and dlio_reader is not None:
        result = infer_dlio_layout(fmt, dlio_reader, spf, file_bytes)
    if result is None:
        result = infer_layout(fmt, reads, record.mean)
    for path, (how, confidence) in result.fields.items():
        facts.put(path, how, confidence)
    facts.notes.extend(result.notes)
    return result.layout
