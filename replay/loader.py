"""A data loader with PyTorch DataLoader semantics, without importing torch.

``num_workers`` workers (processes started with fork, or threads); batch *i* goes to
worker ``i % W``; each worker has ``prefetch_factor`` batches in flight; results are
returned in batch order. ``num_workers == 0`` reads in the calling process. A Loader's
workers live until :meth:`Loader.close`; the engine makes one Loader per epoch when the
model's workers are not persistent (PyTorch starts and joins them every epoch) and one
for the run otherwise. Each worker reads whole batches through a
:class:`~dlreplay.replay.formats.LibraryReader` or ``PosixReader``
(:class:`SampleReader`, shared with the PyTorch-based loader in :mod:`.torchloader`).
"""

from __future__ import annotations

import faulthandler
import importlib.util
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlreplay.capture import REGIONS
from dlreplay.interrupt import INTERRUPT
from dlreplay.model import Distribution
from dlreplay.osutil import end_with_parent

from .common import ReplayError
from .direct import direct_call
from .formats import TEXT_CHUNK_BYTES, Decoded, LibraryReader, PosixReader
from .hostcpu import burn
from .s3 import S3Reader, S3Target
from .served import ReadMeter

#: Bytes per read call in ``--io posix`` when the model does not know its transfer size.
DEFAULT_TRANSFER = 262144
#: Seconds between checks of an idle worker process that its accelerator process is alive.
_PARENT_CHECK_S = 2.0


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to read samples (picklable)."""

    data_dir: str
    fmt: str
    io: str  # library | posix
    paths: tuple[str, ...]  # relative paths, by file index
    file_bytes: tuple[int, ...]
    records: tuple[tuple[tuple[int, int], ...] | None, ...]
    samples_per_file: int
    open_per_sample: bool
    transfer_size: Distribution
    preprocess_time: Distribution
    stats_per_sample: float
    lseeks_per_sample: float
    seed: int
    file_buffering: str = "buffered"
    #: bytes of the sample a worker hands over after its reader's resize (DLIO's ``resized_image``:
    #: one array of this size whatever was read); None = the decoded sample
    resize_bytes: int | None = None
    #: CPU seconds per sample the job's worker spent, read and decode included (the model's
    #: ``reader.preprocess_host_cpu``; fixed 0 = the preprocessing is a sleep)
    preprocess_cpu: Distribution = Distribution.fixed(0.0)
    #: how worker processes start (the model's ``reader.multiprocessing_context``)
    start_method: str = "fork"
    #: files each sample reads whole (the model's ``dataset.files_per_sample``): sample file
    #: ``f`` of the plan is ``paths[f*k .. f*k+k-1]``
    files_per_sample: int = 1
    #: tensors in each batch the torch loader hands over (the model's ``reader.batch_tensors``)
    batch_tensors: int = 1
    #: indexed_binary: where the record index is (the model's ``dataset.layout.index``; None: dlreplay's)
    index_style: str | None = None
    #: indexed_binary: the files are mapped, not read (the model's ``reader.memory_map``)
    memory_map: bool = False
    #: parquet: a sample is read as its row group (the model's ``reader.row_group_reads``)
    row_groups: bool = False
    #: drop the dataset's pages before each epoch (``--cold``: a :data:`.served.COLD_METHODS`); "" = no
    cold: str = ""
    #: the model's storage is s3: samples are read from these objects (:mod:`.s3`), not the files
    s3: S3Target | None = None
    #: reads through O_DIRECT, all (on) or calls of at least ``direct_io_threshold`` bytes
    #: (hybrid) (:mod:`.direct`: --io posix, and npz/npy files whole); off = buffered
    direct_io: str = "off"
    direct_io_threshold: int = 0
    #: the accelerator (rank) whose workers these are, of ``ranks``
    rank: int = 0
    ranks: int = 1
    #: arrays of the files the job never reads per sample (HDF5 dataset paths, NPZ member names,
    #: from the layout's ``read_per_sample``), e.g. DLIO's ``/labels``
    unread: tuple[str, ...] = ()
    #: the preprocess time is the job's silence between two samples' reads (the model's
    #: ``train.timed_between_reads``): the time between two of this reader's samples outside
    #: it (the loader's own work) is taken out of the next sample's preprocessing
    between_reads: bool = False


@dataclass(frozen=True)
class BatchResult:
    """One batch read: its index, bytes actually read, sample ids (file*spf+k), read seconds,
    and the pid of the process that read it."""

    index: int
    nbytes: int
    samples: tuple[int, ...]
    seconds: float
    worker_pid: int = 0
    #: the batch's tensors (torch loader), held until the training process lets go of them at
    #: the end of its step, as a training loop drops its batch
    payload: Any = field(default=None, compare=False, repr=False)
    #: ``time.perf_counter()`` when the loader had the batch in hand (the end of the job's wait for
    #: it); None: when it was handed to the training loop
    received: float | None = field(default=None, compare=False, repr=False)
    #: bytes the block layer read for the batch (its reader's ``/proc`` counters, see
    #: :mod:`.served`); None: not measured
    served: int | None = field(default=None, compare=False, repr=False)


#: Open ``/proc/thread-self/schedstat`` per thread (by native thread id; a forked child's
#: threads have other ids): one ``pread`` per call instead of open, read and close.
_SCHEDSTAT: dict[int, int] = {}


def _run_delay() -> float:
    """Seconds the calling thread has waited in a run queue for a CPU (the second field of
    ``/proc/thread-self/schedstat``; 0 where the kernel keeps no scheduler statistics)."""
    tid = threading.get_native_id()
    for _ in range(2):
        fd = _SCHEDSTAT.get(tid)
        try:
            if fd is None:
                fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
                _SCHEDSTAT[tid] = fd
            return int(os.pread(fd, 128, 0).split()[1]) * 1e-9
        except (OSError, ValueError, IndexError):
            if fd is None or _SCHEDSTAT.pop(tid, None) is None:
                break
            try:  # a thread id reused after its first thread ended: open this thread's file once
                os.close(fd)
            except OSError:
                pass
    return 0.0


def runnable_seconds() -> float:
    """Seconds the calling thread has been runnable: on a CPU plus waiting in the run queue for
    one, i.e. its wall time not blocked (in I/O or sleeps).

    The CPU part is the thread's CPU clock (``CLOCK_THREAD_CPUTIME_ID``, exact when read),
    not schedstat's first field: the kernel brings that one up to date only at a scheduler
    tick or a context switch, so read by the running thread itself it lags by up to a tick
    (4 ms at 250 Hz). Measured around a sample's decode right after a sleep (fresh at the
    start, stale at the end), it came out short by a good part of the decode, and the
    replay slept that much preprocessing twice. The run-queue wait (second field) is
    brought up to date when the thread gets a CPU, so it is current while the thread runs."""
    return time.thread_time() + _run_delay()


class _Draws:
    """Values of a distribution drawn in blocks (one numpy call per :data:`BLOCK` values,
    not one per sample: a single draw of an empirical distribution costs the worker a good
    part of a small sample's own CPU)."""

    BLOCK = 256

    def __init__(self, dist: Distribution, rng: np.random.Generator) -> None:
        self.dist, self.rng = dist, rng
        self.values: list[float] = []
        self.i = 0

    def next(self) -> float:
        if self.i >= len(self.values):
            self.values = [float(v) for v in self.dist.sample(self.rng, self.BLOCK)]
            self.i = 0
        self.i += 1
        return self.values[self.i - 1]


#: The sample handed over by ``--io posix`` reads (see :meth:`SampleReader.read_sample`).
_NO_BYTES = np.empty(0, dtype=np.uint8)
_NO_BYTES.flags.writeable = False


def _text_chunk(transfer: Distribution) -> int:
    """Bytes per read of a whole text file: the model's largest transfer (a sequential reader's
    chunk; its last read of a file is shorter), else :data:`TEXT_CHUNK_BYTES`."""
    if not transfer.is_known:
        return TEXT_CHUNK_BYTES
    top = transfer.max if transfer.max is not None else transfer.mean
    return int(top) if top and top > 0 else TEXT_CHUNK_BYTES


def _record_buffer(spec: WorkerSpec) -> int:
    """The buffer (bytes) a raw record is read through: the job's read size where its reads were
    larger than its records and the files buffered (a Python file's ``seek`` + ``readline``
    reads a buffer from the record's offset); 0 otherwise (the record's bytes alone)."""
    if spec.fmt != "raw" or spec.file_buffering != "buffered" or not spec.transfer_size.is_known:
        return 0
    lengths = [b for recs in spec.records if recs for _, b in recs]
    if not lengths:
        return 0
    ts = spec.transfer_size
    median = float(ts.quantile([0.5])[0]) if ts.type == "empirical" else float(ts.mean or 0)
    return int(median) if median > float(np.mean(lengths)) else 0


def dlio_index_files(spec: WorkerSpec) -> list[int]:
    """The files whose record index DLIO 2.0's PyTorch reader loads in rank ``spec.rank``'s
    workers (``ConfigArguments.get_global_map_index``): those holding the rank's block of
    samples, ``ceil(samples / ranks)`` of them from ``rank * ceil(samples / ranks)`` on."""
    total = len(spec.paths) * spec.samples_per_file
    per_rank = -(-total // max(spec.ranks, 1))
    first, last = spec.rank * per_rank, min((spec.rank + 1) * per_rank, total)
    if last <= first:
        return []
    spf = max(spec.samples_per_file, 1)
    return list(range(first // spf, (last - 1) // spf + 1))


def _dlio_index(spec: WorkerSpec) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """DLIO 2.0's ``IndexedBinaryReader.load_index``: for every file of the rank's samples
    (:func:`dlio_index_files`), its record index (:func:`dlio_index_of`), when a reader
    starts; None for the other files (the rank reads none of their samples)."""
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(spec.paths)
    for i in dlio_index_files(spec):
        out[i] = dlio_index_of(spec, i)
    return out


def dlio_index_of(spec: WorkerSpec, i: int) -> tuple[np.ndarray, np.ndarray]:
    """File *i*'s ``.off.idx`` and ``.sz.idx`` read whole (``samples_per_file`` 8-byte values
    each: open, one read, close; mapped where DLIO's reader maps its files)."""
    path = os.path.join(spec.data_dir, spec.paths[i])
    pair = []
    for suffix in (".off.idx", ".sz.idx"):
        values = np.zeros(spec.samples_per_file, dtype=np.int64)
        try:
            if spec.memory_map:  # DLIO's mmap reader maps its index files too (np.memmap)
                mapped = np.memmap(path + suffix, mode="r", dtype=np.int64)
                values[: min(len(mapped), len(values))] = mapped[: len(values)]
                del mapped
            else:
                with open(path + suffix, "rb") as fh:
                    fh.readinto(values)  # type: ignore[arg-type]  # an ndarray is a writable buffer
        except OSError as exc:
            raise ReplayError(
                f"{path + suffix}: cannot read the record index ({exc.strerror or exc})"
            ) from None
        pair.append(values)
    return pair[0], pair[1]


class SampleReader:
    """Reads samples in one worker (keeps its files open unless open_per_sample) and spends
    the model's preprocess time per sample: what is left of it after the time the library
    took to read and decode the sample while not blocked in I/O (the job's preprocess time
    holds its decode, and its waits for a CPU)."""

    def __init__(self, spec: WorkerSpec, worker_id: int, item_events: bool = True) -> None:
        #: the CPU clock a sample's own CPU is measured by: the process's (all its threads, as
        #: the capture hooks measure a job's item, so a library's own threads, pyarrow's I/O,
        #: are not spent again), the thread's where this reader is one of several threads of
        #: a process (thread workers). Measured by the thread's clock, the replay's items
        #: spent 24-27 % more CPU than the job's (jsonl_lines, parquet_columns), 10-18 % by
        #: the process's (benchmarks/RESULTS.md)
        self.clock = (
            time.process_time
            if threading.current_thread() is threading.main_thread()
            else time.thread_time
        )
        self.meter = (
            ReadMeter()
        )  # the storage's reads for this reader, from its start (index files)
        self.item_events = item_events
        self.preprocess_debt = (
            0.0  # seconds of modelled preprocessing not yet spent (negative: overspent)
        )
        self.spec = spec
        #: ``time.perf_counter()`` where this reader's first sample since :meth:`batch_marks`
        #: began (None: none since), and where its last sample ended (its preprocessing spent)
        self.batch_began: float | None = None
        self.sample_ended: float | None = None
        self.rng = np.random.default_rng([spec.seed, worker_id, 0x10])
        if spec.io == "posix":
            self.reader: Any = PosixReader(
                spec.fmt,
                spec.open_per_sample,
                spec.stats_per_sample,
                spec.lseeks_per_sample,
                direct=spec.direct_io != "off",
            )
        else:
            self.reader = LibraryReader(
                spec.fmt,
                spec.open_per_sample,
                spec.file_buffering == "buffered",
                index_style=spec.index_style,
                text_chunk=_text_chunk(spec.transfer_size),
                memory_map=spec.memory_map,
                row_groups=spec.row_groups,
                direct_io=spec.direct_io,
                direct_io_threshold=spec.direct_io_threshold,
                unread=spec.unread,
                record_buffer=_record_buffer(spec),
            )
        if spec.s3 is not None:
            sizes = dict(zip(spec.paths, spec.file_bytes, strict=True))
            self.reader = S3Reader(spec.s3, spec.data_dir, sizes, spec.samples_per_file)
            self.meter = ReadMeter(self.reader.returned)  # what the GETs returned: no block layer
        #: DLIO 2.0's record index of every file (offsets, sizes), loaded as its reader does when it starts
        self.index = (
            _dlio_index(spec)
            if spec.io != "posix" and spec.fmt == "indexed_binary" and spec.index_style == "dlio"
            else None
        )
        self.preprocess = (
            _Draws(spec.preprocess_time, self.rng)
            if spec.preprocess_time.is_known and (spec.preprocess_time.mean or 0) > 0
            else None
        )
        # CPU per sample drawn with the same random numbers as the preprocess time (a copy of the
        # generator): a long item is one that took much CPU, as in the job
        self.cpu = (
            _Draws(spec.preprocess_cpu, np.random.default_rng([spec.seed, worker_id, 0x10]))
            if self.preprocess is not None
            and spec.preprocess_cpu.is_known
            and (spec.preprocess_cpu.mean or 0) > 0
            else None
        )
        self.cpu_debt = (
            0.0  # CPU seconds of the model not yet spent (negative: the library spent more)
        )
        self.transfer = _Draws(
            spec.transfer_size
            if spec.transfer_size.is_known
            else Distribution.fixed(DEFAULT_TRANSFER),
            np.random.default_rng([spec.seed, worker_id, 0x11]),
        )

    def read_sample(
        self, f: int, k: int, cpu0: float | None = None, busy0: float | None = None
    ) -> tuple[int, Decoded]:
        """Read sample *k* of file *f* and spend its preprocess time; (bytes read, decoded sample).

        With ``--io posix`` nothing is decoded: the bytes go into the reader's reused buffer
        and the sample handed over is an empty array (the model's ``record_length_resize``,
        where it has one, is handed over by the PyTorch loader whatever was read).

        ``cpu0``: the reader's CPU clock (:attr:`clock`) where the sample's item began, if before this call (the
        PyTorch Dataset's own steps count as the job's did); ``busy0``: its runnable seconds
        (:func:`runnable_seconds`) there, likewise for the preprocess time; what the caller
        spends after the call it reports with :meth:`charge`."""
        if self.spec.between_reads:  # (only then are the marks read: batch_marks)
            began = time.perf_counter()
            if self.batch_began is None:
                self.batch_began = began
            elif self.sample_ended is not None:
                # the loader's own work since the last sample (its loop, the Dataset's call) is
                # in the job's silence between two samples, which the model's preprocessing is
                self.preprocess_debt -= began - self.sample_ended
        if cpu0 is None:
            cpu0 = self.clock()
        s = self.spec
        # the same data/item event a captured PyTorch worker emits (no-op when not traced)
        item = (
            REGIONS.begin("item", "data", image_idx=f * s.samples_per_file + k)
            if self.item_events
            else None
        )
        busy0 = (runnable_seconds() if busy0 is None else busy0) + self.reader.library_wait
        if s.files_per_sample > 1:  # each of the sample's files whole, in turn
            got = [
                self._read_file(g, 0)
                for g in range(f * s.files_per_sample, (f + 1) * s.files_per_sample)
            ]
            nbytes = sum(n for n, _ in got)
            decoded: Decoded = tuple(
                a for _, d in got for a in (d if isinstance(d, tuple) else (d,))
            )
        else:
            nbytes, decoded = self._read_file(f, k)
        pre = None
        settled: float | None = None
        burned = 0.0
        if self.cpu is not None:
            # the job's worker CPU per sample, less what the library's read and decode took here: spent
            # busy (it competes for the cores with the training process as the job's decode did)
            settled = self.clock()
            self.cpu_debt += self.cpu.next() - (settled - cpu0)
            if self.cpu_debt > 0:
                pre = REGIONS.begin("preprocess", "data")
                burned = burn(self.cpu_debt)
                self.cpu_debt -= burned
        if self.preprocess is not None:
            pre = self._sleep_preprocess(busy0, pre)
        t1 = time.perf_counter()
        REGIONS.end(pre)
        REGIONS.end(item)
        if self.preprocess is not None:
            # the regions' trace events (a traced replay's, which the job's items did not
            # write) come out of the next sample's share, as the sleep's overshoot does
            self.preprocess_debt -= time.perf_counter() - t1
        if settled is not None:
            # what the sample took after its CPU was settled, besides the burn, comes out of the next
            # sample's: the sleep's own system time and the trace's region events. The job's items
            # spent none of it, and without this the replay's workers spent more CPU per sample
            # than the job's.
            self.cpu_debt -= self.clock() - settled - burned
        if s.between_reads:
            self.sample_ended = time.perf_counter()
        return nbytes, decoded

    def _sleep_preprocess(self, busy0: float, pre: Any) -> Any:
        """Sleep what is left of the sample's modelled preprocess time; returns its trace
        region (*pre*, or one begun here). The model's per-sample time (the job's item time
        minus its POSIX time: decode, and the waits for a CPU on a busy host) holds the job's
        decode; the library has just decoded here too (on a CPU or waiting for one, not
        blocked in I/O; *busy0*: :func:`runnable_seconds` where the sample began), so only the
        rest is slept. Sleeps of a millisecond overshoot by a good part of it on a busy
        machine: the overshoot is carried into the next sample's sleep, so this worker's total
        tracks the model."""
        assert self.preprocess is not None
        self.preprocess_debt += self.preprocess.next() - (
            runnable_seconds() + self.reader.library_wait - busy0
        )
        if self.preprocess_debt > 0:
            t0 = time.perf_counter()
            pre = pre or REGIONS.begin("preprocess", "data")
            time.sleep(self.preprocess_debt)
            self.preprocess_debt -= time.perf_counter() - t0
        return pre

    def batch_marks(self) -> tuple[float | None, float | None]:
        """(where the first sample read since the last call began, where the last one ended;
        ``time.perf_counter()``; None: no sample since), and start anew: the training process
        calls it at each step, so the marks of the next call are its next batch's."""
        marks = (self.batch_began, self.sample_ended)
        self.batch_began = None
        return marks

    def _read_file(self, f: int, k: int) -> tuple[int, Decoded]:
        """Read sample *k* of file *f* (an index of ``spec.paths``): its record's byte range from
        the file's records or its DLIO index, where it has them."""
        s = self.spec
        path = os.path.join(s.data_dir, s.paths[f])
        recs = s.records[f]
        rec = recs[k] if recs is not None else None
        if self.index is not None:
            if self.index[f] is None:  # outside the rank's block (an order not DLIO's): loaded now
                self.index[f] = dlio_index_of(s, f)
            off, size = self.index[f]  # type: ignore[misc]
            rec = (int(off[k]), int(size[k]))
        return self._read(path, f, k, rec)

    def _read(self, path: str, f: int, k: int, rec: tuple[int, int] | None) -> tuple[int, Decoded]:
        """Read sample *k* of file *f* at *path* (its byte range *rec*, when the file has records):
        (bytes read, decoded sample). A failed read raises ReplayError naming the path."""
        s = self.spec
        try:
            if s.io == "posix":
                if rec is not None:
                    off, length = rec
                else:
                    size, n = s.file_bytes[f], s.samples_per_file
                    off = size * k // n
                    length = size * (k + 1) // n - off
                ts = max(1, int(self.transfer.next()))
                # storage-level reads into the reader's reused buffer: nothing decoded, so no bytes
                # are handed to the consumer (a new array per sample cost a page fault per 4 KiB,
                # and through PyTorch's DataLoader a copy into shared memory)
                direct = direct_call(s.direct_io, s.direct_io_threshold, min(ts, length))
                nbytes, decoded = self.reader.read(path, off, length, ts, direct), _NO_BYTES
            else:
                nbytes, decoded = self.reader.read_decoded(path, k, rec)
        except OSError as exc:
            raise ReplayError(
                f"{exc.filename or path}: cannot read sample {k} ({exc.strerror or exc})"
            ) from None
        except ReplayError:
            raise
        except Exception as exc:  # a library failing on a damaged file
            first = (str(exc).strip().splitlines() or [""])[0]  # (torch.load's run for lines)
            raise ReplayError(
                f"{path}: cannot read sample {k} ({type(exc).__name__}: {first})"
            ) from None
        return nbytes, decoded

    def charge(self, seconds: float, busy: float = 0.0) -> None:
        """CPU seconds (and runnable seconds, *busy*) the caller spent on the last sample after
        :meth:`read_sample` returned (the PyTorch Dataset's tensors of it): taken from the next
        sample's share, as the job's item held its own (10-20 us an item: a tenth of a JSON
        line's 0.17 ms, slept again before)."""
        if self.cpu is not None:
            self.cpu_debt -= seconds
        if self.preprocess is not None:
            self.preprocess_debt -= busy

    def read_batch(self, index: int, samples: Sequence[tuple[int, int]]) -> BatchResult:
        s = self.spec
        t0 = time.perf_counter()
        total = 0
        for f, k in samples:
            total += self.read_sample(f, k)[0]
        ids = tuple(f * s.samples_per_file + k for f, k in samples)
        return BatchResult(
            index, total, ids, time.perf_counter() - t0, os.getpid(), served=self.meter.take()
        )

    def close(self) -> None:
        self.reader.close()


def _worker_main(
    spec: WorkerSpec, worker_id: int, tasks: Any, results: Any, is_process: bool
) -> None:
    """Worker loop: take (epoch, index, samples) tasks until None; put BatchResult or ("error", msg).

    A worker process also ends when its accelerator process is gone (killed, or it lost
    track of the worker), instead of waiting for tasks forever.
    """
    parent = multiprocessing.parent_process() if is_process else None
    if is_process:
        faulthandler.enable(all_threads=True)  # a fatal signal prints the worker's Python stacks
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the accelerator stops workers itself
        signal.pthread_sigmask(
            signal.SIG_UNBLOCK, {signal.SIGINT}
        )  # blocked by Loader around the fork
        end_with_parent()  # at once when the accelerator is killed (else at the next parent check)
    reader = SampleReader(spec, worker_id)
    try:
        while True:
            try:
                task = tasks.get(timeout=_PARENT_CHECK_S)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    break
                continue
            if task is None:
                break
            epoch, index, samples = task
            try:
                results.put((epoch, reader.read_batch(index, samples)))
            except Exception as exc:
                results.put((epoch, ("error", str(exc))))
    finally:
        reader.close()


#: Formats read through polars in library mode: polars' thread pool does not survive fork
#: when the parent has used it (children deadlock), so their workers come from a forkserver.
POLARS_FORMATS = ("csv", "parquet")


def worker_context(spec: WorkerSpec, torch: bool = False) -> Any:
    """The job's start method; for fork (PyTorch's default on Linux) with a polars format, a
    forkserver with the readers preloaded (polars' thread pool does not survive a fork), and
    with *torch* (PyTorch's DataLoader workers) torch too: a worker forked from a server
    without it imported torch itself, 1.5-4 s at each epoch's start against the job's 0.16
    (whose workers fork from its training process)."""
    if spec.start_method != "fork":
        return multiprocessing.get_context(spec.start_method)
    if spec.io == "library" and spec.fmt in POLARS_FORMATS:
        ctx = multiprocessing.get_context("forkserver")
        preload = ["dlreplay.replay.loader", "polars", "numpy"]
        if torch:
            preload.append("dlreplay.replay.torchloader")
        if importlib.util.find_spec("pyarrow") is not None:
            preload.append("pyarrow.parquet")  # reader.row_group_reads' library
        ctx.set_forkserver_preload(preload)
        return ctx
    return multiprocessing.get_context("fork")


def start_worker_server(spec: WorkerSpec, torch: bool = False) -> None:
    """Start the forkserver the workers of :func:`worker_context` come from, and wait for its
    preloads (torch: 1.5 s), before the first epoch: the job's workers fork from a training
    process that has imported everything already, so its first epoch holds none of this."""
    ctx = worker_context(spec, torch)
    if ctx.get_start_method() != "forkserver":
        return
    p = ctx.Process(target=_started, name="dlreplay-forkserver-warmup")
    p.start()
    p.join()


def _started() -> None:
    """The warm-up process of :func:`start_worker_server`: nothing to do."""


class Loader:
    """Batches in order, read by ``num_workers`` workers with ``prefetch_factor`` batches each in flight.

    ``one_epoch``: the workers are joined when the epoch's last batch has been delivered
    (PyTorch without ``persistent_workers``: inside the ``next()`` that ends the epoch);
    the Loader is then :attr:`closed` and the next epoch needs a new one.
    """

    name = "builtin"

    def __init__(
        self,
        spec: WorkerSpec,
        num_workers: int,
        worker_kind: str = "process",
        prefetch_factor: int = 2,
        one_epoch: bool = False,
    ) -> None:
        self.spec = spec
        self.one_epoch = one_epoch
        self.closed = False
        self.num_workers = num_workers
        self.prefetch = max(1, prefetch_factor)
        self._epoch = 0
        self._local: SampleReader | None = None
        self._workers: list[Any] = []
        self._tasks: list[Any] = []
        if num_workers == 0:
            self._local = SampleReader(spec, 0)
            return
        if worker_kind == "thread":
            self._results: Any = queue.Queue()
            for w in range(num_workers):
                q: Any = queue.Queue()
                t = threading.Thread(
                    target=_worker_main,
                    args=(spec, w, q, self._results, False),
                    name=f"dlreplay-loader-{w}",
                    daemon=True,
                )
                self._tasks.append(q)
                self._workers.append(t)
        else:
            ctx = worker_context(spec)
            self._results = ctx.Queue()
            for w in range(num_workers):
                q = ctx.Queue()
                p = ctx.Process(
                    target=_worker_main,
                    args=(spec, w, q, self._results, True),
                    name=f"dlreplay-loader-{w}",
                    daemon=True,
                )
                self._tasks.append(q)
                self._workers.append(p)
        # A Ctrl-C while workers start must not raise half-way through (a started worker not
        # yet registered would be left behind): it only sets INTERRUPT, checked at the next
        # batch. SIGINT also stays blocked in this thread meanwhile: a forked child inherits
        # the mask, so a terminal Ctrl-C cannot hit it before it ignores SIGINT.
        with INTERRUPT.deferred():
            mask = (
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                if worker_kind != "thread"
                else None
            )
            try:
                for w in self._workers:
                    w.start()
            finally:
                if mask is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def local_reader(self) -> SampleReader | None:
        """The reader of the training process's own samples (no workers), None with workers."""
        return self._local

    def epoch(self, batches: Sequence[Sequence[tuple[int, int]]]) -> Iterator[BatchResult]:
        """Yield the batches' results in order (batch i read by worker i % W)."""
        yield from self._epoch_batches(batches)
        if self.one_epoch:
            self.close()

    def _epoch_batches(self, batches: Sequence[Sequence[tuple[int, int]]]) -> Iterator[BatchResult]:
        self._epoch += 1
        if self._local is not None:
            for i, b in enumerate(batches):
                yield self._local.read_batch(i, b)
            return
        W, nb = self.num_workers, len(batches)
        sent = 0

        def send(i: int) -> None:
            self._tasks[i % W].put((self._epoch, i, list(batches[i])))

        while sent < min(nb, self.prefetch * W):
            send(sent)
            sent += 1
        buffer: dict[int, BatchResult] = {}
        for i in range(nb):
            while i not in buffer:
                epoch, res = self._get()
                if epoch != self._epoch:
                    continue
                if isinstance(res, tuple):
                    raise ReplayError(res[1])
                buffer[res.index] = res
            if sent < nb:
                send(sent)
                sent += 1
            yield buffer.pop(i)

    def _get(self) -> Any:
        while True:
            try:
                return self._results.get(timeout=1.0)
            except queue.Empty:
                INTERRUPT.check()
                dead = [w for w in self._workers if not w.is_alive()]
                if dead:
                    code = getattr(dead[0], "exitcode", None)
                    raise ReplayError(
                        f"data-loader worker {dead[0].name} ended unexpectedly (exit code {code})"
                    ) from None

    def close(self) -> None:
        """Stop the workers (they finish their current batch)."""
        self.closed = True
        if self._local is not None:
            self._local.close()
        for q in self._tasks:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5.0
        for w in self._workers:
            w.join(max(0.0, deadline - time.monotonic()))
            if isinstance(w, multiprocessing.process.BaseProcess) and w.is_alive():
                w.terminate()
                w.join(1.0)
        self._workers.clear()
