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

Test-only hook: with ``DLREPLAY_TEST_GENERATE_HOLD=N`` (or ``N:PATH``) in the environment,
generation stops after N finished files, writes the journal, prints ``generate held after N
files`` on stderr and waits there for Ctrl-C (or until the file PATH exists, then goes on;
at most :data:`HOLD_MAX_S`). Tests use it so that a Ctrl-C, or a disk filling up, lands
mid-generation on a machine of any speed; nothing else sets it.
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
from dlreplay.osutil import (
    DirectoryClaim,
    claim_directory,
    confined_path,
    end_with_parent,
    host_memory_bytes,
    is_empty_dir,
)

from .common import (
    DATASET_FORMAT_VERSION,
    DATASET_SCHEMA,
    JOURNAL_NAME,
    MANIFEST_NAME,
    TMP_SUFFIX,
    FileSpec,
    ReplayError,
    aux_files,
    check_generate_resources,
    dataset_digest,
    file_problems,
    listed_files,
    plan_dataset,
    read_json,
    write_json_atomic,
)
from .s3 import uploaded
from .writers import AUX_SUFFIXES, write_file

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


def _write_one(
    fmt: str, data_dir: str, spec: FileSpec, layout: Layout, seed: int
) -> dict[str, Any]:
    """Generate one file (runs in a pool process). OS errors become ReplayError naming the path."""
    path = Path(data_dir) / spec.relpath
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, spec.index, 0xDA7A])
        written = write_file(fmt, path, spec.sizes, layout, rng)
    except ReplayError:
        raise
    except (
        Exception
    ) as exc:  # OSError, or a library's own error (polars: ComputeError on a full disk)
        for tmp in (
            path.with_name(f".{path.name}{suffix}{TMP_SUFFIX}") for suffix in ("", *AUX_SUFFIXES)
        ):
            tmp.unlink(
                missing_ok=True
            )  # our partial temporary file: it may hold the space that is missing
        raise _write_error(exc, path, sum(spec.sizes)) from None
    entry: dict[str, Any] = {
        "path": spec.relpath,
        "bytes": written.bytes,
        "samples": len(spec.sizes),
    }
    if written.records is not None:
        entry["records"] = written.records
    if written.aux_bytes:
        entry["aux_bytes"] = written.aux_bytes
    if written.aux:
        entry["aux"] = written.aux
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
        return ReplayError(
            f"{where}: no space left on the device while generating the dataset; free space "
            f"or choose another --data-dir (rerun resumes where it stopped)"
        )
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ReplayError(
            f"{where}: permission denied while generating the dataset; choose a writable --data-dir"
        )
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
    """Generator processes ignore Ctrl-C: the parent stops the pool (they finish their file).
    They end with the parent when it is killed instead (``kill -9``, or a signal that ends
    it without its handlers): an idle pool process waits on its task queue, which it holds
    open itself, so it would otherwise stay behind for good."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    end_with_parent()


def _submit_blocked(pool: ProcessPoolExecutor, *args: Any) -> Future:
    """``pool.submit`` with SIGINT blocked in this thread: a generator process it starts
    inherits the mask, so a terminal Ctrl-C cannot hit it before it ignores SIGINT."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(*args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _remove_owned(data_dir: Path, listed: dict[str, dict[str, Any]]) -> None:
    """Delete the files a previous dlreplay generation listed as its own (paths already confined).

    Only regular files and symbolic links are removed (a link itself, never its target).
    """
    for rel, entry in listed.items():
        for name in (rel, *(rel + suffix for suffix in aux_files(entry))):
            p = data_dir / name
            if p.is_symlink() or p.is_file():
                p.unlink(missing_ok=True)


def _hold_after() -> tuple[int, Path | None] | None:
    """(N, release file) from ``DLREPLAY_TEST_GENERATE_HOLD`` (test-only), or None when unset or malformed."""
    count, _, release = os.environ.get(HOLD_ENV, "").partition(":")
    if not count.isdigit() or int(count) <= 0:
        return None
    return int(count), Path(release) if release else None


