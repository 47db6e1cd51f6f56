"""Verified what-if: replay the distilled model as traced and with each finding's change.

``dlreplay analyze TRACE --verify`` distills the trace into a workload model, replays
it once unchanged (the baseline) and once per distinct recommendation that maps to a
model change (``Finding.whatif``: ``--set`` overrides), and reports predicted AU,
samples/s and MB/s side by side. Compute is replaced by sleep as in every replay, so
the prediction isolates the input pipeline: storage, loader workers, file layout.

Datasets are generated once per distinct dataset shape under ``workdir`` (a dataset
change such as fewer, larger files gets its own directory); runs never touch files
outside ``workdir``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from dlreplay.errors import IneffectiveOverride
from dlreplay.model import WorkloadModel, apply_overrides

from .findings import Finding

__all__ = ["MAX_CHANGES", "verify"]

#: Most changed replays per verification (the top findings' changes).
MAX_CHANGES = 3


def _dirname(label: str) -> str:
    """A label as a safe directory-name part."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)[:60]


def _changes(findings: list[Finding]) -> list[tuple[str, list[str]]]:
    """(finding id, overrides) of the first :data:`MAX_CHANGES` findings with a distinct what-if."""
    changes: list[tuple[str, list[str]]] = []
    for f in findings:
        if f.whatif and all(f.whatif != ch for _, ch in changes):
            changes.append((f.id, list(f.whatif)))
    return changes[:MAX_CHANGES]


def _replay_run(
    m: WorkloadModel,
    workdir: Path,
    out: Path,
    label: str,
    overrides: list[str],
    fid: str | None,
) -> dict[str, Any]:
    """Replay ``m`` into ``out`` (its dataset under ``workdir``, shared by equal datasets); the
    run's row of the comparison."""
    from dlreplay.replay import ReplayConfig, dataset_digest, run_replay

    data = workdir / f"data-{dataset_digest(m)[:12]}"
    res = run_replay(ReplayConfig(model=m, data_dir=data, out=out, trace=False), echo=None)
    if res.metrics.get(
        "interrupted"
    ):  # run_replay answers a Ctrl-C with partial metrics: stop here too
        raise KeyboardInterrupt
    o = res.metrics.get("overall", {})
    au = o.get("au_percent")
    return {
        "label": label,
        "overrides": overrides,
        "finding": fid,
        "au": round(au / 100, 4) if au is not None else None,
        "samples_per_s": o.get("samples_per_s"),
        "mb_per_s": o.get("io_mb_per_s"),
        "epoch_time_s": o.get("epoch_time_s"),
        "complete": res.complete,
        "out": str(out),
    }


def verify(
    events: pl.DataFrame,
    findings: list[Finding],
    workdir: Path,
    *,
    manifest: dict | None = None,
    data_dirs: list[str] | None = None,
    epochs: int | None = 2,
    model: WorkloadModel | None = None,
    echo: Callable[[str], None] | None = None,
    source: str | None = None,
    fingerprint: dict[str, Any] | None = None,
    fingerprint_origin: str | None = None,
) -> dict[str, Any]:
    """Run the baseline and up to :data:`MAX_CHANGES` changed replays; returns the comparison.

    ``epochs``: epochs per replay (None: as traced; more than traced gives a steadier prediction). Returns ``{"runs": [{label,
    overrides, finding, au, samples_per_s, mb_per_s, epoch_time_s, out}], "workdir", "note"}``
    with AU as a fraction. Without ``model``, the trace's ``events`` are distilled as
    ``dlreplay distill`` does (:func:`~.distill.distill` with the trace's ``source`` and the
    dataset ``fingerprint`` it resolved, :func:`~.layout.resolve_fingerprint`), so the
    replays generate the dataset with the same layout.
    """
    from .distill import distill

    say = echo or (lambda s: None)
    base = model or distill(
        events,
        manifest=manifest,
        data_dirs=data_dirs,
        source=source or "the trace",
        fingerprint=fingerprint,
        fingerprint_origin=fingerprint_origin,
    )
    if epochs:  # steady state needs steps: may replay more epochs than were traced
        base = replace(base, train=replace(base.train, epochs=epochs))
    changes = _changes(findings)
    runs: list[dict[str, Any]] = []
    workdir.mkdir(parents=True, exist_ok=True)
    plan: list[tuple[str, list[str], str | None]] = [("baseline", [], None)]
    plan += [(fid, ch, fid) for fid, ch in changes]
    skipped: list[str] = []
    for i, (label, overrides, fid) in enumerate(plan):
        try:
            m = apply_overrides(base, overrides) if overrides else base
        except IneffectiveOverride as exc:  # the model decides it another way: nothing to try
            say(f"replay {i + 1}/{len(plan)}: {label} skipped: {exc}")
            skipped.append(f"{label} ({exc})")
            continue
        out = workdir / f"run-{i}-{_dirname(label)}"
        say(f"replay {i + 1}/{len(plan)}: {label} {' '.join(overrides)}")
        runs.append(_replay_run(m, workdir, out, label, overrides, fid))
    note = (
        f"Replays of the distilled model ({base.train.epochs} epoch(s) each, compute as sleep) in {workdir}. "
        "AU excludes each epoch's first step, as MLPerf Storage does."
    )
    layout = base.provenance.fields.get("dataset.layout")
    if layout is not None:
        note += f" Dataset layout: {layout.method}."
    if not changes:
        note += " No finding maps to a model change, so only the baseline ran."
    if skipped:
        note += (
            " Not replayed, their change cannot take effect on this model: "
            + "; ".join(skipped)
            + "."
        )
    return {"runs": runs, "workdir": str(workdir), "note": note}
