"""``dlreplay replay``: replay a workload model on real storage, compute replaced by sleep.

Each simulated accelerator (a local process, or an MPI rank) reads its shard of the
dataset files (rank r reads files r::N) through a :class:`~.loader.Loader` with
PyTorch DataLoader semantics, sleeps ``train.computation_time`` per step, writes
checkpoints as the model says, and synchronises with the other accelerators once per
step (a barrier, like data-parallel training). Metrics (:mod:`.metrics`) go to
``<out>/metrics.json``. Unless ``trace`` is off, the replay runs itself under
:func:`dlreplay.capture.run_capture`, so ``<out>`` is also a trace directory.

What each accelerator does is planned in :mod:`.plan` (its batches, its steps' compute) and
:mod:`.checkpoint`; what is settled before the accelerators start (the configuration, the
dataset, the output directory, the loader) is in :mod:`.prepare`. This module runs them:
the per-accelerator loop (:func:`run_rank`) and the ranks (local processes, or MPI).
"""

from __future__ import annotations

import dataclasses
import gc
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
from typing import Any

import numpy as np

from dlreplay.capture import REGIONS
from dlreplay.interrupt import INTERRUPT
from dlreplay.model import save_model
from dlreplay.osutil import end_with_parent

from .checkpoint import DEFAULT_WRITE_TRANSFER, Checkpointer
from .common import ReplayError, check_replay_resources, write_json_atomic
from .hostcpu import HostCpu
from .loader import Loader
from .metrics import render_table
from .plan import (
    RankPlan,
    epoch_batches,
    epoch_compute,
    evaluation_steps,
    model_accelerators,
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

#: The engine's public names (the plan, checkpoint and preparation ones are defined in those modules).
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


# --------------------------------------------------------------------------- per accelerator


def run_rank(
    plan: RankPlan, sync: Callable[[], None], keep_checkpoints: bool | str = False
) -> dict[str, Any]:
    """Run one accelerator: epochs of (fetch batch, sleep compute, checkpoint, sync), then each
    epoch's end (epoch checkpoint, evaluation, the model's epoch-end time).

    Returns ``{"rank", "epochs": [records], "complete", "error", "order"}``. Times in
    seconds, sizes in bytes. Ctrl-C ends the run early (``complete`` false), at the latest
    after the step in progress (see :mod:`.interrupt`).
    """
    with INTERRUPT.catching():
        return _run_rank(plan, sync, keep_checkpoints)


class _Sleeper:
    """Sleeps modelled seconds; carries each sleep's overshoot into the next, so the total
    slept tracks the model (a VM's sleeps run long by tens of microseconds to milliseconds)."""

    def __init__(self) -> None:
        self.debt = 0.0

    def sleep(self, seconds: float, spent: float = 0.0) -> float:
        """Make up *seconds* of which *spent* have passed already (the step's host CPU work):
        sleep about the rest; returns the seconds taken in all (*spent* included). Time taken
        beyond the model, by a late wake-up or by CPU work that took longer, is carried into
        the next sleeps."""
        if seconds <= 0 and spent <= 0:
            return 0.0
        t0 = time.perf_counter()
        if seconds - spent - self.debt > 0:
            time.sleep(seconds - spent - self.debt)
        took = spent + time.perf_counter() - t0
        self.debt += took - seconds
        return took


def make_loader(plan: RankPlan) -> Any:
    """The run's data loader: PyTorch's DataLoader (``plan.loader == "torch"``) or the builtin one."""
    rd = plan.model.reader
    if plan.loader == "torch":
        from .torchloader import TorchLoader

        return TorchLoader(
            plan.spec, rd.read_threads, rd.prefetch_factor, rd.persistent_workers, rd.pin_memory
        )
    # PyTorch starts new worker processes at every epoch unless persistent_workers (and joins them
    # in the next() that ends the epoch): one Loader per epoch then.
    persistent = rd.persistent_workers or rd.read_threads == 0 or rd.worker_kind == "thread"
    return Loader(
        plan.spec, rd.read_threads, rd.worker_kind, rd.prefetch_factor, one_epoch=not persistent
    )


def _loader_events_from_hooks(plan: RankPlan) -> bool:
    """A traced torch replay: the capture hooks emit epoch/fetch/step for the DataLoader."""
    if plan.loader != "torch":
        return False
    from .torchloader import loader_events_from_hooks

    return loader_events_from_hooks()


def _new_record(epoch: int) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "steps": 0,
        "samples": 0,
        "bytes_read": 0,
        "compute_s": 0.0,
        "modelled_compute_s": 0.0,
        "host_cpu_s": 0.0,
        "modelled_host_cpu_s": 0.0,
        "host_cpu_dropped_s": 0.0,
        "io_wait_s": 0.0,
        "checkpoint_s": 0.0,
        "checkpoint_bytes": 0,
        "evaluation_s": 0.0,
        "epoch_end_s": 0.0,
        "window_s": 0.0,
        "samples_in_window": 0,
        "bytes_in_window": 0,
        "epoch_time_s": 0.0,
        "worker_pids": [],
    }


