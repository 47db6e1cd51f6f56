"""The C scanner (``dlreplay.analyze.trace._pfwscan``) against the Python/polars parser.

Every trace of the corpus, every damaged trace of the bad-input suite (built with its
builders) and random mixes of valid, odd and malformed lines load into identical event
tables (values, dtypes, order) and identical per-file reports (lines, events, dropped
lines and bytes, problems) with the native scanner and with ``DLREPLAY_PARSER=python``.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from dlreplay import pfw
from dlreplay.analyze import LoadedTrace, load_trace

from .conftest import TRACES
from .test_bad_traces import SRC, biggest, corpus_lines, gz_members
from .test_bad_traces import _odd_trace as odd_trace
from .test_load import BAD_LINES, _many_small_files, member_offsets, to_v1

LOAD = importlib.import_module("dlreplay.analyze.trace.load")
NATIVE = importlib.import_module("dlreplay.analyze.trace.native")
DECOMPRESS = importlib.import_module("dlreplay.analyze.trace.decompress")
SCAN = importlib.import_module("dlreplay.analyze.trace.scan")
RESOLVE = importlib.import_module("dlreplay.analyze.trace.resolve")
MERGE = importlib.import_module("dlreplay.analyze.trace.merge")
INPUTS = importlib.import_module("dlreplay.analyze.trace.inputs")
SHAPES = importlib.import_module("dlreplay.analyze.trace.shapes")
CORPUS = sorted(p for p in TRACES.iterdir() if p.is_dir() and any(p.glob("*.pfw.gz")))


def load_both(
    path: Path | list[Path], monkeypatch: pytest.MonkeyPatch, **kw: Any
) -> tuple[LoadedTrace, LoadedTrace]:
    """(native, python) loads of ``path``."""
    monkeypatch.delenv(LOAD.PARSER_ENV, raising=False)
    assert LOAD.native_parser_available()
    native = load_trace(path, **kw)
    monkeypatch.setenv(LOAD.PARSER_ENV, "python")
    assert not LOAD.native_parser_available()
    python = load_trace(path, **kw)
    monkeypatch.delenv(LOAD.PARSER_ENV)
    return native, python


def assert_same(native: LoadedTrace, python: LoadedTrace) -> None:
    assert_frame_equal(native.events, python.events, check_exact=True)
    assert native.files == python.files


def test_the_extension_is_built() -> None:
    """`make venv` builds it (setup.py); without it every other test here compares nothing."""
    assert NATIVE.NATIVE is not None, (
        "dlreplay.analyze.trace._pfwscan is not built: is a C compiler installed?"
    )


def test_sorting_leaves_the_timestamps_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output order's sort key is built in place in a copy: numpy's view of a polars
    column can be writable, and the key once overwrote the table's ``ts`` (the Python path
    loaded these lines with ts 0 and 1; found by the random-lines test below)."""
    good = (
        b'{"id":0,"name":"read","cat":"POSIX","pid":101,"tid":101,"ts":1795315916000000,"dur":0,"ph":1,'
        b'"args":{"hhash":"6882804a826580cd","fhash":"00000000000000aa","ret":0}}'
    )
    nopid = (
        b'{"id":0,"name":"read","cat":"POSIX","pid":null,"tid":101,"ts":1795315916000000,"dur":0,"ph":1,'
        b'"args":{"hhash":"6882804a826580cd","fhash":"00000000000000aa"}}'
    )
    path = tmp_path / "t.pfw"
    path.write_bytes(b"\n".join([good, good] + [nopid] * 40) + b"\n")
    native, python = load_both(path, monkeypatch)
    assert python.events["ts"].to_list() == [1795315916000000] * 2
    assert_same(native, python)


def test_ids_and_loop_counters_are_32_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pid/ppid/tid and epoch/step are Int32 in the event table (4 B a row each, not 8):
    a counter beyond 32 bits is no counter and reads as null, the rest of the event stays."""

    def item(epoch: int, step: int) -> bytes:  # a worker's item: not numbered by the loop's fill
        return (
            b'{"id":0,"name":"item","cat":"data","pid":101,"tid":101,"ts":1795315916000000,"dur":5,'
            b'"ph":"X","args":{"epoch":%d,"step":%d,"batch_size":4}}' % (epoch, step)
        )

    path = tmp_path / "t.pfw"
    far = item(4, 4).replace(b'"tid":101', b'"tid":%d' % 2**33)
    path.write_bytes(
        b"\n".join([item(0, 2_147_483_647), item(2**31, 1), item(3, 2**40), far]) + b"\n"
    )
    native, python = load_both(path, monkeypatch)
    assert_same(native, python)
    ev = native.events
    narrow = ("pid", "ppid", "tid", "epoch", "step")
    assert {c: ev.schema[c] for c in narrow} == dict.fromkeys(narrow, pl.Int32())
    assert ev.schema["batch_size"] == pl.Int64()  # summed to a run's samples: 64-bit
    assert ev["epoch"].to_list() == [0, None, 3, 4]
    assert ev["step"].to_list() == [2_147_483_647, 1, None, 4]
    assert ev["batch_size"].to_list() == [4, 4, 4, 4] and ev["dur"].to_list() == [5, 5, 5, 5]
    # a thread id beyond 32 bits is no pid_t: null, and the file's report counts it
    assert ev["tid"].to_list() == [101, 101, 101, None]
    assert any(
        "1 event(s) with a pid, ppid or tid beyond 32 bits" in p for p in native.files[0].problems
    )
    assert (
        native.damaged
        and "kept 4 event(s) (1 event(s) with a pid, ppid or tid" in native.describe_damage()
    )


def test_byte_counts_beyond_one_call_read_as_null(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte count no call can move (negative, or beyond 1 TiB: Linux moves at most 2 GiB in
    one read) is damage: read as null and counted in the file's report, the event kept. One
    read of 2^63 - 1 bytes made the trace's total read -8192 PiB (polars' Int64 sum wraps)."""
    at = iter(
        range(T0, T0 + 10**6, 100)
    )  # apart: a checkpoint's size is not filled from others' writes

    def ev(name: str, cat: str, **args: int) -> bytes:
        return json.dumps(
            {
                "id": 0,
                "name": name,
                "cat": cat,
                "pid": 101,
                "tid": 101,
                "ts": next(at),
                "dur": 5,
                "ph": 1,
                "args": {"hhash": "6882804a826580cd", "fhash": "00000000000000aa", **args},
            }
        ).encode()

    tib = 1 << 40
    lines = [
        ev("read", "POSIX", ret=2**63 - 1, count=4096),  # ret: beyond
        ev("fread", "STDIO", ret=1 << 30, size=1 << 11),  # items x item size: 2 TiB
        ev("fread", "STDIO", ret=1 << 20, size=1 << 20),  # exactly 1 TiB: a size
        ev("fread", "STDIO", ret=3, size=-2, count=3),  # a negative item size
        ev("save", "checkpoint", bytes=-5),  # a negative checkpoint size
        ev("save", "checkpoint", bytes=tib),  # 1 TiB: a size
        ev("read", "POSIX", ret=-1, count=tib + 1),  # a failed call (no size), count beyond
        ev("read", "POSIX", ret=-1, count=4096),  # a failed call: no damage
        ev("write", "POSIX", ret=100, count=4096),
    ]
    path = tmp_path / "t.pfw"
    path.write_bytes(b"\n".join(lines) + b"\n")
    native, python = load_both(path, monkeypatch)
    assert_same(native, python)
    ev_ = native.events
    assert ev_["size"].to_list() == [None, None, tib, None, None, tib, None, None, 100]
    assert ev_["size_requested"].to_list() == [4096, None, None, None, None, None, None, 4096, 4096]
    assert native.files[0].problems == [
        "5 event(s) with a byte count negative or beyond 1 TiB in one call (read as null)"
    ]
    assert (
        native.damaged
        and "kept 9 event(s) (5 event(s) with a byte count" in native.describe_damage()
    )
    assert native.events.height == len(lines)


