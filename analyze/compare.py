"""``dlreplay compare A B``: how alike two traces' I/O is (real vs replay, storage A vs B).

The similarity is the DLIO paper's: a feature vector per trace (I/O time, bytes read
and written, transfer size min/max/mean/median, bandwidth per operation, % sequential,
% consecutive, number of files), each feature normalised by the larger of the pair,
and the cosine similarity of the two vectors (1.0 = same shape). Features one side
cannot measure (e.g. write bandwidth when ``torch.save`` writes are invisible to the
tracer) are left out of the vector and listed as ``not_compared``.

Also: Kolmogorov-Smirnov distances of the read-size and inter-batch-gap
distributions (0 = same distribution, 1 = disjoint), epoch times and AU side by side.

Scope: calls on the files each trace's job reads as its dataset and writes as
checkpoints (see :func:`~dlreplay.analyze.files.classify_files`); library and log
files differ between any two programs and would only add noise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from dlreplay.errors import TraceError
from dlreplay.schema import READ_OPS, WRITE_OPS

from .distill.mapped import MAPPED_SCHEMA, mapped_events, with_mapped_reads
from .distill.storage import (
    object_reads,
    with_object_dirs,
    with_object_reads,
    without_object_dirs,
)
from .files import has_loader_processes
from .passes import Characterization, characterize, flag_reads
from .trace import load_trace
from .trace.inputs import trace_notes

__all__ = [
    "COMPARE_FORMAT_VERSION",
    "COMPARE_SCHEMA",
    "FEATURES",
    "Comparison",
    "compare_traces",
    "cosine",
    "features",
    "ks_distance",
]

COMPARE_SCHEMA = "dlreplay.comparison"
COMPARE_FORMAT_VERSION = 1
_US = 1e-6

#: Feature name -> unit (the DLIO paper's feature set).
FEATURES: dict[str, str] = {
    "io_time_s": "s",
    "bytes_read": "B",
    "bytes_written": "B",
    "read_size_min": "B",
    "read_size_max": "B",
    "read_size_mean": "B",
    "read_size_median": "B",
    "read_bandwidth": "B/s",
    "write_bandwidth": "B/s",
    "sequential": "fraction",
    "consecutive": "fraction",
    "files": "count",
}


def features(c: Characterization) -> dict[str, float | None]:
    """The feature vector of one trace (None: not measurable in this trace)."""
    v = c.view
    files = set(v.role_files("dataset")) | set(v.role_files("checkpoint"))
    io = v.io.filter(pl.col("file").is_in(list(files)))
    reads = io.filter(pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0))
    writes = io.filter(pl.col("name").is_in(WRITE_OPS) & (pl.col("size") > 0))
    saves = v.saves
    # bytes written per file: the write calls, or the checkpoint event where writes are invisible
    per_file = writes.group_by("file").agg(pl.col("size").sum().alias("w"))
    # a save naming the directory its writes went to (DCP's checkpoint_id) counts by its writes
    dirs = per_file["file"].cast(pl.String).str.replace(r"/[^/]*$", "").unique().implode()
    ck = (
        saves.filter(pl.col("file").is_not_null() & ~pl.col("file").cast(pl.String).is_in(dirs))
        .group_by("file")
        .agg(pl.col("size").sum().alias("s"))
    )
    merged = per_file.join(ck, on="file", how="full", coalesce=True).fill_null(0)
    written = (
        int(merged.select(pl.max_horizontal("w", "s")).sum().item() or 0) if merged.height else 0
    )
    if not merged.height and saves.height:
        written = int(saves["size"].sum() or 0)
    rt = float(reads["dur"].sum() or 0) * _US
    wt = float(writes["dur"].sum() or 0) * _US
    # the checkpoint files' calls other than writes (opens, fsync, the restore's reads): what a
    # trace whose checkpoint directory was not traced lacks besides the writes
    ck_files = set(v.role_files("checkpoint"))
    ck_io = io.filter(pl.col("file").is_in(list(ck_files)))
    ck_other = ck_io.filter(~(pl.col("name").is_in(WRITE_OPS) & (pl.col("size") > 0)))
    seen = set(io["file"].unique().to_list())
    seq = con = None
    flagged = flag_reads(io)
    if flagged.height:
        seq, con = float(flagged["seq"].mean() or 0), float(flagged["consec"].mean() or 0)  # type: ignore[arg-type]
    sizes = reads["size"]
    return {
        "io_time_s": float(io["dur"].sum() or 0) * _US,
        # (not features: what compare_traces takes out of io_time_s and files where one side's
        # writes are invisible)
        "_write_time_s": wt,
        "_checkpoint_other_s": float(ck_other["dur"].sum() or 0) * _US,
        "_checkpoint_files": float(len(ck_files & seen)),
        "bytes_read": float(sizes.sum() or 0),
        "bytes_written": float(written),
        "read_size_min": float(sizes.min()) if sizes.len() else None,  # type: ignore[arg-type]
        "read_size_max": float(sizes.max()) if sizes.len() else None,  # type: ignore[arg-type]
        "read_size_mean": float(sizes.mean()) if sizes.len() else None,  # type: ignore[arg-type]
        "read_size_median": float(sizes.median()) if sizes.len() else None,  # type: ignore[arg-type]
        "read_bandwidth": float(sizes.sum()) / rt if rt > 0 else None,
        "write_bandwidth": float(writes["size"].sum()) / wt if wt > 0 else None,
        "sequential": seq,
        "consecutive": con,
        "files": float(len(files & seen)),
    }


def cosine(a: dict[str, float | None], b: dict[str, float | None]) -> tuple[float, list[str]]:
    """Cosine similarity of two feature dicts, each feature normalised by the max of the pair.

    Features missing (None) on either side are skipped; features that are 0 on both
    sides count as equal. Returns (similarity, skipped feature names).
    """
    va, vb, skipped = [], [], []
    for k in FEATURES:
        x, y = a.get(k), b.get(k)
        if x is None or y is None:
            skipped.append(k)
            continue
        m = max(abs(x), abs(y))
        if m == 0:
            va.append(1.0)
            vb.append(1.0)
            continue
        va.append(x / m)
        vb.append(y / m)
    if not va:
        return 0.0, skipped
    na, nb = math.sqrt(sum(x * x for x in va)), math.sqrt(sum(y * y for y in vb))
    if na == 0 or nb == 0:
        return 0.0, skipped
    return sum(x * y for x, y in zip(va, vb, strict=True)) / (na * nb), skipped


def ks_distance(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two ECDFs."""
    a, b = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    if a.size == 0 or b.size == 0:
        return None
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / a.size
    fb = np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(fa - fb)))


