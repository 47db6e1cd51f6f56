"""``dlreplay generate``: write a dataset with the workload model's shape.

Files are written with the formats' real libraries (see :mod:`.formats`), in
parallel over a process pool, each through a temporary name then renamed. A
journal (``.dlreplay-dataset.partial.json``) lists the files finished so far, so an
interrupted generation resumes; the manifest (``.dlreplay-dataset.json``,
``complete: true``) is written last and atomically, and only a directory with a
complete manifest for the same dataset digest is ever taken as ready.

Generation refuses a non-empty directory that holds no dlreplay manifest or journal,
and only ever deletes files it created (its temporary files, or with ``force`` the
files listed in its own manifest/journal).

Test-only hook: with ``DLREPLAY_TEST_GENERATE_HOLD=N`` in the environment, generation
stops after N finished files, writes the journal, prints ``generate held after N files``
on stderr and waits there (at most :data:`HOLD_MAX_S`) for Ctrl-C. The Ctrl-C tests use
it so that the interrupt lands mid-generation on a machine of any speed; nothing else
sets it.
"""

from __future__ import annotations

import datetime as _dt
import errno
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import dlreplay
from dlreplay.interrupt import INTERRUPT
from dlreplay.model import Layout, WorkloadModel, model_to_dict
from dlreplay.osutil import host_memory_bytes

from .common import (
    DATASET_FORMAT_VERSION,
    DATASET_SCHEMA,
    JOURNAL_NAME,
    MANIFEST_NAME,
    TMP_SUFFIX,
    FileSpec,
    ReplayError,
    dataset_digest,
    plan_dataset,
    read_json,
    write_json_atomic,
)
from .writers import write_file

#: Test-only: the environment variable that holds generation after N files (see the module docstring).
HOLD_ENV = "DLREPLAY_TEST_GENERATE_HOLD"
#: Seconds a held generation waits for Ctrl-C before it goes on (a test never hangs for good).
HOLD_MAX_S = 300.0

#: Dataset bytes per byte of host RAM below which reads are served from page cache (MLPerf Storage: 5x).
CACHE_FACTOR = 5


@dataclass(frozen=True)
class GenerateConfig:
    """What to generate: *model*'s dataset into *data_dir*, sizes drawn with *seed*.

    ``jobs``: generator processes (None = min(4, CPUs)); ``force``: replace a dlreplay
    dataset of another model/seed in *data_dir* (only files dlreplay listed as its own);
    ``progress``: None = a progress line when stderr is a TTY.
    """

    model: WorkloadModel
    data_dir: Path
    seed: int = 0
    jobs: int | None = None
    force: bool = False
    progress: bool | None = None


@dataclass(frozen=True)
class GenerateResult:
    """Outcome: file count, bytes (all files), files written now vs reused, seconds, warnings."""

    data_dir: Path
    files: int
    total_bytes: int
    generated: int
    reused: int
    seconds: float
    warnings: tuple[str, ...] = field(default_factory=tuple)
    manifest: dict[str, Any] = field(default_factory=dict, compare=False)


def _write_one(fmt: str, data_dir: str, spec: FileSpec, layout: Layout, seed: int) -> dict[str, Any]:
    """Generate one file (runs in a pool process). OS errors become ReplayError naming the path."""
    path = Path(data_dir) / spec.relpath
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, spec.index, 0xDA7A])
        written = write_file(fmt, path, spec.sizes, layout, rng)
    except ReplayError:
        raise
    except Exception as exc:  # OSError, or a library's own error (polars: ComputeError on a full disk)
        for tmp in (path.with_name(f".{path.name}{TMP_SUFFIX}"), path.with_name(f".{path.name}.idx{TMP_SUFFIX}")):
            tmp.unlink(missing_ok=True)  # our partial temporary file: it may hold the space that is missing
        raise _write_error(exc, path, sum(spec.sizes)) from None
    entry: dict[str, Any] = {"path": spec.relpath, "bytes": written.bytes, "samples": len(spec.sizes)}
    if written.records is not None:
        entry["records"] = written.records
    if written.aux_bytes:
        entry["aux_bytes"] = written.aux_bytes
    if written.structure is not None:
        entry["structure"] = written.structure
    if written.notes:
        entry["writer"] = written.notes[0]
    return entry


