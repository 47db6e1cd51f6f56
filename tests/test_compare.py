"""``dlreplay compare`` and ``analyze --verify`` on real captures and real replays."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import TRACES


def test_compare_trace_with_itself_is_one(cli) -> None:
    proc = cli("compare", str(TRACES / "npz_fork"), str(TRACES / "npz_fork"), "--json", check=True)
    out = json.loads(proc.stdout)
    assert out["schema"] == "dlreplay.comparison"
    assert out["similarity"] == pytest.approx(1.0, abs=1e-9)
    assert out["ks"] == {"read_sizes": 0.0, "batch_gaps": 0.0}
    assert out["features"]["files"]["a"] == out["features"]["files"]["b"] > 0


def test_min_similarity_sets_exit_code(cli, tmp_path: Path) -> None:
    a, b = str(TRACES / "npz_fork"), str(TRACES / "jpeg_small")
    sim = json.loads(cli("compare", a, b, "--json", check=True).stdout)["similarity"]
    assert 0 < sim < 0.99
    proc = cli("compare", a, b, "--min-similarity", "0.99")
    assert proc.returncode == 1 and "below --min-similarity" in proc.stderr
    assert cli("compare", a, b, "--min-similarity", f"{sim - 0.01:.4f}").returncode == 0
    report = tmp_path / "cmp.md"
    proc = cli("compare", a, b, "--report", str(report), check=True)
    assert "similarity (cosine" in proc.stdout and report.is_file()
    assert sorted(p.name for p in (tmp_path / "cmp.figures").iterdir()) == [
        "batch_gaps.png",
        "epochs.png",
        "read_sizes.png",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["npz_fork", "h5_shuffle", "jpeg_small"])
def test_real_job_vs_replay_of_its_model(name: str, cli, tmp_path: Path) -> None:
    """The DLIO paper's check: a replay of the distilled model looks like the real job (>= 0.9)."""
    model = tmp_path / "model.yaml"
    cli("distill", str(TRACES / name), "-o", str(model), "-q", check=True)
    replay = tmp_path / "replay"
    cli(
        "replay", str(model), "--data-dir", str(tmp_path / "data"), "--out", str(replay), check=True
    )
    out = json.loads(
        cli(
            "compare",
            str(TRACES / name),
            str(replay),
            "--json",
            "--min-similarity",
            "0.9",
            check=True,
        ).stdout
    )
    print(
        f"{name}: similarity {out['similarity']:.4f}, KS read sizes {out['ks']['read_sizes']}, "
        f"KS batch gaps {out['ks']['batch_gaps']}"
    )
    assert out["similarity"] >= 0.9
    assert out["features"]["files"]["a"] == out["features"]["files"]["b"]
    assert out["timing"]["b"]["au"] is not None and out["timing"]["b"]["source"] == "trace"


LATENCY_JOB = """
import os, sys, time
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class RemoteSamples(Dataset):
    def __init__(self, root):
        self.files = sorted(os.path.join(root, f) for f in os.listdir(root))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        time.sleep(0.025)  # the storage's latency for one sample (a remote object store): no CPU needed
        return torch.from_numpy(np.load(self.files[i]))


if sys.argv[1:] == ["generate"]:
    os.makedirs("data")
    for i in range(32):  # 8 batches an epoch: the AU leaves each epoch's first out
        np.save(f"data/s{i:02d}.npy", np.random.default_rng(i).random(8192, dtype=np.float32))
    sys.exit()
for epoch in range(2):
    for batch in DataLoader(RemoteSamples("data"), batch_size=4, num_workers=1, shuffle=True):
        time.sleep(0.01)  # the training step
"""


@pytest.mark.slow
def test_verify_predicts_more_workers_help(cli, tmp_path: Path) -> None:
    """--verify on a 1-worker job whose loader waits on storage latency: more workers predict a higher AU.

    The premise is built in, not hoped for: each sample costs 25 ms of waiting (a sleep, as a
    remote store's latency) and almost no CPU, so extra loader workers overlap those waits on
    any machine, one core included (a CPU-bound loader, such as NPZ decoding, gains nothing
    from workers on a 2-core machine). Baseline AU is about 20 %, more workers 60 % or more.
    """
    (tmp_path / "job.py").write_text(LATENCY_JOB)
    subprocess.run([sys.executable, "job.py", "generate"], cwd=tmp_path, check=True)
    trace = tmp_path / "trace"
    cli(
        "capture",
        "--out",
        str(trace),
        "--data-dir",
        "data",
        "--",
        sys.executable,
        "job.py",
        cwd=tmp_path,
        check=True,
    )
    work = tmp_path / "verify"
    # two replayed epochs, not four: the AUs are the same (each epoch's first step left out), in half the time
    proc = cli(
        "analyze",
        str(trace),
        "--verify",
        "--verify-epochs",
        "2",
        "--verify-dir",
        str(work),
        "--json",
        check=True,
    )
    runs = {r["label"]: r for r in json.loads(proc.stdout)["verify"]["runs"]}
    base, more = runs["baseline"], runs["too-few-workers"]
    print(f"verify: baseline AU {base['au']}, {more['overrides']} AU {more['au']}")
    assert more["overrides"][0].startswith("reader.read_threads=")
    assert int(more["overrides"][0].split("=")[1]) > 2
    assert all(Path(r["out"]).is_relative_to(work) and r["complete"] for r in runs.values())
    assert base["au"] < 0.5  # the loader is the bottleneck in the replay too
    assert more["au"] > 1.5 * base["au"] and more["samples_per_s"] > 1.5 * base["samples_per_s"]


