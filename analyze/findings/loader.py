"""Finding rules about the input pipeline: the accelerator waiting for data, too few or idle
loader workers, imbalance between workers or ranks, per-sample decoding, I/O not overlapped
with compute and workers restarted every epoch."""

from __future__ import annotations

import math

import polars as pl

from dlreplay.units import human_seconds

from ..passes import Characterization
from .base import (
    Finding,
    Thresholds,
    loader_workers,
    median_worker_busy,
    reading_library,
)
from .mapped import mapped_loop


def rule_data_wait(c: Characterization, t: Thresholds) -> list[Finding]:
    """AU counting data waits only (checkpoint stalls have findings of their own)."""
    s = c["steps"]
    au = s.get("au_data", s.get("au"))
    if au is None or au >= t.au_target:
        return []
    without = " without checkpoint time" if (s.get("checkpoint_s") or 0) > 0 else ""
    return [
        Finding(
            id="data-wait",
            severity="high" if au < t.au_high else "medium",
            title=f"The training loop waits for data: AU {au:.0%}{without} (target {t.au_target:.0%})",
            evidence={
                "au_data": au,
                "au": s.get("au"),
                "wait_s": s["wait_s"],
                "compute_s": s["compute_s"],
                "checkpoint_s": s["checkpoint_s"],
                "steps": s["steps"] - s["warmup_steps"],
                "steps_waiting_longer_than_compute": s["steps_waiting_longer_than_compute"],
                "median_wait_s": s["median_wait_s"],
                "median_compute_s": s["median_compute_s"],
                "worst_waits": s["worst_waits"][:3],
            },
            threshold=f"compute / (compute + data wait) < {t.au_target} (high below {t.au_high})",
            root_cause=(
                f"Batches arrive slower than the model consumes them: the consumer spent "
                f"{human_seconds(s['wait_s'])} waiting and {human_seconds(s['compute_s'])} computing over "
                f"{s['steps'] - s['warmup_steps']} steady-state steps. See the other findings for why the "
                "loader is slow."
            ),
            recommendation="Fix the loader bottleneck named by the findings below (workers, read sizes, file "
            "layout), then re-measure AU; `dlreplay analyze --verify` predicts the effect by replay.",
            impact_s=float(s["wait_s"] or 0.0),
            processes=sorted({w["pid"] for w in s["worst_waits"]}),
            kind="symptom",
        )
    ]


def rule_workers(c: Characterization, t: Thresholds) -> list[Finding]:
    """Too few workers: the consumer waits in steady state (first batch of each epoch excluded).

    In steady state with the loader as the bottleneck, n workers deliver one batch per
    (compute + wait); n / AU workers would deliver one per compute step. The
    recommendation adds 25 % headroom.
    """
    if mapped_loop(c):  # no DataLoader to add workers to: mapped-inline-batches says why it waits
        return []
    s = c["steps"]
    au, steady = s.get("au"), s.get("au_data_steady", s.get("au_steady"))
    n = loader_workers(c)
    busy = median_worker_busy(c)
    out: list[Finding] = []
    if steady is not None and steady < t.au_target:
        more = max(n + 1, math.ceil(max(n, 1) / max(steady, 0.05) * 1.25))
        what = (
            "the consumer reads and decodes every sample itself (0 loader workers)"
            if n == 0
            else f"{n} loader worker(s) per rank deliver a batch every "
            f"{human_seconds((s['median_compute_s'] or 0) + (s['median_wait_s'] or 0))} while a step computes in "
            f"{human_seconds(s['median_compute_s'] or 0)}"
        )
        out.append(
            Finding(
                id="too-few-workers",
                severity="high" if steady < t.au_high else "medium",
                title=f"Too few data-loader workers: {n} per rank, steady-state AU {steady:.0%}",
                evidence={
                    "workers_per_rank": n,
                    "au_steady": steady,
                    "au": au,
                    "worker_busy": busy,
                    "median_wait_s": s["median_wait_s"],
                    "median_compute_s": s["median_compute_s"],
                    "wait_s": s["wait_s"],
                },
                threshold=f"compute / (compute + data wait) without each epoch's first batch < {t.au_target}",
                root_cause=f"Loading is the bottleneck in steady state, not only at epoch start: {what}, so the "
                "consumer waits at almost every step.",
                recommendation=f"Raise DataLoader(num_workers=...) to about {more} per rank (n / AU + 25 %, CPU cores "
                "permitting) and keep prefetch_factor >= 2; or make each sample cheaper to load (see "
                "the I/O findings).",
                impact_s=float(s["wait_s"] or 0.0) - float(s.get("epoch_start_wait_s") or 0.0),
                processes=c.view.workers[:16],
                whatif=[f"reader.read_threads={more}"],
            )
        )
    elif (
        au is not None
        and au >= t.au_target
        and busy is not None
        and busy < t.worker_busy_low
        and n > 2
    ):
        fewer = max(1, math.ceil(n * busy * 2))
        out.append(
            Finding(
                id="idle-workers",
                severity="low",
                title=f"Loader workers mostly idle: {n} per rank, busy {busy:.0%}",
                evidence={"workers_per_rank": n, "worker_busy": busy, "au": au},
                threshold=f"worker busy < {t.worker_busy_low} with au >= {t.au_target} and more than 2 workers",
                root_cause="The loader delivers far faster than the model consumes; extra workers hold memory and "
                "CPU (pinned pages, decoded batches) without raising AU.",
                recommendation=f"{fewer} worker(s) per rank would keep the same AU; give the CPU to other work.",
                processes=c.view.workers[:16],
                whatif=[f"reader.read_threads={fewer}"],
            )
        )
    return out


