"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (stdlib only).

Used by the browser tests to open a page in real headless Chromium, wait until a
condition holds in the page (e.g. Perfetto drew our tracks), and take a screenshot.
Chromium reads commands on fd 3 and writes replies/events on fd 4, NUL-separated JSON.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any


class Browser:
    """Headless Chromium with one page; use as a context manager."""

    def __init__(
        self, executable: str, profile: Path, width: int = 1600, height: int = 1000
    ) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium expects the pipe on fds 3 (in) and 4 (out). Dup through temporaries
        # (a pipe end may already be 3 or 4); keep 3 and 4 open across close_fds.

        def to_3_and_4() -> None:
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._proc = subprocess.Popen(
            [
                executable,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            pass_fds=(3, 4, to_chrome_r, from_chrome_w),
            preexec_fn=to_3_and_4,  # noqa: PLW1509
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.console: list[str] = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self._session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)[
            "sessionId"
        ]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._proc.kill()
        self._proc.wait(timeout=10)
        os.close(self._to_chrome)
        os.close(self._from_chrome)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(
        self, method: str, session: bool = False, timeout: float = 60, **params: Any
    ) -> dict[str, Any]:
        """Send one command and return its result (events seen meanwhile are recorded)."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("method") == "Runtime.consoleAPICalled":
                args = reply["params"].get("args", [])
                self.console.append(
                    " ".join(str(a.get("value", a.get("description", ""))) for a in args)
                )
            elif reply.get("method") == "Runtime.exceptionThrown":
                self.console.append(
                    "exception: " + json.dumps(reply["params"].get("exceptionDetails", {}))[:500]
                )
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def goto(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 90, interval: float = 0.5) -> Any:
        """Poll a JS expression until it is truthy; returns its value (TimeoutError otherwise)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"page never satisfied: {expression}")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        path.write_bytes(base64.b64decode(data))
