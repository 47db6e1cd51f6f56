"""Capture is transparent (issue 43, item 1): no hook changes what the job does, sees or
returns. One job saves and loads through every kind of target torch.save/torch.load are
given (paths, file objects, BytesIO, a pipe, a stream that cannot seek, DCP's writers and
readers) and prints a digest of every byte written and every value loaded; run plainly and
under the real ``dlreplay capture``, the two print the same and exit the same, and what the
hooks could not record is named in the summary and the manifest."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import pytest

from dlreplay.capture import read_manifest
from dlreplay.capture.inject import checkpoint, hooks

from .conftest import run_plain

pytest.importorskip("torch")

HAS_DCP = importlib.util.find_spec("torch.distributed.checkpoint") is not None

JOB = r'''
import hashlib, io, os, pathlib, sys, threading, warnings
import torch

warnings.filterwarnings("ignore")
STATE = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(5), "n": 7}


def digest(b):
    return hashlib.sha256(bytes(b)).hexdigest()[:16]


def value(v):
    if isinstance(v, torch.Tensor):
        return f"{v.dtype}{tuple(v.shape)}:{digest(v.contiguous().numpy().tobytes())}"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}={value(v[k])}" for k in sorted(v)) + "}"
    return repr(v)


def attempt(label, fn):
    try:
        print(label, "ok", fn())
    except Exception as exc:
        print(label, "raised", type(exc).__name__, str(exc).splitlines()[0][:80])


class Unseekable(io.RawIOBase):
    """A stream that can only be written or read in order (DCP's, a socket's)."""

    def __init__(self, data=b""):
        self.out, self.src = bytearray(), io.BytesIO(data)

    def writable(self):
        return True

    def readable(self):
        return True

    def seekable(self):
        return False

    def tell(self):
        raise io.UnsupportedOperation("seek")

    def write(self, b):
        self.out += bytes(b)
        return len(b)

    def readinto(self, m):
        return self.src.readinto(m)


class Odd:
    """A batch item whose shape cannot be asked (the loader hook asks every batch)."""

    @property
    def shape(self):
        raise RuntimeError("no shape")


def through_pipe(save):
    r, w = os.pipe()
    rf, wf = os.fdopen(r, "rb"), os.fdopen(w, "wb")
    got = []
    t = threading.Thread(target=lambda: got.append(rf.read()))
    t.start()
    try:
        ret = save(wf)
    finally:
        wf.close()
        t.join()
        rf.close()
    return ret, got[0]


def save_targets(tmp):
    files = {"str": str(tmp / "a.pt"), "path": tmp / "b.pt"}
    for label, target in files.items():
        attempt(f"save {label}", lambda: (torch.save(STATE, target), digest(pathlib.Path(target).read_bytes())))
    def to_file():
        with open(tmp / "c.pt", "wb") as fh:
            ret = torch.save(STATE, fh)
        return ret, digest((tmp / "c.pt").read_bytes())
    attempt("save fileobj", to_file)
    buf = io.BytesIO(b"head")
    buf.seek(4)
    attempt("save bytesio", lambda: (torch.save(STATE, buf), digest(buf.getvalue()), buf.tell()))
    piped = []
    def pipe():
        ret, data = through_pipe(lambda wf: torch.save(STATE, wf))
        piped.append(data)
        return ret, digest(data)
    attempt("save pipe", pipe)
    ns = Unseekable()
    attempt("save unseekable", lambda: (torch.save(STATE, ns), digest(ns.out)))
    return buf, piped[0] if piped else b"", bytes(ns.out)


def load_targets(tmp, buf, piped, unseekable):
    attempt("load str", lambda: value(torch.load(str(tmp / "a.pt"))))
    attempt("load path", lambda: value(torch.load(tmp / "b.pt", weights_only=True)))
    def from_file():
        with open(tmp / "c.pt", "rb") as fh:
            return value(torch.load(fh))
    attempt("load fileobj", from_file)
    buf.seek(4)
    attempt("load bytesio", lambda: (value(torch.load(buf)), buf.tell()))
    def pipe():
        r, w = os.pipe()
        rf = os.fdopen(r, "rb")
        t = threading.Thread(target=lambda: (os.write(w, piped), os.close(w)))
        t.start()
        try:
            return value(torch.load(rf))
        finally:
            t.join()
            rf.close()
    attempt("load pipe", pipe)
    attempt("load unseekable", lambda: value(torch.load(Unseekable(unseekable))))
    attempt("load missing", lambda: torch.load(str(tmp / "missing.pt")))
    attempt("load nul name", lambda: torch.load("bad\0name.pt"))


def dcp(tmp):
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError as exc:
        print("dcp skipped", type(exc).__name__)
        return
    sd = {"w": STATE["w"].clone(), "b": STATE["b"].clone()}
    attempt(
        "dcp save",  # its Metadata names a fresh uuid each run: its type, and the files
        lambda: (type(dcp.save(sd, checkpoint_id=str(tmp / "dcp"))).__name__, sorted(os.listdir(tmp / "dcp"))),
    )
    into = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
    attempt("dcp load", lambda: (dcp.load(into, checkpoint_id=str(tmp / "dcp")), value(into)))
    writer = dcp.FileSystemWriter(str(tmp / "dcp2"), sync_files=True, thread_count=2)
    attempt("dcp writer", lambda: (type(dcp.save(sd, storage_writer=writer)).__name__, sorted(os.listdir(tmp / "dcp2"))))
    into2 = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
    reader = dcp.FileSystemReader(str(tmp / "dcp2"))
    attempt("dcp reader", lambda: (dcp.load(into2, storage_reader=reader), value(into2)))


def numpy_pickle(tmp):
    """np.save/np.load and pickle.dump/pickle.load through every kind of target."""
    import pickle
    import numpy as np
    arr = np.arange(24, dtype=np.float32).reshape(4, 6)
    for mod, save, load in (
        ("np", lambda o, f: np.save(f, o), lambda f: np.load(f)),
        ("pickle", lambda o, f: pickle.dump(o, f), lambda f: pickle.load(f)),
    ):
        path = tmp / f"{mod}.bin"
        def by_path():
            if mod == "np":
                np.save(str(path), arr)
                return digest((tmp / f"{mod}.bin.npy").read_bytes()), value(torch.from_numpy(np.load(str(path) + ".npy")))
            with open(path, "wb") as fh:
                pickle.dump(arr, fh)
            with open(path, "rb") as fh:
                return digest(path.read_bytes()), value(torch.from_numpy(pickle.load(fh)))
        attempt(f"{mod} path", by_path)
        buf = io.BytesIO()
        attempt(f"{mod} bytesio", lambda: (save(arr, buf), buf.seek(0), value(torch.from_numpy(load(buf))), buf.tell()))
        def pipe():
            ret, data = through_pipe(lambda wf: save(arr, wf))
            return ret, digest(data), value(torch.from_numpy(load(io.BytesIO(data))))
        attempt(f"{mod} pipe", pipe)
        ns = Unseekable()
        attempt(f"{mod} unseekable", lambda: (save(arr, ns), value(torch.from_numpy(load(Unseekable(bytes(ns.out)))))))


def loader():
    from torch.utils.data import DataLoader
    dl = DataLoader([Odd(), Odd(), Odd()], batch_size=2, collate_fn=lambda b: b)
    attempt("loader", lambda: [len(b) for b in dl])


tmp = pathlib.Path(sys.argv[1])
tmp.mkdir()
buf, piped, unseekable = save_targets(tmp)
load_targets(tmp, buf, piped, unseekable)
dcp(tmp)
numpy_pickle(tmp)
loader()
'''


def test_save_and_load_matrix_is_identical_with_and_without_capture(tmp_path: Path, cli) -> None:
    (tmp_path / "job.py").write_text(JOB)
    for run in ("plain", "captured"):  # each its own cwd: the job's messages name "w/..."
        (tmp_path / run).mkdir()
    plain = run_plain("../job.py", "w", cwd=tmp_path / "plain")
    out = tmp_path / "trace"
    captured = cli(
        "capture",
        "--out",
        str(out),
        "--",
        sys.executable,
        "../job.py",
        "w",
        cwd=tmp_path / "captured",
    )
    assert captured.returncode == plain.returncode == 0, captured.stderr
    assert captured.stdout == plain.stdout  # every byte written, every value loaded
    lines = {m[1]: m[2] for m in re.finditer(r"(?m)^(.*?) (ok|raised) ", plain.stdout)}
    assert len(lines) == (27 if HAS_DCP else 23), plain.stdout
    for target in ("str", "path", "fileobj", "bytesio", "pipe", "unseekable"):
        assert lines[f"save {target}"] == "ok", plain.stdout
    for target in ("str", "path", "fileobj", "bytesio"):
        assert lines[f"load {target}"] == "ok", plain.stdout
    for target in ("path", "bytesio", "pipe", "unseekable"):
        assert lines[f"pickle {target}"] == "ok", plain.stdout
    # what torch or numpy itself refuses (a stream it cannot seek), it refuses the same under capture
    assert lines["load pipe"] == lines["load unseekable"] == "raised"
    assert lines["np pipe"] == lines["np unseekable"] == "raised"
    if HAS_DCP:
        for case in ("save", "load", "writer", "reader"):
            assert lines[f"dcp {case}"] == "ok", plain.stdout
    assert "loader ok [2, 1]" in plain.stdout
    # what the hooks could not record is counted, named in the summary and the manifest
    manifest = read_manifest(out)
    assert manifest is not None and manifest["status"] == "complete"
    misses = {(m["hook"], m["reason"]): m["count"] for m in manifest["hook_misses"]}
    # the pipe and the stream; DCP's own torch.save/torch.load calls are parts of its event
    assert misses.pop(("torch.save", "unseekable stream")) == 2
    assert misses.pop(("DataLoader.__next__", "error in the hook (RuntimeError)")) == 2
    assert misses == {}  # a call the job's torch refused is no miss: nothing was written or read
    assert "capture hook torch.save could not record" in captured.stderr
    assert "capture hook DataLoader.__next__ could not record 2 call(s)" in captured.stderr
    assert not list(out.glob("hook-misses-*"))  # summed into the manifest, then removed
    events = [
        json.loads(line)
        for f in out.glob("*.pfw.gz")
        for line in __import__("gzip").open(f, "rt")
        if line.startswith("{") and '"checkpoint"' in line
    ]
    work = tmp_path / "captured" / "w"
    saves = [e.get("args", {}) for e in events if e.get("name") == "capture"]
    sizes = {Path(a["path"]).name: a.get("bytes") for a in saves if "path" in a}
    assert sizes["a.pt"] == (work / "a.pt").stat().st_size
    assert sizes["c.pt"] == (work / "c.pt").stat().st_size
    # numpy and pickle are no checkpoint events (np.load is how datasets are read)
    named = {Path(e["args"]["path"]).name for e in events if "path" in e.get("args", {})}
    assert not named & {"np.bin.npy", "np.bin", "pickle.bin"}
    if HAS_DCP:  # one event per DCP call: the directory, and the bytes of every file in it
        for folder in ("dcp", "dcp2"):
            on_disk = sum(f.stat().st_size for f in (work / folder).iterdir())
            for kind in ("capture", "restart"):
                got = [
                    e["args"]
                    for e in events
                    if e["name"] == kind and e.get("args", {}).get("path") == str(work / folder)
                ]
                assert len(got) == 1 and got[0]["bytes"] == on_disk, (kind, folder, got)


class _Boom(Exception):
    pass


def _fake_torch(calls: list, fail: bool) -> types.ModuleType:
    mod = types.ModuleType("fake_torch")

    def save(obj, f, **kw):
        calls.append(("save", obj, f, kw))
        if fail:
            raise _Boom("disk full")
        return "saved"

    def load(f, **kw):
        calls.append(("load", f, kw))
        if fail:
            raise _Boom("corrupt")
        return {"x": 1}

    mod.save, mod.load = save, load
    checkpoint._patch_torch(mod)
    return mod


def test_a_hook_passes_the_originals_result_and_exception_through(monkeypatch) -> None:
    calls: list = []
    mod = _fake_torch(calls, fail=True)
    stream = types.SimpleNamespace(name=3)  # a name that is not a path, no tell()
    with pytest.raises(_Boom) as err:
        mod.save({"a": 1}, stream, pickle_protocol=2)
    assert str(err.value) == "disk full" and err.type is _Boom
    assert calls == [("save", {"a": 1}, stream, {"pickle_protocol": 2})]  # called once
    with pytest.raises(_Boom, match="corrupt"):
        mod.load(f=stream)
    assert len(calls) == 2

    # the hook's own code failing: the original still runs once, its result is the job's
    calls.clear()
    mod = _fake_torch(calls, fail=False)
    monkeypatch.setattr(hooks, "MISSES", hooks._Misses())
    broken = types.SimpleNamespace(
        tell=lambda: (_ for _ in ()).throw(io_error()), seekable=lambda: True
    )
    assert mod.save(1, broken) == "saved" and mod.load(broken) == {"x": 1}
    monkeypatch.setattr(checkpoint, "_Target", lambda f: 1 / 0)
    assert mod.save(2, "p.pt") == "saved" and mod.load("p.pt") == {"x": 1}
    assert len(calls) == 4
    assert hooks.MISSES.counts == {
        ("torch.save", "unseekable stream"): 1,
        ("torch.load", "unseekable stream"): 1,
        ("torch.save", "error in the hook (ZeroDivisionError)"): 1,
        ("torch.load", "error in the hook (ZeroDivisionError)"): 1,
    }


def io_error() -> OSError:
    import io

    return io.UnsupportedOperation("seek")


def test_a_dcp_hook_passes_results_and_exceptions_through(monkeypatch) -> None:
    """DCP's save/load hooks call the original once with the job's arguments; its result or its
    exception (DCP's CheckpointException is a BaseException) is the job's; torch.save calls made
    inside a DCP call are parts of its event, never misses of their own."""
    monkeypatch.setattr(hooks, "MISSES", hooks._Misses())
    calls: list = []

    class Stop(BaseException):
        pass

    def save(state, *, checkpoint_id=None, storage_writer=None):
        calls.append((state, checkpoint_id, storage_writer))
        inner_save({"t": 1}, types.SimpleNamespace(tell=lambda: 1 / 0))  # DCP's own stream
        if state == "bad":
            raise Stop("ranks failed")
        return "metadata"

    inner_save = checkpoint._wrap_checkpoint(lambda obj, f: None, "torch.save", "capture")
    wrapped = checkpoint._wrap_dcp(save, "dcp.save", "capture")
    assert wrapped("sd", checkpoint_id="ck") == "metadata"
    with pytest.raises(Stop, match="ranks failed"):
        wrapped("bad", storage_writer=types.SimpleNamespace(path="ck2"))
    assert [c[0] for c in calls] == ["sd", "bad"]
    # no FileSystemWriter reported bytes: the event has none (a miss); the inner save is none
    assert hooks.MISSES.counts == {("dcp.save", "unknown target"): 1}
    assert checkpoint._DCP.depth == 0
