"""``dataset.layout`` for distill: from a dataset fingerprint, else from what a trace shows.

A fingerprint (:mod:`dlreplay.capture.fingerprint`) lists, per group of dataset files
(root x extension), the layout of a spread sample of files. :func:`layout_from_fingerprint`
picks the group that holds the trace's dataset files and turns its sampled files into
:class:`~dlreplay.model.Layout` structures: files with the same structure (members,
dtypes, shapes, storage, chunks, filters; image size and coding; table columns) form
one structure whose ``weight`` is its share of the sample; sizes and compression ratios
are the medians/means over its files. :func:`infer_layout` is the fallback for traces
whose dataset is not reachable: only what the read sizes show, marked ``inferred``.

Every result says how each layout field was obtained (field path -> method, confidence).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import polars as pl

from dlreplay.capture.fingerprint import FINGERPRINT_NAME, fingerprint_dataset, read_fingerprint
from dlreplay.model import (
    ArrayFile,
    ArrayMember,
    Distribution,
    Hdf5File,
    ImageFile,
    Layout,
    TableColumn,
    TableFile,
)

from .unread import mark_unread

__all__ = [
    "LayoutResult",
    "find_group",
    "infer_dlio_layout",
    "infer_layout",
    "layout_from_fingerprint",
    "own_files",
    "resolve_fingerprint",
]

#: Formats a fingerprint group may have for each model format.
_COMPATIBLE = {
    "npz": ("npz", "zip"),
    "pt": ("zip",),  # a torch.save archive is a zip
    "indexed_binary": ("raw", None),
    "raw": (None,),
}


@dataclass
class LayoutResult:
    """A layout and how its fields were obtained (dotted path -> (method, confidence))."""

    layout: Layout
    fields: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- finding the fingerprint


def resolve_fingerprint(
    trace_dir: str | os.PathLike[str] | None, data_dirs: Sequence[str] = ()
) -> tuple[dict[str, Any] | None, str | None]:
    """The fingerprint to distill with, and where it came from.

    The trace directory's own ``dataset-fingerprint.json`` (made at capture) comes first;
    otherwise reachable *data_dirs* are fingerprinted now (traces captured elsewhere,
    plain DFTracer or DLIO traces). (None, None) when neither is available.
    """
    if trace_dir is not None and Path(trace_dir).is_dir():
        doc = read_fingerprint(trace_dir)
        if doc is not None:
            return doc, f"{Path(trace_dir) / FINGERPRINT_NAME} (made at capture)"
    reachable = [d for d in data_dirs if os.path.exists(d)]
    if reachable:
        doc = fingerprint_dataset(reachable)
        if doc["groups"]:
            return doc, f"fingerprint of {', '.join(reachable)} made by distill"
    return None, None


def find_group(doc: dict[str, Any], fmt: str, paths: Sequence[str]) -> dict[str, Any] | None:
    """The fingerprint group holding the trace's dataset files *paths* (format *fmt*).

    Prefers a group whose root contains the files and whose extension is theirs; a trace
    captured elsewhere (paths not under any root) gets the largest group of the format.
    """
    groups = [g for g in doc.get("groups", []) if isinstance(g, dict) and g.get("files_sampled")]
    wanted = _COMPATIBLE.get(fmt, (fmt,))
    same = [g for g in groups if g.get("format") in wanted]
    if not same:
        return None
    exts = Counter(PurePosixPath(p).suffix.lower() for p in paths)
    best: tuple[int, int, int] | None = None
    chosen = None
    for i, g in enumerate(same):
        root = str(g.get("root", ""))
        inside = (
            sum(1 for p in paths if p == root or p.startswith(root.rstrip("/") + "/"))
            if paths
            else 0
        )
        score = (inside, exts.get(str(g.get("extension", "")), 0), int(g.get("files", 0)))
        if best is None or score > best:
            best, chosen = score, same[i]
    return chosen


def _inside(path: str, folder: str) -> bool:
    """*path* is *folder* or under it (``/`` holds everything absolute)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def own_files(group: dict[str, Any], paths: Sequence[str]) -> list[dict[str, Any]]:
    """The files *group* sampled that belong to the trace's dataset (*paths*, the files it read):
    those it read, else those in the dataset's folder; where the trace's files lie under the
    group's root but none of those was sampled, none (a root such as ``/`` or a data dir that
    holds other datasets: its other files are not this dataset). A dataset moved here (its paths
    under no root: ``--data-dir`` names where it is now): the files of the same names, else all."""
    files = [f for f in group.get("files_sampled", []) if f.get("format") == group.get("format")]
    if not paths:
        return files
    root = str(group.get("root", ""))
    full = [(os.path.normpath(os.path.join(root, str(f.get("path", "")))), f) for f in files]
    read = set(paths)
    if mine := [f for p, f in full if p in read]:
        return mine
    parents = [str(PurePosixPath(p).parent) for p in paths]
    folder = os.path.commonpath(parents) if all(q.startswith("/") for q in parents) else ""
    if folder and (mine := [f for p, f in full if _inside(p, folder)]):
        return mine
    if root and any(_inside(p, root) for p in paths):
        return []
    names = {PurePosixPath(p).name for p in paths}
    return [f for f in files if PurePosixPath(str(f.get("path", ""))).name in names] or files


