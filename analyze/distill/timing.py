"""Where a consumer's epochs spent their time: the steady and warm-up compute of its steps,
the waits for batches, checkpoints, and the time around its epochs (the train section's
timing fields)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from dlreplay.model import Distribution

from .base import US, num
from .measure import WARMUP_FACTOR, warmup_steps

__all__ = ["TimingModel", "timing_model"]


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
        parts = ", ".join(
            f"{k.replace('_', ' ')} {v:.3f} s" for k, v in c.items() if k != "unattributed"
        )
        un = c.get("unattributed", 0.0)
        share = 100.0 * un / self.total_s if self.total_s > 0 else 0.0
        return (
            f"timing: {self.total_s:.3f} s in {self.epochs} epoch(s) on the training process: {parts}; "
            f"unattributed {un:.3f} s ({share:.1f} %)"
        )


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
    return (
        Distribution.from_values(cpu[measured].astype(float) * US),
        max(1, int(round(float(np.median(threads))))) if threads.size else 1,
    )


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
    values = st["compute_us"].fill_null(0).to_numpy() * US
    warm = warmup_steps(values)
    steady_mask, epoch_warm = _steady_steps(st, values, warm)
    comps = {
        "epoch_start": 0.0,
        "fetch_wait": 0.0,
        "step_compute": float(values[warm:].sum()),
        "warmup_compute": float(values[:warm].sum()),
        "checkpoint": 0.0,
        "epoch_end": 0.0,
        "unattributed": 0.0,
    }
    end_gaps = np.array([])
    total = 0.0
    ep = epochs.sort("ts").select(pl.col("ts").alias("e_ts"), pl.col("end").alias("e_end"))
    if ep.height:
        parts, total, end_gaps = _epoch_times(st, ep, probes, saves)
        comps.update(parts)
    host_cpu, host_threads = _host_cpu(st, steady_mask)
    return TimingModel(
        computation_time=Distribution.from_values(values[steady_mask]),
        computation_host_cpu=host_cpu,
        computation_host_threads=host_threads,
        warmup_computation_time=[round(float(v), 6) for v in values[:warm]],
        epoch_warmup_computation_time=epoch_warm,
        epoch_end_time=Distribution.from_values(end_gaps)
        if end_gaps.size
        else Distribution.fixed(0.0),
        components=comps,
        total_s=total,
        epochs=ep.height,
    )


def _steady_steps(
    st: pl.DataFrame, values: np.ndarray, warm: int
) -> tuple[np.ndarray, list[float]]:
    """(which steps are steady, the later epochs' warm-up compute by position): the steps after
    the run's *warm* warm-up ones, less the leading steps of later epochs that are slower
    than ``WARMUP_FACTOR`` x the steady median (modelled by position instead)."""
    idx = np.arange(values.size)
    steady_mask = idx >= warm if values.size > warm else np.ones(values.size, dtype=bool)
    steady_median = float(np.median(values[steady_mask]))
    # later epochs' leading steps, position by position (median over those epochs)
    first_epoch = st["epoch"].min()
    later = st.with_columns(pl.Series("s", values)).filter(pl.col("epoch") != first_epoch)
    epoch_warm: list[float] = []
    if later.height:
        pos = later.group_by("pos").agg(pl.col("s").median()).sort("pos")["s"].to_numpy()
        n = _leading_warmup(pos, steady_median)
        epoch_warm = [round(float(v), 6) for v in pos[: min(n, max(1, pos.size // 2))]]
        if epoch_warm:  # those steps are modelled by position: keep them out of the steady state
            keep = (idx >= warm) & ~(
                (st["epoch"] != first_epoch).to_numpy() & (st["pos"].to_numpy() < len(epoch_warm))
            )
            if keep.any():
                steady_mask = keep
    return steady_mask, epoch_warm


def _in_epoch(frame: pl.DataFrame, stamp: pl.DataFrame) -> pl.DataFrame:
    """``frame``'s rows tagged with the epoch (``e``) they start in; rows before the first
    epoch dropped."""
    return (
        frame.sort("ts")
        .join_asof(
            stamp, left_on="ts", right_on="e_ts", strategy="backward", check_sortedness=False
        )
        .filter(pl.col("e").is_not_null())
    )


def _epoch_sums(
    st: pl.DataFrame, ep: pl.DataFrame, probes: pl.DataFrame, saves: pl.DataFrame
) -> pl.DataFrame:
    """The epochs ``ep`` (with ``e``, ``next_ts``) with what their steps, end-of-epoch fetches
    and checkpoint saves add up to (microseconds; 0 where none): the first batch's lead-in and
    wait, the other waits, compute, in-loop checkpoints, probes, saves after the epoch's end
    and when the last of them ends."""
    stamp = ep.select("e", "e_ts")
    first = pl.col("pos") == 0
    per = (
        _in_epoch(st, stamp)
        .group_by("e")
        .agg(
            (pl.col("lead_in_us").fill_null(0) + pl.col("wait_us").fill_null(0))
            .filter(first)
            .sum()
            .alias("start_us"),
            pl.col("wait_us").fill_null(0).filter(~first).sum().alias("wait_us"),
            pl.col("compute_us").fill_null(0).sum().alias("compute_us"),
            pl.col("ckpt_us").fill_null(0).sum().alias("ckpt_us"),
        )
    )
    pr = (
        _in_epoch(probes.select("ts", pl.col("dur").fill_null(0)), stamp)
        .group_by("e")
        .agg(pl.col("dur").sum().alias("probe_us"))
    )
    sv = _in_epoch(saves.select("ts", pl.col("dur").fill_null(0)), stamp).join(
        ep.select("e", "e_end"), on="e"
    )
    after = (
        sv.filter(pl.col("ts") >= pl.col("e_end"))
        .group_by("e")
        .agg(
            pl.col("dur").sum().alias("sv_after"),
            (pl.col("ts") + pl.col("dur")).max().alias("sv_last"),
        )
    )
    return (
        ep.join(per, on="e", how="left")
        .join(pr, on="e", how="left")
        .join(after, on="e", how="left")
        .with_columns(
            pl.col(
                "start_us", "wait_us", "compute_us", "ckpt_us", "probe_us", "sv_after"
            ).fill_null(0)
        )
    )


def _epoch_times(
    st: pl.DataFrame, ep: pl.DataFrame, probes: pl.DataFrame, saves: pl.DataFrame
) -> tuple[dict[str, float], float, np.ndarray]:
    """(the components measured per epoch, the epochs' total time, the gaps between epochs),
    seconds, from the steps *st*, the epoch spans *ep* (``e_ts``, ``e_end``), the end-of-epoch
    fetches and the checkpoint saves."""
    ep = ep.with_columns(pl.col("e_ts").shift(-1).alias("next_ts")).with_row_index("e")
    t = _epoch_sums(st, ep, probes, saves)
    t = t.with_columns(
        # the epoch ends when the next one begins; the last one after its trailing saves
        pl.coalesce("next_ts", pl.max_horizontal("e_end", "sv_last")).alias("stop"),
    ).with_columns(
        (pl.col("stop") - pl.col("e_end") - pl.col("sv_after")).clip(lower_bound=0).alias("end_us"),
        (
            pl.col("e_end")
            - pl.col("e_ts")
            - pl.col("start_us")
            - pl.col("wait_us")
            - pl.col("probe_us")
            - pl.col("compute_us")
            - pl.col("ckpt_us")
        )
        .clip(lower_bound=0)
        .alias("un_us"),
    )
    parts = {
        "epoch_start": num(t["start_us"].sum()) * US,
        "fetch_wait": num((t["wait_us"] + t["probe_us"]).sum()) * US,
        "checkpoint": num((t["ckpt_us"] + t["sv_after"]).sum()) * US,
        "epoch_end": num(t["end_us"].sum()) * US,
        "unattributed": num(t["un_us"].sum()) * US,
    }
    total = num((t["stop"] - t["e_ts"]).sum()) * US
    end_gaps = t.filter(pl.col("next_ts").is_not_null())["end_us"].to_numpy() * US
    return parts, total, end_gaps
