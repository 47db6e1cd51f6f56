"""What every part of the fingerprint shares: its bounds, the error a file that cannot be
inspected raises, and the sampling and summary helpers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FingerprintLimits:
    """Bounds that keep a fingerprint to seconds on any dataset size.

    ``files_per_group``: files opened per group (root x extension); ``max_listed``:
    directory entries listed per root and ``list_seconds`` the time budget for it;
    ``max_stat``: files whose size is read per group (beyond it, totals are estimated
    from a spread subset); ``records_per_file``: TFRecord headers walked per file;
    ``text_bytes``: bytes of a CSV read for line lengths; ``chunks_per_dataset``: HDF5
    chunk addresses inspected per dataset; ``level_probe_bytes``: largest NPZ member
    recompressed to estimate its deflate level (bytes).
    """

    files_per_group: int = 24
    max_listed: int = 2_000_000
    list_seconds: float = 10.0
    max_stat: int = 20_000
    records_per_file: int = 4096
    text_bytes: int = 1 << 20
    chunks_per_dataset: int = 20_000
    level_probe_bytes: int = 4 << 20
    max_objects: int = 256


#: The bounds a fingerprint uses unless told otherwise.
DEFAULT_LIMITS = FingerprintLimits()


class Unreadable(Exception):
    """A file could not be inspected; the message says why (one line)."""


def spread(n: int, k: int) -> list[int]:
    """*k* indices spread evenly over range(n) (first and last included)."""
    if n <= k:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, k)})


def quantiles(arr: np.ndarray) -> dict[str, float]:
    """min, max, mean, stdev and the 25th..99th percentiles of *arr*."""
    a = np.asarray(arr, dtype=float)
    qs = np.percentile(a, [25, 50, 75, 90, 99])
    return {
        "min": float(a.min()),
        "max": float(a.max()),
        "mean": float(a.mean()),
        "stdev": float(a.std()),
        **{f"p{q}": float(v) for q, v in zip((25, 50, 75, 90, 99), qs, strict=True)},
    }