def _batch_gaps(c: Characterization) -> np.ndarray:
    """Seconds between successive batch arrivals at each consumer (fetch ends)."""
    f = c.view.fetches.filter(pl.col("batch_size").fill_null(1) > 0)
    if f.height < 2:
        return np.array([])
    ends = f.select("pid", (pl.col("ts") + pl.col("dur")).alias("end")).sort("pid", "end")
    gaps = ends.with_columns(pl.col("end").diff().over("pid").alias("gap"))["gap"].drop_nulls()
    return gaps.to_numpy() * _US


def _dataset_read_sizes(c: Characterization) -> np.ndarray:
    return c.view.dataset_reads["size"].to_numpy()


def _metrics_json(trace: Path) -> dict | None:
    p = trace / "metrics.json" if trace.is_dir() else None
    if p is None or not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError, RecursionError):
        return None


def _steady(epochs: list[dict]) -> float | None:
    """Mean epoch time (s) after each consumer's first epoch (all of them when only one)."""
    if not epochs:
        return None
    by: dict[Any, list[float]] = {}
    for e in epochs:
        if e.get("time_s") is not None:
            by.setdefault(e.get("pid"), []).append(e["time_s"])
    times = [t for ts in by.values() for t in (ts[1:] if len(ts) > 1 else ts)]
    return sum(times) / len(times) if times else None


