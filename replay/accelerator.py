"""One accelerator's run: epochs of (fetch a batch, the step's compute, a checkpoint when due,
sync), then each epoch's end (an epoch checkpoint, an evaluation, the model's epoch-end time).

:func:`run_rank` runs one accelerator's :class:`~.plan.RankPlan` in the calling process; the
replay's launcher (:mod:`.engine`) calls it in each local accelerator process, or once per
MPI rank. The batches come from :func:`make_loader`'s loader (PyTorch DataLoader semantics), a
step's compute is its host CPU (:mod:`.hostcpu`) and a sleep for the rest of its modelled time,
and the metrics of each epoch are gathered in one record (see :mod:`.metrics`).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dlreplay.capture import REGIONS
from dlreplay.interrupt import INTERRUPT

from .checkpoint import Checkpointer, run_checkpoint_workload
from .common import ReplayError, is_worker_failure, streams_shards, worker_failure
from .hostcpu import HostCpu
from .loader import Loader
from .plan import RankPlan, epoch_batches, epoch_compute, evaluation_steps, spends_host_cpu
from .prepare import KEEP_ON_SUCCESS
from .served import EpochProbe, cold_epoch, count_served

__all__ = ["make_loader", "run_rank"]


def run_rank(
    plan: RankPlan, sync: Callable[[], Any], keep_checkpoints: bool | str = False
) -> dict[str, Any]:
    """Run one accelerator: epochs of (fetch batch, sleep compute, checkpoint, sync), then each
    epoch's end (epoch checkpoint, evaluation, the model's epoch-end time).

    Returns ``{"rank", "epochs": [records], "complete", "error", "order"}``. Times in
    seconds, sizes in bytes. Ctrl-C ends the run early (``complete`` false), at the latest
    after the step in progress (see :mod:`.interrupt`).
    """
    with INTERRUPT.catching():
        if not plan.model.train.enabled and plan.model.checkpoint.enabled:
            return _checkpoint_rank(plan, sync, keep_checkpoints)
        return _run_rank(plan, sync, keep_checkpoints)


def _checkpoint_rank(
    plan: RankPlan, sync: Callable[[], Any], keep_checkpoints: bool | str
) -> dict[str, Any]:
    """A checkpoint-only workload (no training): replay/checkpoint.py's writes then reads."""
    done = run_checkpoint_workload(plan, sync)
    rec = {**_new_record(1), **done["record"]}
    rec["epoch_time_s"] = rec["checkpoint_s"]
    if keep_checkpoints is not True:
        done["ck"].cleanup()
    return {"rank": plan.rank, "epochs": [rec], "complete": True, "error": None, "order": None}


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
    if streams_shards(plan.model):  # an IterableDataset streaming whole shards
        from .streaming import StreamingLoader

        return StreamingLoader(plan)
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
    """A traced replay through PyTorch's DataLoader (the torch loader, or streamed shards,
    whose loader is always one): the capture hooks emit epoch/fetch/step for it. A streamed
    replay of a model whose loader is not PyTorch's (a POSIX-only trace's) wrote each epoch
    twice, its own and the hooks' (compare then counted 6 epochs of 3)."""
    if plan.loader != "torch" and not streams_shards(plan.model):
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


def _end_step_event(ev_step: int, clocks: tuple[int, int]) -> None:
    """End a step's event with the training process's CPU in the step since *clocks* (its
    process and thread CPU clocks at the step's start), as the capture hooks measure it."""
    cpu_ns, own_ns = (time.process_time_ns() - clocks[0], time.thread_time_ns() - clocks[1])
    REGIONS.end(
        ev_step,
        cpu_time=cpu_ns // 1000,
        cpu_threads=max(1, round(cpu_ns / own_ns)) if own_ns > 0 else 1,
    )