def _write_error(exc: Exception, path: Path, need: int) -> ReplayError:
    """A message naming *path* for a failed file write; says so when the disk is full.

    numpy (``np.save``: "200000 requested and 81792 written") and polars report a full
    disk without ``errno``, so free space is checked too.
    """
    code = getattr(exc, "errno", None)
    name = getattr(exc, "filename", None)
    where = name if name and TMP_SUFFIX not in str(name) else path
    if code == errno.ENOSPC or "No space left" in str(exc) or _free_bytes(path) < need:
        return ReplayError(f"{where}: no space left on the device while generating the dataset; free space "
                           f"or choose another --data-dir (rerun resumes where it stopped)")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ReplayError(f"{where}: permission denied while generating the dataset; choose a writable "
                           f"--data-dir")
    if isinstance(exc, OSError):
        return ReplayError(f"{where}: cannot write ({exc.strerror or exc})")
    return ReplayError(f"{where}: cannot write ({type(exc).__name__}: {exc})")


def _free_bytes(path: Path) -> float:
    """Bytes available to this user on the file system of *path* (its nearest existing parent)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return float("inf")
    return st.f_bavail * st.f_frsize


def _pool_worker_init() -> None:
    """Generator processes ignore Ctrl-C: the parent stops the pool (they finish their file)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _submit_blocked(pool: ProcessPoolExecutor, *args: Any) -> Future:
    """``pool.submit`` with SIGINT blocked in this thread: a generator process it starts
    inherits the mask, so a terminal Ctrl-C cannot hit it before it ignores SIGINT."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(*args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _owned_paths(doc: dict[str, Any]) -> list[str]:
    out = []
    for e in doc.get("files", []) if isinstance(doc.get("files"), list) else (doc.get("files") or {}).values():
        out.append(e["path"])
        if e.get("aux_bytes"):
            out.append(e["path"] + ".idx")
    return out


def _remove_owned(data_dir: Path, doc: dict[str, Any], plan: list[FileSpec]) -> None:
    """Delete files a previous dlreplay generation created here (listed in its manifest/journal or planned)."""
    names = set(_owned_paths(doc))
    for rel in names:
        for p in (data_dir / rel,):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


def _hold_after() -> int | None:
    """N from ``DLREPLAY_TEST_GENERATE_HOLD`` (test-only), or None when unset or not a positive integer."""
    value = os.environ.get(HOLD_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _hold(files: int) -> None:
    """Test-only: wait for Ctrl-C (KeyboardInterrupt) for at most :data:`HOLD_MAX_S` seconds."""
    sys.stderr.write(f"generate held after {files} files ({HOLD_ENV}); waiting for Ctrl-C\n")
    sys.stderr.flush()
    deadline = time.monotonic() + HOLD_MAX_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
        INTERRUPT.check()


def _clean_tmp(data_dir: Path) -> None:
    for p in data_dir.rglob(f"*{TMP_SUFFIX}"):
        try:
            p.unlink()
        except OSError:
            pass


def dataset_status(model: WorkloadModel, data_dir: Path, seed: int) -> str:
    """``ready`` (complete manifest for this dataset), ``partial``, ``other`` (another dataset),
    ``foreign`` (non-empty, not dlreplay's), ``empty`` (missing or empty)."""
    data_dir = Path(data_dir)
    manifest = read_json(data_dir / MANIFEST_NAME)
    journal = read_json(data_dir / JOURNAL_NAME)
    digest = dataset_digest(model)
    if manifest and manifest.get("schema") == DATASET_SCHEMA:
        same = manifest.get("model_digest") == digest and manifest.get("seed") == seed
        if manifest.get("complete") is True and same:
            return "ready"
        if not same:
            return "other"
        return "partial"
    if journal and journal.get("schema") == DATASET_SCHEMA:
        same = journal.get("model_digest") == digest and journal.get("seed") == seed
        return "partial" if same else "other"
    if data_dir.is_dir() and any(data_dir.iterdir()):
        return "foreign"
    if data_dir.exists() and not data_dir.is_dir():
        return "foreign"
    return "empty"


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.last = total, enabled, 0.0

    def update(self, done: int, nbytes: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < 0.2):
            return
        self.last = now
        width = 30
        filled = int(width * done / max(self.total, 1))
        sys.stderr.write(f"\rgenerating [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} files "
                         f"{nbytes / 2**20:,.1f} MiB ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def generate_dataset(config: GenerateConfig, echo: Callable[[str], None] | None = None) -> GenerateResult:
    """Generate (or resume, or reuse) the dataset of ``config.model`` in ``config.data_dir``.

    Raises :class:`ReplayError` for a foreign non-empty directory, a dlreplay dataset of
    another model/seed (without ``force``), disk full and permission errors (naming the path).
    On KeyboardInterrupt the journal stays and no complete manifest is written.
    """
    t0 = time.perf_counter()
    model, data_dir, seed = config.model, Path(config.data_dir), config.seed
    plan = plan_dataset(model, seed)
    digest = dataset_digest(model)
    status = dataset_status(model, data_dir, seed)
    if status == "foreign":
        raise ReplayError(
            f"{data_dir} is not empty and holds no dlreplay dataset ({MANIFEST_NAME}); generate refuses to "
            f"write there so it never mixes with or deletes files it did not create. Choose an empty or new "
            f"--data-dir.")
    if status == "other":
        if not config.force:
            raise ReplayError(
                f"{data_dir} holds a dlreplay dataset generated for another model shape or seed; pass --force to "
                f"replace it (only files dlreplay created are deleted) or choose another --data-dir.")
        old = read_json(data_dir / MANIFEST_NAME) or read_json(data_dir / JOURNAL_NAME) or {}
        (data_dir / MANIFEST_NAME).unlink(missing_ok=True)
        _remove_owned(data_dir, old, plan)
        (data_dir / JOURNAL_NAME).unlink(missing_ok=True)
        _clean_tmp(data_dir)
        status = "empty"
    warnings: list[str] = []
    if status == "ready":
        manifest = read_json(data_dir / MANIFEST_NAME) or {}
        total = int(manifest.get("total_bytes", 0))
        warnings.extend(cache_warnings(total))
        return GenerateResult(data_dir=data_dir, files=len(plan), total_bytes=total, generated=0,
                              reused=len(plan), seconds=time.perf_counter() - t0, warnings=tuple(warnings),
                              manifest=manifest)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReplayError(f"{data_dir}: cannot create the data directory ({exc.strerror or exc})") from None
    if not os.access(data_dir, os.W_OK):
        raise ReplayError(f"{data_dir}: permission denied (not writable); choose a writable --data-dir")
    (data_dir / MANIFEST_NAME).unlink(missing_ok=True)  # an incomplete manifest is never trusted
    _clean_tmp(data_dir)

    journal = read_json(data_dir / JOURNAL_NAME) if status == "partial" else None
    done: dict[str, dict[str, Any]] = {}
    if journal:
        for rel, entry in (journal.get("files") or {}).items():
            p = data_dir / rel
            ok = p.is_file() and p.stat().st_size == entry.get("bytes")
            if ok and entry.get("aux_bytes"):
                idx = data_dir / (rel + ".idx")
                ok = idx.is_file() and idx.stat().st_size == entry["aux_bytes"]
            if ok:
                done[rel] = entry
    header = {"schema": DATASET_SCHEMA, "format_version": DATASET_FORMAT_VERSION, "model_digest": digest,
              "seed": seed, "format": model.dataset.format, "complete": False}
    journal_path = data_dir / JOURNAL_NAME
    write_json_atomic(journal_path, {**header, "files": done})
    todo = [s for s in plan if s.relpath not in done]
    jobs = config.jobs or min(4, os.cpu_count() or 1)
    show = sys.stderr.isatty() if config.progress is None else config.progress
    progress = _Progress(len(plan), show)
    written_bytes = sum(int(e["bytes"]) for e in done.values())
    last_journal = time.monotonic()
    hold = _hold_after()

    def record(entry: dict[str, Any]) -> None:
        nonlocal written_bytes, last_journal
        done[entry["path"]] = entry
        written_bytes += int(entry["bytes"])
        INTERRUPT.check()  # a Ctrl-C whose KeyboardInterrupt was swallowed (see dlreplay.interrupt)
        progress.update(len(done), written_bytes)
        if time.monotonic() - last_journal > 0.5 or len(done) == hold:
            write_json_atomic(journal_path, {**header, "files": done})
            last_journal = time.monotonic()
        if len(done) == hold:
            _hold(len(done))

    fmt, layout = model.dataset.format, model.dataset.layout
    try:
        if jobs <= 1 or len(todo) <= 1:
            for spec in todo:
                record(_write_one(fmt, str(data_dir), spec, layout, seed))
        else:
            # spawn, not fork: a parent that has used polars (its Rust thread pool) deadlocks
            # forked children that use polars again (csv/parquet writers).
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_pool_worker_init) as pool:
                pending: set[Future] = set()
                it = iter(todo)
                try:
                    for spec in it:
                        pending.add(_submit_blocked(pool, _write_one, fmt, str(data_dir), spec, layout, seed))
                        if len(pending) >= 2 * jobs:
                            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                            for f in finished:
                                record(f.result())
                    for f in list(pending):
                        record(f.result())
                        pending.discard(f)
                except BaseException:
                    for f in pending:
                        f.cancel()
                    raise
    except BaseException:
        progress.update(len(done), written_bytes, force=True)
        progress.close()
        try:  # keep what is done for the rerun; never hide the original error (e.g. disk full)
            write_json_atomic(journal_path, {**header, "files": done})
        except ReplayError:
            pass
        raise
    progress.update(len(done), written_bytes, force=True)
    progress.close()
    write_json_atomic(journal_path, {**header, "files": done})

    INTERRUPT.check()  # never mark a dataset complete after a Ctrl-C
    files = [done[s.relpath] for s in plan]
    total = sum(int(e["bytes"]) + int(e.get("aux_bytes", 0)) for e in files)
    manifest = {
        **header,
        "dlreplay_version": dlreplay.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "num_files": len(plan),
        "num_samples_per_file": model.dataset.num_samples_per_file,
        "total_bytes": total,
        "layout": layout_written(model, files),
        "files": [{k: v for k, v in e.items() if k != "writer"} for e in files],
        "complete": True,
    }
    write_json_atomic(data_dir / MANIFEST_NAME, manifest)
    journal_path.unlink(missing_ok=True)
    warnings.extend(cache_warnings(total))
    return GenerateResult(data_dir=data_dir, files=len(plan), total_bytes=total, generated=len(todo),
                          reused=len(plan) - len(todo), seconds=time.perf_counter() - t0,
                          warnings=tuple(warnings), manifest=manifest)


def layout_written(model: WorkloadModel, files: list[dict[str, Any]]) -> dict[str, Any]:
    """What the dataset's files look like inside: the model's layout, how many files got
    each of its structures, and the writers (libraries and versions) that wrote them."""
    layout = model_to_dict(model)["dataset"].get("layout") or {}
    structures = Counter(e.get("structure") for e in files if e.get("structure") is not None)
    writers = Counter(e.get("writer") for e in files if e.get("writer"))
    out: dict[str, Any] = {"source": layout.get("source") or "plan (no layout: random bytes of the plan's sizes)",
                           "model_layout": layout}
    if structures:
        out["files_per_structure"] = {str(k): v for k, v in sorted(structures.items())}
    if writers:
        out["writers"] = dict(writers)
    return out


def cache_warnings(total_bytes: int) -> list[str]:
    """A warning when *total_bytes* of dataset would fit in page cache (< 5 x host RAM)."""
    ram = host_memory_bytes()
    if ram and total_bytes < CACHE_FACTOR * ram:
        return [f"the dataset ({total_bytes / 1e9:.3g} GB) is smaller than {CACHE_FACTOR}x host RAM "
                f"({ram / 1e9:.3g} GB): reads will be served from memory (page cache), so storage results are "
                f"not meaningful (MLPerf Storage requires a dataset >= {CACHE_FACTOR}x RAM)."]
    return []