def _timing(c: Characterization, trace: Path) -> dict[str, Any]:
    """Epoch times (s), AU and data wait: from the trace's training-loop events (any convention
    the vocabulary reads: dlreplay's, DLIO's, DFTracer's AI annotations), else a replay's metrics.json."""
    ep = c["epochs"]["epochs"]
    st = c["steps"]
    epochs = [e["time_s"] for e in ep]
    au = st.get("au")
    source = "trace"
    m = _metrics_json(trace)
    steady = _steady(ep)
    if (not epochs or au is None) and m:
        if not epochs:
            epochs = [e.get("epoch_time_s") for e in m.get("epochs", [])]
            steady = _steady([{"time_s": t} for t in epochs])
        if au is None and m.get("overall", {}).get("au_percent") is not None:
            au = m["overall"]["au_percent"] / 100
        source = "metrics.json"
    return {
        "epoch_times_s": epochs,
        "steady_epoch_s": steady,
        "au": au,
        "au_dlio": st.get("au_dlio"),
        "au_data": st.get("au_data"),
        "wait_s": st.get("wait_s"),
        "compute_s": st.get("compute_s"),
        "epochs_basis": c["epochs"].get("basis"),
        "loop_basis": st.get("basis"),
        "source": source if epochs or au is not None else None,
        # a replay's: what the storage served (metrics.json format_version 2; None before, or a trace)
        "served": _served_summary(m) if m else None,
    }


@dataclass
class Comparison:
    """The result of :func:`compare_traces` (``to_dict`` is the ``--json`` output)."""

    a: str
    b: str
    similarity: float
    features_a: dict[str, float | None]
    features_b: dict[str, float | None]
    not_compared: list[str]
    ks_read_sizes: float | None
    ks_batch_gaps: float | None
    timing_a: dict[str, Any]
    timing_b: dict[str, Any]
    chars: tuple[Characterization, Characterization]
    #: what a reader must know first about each trace (:func:`~dlreplay.analyze.trace.load.trace_warnings`)
    warnings_a: list[str] = field(default_factory=list)
    warnings_b: list[str] = field(default_factory=list)
    #: of those, what says a trace is missing parts (:func:`~dlreplay.analyze.trace.inputs.trace_notes`):
    #: a similarity with an incomplete side is no evidence, ``--min-similarity`` fails on it
    incomplete_a: list[str] = field(default_factory=list)
    incomplete_b: list[str] = field(default_factory=list)

    def incomplete_sides(self) -> list[tuple[str, str, list[str]]]:
        """(side, trace, what it misses) for each side that is missing parts."""
        return [
            (side, path, gaps)
            for side, path, gaps in (
                ("A", self.a, self.incomplete_a),
                ("B", self.b, self.incomplete_b),
            )
            if gaps
        ]

    def to_dict(self) -> dict:
        return {
            "schema": COMPARE_SCHEMA,
            "format_version": COMPARE_FORMAT_VERSION,
            "a": self.a,
            "b": self.b,
            "similarity": round(self.similarity, 6),
            "features": {
                k: {"a": self.features_a.get(k), "b": self.features_b.get(k), "unit": u}
                for k, u in FEATURES.items()
            },
            "not_compared": self.not_compared,
            "ks": {"read_sizes": self.ks_read_sizes, "batch_gaps": self.ks_batch_gaps},
            "timing": {"a": self.timing_a, "b": self.timing_b},
            "warnings": {"a": self.warnings_a, "b": self.warnings_b},
            "incomplete": {"a": bool(self.incomplete_a), "b": bool(self.incomplete_b)},
        }


def _writes_invisible(f: dict[str, float | None]) -> bool:
    """Bytes were written (checkpoint events say so) but no write call was seen."""
    return bool(f.get("bytes_written")) and f.get("write_bandwidth") is None


