"""What the storage served a replay (#46): real files, real loader workers, the kernel's own
counters (/proc/<pid>/io, mincore, the block device's stat); no mocks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dlreplay.analyze.compare import _served_lines
from dlreplay.model import apply_overrides, model_from_dict, save_model
from dlreplay.replay import (
    GenerateConfig,
    ReplayConfig,
    generate_dataset,
    mlperf,
    run_replay,
    served,
)
from dlreplay.replay.common import read_dataset_manifest
from dlreplay.replay.metrics import served_summary

from .conftest import run_cli

RECORD = 256 * 1024
BASE = {
    "schema": "dlreplay.workload",
    "format_version": 1,
    "model": {"name": "served"},
    "dataset": {
        "format": "npz",
        "num_files": 8,
        "num_samples_per_file": 2,
        "record_length": RECORD,
    },
    "reader": {"batch_size": 2, "read_threads": 2, "transfer_size": 65536},
    "train": {"epochs": 2, "computation_time": 0.001},
}


def _model(*sets: str):
    return apply_overrides(model_from_dict(BASE), list(sets))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generated dataset on the disk the tests use (posix reads of each sample's range:
    the bytes asked are the files' bytes, each read once per epoch)."""
    d = tmp_path_factory.mktemp("served") / "data"
    generate_dataset(GenerateConfig(model=_model(), data_dir=d, jobs=1))
    return d


def _files(data: Path) -> list[str]:
    man = read_dataset_manifest(data)
    assert man is not None
    return [str(data / f["path"]) for f in man["files"]]


@pytest.fixture(scope="module")
def droppable(data: Path) -> None:
    """The premise of a cold read: this disk's page cache can be dropped per file (not tmpfs,
    not an overlay that ignores POSIX_FADV_DONTNEED); checked with mincore."""
    fs = served.filesystem_of(str(data))[0]
    first = _files(data)[0]
    Path(first).read_bytes()
    served.drop_pages(str(data), [os.path.relpath(first, data)], "fadvise")
    if fs in served.MEMORY_FS or served.residency(first) != 0.0:
        pytest.skip(f"the test disk ({fs}) keeps its pages after POSIX_FADV_DONTNEED")


def _close(a: int | None, b: int, within: float = 0.1) -> bool:
    return a is not None and abs(a - b) <= within * b


@pytest.mark.parametrize(
    "loader,sets",
    [("torch", ()), ("builtin", ("reader.worker_kind=thread",))],
    ids=["torch-worker-processes", "builtin-worker-threads"],
)
def test_every_reading_process_reports_what_the_storage_served(
    data: Path, droppable: None, tmp_path: Path, loader: str, sets: tuple[str, ...]
) -> None:
    """Epoch 1 after the pages were dropped: the workers (other processes, or threads of one)
    each measure their own reads, so served ~ asked though the accelerator itself read nothing;
    epoch 2 re-reads what epoch 1 brought into memory: named as served by the page cache."""
    model = _model(*sets)
    paths = [os.path.relpath(p, data) for p in _files(data)]
    drop = served.drop_pages(str(data), paths, "fadvise")
    assert drop["method"] == "fadvise" and drop["resident_after_percent"] == 0.0
    res = run_replay(
        ReplayConfig(
            model=model, data_dir=data, out=tmp_path / "o", trace=False, io="posix", loader=loader
        )
    )
    m = res.metrics
    assert m["format_version"] == 2 and m["loader"] == loader
    e1, e2 = m["epochs"]
    total = sum(os.path.getsize(p) for p in _files(data))
    assert e1["bytes_asked"] == e1["bytes_read"] == total
    assert _close(e1["served_bytes"], total), (e1["served_bytes"], total)
    assert e1["cache_served_percent"] < 10 and e1["served_unmeasured_batches"] == 0
    if loader == "torch":  # read by 2 worker processes, not by the accelerator's
        assert len(e1["worker_pids"]) == 2 and os.getpid() not in e1["worker_pids"]
    if e1.get("device_read_bytes") is not None:  # the device counts every process: at least ours
        assert e1["device_read_bytes"] >= 0.9 * e1["served_bytes"]
    assert e2["served_bytes"] < 0.1 * total and e2["cache_served_percent"] > 90
    assert any("of epoch 2's bytes came from the page cache" in n for n in m["served_notes"])
    assert not any("epoch 1's bytes" in n for n in m["served_notes"])
    assert m["overall"]["served_bytes"] == e1["served_bytes"] + e2["served_bytes"]
    s = served_summary(m)
    assert s is not None and s["epochs"][1]["cache_served_percent"] == e2["cache_served_percent"]


