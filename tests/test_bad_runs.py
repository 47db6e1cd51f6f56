"""Bad conditions while generating, replaying and capturing (issue #7, bad-input suite).

Real processes, real signals, real file systems: Ctrl-C (SIGINT to the process group, as
a terminal sends it, or to the one process, as ``kill -INT`` does) during generation and
replay; a full file system (a small tmpfs mounted for the test, else skipped); a
read-only target; a traced command that fails or is killed.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlreplay.interrupt import STACKS_ENV
from dlreplay.replay.common import JOURNAL_NAME, MANIFEST_NAME
from dlreplay.replay.generate import HOLD_ENV

from .conftest import REPO, check_no_traceback, run_cli
from .test_replay import digest_dir, make_model, write_model

PY = sys.executable


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Exception ignored" not in text, text
    check_no_traceback(text)


def start_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -m dlreplay ARGS`` in its own process group (so a "terminal" Ctrl-C reaches all
    of it), with SIGUSR1 printing its processes' Python stacks (see :func:`finish`)."""
    return subprocess.Popen(
        [PY, "-m", "dlreplay", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**(os.environ if env is None else env), STACKS_ENV: "USR1"},
    )


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = 120.0) -> list[str]:
    """Read the process's stderr until a line contains ``needle``; returns the lines read (the
    needle's and whatever arrived with it: nothing read is dropped).

    Reads the pipe's file descriptor directly: ``select`` with a buffered ``readline`` misses a
    line that arrived in the same read as the previous one (it waits in Python's buffer).
    """
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    text = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text += chunk.decode(errors="replace")
            if any(needle in line for line in text.splitlines()):
                return text.splitlines(keepends=True)
        elif proc.poll() is not None:
            break
    raise AssertionError(f"{needle!r} never printed (exit {proc.poll()}):\n{text}")


def finish(proc: subprocess.Popen[str], timeout: float = 120.0) -> tuple[str, str]:
    """(stdout, stderr) of ``proc`` once it exits and its pipes close; past ``timeout`` the
    test fails with where the stopped run hung: whether the command itself had exited (else
    a process it left holds the pipes), the processes of its session, and their Python
    stacks (SIGUSR1, :func:`start_cli`), before its process group is killed."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = proc.poll()
        try:
            ps = subprocess.run(
                ["ps", "-o", "pid,ppid,stat,wchan:24,etime,args", "--sid", str(proc.pid)],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            ps = f"(ps: {exc})"
        try:
            os.killpg(proc.pid, signal.SIGUSR1)
            time.sleep(2.0)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        state = "still running" if code is None else f"exited {code}, its pipes still open"
        pytest.fail(
            f"{state} {timeout:.0f} s after it was stopped; processes:\n{ps}\nstdout: {out[-2000:]!r}\n"
            f"stderr (with their stacks): {err[-12000:]!r}"
        )


def ctrl_c(proc: subprocess.Popen[str], target: str) -> None:
    if target == "group":  # what a terminal's Ctrl-C does
        os.killpg(proc.pid, signal.SIGINT)
    else:  # kill -INT PID: the main process only
        proc.send_signal(signal.SIGINT)


# --------------------------------------------------------------------------- Ctrl-C: replay

LONG = (
    "dataset.format=raw",
    "dataset.num_files=8",
    "dataset.num_samples_per_file=1",
    "dataset.record_length=4096",
    "reader.batch_size=1",
    "reader.read_threads=2",
    "train.epochs=400",
    "train.computation_time=0.002",
)


@pytest.mark.parametrize(
    ("accelerators", "target"), [(1, "group"), (1, "pid"), (2, "group"), (2, "pid")]
)
def test_ctrl_c_during_replay_keeps_partial_metrics(
    tmp_path: Path, accelerators: int, target: str
) -> None:
    """Exit 130, metrics.json with the epochs done and ``complete: false``; no traceback.

    400 epochs of 8 steps, each epoch forking 2 loader workers: Ctrl-C lands while workers
    start or stop as often as not (the case that was once ignored entirely).
    """
    model, data, out = write_model(tmp_path, *LONG), tmp_path / "d", tmp_path / "o"
    run_cli("generate", str(model), "--data-dir", str(data), check=True)
    proc = start_cli(
        "replay",
        str(model),
        "--data-dir",
        str(data),
        "--out",
        str(out),
        "--no-trace",
        "--accelerators",
        str(accelerators),
    )
    wait_for_line(proc, "replay started")
    time.sleep(1.0)
    ctrl_c(proc, target)
    stdout, stderr = finish(proc)
    no_traceback(stderr)
    assert proc.returncode == 130, stderr
    assert "(incomplete)" in stdout and "incomplete run" in stdout
    m = json.loads((out / "metrics.json").read_text())
    assert m["complete"] is False and m["interrupted"] is True and m["errors"] == []
    assert 0 < len(m["epochs"]) < 400 and m["accelerators"] == accelerators
    assert not (out / "checkpoints").exists()


REPLAY_SWALLOWED = """
import os, signal, sys, time, weakref
from pathlib import Path
from dlreplay.model import load_model
from dlreplay.replay import GenerateConfig, ReplayConfig, accelerator, generate_dataset, run_replay

where, tmp = sys.argv[1], Path(sys.argv[2])
model = load_model(tmp / "model.yaml")
generate_dataset(GenerateConfig(model=model, data_dir=tmp / "d", jobs=1))
calls = {"sleep": 0, "fork": 0}
real_sleep = accelerator._Sleeper.sleep

class Garbage:
    pass

