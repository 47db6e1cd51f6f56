"""``dlreplay analyze``: load a trace, run the passes and the rules, report (and verify).

The CLI's ``analyze`` command is a thin layer over :func:`analyze_trace` and
:func:`render_findings_text`; notebooks call them the same way::

    report = analyze_trace("traces/npz_fork")
    print(render_findings_text(report))
    write_report(report, "report.html")
"""

from __future__ import annotations

import dataclasses
import shlex
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from dlreplay.errors import UsageError

from .distill.mapped import mapped_events
from .findings import Finding, Thresholds, find, load_thresholds
from .passes import Characterization, characterize
from .report import Report, build_report
from .trace import load_trace, trace_warnings
from .trace.hidden import recovered_note

__all__ = ["analyze_trace", "render_findings_text"]


def analyze_trace(
    trace: str | Path,
    *,
    data_dirs: list[str] | None = None,
    config: str | Path | None = None,
    verify: bool = False,
    verify_dir: Path | None = None,
    verify_epochs: int | None = 4,
    scheduler: str | None = None,
    workers: int | None = None,
    figures: bool = True,
    echo: Callable[[str], None] | None = None,
    memory_limit: int | None = None,
    spill_dir: str | Path | None = None,
    jobs: int | None = None,
) -> Report:
    """Everything ``dlreplay analyze`` computes for ``trace`` (see the module doc).

    With ``verify``, the findings' model changes are replayed (:func:`.whatif.verify`)
    in ``verify_dir`` (default: a temporary directory, removed afterwards). With
    ``scheduler`` (a Dask ``tcp://host:port``) or ``workers`` (a LocalCluster of that
    many processes), the trace is parsed on the cluster and the passes, rules, figures
    (unless ``figures`` is false) and the model for ``verify`` are computed on a worker
    (:func:`.distributed.analyze_distributed`): the client never holds the event table.

    With ``memory_limit`` (bytes), a trace whose in-memory analysis would not fit is
    spilled to Parquet under ``spill_dir`` (default: the system temp) and analysed with
    streaming queries (:mod:`.spill`); the spill is removed before this returns, so the
    report's figures are drawn here when ``figures`` is set, and the returned
    view's event table can no longer be read. The path taken is in ``report.notes``.

    ``jobs`` is the number of threads that load the trace (:func:`~.load.load_trace`;
    default: the cores available).
    """
    thresholds, disabled = load_thresholds(config)
    memory_note = None
    if memory_limit is not None:
        plan, memory_note = _memory_plan(
            trace, memory_limit, scheduler is not None or workers is not None, jobs, echo
        )
        if plan.spill:
            return _analyze_spilled(
                trace, plan, spill_dir, data_dirs, thresholds, disabled, verify, echo, figures, jobs
            )
    distill_kw = _distill_kw(trace, data_dirs) if verify else {}
    if scheduler is not None or workers is not None:
        loaded, c, findings, model = _analyze_on_cluster(
            trace,
            scheduler,
            workers,
            data_dirs=data_dirs,
            thresholds=thresholds,
            disabled=disabled,
            figures=figures,
            distill_model=verify,
            distill_kw=distill_kw,
            echo=echo,
        )
    else:
        loaded, c, findings, model = _analyze_here(trace, data_dirs, thresholds, disabled, jobs)
    dirs = _data_dirs(data_dirs, loaded)
    verified = None
    if verify:
        verified = _verified(
            loaded,
            findings,
            verify_dir,
            data_dirs=dirs,
            epochs=verify_epochs,
            model=model,
            echo=echo,
            **distill_kw,
        )
    return _report(trace, loaded, c, findings, verified, memory_note)


def _report(
    trace: str | Path,
    loaded: Any,
    c: Any,
    findings: list[Finding],
    verified: dict | None,
    memory_note: str | None,
) -> Report:
    """The report of a loaded trace, with the memory plan's note and the trace's warnings."""
    report = build_report(
        str(trace),
        c,
        findings,
        manifest=loaded.manifest,
        damage=loaded.describe_damage() if loaded.damaged else None,
        verify=verified,
        dropped=(loaded.dropped_lines, loaded.dropped_bytes),
        file_reports=loaded.files,
    )
    if memory_note:
        report.notes.append(memory_note)
    recovered = recovered_note(loaded.files)
    if recovered:
        report.notes.append(recovered)
    report.warnings = trace_warnings(trace, report.file_reports)
    return report


