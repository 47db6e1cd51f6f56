"""Impossible values shown as fact (issue #45 item 2), through the CLI.

Every trace is a copy of ``traces/npz_fork`` (a capture with its manifest) in which one file's
real corpus lines were changed: timestamps negated, zero or in another unit; durations
negative; ``ret``, ``name`` or ``cat`` of another JSON type; the same events twice. Each
must be set aside or read as null, named in that file's report, and never summed: the
totals stay consistent (no span longer than the capture, dataset bytes never above all
bytes read, no negative time), and both parsers (the C scanner and ``DLREPLAY_PARSER=python``)
give the same table and reports.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from dlreplay.analyze import load_trace
from dlreplay.analyze.trace.native import PARSER_ENV

from .conftest import TRACES

SRC = TRACES / "npz_fork"
WORKER = "trace-10d4018dc031bcfe-fork.pfw.gz"  # a loader worker: 530 events, 180 reads
MAIN = "trace-a108ef62e727e130-preload.pfw.gz"  # the training process: fetch, step, epoch
Change = Callable[[dict], None]


def records(name: str) -> list[dict]:
    return [json.loads(ln) for ln in gzip.decompress((SRC / name).read_bytes()).splitlines()]


def pack(recs: list[dict]) -> bytes:
    text = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in recs)
    return gzip.compress(text, mtime=0)


def changed(tmp_path: Path, name: str, change: Change, manifest: bool = True) -> Path:
    """A copy of npz_fork whose file ``name`` has ``change`` applied to every record."""
    d = tmp_path / "trace"
    shutil.copytree(SRC, d)
    if not manifest:
        (d / "manifest.json").unlink()
    recs = records(name)
    for r in recs:
        change(r)
    (d / name).write_bytes(pack(recs))
    return d


def analyze_json(cli, trace: Path) -> dict:
    proc = cli("analyze", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def report(payload: dict, name: str) -> dict:
    (rep,) = [f for f in payload["files"] if f["name"] == name]
    return rep


def same_in_both_parsers(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C scanner and the reference parser give the same table and the same reports."""
    monkeypatch.delenv(PARSER_ENV, raising=False)
    native = load_trace(trace)
    monkeypatch.setenv(PARSER_ENV, "python")
    python = load_trace(trace)
    monkeypatch.delenv(PARSER_ENV)
    assert_frame_equal(native.events, python.events, check_exact=True)
    assert native.files == python.files


@pytest.fixture(scope="module")
def clean() -> dict:
    from .conftest import run_cli

    proc = run_cli("analyze", str(SRC), "--json", check=True)
    return json.loads(proc.stdout)


def _ts(f: Callable[[int], int]) -> Change:
    def change(r: dict) -> None:
        if "ts" in r:
            r["ts"] = f(r["ts"])
            r["dur"] = f(r.get("dur", 0)) if f(1) > 0 else r.get("dur", 0)

    return change


