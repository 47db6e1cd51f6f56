"""The rules over what a job read through memory maps (the ``mapped`` pass,
:mod:`~..passes.mapped`): a loop that waited for the pages of its windows to be faulted in from
storage, a run whose windows the page cache served (so the storage was never measured), and a
loop that takes its batches itself between steps, with nothing to overlap them with compute."""

from __future__ import annotations

from typing import Any

from dlreplay.units import human_bytes, human_seconds

from ..passes import Characterization
from .base import Finding, Thresholds

__all__ = ["mapped_loop", "rule_mapped"]


def mapped_loop(c: Characterization) -> bool:
    """True for a loop that reads mapped windows itself, without a DataLoader (no fetch events)."""
    m = c.results.get("mapped") or {}
    return bool(m.get("steps_with_windows")) and c.view.fetches.is_empty()


def rule_mapped(c: Characterization, t: Thresholds) -> list[Finding]:
    """``mapped-storage-stall``, ``mapped-page-cache`` and ``mapped-inline-batches``."""
    m = c.results.get("mapped") or {}
    if not m.get("windows"):
        return []
    out = [f for f in (_stall(m, t), _warm(m, t)) if f is not None]
    if mapped_loop(c):
        inline = _inline(c, m, t)
        out += [inline] if inline is not None else []
    return out


def _files(m: dict[str, Any]) -> list[str]:
    return [f["file"] for f in m.get("per_file", [])[:5]]


def _amplification(m: dict[str, Any]) -> float:
    """Bytes of the pages the slices cover over the slices' bytes (>= 1)."""
    touched = m.get("bytes_touched") or 0
    return (m.get("pages_touched") or 0) * m.get("page_size", 4096) / touched if touched else 1.0


def _stall(m: dict[str, Any], t: Thresholds) -> Finding | None:
    stall, loop = float(m.get("stall_s") or 0.0), float(m.get("loop_s") or 0.0)
    if not (m.get("cold_measured") and m.get("cold_steps") and stall > 0 and loop > 0):
        return None
    share = stall / loop
    if share < t.mapped_stall_share:
        return None
    amp = _amplification(m)
    return Finding(
        id="mapped-storage-stall",
        severity="high" if share >= t.mapped_stall_share_high else "medium",
        title=f"The loop waits for mapped pages from storage: {human_seconds(stall)}, {share:.0%} of the loop",
        evidence={
            "cold_steps": m["cold_steps"],
            "steps_with_windows": m.get("steps_with_windows"),
            "cold_bytes": m.get("cold_bytes"),
            "cold_bytes_per_cold_step": m.get("cold_bytes_per_cold_step"),
            "data_time_cold_s": m.get("data_time_cold_s"),
            "data_time_warm_s": m.get("data_time_warm_s"),
            "stall_s": stall,
            "stall_basis": m.get("stall_basis"),
            "loop_s": loop,
            "slice_bytes": m.get("slice_bytes"),
            "page_amplification": round(amp, 2),
        },
        threshold=f"extra data time of steps with cold pages / loop time >= {t.mapped_stall_share} "
        f"(high from {t.mapped_stall_share_high})",
        root_cause=(
            f"{m['cold_steps']} step(s) took windows whose pages were not in the page cache "
            f"({human_bytes(m.get('cold_bytes') or 0)} faulted in from storage); their data time (median "
            f"{human_seconds(m.get('data_time_cold_s') or 0)}) exceeds the warm steps' "
            f"({human_seconds(m.get('data_time_warm_s') or 0)}) by {human_seconds(stall)} in all "
            f"({m.get('stall_basis')}). A mapped read is a page fault: synchronous, in the loop's own "
            "thread, one at a time, each bringing a whole page and its readahead"
            + (
                f" ({amp:.1f}x the bytes of the {human_bytes(m.get('slice_bytes') or 0)} slices)"
                if amp >= 2
                else ""
            )
            + "."
        ),
        recommendation=(
            "Take the next batch's windows while the step computes (a background thread or DataLoader "
            "workers), so the faults overlap compute; or read the windows with explicit reads (np.fromfile "
            "with offset, os.preadv), which storage can queue; where the file fits in RAM "
            f"({human_bytes(m.get('file_bytes') or 0)} mapped), warm it into the page cache before "
            "training; for random windows in a file much larger than RAM, madvise(MADV_RANDOM) stops "
            "readahead reading pages no window needs."
        ),
        impact_s=stall,
        files=_files(m),
    )


