"""Shared plumbing for the example training jobs in ``examples/``.

The example scripts are run as ``python examples/<name>.py`` so ``sys.path[0]``
is this directory and ``import _common`` works (also in ``spawn`` workers,
which inherit the parent's ``sys.path``).

What lives here:

* :class:`CountingFileIO` -- an *unbuffered* ``io.FileIO`` that counts every
  byte (and every ``read(2)`` call) it returns, per process.  By default every
  dataset read in the examples goes through it, so a job knows exactly how many
  bytes it read at the POSIX level; a tracer (DFTracer) can be checked against
  that.  With ``--by-path`` the jobs open files by path through the format's
  library instead (``numpy.load(path)``, ``PIL.Image.open(path)``,
  ``h5py.File(path)``), as real training code does; bytes and read calls then
  come from the thread's kernel counters (``/proc/thread-self/io``).
* dataset bookkeeping (``.dataset-done`` marker, deterministic generation),
* the argparse flags every job shares,
* the training loop, which times each step, checkpoints, aggregates bytes per
  worker pid and writes the JSON report atomically.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

MARKER = ".dataset-done"
MARKER_VERSION = 1

# --------------------------------------------------------------------------
# Counting, unbuffered file object
# --------------------------------------------------------------------------

# Per-process totals (a forked worker inherits the parent's values at fork
# time; consumers therefore only ever use *deltas* taken inside one process).
_BYTES_READ = 0
_READ_CALLS = 0

_READALL_CHUNK = 1 << 20


class CountingFileIO(io.FileIO):
    """``io.FileIO`` opened ``'rb'`` that counts the bytes its reads return.

    ``FileIO`` is unbuffered: each ``read(n)`` / ``readinto(b)`` is exactly one
    ``read(2)`` system call.  ``readall()`` (also ``read()`` / ``read(-1)``) is
    re-implemented as a loop of ``read(2)`` calls so that the number of counted
    calls equals the number of ``read(2)`` syscalls issued on dataset files
    (the final zero-byte read that detects EOF included).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, "rb")
        self.bytes_read = 0
        self.read_calls = 0

    def _account(self, n: int) -> None:
        global _BYTES_READ, _READ_CALLS
        self.bytes_read += n
        self.read_calls += 1
        _BYTES_READ += n
        _READ_CALLS += 1

    def read(self, size: int | None = -1) -> bytes | None:
        if size is None or size < 0:
            return self.readall()
        data = super().read(size)
        if data is not None:
            self._account(len(data))
        return data

    def readinto(self, buffer: Any) -> int | None:
        n = super().readinto(buffer)
        if n is not None:
            self._account(n)
        return n

    def readall(self) -> bytes:
        chunks = []
        while True:
            data = super().read(_READALL_CHUNK)
            if data is None:  # non-blocking fd with no data; never for regular files
                break
            self._account(len(data))
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def io_counters() -> tuple[int, int]:
    """(bytes, read calls) counted so far in *this* process."""
    return _BYTES_READ, _READ_CALLS


class _KeepOpen:
    """Context manager around a cached handle: rewinds, never closes."""

    def __init__(self, f: CountingFileIO) -> None:
        self.f = f

    def __enter__(self) -> CountingFileIO:
        self.f.seek(0)
        return self.f

    def __exit__(self, *exc: object) -> None:
        return None


class Opener:
    """Opens dataset files as :class:`CountingFileIO`.

    Default: a fresh open/close per sample.  With ``keep_open`` one handle per
    file and per process is cached (keyed by pid, so a forked worker never
    shares an inherited descriptor -- and its file offset -- with its parent).
    """

    def __init__(self, keep_open: bool = False) -> None:
        self.keep_open = keep_open
        self._pid = -1
        self._cache: dict[str, CountingFileIO] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"keep_open": self.keep_open, "_pid": -1, "_cache": {}}

    def __call__(self, path: str) -> Any:
        if not self.keep_open:
            return CountingFileIO(path)
        pid = os.getpid()
        if pid != self._pid:
            # Inherited handles belong to another process: drop without closing.
            self._cache = {}
            self._pid = pid
        f = self._cache.get(path)
        if f is None:
            f = self._cache[path] = CountingFileIO(path)
        return _KeepOpen(f)