def test_cold_replay_drops_pages_before_each_epoch_and_writes_provenance(
    data: Path, droppable: None, tmp_path: Path
) -> None:
    """replay --cold (fadvise): the files were read just before (warm), yet each epoch's served
    bytes are close to the bytes asked; mincore finds none of the pages after the drop; the
    summary says what was done; provenance.json names versions, host, command, digests, storage."""
    for p in _files(data):
        Path(p).read_bytes()
    assert all(served.residency(p) == 1.0 for p in _files(data)[:2])
    model_file = tmp_path / "model.yaml"
    save_model(_model(), model_file)
    out = tmp_path / "cold"
    proc = run_cli(
        "replay", str(model_file), "--data-dir", str(data), "--no-trace", "--io", "posix",
        "--loader", "builtin", "--cold", "--cold-method", "fadvise", "-o", str(out), check=True,
    )  # fmt: skip
    assert "cold: fadvise before each epoch (8 file(s) on" in proc.stdout
    m = json.loads((out / "metrics.json").read_text())
    total = sum(os.path.getsize(p) for p in _files(data))
    for e in m["epochs"]:
        assert e["cold"]["method"] == "fadvise" and e["cold"]["files"] == 8
        assert e["cold"]["resident_after_percent"] == 0.0
        assert _close(e["served_bytes"], e["bytes_asked"]), (e["served_bytes"], e["bytes_asked"])
    assert m["cold"] == "fadvise" and not any("page cache" in n for n in m["served_notes"])
    # compare's lines for a replay directory, beside a side that has none (a captured job's trace)
    lines = _served_lines(served_summary(m), None)
    assert any(
        ln.split()[:3] == ["served", "by", "storage"] and ln.split()[-1] == "-" for ln in lines
    )
    served.drop_pages(str(data), [os.path.relpath(p, data) for p in _files(data)], "fadvise")
    assert all(served.residency(p) == 0.0 for p in _files(data))
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["schema"] == "dlreplay.provenance" and prov["format_version"] == 1
    assert prov["versions"]["dlreplay"] and prov["versions"]["python"]
    assert prov["host"]["memory_bytes"] > 0 and prov["host"]["name"]
    assert "--cold" in prov["command"] and prov["model_digest"] == m["model_digest"]
    assert len(prov["dataset_digest"]) == 64 and prov["dataset_bytes"] == total
    st = prov["storage"]
    assert st["filesystem"] == served.filesystem_of(str(data))[0] and st["mount"]
    assert st["data_dir"] == str(data.resolve())


def test_tmpfs_pages_cannot_be_dropped(tmp_path: Path) -> None:
    """On a memory filesystem nothing is dropped, and the result says so."""
    shm = Path("/dev/shm")
    if served.filesystem_of(str(shm))[0] not in served.MEMORY_FS:
        pytest.skip("/dev/shm is not a memory filesystem here")
    d = Path(os.environ.get("TMPDIR_SHM", shm)) / f"dlreplay-served-{os.getpid()}"
    d.mkdir()
    try:
        (d / "f").write_bytes(b"x" * 8192)
        done = served.drop_pages(str(d), ["f"], "auto")
        assert done["method"] == "none" and done["files"] == 0
        assert "page cache cannot be dropped on tmpfs" in done["note"]
    finally:
        (d / "f").unlink()
        d.rmdir()


