"""Side files (``dataset.side_files``, #44): files in the data folder that a job reads outside
its samples (a marker, a label list, a metadata file) are distilled with their size, read calls
and opens, written by ``generate`` and read by the replay as the job read them.

Real ``dlreplay capture --no-loader-hooks`` runs (DFTracer's preload alone) of a small loop in
two variants that differ in each inferred parameter: a side file's size, its read calls (whole
in one call, or in 1 KiB chunks), its opens per reading (1 or 2) and when it is read (once at
the start, or at every epoch).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.compare import compare_traces
from dlreplay.analyze.distill import distill
from dlreplay.model import SideFile, WorkloadModel
from dlreplay.replay import ReplayConfig, run_replay

from .conftest import check_no_traceback

#: the job: reads side files as its arguments say, then epochs of batches of whole sample files
JOB = textwrap.dedent(
    """
    import argparse, os, time

    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--start", action="append", default=[])  # NAME:OPENS, read whole at once
    ap.add_argument("--each-epoch", action="append", default=[])  # NAME, read in 1 KiB chunks
    a = ap.parse_args()

    def whole(path):
        with open(path, "rb") as f:
            return f.read()

    def chunks(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            while os.read(fd, 1024):
                pass
        finally:
            os.close(fd)

    for spec in a.start:
        name, opens = spec.split(":")
        for _ in range(int(opens)):
            whole(os.path.join(a.data, name))
    files = sorted(os.listdir(os.path.join(a.data, "train")))
    for epoch in range(a.epochs):
        for name in a.each_epoch:
            chunks(os.path.join(a.data, name))
        for b in range(0, len(files), 4):
            for name in files[b : b + 4]:
                whole(os.path.join(a.data, "train", name))
            time.sleep(0.01)  # the step's compute
    """
)

#: variant: (side files and their sizes, job arguments, the side files distill must find)
VARIANTS = {
    # read whole: Python asks for one byte more than the size, then one more to find the end
    "marker_and_labels": (
        {".done": 300, "labels.csv": 5000},
        ["--epochs", "3", "--start", ".done:1", "--each-epoch", "labels.csv"],
        [
            SideFile(path=".done", size=300, reads=[[301, 1], [1, 1]], visits=1, when="start"),
            # 1 KiB chunks to the end: 5 full or partial reads and the one that finds the end
            SideFile(path="labels.csv", size=5000, reads=[[1024, 6]], visits=1, when="epoch"),
        ],
    ),
    "metadata_twice": (
        {"meta/info.json": 2000},
        ["--epochs", "2", "--start", "meta/info.json:2"],
        [
            SideFile(
                path="meta/info.json", size=2000, reads=[[2001, 1], [1, 1]], visits=2, when="start"
            )
        ],
    ),
}


def _dataset(root: Path, side: dict[str, int]) -> Path:
    data = root / "data"
    (data / "train").mkdir(parents=True)
    for i in range(16):
        (data / "train" / f"s{i:02d}.dat").write_bytes(bytes([i]) * 4096)
    for name, size in side.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes(b"x" * size)
    return data


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each variant captured (both at once): {variant: (trace dir, data dir)}."""
    root = tmp_path_factory.mktemp("side")
    script = root / "job.py"
    script.write_text(JOB)
    procs, out = {}, {}
    for name, (side, args, _) in VARIANTS.items():
        data = _dataset(root / name, side)
        trace = root / name / "trace"
        cmd = [sys.executable, "-m", "dlreplay", "capture", "--no-loader-hooks"]
        cmd += ["--out", str(trace), "--data-dir", str(data), "--", sys.executable, str(script)]
        procs[name] = subprocess.Popen(
            [*cmd, str(data), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        out[name] = (trace, data)
    for name, p in procs.items():
        text, _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"{name}: {text}"
        check_no_traceback(text, what=f"capture ({name})")
    return out


def _model(trace: Path) -> WorkloadModel:
    lt = load_trace(trace)
    return distill(lt.events, manifest=lt.manifest, source=str(trace))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_side_files_distilled(captures: dict[str, tuple[Path, Path]], variant: str) -> None:
    m = _model(captures[variant][0])
    assert m.dataset.num_files == 16  # the side files are not samples
    assert m.dataset.side_files == VARIANTS[variant][2]
    assert m.provenance.fields["dataset.side_files"].confidence == "measured"


def _opens(trace: Path, data: Path) -> dict[str, int]:
    """Opens per file of the data folder, by path relative to it (dlreplay's own left out)."""
    ev = load_trace(trace).events.with_columns(pl.col("file").cast(pl.String))
    root = str(data.resolve()) + "/"
    opens = ev.filter(
        pl.col("name").cast(pl.String).is_in(["open", "open64", "openat", "fopen", "fopen64"])
        & pl.col("file").str.starts_with(root)
        & ~pl.col("file").str.contains(r"/\.dlreplay-")
    )
    return {f.removeprefix(root): n for f, n in opens.group_by("file").len().iter_rows()}


def test_replay_reads_the_side_files_as_the_job_did(
    captures: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """generate writes each side file at its size; the traced replay opens it as often as the
    job did (labels.csv at each of 3 epochs); compare counts the same files on both sides."""
    trace, data = captures["marker_and_labels"]
    model = _model(trace)
    out, replay_data = tmp_path / "replay", tmp_path / "replay-data"
    run_replay(ReplayConfig(model=model, data_dir=replay_data, out=out), echo=None)
    assert (replay_data / ".done").stat().st_size == 300
    assert (replay_data / "labels.csv").stat().st_size == 5000
    job, replayed = _opens(trace, data), _opens(out, replay_data)
    assert job[".done"] == replayed[".done"] == 1
    assert job["labels.csv"] == replayed["labels.csv"] == 3
    cmp = compare_traces(trace, out, data_dirs_a=[str(data)])
    assert cmp.features_a["files"] == cmp.features_b["files"] == 18
    assert cmp.features_a["read_size_max"] == cmp.features_b["read_size_max"]


def test_side_file_paths_stay_in_the_data_folder() -> None:
    """A model's side file cannot name a path outside the data folder, nor dlreplay's own."""
    from dlreplay.errors import ModelError

    for bad in ("../etc/passwd", "/etc/passwd", "a/../../b", ".dlreplay-dataset.json", ""):
        with pytest.raises(ModelError):
            SideFile(path=bad, size=1)