@pytest.mark.parametrize("trace", CORPUS, ids=lambda p: p.name)
def test_corpus_traces_load_identically(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native, python = load_both(trace, monkeypatch)
    assert native.events.height > 0
    assert_same(native, python)


def test_without_the_extension_loading_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    native = load_trace(SRC)
    monkeypatch.setattr(NATIVE, "NATIVE", None)
    assert not LOAD.native_parser_available()
    assert_same(native, load_trace(SRC))


# --------------------------------------------------------------------------- the bad-input suite's traces


def _truncated(where: str) -> bytes:
    data = gz_members(corpus_lines(), 4)
    starts = member_offsets(data)
    cut = {
        "10%": len(data) // 10,
        "45%": len(data) * 45 // 100,
        "member-boundary": starts[2],
        "in-member-header": starts[2] + 5,
        "in-trailer": len(data) - 3,
        "2-bytes": 2,
    }[where]
    return data[:cut]


def _corrupt_middle() -> bytes:
    data = gz_members(corpus_lines(), 4)
    starts = [*member_offsets(data), len(data)]
    bad = bytearray(data)
    mid = (starts[1] + starts[2]) // 2
    bad[mid : mid + 48] = b"\xff" * 48
    return bytes(bad)


def _malformed() -> bytes:
    bad = [
        *BAD_LINES,
        b'{"id":1,"name":"read","dur":NaN}',
        b"[1, 2, 3]",
        b"null",
        b'"just a string"',
        b"\x00" * 40,
        b"}{",
        b'{"ts":1,',
        b'{"name":"read" ,  ',
    ]
    mixed = list(corpus_lines())
    for k, b in enumerate(bad):
        mixed.insert(7 + 13 * k, b)
    return gz_members(mixed, 3)


def _not_events() -> bytes:
    lines = corpus_lines()
    read = next(json.loads(ln) for ln in lines if b'"name":"read"' in ln)
    not_events = [
        b"{}",
        json.dumps({k: v for k, v in read.items() if k != "ts"}).encode(),
        json.dumps({**read, "ts": 2**64}).encode(),
        json.dumps({**read, "pid": True}).encode(),
    ]
    return gz_members([*lines, *not_events], 1)


BAD_CASES = {
    **{
        f"truncated-{w}": (lambda w=w: _truncated(w))
        for w in ("10%", "45%", "member-boundary", "in-member-header", "in-trailer", "2-bytes")
    },
    "corrupt-middle-member": _corrupt_middle,
    **{f"members-{m}": (lambda m=m: gz_members(corpus_lines(), m)) for m in (1, 3, 60)},
    "malformed-lines": _malformed,
    "not-events": _not_events,
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_suite_loads_identically(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    (trace / biggest()).write_bytes(BAD_CASES[case]())
    native, python = load_both(trace, monkeypatch)
    assert_same(native, python)


@pytest.mark.parametrize(
    "case", ["clean", "truncated-45%", "corrupt-middle-member", "malformed-lines", "members-60"]
)
def test_large_file_path_loads_identically(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large files decode a chunk ahead in a helper thread, into huge-page mappings
    (``pfw.Slabs``), and are parsed in chunks: forced here onto small files (and small
    chunks, outputs and mappings, so that lines and members span them), the table and
    reports are those of the ordinary path, and intact members never fall back to zlib."""
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    if case != "clean":
        (trace / biggest()).write_bytes(BAD_CASES[case]())
    ordinary = load_trace(trace)
    monkeypatch.setattr(LOAD, "_PREFETCH_BYTES", 1)
    monkeypatch.setattr(LOAD, "_PREFETCH_SPARE_ONLY", False)  # whatever the cores
    monkeypatch.setattr(DECOMPRESS, "CHUNK_BYTES", 48 << 10)
    monkeypatch.setattr(pfw, "SLAB_BYTES", 40 << 10)
    monkeypatch.setattr(pfw, "_PIECE_BYTES", 16 << 10)
    made: list[int] = []
    real_map = pfw.anonymous_map
    monkeypatch.setattr(pfw, "anonymous_map", lambda n: made.append(n) or real_map(n))
    slow: list[int] = []
    real_zlib = pfw.zlib.decompressobj
    monkeypatch.setattr(pfw.zlib, "decompressobj", lambda *a: slow.append(1) or real_zlib(*a))
    assert_same(load_trace(trace), ordinary)
    assert set(made) == {40 << 10} and len(made) > len(
        list(trace.glob("*.pfw.gz"))
    )  # files span mappings
    if case in ("clean", "members-60", "malformed-lines"):
        assert not slow, "intact members fell back to zlib"


def test_files_decode_ahead_only_where_a_core_would_be_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper thread decodes a file ahead only where the load has fewer jobs than
    threads (a core would be idle): with every thread parsing, helpers only compete for
    the GIL. The jobs parse_parts starts first, while at least as many wait, never
    decode ahead; a load of one file on 2 threads does; the table is the same."""
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    files = sorted(trace.glob("*.pfw.gz"))
    assert len(files) >= 3
    monkeypatch.setattr(LOAD, "_PREFETCH_BYTES", 1)
    asked: list[bool | None] = []
    ahead: list[int] = []
    real_part, real_ahead = LOAD.parse_part, LOAD.prefetched

    def part(jobs, *, prefetch=None, **kw):
        asked.append(prefetch)
        return real_part(jobs, prefetch=prefetch, **kw)

    monkeypatch.setattr(LOAD, "parse_part", part)
    monkeypatch.setattr(LOAD, "prefetched", lambda *a, **k: ahead.append(1) or real_ahead(*a, **k))
    names = [f.name for f in files]
    many = LOAD.combine(
        list(LOAD.parse_parts(files, jobs=2, group_bytes=1)), names
    )  # a group per file
    assert len(asked) == len(files) and asked[:2] == [False, False]
    assert len(ahead) == sum(asked)  # (a later job may find the other thread done)
    asked.clear()
    ahead.clear()
    one = LOAD.combine(list(LOAD.parse_parts(files[:1], jobs=2)), names[:1])
    assert asked == [True] and ahead == [1]
    assert_frame_equal(many.events.filter(pl.col("source") == names[0]), one.events)
    monkeypatch.setattr(LOAD, "parse_part", real_part)
    assert_same(LOAD.combine(list(LOAD.parse_parts(files, jobs=2, group_bytes=1)), names), many)


def test_parsed_text_mappings_are_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a chunk of a large file's text is parsed, its mappings take the text decoded
    next (here about half as many mappings), and the table is still the one of the
    ordinary path. (A gzip member is decoded whole into mappings: the file has 60.)

    How many mappings are made depends a little on how the decoding thread and the parse
    interleave: 15 of 30 in 65 runs on the project's VM, with the decoder held back (each
    release 20 ms late) or not, on one core or two, and 16 in one CI run. The bound
    leaves room for that, not for text that is never written again (30)."""
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    for extra in trace.glob("*.pfw.gz"):
        if extra.name != biggest():
            extra.unlink()
    (trace / biggest()).write_bytes(BAD_CASES["members-60"]())
    ordinary = load_trace(trace)
    monkeypatch.setattr(LOAD, "_PREFETCH_BYTES", 1)
    monkeypatch.setattr(LOAD, "_PREFETCH_SPARE_ONLY", False)  # whatever the cores
    monkeypatch.setattr(
        DECOMPRESS, "CHUNK_BYTES", 12 << 10
    )  # ~9 chunks a file (a slab is free 3 chunks on)
    monkeypatch.setattr(pfw, "SLAB_BYTES", 4 << 10)
    monkeypatch.setattr(pfw, "_PIECE_BYTES", 2 << 10)
    made: list[int] = []
    real_map = pfw.anonymous_map
    monkeypatch.setattr(pfw, "anonymous_map", lambda n: made.append(n) or real_map(n))
    assert_same(load_trace(trace), ordinary)
    recycled = len(made)
    made.clear()
    monkeypatch.setattr(pfw.Slabs, "release", lambda self, through: None)
    assert_same(load_trace(trace), ordinary)
    assert recycled <= len(made) * 2 // 3, (recycled, len(made))


def test_empty_metadata_only_and_1x_files_load_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace"
    shutil.copytree(SRC, trace)
    meta_only = b"\n".join(ln for ln in corpus_lines() if b'"ph":4' in ln) + b"\n"
    for n, data in {
        "trace-empty-gzip.pfw.gz": gzip.compress(b""),
        "trace-zero.pfw.gz": b"",
        "trace-zero.pfw": b"",
        "trace-meta.pfw.gz": gzip.compress(meta_only),
    }.items():
        (trace / n).write_bytes(data)
    for f in sorted(trace.glob("trace-*-fork.pfw.gz"))[::2]:  # DFTracer 1.x form
        recs = [json.loads(x) for x in gzip.decompress(f.read_bytes()).splitlines()]
        f.write_bytes(gzip.compress(b"[\n" + b",\n".join(to_v1(r) for r in recs) + b",\n]\n"))
    native, python = load_both(trace, monkeypatch)
    assert native.events.height > 0
    assert_same(native, python)


def test_odd_values_load_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = odd_trace(tmp_path)
    assert_same(*load_both(trace, monkeypatch))


def test_byte_ranges_and_groupings_load_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts of several files, and a file cut into ranges of gzip members (the Dask path)."""
    path = tmp_path / "big.pfw.gz"
    path.write_bytes(gz_members(corpus_lines(), 7))
    ranges = LOAD.member_ranges(path, 1)
    assert ranges is not None and len(ranges) == 7
    tables = []
    for parser in ("native", "python"):
        monkeypatch.setenv(LOAD.PARSER_ENV, parser)
        parts = [LOAD.parse_part([(0, path, a, b, k)]) for k, (a, b) in enumerate(ranges)]
        tables.append(LOAD.combine_parts(parts, [path.name]))
    assert_frame_equal(tables[0][0], tables[1][0], check_exact=True)
    assert tables[0][1] == tables[1][1]


def test_values_read_as_null_are_counted_once_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file cut into ranges (the Dask path) or parsed in many batches reports one line per
    kind of value read as null, with the count summed, as one parse of the whole file does."""
    lines = corpus_lines()
    reads = [i for i, ln in enumerate(lines) if b'"name":"read"' in ln and b'"ret":' in ln]
    odd = [reads[0], reads[-1]]
    for i in odd:
        rec = json.loads(lines[i])
        rec["args"]["ret"] = 2**63 - 1
        lines[i] = json.dumps(rec, separators=(",", ":")).encode()
    path = tmp_path / "big.pfw.gz"
    path.write_bytes(gz_members(lines, 7))
    want = ["2 event(s) with a byte count negative or beyond 1 TiB in one call (read as null)"]
    ranges = LOAD.member_ranges(path, 1)
    assert ranges is not None and len(ranges) == 7
    for parser in ("native", "python"):
        monkeypatch.setenv(LOAD.PARSER_ENV, parser)
        parts = [LOAD.parse_part([(0, path, a, b, k)]) for k, (a, b) in enumerate(ranges)]
        assert LOAD.combine_parts(parts, [path.name])[1][0].problems == want, parser
        monkeypatch.setattr(DECOMPRESS, "CHUNK_BYTES", 4000)  # many batches
        assert load_trace(path).files[0].problems == want, parser
        monkeypatch.undo()


@pytest.mark.parametrize("threads", [1, 3])
def test_many_small_files_load_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Small texts are scanned together (one truncated file, one with malformed lines, an
    empty one among them); an invalid UTF-8 file among them is handed to the Python path."""
    d = tmp_path / "many"
    _many_small_files(d)
    data = gzip.decompress((d / "trace-302.pfw.gz").read_bytes())
    (d / "trace-302.pfw.gz").write_bytes(
        gzip.compress(data.replace(b"/data/set/f", b"/data/s\xe9t/f", 3))
    )
    native, python = load_both(d, monkeypatch, jobs=threads)
    assert native.damaged and native.events.height > 0
    assert_same(native, python)


# --------------------------------------------------------------------------- property: random lines

T0 = 1_795_315_916_000_000
_HASHES = ["00000000000000aa", "00000000000000bb"]
_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n"), max_size=8
)
_ints = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-5, 5), st.integers(2**63, 2**65))


