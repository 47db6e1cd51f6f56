"""Checkpoints from POSIX calls alone (#44): a trace without annotations (DFTracer's preload
alone, ``dlreplay capture --no-loader-hooks``) has no checkpoint events, and distill infers
the checkpoints from the writes (or, for ``torch.save``, whose writes DFTracer does not see,
the opens and closes) of files outside the dataset, marked inferred, never measured.

Real traces that differ in each inferred parameter: checkpoints per run (3, 4, 5, 6, 8, 16),
files per checkpoint (DCP's shards and ``.metadata`` of 2 ranks or 1, DLIO's model and layer
files, one ``torch.save`` file), bytes, fsync, the interval (every 2, 3 or 4 steps, every
epoch) and the restore at start, and what is written beside them (a capture of every file of a
torchrun job: its report and the launcher's small files, and rank 0 saving after the other rank
began its next epoch) (traces/checkpoint_posix/, made by
traces/make_checkpoint_traces.py; traces/dlio_jpeg_ckpt and traces/npz_checkpoint seen
through their POSIX events). Traces with no writes say "no checkpoints" (inferred); captures
that traced only the data directories say they cannot tell (a guess).
"""

from __future__ import annotations

import json
import os
import re
from functools import cache

import polars as pl
import pytest
import yaml

from dlreplay.analyze import load_trace
from dlreplay.analyze.distill import distill
from dlreplay.model import WorkloadModel

from .conftest import TRACES

POSIX = TRACES / "checkpoint_posix"


@cache
def _model(path: str, posix_only: bool = True) -> WorkloadModel:
    lt = load_trace(TRACES / path)
    ev = lt.events
    if posix_only:  # what DFTracer's preload alone records of the same run
        ev = ev.filter(pl.col("cat").is_in(["POSIX", "STDIO"])).with_columns(
            pl.lit(None, pl.String).alias("role")
        )
    return distill(ev, manifest=lt.manifest)


def _truth(path: str) -> dict:
    """The checkpoint truth of a trace: its expected.json, or its job's own report/config."""
    d = TRACES / path
    if path == "dlio_jpeg_ckpt":
        cfg = yaml.safe_load((d / "dlio_config.yaml").read_text())
        steps = cfg["dataset"]["num_files_train"] // cfg["reader"]["batch_size"]
        every = cfg["checkpoint"]["steps_between_checkpoints"]
        return {
            "checkpoints": cfg["train"]["epochs"] * steps // every,
            "files_per_checkpoint": 2,  # DLIO 2.0's model and layer files, one rank
            "bytes_per_checkpoint": _model(path, False).checkpoint.bytes_per_checkpoint,
            "fsync": False,
            "steps_between_checkpoints": every,
            "writes_visible": True,
            "read_at_start": False,
        }
    exp = json.loads((d / "expected.json").read_text())
    if path == "npz_checkpoint":
        return {
            "checkpoints": exp["checkpoints"],
            "files_per_checkpoint": 1,
            "bytes_per_checkpoint": exp["checkpoint_bytes"] // exp["checkpoints"],
            "fsync": False,
            "steps_between_checkpoints": exp["model"]["checkpoint_every"],
            "writes_visible": False,
            "read_at_start": False,
        }
    return exp["checkpoint"]


VARIANTS = [
    "checkpoint_posix/dcp_r2_fsync",
    "checkpoint_posix/dcp_r1_every3",
    "checkpoint_posix/torch_every_epoch",
    "checkpoint_posix/torchrun_every_epoch",
    "checkpoint_posix/dlio_r2",
    "dlio_jpeg_ckpt",
    "npz_checkpoint",
]


@pytest.mark.parametrize("path", VARIANTS)
def test_checkpoints_inferred_from_posix_calls(path: str) -> None:
    want = _truth(path)
    m = _model(path)
    c, f = m.checkpoint, m.provenance.fields
    assert c.enabled
    assert f["checkpoint.enabled"].confidence == "inferred"  # never measured without events
    n = re.match(r"(\d+) checkpoint\(s\)", f["checkpoint.enabled"].method)
    assert n is not None and int(n.group(1)) == want["checkpoints"]
    assert c.files_per_checkpoint == want["files_per_checkpoint"]
    assert c.fsync is want["fsync"]
    if want["writes_visible"]:
        assert c.bytes_per_checkpoint == want["bytes_per_checkpoint"]
        assert c.file_writes is not None and len(c.file_writes) == want["files_per_checkpoint"]
    else:  # torch.save: only its fopen/fclose; the time between them is the save's
        assert c.bytes_per_checkpoint == 0
        assert f["checkpoint.bytes_per_checkpoint"].confidence == "default"
        assert c.serialization_time.is_known and (c.serialization_time.mean or 0) > 0
    for field in ("steps_between_checkpoints", "epochs_between_checkpoints"):
        if want.get(field) is None:
            continue
        if f[f"checkpoint.{field}"].confidence == "inferred":
            assert getattr(c, field) == want[field], field
        else:  # the batch size is a guess, so are the steps: said so, not measured
            assert f["reader.batch_size"].confidence == "default"
    if path.startswith("checkpoint_posix/dcp"):  # DCP's names give each file its rank
        assert c.layout == "dcp" and c.file_ranks is not None
        assert sorted(set(c.file_ranks)) == list(range(want["ranks"]))
    assert c.read_at_start is want["read_at_start"]
    if want["read_at_start"]:
        # what each rank read of the checkpoint folder before the dataset: DCP's buffered
        # reader reads parts of a shard again, so its calls carry more than the files hold
        files = want["read_bytes_per_rank"]
        assert c.read_bytes_per_rank is not None and files <= c.read_bytes_per_rank <= 2 * files


