"""Trace loading on a Dask distributed cluster (``dlreplay analyze --workers N | --scheduler ADDR``).

Loading is two stages (:mod:`.load`): :func:`~.load.parse_part` decompresses, parses and
resolves groups of whole trace files (time units, processes, offsets: what one file
decides), or parses byte ranges of whole gzip members of one large file, independently
of every other file; :func:`~.load.combine` resolves what spans files (``FH`` paths, the
ranges of a file together, the order of all rows). Here the first stage runs as one Dask
task per group of files (or per range of a large file) on the cluster's workers, with
the same code as the single-process loader (which runs the same jobs in threads), so
the event table is identical: same rows, same counts and bytes, same salvage counts for
damaged files.

Two ways to finish:

- :func:`load_trace_distributed` combines the parts on the client and returns the table
  (for notebooks and for code that needs the rows);
- :func:`analyze_distributed` (what ``dlreplay analyze --workers/--scheduler`` runs)
  combines the parts in a task on one worker and runs the characterisation passes, the
  findings rules, the report figures and (for ``--verify``) the distillation there too:
  the event table stays on the cluster and only the results (a few kB of numbers, the
  findings, PNG figures) come back to the client, which therefore needs no more memory
  than the results. The results equal the single-process path's, pass by pass.

The workers read the trace files themselves: the trace path must be visible to them
under the same name (a shared file system, or a LocalCluster on this machine).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlreplay.errors import UsageError
from dlreplay.interrupt import hold_point, wait_interruptibly

from .findings import Finding, Thresholds, find
from .passes import Characterization, characterize
from .summary import Summary
from .trace.inputs import file_groups, find_inputs, source_name
from .trace.load import (
    FileReport,
    LoadedTrace,
    combine,
    combine_parts,
    member_ranges,
    parse_part,
)
from .trace.plausible import check_values

__all__ = [
    "ClusterInfo",
    "RemoteAnalysis",
    "RemoteView",
    "analyze_distributed",
    "cluster",
    "load_trace_distributed",
]


@dataclass(frozen=True)
class ClusterInfo:
    """Where the work ran: scheduler address, workers, tasks, seconds."""

    scheduler: str
    workers: int
    tasks: int
    seconds: float


#: Seconds ``--scheduler`` waits for the scheduler to answer, the whole handshake included
#: (Dask retries a refused connection until then: a scheduler still starting is waited
#: for), unless Dask's own ``distributed.comm.timeouts.connect`` is set in the environment.
CONNECT_TIMEOUT_S = 10.0
_CONNECT_ENV = "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT"


def connect_timeout() -> float:
    """Seconds to wait for a Dask scheduler: Dask's ``distributed.comm.timeouts.connect``
    where its environment variable sets it (``DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=60s``),
    else :data:`CONNECT_TIMEOUT_S` (Dask's default of 30 s is long for a mistyped address)."""
    value = os.environ.get(_CONNECT_ENV, "").strip()
    if value:
        from dask.utils import parse_timedelta

        try:  # (the variable itself: Dask's config read it when dask was imported, maybe before it was set)
            seconds = parse_timedelta(value, "s")
        except (TypeError, ValueError, KeyError):
            seconds = None
        if seconds is not None and 0 < seconds < 1e6:
            return float(seconds)
        raise UsageError(
            f"{_CONNECT_ENV}={os.environ[_CONNECT_ENV]!r} is not a duration above 0 and under "
            "1,000,000 s (e.g. 60s)"
        )
    return CONNECT_TIMEOUT_S


#: What Dask raises on a configuration value it cannot parse (a ``DASK_*`` environment
#: variable or a config file, e.g. a timeout of ``soon``), from deep inside its start.
_CONFIG_ERRORS = (KeyError, ValueError, TypeError)


def _config_error(
    exc: BaseException, what: str = "Dask cannot start with its configuration"
) -> UsageError:
    """A usage error for a Dask start that failed (on its configuration, most often): the
    first sentence of Dask's message (its list of valid units is long), and the ``DASK_*``
    environment variables set, where such values come from."""
    text = str(exc).strip().strip("'\"") or type(exc).__name__
    first = text.split(". ")[0][:200]
    names = sorted(k for k in os.environ if k.startswith("DASK_"))
    where = (
        (
            f" (Dask's settings come from DASK_* environment variables, set here: {', '.join(names)}, "
            "and its config files)"
        )
        if names
        else ""
    )
    return UsageError(f"{what}: {first}{where}")


@contextmanager
def cluster(
    scheduler: str | None = None,
    workers: int | None = None,
    *,
    threads_per_worker: int = 1,
    memory_limit: str | int = "auto",
) -> Any:
    """A Dask ``Client``: attached to ``scheduler`` (``tcp://host:port``), or a new
    ``LocalCluster`` of ``workers`` processes bound to 127.0.0.1 (closed afterwards)."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as exc:  # pragma: no cover - dask is a dependency
        raise UsageError(f"distributed analysis needs dask[distributed]: {exc}") from exc
    if (scheduler is None) == (workers is None):
        raise UsageError("give either --scheduler ADDRESS or --workers N")
    timeout = connect_timeout()  # (a bad setting of it is named before anything starts)
    if scheduler is not None:
        started = time.monotonic()
        _handshake(scheduler, timeout)
        try:
            client = Client(scheduler, timeout=max(1.0, timeout - (time.monotonic() - started)))
        except (OSError, TimeoutError) as exc:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc
        except _CONFIG_ERRORS as exc:
            raise _config_error(exc) from None
        try:
            yield client
        except KeyboardInterrupt:
            _quiet_after_interrupt()
            raise
        finally:
            client.close()
        return
    # A terminal's Ctrl-C reaches every process of the group: the workers ignore it (a
    # preload), this process answers it and closes the cluster.
    # No dashboard; the scheduler's HTTP routes (health, metrics), which it serves even so,
    # on a free port of 127.0.0.1: by default they take 8787, and a second analysis on the
    # machine warned "Port 8787 is already in use".
    levels: dict[str, int] | None = (
        _levels()
    )  # LocalCluster's silence_logs sets them for good: put back after the close
    try:
        local = LocalCluster(
            n_workers=workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            memory_limit=memory_limit,
            scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.CRITICAL,
            preload=["dlreplay.analyze._dask_preload"],
        )
    except (
        *_CONFIG_ERRORS,
        RuntimeError,
    ) as exc:  # RuntimeError: "Cluster failed to start: <cause>"
        if levels is not None:
            _restore(levels)
        raise _config_error(exc.__cause__ or exc, "cannot start a local Dask cluster") from None
    attached: Client | None = None
    try:
        attached = Client(local)
        yield attached
    except KeyboardInterrupt:
        _quiet_after_interrupt()
        levels = None  # the process is ending: its pending tasks' errors stay unlogged
        raise
    finally:
        # The results are in (or the error is on its way up): what the workers, nanny and
        # scheduler log while the cluster shuts down (a heartbeat that finds the scheduler
        # gone, a stream closed under a worker) is shutdown noise, logged with tracebacks,
        # that would end a clean run's output. Then this process's logging is as it was (a
        # notebook that analysed on a local cluster keeps its log levels).
        _silence()
        if attached is not None:
            attached.close()
        local.close()
        if levels is not None:
            _restore(levels)


def _handshake(scheduler: str, timeout: float) -> None:
    """Connect to ``scheduler`` and complete Dask's handshake within ``timeout`` seconds,
    or raise a :class:`UsageError` saying which step failed.

    Dask bounds only the TCP connect by its connect timeout: its handshake then waits for
    the peer's first message for ever, so an address where something accepts connections
    and never answers (a stopped process, another service, a firewall that accepts) held
    ``--scheduler`` for good. Here the whole of it runs under one deadline, in a thread of
    its own with its own event loop (the caller may be running one: a notebook), while
    this thread waits in slices (Ctrl-C is answered)."""
    import asyncio

    from distributed.comm import connect

    outcome: dict[str, BaseException | None] = {}
    done = threading.Event()

    async def probe() -> None:
        # a second past Dask's own connect deadline: a refused or unreachable address gets
        # Dask's message (it retries until then); only a silent peer reaches this one
        comm = await asyncio.wait_for(connect(scheduler, timeout=timeout), timeout + 1)
        await comm.close()

    def run() -> None:
        try:
            asyncio.run(probe())
            outcome["error"] = None
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="dlreplay-dask-handshake").start()
    # a little longer than the probe's own deadline: its timeout is the better message
    if not wait_interruptibly(done, timeout + 6):
        outcome["error"] = asyncio.TimeoutError()
    exc = outcome.get("error")
    if exc is None:
        return
    if isinstance(exc, asyncio.TimeoutError | TimeoutError) and not str(exc):
        raise UsageError(
            f"cannot reach the Dask scheduler at {scheduler}: something accepts connections "
            f"there but did not complete Dask's handshake within {timeout:g} s (is it a Dask "
            "scheduler? is the address or port right?)"
        ) from None
    text = str(exc).strip()[:300] or type(exc).__name__
    if isinstance(exc, OSError | TimeoutError):
        raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {text}") from None
    # anything else came from decoding what the peer sent (or from a DASK_* setting)
    raise _config_error(
        exc,
        f"cannot use {scheduler} as a Dask scheduler: what answered there is not Dask's "
        f"handshake ({type(exc).__name__})",
    ) from None


#: The loggers a closing cluster fills with tracebacks.
_NOISY_LOGGERS = ("asyncio", "distributed", "tornado")


def _levels() -> dict[str, int]:
    """The levels of :data:`_NOISY_LOGGERS` in this process."""
    return {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}


def _restore(levels: dict[str, int]) -> None:
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _silence() -> None:
    """Silence :data:`_NOISY_LOGGERS` in this process."""
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def _quiet_after_interrupt() -> None:
    """After a Ctrl-C, the client's pending gathers end with errors nobody will read, which
    asyncio and distributed log with tracebacks ("Task exception was never retrieved") while
    the cluster closes: the interrupt was the message, so those logs are silenced (the
    process is ending: the levels stay)."""
    _silence()


#: Files at least this big (stored bytes) are split into ranges of gzip members.
SPLIT_BYTES = 64 << 20
#: Compressed bytes per range of a split file.
RANGE_BYTES = 16 << 20


def _submit_parse(
    path: str | os.PathLike,
    client: Any,
    split_bytes: int,
    range_bytes: int,
    echo: Callable[[str], None] | None,
) -> tuple[list[Any], list[Path], dict | None, int]:
    """Submit the parse stage: (futures of parts, trace files, manifest, workers).

    The jobs are those of the single-machine loader (:func:`~.load.parse_part`): groups of
    whole files, and byte ranges of the gzip members of files of at least
    ``split_bytes``; the ranges of a file are resolved together where the parts are
    combined (:func:`~.load.resolve_ranges`, which parses the file whole when a cut was
    wrong or the file is damaged)."""
    files, manifest = find_inputs(path)
    nworkers = max(1, len(client.scheduler_info().get("workers", {})))
    indexed = [(src, Path(p).resolve()) for src, p in enumerate(files)]
    jobs: list[list[Any]] = []
    split = set()
    for src, p in indexed:
        if p.stat().st_size >= split_bytes:
            ranges = member_ranges(p, range_bytes)
            if ranges and len(ranges) > 1:
                split.add(src)
                jobs += [[(src, str(p), a, b, k)] for k, (a, b) in enumerate(ranges)]
    rest = [(src, p) for src, p in indexed if src not in split]
    # several groups per worker: the scheduler balances uneven files
    jobs += [[(src, str(p)) for src, p in g] for g in file_groups(rest, nworkers * 4)]
    futures = client.map(parse_part, jobs, pure=False)
    if echo:
        echo(f"parsing {len(files)} file(s) in {len(jobs)} task(s) on {nworkers} Dask worker(s)")
    hold_point("dask-parse")  # test-only: a Ctrl-C with tasks in flight, on any machine
    return futures, files, manifest, nworkers


def load_trace_distributed(
    path: str | os.PathLike,
    client: Any,
    *,
    split_bytes: int = SPLIT_BYTES,
    range_bytes: int = RANGE_BYTES,
    echo: Callable[[str], None] | None = None,
) -> tuple[LoadedTrace, ClusterInfo]:
    """Load a trace with the parse stage on ``client``'s cluster (see the module doc).

    Files of at least ``split_bytes`` are cut into ranges of whole gzip members of about
    ``range_bytes`` (:func:`~.load.member_ranges`), one task each; a file whose ranges
    do not decode cleanly is parsed whole (salvage rules).
    """
    t0 = time.perf_counter()
    futures, files, manifest, nworkers = _submit_parse(path, client, split_bytes, range_bytes, echo)
    parts = client.gather(futures)
    loaded = check_values(
        dataclasses.replace(combine(parts, [source_name(p) for p in files]), manifest=manifest)
    )
    info = ClusterInfo(
        str(client.scheduler.address), nworkers, len(futures), time.perf_counter() - t0
    )
    return loaded, info


@dataclass(frozen=True)
class RemoteView:
    """What the client keeps of a :class:`~.passes.TraceView` whose table stayed on a worker.

    It answers what is read of a view after the passes ran: the summary, the duration
    (seconds), the loader-worker and consumer pids, and the report's figures
    (``rendered``: key -> (title, PNG bytes or None), None when none were asked for).
    """

    summary: Summary
    duration_s: float
    workers: list[int]
    consumers: list[int]
    rendered: dict[str, tuple[str, bytes | None]] | None


@dataclass(frozen=True)
class RemoteAnalysis:
    """The results of :func:`analyze_distributed`; the event table is not among them."""

    characterization: Characterization
    findings: list[Finding]
    files: list[FileReport]
    manifest: dict | None
    model: Any  # WorkloadModel distilled on the worker (``distill=True``), else None
    info: ClusterInfo

    @property
    def loaded(self) -> LoadedTrace:
        """The per-file reports as a :class:`LoadedTrace` without rows (damage, dropped counts)."""
        return LoadedTrace(events=_empty_events(), files=self.files, manifest=self.manifest)


def _empty_events() -> Any:
    import polars as pl

    from dlreplay.schema import EVENT_SCHEMA

    return pl.DataFrame(schema=EVENT_SCHEMA)


def _combine_on_worker(
    parts: list[Any], names: list[str], manifest: dict | None
) -> tuple[Any, list[FileReport]]:
    """The combined table and file reports, impossible values set aside as the local load
    does (:func:`~.trace.plausible.check_values`)."""
    events, reports = combine_parts(parts, names)
    checked = check_values(LoadedTrace(events=events, files=list(reports), manifest=manifest))
    return checked.events, checked.files


def _events_of(combined: tuple[Any, list[FileReport]]) -> Any:
    return combined[0]


def _reports_of(combined: tuple[Any, list[FileReport]]) -> list[FileReport]:
    return combined[1]


def _analyse_on_worker(
    events: Any,
    manifest: dict | None,
    data_dirs: list[str] | None,
    thresholds: Thresholds,
    disabled: set[str],
    figures: bool,
    distill_model: bool,
    distill_kw: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Passes, rules, figures and (optionally) the distilled model, on the worker holding the
    table (``distill_kw``: :func:`~.distill.distill`'s source and dataset fingerprint)."""
    from .report import figures as render_figures

    c = characterize(events, manifest=manifest, data_dirs=data_dirs)
    found = find(c, thresholds, disabled)
    model = None
    if distill_model and events.height:
        from .distill import distill

        model = distill(
            events,
            manifest=manifest,
            data_dirs=data_dirs,
            **{"source": "the trace", **(distill_kw or {})},
        )
    v = c.view
    view = RemoteView(
        summary=v.summary,
        duration_s=v.duration_s,
        workers=list(v.workers),
        consumers=list(v.consumers),
        rendered=render_figures(c) if figures else None,
    )
    return {"results": c.to_dict(), "view": view, "findings": found, "model": model}


def analyze_distributed(
    path: str | os.PathLike,
    client: Any,
    *,
    data_dirs: list[str] | None = None,
    thresholds: Thresholds | None = None,
    disabled: set[str] | None = None,
    figures: bool = True,
    distill_model: bool = False,
    distill_kw: dict[str, Any] | None = None,
    split_bytes: int = SPLIT_BYTES,
    range_bytes: int = RANGE_BYTES,
    echo: Callable[[str], None] | None = None,
) -> RemoteAnalysis:
    """Parse, combine, characterise and diagnose a trace on ``client``'s cluster (module doc).

    ``data_dirs`` defaults to the manifest's. ``figures`` renders the report's figures on
    the worker (PNG bytes come back); ``distill_model`` also distills the workload model
    there (for ``--verify``, whose replays then run on the client), with ``distill_kw``
    (:func:`~.distill.distill`'s ``source``, ``fingerprint`` and ``fingerprint_origin``).
    """
    t0 = time.perf_counter()
    futures, files, manifest, nworkers = _submit_parse(path, client, split_bytes, range_bytes, echo)
    dirs = list(data_dirs or []) or (manifest or {}).get("data_dirs") or None
    combined = client.submit(
        _combine_on_worker, futures, [source_name(p) for p in files], manifest, pure=False
    )
    events = client.submit(_events_of, combined, pure=False)
    reports = client.submit(_reports_of, combined, pure=False)
    if echo:
        echo("combining and characterising on a Dask worker (the event table stays on the cluster)")
    out = client.submit(
        _analyse_on_worker,
        events,
        manifest,
        dirs,
        thresholds or Thresholds(),
        set(disabled or ()),
        figures,
        distill_model,
        distill_kw,
        pure=False,
    )
    res, file_reports = client.gather([out, reports])
    view: RemoteView = res["view"]
    info = ClusterInfo(
        str(client.scheduler.address), nworkers, len(futures) + 3, time.perf_counter() - t0
    )
    c = Characterization(res["results"], view)  # type: ignore[arg-type]
    return RemoteAnalysis(c, res["findings"], file_reports, manifest, res["model"], info)
