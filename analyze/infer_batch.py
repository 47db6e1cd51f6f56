"""POSIX-only batch size where a worker's gaps show no clear period (the batches of a worker
follow each other at once: prefetched, or an I/O-bound loader), by the position of the long
gaps in each worker's epoch. Used by :mod:`.infer`; times are µs as in the frame.

A DataLoader worker builds whole batches: it reads a batch's samples back to back, then
collates the batch and hands it over (and idles, when the consumer is behind), so the idle
time before sample B, 2B, ... of its epoch is longer than its neighbours', in every worker
and every epoch, while the other long gaps (the process descheduled on a busy host, a
garbage collection) fall anywhere. Each gap is ranked within its own sequence (a worker's
epoch) and kind (the same file as the sample before, or another: opening another file costs
more, and in an unshuffled run file changes are periodic too); for a candidate B the score is
the mean rank (0 to 1) of the gaps at its positions: by chance, the mean of that many
uniform ranks (its tail from the Irwin-Hall distribution). B is the smallest candidate whose
score stands out (chance below :data:`ALPHA` over all the candidates tried, and a mean rank
of :data:`MIN_SCORE` or more) and holds nearly all of the best score's excess over chance (a
divisor of B dilutes its score with inner gaps, a multiple keeps it)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

__all__ = ["ALPHA", "MIN_SCORE", "batch_from_gap_ranks", "chance", "idle_gaps"]

#: the chance of a candidate's mean rank by luck, times the candidates tried, must be below this.
#: 1e-2: of the sweep's 85 POSIX-only runs that reach this test, each with its gaps shuffled
#: within each worker's epoch 10 times, 2 of 850 found a batch (0 at 1e-3); on the runs
#: themselves 5 more right than at 1e-3 and none wrong
ALPHA = 1e-2
#: ... and at least this mean rank (the batch's gap is among the longest of its sequence)
MIN_SCORE = 0.8
#: the smallest candidate keeping this share of the best excess over chance wins
KEEP = 0.8
#: a worker's samples in an epoch must be whole batches (the last one of an epoch may be short)
WHOLE_BATCHES = 0.75


def idle_gaps(visits: pl.DataFrame, io: pl.DataFrame) -> pl.DataFrame:
    """``visits`` (pid, file, ts, epoch) with ``gap``: the longest time (µs) the process did no
    I/O on the dataset since its previous visit (each call's silence runs from the end of
    the process's latest call, of any kind; a sample of a held-open file is found by small
    reads of its index before its own read: the silence is before those), and
    ``other_file``: the visit is to another file than the process's previous one."""
    calls = (
        io.select("pid", "ts", (pl.col("ts") + pl.col("dur").fill_null(0)).alias("c_end"))
        .sort("ts")
        .with_columns(
            (pl.col("ts") - pl.col("c_end").cum_max().shift(1).over("pid"))
            .clip(lower_bound=0)
            .alias("silence")
        )
        .filter(pl.col("silence").is_not_null())
    )
    v = visits.sort("ts").with_row_index("__v")
    # each call counts for the first visit of its process at or after it
    owner = calls.join_asof(
        v.select("pid", pl.col("ts").alias("v_ts"), "__v"),
        left_on="ts",
        right_on="v_ts",
        by="pid",
        strategy="forward",
        check_sortedness=False,
    )
    longest = owner.group_by("__v").agg(pl.col("silence").max().alias("gap"))
    first = pl.int_range(pl.len()).over("pid", "epoch") == 0
    return (
        v.join(longest, on="__v", how="left")
        .sort("ts")
        .with_columns(
            pl.when(first).then(None).otherwise(pl.col("gap")).alias("gap"),
            (pl.col("file") != pl.col("file").shift(1).over("pid", "epoch")).alias("other_file"),
        )
        .drop("__v")
    )