def thread_io_counters() -> tuple[int, int]:
    """(rchar, syscr) of the calling thread: bytes and read-family syscalls, from the kernel."""
    rchar = syscr = 0
    try:
        with open("/proc/thread-self/io", "rb", buffering=0) as fh:
            for line in fh.read().splitlines():
                if line.startswith(b"rchar:"):
                    rchar = int(line.split()[1])
                elif line.startswith(b"syscr:"):
                    syscr = int(line.split()[1])
    except OSError:
        pass
    return rchar, syscr


class CountedRead:
    """``with CountedRead() as c: ...`` -> ``c.bytes`` / ``c.calls`` read inside.

    ``by_path``: the reads went through a library opening files by path, so they are
    counted by the kernel for this thread (the read of the counter file itself is
    left out: rchar is read before the counter file's own read is accounted).
    """

    def __init__(self, by_path: bool = False) -> None:
        self.by_path = by_path

    def _counters(self) -> tuple[int, int]:
        return thread_io_counters() if self.by_path else io_counters()

    def __enter__(self) -> CountedRead:
        self._b0, self._c0 = self._counters()
        self.bytes = 0
        self.calls = 0
        return self

    def __exit__(self, *exc: object) -> None:
        b1, c1 = self._counters()
        self.bytes = b1 - self._b0
        self.calls = c1 - self._c0
        if self.by_path:  # the first snapshot's own read(2) of /proc/thread-self/io
            self.calls = max(0, self.calls - 1)


def io_tensors(counted: CountedRead) -> tuple[Any, Any, Any]:
    """(bytes, read calls, pid) as int64 scalar tensors for a sample tuple."""
    import torch

    return (
        torch.tensor(counted.bytes, dtype=torch.int64),
        torch.tensor(counted.calls, dtype=torch.int64),
        torch.tensor(os.getpid(), dtype=torch.int64),
    )


# --------------------------------------------------------------------------
# Dataset bookkeeping
# --------------------------------------------------------------------------


def default_data_dir(job: str) -> str:
    return os.path.join(tempfile.gettempdir(), "dlreplay-examples", job, "data")


