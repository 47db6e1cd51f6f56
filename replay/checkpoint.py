"""Checkpoints as the workload model says: when (steps, time or epochs between them), how
many files and bytes, in which write calls, the serialisation time before the writes, and
the restore.

Each file of a checkpoint belongs to one rank of the job that wrote it: ``file_ranks`` (a
sharded checkpoint: DCP's ``__<rank>_<n>.distcp`` and rank 0's ``.metadata``, or each rank's
``torch.save``), else file j to rank ``j % R`` (R: the job's ``processes.ranks``). Replay rank
r writes the files of rank r, so each rank's shard keeps its size at any replay size: fewer
replay ranks than R write fewer shards (scaled; :func:`scaling` says how, and what the
full-size run writes), more write nothing more. A restore (``read_at_start``) reads the
latest checkpoint before training: :func:`prepare_restore` writes it before the replay (and
its trace) starts, and each rank reads ``read_bytes_per_rank`` of it (its own files first),
in calls of ``read_transfer_size``. A checkpoint-only workload (DLIO's ``workflow.train``
false: the MLPerf Storage checkpointing workloads) is :func:`run_checkpoint_workload`:
``num_checkpoints_write`` checkpoints written (fsync'd, then dropped from the page cache), then
``num_checkpoints_read`` read back."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.capture import REGIONS
from dlreplay.model import Checkpoint, WorkloadModel
from dlreplay.units import human_bytes

from .common import ReplayError
from .plan import RankPlan

#: Bytes per checkpoint write call when the model does not know it.
DEFAULT_WRITE_TRANSFER = 4 << 20


def checkpoint_ranks(model: WorkloadModel) -> int:
    """The ranks whose files make one checkpoint: ``file_ranks``' or the job's."""
    return model.checkpoint.shard_ranks or model.processes.ranks


def file_owners(model: WorkloadModel) -> list[int]:
    """The job's rank that writes each file of a checkpoint."""
    c = model.checkpoint
    if c.file_ranks is not None and len(c.file_ranks) == c.files_per_checkpoint:
        return list(c.file_ranks)
    ranks = checkpoint_ranks(model)
    return [j % ranks for j in range(c.files_per_checkpoint)]


def file_names(model: WorkloadModel) -> list[str]:
    """Each file's name in a checkpoint folder: DCP's (rank r's n-th shard ``__<r>_<n>.distcp``;
    rank 0's last file its ``.metadata``), else ``part-<j>-of-<n>.bin``."""
    c, owners = model.checkpoint, file_owners(model)
    if c.layout != "dcp":
        return [f"part-{j:04d}-of-{c.files_per_checkpoint}.bin" for j in range(len(owners))]
    names, seen = [], dict.fromkeys(owners, 0)
    last0 = max((j for j, r in enumerate(owners) if r == 0), default=-1)
    for j, r in enumerate(owners):
        names.append(".metadata" if j == last0 else f"__{r}_{seen[r]}.distcp")
        seen[r] += 1
    return names


def file_bytes(c: Checkpoint) -> list[list[int] | None]:
    """Each file's write calls (from ``file_writes``), or None each (even shares of the bytes)."""
    plan = c.file_write_plan()
    return list(plan) if plan is not None else [None] * c.files_per_checkpoint


def _file_size(c: Checkpoint, j: int, calls: list[int] | None) -> int:
    if calls is not None:
        return sum(calls)
    n = c.files_per_checkpoint
    return c.bytes_per_checkpoint // n + (c.bytes_per_checkpoint % n if j == n - 1 else 0)


def scaling(model: WorkloadModel, size: int) -> str | None:
    """How a replay of *size* ranks scales the model's checkpoints (None when it does not)."""
    c = model.checkpoint
    ranks = checkpoint_ranks(model)
    if not c.enabled or c.bytes_per_checkpoint <= 0 or size >= ranks:
        return None
    owners, plan = file_owners(model), file_bytes(c)
    sizes = [_file_size(c, j, calls) for j, calls in enumerate(plan)]
    mine = sum(s for s, r in zip(sizes, owners, strict=True) if r < size)
    return (
        f"checkpoints scaled from {ranks} to {size} rank(s), each rank's shard kept: "
        f"{size} rank(s) write {human_bytes(mine)} per checkpoint "
        f"({sum(1 for r in owners if r < size)} of {len(owners)} files); the full-size run "
        f"writes {human_bytes(c.bytes_per_checkpoint)} per checkpoint in "
        f"{c.files_per_checkpoint} files from {ranks} ranks"
        + (
            f", {human_bytes(c.bytes_per_checkpoint * c.num_checkpoints_write)} in its "
            f"{c.num_checkpoints_write} checkpoints"
            if c.num_checkpoints_write
            else ""
        )
    )


