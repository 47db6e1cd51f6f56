"""The analysis report: findings, figures and tables as self-contained HTML or Markdown.

:func:`build_report` turns a :class:`~.passes.Characterization` and its findings into
a :class:`Report` (JSON-safe, ``schema: dlreplay.analysis``); :func:`write_report`
renders it. HTML embeds its figures (PNG, base64) and styles, so the one file can be
mailed or attached to a ticket; Markdown writes its figures into ``<name>.figures/``
beside it. Files are written to a temporary name and renamed, so an interrupted run
never leaves a half-written report that looks complete.

Figures use matplotlib's object API (``Figure``, no pyplot state), so nothing leaks.
"""

from __future__ import annotations

import base64
import errno
import html
import io
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from dlreplay.errors import DlreplayError, UsageError
from dlreplay.osutil import atomic_write_text
from dlreplay.units import (
    human_bytes,
    human_seconds,
    markdown_cell,
    markdown_text,
    printable,
    terminal_safe,
)

from .findings import Finding
from .passes import Characterization, TraceView
from .passes.mapped import MAPPED_NOTE, mapped_headline

__all__ = [
    "REPORT_CSS",
    "REPORT_FORMAT_VERSION",
    "REPORT_SCHEMA",
    "Report",
    "build_report",
    "check_figures_dir",
    "figures",
    "figures_dir",
    "new_figure",
    "png_bytes",
    "write_report",
    "write_report_file",
    "write_with_figures",
]

REPORT_SCHEMA = "dlreplay.analysis"
REPORT_FORMAT_VERSION = 1
_US = 1e-6
#: Processes drawn on the timeline (the consumer(s) first, then the busiest workers).
TIMELINE_PROCESSES = 10


@dataclass
class Report:
    """Everything a report shows. ``verify`` holds a what-if comparison when one was run."""

    trace: str
    characterization: Characterization
    findings: list[Finding]
    manifest: dict | None = None
    damage: str | None = None
    verify: dict | None = None
    notes: list[str] = field(default_factory=list)
    dropped_lines: int = 0
    dropped_bytes: int = 0
    #: per trace file: :class:`~dlreplay.analyze.trace.load.FileReport` (events, dropped, problems)
    file_reports: list = field(default_factory=list)
    #: what a reader must know first (:func:`~dlreplay.analyze.trace.load.trace_warnings`): a capture that
    #: did not end, files cut, left out or without events
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "schema": REPORT_SCHEMA,
            "format_version": REPORT_FORMAT_VERSION,
            "trace": self.trace,
            "findings": [f.to_dict() for f in self.findings],
            "characterization": self.characterization.to_dict(),
            "damage": self.damage,
            "verify": self.verify,
            "notes": self.notes,
            "warnings": self.warnings,
            "dropped_lines": self.dropped_lines,
            "dropped_bytes": self.dropped_bytes,
        }


def build_report(
    trace: str,
    c: Characterization,
    findings: list[Finding],
    *,
    manifest: dict | None = None,
    damage: str | None = None,
    verify: dict | None = None,
    dropped: tuple[int, int] = (0, 0),
    file_reports: list | None = None,
) -> Report:
    """Collect the report and the explanations of whatever the trace could not give."""
    notes = [
        f"{name}: {res['missing']}"
        for name, res in c.results.items()
        if isinstance(res, dict) and res.get("missing")
    ]
    ov = c["overview"]
    mapped = c.results.get("mapped") or {}
    if mapped.get("windows"):
        notes.append(MAPPED_NOTE)
    elif not ov.get("dataset_read_calls"):
        notes.insert(
            0,
            "The trace has no reads of dataset files: nothing to say about the input pipeline. "
            "Was the job's data directory traced (`dlreplay capture --data-dir`)?",
        )
    if ov.get("events") and not (
        ov.get("bytes_read") or ov.get("bytes_written") or mapped.get("windows")
    ):
        notes.insert(0, "The trace holds only metadata calls (open/stat/close), no data transfers.")
    return Report(
        trace,
        c,
        findings,
        manifest,
        damage,
        verify,
        notes,
        dropped[0],
        dropped[1],
        list(file_reports or []),
    )