def compare_traces(
    a: str | Path,
    b: str | Path,
    *,
    data_dirs_a: list[str] | None = None,
    data_dirs_b: list[str] | None = None,
) -> Comparison:
    """Load both traces and compare them (see the module doc)."""
    chars, warned, gaps, loaded = [], [], [], []
    for path, dirs in ((a, data_dirs_a), (b, data_dirs_b)):
        lt = load_trace(path)
        notes = trace_notes(path, lt.files)
        warned.append(notes.warnings)
        gaps.append(notes.gaps)
        if (
            lt.events.height == 0
        ):  # two empty traces are not "identical" (similarity 1.0): nothing to compare
            raise TraceError(
                f"{path}: the trace holds no events, so there is nothing to compare ("
                f"{'; '.join(warned[-1]) or 'no event lines'}); capture the job again"
            )
        loaded.append((path, dirs, lt))
    # both sides' files by one rule: a trace without loader events (DFTracer's preload alone)
    # counts every file read under the data dirs, so its replay's are counted the same way
    by_loader = all(has_loader_processes(lt.events, lt.per_process) for _, _, lt in loaded)
    for path, dirs, lt in loaded:
        objects = object_reads(path)  # S3 GETs are reads of files s3://bucket/key (distill.storage)
        chars.append(
            characterize(
                with_object_reads(lt.events, objects),
                manifest=without_object_dirs(lt.manifest, objects),
                data_dirs=with_object_dirs(dirs, objects),
                passes=["overview", "steps", "epochs", "access"],
                per_process=lt.per_process if objects.is_empty() else None,
                by_loader=by_loader,
            )
        )
    ca, cb = chars
    # mapped files have no read calls: their windows are the reads (analyze.distill.mapped)
    ma, mb = _mapped_pair(a, b, warned)
    fa, sa = with_mapped_reads(features(ca), _dataset_read_sizes(ca), ma)
    fb, sb = with_mapped_reads(features(cb), _dataset_read_sizes(cb), mb)
    if _writes_invisible(fa) or _writes_invisible(fb):
        # A checkpoint written where the tracer cannot see the calls (torch.save's C++ writer, or a
        # checkpoint directory the capture did not trace) has bytes but no write time: the I/O
        # time and the files compare what both sides measured, the dataset's calls and files
        for f in (fa, fb):
            hidden = (f["_write_time_s"] or 0.0) + (f["_checkpoint_other_s"] or 0.0)
            f["io_time_s"] = max(0.0, (f["io_time_s"] or 0.0) - hidden)
            f["files"] = max(0.0, (f["files"] or 0.0) - (f["_checkpoint_files"] or 0.0))
    sim, skipped = cosine(fa, fb)
    return Comparison(
        str(a),
        str(b),
        sim,
        fa,
        fb,
        skipped,
        ks_distance(sa, sb),
        ks_distance(_batch_gaps(ca), _batch_gaps(cb)),
        _timing(ca, Path(a)),
        _timing(cb, Path(b)),
        (ca, cb),
        warned[0],
        warned[1],
        gaps[0],
        gaps[1],
    )