def restore_reads(model: WorkloadModel, rank: int) -> list[tuple[int, int]]:
    """(file j, bytes) that *rank* reads at a restore: ``read_bytes_per_rank`` of the
    checkpoint, its own files first, then the others in order (its own files whole when the
    model does not say)."""
    c = model.checkpoint
    owners, plan = file_owners(model), file_bytes(c)
    sizes = [_file_size(c, j, calls) for j, calls in enumerate(plan)]
    order = [j for j, r in enumerate(owners) if r == rank]
    order += [j for j, r in enumerate(owners) if r != rank]
    want = c.read_bytes_per_rank
    if want is None:
        return [(j, sizes[j]) for j in order if owners[j] == rank]
    out = []
    for j in order:
        if want <= 0:
            break
        take = min(sizes[j], want)
        out.append((j, take))
        want -= take
    return out


def restore_dir(checkpoint_dir: str) -> Path:
    return Path(checkpoint_dir) / "restore"


def prepare_restore(model: WorkloadModel, checkpoint_dir: str, size: int, seed: int) -> int:
    """Write the checkpoint a replay of *size* ranks restores at start (``read_at_start``):
    the files its ranks read, before the replay and its trace start. Returns bytes written."""
    c = model.checkpoint
    if not (c.enabled and c.read_at_start and c.bytes_per_checkpoint > 0):
        return 0
    names, rng = file_names(model), np.random.default_rng([seed, 0xC5])
    need: dict[int, int] = {}
    for rank in range(size):
        for j, nbytes in restore_reads(model, rank):
            need[j] = max(need.get(j, 0), nbytes)
    folder = restore_dir(checkpoint_dir)
    total = 0
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for j, nbytes in sorted(need.items()):
            with open(folder / names[j], "wb") as fh:
                left = nbytes
                while left > 0:
                    chunk = rng.bytes(min(left, 4 << 20))
                    fh.write(chunk)
                    left -= len(chunk)
            total += nbytes
    except OSError as exc:
        raise ReplayError(
            f"{exc.filename or folder}: cannot write the checkpoint to restore "
            f"({exc.strerror or exc})"
        ) from None
    return total


def _met(meet: Callable[[], Any]) -> float:
    """Meet the other ranks; returns this meeting's own latency (seconds from the last rank's
    arrival, which local ranks' meetings return, to this rank's leaving; 0 where unknown)."""
    t0 = time.perf_counter()
    last = meet()
    return max(0.0, time.perf_counter() - max(last, t0)) if isinstance(last, float) else 0.0


