"""The timeline's process and thread tracks: which process is a consumer (it fetches batches
or steps), which are its data-loader workers (they load items), and what each track is called.

Names: ``consumer (pid N)`` (``rank R consumer (pid N)`` when several processes consume),
``loader worker K (pid N)`` for a consumer's workers (K in start order), else the traced
command for a root process, else ``process (pid N)``; `` @host`` is added when the trace
spans several hosts. Threads are ``<process label> main`` or ``<process label> thread T``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ..trace import vocabulary as voc

__all__ = ["Layout", "layout"]


@dataclass
class Layout:
    """Names and ids of the process and thread tracks."""

    process_names: dict[int, str]
    process_order: dict[int, int]
    thread_names: dict[tuple[int, int], str]
    consumers: list[int]
    workers: dict[int, list[int]]  # consumer pid -> worker pids in start order


def layout(events: pl.DataFrame, manifest: dict[str, Any] | None) -> Layout:
    """Name every process: consumers (fetch events), their loader workers (item events), others."""
    rows = _processes(events)
    ppid = {r["pid"]: r["ppid"] for r in rows}
    consumers = [r["pid"] for r in rows if r["is_consumer"]]
    names = _consumer_names(consumers)
    workers, orphans = _workers(rows, ppid, consumers)
    names.update(_worker_names(workers, orphans, consumers))
    _name_the_others(names, rows, ppid, manifest)
    if len({r["host"] for r in rows}) > 1:
        for r in rows:
            if r["host"]:
                names[r["pid"]] += f" @{r['host']}"
    order = {r["pid"]: i for i, r in enumerate(rows)}
    return Layout(names, order, _thread_names(events, names), consumers, workers)


def _processes(events: pl.DataFrame) -> list[dict[str, Any]]:
    """One row per process, in start order: pid, start, ppid, is_consumer, is_worker, host."""
    procs = (
        events.group_by("pid")
        .agg(
            pl.col("ts").min().alias("start"),
            pl.col("ppid").drop_nulls().first().alias("ppid"),
            pl.col("role").is_in([voc.FETCH, voc.STEP, voc.COMPUTE]).any().alias("is_consumer"),
            (pl.col("role") == voc.ITEM).any().alias("is_worker"),
            pl.col("host").drop_nulls().first().alias("host"),
        )
        .sort("start", "pid", nulls_last=True)
    )
    return procs.to_dicts()


def _consumer_names(consumers: list[int]) -> dict[int, str]:
    return {
        pid: f"rank {rank} consumer (pid {pid})" if len(consumers) > 1 else f"consumer (pid {pid})"
        for rank, pid in enumerate(consumers)
    }


def _owner(pid: int, ppid: dict[int, Any], consumers: list[int]) -> int | None:
    """The consumer ``pid`` descends from (the only consumer when its ancestry is not traced)."""
    seen: set[int] = set()
    p = ppid.get(pid)
    while p is not None and p not in seen:
        if p in consumers:
            return p
        seen.add(p)
        p = ppid.get(p)
    return consumers[0] if len(consumers) == 1 else None


def _workers(
    rows: list[dict[str, Any]], ppid: dict[int, Any], consumers: list[int]
) -> tuple[dict[int, list[int]], list[int]]:
    """Each consumer's loader workers in start order, and the workers no consumer owns."""
    workers: dict[int, list[int]] = {c: [] for c in consumers}
    orphans: list[int] = []
    for r in rows:
        if r["is_worker"] and not r["is_consumer"]:
            c = _owner(r["pid"], ppid, consumers)
            (workers[c] if c is not None else orphans).append(r["pid"])
    return workers, orphans


def _worker_names(
    workers: dict[int, list[int]], orphans: list[int], consumers: list[int]
) -> dict[int, str]:
    names: dict[int, str] = {}
    for c, ws in workers.items():
        prefix = f"rank {consumers.index(c)} " if len(consumers) > 1 else ""
        for k, w in enumerate(ws):
            names[w] = f"{prefix}loader worker {k} (pid {w})"
    for k, w in enumerate(orphans):
        names[w] = f"loader worker {k} (pid {w})"
    return names


def _name_the_others(
    names: dict[int, str],
    rows: list[dict[str, Any]],
    ppid: dict[int, Any],
    manifest: dict[str, Any] | None,
) -> None:
    """Name the processes that neither consume nor load: a root one after the traced command."""
    command = (manifest or {}).get("command") or []
    cmd = " ".join(Path(str(c)).name for c in command[:2]) if command else ""
    traced = set(ppid)
    for r in rows:
        pid = r["pid"]
        if pid in names:
            continue
        root = ppid.get(pid) not in traced
        names[pid] = f"{cmd} (pid {pid})" if cmd and root else f"process (pid {pid})"


def _thread_names(events: pl.DataFrame, names: dict[int, str]) -> dict[tuple[int, int], str]:
    """Every thread, in start order, named after its process."""
    threads = events.group_by("pid", "tid").agg(pl.col("ts").min()).sort("ts", nulls_last=True)
    thread_names: dict[tuple[int, int], str] = {}
    for pid, tid, _ in threads.iter_rows():
        label = names[pid].split(" (pid")[0]
        thread_names[(pid, tid)] = f"{label} main" if tid == pid else f"{label} thread {tid}"
    return thread_names
