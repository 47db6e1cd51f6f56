"""Regenerate ``traces/checkpoint_posix/``: POSIX-only captures (``--no-loader-hooks``, the
data and the checkpoint directory traced) of jobs that checkpoint, for
tests/test_checkpoint_posix.py: distill infers their checkpoints from POSIX calls alone.

The variants differ in every parameter that inference reads: checkpoints per run, files per
checkpoint (DCP's shards and ``.metadata`` over 2 ranks or 1, one ``torch.save`` file), bytes
(the model's size), fsync, the interval (every 2 or 3 steps, every epoch) and the restore at
start; ``torch.save``'s own writes are invisible to DFTracer (only its ``fopen``/``fclose``).
``dlio_r2`` is a DLIO 2.0.0 run of the inference sweep (its POSIX events, gzipped from
``bench-data/inference_sweep/``). ``expected.json`` holds the truth, from the job's report.

    python traces/make_checkpoint_traces.py [--only NAME] [--work /tmp/dlreplay-ckpt-traces]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from dlreplay.capture import CaptureConfig, run_capture  # noqa: E402

TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
SMALL = ("--volume", "8", "--num-files", "16", "--batch-size", "2", "--threads", "1")
#: name -> (launcher, script, arguments, a run before the capture that leaves a checkpoint)
TRACES: dict[str, tuple[tuple[str, ...], str, list[str], list[str] | None]] = {
    # 2 ranks, DCP every 2 steps with fsync, restores the checkpoint a first run left
    "dcp_r2_fsync": (
        TORCHRUN,
        "dcp_sharded",
        [*SMALL, "--hidden", "16", "--epochs", "2", "--checkpoint-every", "2", "--fsync"]
        + ["--keep", "0", "--workers", "1"],
        [*SMALL, "--hidden", "16", "--epochs", "1", "--checkpoint-every", "4"],
    ),
    # 1 rank, DCP every 3 steps, no fsync, a larger model, no restore
    "dcp_r1_every3": (
        (),
        "dcp_sharded",
        [*SMALL, "--hidden", "48", "--epochs", "2", "--checkpoint-every", "3"]
        + ["--keep", "0", "--workers", "2", "--no-resume"],
        None,
    ),
    # torch.save after every epoch (its writes invisible to DFTracer), 2 workers, 3 epochs
    "torch_every_epoch": (
        (),
        "unet3d_npz",
        ["--volume", "16", "--num-files", "16", "--batch-size", "4", "--threads", "1"]
        + ["--workers", "2", "--epochs", "3", "--checkpoint-every-epoch"],
        None,
    ),
    # torchrun, 2 ranks of 2 persistent workers each, rank 0 torch.save's after every epoch,
    # every file traced (a capture without --data-dir: the job's report and the launcher's
    # small files are written beside the checkpoints); the other rank begins its next epoch
    # before rank 0's save (retried until it does)
    "torchrun_every_epoch": (
        TORCHRUN,
        "ddp_torchrun",
        [*SMALL, "--workers", "2", "--persistent-workers", "--epochs", "3", "--by-path"]
        + ["--checkpoint-every-epoch"],
        None,
    ),
}
#: captures of every file, not only the data and checkpoint directories
EVERY_FILE = {"torchrun_every_epoch"}


def _truth(script: str, rep: dict[str, Any], pre: bool) -> dict[str, Any]:
    """The checkpoint fields the job's report gives."""
    args, cks = rep["args"], rep["checkpoints"]
    if script == "dcp_sharded":
        sizes = [sum(c["files"].values()) for c in cks]
        return {
            "enabled": True,
            "checkpoints": len(cks),
            "files_per_checkpoint": len(cks[0]["files"]),
            "bytes_per_checkpoint": sizes[0],
            "fsync": args["fsync"],
            "steps_between_checkpoints": args["checkpoint_every"],
            "epochs_between_checkpoints": None,
            "ranks": rep["world_size"],
            "read_at_start": bool(rep["restored"]) and pre,
            "read_bytes_per_rank": rep["restored"]["bytes"] if rep["restored"] else None,
            "writes_visible": True,
        }
    return {
        "enabled": True,
        "checkpoints": len(cks),
        "files_per_checkpoint": 1,
        "bytes_per_checkpoint": cks[0]["bytes"],
        "fsync": False,
        "steps_between_checkpoints": None,
        "epochs_between_checkpoints": 1,
        "checkpoint_after_epoch": 1,
        "ranks": rep.get("world_size", 1),
        "read_at_start": False,
        "writes_visible": False,
    }


def make(name: str, work: Path, tries: int = 10) -> None:
    """Capture *name* into *work* and keep it; a capture whose premise does not show is made
    again, up to *tries* times."""
    for _ in range(tries):
        if _capture(name, work):
            return
    raise SystemExit(f"{name}: the premise did not show in {tries} captures")


