"""Dataset fingerprint: the layout of a dataset's files, without their content.

A replay reproduces a job's I/O only if the regenerated files have the real files'
inside: an NPZ's members and whether they are deflated, an HDF5 file's chunking and
filters, a JPEG's dimensions, quantization tables and subsampling. The format's
library decides what to read from that layout. While the job's dataset is reachable
(``dlreplay capture``, or ``dlreplay distill --data-dir``), this module reads it:

* the dataset trees are listed (hidden files skipped) and their files grouped by root
  and extension; each group's format comes from the files' magic bytes;
* a bounded number of files per group (:class:`FingerprintLimits`), spread evenly over
  the sorted listing, are opened with the formats' own readers (``zipfile`` + numpy's
  header reader, h5py, Pillow, pyarrow) or by walking the container's framing (PNG
  chunks, TFRecord headers, JPEG markers before the first scan, tar headers, Arrow record
  batches' lengths); no sample data is
  kept, only structure: names, dtypes, shapes, storage, filters, sizes;
* file sizes come from ``stat`` (all files up to a bound, then a spread subset).

The result is a JSON document (:data:`FINGERPRINT_SCHEMA`, ``format_version``)
written as ``dataset-fingerprint.json`` in the trace directory. It is plain JSON,
readable without dlreplay; units: bytes, shapes and chunks in elements, seconds.
Files or trees that cannot be read, and files of unknown formats, are listed under
``problems`` (one line each) and never stop a capture.

Public API: :func:`fingerprint_dataset`, :func:`write_fingerprint`,
:func:`read_fingerprint`, :func:`opened_files`, :class:`FingerprintLimits`.

The package's modules: :mod:`.listing` (which files), :mod:`.formats` (which format, and
one file's layout) with one module per format (:mod:`.npz`, :mod:`.hdf5`, :mod:`.jpeg`,
:mod:`.png`, :mod:`.tfrecord`, :mod:`.parquet`, :mod:`.csvfile`, :mod:`.shards` for streamed
tar and Arrow shards), :mod:`.common` (limits and
shared helpers); this module fingerprints a dataset from them and saves the document.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

import dlreplay
from dlreplay.errors import ArtifactVersionError
from dlreplay.osutil import atomic_write_text

from .common import DEFAULT_LIMITS, FingerprintLimits, Unreadable, quantiles, spread
from .formats import detect_format, fingerprint_file
from .jpeg import jpeg_quality
from .listing import DATASET_EXTENSIONS, Listing, list_tree, opened_files

__all__ = [
    "DATASET_EXTENSIONS",
    "FINGERPRINT_FORMAT_VERSION",
    "FINGERPRINT_NAME",
    "FINGERPRINT_SCHEMA",
    "FingerprintLimits",
    "detect_format",
    "fingerprint_dataset",
    "fingerprint_file",
    "jpeg_quality",
    "opened_files",
    "read_fingerprint",
    "write_fingerprint",
]

FINGERPRINT_NAME = "dataset-fingerprint.json"
FINGERPRINT_SCHEMA = "dlreplay.dataset-fingerprint"
FINGERPRINT_FORMAT_VERSION = 1

#: Extensions of files that are never a dataset (the job's code, logs, our own artifacts).
_NOT_DATA = {".py", ".pyc", ".so", ".log", ".pfw", ".gz", ".yaml", ".yml", ".md", ".lock", ".pid"}


def _group_sizes(
    paths: list[str], limits: FingerprintLimits
) -> tuple[int, bool, dict[str, float] | None, int]:
    """(total bytes, estimated?, size quantiles, unreadable count) from stat of all or a spread subset."""
    idx = spread(len(paths), limits.max_stat)
    sizes: list[int] = []
    bad = 0
    for i in idx:
        try:
            sizes.append(os.stat(paths[i]).st_size)
        except OSError:
            bad += 1
    if not sizes:
        return 0, True, None, bad
    arr = np.asarray(sizes, dtype=np.int64)
    estimated = len(idx) < len(paths) or bad > 0
    total = int(arr.sum()) if not estimated else int(round(arr.mean() * len(paths)))
    return total, estimated, quantiles(arr), bad


def _fingerprint_group(
    root: str, ext: str, paths: list[str], limits: FingerprintLimits, problems: list[str]
) -> dict[str, Any]:
    """One group (files of one extension under one root): sizes, format, and the files
    sampled; what could not be read goes to *problems*."""
    paths.sort()
    total, estimated, sizes, unstat = _group_sizes(paths, limits)
    group: dict[str, Any] = {
        "root": root,
        "extension": ext,
        "files": len(paths),
        "bytes": total,
        "bytes_estimated": estimated,
        "file_size": sizes,
    }
    files: list[dict[str, Any]] = []
    formats: Counter[str] = Counter()
    unreadable: Counter[str] = Counter()
    unknown = 0
    for n, i in enumerate(spread(len(paths), limits.files_per_group)):
        path = paths[i]
        try:
            with open(path, "rb") as fh:
                head = fh.read(512)  # a tar's header names its format at byte 257
        except OSError as exc:
            unreadable[
                "permission denied"
                if isinstance(exc, PermissionError)
                else (exc.strerror or str(exc))
            ] += 1
            continue
        fmt = detect_format(head, ext)
        if fmt is None:
            unknown += 1
            continue
        try:
            entry = fingerprint_file(path, fmt, limits, probe_level=n < 4)
        except Unreadable as exc:
            unreadable[str(exc)] += 1
            continue
        formats[entry["format"]] += 1
        files.append(
            {
                "path": os.path.relpath(path, root)
                if os.path.isdir(root)
                else os.path.basename(path),
                **entry,
            }
        )
    where = f"{root} ({ext or 'no extension'}, {len(paths)} file{'s' if len(paths) != 1 else ''})"
    if unstat and not unreadable:
        problems.append(f"{where}: {unstat} file(s) could not be stat'ed")
    for reason, count in unreadable.items():
        problems.append(f"{where}: {count} sampled file(s) unreadable ({reason})")
    if unknown and not files:
        problems.append(f"{where}: format unknown (no recognised header): sizes only")
    group["format"] = formats.most_common(1)[0][0] if formats else None
    group["sampled"] = len(files)
    group["files_sampled"] = files
    if len(paths) <= LISTED_SIZES:  # a few files, each its own size (a token file and its split)
        group["file_bytes"] = {
            (os.path.relpath(f, root) if os.path.isdir(root) else os.path.basename(f)): nbytes
            for f in paths
            if (nbytes := _size_or_none(f)) is not None
        }
    return group


#: Groups of at most this many files list each file's size (``file_bytes``: path -> bytes).
LISTED_SIZES = 64


def _size_or_none(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def fingerprint_dataset(
    roots: Sequence[str | os.PathLike[str]] = (),
    files: Iterable[str] = (),
    limits: FingerprintLimits = DEFAULT_LIMITS,
    skip: Sequence[str | os.PathLike[str]] = (),
) -> dict[str, Any]:
    """Fingerprint the dataset trees *roots* and, when no root is given, the listed *files*.

    *files* (e.g. the files a job opened) are grouped by parent directory and extension.
    *skip*: directories left out of the listing (e.g. the trace directory itself).
    Never raises for an unreadable dataset: problems are listed in the document.
    """
    t0 = time.perf_counter()
    skip_set = frozenset(os.path.abspath(os.fspath(s)) for s in skip)
    problems: list[str] = []
    listings = _list_roots(roots, limits, skip_set, problems) if roots else _list_files(files)
    groups: list[dict[str, Any]] = []
    for listing in listings:
        for ext, paths in sorted(listing.groups.items(), key=lambda kv: -len(kv[1])):
            if ext in _NOT_DATA:
                continue
            groups.append(_fingerprint_group(listing.root, ext, paths, limits, problems))
    return {
        "schema": FINGERPRINT_SCHEMA,
        "format_version": FINGERPRINT_FORMAT_VERSION,
        "dlreplay_version": dlreplay.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "units": "bytes; shapes and chunks in elements; seconds",
        "seconds": round(time.perf_counter() - t0, 4),
        "limits": asdict(limits),
        "roots": [
            {"path": x.root, "listed": x.listed, "listing": "complete" if x.complete else "partial"}
            for x in listings
        ],
        "groups": groups,
        "problems": problems,
    }


def _list_roots(
    roots: Sequence[str | os.PathLike[str]],
    limits: FingerprintLimits,
    skip: frozenset[str],
    problems: list[str],
) -> list[Listing]:
    """The listing of each root; why one is incomplete goes to *problems*."""
    listings: list[Listing] = []
    for r in roots:
        root = os.path.abspath(os.fspath(r))
        listing = list_tree(root, limits, skip)
        if listing.problem:
            problems.append(listing.problem)
        if not listing.complete:
            problems.append(
                f"{root}: listing stopped after {listing.listed:,} files "
                f"({limits.list_seconds:g} s / {limits.max_listed:,} files); sampled from those"
            )
        listings.append(listing)
    return listings


def _list_files(files: Iterable[str]) -> list[Listing]:
    """*files* as listings, one per parent directory (hidden names left out)."""
    by_dir: dict[str, dict[str, list[str]]] = {}
    for f in files:
        p = os.path.abspath(f)
        if os.path.basename(p).startswith("."):
            continue
        by_dir.setdefault(os.path.dirname(p), {}).setdefault(
            os.path.splitext(p)[1].lower(), []
        ).append(p)
    return [
        Listing(root=d, groups=by_ext, listed=sum(map(len, by_ext.values())))
        for d, by_ext in sorted(by_dir.items())
    ]


def write_fingerprint(doc: dict[str, Any], trace_dir: str | os.PathLike[str]) -> Path:
    """Write *doc* as ``dataset-fingerprint.json`` in *trace_dir* (atomically); returns the path."""
    path = Path(trace_dir) / FINGERPRINT_NAME
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def read_fingerprint(trace_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The fingerprint saved in *trace_dir*, or None when there is none.

    Raises :class:`~dlreplay.errors.ArtifactVersionError` naming the file for another
    schema, a newer ``format_version`` or invalid JSON.
    """
    path = Path(trace_dir) / FINGERPRINT_NAME
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ArtifactVersionError(
            f"{path}: not a readable dataset fingerprint ({exc}); delete it or "
            f"pass --data-dir to fingerprint the dataset again"
        ) from None
    if not isinstance(doc, dict) or doc.get("schema") != FINGERPRINT_SCHEMA:
        raise ArtifactVersionError(
            f"{path}: not a dlreplay dataset fingerprint (schema "
            f"{doc.get('schema') if isinstance(doc, dict) else None!r}, expected "
            f"{FINGERPRINT_SCHEMA!r})"
        )
    version = doc.get("format_version")
    if not isinstance(version, int) or version > FINGERPRINT_FORMAT_VERSION:
        raise ArtifactVersionError(
            f"{path}: format_version {version!r} is newer than this dlreplay reads "
            f"({FINGERPRINT_FORMAT_VERSION}); upgrade dlreplay"
        )
    if not isinstance(doc.get("groups"), list):
        raise ArtifactVersionError(
            f"{path}: no 'groups' list; delete it or fingerprint the dataset again"
        )
    return doc