def _warm(m: dict[str, Any], t: Thresholds) -> Finding | None:
    share = m.get("cold_share")
    if not m.get("cold_measured") or share is None or share > t.mapped_warm_share:
        return None
    if m.get("files_cold_at_start"):  # storage served the file: its readahead hid the rest
        return None
    mem = m.get("host_memory_bytes")
    fits = (
        f", and fits in the host's {human_bytes(mem)} of RAM"
        if mem and m.get("file_bytes", 0) < mem
        else ""
    )
    dt = m.get("data_time_s")
    return Finding(
        id="mapped-page-cache",
        severity="info",
        title="Mapped windows came from the page cache: the run did not measure the storage",
        evidence={
            "pages_touched": m.get("pages_touched"),
            "cold_bytes": m.get("cold_bytes"),
            "cold_share": share,
            "file_bytes": m.get("file_bytes"),
            "host_memory_bytes": mem,
            "data_time_s": dt,
        },
        threshold=f"pages of the windows not in the page cache when taken <= {t.mapped_warm_share:.0%}, "
        "and each file's first window found in the page cache",
        root_cause=(
            f"Of the {m.get('pages_touched', 0):,} pages the windows covered, "
            f"{human_bytes(m.get('cold_bytes') or 0)} ({share:.1%}) were not in the page cache when "
            f"taken: the mapped file ({human_bytes(m.get('file_bytes') or 0)}) was cached (written or read "
            f"shortly before{fits}), so the loop's data time"
            + (f" ({human_seconds(dt)} a step, median)" if dt is not None else "")
            + " is that of memory. On a node where the file is not cached, or a file larger than "
            "RAM, every window faults its pages in from storage, one synchronous fault at a time."
        ),
        recommendation=(
            "To measure the storage, replay the distilled model cold (`dlreplay replay MODEL --data-dir "
            "DIR --cold` drops the dataset's pages before each epoch), or capture again after dropping "
            "the file's pages (`vmtouch -e FILE`, or posix_fadvise DONTNEED)."
        ),
        files=_files(m),
    )


def _inline(c: Characterization, m: dict[str, Any], t: Thresholds) -> Finding | None:
    s = c["steps"]
    au = s.get("au_data", s.get("au"))
    if au is None or au >= t.au_target:
        return None
    wait = float(s.get("wait_s") or 0.0)
    steps = max(int(m.get("steps_with_windows") or 1), 1)
    anew = (m.get("maps") or 0) >= steps
    dt = m.get("data_time_s")
    return Finding(
        id="mapped-inline-batches",
        severity="high" if au < t.au_high else "medium",
        title=f"The loop takes its mapped batches itself between steps: AU {au:.0%}",
        evidence={
            "au_data": au,
            "wait_s": wait,
            "data_time_s": dt,
            "windows_per_step": m.get("windows_per_step"),
            "window_bytes": m.get("window_bytes"),
            "maps": m.get("maps"),
            "steps_with_windows": steps,
            "stall_s": m.get("stall_s"),
        },
        threshold=f"compute / (compute + data wait) < {t.au_target}, no DataLoader, mapped windows",
        root_cause=(
            f"No DataLoader: between two steps the training thread itself takes "
            f"{m.get('windows_per_step') or 0:g} window(s) of {human_bytes(m.get('window_bytes') or 0)}, copies "
            "and converts them"
            + (" and maps the file anew" if anew else "")
            + (f" ({human_seconds(dt)} a step, median)" if dt is not None else "")
            + f"; nothing overlaps that with compute, so the loop waited {human_seconds(wait)} in all."
        ),
        recommendation=(
            "Prepare the next batch while the step computes: a DataLoader over the window offsets with "
            "num_workers >= 1, or a background thread with a queue of one or two batches; pin the batch "
            "and copy it with non_blocking=True"
            + ("; keep one np.memmap open rather than one per batch" if anew else "")
            + "."
        ),
        impact_s=max(0.0, wait - float(m.get("stall_s") or 0.0)),
        files=_files(m),
    )
