"""Bottleneck findings: rules over a :class:`~dlreplay.analyze.passes.Characterization`.

A :class:`Finding` says what was seen (``evidence``: the numbers that triggered it and
the threshold they crossed), why it happens (``root_cause``), what to do
(``recommendation``) and, where the advice maps to a workload-model change, the exact
``--set`` overrides that let ``dlreplay replay`` (or ``dlreplay analyze --verify``)
predict its effect (``whatif``).

Every threshold lives in :class:`Thresholds` with its unit and meaning; a YAML file
(``dlreplay analyze --config rules.yaml``) overrides them::

    thresholds:
      au_target: 0.95          # MLPerf Storage asks 0.90 for unet3d, 0.70 for cosmoflow
      small_read_bytes: 131072
    disable: [page-cache]

Severity is ``high`` (costs a large share of the run), ``medium``, ``low`` or
``info``. Findings sort by severity, then by ``impact_s`` (seconds of the run the
finding concerns). A healthy run (AU at target, efficient I/O) yields no ``high``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from dlreplay.errors import UsageError

from ..passes import Characterization

# The rules live by family in this package (loader, reads, checkpoint, mapped); what they share is in
# base. All stay importable from here.
from .base import LIBRARY_OF as LIBRARY_OF
from .base import SEVERITIES, Finding, Rule, Thresholds
from .checkpoint import rule_checkpoint
from .loader import (
    rule_data_wait,
    rule_imbalance,
    rule_overlap,
    rule_preprocess,
    rule_startup,
    rule_workers,
)
from .mapped import rule_mapped
from .reads import (
    rule_metadata,
    rule_page_cache,
    rule_random,
    rule_seeks,
    rule_small_reads,
)

__all__ = ["RULES", "SEVERITIES", "Finding", "Thresholds", "find", "load_thresholds", "top_cause"]


def load_thresholds(path: str | Path | None) -> tuple[Thresholds, set[str]]:
    """Thresholds (and disabled rule ids) from a YAML config; defaults without a path.

    Unknown keys and wrong types are errors naming the key and the file.
    """
    if path is None:
        return Thresholds(), set()
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{p}: cannot read the rules config: {exc}") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{p}: expected a mapping with `thresholds:` and/or `disable:`")
    unknown = set(doc) - {"thresholds", "disable"}
    if unknown:
        raise UsageError(
            f"{p}: unknown key(s) {', '.join(sorted(unknown))}; expected thresholds, disable"
        )
    known = {f.name: f for f in fields(Thresholds)}
    values: dict[str, Any] = {}
    for key, value in (doc.get("thresholds") or {}).items():
        if key not in known:
            raise UsageError(f"{p}: thresholds.{key} is not a threshold; known: {', '.join(known)}")
        default = getattr(Thresholds(), key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise UsageError(f"{p}: thresholds.{key} must be a non-negative number, got {value!r}")
        values[key] = (
            type(default)(value)
            if isinstance(default, float) or float(value).is_integer()
            else value
        )
    disable = doc.get("disable") or []
    if not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
        raise UsageError(f"{p}: disable must be a list of rule ids")
    bad = [d for d in disable if d not in RULES]
    if bad:
        raise UsageError(
            f"{p}: disable: unknown rule id(s) {', '.join(bad)}; known: {', '.join(RULES)}"
        )
    return Thresholds(**values), set(disable)


#: Every rule by the finding id(s) it emits.
RULES: dict[str, Rule] = {
    "data-wait": rule_data_wait,
    "too-few-workers": rule_workers,
    "idle-workers": rule_workers,
    "small-random-reads": rule_random,
    "small-reads": rule_small_reads,
    "seek-interleaved": rule_seeks,
    "metadata-heavy": rule_metadata,
    "worker-imbalance": rule_imbalance,
    "rank-imbalance": rule_imbalance,
    "checkpoint-stall": rule_checkpoint,
    "checkpoint-small-writes": rule_checkpoint,
    "checkpoint-no-fsync": rule_checkpoint,
    "decode-overhead": rule_preprocess,
    "page-cache": rule_page_cache,
    "no-overlap": rule_overlap,
    "worker-startup": rule_startup,
    "mapped-storage-stall": rule_mapped,
    "mapped-inline-batches": rule_mapped,
    "mapped-page-cache": rule_mapped,
}


def find(
    c: Characterization, thresholds: Thresholds | None = None, disable: Iterable[str] = ()
) -> list[Finding]:
    """Run every rule; findings sorted by severity, then impact (seconds), largest first."""
    t = thresholds or Thresholds()
    off = set(disable)
    seen: set[Rule] = set()
    out: list[Finding] = []
    for rule in RULES.values():
        if rule in seen:
            continue
        seen.add(rule)
        out.extend(f for f in rule(c, t) if f.id not in off)
    _relate(out)
    order = {rid: i for i, rid in enumerate(RULES)}  # ties: the more specific rule first
    return sorted(
        out,
        key=lambda f: (
            f.kind != "symptom",
            SEVERITIES.index(f.severity),
            -round(f.impact_s, 6),
            order[f.id],
        ),
    )


def _relate(findings: list[Finding]) -> None:
    """Fold findings that explain another one into it (one root cause, one top finding).

    With too few workers, the decoding time inside samples is *why* the workers are
    slow; it stays as supporting detail (low severity) so the fix (more workers)
    ranks first.
    """
    ids = {f.id for f in findings}
    for f in findings:
        if (
            f.id == "decode-overhead"
            and "too-few-workers" in ids
            and f.severity in ("high", "medium")
        ):
            f.severity = "low"
            f.root_cause += " This is the per-sample work that the too-few-workers finding spreads over more workers."


def top_cause(findings: list[Finding]) -> Finding | None:
    """The first finding that is a cause (not the data-wait symptom)."""
    return next((f for f in findings if f.kind == "cause"), None)
