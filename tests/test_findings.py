"""Characterisation passes, findings and reports on real captures with seeded bottlenecks.

The seeded traces in ``traces/`` (see ``traces/make_corpus.py``) were captured from the
example jobs run with a bottleneck on purpose; each must raise its finding as the top
cause, with evidence numbers that match the trace (recomputed here independently) and
the job's own accounting (``expected.json``).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlreplay.analyze import load_trace
from dlreplay.analyze.analysis import analyze_trace
from dlreplay.analyze.compare import cosine, ks_distance
from dlreplay.analyze.findings import RULES, Thresholds, find, load_thresholds, top_cause
from dlreplay.analyze.passes import PASSES, characterize, darshan_pattern
from dlreplay.analyze.report import write_report
from dlreplay.errors import UsageError
from dlreplay.schema import EVENT_SCHEMA, OPEN_OPS, READ_OPS

from .conftest import TRACES

#: trace -> (top cause, other finding ids that must be present)
SEEDED = {
    "npz_starved": ("too-few-workers", {"data-wait", "small-reads"}),
    "h5_tiny_chunks": ("small-random-reads", {"small-reads"}),
    "npz_checkpoint": ("checkpoint-stall", set()),
    "jpeg_small": ("metadata-heavy", set()),
}


@pytest.fixture(scope="module")
def analysed() -> dict:
    out = {}
    for name in [*SEEDED, "h5_shuffle", "npz_fork", "npz_spawn"]:
        lt = load_trace(TRACES / name)
        c = characterize(lt.events, manifest=lt.manifest)
        out[name] = (lt, c, find(c))
    return out


def _expected(name: str) -> dict:
    return json.loads((TRACES / name / "expected.json").read_text())


def _ids(findings) -> set[str]:
    return {f.id for f in findings}


def _get(findings, fid: str):
    return next(f for f in findings if f.id == fid)


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_seeded_trace_raises_its_top_finding(analysed: dict, name: str) -> None:
    top, others = SEEDED[name]
    findings = analysed[name][2]
    cause = top_cause(findings)
    assert cause is not None and cause.id == top, [(f.severity, f.id, f.impact_s) for f in findings]
    assert others <= _ids(findings)
    for f in findings:  # every finding explains itself
        assert f.evidence and f.threshold and f.root_cause and f.recommendation


def test_healthy_run_has_no_high_severity_finding(analysed: dict) -> None:
    findings = analysed["h5_shuffle"][2]
    assert analysed["h5_shuffle"][1]["steps"]["au"] >= Thresholds().au_target
    assert not [f for f in findings if f.severity == "high"], [(f.severity, f.id) for f in findings]


def test_starved_npz_evidence_matches_the_trace(analysed: dict) -> None:
    lt, c, findings = analysed["npz_starved"]
    exp = _expected("npz_starved")
    workers = _get(findings, "too-few-workers")
    assert workers.evidence["workers_per_rank"] == exp["model"]["read_threads"] == 1
    assert workers.whatif == [f"reader.read_threads={int(workers.whatif[0].split('=')[1])}"]
    assert int(workers.whatif[0].split("=")[1]) > 1
    small = _get(findings, "small-reads")
    # every sample is one whole .npz file: bytes per sample = bytes the job read / samples
    assert small.evidence["bytes_per_sample"] == exp["dataset_bytes_read"] / exp["samples"]
    assert abs(small.evidence["reads_per_sample"] - exp["dataset_read_calls"] / exp["samples"]) <= 1
    assert small.evidence["max_read_bytes"] > 200_000  # numpy's 256 KiB pieces
    assert "numpy" in small.root_cause
    wait = _get(findings, "data-wait")
    ev = lt.events
    fetch_s = ev.filter((pl.col("name") == "fetch") & (pl.col("batch_size") > 0))["dur"].sum() / 1e6
    assert 0 < wait.evidence["wait_s"] <= fetch_s
    assert wait.evidence["au"] < Thresholds().au_target


def _random_fraction_by_hand(events: pl.DataFrame, data_dir: str) -> float:
    """Darshan's random fraction, one read at a time (independent of the vectorised pass)."""
    io = events.filter(pl.col("file").cat.starts_with(data_dir)).sort("ts")
    end: dict[tuple, int] = {}
    session: dict[tuple, int] = {}
    n = seq = 0
    for row in io.select("pid", "file", "name", "offset", "size").iter_rows():
        pid, f, name, off, size = row
        if name in OPEN_OPS:
            session[(pid, f)] = session.get((pid, f), 0) + 1
            continue
        if name not in READ_OPS or not size or off is None:
            continue
        key = (pid, f, session.get((pid, f), 0))
        n += 1
        seq += off >= end.get(key, 0)
        end[key] = off + size
    return (n - seq) / n