def _value(draw: st.DrawFn, v: Any) -> Any:
    """``v`` or, sometimes, an odd spelling of it (string, float, null, bool, nested)."""
    return draw(st.sampled_from([v, v, v, str(v), None, 1.5, True, {"x": [1]}, "", "0x1"]))


@st.composite
def _record(draw: st.DrawFn) -> bytes:
    name = draw(
        st.sampled_from(
            [
                "read",
                "write",
                "open64",
                "close",
                "lseek64",
                "pread64",
                "fread",
                "fetch",
                "item",
                "save",
                "FH",
                "HH",
                "CM",
                "start",
                "odd",
            ]
        )
    )
    meta = name in ("FH", "HH", "CM")
    args: dict[str, Any] = {"hhash": "6882804a826580cd"}
    if meta:
        args.update(
            name=draw(st.sampled_from(["/d/x", "time_metric", "host", "rel/p"])),
            value=draw(st.sampled_from([*_HASHES, "US", "NS"])),
        )
    else:
        args["fhash"] = draw(st.sampled_from(_HASHES))
        for k in draw(
            st.lists(
                st.sampled_from(
                    [
                        "ret",
                        "count",
                        "offset",
                        "whence",
                        "flags",
                        "size",
                        "epoch",
                        "step",
                        "batch_size",
                        "image_idx",
                        "bytes",
                        "ppid",
                        "cpu_time",
                        "cpu_threads",
                        "tensors",
                    ]
                ),
                max_size=4,
                unique=True,
            )
        ):
            args[k] = _value(draw, draw(_ints))
        for k in draw(
            st.lists(
                st.sampled_from(["mode", "cwd", "path", "fname", "note"]), max_size=2, unique=True
            )
        ):
            args[k] = draw(st.one_of(_text, st.sampled_from(["rb", "a+", "/ckpt/x.pt", "rel/x"])))
    rec: dict[str, Any] = {
        "id": draw(st.integers(0, 9)),
        "name": name,
        "cat": "dftracer"
        if meta or name == "start"
        else draw(st.sampled_from(["POSIX", "STDIO", "data", "checkpoint"])),
        "pid": _value(draw, draw(st.sampled_from([101, 102]))),
        "tid": 101,
        "ts": _value(draw, T0 + draw(st.integers(0, 10**6))),
        "dur": draw(st.integers(-3, 10**5)),
        "ph": 4 if meta else draw(st.sampled_from([1, 1, "X", "M", "4"])),
        "args": args,
    }
    if draw(st.booleans()):  # key order, a dropped key
        keys = draw(st.permutations(list(rec)))
        rec = {k: rec[k] for k in keys[: len(keys) - draw(st.integers(0, 1))]}
    line = json.dumps(
        rec,
        separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
        ensure_ascii=draw(st.booleans()),
    ).encode()
    return line + draw(st.sampled_from([b"", b"", b",", b" ", b",,", b"\r"]))