def test_verify_replays_the_layout_distill_writes(cli, tmp_path: Path) -> None:
    """--verify distills as `dlreplay distill TRACE` does, with the trace's dataset fingerprint:
    its replays generate the dataset of the model distill writes (same dataset digest), here
    with the fingerprint's deflated NPZ members rather than what the reads suggest."""
    import numpy as np

    from dlreplay.capture.fingerprint import fingerprint_dataset, write_fingerprint
    from dlreplay.model import load_model
    from dlreplay.replay import dataset_digest

    trace = tmp_path / "trace"
    shutil.copytree(TRACES / "npz_spawn", trace)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(8):
        np.savez_compressed(
            data / f"vol_{i:03d}.npz",
            x=np.zeros((16, 16, 16), np.float32),
            y=np.ones((16, 16, 16), np.uint8),
        )
    write_fingerprint(fingerprint_dataset([str(data)]), trace)
    cli("distill", str(trace), "-o", str(tmp_path / "m.yaml"), "-q", check=True)
    model = load_model(tmp_path / "m.yaml")
    assert model.dataset.layout is not None and model.dataset.layout.compressed
    work = tmp_path / "verify"
    out = json.loads(
        cli(
            "analyze",
            str(trace),
            "--verify",
            "--verify-epochs",
            "1",
            "--verify-dir",
            str(work),
            "--json",
            check=True,
        ).stdout
    )["verify"]
    assert sorted(p.name for p in work.glob("data-*")) == [f"data-{dataset_digest(model)[:12]}"]
    assert "dataset fingerprint" in out["note"] and out["runs"][0]["complete"]


def _job_and_replay(tmp: Path, ckpt_traced: bool) -> Path:
    """One process reading two dataset files whole, then saving a checkpoint (a DCP save
    event of 2 MB, over the 1 MiB that makes a written file a checkpoint); with *ckpt_traced* the save's writes, fsync and close are in the
    trace (a replay traces its own checkpoint directory), else only the save event (a capture
    that traced the data directory alone)."""
    from .test_load import Proc, write_gz

    p = Proc(pid=7)
    for f in ("/d/f0.bin", "/d/f1.bin"):
        for _ in range(2):  # two epochs
            p.open(f)
            p.read(f, 1000, dur=40)
            p.close(f)
    save = p.event(
        "capture", "checkpoint", {"bytes": 2_000_000, "path": "/ck/step_1"}, dur=500, typ=2
    )
    if ckpt_traced:
        p.ts = save["ts"] + 10
        p.open("/ck/step_1/__0_0.distcp", flags=577)
        p.write("/ck/step_1/__0_0.distcp", 2_000_000, dur=100)
        p.event("fsync", "POSIX", {"ret": 0, "fhash": p.file("/ck/step_1/__0_0.distcp")}, dur=300)
        p.close("/ck/step_1/__0_0.distcp")
    p.finish()
    out = tmp / ("replay" if ckpt_traced else "job")
    out.mkdir()
    write_gz(out / "trace-7.pfw.gz", p.lines())
    return out


def test_checkpoint_io_one_side_cannot_see_is_left_out_of_both(tmp_path: Path) -> None:
    """A job captured with its data directory alone has its checkpoints' save events but not
    their calls; its replay's trace has them (writes, fsync, the files). Both are compared on
    what both measured: the dataset's files (2 and 2, not 2 and 3) and the I/O time of the
    dataset's calls (the replay's fsync is not I/O time the job lacks)."""
    from dlreplay.analyze.compare import compare_traces

    job, replay = _job_and_replay(tmp_path, False), _job_and_replay(tmp_path, True)
    cmp = compare_traces(job, replay, data_dirs_a=["/d"], data_dirs_b=["/d"])
    fa, fb = cmp.features_a, cmp.features_b
    assert fa["bytes_written"] == fb["bytes_written"] == 2_000_000
    assert fa["files"] == fb["files"] == 2
    assert fa["io_time_s"] == pytest.approx(fb["io_time_s"])
    assert cmp.similarity == pytest.approx(1.0)
    # both sides traced the checkpoint: its file counts and its calls are I/O time on both
    both = compare_traces(replay, replay, data_dirs_a=["/d"], data_dirs_b=["/d"])
    assert both.features_a["files"] == 3
    assert both.features_a["io_time_s"] > fb["io_time_s"]