@pytest.mark.parametrize("path", ["dlio_jpeg_ckpt", "checkpoint_posix/dlio_r2"])
def test_annotated_checkpoints_stay_measured(path: str) -> None:
    """The same runs with DLIO's own checkpoint events: measured, and the POSIX inference
    found what they say."""
    full, posix = _model(path, False), _model(path)
    assert full.provenance.fields["checkpoint.enabled"].confidence == "measured"
    for field in ("files_per_checkpoint", "bytes_per_checkpoint", "file_writes", "fsync"):
        assert getattr(posix.checkpoint, field) == getattr(full.checkpoint, field), field


@pytest.mark.parametrize("name", ["dlio_npz_4spf", "dlio_hdf5_8spf"])
def test_no_writes_no_checkpoints(name: str) -> None:
    """DLIO traced its data and checkpoint folders: no write at all, no checkpoints (inferred)."""
    m = _model(f"sweep/{name}")
    f = m.provenance.fields["checkpoint.enabled"]
    assert not m.checkpoint.enabled
    assert f.confidence == "inferred" and "no writes" in f.method


@pytest.mark.parametrize("name", ["tiles_w0_t64", "cosmo_w2_s1"])
def test_capture_of_the_data_dirs_alone_cannot_tell(name: str) -> None:
    """``dlreplay capture --data-dir`` traced only the dataset: checkpoints written elsewhere
    are not in the trace, so "none" is a guess, said so (it was marked measured, and wrong
    for every sweep run that saved)."""
    m = _model(f"sweep/{name}", False)  # captured with --no-loader-hooks: POSIX only
    f = m.provenance.fields["checkpoint.enabled"]
    assert not m.checkpoint.enabled
    assert f.confidence == "default" and "traced only" in f.method
    assert any(n.startswith("guess: checkpoint.enabled") for n in m.provenance.notes)


#: A loop without a DataLoader that reads its samples, takes a lock file every step as the
#: ``filelock`` package does (an ``open(2)`` for writing, ``flock``, ``close``: nothing written)
#: and, given an argument, ``torch.save``s to a path every epoch (its writes unseen: only the
#: C stream's ``fopen``/``fclose``).
HEARTBEAT_JOB = """
import fcntl, os, sys, time
from pathlib import Path
import torch
save = len(sys.argv) > 1
files = sorted(Path("data").iterdir())
model = torch.nn.Linear(256, 256)
for epoch in range(3):
    for i, f in enumerate(files):
        f.read_bytes()
        fd = os.open("run/step.lock", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        time.sleep(0.002)
    if save:
        torch.save(model.state_dict(), f"run/ckpt_{epoch:03d}.pt")
"""


@pytest.mark.parametrize("save", [True, False])
def test_a_lock_file_taken_every_step_is_no_checkpoint(tmp_path, save: bool) -> None:
    """Only a C stream opened for writing can have written unseen: a lock file opened every
    step through ``open(2)`` (whose writes DFTracer always sees) is empty, no checkpoint, whether
    ``torch.save`` checkpoints are beside it (3, found after each epoch) or not (none)."""
    import sys

    from dlreplay.capture import CaptureConfig, run_capture

    (tmp_path / "data").mkdir()
    (tmp_path / "run").mkdir()
    for i in range(6):
        (tmp_path / "data" / f"s{i}.bin").write_bytes(os.urandom(20_000))
    (tmp_path / "job.py").write_text(HEARTBEAT_JOB)
    out = tmp_path / "trace"
    res = run_capture(
        CaptureConfig(
            command=(sys.executable, "job.py", *(["save"] if save else [])),
            out=out,
            data_dirs=("data", "run"),
            cwd=tmp_path,
            loader_hooks=False,
        )
    )
    assert res.exit_code == 0
    lt = load_trace(out)
    m = distill(lt.events, manifest=lt.manifest, source=str(out)).checkpoint
    assert m.enabled is save
    if save:
        assert m.files_per_checkpoint == 1 and m.epochs_between_checkpoints == 1
        assert "ckpt_" not in str(m.checkpoint_folder) and str(m.checkpoint_folder).endswith("run")
