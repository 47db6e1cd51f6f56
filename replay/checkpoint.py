"""Checkpoints as the workload model says: when (steps, time or epochs between them), how
many files and bytes, in which write calls, and the serialisation time before the writes.
Rank r of N writes the files j with j % N == r of each checkpoint."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import numpy as np

from dlreplay.capture import REGIONS

from .common import ReplayError
from .plan import RankPlan

#: Bytes per checkpoint write call when the model does not know it.
DEFAULT_WRITE_TRANSFER = 4 << 20


class Checkpointer:
    """Writes checkpoints as the model says; this rank writes files j with j % N == rank."""

    def __init__(self, plan: RankPlan) -> None:
        self.plan = plan
        self.c = plan.model.checkpoint
        self.count = 0
        self.last_path: str | None = (
            None  # the latest checkpoint's file when it has one (for its trace event)
        )
        self.last_time = time.monotonic()
        self.created: list[Path] = []
        self.rng = np.random.default_rng([plan.seed, plan.rank, 0xC4])
        wts = self.c.write_transfer_size
        self.transfer = wts if wts.is_known else None
        self.file_plan = self.c.file_write_plan()  # each file's write calls as the job made them
        # the bytes to write are made now, not inside the first save (24 MiB of random bytes take
        # tens of milliseconds: time the job's saves did not spend)
        self._buf = b""
        if self._enabled():
            largest = (
                max((max(calls, default=0) for calls in self.file_plan), default=0)
                if self.file_plan
                else int(
                    min(
                        self.c.bytes_per_checkpoint,
                        (self.transfer.max or 0) if self.transfer else DEFAULT_WRITE_TRANSFER,
                    )
                )
            )
            self._buf = self.rng.bytes(max(largest, 0))

    def _enabled(self) -> bool:
        c = self.c
        st = c.serialization_time
        if not c.enabled or (
            c.bytes_per_checkpoint <= 0 and not (st.is_known and (st.mean or 0) > 0)
        ):
            return False
        return c.num_checkpoints_write is None or self.count < c.num_checkpoints_write

    @property
    def by_epoch(self) -> bool:
        """Checkpoints at epoch ends (neither steps nor time between them given)."""
        return not (self.c.steps_between_checkpoints or self.c.time_between_checkpoints)

    def due_step(self, global_step: int) -> bool:
        """A step- or time-based checkpoint is due after this step."""
        c = self.c
        if not self._enabled() or self.by_epoch:
            return False
        if c.steps_between_checkpoints:
            return global_step % c.steps_between_checkpoints == 0
        return time.monotonic() - self.last_time >= (c.time_between_checkpoints or 0.0)

    def due_epoch(self, epoch: int) -> bool:
        """An epoch-based checkpoint is due after *epoch* (1-based): after its last batch, as a
        training script saves after its loop over the DataLoader."""
        c = self.c
        if not self._enabled() or not self.by_epoch:
            return False
        every = c.epochs_between_checkpoints or 1
        return epoch >= c.checkpoint_after_epoch and (epoch - c.checkpoint_after_epoch) % every == 0

    def save(self) -> int:
        """One checkpoint as a ``checkpoint/save`` event: the model's serialisation time, then the
        writes; returns bytes written."""
        ev = REGIONS.begin("save", "checkpoint")
        nbytes = 0
        try:
            st = self.c.serialization_time
            seconds = (
                float(st.sample(self.rng, 1)[0]) if st.is_known and (st.mean or 0) > 0 else 0.0
            )
            if seconds > 0:
                time.sleep(seconds)
            # no bytes: a save whose size the trace does not know (its time is the serialisation)
            nbytes = self.write() if self.c.bytes_per_checkpoint > 0 else 0
        finally:
            REGIONS.end(ev, path=self.last_path, bytes=nbytes)
        return nbytes

    def write(self) -> int:
        """Write this rank's files of one checkpoint; returns bytes written."""
        c, p = self.c, self.plan
        self.count += 1
        self.last_time = time.monotonic()
        folder = Path(p.checkpoint_dir) / f"checkpoint-{self.count:04d}"
        nfiles = c.files_per_checkpoint
        mine = range(p.rank, nfiles, p.size)
        # the save event names its file only when there is one: with several, each file's bytes
        # are its writes (a path would credit the save's bytes to one of them)
        self.last_path = None
        total = 0
        for j in mine:
            calls = self.file_plan[j] if self.file_plan is not None else None
            nbytes = (
                sum(calls)
                if calls is not None
                else c.bytes_per_checkpoint // nfiles
                + (c.bytes_per_checkpoint % nfiles if j == nfiles - 1 else 0)
            )
            path = folder / f"part-{j:04d}-of-{nfiles}.bin"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                self.created.append(path)
                if len(mine) == 1:
                    self.last_path = str(path.resolve())
                try:
                    left = nbytes
                    planned = iter(calls or ())
                    while left > 0:
                        if calls is not None:
                            ts = next(planned, left)
                        else:
                            ts = (
                                int(self.transfer.sample(self.rng, 1)[0])
                                if self.transfer
                                else DEFAULT_WRITE_TRANSFER
                            )
                        ts = max(1, min(ts, left))
                        if len(self._buf) < ts:
                            self._buf = self.rng.bytes(ts)
                        n = os.write(fd, memoryview(self._buf)[:ts])
                        left -= n
                        total += n
                    if c.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                hint = "; free space or choose another --out" if exc.errno == errno.ENOSPC else ""
                raise ReplayError(
                    f"{exc.filename or path}: cannot write checkpoint ({exc.strerror or exc}){hint}"
                ) from None
        return total

    def cleanup(self) -> None:
        """Delete the checkpoint files this run created (and their folders if empty)."""
        for path in self.created:
            try:
                path.unlink()
                path.parent.rmdir()
            except OSError:
                pass