class _RankRun:
    """One accelerator's run (see :func:`run_rank`): the state its epochs and steps share."""

    def __init__(self, plan: RankPlan, sync: Callable[[], None]) -> None:
        m = plan.model
        self.plan, self.model, self.sync = plan, m, sync
        self.compute_rng = np.random.default_rng([plan.seed, plan.rank, 0xC0])
        self.edge_rng = np.random.default_rng([plan.seed, plan.rank, 0xE0])
        self.epochs: list[dict[str, Any]] = []
        self.order: dict[str, list[int]] = {}
        self.result: dict[str, Any] = {
            "rank": plan.rank,
            "epochs": self.epochs,
            "complete": False,
            "error": None,
        }
        self.ckpt = Checkpointer(plan)
        self.loader: Any = None
        self.global_step = 0
        self.sleeper = _Sleeper()
        # host CPU a step could not spend inside its modelled wall time (the cores were busy), spent
        # by later steps that have time left; at most one mean step's CPU is carried, so a host
        # that is slower than the job's does not pile it up
        self.cpu_debt, self.cpu_debt_max = 0.0, float(m.train.computation_host_cpu.mean or 0.0)
        self.eval_steps = evaluation_steps(m, plan.size)
        self.per_epoch_au = m.train.au_first_steps == "epoch"
        self.host = HostCpu(m.train.computation_host_threads) if spends_host_cpu(m) else None
        self.own_events = True

    def start(self) -> None:
        """What a training script does before its first epoch."""
        # What a training script imports before its first epoch (torch, the format's library) is
        # imported here, not inside the first epoch; forked workers inherit it.
        if self.plan.loader == "torch":
            from . import torchloader  # noqa: F401
        if self.plan.spec.io == "library":
            from .formats import prime_library

            prime_library(self.plan.spec.fmt)
        # The DataLoader's events come from the capture hooks in a traced torch replay; else from here
        # (the same names and args a captured job has, so a replay trace is analysed like the real one).
        self.own_events = not _loader_events_from_hooks(self.plan)
        # the interpreter's objects so far (torch, numpy, the formats' libraries: ~10^5) are left
        # out of the garbage collector's scans: a full scan of them takes far longer than a young
        # one, loop overhead a training step of the job did not have in its measured time (collected
        # first, so no garbage is frozen; unfrozen at the rank's end)
        gc.collect()
        gc.freeze()

    def epoch(self, epoch: int) -> bool:
        """Run *epoch* (1-based): its steps, then its end; False when there is nothing left to run."""
        INTERRUPT.check()
        batches = epoch_batches(self.plan, epoch)
        total_cap = self.model.train.total_training_steps
        if total_cap is not None:
            batches = batches[: max(0, total_cap - self.global_step)]
        if not batches:
            return False
        rec = _new_record(epoch)
        self.epochs.append(rec)
        ids: list[int] = []
        pids: set[int] = set()
        t_start = self._steps(epoch, batches, rec, ids, pids)
        self._epoch_end(epoch, rec)
        rec["epoch_time_s"] = time.perf_counter() - t_start
        rec["worker_pids"] = sorted(pids)
        if self.plan.record_order:
            self.order[str(epoch)] = ids
        return True

    def _steps(
        self,
        epoch: int,
        batches: list[list[tuple[int, int]]],
        rec: dict[str, Any],
        ids: list[int],
        pids: set[int],
    ) -> float:
        """The epoch's steps (fetch a batch, its compute, a checkpoint when due, sync); returns the
        epoch's start time."""
        own_events, sleeper, record_order = self.own_events, self.sleeper, self.plan.record_order
        per_epoch_au = self.per_epoch_au
        modelled_steps, cpu_steps = epoch_compute(
            self.model, self.compute_rng, len(batches), epoch, self.global_step
        )
        t_start = t_prev = time.perf_counter()
        if self.loader is None or getattr(
            self.loader, "closed", False
        ):  # worker start-up is part of the epoch
            self.loader = make_loader(self.plan)
        ev_epoch = REGIONS.begin("epoch", "pipeline", epoch=epoch - 1) if own_events else None
        batch_iter = iter(self.loader.epoch(batches))
        step = -1
        while True:
            step += 1
            ev_fetch = (
                REGIONS.begin("fetch", "dataloader", epoch=epoch - 1, step=step)
                if own_events
                else None
            )
            try:
                res = next(batch_iter)
            except StopIteration:
                REGIONS.end(ev_fetch, batch_size=0, last=1)
                break
            REGIONS.end(ev_fetch, batch_size=len(res.samples))
            ev_step = (
                REGIONS.begin("step", "compute", epoch=epoch - 1, step=step) if own_events else None
            )
            clocks = (time.process_time_ns(), time.thread_time_ns()) if ev_step else (0, 0)
            INTERRUPT.check()  # a Ctrl-C whose KeyboardInterrupt was swallowed still stops here
            t_got = time.perf_counter()
            # the step starts when the loader had the batch (what the loader does after that,
            # and the interpreter's garbage collections, are the replay's loop overhead)
            t_recv = min(res.received, t_got) if res.received is not None else t_got
            sleeper.debt += t_got - t_recv  # taken out of this step's sleep
            modelled = float(modelled_steps[step])
            compute, ck = self._compute(epoch, step, modelled, cpu_steps, rec)
            self.sync()
            if ev_step:  # the training process's CPU in the step, as the capture hooks measure it
                cpu_ns, own_ns = (
                    time.process_time_ns() - clocks[0],
                    time.thread_time_ns() - clocks[1],
                )
                REGIONS.end(
                    ev_step,
                    cpu_time=cpu_ns // 1000,
                    cpu_threads=max(1, round(cpu_ns / own_ns)) if own_ns > 0 else 1,
                )
            rec["steps"] += 1
            rec["samples"] += len(res.samples)
            rec["bytes_read"] += res.nbytes
            rec["checkpoint_s"] += ck
            pids.add(res.worker_pid)
            if record_order:
                ids.extend(res.samples)
            n_samples, n_bytes = len(res.samples), res.nbytes
            del res  # the batch is let go here, inside the step, as a training loop's is
            t_end = time.perf_counter()
            # The model's compute time is the job's whole loop body, its own overhead included;
            # the replay's (letting go of the batch, bookkeeping) is taken out of the next sleeps
            over = max((t_end - t_got) - compute - ck, 0.0)
            sleeper.debt += over
            compute += over + (t_got - t_recv)
            # DLIO leaves the run's first step out of AU and throughput (its own runs: every epoch's)
            if (step > 0) if per_epoch_au else (self.global_step > 1):
                rec["compute_s"] += compute
                rec["modelled_compute_s"] += modelled
                rec["io_wait_s"] += t_recv - t_prev
                rec["window_s"] += t_end - t_prev
                rec["samples_in_window"] += n_samples
                rec["bytes_in_window"] += n_bytes
            t_prev = t_end
            rec["epoch_time_s"] = t_end - t_start  # so far (an interrupted epoch keeps it)
        REGIONS.end(ev_epoch, steps=rec["steps"])
        return t_start

    def _compute(
        self, epoch: int, step: int, modelled: float, cpu_steps: np.ndarray, rec: dict[str, Any]
    ) -> tuple[float, float]:
        """The step's compute (host CPU, then a sleep for the rest of its modelled time) and the
        checkpoint due after it; returns (compute seconds, checkpoint seconds)."""
        m = self.model
        warm = self.global_step < len(m.train.warmup_computation_time) or (
            epoch > 1 and step < len(m.train.epoch_warmup_computation_time)
        )
        ev_warm = REGIONS.begin("warmup", "compute", epoch=epoch - 1, step=step) if warm else None
        if self.host is not None:
            compute = self._host_step(self.host, modelled, float(cpu_steps[step]), rec)
        else:
            compute = self.sleeper.sleep(modelled)
        REGIONS.end(ev_warm)
        self.global_step += 1
        ck0 = time.perf_counter()
        if self.ckpt.due_step(self.global_step):
            rec["checkpoint_bytes"] += self.ckpt.save()
        return compute, time.perf_counter() - ck0

    def _host_step(self, host: HostCpu, modelled: float, cpu: float, rec: dict[str, Any]) -> float:
        """The step's host CPU first (it competes with the loader's workers as the job's did), then a
        sleep for the rest of its compute time; returns the seconds the step took."""
        b0 = time.perf_counter()
        want = cpu + self.cpu_debt
        # the CPU work ends where the step's time ends, less what earlier steps overran
        # (sleeper.debt): a step whose CPU fills its time has no sleep to repay that from
        spent_cpu = host.spend(want, deadline=b0 + max(0.0, modelled - self.sleeper.debt))
        unspent = max(want - spent_cpu, 0.0)
        self.cpu_debt = min(unspent, self.cpu_debt_max)
        rec["host_cpu_s"] += spent_cpu
        rec["host_cpu_dropped_s"] += unspent - self.cpu_debt  # beyond the one step's carried on
        rec["modelled_host_cpu_s"] += cpu
        return self.sleeper.sleep(modelled, spent=time.perf_counter() - b0)

    def _epoch_end(self, epoch: int, rec: dict[str, Any]) -> None:
        """The epoch's end, after the loop over the loader, as in a training script: an epoch
        checkpoint, an evaluation, the model's epoch-end time, each when due."""
        if self.ckpt.due_epoch(epoch):
            ck0 = time.perf_counter()
            rec["checkpoint_bytes"] += self.ckpt.save()
            rec["checkpoint_s"] += time.perf_counter() - ck0
            self.sync()
        ev = self.model.train.evaluation
        if (
            ev is not None
            and self.eval_steps
            and epoch >= ev.after_epoch
            and (epoch - ev.after_epoch) % ev.every_n_epochs == 0
        ):
            e0 = time.perf_counter()
            ev_eval = REGIONS.begin("evaluate", "pipeline", epoch=epoch - 1, steps=self.eval_steps)
            for t in ev.computation_time.sample(self.compute_rng, self.eval_steps):
                INTERRUPT.check()
                self.sleeper.sleep(max(0.0, float(t)))
            REGIONS.end(ev_eval)
            self.sync()
            rec["evaluation_s"] += time.perf_counter() - e0
        end_time = self.model.train.epoch_end_time
        if end_time.is_known and (end_time.mean or 0) > 0:
            e0 = time.perf_counter()
            ev_end = REGIONS.begin("epoch_end", "pipeline", epoch=epoch - 1)
            self.sleeper.sleep(max(0.0, float(end_time.sample(self.edge_rng, 1)[0])))
            REGIONS.end(ev_end)
            rec["epoch_end_s"] += time.perf_counter() - e0

    def end(self) -> None:
        """After the last epoch: host CPU still carried was never spent."""
        if self.epochs and self.cpu_debt:  # carried past the last step: never spent
            self.epochs[-1]["host_cpu_dropped_s"] += self.cpu_debt
        INTERRUPT.check()

    def close(self, keep_checkpoints: bool | str) -> None:
        """Release the loader, the host CPU threads and (unless kept) the checkpoint files."""
        gc.unfreeze()
        if self.loader is not None:
            self.loader.close()
        if self.host is not None:
            self.host.close()
        ok = self.result.get("error") is None
        if not (keep_checkpoints is True or (keep_checkpoints == KEEP_ON_SUCCESS and ok)):
            self.ckpt.cleanup()


