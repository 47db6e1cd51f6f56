"""Every committed real trace through the loader and the CLI, checked against what the job counted."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import TraceDamageWarning, load, load_trace, summarize
from dlreplay.analyze.trace.vocabulary import CKPT_SAVE, EPOCH, FETCH, ITEM, has_role
from dlreplay.schema import EVENT_SCHEMA, READ_OPS

from .conftest import TRACES

# dlreplay captures (a manifest and the job's own accounting); the foreign traces (DLIO, DFTracer AI
# annotations) have tests of their own in tests/test_vocabulary.py
CORPUS = sorted(p.parent for p in TRACES.glob("*/manifest.json"))


def _expected(trace: Path) -> dict:
    return json.loads((trace / "expected.json").read_text())


def test_corpus_is_present() -> None:
    assert {p.name for p in CORPUS} >= {"npz_fork", "npz_spawn", "h5_shuffle", "jpeg_small"}


def test_corpus_keeps_both_namings() -> None:
    """Traces of the first naming (dataloader/fetch, compute/step, checkpoint/save) must keep
    loading: some corpus traces stay in it, and the others are in DFTracer's conventions."""
    first, conventions = set(), set()
    for trace in CORPUS:
        names = set(load(trace).filter(pl.col("cat") == "dataloader")["name"].unique().to_list())
        (first if "fetch" in names else conventions if "fetch.iter" in names else set()).add(
            trace.name
        )
    assert first and conventions, (first, conventions)


@pytest.mark.parametrize("trace", CORPUS, ids=lambda p: p.name)
def test_loader_matches_job_accounting(trace: Path) -> None:
    exp = _expected(trace)
    loaded = load_trace(trace)
    ev = loaded.events
    assert not loaded.damaged, loaded.describe_damage()
    assert dict(ev.schema) == EVENT_SCHEMA
    assert loaded.manifest is not None and loaded.manifest["status"] == "complete"
    data_dir = loaded.manifest["data_dirs"][0]

    # Bytes read from dataset files, per process: exactly what each worker counted.
    reads = ev.filter(pl.col("name").is_in(READ_OPS) & pl.col("file").cat.starts_with(data_dir))
    per_pid = {
        str(r["pid"]): r["size"] for r in reads.group_by("pid").agg(pl.col("size").sum()).to_dicts()
    }
    for pid, nbytes in exp["bytes_read_per_pid"].items():
        assert per_pid.get(pid) == nbytes, f"pid {pid}"
    worker_total = sum(per_pid.get(pid, 0) for pid in exp["bytes_read_per_pid"])
    assert worker_total == exp["dataset_bytes_read"]
    if exp.get("dataset_read_calls") is not None:
        worker_calls = reads.filter(
            pl.col("pid").cast(pl.Utf8).is_in(list(exp["bytes_read_per_pid"]))
        ).height
        assert worker_calls == exp["dataset_read_calls"]

    # Data-loader events, read through the vocabulary's roles (the corpus holds both namings:
    # format 1's dataloader/fetch, compute/step, checkpoint/save and DFTracer's conventions'
    # fetch.iter/fetch.block, checkpoint/capture): one fetch per batch, one item per sample,
    # one epoch event per epoch.
    fetch = ev.filter(has_role(FETCH) & (pl.col("batch_size") > 0))
    assert fetch.height == exp["batches"]
    assert fetch["batch_size"].sum() == exp["samples"]
    items = ev.filter(has_role(ITEM))
    assert items.height == exp["samples"]
    assert set(items["pid"].unique().to_list()) == {int(p) for p in exp["bytes_read_per_pid"]}
    epochs = ev.filter(has_role(EPOCH))
    assert epochs.height == exp["epochs"]

    # Checkpoints written by torch.save are accounted with their bytes.
    saves = ev.filter(has_role(CKPT_SAVE))
    assert saves.height == exp["checkpoints"]
    assert (saves["size"].sum() or 0) == exp["checkpoint_bytes"]

    # Offsets are reconstructed for every dataset read.
    assert reads["offset"].null_count() == 0
    assert (reads["offset"] >= 0).all()


@pytest.mark.parametrize("trace", CORPUS, ids=lambda p: p.name)
def test_summary_dataset_bytes(trace: Path) -> None:
    exp = _expected(trace)
    loaded = load_trace(trace)
    s = summarize(loaded.events, data_dirs=loaded.manifest["data_dirs"])
    # Worker reads of dataset files; the main process only reads the generator's marker file.
    assert s.dataset_bytes_read >= exp["dataset_bytes_read"]
    assert s.dataset_files == exp["dataset_files"]


@pytest.mark.parametrize("trace", CORPUS, ids=lambda p: p.name)
def test_cli_analyze_every_trace(trace: Path, cli) -> None:
    proc = cli("analyze", str(trace), check=True)
    assert "dataset" in proc.stdout.lower()
    proc = cli("analyze", str(trace), "--json", check=True)
    payload = json.loads(proc.stdout)
    assert payload["dropped_lines"] == 0
    assert payload["dataset_bytes_read"] >= _expected(trace)["dataset_bytes_read"]


def test_truncated_trace_is_salvaged_with_counts(tmp_path: Path, cli) -> None:
    src = TRACES / "npz_fork"
    dst = tmp_path / "npz_fork"
    shutil.copytree(src, dst)
    biggest = max(dst.glob("*.pfw.gz"), key=lambda p: p.stat().st_size)
    full = load(src)
    raw = biggest.read_bytes()
    biggest.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.warns(TraceDamageWarning):
        part = load(dst)
    assert 0 < part.height < full.height
    loaded = load_trace(dst)
    assert loaded.damaged and loaded.dropped_bytes + loaded.dropped_lines > 0
    assert biggest.name in loaded.describe_damage()
    # Everything from the undamaged files is still there.
    others = full.filter(pl.col("source") != biggest.name)
    assert part.filter(pl.col("source") != biggest.name).height == others.height
    proc = cli("analyze", str(dst))
    assert proc.returncode == 0
    assert "warning" in proc.stdout.lower() and biggest.name in proc.stdout


def test_loading_is_silent_on_clean_traces() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load(TRACES / "npz_spawn")