class Checkpointer:
    """Writes checkpoints as the model says (this rank: its job rank's files, see the module),
    and restores the latest at start when the model says so."""

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
        self.owners = file_owners(plan.model)
        self.names = file_names(plan.model)
        self.restored = 0
        self.drop_cache = False  # a checkpoint-only workload reads back from storage
        # the accelerators' meeting (set by the rank's run): a DCP save's ranks meet inside it
        self.meet: Callable[[], Any] | None = None
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
        if self.c.enabled and self.c.read_at_start and self.c.bytes_per_checkpoint > 0:
            self.restored = self.restore()

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
        writes; returns bytes written. A DCP checkpoint of several ranks is saved as DCP does:
        the ranks meet first (their plans gathered), each writes its shards, they meet again
        (the write results gathered on rank 0), rank 0 writes the ``.metadata``, and they meet
        once more (its result broadcast): a rank waits for the others inside the save, as the
        job's did. The meetings' own latency after the last rank arrived (waking processes
        on a busy host: milliseconds) is the replay's, not the job's (the job's collectives'
        own time is in its serialisation time): such a save spends its serialisation last,
        less those latencies, as the step loop takes its barrier's latency out of the next
        sleeps."""
        ev = REGIONS.begin("save", "checkpoint")
        nbytes = 0
        # every rank saves at the same step (a time-based save is each rank's own decision)
        collective = self.c.layout == "dcp" and self.plan.size > 1
        meet = self.meet if collective and not self.c.time_between_checkpoints else None
        try:
            st = self.c.serialization_time
            seconds = (
                float(st.sample(self.rng, 1)[0]) if st.is_known and (st.mean or 0) > 0 else 0.0
            )
            if meet is None:
                if seconds > 0:
                    time.sleep(seconds)
                # no bytes: a save whose size the trace does not know (its time is the serialisation)
                if self.c.bytes_per_checkpoint > 0:
                    nbytes = self.write()
            else:
                latency = _met(meet)
                if self.c.bytes_per_checkpoint > 0:
                    nbytes = self.write(shards_only=True)
                latency += _met(meet)
                if self.c.bytes_per_checkpoint > 0:
                    nbytes += self.write(metadata_only=True)
                latency += _met(meet)
                if seconds - latency > 0:
                    time.sleep(seconds - latency)
        finally:
            REGIONS.end(ev, path=self.last_path, bytes=nbytes)
        return nbytes

    def _mine(self, apart: bool, metadata: bool) -> list[int]:
        """This rank's files of a checkpoint (with *apart*: only DCP's ``.metadata`` when
        *metadata*, else all but it)."""
        mine = [j for j, r in enumerate(self.owners) if r == self.plan.rank]
        return [j for j in mine if (self.names[j] == ".metadata") is metadata] if apart else mine

    def write(self, shards_only: bool = False, metadata_only: bool = False) -> int:
        """Write this rank's files of one checkpoint (only its shards, or only DCP's
        ``.metadata``, when the save writes them apart); returns bytes written."""
        c, p = self.c, self.plan
        if not metadata_only:
            self.count += 1
            self.last_time = time.monotonic()
            # the save event names its file only when there is one: with several, each file's
            # bytes are its writes (a path would credit the save's bytes to one of them)
            self.last_path = None
        folder = Path(p.checkpoint_dir) / f"checkpoint-{self.count:04d}"
        nfiles = c.files_per_checkpoint
        mine = self._mine(shards_only or metadata_only, metadata_only)
        total = 0
        for j in mine:
            calls = self.file_plan[j] if self.file_plan is not None else None
            nbytes = (
                sum(calls)
                if calls is not None
                else c.bytes_per_checkpoint // nfiles
                + (c.bytes_per_checkpoint % nfiles if j == nfiles - 1 else 0)
            )
            path = folder / self.names[j]
            # DCP writes its .metadata as .metadata.tmp, renamed when complete
            temp = path.with_name(path.name + ".tmp") if path.name == ".metadata" else path
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                self.created.append(path)
                if c.layout == "dcp":  # DCP's event names its checkpoint directory
                    self.last_path = str(folder.resolve())
                elif len(mine) == 1:
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
                        if self.drop_cache and hasattr(os, "posix_fadvise"):
                            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                if temp != path:
                    os.replace(temp, path)
            except OSError as exc:
                hint = "; free space or choose another --out" if exc.errno == errno.ENOSPC else ""
                raise ReplayError(
                    f"{exc.filename or path}: cannot write checkpoint ({exc.strerror or exc}){hint}"
                ) from None
        return total

    def cleanup(self) -> None:
        """Delete the checkpoint files this run created (and their folders if empty); rank 0 the
        checkpoint it restored."""
        for path in self.created:
            try:
                path.unlink()
                path.parent.rmdir()
            except OSError:
                pass
        if self.plan.rank == 0 and self.restored:
            folder = restore_dir(self.plan.checkpoint_dir)
            for name in set(self.names):
                (folder / name).unlink(missing_ok=True)
            try:
                folder.rmdir()
            except OSError:
                pass

    def restore(self, folder: Path | None = None) -> int:
        """Read this rank's share of a checkpoint (the one to restore at start, else *folder*)
        as a ``checkpoint/restart`` event; returns bytes read."""
        folder = folder or restore_dir(self.plan.checkpoint_dir)
        rts = self.c.read_transfer_size
        ev = REGIONS.begin("restart", "checkpoint")
        total = 0
        reads = restore_reads(self.plan.model, self.plan.rank)
        # named as the job's load names it: DCP its directory, torch.load its one file
        named = (
            folder
            if self.c.layout == "dcp" or len(reads) != 1
            else folder / self.names[reads[0][0]]
        )
        try:
            for j, nbytes in reads:
                total += self._read(folder / self.names[j], nbytes, rts)
        finally:
            REGIONS.end(ev, path=str(named.resolve()), bytes=total)
        return total

    def _read(self, path: Path, nbytes: int, rts: Any) -> int:
        got = 0
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise ReplayError(
                f"{path}: cannot read the checkpoint ({exc.strerror or exc})"
            ) from None
        try:
            while got < nbytes:
                ts = int(rts.sample(self.rng, 1)[0]) if rts.is_known else DEFAULT_WRITE_TRANSFER
                n = len(os.read(fd, max(1, min(ts, nbytes - got))))
                if n == 0:
                    break
                got += n
        finally:
            os.close(fd)
        return got


def run_checkpoint_workload(plan: RankPlan, sync: Callable[[], None]) -> dict[str, Any]:
    """A checkpoint-only workload (no training: DLIO's ``workflow.train`` false, the MLPerf
    Storage checkpointing workloads): ``num_checkpoints_write`` checkpoints of this rank's
    shards (fsync'd as the model says, then dropped from the page cache, so the reads come from
    storage), then ``num_checkpoints_read`` read back, newest first (again from the newest when more reads than writes), each rank its own. Returns
    one record like an epoch's (``checkpoint_s``, ``checkpoint_bytes``; ``checkpoint_write_s``,
    ``checkpoint_read_s``, ``checkpoint_read_bytes``)."""
    from dataclasses import replace

    c = plan.model.checkpoint
    # the reads are of what this run wrote: no restore at start
    ck = Checkpointer(
        replace(plan, model=replace(plan.model, checkpoint=replace(c, read_at_start=False)))
    )
    ck.drop_cache = c.fsync
    ck.meet = sync
    writes = c.num_checkpoints_write or 1
    t0 = time.perf_counter()
    written = 0
    for _ in range(writes):
        written += ck.save()
        sync()
    t_write = time.perf_counter() - t0
    folders = sorted({p.parent for p in ck.created}, reverse=True)
    t1 = time.perf_counter()
    read = 0
    for i in range(c.num_checkpoints_read or 0 if folders else 0):
        read += ck.restore(folders[i % len(folders)])
        sync()
    t_read = time.perf_counter() - t1
    return {
        "ck": ck,
        "record": {
            "checkpoint_s": t_write + t_read,
            "checkpoint_bytes": written,
            "checkpoint_write_s": t_write,
            "checkpoint_read_s": t_read,
            "checkpoint_read_bytes": read,
            "checkpoints_written": writes,
            "checkpoints_read": c.num_checkpoints_read or 0 if folders else 0,
        },
    }


def checkpoint_only(model: WorkloadModel) -> bool:
    """A checkpoint-only workload: no training (it reads no dataset), checkpoints on."""
    return not model.train.enabled and model.checkpoint.enabled


def _gb_per_s(nbytes: int, seconds: float) -> float | None:
    """Decimal GB/s (1e9 bytes per second), None without time."""
    return nbytes / seconds / 1e9 if seconds > 0 else None


def checkpoint_workload_doc(
    model: WorkloadModel, ranks: list[dict[str, Any]], size: int
) -> dict[str, Any] | None:
    """The metrics of a checkpoint-only workload (:func:`run_checkpoint_workload`) over its
    *ranks*' records: bytes and seconds written and read (the slowest rank's time: the ranks
    meet after each checkpoint), bandwidths in bytes/s and decimal GB/s, in total and per rank,
    the scaling and the full-size run's bytes; its ``summary``: the lines the replay prints
    instead of an AU verdict (there is no training to keep busy). None for a training
    workload."""
    c = model.checkpoint
    if not checkpoint_only(model):
        return None
    recs = [(r["rank"], r["epochs"][0]) for r in ranks if r.get("epochs")]
    if not recs:
        return None
    per_rank = [
        {
            "rank": rank,
            "bytes_written": int(r.get("checkpoint_bytes", 0)),
            "write_s": float(r.get("checkpoint_write_s", 0.0)),
            "bytes_read": int(r.get("checkpoint_read_bytes", 0)),
            "read_s": float(r.get("checkpoint_read_s", 0.0)),
        }
        for rank, r in recs
    ]
    for p in per_rank:
        p["write_gb_per_s"] = _gb_per_s(p["bytes_written"], p["write_s"])
        p["read_gb_per_s"] = _gb_per_s(p["bytes_read"], p["read_s"])
    written = sum(p["bytes_written"] for p in per_rank)
    read = sum(p["bytes_read"] for p in per_rank)
    w_s = max(p["write_s"] for p in per_rank)
    r_s = max(p["read_s"] for p in per_rank)
    writes = recs[0][1].get("checkpoints_written", 0)
    reads = recs[0][1].get("checkpoints_read", 0)
    note = scaling(model, size)
    doc: dict[str, Any] = {
        "ranks": size,
        "checkpoint_ranks": checkpoint_ranks(model),
        "checkpoints_written": writes,
        "checkpoints_read": reads,
        "bytes_written": written,
        "bytes_read": read,
        "write_s": w_s,
        "read_s": r_s,
        "write_bytes_per_s": written / w_s if w_s > 0 else None,
        "read_bytes_per_s": read / r_s if r_s > 0 else None,
        "write_gb_per_s": _gb_per_s(written, w_s),
        "read_gb_per_s": _gb_per_s(read, r_s),
        "per_rank": sorted(per_rank, key=lambda p: p["rank"]),
        "full_bytes_per_checkpoint": c.bytes_per_checkpoint,
        "fsync": c.fsync,
        "scaling": note,
    }
    doc["summary"] = _workload_lines(doc, size)
    return doc


def _workload_lines(doc: dict[str, Any], size: int) -> list[str]:
    """The replay's output for a checkpoint-only workload: a line per side (write, read) with
    checkpoints, bytes, the slowest rank's seconds and GB/s in total and per rank, then the
    per-rank table and the scaling note."""

    def gbs(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    fsync = " (fsync)" if doc["fsync"] else ""
    lines = [
        "checkpoint-only workload: no training, no AU; checkpoint throughput (GB = 1e9 bytes)",
        f"{'side':<6} {'ckpts':>5} {'bytes':>16} {'time s':>8} {'GB/s':>8} {'GB/s/rank':>10}",
    ]
    for side, n, key, sec in (
        ("write", doc["checkpoints_written"], "bytes_written", "write_s"),
        ("read", doc["checkpoints_read"], "bytes_read", "read_s"),
    ):
        mine = [p[f"{side}_gb_per_s"] for p in doc["per_rank"] if p[f"{side}_gb_per_s"]]
        per = sum(mine) / len(mine) if mine else None
        lines.append(
            f"{side:<6} {n:>5} {doc[key]:>16,} {doc[sec]:>8.2f} {gbs(doc[f'{side}_gb_per_s']):>8} "
            f"{gbs(per):>10}" + (fsync if side == "write" else "")
        )
    if size > 1:
        lines += [
            f"  rank {p['rank']}: write {human_bytes(p['bytes_written'])} in {p['write_s']:.2f} s "
            f"({gbs(p['write_gb_per_s'])} GB/s), read {human_bytes(p['bytes_read'])} in "
            f"{p['read_s']:.2f} s ({gbs(p['read_gb_per_s'])} GB/s)"
            for p in doc["per_rank"]
        ]
    lines.append(
        f"checkpoints: {doc['checkpoints_written']} written by {size} rank(s), "
        f"{human_bytes(doc['bytes_written'])} in {doc['write_s']:.2f} s "
        f"({human_bytes(doc['write_bytes_per_s'] or 0)}/s{', fsync' if doc['fsync'] else ''}); "
        f"{doc['checkpoints_read']} read back, {human_bytes(doc['bytes_read'])} in {doc['read_s']:.2f} s "
        f"({human_bytes(doc['read_bytes_per_s'] or 0)}/s)"
    )
    if doc["scaling"]:
        lines.append(doc["scaling"])
    return lines
