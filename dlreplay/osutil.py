"""Small operating-system helpers every stage shares: atomic writes, host memory, paths
confined to their directory, and the one-writer claim on an output directory."""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import fnmatch
import glob
import json
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import InUseError, UnsafePathError, UsageError

__all__ = [
    "CLAIM_NAME",
    "DirectoryClaim",
    "atomic_write_text",
    "check_plain_name",
    "claim_directory",
    "claimed_here",
    "confined_path",
    "share_directory",
    "end_with_parent",
    "host_memory_bytes",
    "is_empty_dir",
    "not_owned",
    "process_limit",
    "remove_owned",
]

#: The claim file a dlreplay command holds (``flock``) in a directory it writes; never counts as content.
CLAIM_NAME = ".dlreplay-claim"


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write *text* to *path* atomically (temporary file in the same folder, fsync, rename).

    An interrupted write leaves the old file (or none), never a half-written one. The
    file gets the usual mode (0666 minus the umask), not mkstemp's 0600.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


#: Most processes one option may ask for, whatever the limits say (a typo such as 100000 never forks).
MAX_PROCESSES = 1024


def process_limit() -> tuple[int, str]:
    """(most processes one dlreplay command may start for one option, why that number).

    Each child holds a few pipes and files open in the parent (workers' queues, loader
    pipes), so a quarter of the open-file limit (``RLIMIT_NOFILE``), also below the
    process limit (``RLIMIT_NPROC``) and :data:`MAX_PROCESSES`.
    """
    import resource

    limit, why = MAX_PROCESSES, f"dlreplay's cap of {MAX_PROCESSES}"
    for res, share, name in (
        (resource.RLIMIT_NOFILE, 4, "a quarter of the open-file limit"),
        (resource.RLIMIT_NPROC, 1, "the process limit"),
    ):
        soft = resource.getrlimit(res)[0]
        if soft != resource.RLIM_INFINITY and soft // share < limit:
            limit, why = max(1, soft // share), f"{name} ({soft}, ulimit)"
    return limit, why


#: ``prctl`` option: the signal a process gets when the thread that started it ends (Linux).
_PR_SET_PDEATHSIG = 1


def end_with_parent() -> bool:
    """In a process started by :mod:`multiprocessing` (fork or spawn): have it killed
    (SIGKILL) when its parent ends, and end it now if the parent already has. A parent
    killed without running its handlers (``kill -9``, a signal it does not handle) cannot
    stop its children, and a child waiting on a queue or a barrier it holds open itself
    stays for good, holding the caller's pipes. Linux's ``PR_SET_PDEATHSIG``: no thread of
    its own in the process (a process that forks or spawns workers, under DFTracer too,
    stays single-threaded). False where there is no such parent (the main process, an MPI
    rank), no ``prctl`` (not Linux), or the parent is a forkserver."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == parent.pid:
        return True
    # Not its parent's child any more, or never (a forkserver's). Whether the process that
    # started it still runs is read from /proc: ``parent.is_alive()`` watches a pipe whose
    # other end every sibling forked after this process holds too, so a forked worker
    # whose parent had died took it for alive while a sibling ran, and waited for good.
    if parent.pid is not None and _pid_gone(parent.pid):
        os._exit(1)  # it ended before the request: nothing will signal this process
    # started through a forkserver: its parent is the server, which outlives the process
    # that asked for it (that one's end is the workers' own affair)
    libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)
    return False


def _pid_gone(pid: int) -> bool:
    """The process ``pid`` has ended: it is gone, or a zombie not yet reaped (its state in
    ``/proc/PID/stat``; where that cannot be read, whether a signal could reach it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:  # pid (comm) state ...: comm may hold ")"
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # (it exists, owned by another user)
        pass
    return False


def host_memory_bytes() -> int:
    """Physical memory of this host in bytes (``os.sysconf``), 0 if unknown."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


#: Device nodes of the accelerators a training job computes on: NVIDIA GPUs, AMD's ROCm
#: kernel driver, Linux's accel subsystem (Gaudi, NPUs), WSL's GPU
ACCELERATOR_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/accel/accel*", "/dev/dxg")


def accelerator_nodes(env: Mapping[str, str] | None = None) -> list[str]:
    """The accelerator device nodes on this host (:data:`ACCELERATOR_NODES`), NVIDIA's left
    out where ``CUDA_VISIBLE_DEVICES`` in *env* hides every GPU ("" or "-1"); [] means a job
    here computes on the CPU."""
    env = os.environ if env is None else env
    hidden = env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1")
    found = sorted({n for pat in ACCELERATOR_NODES for n in glob.glob(pat)})
    return [n for n in found if not (hidden and os.path.basename(n).startswith("nvidia"))]


def confined_path(
    base: str | os.PathLike[str], rel: object, source: str | os.PathLike[str]
) -> Path:
    """``base / rel`` for a path *rel* read from the file *source*, if it stays inside *base*.

    Refuses (:class:`UnsafePathError`, naming *source* and the entry) anything that is not
    a non-empty relative path string, is absolute, has a ``..`` part or a NUL byte, or
    resolves (symbolic links followed) outside *base*: a manifest, journal, trace or model
    can never make dlreplay read, write or delete a file elsewhere.
    """
    base = Path(base)
    why = None
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        why = "not a relative file path"
    elif PurePosixPath(rel).is_absolute():
        why = "an absolute path"
    elif ".." in PurePosixPath(rel).parts:
        why = "it climbs out with '..'"
    elif not (base / rel).resolve().is_relative_to(base.resolve()):
        why = "a symbolic link leads out"
    if why is None:
        return base / str(rel)
    raise UnsafePathError(
        f"{source}: lists the path {rel!r}, outside {base} ({why}); dlreplay only uses paths "
        f"inside the directory a file belongs to, so it refused this file and changed nothing. "
        f"Delete {source} if you did not write it, or choose another directory."
    )


class DirectoryClaim:
    """This process's claim on a directory it writes: an exclusive ``flock`` on :data:`CLAIM_NAME`.

    The kernel drops the lock when the holder exits, however it exits, so a crashed run
    never blocks the next one; the file names the holder for the message a loser gets.
    Claims are re-entrant within one process (a traced replay claims its ``--out``, then
    captures into it): each :func:`claim_directory` needs one :meth:`release` (or the end
    of a ``with`` block); the last one deletes the file.
    """

    _held: dict[str, DirectoryClaim] = {}

    def __init__(self, path: Path, fd: int, shared: bool = False) -> None:
        self.path, self._fd, self._count, self.shared = path, fd, 1, shared

    def __enter__(self) -> DirectoryClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._count == 0:
            return
        self._count -= 1
        if self._count:
            return
        DirectoryClaim._held.pop(str(self.path), None)
        if (
            self.shared
        ):  # the last reader removes the file: the lock is then exclusive (nobody else holds it)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(self._fd)  # other readers still hold it: theirs to remove
                return
        try:  # unlinked while still locked: a process waiting on the old file re-checks its inode
            os.unlink(self.path / CLAIM_NAME)
        except OSError:
            pass
        os.close(self._fd)


def _holder(path: Path) -> str | None:
    """Who holds the claim on *path*, from its claim file; None when the file is empty (readers'
    holds write nothing)."""
    try:
        text = (path / CLAIM_NAME).read_text(encoding="utf-8")
        if not text.strip():
            return None
        info: dict[str, Any] = json.loads(text)
        command = " ".join(str(a) for a in info.get("command", []))
        return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}: {command}"
    except (OSError, ValueError, TypeError, AttributeError):
        return "another process"


def _still_linked(fd: int, lock: Path) -> bool:
    """Whether the claim file *fd* was opened from is still the one at *lock* (its holder
    removes it when it lets go: a lock taken on the old file would guard nothing)."""
    try:
        return os.fstat(fd).st_ino == os.stat(lock).st_ino
    except FileNotFoundError:
        return False


def claim_directory(path: str | os.PathLike[str], option: str) -> DirectoryClaim:
    """Create *path* if needed and claim it for this process: one writer per directory.

    Raises :class:`InUseError` naming the holder and *option* (e.g. ``--out``) while another
    process holds the claim, and ``OSError`` when the directory or its claim file cannot be
    created (read-only, permission, disk full), for the caller to name in its own words.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    mine = DirectoryClaim._held.get(key)
    if mine is not None:
        if mine.shared:
            raise InUseError(
                f"{path} is being read by this dlreplay command; it cannot also write there "
                f"(choose another {option})"
            )
        mine._count += 1
        return mine
    fd = _locked_claim_file(path, key, option, shared=False)
    assert fd is not None  # (only a reader's open can find a read-only directory)
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": sys.argv,
        "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    claim = DirectoryClaim(Path(key), fd)
    DirectoryClaim._held[key] = claim
    return claim


def _locked_claim_file(path: Path, key: str, option: str, *, shared: bool) -> int | None:
    """A descriptor of the claim file of the directory *key* (*path* as the user named it),
    locked shared (a reader) or exclusive (the writer), and still the file at its place:
    its holder removes it when it lets go, and a lock taken on the old file would guard
    nothing, so the open is retried on the new one. None when a reader finds a read-only
    directory without a claim file. Raises :class:`InUseError` naming who holds it."""
    lock = Path(key) / CLAIM_NAME
    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if not shared or exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            try:  # a read-only dataset: no dlreplay command can write there either
                fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            readers = False
            if not shared:
                try:  # a shared lock is granted only when the holders are readers (replays of a dataset)
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    readers = True
                except OSError:
                    pass
            os.close(fd)
            if readers:
                raise InUseError(
                    f"{path} is being read by a running dlreplay replay (its dataset); wait for "
                    f"it to finish or choose another {option}"
                ) from None
            rule = ";" if shared else "; one writer per directory:"
            raise InUseError(
                f"{path} is being written by another dlreplay command "
                f"({_holder(Path(key)) or 'another process'}){rule} wait for it to finish or "
                f"choose another {option}"
            ) from None
        if _still_linked(fd, lock):
            return fd
        os.close(fd)  # the holder deleted the file between our open and our lock: open the new one
    raise InUseError(
        f"{path}: its claim file keeps changing (dlreplay commands are starting there); choose "
        f"another {option}"
    )


def share_directory(path: str | os.PathLike[str], option: str) -> DirectoryClaim | None:
    """Hold *path* for reading while this process uses its files: a shared ``flock`` on
    :data:`CLAIM_NAME`, so that no dlreplay command writes there meanwhile (a ``generate --force``
    of another model into the dataset a replay reads), while any number of readers share it.

    Returns None when the directory is read-only and has no claim file (no dlreplay command
    can write there either). Raises :class:`InUseError` naming the writer and *option* while one
    holds the directory. Re-entrant like :func:`claim_directory` (a claim this process holds
    already, exclusive or shared, is counted once more); release it the same way.
    """
    key = str(Path(path).resolve())
    mine = DirectoryClaim._held.get(key)
    if mine is not None:
        mine._count += 1
        return mine
    fd = _locked_claim_file(Path(path), key, option, shared=True)
    if fd is None:
        return None
    claim = DirectoryClaim(Path(key), fd, shared=True)
    DirectoryClaim._held[key] = claim
    return claim


def is_empty_dir(path: str | os.PathLike[str]) -> bool:
    """True when *path* is missing or holds nothing but a dlreplay claim file."""
    p = Path(path)
    if not p.exists():
        return True
    return p.is_dir() and all(c.name == CLAIM_NAME for c in p.iterdir())


def claimed_here(path: str | os.PathLike[str]) -> bool:
    """Whether this process already holds the exclusive claim on *path*: a caller that claimed
    an output directory and wrote its own files there (a traced replay's ``model.yaml``) before
    it asks a stage to write beside them."""
    mine = DirectoryClaim._held.get(str(Path(path).resolve()))
    return mine is not None and not mine.shared


def _owned_files(root: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every entry under *root* that is not a directory of
    its own (files, symbolic links, a link to a directory too: never followed), claim
    file excluded."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        links = [d for d in dirnames if (here / d).is_symlink()]
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in (*filenames, *links):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if rel != CLAIM_NAME:
                found.append((rel, path))
    return found


def not_owned(root: str | os.PathLike[str], owned: tuple[str, ...]) -> list[str]:
    """The files under *root* (relative POSIX paths, sorted) that match none of the globs
    *owned*: what a dlreplay stage did not write there, which no ``--force`` may delete."""
    return sorted(
        rel
        for rel, _ in _owned_files(Path(root))
        if not any(fnmatch.fnmatchcase(rel, g) for g in owned)
    )


def remove_owned(root: str | os.PathLike[str], owned: tuple[str, ...]) -> None:
    """Delete the files under *root* that match one of the globs *owned* (a link itself, never
    what it points to), then the folders below *root* this left empty. Nothing else."""
    root = Path(root)
    for rel, path in _owned_files(root):
        if any(fnmatch.fnmatchcase(rel, g) for g in owned):
            path.unlink(missing_ok=True)
    for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
        if Path(dirpath) != root:
            try:
                os.rmdir(dirpath)  # only an empty one: a user's file keeps its folder
            except OSError:
                pass


#: Longest name a name option takes (it becomes part of a directory name).
MAX_NAME = 200


def check_plain_name(name: str, option: str) -> str:
    """*name* when it is a name, not a path: no ``/``, no control character or NUL, not ``.``
    or ``..``, 1 to :data:`MAX_NAME` characters. Else :class:`UsageError` naming *option*:
    a name never places an output outside the directory it is made in."""
    why = None
    if not name:
        why = "it is empty"
    elif "/" in name or os.sep in name:
        why = "it holds a '/' (a name, not a path; choose the directory with --out)"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        why = "it holds a control character"
    elif name in (".", ".."):
        why = "it names a directory"
    elif len(name) > MAX_NAME:
        why = f"it is longer than {MAX_NAME} characters"
    if why is None:
        return name
    shown = name if len(name) <= 60 else name[:60] + "…"
    raise UsageError(f"{option} {shown!r} is not a plain name: {why}.")
