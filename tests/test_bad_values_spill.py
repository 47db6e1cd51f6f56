"""Impossible values on the spilled load (``analyze --memory-limit``, issue #45 items 2 and 3):
set aside or read as null, and named, exactly as the local load does.

Each trace is a copy of ``traces/npz_fork`` changed as in ``tests/test_bad_values.py`` (real
corpus lines: timestamps negated, durations negative, ``ret`` as text, another run's files
beside the run's, a gzip member appended twice). The spilled load (1 MB: every file a spill
group of its own) must give the local load's totals and per-file reports, word for word.
"""

from __future__ import annotations

import gzip
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


@pytest.mark.parametrize("how", ["member-appended", "recompressed-copy"])
def test_a_gzip_member_twice_is_counted_once_when_spilled(tmp_path: Path, cli, how: str) -> None:
    """A file's gzip member appended to it again; a copy of a file compressed anew, in another
    spill group than its original: set aside in the spill as in memory (the events and bytes
    of the clean trace). **Was**: the copy summed (+530 events) when spilled."""
    trace = changed(tmp_path, WORKER, lambda r: None)
    data = (SRC / WORKER).read_bytes()
    named = WORKER if how == "member-appended" else "trace-again-fork.pfw.gz"
    if how == "member-appended":
        (trace / WORKER).write_bytes(data + data)
    else:
        (trace / named).write_bytes(gzip.compress(gzip.decompress(data), compresslevel=1))
    local, spilled = both(cli, trace, tmp_path / "sp")
    same(local, spilled)
    (rep,) = [f for f in spilled["files"] if f["name"] == named]
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


def _twice(line: str, k: int) -> str:
    """``line`` (a complete event) with a kept key given twice, three ways in turn: a wrong
    value before the right one (``name``, ``ts``), a key twice inside ``args``, ``args`` twice."""
    if k % 3 == 0:
        return line.replace('"name":', '"name":"open","name":', 1).replace(
            '"ts":', '"ts":"x","ts":', 1
        )
    if k % 3 == 1:
        return line.replace('"args":{', '"args":{"ret":"bad","fhash":null,"hhash":7,', 1)
    return line.replace('"ph":', '"args":{"ret":-1},"ph":', 1)


def test_thousands_of_lines_with_a_key_given_twice(tmp_path: Path, cli, monkeypatch) -> None:
    """Every event line of a real trace (3,300 lines) with a key given twice: read as JSON
    readers read it (the last value), the same in both parsers, counted per file as
    "N event(s) with a key given twice" (not damage); analyze, distill and export run and
    give the clean trace's totals. **Was**: the first value won in the loader while JSON
    readers take the last (every event renamed "open", a trace of "no events" when the first
    ``ts`` was text), nothing said."""
    from polars.testing import assert_frame_equal

    from dlreplay.analyze import load_trace
    from dlreplay.analyze.trace.native import PARSER_ENV

    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    for f in trace.glob("*.pfw.gz"):
        lines = gzip.decompress(f.read_bytes()).decode().splitlines()
        out = [_twice(ln, k) if '"id":' in ln else ln for k, ln in enumerate(lines)]
        f.write_bytes(gzip.compress(("\n".join(out) + "\n").encode(), mtime=0))
    clean = json.loads(cli("analyze", str(SRC), "--json").stdout)
    payload = json.loads(cli("analyze", str(trace), "--json", check=True).stdout)
    for key in ("events", "bytes_read", "dataset_bytes_read", "duration_s", "item_events"):
        assert payload[key] == clean[key], key
    assert not payload["incomplete"] and payload["dropped_lines"] == 0
    for rep in payload["files"]:
        (said,) = [p for p in rep["problems"] if "given twice" in p]
        assert int(said.split()[0]) == sum(
            b'"id":' in ln for ln in gzip.decompress((SRC / rep["name"]).read_bytes()).splitlines()
        )
    model = tmp_path / "m.yaml"
    assert cli("distill", str(trace), "-o", str(model)).returncode == 0
    assert cli("distill", str(SRC), "-o", str(tmp_path / "c.yaml")).returncode == 0

    def strip(p: Path) -> list[str]:  # (the lines naming the trace or the date differ)
        return [
            x
            for x in p.read_text().splitlines()
            if not any(w in x for w in ("trace", "date", "created"))
        ]

    assert strip(model) == strip(tmp_path / "c.yaml")
    assert cli("export", str(trace), "-o", str(tmp_path / "t.json")).returncode == 0
    monkeypatch.delenv(PARSER_ENV, raising=False)
    native = load_trace(trace)
    monkeypatch.setenv(PARSER_ENV, "python")
    python = load_trace(trace)
    assert_frame_equal(native.events, python.events, check_exact=True)
    assert native.files == python.files
