"""numpy's reads and writes through a duplicated descriptor, which DFTracer does not see,
recovered from their seek trails (``analyze/trace/hidden.py``).

One real capture (DFTracer's preload, POSIX calls alone) of a script that writes and reads
arrays the ways jobs do: ``np.save``/``np.load`` of two sizes and two dtypes, ``tofile`` and
``np.fromfile`` on a file object after a header of its own, ``np.fromfile`` on a path, and
``torch.save``/``torch.load`` (PyTorch's zip reader seeks too, and is no trail). The trace
alone shows each ``.npy`` read as one 4 KiB buffer refill; with the trails each transfer is
there with its bytes.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze.trace.hidden import RECOVERED, UNRECOVERED, recover_hidden, recovered_note
from dlreplay.analyze.trace.load import load_trace

JOB = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch

    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    arrays = {
        "big.npy": np.arange(300_000, dtype=np.float32),       # 1.2 MB
        "small.npy": np.arange(9_000, dtype=np.int16),        # 18 kB
    }
    for name, a in arrays.items():
        np.save(os.path.join(d, name), a)
    # a format of its own: a 16-byte header written and read through the file object, then
    # the array by tofile / fromfile
    raw = np.arange(50_000, dtype=np.float64)
    with open(os.path.join(d, "own.bin"), "wb") as f:
        f.write(b"HEADER0123456789")
        raw.tofile(f)
    torch.save(torch.arange(40_000, dtype=torch.float32), os.path.join(d, "t.pt"))
    total = 0.0
    for epoch in range(2):
        for name in arrays:
            total += float(np.load(os.path.join(d, name)).sum())
        with open(os.path.join(d, "own.bin"), "rb") as f:
            assert f.read(16) == b"HEADER0123456789"
            total += float(np.fromfile(f, dtype=np.float64, count=50_000).sum())
        total += float(torch.load(os.path.join(d, "t.pt")).sum())
    total += float(np.fromfile(os.path.join(d, "big.npy"), dtype=np.uint8).sum())
    sizes = {n: int(a.nbytes) for n, a in arrays.items()}
    sizes["own.bin"] = int(raw.nbytes)
    print(json.dumps(sizes))
    """
)


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> tuple[Path, dict[str, int], str]:
    from .conftest import run_cli

    root = tmp_path_factory.mktemp("hidden")
    (root / "job.py").write_text(JOB)
    data = root / "data"
    proc = run_cli(
        "capture",
        "--no-loader-hooks",
        "--data-dir",
        str(data),
        "-o",
        str(root / "trace"),
        "--",
        sys.executable,
        str(root / "job.py"),
        str(data),
        cwd=root,
        check=True,
    )
    return root / "trace", json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _calls(trace: Path) -> pl.DataFrame:
    ev = load_trace(trace).events
    return ev.filter(pl.col("file").is_not_null()).with_columns(
        pl.col("file").cast(pl.String).str.split("/").list.last().alias("f"),
        pl.col("name").cast(pl.String).alias("op"),
    )


def test_each_array_transfer_is_recovered_with_its_bytes(capture) -> None:
    trace, sizes, _ = capture
    ev = _calls(trace)
    got = ev.filter(pl.col("op").is_in(["fread", "fwrite"]))
    reads = got.filter(pl.col("op") == "fread")
    writes = got.filter(pl.col("op") == "fwrite")
    # np.save: the array after its header, exactly; tofile after 16 bytes of header
    for name in ("big.npy", "small.npy"):
        w = writes.filter(pl.col("f") == name)
        assert w["size"].to_list() == [sizes[name]], name
        r = reads.filter(pl.col("f") == name)
        # np.load, both epochs: the array, read again from the buffer refill's start (over
        # by the header's bytes at most: 128 for these)
        assert r.height == 2, name
        assert all(0 <= s - sizes[name] <= 128 for s in r["size"].to_list()), r
        assert r["offset"].to_list() == [0, 0]
    own_w = writes.filter(pl.col("f") == "own.bin")
    assert own_w.select("size", "offset").rows() == [(sizes["own.bin"], 16)]
    own_r = reads.filter(pl.col("f") == "own.bin")
    assert own_r.height == 2 and all(
        0 <= s - sizes["own.bin"] <= 16 for s in own_r["size"].to_list()
    ), own_r
    # torch's zip reader seeks (a tell twice, then the end): no trail
    assert got.filter(pl.col("f") == "t.pt").height == 0
    # every recovered row is in ts order and timed inside its trail
    assert ev["ts"].is_sorted()
    assert (got["dur"] >= 0).all()


def test_the_trace_says_what_was_recovered_and_what_could_not_be(capture, cli) -> None:
    trace, _, said = capture
    lt = load_trace(trace)
    notes = [p for f in lt.files for p in f.problems]
    assert any(p.endswith(RECOVERED) for p in notes), notes
    # np.fromfile(path): its file opened and read by numpy alone, direction unknown
    assert any(p.endswith(UNRECOVERED) and p.startswith("1 ") for p in notes), notes
    assert not lt.damaged  # a note, not damage
    note = recovered_note(lt.files)
    assert note and "9 numpy array transfer(s)" in note and "1 more" in note, note
    out = cli("analyze", str(trace), check=True).stdout
    assert "note: 9 numpy array transfer(s)" in out
    assert "note: 9 numpy array transfer(s)" in said  # the capture's own summary


