"""Replay through PyTorch's own ``torch.utils.data.DataLoader`` (the ``torch`` extra).

A training job's input pipeline costs more than its reads: worker processes start (and,
unless ``persistent_workers``, are joined) every epoch, each sample is decoded into a
tensor, ``collate`` stacks the batch into shared memory and the batch crosses from the
worker to the training process. The builtin loader (:mod:`.loader`) imitates the
scheduling; this module runs the real thing, so its behaviour on new storage is the
job's behaviour:

* :class:`ReplayDataset`: ``__getitem__(sample id)`` reads the sample through the
  format's library (:class:`~.loader.SampleReader`), spends the model's preprocess time
  and returns the decoded sample as a tensor (the array the library returns), or, when
  the model gives ``dataset.record_length_resize``, one tensor of that many bytes (the
  reader's resize: DLIO hands over its ``resized_image`` whatever it read);
* :class:`PlannedBatches`: a batch sampler yielding the epoch's planned batches (the
  seeded file and sample shuffles of :func:`~.plan.epoch_batches`, sharded by rank),
  so both loaders read the same samples in the same order;
* :class:`TorchLoader`: a ``DataLoader`` with the model's workers, prefetch factor,
  persistent workers and pin memory; :meth:`TorchLoader.epoch` yields
  :class:`~.loader.BatchResult`, like the builtin loader.

Importing this module imports torch; :mod:`.engine` imports it only when it is used.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info

from dlreplay.interrupt import INTERRUPT
from dlreplay.osutil import end_with_parent

from .common import ReplayError, worker_failure, worker_message
from .formats import joined
from .loader import BatchResult, SampleReader, WorkerSpec, runnable_seconds, worker_context


def _hooks_patched(obj: Any) -> bool:
    """True when dlreplay's capture hooks instrument *obj* (a traced replay): they emit the
    data-loader events themselves, so the replay must not emit them twice."""
    return bool(getattr(obj, "_dlreplay_patched", False))


def loader_events_from_hooks() -> bool:
    """Whether the capture hooks emit epoch/fetch/step events for ``DataLoader`` here."""
    return _hooks_patched(DataLoader)


class ReplayDataset(Dataset):  # type: ignore[type-arg]
    """Map-style dataset over the replay's files: sample id (file * spf + k) -> decoded sample.

    Returns ``(bytes read, reader pid, *tensors, *others)``: the counts first, so the capture
    hooks' batch-size probe (leading dimension of the first tensor) sees the batch size;
    ``tensors``: the sample's arrays as the library returned them (an NPZ file's members,
    an HDF5 file's rows: the job's Dataset returned them so; one flat array of them all
    where they are more than the job's batch had tensors); ``others``: scalars up to
    ``batch_tensors`` tensors in all (the job's labels, masks' handover), each collated into
    one more tensor of the batch.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._reader: SampleReader | None = None
        self._pid = -1
        self._resized: torch.Tensor | None = None
        self._others = tuple(
            torch.zeros((), dtype=torch.int64) for _ in range(spec.batch_tensors - 1)
        )

    def __getstate__(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "_reader": None,
            "_pid": -1,
            "_resized": None,
            "_others": self._others,
        }

    def __len__(self) -> int:
        return len(self.spec.paths) // self.spec.files_per_sample * self.spec.samples_per_file

    def reader(self) -> SampleReader:
        pid = os.getpid()
        if (
            self._pid != pid
        ):  # one reader per worker process (a forked worker's inherited one is not its own)
            info = get_worker_info()
            from torch.utils.data import _utils

            items_hooked = _hooks_patched(_utils.fetch._MapDatasetFetcher)
            self._reader = SampleReader(
                self.spec, info.id if info is not None else 0, item_events=not items_hooked
            )
            _SERVED[:] = [0, True]  # (a forked worker's copy of its parent's count is not its own)
            self._pid = pid
        assert self._reader is not None
        return self._reader

    def __getitem__(self, sample: int) -> tuple[Any, ...]:
        reader = self.reader()  # (its start in a new worker, opening files, is not the sample's)
        # the item's CPU and runnable time from here (the job's item held its Dataset's own
        # steps too): what this spends around the reader's read_sample comes out of the
        # sample's modelled CPU and preprocess time
        cpu0, busy0 = reader.clock(), runnable_seconds()
        f, k = divmod(int(sample), self.spec.samples_per_file)
        nbytes, decoded = reader.read_sample(f, k, cpu0, busy0)
        after, busy_after = reader.clock(), runnable_seconds()
        _count_served(reader.meter.take())  # the storage's reads for it, handed over by collate
        if self.spec.resize_bytes:
            # the reader resizes every sample to one array (DLIO returns its ``resized_image``)
            if self._resized is None or self._resized.numel() != self.spec.resize_bytes:
                self._resized = torch.zeros(self.spec.resize_bytes, dtype=torch.uint8)
            out = (nbytes, os.getpid(), self._resized, *self._others)
        else:
            arrays = decoded if isinstance(decoded, tuple) else (decoded,)
            if (
                len(arrays) > len(self._others) + 1
            ):  # more than the job's batch had tensors: one flat array
                arrays = (joined(decoded),)
            tensors = tuple(
                torch.from_numpy(np.require(a, requirements=["C", "W"])) for a in arrays
            )
            out = (nbytes, os.getpid(), *tensors, *self._others[len(arrays) - 1 :])
        reader.charge(reader.clock() - after, runnable_seconds() - busy_after)
        return out

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
            self._pid = -1


