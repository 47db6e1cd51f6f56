"""Damaged and odd traces through the CLI (issue #7, bad-input suite).

Every trace here is built from real corpus lines (``traces/npz_fork``): re-compressed into
several gzip members, then damaged. The expected event count is computed independently
(zlib and ``json.loads``, line by line) from what survives the damage, so "never loses a
valid event" is checked exactly. Through the CLI: exit code, no traceback, and a message
naming the file and what was dropped.
"""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlreplay import pfw
from dlreplay.analyze import load_trace

from .conftest import TRACES, check_no_traceback, run_cli
from .test_load import BAD_LINES, member_offsets, ref_decode, to_v1

SRC = TRACES / "npz_fork"
META_PH = (4, "4", "M")


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Exception ignored" not in text, text
    check_no_traceback(text)


def corpus_lines(name: str | None = None) -> list[bytes]:
    """Lines of the largest corpus file of npz_fork (a loader worker), or of ``name``."""
    path = SRC / name if name else max(SRC.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    return gzip.decompress(path.read_bytes()).splitlines()


def biggest() -> str:
    return max(SRC.glob("*.pfw.gz"), key=lambda p: p.stat().st_size).name


def is_event(line: bytes) -> bool:
    """A complete, valid, non-metadata DFTracer line (reference, independent of the loader)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and obj.get("ph") not in META_PH and "ts" in obj


def events_in(text: bytes) -> int:
    """Valid events among the complete lines of ``text`` (a trailing partial line is not one)."""
    return sum(is_event(ln) for ln in text.split(b"\n")[:-1])


def gz_members(lines: list[bytes], members: int) -> bytes:
    per = -(-len(lines) // members)
    return b"".join(
        gzip.compress(b"\n".join(lines[i : i + per]) + b"\n", mtime=0)
        for i in range(0, len(lines), per)
    )


def trace_with(tmp_path: Path, name: str, data: bytes) -> Path:
    """A copy of npz_fork where file ``name`` holds ``data``."""
    d = tmp_path / "trace"
    shutil.copytree(SRC, d)
    (d / name).write_bytes(data)
    return d


def analyze_json(trace: Path) -> dict:
    proc = run_cli("analyze", str(trace), "--json")
    no_traceback(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def file_report(payload: dict, name: str) -> dict:
    (rep,) = [f for f in payload["files"] if f["name"] == name]
    return rep


@pytest.fixture(scope="module")
def clean() -> dict:
    return analyze_json(SRC)


# --------------------------------------------------------------------------- gzip damage


@pytest.mark.parametrize(
    "where", ["10%", "45%", "member-boundary", "in-member-header", "in-trailer", "2-bytes"]
)
def test_truncated_gzip_keeps_every_complete_event(tmp_path: Path, clean: dict, where: str) -> None:
    name, lines = biggest(), corpus_lines()
    data = gz_members(lines, 4)
    starts = member_offsets(data)
    cut = {
        "10%": len(data) // 10,
        "45%": len(data) * 45 // 100,
        "member-boundary": starts[2],
        "in-member-header": starts[2] + 5,
        "in-trailer": len(data) - 3,
        "2-bytes": 2,
    }[where]
    trace = trace_with(tmp_path, name, data[:cut])
    text, _ = ref_decode(data[:cut])
    tail = text[text.rfind(b"\n") + 1 :]
    payload = analyze_json(trace)
    rep = file_report(payload, name)
    assert rep["events"] == events_in(text)  # exactly the complete events before the cut
    assert payload["events"] == clean["events"] - events_in(gzip.decompress(data)) + events_in(text)
    assert rep["dropped_lines"] == (1 if tail else 0) and rep["dropped_bytes"] == len(tail)
    if (
        where != "member-boundary"
    ):  # a cut exactly between members is indistinguishable from a shorter file
        assert any("truncated" in p for p in rep["problems"])
    text_out = run_cli("analyze", str(trace))
    no_traceback(text_out.stderr)
    if tail:
        assert f"warning: {name}: dropped 1 line(s) and {len(tail)} byte(s)" in text_out.stdout


def salvaged(member: bytes) -> bytes:
    """What zlib decodes of a corrupt gzip member before its first error (byte by byte)."""
    d = zlib.decompressobj(31)
    out = b""
    for i in range(len(member)):
        try:
            out += d.decompress(member[i : i + 1])
        except zlib.error:
            break
    return out


def test_corrupt_member_in_the_middle_later_members_still_read(tmp_path: Path, clean: dict) -> None:
    name, lines = biggest(), corpus_lines()
    data = gz_members(lines, 4)
    starts = [*member_offsets(data), len(data)]
    bad = bytearray(data)
    mid = (starts[1] + starts[2]) // 2
    bad[mid : mid + 48] = b"\xff" * 48
    trace = trace_with(tmp_path, name, bytes(bad))
    kept = [gzip.decompress(data[starts[k] : starts[k + 1]]) for k in (0, 2, 3)]
    damaged = salvaged(bytes(bad[starts[1] : starts[2]]))
    expected = sum(events_in(t) for t in kept) + events_in(damaged)
    payload = analyze_json(trace)
    rep = file_report(payload, name)
    assert rep["events"] == expected and rep["members"] == 4
    assert any(
        "corrupt gzip member 2" in p and "resumed at the next member header" in p
        for p in rep["problems"]
    )
    # the events of the members after the damage are all there (by timestamp)
    loaded = load_trace(trace)
    got = set(loaded.events.filter(pl.col("source") == name)["ts"].to_list())
    later = {json.loads(ln)["ts"] for t in kept[1:] for ln in t.splitlines() if is_event(ln)}
    assert later <= got
    out = run_cli("analyze", str(trace))
    assert "warning:" in out.stdout and name in out.stdout and "corrupt gzip member 2" in out.stdout


@pytest.mark.parametrize("damage", ["none", "truncated", "corrupt", "not-gzip-between"])
def test_fast_decoder_pieces_join_to_what_zlib_decodes(
    monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """ISA-L decodes members in small pieces (``_PIECE_BYTES``); joined, they are what the
    zlib path yields, with the same members, drops and problems (clean and damaged input)."""
    monkeypatch.setattr(pfw, "_PIECE_BYTES", 64 << 10)  # (the premise: members of several pieces)
    lines = corpus_lines()
    data = gz_members(lines * 12, 5)  # members of several pieces each
    starts = member_offsets(data)
    assert len(gzip.decompress(data[starts[0] : starts[1]])) > 2 * pfw._PIECE_BYTES
    if damage == "truncated":
        data = data[: (starts[2] + starts[3]) // 2]
    elif damage == "corrupt":
        bad = bytearray(data)
        bad[(starts[1] + starts[2]) // 2 : (starts[1] + starts[2]) // 2 + 48] = b"\xff" * 48
        data = bytes(bad)
    elif damage == "not-gzip-between":
        data = data[: starts[2]] + b"garbage" + data[starts[2] :]

    def decode() -> tuple[list[tuple[bytes, bool]], pfw.DecodeStats]:
        stats = pfw.DecodeStats()
        return list(pfw.decoded_pieces(data, stats)), stats

    assert pfw._FAST is not zlib, "isal is a dependency: the fast path must be in use"
    fast, fast_stats = decode()
    # the loader's way for large files: spans of small mappings (a member spans several)
    slab_stats = pfw.DecodeStats()
    slabs = pfw.Slabs(size=3 * pfw._PIECE_BYTES)
    spans = list(pfw.decoded_spans(data, slab_stats, slabs))
    assert slab_stats == fast_stats
    assert [(bytes(buf[lo:hi]), dmg) for buf, lo, hi, dmg in spans] == fast
    assert any(not isinstance(buf, bytes) for buf, _, _, _ in spans)
    monkeypatch.setattr(pfw, "_FAST", zlib)
    slow, slow_stats = decode()
    assert b"".join(p for p, _ in fast) == b"".join(p for p, _ in slow)

    def damage_points(pieces: list[tuple[bytes, bool]]) -> list[int]:
        """Decoded bytes before each point where damage follows."""
        ends = itertools.accumulate(len(p) for p, _ in pieces)
        return [end for end, (_, dmg) in zip(ends, pieces, strict=True) if dmg]

    assert damage_points(fast) == damage_points(slow)
    assert bool(damage_points(fast)) == (damage in ("truncated", "corrupt"))
    assert fast_stats == slow_stats
    if damage == "none":
        assert fast_stats.members == 5 and not fast_stats.problems
        assert max(len(p) for p, _ in fast) <= pfw._PIECE_BYTES < max(len(p) for p, _ in slow)
    else:
        assert fast_stats.problems


@pytest.mark.parametrize("members", [1, 3, 60])
def test_multi_member_gzip_reads_like_one_member(tmp_path: Path, clean: dict, members: int) -> None:
    name, lines = biggest(), corpus_lines()
    data = gz_members(lines, members)
    trace = trace_with(tmp_path, name, data)
    payload = analyze_json(trace)
    assert file_report(payload, name)["members"] == len(member_offsets(data)) >= min(members, 50)
    assert {k: v for k, v in payload.items() if k not in ("trace", "files")} == {
        k: v for k, v in clean.items() if k not in ("trace", "files")
    }
    assert load_trace(trace).events.drop("source").equals(load_trace(SRC).events.drop("source"))


# --------------------------------------------------------------------------- empty and metadata-only files


def test_empty_zero_byte_and_metadata_only_files(tmp_path: Path, clean: dict) -> None:
    """Next to real files they change nothing; alone, analyze says why there is nothing and
    distill refuses with a message (test_distill.test_cli_distill_empty_trace: 0-byte file)."""
    meta_only = b"\n".join(ln for ln in corpus_lines() if not is_event(ln)) + b"\n"
    odd = {
        "trace-empty-gzip.pfw.gz": gzip.compress(b""),
        "trace-zero.pfw.gz": b"",
        "trace-zero.pfw": b"",
        "trace-meta.pfw.gz": gzip.compress(meta_only),
    }
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    for n, data in odd.items():
        (trace / n).write_bytes(data)
    payload = analyze_json(trace)
    assert payload["events"] == clean["events"] and payload["dropped_lines"] == 0
    assert file_report(payload, "trace-meta.pfw.gz")["lines"] == meta_only.count(b"\n")
    alone = tmp_path / "alone"
    alone.mkdir()
    for n, data in odd.items():
        (alone / n).write_bytes(data)
    out = run_cli("analyze", str(alone))
    no_traceback(out.stderr)
    assert out.returncode == 0 and "warning: the trace holds no events" in out.stdout
    assert "trace-zero.pfw.gz: file is empty (0 bytes)" in out.stdout
    dis = run_cli("distill", str(alone), "-o", str(tmp_path / "m.yaml"))
    no_traceback(dis.stderr)
    assert dis.returncode == 1 and "no events" in dis.stderr
    exp = run_cli("export", str(alone), "-o", str(tmp_path / "x.perfetto-trace"))
    no_traceback(exp.stderr)
    assert exp.returncode == 1 and "no events" in exp.stderr


# --------------------------------------------------------------------------- DFTracer 1.x next to 2.x


def test_dftracer_1x_and_2x_files_in_one_directory(tmp_path: Path, clean: dict) -> None:
    """Every other file rewritten in DFTracer 1.x form (``[`` first line, letter ``ph``,
    numbers as strings, integer hashes, trailing commas): same summary as the 2.x original."""
    trace = tmp_path / "mixed"
    shutil.copytree(SRC, trace)
    converted = sorted(trace.glob("*.pfw.gz"))[::2]
    for f in converted:
        recs = [json.loads(x) for x in gzip.decompress(f.read_bytes()).splitlines()]
        f.write_bytes(gzip.compress(b"[\n" + b",\n".join(to_v1(r) for r in recs) + b",\n"))
    payload = analyze_json(trace)
    assert payload["dropped_lines"] == 0
    assert {k: v for k, v in payload.items() if k not in ("trace", "files")} == {
        k: v for k, v in clean.items() if k not in ("trace", "files")
    }
    model = run_cli("distill", str(trace), "-o", str(tmp_path / "m.yaml"))
    assert model.returncode == 0, model.stderr


# --------------------------------------------------------------------------- malformed and odd lines


def test_malformed_json_lines_are_dropped_and_counted(tmp_path: Path, clean: dict) -> None:
    name, lines = biggest(), corpus_lines()
    bad = [
        *BAD_LINES,
        b'{"id":1,"name":"read","dur":NaN}',
        b"[1, 2, 3]",
        b"null",
        b'"just a string"',
        b"\x00" * 40,
        b"}{",
    ]
    mixed = list(lines)
    for k, b in enumerate(bad):
        mixed.insert(7 + 13 * k, b)
    trace = trace_with(tmp_path, name, gz_members(mixed, 3))
    payload = analyze_json(trace)
    rep = file_report(payload, name)
    assert payload["events"] == clean["events"]  # not one valid event lost
    assert rep["dropped_lines"] == len(bad) and rep["dropped_bytes"] == sum(len(b) + 1 for b in bad)
    out = run_cli("analyze", str(trace))
    assert f"{name}: dropped {len(bad)} line(s)" in out.stdout and "malformed" in out.stdout


def _odd_trace(tmp_path: Path) -> tuple[Path, int]:
    """Valid events with odd values: unknown ph and type, an unknown file hash (no FH
    record anywhere), negative and huge durations, timestamps out of order and far away."""
    name, lines = biggest(), corpus_lines()
    recs = [json.loads(ln) for ln in lines]
    reads = [i for i, r in enumerate(recs) if r.get("name") == "read"]
    changes = [
        {"ph": "Z"},
        {"type": 99},
        {"args": {**recs[reads[2]]["args"], "fhash": "deadbeefdeadbeef"}},
        {"dur": -5},
        {"dur": 2**62},
        {"ts": recs[reads[5]]["ts"] - 10**9},
        {"ts": recs[reads[6]]["ts"] + 10**15},
        {"ts": 2**63 - 1},
    ]
    for i, change in zip(reads, changes, strict=False):
        recs[i] = {**recs[i], **change}
    out = [json.dumps(r, separators=(",", ":")).encode() for r in recs]
    return trace_with(tmp_path, name, gz_members(out, 2)), len(changes)


def test_odd_values_are_kept_and_every_command_copes(tmp_path: Path, clean: dict) -> None:
    """The events with possible values are kept (the duration of 2^62 µs reads as null and is
    counted); the three timestamps outside the capture are set aside and the negative duration
    reads as null, each counted (issue #45: no impossible value is summed as a fact); analyze,
    distill and export (both formats) finish without a traceback."""
    trace, _ = _odd_trace(tmp_path)
    name = biggest()
    payload = analyze_json(trace)
    assert payload["events"] == clean["events"] - 3 and payload["dropped_lines"] == 0
    # the two reads moved far into the future come after their files' closes: on no file
    problems = file_report(payload, name)["problems"]
    assert problems[:2] == [
        "1 event(s) with a duration beyond \u00b1407 days (read as null)",
        "2 event(s) with a file their process had closed or never opened for writing (DFTracer's close race: "
        "another thread reused the descriptor), kept without a file",
    ]
    assert problems[2].startswith("3 event(s) with a timestamp outside the capture (")
    assert problems[3] == "1 event(s) with a negative duration (read as null)"
    events = load_trace(trace).events
    assert events["dur"].null_count() == 2 and events["dur"].max() < 2**45  # 2^62 µs and -5
    assert events["dur"].min() >= 0
    assert events["ts"].is_sorted(nulls_last=True)  # out-of-order input comes out in time order
    missing_fh = events.filter(pl.col("fhash") == "deadbeefdeadbeef")
    assert missing_fh.height == 1 and missing_fh["file"][0] is None
    dis = run_cli("distill", str(trace), "-o", str(tmp_path / "m.yaml"))
    no_traceback(dis.stderr)
    assert dis.returncode == 0, dis.stderr
    for out in ("x.perfetto-trace", "x.json.gz"):
        exp = run_cli("export", str(trace), "-o", str(tmp_path / out))
        no_traceback(exp.stderr)
        assert exp.returncode == 0, exp.stderr
        # (the timestamp beyond year 2262 and the negative duration are left out at load)
        assert "not written" not in exp.stdout


def test_byte_counts_no_call_moves_are_read_as_null_and_named(tmp_path: Path, clean: dict) -> None:
    """Two reads claiming 2^63 - 1 bytes each: their sizes read as null and are counted, so
    the totals are the clean trace's less those two reads (not wrapped: one such read made a
    total read -8192 PiB), and the plain output names the file and why."""
    name, lines = biggest(), corpus_lines()
    recs = [json.loads(ln) for ln in lines]
    reads = [
        i
        for i, r in enumerate(recs)
        if r.get("name") == "read" and r.get("args", {}).get("ret", 0) > 0
    ]
    lost = sum(recs[i]["args"]["ret"] for i in reads[:2])
    for i in reads[:2]:
        recs[i]["args"]["ret"] = 2**63 - 1
    trace = trace_with(
        tmp_path, name, gz_members([json.dumps(r, separators=(",", ":")).encode() for r in recs], 2)
    )
    payload = analyze_json(trace)
    assert payload["events"] == clean["events"]
    assert payload["bytes_read"] == clean["bytes_read"] - lost > 0
    assert file_report(payload, name)["problems"] == [
        "2 event(s) with a byte count negative or beyond 1 TiB in one call (read as null)"
    ]
    out = run_cli("analyze", str(trace))
    assert (
        f"{name}: dropped 0 line(s)" in out.stdout
        and "beyond 1 TiB in one call (read as null)" in out.stdout
    )
    assert "PiB" not in out.stdout and "EiB" not in out.stdout


def test_times_in_milliseconds_beyond_int64_in_microseconds(tmp_path: Path) -> None:
    """A trace in ms (``CM`` time_metric ``MS``) with a timestamp and a duration of 2^62 ms:
    in µs they pass Int64. The timestamp is clipped to Int64 (kept, as one of 2^63 - 1 µs
    is), the duration reads as null and is counted; the rest is converted as before.
    **Was**: a polars cast error and a traceback from ``analyze``."""
    t0 = 1_795_315_916_000  # ms
    recs = [
        {
            "name": "CM",
            "cat": "dftracer",
            "pid": 1,
            "tid": 1,
            "ph": 4,
            "args": {"hhash": "aa", "name": "time_metric", "value": "MS"},
        }
    ]
    for i in range(10):
        recs.append(
            {
                "id": i,
                "name": "read",
                "cat": "POSIX",
                "pid": 1,
                "tid": 1,
                "ts": 2**62 if i == 9 else t0 + i,
                "dur": 2**62 if i == 3 else 2,
                "ph": 1,
                "args": {"hhash": "aa", "fhash": "f1", "ret": 10, "count": 10},
            }
        )
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "ms.pfw").write_text("".join(json.dumps(r) + "\n" for r in recs))
    payload = analyze_json(tmp_path / "t")
    assert payload["events"] == 10 and payload["bytes_read"] == 100
    assert file_report(payload, "ms.pfw")["problems"] == [
        "1 event(s) with a duration beyond \u00b1407 days (read as null)"
    ]
    events = load_trace(tmp_path / "t").events
    assert events["ts"].to_list()[:9] == [(t0 + i) * 1000 for i in range(9)]
    assert events["ts"].to_list()[9] > 2**63 - 2**11  # clipped
    assert events["dur"].to_list() == [2000] * 3 + [None] + [2000] * 6


def test_lines_that_are_not_events_are_dropped_and_counted(tmp_path: Path, clean: dict) -> None:
    name, lines = biggest(), corpus_lines()
    read = next(json.loads(ln) for ln in lines if b'"name":"read"' in ln)
    not_events = [
        b"{}",
        json.dumps({k: v for k, v in read.items() if k != "ts"}).encode(),
        json.dumps({**read, "ts": 2**64}).encode(),
        json.dumps({**read, "pid": True}).encode(),
    ]
    trace = trace_with(tmp_path, name, gz_members([*lines, *not_events], 1))
    payload = analyze_json(trace)
    rep = file_report(payload, name)
    assert payload["events"] == clean["events"]
    assert rep["dropped_lines"] == len(not_events)


# --------------------------------------------------------------------------- property: random events, random damage

T0 = 1_795_315_916_000_000
_NAMES = [
    "read",
    "read",
    "write",
    "open64",
    "close",
    "lseek64",
    "pread64",
    "fetch",
    "item",
    "odd_op",
]
_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n\r"), max_size=10
)
#: Lines that are not valid JSON (or not an object), none containing a newline, none ending
#: in "," or blank (see test_dropped_bytes_of_a_malformed_line_ending_in_a_comma).
_MALFORMED = [*BAD_LINES, b"[1, 2]", b"null", b"}{", b'{"ts":1', b"\x00\x00\x00", b'{"a":1}}']


@st.composite
def _events(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(1, 120))
    out = []
    for i in range(n):
        name = draw(st.sampled_from(_NAMES))
        args: dict[str, Any] = {
            "hhash": "6882804a826580cd",
            "fhash": draw(st.sampled_from(["00000000000000aa", "00000000000000bb"])),
        }
        if name in ("read", "write", "pread64"):
            args.update(ret=draw(st.integers(-1, 2**40)), count=draw(st.integers(0, 2**40)))
        if name in ("fetch", "item"):
            args.update(epoch=draw(st.integers(0, 5)), step=draw(st.integers(0, 1000)))
        if draw(st.booleans()):
            args["note"] = draw(_text)  # commas, quotes, escapes, non-ASCII
        out.append(
            {
                "id": i + 1,
                "name": name,
                "cat": "POSIX" if name not in ("fetch", "item") else "dataloader",
                "type": 3,
                "pid": draw(st.sampled_from([101, 102])),
                "tid": 101,
                "ts": T0 + 7 * i,
                "dur": draw(st.integers(0, 10**6)),
                "ph": 1,
                "args": args,
            }
        )
    return out


@st.composite
def _damaged(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """(file bytes, the lines written), with malformed lines inserted, several members, maybe a cut."""
    meta = [
        json.dumps(
            {
                "name": "FH",
                "cat": "dftracer",
                "type": 1,
                "pid": 101,
                "tid": 101,
                "ph": 4,
                "args": {"name": f"/d/{h}", "value": h},
            }
        ).encode()
        for h in ("00000000000000aa", "00000000000000bb")
    ]
    ascii_only = draw(st.booleans())
    lines = meta + [
        json.dumps(e, separators=(",", ":"), ensure_ascii=ascii_only).encode()
        for e in draw(_events())
    ]
    for _ in range(draw(st.integers(0, 6))):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(_MALFORMED)))
    data = gz_members(lines, draw(st.integers(1, 5)))
    if draw(st.booleans()):
        data = data[: draw(st.integers(1, len(data)))]
    return data, lines


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=_damaged())
def test_random_events_with_random_damage(tmp_path: Path, case: tuple[bytes, list[bytes]]) -> None:
    """Exactly the complete valid events survive, and every other line is counted as dropped."""
    data, _ = case
    path = tmp_path / "h.pfw.gz"
    path.write_bytes(data)
    text, _ = ref_decode(data)
    complete, tail = text.split(b"\n")[:-1], text[text.rfind(b"\n") + 1 :]
    want = sorted(
        (o["ts"], o["pid"], o["name"], o["dur"])
        for o in (json.loads(ln) for ln in complete if is_event(ln))
    )
    malformed = [ln for ln in complete if ln.strip() and not _json_object(ln)]
    loaded = load_trace(path)
    got = sorted(loaded.events.select("ts", "pid", "name", "dur").iter_rows())
    assert got == want
    rep = loaded.files[0]
    assert rep.dropped_lines == len(malformed) + (1 if tail else 0)
    assert rep.dropped_bytes == sum(len(ln) + 1 for ln in malformed) + len(tail)


def _json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_dropped_bytes_of_a_malformed_line_ending_in_a_comma(tmp_path: Path) -> None:
    lines = corpus_lines()
    bad = [b'{"ts":1,', b'{"name":"read" ,  ']
    path = tmp_path / "c.pfw.gz"
    path.write_bytes(gz_members([bad[0], *lines, bad[1]], 1))
    rep = load_trace(path).files[0]
    assert rep.dropped_lines == 2
    assert rep.dropped_bytes == sum(len(b) + 1 for b in bad)


# --------------------------------------------------------------------------- traces that hold nothing, runs that did not end


def _first_lines(text: str) -> list[str]:
    """The lines before the summary (what a reader sees first)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("warning: "):
            break
        out.append(line)
    return out


def test_empty_header_only_and_cut_files_are_named_first_in_plain_output(tmp_path: Path) -> None:
    """Not only in --json: the plain text names each file without events and each cut one, before the summary."""
    lines = corpus_lines()
    data = gz_members(lines, 2)
    odd = {
        "trace-zero.pfw.gz": b"",
        "trace-header.pfw.gz": gzip.compress(b"[\n"),
        "trace-cut.pfw.gz": data[: len(data) * 2 // 3],
    }
    trace = trace_with(tmp_path, biggest(), data)
    for n, d in odd.items():
        (trace / n).write_bytes(d)
    proc = run_cli("analyze", str(trace))
    no_traceback(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    first = "\n".join(_first_lines(proc.stdout))
    assert "1 process file(s) cut or damaged (trace-cut.pfw.gz)" in first
    assert (
        "trace-zero.pfw.gz (file is empty (0 bytes)" in first and "trace-header.pfw.gz (" in first
    )
    assert "hold no events" in first
    payload = json.loads(run_cli("analyze", str(trace), "--json", check=True).stdout)
    assert payload["incomplete"] is True
    assert [f"warning: {w}" for w in payload["warnings"]] == _first_lines(proc.stdout)


def test_comparing_traces_without_events_is_an_error(tmp_path: Path) -> None:
    """Two empty traces used to be 'identical' (similarity 1.0)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "trace-a.pfw.gz").write_bytes(b"")
    (empty / "trace-b.pfw.gz").write_bytes(gzip.compress(b"[\n"))
    for a, b, bad in ((empty, empty, empty), (SRC, empty, empty), (empty, SRC, empty)):
        proc = run_cli("compare", str(a), str(b), "--json")
        no_traceback(proc.stderr)
        assert proc.returncode == 1 and proc.stdout == "", proc.stdout
        assert (
            f"dlreplay: error: {bad}: the trace holds no events, so there is nothing to compare"
            in proc.stderr
        )
        assert "trace-a.pfw.gz (file is empty (0 bytes)" in proc.stderr


def test_duplicate_files_and_another_run_inside_are_reported_not_summed(
    tmp_path: Path, clean: dict
) -> None:
    """The same run copied into a subdirectory, and another capture (its own manifest) kept inside:
    both left out and named; the numbers are those of the run itself."""
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    shutil.copytree(
        SRC, trace / "again", ignore=shutil.ignore_patterns("manifest.json")
    )  # the same run twice
    shutil.copytree(TRACES / "npz_spawn", trace / "replay")  # another run, with its manifest
    payload = analyze_json(trace)
    assert payload["events"] == clean["events"]
    assert payload["bytes_read"] == clean["bytes_read"]
    n = len(list(SRC.glob("*.pfw*")))
    assert any(
        w.startswith(f"{n} trace file(s) are byte-identical copies of others")
        for w in payload["warnings"]
    )
    assert any(w.startswith("replay/: ") and "of another run" in w for w in payload["warnings"])
    text = run_cli("analyze", str(trace), check=True).stdout
    assert "byte-identical copies" in text.split("\n\n")[0] and "replay/" in text.split("\n\n")[0]
    cmp = json.loads(run_cli("compare", str(trace), str(SRC), "--json", check=True).stdout)
    assert cmp["similarity"] == pytest.approx(1.0, abs=1e-9) and cmp["warnings"]["b"] == []
    assert len(cmp["warnings"]["a"]) == 2


def test_a_directory_of_several_runs_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "traces"
    runs.mkdir()
    shutil.copytree(SRC, runs / "a")
    shutil.copytree(TRACES / "npz_spawn", runs / "b")
    proc = run_cli("analyze", str(runs))
    no_traceback(proc.stderr)
    assert proc.returncode == 1
    assert (
        f"{runs} holds 2 captured runs (a, b), each with its own manifest.json: analyse one run at a time"
        in proc.stderr
    )
    (
        runs / "b" / "manifest.json"
    ).unlink()  # b's files are now loose files of the directory: a is left out
    assert "a/: " in "\n".join(analyze_json(runs)["warnings"])


def test_capture_that_did_not_end_is_said_first_and_marked(tmp_path: Path) -> None:
    """manifest 'running' (the capture was killed): analyze, distill and compare say so first; the
    distilled model and the JSON outputs carry it."""
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    manifest = json.loads((trace / "manifest.json").read_text())
    manifest["status"] = "running"
    (trace / "manifest.json").write_text(json.dumps(manifest))
    said = "the capture did not end: its manifest.json still says 'running'"
    ana = run_cli("analyze", str(trace), check=True)
    assert ana.stdout.startswith(f"warning: {said}")
    assert (
        said
        in json.loads(run_cli("analyze", str(trace), "--json", check=True).stdout)["warnings"][0]
    )
    dis = run_cli("distill", str(trace), "-o", str(tmp_path / "m.yaml"), check=True)
    assert dis.stdout.startswith(f"warning: {said}")
    from dlreplay.model import load_model

    assert any(
        n.startswith(f"distilled from an incomplete trace: {said}")
        for n in load_model(tmp_path / "m.yaml").provenance.notes
    )
    cmp = run_cli("compare", str(SRC), str(trace), check=True)
    assert cmp.stdout.startswith(f"warning: B ({trace}): {said}")


# --------------------------------------------------------------------------- garbage: memory bounded by content


PEAK = """
import resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "dlreplay", *sys.argv[1:]], capture_output=True, text=True)
sys.stdout.write(proc.stdout)
sys.stderr.write(proc.stderr)
print(f"exit {proc.returncode} peak {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}")
"""


@pytest.mark.parametrize("kind", ["nul-plain", "nul-gzip", "random-plain"])
def test_garbage_files_need_memory_by_content_not_size(tmp_path: Path, kind: str) -> None:
    """200 MiB of NUL bytes (plain, or gzip: a 1000:1 "zip bomb") and 64 MiB of random bytes named
    .pfw: no events, every byte counted as dropped, and the peak memory of `dlreplay analyze` far
    below the file size (it was 3.4 GB for the NUL file, 1 GB and 80 s for 20 MiB of random bytes)."""
    size = {"nul-plain": 200 << 20, "nul-gzip": 200 << 20, "random-plain": 64 << 20}[kind]
    trace = tmp_path / "trace"
    trace.mkdir()
    if kind == "random-plain":
        (trace / "trace-x.pfw").write_bytes(np.random.default_rng(7).bytes(size))
    elif kind == "nul-plain":
        with open(trace / "trace-x.pfw", "wb") as fh:
            fh.truncate(size)  # a sparse file of NUL bytes
    else:
        comp = zlib.compressobj(1, zlib.DEFLATED, 31)
        with open(trace / "trace-x.pfw.gz", "wb") as fh:
            for _ in range(size >> 20):
                fh.write(comp.compress(bytes(1 << 20)))
            fh.write(comp.flush())
    script = tmp_path / "peak.py"
    script.write_text(PEAK)
    proc = subprocess.run(
        [sys.executable, str(script), "analyze", str(trace), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    no_traceback(proc.stderr)
    last = proc.stdout.strip().splitlines()[-1]
    code, peak = int(last.split()[1]), int(last.split()[3])
    assert code == 0, proc.stderr
    payload = json.loads(proc.stdout[: proc.stdout.rindex("\nexit ")])
    (rep,) = payload["files"]
    assert payload["events"] == 0 and rep["events"] == 0
    assert size * 0.98 <= rep["dropped_bytes"] <= size
    print(f"{kind}: {size >> 20} MiB file, peak RSS {peak >> 20} MiB")
    assert (
        peak < 1 << 30
    )  # measured 105-560 MiB here (the interpreter, polars and numpy alone: ~110 MiB)


# --------------------------------------------------------------------------- names with control characters or markup


NASTY = "vol_\x1b[31mRED\x1b[0m<script>alert(1)</script>|*x*_\nnext\r\x07\u202e`y`[l](http://e)"


def test_names_with_control_characters_and_markup_are_escaped(tmp_path: Path) -> None:
    """A dataset file whose name holds a terminal escape, markup, Markdown table syntax, a line
    break, a bell and a bidi override: shown escaped on the terminal, in Markdown and in HTML."""
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    renamed = 0
    for f in trace.glob("*.pfw.gz"):
        out = []
        for line in gzip.decompress(f.read_bytes()).splitlines():
            if b"vol_00001" in line:
                line = line.replace(b"vol_00001", json.dumps(NASTY).encode()[1:-1])
                renamed += 1
            out.append(line)
        f.write_bytes(gzip.compress(b"\n".join(out) + b"\n"))
    assert renamed
    data = json.loads((SRC / "manifest.json").read_text())["data_dirs"][0]
    text = run_cli("analyze", str(trace), "--data-dir", data, check=True).stdout
    for raw in ("\x1b", "\r", "\x07", "\u202e"):
        assert raw not in text
    assert (
        "\\nnext\\r\\x07\\u202e" in text
    )  # the end of the name (the table shows a long name's end)
    md = tmp_path / "r.md"
    run_cli("analyze", str(trace), "--data-dir", data, "--report", str(md), check=True)
    doc = md.read_text()
    assert "\x1b" not in doc and "<script>" not in doc and "&lt;script&gt;" in doc
    (row,) = [ln for ln in doc.splitlines() if "RED" in ln]  # the name did not break its table row
    assert row.startswith("| ") and row.count(" | ") == 6 and "\\|\\*x\\*" in row
    page = tmp_path / "r.html"
    run_cli("analyze", str(trace), "--report", str(page), check=True)
    html_doc = page.read_text()
    assert (
        "\x1b" not in html_doc
        and "<script>alert" not in html_doc
        and "&lt;script&gt;alert(1)" in html_doc
    )
    cmp = run_cli("compare", str(trace), str(SRC), "--report", str(tmp_path / "c.md"), check=True)
    assert "\x1b" not in cmp.stdout
