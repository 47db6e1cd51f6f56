"""Exposure and data-safety checks (issues #7, #18): the viewer listens on loopback only; no shell
anywhere; paths read from files stay inside their directory; one writer per output directory."""

from __future__ import annotations

import ast
import json
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlreplay.osutil import CLAIM_NAME
from dlreplay.replay.common import JOURNAL_NAME, MANIFEST_NAME

from .conftest import REPO, TRACES, check_no_traceback, run_cli


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Exception ignored" not in text, text
    check_no_traceback(text)


SOURCE_DIRS = ("dlreplay", "capture", "analyze", "replay", "examples", "benchmarks")


def _non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback (the default route's), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def _listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses with a TCP socket listening on ``port`` (from /proc/net)."""
    out = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:  # 0A = LISTEN
                if width == 8:
                    out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
                else:
                    out.add(addr)
    return out


def test_view_listens_on_loopback_only(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlreplay",
            "view",
            str(TRACES / "npz_spawn"),
            "--port",
            "0",
            "--no-browser",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port, text, deadline = None, "", time.monotonic() + 120
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
                text += line
                m = re.search(r"on 127\.0\.0\.1:(\d+)", line)
                port = int(m.group(1)) if m else None
        assert port, (
            f"no 'serving ... on 127.0.0.1:PORT' line:\n{text}{proc.stderr.read() if proc.poll() else ''}"
        )
        assert _listening_addresses(port) == {"127.0.0.1"}  # not 0.0.0.0, not ::
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
        other = _non_loopback_ipv4()
        if other is None:
            pytest.skip("this machine has no non-loopback IPv4 address to try")
        with pytest.raises(OSError):  # ConnectionRefusedError: nothing listens there
            socket.create_connection((other, port), timeout=10).close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        no_traceback(err)


def _python_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py"))


def test_no_shell_in_the_source_tree() -> None:
    """No ``shell=True``, ``os.system``, ``os.popen`` or ``subprocess.getoutput`` (text and syntax tree)."""
    files = _python_files()
    assert len(files) > 20
    text_hits = [
        f"{p.relative_to(REPO)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"shell\s*=\s*True|os\.system\s*\(|os\.popen\s*\(", line)
    ]
    assert text_hits == []
    shell_calls = {"system", "popen", "getoutput", "getstatusoutput", "spawnlp", "spawnvp"}
    ast_hits = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            shell = [
                k
                for k in node.keywords
                if k.arg == "shell"
                and not (isinstance(k.value, ast.Constant) and k.value.value is False)
            ]
            if name in shell_calls or shell:
                ast_hits.append(f"{p.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert ast_hits == []


# --------------------------------------------------------------------------- paths read from files stay inside


def _victims(tmp_path: Path) -> tuple[Path, Path]:
    """Two files of the user's outside any dataset: one next to it, one far away (by absolute path)."""
    near, far = tmp_path / "victim.txt", tmp_path / "elsewhere" / "victim.txt"
    far.parent.mkdir()
    near.write_text("keep me")
    far.write_text("keep me too")
    return near, far


def _forged_dataset(tmp_path: Path, name: str, entries: list, *, digest: str | None = None) -> Path:
    """A directory F holding a copy of a real dataset manifest (or journal) with forged ``files``."""
    from .test_replay import write_model

    model = write_model(tmp_path)
    run_cli("generate", str(model), "--data-dir", str(tmp_path / "d"), check=True)
    doc = json.loads((tmp_path / "d" / MANIFEST_NAME).read_text())
    doc["model_digest"] = digest or "0" * 64  # "another model": generate --force replaces it
    doc["files"] = entries if name == MANIFEST_NAME else {str(i): e for i, e in enumerate(entries)}
    forged = tmp_path / "F"
    forged.mkdir()
    (forged / name).write_text(json.dumps(doc))
    return forged


@pytest.mark.parametrize("name", [MANIFEST_NAME, JOURNAL_NAME])
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "not-a-path"])
def test_forged_dataset_listing_deletes_nothing_outside(
    tmp_path: Path, name: str, how: str
) -> None:
    """Issue #18 item 1: `generate --force` over a manifest/journal listing files outside its
    directory used to delete them. Now the file is refused, naming it, and nothing is deleted."""
    from .test_replay import write_model

    near, far = _victims(tmp_path)
    entries = {
        "dotdot": [{"path": "../victim.txt", "bytes": 7}],
        "absolute": [{"path": str(far), "bytes": 11}],
        "symlink": [{"path": "out/victim.txt", "bytes": 11}],
        "not-a-path": [{"path": 123, "bytes": 1}, {"path": "../victim.txt", "bytes": 7}],
    }[how]
    forged = _forged_dataset(tmp_path, name, [{"path": "train/mine.npz", "bytes": 1}, *entries])
    (forged / "train").mkdir()
    (forged / "train" / "mine.npz").write_bytes(b"x")
    (forged / "out").symlink_to(far.parent)  # inside F by name, outside by what it resolves to
    proc = run_cli("generate", str(write_model(tmp_path)), "--data-dir", str(forged), "--force")
    no_traceback(proc.stderr)
    assert proc.returncode == 1, proc.stderr
    assert f"{forged / name}: lists the path" in proc.stderr and "outside" in proc.stderr
    assert near.read_text() == "keep me" and far.read_text() == "keep me too"
    assert (
        forged / "train" / "mine.npz"
    ).exists()  # refused as a whole: not even its own files went
    assert (forged / name).exists()


def test_the_issue_reproduction_deletes_nothing(tmp_path: Path) -> None:
    """The exact steps of issue #18: both victims survive, the command fails naming the manifest."""
    from .test_replay import write_model

    near, far = _victims(tmp_path)
    forged = _forged_dataset(
        tmp_path, MANIFEST_NAME, [{"path": "../victim.txt"}, {"path": str(far)}]
    )
    proc = run_cli("generate", str(write_model(tmp_path)), "--data-dir", str(forged), "--force")
    assert proc.returncode == 1 and str(forged / MANIFEST_NAME) in proc.stderr
    assert near.read_text() == "keep me" and far.read_text() == "keep me too"


def test_replay_refuses_a_ready_manifest_that_points_outside(tmp_path: Path) -> None:
    """A complete manifest of the same dataset whose paths lead out: replay reads nothing outside."""
    from .test_replay import write_model

    model, data = write_model(tmp_path), tmp_path / "d"
    run_cli("generate", str(model), "--data-dir", str(data), check=True)
    doc = json.loads((data / MANIFEST_NAME).read_text())
    doc["files"][0]["path"] = "../../../../../../../../etc/passwd"
    (data / MANIFEST_NAME).write_text(json.dumps(doc))
    proc = run_cli(
        "replay", str(model), "--data-dir", str(data), "--out", str(tmp_path / "o"), "--no-trace"
    )
    no_traceback(proc.stderr)
    assert proc.returncode == 1 and f"{data / MANIFEST_NAME}: lists the path '../../" in proc.stderr


def test_confined_path_unit(tmp_path: Path) -> None:
    from dlreplay.errors import UnsafePathError
    from dlreplay.osutil import confined_path

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "up").symlink_to(tmp_path)
    assert confined_path(tmp_path / "sub", "a/b.npz", "m.json") == tmp_path / "sub" / "a" / "b.npz"
    assert (
        confined_path(tmp_path / "sub", "up/sub/x", "m.json")
        == tmp_path / "sub" / "up" / "sub" / "x"
    )
    for bad in ("../x", "a/../../x", "/etc/passwd", "", "a\x00b", None, 3, ["a"], "up/x"):
        with pytest.raises(UnsafePathError, match="m.json: lists the path"):
            confined_path(tmp_path / "sub", bad, "m.json")


# --------------------------------------------------------------------------- one writer per output directory


HOLD = """
import sys, time
from dlreplay.osutil import claim_directory
claim_directory(sys.argv[1], "--out")
print("claimed", flush=True)
time.sleep(600)
"""


@pytest.fixture
def held(tmp_path: Path):
    """Claim a directory from another process (as a running dlreplay command does); yields a function."""
    procs: list[subprocess.Popen[str]] = []

    def hold(path: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline() == "claimed\n"
        procs.append(proc)
        return proc

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def test_claimed_outputs_are_refused_naming_the_holder(tmp_path: Path, held) -> None:
    """Replay --out, generate --data-dir and capture --out claimed by another process: refused
    (exit 1, the holder's pid named), nothing written; once the holder is gone (killed: the kernel
    drops its lock), the same commands run."""
    from .test_replay import write_model

    model = write_model(tmp_path, "dataset.format=raw")
    run_cli("generate", str(model), "--data-dir", str(tmp_path / "d"), check=True)
    cases = {
        "replay": (
            "replay",
            str(model),
            "--data-dir",
            str(tmp_path / "d"),
            "--out",
            str(tmp_path / "r"),
            "--no-trace",
        ),
        "generate": ("generate", str(model), "--data-dir", str(tmp_path / "g")),
        "capture": ("capture", "--out", str(tmp_path / "c"), "--", sys.executable, "-c", "pass"),
    }
    for what, args in cases.items():
        target = tmp_path / what[0]
        holder = held(target)
        proc = run_cli(*args)
        no_traceback(proc.stderr)
        assert proc.returncode == 1, (what, proc.stderr)
        assert (
            f"{target} is being written by another dlreplay command (pid {holder.pid}"
            in proc.stderr
        )
        assert ("--data-dir" if what == "generate" else "--out") in proc.stderr
        assert [p.name for p in target.iterdir()] == [CLAIM_NAME]  # the loser wrote nothing
        holder.kill()
        holder.wait()
        run_cli(*args, check=True)
        assert CLAIM_NAME not in {p.name for p in target.iterdir()}  # released at the end


def test_two_replays_into_one_out_at_once(tmp_path: Path) -> None:
    """Issue #18 item 2: two traced replays started together into one --out: exactly one runs;
    the other is refused (claimed, or not empty if it came second); one run's files only."""
    from .test_replay import write_model

    model = write_model(tmp_path, "dataset.format=raw", "train.epochs=3")
    run_cli("generate", str(model), "--data-dir", str(tmp_path / "d"), check=True)
    out = tmp_path / "r"
    args = [
        sys.executable,
        "-m",
        "dlreplay",
        "replay",
        str(model),
        "--data-dir",
        str(tmp_path / "d"),
        "--out",
        str(out),
    ]
    procs = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    for r in results:
        no_traceback(r[1] + r[2])
    codes = sorted(r[0] for r in results)
    assert codes == [0, 1], results
    loser = next(r for r in results if r[0] == 1)
    no_traceback(loser[2])
    assert "being written by another dlreplay command" in loser[2] or "is not empty" in loser[2]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["complete"] is True
    manifest = json.loads((out / "manifest.json").read_text())
    assert {f["name"] for f in manifest["files"]} == {
        p.name for p in out.glob("*.pfw*")
    }  # no stray traces


def test_two_generates_of_different_models_into_one_dir(tmp_path: Path) -> None:
    """Concurrent generation into one --data-dir never mixes two datasets: one wins, the other is
    refused (claimed, or another model's dataset if it came second); the winner's dataset is whole."""
    from dlreplay.model import load_model
    from dlreplay.replay import dataset_digest

    from .test_replay import write_model

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    models = [
        write_model(tmp_path / "a", "dataset.num_files=40"),
        write_model(tmp_path / "b", "dataset.num_files=41"),
    ]
    data = tmp_path / "d"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dlreplay", "generate", str(m), "--data-dir", str(data)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for m in models
    ]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    for r in results:
        no_traceback(r[1] + r[2])
    assert sorted(r[0] for r in results) == [0, 1], results
    winner = models[[r[0] for r in results].index(0)]
    loser = next(r for r in results if r[0] == 1)
    no_traceback(loser[2])
    assert (
        "being written by another dlreplay command" in loser[2] or "another model shape" in loser[2]
    )
    manifest = json.loads((data / MANIFEST_NAME).read_text())
    assert (
        manifest["model_digest"] == dataset_digest(load_model(winner))
        and manifest["complete"] is True
    )
    assert sorted(
        p.relative_to(data).as_posix() for p in (data / "train").rglob("*") if p.is_file()
    ) == sorted(f["path"] for f in manifest["files"])


def test_claim_is_reentrant_and_released(tmp_path: Path) -> None:
    from dlreplay.osutil import claim_directory

    def other_process_claims() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", HOLD.replace("time.sleep(600)", ""), str(tmp_path / "o")],
            capture_output=True,
            text=True,
        )

    a = claim_directory(tmp_path / "o", "--out")
    b = claim_directory(tmp_path / "o", "--out")  # same process (a traced replay, then its capture)
    assert a is b
    b.release()
    refused = other_process_claims()
    assert "InUseError" in refused.stderr and "choose another --out" in refused.stderr
    a.release()
    assert list((tmp_path / "o").iterdir()) == []
    assert other_process_claims().returncode == 0  # released: another process gets it
    assert list((tmp_path / "o").iterdir()) == [
        tmp_path / "o" / CLAIM_NAME
    ]  # it exited without release
    with claim_directory(
        tmp_path / "o", "--out"
    ):  # its lock died with it: the leftover file is reclaimed
        assert "InUseError" in other_process_claims().stderr


# --------------------------------------------------------------------------- no traceback from any CLI run


def test_every_cli_run_in_the_suite_is_checked_for_tracebacks() -> None:
    """run_cli checks every run's output (conftest.check_no_traceback); a test that starts the
    CLI itself must check its output too: every function that spawns ``python -m dlreplay``
    calls the check. The checker itself fails on what Python prints."""
    unchecked = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            body = ast.unparse(node)
            if re.search(r"'-m', 'dlreplay'", body) and not re.search(
                r"\b(no_traceback|check_no_traceback)\(", body
            ):
                callers = [
                    n.name
                    for n in ast.walk(tree)
                    if isinstance(n, ast.FunctionDef)
                    and re.search(rf"\b{node.name}\(", ast.unparse(n))
                    and n is not node
                ]
                checked = [
                    c
                    for c in callers
                    if "no_traceback("
                    in ast.unparse(
                        next(
                            n
                            for n in ast.walk(tree)
                            if isinstance(n, ast.FunctionDef) and n.name == c
                        )
                    )
                ]
                if not callers or len(checked) < len(callers):
                    unchecked.append(f"{path.name}::{node.name}")
    assert unchecked == [], f"spawn the CLI without checking for a traceback: {unchecked}"
    for bad in (
        'Traceback (most recent call last):\n  File "/x.py", line 1, in <module>\nValueError',
        "Exception ignored in: <function f>",
        "Error in sitecustomize; set PYTHONVERBOSE",
        "Fatal Python error: Segmentation fault",
    ):
        with pytest.raises(AssertionError, match="a Python traceback"):
            check_no_traceback("ok\n", bad)
    check_no_traceback(
        'dlreplay: error: trace processor: Traceback (most recent call last):\n  File "stdin"'
    )


SHARE = """
import sys, time
from dlreplay.osutil import share_directory
share_directory(sys.argv[1], "--data-dir")
print("claimed", flush=True)
time.sleep(600)
"""


def test_dataset_read_by_a_replay_is_not_rewritten(tmp_path: Path, held) -> None:
    """A replay holds its dataset (shared) while it reads: `generate --force` of another model into
    that directory is refused naming the reader and deletes nothing; a replay of a dataset being
    written is refused naming the writer; readers share; the last reader removes the claim file."""
    from .test_replay import write_model

    model = write_model(tmp_path, "dataset.format=raw")
    (tmp_path / "o").mkdir()
    other = write_model(tmp_path / "o", "dataset.format=raw", "dataset.num_files=5")
    data = tmp_path / "d"
    run_cli("generate", str(model), "--data-dir", str(data), check=True)

    def files() -> list[tuple[str, int, int]]:
        return sorted(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns)
            for p in data.rglob("*")
            if p.is_file() and p.name != CLAIM_NAME
        )

    before = files()

    reader = subprocess.Popen(
        [sys.executable, "-c", SHARE, str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "claimed\n"
        proc = run_cli("generate", str(other), "--data-dir", str(data), "--force")
        no_traceback(proc.stderr)
        assert proc.returncode == 1, proc.stderr
        assert f"{data} is being read by a running dlreplay replay" in proc.stderr
        assert files() == before  # nothing deleted or rewritten
        # a second reader shares the dataset with the first: the replay runs, and leaves the
        # claim file to the reader still holding it
        run_cli(
            "replay",
            str(model),
            "--data-dir",
            str(data),
            "--out",
            str(tmp_path / "r1"),
            "--no-trace",
            check=True,
        )
        assert (data / CLAIM_NAME).exists()
    finally:
        reader.kill()
        reader.wait()

    run_cli(
        "replay",
        str(model),
        "--data-dir",
        str(data),
        "--out",
        str(tmp_path / "r2"),
        "--no-trace",
        check=True,
    )
    assert not (data / CLAIM_NAME).exists()  # the last (only) reader removed it

    writer = held(data)
    proc = run_cli(
        "replay", str(model), "--data-dir", str(data), "--out", str(tmp_path / "r3"), "--no-trace"
    )
    no_traceback(proc.stderr)
    assert proc.returncode == 1, proc.stderr
    assert f"{data} is being written by another dlreplay command (pid {writer.pid}" in proc.stderr
    writer.kill()
    writer.wait()
    run_cli("generate", str(other), "--data-dir", str(data), "--force", check=True)


EMPTY_HOLD = """
import fcntl, os, sys, time
fd = os.open(os.path.join(sys.argv[1], ".dlreplay-claim"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("claimed", flush=True)
time.sleep(600)
"""


def test_writer_that_has_not_named_itself_yet_is_a_writer(tmp_path: Path) -> None:
    """A writer between taking its lock and writing its name in the claim file (two generates
    started together) is told apart from readers by the lock itself, not by the file's text:
    the loser hears "being written", never "being read by a replay"."""
    from .test_replay import write_model

    model = write_model(tmp_path, "dataset.format=raw")
    data = tmp_path / "d"
    data.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", EMPTY_HOLD, str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "claimed\n"
        proc = run_cli("generate", str(model), "--data-dir", str(data))
        no_traceback(proc.stderr)
        assert proc.returncode == 1, proc.stderr
        assert (
            f"{data} is being written by another dlreplay command (another process)" in proc.stderr
        )
    finally:
        holder.kill()
        holder.wait()
