"""``dlreplay replay``: replay a workload model on real storage, compute replaced by sleep.

Each simulated accelerator (a local process, or an MPI rank) reads its shard of the
dataset files (rank r reads files r::N) through a :class:`~.loader.Loader` with
PyTorch DataLoader semantics, sleeps ``train.computation_time`` per step, writes
checkpoints as the model says, and synchronises with the other accelerators once per
step (a barrier, like data-parallel training). Metrics (:mod:`.metrics`) go to
``<out>/metrics.json``. Unless ``trace`` is off, the replay runs itself under
:func:`dlreplay.capture.run_capture`, so ``<out>`` is also a trace directory.

What each accelerator does is planned in :mod:`.plan` (its batches, its steps' compute) and
:mod:`.checkpoint`, and run by :mod:`.accelerator` (the per-accelerator loop, :func:`run_rank`);
what is settled before the accelerators start (the configuration, the dataset, the output
directory, the loader) is in :mod:`.prepare`. This module launches them: one accelerator in
this process, several as local processes, MPI ranks, or the whole replay under a capture.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlreplay.capture import REGIONS
from dlreplay.interrupt import INTERRUPT
from dlreplay.model import save_model
from dlreplay.osutil import end_with_parent

from .accelerator import make_loader, run_rank
from .checkpoint import (
    DEFAULT_WRITE_TRANSFER,
    checkpoint_workload_doc,
    prepare_restore,
    scaling,
)
from .common import ReplayError, check_replay_resources, write_json_atomic
from .metrics import render_table
from .plan import (
    RankPlan,
    epoch_batches,
    epoch_compute,
    evaluation_steps,
    model_accelerators,
    sample_files,
    spends_host_cpu,
    step_compute,
    steps_per_epoch,
)
from .prepare import (
    CLAIMS,
    IO_MODES,
    KEEP_ON_SUCCESS,
    LOADERS,
    METRICS_NAME,
    ORDER_NAME,
    ReplayConfig,
    ReplayResult,
    check_out,
    choose_loader,
    default_out,
    ensure_dataset,
    import_loader,
    metrics_doc,
    model_warnings,
    mpi_world,
    now_utc,
    worker_spec,
)

if TYPE_CHECKING:
    from dlreplay.capture import CaptureResult

#: The engine's public names (the plan, checkpoint, preparation and accelerator ones are defined in those modules).
__all__ = [
    "DEFAULT_WRITE_TRANSFER",
    "IO_MODES",
    "KEEP_ON_SUCCESS",
    "LOADERS",
    "METRICS_NAME",
    "ORDER_NAME",
    "RankPlan",
    "ReplayConfig",
    "ReplayResult",
    "choose_loader",
    "default_out",
    "epoch_batches",
    "epoch_compute",
    "evaluation_steps",
    "find_max_accelerators",
    "make_loader",
    "model_accelerators",
    "model_warnings",
    "render_result",
    "run_rank",
    "run_replay",
    "spends_host_cpu",
    "step_compute",
    "steps_per_epoch",
]

BARRIER_TIMEOUT_S = 600.0


# --------------------------------------------------------------------------- local accelerator processes


def traced_sync(wait: Callable[[], Any]) -> Callable[[], Any]:
    """*wait* (the accelerators' meeting after each step) as a DFTracer ``comm``/``barrier``
    event inside the step, where a data-parallel job's collectives are (its all-reduce): the
    replay's trace shows its ranks' waits for each other as the job's capture shows its own.
    Returns what *wait* returns (local ranks: when the last rank arrived, see
    :func:`_rank_process`)."""

    def sync() -> Any:
        ev = REGIONS.begin("barrier", "comm")
        try:
            return wait()
        finally:
            REGIONS.end(ev)

    return sync


def _rank_process(
    plan: RankPlan, barrier: Any, arrivals: Any, results: Any, keep_checkpoints: bool | str
) -> None:
    meetings = [0]

    def wait() -> float:
        # Each rank stamps its arrival (time.perf_counter: CLOCK_MONOTONIC, one clock for all
        # processes) in its slot of this meeting's half of *arrivals* (halves alternate, so a
        # fast rank's next stamp never overwrites one a slow rank has still to read); returns
        # when the last rank arrived: the wait before it is for the others, the time after it
        # the barrier's own latency (replay overhead, repaid by the next sleeps)
        half = (meetings[0] % 2) * plan.size
        meetings[0] += 1
        arrivals[half + plan.rank] = time.perf_counter()
        # A KeyboardInterrupt raised inside the barrier's own locks leaves them half released
        # ("lock is not owned" tracebacks from the rank): while waiting, Ctrl-C only sets the
        # flag, and it is raised here, after the wait, at a safe point.
        with INTERRUPT.catching("flag"):
            try:
                barrier.wait(timeout=BARRIER_TIMEOUT_S)
            except threading.BrokenBarrierError:
                if INTERRUPT.requested:  # a peer stopped for the same Ctrl-C
                    raise KeyboardInterrupt from None
                raise
        INTERRUPT.check()
        return max(arrivals[half : half + plan.size])

    sync = traced_sync(wait)

    # Forked from the parent: its flag (set if a Ctrl-C came before the fork) carries over.
    # The handler stays until the process ends: a second SIGINT must not cut the partial result.
    INTERRUPT.install("first")
    end_with_parent()  # a killed parent cannot stop the ranks: they would wait at its barrier for good
    try:
        res = run_rank(plan, sync, keep_checkpoints)
    except KeyboardInterrupt:
        res = {"rank": plan.rank, "epochs": [], "complete": False, "error": None, "order": None}
    if not res["complete"]:
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001 - best effort to release peers
            pass
    results.put(res)


# --------------------------------------------------------------------------- orchestration


def run_replay(config: ReplayConfig, echo: Callable[[str], None] | None = None) -> ReplayResult:
    """Replay ``config.model``; writes ``<out>/metrics.json`` (and a trace unless ``trace`` is off).

    Ctrl-C (also one received before the call whose KeyboardInterrupt was swallowed, see
    :mod:`dlreplay.interrupt`) stops the replay and returns partial metrics, ``complete`` false.
    """
    held = len(CLAIMS)
    try:
        return _run_replay(config, echo)
    finally:
        INTERRUPT.reset()  # this run has answered any Ctrl-C; the next starts clean
        while len(CLAIMS) > held:
            CLAIMS.pop().release()


def _run_replay(config: ReplayConfig, echo: Callable[[str], None] | None) -> ReplayResult:
    say = echo or (lambda s: None)
    if config.io not in IO_MODES:
        raise ReplayError(f"--io: expected one of {', '.join(IO_MODES)}, got {config.io!r}")
    if config.loader not in LOADERS:
        raise ReplayError(f"--loader: expected one of {', '.join(LOADERS)}, got {config.loader!r}")
    if config.accelerators is None:
        n = model_accelerators(config.model)
        config = dataclasses.replace(config, accelerators=n)
        if n > 1 and not config.traced:
            say(
                f"{n} accelerators, as many as the traced job's ranks (processes.ranks; "
                "--accelerators N to change)"
            )
    assert config.accelerators is not None
    if config.accelerators < 1:
        raise ReplayError(f"--accelerators: expected a positive integer, got {config.accelerators}")
    check_replay_resources(config.model, config.accelerators, config.out)
    comm = mpi_world()
    if comm is not None:
        return _run_mpi(config, comm, say)
    out = config.out or default_out(config.model)
    if not config.traced and (note := scaling(config.model, config.accelerators)):
        say(note)
    if config.trace and not config.traced:
        return _run_traced(config, out, say)
    check_out(out, allow_existing=config.traced)
    manifest, warnings = ensure_dataset(config, say)
    spec = worker_spec(config, manifest)
    size = config.accelerators
    steps_per_epoch(config.model, size)  # validate early
    ckdir = str((out / "checkpoints").resolve())
    if not config.traced:  # a traced replay's restore was written before its trace
        prepare_restore(config.model, ckdir, size, config.seed)
    loader, why = choose_loader(config)
    import_loader(loader)
    plans = [
        RankPlan(
            config.model,
            dataclasses.replace(spec, rank=r, ranks=size),
            r,
            size,
            config.seed,
            ckdir,
            config.record_order,
            loader,
        )
        for r in range(size)
    ]
    # One accelerator runs here: Ctrl-C raises KeyboardInterrupt. With several, this process
    # only waits for results: Ctrl-C sets the flag, polled by _run_local_ranks.
    with INTERRUPT.catching("first" if size == 1 else "flag"):
        say(
            f"replay started: {size} accelerator(s), {config.model.train.epochs} epoch(s) of "
            f"{steps_per_epoch(config.model, size)} step(s), {loader} loader ({why}); results in {out} "
            f"(Ctrl-C stops it, partial metrics are kept)"
        )
        started, t0 = now_utc(), time.perf_counter()
        if size == 1:
            try:
                ranks = [run_rank(plans[0], lambda: None, config.keep_checkpoints)]
            except KeyboardInterrupt:
                ranks = [{"rank": 0, "epochs": [], "complete": False, "error": None, "order": None}]
            interrupted = not ranks[0]["complete"] and ranks[0]["error"] is None
        else:
            ranks, interrupted = _run_local_ranks(plans, config.keep_checkpoints)
        wall = time.perf_counter() - t0
        return _finish(
            config, out, ranks, manifest, started, wall, interrupted, warnings, size, False, say
        )


def _finish(
    config: ReplayConfig,
    out: Path,
    ranks: list[dict[str, Any]],
    manifest: dict[str, Any],
    started: str,
    wall: float,
    interrupted: bool,
    warnings: Sequence[str],
    size: int,
    mpi: bool,
    say: Callable[[str], None],
) -> ReplayResult:
    doc = metrics_doc(config, ranks, manifest, started, wall, interrupted, warnings, size, mpi)
    if (ck := checkpoint_workload_doc(config.model, ranks, size)) is not None:
        doc["checkpoint_workload"] = ck
    write_json_atomic(out / METRICS_NAME, doc)
    if config.record_order:
        write_json_atomic(out / ORDER_NAME, {str(r["rank"]): r.get("order") for r in ranks})
    if not config.keep_checkpoints:
        try:
            (out / "checkpoints").rmdir()  # only when empty: the ranks deleted their own files
        except OSError:
            pass
    if doc["errors"] and not interrupted:
        raise ReplayError(
            f"replay failed ({'; '.join(doc['errors'])}); partial metrics in {out / METRICS_NAME}"
        )
    return ReplayResult(
        out=out, metrics=doc, complete=doc["complete"], traced=False, warnings=tuple(warnings)
    )


def _run_local_ranks(plans: list[RankPlan], keep: bool | str) -> tuple[list[dict[str, Any]], bool]:
    """Run each plan in its own accelerator process; returns (their results by rank, interrupted)."""
    # fork, like PyTorch's default. The replay path never runs polars in this parent before
    # forking (fork after polars' thread pool has run can deadlock csv/parquet readers).
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(len(plans))
    arrivals = ctx.Array("d", 2 * len(plans), lock=False)  # see _rank_process
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_rank_process,
            args=(p, barrier, arrivals, results, keep),
            name=f"dlreplay-rank-{p.rank}",
        )
        for p in plans
    ]
    for p in procs:
        p.start()
    got, interrupted = _collect_ranks(procs, results, len(plans))
    for p in procs:
        p.join(5.0)
        if p.is_alive():
            p.terminate()
            p.join(1.0)
    dead = {r["rank"] for r in got}
    for p, plan in zip(procs, plans, strict=True):
        if plan.rank not in dead and not interrupted:
            got.append(
                {
                    "rank": plan.rank,
                    "epochs": [],
                    "complete": False,
                    "error": f"accelerator process ended unexpectedly (exit code {p.exitcode})",
                    "order": None,
                }
            )
    got.sort(key=lambda r: r["rank"])
    if any(not r["complete"] and r["error"] is None for r in got):
        interrupted = True
    return got, interrupted


def _collect_ranks(procs: list[Any], results: Any, n: int) -> tuple[list[dict[str, Any]], bool]:
    """The results the *n* accelerator processes put on *results* (fewer when some died); a Ctrl-C
    is passed on to them and waited for at most 30 s. Returns (results, interrupted)."""
    got: list[dict[str, Any]] = []
    interrupted = False
    deadline: float | None = None
    while len(got) < n:
        try:
            got.append(results.get(timeout=1.0))
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break
            if deadline is not None and time.monotonic() > deadline:
                break
        except KeyboardInterrupt:  # SIGINT handled elsewhere than INTERRUPT's flag-only handler
            INTERRUPT.requested = True
        if INTERRUPT.requested and not interrupted:
            interrupted = True
            deadline = time.monotonic() + 30.0
            for p in (
                procs
            ):  # a Ctrl-C on the terminal reaches them anyway; a signal to us alone must too
                if p.is_alive() and p.pid:
                    try:
                        os.kill(p.pid, signal.SIGINT)
                    except ProcessLookupError:
                        pass
    return got, interrupted


def _run_mpi(config: ReplayConfig, comm: Any, say: Callable[[str], None]) -> ReplayResult:
    rank, size = comm.Get_rank(), comm.Get_size()
    if config.trace and not config.traced:
        if rank == 0:
            raise ReplayError(
                "tracing an MPI replay from inside mpiexec is not supported; run "
                "`dlreplay capture -- mpiexec -n N python -m dlreplay replay ... --no-trace`, "
                "or pass --no-trace"
            )
        comm.Abort(1)
    out = Path(
        comm.bcast(str(config.out or default_out(config.model)) if rank == 0 else None, root=0)
    )
    err: str | None = None
    manifest: dict[str, Any] = {}
    warnings: list[str] = []
    if rank == 0:
        try:
            check_out(out, allow_existing=config.traced)
            manifest, warnings = ensure_dataset(config, say)
            steps_per_epoch(config.model, size)
            if not config.traced:
                prepare_restore(
                    config.model, str((out / "checkpoints").resolve()), size, config.seed
                )
        except ReplayError as exc:
            err = str(exc)
    err = comm.bcast(err, root=0)
    if err:
        if rank == 0:
            raise ReplayError(err)
        sys.exit(1)
    manifest = comm.bcast(manifest if rank == 0 else None, root=0)
    spec = worker_spec(config, manifest)
    loader, _ = choose_loader(config)
    import_loader(loader)
    plan = RankPlan(
        config.model,
        dataclasses.replace(spec, rank=rank, ranks=size),
        rank,
        size,
        config.seed,
        str((out / "checkpoints").resolve()),
        config.record_order,
        loader,
    )
    comm.Barrier()
    started, t0 = now_utc(), time.perf_counter()
    res = run_rank(plan, traced_sync(comm.Barrier), config.keep_checkpoints)
    wall = time.perf_counter() - t0
    ranks = comm.gather(res, root=0)
    if rank != 0:
        if res.get("error"):
            sys.exit(1)
        return ReplayResult(out=out, metrics={}, complete=res["complete"], traced=False)
    interrupted = any(not r["complete"] and r["error"] is None for r in ranks)
    return _finish(
        config,
        out,
        sorted(ranks, key=lambda r: r["rank"]),
        manifest,
        started,
        wall,
        interrupted,
        warnings,
        size,
        True,
        say,
    )


def _run_traced(config: ReplayConfig, out: Path, say: Callable[[str], None]) -> ReplayResult:
    """Generate outside the trace, then re-run this replay as ``python -m dlreplay replay`` under DFTracer."""
    from dlreplay.capture import CaptureConfig, run_capture

    check_out(out, allow_existing=False)
    manifest, warnings = ensure_dataset(config, say)
    assert config.accelerators is not None
    prepare_restore(
        config.model, str(out.resolve() / "checkpoints"), config.accelerators, config.seed
    )
    model_path = out / "model.yaml"
    save_model(config.model, model_path)
    cmd = _traced_command(config, out, model_path)
    ckdir = out.resolve() / "checkpoints"
    started = now_utc()
    try:
        INTERRUPT.check()  # a Ctrl-C so far whose KeyboardInterrupt was swallowed (see dlreplay.interrupt)
        say(
            f"replay started (traced): {config.accelerators} accelerator(s), {config.model.train.epochs} epoch(s), "
            f"{choose_loader(config)[0]} loader; results and trace in {out} (Ctrl-C stops it, partial metrics "
            f"are kept)"
        )
        cap = run_capture(
            CaptureConfig(
                command=tuple(cmd),
                out=out,
                force=True,
                data_dirs=(str(config.data_dir.resolve()), str(ckdir)),
                name=config.model.model.name or "replay",
            )
        )
    except KeyboardInterrupt:
        return _not_started(config, out, manifest, started, warnings)
    finally:
        if not config.keep_checkpoints:
            shutil.rmtree(ckdir, ignore_errors=True)
    return _traced_result(config, out, cap, manifest, started, warnings)


def _traced_command(config: ReplayConfig, out: Path, model_path: Path) -> list[str]:
    """The command line of the replay that runs under the capture: this replay's settings, untraced
    inside, its dataset already generated."""
    cmd = [
        sys.executable,
        "-m",
        "dlreplay",
        "replay",
        str(model_path.resolve()),
        "--data-dir",
        str(config.data_dir.resolve()),
        "--accelerators",
        str(config.accelerators),
        "--out",
        str(out.resolve()),
        "--no-trace",
        "--_traced",
        "--no-generate",
        "--io",
        config.io,
        "--au-threshold",
        str(config.au_threshold),
        "--seed",
        str(config.seed),
        "--loader",
        config.loader,
        "--quiet",
    ]
    if config.record_order:
        cmd.append("--record-order")
    if config.cold:
        cmd += ["--cold", "--cold-method", config.cold]
    # the replay's checkpoint files are deleted here, after the trace: not the workload's I/O
    cmd.append("--keep-checkpoints" if config.keep_checkpoints else "--_checkpoints-after-trace")
    return cmd


def _traced_result(
    config: ReplayConfig,
    out: Path,
    cap: CaptureResult,
    manifest: dict[str, Any],
    started: str,
    warnings: Sequence[str],
) -> ReplayResult:
    """The result of a traced replay from the metrics its inner replay wrote and the capture's
    outcome *cap*; a failure (not a Ctrl-C) raises ReplayError."""
    path = out / METRICS_NAME
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError):
        if cap.status == "interrupted":  # stopped before its first step
            return _not_started(config, out, manifest, started, warnings)
        raise ReplayError(
            f"the traced replay wrote no metrics ({path}); exit code {cap.exit_code}, "
            f"trace status {cap.status} in {out}"
        ) from None
    interrupted = cap.status == "interrupted" or bool(metrics.get("interrupted"))
    if not interrupted and (
        cap.exit_code != 0 or metrics.get("errors")
    ):  # failed: not a Ctrl-C (exit 130)
        detail = (
            "; ".join(metrics.get("errors") or [])
            or f"the traced replay exited with code {cap.exit_code}"
        )
        raise ReplayError(f"replay failed ({detail}); partial metrics and trace in {out}")
    return ReplayResult(
        out=out,
        metrics=metrics,
        complete=bool(metrics.get("complete")) and cap.exit_code == 0,
        traced=True,
        warnings=tuple(warnings),
    )


def _not_started(
    config: ReplayConfig, out: Path, manifest: dict[str, Any], started: str, warnings: Sequence[str]
) -> ReplayResult:
    """Metrics of a replay interrupted before its first step: no epochs, ``complete`` false."""
    assert config.accelerators is not None  # set by run_replay before a traced run starts
    doc = metrics_doc(
        config, [], manifest, started, 0.0, True, warnings, config.accelerators, False
    )
    write_json_atomic(out / METRICS_NAME, doc)
    return ReplayResult(
        out=out, metrics=doc, complete=False, traced=config.trace, warnings=tuple(warnings)
    )


# --------------------------------------------------------------------------- find max accelerators


def find_max_accelerators(
    config: ReplayConfig, limit: int = 64, echo: Callable[[str], None] | None = None
) -> list[tuple[int, float | None]]:
    """Largest N whose AU stays >= the threshold: try 1, 2, 4, … then bisect. Returns (N, AU %) measured.

    Each trial is an untraced replay into ``<out>/n<N>``.
    """
    say = echo or (lambda s: None)
    base = config.out or default_out(config.model)
    measured: dict[int, float | None] = {}

    def trial(n: int) -> bool:
        if n > sample_files(config.model):
            return False
        cfg = dataclasses.replace(config, accelerators=n, out=base / f"n{n}", trace=False)
        res = run_replay(cfg, echo=say)
        if not res.complete:  # interrupted: stop searching (partial metrics are in cfg.out)
            raise KeyboardInterrupt
        au = res.metrics["overall"].get("au_percent")
        measured[n] = au
        say(f"accelerators {n}: AU {au if au is None else round(au, 2)} %")
        return au is not None and au >= config.au_threshold

    good, bad = 0, None
    n = 1
    while n <= limit:
        if trial(n):
            good, n = n, n * 2
        else:
            bad = n
            break
    if bad is not None and good:
        lo, hi = good, bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if trial(mid):
                lo = mid
            else:
                hi = mid
    return sorted(measured.items())


def render_result(result: ReplayResult) -> str:
    """The metrics table of a replay."""
    return render_table(result.metrics)