def _mapped_pair(
    a: str | Path, b: str | Path, warned: list[list[str]]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Both traces' mapped hooks' events, or none of either: a trace without any (a DLIO run
    traced by DLIO's own DFTracer, which has no such hooks) cannot show the windows the other
    counts, so windows count as reads only where both traces have them; a note on the side
    whose windows are left out."""
    ma, mb = mapped_events(a), mapped_events(b)
    if ma.is_empty() == mb.is_empty():
        return ma, mb
    side = 0 if mb.is_empty() else 1
    warned[side].append(
        "its mapped windows are not counted as reads: the other trace has no mapped-file "
        "events (no mapping, or not traced with dlreplay capture's mapped hooks: DLIO's own)"
    )
    empty = pl.DataFrame(schema=MAPPED_SCHEMA)
    return empty, empty


def render_comparison(cmp: Comparison) -> str:
    """A side-by-side table for the terminal."""
    from dlreplay.units import human_bytes

    def fmt(k: str, x: float | None) -> str:
        if x is None:
            return "-"
        u = FEATURES[k]
        if u == "B":
            return human_bytes(x)
        if u == "B/s":
            return human_bytes(x) + "/s"
        if u == "fraction":
            return f"{x:.1%}"
        if u == "s":
            return f"{x:.4g} s"
        return f"{x:g}"

    lines = [f"A: {cmp.a}", f"B: {cmp.b}", "", f"  {'feature':<18} {'A':>14} {'B':>14}"]
    lines.append(f"  {'-' * 18} {'-' * 14} {'-' * 14}")
    for k in FEATURES:
        mark = "  (not compared)" if k in cmp.not_compared else ""
        if k == "io_time_s" and (
            _writes_invisible(cmp.features_a) or _writes_invisible(cmp.features_b)
        ):
            mark = "  (checkpoint I/O left out: one side's writes are invisible)"
        if k == "files" and (
            _writes_invisible(cmp.features_a) or _writes_invisible(cmp.features_b)
        ):
            mark = "  (dataset files: one side's checkpoint files are invisible)"
        lines.append(
            f"  {k:<18} {fmt(k, cmp.features_a.get(k)):>14} {fmt(k, cmp.features_b.get(k)):>14}{mark}"
        )
    lines.append("")
    ta, tb = cmp.timing_a, cmp.timing_b
    lines.append(f"  {'AU':<18} {_pct(ta['au']):>14} {_pct(tb['au']):>14}")
    if ta.get("au_dlio") is not None or tb.get("au_dlio") is not None:
        lines.append(
            f"  {'AU (DLIO formula)':<18} {_pct(ta.get('au_dlio')):>14} {_pct(tb.get('au_dlio')):>14}"
        )
    if ta.get("wait_s") is not None or tb.get("wait_s") is not None:
        lines.append(
            f"  {'data wait':<18} {_sec(ta.get('wait_s')):>14} {_sec(tb.get('wait_s')):>14}"
        )
    sa, sb = ta.get("steady_epoch_s"), tb.get("steady_epoch_s")
    err = f"  ({(sb - sa) / sa:+.1%})" if sa and sb else ""
    lines.append(f"  {'steady epoch time':<18} {_sec(sa):>14} {_sec(sb):>14}{err}")
    n = max(len(ta["epoch_times_s"]), len(tb["epoch_times_s"]))
    for i in range(n):
        x = ta["epoch_times_s"][i] if i < len(ta["epoch_times_s"]) else None
        y = tb["epoch_times_s"][i] if i < len(tb["epoch_times_s"]) else None
        lines.append(f"  {'epoch ' + str(i) + ' time':<18} {_sec(x):>14} {_sec(y):>14}")
    lines += _served_lines(ta.get("served"), tb.get("served"))
    lines.append("")
    lines.append(f"similarity (cosine, DLIO features): {cmp.similarity:.4f}")
    lines.append(
        f"KS distance, read sizes: {_opt(cmp.ks_read_sizes)}   inter-batch gaps: {_opt(cmp.ks_batch_gaps)}"
    )
    return "\n".join(lines)


def _served_summary(m: dict) -> dict | None:
    from dlreplay.replay.metrics import served_summary

    return served_summary(m)


def _served_lines(sa: dict | None, sb: dict | None) -> list[str]:
    """Side by side: bytes a replay asked for, what the storage served, the page cache's share,
    and the sentences its metrics.json says about it (none when neither side is such a replay)."""
    if sa is None and sb is None:
        return []
    from dlreplay.units import human_bytes

    def hb(s: dict | None, k: str) -> str:
        v = s.get(k) if s else None
        return "-" if v is None else human_bytes(v)

    def pc(s: dict | None) -> str:
        v = s.get("cache_served_percent") if s else None
        return "-" if v is None else f"{v:.1f} %"

    lines = [
        f"  {'bytes asked':<18} {hb(sa, 'bytes_asked'):>14} {hb(sb, 'bytes_asked'):>14}",
        f"  {'served by storage':<18} {hb(sa, 'served_bytes'):>14} {hb(sb, 'served_bytes'):>14}",
    ]
    # an S3 replay's bytes came from the object store (its GETs'): it has no page-cache share
    if any(s is not None and s.get("served_from") != "object_store" for s in (sa, sb)):
        lines.append(f"  {'from page cache':<18} {pc(sa):>14} {pc(sb):>14}")
    for side, s in (("A", sa), ("B", sb)):
        lines += [f"  {side}: {n}" for n in (s or {}).get("notes", [])]
    return lines


def _pct(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "-"


def _sec(x: float | None) -> str:
    return f"{x:.3f} s" if x is not None else "-"


def _opt(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "n/a (no data on one side)"


def overlay_figures(cmp: Comparison) -> dict[str, bytes]:
    """PNG overlays: read-size ECDFs, inter-batch-gap ECDFs, epoch times."""
    from .report import new_figure, png_bytes

    out: dict[str, bytes] = {}
    ca, cb = cmp.chars
    for key, title, xa, xb, xlabel, logx in (
        (
            "read_sizes",
            "Dataset read sizes (ECDF)",
            _dataset_read_sizes(ca),
            _dataset_read_sizes(cb),
            "bytes",
            True,
        ),
        (
            "batch_gaps",
            "Inter-batch gaps (ECDF)",
            _batch_gaps(ca),
            _batch_gaps(cb),
            "seconds",
            False,
        ),
    ):
        if not (len(xa) or len(xb)):
            continue
        fig = new_figure(7, 3)
        ax = fig.subplots()
        for data, label in ((xa, "A"), (xb, "B")):
            if len(data):
                s = np.sort(data)
                ax.step(s, np.arange(1, s.size + 1) / s.size, where="post", label=label)
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction")
        ax.set_title(title)
        ax.legend()
        out[key] = png_bytes(fig)
    ea, eb = cmp.timing_a["epoch_times_s"], cmp.timing_b["epoch_times_s"]
    if ea or eb:
        fig = new_figure(7, 3)
        ax = fig.subplots()
        n = max(len(ea), len(eb))
        idx = np.arange(n)
        ax.bar(idx - 0.2, [x or 0 for x in ea] + [0] * (n - len(ea)), width=0.4, label="A")
        ax.bar(idx + 0.2, [x or 0 for x in eb] + [0] * (n - len(eb)), width=0.4, label="B")
        ax.set_xlabel("epoch")
        ax.set_ylabel("seconds")
        ax.set_title("Epoch times")
        ax.legend()
        out["epochs"] = png_bytes(fig)
    return out


def write_comparison_report(cmp: Comparison, path: str | Path) -> Path:
    """An HTML (self-contained) or Markdown comparison report, written atomically."""
    import base64
    import html

    from dlreplay.units import markdown_text

    from .report import REPORT_CSS, write_report_file, write_with_figures

    p = Path(path)
    figs = overlay_figures(cmp)
    text_table = render_comparison(cmp)
    warned = [  # what a reader must know before the numbers
        f"{side} ({path}): {w}"
        for side, path, ws in (("A", cmp.a, cmp.warnings_a), ("B", cmp.b, cmp.warnings_b))
        for w in ws
    ]
    if p.suffix.lower() in (".html", ".htm"):
        body = [
            f"<!doctype html><html><head><meta charset='utf-8'><meta name='dlreplay-schema' "
            f"content='{COMPARE_SCHEMA} {COMPARE_FORMAT_VERSION}'><title>dlreplay compare</title>"
            f"<style>{REPORT_CSS}</style></head><body><h1>Comparison: similarity {cmp.similarity:.4f}"
            f"{' (incomplete trace)' if cmp.incomplete_sides() else ''}</h1>",
            *(f"<p class='note'><b>Warning:</b> {html.escape(w)}</p>" for w in warned),
            f"<pre>{html.escape(text_table)}</pre>",
        ]
        for key, png in figs.items():
            body.append(
                f"<h2>{html.escape(key)}</h2><img alt='{key}' src='data:image/png;base64,"
                f"{base64.b64encode(png).decode()}'>"
            )
        body.append("</body></html>")
        return write_report_file(p, "\n".join(body))
    if p.suffix.lower() in (".md", ".markdown"):
        fig_dir = p.with_name(p.stem + ".figures")

        def render(tmp: Path) -> str:  # figures into tmp, moved to fig_dir once the text is written
            md = [
                f"# Comparison: similarity {cmp.similarity:.4f}"
                f"{' (incomplete trace)' if cmp.incomplete_sides() else ''}",
                "",
                f"<!-- {COMPARE_SCHEMA} format_version {COMPARE_FORMAT_VERSION} -->",
                "",
                *(f"> **Warning:** {markdown_text(w)}\n" for w in warned),
                "```",
                text_table,
                "```",
                "",
            ]
            for key, png in figs.items():
                (tmp / f"{key}.png").write_bytes(png)
                md += [f"![{key}]({fig_dir.name}/{key}.png)", ""]
            return "\n".join(md)

        return write_with_figures(p, fig_dir, render)
    from dlreplay.errors import UsageError

    raise UsageError(f"{p}: the report must end in .html or .md")
