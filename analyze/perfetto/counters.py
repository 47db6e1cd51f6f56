"""The timeline's two global counter tracks, as small polars tables of (``ts`` µs, ``value``):
read bandwidth in MB/s per :data:`BANDWIDTH_BIN_US` bin, and reads in flight."""

from __future__ import annotations

import polars as pl

from dlreplay.schema import READ_OPS

__all__ = ["BANDWIDTH_BIN_US", "bandwidth", "in_flight"]

#: Width of the read-bandwidth bins (microseconds).
BANDWIDTH_BIN_US = 100_000


def _empty() -> pl.DataFrame:
    return pl.DataFrame({"ts": [], "value": []}, schema={"ts": pl.Int64, "value": pl.Float64})


def bandwidth(events: pl.DataFrame) -> pl.DataFrame:
    """Read bandwidth per 100 ms bin: columns ``ts`` (µs, bin start), ``value`` (MB/s).

    A read's bytes count in the bin of its midpoint. Runs of equal values are collapsed.
    """
    reads = events.filter(
        pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("ts").is_not_null()
    )
    if reads.is_empty():
        return _empty()
    b = (
        reads.select(
            ((pl.col("ts") + pl.col("dur").fill_null(0) // 2) // BANDWIDTH_BIN_US).alias("bin"),
            "size",
        )
        .group_by("bin")
        .agg(pl.col("size").sum())
    )
    # Only bins with reads, and the empty bin after each (the value drops to 0 there): a
    # dense range of bins would need (last - first) / 100 ms rows (a bad timestamp years off
    # made that billions of rows).
    b = b.sort("bin")
    zeros = b.select(
        (pl.col("bin") + 1).alias("bin"), pl.lit(0, dtype=b.schema["size"]).alias("size")
    ).filter(~pl.col("bin").is_in(b["bin"].implode()))
    out = (
        pl.concat([b, zeros])
        .sort("bin")
        .select(
            (pl.col("bin") * BANDWIDTH_BIN_US).alias("ts"),
            (pl.col("size") / 1e6 / (BANDWIDTH_BIN_US / 1e6)).alias("value"),
        )
    )
    return out.filter((pl.col("value") != pl.col("value").shift(1)).fill_null(True))


def in_flight(events: pl.DataFrame) -> pl.DataFrame:
    """Reads in flight over all processes: columns ``ts`` (µs), ``value`` (count) at each change."""
    reads = events.filter(pl.col("name").is_in(READ_OPS) & pl.col("ts").is_not_null()).select(
        "ts", pl.col("dur").fill_null(0)
    )
    if reads.is_empty():
        return _empty()
    deltas = pl.concat(
        [
            reads.select(pl.col("ts"), pl.lit(1, pl.Int64).alias("d")),
            reads.select(
                (pl.col("ts") + pl.col("dur")).alias("ts"), pl.lit(-1, pl.Int64).alias("d")
            ),
        ]
    )
    return (
        deltas.group_by("ts")
        .agg(pl.col("d").sum())
        .sort("ts")
        .select("ts", pl.col("d").cum_sum().cast(pl.Float64).alias("value"))
        .filter(pl.col("value") != pl.col("value").shift(1, fill_value=-1.0))
    )
