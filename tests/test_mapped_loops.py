"""Loops without a DataLoader and memory-mapped data (#43 items 2, 3): real ``dlreplay capture``
runs of ``examples/tokens_memmap.py`` in two variants that differ in window size, windows per
step, validation interval and page cache (the second starts with its files evicted); steps
found from the ``steps`` hooks, windows from the ``mapped`` hooks, distilled into
``reader.mapped_access``; the second capture runs a DataLoader loop first in the same process,
whose steps must not be counted twice; the replay's windows fault in the pages they cover (the
mapping's resident set); ``analyze`` counts the mapped windows and pages faulted in as the
dataset's reads; and a third capture of numpy gathers and ``mmap.mmap`` reads records them with
the job's results unchanged."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.analysis import analyze_trace
from dlreplay.analyze.distill.mapped import mapped_access, mapped_events, mapped_summary
from dlreplay.analyze.findings import Thresholds, find
from dlreplay.analyze.report import write_report
from dlreplay.analyze.summary import render_text
from dlreplay.analyze.trace import vocabulary as voc
from dlreplay.model.sections import MappedAccess
from replay.mapped import take_windows, window_offsets

from .conftest import check_no_traceback

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tokens_memmap.py"

#: the two variants: (block tokens, windows per step, steps, eval interval, eval batches)
SMALL = (
    "--block",
    "64",
    "--batch",
    "4",
    "--steps",
    "6",
    "--eval-interval",
    "3",
    "--eval-iters",
    "2",
)
LARGE = (
    "--block",
    "512",
    "--batch",
    "2",
    "--steps",
    "4",
    "--eval-interval",
    "2",
    "--eval-iters",
    "1",
)
COMMON = ("--tokens", "200000", "--width", "16", "--quiet")

#: a DataLoader loop of DATALOADER_STEPS steps, then the example's LARGE loop, in one process
MIXED = textwrap.dedent(
    """
    import runpy, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(12, 4), torch.randn(12, 1)), batch_size=3)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sys.argv = [sys.argv[1], *sys.argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)
DATALOADER_STEPS = 4

#: Reads of a mapped file the slice hooks do not see: integer-array indexes of an np.memmap
#: (nanoGPT's gather form, a list, negative rows) and mmap.mmap slices and reads; prints a
#: digest of everything it got, which must be the same with and without capture
PROBE = textwrap.dedent(
    """
    import hashlib, mmap, pickle, sys
    import numpy as np
    path = sys.argv[1]
    h = hashlib.sha256()
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    ix = np.array([10, 5000, 90000])
    for got in (mm[ix[:, None] + np.arange(64)], mm[[3, 4, 5, 9]], mm[np.array([-2, -1])]):
        h.update(np.ascontiguousarray(got).tobytes())
        h.update(type(got).__name__.encode())
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        h.update(m[100:300])
        m.seek(1000)
        h.update(m.read(50))
        h.update(bytes([m[7]]))
        h.update(repr(m).encode() + type(m).__name__.encode() + str(isinstance(m, mmap.mmap)).encode())
        try:
            pickle.dumps(m)
        except TypeError as exc:
            h.update(str(exc).encode())
        m.close()
    print(h.hexdigest())
    """
)
#: (file offset, bytes) of each window PROBE takes, in order
PROBE_WINDOWS = [(2 * r, 128) for r in (10, 5000, 90000)] + [(6, 6), (18, 2)]
PROBE_WINDOWS += [(2 * (200_000 - 2), 4), (100, 200), (1000, 50)]