_MALFORMED = [
    *BAD_LINES,
    b"[1, 2]",
    b"null",
    b"}{",
    b'{"ts":1',
    b"\x00\x00\x00",
    b'{"a":1}}',
    b"",
    b"  ",
    b"[",
    b"]",
    b" ]",
    b'{"name":"read","pid":1,"ts":1,"name":"x"}',
    b'{"name":"read","pid":1,"ts":01}',
    b'{"name":"read","pid":1,"ts":1}garbage',
    b'{"name":"r\\u00e9ad","pid":1,"ts":1,"cat":"POSIX","args":{}}',
    b'{"name":"read","pid":1,"ts":1}',
    b'{"name":"read","pid":"1","ts":"-0","args":{"fhash":12345678901234567890}}',
    b'{"name":"a\xc3(b","pid":1,"ts":1}',
]


@st.composite
def _trace(draw: st.DrawFn) -> list[bytes]:
    lines = draw(st.lists(_record(), min_size=1, max_size=80))
    for _ in range(draw(st.integers(0, 8))):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(_MALFORMED)))
    if draw(st.booleans()):  # a group large enough for the Python path's layout queries
        lines += [draw(_record())] * 30
    return lines


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lines=_trace(),
    members=st.integers(1, 3),
    cut=st.one_of(st.none(), st.integers(1, 10**6)),
    batch=st.one_of(st.none(), st.integers(200, 4000)),
)
def test_random_lines_load_identically(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lines: list[bytes],
    members: int,
    cut: int | None,
    batch: int | None,
) -> None:
    """``batch``: text per parse batch (bytes); small, one file is scanned in many batches
    into the same reused scanner buffers, which must leave nothing of one batch in the next."""
    data = gz_members(lines, members)
    if cut is not None:
        data = data[:cut]
    path = tmp_path / "r.pfw.gz"
    path.write_bytes(data)
    if batch is not None:
        monkeypatch.setattr(DECOMPRESS, "CHUNK_BYTES", batch)
    assert_same(*load_both(path, monkeypatch))


