"""Which traced processes are programs of their own, not data-loader workers: a process that
its parent started with another command line (``torchrun`` starting its ranks, a shell
starting python, ``mpiexec``'s proxy starting a rank) runs a program; a process forked
without ``exec`` (a DataLoader worker under ``fork``) runs its parent's.

DFTracer (2.0.3 and later) opens every process's file with a ``start`` record that names its
parent (``ppid``) and the hash of its command line (``cmd_hash``), and a string record
(``SH``) maps that hash to the command line. Both sit in the first lines of the file, so only
a file's head is read (:data:`HEAD_BYTES` of text at most), not the trace.

A child of Python's ``multiprocessing`` started anew (``spawn``, ``forkserver``: its command
line runs ``multiprocessing``'s own entry point) is a worker all the same, never a program.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from .inputs import find_inputs

__all__ = ["HEAD_BYTES", "programs"]

#: Text read from the head of each trace file to find its start and string records.
HEAD_BYTES = 256 << 10
#: Compressed bytes fed to the decompressor at a time.
_CHUNK = 1 << 16
#: A command line with one of these runs ``multiprocessing``'s entry point: a worker.
_MULTIPROCESSING = ("multiprocessing.spawn", "multiprocessing.forkserver", "--multiprocessing-fork")


def programs(source: str | Path | None) -> set[int]:
    """The pids of the processes of trace directory *source* whose parent is traced and ran
    another command line (see the module doc); empty when *source* is not a trace directory
    or its files have no start records (DFTracer before 2.0.3). A pid started twice (two
    hosts, or a pid used again) is left out: its parent cannot be told."""
    if source is None:
        return set()
    try:
        files, _ = find_inputs(source)
    except Exception:  # noqa: BLE001 - not a trace directory: nothing known
        return set()
    starts: dict[int, tuple[int, str]] = {}
    strings: dict[str, str] = {}  # a forked child's file need not repeat its parent's strings
    twice: set[int] = set()
    for f in files:
        heads, named = _heads(f)
        strings.update(named)
        for pid, ppid, cmd in heads:
            if pid in starts and starts[pid] != (ppid, cmd):
                twice.add(pid)
            starts[pid] = (ppid, cmd)
    out = set()
    for pid, (ppid, cmd) in starts.items():
        parent = starts.get(ppid)
        if pid in twice or parent is None or parent[1] == cmd:
            continue
        line = strings.get(cmd)
        if line is not None and not any(m in line for m in _MULTIPROCESSING):
            out.add(pid)
    return out


def _heads(path: Path) -> tuple[list[tuple[int, int, str]], dict[str, str]]:
    """((pid, ppid, command line's hash) of the start records, {hash: string} of the string
    records) in the head of one trace file."""
    text = _head_text(path)
    starts: list[tuple[int, int, str]] = []
    strings: dict[str, str] = {}
    for line in text.splitlines():
        if '"start"' not in line and '"SH"' not in line:
            continue
        try:
            rec = json.loads(line.rstrip().rstrip(","))
        except ValueError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("args"), dict):
            continue
        args = rec["args"]
        if rec.get("name") == "SH" and isinstance(args.get("value"), str):
            strings[args["value"]] = str(args.get("name"))
        elif rec.get("name") == "start" and rec.get("cat") == "dftracer":
            pid, ppid, cmd = rec.get("pid"), args.get("ppid"), args.get("cmd_hash")
            if isinstance(pid, int) and isinstance(ppid, int) and isinstance(cmd, str):
                starts.append((pid, ppid, cmd))
    return starts, strings


def _head_text(path: Path) -> str:
    """Up to :data:`HEAD_BYTES` of a trace file's text from its start (gzip members in turn;
    a damaged stream ends the text where it breaks)."""
    out = bytearray()
    try:
        with open(path, "rb") as fh:
            if not path.name.endswith(".gz"):
                return fh.read(HEAD_BYTES).decode("utf-8", "replace")
            d = zlib.decompressobj(wbits=31)
            while len(out) < HEAD_BYTES:
                chunk = d.unconsumed_tail or d.unused_data or fh.read(_CHUNK)
                if not chunk:
                    break
                if d.eof:  # the next gzip member
                    d = zlib.decompressobj(wbits=31)
                out += d.decompress(chunk, HEAD_BYTES - len(out))
    except (OSError, zlib.error):
        pass
    return out.decode("utf-8", "replace")