def _data_dirs(data_dirs: list[str] | None, loaded: Any) -> list[str] | None:
    """The dataset directories: ``--data-dir`` when given, else the capture manifest's."""
    return list(data_dirs or []) or (loaded.manifest or {}).get("data_dirs") or None


def _analyze_here(
    trace: str | Path,
    data_dirs: list[str] | None,
    thresholds: Thresholds,
    disabled: set[str],
    jobs: int | None,
) -> tuple[Any, Characterization, list[Finding], None]:
    """Load the trace into this process, run the passes and the rules: (loaded trace,
    characterization, findings, no model)."""
    loaded = load_trace(trace, jobs=jobs)
    c = characterize(
        loaded.events,
        manifest=loaded.manifest,
        data_dirs=_data_dirs(data_dirs, loaded),
        per_process=loaded.per_process,
        mapped_events=mapped_events(trace),
    )
    return loaded, c, find(c, thresholds, disabled), None


def _analyze_on_cluster(
    trace: str | Path, scheduler: str | None, workers: int | None, **kw: Any
) -> tuple[Any, Any, list[Finding], Any]:
    """Parse the trace and analyse it on a Dask cluster (:func:`.distributed.analyze_distributed`
    with ``kw``): (loaded trace, characterization, findings, the model for ``--verify``)."""
    from .distributed import analyze_distributed, cluster

    with cluster(scheduler, workers) as client:
        remote = analyze_distributed(trace, client, **kw)
    return remote.loaded, remote.characterization, remote.findings, remote.model


def _memory_plan(
    trace: str | Path,
    memory_limit: int,
    on_cluster: bool,
    jobs: int | None,
    echo: Callable[[str], None] | None,
) -> tuple[Any, str]:
    """Whether the trace's analysis fits ``memory_limit`` (bytes), and the note that says so."""
    if on_cluster:
        raise UsageError(
            "--memory-limit cannot be combined with --workers/--scheduler (yet): choose one"
        )
    from .trace.spill import plan_memory

    plan = plan_memory(trace, memory_limit, jobs=jobs)
    memory_note = plan.describe()
    if echo:
        echo(memory_note)
    return plan, memory_note


def _distill_kw(trace: str | Path, data_dirs: list[str] | None) -> dict[str, Any]:
    """The model the replays of ``--verify`` run is the one ``dlreplay distill TRACE`` writes:
    same source and the same dataset fingerprint (so the same layout)."""
    from .layout import resolve_fingerprint

    fingerprint, origin = resolve_fingerprint(
        trace if isinstance(trace, (str, Path)) else None, list(data_dirs or [])
    )
    return {"source": str(trace), "fingerprint": fingerprint, "fingerprint_origin": origin}


def _verified(loaded: Any, findings: list, verify_dir: Path | None, **kw: Any) -> dict:
    """Replay the model as traced and with each finding's change (:func:`.whatif.verify`, with
    ``kw``) in ``verify_dir`` (default: a temporary directory, removed)."""
    from .whatif import verify as run_verify

    if verify_dir is not None:
        return run_verify(loaded.events, findings, verify_dir, manifest=loaded.manifest, **kw)
    with tempfile.TemporaryDirectory(prefix="dlreplay-verify-") as tmp:
        verified = run_verify(loaded.events, findings, Path(tmp), manifest=loaded.manifest, **kw)
        verified["note"] += " (temporary directory, removed; keep it with --verify-dir)"
    return verified


