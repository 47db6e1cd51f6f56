"""Run a command under DFTracer and keep its trace as a dlreplay trace directory."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dlreplay
from dlreplay.capture.inject.hooks import EXTENSIONS, MISSES_ENV, MISSES_PREFIX
from dlreplay.errors import CaptureError, UsageError
from dlreplay.osutil import (
    DirectoryClaim,
    accelerator_nodes,
    atomic_write_text,
    check_plain_name,
    claim_directory,
    claimed_here,
    host_memory_bytes,
    is_empty_dir,
    remove_owned,
)
from dlreplay.pfw import count_events
from dlreplay.schema import TRACE_FORMAT_VERSION, TRACE_SCHEMA_NAME

MANIFEST = "manifest.json"
TRACE_PREFIX = "trace"
#: The file every capture writes first in its directory: with a manifest of the trace schema,
#: what tells a capture ``--force`` may replace from a directory it must never touch.
CAPTURE_MARKER = ".dlreplay-capture"
#: Globs of the files a capture writes in its directory (and ``--force`` deletes): nothing else.
CAPTURE_FILES = (
    MANIFEST,
    CAPTURE_MARKER,
    "dataset-fingerprint.json",
    f"{TRACE_PREFIX}-*.pfw",
    f"{TRACE_PREFIX}-*.pfw.gz",
    f"{MISSES_PREFIX}*.json*",
)
_INJECT_DIR = Path(__file__).resolve().parent / "inject"
#: The files of ``inject/`` the job's PYTHONPATH gets, and their names there: the hooks are the
#: top-level module ``_dlreplay_hooks`` in the job (``sitecustomize`` imports it by that name).
_INJECT_FILES = {
    "sitecustomize.py": "sitecustomize.py",
    "hooks.py": "_dlreplay_hooks.py",
    **{f"{name}.py": f"_dlreplay_{name}.py" for name in EXTENSIONS},
}
#: Environment variables recorded in the manifest (values that change I/O behaviour).
_RECORDED_ENV_PREFIXES = ("DFTRACER_", "OMP_", "MKL_", "SLURM_", "PMI_", "OMPI_", "CUDA_", "TORCH")
_RECORDED_ENV = ("PYTHONHASHSEED", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR")


@dataclass(frozen=True)
class CaptureConfig:
    """What to run and where to put the trace.

    ``command`` is an argv list (never run through a shell). ``data_dirs`` limits
    tracing to those trees (empty: trace every file). ``out`` defaults to
    ``traces/<name>-<UTC timestamp>`` under the current directory. ``loader_hooks``
    False records POSIX/STDIO only, as DFTracer's preload alone would (no data-loader or
    checkpoint events; worker processes are still flushed when they exit).
    """

    command: tuple[str, ...]
    out: Path | None = None
    data_dirs: tuple[str, ...] = ()
    name: str | None = None
    force: bool = False
    cwd: Path | None = None
    extra_env: tuple[tuple[str, str], ...] = ()
    #: file that receives the job's stdout and stderr (None: this process's own)
    job_output: Path | None = None
    loader_hooks: bool = True


@dataclass(frozen=True)
class CaptureResult:
    """Outcome of a capture. ``exit_code`` is the job's (128+N when killed by signal N)."""

    trace_dir: Path
    exit_code: int
    status: str  # complete | failed | interrupted
    wall_time_s: float
    files: list[dict[str, Any]] = field(default_factory=list)
    killed_by_signal: int | None = None
    warnings: tuple[str, ...] = ()
    #: what the dataset fingerprint (``dataset-fingerprint.json``) could not read, one line each
    fingerprint_problems: list[str] = field(default_factory=list)
    #: calls the job's hooks could not record (the job ran them unchanged): one dict per hook
    #: and reason, ``{"hook", "reason", "count", "processes"}`` (the manifest's ``hook_misses``)
    hook_misses: list[dict[str, Any]] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(int(f["events"]) for f in self.files)