def test_tiny_chunk_evidence_matches_the_trace(analysed: dict) -> None:
    lt, c, findings = analysed["h5_tiny_chunks"]
    f = _get(findings, "small-random-reads")
    data_dir = lt.manifest["data_dirs"][0]
    assert f.evidence["random"] == pytest.approx(
        _random_fraction_by_hand(lt.events, data_dir), abs=1e-3
    )
    assert f.evidence["random"] >= Thresholds().random_fraction
    assert f.evidence["bytes_weighted_median_read"] <= 8 * 8 * 8 * 4 + 64  # one 8^3 float32 chunk
    exp = _expected("h5_tiny_chunks")
    assert f.evidence["mean_file_size_bytes"] == pytest.approx(
        exp["model"]["record_length_mean"] * exp["model"]["num_samples_per_file"], rel=0.02
    )


def test_checkpoint_evidence_matches_the_trace(analysed: dict) -> None:
    _lt, _c, findings = analysed["npz_checkpoint"]
    exp = _expected("npz_checkpoint")
    f = _get(findings, "checkpoint-stall")
    assert f.evidence["saves"] == exp["checkpoints"] == 16
    assert f.evidence["bytes"] == exp["checkpoint_bytes"]
    assert f.evidence["share_of_training"] >= Thresholds().checkpoint_share
    assert f.whatif and f.whatif[0].startswith("checkpoint.steps_between_checkpoints=")
    assert "checkpoint-no-fsync" in _ids(findings)


def test_metadata_evidence_matches_the_trace(analysed: dict) -> None:
    lt, _c, findings = analysed["jpeg_small"]
    exp = _expected("jpeg_small")
    f = _get(findings, "metadata-heavy")
    assert f.evidence["files"] == exp["dataset_files"] == 256
    data_dir = lt.manifest["data_dirs"][0]
    opens = lt.events.filter(
        pl.col("name").is_in(OPEN_OPS)
        & pl.col("file").cat.starts_with(data_dir)
        & pl.col("file").cat.ends_with(".jpg")
    ).height
    assert f.evidence["opens"] == opens
    assert f.evidence["opens_per_sample"] == pytest.approx(opens / exp["samples"], abs=1e-3)
    spf = int(
        next(w for w in f.whatif if w.startswith("dataset.num_samples_per_file=")).split("=")[1]
    )
    assert 1 < spf <= 256 // 8  # shards, but still enough files to share among workers


def test_spawn_workers_restarting_every_epoch(analysed: dict) -> None:
    findings = analysed["npz_spawn"][2]
    f = _get(findings, "worker-startup")
    assert f.whatif == ["reader.persistent_workers=true"]
    assert f.evidence["epoch_start_wait_s"] >= Thresholds().startup_wait_s


def test_every_pass_runs_alone(analysed: dict) -> None:
    lt = analysed["npz_fork"][0]
    for name in PASSES:
        c = characterize(lt.events, manifest=lt.manifest, passes=[name])
        assert list(c.results) == [name] and isinstance(c[name], dict)
        json.dumps(c[name])
    with pytest.raises(KeyError, match="unknown pass"):
        characterize(lt.events, passes=["nope"])