def _drop_pages(folder: Path) -> None:
    """Evict the token files under *folder* from the page cache (written back first)."""
    for f in folder.glob("*.bin"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _capture(out: Path, data: Path, args: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dlreplay", "capture", "--out", str(out), "--data-dir", str(data)]
    return subprocess.Popen(
        [*cmd, "--", sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both captures, run at once (each variant's own token files)."""
    root = tmp_path_factory.mktemp("mapped")
    script = root / "mixed.py"
    script.write_text(MIXED)
    runs = {
        "small": [str(EXAMPLE), "--data-dir", str(root / "d_small"), *SMALL, *COMMON],
        "mixed": [str(script), str(EXAMPLE), "--data-dir", str(root / "d_large"), *LARGE, *COMMON],
    }
    for name, args in runs.items():  # the token files first: not part of the captured loop
        example_args = args[1:] if name == "mixed" else args
        subprocess.run([sys.executable, *example_args, "--generate-only"], check=True)
    _drop_pages(root / "d_large")  # the mixed run starts cold, the small one warm
    probe = root / "probe.py"
    probe.write_text(PROBE)
    runs["probe"] = [str(probe), str(root / "d_small" / "train.bin")]
    procs = {
        name: _capture(
            root / f"t_{name}", root / ("d_small" if name != "mixed" else "d_large"), args
        )
        for name, args in runs.items()
    }
    outs = {}
    for name, p in procs.items():
        outs[name], _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"{name}: {outs[name]}"
        check_no_traceback(outs[name], what=f"capture ({name})")
    plain = subprocess.run(
        [sys.executable, *runs["probe"]], capture_output=True, text=True, check=True
    )
    (root / "probe.plain").write_text(plain.stdout)
    (root / "probe.captured").write_text(outs["probe"])
    return {name: root / f"t_{name}" for name in runs} | {"root": root}


def _events(trace: Path) -> pl.DataFrame:
    return voc.ensure_roles(load_trace(trace).events)


def test_steps_found_without_a_dataloader(captures: dict[str, Path]) -> None:
    ev = _events(captures["small"])
    steps = voc.training_steps(ev)
    assert steps.height == 6
    assert set(steps["basis"]) == {"compute events"}
    assert (steps["compute_us"] > 0).all()
    # the steps' data time: from the previous optimizer step to the next forward
    assert (steps["wait_us"].tail(5) > 0).all()
    evaluate = ev.filter(pl.col("role") == voc.EVALUATE)
    assert evaluate.height == 2  # after steps 3 and 6
    assert ev.filter(pl.col("role") == voc.BACKWARD).height == 6


def test_no_steps_counted_twice_in_a_dataloader_loop(captures: dict[str, Path]) -> None:
    ev = _events(captures["mixed"])
    epoch = ev.filter(pl.col("role") == voc.EPOCH)
    assert epoch.height == 1
    e0, e1 = epoch["ts"][0], epoch["ts"][0] + epoch["dur"][0]
    bodies = ev.filter(pl.col("role") == voc.STEP)
    compute = ev.filter(pl.col("role") == voc.COMPUTE)
    assert bodies.height == DATALOADER_STEPS
    # the DataLoader's steps are its hooks' alone; the steps hooks mark the later loop only
    assert compute.filter((pl.col("ts") >= e0) & (pl.col("ts") < e1)).height == 0
    assert compute.height == 4
    assert ev.filter(pl.col("role") == voc.BACKWARD)["ts"].min() > e1


@pytest.mark.parametrize(
    ("name", "block", "batch", "steps", "every", "eval_batches"),
    [("small", 64, 4, 6, 3, 2), ("mixed", 512, 2, 4, 2, 1)],
)
def test_mapped_windows_distilled(
    captures: dict[str, Path],
    name: str,
    block: int,
    batch: int,
    steps: int,
    every: int,
    eval_batches: int,
) -> None:
    trace = captures[name]
    ev = _events(trace)
    if name == "mixed":  # the example's loop, after the DataLoader's epoch
        epoch = ev.filter(pl.col("role") == voc.EPOCH)
        ev = ev.filter(pl.col("ts") > epoch["ts"][0] + epoch["dur"][0])
    mapped = mapped_events(trace)
    windows = mapped.filter(pl.col("name") == "io.window")
    # input and target of each sample: 2 slices of block tokens (uint16), one token apart
    assert set(windows["bytes"]) == {2 * block}
    n_eval = (steps // every) * eval_batches
    assert windows.height == 2 * batch * (steps + n_eval)
    assert (windows["offset"] % 2 == 0).all()
    access = mapped_access(mapped, ev)
    assert access is not None
    assert access.window_bytes == 2 * (block + 1)
    assert access.slices_per_window == 2 and access.slice_bytes == 2 * block
    assert access.windows_per_step == batch
    assert access.offsets == "uniform" and access.map_per_step
    assert access.file_bytes == 2 * 200_000
    assert access.eval_file_bytes == 2 * 20_000
    assert access.eval_every_steps == every and access.eval_steps == eval_batches
    assert access.eval_windows_per_step == batch
    summary = mapped_summary(trace)
    assert summary is not None and summary["files"] == 2
    assert summary["bytes"] == int(windows["bytes"].sum())


def _resident_kib(path: Path) -> int:
    """This process's resident KiB of its mappings of *path* (``/proc/self/smaps`` Rss)."""
    text = Path("/proc/self/smaps").read_text()
    total = 0
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        if block.split("\n", 1)[0].endswith(str(path)):
            m = re.search(r"^Rss:\s+(\d+) kB", block, re.M)
            total += int(m.group(1)) if m else 0
    return total


SIZE = 64 << 20  #: bytes of the replay test's file


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc/self/smaps")
@pytest.mark.parametrize(("window", "slices", "n"), [(258, 2, 8), (4098, 2, 3)])
def test_replay_windows_fault_in_their_pages(
    tmp_path: Path, window: int, slices: int, n: int
) -> None:
    path = tmp_path / "tokens.bin"
    np.full(SIZE, 7, dtype=np.uint8).tofile(path)
    access = MappedAccess(
        file_bytes=SIZE,
        window_bytes=window,
        windows_per_step=n,
        slices_per_window=slices,
        slice_bytes=window - 2,
    )
    page = os.sysconf("SC_PAGE_SIZE")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    assert _resident_kib(path) == 0  # nothing touched yet
    taken = take_windows(mm, access, n, np.random.default_rng(7))
    offsets = window_offsets(access, SIZE, n, np.random.default_rng(7))
    assert taken == n * slices * (window - 2)
    pages = {p for o in offsets for p in range(int(o) // page, (int(o) + window - 1) // page + 1)}
    resident = _resident_kib(path) * 1024
    # every page a slice covers is mapped in; a fault maps the cached pages around it too (fault
    # around, a large folio: at most 2 MiB a page), far less than the file
    assert len(pages) * page <= resident <= len(pages) * (2 << 20) < SIZE
    del mm


def test_gathers_and_mmap_reads_recorded_transparently(captures: dict[str, Path]) -> None:
    root = captures["root"]
    digest = re.compile(r"^[0-9a-f]{64}$", re.M)
    plain = digest.findall((root / "probe.plain").read_text())
    assert len(plain) == 1 and digest.findall((root / "probe.captured").read_text()) == plain
    mapped = mapped_events(captures["probe"])
    windows = mapped.filter(pl.col("name") == "io.window")
    assert sorted(zip(windows["offset"], windows["bytes"], strict=True)) == sorted(PROBE_WINDOWS)
    maps = mapped.filter(pl.col("name") == "io.mmap")  # the np.memmap's, the mmap.mmap's
    assert maps.height == 2 and set(maps["bytes"]) == {2 * 200_000}
    assert windows["cold"].null_count() == 0
    manifest = json.loads((captures["probe"] / "manifest.json").read_text())
    assert manifest["hook_misses"] == []


@pytest.mark.parametrize(
    ("name", "block", "batch", "steps", "every", "eval_batches", "cold"),
    [("small", 64, 4, 6, 3, 2, False), ("mixed", 512, 2, 4, 2, 1, True)],
)
def test_analyze_counts_mapped_reads(
    captures: dict[str, Path],
    tmp_path: Path,
    name: str,
    block: int,
    batch: int,
    steps: int,
    every: int,
    eval_batches: int,
    cold: bool,
) -> None:
    report = analyze_trace(captures[name])
    m = report.characterization["mapped"]
    n_eval = (steps // every) * eval_batches
    assert m["files"] == 2 and m["file_bytes"] == 2 * 220_000
    assert m["windows"] == 2 * batch * (steps + n_eval) and m["eval_windows"] == 2 * batch * n_eval
    assert m["bytes_touched"] == m["windows"] * 2 * block
    assert m["steps_with_windows"] == steps and m["slices_per_step"] == 2 * batch
    assert m["windows_per_step"] == batch and m["window_bytes"] == 2 * (block + 1)
    assert m["data_time_s"] is not None and m["data_time_s"] > 0
    ids = {f.id for f in report.findings}
    assert "too-few-workers" not in ids or name == "mixed"  # a DataLoader only in the mixed run
    if cold:  # its files dropped from the page cache before the capture
        assert m["cold_bytes"] > 0 and m["cold_steps"] >= 1 and "mapped-page-cache" not in ids
        assert m["files_cold_at_start"] >= 1
        stall = {f.id for f in find(report.characterization, Thresholds(mapped_stall_share=0.0))}
        assert ("mapped-storage-stall" in stall) == (m["stall_s"] > 0)
    else:
        assert m["cold_bytes"] == 0 and m["cold_steps"] == 0 and "mapped-page-cache" in ids
        assert m["files_cold_at_start"] == 0
    text = render_text(report.characterization.view.summary)
    assert "Mapped data: 2 file(s)" in text and "no dataset reads found" not in text
    for suffix in ("md", "html"):
        page = write_report(report, tmp_path / f"report.{suffix}").read_text()
        assert "mapped data" in page and "faulted in from storage" in page


MAPPED_POSIX = Path(__file__).resolve().parents[1] / "traces" / "mapped_posix"


@pytest.mark.parametrize("name", ["tokens_a", "tokens_b"])
def test_a_mapped_loop_from_posix_calls_alone(name: str) -> None:
    """DFTracer's POSIX calls alone (committed captures, traces/make_mapped_traces.py): a loop
    that maps its token file every batch is one pass of steps (one map each), with validation
    passes (bursts of maps of the other file) and the files' sizes (from the capture's
    fingerprint: the token files are not at hand here); the windows are not in such a trace,
    and distill says so. It was 'N epochs of 1 sample' with no compute: a replay of no time.
    The two differ in steps, validation interval and batches, and file sizes."""
    from dlreplay.analyze.distill import distill

    truth = json.loads((MAPPED_POSIX / name / "expected.json").read_text())["truth"]
    loaded = load_trace(MAPPED_POSIX / name)
    model = distill(loaded.events, manifest=loaded.manifest, source=str(MAPPED_POSIX / name))
    access = model.reader.mapped_access
    assert access is not None
    assert model.train.epochs == 1 and model.train.steps_per_epoch == truth["steps"]
    assert access.map_per_step and access.window_bytes == 0  # not in the trace: none kept
    assert (access.file_bytes, access.eval_file_bytes) == (
        truth["file_bytes"],
        truth["eval_file_bytes"],
    )
    assert (access.eval_every_steps, access.eval_steps) == (
        truth["eval_every_steps"],
        truth["eval_steps"],
    )
    assert (model.train.computation_time.mean or 0) > 0
    fields = model.provenance.fields
    assert fields["train.computation_time"].confidence == "default"
    assert "not in such a trace" in fields["reader.mapped_access"].method
