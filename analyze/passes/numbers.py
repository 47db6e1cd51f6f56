"""JSON-safe numbers for the passes' results: rounded floats, polars scalars, and the
summary statistics of a series or of a histogram of read sizes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

__all__ = ["US", "hist_stats", "num", "rounded", "stats"]

#: Seconds per microsecond (the event table's ``ts`` and ``dur`` are µs).
US = 1e-6


def rounded(x: Any, nd: int = 6) -> float | None:
    """A JSON-safe rounded float (None for null/NaN)."""
    if x is None:
        return None
    v = float(x)
    return None if math.isnan(v) or math.isinf(v) else round(v, nd)


def num(x: Any) -> float:
    """A polars scalar (sum/median/max, possibly null) as a float, null as 0."""
    return float(x or 0)


def stats(values: pl.Series) -> dict[str, float | int | None]:
    """count/min/max/mean/median of a numeric series (JSON-safe)."""
    v = values.drop_nulls()
    if v.is_empty():
        return {"count": 0, "min": None, "max": None, "mean": None, "median": None}
    return {
        "count": int(v.len()),
        "min": rounded(v.min()),
        "max": rounded(v.max()),
        "mean": rounded(v.mean()),
        "median": rounded(v.median()),
    }


def hist_stats(hist: pl.DataFrame) -> dict[str, float | int | None]:
    """:func:`stats` of the read sizes counted in ``hist`` (``size``, ``n``: how many reads of
    that size), with ``bytes_weighted_median``: the transfer size that moves the median byte
    (half the bytes go in reads at most this big). The same figures as from one row per
    read, from a table of distinct sizes."""
    h = hist.filter(pl.col("size").is_not_null()).sort("size")
    count = int(h["n"].sum() or 0)
    if not count:
        return {
            "count": 0,
            "min": None,
            "max": None,
            "mean": None,
            "median": None,
            "bytes_weighted_median": None,
        }
    sizes, n = h["size"].to_numpy(), h["n"].to_numpy()
    cum = np.cumsum(n)
    lower, upper = (
        sizes[np.searchsorted(cum, (count - 1) // 2, "right")],
        sizes[np.searchsorted(cum, count // 2, "right")],
    )
    moved = np.cumsum(sizes.astype(np.float64) * n)
    total = int((h["size"].cast(pl.Int64) * h["n"]).sum())
    return {
        "count": count,
        "min": rounded(sizes[0]),
        "max": rounded(sizes[-1]),
        "mean": rounded(total / count),
        "median": rounded((float(lower) + float(upper)) / 2),
        "bytes_weighted_median": rounded(sizes[int(np.searchsorted(moved, total / 2, "left"))])
        if total
        else None,
    }
