"""Replay of a job that streams shards (``dataset.format`` tar or arrow) through an
``IterableDataset``: each loader worker opens its shards one after the other and reads each
through, once per epoch, with the job's library (``reader.streaming.library``: ``tarfile`` in
stream mode ``r|``, ``webdataset``, ``pyarrow``'s IPC stream reader), so the storage sees the
job's opens, read sizes and order.

* :func:`split_shards`: the shards of one worker of one rank, split as the job split them
  (``interleaved``: rank r takes shards r::R, worker w of those w::W, as webdataset's
  ``split_by_node``/``split_by_worker``; ``contiguous``: blocks);
* :class:`ShardStream`: the IterableDataset; a shuffle buffer of ``shuffle_buffer`` samples per
  worker (webdataset's ``.shuffle(n)``) when the job had one;
* :func:`streamed_batches`: the epoch's batches as the DataLoader hands them over (each worker
  batches its own samples, so a worker's last batch may be short; batches come round-robin);
* :class:`StreamingLoader`: a ``torch.utils.data.DataLoader`` over the stream, with the
  model's workers, prefetch factor, persistent workers and start method; ``epoch`` yields
  :class:`~.loader.BatchResult` as the other loaders do.

Bytes read are counted on the shard's file (tar; an Arrow stream is read through: its file's bytes).
Each sample's work beyond its reads (the job's decode) is spent in the worker as the job's
CPU time on the CPU (``reader.preprocess_host_cpu``: the job's decode competed with its
training step for the cores) and the rest of its wall time (``reader.preprocess_time``)
asleep (:class:`_SampleWork`); compute stays the accelerator's sleep (:mod:`.accelerator`).
Importing this module imports torch.
"""

from __future__ import annotations

import functools
import importlib
import io
import math
import os
import random
import signal
import tarfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dlreplay.model import Distribution, Streaming, WorkloadModel
from dlreplay.osutil import end_with_parent

from .common import ReplayError
from .hostcpu import burn
from .loader import BatchResult, WorkerSpec, runnable_seconds, worker_context
from .plan import RankPlan
from .torchloader import arrival_stamps, collate, received_at

__all__ = ["ShardStream", "StreamingLoader", "split_shards", "streamed_batches", "streaming_of"]

#: The library each shard format is read with when the model names none.
DEFAULT_LIBRARY = {"tar": "tarfile", "arrow": "pyarrow"}
#: The formats each library reads.
LIBRARY_FORMATS = {"tarfile": "tar", "webdataset": "tar", "pyarrow": "arrow"}


def streaming_of(model: WorkloadModel) -> Streaming:
    """The model's ``reader.streaming`` (the format's default library when it has none); raises
    :class:`ReplayError` when the library does not read the dataset's format."""
    fmt = model.dataset.format
    st = model.reader.streaming or Streaming(library=DEFAULT_LIBRARY.get(fmt, "tarfile"))
    if LIBRARY_FORMATS[st.library] != fmt:
        raise ReplayError(
            f"reader.streaming.library: {st.library} reads {LIBRARY_FORMATS[st.library]} shards, "
            f"not dataset.format {fmt}; set one of them to match"
        )
    return st


def split_shards(
    shards: int, rank: int, ranks: int, worker: int, workers: int, how: str
) -> list[int]:
    """The shard indices (of *shards*) that *worker* of *workers* on *rank* of *ranks* streams."""
    if how == "interleaved":
        return list(range(shards))[rank::ranks][worker::workers]
    mine = np.array_split(np.arange(shards), ranks)[rank]
    return [int(i) for i in np.array_split(mine, workers)[worker]]


def _workers(model: WorkloadModel) -> int:
    return max(1, model.reader.read_threads)