def _hold(files: int, release: Path | None) -> None:
    """Test-only: wait for Ctrl-C (KeyboardInterrupt) or *release* to exist, at most :data:`HOLD_MAX_S` seconds."""
    sys.stderr.write(f"generate held after {files} files ({HOLD_ENV}); waiting for Ctrl-C\n")
    sys.stderr.flush()
    deadline = time.monotonic() + HOLD_MAX_S
    while time.monotonic() < deadline and not (release is not None and release.exists()):
        time.sleep(0.05)
        INTERRUPT.check()


def _clean_tmp(data_dir: Path) -> None:
    for p in data_dir.rglob(f"*{TMP_SUFFIX}"):
        try:
            p.unlink()
        except OSError:
            pass


def dataset_status(model: WorkloadModel, data_dir: Path, seed: int) -> str:
    """``ready`` (complete manifest for this dataset, every file at its listed size), ``damaged``
    (complete manifest, but files missing or of another size since), ``partial``, ``other``
    (another dataset), ``foreign`` (non-empty, not dlreplay's), ``empty`` (missing or empty).

    Raises (naming the file) when the manifest or journal lists a path outside *data_dir*.
    """
    data_dir = Path(data_dir)
    manifest = read_json(data_dir / MANIFEST_NAME)
    journal = read_json(data_dir / JOURNAL_NAME)
    digest = dataset_digest(model)
    if manifest and manifest.get("schema") == DATASET_SCHEMA:
        same = manifest.get("model_digest") == digest and manifest.get("seed") == seed
        if manifest.get("complete") is True and same:
            files = listed_files(data_dir, manifest, data_dir / MANIFEST_NAME)
            return "damaged" if file_problems(data_dir, files) else "ready"
        if not same:
            return "other"
        return "partial"
    if journal and journal.get("schema") == DATASET_SCHEMA:
        same = journal.get("model_digest") == digest and journal.get("seed") == seed
        return "partial" if same else "other"
    if not is_empty_dir(data_dir):
        return "foreign"
    return "empty"


