"""Exposure checks (issue #7): the viewer listens on loopback only; no shell anywhere."""

from __future__ import annotations

import ast
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, TRACES

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
    proc = subprocess.Popen([sys.executable, "-m", "dlreplay", "view", str(TRACES / "npz_spawn"), "--port", "0",
                             "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port, text, deadline = None, "", time.monotonic() + 120
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
                text += line
                m = re.search(r"on 127\.0\.0\.1:(\d+)", line)
                port = int(m.group(1)) if m else None
        assert port, f"no 'serving ... on 127.0.0.1:PORT' line:\n{text}{proc.stderr.read() if proc.poll() else ''}"
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
        proc.wait(timeout=30)


def _python_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py"))


def test_no_shell_in_the_source_tree() -> None:
    """No ``shell=True``, ``os.system``, ``os.popen`` or ``subprocess.getoutput`` (text and syntax tree)."""
    files = _python_files()
    assert len(files) > 20
    text_hits = [f"{p.relative_to(REPO)}:{i}" for p in files
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"shell\s*=\s*True|os\.system\s*\(|os\.popen\s*\(", line)]
    assert text_hits == []
    shell_calls = {"system", "popen", "getoutput", "getstatusoutput", "spawnlp", "spawnvp"}
    ast_hits = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            shell = [k for k in node.keywords if k.arg == "shell"
                     and not (isinstance(k.value, ast.Constant) and k.value.value is False)]
            if name in shell_calls or shell:
                ast_hits.append(f"{p.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert ast_hits == []
