"""Trace loading on a Dask distributed cluster (``dlreplay analyze --workers N | --scheduler ADDR``).

Loading is two stages (:mod:`.load`): :func:`~.load.parse_part` decompresses and parses
groups of trace files (or byte ranges of whole gzip members of one large file) into raw
partial frames, independently of every other file;
:func:`~.load.combine_parts` resolves what spans files (FH paths, processes, offsets).
Here the first stage runs as one Dask task per group of files (or per range of a large
file) on the cluster's workers, and the second on the client, with the same code as the single-process
path, so the event table is identical: same rows, same counts and bytes, same
salvage counts for damaged files.

The workers read the trace files themselves: the trace path must be visible to them
under the same name (a shared file system, or a LocalCluster on this machine).
Characterisation passes then run on the combined table in the client.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlreplay.errors import UsageError

from .load import LoadedTrace, _find_inputs, _groups, combine_parts, member_ranges, parse_part

__all__ = ["ClusterInfo", "cluster", "load_trace_distributed"]


@dataclass(frozen=True)
class ClusterInfo:
    """Where the work ran: scheduler address, workers, tasks, seconds."""

    scheduler: str
    workers: int
    tasks: int
    seconds: float


@contextmanager
def cluster(scheduler: str | None = None, workers: int | None = None, *, threads_per_worker: int = 1,
            memory_limit: str | int = "auto") -> Any:
    """A Dask ``Client``: attached to ``scheduler`` (``tcp://host:port``), or a new
    ``LocalCluster`` of ``workers`` processes bound to 127.0.0.1 (closed afterwards)."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as exc:  # pragma: no cover - dask is a dependency
        raise UsageError(f"distributed analysis needs dask[distributed]: {exc}") from exc
    if (scheduler is None) == (workers is None):
        raise UsageError("give either --scheduler ADDRESS or --workers N")
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=10)
        except (OSError, TimeoutError) as exc:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc
        try:
            yield client
        finally:
            client.close()
        return
    local = LocalCluster(n_workers=workers, threads_per_worker=threads_per_worker, processes=True,
                         host="127.0.0.1", dashboard_address=None, memory_limit=memory_limit,
                         silence_logs=40)
    client = Client(local)
    try:
        yield client
    finally:
        client.close()
        local.close()


#: Files at least this big (stored bytes) are split into ranges of gzip members.
SPLIT_BYTES = 64 << 20
#: Compressed bytes per range of a split file.
RANGE_BYTES = 16 << 20


def load_trace_distributed(path: str | os.PathLike, client: Any, *, split_bytes: int = SPLIT_BYTES,
                           range_bytes: int = RANGE_BYTES,
                           echo: Callable[[str], None] | None = None) -> tuple[LoadedTrace, ClusterInfo]:
    """Load a trace with the parse stage on ``client``'s cluster (see the module doc).

    Files of at least ``split_bytes`` are cut into ranges of whole gzip members of about
    ``range_bytes`` (found by a streaming scan on a worker, :func:`~.load.member_ranges`),
    one task each; a file that does not decode cleanly is parsed whole (salvage rules).
    """
    files, manifest = _find_inputs(path)
    nworkers = max(1, len(client.scheduler_info().get("workers", {})))
    t0 = time.perf_counter()
    indexed = [(src, Path(p).resolve()) for src, p in enumerate(files)]
    big = [(src, p) for src, p in indexed if p.stat().st_size >= split_bytes]
    scans = client.gather(client.map(member_ranges, [str(p) for _, p in big], [range_bytes] * len(big), pure=False))
    jobs: list[list[Any]] = []
    split = set()
    for (src, p), ranges in zip(big, scans, strict=True):
        if ranges and len(ranges) > 1:
            split.add(src)
            jobs += [[(src, str(p), a, b, k)] for k, (a, b) in enumerate(ranges)]
    rest = [(src, p) for src, p in indexed if src not in split]
    # several groups per worker: the scheduler balances uneven files
    jobs += [[(src, str(p)) for src, p in g] for g in _groups(rest, nworkers * 4)]
    futures = client.map(parse_part, jobs, pure=False)
    if echo:
        echo(f"parsing {len(files)} file(s) in {len(jobs)} task(s) on {nworkers} Dask worker(s)")
    parts = client.gather(futures)
    events, reports = combine_parts(parts, [p.name for p in files])
    info = ClusterInfo(str(client.scheduler.address), nworkers, len(jobs), time.perf_counter() - t0)
    return LoadedTrace(events=events, files=reports, manifest=manifest), info