def preload_library() -> Path:
    """Path of DFTracer's LD_PRELOAD library (from the installed ``dftracer`` wheel).

    ``DLREPLAY_DFTRACER_PRELOAD`` overrides it.
    """
    override = os.environ.get("DLREPLAY_DFTRACER_PRELOAD")
    if override:
        path = Path(override)
        if not path.is_file():
            raise CaptureError(f"DLREPLAY_DFTRACER_PRELOAD={override} does not exist.")
        return path
    spec = importlib.util.find_spec("dftracer")
    if spec is None or not spec.submodule_search_locations:
        raise CaptureError(
            "DFTracer is not installed: run `pip install dftracer` in this environment."
        )
    for base in spec.submodule_search_locations:
        for sub in ("lib64", "lib"):
            candidate = Path(base) / sub / "libdftracer_preload.so"
            if candidate.is_file():
                return candidate
    raise CaptureError(
        "the installed dftracer package has no libdftracer_preload.so; "
        "reinstall it (`pip install --force-reinstall dftracer`) or set DLREPLAY_DFTRACER_PRELOAD."
    )


def data_dir_spellings(data_dirs: Sequence[str], cwd: Path) -> list[str]:
    """Every spelling of each data dir that DFTracer's prefix match may see.

    DFTracer compares the path string the program passed, so a job that opens
    ``data/x.npz`` is missed by a filter on ``/abs/data``: include the absolute,
    the real (symlinks resolved), and the cwd-relative spellings.
    """
    out: list[str] = []
    for d in data_dirs:
        p = Path(d)
        absolute = p if p.is_absolute() else (cwd / p)
        candidates = {
            os.path.normpath(str(absolute)),
            os.path.realpath(absolute),
        }
        for c in list(candidates):
            rel = os.path.relpath(c, cwd)
            candidates.add(rel)
            if not rel.startswith(".."):
                candidates.add("./" + rel)
        if not p.is_absolute():
            candidates.add(d)
        out.extend(sorted(candidates))
    return list(dict.fromkeys(out))


def default_out_dir(name: str) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("traces") / f"{name}-{stamp}"


def is_capture_dir(path: Path) -> bool:
    """Whether *path* holds a capture dlreplay wrote: its marker file, and a manifest of the
    trace schema in a format_version this dlreplay knows."""
    marker = path / CAPTURE_MARKER
    if marker.is_symlink() or not marker.is_file():
        return False
    try:
        doc = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        version = doc.get("format_version")
        return (
            doc.get("schema") == TRACE_SCHEMA_NAME
            and isinstance(version, int)
            and 1 <= version <= TRACE_FORMAT_VERSION
        )
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def _prepare_out_dir(out: Path, force: bool) -> DirectoryClaim:
    """Claim *out* for this capture (one writer per directory), then refuse it unless empty, or
    ``force`` and a previous capture (whose own files are deleted, nothing else), or a
    directory this process claimed before (its caller's output, e.g. a traced replay's)."""
    if out.exists() and not out.is_dir():
        raise CaptureError(f"{out} exists and is not a directory; choose another --out.")
    callers = claimed_here(out)
    try:
        claim = claim_directory(out, "--out")
    except OSError as exc:
        raise CaptureError(
            f"{out}: cannot create the trace directory ({exc.strerror or exc}); "
            f"choose another --out."
        ) from None
    try:
        if not is_empty_dir(out):
            if not force:
                raise CaptureError(
                    f"{out} is not empty; pass --force to replace a previous capture there, or "
                    f"choose another --out."
                )
            if is_capture_dir(out):
                remove_owned(out, CAPTURE_FILES)  # the capture's own files; anything else stays
            elif not callers:
                raise CaptureError(
                    f"{out} is not empty and holds no dlreplay capture (its {CAPTURE_MARKER} and a "
                    f"{MANIFEST} of schema {TRACE_SCHEMA_NAME}); --force only replaces a previous "
                    f"capture, so nothing was changed: choose an empty or new --out."
                )
    except BaseException:
        claim.release()
        raise
    return claim


def _versions() -> dict[str, str | None]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "dlreplay": dlreplay.__version__,
        "dftracer": version("dftracer"),
        "pydftracer": version("pydftracer"),
        "python": platform.python_version(),
        "torch": version("torch"),
    }