def test_without_the_trails_the_reads_are_the_buffer_refills(capture) -> None:
    """The premise: DFTracer's own calls on a ``.npy`` are 4 KiB-sized refills, far below the
    array (the test above would pass on a trace that had the reads)."""
    trace, sizes, _ = capture
    ev = _calls(trace)
    seen = ev.filter(pl.col("op") == "read", pl.col("f") == "big.npy")["size"].sum()
    assert seen < sizes["big.npy"] / 10


def test_dlio_npy_samples_are_read_whole(cli, tmp_path: Path) -> None:
    """DLIO 2.0.0's NPY reader (``np.load`` a sample; pydftracer 1.x names files by path):
    every sample's array is read, once an epoch, with the record's bytes; distill and compare
    see them (the trace alone: 32 reads of 4 KiB for 12 MiB of samples)."""
    import yaml

    trace = Path(__file__).parent.parent / "traces" / "dlio_npy_small"
    exp = json.loads((trace / "expected.json").read_text())["model"]
    ev = _calls(trace)
    got = ev.filter(pl.col("op") == "fread")
    assert got.height == exp["num_files"] * exp["epochs"]
    assert got["f"].n_unique() == exp["num_files"]
    assert all(abs(s - exp["record_length"]) <= 1024 for s in got["size"].to_list()), got
    model = tmp_path / "model.yaml"
    out = cli("distill", str(trace), "-o", str(model), check=True)
    m = yaml.safe_load(model.read_text())
    assert "384.0 KiB" in out.stdout
    assert "note: 32 numpy array transfer(s)" in out.stdout
    # (the whole file: the header read again with the array, 41 bytes past DLIO's record)
    assert abs(m["dataset"]["record_length"]["mean"] - exp["record_length"]) <= 1024, m["dataset"]


def test_a_trail_past_what_a_call_can_move_is_not_recovered(capture) -> None:
    """A seek to 2^62 (a damaged or hand-made trace) makes no exabyte read: the loader's bound
    on one call's bytes (1 TiB) holds for what it adds too."""
    trace, sizes, _ = capture
    ev = load_trace(trace).events.filter(~pl.col("name").cast(pl.String).is_in(["fread", "fwrite"]))
    big = pl.col("ret") > sizes["small.npy"]
    far = ev.with_columns(
        pl.when(big).then(pl.lit(1 << 62)).otherwise(pl.col(c)).alias(c) for c in ("ret", "offset")
    )
    out, _ = recover_hidden(ev)
    assert out.height > ev.height  # (the premise: the same table's trails, as they were)
    out, notes = recover_hidden(far)
    got = out.filter(pl.col("name").cast(pl.String).is_in(["fread", "fwrite"]))
    assert (got["size"] <= 1 << 40).all(), got


def test_two_threads_loading_one_file_at_once_each_keep_their_trail(capture) -> None:
    """Two threads of one process that ``np.load`` the same file at the same time interleave
    their calls on it; each trail is one thread's. Built from the capture's own rows: its two
    loads of big.npy, the second given to another thread and interleaved call by call."""
    trace, sizes, _ = capture
    ev = load_trace(trace).events.filter(~pl.col("name").cast(pl.String).is_in(["fread", "fwrite"]))
    big = ev.filter(pl.col("file").cast(pl.String).str.ends_with("/big.npy"))
    visit = (pl.col("name").cast(pl.String).str.starts_with("open")).cum_sum().alias("visit")
    big = big.with_columns(visit)
    a, b = (big.filter(pl.col("visit") == k).drop("visit") for k in (2, 3))  # the two np.load
    assert a.height == b.height and a["name"].to_list() == b["name"].to_list()
    t0 = int(a["ts"][0])
    a = a.with_columns((t0 + 2 * pl.int_range(pl.len())).alias("ts"), pl.lit(0).alias("dur"))
    b = b.with_columns(
        (t0 + 2 * pl.int_range(pl.len()) + 1).alias("ts"),
        pl.lit(0).alias("dur"),
        (pl.col("tid") + 1).alias("tid"),
    )
    both = pl.concat([a, b]).sort("ts")
    # (the premise: in the process's calls on the file the two loads alternate)
    assert both["tid"].to_list()[:4] == [a["tid"][0], b["tid"][0]] * 2
    out, _ = recover_hidden(both)
    got = out.filter(pl.col("name").cast(pl.String) == "fread")
    assert sorted(got["tid"].to_list()) == sorted([a["tid"][0], b["tid"][0]])
    assert all(0 <= s - sizes["big.npy"] <= 128 for s in got["size"].to_list()), got


def test_tables_without_trails_are_returned_as_they_are() -> None:
    lt = load_trace(Path(__file__).parent.parent / "traces" / "npz_fork")
    out, notes = recover_hidden(lt.events)
    assert out is lt.events and notes == {}