def test_mlperf_mode_refuses_a_small_dataset_and_says_what_is_short(
    data: Path, tmp_path: Path
) -> None:
    """--mlperf and --mlperf-check-only on 8 files of 0.5 MiB, 8 steps: both refused, naming the
    dataset's size against 5x the host's memory, the files that would do, and the steps."""
    model_file = tmp_path / "model.yaml"
    save_model(_model(), model_file)
    for flag in ("--mlperf-check-only", "--mlperf"):
        proc = run_cli(
            "replay", str(model_file), "--data-dir", str(data), "-o", str(tmp_path / flag), flag
        )  # fmt: skip
        assert proc.returncode == 1, proc.stdout + proc.stderr
        err = proc.stderr
        assert "MLPerf Storage rules not met" in err and "(measured)" in err
        assert "this host's memory" in err and "at least 5x" in err
        need = mlperf.files_for_bytes(_model(), 5 * mlperf.host_memory_bytes())
        assert f"dataset.num_files={need} instead of 8" in err
        assert "8 step(s) per epoch on 1 accelerator(s); MLPerf needs at least 500" in err
        assert not (tmp_path / flag / "warmup").exists()


def test_mlperf_runs_a_warmup_then_five_measured_runs(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mode's runs on a dataset this host can hold (the rules' thresholds lowered: a real
    one would need 5x this host's memory): warm-up, 5 runs, AU per run as the mean of its
    epochs' AU, every run's metrics and provenance."""
    monkeypatch.setattr(mlperf, "MEMORY_FACTOR", 0)
    monkeypatch.setattr(mlperf, "MIN_STEPS", 1)
    cfg = ReplayConfig(
        model=_model("train.epochs=2", "reader.read_threads=0"),
        data_dir=data,
        accelerators=1,
        out=tmp_path / "ml",
        trace=False,
        io="posix",
        loader="builtin",
        au_threshold=0.0,
    )
    doc = mlperf.run_mlperf(cfg, ["dlreplay", "replay", "--mlperf"], run_replay, lambda s: None)
    assert [r["run"] for r in doc["runs"]] == [f"run-{i}" for i in range(1, 6)]
    for name in ("warmup", "run-1", "run-5"):
        assert (tmp_path / "ml" / name / "metrics.json").is_file()
        assert (tmp_path / "ml" / name / "provenance.json").is_file()
    m1 = json.loads((tmp_path / "ml" / "run-1" / "metrics.json").read_text())
    aus = [e["au_percent"] for e in m1["epochs"]]
    assert doc["runs"][0]["au_percent"] == pytest.approx(sum(aus) / len(aus))
    assert doc["pass"] and json.loads((tmp_path / "ml" / "mlperf.json").read_text()) == doc
    assert "MLPerf (0.0 % in every run): PASS" in mlperf.render_mlperf(doc)


def test_generate_scales_a_dataset_keeping_its_layout(tmp_path: Path) -> None:
    """generate --scale-to SIZE: more files of the same format and samples per file; an
    N-x-memory target is N times this host's memory; the replay's --set is printed."""
    model_file = tmp_path / "model.yaml"
    save_model(_model("dataset.num_samples_per_file=1", "dataset.num_files=2"), model_file)
    proc = run_cli(
        "generate", str(model_file), "--data-dir", str(tmp_path / "d"), "--jobs", "1",
        "--scale-to", "1.3MB", check=True,
    )  # fmt: skip
    man = read_dataset_manifest(tmp_path / "d")
    assert man is not None and len(man["files"]) == 5  # ceil(1.3 MB / 256 KiB)
    assert all(f["path"].endswith(".npz") for f in man["files"])
    assert "--set dataset.num_files=5" in proc.stdout
    assert mlperf.scale_target("2x-memory") == 2 * mlperf.host_memory_bytes()
    with pytest.raises(Exception, match="expected <N>x-memory"):
        mlperf.scale_target("-1x-memory")


def test_a_version_1_metrics_document_has_no_served_figures() -> None:
    """compare reads a replay's metrics.json of either version: version 1 has no served figures."""
    assert served_summary({"format_version": 1, "overall": {"au_percent": 50.0}}) is None