def collate(samples: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """``(bytes per sample, pid per sample, *tensors)``: each of the samples' tensors (their
    arrays, then the scalars of the job's other tensors: labels, masks) stacked into one
    tensor of the batch by ``default_collate`` (into shared memory in a worker, as for the
    job's batches) where it has one shape in every sample, else concatenated flat (images
    of varying sizes before a resize the model does not know): every tensor of a batch is
    one more worker -> main handover. The counts stay Python lists: pickled with the batch,
    they add no shared-memory tensor the job's batch does not have; the bytes list carries
    the bytes the storage served for the batch (``served``, see :mod:`.served`; None: not
    measured)."""
    nbytes = _Counts(int(s[0]) for s in samples)
    nbytes.served, _SERVED[:] = (_SERVED[0] if _SERVED[1] else None), [0, True]
    pids = [int(s[1]) for s in samples]
    stacked = []
    for j in range(2, len(samples[0]) if samples else 2):
        column = [s[j] for s in samples]
        same = len({(t.shape, t.dtype) for t in column}) == 1
        stacked.append(default_collate(column) if same else _concat_flat(column))
    return (nbytes, pids, *stacked)


class _Counts(list):  # type: ignore[type-arg]
    """A batch's bytes per sample, with the bytes the storage served for it (``served``)."""

    served: int | None = None


#: bytes the storage served for this process's samples since its last batch was collated, and
#: whether every one of them was measured
_SERVED: list[Any] = [0, True]


def _count_served(served: int | None) -> None:
    """Add a sample's served bytes (None: not measured) to this process's coming batch."""
    if served is None:
        _SERVED[1] = False
    else:
        _SERVED[0] += served


def _concat_flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Samples of different shapes as one flat tensor, in shared memory inside a worker as
    ``default_collate`` allocates a stacked batch: one transfer per batch, as the job's
    (resized) batch is, with the bytes of the decoded samples (as bytes where their types
    differ: a file without one of the arrays the others have)."""
    flat = [t.reshape(-1) for t in tensors]
    if len({t.dtype for t in flat}) > 1:
        flat = [t.contiguous().view(torch.uint8) for t in flat]
    numel = sum(t.numel() for t in flat)
    out = None
    if get_worker_info() is not None:
        storage = flat[0]._typed_storage()._new_shared(numel, device=flat[0].device)
        out = flat[0].new(storage).resize_(numel)
    return torch.cat(flat, out=out)


class PlannedBatches(Sampler):  # type: ignore[type-arg]
    """Batch sampler yielding the batches set for the coming epoch (lists of sample ids)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


@contextlib.contextmanager
def _quiet_worker_count() -> Iterator[None]:
    """Without PyTorch's "suggested max number of worker" warning: the model's worker count is
    the job's, on whatever machine replays it (the warning comes at construction and every iter)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*suggested max number of worker")
        yield


@contextlib.contextmanager
def _workers_start_deaf() -> Iterator[None]:
    """Start workers (``iter()``) with SIGINT blocked: a Ctrl-C meanwhile only sets the flag
    (checked at the next batch), and a worker cannot be hit before :func:`_worker_init` makes
    it ignore SIGINT (a KeyboardInterrupt in a worker's start-up kills it with a traceback).
    The training process stops its workers itself, as the builtin loader's."""
    with INTERRUPT.deferred():
        main = threading.current_thread() is threading.main_thread()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if main else None
        try:
            yield
        finally:
            if mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _worker_init(worker_id: int) -> None:
    """In each worker: ignore SIGINT (then unblock it, see :func:`_workers_start_deaf`), and stay
    quiet when the training process abandons a batch hand-over (its fd-sharing thread then sees
    the connection reset: a Ctrl-C, not an error). A fatal signal (SIGSEGV, SIGBUS...) prints
    the Python stack of every thread of the worker before PyTorch's own handler reports it:
    PyTorch alone says only "killed by signal", with "details lost due to multiprocessing"."""
    faulthandler.enable(all_threads=True)  # then the previous handler (PyTorch's) runs
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # ended with its accelerator process when that is killed: PyTorch's own watch takes
    # the parent pid at the worker's start, a reparented one if the accelerator ended first
    end_with_parent()
    _quiet_abandoned_handovers()


def _quiet_abandoned_handovers() -> None:
    """Drop connection errors of multiprocessing's fd-sharing thread (``resource_sharer._serve``,
    which reports through ``sys.excepthook``): a peer that went away mid hand-over (a Ctrl-C)
    is not an error of the replay. Everything else still reaches the previous hook."""
    previous = sys.excepthook
    if getattr(previous, "_dlreplay_quiet", False):
        return

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        if (
            issubclass(exc_type, (ConnectionError, EOFError))
            and "_serve" in threading.current_thread().name
        ):
            return
        previous(exc_type, exc, tb)

    hook._dlreplay_quiet = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def arrival_stamps(it: Any) -> list[float]:
    """A one-item list that holds, after each batch of the DataLoader iterator *it*, the
    ``time.perf_counter()`` at which torch had it (its ``_next_data`` returned; 0.0 where the
    iterator has none).

    The iterator's ``__next__`` reaches its caller later than that (from the capture hook's
    last statement to the caller's next one), most likely the training thread waiting for the
    GIL while the DataLoader's other threads run. A job's step, as the capture hooks measure
    it, starts before that delay and holds it, and the replay's loop body holds it again; so
    the replay counts the step from the batch's arrival and takes the delay out of its sleep
    instead of spending it twice (else loop bodies run longer than the model and AU comes out
    high). Traced by dlreplay's capture hooks, the step begins later, where the hooks begin
    the loop body (``epoch`` reads it): their own fetch bookkeeping, and a trace buffer's
    flush, belong to the fetch, as in the job. Figures: benchmarks/RESULTS.md."""
    stamp = [0.0]
    inner = getattr(it, "_next_data", None)
    if inner is None or getattr(
        inner, "_dlreplay_stamped", False
    ):  # (a persistent iterator: wrapped once)
        return getattr(inner, "_dlreplay_stamp", stamp)

    def _next_data() -> Any:
        data = inner()
        stamp[0] = time.perf_counter()
        return data

    _next_data._dlreplay_stamped = True  # type: ignore[attr-defined]
    _next_data._dlreplay_stamp = stamp  # type: ignore[attr-defined]
    it._next_data = _next_data
    return stamp


def received_at(it: Any, stamp: list[float]) -> float:
    """When the step of the batch the DataLoader iterator *it* just gave begins
    (``time.perf_counter()``), from its :func:`arrival_stamps` list *stamp* (reset for the
    next batch). Traced by dlreplay's capture hooks, the step begins where they begin the
    job's loop body: after their own fetch bookkeeping (and a trace buffer's flush)."""
    hooked = getattr(it.__dict__.get("_dlreplay_state"), "step_t0", 0.0)
    got = max(stamp[0], hooked) or time.perf_counter()
    stamp[0] = 0.0
    return got


class TorchLoader:
    """The replay's batches through ``torch.utils.data.DataLoader``.

    One DataLoader for the run: PyTorch itself starts the workers at every epoch's
    ``iter()`` and joins them at its end unless ``persistent_workers``.
    """

    name = "torch"

    def __init__(
        self,
        spec: WorkerSpec,
        num_workers: int,
        prefetch_factor: int = 2,
        persistent_workers: bool = False,
        pin_memory: bool = False,
    ) -> None:
        self.spec = spec
        self.dataset = ReplayDataset(spec)
        self.sampler = PlannedBatches()
        _quiet_abandoned_handovers()
        self.pin_memory = bool(pin_memory and torch.cuda.is_available())
        kwargs: dict[str, Any] = {}
        if num_workers > 0:
            kwargs = {
                "prefetch_factor": max(1, prefetch_factor),
                "persistent_workers": persistent_workers,
                "multiprocessing_context": worker_context(spec, torch=True),
                "worker_init_fn": _worker_init,
            }
        with _quiet_worker_count():
            self.loader = DataLoader(
                self.dataset,
                batch_sampler=self.sampler,
                num_workers=num_workers,
                collate_fn=collate,
                pin_memory=self.pin_memory,
                **kwargs,
            )
        self._iter: Any = None
        self._in_process = num_workers == 0

    def local_reader(self) -> SampleReader | None:
        """The reader of the training process's own samples (no workers), None with workers."""
        return self.dataset._reader if self._in_process else None

    def epoch(self, batches: Sequence[Sequence[tuple[int, int]]]) -> Iterator[BatchResult]:
        """Yield the epoch's batches in order (``iter()`` starts workers unless they persist)."""
        spf = self.spec.samples_per_file
        self.sampler.batches = [[f * spf + k for f, k in b] for b in batches]
        try:
            with _quiet_worker_count(), _workers_start_deaf():
                self._iter = iter(self.loader)
            arrived = arrival_stamps(self._iter)
            for i, (nbytes, pids, *tensors) in enumerate(self._iter):
                served = getattr(nbytes, "served", None)
                got = received_at(self._iter, arrived)
                # the tensors go to the training step, which drops them at its end (a generator
                # suspended at yield would otherwise hold them into the next fetch)
                box = [tensors]
                del tensors
                yield BatchResult(
                    i,
                    sum(nbytes),
                    tuple(self.sampler.batches[i]),
                    0.0,
                    pids[0],
                    box.pop(),
                    got,
                    served=served,
                )
        except ReplayError as exc:
            raise ReplayError(worker_message(exc)) from None
        except RuntimeError as exc:  # a worker killed or gone, or its error re-raised
            raise worker_failure(exc) from None

    def close(self) -> None:
        """Stop persistent workers, close the main process's files."""
        for it in (self._iter, getattr(self.loader, "_iterator", None)):
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
        self._iter = None
        self.dataset.close()
