"""Impossible values on the spilled load (``analyze --memory-limit``, issue #45 items 2 and 3):
set aside or read as null, and named, exactly as the local load does.

Each trace is a copy of ``traces/npz_fork`` changed as in ``tests/test_bad_values.py`` (real
corpus lines: timestamps negated, durations negative, ``ret`` as text, another run's files
beside the run's, a gzip member appended twice). The spilled load (1 MB: every file a spill
group of its own) must give the local load's totals and per-file reports, word for word.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlreplay.analyze.trace.spill import spilled_trace

from .conftest import TRACES
from .test_bad_values import SRC, WORKER, _negate, _ts, changed

KEYS = ("events", "bytes_read", "dataset_bytes_read", "duration_s", "item_events", "incomplete")


def both(cli, trace: Path, spill: Path) -> tuple[dict, dict]:
    """``analyze --json`` of ``trace`` in memory and spilled (under ``spill``)."""
    out = []
    for extra in ((), ("--memory-limit", "1MB", "--spill-dir", str(spill))):
        proc = cli("analyze", str(trace), "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        out.append(json.loads(proc.stdout))
    return out[0], out[1]


def same(local: dict, spilled: dict) -> None:
    for key in KEYS:
        assert spilled[key] == local[key], key
    assert spilled["files"] == local["files"]


def _ret_text(r: dict) -> None:
    if r.get("name") == "read":
        r["args"]["ret"] = "many"


@pytest.mark.parametrize(
    "kind",
    ["negated-ts", "negative-read-time", "ret-as-text", "other-run", "other-run-no-manifest"],
)
def test_the_spilled_load_sets_aside_what_the_local_load_does(
    tmp_path: Path, cli, kind: str
) -> None:
    """**Was**: the spilled load summed them all (e.g. negated timestamps: "events over
    997,397 h"; another run's files: their reads summed), and named none."""
    change = {
        "negated-ts": _ts(lambda t: -t),
        "negative-read-time": _negate(("read",), first_only=True),
        "ret-as-text": _ret_text,
    }.get(kind, lambda r: None)
    trace = changed(tmp_path, WORKER, change, manifest=kind != "other-run-no-manifest")
    if kind.startswith("other-run"):
        for p in sorted((TRACES / "npz_spawn").glob("*.pfw.gz")):
            shutil.copy(p, trace / f"x{p.name}")
    local, spilled = both(cli, trace, tmp_path / "sp")
    same(local, spilled)
    said = [p for f in spilled["files"] for p in f["problems"]]
    assert any("(set aside)" in p or "(read as null)" in p for p in said), said


def test_a_gzip_member_twice_is_counted_once_when_spilled(tmp_path: Path, cli) -> None:
    """A file's gzip member appended to it again: its repeats set aside in the spill as in
    memory (the events and bytes of the clean trace)."""
    trace = changed(tmp_path, WORKER, lambda r: None)
    data = (SRC / WORKER).read_bytes()
    (trace / WORKER).write_bytes(data + data)
    local, spilled = both(cli, trace, tmp_path / "sp")
    same(local, spilled)
    (rep,) = [f for f in spilled["files"] if f["name"] == WORKER]
    assert any("the same events twice" in p for p in rep["problems"])
    clean = json.loads(cli("analyze", str(SRC), "--json").stdout)
    assert spilled["events"] == clean["events"]
    assert spilled["bytes_read"] == clean["bytes_read"]


def test_spilled_table_is_the_checked_local_table(tmp_path: Path) -> None:
    """The spilled table holds the rows the local load keeps (one file's timestamps negated:
    its events set aside), row for row, and the same per-file reports."""
    from polars.testing import assert_frame_equal

    from dlreplay.analyze import load_trace

    trace = changed(tmp_path, WORKER, _ts(lambda t: -t))
    local = load_trace(trace)
    with spilled_trace(trace, group_stored_bytes=1, spill_dir=tmp_path / "sp") as sp:
        table = sp.collect()
        files = sp.files
    assert_frame_equal(table, local.events, check_exact=True)
    assert files == local.files