def _analyze_spilled(
    trace, plan, spill_dir, data_dirs, thresholds, disabled, verify, echo, figures_wanted, jobs
) -> Report:
    """The ``--memory-limit`` path for a trace that does not fit: spill, stream, report."""
    from .passes import TraceView
    from .report import figures
    from .trace.spill import BASE_BYTES, DATASET_IO_BYTES, spilled_trace

    if verify:
        raise UsageError(
            f"--verify distills the whole event table in memory, which needs ~{plan.eager_bytes >> 20} "
            "MiB here: raise --memory-limit or analyse without --verify"
        )
    with spilled_trace(
        trace, group_stored_bytes=plan.group_stored_bytes, spill_dir=spill_dir, echo=echo, jobs=jobs
    ) as sp:
        dirs = list(data_dirs or []) or (sp.manifest or {}).get("data_dirs") or None
        view = TraceView(sp.events, sp.manifest, dirs, sp.per_process)
        c = characterize(dataclasses.replace(view, mapped_events=mapped_events(trace)))
        findings = find(c, thresholds, disabled)
        _ = c.view.summary  # printed by the CLI after the spill is gone
        if figures_wanted:
            figures(c)
        report = build_report(
            str(trace),
            c,
            findings,
            manifest=sp.manifest,
            damage=sp.describe_damage() if sp.damaged else None,
            dropped=(sp.dropped_lines, sp.dropped_bytes),
            file_reports=sp.files,
        )
        report.warnings = trace_warnings(trace, report.file_reports)
        report.notes.append(
            f"{plan.describe()}: {sp.height:,} events in {sp.groups} group(s), "
            f"{sp.spill_bytes >> 20} MiB of Parquet (removed)"
        )
        n_io = int(c.view.collect(c.view.dataset_query().select(pl.len())).item())
        held = n_io * DATASET_IO_BYTES
        if BASE_BYTES + held > plan.limit:
            report.notes.append(
                f"memory limit may have been exceeded: the passes hold a few columns of the trace's {n_io:,} "
                f"dataset I/O events at a time, up to ~{held >> 20} MiB by a cautious estimate "
                f"({DATASET_IO_BYTES} B each), more than the limit leaves them"
            )
    return report


def render_findings_text(report: Report, *, width: int = 100) -> str:
    """The findings for a terminal: symptom first, then causes by severity and impact."""
    lines = []
    st = report.characterization["steps"]
    if st.get("au") is not None:
        lines.append(
            f"AU {st['au']:.1%} over {st['steps'] - st['warmup_steps']} steps (warm-up excluded); "
            f"data wait {st['wait_s']:.3f} s, compute {st['compute_s']:.3f} s"
            + (f", checkpoints {st['checkpoint_s']:.3f} s" if st.get("checkpoint_s") else "")
            + (f", other {st['other_s']:.3f} s" if st.get("other_s") else "")
        )
        if st.get("au_dlio") is not None:
            lines.append(
                f"AU as DLIO computes it (each block's first step left out, checkpoints outside blocks): "
                f"{st['au_dlio']:.1%}; loop read from {st.get('basis')}"
            )
    if not report.findings:
        lines.append("No bottleneck found with the current thresholds.")
    else:
        lines.append(f"Findings ({len(report.findings)}):")
    wrap = textwrap.TextWrapper(width=width, initial_indent="      ", subsequent_indent="      ")
    for f in report.findings:
        lines.append(f"  [{f.severity.upper():<6}] {f.title}  ({f.id})")
        lines += wrap.wrap(f"why: {f.root_cause}")
        lines += wrap.wrap(f"fix: {f.recommendation}")
        if f.whatif:
            sets = " ".join(f"--set {shlex.quote(s)}" for s in f.whatif)
            lines.append(f"      replay: dlreplay replay MODEL --data-dir DIR {sets}")
    if report.verify:
        lines.append("")
        lines.append("Verified by replay (predicted):")
        lines.append(
            f"  {'run':<20} {'change (--set)':<40} {'AU':>7} {'samples/s':>10} {'MB/s':>9}"
        )
        for r in report.verify["runs"]:
            au = f"{r['au']:.1%}" if r["au"] is not None else "-"
            sps = f"{r['samples_per_s']:.1f}" if r["samples_per_s"] is not None else "-"
            mbs = f"{r['mb_per_s']:.1f}" if r["mb_per_s"] is not None else "-"
            change = " ".join(r["overrides"]) or "-"
            lines.append(f"  {r['label'][:20]:<20} {change[:40]:<40} {au:>7} {sps:>10} {mbs:>9}")
        lines.append(f"  {report.verify['note']}")
    for n in report.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
