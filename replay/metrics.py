"""MLPerf Storage metrics of a replay: AU, samples/s, I/O throughput, per epoch and overall.

Vocabulary and definitions follow MLPerf Storage / DLIO:

* **AU** (accelerator utilization, %) = compute time / total time. The first step of
  the run is excluded (DLIO does: it holds start-up costs). Across ranks, AU is the
  mean of the ranks' AU.
* **samples/s** = samples consumed / time (same window as AU, summed over ranks,
  divided by the slowest rank's time).
* **I/O throughput** = bytes *actually read* / time, in MB/s (1 MB = 10^6 bytes) and MiB/s.
* epoch time (s, wall clock incl. the first step, worker start-up and the epoch's end:
  epoch checkpoint, evaluation, epoch-end time), mean and population stdev across epochs;
  per epoch also the seconds of evaluation and epoch-end time, and the pids of the
  processes that read its batches (``worker_pids``: new ones every epoch unless the
  workers persist).
* host CPU (``host_cpu_s``, per rank): CPU seconds the steps' compute spent on the host
  (``train.computation_host_cpu``), by the spending threads' CPU clocks, beside the
  model's (``modelled_host_cpu_s``); 0 when the compute is a pure sleep. A step's CPU work
  stops where its compute time ends; what it could not spend is carried to the next step
  (at most one step's) and the rest is ``host_cpu_dropped_s`` (with what was still carried
  at the run's end): spent + dropped is at least the modelled CPU, and dropped is 0 where
  the steps' time sufficed for their CPU.
* pass/fail: AU >= the threshold (MLPerf Storage: 90 % for unet3d and resnet50).
* served by the storage (format_version 2; see :mod:`.served`), per epoch and overall:
  ``bytes_asked`` (= ``bytes_read``: what the replay's reads asked for), ``served_bytes``
  (what the block layer read for the replay's reading processes, each measuring its own;
  None where it could not be counted, ``served_unmeasured_batches`` batches), and
  ``cache_served_percent`` (the share of the bytes asked that no storage read served:
  100 * (1 - served / asked), at least 0; readahead can make served exceed asked);
  ``written_bytes`` (dirtied for the storage by the accelerator processes: checkpoints, a
  traced replay's trace), ``write_call_bytes``; ``device``, ``device_read_bytes``,
  ``device_write_bytes`` (the dataset's block device, every process on the host); ``cold``
  (what ``--cold`` did before the epoch); ``served_from``: ``block_layer`` (the above) or
  ``object_store`` (an S3 replay: ``served_bytes`` are the bytes its GETs returned, and it has
  no ``cache_served_percent`` or device counts: no page cache or block device of this host
  served it). ``served_notes``: plain sentences, e.g. when most of an epoch's bytes came from
  the page cache. A version 1 document has none of these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

METRICS_SCHEMA = "dlreplay.metrics"
#: 2: the served-by-the-storage fields (version 1 documents are still read: they have none)
METRICS_FORMAT_VERSION = 2
#: An epoch whose bytes came from the page cache at least this much (percent) is said so
CACHE_NOTE_PERCENT = 50.0
MB = 1_000_000
MIB = 1 << 20


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    m = sum(vals) / len(vals)
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))


def _combine(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One epoch (or the whole run) from the ranks' records of it."""
    window = max((r["window_s"] for r in per_rank), default=0.0)
    samples_w = sum(r["samples_in_window"] for r in per_rank)
    bytes_w = sum(r["bytes_in_window"] for r in per_rank)
    aus = [_ratio(r["compute_s"], r["window_s"]) for r in per_rank]
    au_vals = [a for a in aus if a is not None]
    au = 100.0 * sum(au_vals) / len(au_vals) if au_vals else None
    mbps = _ratio(bytes_w, window)
    return {
        "au_percent": au,
        "samples_per_s": _ratio(samples_w, window),
        "io_mb_per_s": mbps / MB if mbps is not None else None,
        "io_mib_per_s": mbps / MIB if mbps is not None else None,
        "steps": max((r["steps"] for r in per_rank), default=0),
        "samples": sum(r["samples"] for r in per_rank),
        "bytes_read": sum(r["bytes_read"] for r in per_rank),
        "compute_s": sum(r["compute_s"] for r in per_rank) / max(len(per_rank), 1),
        "modelled_compute_s": sum(r["modelled_compute_s"] for r in per_rank)
        / max(len(per_rank), 1),
        "host_cpu_s": sum(r.get("host_cpu_s", 0.0) for r in per_rank) / max(len(per_rank), 1),
        "modelled_host_cpu_s": sum(r.get("modelled_host_cpu_s", 0.0) for r in per_rank)
        / max(len(per_rank), 1),
        "host_cpu_dropped_s": sum(r.get("host_cpu_dropped_s", 0.0) for r in per_rank)
        / max(len(per_rank), 1),
        "io_wait_s": sum(r["io_wait_s"] for r in per_rank) / max(len(per_rank), 1),
        "checkpoint_s": sum(r["checkpoint_s"] for r in per_rank) / max(len(per_rank), 1),
        "checkpoint_bytes": sum(r["checkpoint_bytes"] for r in per_rank),
        "window_s": window,
        "epoch_time_s": max((r["epoch_time_s"] for r in per_rank), default=0.0),
    }