def _read_marker(data_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(data_dir, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ensure_dataset(
    data_dir: str,
    job: str,
    params: dict[str, Any],
    generate: Callable[[str], Sequence[str]],
) -> tuple[list[str], bool]:
    """Return (absolute file paths, generated?) of the dataset in ``data_dir``.

    The dataset is reused when ``data_dir/.dataset-done`` exists and records
    the same ``job`` and generation ``params``; otherwise files listed by a
    stale marker are removed and ``generate(data_dir)`` (which returns paths
    relative to ``data_dir``) is called.  The marker is written last.
    """
    data_dir = os.path.abspath(data_dir)
    marker = _read_marker(data_dir)
    want = {"version": MARKER_VERSION, "job": job, "params": params}
    if marker is not None and all(marker.get(k) == v for k, v in want.items()):
        files = [os.path.join(data_dir, p) for p in marker["files"]]
        if all(os.path.isfile(p) for p in files):
            return files, False
    if marker is not None:
        # Only ever delete what a previous run of these examples created.
        for rel in marker.get("files", []):
            try:
                os.unlink(os.path.join(data_dir, rel))
            except OSError:
                pass
    os.makedirs(data_dir, exist_ok=True)
    try:
        os.unlink(os.path.join(data_dir, MARKER))
    except OSError:
        pass
    rel_files = list(generate(data_dir))
    write_json_atomic(os.path.join(data_dir, MARKER), {**want, "files": rel_files})
    return [os.path.join(data_dir, p) for p in rel_files], True


def write_json_atomic(path: str, obj: Any) -> None:
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def nonneg_int(s: str) -> int:
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def positive_float(s: str) -> float:
    v = float(s)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def make_parser(
    job: str, description: str, *, num_files: int, batch_size: int, workers: int, epochs: int = 3
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{job}.py",
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("dataset")
    g.add_argument(
        "--data-dir",
        default=default_data_dir(job),
        help="dataset directory; generated there (deterministically from --seed) "
        f"unless it holds a matching {MARKER} marker",
    )
    g.add_argument("--num-files", type=positive_int, default=num_files, help="number of data files")
    g.add_argument("--generate-only", action="store_true", help="generate the dataset and exit")
    g.add_argument(
        "--by-path",
        action="store_true",
        help="open files by path through the format's library (numpy.load(path), "
        "PIL.Image.open(path), h5py.File(path)) as real training code does, instead of the "
        "byte-counting unbuffered file object; bytes are then counted by the kernel",
    )
    g.add_argument(
        "--keep-open",
        action="store_true",
        help="keep one open handle per file and process instead of open/close per sample",
    )
    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=positive_int, default=batch_size, help="samples per batch")
    g.add_argument("--workers", type=nonneg_int, default=workers, help="DataLoader workers")
    g.add_argument("--epochs", type=positive_int, default=epochs, help="passes over the dataset")
    g.add_argument(
        "--mp-context",
        choices=("fork", "spawn", "forkserver"),
        default="fork",
        help="multiprocessing start method of the DataLoader workers (ignored with --workers 0)",
    )
    g.add_argument(
        "--shuffle", action=argparse.BooleanOptionalAction, default=True, help="shuffle samples"
    )
    g.add_argument(
        "--persistent-workers",
        action="store_true",
        help="keep DataLoader workers alive across epochs instead of new workers every epoch",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for data generation, init, shuffle")
    g.add_argument(
        "--compute-scale",
        type=positive_float,
        default=1.0,
        help="multiplies the model width (heavier/lighter compute per step)",
    )
    g.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    g.add_argument(
        "--threads", type=nonneg_int, default=0, help="torch intra-op threads (0 = torch default)"
    )
    g = p.add_argument_group("checkpointing / reporting")
    g.add_argument(
        "--checkpoint-every",
        type=nonneg_int,
        default=0,
        metavar="N",
        help="torch.save model+optimizer state every N global steps (0 = never)",
    )
    g.add_argument(
        "--checkpoint-every-epoch",
        action="store_true",
        help="torch.save model+optimizer state at the end of every epoch",
    )
    g.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where checkpoints go; None means <data-dir>/../checkpoints",
    )
    g.add_argument("--report", default=None, metavar="PATH", help="write a JSON report here")
    g.add_argument(
        "--fail-with",
        type=int,
        default=None,
        metavar="CODE",
        help="exit with CODE after the first epoch (report, if requested, is still written)",
    )
    g.add_argument("--quiet", action="store_true", help="no per-epoch progress lines")
    return p


def finalize_args(args: argparse.Namespace) -> argparse.Namespace:
    args.data_dir = os.path.abspath(args.data_dir)
    if args.checkpoint_dir is None:
        args.checkpoint_dir = os.path.join(os.path.dirname(args.data_dir), "checkpoints")
    args.checkpoint_dir = os.path.abspath(args.checkpoint_dir)
    if args.report is not None:
        args.report = os.path.abspath(args.report)
    return args


def scaled(width: int, scale: float) -> int:
    return max(1, int(round(width * scale)))


# --------------------------------------------------------------------------
# Training loop
# --------------------------------------------------------------------------


def make_loader(dataset: Any, args: argparse.Namespace) -> Any:
    import torch
    from torch.utils.data import DataLoader

    gen = torch.Generator()
    gen.manual_seed(args.seed)
    ctx = None
    if args.workers > 0:
        import multiprocessing as mp

        ctx = mp.get_context(args.mp_context)
    # More workers than cores is a deliberate choice here (cosmoflow default:
    # 3 workers on a 2-core box); torch's "suggested max number of worker"
    # warning (emitted at construction and at every epoch's iter()) would only
    # add noise to the captured job output.
    warnings.filterwarnings("ignore", message=r".*suggested max number of worker")
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=args.shuffle,
        num_workers=args.workers,
        multiprocessing_context=ctx,
        drop_last=False,
        generator=gen,
        persistent_workers=args.persistent_workers and args.workers > 0,
    )
    return loader


def _log(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(msg, flush=True)


def train(
    job: str,
    args: argparse.Namespace,
    dataset: Any,
    files: Iterable[str],
    model: Any,
    loss_fn: Callable[[Any, Any], Any],
    gen_seconds: float,
) -> int:
    """Run the epochs, write the report, print a summary; return the exit code.

    Each batch is ``(x, y, bytes, read_calls, pid)``; ``x``/``y`` feed the
    model, the other three are per-sample I/O accounting tensors.
    """
    import torch

    files = [os.path.abspath(f) for f in files]
    loader = make_loader(dataset, args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()

    main_pid = os.getpid()
    bytes_per_pid: dict[int, int] = {}
    calls_per_pid: dict[int, int] = {}
    step_compute: list[float] = []
    step_wait: list[float] = []
    epoch_times: list[float] = []
    losses: list[float] = []
    checkpoints: list[dict[str, Any]] = []
    samples = 0
    step = 0
    batches_per_epoch = len(loader)
    exit_code = 0
    t_start = time.perf_counter()

    for epoch in range(args.epochs):
        t_epoch = time.perf_counter()
        epoch_loss = 0.0
        it = iter(loader)
        n_batches = 0
        while True:
            t_ask = time.perf_counter()
            try:
                x, y, nbytes, ncalls, pids = next(it)
            except StopIteration:
                break
            t_recv = time.perf_counter()
            step_wait.append(t_recv - t_ask)

            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            loss_v = float(loss.detach())
            t_done = time.perf_counter()
            step_compute.append(t_done - t_recv)

            for b, c, p in zip(nbytes.tolist(), ncalls.tolist(), pids.tolist(), strict=True):
                bytes_per_pid[p] = bytes_per_pid.get(p, 0) + b
                calls_per_pid[p] = calls_per_pid.get(p, 0) + c
            samples += int(x.shape[0])
            epoch_loss += loss_v
            n_batches += 1
            step += 1

            if args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoints.append(_checkpoint(args, model, opt, step, epoch))
        del it
        if getattr(args, "checkpoint_every_epoch", False):
            checkpoints.append(_checkpoint(args, model, opt, step, epoch))
        epoch_times.append(time.perf_counter() - t_epoch)
        losses.append(epoch_loss / max(1, n_batches))
        _log(
            args,
            f"[{job}] epoch {epoch + 1}/{args.epochs}: {n_batches} steps, "
            f"mean loss {losses[-1]:.4f}, {epoch_times[-1]:.2f}s",
        )
        if args.fail_with is not None and epoch == 0:
            exit_code = args.fail_with
            break

    total_s = time.perf_counter() - t_start
    _let_queue_feeders_finish(loader)
    total_bytes = sum(bytes_per_pid.values())
    report = {
        "job": job,
        "args": vars(args),
        "epochs": len(epoch_times),
        "steps": step,
        "batches_per_epoch": batches_per_epoch,
        "samples": samples,
        "dataset_files": files,
        "dataset_bytes_read": total_bytes,
        "bytes_read_per_pid": {str(p): b for p, b in sorted(bytes_per_pid.items())},
        "dataset_read_calls": sum(calls_per_pid.values()),
        "read_calls_per_pid": {str(p): c for p, c in sorted(calls_per_pid.items())},
        "step_compute_s": step_compute,
        "step_wait_s": step_wait,
        "epoch_times_s": epoch_times,
        "epoch_mean_loss": losses,
        "checkpoints": checkpoints,
        "main_pid": main_pid,
        "train_s": total_s,
        "generate_s": gen_seconds,
        "exit_code": exit_code,
    }
    if args.report:
        write_json_atomic(args.report, report)

    rate = samples / total_s if total_s > 0 else math.inf
    compute = sum(step_compute)
    print(
        f"[{job}] done: {len(epoch_times)} epochs, {step} steps, {samples} samples in "
        f"{total_s:.2f}s ({rate:.1f} samples/s; compute {compute:.2f}s, "
        f"data wait {sum(step_wait):.2f}s); dataset bytes read {total_bytes} "
        f"in {report['dataset_read_calls']} read calls by {len(bytes_per_pid)} pid(s); "
        f"{len(checkpoints)} checkpoint(s)"
        + (f"; exiting with --fail-with {exit_code}" if exit_code else ""),
        flush=True,
    )
    return exit_code


def _let_queue_feeders_finish(loader: Any, timeout: float = 10.0) -> None:
    """Stop the loader's workers; wait (up to ``timeout`` seconds) for its queue feeders.

    With the ``spawn``/``forkserver`` start methods each multiprocessing queue
    holds named semaphores; the last reference to them is often dropped by the
    queue's daemon feeder thread as it ends, which unlinks the semaphore and
    then tells the resource tracker.  If the interpreter exits in between, the
    daemon thread is frozen, and the tracker prints "leaked semaphore objects"
    at shutdown.  Joining the feeders, then collecting, makes the exit clean.
    """
    import gc
    import threading

    # Persistent workers live until the loader's iterator is shut down.
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
        loader._iterator = None
    deadline = time.monotonic() + timeout
    for t in threading.enumerate():
        if t.name == "QueueFeederThread" and t is not threading.current_thread():
            t.join(max(0.0, deadline - time.monotonic()))
    gc.collect()


def _checkpoint(args: argparse.Namespace, model: Any, opt: Any, step: int, epoch: int) -> dict:
    import torch

    os.makedirs(args.checkpoint_dir, exist_ok=True)
    path = os.path.join(args.checkpoint_dir, f"ckpt_step{step:06d}.pt")
    t0 = time.perf_counter()
    torch.save(
        {
            "step": step,
            "epoch": epoch,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
        },
        path,
    )
    dt = time.perf_counter() - t0
    return {"path": path, "bytes": os.path.getsize(path), "step": step, "seconds": dt}


def main_wrapper(
    job: str,
    args: argparse.Namespace,
    params: dict[str, Any],
    generate: Callable[[str], Sequence[str]],
    build: Callable[[list[str]], tuple[Any, Any, Callable[[Any, Any], Any]]],
) -> int:
    """Generate (if needed) then train.

    ``build(files) -> (dataset, model, loss_fn)``.
    """
    finalize_args(args)
    t0 = time.perf_counter()
    files, generated = ensure_dataset(args.data_dir, job, params, generate)
    gen_s = time.perf_counter() - t0
    nbytes = sum(os.path.getsize(f) for f in files)
    print(
        f"[{job}] dataset {args.data_dir}: {len(files)} files, {nbytes} bytes "
        + (f"(generated in {gen_s:.2f}s)" if generated else "(reused)"),
        flush=True,
    )
    if args.generate_only:
        return 0

    import torch

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    dataset, model, loss_fn = build(files)
    return train(job, args, dataset, files, model, loss_fn, gen_s if generated else 0.0)


def run(main: Callable[[], int]) -> None:
    """Call ``main`` and exit with its code (flushing stdio first)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


__all__ = [
    "CountedRead",
    "CountingFileIO",
    "Opener",
    "ensure_dataset",
    "io_counters",
    "io_tensors",
    "main_wrapper",
    "make_parser",
    "run",
    "scaled",
    "write_json_atomic",
]