def _count_batch(
    rec: dict[str, Any], res: Any, ck: float, pids: set[int], order: list[int] | None
) -> tuple[int, int]:
    """Count a step's batch *res* (and the checkpoint seconds *ck* after it) in the epoch's
    record, its worker in *pids* and its samples in *order* (when the order is recorded);
    returns the batch's (samples, bytes)."""
    rec["steps"] += 1
    rec["samples"] += len(res.samples)
    rec["bytes_read"] += res.nbytes
    rec["checkpoint_s"] += ck
    count_served(rec, getattr(res, "served", None))
    pids.add(res.worker_pid)
    if order is not None:
        order.extend(res.samples)
    return len(res.samples), res.nbytes


class _RankRun:
    """One accelerator's run (see :func:`run_rank`): the state its epochs and steps share."""

    def __init__(self, plan: RankPlan, sync: Callable[[], Any]) -> None:
        m = plan.model
        self.plan, self.model, self.sync = plan, m, sync
        # one draw of a step's compute for every rank: data-parallel ranks run the same model on
        # batches of one size, so a step is long or short on all of them (the distilled compute is
        # the step's own, the last-arriving rank's); independent draws met at the per-step barrier
        # made every step the longest of N draws (3 ranks: +10 % a steady epoch)
        self.compute_rng = np.random.default_rng([plan.seed, 0xC0])
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
        self.ckpt.meet = sync  # a DCP save's ranks meet inside it
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
        if self.plan.loader == "torch" and self.model.reader.read_threads > 0:
            from .loader import start_worker_server

            start_worker_server(self.plan.spec, torch=True)
        # The DataLoader's events come from the capture hooks in a traced torch replay; else from here
        # (the same names and args a captured job has, so a replay trace is analysed like the real one).
        self.own_events = not _loader_events_from_hooks(self.plan)
        # the interpreter's objects so far (torch, numpy, the formats' libraries: ~10^5) are left
        # out of the garbage collector's scans: a full scan of them takes far longer than a young
        # one, loop overhead a training step of the job did not have in its measured time (collected
        # first, so no garbage is frozen; unfrozen at the rank's end)
        gc.collect()
        gc.freeze()
        self.read_side_files("start")
        self.scan_dataset()

    def scan_dataset(self) -> None:
        """The pass a Dataset that indexes its records makes as it is made: every dataset file
        read start to end in ``dataset.scan_read_size`` reads (local data only)."""
        size = self.model.dataset.scan_read_size
        if not size or self.plan.spec.s3 is not None:
            return
        spec = self.plan.spec
        for rel in spec.paths:
            fd = os.open(os.path.join(spec.data_dir, rel), os.O_RDONLY)
            try:
                while os.read(fd, size):
                    INTERRUPT.check()
            finally:
                os.close(fd)

    def read_side_files(self, when: str) -> None:
        """Read the dataset's side files of *when* (``start``, ``epoch``) as the job did: each
        visit opens the file and makes the recorded read calls (bytes; local data only)."""
        side = [s for s in self.model.dataset.side_files or [] if s.when == when]
        if not side or self.plan.spec.s3 is not None:
            return
        from dlreplay.osutil import confined_path

        for sf in side:
            path = confined_path(self.plan.spec.data_dir, sf.path, "the model's dataset.side_files")
            for _ in range(sf.visits):
                fd = os.open(path, os.O_RDONLY)
                try:
                    for nbytes, calls in sf.reads:
                        for _ in range(calls):
                            os.read(fd, nbytes)
                finally:
                    os.close(fd)

    def epoch(self, epoch: int) -> bool:
        """Run *epoch* (1-based): its steps, then its end; False when there is nothing left to run."""
        INTERRUPT.check()
        if streams_shards(self.model):
            from .streaming import streamed_batches

            batches = streamed_batches(self.plan, epoch)
        else:
            batches = epoch_batches(self.plan, epoch)
        total_cap = self.model.train.total_training_steps
        if total_cap is not None:
            batches = batches[: max(0, total_cap - self.global_step)]
        if not batches:
            return False
        self.read_side_files("epoch")
        rec = _new_record(epoch)
        self.epochs.append(rec)
        ids: list[int] = []
        pids: set[int] = set()
        cold = cold_epoch(self.plan.spec, self.plan.rank, self.sync)  # --cold: before the epoch
        probe = EpochProbe(
            self.plan.spec.data_dir, self.plan.rank == 0, objects=self.plan.spec.s3 is not None
        )
        if self.model.reader.mapped_access is not None:  # a loop without a DataLoader
            from .mapped import mapped_step_count, mapped_steps

            t_start = mapped_steps(
                self, epoch, rec, mapped_step_count(self.model, self.global_step)
            )
        else:
            t_start = self._steps(epoch, batches, rec, ids, pids)
        self._epoch_end(epoch, rec)
        rec["epoch_time_s"] = time.perf_counter() - t_start
        probe.finish(rec, cold)
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
        own_events, sleeper, per_epoch_au = self.own_events, self.sleeper, self.per_epoch_au
        order = ids if self.plan.record_order else None
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
            # the step starts when the loader had the batch (what it does after, and garbage
            # collections: loop overhead, out of this step's sleep; and :meth:`_loader_work`)
            t_recv = min(res.received, t_got) if res.received is not None else t_got
            sleeper.debt += t_got - t_recv + self._loader_work(step, t_prev, t_recv)
            modelled = float(modelled_steps[step])
            compute, ck = self._compute(epoch, step, modelled, cpu_steps, rec)
            t_sync = time.perf_counter()
            last = self.sync()  # local ranks: when the last one arrived (None: not known)
            # the wait for the other ranks (up to the last one's arrival) is no replay overhead
            waited = time.perf_counter() - t_sync if last is None else max(0.0, last - t_sync)
            if ev_step:
                _end_step_event(ev_step, clocks)
            n_samples, n_bytes = _count_batch(rec, res, ck, pids, order)
            del res  # the batch is let go here, inside the step, as a training loop's is
            t_end = time.perf_counter()
            # The model's compute time is the job's whole loop body, its own overhead included;
            # the replay's (letting go of the batch, bookkeeping) is taken out of the next sleeps.
            # The wait for the other ranks is not: the distilled compute is the step's own (the
            # last-arriving rank's), and a job's rank that waited at the all-reduce computes its
            # whole next step (taken out, a rank that waited once slept no more and waited again:
            # 2 of 3 ranks slept ~0 a step, the step ended at the one rank that still computed).
            # The barrier's own latency after the last arrival is the replay's, as DLIO's MPI
            # barrier's is its own: taken out of the next sleeps
            over = max((t_end - t_got) - compute - ck - waited, 0.0)
            sleeper.debt += over
            compute += over + waited + (t_got - t_recv)
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

    def _loader_work(self, step: int, t_prev: float, t_recv: float) -> float:
        """Seconds this process's loader worked around the batch just received outside its
        samples (``time.perf_counter()`` stamps: the previous step ended at *t_prev*, the loader
        had the batch at *t_recv*): from the previous step's end to its first sample's read (the
        loop, the fetch; not for an epoch's first batch, whose wait holds the loader's start),
        and from its last sample's end to the batch in hand (the collate). 0 unless the model's
        compute is the job's silence between its batches' reads (``train.timed_between_reads``),
        which holds the job's own loader work there: the replay's is then taken out of the
        step's compute instead of added to it. (The library's own time around a sample's reads
        is in the silence too, but not taken out: the thread's runnable time also holds the
        reads' copies, and subtracting it took the sweep's batch-1 runs from 10-30 % over to
        13-33 % under; docs/fidelity.md.)"""
        local = getattr(self.loader, "local_reader", None) if self.plan.spec.between_reads else None
        reader = local() if local is not None else None  # (streamed shards: no sample reader)
        if reader is None:
            return 0.0
        began, ended = reader.batch_marks()
        work = max(0.0, t_recv - ended) if ended is not None else 0.0
        if began is not None and step > 0:
            work += max(0.0, began - t_prev)
        return work

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
    plan: RankPlan, sync: Callable[[], Any], keep_checkpoints: bool | str
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
    except RuntimeError as exc:  # a worker died while this process was not waiting for it
        if not is_worker_failure(exc):
            raise
        failure = worker_failure(exc)
        result["error"] = None if isinstance(failure, KeyboardInterrupt) else str(failure)
    finally:
        run.close(keep_checkpoints)
    result["order"] = run.order if plan.record_order else None
    return result