def test_darshan_pattern_on_known_offsets() -> None:
    reads = pl.DataFrame(
        {
            "pid": [1] * 5,
            "file": ["f"] * 5,
            "ts": [1, 2, 3, 4, 5],
            "offset": [0, 100, 300, 50, 150],
            "size": [100, 100, 100, 100, 100],
        }
    )
    out = darshan_pattern(reads)
    assert out["consec"].to_list() == [True, True, False, False, True]
    assert out["seq"].to_list() == [True, True, True, False, True]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(1, 3)),
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 6),
            st.sampled_from(["open64", "read", "pread64", "lseek64", "close"]),
            st.one_of(st.none(), st.integers(0, 400)),
            st.integers(0, 150),
        ),
        max_size=60,
    )
)
def test_flag_reads_equals_the_window_reference(rows) -> None:
    """flag_reads (one stable sort; the row before a read is its predecessor) against
    _sessions + darshan_pattern (window functions): the same flagged reads, ties in time
    included, with the packed sort key and with two keys."""
    from dlreplay.analyze.passes import flag_reads, flag_reads_lazy
    from dlreplay.analyze.passes import sessions as _sessions

    io = pl.DataFrame(
        sorted(rows, key=lambda r: r[2]),
        schema={
            "pid": pl.Int32,
            "file": pl.Categorical,
            "ts": pl.Int64,
            "name": pl.Categorical,
            "offset": pl.Int64,
            "size": pl.Int64,
        },
        orient="row",
    )
    ref = darshan_pattern(
        _sessions(io).filter(
            pl.col("name").is_in(READ_OPS) & (pl.col("size") > 0) & pl.col("offset").is_not_null()
        )
    )
    cols = ["pid", "file", "offset", "size", "seq", "consec"]
    want = ref.select(cols).with_columns(pl.col("file").cast(pl.String)).sort(pl.all())
    got = flag_reads(io).select(cols).with_columns(pl.col("file").cast(pl.String)).sort(pl.all())
    assert got.equals(want)
    two_keys = flag_reads_lazy(io.lazy(), packed=False).collect()
    assert (
        two_keys.select(cols)
        .with_columns(pl.col("file").cast(pl.String))
        .sort(pl.all())
        .equals(want)
    )


def test_ks_and_cosine() -> None:
    a = np.arange(100.0)
    assert ks_distance(a, a) == 0.0
    assert ks_distance(a, a + 1000) == 1.0
    assert ks_distance(a, np.array([])) is None
    f = {"io_time_s": 1.0, "bytes_read": 10.0, "files": 3.0, "sequential": None}
    assert cosine(f, f)[0] == pytest.approx(1.0)
    sim, skipped = cosine(f, {**f, "bytes_read": 1.0})
    assert sim < 1.0 and "sequential" in skipped


def test_thresholds_config(tmp_path: Path, analysed: dict, cli) -> None:
    cfg = tmp_path / "rules.yaml"
    cfg.write_text("thresholds:\n  au_target: 0.3\n  au_high: 0.1\ndisable: [page-cache]\n")
    t, off = load_thresholds(cfg)
    assert t.au_target == 0.3 and off == {"page-cache"}
    c = analysed["npz_starved"][1]
    ids = _ids(find(c, t, off))
    assert "data-wait" not in ids and "page-cache" not in ids
    for text, needle in (
        ("thresholds:\n  au_targt: 0.5\n", "thresholds.au_targt"),
        ("thresholds:\n  au_target: high\n", "thresholds.au_target"),
        ("disable: [nope]\n", "nope"),
        ("rules: 1\n", "rules"),
    ):
        cfg.write_text(text)
        with pytest.raises(UsageError, match=needle):
            load_thresholds(cfg)
    proc = cli("analyze", str(TRACES / "npz_fork"), "--config", str(cfg))
    assert proc.returncode == 2 and "rules" in proc.stderr and "Traceback" not in proc.stderr
    assert set(RULES) >= {
        "data-wait",
        "too-few-workers",
        "small-reads",
        "metadata-heavy",
        "small-random-reads",
        "checkpoint-stall",
        "decode-overhead",
        "page-cache",
        "no-overlap",
        "worker-startup",
    }