def streamed_batches(plan: RankPlan, epoch: int) -> list[list[tuple[int, int]]]:
    """The batches (lists of (shard, sample in shard)) this rank's DataLoader hands over in
    *epoch*: each worker's samples in shard order (a shuffle buffer reorders them, not their
    count) cut into batches, a short last one unless ``drop_last``, taken round-robin over
    the workers. ``train.steps_per_epoch`` caps them."""
    m = plan.model
    st, spf, b = streaming_of(m), m.dataset.num_samples_per_file, m.reader.batch_size
    per_worker = []
    for w in range(_workers(m)):
        shards = split_shards(m.dataset.num_files, plan.rank, plan.size, w, _workers(m), st.split)
        samples = [(s, k) for s in shards for k in range(spf)]
        cut = len(samples) // b if m.reader.drop_last else math.ceil(len(samples) / b)
        per_worker.append([samples[i * b : (i + 1) * b] for i in range(cut)])
    out: list[list[tuple[int, int]]] = []
    for i in range(max((len(p) for p in per_worker), default=0)):
        out.extend(p[i] for p in per_worker if i < len(p))
    if m.train.steps_per_epoch:
        out = out[: m.train.steps_per_epoch]
    return out


class _CountingFile(io.FileIO):
    """An unbuffered file (``read(2)`` per read) that counts the bytes its reads return."""

    #: seconds this process spent in the reads of such files (the sample's work is the rest)
    read_seconds = 0.0

    def __init__(self, path: str) -> None:
        super().__init__(path, "rb")
        self.nbytes = 0

    def read(self, size: int | None = -1) -> bytes | None:  # type: ignore[override]
        t0 = time.perf_counter()
        data = super().read(size)
        _CountingFile.read_seconds += time.perf_counter() - t0
        self.nbytes += len(data or b"")
        return data

    def readinto(self, buffer: Any) -> int | None:
        t0 = time.perf_counter()
        n = super().readinto(buffer)
        _CountingFile.read_seconds += time.perf_counter() - t0
        self.nbytes += n or 0
        return n


def _counted(
    samples: Iterator[tuple[int, bytes]], read: Callable[[], int]
) -> Iterator[tuple[int, bytes, int]]:
    """(sample, bytes, bytes read for it) of one shard: the bytes read since the previous sample
    (*read*: bytes read from the shard so far), the shard's last reads with its last sample
    (each sample is handed on when the next one is in, or the shard has ended)."""
    held: list[Any] | None = None
    last = 0
    for k, data in samples:
        now = read()
        if held is not None:
            yield held[0], held[1], held[2]
        held, last = [k, data, now - last], now
    if held is not None:
        yield held[0], held[1], held[2] + read() - last


class ShardStream(IterableDataset):  # type: ignore[type-arg]
    """The replay's shards streamed by each loader worker: yields ``(sample id, bytes read
    since the last sample, reader pid, the sample's first part as a uint8 tensor, *others)``
    (``others``: scalars up to the job's ``batch_tensors``)."""

    def __init__(self, spec: WorkerSpec, st: Streaming, rank: int, ranks: int, seed: int) -> None:
        self.spec, self.st, self.rank, self.ranks, self.seed = spec, st, rank, ranks, seed
        self.epoch = 0
        self._others = tuple(
            torch.zeros((), dtype=torch.int64) for _ in range(max(0, spec.batch_tensors - 1))
        )

    def _paths(self, worker: int, workers: int) -> list[tuple[int, str]]:
        idx = split_shards(
            len(self.spec.paths), self.rank, self.ranks, worker, workers, self.st.split
        )
        return [(i, os.path.join(self.spec.data_dir, self.spec.paths[i])) for i in idx]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        shards = self._paths(w, nw)
        if self.spec.io == "posix":  # --io posix: the shards' bytes, without their library
            raw = _posix_samples(shards, self.spec)
        else:
            read = {"tarfile": _tar_samples, "webdataset": _wds_samples, "pyarrow": _arrow_samples}
            raw = read[self.st.library](shards, self.spec.file_bytes)
        rng = random.Random(hash((self.seed, self.epoch, self.rank, w)))
        spf = self.spec.samples_per_file
        work = _SampleWork(
            self.spec.preprocess_time,
            self.spec.preprocess_cpu,
            [self.seed, self.epoch, self.rank, w, 0x5A],
            (self.st.worker_start_time, self.st.worker_start_cpu) if info is not None else None,
        )
        for sid, k, data, nbytes in _buffered(raw, self.st.shuffle_buffer, rng):
            payload = torch.frombuffer(bytearray(data or b"\0"), dtype=torch.uint8)
            work.spend()
            yield (sid * spf + k, nbytes, os.getpid(), payload, *self._others)
            work.resume()