def rule_imbalance(c: Characterization, t: Thresholds) -> list[Finding]:
    b = c["balance"]
    out: list[Finding] = []
    w = b.get("workers")
    # a worker's share is only comparable over many samples (few batches split unevenly by design)
    if w and w["count"] >= 2 and (w["items"]["median"] or 0) >= 32:
        ratio = (w["items"]["max"] or 0) / w["items"]["median"]
        if ratio >= t.imbalance_ratio:
            out.append(
                Finding(
                    id="worker-imbalance",
                    severity="low",
                    title=f"Loader workers unevenly loaded: max/median items {ratio:.2f}",
                    evidence={
                        "workers": w["count"],
                        "items": w["items"],
                        "busy_s": w["busy_s"],
                        "items_max_over_median": round(ratio, 3),
                    },
                    threshold=f"max/median items per worker >= {t.imbalance_ratio}",
                    root_cause="Some workers handled more samples than others (uneven batch assignment, or "
                    "workers that started late).",
                    recommendation="Check for workers stalled at start-up and for uneven sample sizes.",
                    processes=c.view.workers[:16],
                )
            )
    r = b.get("ranks")
    if (
        r
        and r["count"] >= 2
        and r.get("max_over_median")
        and r["max_over_median"] >= t.imbalance_ratio
    ):
        slow = max(r["per_rank"], key=lambda x: x["epoch_s"] or 0)
        out.append(
            Finding(
                id="rank-imbalance",
                severity="medium",
                title=f"Straggler rank: pid {slow['pid']} takes {r['max_over_median']:.2f}x the median epoch time",
                evidence={
                    "ranks": r["count"],
                    "per_rank": r["per_rank"],
                    "max_over_median": r["max_over_median"],
                },
                threshold=f"max/median epoch time over ranks >= {t.imbalance_ratio}",
                root_cause="One rank's loader or storage path is slower; in synchronous data-parallel training "
                "every rank waits for it at each all-reduce.",
                recommendation="Compare the straggler's read sizes and bandwidth with the others' (node-local "
                "cache, noisy neighbour, uneven file sizes).",
                impact_s=float(slow["wait_s"] or 0.0),
                processes=[slow["pid"]],
            )
        )
    return out


def rule_preprocess(c: Characterization, t: Thresholds) -> list[Finding]:
    p = c["preprocess"]
    ratio = p.get("ratio")
    if ratio is None or ratio < t.preprocess_ratio:
        return []
    au = c["steps"].get("au")
    lib, _ = reading_library(c)
    starving = au is not None and au < t.au_target
    per_sample = c["transfer"].get("reads_per_sample") or 0
    # hundreds of reads per sample: the library's time is per-call work for them (chunk
    # lookups, buffer copies); the read-pattern findings name the cause, this one follows
    many_calls = per_sample >= 8 * t.small_reads_per_sample
    severity = ("low" if many_calls else "medium") if starving else "info"
    return [
        Finding(
            id="decode-overhead",
            severity=severity,
            title=f"Loader time goes to decoding, not I/O: {ratio:.1f}x the POSIX time inside samples",
            evidence={
                "items": p["items"],
                "item_time_s": p["item_time_s"],
                "io_in_items_s": p["io_in_items_s"],
                "non_io_s": p["non_io_s"],
                "ratio": ratio,
                "per_item_s": p["per_item_s"],
                "au": au,
            },
            threshold=f"item time / POSIX time inside items >= {t.preprocess_ratio}",
            root_cause=f"Each Dataset.__getitem__ spends {human_seconds(p['per_item_s'] or 0)}, mostly in "
            f"{lib} and transforms (deserialisation, decompression, augmentation) rather than in reads"
            + (
                ": faster storage would not raise AU"
                if starving
                else "; it is hidden behind compute today"
            )
            + (
                f". Much of it is the library's per-call work for {per_sample:g} reads per sample (see the "
                "read-pattern findings)."
                if many_calls
                else "."
            ),
            recommendation="Add workers, decode cheaper formats (raw arrays instead of compressed/encoded), move "
            "augmentation to the accelerator (e.g. NVIDIA DALI), or cache decoded samples.",
            impact_s=float(p["non_io_s"] or 0.0) if starving else 0.0,
            processes=c.view.workers[:16],
            whatif=[f"reader.read_threads={max(2, 2 * loader_workers(c))}"] if starving else [],
        )
    ]