# ---------------------------------------------------------------------------------------
# Figures


def new_figure(w: float = 9.0, h: float = 3.2) -> Any:
    """A matplotlib figure of ``w`` x ``h`` inches for a report (no pyplot, no display)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def png_bytes(fig: Any) -> bytes:
    """``fig`` as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _timeline(v: TraceView) -> bytes | None:
    if not v.height:
        return None
    t0 = v.span[0]
    procs = [*v.consumers]
    busiest = (
        v.collect(
            v.scan.filter(~pl.col("pid").is_in(procs)).group_by("pid").agg(pl.col("dur").sum())
        )
        .sort("dur", descending=True)["pid"]
        .to_list()
    )
    procs = (procs + busiest)[:TIMELINE_PROCESSES]
    if not procs:
        return None
    layers = [
        ("compute (step)", pl.col("role").is_in(["compute", "step"]), "#4caf50"),
        ("data wait (fetch)", pl.col("role") == "fetch", "#e53935"),
        ("sample (item)", pl.col("role") == "item", "#90caf9"),
        ("checkpoint", pl.col("role").is_in(["checkpoint.save", "checkpoint.load"]), "#8e24aa"),
        ("POSIX/STDIO I/O", pl.col("cat").is_in(["POSIX", "STDIO"]), "#263238"),
    ]
    fig = new_figure(10, 0.45 * len(procs) + 1.4)
    ax = fig.subplots()
    role = {p: "consumer" for p in v.consumers} | {p: "worker" for p in v.workers}
    for row, pid in enumerate(procs):
        mine = v.rows(pl.col("pid") == pid, ["cat", "name", "role", "ts", "dur"])
        for i, (label, cond, color) in enumerate(layers):
            sel = mine.filter(cond).select(
                ((pl.col("ts") - t0) * _US).alias("a"), (pl.col("dur") * _US).alias("d")
            )
            if sel.is_empty():
                continue
            h = 0.8 if i < 4 else 0.3
            ax.broken_barh(
                list(sel.iter_rows()),
                (row - h / 2, h),
                facecolors=color,
                label=label if row == 0 or label not in ax.get_legend_handles_labels()[1] else None,
            )
    loop = v.collect(
        v.scan.filter(pl.col("role").is_in(["epoch", "fetch", "step", "compute", "item"])).select(
            pl.len().alias("n"),
            pl.col("ts").min().alias("a"),
            (pl.col("ts") + pl.col("dur")).max().alias("b"),
        )
    ).row(0, named=True)
    if loop[
        "n"
    ]:  # zoom on the training loop (start-up, imports and dataset checks are long and empty)
        a = (int(loop["a"]) - t0) * _US
        b = (int(loop["b"]) - t0) * _US
        pad = 0.02 * max(b - a, 1e-3)
        ax.set_xlim(a - pad, b + pad)
    ax.set_yticks(range(len(procs)), [f"{role.get(p, 'process')} {p}" for p in procs])
    ax.invert_yaxis()
    ax.set_xlabel("time since trace start (s)")
    ax.set_title("I/O vs compute per process")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=False))
    ax.legend(
        uniq.values(),
        uniq.keys(),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    return png_bytes(fig)


def _bandwidth(c: Characterization) -> bytes | None:
    b = c["bandwidth"]
    if not b.get("t_s"):
        return None
    fig = new_figure()
    ax = fig.subplots()
    ax.plot(b["t_s"], [x / 1e6 for x in b["all_bps"]], label="all reads", color="#90a4ae")
    ax.plot(b["t_s"], [x / 1e6 for x in b["dataset_bps"]], label="dataset reads", color="#1e88e5")
    ax.set_xlabel("time since trace start (s)")
    ax.set_ylabel("MB/s")
    ax.set_title(f"Read bandwidth over time ({b['bin_s']:.3g} s bins)")
    ax.legend(fontsize=8)
    return png_bytes(fig)


def _histogram(c: Characterization) -> bytes | None:
    ov = c["overview"]
    rh, wh = ov.get("read_histogram") or {}, ov.get("write_histogram") or {}
    if not (sum(rh.values()) + sum(wh.values())):
        return None
    labels = list(rh)
    x = range(len(labels))
    fig = new_figure()
    ax = fig.subplots()
    ax.bar([i - 0.2 for i in x], [rh[k] for k in labels], width=0.4, label="reads", color="#1e88e5")
    ax.bar(
        [i + 0.2 for i in x],
        [wh.get(k, 0) for k in labels],
        width=0.4,
        label="writes",
        color="#fb8c00",
    )
    ax.set_xticks(list(x), labels, rotation=30, fontsize=8)
    ax.set_ylabel("calls")
    ax.set_yscale("symlog")
    ax.set_title("Transfer sizes (Darshan buckets, bytes)")
    ax.legend(fontsize=8)
    return png_bytes(fig)


def _au_per_epoch(c: Characterization) -> bytes | None:
    per = c["steps"].get("per_epoch") or []
    if not per:
        return None
    fig = new_figure()
    ax = fig.subplots()
    ep = [str(p["epoch"]) for p in per]
    comp = [p["compute_s"] for p in per]
    wait = [p["wait_s"] for p in per]
    ck = [p["checkpoint_s"] for p in per]
    ax.bar(ep, comp, label="compute", color="#4caf50")
    ax.bar(ep, wait, bottom=comp, label="data wait", color="#e53935")
    ax.bar(
        ep,
        ck,
        bottom=[a + b for a, b in zip(comp, wait, strict=True)],
        label="checkpoint",
        color="#8e24aa",
    )
    for i, p in enumerate(per):
        if p["au"] is not None:
            ax.annotate(
                f"AU {p['au']:.0%}",
                (i, comp[i] + wait[i] + ck[i]),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xlabel("epoch")
    ax.set_ylabel("seconds (warm-up steps excluded)")
    ax.set_title("Compute vs data wait per epoch")
    ax.legend(fontsize=8)
    return png_bytes(fig)


def _workers(c: Characterization) -> bytes | None:
    rows = [p for p in c["processes"]["processes"] if p["role"] == "worker"]
    if not rows:
        return None
    rows = rows[:32]
    fig = new_figure(9, 2.8)
    ax = fig.subplots()
    ax.bar([str(p["pid"]) for p in rows], [100 * (p["busy"] or 0) for p in rows], color="#1e88e5")
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of lifetime in samples")
    ax.set_xlabel("loader worker pid")
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.set_title("Loader worker utilisation")
    return png_bytes(fig)


FIGURES: dict[str, tuple[str, Callable[[Characterization], bytes | None]]] = {
    "timeline": ("I/O vs compute timeline", lambda c: _timeline(c.view)),
    "bandwidth": ("Bandwidth over time", _bandwidth),
    "histogram": ("Transfer-size histogram", _histogram),
    "au": ("AU per epoch", _au_per_epoch),
    "workers": ("Worker utilisation", _workers),
}


def figures(c: Characterization) -> dict[str, tuple[str, bytes | None]]:
    """Every figure as PNG bytes (None when the trace lacks the data), by key.

    Figures already rendered where the table is (a Dask worker, see
    :class:`~.distributed.RemoteView`) are returned as they are. Otherwise they are
    drawn once per characterisation (kept in ``c.figures``): a spilled trace's figures
    are drawn while its spill directory exists, and the report is written after.
    """
    rendered = getattr(c.view, "rendered", None)
    if rendered is not None:
        return dict(rendered)
    if c.figures is None:
        if not isinstance(c.view, TraceView):
            raise UsageError(
                "this analysis ran on a Dask cluster without figures; "
                "run analyze_trace(..., figures=True) to write a report"
            )
        c.figures = {key: (title, fn(c)) for key, (title, fn) in FIGURES.items()}
    return c.figures


# ---------------------------------------------------------------------------------------
# Rendering


def _headline(r: Report) -> list[tuple[str, str]]:
    c = r.characterization
    ov, st = c["overview"], c["steps"]
    rows = [
        ("trace", r.trace),
        ("command", shlex.join((r.manifest or {}).get("command") or []) or "-"),
        ("duration", human_seconds(ov["duration_s"])),
        ("processes / events", f"{ov['processes']} / {ov['events']:,}"),
        (
            "dataset",
            f"{ov['dataset_files']} files, {human_bytes(ov['dataset_bytes_read'])} read in "
            f"{ov['dataset_read_calls']:,} calls",
        ),
        (
            "AU (warm-up excluded)",
            f"{st['au']:.1%}" if st.get("au") is not None else "unknown (no step events)",
        ),
    ]
    if st.get("au_steady") is not None:
        rows.append(("AU without epoch starts", f"{st['au_steady']:.1%}"))
    if st.get("au_dlio") is not None:
        rows.append(("AU as DLIO computes it", f"{st['au_dlio']:.1%}"))
    rows += mapped_headline(c.results.get("mapped") or {})
    acc = c["access"]
    if acc.get("reads"):
        rows.append(
            (
                "dataset reads",
                f"{acc['sequential']:.0%} sequential, {acc['consecutive']:.0%} consecutive, "
                f"{acc['random']:.0%} random",
            )
        )
    return rows


def _replay_cmd(trace: str, f: Finding) -> str | None:
    if not f.whatif:
        return None
    sets = " ".join(f"--set {shlex.quote(s)}" for s in f.whatif)
    return (
        f"dlreplay distill {shlex.quote(trace)} -o model.yaml && "
        f"dlreplay replay model.yaml --data-dir /path/to/storage {sets}"
    )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict | list):
        import json

        return json.dumps(v, default=str)[:300]
    return str(v)


#: The style sheet of the HTML reports (analysis and comparison), inlined in each page.
REPORT_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top} th{background:#f5f5f5} td.n{text-align:right;font-variant-numeric:tabular-nums}
.f{border-left:6px solid #999;padding:.4em 1em;margin:1em 0;background:#fafafa}
.high{border-color:#c62828}.medium{border-color:#ef6c00}.low{border-color:#f9a825}.info{border-color:#90a4ae}
.sev{font-weight:bold;text-transform:uppercase;font-size:.8em;margin-right:.5em}
code,pre{background:#f0f0f0;padding:1px 4px;border-radius:3px;font-size:.92em}
pre{padding:.5em;white-space:pre-wrap} img{max-width:100%} .note{color:#555}
"""


def _html(text: object) -> str:
    """Text for HTML: markup escaped, and control characters (from names in traces) shown escaped."""
    return html.escape(terminal_safe(text))


def render_html(r: Report) -> str:
    """A self-contained HTML page (figures embedded as base64 PNG)."""
    e = _html
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<meta name='dlreplay-schema' content='{REPORT_SCHEMA} {REPORT_FORMAT_VERSION}'>",
        f"<title>dlreplay report: {e(r.trace)}</title><style>{REPORT_CSS}</style></head><body>",
        f"<h1>I/O analysis of {e(os.path.basename(r.trace.rstrip('/')) or r.trace)}</h1>",
        "<table>",
    ]
    out += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _headline(r)]
    out.append("</table>")
    for w in r.warnings:
        out.append(f"<p class='note'><b>Warning:</b> {e(w)}</p>")
    if r.damage:
        out.append(f"<p class='note'><b>Damaged trace:</b> {e(r.damage)}</p>")
    out.append(f"<h2>Findings ({len(r.findings)})</h2>")
    if not r.findings:
        out.append("<p>No bottleneck found with the current thresholds.</p>")
    for f in r.findings:
        out.append(
            f"<div class='f {e(f.severity)}' id='{e(f.id)}'><p><span class='sev'>{e(f.severity)}</span>"
            f"<b>{e(f.title)}</b> <code>{e(f.id)}</code>"
            + (" <i>(symptom)</i>" if f.kind == "symptom" else "")
            + "</p>"
        )
        out.append(
            f"<p><b>Root cause.</b> {e(f.root_cause)}</p><p><b>Recommendation.</b> {e(f.recommendation)}</p>"
        )
        cmd = _replay_cmd(r.trace, f)
        if cmd:
            out.append(f"<p><b>Try it by replay:</b></p><pre>{e(cmd)}</pre>")
        out.append(
            "<details><summary>evidence (threshold: " + e(f.threshold) + ")</summary><table>"
        )
        out += [f"<tr><th>{e(k)}</th><td>{e(_fmt(v))}</td></tr>" for k, v in f.evidence.items()]
        if f.files:
            out.append(f"<tr><th>files</th><td>{e(', '.join(f.files))}</td></tr>")
        if f.processes:
            out.append(f"<tr><th>processes</th><td>{e(', '.join(map(str, f.processes)))}</td></tr>")
        out.append("</table></details></div>")
    if r.verify:
        out.append("<h2>Verified what-if (replay)</h2>" + _verify_html(r.verify))
    out.append("<h2>Figures</h2>")
    for _key, (title, png) in figures(r.characterization).items():
        if png is None:
            out.append(f"<p class='note'>{e(title)}: not available for this trace.</p>")
            continue
        out.append(
            f"<h3>{e(title)}</h3><img alt='{e(title)}' src='data:image/png;base64,"
            f"{base64.b64encode(png).decode()}'>"
        )
    out.append("<h2>Top operations</h2>" + _table_html(*_ops_table(r)))
    out.append("<h2>Top files</h2>" + _table_html(*_files_table(r)))
    if r.notes:
        out.append(
            "<h2>What the trace could not tell</h2><ul>"
            + "".join(f"<li>{e(n)}</li>" for n in r.notes)
            + "</ul>"
        )
    out.append(
        "<p class='note'>Made by dlreplay. Thresholds: <code>dlreplay analyze --config rules.yaml</code>."
        "</p></body></html>"
    )
    return "\n".join(out)


def _verify_html(v: dict) -> str:
    e = _html
    rows = v.get("runs", [])
    head = (
        "<table><tr><th>run</th><th>overrides</th><th>AU</th><th>samples/s</th><th>MB/s</th></tr>"
    )
    body = "".join(
        f"<tr><td>{e(x['label'])}</td><td><code>{e(' '.join(x['overrides']) or '-')}</code></td>"
        f"<td class='n'>{_pct(x.get('au'))}</td><td class='n'>{_num(x.get('samples_per_s'))}</td>"
        f"<td class='n'>{_num(x.get('mb_per_s'))}</td></tr>"
        for x in rows
    )
    return (
        head + body + "</table>" + (f"<p class='note'>{e(v['note'])}</p>" if v.get("note") else "")
    )


def _pct(x: Any) -> str:
    return f"{x:.1%}" if isinstance(x, int | float) else "-"


def _num(x: Any) -> str:
    return f"{x:,.1f}" if isinstance(x, int | float) else "-"


def _ops_table(r: Report) -> tuple[list[str], list[list[str]], list[bool]]:
    ops = r.characterization["overview"]["operations"][:15]
    rows = [
        [
            o["cat"],
            o["name"],
            f"{o['count']:,}",
            human_bytes(o["bytes"]),
            human_seconds(o["time_s"]),
        ]
        for o in ops
    ]
    return (
        ["category", "operation", "count", "bytes", "time"],
        rows,
        [False, False, True, True, True],
    )


def _files_table(r: Report) -> tuple[list[str], list[list[str]], list[bool]]:
    c = r.characterization
    pat = {p["file"]: p for p in c["access"].get("per_file", [])}
    rows = []
    for f in c["overview"]["top_files"]:
        p = pat.get(f["file"], {})
        rows.append(
            [
                f["file"],
                f["role"],
                human_bytes(f["bytes_read"]),
                f"{f['reads']:,}",
                str(f["processes"]),
                _pct(p.get("sequential")),
                _pct(p.get("consecutive")),
            ]
        )
    return (
        ["file", "role", "bytes read", "reads", "processes", "sequential", "consecutive"],
        rows,
        [False, False, True, True, True, True, True],
    )


def _table_html(headers: list[str], rows: list[list[str]], right: list[bool]) -> str:
    e = _html
    if not rows:
        return "<p class='note'>none</p>"
    h = "".join(f"<th>{e(x)}</th>" for x in headers)
    b = "".join(
        "<tr>"
        + "".join(
            f"<td class='{'n' if rt else ''}'>{e(x)}</td>" for x, rt in zip(row, right, strict=True)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{h}</tr>{b}</table>"


def _table_md(headers: list[str], rows: list[list[str]], right: list[bool]) -> str:
    if not rows:
        return "_none_\n"
    esc = [[markdown_cell(x) for x in row] for row in rows]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if rt else "---" for rt in right) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in esc]
    return "\n".join(lines) + "\n"


def _finding_md(trace: str, f: Finding) -> list[str]:
    """One finding's Markdown section: title, root cause, recommendation, the replay command
    that tries it (when it has one) and its evidence."""
    t = markdown_text
    out = [
        f"### [{f.severity.upper()}] {t(f.title)} (`{f.id}`{', symptom' if f.kind == 'symptom' else ''})",
        "",
        f"**Root cause.** {t(f.root_cause)}",
        "",
        f"**Recommendation.** {t(f.recommendation)}",
        "",
    ]
    cmd = _replay_cmd(trace, f)
    if cmd:
        out += [
            "Try it by replay:",
            "",
            "```",
            printable(cmd).replace("```", "\\`\\`\\`"),
            "```",
            "",
        ]
    out += [f"Evidence (threshold: {t(f.threshold)}):", ""]
    out += [f"- `{k}`: {t(_fmt(v))}" for k, v in f.evidence.items()]
    out.append("")
    return out


def _verify_md(verify: dict) -> list[str]:
    """The Markdown section of the verified what-if replays (``--verify``)."""
    out = [
        "## Verified what-if (replay)",
        "",
        _table_md(
            ["run", "overrides", "AU", "samples/s", "MB/s"],
            [
                [
                    x["label"],
                    " ".join(x["overrides"]) or "-",
                    _pct(x.get("au")),
                    _num(x.get("samples_per_s")),
                    _num(x.get("mb_per_s")),
                ]
                for x in verify.get("runs", [])
            ],
            [False, False, True, True, True],
        ),
    ]
    if verify.get("note"):
        out += [markdown_text(verify["note"]), ""]
    return out


def render_markdown(r: Report, figure_dir: Path, figure_prefix: str) -> str:
    """Markdown text; writes the figures as PNG files into ``figure_dir``."""
    t = markdown_text  # every text here may hold names from the trace (files, paths)
    out = [
        f"# I/O analysis of {markdown_cell(os.path.basename(r.trace.rstrip('/')) or r.trace)}",
        "",
        f"<!-- {REPORT_SCHEMA} format_version {REPORT_FORMAT_VERSION} -->",
        "",
    ]
    out += [f"- **{t(k)}**: {t(v)}" for k, v in _headline(r)]
    out += [f"\n> **Warning:** {t(w)}" for w in r.warnings]
    if r.damage:
        out += ["", f"> **Damaged trace:** {t(r.damage)}"]
    out += ["", f"## Findings ({len(r.findings)})", ""]
    if not r.findings:
        out.append("No bottleneck found with the current thresholds.")
    for f in r.findings:
        out += _finding_md(r.trace, f)
    if r.verify:
        out += _verify_md(r.verify)
    out += ["## Figures", ""]
    figure_dir.mkdir(parents=True, exist_ok=True)
    for key, (title, png) in figures(r.characterization).items():
        if png is None:
            out += [f"_{title}: not available for this trace._", ""]
            continue
        (figure_dir / f"{key}.png").write_bytes(png)
        out += [f"### {title}", "", f"![{title}]({figure_prefix}/{key}.png)", ""]
    out += [
        "## Top operations",
        "",
        _table_md(*_ops_table(r)),
        "## Top files",
        "",
        _table_md(*_files_table(r)),
    ]
    if r.notes:
        out += (
            ["## What the trace could not tell", ""]
            + [f"- {markdown_text(n)}" for n in r.notes]
            + [""]
        )
    return "\n".join(out) + "\n"


def write_report(r: Report, path: str | Path) -> Path:
    """Write ``path`` (.html/.htm or .md) atomically; returns the path.

    A Markdown report's figures (``<stem>.figures/``) are drawn into a temporary directory
    first and moved in place after the text is written, so a failure (a full disk) leaves
    neither half a report nor stray figures; the error names the path.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".html", ".htm", ".md", ".markdown"):
        raise UsageError(f"{p}: the report must end in .html or .md")
    if suffix in (".html", ".htm"):
        return write_report_file(p, render_html(r))
    fig_dir = p.with_name(p.stem + ".figures")
    return write_with_figures(p, fig_dir, lambda tmp: render_markdown(r, tmp, fig_dir.name))


def figures_dir(path: str | Path) -> Path | None:
    """The folder a Markdown report at *path* writes its figures to (``<stem>.figures``
    beside it); None for any other report (HTML embeds them)."""
    p = Path(path)
    return p.with_name(p.stem + ".figures") if p.suffix.lower() in (".md", ".markdown") else None


def check_figures_dir(fig_dir: Path) -> None:
    """Refuse a figures folder that a report would replace but that holds more than a
    report's figures (PNG files): it is not dlreplay's to delete. Missing is fine."""
    if not os.path.lexists(fig_dir):
        return
    if fig_dir.is_symlink() or not fig_dir.is_dir():
        raise DlreplayError(
            f"{fig_dir} (where the report's figures go) is not a folder of figures dlreplay wrote; "
            f"nothing was written: move it or choose another report name."
        )
    other = sorted(
        c.name for c in fig_dir.iterdir() if c.is_symlink() or not c.is_file() or c.suffix != ".png"
    )
    if other:
        shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
        raise DlreplayError(
            f"{fig_dir} (where the report's figures go) holds {shown}, which dlreplay did not "
            f"write; nothing was written: move them or choose another report name."
        )


def write_with_figures(p: Path, fig_dir: Path, render: Callable[[Path], str]) -> Path:
    """Write the text ``render(tmp)`` to *p*, whose figures ``render`` writes into ``tmp``; the
    figures become *fig_dir* (replacing an old one: only one of figures) only once the text
    is written."""
    check_figures_dir(fig_dir)
    _mkdir(p.parent, p)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{fig_dir.name}.", dir=p.parent))
    except OSError as exc:
        raise _write_error(p, exc) from None
    try:
        try:
            text = render(tmp)
        except OSError as exc:
            raise _write_error(fig_dir, exc) from None
        write_report_file(p, text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the figures from other readers
        if fig_dir.is_dir() and not fig_dir.is_symlink():
            shutil.rmtree(fig_dir)
        os.replace(tmp, fig_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return p


def _write_error(p: Path, exc: OSError) -> DlreplayError:
    """A one-line error naming *p*; says so when the disk is full."""
    if exc.errno == errno.ENOSPC:
        return DlreplayError(
            f"{p}: cannot write: no space left on the device; free space or choose another path "
            f"(nothing was left half-written)"
        )
    return DlreplayError(f"{p}: cannot write ({exc.strerror or exc})")


def _mkdir(d: Path, p: Path) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _write_error(p, exc) from None


def write_report_file(p: Path, text: str) -> Path:
    """Write a report's ``text`` to ``p`` (parents created) through the core's
    :func:`~dlreplay.osutil.atomic_write_text`; an OS error (a full disk) becomes a one-line
    error naming ``p`` and leaves no partial file."""
    _mkdir(p.parent, p)
    try:
        atomic_write_text(p, text)
    except OSError as exc:
        raise _write_error(p, exc) from None
    return p