def test_cli_analyze_prints_findings_and_json(cli) -> None:
    proc = cli("analyze", str(TRACES / "npz_starved"), check=True)
    assert "too-few-workers" in proc.stdout and "replay: dlreplay replay MODEL" in proc.stdout
    assert "next:" in proc.stdout
    payload = json.loads(cli("analyze", str(TRACES / "npz_starved"), "--json", check=True).stdout)
    assert payload["schema"] == "dlreplay.analysis" and payload["format_version"] == 1
    assert payload["findings"][0]["id"] == "data-wait"
    assert {"steps", "access", "metadata", "checkpoints"} <= set(payload["characterization"])


def _browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_markdown_report_writes_figures(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a matplotlib figure leak (or any warning) fails the test
        report = analyze_trace(TRACES / "npz_checkpoint")
        md = write_report(report, tmp_path / "r.md")
    text = md.read_text()
    assert "checkpoint-stall" in text and "dlreplay.analysis" in text
    figs = sorted(p.name for p in (tmp_path / "r.figures").iterdir())
    assert figs == ["au.png", "bandwidth.png", "histogram.png", "timeline.png", "workers.png"]
    for name in figs:
        assert f"r.figures/{name}" in text
    with pytest.raises(UsageError, match=r"\.html or \.md"):
        write_report(report, tmp_path / "r.pdf")


@pytest.mark.skipif(not _browser(), reason="needs Chromium: `apt-get install -y chromium`")
def test_html_report_renders_in_headless_chromium(tmp_path: Path, cli) -> None:
    from .cdp import Browser

    out = tmp_path / "report.html"
    proc = cli("analyze", str(TRACES / "npz_starved"), "--report", str(out), check=True)
    assert f"report: {out}" in proc.stdout
    again = cli("analyze", str(TRACES / "npz_starved"), "--report", str(out))
    assert again.returncode == 2 and "--force" in again.stderr  # never overwrites silently
    html = out.read_text()
    assert (
        "http://" not in html.replace("http://www.w3.org", "") and "<script" not in html
    )  # self-contained
    shot = tmp_path / "report.png"
    with Browser(_browser() or "", tmp_path / "profile") as page:
        page.goto(out.as_uri())
        info = page.wait_for(
            "document.readyState === 'complete' && document.images.length >= 5 && "
            "Array.from(document.images).every(i => i.complete && i.naturalWidth > 0) ? "
            "JSON.stringify({n: document.images.length, t: document.body.innerText}) : ''",
            timeout=60,
        )
        page.screenshot(shot)
        console = list(page.console)
    got = json.loads(info)
    assert got["n"] == 5 and "too-few-workers" in got["t"] and "Root cause" in got["t"]
    assert not [c for c in console if c.startswith("exception")], console
    assert shot.stat().st_size > 20_000


def _write_trace(tmp_path: Path, name: str, lines: list[dict]) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "trace-1.pfw").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def _fh(path: str, h: str) -> dict:
    return {
        "id": 0,
        "name": "FH",
        "cat": "dftracer",
        "pid": 7,
        "tid": 7,
        "ph": "M",
        "args": {"name": path, "value": h},
    }


def _ev(i: int, name: str, h: str, **args) -> dict:
    return {
        "id": i,
        "name": name,
        "cat": "POSIX",
        "pid": 7,
        "tid": 7,
        "ts": 1_000_000 + 10 * i,
        "dur": 5,
        "ph": "X",
        "args": {"fhash": h, **args},
    }