@pytest.mark.parametrize(
    "kind, change",
    [
        ("negated", _ts(lambda t: -t)),
        ("zero", _ts(lambda t: 0)),
        ("nanoseconds", _ts(lambda t: t * 1000)),
        ("milliseconds", _ts(lambda t: t // 1000)),
    ],
)
def test_impossible_timestamps_of_one_file_are_set_aside_and_named(
    tmp_path: Path, cli, clean: dict, monkeypatch, kind: str, change: Change
) -> None:
    """**Was**: "events over 997,397 h" (negated), 498,698 h (zero), 498,200,166 h (ns), all
    the file's reads summed."""
    trace = changed(tmp_path, WORKER, change)
    payload = analyze_json(cli, trace)
    manifest = json.loads((SRC / "manifest.json").read_text())
    assert payload["duration_s"] <= manifest["wall_time_s"]
    assert payload["events"] == clean["events"] - 530
    assert payload["bytes_read"] < clean["bytes_read"]
    assert payload["dataset_bytes_read"] <= payload["bytes_read"]
    problems = report(payload, WORKER)["problems"]
    assert problems[-1] == "every event of this file set aside", problems
    assert "(set aside)" in problems[0] and report(payload, WORKER)["events"] == 0
    if kind == "negated":  # (the plain output once: the same lines for the others)
        text = cli("analyze", str(trace)).stdout
        assert f"warning: {WORKER}: dropped 0 line(s)" in text and " h from " not in text
    same_in_both_parsers(trace, monkeypatch)


@pytest.mark.parametrize("manifest", [True, False])
def test_another_runs_files_in_the_directory_are_not_summed(
    tmp_path: Path, cli, clean: dict, manifest: bool
) -> None:
    """Another run's trace files (without their manifest) beside the run's: hours away, set
    aside per file (with the manifest: outside the capture; without: far from the rest).
    **Was**: "events over 70.50 h", their reads and steps summed."""
    trace = changed(tmp_path, WORKER, lambda r: None, manifest=manifest)
    others = sorted((TRACES / "npz_spawn").glob("*.pfw.gz"))
    for p in others:
        shutil.copy(p, trace / f"x{p.name}")
    payload = analyze_json(cli, trace)
    assert payload["events"] == clean["events"] and payload["bytes_read"] == clean["bytes_read"]
    assert payload["duration_s"] == clean["duration_s"]
    for p in others:
        rep = report(payload, f"x{p.name}")
        assert rep["events"] == 0 and rep["problems"][-1] == "every event of this file set aside"
        why = "outside the capture" if manifest else "hours away from the rest of the run"
        assert why in rep["problems"][0]


def _negate(names: tuple[str, ...], first_only: bool = False) -> Change:
    seen = []

    def change(r: dict) -> None:
        if r.get("name") in names and (not first_only or not seen):
            r["dur"] = -abs(r["dur"]) if not first_only else -180_000_000
            seen.append(r)

    return change


@pytest.mark.parametrize("loop", ["fetch", "step"])
def test_negative_loop_durations_are_not_measured(
    tmp_path: Path, cli, monkeypatch, loop: str
) -> None:
    """The consumer's fetch waits (or steps) with negative durations: read as null and
    counted; analyze says data wait, compute and AU are not measured, distill marks the
    compute time a default, never measured. **Was**: "AU 0.0% … data wait -0.352 s,
    compute 0.000 s" and distill's ``computation_time`` of 0 s, confidence ``measured``."""
    trace = changed(tmp_path, MAIN, _negate((loop,)))
    payload = analyze_json(cli, trace)
    steps = payload["characterization"]["steps"]
    assert steps["au"] is None and "not measured" in steps["missing"]
    assert "(read as null)" in report(payload, MAIN)["problems"][-1]
    text = cli("analyze", str(trace)).stdout
    assert "not measured" in text and "AU 0.0%" not in text and " -0." not in text
    if loop == "fetch":  # (distill once)
        same_in_both_parsers(trace, monkeypatch)
        return
    out = tmp_path / "m.yaml"
    proc = cli("distill", str(trace), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "computation_time not measured" in proc.stdout
    model = out.read_text()
    at = model.index("train.computation_time:")
    assert "confidence: default" in model[at : at + 300]


def test_a_negative_read_time_is_read_as_null(tmp_path: Path, cli, clean: dict) -> None:
    """One read of -180 s. **Was**: the operations table's read time -180 s."""
    trace = changed(tmp_path, WORKER, _negate(("read",), first_only=True))
    payload = analyze_json(cli, trace)
    assert all(op["time_s"] >= 0 for op in payload["operations"])
    assert payload["bytes_read"] == clean["bytes_read"]
    assert report(payload, WORKER)["problems"] == [
        "1 event(s) with a negative duration (read as null)"
    ]


def _retyped(field: str, value: object) -> Change:
    def change(r: dict) -> None:
        if r.get("name") == "read" and r.get("cat") == "POSIX":
            if field == "ret":
                r["args"]["ret"] = value
            else:
                r[field] = value

    return change


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("ret", None, "without a byte count"),
        ("ret", True, "without a byte count"),
        ("ret", "many", "without a byte count"),
        ("name", 7, "a number for a name"),
        ("cat", None, "no category"),
    ],
)
def test_mistyped_fields_are_named_and_totals_stay_consistent(
    tmp_path: Path, cli, clean: dict, monkeypatch, field: str, value: object, said: str
) -> None:
    """``ret`` null, a bool or text; ``name`` a number; ``cat`` null, on the 180 reads of one
    file: named in that file's report; the dataset's bytes never exceed all bytes read.
    **Was**: 1.9 MiB of reads gone without a word, or (``cat`` null) "read 9.4 MiB" beside
    "Dataset: 11.3 MiB read"."""
    trace = changed(tmp_path, WORKER, _retyped(field, value))
    payload = analyze_json(cli, trace)
    assert payload["dataset_bytes_read"] <= payload["bytes_read"]
    assert any(
        p.startswith("180 event(s) with") and said in p for p in report(payload, WORKER)["problems"]
    )
    if field == "cat":  # the bytes are real: counted by the call's name; (the plain output once)
        assert payload["bytes_read"] == clean["bytes_read"]
        text = cli("analyze", str(trace)).stdout
        assert f"warning: {WORKER}:" in text and said in text
    same_in_both_parsers(trace, monkeypatch)


@pytest.mark.parametrize("how", ["member-appended", "recompressed-copy"])
def test_the_same_events_twice_are_counted_once(
    tmp_path: Path, cli, clean: dict, monkeypatch, how: str
) -> None:
    """A file's gzip member appended to it again; a copy of a file compressed anew (not
    byte-identical, so not caught as a copy by its bytes). **Was**: summed (+530 events,
    +1.9 MiB read, 84 samples loaded of 72)."""
    trace = changed(tmp_path, WORKER, lambda r: None)
    data = (SRC / WORKER).read_bytes()
    if how == "member-appended":
        (trace / WORKER).write_bytes(data + data)
        named = WORKER
    else:
        named = "trace-again-fork.pfw.gz"
        (trace / named).write_bytes(gzip.compress(gzip.decompress(data), compresslevel=1))
    payload = analyze_json(cli, trace)
    assert payload["events"] == clean["events"] and payload["bytes_read"] == clean["bytes_read"]
    assert payload["item_events"] == clean["item_events"]
    assert any("the same events twice" in p for p in report(payload, named)["problems"])
    same_in_both_parsers(trace, monkeypatch)


def test_a_cluster_load_sets_aside_what_a_local_load_does(tmp_path: Path, cli) -> None:
    """``analyze --workers`` (the parse on a Dask LocalCluster, combined on a worker) applies
    the same value checks as the local load: one file's negated timestamps set aside and
    named, the same totals."""
    trace = changed(tmp_path, WORKER, _ts(lambda t: -t))
    local = analyze_json(cli, trace)
    proc = cli("analyze", "--json", str(trace), "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    remote = json.loads(proc.stdout)
    for key in ("events", "bytes_read", "dataset_bytes_read", "duration_s"):
        assert remote[key] == local[key], key
    assert report(remote, WORKER)["problems"] == report(local, WORKER)["problems"]