def _ranked(v: pl.DataFrame) -> list[np.ndarray]:
    """Per process and epoch (in time order): each gap's rank (0 to 1) among the gaps of the
    same kind in that sequence; the first sample's (no gap) is NaN."""
    seqs = []
    for _, g in v.sort("ts").group_by("pid", "epoch", maintain_order=True):
        if g.height < 4:
            continue
        gap = g["gap"].to_numpy().astype(float)
        kind = g["other_file"].fill_null(True).to_numpy()
        r = np.full(g.height, np.nan)
        for k in (False, True):
            idx = np.flatnonzero(kind == k)
            idx = idx[idx > 0]
            if idx.size >= 3:
                order = gap[idx].argsort().argsort()
                r[idx] = (order + 0.5) / idx.size  # mid-ranks: uniform on (0, 1) by chance
        seqs.append(r)
    return seqs


def _score(seqs: list[np.ndarray], b: int) -> tuple[float, int, float]:
    """(mean rank at positions B, 2B, ..., how many, share of sequences of whole batches)."""
    at = [s[b::b] for s in seqs]
    vals = np.concatenate(at) if at else np.array([])
    vals = vals[~np.isnan(vals)]
    # whole batches: a sequence of m samples holds m/B batches (one short batch per epoch)
    whole = float(np.mean([len(s) % b == 0 for s in seqs])) if seqs else 0.0
    return (float(vals.mean()) if vals.size else 0.5), int(vals.size), whole


def chance(n: int, score: float) -> float:
    """The probability that the mean of ``n`` independent uniform ranks is ``score`` or more
    (Irwin-Hall; the normal approximation above 20 ranks)."""
    x = n * (1.0 - score)  # the sum of (1 - rank): at most x
    if x <= 0:
        return 0.0
    if n > 20:
        z = (score - 0.5) / math.sqrt(1 / (12 * n))
        return 0.5 * math.erfc(z / math.sqrt(2))
    cdf = sum((-1) ** k * math.comb(n, k) * (x - k) ** n for k in range(int(x) + 1))
    return min(max(cdf / math.factorial(n), 0.0), 1.0)


def batch_from_gap_ranks(v: pl.DataFrame) -> tuple[int | None, str]:
    """(batch size or None, evidence) from the rank of the gaps at every B-th sample of each
    worker's epoch (``v`` from :func:`idle_gaps`; see the module doc)."""
    seqs = _ranked(v)
    if len(seqs) < 2:
        return None, "fewer than two sequences of 4 or more samples"
    longest = max(len(s) for s in seqs)
    found = []
    for b in range(2, longest // 2 + 1):
        score, n, whole = _score(seqs, b)
        if n < 2 or whole < WHOLE_BATCHES:
            continue
        found.append((b, score, n, chance(n, score)))
    tried = max(len(found), 1)
    strong = [f for f in found if f[3] * tried < ALPHA and f[1] >= MIN_SCORE]
    if not strong:
        best = min(found, key=lambda f: f[3], default=None)
        told = (
            f"best {best[0]}: mean rank {best[1]:.2f}, chance {best[3] * tried:.1g}"
            if best
            else "none"
        )
        return None, f"no position of the long gaps shared by the workers' epochs ({told})"
    top = max(f[1] for f in strong) - 0.5
    b, score, n, p = min((f for f in strong if f[1] - 0.5 >= KEEP * top), key=lambda f: f[0])
    # a divisor of B whose positions are likelier than chance still (more so than B's) but
    # whose mean rank fell short: B's positions are a part of its, and B may be its multiple
    # (seen under CPU load: batch 2 at chance 2e-5, mean rank 0.78; 4 at 0.006, 0.81)
    under = [f for f in found if f[0] < b and b % f[0] == 0 and f[3] < p and f[1] < MIN_SCORE]
    if under:
        d = min(under, key=lambda f: f[3])
        return None, (
            f"no position of the long gaps shared by the workers' epochs: {b} (mean rank "
            f"{score:.2f}, chance {p * tried:.1g}) is a multiple of {d[0]} (mean rank "
            f"{d[1]:.2f}, chance {d[3] * tried:.1g}), likelier but under {MIN_SCORE}"
        )
    return b, (
        f"the gap before every {b}th sample of a worker's epoch ranks {score:.2f} among its "
        f"sequence's gaps ({n} batch boundaries in {len(seqs)} worker-epochs; by chance "
        f"{p * tried:.1g})"
    )