#: whether this process has spent its worker start (a persistent worker spends it once, a worker
#: of a non-persistent loader in every epoch: a new process each time)
_STARTED = [False]


def _positive(dist: Distribution) -> Distribution:
    """*dist*, or a fixed 0 where it is unknown or not above 0."""
    return dist if dist.is_known and (dist.mean or 0) > 0 else Distribution.fixed(0.0)


def _draws(dist: Distribution, rng: np.random.Generator) -> Iterator[float]:
    """Values of *dist*, drawn 256 at a time (one numpy call per sample costs a small sample's
    worth of CPU)."""
    while True:
        yield from (float(v) for v in dist.sample(rng, 256))


class _SampleWork:
    """The job's work on each sample beyond its reads (decode, its Dataset's own steps), spent in
    one worker: ``reader.preprocess_host_cpu`` seconds busy on the CPU (:func:`.hostcpu.burn`:
    it competes for the cores as the job's decode did, and takes longer on a busier host), then
    the rest of ``reader.preprocess_time`` (the job's wall time per sample outside its reads:
    its CPU and its waits for one) asleep, less the time this worker was runnable meanwhile
    (on a CPU or waiting for one: :func:`.loader.runnable_seconds`). What the library's own
    reads, parsing and the batch's collation took here is part of the job's too: only the rest
    is spent. A CPU time of 0 (the field's default; a capture before dlreplay measured it for
    an IterableDataset) sleeps the whole of it, as DLIO's preprocessing. A worker process's
    first sample also carries its start (``reader.streaming.worker_start_time`` and ``_cpu``:
    the job's imports and setup; the replay's own, importing the library, count towards it).
    Overshoots are carried into the next sample's, so a worker's total tracks the model's.
    Units: seconds."""

    def __init__(
        self,
        pre: Distribution,
        cpu: Distribution,
        seed: list[int],
        start: tuple[Distribution, Distribution] | None = None,
    ) -> None:
        pre, cpu = _positive(pre), _positive(cpu)  # 0 CPU: "the preprocessing is a sleep"
        # (the CPU time drawn with the same random numbers: a long sample took much CPU, as in the job)
        self.wall = _draws(pre, np.random.default_rng(seed))
        self.cpu = _draws(cpu, np.random.default_rng(seed))
        self.cpu_debt = self.wall_debt = 0.0
        if start is not None and not _STARTED[0]:
            # this worker process's start (reader.streaming.worker_start_*), with its first sample
            rng = np.random.default_rng([*seed, 0x57])
            self.wall_debt = max(0.0, float(_positive(start[0]).sample(rng, 1)[0]))
            self.cpu_debt = min(self.wall_debt, float(_positive(start[1]).sample(rng, 1)[0]))
            _STARTED[0] = True
        self.on = (pre.mean or 0) > 0 or self.wall_debt > 0
        self.resume()

    def resume(self) -> None:
        """Mark where the next sample's own work begins (its reads, the library's parsing)."""
        self.cpu0, self.busy0 = time.process_time(), runnable_seconds()
        self.read0 = _CountingFile.read_seconds

    def spend(self) -> None:
        """Spend what is left of this sample's CPU time, then of its wall time."""
        if not self.on:
            return
        cpu_s, wall_s = _COLLATE_PER_SAMPLE
        self.cpu_debt += next(self.cpu) - (time.process_time() - self.cpu0 + cpu_s)
        if self.cpu_debt > 0:
            self.cpu_debt -= burn(self.cpu_debt)
        reads = _CountingFile.read_seconds - self.read0
        busy = runnable_seconds() - self.busy0 - reads + wall_s
        self.wall_debt += next(self.wall) - busy
        if self.wall_debt > 0:
            t0 = time.perf_counter()
            time.sleep(self.wall_debt)
            self.wall_debt -= time.perf_counter() - t0


def _buffered(samples: Iterator[Any], buffer: int, rng: random.Random) -> Iterator[Any]:
    """webdataset's ``.shuffle(buffer)``: fill a buffer, hand out a random one as each comes in."""
    if buffer <= 1:
        yield from samples
        return
    buf: list[Any] = []
    for s in samples:
        buf.append(s)
        if len(buf) >= buffer:
            yield buf.pop(rng.randrange(len(buf)))
    while buf:
        yield buf.pop(rng.randrange(len(buf)))


