"""Which files make up the dataset: the trees listed (bounded in entries and time), or the
dataset files a job opened, as its trace names them."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .common import FingerprintLimits

#: Extensions the fingerprint treats as dataset files when picking opened files.
DATASET_EXTENSIONS = {
    ".npz",
    ".npy",
    ".h5",
    ".hdf5",
    ".hdf",
    ".he5",
    ".nc",
    ".jpg",
    ".jpeg",
    ".png",
    ".tfrecord",
    ".tfrecords",
    ".csv",
    ".tsv",
    ".parquet",
    ".pq",
    ".bin",
    ".idx",
    ".raw",
    ".dat",
    ".zip",
    ".tar",  # shards (WebDataset), streamed by an IterableDataset
    ".arrow",  # Arrow IPC files (HF datasets' cache)
    ".pt",  # torch.save archives a sample (checkpoints too: a group of their own)
    ".pth",
}


@dataclass
class Listing:
    """The regular files under *root*, by extension; ``complete`` False when a bound stopped
    the listing, ``problem`` a one-line reason when (part of) the tree could not be listed."""

    root: str
    groups: dict[str, list[str]]
    listed: int = 0
    complete: bool = True
    problem: str | None = None


def list_tree(root: str, limits: FingerprintLimits, skip: frozenset[str]) -> Listing:
    """Regular files under *root* grouped by extension (hidden names and *skip* left out)."""
    out = Listing(root=root, groups={})
    if os.path.isfile(root):
        out.groups.setdefault(Path(root).suffix.lower(), []).append(root)
        out.listed = 1
        return out
    deadline = time.monotonic() + limits.list_seconds
    stack = [root]
    denied = 0
    while stack:
        d = stack.pop()
        try:
            if not _scan_dir(d, out, stack, limits, deadline, skip):
                out.complete = False
                return out
        except OSError as exc:
            denied += _unlistable(out, d, exc)
    if denied and out.problem is None:
        out.problem = f"{root}: {denied} director{'y' if denied == 1 else 'ies'} could not be listed (permission)"
    return out


def _scan_dir(
    d: str,
    out: Listing,
    stack: list[str],
    limits: FingerprintLimits,
    deadline: float,
    skip: frozenset[str],
) -> bool:
    """List the directory *d* into *out* and push its subdirectories on *stack*; False when
    the listing reached its bound (entries, or time) and stops there."""
    with os.scandir(d) as it:
        for e in it:
            if e.name.startswith("."):
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.path not in skip:
                        stack.append(e.path)
                    continue
                if not (e.is_file() or (e.is_symlink() and not os.path.exists(e.path))):
                    continue  # a broken link is listed: reading it reports the problem
            except OSError:
                continue
            out.groups.setdefault(os.path.splitext(e.name)[1].lower(), []).append(e.path)
            out.listed += 1
            if out.listed >= limits.max_listed or (
                out.listed & 1023 == 0 and time.monotonic() > deadline
            ):
                return False
    return True


def _unlistable(out: Listing, d: str, exc: OSError) -> int:
    """Note why the directory *d* could not be listed (the root's reason becomes the listing's
    problem); 1 when it counts among the directories the listing was denied, else 0."""
    root = out.root
    if isinstance(exc, FileNotFoundError):
        if d == root:
            out.problem = f"{root}: no such directory"
        return 0
    if isinstance(exc, PermissionError):
        if d == root:
            out.problem = f"{root}: permission denied"
        return 1
    if isinstance(exc, NotADirectoryError):
        out.problem = f"{root}: not a directory"
        return 0
    if d == root:
        out.problem = f"{root}: cannot list ({exc.strerror or exc})"
    return 1


_FH_NAME = re.compile(rb'"name":"FH".*?"name":"((?:[^"\\]|\\.)*)"')


def opened_files(
    trace_files: Iterable[str | os.PathLike[str]], max_bytes: int = 256 << 20
) -> list[str]:
    """Paths of dataset-like files named in DFTracer's ``FH`` records of *trace_files*.

    Only files with a dataset extension (:data:`DATASET_EXTENSIONS`) outside the Python
    installation are kept. Traces larger than *max_bytes* (compressed) are not scanned.
    """
    import sys

    from dlreplay.pfw import decompress

    paths = [Path(p) for p in trace_files]
    if sum(p.stat().st_size for p in paths if p.exists()) > max_bytes:
        return []
    prefixes = tuple({sys.prefix, sys.base_prefix, "/usr/", "/proc/", "/sys/", "/dev/"})
    found: set[str] = set()
    for p in paths:
        try:
            text = decompress(p).data
        except OSError:
            continue
        for m in _FH_NAME.finditer(text):
            name = m.group(1).decode("utf-8", "replace").replace("\\/", "/")
            if os.path.splitext(name)[1].lower() in DATASET_EXTENSIONS and not name.startswith(
                prefixes
            ):
                found.add(name)
    return sorted(f for f in found if os.path.isfile(f))