def test_scanner_buffers_are_reused_by_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One parse job scans its batches into one kept mapping (not a new one per batch), and
    the table is the one of whole-file batches and of the Python path."""
    shutil.copytree(SRC, tmp_path / "trace")
    whole = load_trace(tmp_path / "trace", jobs=1)
    scans: list[int] = []
    mapped: list[int] = []
    real_scan, real_map = SCAN._scan, SCAN.anonymous_map
    monkeypatch.setattr(SCAN, "_scan", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    monkeypatch.setattr(SCAN, "anonymous_map", lambda n: mapped.append(n) or real_map(n))
    monkeypatch.setattr(DECOMPRESS, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(pfw, "_PIECE_BYTES", 4 << 10)  # (a chunk is whole decoder pieces)
    native, python = load_both(tmp_path / "trace", monkeypatch, jobs=1)
    assert (
        len(scans) >= 10 and len(mapped) <= len(scans) / 3
    )  # a new mapping only for a larger batch
    assert_same(native, whole)
    assert_same(native, python)


# --------------------------------------------------------------------------- the scanner itself


def _scan(text: bytes) -> tuple[int, int, np.ndarray]:
    n = text.count(b"\n") + 1
    out = NATIVE.NATIVE.scan(
        text,
        np.empty((NATIVE.NATIVE.NI, n), np.int64),
        np.empty(n, np.uint32),
        np.empty((11, n), np.int32),
        np.empty(n, np.int64),
    )
    return out[0], out[1], np.frombuffer(out[2], dtype=np.int64).reshape(-1, 3)


def test_scanner_accepts_dftracer_lines_and_hands_back_the_rest() -> None:
    good = b'{"id":1,"name":"read","cat":"POSIX","pid":1,"tid":1,"ts":5,"dur":1,"ph":1,"args":{"ret":1}}'
    meta = (
        b'{"name":"FH","cat":"dftracer","pid":1,"tid":1,"ph":4,"args":{"name":"/a","value":"aa"}}'
    )
    odd = [
        b'{"name":"re\\"ad","pid":1,"ts":1}',
        b'{"name":"read","pid":1}',
        b'{"name":"read","pid":1,"ts":1.0}',
        b'{"name":"read","pid":1,"ts":9223372036854775808}',
        b'{"name":"read","pid":1,"ts":1,"ts":2}',
        b'{"name":"read","pid":1,"ts":1} ',
        b'{"name":["read"],"pid":1,"ts":1}',
        b" ",
        b"[,",
    ]
    text = b"\n".join([b"[", good, b"", meta, *odd, good + b",", b"]"])
    nev, nmeta, rej = _scan(text)
    assert (nev, nmeta) == (2, 1)
    lines = text.split(b"\n")
    assert [lines[i] for i in rej[:, 0]] == odd
    assert [text[a:b] for _, a, b in rej] == odd
    # not UTF-8: None, the caller hands the whole text to the Python path
    assert (
        NATIVE.NATIVE.scan(
            b'{"name":"\xff"}',
            np.empty((NATIVE.NATIVE.NI, 1), np.int64),
            np.empty(1, np.uint32),
            np.empty((11, 1), np.int32),
            np.empty(1, np.int64),
        )
        is None
    )


def _scan_rows(texts: bytes | list[bytes]) -> tuple | None:
    """Everything the scanner found in ``texts``, comparable across how the text is split:
    per row its line, int fields present and string values; rejected lines as their bytes."""
    parts = texts if isinstance(texts, list) else [texts]
    n = max(1, sum(t.count(b"\n") + (1 if t and not t.endswith(b"\n") else 0) for t in parts))
    ints, imask, strs, rows = (
        np.zeros((NATIVE.NATIVE.NI, n), np.int64),
        np.zeros(n, np.uint32),
        np.zeros((11, n), np.int32),
        np.zeros(n, np.int64),
    )
    out = NATIVE.NATIVE.scan(texts, ints, imask, strs, rows)
    if out is None:
        return None
    nev, nmeta, rejected, uniques, any_mask, _fields = out
    firsts = np.cumsum(
        [0] + [t.count(b"\n") + (1 if t and not t.endswith(b"\n") else 0) for t in parts]
    )

    def row(r: int) -> tuple:
        return (
            int(rows[r]),
            int(imask[r]),
            tuple(int(ints[f, r]) for f in range(16) if imask[r] >> f & 1),
            tuple(uniques[c] if c >= 0 else None for c in strs[:, r]),
        )

    rej = [
        (int(line), parts[int(np.searchsorted(firsts, line, side="right")) - 1][a:b])
        for line, a, b in np.frombuffer(rejected, dtype=np.int64).reshape(-1, 3)
    ]
    return ([row(r) for r in range(nev)], [row(r) for r in range(n - nmeta, n)], rej, any_mask)


@settings(max_examples=80, deadline=None)
@given(lines=_trace(), cuts=st.lists(st.integers(0, 200), max_size=6), last_newline=st.booleans())
def test_scanner_scans_a_list_of_texts_as_their_concatenation(
    lines: list[bytes], cuts: list[int], last_newline: bool
) -> None:
    """The loader hands the scanner the decoder's pieces where they lie (a list of texts of
    whole lines): rows, line numbers, values and rejected lines are those of the joined text."""
    bounds = sorted({min(c, len(lines)) for c in cuts} | {0, len(lines)})
    texts = [
        b"".join(ln + b"\n" for ln in lines[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    if not last_newline and texts and texts[-1]:
        texts[-1] = texts[-1][:-1]
    texts.insert(len(texts) // 2, b"")  # an empty text holds no line
    assert _scan_rows(texts) == _scan_rows(b"".join(texts))


@settings(max_examples=80, deadline=None)
@given(lines=_trace(), last_newline=st.booleans())
def test_scanner_reads_each_line_as_it_reads_it_alone(
    lines: list[bytes], last_newline: bool
) -> None:
    """The layouts of earlier lines find where a line ends as they parse it (no search for
    its newline first): each line's row or rejection is the one it gets scanned alone, by
    the general parser, whatever the lines before it; lines that a layout fits up to extra
    bytes, a carriage return or a cut are among them."""
    lines = list(lines)
    for ln in lines[:3]:  # a layout's line followed by more, or cut short
        lines += [ln + b"}", ln + b" x", ln + b"\r", ln[: len(ln) // 2], ln[:-1]]
    text = b"\n".join(lines) + (b"\n" if last_newline else b"")
    whole = _scan_rows(text)
    if whole is None:  # not UTF-8: the Python path reads the text (tested elsewhere)
        assert any(_scan_rows(ln) is None for ln in lines)
        return
    events, metas, rejected, _mask = whole
    alone: list[tuple] = []
    for i, ln in enumerate(lines):
        got = _scan_rows(ln)
        assert got is not None
        ev, me, rej, _ = got
        alone += (
            [("event", i, r[1:]) for r in ev]
            + [("meta", i, r[1:]) for r in me]
            + [("rejected", i, b) for _, b in rej]
        )
    together = (
        [("event", r[0], r[1:]) for r in events]
        + [("meta", r[0], r[1:]) for r in metas]
        + [("rejected", line, b) for line, b in rejected]
    )
    assert sorted(together, key=repr) == sorted(alone, key=repr)


#: Integer spellings around the scanner's 8-bytes-at-a-time path (1 to 16 plain digits):
#: its lengths and their neighbours, signs, leading zeros, fractions and exponents right
#: after 8 or 16 digits, and the ends of int64.
_NUMBERS = [
    "0",
    "7",
    "-0",
    "-7",
    "00",
    "01",
    "007",
    "0.5",
    "1.5",
    "1e3",
    "1E3",
    "1234567",
    "12345678",
    "99999999",
    "123456789",
    "100000000",
    "1234567890123456",
    "9999999999999999",
    "12345678901234567",
    "0000000000000000",
    "12345678.5",
    "12345678e2",
    "1234567890123456.5",
    "1234567890123456E2",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "1" * 19,
    "1" * 20,
]


def test_integers_of_every_length_and_form_read_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Integers read 8 bytes at a time (on a layout, by the general parser, in an int field,
    a skipped one, a timestamp, and within 8 or 16 bytes of the text's end) are read as the
    Python path reads them, and every line as it is read alone."""
    line = (
        '{{"id":{i},"name":"read","cat":"POSIX","pid":1,"tid":1,"ts":{ts},"dur":{v},"ph":1,'
        '"args":{{"ret":{v},"count":{v},"fhash":"00000000000000aa"}}}}'
    )
    json_int = re.compile(r"-?(0|[1-9][0-9]*)")
    for v in (
        _NUMBERS
    ):  # each line alone: a JSON integer in int64 is read as written, else the line is refused
        as_int = json_int.fullmatch(v) is not None and -(2**63) <= int(v) < 2**63
        number = re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?", v) is not None
        for text, ok, want in (
            (line.format(i=1, ts=T0, v=v), as_int, (1, 1, T0, *[int(v) if as_int else 0] * 3)),
            (line.format(i=v, ts=T0, v=3), number, (1, 1, T0, 3, 3, 3)),  # a skipped key
            (line.format(i=1, ts=v, v=3), as_int, (1, 1, int(v) if as_int else 0, 3, 3, 3)),
        ):
            got = _scan_rows(text.encode())
            assert got is not None
            events, _, rejected, _ = got
            assert (len(events), len(rejected)) == ((1, 0) if ok else (0, 1)), text
            if ok:
                assert events[0][2] == want, text
    lines = []
    for i, v in enumerate(_NUMBERS):
        lines += [
            line.format(i=i, ts=T0 + i, v=3),  # the layout the next lines are read with
            line.format(i=i, ts=T0 + i, v=v),
            line.format(i=v, ts=T0 + i, v=3),
            line.format(i=i, ts=v, v=3),
        ]
    for v in _NUMBERS:  # the number near the end of the text (no newline after the last line)
        text = "\n".join(
            [*lines, f'{{"name":"read","pid":1,"ts":{T0},"args":{{"ret":{v}}}}}']
        ).encode()
        whole = _scan_rows(text)
        assert whole is not None
        events, metas, rejected, _ = whole
        alone: list[tuple] = []
        for k, ln in enumerate(text.split(b"\n")):
            got = _scan_rows(ln)
            assert got is not None
            alone += [("event", k, r[1:]) for r in got[0]] + [("rejected", k, b) for _, b in got[2]]
        together = [("event", r[0], r[1:]) for r in events] + [
            ("rejected", k, b) for k, b in rejected
        ]
        assert sorted(together, key=repr) == sorted(alone, key=repr)
        assert not metas
    path = tmp_path / "n.pfw.gz"
    path.write_bytes(gzip.compress(text))
    native, python = load_both(path, monkeypatch)
    assert_same(native, python)
    # plain integers, read as written (a read's size is its ret)
    assert 7 in native.events.filter(pl.col("ts") == T0 + 1)["size"].to_list()
    assert 9999999999999999 in native.events["ts"].to_list()
    assert 12345678 in native.events["size"].to_list()


_ASAN_SCRIPT = """
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import _pfwscan as S
numbers, t0 = sys.argv[2].split(","), 1795315916000000
layout = ('{"id":1,"name":"read","cat":"POSIX","pid":1,"tid":1,"ts":%d,"dur":3,"ph":1,'
          '"args":{"ret":3,"count":3}}' % t0)
n = 0
for v in numbers:
    for tail in ('{"id":1,"name":"read","cat":"POSIX","pid":1,"tid":1,"ts":%d,"dur":3,"ph":1,"args":{"ret":3,"count":%s'
                 % (t0, v), '{"id":1,"name":"read","pid":1,"ts":' + v, '{"id":' + v, '{"ts":%s}' % v, v):
        for pre in ("", layout + "\\n"):
            raw = (pre + tail).encode()
            text = np.empty(len(raw), dtype=np.uint8)  # its own allocation: nothing readable after it
            text[:] = np.frombuffer(raw, dtype=np.uint8)
            k = raw.count(b"\\n") + 1
            S.scan(text, np.empty((S.NI, k), np.int64), np.empty(k, np.uint32), np.empty((11, k), np.int32),
                   np.empty(k, np.int64))
            n += 1
print("scanned", n)
"""