def _tar_samples(
    shards: Sequence[tuple[int, str]], sizes: Sequence[int]
) -> Iterator[tuple[int, int, bytes, int]]:
    """(shard, sample, first part's bytes, bytes read) of tar shards read with ``tarfile`` in
    stream mode on an unbuffered file (its reads of 10 KiB records, as the job's)."""
    for i, path in shards:
        with _CountingFile(path) as fh, tarfile.open(fileobj=fh, mode="r|") as tf:  # type: ignore[call-overload]
            for k, data, n in _counted(_tar_groups(tf), functools.partial(getattr, fh, "nbytes")):
                yield i, k, data, n


def _tar_groups(tf: tarfile.TarFile) -> Iterator[tuple[int, bytes]]:
    """(sample, first member's bytes) of a tar stream whose samples are members sharing a key."""
    key, first, k = None, b"", 0
    for member in tf:
        name = member.name.rsplit("/", 1)[-1].partition(".")[0]
        f = tf.extractfile(member)
        data = f.read() if f is not None else b""
        if key is not None and name != key:
            yield k, first
            k += 1
        if name != key:
            key, first = name, data
    if key is not None:
        yield k, first


def _wds_samples(
    shards: Sequence[tuple[int, str]], sizes: Sequence[int]
) -> Iterator[tuple[int, int, bytes, int]]:
    """(shard, sample, first part's bytes, bytes read) of tar shards read through
    ``webdataset``'s own tar expander and key grouping, on the buffered file its ``gopen``
    opens (``open(path, "rb")``: a buffer of the file system's block size)."""
    try:
        from webdataset.tariterators import group_by_keys, tar_file_expander
    except ImportError:
        raise ReplayError(
            "reader.streaming.library is webdataset, which is not installed here: "
            "pip install 'dlreplay[streaming]'"
        ) from None
    for i, path in shards:
        raw = _CountingFile(path)
        blksize = os.fstat(raw.fileno()).st_blksize
        with io.BufferedReader(raw, blksize if blksize > 1 else io.DEFAULT_BUFFER_SIZE) as fh:  # type: ignore[type-var]
            grouped = group_by_keys(tar_file_expander([{"url": path, "stream": fh}]))
            parts = (
                (k, next((v for key, v in s.items() if not key.startswith("__")), b""))
                for k, s in enumerate(grouped)
            )
            for k, data, n in _counted(parts, functools.partial(getattr, raw, "nbytes")):
                yield i, k, data if isinstance(data, bytes) else b"", n


def _arrow_samples(
    shards: Sequence[tuple[int, str]], sizes: Sequence[int]
) -> Iterator[tuple[int, int, bytes, int]]:
    """(shard, row, largest binary column's bytes, bytes read) of Arrow IPC stream shards read
    record batch by record batch with ``pyarrow`` on its own ``OSFile``, as the job's reader
    does: its reads go into Arrow's memory pool (through a Python file, each read of a record
    batch was a new ``bytes`` whose pages the kernel faulted in inside the read: 2-4x the
    job's read time). Bytes read: the file's position after each batch; the reads are not timed
    apart from the stream's decoding (a few µs per batch, counted as the sample's own work)."""
    import pyarrow as pa

    for i, path in shards:
        with pa.OSFile(path, mode="rb") as f:
            rows = _arrow_rows(pa.ipc.open_stream(f))
            for k, data, n in _counted(rows, f.tell):
                yield i, k, data, n


def _arrow_rows(stream: Any) -> Iterator[tuple[int, bytes]]:
    """(row, its largest binary column's bytes: the sample's payload) of an Arrow IPC stream."""
    import pyarrow as pa

    k = 0
    for batch in stream:
        binary = sorted(
            (c for c in batch.columns if pa.types.is_binary(c.type)), key=lambda c: c.nbytes
        )
        for v in binary[-1].to_pylist() if binary else [b""] * batch.num_rows:
            yield k, v or b""
            k += 1