def _recorded_env(env: dict[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(env.items())
        if k.startswith(_RECORDED_ENV_PREFIXES) or k in _RECORDED_ENV
    }


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def build_env(config: CaptureConfig, out: Path, inject_dir: Path, cwd: Path) -> dict[str, str]:
    """The job's environment: the caller's plus DFTracer's and our injection path."""
    env = dict(os.environ)
    if dlreplay.JEMALLOC_SET_BY_DLREPLAY:  # dlreplay's own allocator setting, not the job's
        env.pop(dlreplay.JEMALLOC_ENV, None)
    if dlreplay.BLAS_SET_BY_DLREPLAY:  # nor its one BLAS thread
        env.pop(dlreplay.BLAS_ENV, None)
    env.update(dict(config.extra_env))
    preload = str(preload_library())
    env["LD_PRELOAD"] = ":".join(p for p in (preload, env.get("LD_PRELOAD", "")) if p)
    env["DFTRACER_ENABLE"] = "1"
    env["DFTRACER_INIT"] = "PRELOAD"
    env["DFTRACER_INC_METADATA"] = "1"
    env["DFTRACER_LOG_FILE"] = str(out.resolve() / TRACE_PREFIX)
    env["DFTRACER_DATA_DIR"] = (
        ":".join(data_dir_spellings(config.data_dirs, cwd)) if config.data_dirs else "all"
    )
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(inject_dir), env.get("PYTHONPATH", "")) if p
    )
    env["DLREPLAY_CAPTURE"] = "1"
    env[MISSES_ENV] = str(out.resolve())
    env["DLREPLAY_LOADER_HOOKS"] = "1" if config.loader_hooks else "0"
    return env


def run_capture(config: CaptureConfig) -> CaptureResult:
    """Run ``config.command`` under DFTracer; write the trace dir and its manifest.

    The job's exit code is returned in the result (the trace is kept and marked
    ``failed`` / ``interrupted`` when the job fails or is stopped). SIGINT/SIGTERM
    received by this process are forwarded to the job.
    """
    if not config.command:
        raise UsageError(
            "no command to capture: put it after `--`, e.g. `dlreplay capture -- python train.py`."
        )
    cwd = (config.cwd or Path.cwd()).resolve()
    name = config.name or Path(config.command[0]).stem or "job"
    if config.name is not None and config.out is None:  # it names the directory: never a path
        check_plain_name(config.name, "--name")
    out = config.out or default_out_dir(name)
    if not out.is_absolute():
        out = Path.cwd() / out
    executable = (
        shutil.which(config.command[0], path=os.environ.get("PATH"))
        if os.sep not in config.command[0]
        else config.command[0]
    )
    if executable is None or not os.path.exists(
        executable if os.path.isabs(executable) else cwd / executable
    ):
        raise CaptureError(f"command not found: {config.command[0]}")
    claim = _prepare_out_dir(out, config.force)
    try:
        return _capture_into(config, out, cwd, name)
    finally:
        claim.release()


def _capture_into(config: CaptureConfig, out: Path, cwd: Path, name: str) -> CaptureResult:
    """The capture itself, into the claimed directory *out*."""
    inject_dir = Path(tempfile.mkdtemp(prefix="dlreplay-inject-"))
    try:
        for src, dst in _INJECT_FILES.items():
            shutil.copy2(_INJECT_DIR / src, inject_dir / dst)
        env = build_env(config, out, inject_dir, cwd)
        manifest = _started_manifest(config, env, cwd, name)
        manifest_path = out / MANIFEST
        atomic_write_text(out / CAPTURE_MARKER, f"made by dlreplay capture ({TRACE_SCHEMA_NAME})\n")
        _write_json_atomic(manifest_path, manifest)
        returncode, interrupted, wall = _run_job(config, env, cwd)
        # The job's own helpers can outlive it by a moment (multiprocessing's resource tracker,
        # started by spawn-context queues, exits once the job's end closes its pipe): their
        # trace files are written, or removed when empty, only as they end. The hooks stay
        # until then: a helper still starting its interpreter imports them from inject_dir
        # (removed at the job's exit, a helper that started late missed them: "not loaded")
        lingering = wait_for_trace_writers(out, LINGER_S)
    finally:
        shutil.rmtree(inject_dir, ignore_errors=True)

    exit_code, killed_by, status = _job_status(returncode, interrupted)
    misses = collect_hook_misses(out)
    warnings = _capture_warnings(config, cwd, lingering) + [
        f"capture hook {m['hook']} could not record {m['count']} call(s) ({m['reason']}) in "
        f"{m['processes']} process(es); the job's calls ran unchanged"
        for m in misses
    ]
    files = _trace_files(out)
    manifest.update(
        {
            "status": status,
            "exit_code": exit_code,
            "killed_by_signal": killed_by,
            "end_time": _now_iso(),
            "end_time_us": time.time_ns() // 1000,
            "wall_time_s": round(wall, 6),
            "files": files,
            "events": sum(int(f["events"]) for f in files),
            "warnings": warnings,
            "hook_misses": misses,
        }
    )
    _write_json_atomic(manifest_path, manifest)
    problems = _fingerprint(out, manifest, status)
    _write_json_atomic(manifest_path, manifest)
    return CaptureResult(
        trace_dir=out,
        exit_code=exit_code,
        status=status,
        wall_time_s=wall,
        files=files,
        killed_by_signal=killed_by,
        fingerprint_problems=problems,
        warnings=tuple(warnings),
        hook_misses=misses,
    )