# --------------------------------------------------------------------------- fingerprint -> layout


def _median_int(values: Sequence[float | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return int(np.median(vals)) if vals else None


def _ratio(stored: Sequence[float], logical: Sequence[float]) -> float | None:
    s, lg = float(np.sum(stored)), float(np.sum(logical))
    if lg <= 0:
        return None
    return round(s / lg, 6)


def _structures(files: list[dict[str, Any]], key: Any) -> list[list[dict[str, Any]]]:
    """Files grouped by structure key, most common first (ties: first seen)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for f in files:
        groups.setdefault(json.dumps(key(f), sort_keys=True, default=str), []).append(f)
    return sorted(groups.values(), key=lambda g: -len(g))


def _member_key(m: dict[str, Any]) -> tuple[Any, ...]:
    return (
        m.get("name"),
        m.get("dtype"),
        tuple(m.get("shape") or ()),
        m.get("fortran_order", False),
        m.get("storage"),
        m.get("zip64", False),
    )


def _npz_arrays(files: list[dict[str, Any]], spf: int) -> tuple[list[ArrayFile], int | None]:
    levels: dict[str, Counter[int]] = {}
    for f in files:
        for m in f.get("members", []):
            if m.get("level") is not None:
                levels.setdefault(m["name"], Counter())[int(m["level"])] += 1
    out = []
    for same in _structures(files, lambda f: [_member_key(m) for m in f.get("members", [])]):
        first = same[0]["members"]
        members = []
        for j, m in enumerate(first):
            deflated = m.get("storage") == "deflated"
            per = [f["members"][j] for f in same]
            level = levels.get(m["name"], Counter()).most_common(1)
            members.append(
                ArrayMember(
                    name=m["name"],
                    dtype=m.get("dtype") or "|u1",
                    shape=list(m.get("shape") or [m.get("logical_bytes", 0)]),
                    fortran_order=bool(m.get("fortran_order", False)),
                    storage=m.get("storage")
                    if m.get("storage") in ("stored", "deflated")
                    else None,
                    compression="deflate" if deflated else None,
                    compression_level=(level[0][0] if level else None) if deflated else None,
                    compression_ratio=_ratio(
                        [p["stored_bytes"] for p in per], [p["logical_bytes"] for p in per]
                    )
                    if deflated
                    else None,
                    zip64=bool(m.get("zip64", False)),
                )
            )
        out.append(
            ArrayFile(
                weight=round(len(same) / len(files), 6),
                bytes=_median_int([f["bytes"] for f in same]),
                file_bytes=_file_bytes(same),
                samples=_samples(members, spf),
                members=members,
            )
        )
    all_levels = Counter(lv for c in levels.values() for lv in c.elements())
    return out, (all_levels.most_common(1)[0][0] if all_levels else None)


def _file_bytes(same: list[dict[str, Any]]) -> list[int]:
    return sorted(int(f["bytes"]) for f in same)


def _samples(members: Sequence[ArrayMember], spf: int) -> int | None:
    """The sample axis' length when some array's leading dimension is the samples per file."""
    return spf if any(m.shape and m.shape[0] == spf for m in members) else None


def _h5_key(d: dict[str, Any]) -> tuple[Any, ...]:
    return (
        d.get("name"),
        d.get("dtype"),
        tuple(d.get("shape") or ()),
        d.get("storage"),
        tuple(d.get("chunks") or ()),
        json.dumps(d.get("filters") or {}, sort_keys=True),
        d.get("fill_value"),
        d.get("chunk_order"),
        d.get("track_times"),
        d.get("attributes", 0),
        d.get("vlen_attributes", 0),
    )


def _by_address(members: list[ArrayMember], datasets: list[dict[str, Any]]) -> list[ArrayMember]:
    """*members* (one per fingerprint dataset of *datasets*) in the order of their data in the
    file, where every dataset with data is contiguous (its offset exact; those without data
    first, in their own order); as listed otherwise (chunked datasets' chunks interleave, and
    the listed order is the one the replay's tests hold to)."""
    if any(d.get("storage") == "chunked" for d in datasets):
        return members
    order = sorted(
        range(len(members)),
        key=lambda j: (datasets[j].get("offset") is not None, datasets[j].get("offset") or 0, j),
    )
    return [members[j] for j in order]


def _hdf5_arrays(files: list[dict[str, Any]], spf: int) -> list[ArrayFile]:
    out = []
    for same in _structures(
        files, lambda f: [tuple(f.get("groups", [])), [_h5_key(d) for d in f["datasets"]]]
    ):
        first = same[0]
        members = []
        for j, d in enumerate(first["datasets"]):
            per = [f["datasets"][j] for f in same]
            flt = d.get("filters") or {}
            filtered = bool(flt.get("compression") or flt.get("scaleoffset") is not None)
            allocated = [
                p.get("chunks_allocated", 0) / p["chunks_total"]
                for p in per
                if p.get("chunks_total")
            ]
            frac = round(float(np.mean(allocated)), 6) if allocated else None
            opts = flt.get("compression_opts")
            members.append(
                ArrayMember(
                    name=d["name"],
                    dtype=d.get("dtype") or "|u1",
                    shape=list(d.get("shape") or []),
                    storage=d.get("storage")
                    if d.get("storage") in ("contiguous", "chunked", "compact")
                    else None,
                    chunks=list(d["chunks"]) if d.get("chunks") else None,
                    compression=flt.get("compression"),
                    compression_level=int(opts) if isinstance(opts, int) else None,
                    compression_ratio=_ratio(
                        [p.get("stored_bytes", 0) for p in per], [_written_bytes(p) for p in per]
                    )
                    if filtered
                    else None,
                    shuffle=bool(flt.get("shuffle", False)),
                    fletcher32=bool(flt.get("fletcher32", False)),
                    scaleoffset=flt.get("scaleoffset"),
                    fill_value=d.get("fill_value"),
                    chunk_order=d.get("chunk_order"),
                    chunks_allocated=frac if frac is not None and frac < 0.999 else None,
                    track_times=bool(d.get("track_times", False)),
                    attributes=int(d.get("attributes", 0)),
                    attribute_bytes=_median_int([p.get("attribute_bytes", 0) for p in per]) or 0,
                    vlen_attributes=int(d.get("vlen_attributes", 0)),
                )
            )
        # in the order of their data in the file (link order is by name): the replay creates
        # and writes them in this order, so its arrays lie where the job's do
        members = _by_address(members, first["datasets"])
        out.append(
            ArrayFile(
                weight=round(len(same) / len(files), 6),
                bytes=_median_int([f["bytes"] for f in same]),
                file_bytes=_file_bytes(same),
                samples=_samples(members, spf),
                members=members,
                groups=[g for g in first.get("groups", []) if g != "/"],
            )
        )
    return out


def _written_bytes(d: dict[str, Any]) -> float:
    """Logical bytes of the part of a dataset that was written (its allocated chunks' share)."""
    logical = float(d.get("logical_bytes", 0))
    if d.get("chunks_total") and d.get("chunks_allocated") is not None:
        return logical * int(d["chunks_allocated"]) / int(d["chunks_total"])
    return logical


def _hdf5_file(files: list[dict[str, Any]]) -> Hdf5File:
    def common(key: str) -> Any:
        c = Counter(json.dumps(f.get(key)) for f in files)
        return json.loads(c.most_common(1)[0][0])

    return Hdf5File(
        superblock_version=common("superblock_version"),
        userblock_size=common("userblock_size") or 0,
        alignment_interval=common("alignment_interval"),
        alignment_threshold=common("alignment_threshold"),
        meta_block_size=common("meta_block_size"),
        file_space_strategy=common("file_space_strategy"),
        file_space_page_size=common("file_space_page_size"),
        root_attributes=common("root_attributes") or 0,
        root_attribute_bytes=common("root_attribute_bytes") or 0,
        root_vlen_attributes=common("root_vlen_attributes") or 0,
    )


def _images(files: list[dict[str, Any]], fmt: str) -> list[ImageFile]:
    multi = [
        int(f["chunk_bytes"]) for f in files if f.get("idat_chunks", 0) > 1 and f.get("chunk_bytes")
    ]
    chunk = max(multi) if multi else None
    out = []
    for same in _structures(
        files,
        lambda f: [
            f.get(k)
            for k in (
                "width",
                "height",
                "mode",
                "bits",
                "quality",
                "subsampling",
                "progressive",
                "optimize",
                "restart_interval",
                "interlaced",
            )
        ],
    ):
        f0 = same[0]
        ratios = [f["compression_ratio"] for f in same if f.get("compression_ratio")]
        out.append(
            ImageFile(
                weight=round(len(same) / len(files), 6),
                bytes=_median_int([f["bytes"] for f in same]),
                file_bytes=_file_bytes(same),
                width=int(f0["width"]),
                height=int(f0["height"]),
                mode=str(f0.get("mode") or "RGB"),
                bits=int(f0["bits"])
                if fmt == "png" and f0.get("bits") and f0.get("bits") != 8
                else None,
                quality=f0.get("quality") if fmt == "jpeg" else None,
                qtables=[list(q) for q in f0["qtables"]]
                if fmt == "jpeg" and f0.get("qtables")
                else None,
                subsampling=f0.get("subsampling") if fmt == "jpeg" else None,
                progressive=bool(f0.get("progressive", False)),
                optimize=bool(f0.get("optimize", False)),
                restart_interval=int(f0.get("restart_interval") or 0),
                interlaced=bool(f0.get("interlaced", False)),
                chunk_bytes=chunk if fmt == "png" else None,
                compression_ratio=round(float(np.mean(ratios)), 6)
                if ratios and fmt == "png"
                else None,
                extra_bytes=_median_int([f.get("extra_bytes", 0) for f in same]) or 0,
            )
        )
    return out


def _column(f: dict[str, Any], name: str) -> dict[str, Any]:
    return next((c for c in f.get("columns", []) if c.get("name") == name), {})


def _table_column(c: dict[str, Any], same: list[dict[str, Any]]) -> TableColumn:
    """Column *c* of a table structure, its bytes per row the median over the files *same*."""

    def per_row(key: str) -> float | None:
        if c.get(key) is None:
            return None
        return round(float(np.median([_column(f, c["name"]).get(key) or 0 for f in same])), 3)

    return TableColumn(
        name=str(c["name"]),
        type=str(c.get("physical_type") or c.get("type") or "str"),
        compression=c.get("compression"),
        dictionary=bool(c.get("dictionary", False)),
        row_bytes=per_row("row_bytes"),
        disk_row_bytes=per_row("disk_row_bytes"),
    )


def _tables(files: list[dict[str, Any]], fmt: str) -> list[TableFile]:
    out = []

    def key(f: dict[str, Any]) -> list[Any]:
        if fmt != "parquet":
            return [f.get(k) for k in ("columns", "header", "delimiter")]
        # the columns' identity: their sizes and pages differ from file to file
        ident = ("name", "type", "physical_type", "compression", "dictionary")
        return [[[c.get(k) for k in ident] for c in f.get("columns", [])], f.get("row_groups")]

    for same in _structures(files, key):
        f0 = same[0]
        cols = [_table_column(c, same) for c in f0.get("columns", [])]
        line = None
        if fmt == "csv":
            sample = [x for f in same for x in f.get("line_bytes_sample", [])]
            line = Distribution.from_values(sample) if sample else None
        ratios = [f["compression_ratio"] for f in same if f.get("compression_ratio")]
        out.append(
            TableFile(
                weight=round(len(same) / len(files), 6),
                bytes=_median_int([f["bytes"] for f in same]),
                file_bytes=_file_bytes(same),
                rows=_median_int([f.get("rows") for f in same]),
                row_groups=f0.get("row_groups"),
                row_group_rows=_median_int([(f.get("row_group_rows") or [None])[0] for f in same]),
                data_page_size=_median_int([f.get("data_page_size") for f in same]),
                data_page_values=_median_int([f.get("data_page_values") for f in same]),
                data_page_batch=_median_int([f.get("data_page_batch") for f in same]),
                data_page_version=max(
                    (f["data_page_version"] for f in same if f.get("data_page_version")),
                    default=None,
                ),
                compression_ratio=round(float(np.mean(ratios)), 6) if ratios else None,
                columns=cols,
                header=bool(f0.get("header", False)),
                delimiter=f0.get("delimiter"),
                line_bytes=line,
            )
        )
    return out


def layout_from_fingerprint(
    doc: dict[str, Any],
    fmt: str,
    paths: Sequence[str],
    spf: int,
    where: str = FINGERPRINT_NAME,
    reads: pl.DataFrame | None = None,
) -> LayoutResult | None:
    """The layout of the trace's dataset (*paths*, format *fmt*, *spf* samples per file) from
    fingerprint *doc*; None when the fingerprint has no group of that format. With the trace's
    dataset *reads*, the arrays of NPZ and HDF5 files that no read touched are marked
    ``read_per_sample: false`` (:func:`.unread.mark_unread`)."""
    group = find_group(doc, fmt, paths)
    files = own_files(group, paths) if group is not None else []
    if not files:  # none of the trace's own files sampled: sample them now, where they are here
        reachable = [p for p in dict.fromkeys(paths) if os.path.isfile(p)]
        group = find_group(fingerprint_dataset(files=reachable), fmt, paths) if reachable else None
        files = own_files(group, paths) if group is not None else []
        where = "fingerprint of the trace's dataset files made by distill"
    if group is None or not files:
        return None
    sampled = f"{len(files)} of {group.get('files', len(files)):,} files under {group.get('root')}"
    how = f"dataset fingerprint ({where}): {sampled}"
    res = LayoutResult(layout=Layout())
    res.fields["dataset.layout"] = (how, "measured")
    summary: dict[str, Any] = {"source": "fingerprint", "files_sampled": len(files)}
    gfmt = group.get("format")
    if gfmt in ("npz", "zip", "npy"):
        _npz_summary(_archive_members(files) if fmt == "pt" else files, spf, how, res, summary)
    elif gfmt == "hdf5":
        _hdf5_summary(files, spf, how, res, summary)
    elif gfmt in ("jpeg", "png"):
        summary["images"] = _images(files, gfmt)
        res.fields["dataset.layout.images"] = (
            f"dimensions, mode, coding (quality from the quantization tables); {how}",
            "measured",
        )
    elif gfmt in ("parquet", "csv"):
        summary["tables"] = _tables(files, gfmt)
        res.fields["dataset.layout.tables"] = (f"columns, row groups, codecs; {how}", "measured")
        res.notes.extend(str(f["note"]) for f in files[:1] if f.get("note"))
    elif gfmt == "tfrecord":
        _tfrecord_summary(files, how, res, summary)
    if reads is not None:
        mark_unread(summary, files, str(group.get("root", "")), str(gfmt), reads, res.fields)
    res.layout = Layout(**summary)
    if len(res.layout.arrays or res.layout.images or res.layout.tables or []) > 1:
        res.notes.append(
            f"dataset files differ: {len(res.layout.arrays or res.layout.images or res.layout.tables or [])} "
            f"structures among {len(files)} sampled files (weights in dataset.layout)"
        )
    return res


def _archive_members(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """*files* of ``torch.save`` archives with their members named without the archive's own
    folder (``sample_00007/data/0`` -> ``data/0``: torch names it after the file), so files
    of one structure are one structure."""
    out = []
    for f in files:
        members = [
            {**m, "name": str(m.get("name", "")).split("/", 1)[-1]} for m in f.get("members", [])
        ]
        out.append({**f, "members": members})
    return out


def _npz_summary(
    files: list[dict[str, Any]], spf: int, how: str, res: LayoutResult, summary: dict[str, Any]
) -> None:
    """NPZ (zip) members: arrays, whether any is deflated and at what level."""
    arrays, level = _npz_arrays(files, spf)
    deflated = [m for a in arrays for m in a.members if m.storage == "deflated"]
    summary.update(
        arrays=arrays, compressed=bool(deflated), compression_level=level if deflated else None
    )
    res.fields["dataset.layout.arrays"] = (
        f"members, dtypes, shapes, stored/deflated and compressed sizes; {how}",
        "measured",
    )
    res.fields["dataset.layout.compressed"] = ("deflated members in the sampled files", "measured")
    if deflated:
        res.fields["dataset.layout.compression_level"] = (
            "deflate level whose output size matches the members' (recompressed sample)",
            "inferred",
        )


def _hdf5_summary(
    files: list[dict[str, Any]], spf: int, how: str, res: LayoutResult, summary: dict[str, Any]
) -> None:
    """HDF5 datasets and file properties; the chunking and compression of the largest dataset."""
    arrays = _hdf5_arrays(files, spf)
    main = max(
        arrays[0].members,
        key=lambda m: int(np.prod(m.shape or [0])) * _itemsize(m.dtype),
        default=None,
    )
    summary.update(arrays=arrays, hdf5=_hdf5_file(files))
    if main is not None and main.storage == "chunked" and main.chunks:
        summary.update(
            hdf5_chunk_shape=list(main.chunks),
            hdf5_chunk_bytes=int(np.prod(main.chunks)) * _itemsize(main.dtype),
        )
    if main is not None and main.compression:
        summary.update(hdf5_compression=main.compression, compression_level=main.compression_level)
    res.fields["dataset.layout.arrays"] = (
        f"datasets, storage, chunks, filters, chunk order; {how}",
        "measured",
    )
    res.fields["dataset.layout.hdf5"] = (
        "superblock, user block, file-space strategy, alignment of data addresses",
        "measured",
    )
    for key in ("hdf5_chunk_shape", "hdf5_chunk_bytes", "hdf5_compression"):
        res.fields[f"dataset.layout.{key}"] = ("the largest dataset's", "measured")


def _tfrecord_summary(
    files: list[dict[str, Any]], how: str, res: LayoutResult, summary: dict[str, Any]
) -> None:
    """TFRecord payload lengths and records per file."""
    lengths = [x for f in files for x in f.get("record_bytes_sample", [])]
    if lengths:
        summary["record_bytes"] = Distribution.from_values(lengths)
        res.fields["dataset.layout.record_bytes"] = (f"TFRecord payload lengths; {how}", "measured")
    per_file = _median_int([f.get("records") for f in files])
    if per_file:
        summary["records_per_file"] = per_file
        res.fields["dataset.layout.records_per_file"] = (f"records per file; {how}", "measured")


def _itemsize(dtype: str) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 1


# --------------------------------------------------------------------------- trace-only inference


def infer_dlio_layout(
    fmt: str, reader_class: str, spf: int, file_sizes: Sequence[float]
) -> LayoutResult | None:
    """The layout DLIO 2.0.0's generator wrote (:mod:`dlreplay.dlio.generator`), for a DLIO trace
    (its reader events name *reader_class*) whose dataset cannot be fingerprinted: the
    sample's sides are those whose generated file has the trace's file sizes (bytes: the
    largest position read or seeked, or the bytes read between an open and its close).
    None when the sizes match no file DLIO generates (compressed, chunked, other sides)."""
    from dlreplay.dlio.generator import (
        DLIO_READER_FORMATS,
        dims_from_file_bytes,
        dims_from_image_bytes,
        generated_layout,
    )

    if fmt not in DLIO_READER_FORMATS.get(reader_class, ()) or not len(file_sizes):
        return None
    sizes = np.asarray(file_sizes, dtype=float)
    median = float(np.median(sizes))
    if fmt in ("jpeg", "png"):
        dims = dims_from_image_bytes(fmt, median)
        how = (
            f"the square grayscale {fmt.upper()} of noise DLIO's generator saves with Pillow's defaults that is "
            f"nearest the files' median size ({median:,.0f} B)"
            + (" (sides to 8 pixels)" if fmt == "jpeg" else "")
        )
    else:
        if float(sizes.max() - sizes.min()) > 0:
            return None  # DLIO's files of one run differ only when their sides are drawn at random
        # HDF5: the labels after the records are never read by DLIO's reader, so not seen
        dims = dims_from_file_bytes(
            fmt, spf, int(median), unseen=8 * spf + 64 if fmt == "hdf5" else 0
        )
        how = f"the sample whose DLIO {fmt} file has the files' size ({int(median):,} B, {spf} sample(s) per file)"
    if dims is None:
        return None
    layout = generated_layout(fmt, spf, dims)
    if layout is None:
        return None
    res = LayoutResult(layout=replace(layout, source="inferred"))
    res.fields["dataset.layout"] = (
        f"DLIO 2.0.0's {fmt} generator (the trace's reader is DLIO's {reader_class}): {dims[0]}x{dims[1]} uint8 "
        f"samples, {how}",
        "inferred",
    )
    return res


#: Size of a zip local file header: zipfile reads one per member it opens.
_ZIP_LOCAL_HEADER = 30


def infer_layout(fmt: str, reads: pl.DataFrame, record_length: float | None) -> LayoutResult:
    """What the trace's dataset reads show about the layout (``inferred``), for datasets
    that cannot be fingerprinted.

    * HDF5: reads much smaller than a record, most of one size -> chunks of that size;
    * NPZ: reads of a zip local header (30 B) per file open -> members per file (a note).
    """
    res = LayoutResult(layout=Layout())
    if reads.is_empty():
        res.fields["dataset.layout"] = ("no dataset reads: not visible in the trace", "default")
        return res
    sizes = reads["size"].drop_nulls()
    if fmt == "hdf5" and record_length:
        big = sizes.filter(sizes >= 1024)
        if big.len():
            mode = int(big.mode().sort()[-1])
            share = float((big == mode).sum()) / big.len()
            if mode < 0.5 * record_length and share >= 0.3:
                res.layout = Layout(source="inferred", hdf5_chunk_bytes=mode)
                res.fields["dataset.layout"] = (
                    "read sizes (no fingerprint: the dataset was not reachable)",
                    "inferred",
                )
                res.fields["dataset.layout.hdf5_chunk_bytes"] = (
                    f"most common dataset read ({mode} B, {100 * share:.0f} % of reads >= 1 KiB)",
                    "inferred",
                )
                return res
    if fmt == "npz":
        headers = reads.filter(pl.col("size") == _ZIP_LOCAL_HEADER)
        files = reads["file"].n_unique() if "file" in reads.columns else 0
        if headers.height and files:
            per_file = headers.height / max(reads.filter(pl.col("size") > 0)["file"].n_unique(), 1)
            res.notes.append(
                f"~{per_file:.1f} zip local-header reads per dataset file (members x reads): "
                f"member names, dtypes and compression need a fingerprint (distill --data-dir)"
            )
    res.fields["dataset.layout"] = (
        "not visible in the trace; pass --data-dir to fingerprint the dataset",
        "default",
    )
    return res