def test_reports_on_traces_without_data_reads(tmp_path: Path, cli) -> None:
    meta_only = _write_trace(
        tmp_path,
        "meta_only",
        [_fh("/data/a.npz", "aa"), _fh("/data/b.npz", "bb")]
        + [
            _ev(i, n, "aa" if i % 2 else "bb")
            for i, n in enumerate(["open64", "__xstat64", "close"] * 4)
        ],
    )
    no_reads = _write_trace(
        tmp_path,
        "no_reads",
        [_fh("/out/log.txt", "cc")] + [_ev(i, "write", "cc", size=100, ret=100) for i in range(8)],
    )
    for trace, needle in ((meta_only, "only metadata"), (no_reads, "no reads of dataset files")):
        out = tmp_path / f"{trace.name}.html"
        proc = cli("analyze", str(trace), "--report", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert needle in proc.stdout and needle in out.read_text()
    empty_ok = pl.DataFrame(schema=EVENT_SCHEMA)
    c = characterize(empty_ok)
    assert find(c) == [] and c["steps"]["au"] is None


def _frame(rows: list[dict]) -> pl.DataFrame:
    """An event table from partial rows (missing columns null)."""
    return pl.DataFrame([{k: r.get(k) for k in EVENT_SCHEMA} for r in rows], schema=EVENT_SCHEMA)


def _loop(
    pid: int, steps: int, t0: int, compute_us: int, wait_us: int, epochs: int = 2
) -> list[dict]:
    """A consumer's epoch/fetch/step events (µs), like the capture hooks write them."""
    rows, t = [], t0
    for e in range(epochs):
        start = t
        for k in range(steps):
            rows.append(
                {
                    "pid": pid,
                    "ppid": 1,
                    "host": "h",
                    "cat": "dataloader",
                    "name": "fetch",
                    "ts": t,
                    "dur": wait_us,
                    "epoch": e,
                    "step": k,
                    "batch_size": 4,
                }
            )
            t += wait_us
            rows.append(
                {
                    "pid": pid,
                    "ppid": 1,
                    "host": "h",
                    "cat": "compute",
                    "name": "step",
                    "ts": t,
                    "dur": compute_us,
                    "epoch": e,
                    "step": k,
                }
            )
            t += compute_us
        rows.append(
            {
                "pid": pid,
                "ppid": 1,
                "host": "h",
                "cat": "pipeline",
                "name": "epoch",
                "ts": start,
                "dur": t - start,
                "epoch": e,
            }
        )
    return rows


def test_rank_imbalance_names_the_straggler() -> None:
    ev = _frame(
        _loop(10, 20, 0, 10_000, 500)
        + _loop(11, 20, 0, 10_000, 500)
        + _loop(12, 20, 0, 10_000, 12_000)
    )
    c = characterize(ev)
    ranks = c["balance"]["ranks"]
    assert ranks["count"] == 3 and ranks["max_over_median"] == pytest.approx(
        22_000 / 10_500, rel=1e-3
    )
    f = _get(find(c), "rank-imbalance")
    assert f.processes == [12] and "12" in f.title


def test_loader_in_the_training_process_is_not_overlapped() -> None:
    rows = [
        {
            "pid": 10,
            "ppid": 1,
            "host": "h",
            "cat": "data",
            "name": "item",
            "ts": 0,
            "dur": 1,
            "sample_index": 0,
        }
    ]
    rows += _loop(10, 20, 0, 2_000, 8_000, epochs=1)
    # the consumer reads its samples itself, inside each fetch (workers = 0)
    for r in [r for r in rows if r["name"] == "fetch"]:
        rows.append(
            {
                "pid": 10,
                "ppid": 1,
                "host": "h",
                "cat": "POSIX",
                "name": "read",
                "ts": r["ts"] + 100,
                "dur": 7_000,
                "file": "/data/s.npy",
                "size": 1 << 20,
                "offset": 0,
            }
        )
    c = characterize(_frame(rows), data_dirs=["/data"])
    assert c["overlap"]["overlap"] == 0.0 and c["overlap"]["io_in_consumer_s"] == pytest.approx(
        0.14
    )
    ids = _ids(find(c))
    assert {"no-overlap", "data-wait", "too-few-workers"} <= ids
    assert _get(find(c), "too-few-workers").evidence["workers_per_rank"] == 0


def test_page_cache_uses_the_captured_hosts_memory(tmp_path: Path) -> None:
    """RAM comes from the capture manifest (the trace may be analysed on another host)."""
    d = tmp_path / "t"
    shutil.copytree(TRACES / "npz_fork", d)
    man = json.loads((d / "manifest.json").read_text())
    man.update(host="some-other-node", mem_total_bytes=8 << 30)
    (d / "manifest.json").write_text(json.dumps(man))
    lt = load_trace(d)
    pc = characterize(lt.events, manifest=lt.manifest, passes=["page_cache"])["page_cache"]
    assert pc["host_memory_bytes"] == 8 << 30 and pc["host_memory_source"] == "capture manifest"
    man.pop("mem_total_bytes")
    (d / "manifest.json").write_text(json.dumps(man))
    lt = load_trace(d)
    pc = characterize(lt.events, manifest=lt.manifest, passes=["page_cache"])["page_cache"]
    assert (
        pc["host_memory_bytes"] is None and pc["host_memory_source"] == "unknown"
    )  # never guessed


def test_passes_take_a_summary_already_made(monkeypatch) -> None:
    """A view given the trace's summary (as the ingest benchmark has it after its own
    summarize) does not compute it again, and the passes' results are those of a view
    that computes it."""
    import dlreplay.analyze.passes.view as passes
    from dlreplay.analyze import summarize

    lt = load_trace(TRACES / "npz_fork")
    whole = characterize(lt.events, manifest=lt.manifest, per_process=lt.per_process).to_dict()
    made = summarize(lt.events, data_dirs=lt.manifest["data_dirs"], per_process=lt.per_process)
    monkeypatch.setattr(
        passes, "summarize", lambda *a, **k: pytest.fail("the summary was computed again")
    )
    view = passes.TraceView(lt.events, lt.manifest, None, lt.per_process, known_summary=made)
    assert (
        view.data_dirs == lt.manifest["data_dirs"]
    )  # (the summary's: the manifest's data directories)
    assert json.dumps(characterize(view).to_dict(), sort_keys=True, default=str) == json.dumps(
        whole, sort_keys=True, default=str
    )


@pytest.mark.parametrize(
    "name",
    ["npz_fork", "h5_shuffle", "jpeg_small", "npz_checkpoint", "dlio_h5_multi", "ai_annotated"],
)
@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "polars"])
def test_passes_by_process_batches_give_the_same_results(
    name: str, kernels: bool, monkeypatch, tmp_path: Path
) -> None:
    """The passes that sort or join every dataset read take big traces' processes in batches
    (a lower peak); forced on these small traces, the batches split the rows exactly and
    every pass gives what it gives in one go, in memory and over a spilled table, with the
    C kernels and with the polars queries."""
    import dlreplay.analyze.passes.view as passes

    if not kernels:
        monkeypatch.setattr(passes, "_KERNELS", None)
    lt = load_trace(TRACES / name)
    whole = characterize(lt.events, manifest=lt.manifest, per_process=lt.per_process).to_dict()
    monkeypatch.setattr(passes, "PID_BATCH_MIN_ROWS", 0)
    view = passes.TraceView(lt.events, lt.manifest, None, lt.per_process)
    batches = view.pid_batches
    assert len(batches) >= 2
    assert sum(lt.events.filter(b).height for b in batches) == lt.events.height
    assert json.dumps(characterize(view).to_dict(), sort_keys=True, default=str) == json.dumps(
        whole, sort_keys=True, default=str
    )
    spilled = analyze_trace(TRACES / name, memory_limit=1, spill_dir=tmp_path, figures=False)
    assert json.dumps(
        spilled.characterization.to_dict(), sort_keys=True, default=str
    ) == json.dumps(whole, sort_keys=True, default=str)
