"""Which traced processes are programs of their own, not data-loader workers: a process that
its parent started with another command line (``torchrun`` starting its ranks, a shell
starting python, ``mpiexec``'s proxy starting a rank) runs a program; a process forked
without ``exec`` (a DataLoader worker under ``fork``) runs its parent's.

DFTracer (2.0.3 and later) opens every process's file with a ``start`` record that names its
parent (``ppid``) and the hash of its command line (``cmd_hash``), and a string record
(``SH``) maps that hash to the command line. The event table keeps neither, so they are read
through :mod:`.sidecar` (one read of the trace serves every such pass).

A child of Python's ``multiprocessing`` started anew (``spawn``, ``forkserver``: its command
line runs ``multiprocessing``'s own entry point) is a worker all the same, never a program.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from .sidecar import fields_of, matching_lines, register

__all__ = ["programs"]

_START = register(
    re.compile(rb'^\{[^\n]*"name":"start","cat":"dftracer"[^\n]*"cmd_hash":[^\n]*$', re.M),
    b'"name":"start","cat":"dftracer"',
)
_STRING = register(
    re.compile(rb'^\{[^\n]*"name":"SH","cat":"dftracer"[^\n]*$', re.M),
    b'"name":"SH","cat":"dftracer"',
)
#: A command line with one of these runs ``multiprocessing``'s entry point: a worker.
_MULTIPROCESSING = ("multiprocessing.spawn", "multiprocessing.forkserver", "--multiprocessing-fork")


def programs(source: str | Path | None) -> set[int]:
    """The pids of the processes of the trace at *source* whose parent is traced and ran
    another command line (see the module doc); empty without start records (DFTracer before
    2.0.3, or *source* not a trace). A pid started twice with another parent or command line
    (two hosts, or a pid used again) is left out: its parent cannot be told."""
    starts = fields_of(
        matching_lines(source, _START),
        {
            "pid": ("$.pid", pl.Int64),
            "ppid": ("$.args.ppid", pl.Int64),
            "cmd": ("$.args.cmd_hash", pl.String),
        },
    ).drop_nulls()
    if starts.is_empty():
        return set()
    lines = fields_of(
        matching_lines(source, _STRING),
        {"cmd": ("$.args.value", pl.String), "line": ("$.args.name", pl.String)},
    ).unique("cmd")
    once = starts.unique().filter(pl.len().over("pid") == 1)
    parents = once.select(pl.col("pid").alias("ppid"), pl.col("cmd").alias("parent_cmd"))
    launched = (
        once.join(parents, on="ppid")
        .filter(pl.col("cmd") != pl.col("parent_cmd"))
        .join(lines, on="cmd")  # the command line must be known to be no multiprocessing child
        .filter(
            ~pl.any_horizontal(
                pl.col("line").str.contains(m, literal=True) for m in _MULTIPROCESSING
            )
        )
    )
    return set(launched["pid"].to_list())
