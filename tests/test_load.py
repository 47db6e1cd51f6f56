"""Loader tests on hand-built DFTracer traces (2.x and 1.x forms) written into tmp_path.

Covers: schema and ordering, multi-member gzip, FH records in another process's file,
truncation at several offsets (exact counts against a reference zlib decode), a corrupt
member in the middle, malformed lines, empty/missing inputs, both parse paths (layout
fast path and JSON fallback) agreeing, offset reconstruction against a plain-Python
reference, and a hypothesis round trip of random valid events.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import random
import shutil
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from dlreplay.analyze import LoadedTrace, TraceDamageWarning, load, load_trace
from dlreplay.analyze.trace.load import trace_warnings
from dlreplay.errors import TraceError
from dlreplay.schema import EVENT_SCHEMA, READ_OPS, WRITE_OPS

from .conftest import TRACES

LOAD = importlib.import_module("dlreplay.analyze.trace.load")
NATIVE = importlib.import_module("dlreplay.analyze.trace.native")
DECOMPRESS = importlib.import_module("dlreplay.analyze.trace.decompress")
SCAN = importlib.import_module("dlreplay.analyze.trace.scan")
RESOLVE = importlib.import_module("dlreplay.analyze.trace.resolve")
MERGE = importlib.import_module("dlreplay.analyze.trace.merge")
INPUTS = importlib.import_module("dlreplay.analyze.trace.inputs")
SHAPES = importlib.import_module("dlreplay.analyze.trace.shapes")
HOST = "node-a"
HHASH = "6882804a826580cd"
T0 = 1_795_313_692_000_000  # µs


# ---------------------------------------------------------------------------------------
# Building DFTracer 2.x traces


def _line(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def fhash_of(path: str) -> str:
    return f"{zlib.crc32(path.encode()) * 2654435761 & 0xFFFFFFFFFFFFFFFF:016x}"


@dataclass
class Proc:
    """Records of one traced process, in DFTracer 2.x key order."""

    pid: int
    ppid: int = 1
    cwd: str = "/work"
    ts: int = T0
    records: list[dict] = field(default_factory=list)
    next_id: int = 1
    known: set = field(default_factory=set)
    fh: bool = True  # write FH records for files this process touches

    def __post_init__(self) -> None:
        self.meta("HH", HOST, HHASH)
        self.meta("thread_name", str(self.pid), "thread_name")
        self.meta("CM", "time_metric", "US")
        self.meta("FH", self.cwd, fhash_of(self.cwd))
        self.event(
            "start",
            "dftracer",
            {
                "ppid": self.ppid,
                "cmd_hash": "93ec23d43d22b9cc",
                "version": 20003,
                "date": "Sun Nov 22 02:14:52 2026",
                "cwd": fhash_of(self.cwd),
            },
            typ=1,
        )

    def meta(self, name: str, a_name: str, a_value: str) -> None:
        self.records.append(
            {
                "name": name,
                "cat": "dftracer",
                "type": 1,
                "pid": self.pid,
                "tid": self.pid,
                "ph": 4,
                "args": {"hhash": HHASH, "name": a_name, "value": a_value},
            }
        )

    def event(
        self,
        name: str,
        cat: str,
        args: dict,
        *,
        dur: int = 2,
        tid: int | None = None,
        ts: int | None = None,
        typ: int = 3,
        gap: int = 3,
    ) -> dict:
        rec = {
            "id": self.next_id,
            "name": name,
            "cat": cat,
            "type": typ,
            "pid": self.pid,
            "tid": self.pid if tid is None else tid,
            "ts": self.ts if ts is None else ts,
            "dur": dur,
            "ph": 1,
            "args": {"hhash": HHASH, **args},
        }
        self.next_id += 1
        if ts is None:
            self.ts += dur + gap
        self.records.append(rec)
        return rec

    def file(self, path: str) -> str:
        h = fhash_of(path)
        if self.fh and h not in self.known:
            self.known.add(h)
            self.meta("FH", path, h)
        return h

    # POSIX helpers -----------------------------------------------------------------
    def open(self, path: str, flags: int = 524288, **kw) -> dict:  # (O_CLOEXEC, read-only)
        return self.event("open64", "POSIX", {"flags": flags, "fhash": self.file(path)}, **kw)

    def read(self, path: str, n: int, count: int | None = None, **kw) -> dict:
        return self.event(
            "read",
            "POSIX",
            {"ret": n, "count": n if count is None else count, "fhash": self.file(path)},
            **kw,
        )

    def write(self, path: str, n: int, **kw) -> dict:
        return self.event("write", "POSIX", {"ret": n, "count": n, "fhash": self.file(path)}, **kw)

    def lseek(self, path: str, pos: int, whence: int = 0, **kw) -> dict:
        return self.event(
            "lseek64",
            "POSIX",
            {"ret": pos, "whence": whence, "offset": pos, "fhash": self.file(path)},
            **kw,
        )

    def pread(self, path: str, n: int, off: int, **kw) -> dict:
        return self.event(
            "pread64",
            "POSIX",
            {"ret": n, "count": n, "offset": off, "fhash": self.file(path)},
            **kw,
        )

    def close(self, path: str, **kw) -> dict:
        return self.event("close", "POSIX", {"ret": 0, "fhash": self.file(path)}, **kw)

    def finish(self) -> None:
        self.event(
            "end",
            "dftracer",
            {"app": {}, "used": {"C_APP": 1}, "cfg": {"enable": 1}, "num_events": self.next_id},
            typ=1,
        )

    def lines(self) -> list[bytes]:
        return [_line(r) for r in self.records]


def write_gz(path: Path, lines: list[bytes], members: int = 1) -> Path:
    """Write lines as a (multi-member) gzip file; members split the lines evenly."""
    per = max(1, -(-len(lines) // members))
    with path.open("wb") as f:
        for i in range(0, len(lines), per):
            f.write(gzip.compress(b"\n".join(lines[i : i + per]) + b"\n", mtime=0))
    return path


def member_offsets(data: bytes) -> list[int]:
    """Start offsets of the gzip members of ``data`` (reference, by decoding)."""
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        d = zlib.decompressobj(31)
        d.decompress(data[pos:])
        pos = len(data) - len(d.unused_data)
    return out


def ref_decode(data: bytes) -> tuple[bytes, bool]:
    """Reference decode of a possibly truncated multi-member gzip: (text, truncated)."""
    out = b""
    while data:
        d = zlib.decompressobj(31)
        out += d.decompress(data)
        if not d.eof:
            return out + d.flush(), True
        data = d.unused_data
    return out, False


def dataloader_job(
    tmp_path: Path,
    *,
    n_samples: int = 40,
    members: int = 3,
    fh_in_parent_only: bool = False,
    name: str = "trace",
) -> tuple[Path, dict]:
    """A main process and two forked workers reading npz-like files; returns (dir, truth)."""
    d = tmp_path / name
    d.mkdir()
    main = Proc(pid=100, ppid=1)
    workers = [
        Proc(pid=101 + w, ppid=100, ts=T0 + 50 + w, fh=not fh_in_parent_only) for w in range(2)
    ]
    files = [f"/data/set/vol_{i:03d}.npz" for i in range(8)]
    if fh_in_parent_only:  # forked workers inherit the parent's file table
        for f in files:
            main.file(f)
    truth = {"reads": [], "bytes_per_pid": {}}
    for s in range(n_samples):
        w = workers[s % 2]
        f = files[s % len(files)]
        t_item = w.ts
        w.open(f)
        pos = 0
        for n in (6, 1000, 4096, 333):
            w.read(f, n)
            truth["reads"].append((w.pid, f, pos, n))
            pos += n
        w.lseek(f, 10_000)
        w.read(f, 50)
        truth["reads"].append((w.pid, f, 10_000, 50))
        w.close(f)
        w.event(
            "item",
            "data",
            {"image_idx": s % len(files), "epoch": s // 16},
            ts=t_item,
            dur=w.ts - t_item,
            typ=2,
        )
        truth["bytes_per_pid"][w.pid] = (
            truth["bytes_per_pid"].get(w.pid, 0) + 6 + 1000 + 4096 + 333 + 50
        )
        if s % 4 == 3:
            main.event(
                "fetch", "dataloader", {"batch_size": 4, "step": s // 4, "epoch": s // 16}, typ=2
            )
    main.event("save", "checkpoint", {"bytes": "3221225472", "path": "/ckpt/model.pt"}, typ=2)
    for p in (main, *workers):
        p.finish()
    for p in (main, *workers):
        write_gz(d / f"trace-{p.pid}.pfw.gz", p.lines(), members=members)
    truth["events"] = sum(1 for p in (main, *workers) for r in p.records if r["ph"] == 1)
    return d, truth


# ---------------------------------------------------------------------------------------
# Basic loading


def test_schema_order_and_resolution(tmp_path: Path) -> None:
    d, truth = dataloader_job(tmp_path, fh_in_parent_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_trace(d)
    ev = loaded.events
    assert isinstance(loaded, LoadedTrace) and not loaded.damaged and loaded.manifest is None
    assert dict(ev.schema) == EVENT_SCHEMA
    assert ev.height == truth["events"]
    assert ev["ts"].is_sorted()
    assert all(f.members == 3 for f in loaded.files)
    assert sum(f.events for f in loaded.files) == ev.height
    # FH records only in the parent's file still resolve the workers' reads
    reads = ev.filter(pl.col("name") == "read")
    assert reads["file"].null_count() == 0 and reads["file"].cat.starts_with("/data/set/").all()
    assert set(ev["host"].unique()) == {HOST}
    assert set(ev.filter(pl.col("pid") > 100)["ppid"].unique()) == {100}
    assert set(ev["source"].unique()) == {
        "trace-100.pfw.gz",
        "trace-101.pfw.gz",
        "trace-102.pfw.gz",
    }
    per_pid = dict(reads.group_by("pid").agg(pl.col("size").sum()).iter_rows())
    assert per_pid == truth["bytes_per_pid"]
    items = ev.filter(pl.col("name") == "item")
    assert items["sample_index"].null_count() == 0 and items["epoch"].max() == 2
    save = ev.filter(pl.col("cat") == "checkpoint").row(0, named=True)
    assert save["size"] == 3 * 2**30 and save["file"] == "/ckpt/model.pt"


@pytest.mark.parametrize("jobs", [1, 2])
def test_fields_of_one_value_are_constant_columns(tmp_path: Path, jobs: int) -> None:
    """A POSIX trace without annotations, on one host: its annotation fields (all null)
    and its host are constant columns of the table, of no size (polars keeps a column of
    one value as a constant through the loader's selects, gathers and concatenations),
    with the values a column of a value per row would hold."""
    for k in range(3):
        p = Proc(pid=70 + k)
        for i in range(50):
            path = f"/data/f{k}_{i}.bin"
            p.open(path)
            p.read(path, 4096)
            p.close(path)
        p.finish()
        write_gz(tmp_path / f"trace-{70 + k}.pfw.gz", p.lines(), members=2)
    ev = load_trace(tmp_path, jobs=jobs).events
    assert ev.filter(pl.col("name") == "read").height == 150
    constant = (
        "epoch",
        "step",
        "batch_size",
        "sample_index",
        "cpu_time",
        "cpu_threads",
        "tensors",
        "host",
    )
    assert all(ev.select(c).estimated_size() < 64 for c in constant), {
        c: ev.select(c).estimated_size() for c in constant
    }
    assert ev.select(pl.col(c).null_count() for c in constant[:-1]).row(0) == (ev.height,) * 7
    assert ev["host"].unique().to_list() == [HOST] and ev["pid"].n_unique() == 3
    assert ev.select(pl.col("ts").is_sorted()).item() and ev["size"].sum() == 3 * 50 * 4096


def test_single_file_list_and_plain_pfw(tmp_path: Path) -> None:
    p = Proc(pid=7)
    p.open("/x/a.bin")
    p.read("/x/a.bin", 10)
    p.finish()
    gz = write_gz(tmp_path / "one.pfw.gz", p.lines())
    plain = tmp_path / "one.pfw"
    plain.write_bytes(b"\n".join(p.lines()))  # no trailing newline: last line is still kept
    a, b = load(gz), load(plain)
    with pytest.warns(TraceDamageWarning, match="set aside"):
        c = load([gz, plain])  # the same events twice: the second copy set aside (issue #45)
    assert a.height == b.height == c.height == 4
    assert a.drop("source").equals(b.drop("source"))


def test_fast_path_and_json_path_agree(tmp_path: Path, monkeypatch) -> None:
    d, _ = dataloader_job(tmp_path)
    monkeypatch.setenv(LOAD.PARSER_ENV, "native")
    fast = load(d)
    monkeypatch.setenv(LOAD.PARSER_ENV, "python")
    slow = load(d)
    assert fast.equals(slow)


def test_relative_paths_use_the_process_cwd(tmp_path: Path) -> None:
    p = Proc(pid=9, cwd="/tmp/exp")
    p.open("data/f0.npz")
    p.read("data/f0.npz", 100)
    p.finish()
    write_gz(tmp_path / "t.pfw.gz", p.lines())
    ev = load(tmp_path)
    assert ev.filter(pl.col("name") == "read")["file"].to_list() == ["/tmp/exp/data/f0.npz"]


def test_time_metric_ns_is_converted(tmp_path: Path) -> None:
    p = Proc(pid=3)
    # (no start record: its µs timestamp read as ns would put the read before the process
    # began, which the loader sets aside since issue #45)
    p.records = [r for r in p.records if r["name"] not in ("CM", "start")]
    p.meta("CM", "time_metric", "NS")
    p.event("read", "POSIX", {"ret": 1, "count": 1, "fhash": "ab"}, ts=5_000_000, dur=7_000)
    write_gz(tmp_path / "t.pfw.gz", p.lines())
    r = load(tmp_path).filter(pl.col("name") == "read").row(0, named=True)
    assert (r["ts"], r["dur"]) == (5_000, 7)


def test_unknown_values_are_kept(tmp_path: Path) -> None:
    p = Proc(pid=4)
    p.event("frobnicate", "WEIRD", {"ret": 5, "color": "blue, green"})
    rec = p.event("read", "POSIX", {"ret": 8, "count": 8, "fhash": "00"})
    rec["ph"] = 7  # unknown phase: still a row
    p.records.append(
        {
            "id": 99,
            "name": "ctr",
            "cat": "C",
            "pid": 4,
            "tid": 4,
            "ts": T0 + 1,
            "ph": "C",
            "args": {"v": 1},
        }
    )
    write_gz(tmp_path / "t.pfw.gz", p.lines())
    ev = load(tmp_path)
    assert {"frobnicate", "read", "ctr"} <= set(ev["name"])
    assert ev.filter(pl.col("name") == "read")["size"].to_list() == [8]


def test_fread_counts_items_times_size(tmp_path: Path) -> None:
    p = Proc(pid=5)
    fh = p.file("/etc/x.conf")
    p.event("fopen64", "STDIO", {"mode": "rb", "fhash": fh})
    p.event("fread", "STDIO", {"ret": 3, "count": 4, "size": 100, "fhash": fh})
    p.event("fread", "STDIO", {"ret": 2, "count": 8, "size": 1, "fhash": fh})
    write_gz(tmp_path / "t.pfw.gz", p.lines())
    r = load(tmp_path).filter(pl.col("name") == "fread").sort("ts")
    assert r["size"].to_list() == [300, 2]
    assert r["size_requested"].to_list() == [400, 8]
    assert r["offset"].to_list() == [0, 300]


# ---------------------------------------------------------------------------------------
# DFTracer 1.x


def to_v1(rec: dict) -> bytes:
    """A 2.x record in DFTracer 1.x form: letter ph, numbers as strings, integer hashes."""
    o = {k: v for k, v in rec.items() if k != "type"}
    o["ph"] = {1: "X", 4: "M"}[rec["ph"]]
    for k in ("id", "pid", "tid", "ts", "dur"):
        if k in o:
            o[k] = str(o[k])
    args = dict(o["args"])
    for k, v in args.items():
        if k in ("hhash", "fhash", "cwd") or (k == "value" and rec["name"] in ("FH", "HH")):
            args[k] = int(v, 16)
        elif isinstance(v, int) and k in ("ret", "count", "offset"):
            args[k] = str(v)
    o["args"] = args
    return _line(o)


@pytest.mark.parametrize("closing", [b"", b"\n]"])
def test_v1_format_matches_v2(tmp_path: Path, closing: bytes) -> None:
    d2, _ = dataloader_job(tmp_path, name="v2")
    d1 = tmp_path / "v1"
    d1.mkdir()
    for f in sorted(d2.glob("*.pfw.gz")):
        recs = [json.loads(x) for x in gzip.decompress(f.read_bytes()).splitlines()]
        body = b"[\n" + b",\n".join(to_v1(r) for r in recs) + b",\n" + closing
        (d1 / f.name).write_bytes(gzip.compress(body))
    v1, v2 = load_trace(d1), load_trace(d2)
    assert not v1.damaged, v1.describe_damage()
    a, b = v1.events, v2.events
    assert a.height == b.height
    assert (
        a["fhash"].drop_nulls().cast(pl.String).str.contains("^[0-9]+$").all()
    )  # integer hashes -> decimal strings
    same = [c for c in EVENT_SCHEMA if c != "fhash"]
    assert a.select(same).equals(b.select(same))


# ---------------------------------------------------------------------------------------
# Damage


def _complete_events(text: bytes) -> int:
    n = 0
    for ln in text.split(b"\n")[:-1]:
        if ln.strip() and json.loads(ln)["ph"] != 4:
            n += 1
    return n


@pytest.fixture(scope="module")
def big_member_file(tmp_path_factory) -> tuple[Path, bytes]:
    p = Proc(pid=11)
    rnd = random.Random(1)
    for i in range(3000):
        f = f"/d/f{i % 7}"
        p.read(f, rnd.randrange(1, 1 << 20))
    p.finish()
    path = write_gz(tmp_path_factory.mktemp("gz") / "big.pfw.gz", p.lines(), members=4)
    return path, path.read_bytes()


@pytest.mark.parametrize(
    "where", ["10%", "50%", "90%", "boundary", "in-header", "in-trailer", "1-byte"]
)
def test_truncation_counts_are_exact(tmp_path: Path, big_member_file, where: str) -> None:
    _, data = big_member_file
    starts = member_offsets(data)
    cut = {
        "10%": len(data) // 10,
        "50%": len(data) // 2,
        "90%": len(data) * 9 // 10,
        "boundary": starts[2],
        "in-header": starts[2] + 5,
        "in-trailer": len(data) - 3,
        "1-byte": 1,
    }[where]
    path = tmp_path / "t.pfw.gz"
    path.write_bytes(data[:cut])
    text, truncated = ref_decode(data[:cut])
    tail = text[text.rfind(b"\n") + 1 :]
    loaded = load_trace(path)
    rep = loaded.files[0]
    assert loaded.events.height == _complete_events(text)
    assert rep.dropped_lines == (1 if tail else 0)
    assert rep.dropped_bytes == len(tail)
    if truncated:
        assert any("truncated" in p for p in rep.problems)
    if tail:
        with pytest.warns(TraceDamageWarning, match="t.pfw.gz"):
            load(path)
        assert "t.pfw.gz" in loaded.describe_damage()


def test_corrupt_middle_member_keeps_later_members(tmp_path: Path, big_member_file) -> None:
    src, data = big_member_file
    starts = member_offsets(data)
    bad = bytearray(data)
    mid = (starts[1] + starts[2]) // 2
    bad[mid : mid + 64] = b"\xff" * 64
    path = tmp_path / "c.pfw.gz"
    path.write_bytes(bytes(bad))
    good_lines = gzip.decompress(data).split(b"\n")
    all_ts = {json.loads(x)["ts"] for x in good_lines if x and json.loads(x)["ph"] == 1}
    later_ts = {
        json.loads(x)["ts"]
        for x in gzip.decompress(data[starts[2] :]).split(b"\n")
        if x and json.loads(x)["ph"] == 1
    }
    first_ts = {
        json.loads(x)["ts"]
        for x in gzip.decompress(data[: starts[1]]).split(b"\n")
        if x and json.loads(x)["ph"] == 1
    }
    loaded = load_trace(path)
    kept = set(loaded.events["ts"].to_list())
    assert kept <= all_ts  # nothing invented
    assert later_ts <= kept and first_ts <= kept  # members after the damage were decoded
    assert len(kept) < len(all_ts)
    rep = loaded.files[0]
    assert (
        rep.members == 4 and rep.damaged and any("corrupt gzip member 2" in p for p in rep.problems)
    )
    with pytest.warns(TraceDamageWarning, match="c.pfw.gz"):
        load(path)


BAD_LINES = [
    b'{"id":5,"name":"read","cat":"POSIX"',
    b"this is not json",
    b'{"name": tru}',
    b"12345",
    b'{"id":6,"name":"read",,"cat":"POSIX"}',
    b'{"id":7,"name":"read","cat":"POSIX","type":3,"pid":11,"tid":11,"ts":12x4,"dur":1,"ph":1,'
    b'"args":{"hhash":"6882804a826580cd","ret":1,"count":1,"fhash":"00000000000000aa"}}',
    b"\xff\xfe\x00garbage",
]


@pytest.mark.parametrize("parser", ["native", "python"])
def test_malformed_lines_are_dropped_and_counted(tmp_path: Path, monkeypatch, parser: str) -> None:
    monkeypatch.setenv(LOAD.PARSER_ENV, parser)
    p = Proc(pid=11)
    for i in range(200):
        p.read("/d/x", i + 1)
    lines = p.lines()
    for k, bad in enumerate(BAD_LINES):
        lines.insert(10 + 25 * k, bad)
    lines.insert(5, b"")  # blank lines are not lines
    path = write_gz(tmp_path / "m.pfw.gz", lines, members=2)
    loaded = load_trace(path)
    rep = loaded.files[0]
    assert loaded.events.height == len(p.records) - 5  # 5 metadata records
    assert rep.dropped_lines == len(BAD_LINES)
    assert rep.dropped_bytes == sum(len(b) + 1 for b in BAD_LINES)
    assert rep.lines == len(p.records) + len(BAD_LINES)


def test_empty_inputs_and_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(TraceError, match="no trace files"):
        load_trace(tmp_path / "empty_dir")
    d = tmp_path / "zero"
    d.mkdir()
    (d / "a.pfw.gz").write_bytes(b"")
    (d / "b.pfw").write_bytes(b"")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_trace(d)
    assert loaded.events.height == 0 and dict(loaded.events.schema) == EVENT_SCHEMA
    assert all("empty" in f.problems[0] for f in loaded.files) and not loaded.damaged
    p = Proc(pid=1)
    p.read("/a", 1)
    write_gz(d / "c.pfw.gz", p.lines())
    assert load(d).height == 2


def test_manifest_is_read(tmp_path: Path) -> None:
    d, _ = dataloader_job(tmp_path)
    (d / "manifest.json").write_text(
        json.dumps({"schema": "dlreplay.trace", "data_dirs": ["/data/set"]})
    )
    assert load_trace(d).manifest["data_dirs"] == ["/data/set"]
    (d / "manifest.json").write_text("{broken")
    with pytest.warns(TraceDamageWarning, match="manifest.json"):
        assert load_trace(d).manifest is None


# ---------------------------------------------------------------------------------------
# Offsets


def reference_offsets(ev: pl.DataFrame) -> list[int | None]:
    """Plain-Python model of the file position, row by row (events sorted by ts). A transfer
    the loader took the file from (its process had closed the file: a stray) has none."""
    pos: dict[tuple, int | None] = {}
    out = []
    for r in ev.iter_rows(named=True):
        key = (r["source"], r["pid"], r["cat"], r["fhash"])
        name = r["name"]
        off = None
        if r["fhash"] is None:
            out.append(None)
            continue
        if name in ("open64", "open", "fopen64", "fopen"):
            pos[key] = 0
        elif name in ("lseek64", "lseek"):
            if r["ret"] is not None and r["ret"] >= 0:
                pos[key] = r["ret"]
        elif name in ("close", "fclose"):
            pos[key] = None
        elif name in ("pread64", "pwrite64"):
            off = r["offset"]
        elif name in READ_OPS or name in WRITE_OPS:
            off = pos.get(key)
            if off is not None:
                pos[key] = off + (r["size"] or 0)
        out.append(off)
    return out


def test_offsets_match_reference_and_ground_truth(tmp_path: Path) -> None:
    rnd = random.Random(3)
    procs = [Proc(pid=200 + k) for k in range(2)]
    truth = []
    for p in procs:
        for f in ("/d/a", "/d/b", "/d/c"):
            pos = None
            nopen, opened = (
                0,
                False,
            )  # a transfer with the file opened before and none open now: a stray
            for _ in range(60):
                op = rnd.choice(["open", "read", "read", "write", "lseek", "pread", "close"])
                tid = rnd.choice([p.pid, p.pid + 1000])
                gap = rnd.choice([0, 0, 1, 5])  # equal timestamps: line order decides
                stray = opened and nopen == 0
                if op == "open":
                    p.open(
                        f, flags=0o2000002, tid=tid, dur=0, gap=gap
                    )  # O_CLOEXEC | O_RDWR: its writes are the file's
                    pos = 0
                    nopen, opened = nopen + 1, True
                elif op == "lseek":
                    pos = rnd.randrange(0, 10_000)
                    p.lseek(f, pos, tid=tid, dur=0, gap=gap)
                elif op == "close":
                    p.close(f, tid=tid, dur=0, gap=gap)
                    pos = None
                    nopen = max(nopen - 1, 0)
                elif op == "pread":
                    o, n = rnd.randrange(0, 5000), rnd.randrange(0, 500)
                    r = p.pread(f, n, o, tid=tid, dur=0, gap=gap)
                    truth.append((r["ts"], p.pid, None, None) if stray else (r["ts"], p.pid, f, o))
                else:
                    n = rnd.choice([0, 1, 17, 4096])
                    r = (p.read if op == "read" else p.write)(f, n, tid=tid, dur=0, gap=gap)
                    truth.append(
                        (r["ts"], p.pid, None, None) if stray else (r["ts"], p.pid, f, pos)
                    )
                    if pos is not None:
                        pos += n
            p.ts += 1  # files are interleaved in time only through equal-ts ties
    for p in procs:
        write_gz(tmp_path / f"trace-{p.pid}.pfw.gz", p.lines(), members=2)
    ev = load(tmp_path)
    io = ev.filter(pl.col("cat") == "POSIX")
    xfer = io.with_columns(pl.Series("ref", reference_offsets(io), dtype=pl.Int64)).filter(
        pl.col("name").is_in(["read", "write", "pread64"])
    )
    assert xfer["offset"].to_list() == xfer["ref"].to_list()
    assert xfer["offset"].null_count() > 0  # reads after close / before open are unknown
    assert (
        0 < xfer["file"].null_count() < xfer.height
    )  # strays (the generator makes reads after a close)

    def norm(rows):
        return sorted((ts, pid, f or "", -1 if off is None else off) for ts, pid, f, off in rows)

    assert norm(zip(xfer["ts"], xfer["pid"], xfer["file"], xfer["offset"], strict=True)) == norm(
        truth
    )


@pytest.mark.parametrize("native", [True, False], ids=["C pass", "numpy"])
def test_calls_logged_on_a_closed_file_are_kept_without_it(
    tmp_path: Path, monkeypatch, native: bool
) -> None:
    """DFTracer's close() closes the descriptor, logs, and only then forgets its file: a
    socket another thread opens in between gets the number, and its calls are logged with
    the closed file's hash. A DataLoader worker's resource-sharer thread answering the
    training process is such a socket (35 + 13 bytes written, 20 read: the +48 bytes a
    replay of dlio_jpeg_ckpt once wrote to its dataset). The loader keeps those calls on no
    file and counts them, and writes on a file the process only ever opened read-only too
    (a handshake stamped after the file was opened again); descriptors another thread still
    holds, closes of inherited descriptors, and opens for writing or of unknown flags
    change nothing."""
    if not native:
        monkeypatch.setattr(NATIVE, "NATIVE", None)
    w = Proc(pid=300)
    w.open("/data/a.jpg")
    w.read("/data/a.jpg", 4096)
    w.close("/data/a.jpg")
    handshake = [
        w.write("/data/a.jpg", 35, tid=301),
        w.read("/data/a.jpg", 20, tid=301),
        w.write("/data/a.jpg", 13, tid=301),
    ]
    w.open("/data/a.jpg")  # open again: its reads are the file's
    w.read("/data/a.jpg", 100)
    # a handshake stamped after the reopen: its read passes for the file's, its writes
    # cannot be (every open of the file in this process was read-only)
    late = [w.write("/data/a.jpg", 35, tid=301), w.write("/data/a.jpg", 13, tid=301)]
    w.read("/data/a.jpg", 20, tid=301)
    w.open(
        "/data/log.txt", flags=0o2000101
    )  # O_CLOEXEC | O_CREAT | O_WRONLY: its writes are the file's
    w.write("/data/log.txt", 9)
    w.event("open64", "POSIX", {"fhash": w.file("/data/old.bin")})  # no flags: could have written
    w.write("/data/old.bin", 5)
    w.open("/data/c.h5", tid=302)  # two threads hold the file: one closes, the other reads on
    w.open("/data/c.h5")
    w.close("/data/c.h5")
    w.pread("/data/c.h5", 512, 4096, tid=302)
    w.close("/data/c.h5", tid=302)
    w.pread("/data/c.h5", 64, 0, tid=303)  # closed by both: a stray too
    inherited = Proc(pid=400)
    inherited.close("/data/d.npz")  # a descriptor from the parent: no open of its own to undo
    inherited.open("/data/d.npz")
    inherited.read("/data/d.npz", 7)
    write_gz(tmp_path / "trace-300.pfw.gz", w.lines())
    write_gz(tmp_path / "trace-400.pfw.gz", inherited.lines())
    loaded = load_trace(tmp_path)
    ev = loaded.events.filter(pl.col("name").cast(pl.String).is_in(["read", "write", "pread64"]))
    stray = ev.filter(pl.col("file").is_null())
    assert sorted(stray.select("tid", "ts", "size").rows()) == sorted(
        [(301, r["ts"], r["args"]["ret"]) for r in handshake + late]
        + [(303, stray["ts"].max(), 64)]
    )
    assert stray["offset"].null_count() == stray.height
    assert stray["name"].cast(pl.String).to_list().count("write") == 4  # the calls stay, on no file
    kept = ev.filter(pl.col("file").is_not_null())
    assert sorted(kept.select(pl.col("file").cast(pl.String), "size").rows()) == [
        ("/data/a.jpg", 20),
        ("/data/a.jpg", 100),
        ("/data/a.jpg", 4096),
        ("/data/c.h5", 512),
        ("/data/d.npz", 7),
        ("/data/log.txt", 9),
        ("/data/old.bin", 5),
    ]
    problems = {f.name: f.problems for f in loaded.files}
    assert problems["trace-300.pfw.gz"] == [
        "6 event(s) with a file their process had closed or never opened for writing (DFTracer's close race: another "
        "thread reused the descriptor), kept without a file"
    ]
    assert problems["trace-400.pfw.gz"] == [] and not loaded.damaged
    from dlreplay.analyze.files import classify_files

    files = {r["file"]: r for r in classify_files(loaded.events).iter_rows(named=True)}
    assert files["/data/a.jpg"]["bytes_written"] == 0 and files["/data/a.jpg"]["bytes_read"] == 4216
    assert any("6 read/write call(s)" in w_ for w_ in trace_warnings(tmp_path, loaded.files))


# ---------------------------------------------------------------------------------------
# Hypothesis: random valid events round-trip through the parser

_names = st.sampled_from(["read", "write", "open64", "lseek64", "close", "pread64", "mystery_op"])
_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)


@st.composite
def random_event(draw) -> dict:
    name = draw(_names)
    args = {"hhash": HHASH}
    if name in ("read", "write", "pread64"):
        args["ret"] = draw(st.integers(-1, 2**40))
        args["count"] = draw(st.integers(0, 2**40))
    if name in ("pread64", "lseek64"):
        args["offset"] = draw(st.integers(0, 2**40))
    if name == "lseek64":
        args["ret"] = draw(st.integers(-1, 2**40))
        args["whence"] = draw(st.integers(0, 2))
    if draw(st.booleans()):
        args["note"] = draw(_text)  # arbitrary text (commas, quotes, escapes, unicode)
    args["fhash"] = draw(st.sampled_from(["0000000000000001", "00000000000000ff"]))
    return {
        "name": name,
        "cat": "POSIX",
        "pid": draw(st.integers(1, 2**22)),
        "ts": draw(st.integers(T0, T0 + 10**9)),
        "dur": draw(st.integers(0, 10**6)),
        "args": args,
    }


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(random_event(), min_size=1, max_size=40), st.booleans())
def test_random_events_round_trip(tmp_path: Path, events: list[dict], fast: bool) -> None:
    saved = os.environ.get(LOAD.PARSER_ENV)
    os.environ[LOAD.PARSER_ENV] = "native" if fast else "python"
    try:
        lines = []
        for i, e in enumerate(events):
            rec = {
                "id": i + 1,
                "name": e["name"],
                "cat": e["cat"],
                "type": 3,
                "pid": e["pid"],
                "tid": e["pid"],
                "ts": e["ts"],
                "dur": e["dur"],
                "ph": 1,
                "args": e["args"],
            }
            lines.append(_line(rec))
        path = tmp_path / f"h{random.random()}.pfw.gz"
        write_gz(path, lines)
        loaded = load_trace(path)
    finally:
        if saved is None:
            os.environ.pop(LOAD.PARSER_ENV, None)
        else:
            os.environ[LOAD.PARSER_ENV] = saved
    assert not loaded.damaged, loaded.describe_damage()
    got = loaded.events.sort("ts", "pid", "name", "dur", maintain_order=True)
    want = pl.DataFrame(
        {
            "ts": [e["ts"] for e in events],
            "pid": [e["pid"] for e in events],
            "name": [e["name"] for e in events],
            "dur": [e["dur"] for e in events],
            "ret": [e["args"].get("ret") for e in events],
            "fhash": [e["args"]["fhash"] for e in events],
        },
        schema={
            "ts": pl.Int64,
            "pid": pl.Int64,
            "name": pl.String,
            "dur": pl.Int64,
            "ret": pl.Int64,
            "fhash": pl.String,
        },
    ).sort("ts", "pid", "name", "dur", maintain_order=True)
    assert got.select(want.columns).sort(want.columns).equals(want.sort(want.columns))
    sized = got.filter(pl.col("name").is_in(["read", "write", "pread64"]))
    assert sized["size"].to_list() == [r if r >= 0 else None for r in sized["ret"].to_list()]


# ---------------------------------------------------------------------------------------
# Parts: grouping files into parts (and batching small files into one parse) changes nothing


def _many_small_files(d: Path) -> None:
    """A job of many small per-process files, one truncated and one with malformed lines."""
    d.mkdir()
    rnd = random.Random(5)
    procs = [Proc(pid=300 + k, ppid=300 if k else 1, ts=T0 + k) for k in range(24)]
    for p in procs:
        for s in range(rnd.randrange(5, 40)):
            f = f"/data/set/f{rnd.randrange(9)}.bin"
            p.open(f)
            p.read(f, rnd.randrange(1, 5000))
            p.lseek(f, rnd.randrange(0, 100))
            p.read(f, 7)
            p.close(f)
            p.event("item", "data", {"image_idx": s, "epoch": 0}, typ=2)
        p.finish()
    for k, p in enumerate(procs):
        lines = p.lines()
        if k == 5:
            lines.insert(7, BAD_LINES[0])
            lines.insert(12, BAD_LINES[2])
        path = write_gz(d / f"trace-{p.pid}.pfw.gz", lines, members=2)
        if k == 9:
            data = path.read_bytes()
            path.write_bytes(data[: len(data) * 2 // 3])
    (d / "empty.pfw").write_bytes(b"")


def test_batched_small_files_match_one_by_one(tmp_path: Path, monkeypatch) -> None:
    d = tmp_path / "many"
    _many_small_files(d)
    files = sorted(p for p in d.iterdir())
    batched = load_trace(d, jobs=1)
    assert (
        len(INPUTS.file_groups(list(enumerate(files)), 1)) == 1
    )  # all small: one part, one parse batch
    monkeypatch.setattr(INPUTS, "_GROUP_BYTES", 1)  # every file its own part
    monkeypatch.setattr(DECOMPRESS, "CHUNK_BYTES", 1)  # and every file its own parse batch
    single = load_trace(d, jobs=2)
    assert batched.events.equals(single.events)
    assert batched.files == single.files
    # a damaged file in the batch reports exactly what it reports alone
    for k, rep in enumerate(batched.files):
        alone = load_trace(files[k]).files[0]
        assert rep == alone, rep.name
    reps = {r.name: r for r in batched.files}
    assert reps["trace-305.pfw.gz"].dropped_lines == 2
    assert reps["trace-309.pfw.gz"].damaged and any(
        "truncated" in p for p in reps["trace-309.pfw.gz"].problems
    )
    assert (
        sum(r.dropped_lines for r in batched.files)
        == batched.dropped_lines
        == 2 + reps["trace-309.pfw.gz"].dropped_lines
    )
    assert not reps["empty.pfw"].damaged and reps["empty.pfw"].events == 0


def test_parts_combine_in_any_grouping_and_order(tmp_path: Path) -> None:
    d = tmp_path / "many"
    _many_small_files(d)
    jobs = list(enumerate(sorted(p for p in d.iterdir())))
    names = [p.name for _, p in jobs]
    whole = LOAD.combine_parts([LOAD.parse_part(jobs)], names)
    rnd = random.Random(2)
    shuffled = jobs[:]
    rnd.shuffle(shuffled)
    parts = [LOAD.parse_part(shuffled[i : i + 5]) for i in range(0, len(shuffled), 5)]
    rnd.shuffle(parts)
    events, reports = LOAD.combine_parts(parts, names)
    assert events.equals(whole[0]) and reports == whole[1]
    assert events.equals(load_trace(d).events)


def test_layout_with_varying_names_in_one_group(tmp_path: Path, monkeypatch) -> None:
    """Records without "id" put the name first; one layout group then holds several names."""
    recs = []
    ts = T0
    for k in range(40):
        for name, args in (
            ("open64", {"ret": 3, "count": 0, "fhash": "0a"}),
            ("read", {"ret": 100 + k, "count": 4096, "fhash": "0a"}),
            ("read", {"ret": 7, "count": 4096, "fhash": "0a"}),
            ("close", {"ret": 0, "count": 0, "fhash": "0a"}),
        ):
            recs.append(
                _line(
                    {
                        "name": name,
                        "cat": "POSIX",
                        "pid": 8,
                        "tid": 8,
                        "ts": ts,
                        "dur": 1,
                        "ph": "X",
                        "args": args,
                    }
                )
            )
            ts += 2
    write_gz(tmp_path / "t.pfw.gz", recs)
    monkeypatch.setenv(LOAD.PARSER_ENV, "native")
    fast = load(tmp_path)
    monkeypatch.setenv(LOAD.PARSER_ENV, "python")
    slow = load(tmp_path)
    assert fast.equals(slow)
    reads = fast.filter(pl.col("name") == "read")
    assert reads["offset"].to_list()[:4] == [0, 100, 0, 101]


def test_unpacked_sort_paths_agree(tmp_path: Path, monkeypatch) -> None:
    """Keys too wide to pack into one Int64 take the multi-key sorts: same table."""
    d, _ = dataloader_job(tmp_path)
    packed = load(d)
    monkeypatch.setattr(SHAPES, "PACK_BITS", 0)
    assert load(d).equals(packed)
    monkeypatch.undo()
    p = Proc(pid=400)
    p.open("/d/far", ts=(1 << 61) - 5)
    for k in range(30):  # a process whose clock is far off: a huge ts range
        p.read("/d/far", k + 1, ts=(1 << 61) + k * 10)
    p.finish()
    write_gz(d / "trace-400.pfw.gz", p.lines())
    # (the far-off process's file is set aside as hours away from the run since issue #45: its
    # table is checked before that step)
    monkeypatch.setattr(LOAD, "check_values", lambda loaded: loaded)
    wide = load(d)
    assert wide["ts"].is_sorted() and wide.height == packed.height + 33
    assert wide.filter(pl.col("pid") == 400, pl.col("name") == "read")["offset"].to_list() == [
        sum(range(1, k + 1)) for k in range(30)
    ]
    monkeypatch.undo()
    (far,) = [f for f in load_trace(d).files if f.name == "trace-400.pfw.gz"]
    assert far.events == 2 and "outside its process's lifetime" in far.problems[0]  # (start, end)


@pytest.mark.parametrize("chunk", [1 << 12, 32 << 20])
def test_decoding_ahead_in_a_thread_changes_nothing(
    tmp_path: Path, big_member_file, monkeypatch, chunk: int
) -> None:
    """Large files decode their next chunk in a helper thread: same rows, same reports
    (problems in the same order) for clean, truncated, corrupt and malformed files."""
    _, data = big_member_file
    starts = member_offsets(data)
    d = tmp_path / "t"
    d.mkdir()
    (d / "clean.pfw.gz").write_bytes(data)
    (d / "cut.pfw.gz").write_bytes(data[: len(data) * 3 // 4])
    bad = bytearray(data)
    for m in (1, 2):  # two corrupt members: two damage points
        mid = (starts[m] + starts[m + 1]) // 2
        bad[mid : mid + 64] = b"\xff" * 64
    (d / "corrupt.pfw.gz").write_bytes(bytes(bad))
    p = Proc(pid=12)
    for i in range(3000):
        p.read("/d/x", i + 1)
    lines = p.lines()
    for k, b in enumerate(BAD_LINES):
        lines.insert(100 + 400 * k, b)
    write_gz(d / "malformed.pfw.gz", lines, members=5)
    monkeypatch.setattr(DECOMPRESS, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(LOAD, "_PREFETCH_BYTES", 1 << 40)
    inline = load_trace(d)
    monkeypatch.setattr(LOAD, "_PREFETCH_BYTES", 0)
    monkeypatch.setattr(LOAD, "_PREFETCH_SPARE_ONLY", False)  # whatever the cores
    ahead = load_trace(d)
    assert ahead.events.equals(inline.events)
    assert ahead.files == inline.files
    assert {f.name for f in ahead.files if f.problems} == {
        "cut.pfw.gz",
        "corrupt.pfw.gz",
        "malformed.pfw.gz",
    }


# ---------------------------------------------------------------------------------------
# The loader's per-(file, host, pid) table (integer keys) equals the one of the event table


def _assert_per_process_matches(loaded: LoadedTrace) -> None:
    from dlreplay.analyze.files import file_process_table
    from dlreplay.analyze.trace import vocabulary as voc

    if (
        loaded.per_process is None
    ):  # the vocabulary rewrote processes (DLIO's rank pids): counted where used
        assert loaded.events.filter(pl.col("cat").is_in(voc.DLIO_CATEGORIES)).height > 0
        return
    keys = ["file", "host", "pid"]
    want = file_process_table(loaded.events).sort(keys)
    assert want.height > 0
    assert_frame_equal(loaded.per_process.sort(keys), want)


@pytest.mark.parametrize(
    "trace", sorted(p.parent for p in TRACES.glob("*/expected.json")), ids=lambda p: p.name
)
def test_per_process_table_of_the_corpus(trace: Path) -> None:
    _assert_per_process_matches(load_trace(trace))


@pytest.mark.parametrize("dense", [True, False], ids=["bincount", "group-by"])
def test_per_process_table_with_every_kind_of_file_name(
    tmp_path: Path, monkeypatch, dense: bool
) -> None:
    """FH in another process's file, a checkpoint named only by its path argument, a
    relative name, an unresolved hash, one path under two hashes, writes and opens, and a
    pid that appears in two trace files (two processes, one host): one row each."""
    if not dense:
        monkeypatch.setattr(importlib.import_module("dlreplay.analyze.files"), "_DENSE_KEYS", 0)
    d, _ = dataloader_job(tmp_path, fh_in_parent_only=True)
    p = Proc(pid=100, cwd="/tmp/exp")  # the same pid as the job's main process, another file
    p.open("data/f0.npz")
    p.read("data/f0.npz", 100)
    p.write("/tmp/exp/data/f0.npz", 7)  # the same path under another hash (absolute spelling)
    p.event("read", "POSIX", {"ret": 5, "count": 5, "fhash": "00000000000000ab"})  # no FH record
    p.event("load", "checkpoint", {"bytes": 42, "path": "ckpt/last.pt"}, typ=2)
    p.finish()
    write_gz(d / "other-100.pfw.gz", p.lines())
    loaded = load_trace(d)
    _assert_per_process_matches(loaded)
    rows = loaded.per_process.filter(pl.col("file") == "/tmp/exp/data/f0.npz").row(0, named=True)
    assert (rows["rb"], rows["wb"], rows["opens"]) == (100, 7, 1)
    ckpt = loaded.per_process.filter(pl.col("file") == "/tmp/exp/ckpt/last.pt").row(0, named=True)
    assert ckpt["ck_r"] == 42 and ckpt["ckpt_event"]


def test_per_process_table_of_a_damaged_trace(tmp_path: Path) -> None:
    d = tmp_path / "many"
    _many_small_files(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceDamageWarning)
        loaded = load_trace(d)
    assert loaded.damaged
    _assert_per_process_matches(loaded)


def test_per_process_table_of_an_empty_trace(tmp_path: Path) -> None:
    p = Proc(pid=3)
    p.records = [r for r in p.records if r["ph"] == 4]  # metadata only: no event rows
    write_gz(tmp_path / "t.pfw.gz", p.lines())
    loaded = load_trace(tmp_path)
    assert loaded.events.height == 0 and loaded.per_process is None


# ---------------------------------------------------------------------------------------
# Parallel loading: any number of jobs gives the table of one


def _parallel_trace(tmp_path: Path) -> Path:
    """npz_fork plus three large multi-member files: intact, truncated, and with a corrupt
    member in the middle (each split into byte ranges when loaded with several jobs)."""
    from .test_bad_traces import SRC, corpus_lines, gz_members

    d = tmp_path / "par"
    shutil.copytree(SRC, d)
    lines = corpus_lines()
    big = gz_members(lines * 3, 24)
    (d / "big-intact.pfw.gz").write_bytes(big)
    (d / "big-truncated.pfw.gz").write_bytes(big[: len(big) * 5 // 7])
    starts = member_offsets(big)
    mid = starts[len(starts) // 2]
    bad = bytearray(big)
    bad[mid + 200 : mid + 260] = bytes(60)  # zeros inside the deflate data of one member
    (d / "big-corrupt.pfw.gz").write_bytes(bytes(bad))
    return d


def _assert_same_load(a: LoadedTrace, b: LoadedTrace) -> None:
    assert_frame_equal(a.events, b.events, check_exact=True)
    assert a.files == b.files
    if a.per_process is None and b.per_process is None:
        # events set aside (the fixtures' files hold their lines several times: issue #45): the
        # per-process table is counted again where it is used
        assert any("set aside" in p for f in a.files for p in f.problems)
        return
    assert a.per_process is not None and b.per_process is not None
    keys = ["file", "host", "pid"]
    assert_frame_equal(a.per_process.sort(keys), b.per_process.sort(keys))


@pytest.mark.parametrize("jobs", [2, 3, 7])
def test_jobs_give_the_table_of_one(tmp_path: Path, monkeypatch, jobs: int) -> None:
    d = _parallel_trace(tmp_path)
    one = load_trace(d, jobs=1)
    assert one.damaged and one.events.height > 0
    monkeypatch.setattr(
        LOAD, "range_share", lambda sizes, workers: 4 << 10
    )  # the large files are cut
    calls: list[tuple] = []
    real = LOAD.parse_part
    monkeypatch.setattr(
        LOAD, "parse_part", lambda job, **kw: calls.append(tuple(job)) or real(job, **kw)
    )
    many = load_trace(d, jobs=jobs)
    _assert_same_load(one, many)
    ranges = {Path(job[0][1]).name for job in calls if len(job[0]) == 5}
    assert ranges == {"big-intact.pfw.gz", "big-truncated.pfw.gz", "big-corrupt.pfw.gz"}
    # the damaged files were parsed again whole (their salvage counts are the whole file's)
    again = {
        Path(job[0][1]).name
        for job in calls
        if len(job) == 1 and len(job[0]) == 2 and Path(job[0][1]).name.startswith("big")
    }
    assert again == {"big-truncated.pfw.gz", "big-corrupt.pfw.gz"}


def test_a_large_part_alone_returns_memory_between_its_steps(tmp_path: Path, monkeypatch) -> None:
    """A part resolved alone returns what its steps freed only when it is large
    (``_RELEASE_ROWS``); the table is the same either way."""
    d = _parallel_trace(tmp_path)
    released: list[bool] = []
    real = RESOLVE.release_free_memory
    monkeypatch.setattr(
        RESOLVE,
        "release_free_memory",
        lambda keep_large=False: released.append(keep_large) or real(keep_large=keep_large),
    )
    small = load_trace(d, jobs=1)
    between = released.count(True)
    released.clear()
    monkeypatch.setattr(RESOLVE, "_RELEASE_ROWS", 1)  # every part counts as large
    large = load_trace(d, jobs=1)
    # a large part also returns the sort keys, the offsets' inputs and the dropped columns
    assert released.count(True) >= between + 2
    _assert_same_load(small, large)


def test_the_merge_holds_no_part_once_it_has_taken_their_rows(tmp_path: Path, monkeypatch) -> None:
    """Nothing outside the merge keeps a resolved part (and so its rows) alive while the
    run's table is built: a loop variable had kept the last one through the merge."""
    import gc
    import weakref

    d = _parallel_trace(tmp_path)
    alive: list[int] = []
    real = LOAD.merge_parts

    def merge(parts, names):
        refs = [weakref.ref(p) for p in parts]
        out = real(parts, names)
        gc.collect()
        alive.append(sum(r() is not None for r in refs))
        return out

    monkeypatch.setattr(LOAD, "merge_parts", merge)
    loaded = load_trace(d, jobs=2)
    assert loaded.events.height and alive == [0]


def test_a_wrong_cut_falls_back_to_the_whole_file(tmp_path: Path, monkeypatch) -> None:
    """Cuts inside a member, or after a member that ends inside a line, are detected after
    the ranges are parsed; the file is then parsed whole, with the same result."""
    from .test_bad_traces import corpus_lines

    d = tmp_path / "cut"
    d.mkdir()
    text = b"\n".join(corpus_lines() * 2) + b"\n"
    half = len(text) // 2
    # three members: the second ends in the middle of a line
    (d / "a.pfw.gz").write_bytes(
        gzip.compress(text[: half // 2], mtime=0)
        + gzip.compress(text[half // 2 : half + 7], mtime=0)
        + gzip.compress(text[half + 7 :], mtime=0)
    )
    one = load_trace(d, jobs=1)
    # (the lines twice: the second copy set aside since issue #45, nothing dropped)
    assert not one.dropped_lines and not one.dropped_bytes
    data = (d / "a.pfw.gz").read_bytes()
    starts = member_offsets(data)
    for cuts in ([0, starts[1] + 100], [0, starts[2]]):  # inside a member; after the odd member
        monkeypatch.setattr(LOAD, "range_share", lambda sizes, workers: 1)
        monkeypatch.setattr(
            LOAD, "split_file", lambda p, size, n, c=cuts: list(zip(c, [*c[1:], size], strict=True))
        )
        _assert_same_load(one, load_trace(d, jobs=2))


def test_member_headers_are_found_where_they_are(tmp_path: Path) -> None:
    from .test_bad_traces import corpus_lines, gz_members

    path = tmp_path / "m.pfw.gz"
    data = gz_members(corpus_lines() * 4, 16)
    path.write_bytes(data)
    starts = member_offsets(data)
    ranges = LOAD.split_file(path, len(data), 4)
    assert ranges and ranges[0][0] == 0 and ranges[-1][1] == len(data) and len(ranges) >= 3
    assert all(a in starts for a, _ in ranges) and all(
        b == c for (_, b), (c, _) in zip(ranges[:-1], ranges[1:], strict=True)
    )
    (tmp_path / "plain.pfw").write_bytes(b"\n".join(corpus_lines()))
    assert LOAD.split_file(tmp_path / "plain.pfw", 1000, 4) is None


def _v1_event(i: int, name: str, pid: int, tid: int, ts: int, args: dict) -> bytes:
    """One event as pydftracer 1.x writes it (DLIO's traces): numbers as strings, files by ``fname``."""
    return _line(
        {
            "id": str(i),
            "name": name,
            "cat": "POSIX",
            "pid": str(pid),
            "tid": str(tid),
            "ts": str(ts),
            "dur": "1",
            "ph": "X",
            "args": {"hostname": HOST, **args},
        }
    )


@pytest.mark.parametrize("native", [True, False], ids=["C pass", "numpy"])
def test_v1_fname_traces_get_offsets_per_rank_thread(
    tmp_path: Path, monkeypatch, native: bool
) -> None:
    """DFTracer 1.x names files by ``fname`` (no FH hashes): positions are still reconstructed
    per (process, file). In DLIO's traces the pid is the MPI rank and the forked reader
    workers write into the rank's file under their own thread ids: each worker keeps its own
    positions even on the same file. A real process (pid >= 1024, events on its own main
    thread) keeps one position per file across its threads."""
    if not native:
        monkeypatch.setattr(NATIVE, "NATIVE", None)
    rnd = random.Random(11)
    lines = [b"["]
    truth: dict[int, int | None] = {}
    pos: dict[tuple[int, int, str], int | None] = {}
    nopen: dict[
        tuple[int, int, str], int
    ] = {}  # descriptors open; a read with none open after an open: a stray
    ts = T0
    procs = [
        (0, 1539),
        (0, 1540),
        (4242, 4242),
        (4242, 4243),
    ]  # (pid, tid): two DLIO workers, one real process
    for i in range(600):
        pid, tid = rnd.choice(procs)
        f = rnd.choice(["/d/img_0.npz", "/d/img_1.npz"])
        key = (
            pid,
            pid if pid >= 1024 else tid,
            f,
        )  # a real process shares its position between threads
        op = rnd.choice(["open64", "read", "read", "read", "lseek64", "close"])
        args: dict = {"fname": f, "fd": 3}
        if op == "open64":
            args |= {"ret": 3, "flags": 0}
            pos[key] = 0
            nopen[key] = nopen.get(key, 0) + 1
        elif op == "lseek64":
            p = rnd.randrange(0, 5000)
            args |= {"ret": str(p), "whence": 0, "offset": str(p)}
            pos[key] = p
        elif op == "close":
            args |= {"ret": 0}
            pos[key] = None
            if key in nopen:
                nopen[key] = max(nopen[key] - 1, 0)
        else:
            n = rnd.choice([0, 22, 4096])
            args |= {"ret": str(n), "count": str(max(n, 1))}
            truth[ts] = None if nopen.get(key) == 0 else pos.get(key)
            if pos.get(key) is not None:
                pos[key] = pos[key] + n  # type: ignore[operator]
        lines.append(_v1_event(i, op, pid, tid, ts, args) + b",")
        ts += 5
    write_gz(tmp_path / "trace-0-of-1.pfw.gz", lines)
    ev = load(tmp_path)
    reads = ev.filter(pl.col("name") == "read").sort("ts")
    assert reads.height == len(truth)
    assert reads["offset"].to_list() == [truth[t] for t in reads["ts"].to_list()]
    assert reads["offset"].drop_nulls().len() > len(truth) // 2
    assert set(reads["file"].drop_nulls().unique().to_list()) == {"/d/img_0.npz", "/d/img_1.npz"}
    assert reads["file"].null_count() > 0  # the strays (read with the file closed), on no file


_PEAK_CHILD = r"""
import json, sys
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
from dlreplay.analyze.summary import summarize
from dlreplay.analyze.trace.load import load_trace
base = status("VmRSS:")
lt = load_trace(sys.argv[1], jobs=2)
summarize(lt.events, per_process=lt.per_process)
print(json.dumps({"events": lt.events.height, "peak": status("VmHWM:") - base}))
"""


@pytest.fixture(scope="module")
def two_million(tmp_path_factory) -> dict[str, Path]:
    """The ingest benchmark's 2.1 M-event traces: one file, and 9 (a main process and 8 workers)."""
    import sys

    from .conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from ingest import build
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("two_million")
    build(out / "single", 2_200_000, workers=0)
    build(out / "multi", 2_200_000, workers=8)
    return {"single": out / "single", "multi": out / "multi"}


@pytest.mark.parametrize(("kind", "bound"), [("single", 210), ("multi", 200)])
def test_loading_peaks_below_200_bytes_an_event(
    two_million: dict[str, Path], kind: str, bound: int
) -> None:
    """Issue #19's bound: loading and summarising a 2 M-event trace on 2 threads peaks at no
    more than 200 bytes an event above the process's memory after its imports. Freed pages
    go back to the system at once (decay 0), so the peak is live memory, whatever the
    machine's speed. Measured: 9 files 160-161 (8 runs); one file 172-173, and 198-199 in
    about one run of four (the high mode is not the code's order of work: the code before
    this test had it too, 171-172 and 188-190), so one file is held to 210 here, which the
    regression this test was written for still fails (a part copied whole into one chunk,
    its source still held: 223 in the low mode)."""
    import subprocess
    import sys

    from dlreplay import JEMALLOC_ENV

    env = {**os.environ, JEMALLOC_ENV: "dirty_decay_ms:0,muzzy_decay_ms:0"}
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, str(two_million[kind])],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["events"] > 2_000_000
    assert got["peak"] / got["events"] <= bound, got