def test_scanner_reads_nothing_past_a_texts_end(tmp_path: Path) -> None:
    """Built with AddressSanitizer, the scanner reads no byte after a text that ends in a
    number (its 8- and 16-byte loads stop where the text does), on the general parser and on
    a layout. Skipped where gcc or its ASan runtime is missing."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    runtime = subprocess.run(
        [gcc, "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not Path(runtime).is_absolute() or not Path(runtime).exists():
        pytest.skip("no AddressSanitizer runtime")
    src = Path(LOAD.__file__).parent / "_pfwscan.c"
    built = subprocess.run(
        [
            gcc,
            "-O1",
            "-g",
            "-fsanitize=address",
            "-fno-omit-frame-pointer",
            "-std=c99",
            "-fPIC",
            "-shared",
            "-I" + sysconfig.get_paths()["include"],
            "-Wno-declaration-after-statement",
            str(src),
            "-o",
            str(tmp_path / ("_pfwscan" + sysconfig.get_config_var("EXT_SUFFIX"))),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    env = {**os.environ, "LD_PRELOAD": runtime, "ASAN_OPTIONS": "detect_leaks=0"}
    # (where ASan cannot run a Python at all, e.g. its shadow memory against this kernel's
    # address layout, that is the machine's, not the scanner's: skipped)
    alone = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import _pfwscan",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if alone.returncode != 0:
        pytest.skip(
            "AddressSanitizer cannot run Python here: "
            + (alone.stderr.strip().splitlines() or ["?"])[-1]
        )
    run = subprocess.run(
        [sys.executable, "-c", _ASAN_SCRIPT, str(tmp_path), ",".join(_NUMBERS)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0 and f"scanned {len(_NUMBERS) * 10}" in run.stdout, run.stderr[-3000:]


def test_scanner_refuses_too_small_buffers() -> None:
    with pytest.raises(ValueError):
        NATIVE.NATIVE.scan(
            b"{}\n{}\n",
            np.empty((NATIVE.NATIVE.NI, 1), np.int64),
            np.empty(1, np.uint32),
            np.empty((11, 1), np.int32),
            np.empty(1, np.int64),
        )
    with pytest.raises(ValueError):
        NATIVE.NATIVE.scan(
            b"{}",
            np.empty((NATIVE.NATIVE.NI, 1), np.int64),
            np.empty(1, np.uint32),
            np.empty((10, 1), np.int32),
            np.empty(1, np.int64),
        )


_POSITION_CALLS = st.sampled_from(
    [
        ("open64", "POSIX"),
        ("fopen", "STDIO"),
        ("lseek64", "POSIX"),
        ("fseek", "STDIO"),
        ("ftell", "STDIO"),
        ("rewind", "STDIO"),
        ("close", "POSIX"),
        ("fclose", "STDIO"),
        ("read", "POSIX"),
        ("write", "POSIX"),
        ("fread", "STDIO"),
        ("fwrite", "STDIO"),
        ("pread64", "POSIX"),
        ("pwrite64", "POSIX"),
        ("fsync", "POSIX"),
    ]
)
_MAYBE = st.one_of(st.none(), st.integers(0, 5000), st.integers(0, 5000), st.just(-1))


@st.composite
def _position_event(draw) -> dict:
    name, cat = draw(_POSITION_CALLS)
    args: dict = {
        "fhash": draw(
            st.sampled_from(["00000000000000a1", "00000000000000a1", "00000000000000b2", None])
        )
    }
    for key, values in (
        ("ret", _MAYBE),
        ("count", _MAYBE),
        ("offset", _MAYBE),
        ("whence", st.none() | st.integers(0, 2)),
        ("size", st.none() | st.integers(1, 8)),
        ("flags", st.none() | st.sampled_from([0, 0o2000, 0o101])),
        ("mode", st.none() | st.sampled_from(["r", "a", "ab+", "w"])),
    ):
        value = draw(values)
        if value is not None:
            args[key] = value
    return {
        "name": name,
        "cat": cat,
        "pid": draw(st.sampled_from([7, 7, 8])),
        "ts": draw(st.integers(0, 3)),
        "args": args,
    }


def _stdio(name: str, **args: int) -> dict:
    return {
        "name": name,
        "cat": "STDIO",
        "pid": 7,
        "ts": 0,
        "args": {"fhash": "00000000000000a1", **args},
    }


_SEEKS = [  # fopen, fread 10, fseek (whence, offset), ftell, fread 5, rewind, fread 1, fclose, fread 1
    _stdio("fopen", ret=0),
    _stdio("fread", ret=10, count=10, size=1),
    _stdio("fseek", ret=0, whence=1, offset=100),
    _stdio("fread", ret=5, count=5, size=1),
    _stdio("fseek", ret=0, whence=0, offset=7),
    _stdio("fread", ret=5, count=5, size=1),
    _stdio("fseek", ret=0, whence=2, offset=0),
    _stdio("fread", ret=5, count=5, size=1),
    _stdio("ftell", ret=3),
    _stdio("fread", ret=5, count=5, size=2),
    _stdio("rewind"),
    _stdio("fread", ret=1, count=1, size=1),
    _stdio("fclose", ret=0),
    _stdio("fread", ret=1, count=1, size=1),
]


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_position_event(), min_size=10, max_size=80))
@example(events=_SEEKS)
def test_file_offsets_in_c_match_the_polars_model(tmp_path_factory, events: list[dict]) -> None:
    """Every position rule (open/append, lseek, fseek by whence, ftell, rewind, close, stream and
    positional transfers, failed calls, missing values) in the one C pass and in polars/numpy."""
    d = tmp_path_factory.mktemp("pos")
    lines = [
        json.dumps(
            {
                "id": i,
                "name": e["name"],
                "cat": e["cat"],
                "pid": e["pid"],
                "tid": e["pid"],
                "ts": 1_000 + 4 * i + e["ts"],
                "dur": 1,
                "ph": 1,
                "args": e["args"],
            }
        )
        for i, e in enumerate(events)
    ]
    (d / "t.pfw").write_text("\n".join(lines) + "\n")
    assert NATIVE.NATIVE is not None
    native = load_trace(d)
    with pytest.MonkeyPatch.context() as mp:  # undone after each example, not only after the test
        mp.setattr(NATIVE, "NATIVE", None)
        python = load_trace(d)
    assert_frame_equal(native.events, python.events)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-5, 40)), st.integers(0, 3), st.integers(0, 60)),
        min_size=1,
        max_size=120,
        unique_by=lambda r: (r[1], r[2]),
    ),
    ranged=st.booleans(),
    chunks=st.integers(1, 5),
    step=st.integers(1, 50),
)
@example(rows=[(1, 2, 0), (2, 0, 0), (None, 1, 5), (1, 0, 7)], ranged=False, chunks=2, step=1)
@example(rows=[(3, 1, 9), (3, 1, 4), (0, 3, 1), (None, 0, 2)], ranged=True, chunks=3, step=2)
def test_output_order_is_the_three_key_sort(
    monkeypatch: pytest.MonkeyPatch, rows: list, ranged: bool, chunks: int, step: int
) -> None:
    """The packed sort key, built a few rows at a time from slices of chunked columns (as the
    parse batches leave them), orders rows as polars' sort by (ts with nulls last, src, seq)."""
    monkeypatch.setattr(RESOLVE, "_KEY_STEP", step)
    ts = [r[0] for r in rows]
    src = [r[1] for r in rows]
    seq = [
        ((r[2] % 4) << 32) + r[2] // 4 if ranged else r[2] for r in rows
    ]  # a range's lines: k << 32 | line
    frame = pl.DataFrame(
        {"ts": ts, "src": src, "seq": seq},
        schema={"ts": pl.Int64, "src": pl.UInt32, "seq": pl.Int64},
    )
    cuts = sorted({len(rows) * k // chunks for k in range(1, chunks)} - {0, len(rows)})
    parts = [frame.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
    chunked = pl.concat(parts, rechunk=False) if len(parts) > 1 else frame
    top = max((t for t in ts if t is not None), default=0)
    want = (
        frame.select(pl.arg_sort_by(pl.col("ts").fill_null(top + 1), "src", "seq"))
        .to_series()
        .to_numpy()
    )
    got = RESOLVE._output_order(chunked)
    assert got.dtype == np.int64 and got.tolist() == want.tolist()


@st.composite
def _runs(draw: st.DrawFn) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, list[tuple]]:
    """Parts as the merge receives them: each holds whole files (its own processes), its
    rows in (ts, file) order; timestamps collide within and across parts. Also each part
    as its rows came (ts, p) with the order that sorts them (a stable sort by (ts, file):
    lines of one file keep their order)."""
    k = draw(st.integers(1, 6))
    ts_runs, p_runs, proc_src, nproc, raw = [], [], [], 0, []
    files = draw(st.permutations(range(2 * k)))
    for r in range(k):
        mine = files[2 * r : 2 * r + draw(st.integers(1, 2))]  # the part's files
        procs = []
        for f in mine:
            for _ in range(draw(st.integers(1, 3))):  # processes of the file
                procs.append(nproc)
                proc_src.append(f)
                nproc += 1
        m = draw(st.integers(0, 40))
        ts = np.array(draw(st.lists(st.integers(-3, 12), min_size=m, max_size=m)), dtype=np.int64)
        p = np.array(
            draw(st.lists(st.sampled_from(procs), min_size=m, max_size=m)), dtype=np.uint32
        )
        o = np.lexsort((np.array(proc_src, dtype=np.uint32)[p] if m else p, ts))
        ts_runs.append(ts[o])
        p_runs.append(p[o])
        raw.append((ts, p, o.astype(draw(st.sampled_from([np.uint32, np.uint64])))))
    return ts_runs, p_runs, np.array(proc_src, dtype=np.uint32), raw


@settings(max_examples=150, deadline=None)
@given(_runs(), st.data())
def test_k_way_merge_is_the_stable_sort(runs: tuple, data: st.DataObject) -> None:
    """merge_runs orders the runs' rows as the stable sort by (ts, file) of their
    concatenation (what :func:`_merge_order` computes), in 4- and 8-byte indices; and runs
    given as their rows came, with the orders that sort them (any of them: the others
    sorted), as the rows' own indices in that order."""
    ts_runs, p_runs, proc_src, raw = runs
    ts = np.concatenate(ts_runs)
    src = proc_src[np.concatenate(p_runs)].astype(np.int64)
    want = MERGE._merge_order(pl.Series(ts, dtype=pl.Int64), src)
    assert want.tolist() == np.lexsort((src, ts)).tolist()
    for dtype in (np.uint32, np.int64):
        out = np.empty(len(ts), dtype=dtype)
        assert NATIVE.NATIVE.merge_runs(ts_runs, p_runs, proc_src, out) is True
        assert out.tolist() == want.tolist()
        assert NATIVE.NATIVE.merge_runs(ts_runs, p_runs, proc_src, out, None) is True
        assert out.tolist() == want.tolist()
    # some runs as they came, with their orders: the output indexes their rows
    unsorted = data.draw(st.lists(st.booleans(), min_size=len(raw), max_size=len(raw)))
    runs_ts = [r[0] if u else t for r, t, u in zip(raw, ts_runs, unsorted, strict=True)]
    runs_p = [r[1] if u else p for r, p, u in zip(raw, p_runs, unsorted, strict=True)]
    orders = [r[2] if u else None for r, u in zip(raw, unsorted, strict=True)]
    starts = np.cumsum([0, *(len(t) for t in ts_runs)])[:-1]
    rows = (
        np.concatenate(
            [
                start + (r[2].astype(np.int64) if u else np.arange(len(r[2])))
                for start, r, u in zip(starts, raw, unsorted, strict=True)
            ]
        )
        if len(ts)
        else np.array([])
    )
    out = np.empty(len(ts), dtype=np.uint32)
    assert NATIVE.NATIVE.merge_runs(runs_ts, runs_p, proc_src, out, orders) is True
    assert out.tolist() == rows[want].tolist()
    # the rows in the output's order are those of the stable sort
    assert np.concatenate(runs_ts)[out].tolist() == ts[want].tolist() if len(ts) else True
    # cut into slices, one call each (as threads run them), in any order of the calls
    parts = data.draw(st.integers(2, 6))
    out = np.full(len(ts), 2**32 - 1, dtype=np.uint32)
    for q in data.draw(st.permutations(range(parts))):
        assert NATIVE.NATIVE.merge_runs(runs_ts, runs_p, proc_src, out, orders, q, parts) is True
    assert out.tolist() == rows[want].tolist()


def test_k_way_merge_refuses_runs_out_of_order_and_bad_indices() -> None:
    """A run out of (ts, file) order makes merge_runs answer False (the caller sorts); a
    process index beyond the file table or a wrong output size is an error, not a read
    out of bounds."""
    src = np.array([0, 1], dtype=np.uint32)
    ts = [np.array([1, 5], dtype=np.int64), np.array([3, 2], dtype=np.int64)]
    p = [np.array([0, 0], dtype=np.uint32), np.array([1, 1], dtype=np.uint32)]
    assert NATIVE.NATIVE.merge_runs(ts, p, src, np.empty(4, dtype=np.uint32)) is False
    same_ts = [np.array([4, 4], dtype=np.int64)]
    assert (
        NATIVE.NATIVE.merge_runs(
            same_ts, [np.array([1, 0], dtype=np.uint32)], src, np.empty(2, dtype=np.uint32)
        )
        is False
    )  # file 1 before file 0 at one ts
    with pytest.raises(ValueError, match="beyond"):
        NATIVE.NATIVE.merge_runs(
            ts, [p[0], np.array([1, 2], dtype=np.uint32)], src, np.empty(4, dtype=np.uint32)
        )
    with pytest.raises(ValueError, match="out must"):
        NATIVE.NATIVE.merge_runs(ts, p, src, np.empty(3, dtype=np.uint32))
    # a run's order: an index beyond the run, a length or item size that is not the run's
    one = [np.array([1, 5], dtype=np.int64)]
    with pytest.raises(ValueError, match="beyond its run"):
        NATIVE.NATIVE.merge_runs(
            one, [p[0]], src, np.empty(2, dtype=np.uint32), [np.array([0, 2], dtype=np.uint32)]
        )
    with pytest.raises(ValueError, match="differ in length"):
        NATIVE.NATIVE.merge_runs(
            one, [p[0]], src, np.empty(2, dtype=np.uint32), [np.array([0], dtype=np.uint32)]
        )
    with pytest.raises(ValueError, match="4- or 8-byte"):
        NATIVE.NATIVE.merge_runs(
            one, [p[0]], src, np.empty(2, dtype=np.uint32), [np.array([0, 1], dtype=np.uint16)]
        )
    with pytest.raises(ValueError, match="ord_list and ts_list"):
        NATIVE.NATIVE.merge_runs(one, [p[0]], src, np.empty(2, dtype=np.uint32), [None, None])
    assert (
        NATIVE.NATIVE.merge_runs(
            one, [p[0]], src, np.empty(2, dtype=np.uint32), [np.array([1, 0], dtype=np.uint32)]
        )
        is False
    )  # 5 before 1: out of order
    # in slices: a run out of order is found by some slice's call (its rows or its cuts)
    rng = np.random.default_rng(7)
    for _ in range(50):
        runs = [
            np.sort(rng.integers(0, 30, rng.integers(1, 40))).astype(np.int64) for _ in range(3)
        ]
        bad = int(rng.integers(0, 3))
        if len(runs[bad]) < 2:
            continue
        i = int(rng.integers(0, len(runs[bad]) - 1))
        runs[bad][i], runs[bad][-1] = runs[bad][-1] + 1, runs[bad][i]  # one row out of place
        procs = [np.full(len(r), k, dtype=np.uint32) for k, r in enumerate(runs)]
        out = np.empty(sum(len(r) for r in runs), dtype=np.uint32)
        files = np.array([0, 1, 2], dtype=np.uint32)
        for parts in (2, 3, 5):
            assert not all(
                NATIVE.NATIVE.merge_runs(runs, procs, files, out, None, q, parts)
                for q in range(parts)
            )
    # a bad index is an error in the call whose slice (or cut) reads it, whichever that is
    for parts in (2, 3):
        errors = []
        for q in range(parts):
            try:
                NATIVE.NATIVE.merge_runs(
                    [np.array([1, 5], dtype=np.int64), np.array([2, 3], dtype=np.int64)],
                    [p[0], np.array([1, 2], dtype=np.uint32)],
                    src,
                    np.empty(4, dtype=np.uint32),
                    None,
                    q,
                    parts,
                )
            except ValueError as exc:
                errors.append(str(exc))
        assert errors and all("beyond proc_src" in e for e in errors)
    with pytest.raises(ValueError, match="part must"):
        NATIVE.NATIVE.merge_runs(one, [p[0]], src, np.empty(2, dtype=np.uint32), None, 2, 2)


def test_the_merge_takes_the_k_way_order_and_falls_back_to_the_sort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of many files loaded on 2 threads is merged by merge_runs; the table is the
    one of the stable sort (merge_runs switched off) and of one thread."""
    d = tmp_path / "t"
    _many_small_files(d)
    used: list[bool] = []
    real = MERGE._merged_runs

    def spy(*a: Any) -> np.ndarray | None:
        out = real(*a)
        used.append(out is not None)
        return out

    monkeypatch.setattr(MERGE, "_merged_runs", spy)
    merged = load_trace(d, jobs=2)
    assert used == [True]
    # merged in slices, one thread each (as on a machine of 4 cores), whatever the cores here
    calls: list[tuple] = []
    real_merge = NATIVE.NATIVE.merge_runs
    monkeypatch.setattr(MERGE, "_MERGE_SLICE_ROWS", 16)
    monkeypatch.setattr(MERGE, "available_cores", lambda: 4)
    monkeypatch.setattr(
        NATIVE,
        "NATIVE",
        SimpleNamespace(
            **{
                k: getattr(real_merge.__self__, k)
                for k in dir(real_merge.__self__)
                if not k.startswith("__")
            }
        ),
    )
    monkeypatch.setattr(
        NATIVE.NATIVE, "merge_runs", lambda *a: calls.append(a[5:]) or real_merge(*a)
    )
    sliced = load_trace(d, jobs=2)
    assert sorted(calls) == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert_frame_equal(merged.events, sliced.events)
    monkeypatch.undo()
    monkeypatch.setattr(MERGE, "_merged_runs", lambda *a: None)
    sorted_ = load_trace(d, jobs=2)
    assert_frame_equal(merged.events, sorted_.events)
    assert_frame_equal(merged.events, load_trace(d, jobs=1).events)


@pytest.mark.parametrize("contiguous", [True, False])
def test_segments_of_one_file_are_numbered_as_one_text(contiguous: bool) -> None:
    """A batch's texts that continue each other (one file's decoder outputs, in order) are
    scanned without a per-row segment lookup: rows, line numbers and the accepted lines
    are those of the joined text. Texts of one file that do not continue each other (a gap
    between their line numbers) keep each text's own numbering."""
    lines = corpus_lines()[:400]
    bounds = [0, 90, 91, 250, 400]
    texts = [
        b"".join(ln + b"\n" for ln in lines[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    counts = np.diff(bounds).astype(np.int64)
    first = np.cumsum(counts) - counts
    seq0s = (
        (first + 7) if contiguous else (first + 7 + np.arange(len(counts), dtype=np.int64) * 1000)
    )
    srcs = np.full(len(counts), 3, dtype=np.uint32)

    def frames(text, firsts, seqs, src):
        events, meta, per_seg, rejected = SCAN._scan(
            text, int(sum(t.count(b"\n") for t in texts)), firsts, src, seqs, compact=True
        )
        return events[0], meta, per_seg, rejected

    ev, meta, per_seg, rej = frames(texts, first, seq0s, srcs)
    one_ev, one_meta, one_per, one_rej = frames(
        b"".join(texts), np.zeros(1, dtype=np.int64), seq0s[:1], srcs[:1]
    )
    assert per_seg.sum() == one_per.sum() == ev.height + meta.height > 300
    if contiguous:
        assert_frame_equal(ev, one_ev, check_exact=True)
        assert_frame_equal(meta, one_meta, check_exact=True)
        assert per_seg[1:].sum() == 0  # counted on the first text: the same file's count
    else:
        shift = np.repeat(seq0s - first - seq0s[0], counts)  # each text's own numbering
        line = one_ev["seq"].to_numpy() - seq0s[0]
        assert_frame_equal(ev.drop("seq"), one_ev.drop("seq"), check_exact=True)
        assert (ev["seq"].to_numpy() == one_ev["seq"].to_numpy() + shift[line]).all()
        assert per_seg.tolist() == [
            int(np.sum((line >= a) & (line < b))) + int(np.sum((meta_line >= a) & (meta_line < b)))
            for a, b, meta_line in (
                (a, b, one_meta["seq"].to_numpy() - seq0s[0])
                for a, b in zip(bounds, bounds[1:], strict=False)
            )
        ]
    assert (rej == one_rej).all()


def test_metadata_rows_of_a_part_become_one_frame() -> None:
    """A batch's metadata rows are kept as the scanner wrote them and made one frame per
    part: the frame is the concatenation of the frames each batch made, in order (string
    codes of each batch moved past the strings of the batches before it)."""
    lines = [ln for ln in corpus_lines() if b'"ph":4' in ln or b'"ph":"M"' in ln or b'"ts"' in ln][
        :600
    ]
    texts = [
        b"".join(ln + b"\n" for ln in lines[a:b]) for a, b in ((0, 200), (200, 420), (420, 600))
    ]
    deferred, frames = [], []
    for k, text in enumerate(texts):
        n = text.count(b"\n")
        args = (
            text,
            n,
            np.zeros(1, dtype=np.int64),
            np.array([k % 2], dtype=np.uint32),
            np.array([1000 * k], dtype=np.int64),
        )
        deferred.append(SCAN._scan(*args, compact=True, defer_meta=True)[1])
        frames.append(SCAN._scan(*args, compact=True)[1])
    assert sum(m.height for m in deferred) == sum(f.height for f in frames) > 3
    assert all(isinstance(m, SCAN.MetaRows) for m in deferred)
    assert_frame_equal(SCAN._meta_frame(deferred), pl.concat(frames), check_exact=True)