# the step's sleep, called once a step (time.sleep is not: a step whose overruns have used up
# its 1 ms sleeps none, so "the third time.sleep" came epochs later on a slow machine)
def sleep(self, seconds, spent=0.0):  # compute step 3: Ctrl-C arrives while a finalizer runs (garbage collection)
    calls["sleep"] += 1
    if where == "finalizer" and calls["sleep"] == 3:
        g = Garbage()
        weakref.finalize(g, signal.raise_signal, signal.SIGINT)
        del g  # KeyboardInterrupt is raised inside the finalizer, and Python discards it there
    return real_sleep(self, seconds, spent)

def after_fork():  # epoch 2: Ctrl-C arrives while a loader worker is being forked
    calls["fork"] += 1
    if where == "fork" and calls["fork"] == 3:
        signal.raise_signal(signal.SIGINT)  # raised inside an at-fork callback: discarded too

accelerator._Sleeper.sleep = sleep
os.register_at_fork(after_in_parent=after_fork)
res = run_replay(ReplayConfig(model=model, data_dir=tmp / "d", out=tmp / "o", trace=False))
print(res.complete, len(res.metrics["epochs"]), res.metrics["interrupted"])
"""


@pytest.mark.parametrize("where", ["finalizer", "fork"])
def test_swallowed_keyboard_interrupt_still_stops_the_replay(tmp_path: Path, where: str) -> None:
    """Regression: a KeyboardInterrupt that Python discards (raised inside a finalizer or an
    at-fork callback) used to be lost, and the replay ran every epoch and exited 0."""
    script = tmp_path / "swallow.py"
    script.write_text(REPLAY_SWALLOWED)
    write_model(
        tmp_path,
        "dataset.format=raw",
        "reader.batch_size=1",
        "reader.read_threads=2",
        "train.epochs=20",
        "train.computation_time=0.001",
    )
    proc = subprocess.run(
        [PY, str(script), where, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    complete, epochs, interrupted = proc.stdout.split()
    assert (complete, interrupted) == ("False", "True"), proc.stdout
    assert int(epochs) <= 3
    no_traceback(proc.stderr)


# --------------------------------------------------------------------------- Ctrl-C: generate

GEN = ("dataset.format=npy", "dataset.num_files=400", "dataset.record_length=50000")


def journal_files(data: Path) -> int:
    try:
        return len(json.loads((data / JOURNAL_NAME).read_text())["files"])
    except (OSError, ValueError, KeyError):
        return 0


def test_ctrl_c_during_generate_leaves_no_manifest_and_rerun_resumes(tmp_path: Path) -> None:
    """Ctrl-C mid-generation: exit 130, the journal keeps the files done, no manifest; a rerun resumes.

    The test-only hold (``DLREPLAY_TEST_GENERATE_HOLD``) stops generation after 10 of the 400
    files until the Ctrl-C arrives, so it lands mid-generation on a machine of any speed.
    """
    model, data = write_model(tmp_path, *GEN), tmp_path / "d"
    proc = start_cli(
        "generate",
        str(model),
        "--data-dir",
        str(data),
        "--jobs",
        "2",
        env={**os.environ, HOLD_ENV: "10"},
    )
    wait_for_line(proc, "generate held after 10 files")
    ctrl_c(proc, "group")  # the generator processes get it too
    _, stderr = finish(proc)
    no_traceback(stderr)
    assert proc.returncode == 130, stderr
    assert "interrupted (Ctrl-C)" in stderr and str(data) in stderr and "rerun" in stderr
    assert not (data / MANIFEST_NAME).exists()
    kept = journal_files(data)
    assert kept == 10  # what was finished before the Ctrl-C is kept for the rerun
    again = run_cli("generate", str(model), "--data-dir", str(data), "--jobs", "2", check=True)
    generated, reused = (
        int(x) for x in re.search(r"(\d+) generated, (\d+) reused", again.stdout).groups()
    )
    assert reused >= kept and generated + reused == 400
    assert json.loads((data / MANIFEST_NAME).read_text())["complete"] is True
    assert not list(data.rglob("*.dlreplay-tmp"))
    run_cli("generate", str(model), "--data-dir", str(tmp_path / "ref"), "--jobs", "2", check=True)
    assert digest_dir(data) == digest_dir(tmp_path / "ref")  # resumed = generated in one go


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _still_alive(pids: list[int], timeout: float = 60.0) -> list[int]:
    """``pids`` still running after up to ``timeout`` s (a process that closed its files is
    still exiting for a moment)."""
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def test_generator_processes_end_with_a_killed_generate(tmp_path: Path) -> None:
    """``kill -9`` of a ``generate --jobs 2`` (no handler runs): its generator processes end
    too, instead of waiting on their task queue for good and holding its pipes; a rerun
    resumes. Held after 10 files so that the pool is running on a machine of any speed."""
    model, data = write_model(tmp_path, *GEN), tmp_path / "d"
    proc = start_cli(
        "generate",
        str(model),
        "--data-dir",
        str(data),
        "--jobs",
        "2",
        env={**os.environ, HOLD_ENV: "10"},
    )
    wait_for_line(proc, "generate held after 10 files")
    children = [
        int(pid) for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    ]
    assert len(children) >= 2  # the pool's processes (and the resource tracker)
    proc.kill()
    _, stderr = finish(proc, timeout=60)  # the pipes close: nothing the command started holds them
    no_traceback(stderr)
    assert not _still_alive(children)
    again = run_cli("generate", str(model), "--data-dir", str(data), check=True)
    assert (
        "reused" in again.stdout
        and json.loads((data / MANIFEST_NAME).read_text())["complete"] is True
    )


def test_replay_processes_end_with_a_killed_replay(tmp_path: Path) -> None:
    """``kill -9`` of a 2-accelerator replay: its accelerator processes end too (they waited
    at its barrier for good, holding its pipes), and so do their loader workers (a PyTorch
    worker forked just before its accelerator ended took the pid it was reparented to for
    its parent's and waited for good: 2 of 6 runs under ``taskset -c 0``)."""
    model, data, out = write_model(tmp_path, *LONG), tmp_path / "d", tmp_path / "o"
    run_cli("generate", str(model), "--data-dir", str(data), check=True)
    proc = start_cli(
        "replay",
        str(model),
        "--data-dir",
        str(data),
        "--out",
        str(out),
        "--no-trace",
        "--accelerators",
        "2",
    )
    wait_for_line(proc, "replay started")
    ranks: list[int] = []
    deadline = time.monotonic() + 60
    while len(ranks) < 2 and time.monotonic() < deadline:  # forked after the line
        ranks = [
            int(pid)
            for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        ]
        time.sleep(0.05)
    assert len(ranks) == 2
    proc.kill()
    _, stderr = finish(proc, timeout=90)  # the pipes close: nothing the replay started holds them
    no_traceback(stderr)
    assert not _still_alive(ranks)


ORPHANS = r"""
import multiprocessing as mp, os, sys, time
from dlreplay.osutil import end_with_parent
out = sys.argv[1]

def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

def worker(k, creator):
    with open(f"{out}/pid-{k}.tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(f"{out}/pid-{k}.tmp", f"{out}/pid-{k}")
    while os.getppid() == creator:  # its parent ends first (killed: it cannot stop its workers)
        time.sleep(0.01)
    if k == 1:  # forked after worker 0, it runs until worker 0 has asked (and ended, or not)
        first = int(open(f"{out}/pid-0").read())
        while running(first) and not os.path.exists(f"{out}/survived-0"):
            time.sleep(0.01)
    end_with_parent()
    open(f"{out}/survived-{k}", "w").close()
    time.sleep(60)  # a loader worker waiting on its queue for good

def parent():
    ctx = mp.get_context("fork")
    for k in range(2):
        ctx.Process(target=worker, args=(k, os.getpid())).start()
    while not all(os.path.exists(f"{out}/pid-{k}") for k in range(2)):
        time.sleep(0.01)
    os._exit(0)

if __name__ == "__main__":
    p = mp.get_context("fork").Process(target=parent)
    p.start()
    p.join()
"""


def test_a_worker_whose_parent_ended_before_it_asked_ends(tmp_path: Path) -> None:
    """:func:`~dlreplay.osutil.end_with_parent` in a forked worker whose parent had already
    ended (a PyTorch worker of an accelerator killed while it started its loader): the
    worker ends, even while a sibling forked after it still runs (the sibling holds the
    pipe ``multiprocessing.parent_process().is_alive()`` watches, so that said "alive" and
    the worker waited for good: clean-clone CI, once, in the killed-replay test)."""
    err = tmp_path / "stderr"
    with err.open("w") as fh:  # (a file: a worker left running would hold a pipe open)
        proc = subprocess.run(
            [sys.executable, "-c", ORPHANS, str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=fh,
            timeout=60,
        )
    assert proc.returncode == 0, err.read_text()
    pids = [int((tmp_path / f"pid-{k}").read_text()) for k in range(2)]
    try:
        assert not _still_alive(pids, timeout=20)
        assert not list(tmp_path.glob("survived-*"))
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_usr1_prints_where_a_run_waits_and_it_goes_on(tmp_path: Path) -> None:
    """``DLREPLAY_STACKS_ON=USR1`` (set by :func:`start_cli`): ``kill -USR1`` prints the
    command's Python stacks on stderr and the run goes on; Ctrl-C still stops it cleanly."""
    model, data = write_model(tmp_path, *GEN), tmp_path / "d"
    proc = start_cli(
        "generate",
        str(model),
        "--data-dir",
        str(data),
        "--jobs",
        "2",
        env={**os.environ, HOLD_ENV: "10"},
    )
    seen = "".join(wait_for_line(proc, "generate held after 10 files"))
    proc.send_signal(signal.SIGUSR1)
    seen += "".join(wait_for_line(proc, "in _hold"))
    assert "most recent call first" in seen and "generate.py" in seen, seen
    assert proc.poll() is None  # it goes on, held
    ctrl_c(proc, "group")
    _, stderr = finish(proc)
    no_traceback(stderr)
    assert proc.returncode == 130, stderr
    assert not (data / MANIFEST_NAME).exists()


_BUSY_THREADS = r"""
import os, selectors, sys, threading
from dlreplay.interrupt import stacks_on_signal
assert stacks_on_signal()
def spin():  # enters and leaves calls all the time: the frames a stack print reads change
    def deeper(n):
        return deeper(n - 1) if n else sel.select(0)
    sel = selectors.DefaultSelector()
    while True:
        deeper(20)
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()  # until the test closes it
"""


def test_usr1_stacks_are_safe_while_threads_run(tmp_path: Path) -> None:
    """Stack prints on SIGUSR1 never crash the run they look at, however often they come: 400
    signals to a process whose four threads keep entering and leaving calls. With
    ``faulthandler.register(all_threads=True)`` (the handler before) such a process ended with
    SIGSEGV after 2 to 19 signals (5 of 5 runs), as a held ``generate`` once did in CI."""
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [PY, "-c", _BUSY_THREADS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, STACKS_ENV: "USR1"},
            cwd=REPO,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            for _ in range(400):
                proc.send_signal(signal.SIGUSR1)
                time.sleep(0.001)
            time.sleep(0.2)
            assert proc.poll() is None, f"ended by the stack prints: {proc.returncode}"
            proc.communicate("", timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, proc.returncode
    printed = err_path.read_text()
    assert printed.count('"MainThread" (most recent call first)') >= 1, printed[-3000:]
    assert " in deeper\n" in printed and " in spin\n" in printed, printed[-3000:]
    no_traceback(printed)


# --------------------------------------------------------------------------- full / read-only file systems


def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root; "
            f"test_simulated_enospc_* cover the messages without a mount"
        )


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 2 MiB tmpfs with a file of the user's in it (must survive every failure)."""
    mnt = tmp_path / "fs"
    _mount_tmpfs(mnt, "size=2m")
    (mnt / "user-file.txt").write_text("not dlreplay's")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def read_only_fs(tmp_path: Path):
    mnt = tmp_path / "ro"
    _mount_tmpfs(mnt, "ro,size=1m")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize(
    "fmt", ["npy", "parquet"]
)  # np.save and polars report a full disk without errno
def test_generate_on_a_full_disk_fails_clearly_and_resumes(
    tmp_path: Path, small_fs: Path, fmt: str
) -> None:
    """The disk fills up mid-generation (another writer takes the space while generation is held
    after 3 files): exit 1 naming the path, no manifest, no temporary files; a rerun resumes."""
    model = write_model(
        tmp_path,
        f"dataset.format={fmt}",
        "dataset.num_files=8",
        "dataset.num_samples_per_file=1",
        "dataset.record_length=200000",
    )  # 1.6 MB: passes the up-front check on the 2 MiB file system
    data, release = small_fs / "d", tmp_path / "release"
    proc = start_cli(
        "generate",
        str(model),
        "--data-dir",
        str(data),
        "--jobs",
        "1",
        env={**os.environ, HOLD_ENV: f"3:{release}"},
    )
    wait_for_line(proc, "generate held after 3 files")
    (small_fs / "filler").write_bytes(
        b"\0" * (_free_bytes(small_fs) - 100_000)
    )  # leaves less than a file
    release.touch()
    _, stderr = finish(proc)
    no_traceback(stderr)
    assert proc.returncode == 1
    assert "no space left on the device" in stderr and str(data) in stderr
    assert "rerun resumes" in stderr
    assert not (data / MANIFEST_NAME).exists()
    assert not list(
        data.rglob("*.dlreplay-tmp")
    )  # its partial temporary files are not left taking space
    assert (small_fs / "user-file.txt").read_text() == "not dlreplay's"
    kept = journal_files(data)
    assert kept >= 3
    (small_fs / "filler").unlink()
    again = run_cli("generate", str(model), "--data-dir", str(data), check=True)
    assert f"{8 - kept} generated, {kept} reused" in again.stdout
    assert json.loads((data / MANIFEST_NAME).read_text())["complete"] is True
    assert (small_fs / "user-file.txt").read_text() == "not dlreplay's"


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_generate_larger_than_the_free_space_is_refused_up_front(
    tmp_path: Path, small_fs: Path
) -> None:
    """A dataset that cannot fit is refused before a byte is written, naming the fields and sizes."""
    model = write_model(
        tmp_path,
        "dataset.format=raw",
        "dataset.num_files=30",
        "dataset.num_samples_per_file=1",
        "dataset.record_length=200000",
    )
    proc = run_cli("generate", str(model), "--data-dir", str(small_fs / "d"))
    no_traceback(proc.stderr)
    assert proc.returncode == 1
    assert (
        "dataset.num_files x dataset.num_samples_per_file x dataset.record_length = 30 x 1 x 195.3 KiB = "
        f"5.7 MiB, but the file system of {small_fs / 'd'} has "
    ) in proc.stderr
    assert not (small_fs / "d").exists()
    ck = write_model(
        tmp_path,
        "dataset.format=raw",
        "checkpoint.enabled=true",
        "checkpoint.steps_between_checkpoints=2",
        "checkpoint.bytes_per_checkpoint=3000000",
    )
    proc = run_cli(
        "replay",
        str(ck),
        "--data-dir",
        str(tmp_path / "d"),
        "--out",
        str(small_fs / "o"),
        "--no-trace",
    )
    assert (
        proc.returncode == 1
        and "checkpoint.bytes_per_checkpoint: 2.9 MiB per checkpoint, but the file "
        f"system of {small_fs / 'o'} has "
        in proc.stderr
    )
    assert not (small_fs / "o").exists()


@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
def test_replay_checkpoints_on_a_full_disk(tmp_path: Path, small_fs: Path, traced: bool) -> None:
    """Checkpoint writes hit ENOSPC: exit 1 (not 130: nobody pressed Ctrl-C) naming the file, partial
    metrics with the error, the replay's own checkpoint files removed, the user's file kept."""
    model = write_model(
        tmp_path,
        "dataset.format=raw",
        "checkpoint.enabled=true",
        "checkpoint.steps_between_checkpoints=2",
        "checkpoint.bytes_per_checkpoint=1500000",
        "checkpoint.files_per_checkpoint=2",
    )  # one fits (refused up front otherwise), two do not
    out = small_fs / "o"
    proc = run_cli(
        "replay",
        str(model),
        "--data-dir",
        str(tmp_path / "d"),
        "--out",
        str(out),
        *([] if traced else ["--no-trace"]),
    )
    no_traceback(proc.stderr)
    assert proc.returncode == 1, proc.stderr
    assert (
        "cannot write checkpoint (No space left on device); free space or choose another --out"
        in proc.stderr
    )
    assert str(out) in proc.stderr
    m = json.loads((out / "metrics.json").read_text())
    assert (
        m["complete"] is False and m["interrupted"] is False and "No space left" in m["errors"][0]
    )
    assert not (out / "checkpoints").exists()
    assert (small_fs / "user-file.txt").read_text() == "not dlreplay's"
    if traced:  # the trace of the failed replay is kept and loadable
        assert json.loads((out / "manifest.json").read_text())["status"] == "failed"
        assert run_cli("analyze", str(out)).returncode == 0


def test_read_only_targets_are_named(tmp_path: Path, read_only_fs: Path) -> None:
    """Unwritable even for root (test_replay.test_unwritable_data_dir_is_named uses /proc)."""
    model = write_model(tmp_path)
    gen = run_cli("generate", str(model), "--data-dir", str(read_only_fs / "d"))
    assert (
        gen.returncode == 1
        and "Read-only file system" in gen.stderr
        and str(read_only_fs / "d") in gen.stderr
    )
    rep = run_cli(
        "replay", str(model), "--data-dir", str(tmp_path / "d"), "--out", str(read_only_fs / "o")
    )
    assert (
        rep.returncode == 1
        and "Read-only file system" in rep.stderr
        and str(read_only_fs / "o") in rep.stderr
    )
    dis = run_cli("distill", str(REPO / "traces" / "npz_spawn"), "-o", str(read_only_fs / "m.yaml"))
    assert dis.returncode == 1 and "Read-only file system" in dis.stderr and "m.yaml" in dis.stderr
    cap = run_cli("capture", "--out", str(read_only_fs / "t"), "--", PY, "-c", "pass")
    assert cap.returncode == 1 and str(read_only_fs / "t") in cap.stderr
    for p in (gen, rep, dis, cap):
        no_traceback(p.stderr)


def test_simulated_enospc_generate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a mount: the third file write fails with ENOSPC."""
    from dlreplay.replay import GenerateConfig, ReplayError, generate_dataset
    from dlreplay.replay import generate as gen

    real, calls = gen.write_file, {"n": 0}

    def write_file(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(gen, "write_file", write_file)
    with pytest.raises(ReplayError, match="no space left on the device while generating"):
        generate_dataset(GenerateConfig(model=make_model(), data_dir=tmp_path / "d", jobs=1))
    assert journal_files(tmp_path / "d") == 2 and not (tmp_path / "d" / MANIFEST_NAME).exists()


def test_simulated_enospc_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlreplay.replay import ReplayConfig, ReplayError, engine, run_replay

    model = make_model(
        "dataset.format=raw",
        "reader.read_threads=0",
        "checkpoint.enabled=true",
        "checkpoint.steps_between_checkpoints=2",
        "checkpoint.bytes_per_checkpoint=100000",
    )
    real = os.write

    def write(fd: int, data) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".bin"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(engine.os, "write", write)
    with pytest.raises(
        ReplayError, match="cannot write checkpoint .No space left on device.; free space"
    ):
        run_replay(
            ReplayConfig(model=model, data_dir=tmp_path / "d", out=tmp_path / "o", trace=False)
        )
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["complete"] is False and "No space left" in m["errors"][0]
    assert not (tmp_path / "o" / "checkpoints").exists()


# --------------------------------------------------------------------------- a traced command that fails or is killed

JOB = """
import os, signal, sys
for _ in range(int(sys.argv[2])):
    with open("data/a.bin", "rb", buffering=0) as f:
        while f.read(65536):
            pass
if sys.argv[1] == "exit":
    sys.exit(3)
os.kill(os.getpid(), getattr(signal, sys.argv[1]))
"""


@pytest.mark.parametrize(
    ("how", "code", "status"),
    [("exit", 3, "failed"), ("SIGTERM", 143, "interrupted"), ("SIGKILL", 137, "failed")],
)
def test_failed_or_killed_job_exit_code_and_trace(
    tmp_path: Path, how: str, code: int, status: str
) -> None:
    """Exit code propagated (128+N when killed), trace kept and loadable; a SIGKILLed job's
    buffered events are lost, and analyze says why instead of printing an empty summary."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(os.urandom(300_000))
    (tmp_path / "job.py").write_text(JOB)
    out = tmp_path / "t"
    proc = run_cli(
        "capture",
        "--out",
        str(out),
        "--data-dir",
        "data",
        "--",
        PY,
        "job.py",
        how,
        "20",
        cwd=tmp_path,
    )
    no_traceback(proc.stderr)
    assert proc.returncode == code
    assert f"capture {status} (exit code {code}" in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == status and manifest["exit_code"] == code
    analyzed = run_cli("analyze", str(out), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    events = json.loads(analyzed.stdout)["events"]
    if how == "SIGKILL":
        assert "killed by SIGKILL" in proc.stderr and "the trace holds no events" in proc.stderr
        text = run_cli("analyze", str(out))
        assert (
            "killed by signal 9 (SIGKILL)" in text.stdout
            and "file is empty (0 bytes)" in text.stdout
        )
    else:
        assert events > 20 * 5  # open + reads + close per pass


def test_ctrl_c_while_capture_starts_the_job_is_forwarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a Ctrl-C that arrived while Popen was starting the job was recorded but
    not forwarded, so the job ran to its end (the traced replay then ignored Ctrl-C)."""
    from dlreplay.capture import CaptureConfig, run_capture
    from dlreplay.capture import run as capture_run

    real_popen = subprocess.Popen

    def popen(argv, *args, **kwargs):
        if argv[:2] == [PY, "-c"]:  # the job (platform.platform() runs `uname -p` earlier)
            signal.raise_signal(
                signal.SIGINT
            )  # handled by capture's handler: the job does not exist yet
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(capture_run.subprocess, "Popen", popen)
    t0 = time.monotonic()
    result = run_capture(
        CaptureConfig(command=(PY, "-c", "import time; time.sleep(60)"), out=tmp_path / "t")
    )
    assert time.monotonic() - t0 < 45
    assert result.status == "interrupted" and result.exit_code in (130, 128 + signal.SIGINT)


@pytest.mark.slow
def test_ctrl_c_during_traced_replay_keeps_metrics_and_trace(tmp_path: Path) -> None:
    model, data, out = write_model(tmp_path, *LONG), tmp_path / "d", tmp_path / "o"
    run_cli("generate", str(model), "--data-dir", str(data), check=True)
    proc = start_cli("replay", str(model), "--data-dir", str(data), "--out", str(out))
    wait_for_line(proc, "replay started (traced)")
    time.sleep(4.0)  # the traced child imports and starts its accelerator meanwhile
    ctrl_c(proc, "group")
    stdout, stderr = finish(proc)
    no_traceback(stderr)
    assert proc.returncode == 130, stderr
    m = json.loads((out / "metrics.json").read_text())
    assert m["complete"] is False and m["interrupted"] is True and len(m["epochs"]) < 400
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    analyzed = run_cli("analyze", str(out), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    assert (
        json.loads(analyzed.stdout)["events"] > 0
    )  # the trace of the partial run is kept and loadable


# --------------------------------------------------------------------------- a dataset changed after generation


@pytest.mark.parametrize("damage", ["deleted", "truncated", "grown"])
def test_dataset_damaged_after_generation_is_not_reused(tmp_path: Path, damage: str) -> None:
    """Files deleted or resized after generation: sizes are checked against the manifest before
    reuse; generate regenerates just those files (and says so), replay --no-generate refuses."""
    model, data = write_model(tmp_path, "dataset.format=npy"), tmp_path / "d"
    run_cli("generate", str(model), "--data-dir", str(data), check=True)
    before = digest_dir(data)
    victim = sorted((data / "train").rglob("*.npy"))[2]
    rel = victim.relative_to(data).as_posix()
    if damage == "deleted":
        victim.unlink()
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:100])
    else:
        victim.write_bytes(victim.read_bytes() + b"more")
    refused = run_cli(
        "replay",
        str(model),
        "--data-dir",
        str(data),
        "--out",
        str(tmp_path / "o"),
        "--no-trace",
        "--no-generate",
    )
    no_traceback(refused.stderr)
    assert (
        refused.returncode == 1
        and "files were deleted or changed size since it was generated" in refused.stderr
    )
    again = run_cli("generate", str(model), "--data-dir", str(data), check=True)
    assert "1 generated, 5 reused" in again.stdout
    assert f"1 file(s) of the dataset in {data} were missing or had changed size" in again.stderr
    assert (
        rel in again.stderr
        and ("missing" if damage == "deleted" else "bytes, listed") in again.stderr
    )
    assert digest_dir(data) == before  # regenerated byte for byte
    replayed = run_cli(
        "replay",
        str(model),
        "--data-dir",
        str(data),
        "--out",
        str(tmp_path / "o2"),
        "--no-trace",
        "--no-generate",
        check=True,
    )
    assert "metrics:" in replayed.stdout


# --------------------------------------------------------------------------- the job's own sitecustomize


USER_SITECUSTOMIZE = """
import os, sys
if __name__ == "sitecustomize":  # as Python imports it
    with open(os.environ["SC_LOG"], "a") as f:
        f.write(f"{os.getpid()} {os.path.basename(sys.argv[0]) if sys.argv else '-'}\\n")
"""

SPAWNING_JOB = """
import multiprocessing as mp, os, sys
import sitecustomize  # the job's own, not dlreplay's
assert sitecustomize.__file__.startswith(os.environ["SC_DIR"]), sitecustomize.__file__

def pid(_):
    return os.getpid()

if __name__ == "__main__":
    with mp.get_context("spawn").Pool(2) as pool:
        children = set(pool.map(pid, range(8)))
    print(os.getpid(), *children)
"""


@pytest.mark.parametrize("nested", [False, True], ids=["capture", "capture-in-capture"])
def test_users_sitecustomize_runs_exactly_once_per_process(tmp_path: Path, nested: bool) -> None:
    """The job's own sitecustomize.py (on PYTHONPATH) runs once in the job and in each spawned
    child, under its own name; also when captures nest (an inner capture's copy used to chain
    to the outer one and back until RecursionError, and the job's own never ran)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    (tmp_path / "job.py").write_text(SPAWNING_JOB)
    log = tmp_path / "sc.log"
    env = {**os.environ, "PYTHONPATH": str(site), "SC_LOG": str(log), "SC_DIR": str(site)}
    job = [PY, "job.py"]
    if nested:
        job = [PY, "-m", "dlreplay", "capture", "-q", "--out", str(tmp_path / "inner"), "--", *job]
    proc = subprocess.run(
        [PY, "-m", "dlreplay", "capture", "-q", "--out", str(tmp_path / "t"), "--", *job],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    no_traceback(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    assert "Error in sitecustomize" not in proc.stderr
    pids = [int(x) for x in proc.stdout.split()]
    runs = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert len(pids) >= 2  # the job and at least one spawned worker
    for pid in pids:
        assert runs.count(pid) == 1, (pid, runs)
    assert len(runs) == len(
        set(runs)
    )  # no process ran it twice (dlreplay's own processes run it once too)


def test_capture_data_dir_that_does_not_exist_is_reported(tmp_path: Path) -> None:
    """A --data-dir that does not exist (a typo) is named in the summary, also with -q, and kept in
    the manifest; one the job creates while it runs is not a mistake."""
    (tmp_path / "job.py").write_text("import os\nos.makedirs('made', exist_ok=True)\n")
    for quiet in ([], ["-q"]):
        out = tmp_path / f"t{len(quiet)}"
        proc = run_cli(
            "capture",
            *quiet,
            "--out",
            str(out),
            "--data-dir",
            "dta",
            "--data-dir",
            "made",
            "--",
            PY,
            "job.py",
            cwd=tmp_path,
        )
        no_traceback(proc.stderr)
        assert proc.returncode == 0, proc.stderr
        assert (
            f"--data-dir dta does not exist (in {tmp_path}): nothing under it was traced"
            in proc.stderr
        )
        assert "--data-dir made" not in proc.stderr
        assert json.loads((out / "manifest.json").read_text())["warnings"] == [
            line.split("warning: ", 1)[1]
            for line in proc.stderr.splitlines()
            if "warning: --data-dir" in line
        ]


# --------------------------------------------------------------------------- Ctrl-C: analyze, analyze --verify, demo


def test_ctrl_c_during_a_verify_replay_stops_analyze(tmp_path: Path) -> None:
    """A Ctrl-C during --verify's first replay used to be answered by that replay (partial
    metrics) and swallowed: the next replay ran and the table was shown as a finished result.
    The replay lasts at least its compute sleeps (~0.6 s), so the Ctrl-C sent as it starts lands in it."""
    proc = start_cli(
        "analyze",
        str(REPO / "traces" / "npz_starved"),
        "--verify",
        "--verify-dir",
        str(tmp_path / "v"),
    )
    wait_for_line(proc, "replay 1/")
    ctrl_c(proc, "group")
    stdout, stderr = proc.communicate(timeout=300)
    no_traceback(stderr)
    assert proc.returncode == 130, stderr
    assert "interrupted (Ctrl-C)" in stderr and "replay 2/" not in stderr
    assert "Verified by replay" not in stdout and "AU" not in stdout  # no result shown at all


@pytest.mark.parametrize("point", ["command", "command:exec"])
def test_ctrl_c_that_lands_in_exec_code_still_exits_130(point: str) -> None:
    """A Ctrl-C raised inside code that ``exec()`` runs from a string (a dataclass's methods,
    made as a module is imported: how the verify-replay test above failed in CI, 1 run in
    13 under load) left CPython's "unhandled KeyboardInterrupt" note set although dlreplay
    handled it, and ``python -m dlreplay`` then killed itself with SIGINT at exit (-2, not
    130). The test-only hold point waits inside such an ``exec`` (``command:exec``) or in
    plain code (``command``), as the command starts."""
    from dlreplay.interrupt import HOLD_ENV as POINT_ENV

    proc = start_cli(
        "analyze", str(REPO / "traces" / "npz_starved"), env={**os.environ, POINT_ENV: point}
    )
    wait_for_line(proc, f"held at {point} ")
    ctrl_c(proc, "group")
    stdout, stderr = proc.communicate(timeout=120)
    no_traceback(stderr)
    assert proc.returncode == 130, stderr
    assert stdout == "" and "interrupted (Ctrl-C)" in stderr


@pytest.mark.parametrize("target", ["group", "pid"])
def test_ctrl_c_during_distributed_analyze(tmp_path: Path, target: str) -> None:
    """--workers 2: Ctrl-C with parse tasks in flight (held there by the test-only hook): exit 130,
    no traceback from the client, the event loop or a worker process (the whole process group gets it)."""
    from dlreplay.interrupt import HOLD_ENV

    proc = start_cli(
        "analyze",
        str(REPO / "traces" / "npz_fork"),
        "--workers",
        "2",
        env={**os.environ, HOLD_ENV: "dask-parse"},
    )
    wait_for_line(proc, "held at dask-parse")
    ctrl_c(proc, target)
    stdout, stderr = proc.communicate(timeout=300)
    no_traceback(stderr)
    assert "Task exception was never retrieved" not in stderr
    assert proc.returncode == 130, stderr
    assert stdout == "" and "interrupted (Ctrl-C)" in stderr


@pytest.mark.slow
def test_ctrl_c_during_the_demo_capture(tmp_path: Path) -> None:
    """Ctrl-C while the demo's training job runs (it imports torch for over a second): exit 130, no
    traceback (the job's own output goes to job.log), no later step runs."""
    log = tmp_path / "demo" / "job.log"
    proc = start_cli("demo", "--out", str(tmp_path / "demo"))
    deadline = time.monotonic() + 300
    while (
        proc.poll() is None
        and time.monotonic() < deadline
        and "dataset" not in (log.read_text() if log.is_file() else "")
    ):
        time.sleep(0.05)  # the job's first line: it goes on to import torch and train
    ctrl_c(proc, "group")
    stdout, stderr = proc.communicate(timeout=300)
    no_traceback(stdout + stderr)
    assert proc.returncode == 130, stderr
    assert "interrupted (Ctrl-C)" in stderr and "[2/6]" in stdout and "[3/6]" not in stdout


# --------------------------------------------------------------------------- full disks during reports and spills


def test_full_disk_during_reports_exports_and_spills(tmp_path: Path, small_fs: Path) -> None:
    """Reports (HTML, Markdown with figures), a comparison report, a timeline export and a spill
    on a file system with 8 KiB left: exit 1, the message names the path, nothing partial is left
    (only the user's file and the filler remain)."""
    trace = str(REPO / "traces" / "npz_fork")
    (small_fs / "filler").write_bytes(b"\0" * (_free_bytes(small_fs) - 8192))
    runs = {
        "report.html": ("analyze", trace, "--report", str(small_fs / "report.html")),
        "report.md": ("analyze", trace, "--report", str(small_fs / "report.md")),
        "compare.md": ("compare", trace, trace, "--report", str(small_fs / "compare.md")),
        "timeline": ("export", trace, "-o", str(small_fs / "t.perfetto-trace")),
        "spill": ("analyze", trace, "--memory-limit", "1MB", "--spill-dir", str(small_fs)),
    }
    named = {
        "report.html": str(small_fs / "report.html"),
        "report.md": str(small_fs / "report.figures"),
        "compare.md": str(small_fs / "compare.figures"),
        "timeline": str(small_fs / "t.perfetto-trace"),
        "spill": str(small_fs / "dlreplay-spill-"),
    }
    for what, args in runs.items():
        proc = run_cli(*args)
        no_traceback(proc.stderr)
        assert proc.returncode == 1, (what, proc.stdout, proc.stderr)
        assert named[what] in proc.stderr and ("no space left" in proc.stderr.lower()), (
            what,
            proc.stderr,
        )
        assert sorted(p.name for p in small_fs.iterdir()) == ["filler", "user-file.txt"], what


# --------------------------------------------------------------------------- a replay worker killed by a fatal signal

CRASHING_REPLAY = r"""
import ctypes, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])  # the repository: its tests' model
from dlreplay.replay import ReplayConfig, run_replay
from dlreplay.replay.common import ReplayError
from dlreplay.replay import loader
from tests.test_replay import make_model


def read_sample(self, f, k, cpu0=None, busy0=None):
    if k == 0 and f == 3:
        ctypes.string_at(0)  # SIGSEGV in the worker, as a crash in a native library would
    return real(self, f, k, cpu0, busy0)


real = loader.SampleReader.read_sample
if __name__ == "__main__":  # (generate's pool spawns processes that import this file)
    loader.SampleReader.read_sample = read_sample  # forked workers inherit it
    out = Path(sys.argv[2])
    try:
        run_replay(ReplayConfig(model=make_model("reader.read_threads=2"), data_dir=out / "d",
                                out=out / "o", trace=False, loader=sys.argv[1]))
    except ReplayError as exc:
        print("replay error:", exc)
"""


@pytest.mark.parametrize(
    "loader",
    [
        "builtin",
        pytest.param(
            "torch",
            marks=pytest.mark.skipif(
                __import__("importlib").util.find_spec("torch") is None, reason="no torch"
            ),
        ),
    ],
)
def test_a_replay_worker_killed_by_a_fatal_signal_prints_its_stack(
    tmp_path: Path, loader: str
) -> None:
    """A worker that dies of SIGSEGV (a native library's crash) fails the replay with a clear
    error, and its Python stack (every thread's) is on stderr: PyTorch alone says only
    "killed by signal", its details "lost due to multiprocessing"."""
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_REPLAY)
    proc = subprocess.run(
        [PY, str(script), loader, str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "replay error:" in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    assert "Fatal Python error: Segmentation fault" in proc.stderr, proc.stderr[-3000:]
    stack = proc.stderr[proc.stderr.index("Fatal Python error") :]
    assert "in read_sample" in stack and "crash.py" in stack, stack[:3000]


CRASH_DURING_COMPUTE = r"""
import ctypes, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])  # the repository: its tests' model
from dlreplay.replay import ReplayConfig, run_replay
from dlreplay.replay.common import ReplayError
from dlreplay.replay import accelerator, loader
from tests.test_replay import make_model

out = Path(sys.argv[1])
MARK = out / "computing"


def read_sample(self, f, k, cpu0=None, busy0=None):
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    if info is not None and info.id == 1:  # batch 1's worker: dies once batch 0 is computing
        for _ in range(6000):
            if MARK.exists():
                ctypes.string_at(0)
            time.sleep(0.01)
    return real_read(self, f, k, cpu0, busy0)


def sleep(self, seconds, spent=0.0):
    if seconds >= 10:
        MARK.touch()
    return real_sleep(self, seconds, spent)


real_read = loader.SampleReader.read_sample
real_sleep = accelerator._Sleeper.sleep
if __name__ == "__main__":
    loader.SampleReader.read_sample = read_sample  # forked workers inherit it
    accelerator._Sleeper.sleep = sleep
    try:
        run_replay(ReplayConfig(
            model=make_model("reader.read_threads=2", "train.epochs=1",
                             "train.computation_time=20"),
            data_dir=out / "d", out=out / "o", trace=False, loader="torch"))
    except ReplayError as exc:
        print("replay error:", exc)
"""


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="no torch")
def test_a_worker_that_dies_while_the_step_computes_is_a_replay_error(tmp_path: Path) -> None:
    """PyTorch reports a dead worker through its SIGCHLD handler, which raises wherever the
    training process is: here in the compute sleep of batch 0 (batch 1's worker dies only once
    that sleep has begun), not in the batch wait. It is a replay error all the same, no
    traceback (CI once saw it escape when a crash happened to land in a step)."""
    script = tmp_path / "crash.py"
    script.write_text(CRASH_DURING_COMPUTE)
    proc = subprocess.run(
        [PY, str(script), str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300
    )
    assert (tmp_path / "computing").exists(), proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "replay error:" in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    assert "data-loader worker failed" in proc.stdout, proc.stdout
    assert "killed by signal: Segmentation fault" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr.split("Fatal Python error")[0], proc.stderr[-3000:]