def rule_overlap(c: Characterization, t: Thresholds) -> list[Finding]:
    o, dur = c["overlap"], c.view.duration_s
    ov, io_s = o.get("overlap"), o.get("io_time_s") or 0.0
    if ov is None or not dur or io_s / dur < t.io_share_min or ov >= t.overlap_min:
        return []
    in_consumer = o.get("io_in_consumer_s") or 0.0
    return [
        Finding(
            id="no-overlap",
            severity="medium",
            title=f"I/O not overlapped with compute: {ov:.0%} of {human_seconds(io_s)} dataset I/O during compute",
            evidence={
                "overlap": ov,
                "io_time_s": io_s,
                "overlapped_s": o["overlapped_s"],
                "io_in_consumer_s": in_consumer,
                "run_s": round(dur, 6),
            },
            threshold=f"overlap < {t.overlap_min} with dataset I/O >= {t.io_share_min} of the run",
            root_cause=(
                "The training process reads samples itself, between steps"
                if in_consumer >= 0.5 * io_s
                else "Loader workers read only while the consumer waits (prefetch too shallow)"
            )
            + ", so I/O time adds to step time instead of hiding behind it.",
            recommendation="Use DataLoader workers (num_workers > 0) with prefetch_factor >= 2 so reading overlaps "
            "the training step.",
            impact_s=float(io_s - (o["overlapped_s"] or 0.0)),
            whatif=[f"reader.read_threads={max(2, loader_workers(c))}", "reader.prefetch_factor=2"],
        )
    ]


def rule_startup(c: Characterization, t: Thresholds) -> list[Finding]:
    """Long waits at the first batch of each epoch: new worker processes start every epoch."""
    v = c.view
    fetch = v.fetches.filter(pl.col("batch_size").fill_null(1) > 0).sort("ts")
    if fetch.is_empty() or not v.workers or fetch["epoch"].n_unique() < 2:
        return []
    first = (
        fetch.group_by("pid", "epoch")
        .agg(pl.col("dur").first().alias("w"))
        .filter(pl.col("epoch") > 0)
    )
    startup_us = int(first["w"].sum() or 0)
    # waits of the later epochs' batches after the first
    total_us = int(fetch.filter(pl.col("epoch") > 0)["dur"].sum() or 0)
    if (
        not total_us
        or startup_us / total_us < t.startup_wait_share
        or startup_us * 1e-6 < t.startup_wait_s
    ):
        return []
    persistent = _persistent(c)
    if persistent:
        return []
    return [
        Finding(
            id="worker-startup",
            severity="medium",
            title=f"Loader workers restart every epoch: {human_seconds(startup_us * 1e-6)} waiting for first batches",
            evidence={
                "epoch_start_wait_s": round(startup_us * 1e-6, 6),
                "later_epochs_wait_s": round(total_us * 1e-6, 6),
                "share": round(startup_us / total_us, 4),
                "epochs": int(fetch["epoch"].n_unique()),
                "worker_processes": len(v.workers),
            },
            threshold=f"first-batch waits >= {t.startup_wait_share} of all waits after epoch 0 and >= "
            f"{t.startup_wait_s} s",
            root_cause="Without persistent_workers, PyTorch starts new worker processes at every epoch; with the "
            "spawn/forkserver start methods each imports torch and the dataset code again before the "
            "first batch.",
            recommendation="DataLoader(persistent_workers=True) keeps workers across epochs.",
            impact_s=startup_us * 1e-6,
            processes=v.workers[:16],
            whatif=["reader.persistent_workers=true"],
        )
    ]


def _persistent(c: Characterization) -> bool:
    """True when the same worker pids serve several epochs."""
    v = c.view
    it = v.items.filter(pl.col("pid").is_in(v.workers)).sort("ts")
    ep = v.epochs.select(pl.col("ts").alias("e_ts"), pl.col("epoch").alias("win")).sort("e_ts")
    if it.is_empty() or ep.height < 2:
        return False
    tagged = it.join_asof(ep, left_on="ts", right_on="e_ts", strategy="backward")
    spans = tagged.group_by("pid").agg(pl.col("win").n_unique().alias("n"))
    return float((spans["n"] > 1).cast(pl.Float64).mean() or 0.0) > 0.5  # type: ignore[arg-type]