def _claim(data_dir: Path) -> DirectoryClaim:
    """Claim *data_dir* for this generation (one writer per directory), creating it if needed."""
    if data_dir.exists() and not data_dir.is_dir():
        raise ReplayError(f"{data_dir} exists and is not a directory; choose another --data-dir")
    try:
        return claim_directory(data_dir, "--data-dir")
    except OSError as exc:
        raise ReplayError(
            f"{data_dir}: cannot create the data directory ({exc.strerror or exc})"
        ) from None


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
        sys.stderr.write(
            f"\rgenerating [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} files "
            f"{nbytes / 2**20:,.1f} MiB "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def generate_dataset(
    config: GenerateConfig, echo: Callable[[str], None] | None = None
) -> GenerateResult:
    """Generate (or resume, or reuse) the dataset of ``config.model`` in ``config.data_dir``.

    Raises :class:`ReplayError` for a foreign non-empty directory, a dlreplay dataset of
    another model/seed (without ``force``), disk full and permission errors (naming the path).
    On KeyboardInterrupt the journal stays and no complete manifest is written.
    """
    t0 = time.perf_counter()
    plan_dataset(
        config.model, config.seed
    )  # a model without a dataset plan fails before anything is created
    if dataset_status(config.model, Path(config.data_dir), config.seed) == "ready":
        return uploaded(_generate(config, t0), config.model)  # reuse only reads: no claim
    data_dir = Path(config.data_dir)
    created = not data_dir.exists()
    try:
        with _claim(
            data_dir
        ):  # status again under the claim: another writer may just have finished
            return uploaded(_generate(config, t0), config.model)
    except BaseException:
        if created:  # refused before writing anything: leave no empty directory behind
            try:
                data_dir.rmdir()
            except OSError:
                pass
        raise


def _generate(config: GenerateConfig, t0: float) -> GenerateResult:
    model, data_dir, seed = config.model, Path(config.data_dir), config.seed
    plan = plan_dataset(model, seed)
    digest = dataset_digest(model)
    status = dataset_status(model, data_dir, seed)
    if status in ("foreign", "other"):
        status = _replace_other(data_dir, status, config.force)
    if status == "ready":
        return _reused(data_dir, len(plan), t0)
    _make_writable(data_dir)
    done, warnings = _reusable(data_dir, plan, status)
    jobs = config.jobs or min(4, os.cpu_count() or 1)
    check_generate_resources(
        model,
        data_dir,
        jobs,
        reusable_bytes=sum(int(e["bytes"]) for e in done.values()),
        reusable_files=len(done),
    )
    (data_dir / MANIFEST_NAME).unlink(missing_ok=True)  # an incomplete manifest is never trusted
    _clean_tmp(data_dir)
    header = {
        "schema": DATASET_SCHEMA,
        "format_version": DATASET_FORMAT_VERSION,
        "model_digest": digest,
        "seed": seed,
        "format": model.dataset.format,
        "complete": False,
    }
    journal_path = data_dir / JOURNAL_NAME
    write_json_atomic(journal_path, {**header, "files": done})
    todo = [s for s in plan if s.relpath not in done]
    show = sys.stderr.isatty() if config.progress is None else config.progress
    journal = _Journal(journal_path, header, done, _Progress(len(plan), show))
    _write_journaled(todo, model, data_dir, seed, jobs, journal)

    INTERRUPT.check()  # never mark a dataset complete after a Ctrl-C
    side = _write_side_files(model, data_dir, seed, {s.relpath for s in plan})
    INTERRUPT.check()
    files = [done[s.relpath] for s in plan]
    total = sum(int(e["bytes"]) + int(e.get("aux_bytes", 0)) for e in files)
    total += sum(e["bytes"] for e in side)
    manifest = _manifest(header, model, files, total)
    if side:
        manifest["side_files"] = side
    write_json_atomic(data_dir / MANIFEST_NAME, manifest)
    journal_path.unlink(missing_ok=True)
    warnings.extend(cache_warnings(total))
    return GenerateResult(
        data_dir=data_dir,
        files=len(plan),
        total_bytes=total,
        generated=len(todo),
        reused=len(plan) - len(todo),
        seconds=time.perf_counter() - t0,
        warnings=tuple(warnings),
        manifest=manifest,
    )


def _write_side_files(
    model: WorkloadModel, data_dir: Path, seed: int, planned: set[str]
) -> list[dict[str, Any]]:
    """Write the model's ``dataset.side_files`` (seeded random bytes of each one's size, each
    through a temporary file) in *data_dir*; returns their manifest entries (path, bytes)."""
    entries: list[dict[str, Any]] = []
    for k, sf in enumerate(model.dataset.side_files or []):
        if sf.path in planned:
            raise ReplayError(
                f"dataset.side_files lists {sf.path!r}, which is also one of the dataset's files; "
                "remove it from side_files"
            )
        path = confined_path(data_dir, sf.path, "the model's dataset.side_files")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
        rng = np.random.default_rng([seed, 1 << 20, k])
        try:
            with open(tmp, "wb") as fh:
                left = sf.size
                while left:
                    n = min(left, 1 << 20)
                    fh.write(rng.bytes(n))
                    left -= n
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        entries.append({"path": sf.path, "bytes": sf.size})
    return entries


def _reused(data_dir: Path, files: int, t0: float) -> GenerateResult:
    """The result for a ready dataset of *files* files in *data_dir*, reused as it is."""
    manifest = read_json(data_dir / MANIFEST_NAME) or {}
    total = int(manifest.get("total_bytes", 0))
    return GenerateResult(
        data_dir=data_dir,
        files=files,
        total_bytes=total,
        generated=0,
        reused=files,
        seconds=time.perf_counter() - t0,
        warnings=tuple(cache_warnings(total)),
        manifest=manifest,
    )


def _make_writable(data_dir: Path) -> None:
    """Create *data_dir* when missing; ReplayError when it cannot be created or written."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReplayError(
            f"{data_dir}: cannot create the data directory ({exc.strerror or exc})"
        ) from None
    if not os.access(data_dir, os.W_OK):
        raise ReplayError(
            f"{data_dir}: permission denied (not writable); choose a writable --data-dir"
        )


def _write_journaled(
    todo: list[FileSpec],
    model: WorkloadModel,
    data_dir: Path,
    seed: int,
    jobs: int,
    journal: _Journal,
) -> None:
    """Write the files *todo* on *jobs* processes, each recorded in *journal* as it finishes;
    the journal is written last, also when the writing stops early (for the rerun)."""
    try:
        _write_files(
            todo, model.dataset.format, data_dir, model.dataset.layout, seed, jobs, journal.record
        )
    except BaseException:
        journal.close()
        try:  # keep what is done for the rerun; never hide the original error (e.g. disk full)
            journal.write()
        except ReplayError:
            pass
        raise
    journal.close()
    journal.write()


def _manifest(
    header: dict[str, Any], model: WorkloadModel, files: list[dict[str, Any]], total: int
) -> dict[str, Any]:
    """The complete dataset's manifest: *header*, then the dataset's files (their entries in
    plan order) and what was written."""
    return {
        **header,
        "dlreplay_version": dlreplay.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "num_files": len(files),
        "num_samples_per_file": model.dataset.num_samples_per_file,
        "total_bytes": total,
        "layout": layout_written(model, files),
        "files": [{k: v for k, v in e.items() if k != "writer"} for e in files],
        "complete": True,
    }


def _replace_other(data_dir: Path, status: str, force: bool) -> str:
    """Refuse a foreign directory, and another dlreplay dataset unless *force*; with *force*,
    delete that dataset's own files (every listed path checked first). Returns the new status."""
    if status == "foreign":
        raise ReplayError(
            f"{data_dir} is not empty and holds no dlreplay dataset ({MANIFEST_NAME}); generate refuses to "
            f"write there so it never mixes with or deletes files it did not create. Choose an empty or new "
            f"--data-dir."
        )
    if not force:
        raise ReplayError(
            f"{data_dir} holds a dlreplay dataset generated for another model shape or seed; pass --force to "
            f"replace it (only files dlreplay created are deleted) or choose another --data-dir."
        )
    listed: dict[str, dict[str, Any]] = {}
    for name in (
        MANIFEST_NAME,
        JOURNAL_NAME,
    ):  # every listed path checked before anything is deleted
        doc = read_json(data_dir / name)
        if doc and doc.get("schema") == DATASET_SCHEMA:
            listed.update(listed_files(data_dir, doc, data_dir / name))
    (data_dir / MANIFEST_NAME).unlink(missing_ok=True)
    _remove_owned(data_dir, listed)
    (data_dir / JOURNAL_NAME).unlink(missing_ok=True)
    _clean_tmp(data_dir)
    return "empty"


def _reusable(
    data_dir: Path, plan: list[FileSpec], status: str
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(the files an earlier run finished that are kept, warnings): the journal of an interrupted
    run, or the manifest of a complete one whose files were deleted or truncated since
    ("damaged"); each file is kept only at its listed size, and only when the plan still has it."""
    source = data_dir / (MANIFEST_NAME if status == "damaged" else JOURNAL_NAME)
    earlier = read_json(source) if status in ("partial", "damaged") else None
    listed = listed_files(data_dir, earlier, source) if earlier else {}
    planned = {s.relpath for s in plan}
    listed = {rel: e for rel, e in listed.items() if rel in planned}
    broken = file_problems(data_dir, listed)
    done: dict[str, dict[str, Any]] = {rel: e for rel, e in listed.items() if rel not in broken}
    warnings: list[str] = []
    if status == "damaged":
        warnings.append(
            f"{len(broken)} file(s) of the dataset in {data_dir} were missing or had changed size since "
            f"it was generated (e.g. {'; '.join(list(broken.values())[:3])}): regenerated them"
        )
    return done, warnings


class _Journal:
    """The files finished so far (*done*, updated in place), written to the journal at most every
    half second and when a test hold is reached; the progress line follows them."""

    def __init__(
        self,
        path: Path,
        header: dict[str, Any],
        done: dict[str, dict[str, Any]],
        progress: _Progress,
    ) -> None:
        self.path, self.header, self.done, self.progress = path, header, done, progress
        self.written_bytes = sum(int(e["bytes"]) for e in done.values())
        self.last_write = time.monotonic()
        self.hold = _hold_after()

    def record(self, entry: dict[str, Any]) -> None:
        """One more file finished."""
        done = self.done
        done[entry["path"]] = entry
        self.written_bytes += int(entry["bytes"])
        INTERRUPT.check()  # a Ctrl-C whose KeyboardInterrupt was swallowed (see dlreplay.interrupt)
        self.progress.update(len(done), self.written_bytes)
        held = self.hold is not None and len(done) == self.hold[0]
        if time.monotonic() - self.last_write > 0.5 or held:
            self.write()
            self.last_write = time.monotonic()
        if held and self.hold is not None:
            _hold(len(done), self.hold[1])

    def write(self) -> None:
        write_json_atomic(self.path, {**self.header, "files": self.done})

    def close(self) -> None:
        """The progress line's last state."""
        self.progress.update(len(self.done), self.written_bytes, force=True)
        self.progress.close()


def _write_files(
    todo: list[FileSpec],
    fmt: str,
    data_dir: Path,
    layout: Layout,
    seed: int,
    jobs: int,
    record: Callable[[dict[str, Any]], None],
) -> None:
    """Write the files of *todo*, in *jobs* processes; *record* is called with each one's entry."""
    if jobs <= 1 or len(todo) <= 1:
        for spec in todo:
            record(_write_one(fmt, str(data_dir), spec, layout, seed))
        return
    # spawn, not fork: a parent that has used polars (its Rust thread pool) deadlocks
    # forked children that use polars again (csv/parquet writers).
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=ctx, initializer=_pool_worker_init
    ) as pool:
        pending: set[Future] = set()
        it = iter(todo)
        try:
            for spec in it:
                pending.add(
                    _submit_blocked(pool, _write_one, fmt, str(data_dir), spec, layout, seed)
                )
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


def layout_written(model: WorkloadModel, files: list[dict[str, Any]]) -> dict[str, Any]:
    """What the dataset's files look like inside: the model's layout, how many files got
    each of its structures, and the writers (libraries and versions) that wrote them."""
    layout = model_to_dict(model)["dataset"].get("layout") or {}
    structures = Counter(e.get("structure") for e in files if e.get("structure") is not None)
    writers = Counter(e.get("writer") for e in files if e.get("writer"))
    out: dict[str, Any] = {
        "source": layout.get("source") or "plan (no layout: random bytes of the plan's sizes)",
        "model_layout": layout,
    }
    if structures:
        out["files_per_structure"] = {str(k): v for k, v in sorted(structures.items())}
    if writers:
        out["writers"] = dict(writers)
    return out


def cache_warnings(total_bytes: int) -> list[str]:
    """A warning when *total_bytes* of dataset would fit in page cache (< 5 x host RAM)."""
    ram = host_memory_bytes()
    if ram and total_bytes < CACHE_FACTOR * ram:
        return [
            f"the dataset ({total_bytes / 1e9:.3g} GB) is smaller than {CACHE_FACTOR}x host RAM "
            f"({ram / 1e9:.3g} GB): reads will be served from memory (page cache), so storage results are "
            f"not meaningful (MLPerf Storage requires a dataset >= {CACHE_FACTOR}x RAM)."
        ]
    return []
