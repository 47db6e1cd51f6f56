"""End-to-end checks of the example training jobs in ``examples/``.

Each job runs in a subprocess (as ``python examples/<name>.py``, the way
dlreplay captures it) on a tiny dataset in ``tmp_path``; assertions are made on
its ``--report`` JSON.  Byte accounting is checked *exactly*: the test re-reads
every sample in-process through the same unbuffered counting ``FileIO`` and
the same reader (``np.load`` / ``h5py.File`` / ``PIL.Image.open``), so the
job's total must equal ``epochs x`` that per-epoch sum -- i.e. every sample is
read exactly once per epoch and nothing else is counted.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SCRIPTS = (
    "unet3d_npz.py",
    "cosmoflow_h5.py",
    "resnet_jpeg.py",
    "paired_files.py",
    "pt_samples.py",
    "mapped_rows.py",
)


def _load_common():
    spec = importlib.util.spec_from_file_location(
        "_dlreplay_examples_common", EXAMPLES / "_common.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


common = _load_common()


def run_job(script, tmp_path, *args, expect_rc=0, report=True, data_dir=None):
    data_dir = data_dir or tmp_path / "data"
    report_path = tmp_path / "report.json"
    cmd = [sys.executable, str(EXAMPLES / script), "--data-dir", str(data_dir), "--quiet"]
    if report:
        cmd += ["--report", str(report_path)]
    cmd += [str(a) for a in args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = f"cmd: {cmd}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == expect_rc, out
    assert "Traceback" not in proc.stderr, out
    assert "Warning" not in proc.stderr, out
    rep = json.loads(report_path.read_text()) if report else None
    return rep, proc


def check_report(rep, *, job, n_samples, batch, epochs, workers):
    """Invariants every report must satisfy."""
    assert rep["job"] == job
    per_epoch = math.ceil(n_samples / batch)
    assert rep["batches_per_epoch"] == per_epoch
    assert rep["epochs"] == epochs
    assert rep["steps"] == per_epoch * epochs
    assert rep["samples"] == n_samples * epochs
    assert len(rep["step_compute_s"]) == rep["steps"]
    assert len(rep["step_wait_s"]) == rep["steps"]
    assert all(t > 0 for t in rep["step_compute_s"])
    assert len(rep["epoch_times_s"]) == epochs
    files = rep["dataset_files"]
    assert all(os.path.isabs(f) and os.path.isfile(f) for f in files)
    per_pid = {int(p): b for p, b in rep["bytes_read_per_pid"].items()}
    assert rep["dataset_bytes_read"] == sum(per_pid.values())
    assert rep["dataset_read_calls"] == sum(rep["read_calls_per_pid"].values())
    # A full pass reads every file at least once per epoch.
    assert rep["dataset_bytes_read"] >= sum(os.path.getsize(f) for f in files) * epochs
    if workers == 0:
        assert set(per_pid) == {rep["main_pid"]}
    else:
        assert rep["main_pid"] not in per_pid
        if per_epoch >= workers:
            # Non-persistent workers: a fresh set of worker processes per epoch.
            assert len(per_pid) == workers * epochs
    return per_pid


def _reference(paths_and_readers):
    """(bytes, read calls) for reading each sample once, in this process."""
    total_b = total_c = 0
    for path, read in paths_and_readers:
        with common.CountingFileIO(path) as f:
            read(f)
        total_b += f.bytes_read
        total_c += f.read_calls
    return total_b, total_c


def npz_reference(files):
    def read(f):
        with np.load(f) as z:
            z["x"], z["y"]

    return _reference((p, read) for p in files)


def h5_reference(files, spf):
    import h5py

    def reader(row):
        def read(f):
            with h5py.File(f, "r") as h:
                h["x"][row], h["y"][row]

        return read

    return _reference((p, reader(r)) for p in files for r in range(spf))


def image_reference(files):
    from PIL import Image

    def read(f):
        with Image.open(f) as im:
            np.array(im.convert("RGB"))

    return _reference((p, read) for p in files)


def assert_exact(rep, ref, epochs):
    ref_bytes, ref_calls = ref
    assert rep["dataset_bytes_read"] == ref_bytes * epochs
    assert rep["dataset_read_calls"] == ref_calls * epochs


# --------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--data-dir",
        "--num-files",
        "--batch-size",
        "--workers",
        "--epochs",
        "--checkpoint-every",
        "--checkpoint-dir",
        "--mp-context",
        "--no-shuffle",
        "--seed",
        "--compute-scale",
        "--report",
        "--generate-only",
        "--fail-with",
    ):
        assert flag in proc.stdout, flag


def _unet(tmp_path, ctx, epochs):
    files, batch, workers = 6, 4, 2
    rep, _ = run_job(
        "unet3d_npz.py", tmp_path,
        "--num-files", files, "--volume", 16, "--batch-size", batch, "--workers", workers,
        "--epochs", epochs, "--mp-context", ctx, "--checkpoint-every", 3,
    )  # fmt: skip
    check_report(
        rep, job="unet3d_npz", n_samples=files, batch=batch, epochs=epochs, workers=workers
    )
    assert len(rep["dataset_files"]) == files
    assert all(f.endswith(".npz") for f in rep["dataset_files"])
    assert_exact(rep, npz_reference(rep["dataset_files"]), epochs)
    # Checkpoints every 3 global steps, in <data-dir>/../checkpoints.
    steps = rep["steps"]
    assert [c["step"] for c in rep["checkpoints"]] == list(range(3, steps + 1, 3))
    for c in rep["checkpoints"]:
        assert Path(c["path"]).parent == tmp_path / "checkpoints"
        assert os.path.getsize(c["path"]) == c["bytes"] > 0
    return rep


def test_unet3d_npz_fork(tmp_path):
    _unet(tmp_path, "fork", epochs=2)


@pytest.mark.slow
def test_unet3d_npz_spawn(tmp_path):
    # Every spawned worker re-imports torch (seconds each), hence slow.
    _unet(tmp_path, "spawn", epochs=2)


def test_npz_bytes_are_file_size_plus_constant(tmp_path):
    """np.load of an np.savez .npz reads the whole file plus a fixed overhead
    (the 6-byte magic probe + the 20-byte zip64 locator probe: 26 bytes on
    CPython 3.11 / numpy 2.x)."""
    run_job("unet3d_npz.py", tmp_path, "--num-files", 3, "--volume", 8, "--generate-only",
            report=False)  # fmt: skip
    files = sorted(str(p) for p in (tmp_path / "data").glob("*.npz"))
    overheads = set()
    for p in files:
        b, _ = npz_reference([p])
        overheads.add(b - os.path.getsize(p))
    assert len(overheads) == 1
    assert 0 <= overheads.pop() <= 64


@pytest.mark.parametrize("layout", ["contiguous", "chunked"])
def test_cosmoflow_h5(tmp_path, layout):
    files, spf, batch, workers, epochs = 3, 3, 4, 2, 2
    extra = ["--contiguous"] if layout == "contiguous" else ["--chunked", "--chunk-rows", 2]
    rep, _ = run_job(
        "cosmoflow_h5.py", tmp_path,
        "--num-files", files, "--samples-per-file", spf, "--volume", 8, "--channels", 2,
        "--batch-size", batch, "--workers", workers, "--epochs", epochs, *extra,
    )  # fmt: skip
    check_report(
        rep, job="cosmoflow_h5", n_samples=files * spf, batch=batch, epochs=epochs, workers=workers
    )
    assert len(rep["dataset_files"]) == files
    assert_exact(rep, h5_reference(rep["dataset_files"], spf), epochs)


def test_cosmoflow_h5_keep_open_workers0(tmp_path):
    files, spf, batch, epochs = 2, 3, 4, 2
    rep, _ = run_job(
        "cosmoflow_h5.py", tmp_path,
        "--num-files", files, "--samples-per-file", spf, "--volume", 8, "--channels", 1,
        "--batch-size", batch, "--workers", 0, "--epochs", epochs, "--keep-open", "--no-shuffle",
    )  # fmt: skip
    check_report(
        rep, job="cosmoflow_h5", n_samples=files * spf, batch=batch, epochs=epochs, workers=0
    )


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
def test_resnet_images(tmp_path, fmt):
    files, batch, workers, epochs, classes = 24, 8, 2, 2, 3
    rep, _ = run_job(
        "resnet_jpeg.py", tmp_path,
        "--format", fmt, "--num-files", files, "--image-size", 16, "--num-classes", classes,
        "--batch-size", batch, "--workers", workers, "--epochs", epochs,
    )  # fmt: skip
    check_report(
        rep, job="resnet_jpeg", n_samples=files, batch=batch, epochs=epochs, workers=workers
    )
    ext = ".jpg" if fmt == "jpeg" else ".png"
    assert all(f.endswith(ext) for f in rep["dataset_files"])
    assert {Path(f).parent.name for f in rep["dataset_files"]} == {
        f"class_{c}" for c in range(classes)
    }
    assert_exact(rep, image_reference(rep["dataset_files"]), epochs)


def test_fail_with_exit_code_workers0(tmp_path):
    rep, proc = run_job(
        "unet3d_npz.py", tmp_path,
        "--num-files", 4, "--volume", 8, "--batch-size", 2, "--workers", 0, "--epochs", 3,
        "--fail-with", 3,
        expect_rc=3,
    )  # fmt: skip
    assert rep["exit_code"] == 3
    check_report(rep, job="unet3d_npz", n_samples=4, batch=2, epochs=1, workers=0)
    assert "fail-with 3" in proc.stdout


def test_generate_only_and_reuse(tmp_path):
    args = ("--num-files", 5, "--image-size", 8, "--generate-only")
    _, p1 = run_job("resnet_jpeg.py", tmp_path, *args, report=False)
    assert "generated" in p1.stdout
    marker = json.loads((tmp_path / "data" / common.MARKER).read_text())
    assert len(marker["files"]) == 5
    before = {f: (tmp_path / "data" / f).stat().st_mtime_ns for f in marker["files"]}
    _, p2 = run_job("resnet_jpeg.py", tmp_path, *args, report=False)
    assert "(reused)" in p2.stdout
    assert before == {f: (tmp_path / "data" / f).stat().st_mtime_ns for f in marker["files"]}
    # Different generation parameters -> stale files removed, dataset regenerated.
    _, p3 = run_job("resnet_jpeg.py", tmp_path, "--num-files", 3, "--image-size", 8,
                    "--generate-only", report=False)  # fmt: skip
    assert "generated" in p3.stdout
    assert len(list((tmp_path / "data").glob("class_*/*.jpg"))) == 3
    assert not (tmp_path / "report.json").exists()


def test_generation_is_deterministic(tmp_path):
    for d in ("a", "b"):
        run_job("cosmoflow_h5.py", tmp_path, "--num-files", 2, "--volume", 8, "--channels", 1,
                "--generate-only", report=False, data_dir=tmp_path / d)  # fmt: skip
        run_job("unet3d_npz.py", tmp_path, "--num-files", 2, "--volume", 8,
                "--generate-only", report=False, data_dir=tmp_path / d / "u")  # fmt: skip
    import h5py

    for name in ("univ_00000.h5", "univ_00001.h5"):
        with h5py.File(tmp_path / "a" / name) as ha, h5py.File(tmp_path / "b" / name) as hb:
            assert np.array_equal(ha["x"][()], hb["x"][()])
            assert np.array_equal(ha["y"][()], hb["y"][()])
    for name in ("vol_00000.npz", "vol_00001.npz"):
        assert (tmp_path / "a" / "u" / name).read_bytes() == (
            tmp_path / "b" / "u" / name
        ).read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_default_sizes(tmp_path, script):
    """The defaults (what --help advertises) run end to end."""
    rep, _ = run_job(script, tmp_path)
    a = rep["args"]
    n = a["num_files"] * a.get("samples_per_file", 1)
    check_report(rep, job=script[:-3], n_samples=n, batch=a["batch_size"], epochs=a["epochs"],
                 workers=a["workers"])  # fmt: skip