def _started_manifest(
    config: CaptureConfig, env: dict[str, str], cwd: Path, name: str
) -> dict[str, Any]:
    """The manifest as the job starts (``status`` running); the job's end completes it."""
    return {
        "schema": TRACE_SCHEMA_NAME,
        "format_version": TRACE_FORMAT_VERSION,
        "status": "running",
        "name": name,
        "command": list(config.command),
        "cwd": str(cwd),
        "env": _recorded_env(env),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "mem_total_bytes": host_memory_bytes()
        or None,  # page-cache analysis: is the dataset smaller than RAM?
        # the accelerators' device nodes the job could use ([]: it computed on the CPU)
        "accelerators": accelerator_nodes(env),
        "start_time": _now_iso(),
        "start_time_us": time.time_ns() // 1000,
        "versions": _versions(),
        "data_dirs": [
            str((cwd / d).resolve()) if not os.path.isabs(d) else d for d in config.data_dirs
        ],
        "trace_prefix": TRACE_PREFIX,
        "loader_hooks": config.loader_hooks,
    }


def _run_job(config: CaptureConfig, env: dict[str, str], cwd: Path) -> tuple[int, bool, float]:
    """Run the job to its end, forwarding SIGINT/SIGTERM to it; returns (its return code,
    whether it was interrupted, wall seconds)."""
    interrupted = False
    proc: subprocess.Popen[bytes] | None = None
    pending: list[int] = []  # signals received while Popen was starting the job

    def forward(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted = True
        if proc is None:
            pending.append(signum)
            return
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    # Handlers first: a signal that arrives before the job starts stops the capture cleanly.
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.perf_counter()
    try:
        returncode = 128 + signal.SIGINT
        if not interrupted:
            if config.job_output is not None:
                with open(config.job_output, "wb") as log:
                    proc = subprocess.Popen(
                        list(config.command), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT
                    )
            else:
                proc = subprocess.Popen(list(config.command), cwd=cwd, env=env)
            for signum in pending:  # else the job would run to its end, ignoring that Ctrl-C
                proc.send_signal(signum)
            while True:
                try:
                    returncode = proc.wait()
                    break
                except KeyboardInterrupt:  # pragma: no cover - handler above normally wins
                    interrupted = True
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return returncode, interrupted, time.perf_counter() - t0


def _job_status(returncode: int, interrupted: bool) -> tuple[int, int | None, str]:
    """(exit code, killing signal or None, status) of the job from its return code."""
    exit_code = returncode if returncode >= 0 else 128 - returncode
    killed_by = -returncode if returncode < 0 else None
    if interrupted or killed_by in (signal.SIGINT, signal.SIGTERM):
        status = "interrupted"
    elif returncode != 0:
        status = "failed"
    else:
        status = "complete"
    return exit_code, killed_by, status


def _capture_warnings(config: CaptureConfig, cwd: Path, lingering: set[int]) -> list[str]:
    """Data dirs that do not exist, and processes still writing their trace after the wait."""
    warnings = [
        f"--data-dir {d} does not exist (in {cwd}): nothing under it was traced; check the path "
        f"(a relative one is relative to the job's working directory)"
        for d in config.data_dirs
        if not (cwd / d).exists()
    ]
    warnings += [
        f"process {pid} of the job still had a trace file open {LINGER_S:g} s after the job ended: its "
        f"events may be incomplete"
        for pid in sorted(lingering)
    ]
    return warnings


def _trace_files(out: Path) -> list[dict[str, Any]]:
    """Each trace file of the capture: name, bytes, events and damaged lines."""
    files: list[dict[str, Any]] = []
    for path in sorted(out.glob(f"{TRACE_PREFIX}-*.pfw*")):
        counted = count_events(path)
        files.append(
            {
                "name": path.name,
                "bytes": path.stat().st_size,
                "events": counted.events,
                "damaged": counted.damaged,
            }
        )
    return files


def collect_hook_misses(out: Path) -> list[dict[str, Any]]:
    """The calls the job's hooks could not record, summed over its processes' files
    (``hook-misses-<pid>.json``, removed once read): ``{"hook", "reason", "count",
    "processes"}`` per hook and reason, most first. A file that cannot be read is skipped."""
    counts: dict[tuple[str, str], list[int]] = {}
    for path in sorted(out.glob(f"{MISSES_PREFIX}*.json*")):
        try:
            rows = json.loads(path.read_text()).get("misses", []) if path.suffix == ".json" else []
            for row in rows:
                tally = counts.setdefault((str(row["hook"]), str(row["reason"])), [0, 0])
                tally[0] += int(row["count"])
                tally[1] += 1
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass
        path.unlink(missing_ok=True)
    return [
        {"hook": hook, "reason": reason, "count": n, "processes": procs}
        for (hook, reason), (n, procs) in sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[0]))
    ]