def _saved_in_the_next_epoch(trace: Path) -> bool:
    """Whether a save (a checkpoint file's open) began after another rank had begun the next
    epoch's reads: the whole job's epochs put it inside that epoch."""
    import polars as pl

    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill.base import Facts
    from dlreplay.analyze.distill.observe import observe

    ev = load_trace(trace).events
    spans = sorted(a for _, a, _ in observe(ev, None, None, str(trace), Facts()).posix.epoch_spans)
    saves = ev.filter(
        pl.col("name").cast(pl.String).str.starts_with("fopen")
        & pl.col("file").cast(pl.String).str.contains("/ck/")
    )["ts"].sort()
    return any(k + 1 < len(spans) and t > spans[k + 1] for k, t in enumerate(saves.to_list()))


def _capture(name: str, work: Path) -> bool:
    launcher, script, args, pre = TRACES[name]
    job = work / name
    if job.exists():
        shutil.rmtree(job)
    data, ck, out, report = job / "data", job / "ck", job / "trace", job / "report.json"
    base = [sys.executable, str(REPO / "examples" / f"{script}.py"), "--data-dir", str(data)]
    base += ["--checkpoint-dir", str(ck)]
    subprocess.run([*base, *args, "--generate-only"], check=True, capture_output=True)
    if pre is not None:
        subprocess.run([*base, *pre, "--quiet"], check=True, capture_output=True)
    cmd = [sys.executable, *launcher, *base[1:], *args, "--quiet", "--report", str(report)]
    res = run_capture(
        CaptureConfig(
            command=tuple(cmd),
            out=out,
            data_dirs=() if name in EVERY_FILE else (str(data), str(ck)),
            name=name,
            loader_hooks=False,
            cwd=job,
        )
    )
    if res.exit_code != 0:
        raise SystemExit(f"{name}: job failed ({res.exit_code})")
    if name in EVERY_FILE and not _saved_in_the_next_epoch(out):
        return False
    rep = json.loads(report.read_text())
    _keep(
        name,
        out,
        {
            "source": f"examples/{script}.py, dlreplay capture --no-loader-hooks",
            "command": cmd[1:],
            "checkpoint": _truth(script, rep, pre is not None),
        },
    )
    return True


def _keep(name: str, trace: Path, expected: dict[str, Any]) -> None:
    dest = HERE / "checkpoint_posix" / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in sorted(trace.iterdir()):
        if f.name.endswith(".pfw"):
            with open(f, "rb") as src, gzip.open(dest / (f.name + ".gz"), "wb", 9) as dst:
                shutil.copyfileobj(src, dst)
        elif f.name.endswith(".pfw.gz") or f.name == "manifest.json":
            shutil.copy(f, dest / f.name)
    (dest / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"{name}: {size / 1024:.0f} KiB -> {dest}")


def dlio_r2(cache: Path) -> None:
    """The sweep's DLIO run of 2 ranks and checkpoints every 2 steps, its truth from its
    configuration (rank 0 writes DLIO 2.0's model and layer files)."""
    run = cache / "dlio_hdf5-w4p-s2-b1-sh-r2-ck"
    result = json.loads((run / "result.json").read_text())
    c = result["config"]
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill import distill

    lt = load_trace(run / "trace")
    steps = max(4, 2 * c["workers"])  # batches per rank an epoch (the sweep's design)
    truth = {
        "enabled": True,
        "checkpoints": 2 * steps // 2,  # 2 epochs, every 2 steps
        "files_per_checkpoint": 2,
        # DLIO's own checkpoint events (the whole trace distilled: measured)
        "bytes_per_checkpoint": distill(
            lt.events, manifest=lt.manifest
        ).checkpoint.bytes_per_checkpoint,
        "fsync": False,
        "steps_between_checkpoints": 2,
        "epochs_between_checkpoints": None,
        "ranks": c["ranks"],
        "read_at_start": False,
        "writes_visible": True,
    }
    _keep(
        "dlio_r2",
        run / "trace",
        {
            "source": "DLIO 2.0.0 run of benchmarks/inference_sweep.py",
            "config": c,
            "checkpoint": truth,
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None)
    ap.add_argument("--work", type=Path, default=Path("/tmp/dlreplay-ckpt-traces"))
    ap.add_argument("--sweep-cache", type=Path, default=REPO / "bench-data" / "inference_sweep")
    a = ap.parse_args()
    for name in TRACES:
        if a.only in (None, name):
            make(name, a.work)
    if a.only in (None, "dlio_r2"):
        dlio_r2(a.sweep_cache)


if __name__ == "__main__":
    main()
