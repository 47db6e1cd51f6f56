"""What the finding rules share: :class:`Thresholds` (every number they compare against),
:class:`Finding` (one diagnosed problem), the :data:`Rule` signature and the helpers that read
the characterization the same way for every rule (the library behind the dataset's reads, the
loader workers per rank). The rules themselves are in ``loader`` (the input pipeline),
``reads`` (how the dataset is read) and ``checkpoint``; the package's ``find`` runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from ..distill.measure import workers_per_rank
from ..passes import Characterization

SEVERITIES = ("high", "medium", "low", "info")


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules compare against. Units in the field comments."""

    au_target: float = 0.90  # AU below this: the accelerator waits for data (MLPerf unet3d: 0.90)
    au_high: float = 0.70  # AU below this makes data-wait findings high severity
    worker_busy_low: float = 0.25  # ... idler than this (with AU at target) are more than needed
    small_read_bytes: int = (
        64 << 10
    )  # reads below this (bytes) are small (half the bytes moved in them)
    small_reads_per_sample: float = (
        4.0  # a sample taking at least this many reads is read in pieces
    )
    seeks_per_read: float = 1.0  # dataset lseeks per read at or above this: interleaved seeks
    meta_time_share: float = 0.30  # metadata calls' share of dataset I/O time at or above this
    small_file_bytes: int = (
        1 << 20
    )  # files below this (bytes) opened once per sample are "small files"
    small_file_count: int = 100  # ... when there are at least this many
    random_fraction: float = (
        0.30  # share of non-sequential dataset reads at or above this is random
    )
    large_file_bytes: int = 1 << 20  # files at least this big (bytes) count as large shared files
    imbalance_ratio: float = 1.5  # max/median (items or busy time of workers; epoch time of ranks)
    checkpoint_share: float = 0.05  # training blocked in checkpoint saves, share of the run
    checkpoint_share_high: float = 0.20  # ... high severity from this share
    checkpoint_write_bytes: int = (
        1 << 20
    )  # median checkpoint write call below this (bytes) is small
    preprocess_ratio: float = 5.0  # item time / POSIX time inside items at or above this
    device_bandwidth_bps: float = (
        3.0e9  # in-call read bandwidth above this (bytes/s) can only be page cache
    )
    cache_memory_share: float = (
        0.5  # dataset smaller than this share of host RAM and re-read: cached
    )
    overlap_min: float = 0.5  # share of dataset I/O time overlapped with compute below this
    io_share_min: float = 0.05  # ... only when dataset I/O is at least this share of the run
    startup_wait_share: float = 0.5  # epoch-start waits at or above this share of all data wait
    startup_wait_s: float = 0.5  # ... and at least this many seconds in all
    mapped_stall_share: float = 0.05  # extra data time of steps with cold mapped pages / loop time
    mapped_stall_share_high: float = 0.20  # ... high severity from this share
    mapped_warm_share: float = 0.01  # mapped windows' pages found cold at most this share: cached


@dataclass
class Finding:
    """One diagnosed problem. ``evidence`` values are numbers from the trace (units in keys)."""

    id: str
    severity: str
    title: str
    evidence: dict[str, Any]
    threshold: str
    root_cause: str
    recommendation: str
    impact_s: float = 0.0
    kind: str = "cause"  # "symptom" (what training feels: data-wait) or "cause" (why)
    files: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    whatif: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


Rule = Callable[[Characterization, Thresholds], list[Finding]]
"""A rule: (characterization, thresholds) -> the findings it emits."""


#: Which library issues the reads, by dataset file extension (for the root cause).
LIBRARY_OF = {
    ".npz": (
        "numpy.load on a zip archive",
        "zipfile reads each member's local header (tens of bytes) and numpy "
        "reads the array through the zip stream in pieces of at most 256 KiB (numpy.lib.format's "
        "BUFFER_SIZE)",
    ),
    ".npy": ("numpy.load", "numpy reads the header, then the array in pieces of at most 256 KiB"),
    ".h5": (
        "h5py / the HDF5 library",
        "HDF5 reads the superblock, object headers and B-tree/heap metadata in "
        "small pieces, then one read per chunk",
    ),
    ".hdf5": (
        "h5py / the HDF5 library",
        "HDF5 reads metadata in small pieces, then one read per chunk",
    ),
    ".jpg": (
        "Pillow (PIL.Image.open / load)",
        "Pillow parses JPEG markers a few bytes at a time and reads the "
        "data in small blocks; through an unbuffered file object every one is a read(2)",
    ),
    ".jpeg": ("Pillow (PIL.Image.open / load)", "Pillow parses markers a few bytes at a time"),
    ".png": ("Pillow (PIL.Image.open / load)", "Pillow reads PNG chunks one at a time"),
    ".tfrecord": ("the TFRecord reader", "records are read one length-prefixed record at a time"),
    ".parquet": ("pyarrow", "Parquet footers and column chunks are read separately"),
    ".csv": ("the CSV reader", "rows are read line by line"),
}


def top_extension(c: Characterization) -> str:
    """The dataset file extension that moves the most bytes ('' when none)."""
    exts = c["transfer"].get("extensions") or {}
    return max(exts, key=lambda e: exts[e]) if exts else ""


def reading_library(c: Characterization) -> tuple[str, str]:
    """(library, how it reads) for the dataset's main extension (:data:`LIBRARY_OF`)."""
    return LIBRARY_OF.get(
        top_extension(c), ("the data-loading code", "the reader issues many small read calls")
    )


def dataset_files(c: Characterization, n: int = 5) -> list[str]:
    """The first ``n`` dataset files of the access pass (for a finding's ``files``)."""
    return [r["file"] for r in c["access"].get("per_file", [])[:n]]


def loader_workers(c: Characterization) -> int:
    """Loader workers per rank (0 = the consumer reads itself)."""
    v = c.view
    if not v.workers:
        return 0
    wi = v.items.filter(pl.col("pid").is_in(v.workers))
    return max(workers_per_rank(wi, v.epochs, v.consumers or [0]), 1)


def median_worker_busy(c: Characterization) -> float | None:
    """The median busy share of the loader workers (None without workers)."""
    busy = [
        p["busy"]
        for p in c["processes"]["processes"]
        if p["role"] == "worker" and p["busy"] is not None
    ]
    if not busy:
        return None
    busy.sort()
    return busy[len(busy) // 2]