#: Seconds to wait after the job's end for its processes that still write trace files.
LINGER_S = 10.0


def trace_writers(out: Path) -> set[int]:
    """Processes of this session (the job's, left running after it) with a file under *out*
    open, by ``/proc/<pid>/fd``; empty where ``/proc`` is not there to read."""
    root = str(out.resolve()) + os.sep
    me, sid = os.getpid(), os.getsid(0)
    found: set[int] = set()
    try:
        procs = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return found
    for pid in procs:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) != sid:  # after "comm)": state ppid pgrp session
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
        except (OSError, IndexError, ValueError):
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(root):
                    found.add(pid)
                    break
            except OSError:
                continue
    return found


def wait_for_trace_writers(out: Path, timeout: float) -> set[int]:
    """Wait up to *timeout* seconds until no process of this session has a trace file under
    *out* open; returns those still writing then (empty: all done)."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        left = trace_writers(out)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _fingerprint(out: Path, manifest: dict[str, Any], status: str) -> list[str]:
    """Fingerprint the dataset (the --data-dir trees, else the dataset files the job opened)
    into the trace dir; record it in *manifest*. Never fails the capture: returns problems."""
    from dlreplay.capture.fingerprint import (
        FINGERPRINT_NAME,
        fingerprint_dataset,
        opened_files,
        write_fingerprint,
    )

    if status == "interrupted":
        manifest["dataset_fingerprint"] = {"file": None, "skipped": "capture interrupted"}
        return []
    try:
        roots = manifest.get("data_dirs") or []
        opened = [] if roots else opened_files(out / f["name"] for f in manifest.get("files", []))
        doc = fingerprint_dataset(roots, files=opened, skip=[out])
        if not doc["groups"] and not doc["problems"]:
            where = "under --data-dir" if roots else "among the files the job opened"
            doc["problems"].append(f"no dataset files found {where}: dataset layout not recorded")
        write_fingerprint(doc, out)
    except Exception as exc:  # the trace is complete without it; say why once
        problem = f"dataset fingerprint failed ({type(exc).__name__}: {exc})"
        manifest["dataset_fingerprint"] = {"file": None, "problems": [problem]}
        return [problem]
    manifest["dataset_fingerprint"] = {
        "file": FINGERPRINT_NAME,
        "groups": len(doc["groups"]),
        "seconds": doc["seconds"],
        "problems": doc["problems"],
    }
    return list(doc["problems"])


def read_manifest(trace_dir: Path) -> dict[str, Any] | None:
    """The manifest of a trace dir, or None if it has none. Rejects other schemas/versions."""
    from dlreplay.errors import ArtifactVersionError

    path = Path(trace_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:  # (RecursionError: nested too deep)
        raise ArtifactVersionError(
            f"{path} is not valid JSON ({exc}); recapture or delete it."
        ) from exc
    if data.get("schema") != TRACE_SCHEMA_NAME:
        raise ArtifactVersionError(
            f"{path} names schema {data.get('schema')!r}, expected {TRACE_SCHEMA_NAME!r}."
        )
    if int(data.get("format_version", -1)) > TRACE_FORMAT_VERSION:
        raise ArtifactVersionError(
            f"{path} has format_version {data.get('format_version')}, newer than this dlreplay reads "
            f"({TRACE_FORMAT_VERSION}); upgrade dlreplay."
        )
    return data


def main_python() -> str:
    """The interpreter running dlreplay (handy for capturing Python jobs)."""
    return sys.executable
