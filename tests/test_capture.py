"""dlreplay capture: real DFTracer runs of small real jobs (no mocks)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from dlreplay.capture import CaptureConfig, data_dir_spellings, read_manifest, run_capture
from dlreplay.errors import ArtifactVersionError, CaptureError, UsageError

from .conftest import check_no_traceback

READER = """
import os, sys
paths = sorted(os.listdir("data"))
total = 0
for p in paths:
    with open(os.path.join("data", p), "rb", buffering=0) as f:
        while True:
            b = f.read(65536)
            if not b:
                break
            total += len(b)
print(total)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def _events(trace_dir: Path) -> list[dict]:
    out = []
    for f in sorted(trace_dir.glob("*.pfw.gz")):
        if f.stat().st_size == 0:
            continue
        with gzip.open(f, "rt") as fh:
            for line in fh:
                line = line.strip()
                if line.startswith("{"):
                    out.append(json.loads(line))
    return out


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    for i in range(3):
        (tmp_path / "data" / f"s{i}.bin").write_bytes(os.urandom(100_000 + i))
    (tmp_path / "job.py").write_text(READER)
    return tmp_path


def test_capture_records_reads_and_manifest(job_dir: Path) -> None:
    out = job_dir / "trace"
    result = run_capture(
        CaptureConfig(command=(sys.executable, "job.py"), out=out, data_dirs=("data",), cwd=job_dir)
    )
    assert result.exit_code == 0 and result.status == "complete"
    manifest = read_manifest(out)
    assert manifest is not None
    assert manifest["schema"] == "dlreplay.trace" and manifest["format_version"] == 1
    assert manifest["command"] == [sys.executable, "job.py"]
    assert manifest["versions"]["dftracer"]
    assert manifest["mem_total_bytes"] > 1 << 30 and manifest["cpus"] >= 1
    # the accelerators' device nodes the job could use, as this host has them
    from dlreplay.osutil import accelerator_nodes

    assert manifest["accelerators"] == accelerator_nodes()
    assert manifest["events"] == sum(f["events"] for f in manifest["files"]) > 0
    # Relative data dir spelled the way the job opens files ("data/s0.bin").
    assert "data" in manifest["env"]["DFTRACER_DATA_DIR"].split(":")
    events = _events(out)
    fh = {e["args"]["value"]: e["args"]["name"] for e in events if e.get("name") == "FH"}
    read_bytes = sum(
        e["args"]["ret"]
        for e in events
        if e.get("cat") == "POSIX"
        and e["name"] == "read"
        and fh.get(e["args"].get("fhash"), "").startswith("data/")
    )
    assert read_bytes == 300_003  # every byte of the three files, once


def test_exit_code_is_propagated_and_trace_kept(job_dir: Path) -> None:
    result = run_capture(
        CaptureConfig(
            command=(sys.executable, "job.py", "3"),
            out=job_dir / "t",
            data_dirs=("data",),
            cwd=job_dir,
        )
    )
    assert result.exit_code == 3 and result.status == "failed"
    manifest = read_manifest(job_dir / "t")
    assert manifest["status"] == "failed" and manifest["exit_code"] == 3
    assert manifest["events"] > 0


def test_cli_exit_code_and_summary(job_dir: Path, cli) -> None:
    proc = cli(
        "capture",
        "--out",
        str(job_dir / "t"),
        "--data-dir",
        "data",
        "--",
        sys.executable,
        "job.py",
        "5",
        cwd=job_dir,
    )
    assert proc.returncode == 5
    assert "capture failed (exit code 5)" in proc.stderr
    assert "next: dlreplay analyze" in proc.stderr