_SUMMED = (
    "steps",
    "samples",
    "bytes_read",
    "compute_s",
    "modelled_compute_s",
    "host_cpu_s",
    "modelled_host_cpu_s",
    "host_cpu_dropped_s",
    "io_wait_s",
    "checkpoint_s",
    "checkpoint_bytes",
    "window_s",
    "epoch_time_s",
    "samples_in_window",
    "bytes_in_window",
)


def aggregate(ranks: Sequence[dict[str, Any]], au_threshold: float) -> dict[str, Any]:
    """Per-epoch and overall metrics from each rank's result (``{"epochs": [records...]}``)."""
    n_epochs = max((len(r["epochs"]) for r in ranks), default=0)
    epochs = []
    for i in range(n_epochs):
        recs = [r["epochs"][i] for r in ranks if len(r["epochs"]) > i]
        pids = sorted({p for r in recs for p in r.get("worker_pids", [])})
        epochs.append(
            {
                "epoch": recs[0]["epoch"],
                **_combine(recs),
                **served_totals(recs),
                "evaluation_s": max((r.get("evaluation_s", 0.0) for r in recs), default=0.0),
                "epoch_end_s": max((r.get("epoch_end_s", 0.0) for r in recs), default=0.0),
                "worker_pids": pids,
            }
        )
    totals = []
    for r in ranks:
        tot = {k: sum(e.get(k, 0.0) for e in r["epochs"]) for k in _SUMMED}
        tot["steps"] = sum(e["steps"] for e in r["epochs"])
        totals.append(tot)
    overall = _combine(totals) if totals else {}
    if overall:
        overall.update(served_totals([e for r in ranks for e in r["epochs"]]))
    summary = {}
    for key in ("au_percent", "samples_per_s", "io_mb_per_s", "io_mib_per_s", "epoch_time_s"):
        m, s = _mean_std([e[key] for e in epochs])
        summary[key] = {"mean": m, "stdev": s}
    au = overall.get("au_percent")
    return {
        "epochs": epochs,
        "overall": overall,
        "across_epochs": summary,
        "au_threshold_percent": au_threshold,
        "pass": bool(au is not None and au >= au_threshold),
        "served_notes": served_notes(epochs, overall),
        "ranks": [
            {
                "rank": r["rank"],
                **{k: t[k] for k in ("samples", "bytes_read", "compute_s", "window_s")},
                "au_percent": (100.0 * t["compute_s"] / t["window_s"])
                if t["window_s"] > 0
                else None,
            }
            for r, t in zip(ranks, totals, strict=True)
        ],
    }


def _sum_of(recs: Sequence[dict[str, Any]], key: str) -> int | None:
    vals = [int(r[key]) for r in recs if r.get(key) is not None]
    return sum(vals) if vals else None


