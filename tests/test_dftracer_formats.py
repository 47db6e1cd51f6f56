"""DFTracer's record kinds after 2.2: aggregated records, the per-process ``end`` record, GPU
(CUDA) events, read by both parsers (the C scanner and ``DLREPLAY_PARSER=python``) alike.

Lines are built from DFTracer's documented layout: ``docs/trace_format.rst`` ("Record Phases",
"Aggregated Events", "Lifecycle Events") and ``docs/gpu_tracing.rst`` ("Traced events") of
github.com/llnl-asr/dftracer (trace_format.rst at commit 17c724bcd2b6, gpu_tracing.rst at
629aca2430f9), and its writer ``src/dftracer/core/serialization/json_line.cpp``
(``JsonLines::series``/``aggregated``, commit 7e9187c7aec5): an aggregated record is
``{"name","cat","type","ts","ph":3,"pid","tid","args":{"hhash", "dft_cnt": calls,
"<field>_min"/"_max"/"_sum" or a plain "<field>"}}``, ``ts`` the start of its interval, no
``id`` or ``dur``. :func:`test_real_aggregated_capture_counts_what_the_plain_one_does` checks
the reading against real records: the installed DFTracer 2.2.0 (``DFTRACER_ENABLE_AGGREGATION=1``)
traces the same commands as without aggregation.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from dlreplay.analyze import load_trace
from dlreplay.analyze.trace.native import PARSER_ENV

HH = "6882804a826580cd"
PID = 4242
T0 = 1796475921000000  # an interval start (µs)
FILE = "/data/train/f0.bin"
FH = "725a1c225a560dbe"


def meta(name: str, key: str, value: str) -> dict:
    return {"name": name, "cat": "dftracer", "type": 1, "pid": PID, "tid": PID, "ph": 4,
            "args": {"hhash": HH, "name": key, "value": value}}  # fmt: skip


def complete(i: int, name: str, ts: int, dur: int, cat: str = "POSIX", **args) -> dict:
    return {"id": i, "name": name, "cat": cat, "type": 3, "pid": PID, "tid": PID, "ts": ts,
            "dur": dur, "ph": 1, "args": {"hhash": HH, **args}}  # fmt: skip


def aggregated(name: str, ts: int, ph: int | str = 3, cat: str = "POSIX", **args) -> dict:
    """An aggregated record as ``JsonLines::series`` writes it (key order included)."""
    return {"name": name, "cat": cat, "type": 3, "ts": ts, "ph": ph, "pid": PID, "tid": PID,
            "args": {"hhash": HH, **args}}  # fmt: skip


def end_record(i: int, ts: int, num_events: int) -> dict:
    """The 2.2 ``end`` record of trace_format.rst ("Lifecycle Events")."""
    cfg = {"enable": 1, "metadata": 1, "time_metric": "US", "trace_interval_ms": 1000,
           "aggregation_enable": 1, "aggregation_type": "FULL", "bind": 1,
           "log_file": "/tmp/t-1-app.pfw.gz"}  # fmt: skip
    return complete(i, "end", ts, 0, cat="dftracer", num_events=num_events, cfg=cfg,
                    build={"mpi": 0, "hdf5": 0, "cuda": 1}, used={"LIBC_IO": 1, "CUDA": 1},
                    app={"batch_size": 32})  # fmt: skip


def write(d: Path, name: str, recs: list[dict]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs)
    (d / name).write_bytes(gzip.compress(text.encode(), mtime=0))
    return d


def base(extra: list[dict]) -> list[dict]:
    """A process with its start record, a file hash, two plain reads of 4096 B and ``extra``."""
    start = complete(1, "start", T0 + 100, 0, cat="dftracer", ppid=1, cwd="64ef5b449d704e6e")
    return [
        meta("HH", "vm", HH),
        meta("FH", FILE, FH),
        start,
        complete(2, "open64", T0 + 200, 5, flags=0, fhash=FH),
        complete(3, "read", T0 + 300, 10, ret=4096, count=4096, fhash=FH),
        complete(4, "read", T0 + 400, 10, ret=4096, count=4096, fhash=FH),
        *extra,
    ]


def analyze(cli, trace: Path) -> dict:
    proc = cli("analyze", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def ops(payload: dict) -> dict[str, dict]:
    return {o["name"]: o for o in payload["operations"] if o["cat"] == "POSIX"}


def same_in_both_parsers(trace: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(PARSER_ENV, raising=False)
    native = load_trace(trace)
    monkeypatch.setenv(PARSER_ENV, "python")
    python = load_trace(trace)
    monkeypatch.delenv(PARSER_ENV)
    assert_frame_equal(native.events, python.events, check_exact=True)
    assert native.files == python.files
    return native


def test_aggregated_records_enter_every_total(tmp_path: Path, cli, monkeypatch) -> None:
    """Calls, bytes and time of aggregated records count as the calls they fold: sums split
    over ``dft_cnt`` calls, a plain value (one all calls had) repeated, minima and maxima
    unused; DFTracer < 2.2's counter phase (``"C"``) with ``dft_cnt`` read alike.
    **Was**: each record one call of no bytes and no time, and its file "cut or damaged"."""
    recs = base(
        [
            aggregated(
                "read",
                T0,
                dft_cnt=5,
                dur_min=2,
                dur_max=40,
                dur_sum=70,
                ret_min=0,
                ret_max=65536,
                ret_sum=200001,
                count_min=65536,
                count_max=65536,
                count_sum=327680,
            ),  # fmt: skip
            aggregated("write", T0, dft_cnt=3, dur=7, ret=4096, count=4096),
            aggregated(
                "read",
                T0 + 1_000_000,
                ph="C",
                dft_cnt=2,
                dur_sum=9,
                ret_sum=1000,
                ret_min=400,
                ret_max=600,
                count=512,
            ),  # fmt: skip
            aggregated("close", T0 + 1_000_000, dft_cnt=4, dur_sum=4, ret=0),
            # a counter sample (dftracer_service): no dft_cnt, one row as before
            aggregated("cpu", T0 + 1_000_000, ph=2, cat="sys", user_pct=12.5),
            end_record(5, T0 + 1_500_000, num_events=18),
        ]
    )
    trace = write(tmp_path / "t", "t-1-app.pfw.gz", recs)
    payload = analyze(cli, trace)
    by = ops(payload)
    assert by["read"]["count"] == 2 + 5 + 2
    assert by["read"]["bytes"] == 2 * 4096 + 200001 + 1000
    assert round(by["read"]["time_s"] * 1e6) == 10 + 10 + 70 + 9
    assert (by["write"]["count"], by["write"]["bytes"]) == (3, 3 * 4096)
    assert round(by["write"]["time_s"] * 1e6) == 3 * 7
    assert (by["close"]["count"], round(by["close"]["time_s"] * 1e6)) == (4, 4)
    assert payload["bytes_read"] == 2 * 4096 + 201001
    assert payload["bytes_written"] == 3 * 4096
    assert payload["read_histogram"]["10K-100K"] == 5  # 200001 B over 5 calls: 40,000 B each
    assert payload["dropped_lines"] == 0 and not payload["incomplete"], payload["files"]
    assert payload["files"][0]["problems"] == []
    loaded = same_in_both_parsers(trace, monkeypatch)
    reads = loaded.events.filter(loaded.events["name"] == "read")
    assert reads["ts"].is_unique().all()  # placed one after another: never read as repeats
    assert reads["size_requested"].sum() == 2 * 4096 + 327680 + 2 * 512


def test_bad_aggregated_counts_are_dropped_and_counted(tmp_path: Path, cli, monkeypatch) -> None:
    """A ``dft_cnt`` that is no count of calls (0, negative, text, past 10^7) drops its record
    as malformed (counted) in both parsers; the rest is read."""
    bad = [aggregated("read", T0, dft_cnt=v, ret_sum=999, dur_sum=1) for v in (0, -3, "x", 10**8)]
    trace = write(tmp_path / "t", "t-1-app.pfw.gz", base(bad))
    payload = analyze(cli, trace)
    assert payload["dropped_lines"] == 4
    assert ops(payload)["read"]["count"] == 2 and payload["bytes_read"] == 2 * 4096
    same_in_both_parsers(trace, monkeypatch)


def test_cuda_events_and_end_record_are_kept_out_of_io_totals(
    tmp_path: Path, cli, monkeypatch
) -> None:
    """GPU events (type 11, ``cat`` the CUPTI activity kind, gpu_tracing.rst) stay events of
    their category: a copy's ``bytes`` is no file I/O. The 2.2 ``end`` record (nested
    ``cfg``/``build``/``used``/``app``) ends its process's lifetime: an event 5 s after it is
    set aside and named."""
    cuda = [
        complete(
            5,
            "cudaMemcpy",
            T0 + 500,
            30,
            cat="CUDA_RUNTIME_API",
            device_id=0,
            context_id=1,
            stream_id=7,
            correlation_id=42,
        ),  # fmt: skip
        complete(
            6,
            "HtoD",
            T0 + 510,
            12,
            cat="CUDA_MEMCPY",
            device_id=0,
            context_id=1,
            stream_id=7,
            correlation_id=42,
            bytes=1048576,
            copy_kind="HtoD",
        ),  # fmt: skip
        complete(
            7,
            "unet_fwd_kernel",
            T0 + 530,
            80,
            cat="CUDA_KERNEL",
            device_id=0,
            grid_x=64,
            block_x=256,
            registers_per_thread=32,
        ),  # fmt: skip
    ]
    for r in cuda:
        r["type"] = 11
    late = complete(9, "read", T0 + 9_000_000, 10, ret=4096, count=4096, fhash=FH)
    recs = [*base(cuda), end_record(8, T0 + 2_000_000, num_events=7), late]
    trace = write(tmp_path / "t", "t-1-app.pfw.gz", recs)
    payload = analyze(cli, trace)
    assert payload["bytes_read"] == 2 * 4096 and payload["bytes_written"] == 0
    cats = {(o["cat"], o["name"]): o for o in payload["operations"]}
    assert cats[("CUDA_MEMCPY", "HtoD")]["count"] == 1
    assert cats[("CUDA_MEMCPY", "HtoD")]["bytes"] == 0
    assert cats[("CUDA_KERNEL", "unet_fwd_kernel")]["count"] == 1
    (rep,) = payload["files"]
    assert any(
        "outside its process's lifetime" in p and p.startswith("1 ") for p in rep["problems"]
    )
    same_in_both_parsers(trace, monkeypatch)


def _traced(out: Path, data: Path, aggregate: bool) -> Path:
    """Run two commands (``cat`` of three files, ``head`` of one) under the installed DFTracer's
    preload library, with or without aggregation; their trace files go to ``out``."""
    from dlreplay.capture.run import preload_library

    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACER_")}
    env.update(
        LD_PRELOAD=str(preload_library()),
        DFTRACER_ENABLE="1",
        DFTRACER_INIT="PRELOAD",
        DFTRACER_INC_METADATA="1",
        DFTRACER_LOG_FILE=str(out / "trace"),
        DFTRACER_DATA_DIR=str(data),
        DFTRACER_ENABLE_AGGREGATION="1" if aggregate else "0",
        DFTRACER_TRACE_INTERVAL_MS="1000",
    )
    out.mkdir()
    files = [str(data / f"f{i}.bin") for i in range(3)]
    script = f"cat {' '.join(files)} >/dev/null; head -c 70000 {files[0]} >/dev/null"
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=60)
    return out


@pytest.mark.skipif(shutil.which("cat") is None, reason="needs cat and head")
def test_real_aggregated_capture_counts_what_the_plain_one_does(
    tmp_path: Path, cli, monkeypatch
) -> None:
    """Real aggregated records (DFTracer 2.2.0, FULL aggregation over 1 s intervals) give the
    same read calls and bytes as the same commands traced call by call."""
    pytest.importorskip("dftracer")
    data = tmp_path / "data"
    data.mkdir()
    for i, n in enumerate((300_000, 70_001, 5_000)):
        (data / f"f{i}.bin").write_bytes(os.urandom(n))
    plain = analyze(cli, _traced(tmp_path / "plain", data, aggregate=False))
    agg_dir = _traced(tmp_path / "agg", data, aggregate=True)
    lines = [json.loads(x) for f in agg_dir.glob("*.pfw.gz") for x in gzip.open(f)]
    folded = [r for r in lines if r.get("ph") == 3]
    assert folded and all("dft_cnt" in r["args"] for r in folded)  # the documented layout
    agg = analyze(cli, agg_dir)
    assert ops(agg)["read"]["count"] == ops(plain)["read"]["count"]
    assert ops(agg)["read"]["bytes"] == ops(plain)["read"]["bytes"] >= 375_001 + 70_000
    assert agg["bytes_read"] == plain["bytes_read"]
    assert not agg["incomplete"] and agg["dropped_lines"] == 0
    same_in_both_parsers(agg_dir, monkeypatch)