def test_refuses_non_empty_out_without_force(job_dir: Path) -> None:
    out = job_dir / "t"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(CaptureError, match="not empty"):
        run_capture(CaptureConfig(command=(sys.executable, "job.py"), out=out, cwd=job_dir))
    # --force replaces a previous capture only (issue #45): never a directory that holds none
    with pytest.raises(CaptureError, match="holds no dlreplay capture"):
        run_capture(
            CaptureConfig(command=(sys.executable, "job.py"), out=out, cwd=job_dir, force=True)
        )
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    (out / "notes.txt").unlink()
    run_capture(CaptureConfig(command=(sys.executable, "job.py"), out=out, cwd=job_dir))
    (out / "notes.txt").write_text("mine")
    # --force replaces capture files only; the user's file stays.
    run_capture(CaptureConfig(command=(sys.executable, "job.py"), out=out, cwd=job_dir, force=True))
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "manifest.json").is_file()


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        run_capture(CaptureConfig(command=(), out=tmp_path / "t"))
    with pytest.raises(CaptureError, match="command not found"):
        run_capture(CaptureConfig(command=("no-such-program-xyz",), out=tmp_path / "t2"))


def test_data_dir_spellings(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    spellings = data_dir_spellings(["d"], tmp_path)
    assert str(tmp_path / "d") in spellings
    assert "d" in spellings and "./d" in spellings
    spellings = data_dir_spellings([str(tmp_path / "d")], tmp_path)
    assert "d" in spellings


def test_manifest_version_mismatch_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(
        json.dumps({"schema": "dlreplay.trace", "format_version": 99})
    )
    with pytest.raises(ArtifactVersionError, match="format_version 99"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ArtifactVersionError, match="schema"):
        read_manifest(tmp_path)


SLOW_JOB = """
import os, time
for i in range(400):
    with open("data/s0.bin", "rb") as f:
        f.read()
    time.sleep(0.01)
"""


def test_sigterm_is_forwarded_trace_marked_interrupted(job_dir: Path) -> None:
    (job_dir / "slow.py").write_text(SLOW_JOB)
    out = job_dir / "t"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlreplay",
            "capture",
            "-q",
            "--out",
            str(out),
            "--data-dir",
            "data",
            "--",
            sys.executable,
            "slow.py",
        ],
        cwd=job_dir,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Wait until the job runs (the manifest says so), then a little for it to do I/O.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = out / "manifest.json"
        if m.is_file() and json.loads(m.read_text()).get("status") == "running":
            break
        time.sleep(0.1)
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    rc = proc.returncode
    check_no_traceback(err)
    manifest = read_manifest(out)
    assert manifest["status"] == "interrupted"
    assert rc == 128 + signal.SIGTERM == manifest["exit_code"]
    # The job's SIGTERM handler (installed by the injection) flushed its events.
    assert manifest["events"] > 0


TORCH_JOB = """
import sys, numpy as np, torch
from torch.utils.data import Dataset, DataLoader

class DS(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        with open(f"data/s{i % 3}.bin", "rb", buffering=0) as f:
            # a sample of three tensors once collated: the size, the index, a mask
            return torch.tensor(len(f.read())), {"index": i, "mask": torch.zeros(2)}

if __name__ == "__main__":
    dl = DataLoader(DS(), batch_size=3, num_workers=2, multiprocessing_context=sys.argv[1])
    for epoch in range(2):
        for batch in dl:
            pass
    torch.save({"w": torch.zeros(50_000)}, "ckpt.pt")
"""