def _run_rank(
    plan: RankPlan, sync: Callable[[], None], keep_checkpoints: bool | str
) -> dict[str, Any]:
    run = _RankRun(plan, sync)
    result = run.result
    try:
        run.start()
        for epoch in range(1, plan.model.train.epochs + 1):
            if not run.epoch(epoch):
                break
        run.end()
        result["complete"] = True
    except KeyboardInterrupt:
        result["error"] = None
    except threading.BrokenBarrierError:
        result["error"] = "another accelerator stopped (barrier broken)"
    except ReplayError as exc:
        result["error"] = str(exc)
    finally:
        run.close(keep_checkpoints)
    result["order"] = run.order if plan.record_order else None
    return result


def _rank_process(plan: RankPlan, barrier: Any, results: Any, keep_checkpoints: bool | str) -> None:
    def sync() -> None:
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
    if config.trace and not config.traced:
        return _run_traced(config, out, say)
    check_out(out, allow_existing=config.traced)
    manifest, warnings = ensure_dataset(config, say)
    spec = worker_spec(config, manifest)
    size = config.accelerators
    steps_per_epoch(config.model, size)  # validate early
    ckdir = str((out / "checkpoints").resolve())
    loader, why = choose_loader(config)
    import_loader(loader)
    plans = [
        RankPlan(config.model, spec, r, size, config.seed, ckdir, config.record_order, loader)
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
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_rank_process, args=(p, barrier, results, keep), name=f"dlreplay-rank-{p.rank}"
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
        spec,
        rank,
        size,
        config.seed,
        str((out / "checkpoints").resolve()),
        config.record_order,
        loader,
    )
    comm.Barrier()
    started, t0 = now_utc(), time.perf_counter()
    res = run_rank(plan, comm.Barrier, config.keep_checkpoints)
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
    model_path = out / "model.yaml"
    save_model(config.model, model_path)
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
    # the replay's checkpoint files are deleted here, after the trace: not the workload's I/O
    cmd.append("--keep-checkpoints" if config.keep_checkpoints else "--_checkpoints-after-trace")
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
        if n > config.model.dataset.num_files:
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