def _posix_samples(
    shards: Sequence[tuple[int, str]], spec: WorkerSpec
) -> Iterator[tuple[int, int, bytes, int]]:
    """(shard, sample, b"", bytes read) of shards read through with ``read(2)`` calls of the
    model's transfer size (``--io posix``), their bytes shared over the samples."""
    size = int(spec.transfer_size.mean or 0) if spec.transfer_size.is_known else 0
    size = max(size, 4096) if size > 0 else 1 << 20
    spf = max(1, spec.samples_per_file)
    for i, path in shards:
        fd = os.open(path, os.O_RDONLY)
        try:
            got = 0
            while chunk := os.read(fd, size):
                got += len(chunk)
        finally:
            os.close(fd)
        share = got // spf
        for k in range(spf):
            yield i, k, b"", share + (got - share * spf if k == spf - 1 else 0)


#: (CPU seconds, runnable seconds) per sample of this process's last batch collation: the job's
#: batch fetch (whose time per sample the model's ``preprocess_time`` and ``preprocess_host_cpu``
#: are) held its collation too, so a worker spends that much less per sample
_COLLATE_PER_SAMPLE = [0.0, 0.0]


def _collate(samples: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """(sample ids, bytes per sample, pids, *tensors) of a batch (see torchloader.collate)."""
    c0, b0 = time.process_time(), runnable_seconds()
    out = ([int(s[0]) for s in samples], *collate([s[1:] for s in samples]))
    n = max(1, len(samples))
    _COLLATE_PER_SAMPLE[:] = [(time.process_time() - c0) / n, (runnable_seconds() - b0) / n]
    return out


def _worker_init(worker_id: int) -> None:
    """A worker ignores Ctrl-C (the training process stops it) and ends with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_with_parent()


#: the module each library's reads import (its import in each worker is part of the worker's start)
_LIBRARY_MODULES = {"webdataset": "webdataset.tariterators", "pyarrow": "pyarrow.ipc"}


def _import_library(library: str) -> None:
    """Import the shards' library in the training process, before its workers start, as a job
    does at its top (its forked workers then start with it; importing it in each worker made the
    replay's worker start 30 ms longer than the job's with pyarrow). A missing library is said
    when a worker reads (:func:`_wds_samples`)."""
    name = _LIBRARY_MODULES.get(library)
    if name is not None:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


class StreamingLoader:
    """The replay's batches of streamed shards through ``torch.utils.data.DataLoader``."""

    name = "torch"

    def __init__(self, plan: RankPlan) -> None:
        m, rd = plan.model, plan.model.reader
        self.stream = ShardStream(plan.spec, streaming_of(m), plan.rank, plan.size, plan.seed)
        if plan.spec.io != "posix":
            _import_library(self.stream.st.library)
        kwargs: dict[str, Any] = {}
        if rd.read_threads > 0:
            kwargs = {
                "prefetch_factor": max(1, rd.prefetch_factor),
                "persistent_workers": rd.persistent_workers,
                "multiprocessing_context": worker_context(plan.spec, torch=True),
                "worker_init_fn": _worker_init,
            }
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*suggested max number of worker")
            self.loader = DataLoader(
                self.stream,
                batch_size=rd.batch_size,
                drop_last=rd.drop_last,
                num_workers=rd.read_threads,
                collate_fn=_collate,
                **kwargs,
            )
        self._iter: Any = None

    def epoch(self, batches: Sequence[Sequence[tuple[int, int]]]) -> Iterator[BatchResult]:
        """Yield the epoch's batches as the workers stream them (at most ``len(batches)``)."""
        self.stream.epoch += 1
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r".*suggested max number of worker")
                self._iter = iter(self.loader)
            arrived = arrival_stamps(self._iter)
            for i, (ids, nbytes, pids, *tensors) in enumerate(self._iter):
                if i >= len(batches):
                    break
                # the step begins when torch had the batch, as for map-style datasets: without
                # it the handover counted in neither the fetch nor the sleep, and the replay's
                # loop bodies ran 4 % past the model (tar_stream: 2.78 against 2.67 ms)
                got = received_at(self._iter, arrived)
                box = [tensors]
                del tensors
                yield BatchResult(i, sum(nbytes), tuple(ids), 0.0, pids[0], box.pop(), got)
        except ReplayError:
            raise
        except (OSError, tarfile.TarError, RuntimeError) as exc:
            raise ReplayError(f"streaming shards: {exc}") from None

    def close(self) -> None:
        """Stop persistent workers."""
        for it in (self._iter, getattr(self.loader, "_iterator", None)):
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
        self._iter = None