@pytest.mark.slow
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_torch_dataloader_events_in_fork_and_spawn_workers(job_dir: Path, ctx: str) -> None:
    (job_dir / "tjob.py").write_text(TORCH_JOB)
    out = job_dir / f"t-{ctx}"
    result = run_capture(
        CaptureConfig(
            command=(sys.executable, "tjob.py", ctx),
            out=out,
            data_dirs=("data", "ckpt.pt"),
            cwd=job_dir,
        )
    )
    assert result.exit_code == 0, result
    events = [e for e in _events(out) if "ts" in e]
    by_name: dict[tuple[str, str], list[dict]] = {}
    for e in events:
        by_name.setdefault((e["cat"], e["name"]), []).append(e)
    items = by_name[("data", "item")]
    assert len(items) == 16  # 8 samples x 2 epochs
    assert sorted(e["args"]["image_idx"] for e in items) == sorted(list(range(8)) * 2)
    # DFTracer's AI conventions: fetch.iter (the wait), fetch.block (the step), fetch.stop (the end)
    main_pid = {e["pid"] for e in by_name[("dataloader", "fetch.iter")]}
    assert len(main_pid) == 1
    worker_pids = {e["pid"] for e in items}
    assert len(worker_pids) == 4 and not (
        worker_pids & main_pid
    )  # 2 workers per epoch, not persistent
    fetches = by_name[("dataloader", "fetch.iter")]
    assert len(fetches) == 6  # ceil(8/3) = 3 batches x 2 epochs
    assert sorted(e["args"]["batch_size"] for e in fetches) == [2, 2, 3, 3, 3, 3]
    assert all(e["args"]["tensors"] == 3 for e in fetches)  # each a worker -> main handover
    assert sorted((e["args"]["epoch"], e["args"]["step"], e["args"]["count"]) for e in fetches) == [
        (ep, k, k + 1) for ep in (0, 1) for k in range(3)
    ]
    assert len(by_name[("dataloader", "fetch.stop")]) == 2
    assert all(e["args"]["batch_size"] == 0 for e in by_name[("dataloader", "fetch.stop")])
    assert len(by_name[("pipeline", "epoch")]) == 2
    assert len(by_name[("dataloader", "fetch.block")]) == 6
    assert ("compute", "step") not in by_name and ("dataloader", "fetch") not in by_name
    (save,) = by_name[("checkpoint", "capture")]
    assert save["args"]["bytes"] == (job_dir / "ckpt.pt").stat().st_size
    # Worker reads of the dataset are in the trace (spawned workers included). Summed over the
    # loaded table: DFTracer logs a socket's read on a descriptor number a worker had just
    # closed under that file's name (its close race; a CI run read 4 bytes more, a
    # connection's length header), and the loader takes such calls off the file.
    from dlreplay.analyze import load_trace

    ev = load_trace(out).events
    worker_read = int(
        ev.filter(
            pl.col("pid").is_in(sorted(worker_pids))
            & (pl.col("name").cast(pl.String) == "read")
            & pl.col("file").cast(pl.String).str.contains(r"/data/s[0-9]+\.bin$")
        )["size"].sum()
    )
    sizes = [(job_dir / "data" / f"s{i % 3}.bin").stat().st_size for i in range(8)]
    assert worker_read == 2 * sum(sizes)
    # the loader keeps the batch's tensor count, and distill makes it the model's
    from dlreplay.analyze.distill import distill

    lt = load_trace(out)
    assert lt.events.filter(pl.col("name") == "fetch.iter")["tensors"].to_list() == [3] * 6
    assert distill(lt.events, manifest=lt.manifest).reader.batch_tensors == 3


LEAVER = """
import subprocess, sys
# a helper that outlives the job (as multiprocessing's resource tracker does), reading late
subprocess.Popen([sys.executable, "-c",
                  "import time; time.sleep(1.0); open('data/s2.bin', 'rb').read()"])
"""


def test_capture_waits_for_processes_that_outlive_the_job(job_dir: Path) -> None:
    (job_dir / "leaver.py").write_text(LEAVER)
    out = job_dir / "t-leaver"
    result = run_capture(
        CaptureConfig(
            command=(sys.executable, "leaver.py"), out=out, data_dirs=("data",), cwd=job_dir
        )
    )
    assert result.exit_code == 0 and not result.warnings, result
    # the helper's read, done a second after the job ended, is in the trace, and every file
    # the manifest lists is there
    fh = {e["args"]["value"]: e["args"]["name"] for e in _events(out) if e.get("name") == "FH"}
    late = [
        e
        for e in _events(out)
        if e.get("name") == "read" and fh.get(e["args"].get("fhash"), "").endswith("s2.bin")
    ]
    assert sum(e["args"]["ret"] for e in late) == (job_dir / "data" / "s2.bin").stat().st_size
    listed = [f["name"] for f in read_manifest(out)["files"]]
    assert listed and all((out / name).exists() for name in listed)