def served_totals(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The served-by-the-storage fields (see the module doc) of epoch records *recs* (one epoch's
    ranks, or every epoch of every rank): bytes summed; ``cold`` from the first that has it."""
    asked = sum(int(r.get("bytes_read", 0)) for r in recs)
    unmeasured = sum(int(r.get("served_unmeasured_batches", 0)) for r in recs)
    steps = sum(int(r.get("steps", 0)) for r in recs)
    served = _sum_of(recs, "served_bytes") if unmeasured < steps or steps == 0 else None
    cache = None
    if served is not None and asked > 0 and not unmeasured:
        cache = 100.0 * max(0.0, 1.0 - served / asked)
    dev = next((r for r in recs if r.get("device")), None)
    cold = next((r["cold"] for r in recs if r.get("cold")), None)
    objects = any(r.get("served_from") == "object_store" for r in recs)
    if objects:  # the object store served every byte it returned: no page cache of this host
        cache = None
    return {
        "bytes_asked": asked,
        "served_bytes": served,
        "served_unmeasured_batches": unmeasured,
        "cache_served_percent": cache,
        "written_bytes": _sum_of(recs, "written_bytes"),
        "write_call_bytes": _sum_of(recs, "write_call_bytes"),
        "device": dev.get("device") if dev else None,
        "device_read_bytes": _sum_of(recs, "device_read_bytes"),
        "device_write_bytes": _sum_of(recs, "device_write_bytes"),
        "cold": cold,
        "served_from": "object_store" if objects else "block_layer",
    }


def served_notes(epochs: Sequence[dict[str, Any]], overall: dict[str, Any]) -> list[str]:
    """Plain sentences on where the bytes came from: each epoch most of whose bytes the page
    cache served, epochs whose storage reads could not be counted, what ``--cold`` could not do."""
    notes = []
    for e in epochs:
        cache = e.get("cache_served_percent")
        if cache is not None and cache >= CACHE_NOTE_PERCENT:
            dropped = (e.get("cold") or {}).get("method", "none") != "none"
            notes.append(
                f"{cache:.0f} % of epoch {e['epoch']}'s bytes came from the page cache"
                + (
                    " (the dataset's pages were dropped before it: the epoch read bytes again "
                    "that it had read already)"
                    if dropped
                    else ": this AU says little about the storage"
                )
            )
        if e.get("served_bytes") is None and e.get("steps"):
            notes.append(
                f"epoch {e['epoch']}: the storage's reads could not be counted (no per-process I/O "
                f"accounting readable here): its bytes may have come from memory"
            )
        elif e.get("served_unmeasured_batches"):
            notes.append(
                f"epoch {e['epoch']}: {e['served_unmeasured_batches']} batch(es) read where the "
                f"storage's reads could not be counted; its served bytes leave them out"
            )
        note = (e.get("cold") or {}).get("note")
        if note and note not in notes:
            notes.append(note)
    cache = overall.get("cache_served_percent")
    cold = any((e.get("cold") or {}).get("method", "none") != "none" for e in epochs)
    if len(epochs) > 1 and cache is not None and cache >= CACHE_NOTE_PERCENT:
        notes.append(
            f"overall, {cache:.0f} % of the replay's bytes came from the page cache, not the "
            + (
                "storage: re-reads within each epoch (its pages were dropped before it)"
                if cold
                else "storage (dlreplay replay --cold drops the dataset's pages before each epoch)"
            )
        )
    return notes


def served_summary(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The served-by-the-storage figures of a metrics document (overall, and per epoch:
    ``bytes_asked``, ``served_bytes``, ``cache_served_percent``, ``cold`` method); None for a
    version 1 document, which has none."""
    o = doc.get("overall") or {}
    if "served_bytes" not in o:
        return None
    keys = ("bytes_asked", "served_bytes", "cache_served_percent")
    return {
        **{k: o.get(k) for k in keys},
        "served_from": o.get("served_from", "block_layer"),
        "cold": doc.get("cold"),
        "epochs": [
            {"epoch": e.get("epoch"), **{k: e.get(k) for k in keys}} for e in doc.get("epochs", [])
        ],
        "notes": list(doc.get("served_notes") or []),
    }


def _served_lines(metrics: dict[str, Any]) -> list[str]:
    """The summary's lines on what the storage served (none for a version 1 document)."""
    from dlreplay.units import human_bytes

    o = metrics.get("overall") or {}
    if "served_bytes" not in o:
        return []

    def hb(v: int | None) -> str:
        return "-" if v is None else human_bytes(v)

    if o.get("served_from") == "object_store":
        return _object_lines(metrics, hb)
    lines = [
        f"{'epoch':>5} {'asked':>12} {'served':>12} {'cache %':>8} {'written':>12} {'device read':>12}"
    ]
    for e in [*metrics.get("epochs", []), {**o, "epoch": "all"}]:
        lines.append(
            f"{e['epoch']:>5} {hb(e.get('bytes_asked')):>12} {hb(e.get('served_bytes')):>12} "
            f"{_f(e.get('cache_served_percent'), '.1f'):>8} {hb(e.get('written_bytes')):>12} "
            f"{hb(e.get('device_read_bytes')):>12}"
        )
    cold = next((e["cold"] for e in metrics.get("epochs", []) if e.get("cold")), None)
    if cold:
        lines.append(
            f"cold: {cold['method']} before each epoch ({cold['files']} file(s) on {cold['filesystem']}"
            + (
                f", {cold['resident_after_percent']:.0f} % of the checked pages resident after"
                if cold.get("resident_after_percent") is not None
                else ""
            )
            + ")"
        )
    lines += [f"note: {n}" for n in metrics.get("served_notes") or []]
    return lines


def _object_lines(metrics: dict[str, Any], hb: Any) -> list[str]:
    """The summary's lines on what an S3 replay's object store served (its GETs' bytes)."""
    o = metrics.get("overall") or {}
    lines = [f"{'epoch':>5} {'asked':>12} {'served by S3':>12} {'written':>12}"]
    for e in [*metrics.get("epochs", []), {**o, "epoch": "all"}]:
        lines.append(
            f"{e['epoch']:>5} {hb(e.get('bytes_asked')):>12} {hb(e.get('served_bytes')):>12} "
            f"{hb(e.get('written_bytes')):>12}"
        )
    lines.append(
        "served by S3: the bytes the object store returned to the replay's GETs (no page cache "
        "or block device of this host is in their path)"
    )
    return lines + [f"note: {n}" for n in metrics.get("served_notes") or []]


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_table(metrics: dict[str, Any]) -> str:
    """A short text table: one line per epoch, then overall, mean ± stdev and pass/fail; a
    checkpoint-only workload's checkpoint throughput instead (no training, no AU)."""
    ck = metrics.get("checkpoint_workload")
    if ck:
        tail = [] if metrics.get("complete", True) else ["(incomplete run)"]
        return "\n".join(list(ck.get("summary", [])) + tail)
    lines = [
        f"{'epoch':>5} {'AU %':>7} {'samples/s':>10} {'MB/s':>10} {'MiB/s':>10} {'time s':>8} {'bytes read':>14}"
    ]
    for e in metrics.get("epochs", []):
        lines.append(
            f"{e['epoch']:>5} {_f(e['au_percent'], '.2f'):>7} {_f(e['samples_per_s'], '.1f'):>10} "
            f"{_f(e['io_mb_per_s'], '.1f'):>10} {_f(e['io_mib_per_s'], '.1f'):>10} "
            f"{e['epoch_time_s']:>8.2f} {e['bytes_read']:>14,}"
        )
    o = metrics.get("overall") or {}
    if o:
        lines.append(
            f"{'all':>5} {_f(o['au_percent'], '.2f'):>7} {_f(o['samples_per_s'], '.1f'):>10} "
            f"{_f(o['io_mb_per_s'], '.1f'):>10} {_f(o['io_mib_per_s'], '.1f'):>10} "
            f"{o['epoch_time_s']:>8.2f} {o['bytes_read']:>14,}"
        )
    s = metrics.get("across_epochs") or {}
    if s.get("au_percent", {}).get("mean") is not None:
        au = s["au_percent"]
        lines.append(
            f"AU across epochs: {au['mean']:.2f} ± {au['stdev']:.2f} %; "
            f"samples/s {_f(s['samples_per_s']['mean'], '.1f')} ± {_f(s['samples_per_s']['stdev'], '.1f')}"
        )
    if o.get("modelled_host_cpu_s"):
        dropped = o.get("host_cpu_dropped_s") or 0.0
        lines.append(
            f"host CPU: {o['host_cpu_s']:.2f} s spent in the steps' compute ({o['modelled_host_cpu_s']:.2f} s "
            f"modelled, {metrics.get('host_cpu_threads', 1)} thread(s)); the rest of it slept"
            + (
                f"; {dropped:.2f} s not spent: the steps' time ran out first (a busy host, or more CPU than "
                f"compute time per step)"
                if dropped >= 0.005
                else ""
            )
        )
    elif metrics.get("host_cpu_per_step_s") == 0.0:
        lines.append("host CPU: none, the steps' compute slept (an accelerator's)")
    if metrics.get("loader"):
        lines.append(f"loader: {metrics['loader']} ({metrics.get('loader_reason', '')})")
    lines += _served_lines(metrics)
    verdict = "PASS" if metrics.get("pass") else "FAIL"
    lines.append(
        f"AU threshold {metrics.get('au_threshold_percent')} %: {verdict}"
        + ("" if metrics.get("complete", True) else " (incomplete run)")
    )
    return "\n".join(lines)
