"""Regenerate ``traces/streams/``: captures of ``examples/shards_tar.py`` (tar shards streamed by
an ``IterableDataset``), for tests/test_streaming_shards.py.

* ``r2_fresh``, ``r2_persistent``: under ``torchrun`` with 2 ranks, with the loader hooks:
  distill finds each rank's workers and whether they persist. They differ in workers per rank
  (2, 3), persistence, the library (webdataset, tarfile), the split (contiguous, interleaved)
  and epochs (3, 2). The ranks start their epochs apart; in ``r2_fresh`` (re-forked workers) a
  worker of one rank must still read after the other rank's next epoch began, the case that
  made its workers look persistent (6 per rank): the script captures again until a run shows it
  (``premise_workers_across_ranks_epochs`` in ``expected.json``).
* ``posix_tarfile``, ``posix_wds``, ``posix_wds_npy``: one rank, DFTracer's POSIX calls
  alone (``--no-loader-hooks``), with the capture's dataset fingerprint: distill recognises
  the streamed shards and takes their insides from the fingerprint (the shards themselves are
  not at hand where the tests run). They differ in shards (16, 8, 10), samples per shard (12,
  20, 18), members (npy, jpg), workers (3, 2), persistence, library, split, epochs and batch
  size (4, 8, 6, 3): ``posix_wds``'s samples (small JPEGs) are smaller than its reads, and
  ``posix_wds_npy``'s worker reads a shard's samples in one burst, so their batch size does not
  show (``batch`` null: distill must say it is a guess). ``posix_arrow``: Arrow IPC shards read
  with pyarrow (record batches of 6 rows, each read in one call: no batch either).
  ``posix_whole_shards``, ``posix_w0``: batches of whole shards (4 shards of 4, 2 of 8 samples),
  read by one worker re-forked every epoch and by the consumer itself: the batch is the period
  of the shards' opens times the samples per shard; no workers is 0, not 1.
  ``posix_r2_w0``: under ``torchrun``, 2 ranks streaming their shards themselves (no workers,
  no process group), captured again until the ranks ran out of step (one rank's next epoch
  begun before the other's ended: ``premise_workers_across_ranks_epochs`` counts such pairs):
  each rank's own opens cut into epochs, the trace's in time order do not.

``expected.json`` holds the truth, from the jobs' arguments.

    python traces/make_stream_traces.py [--only NAME] [--work /tmp/dlreplay-stream-traces]
"""

from __future__ import annotations

import argparse
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
#: name -> (launcher, the job's arguments, loader hooks, the truth distill must find)
TRACES: dict[str, tuple[tuple[str, ...], list[str], bool, dict[str, Any]]] = {
    "r2_fresh": (
        TORCHRUN,
        ["--num-files", "12", "--samples-per-shard", "10", "--sample-bytes", "30000"]
        + ["--workers", "2", "--batch-size", "4", "--reader", "webdataset"]
        + ["--split", "contiguous", "--epochs", "3"],
        True,
        {"ranks": 2, "workers_per_rank": 2, "persistent": False, "epochs": 3},
    ),
    "r2_persistent": (
        TORCHRUN,
        ["--num-files", "12", "--samples-per-shard", "8", "--sample-bytes", "12000"]
        + ["--workers", "3", "--batch-size", "2", "--reader", "tarfile"]
        + ["--split", "interleaved", "--epochs", "2", "--persistent-workers"],
        True,
        {"ranks": 2, "workers_per_rank": 3, "persistent": True, "epochs": 2},
    ),
    # DFTracer's POSIX calls alone (--no-loader-hooks): the shards' insides come from the
    # capture's dataset fingerprint (the shards are not at hand where the tests distill)
    "posix_tarfile": (
        (),
        ["--num-files", "16", "--samples-per-shard", "12", "--sample-bytes", "20000"]
        + ["--workers", "3", "--batch-size", "4", "--reader", "tarfile"]
        + ["--split", "interleaved", "--epochs", "3"],
        False,
        {"ranks": 1, "workers_per_rank": 3, "persistent": False, "epochs": 3, "shards": 16,
         "samples_per_shard": 12, "parts": ["cls", "npy"], "batch": 4},
    ),
    "posix_wds": (
        (),
        ["--num-files", "8", "--samples-per-shard", "20", "--sample-bytes", "6000"]
        + ["--workers", "2", "--batch-size", "8", "--reader", "webdataset"]
        + ["--split", "contiguous", "--epochs", "2", "--persistent-workers", "--member", "jpeg"],
        False,
        {"ranks": 1, "workers_per_rank": 2, "persistent": True, "epochs": 2, "shards": 8,
         "samples_per_shard": 20, "parts": ["cls", "jpg"], "batch": None},
    ),
    "posix_wds_npy": (
        (),
        ["--num-files", "10", "--samples-per-shard", "18", "--sample-bytes", "40000"]
        + ["--workers", "2", "--batch-size", "6", "--reader", "webdataset"]
        + ["--split", "contiguous", "--epochs", "2", "--persistent-workers"]
        + ["--compute-scale", "6"],  # a consumer slower than its loader: batches wait
        False,
        {"ranks": 1, "workers_per_rank": 2, "persistent": True, "epochs": 2, "shards": 10,
         "samples_per_shard": 18, "parts": ["cls", "npy"], "batch": None},
    ),
    "posix_tar_b3": (
        (),
        ["--num-files", "9", "--samples-per-shard", "9", "--member", "jpeg"]
        + ["--image-size", "176", "--workers", "2", "--batch-size", "3", "--reader", "tarfile"]
        + ["--split", "contiguous", "--epochs", "2", "--persistent-workers"]
        + ["--compute-scale", "2"],
        False,
        {"ranks": 1, "workers_per_rank": 2, "persistent": True, "epochs": 2, "shards": 9,
         "samples_per_shard": 9, "parts": ["cls", "jpg"], "batch": 3},
    ),
    "posix_arrow": (
        (),
        ["--format", "arrow", "--num-files", "10", "--samples-per-shard", "24"]
        + ["--sample-bytes", "30000", "--rows-per-batch", "6", "--workers", "2"]
        + ["--batch-size", "4", "--reader", "pyarrow", "--split", "interleaved", "--epochs", "3"]
        + ["--compute-scale", "2"],
        False,
        {"ranks": 1, "workers_per_rank": 2, "persistent": False, "epochs": 3, "shards": 10,
         "samples_per_shard": 24, "parts": ["data", "key", "label"], "batch": None, "format": "arrow"},
    ),
    # batches of whole shards: the batch's end is a shard's open (the period is in the shards)
    "posix_whole_shards": (
        (),
        ["--num-files", "16", "--samples-per-shard", "4", "--sample-bytes", "30000"]
        + ["--workers", "1", "--batch-size", "16", "--reader", "tarfile"]
        + ["--split", "contiguous", "--epochs", "3"],
        False,
        {"ranks": 1, "workers_per_rank": 1, "persistent": False, "epochs": 3, "shards": 16,
         "samples_per_shard": 4, "parts": ["cls", "npy"], "batch": 16},
    ),
    # the consumer streams its shards itself (no workers), 2 shards a batch
    "posix_w0": (
        (),
        ["--num-files", "8", "--samples-per-shard", "8", "--sample-bytes", "30000"]
        + ["--workers", "0", "--batch-size", "16", "--reader", "tarfile"]
        + ["--split", "interleaved", "--epochs", "2"],
        False,
        {"ranks": 1, "workers_per_rank": 0, "persistent": False, "epochs": 2, "shards": 8,
         "samples_per_shard": 8, "parts": ["cls", "npy"], "batch": 16},
    ),
    # torchrun's 2 ranks stream their shards themselves (no workers, no process group): they
    # run out of step, one rank's second epoch begun before the other's first ended
    "posix_r2_w0": (
        TORCHRUN,
        ["--num-files", "16", "--samples-per-shard", "12", "--sample-bytes", "20000"]
        + ["--workers", "0", "--batch-size", "6", "--reader", "tarfile"]
        + ["--split", "interleaved", "--epochs", "2"],
        False,
        {"ranks": 2, "workers_per_rank": 0, "persistent": False, "epochs": 2, "shards": 16,
         "samples_per_shard": 12, "parts": ["cls", "npy"], "batch": 6},
    ),
}  # fmt: skip


def out_of_step(trace: Path, epochs: int) -> int:
    """Pairs of ranks (reading their shards themselves) of which one began its next epoch
    before the other ended its epoch (the premise of ``posix_r2_w0``): the trace's opens of
    shards in time order do not cut into epochs, each rank's do."""
    import polars as pl

    from dlreplay.analyze import load_trace

    ev = load_trace(trace).events
    opens = ev.filter(
        pl.col("name").cast(pl.String).str.starts_with("open")
        & pl.col("file").cast(pl.String).str.ends_with(".tar")
    ).sort("ts")
    spans = {}
    for (pid,), o in opens.group_by("pid"):
        ts = o["ts"].to_list()
        k = len(ts) // epochs
        spans[pid] = [(ts[e * k], ts[(e + 1) * k - 1]) for e in range(epochs)]
    return sum(
        1
        for a in spans
        for b in spans
        if a != b and any(spans[b][e + 1][0] < spans[a][e][1] for e in range(epochs - 1))
    )


def crossed(trace: Path) -> int:
    """Worker reads that fall after another rank's next epoch began (the premise of
    ``r2_fresh``): per worker, its reads placed in every consumer's epochs by time alone span
    more than one epoch."""
    import polars as pl

    from dlreplay.analyze import load_trace
    from dlreplay.analyze.trace.steps import epoch_spans

    ev = load_trace(trace).events
    starts = epoch_spans(ev).select("ts", "epoch").sort("ts")
    reads = ev.filter(
        (pl.col("name") == "read") & pl.col("file").cast(pl.String).str.ends_with(".tar")
    )
    tagged = reads.select("pid", "ts").sort("ts").join_asof(starts, on="ts", strategy="backward")
    per = tagged.drop_nulls("epoch").group_by("pid").agg(pl.col("epoch").n_unique().alias("n"))
    return int((per["n"] > 1).sum())


def make(name: str, work: Path, tries: int = 8) -> None:
    launcher, args, hooks, truth = TRACES[name]
    job = work / name
    if job.exists():
        shutil.rmtree(job)
    data = job / "data"
    script = str(REPO / "examples" / "shards_tar.py")
    base = [script, "--data-dir", str(data), "--threads", "1", "--quiet", *args]
    subprocess.run([sys.executable, *base, "--generate-only"], check=True, capture_output=True)
    for attempt in range(tries):
        out = job / f"trace{attempt}"
        res = run_capture(
            CaptureConfig(
                command=(sys.executable, *launcher, *base),
                out=out,
                data_dirs=(str(data),),
                name=name,
                cwd=job,
                loader_hooks=hooks,
            )
        )
        if res.exit_code != 0:
            raise SystemExit(f"{name}: job failed ({res.exit_code})")
        if hooks:
            premise = crossed(out)
        elif truth["ranks"] > 1:
            premise = out_of_step(out, truth["epochs"])
        else:
            premise = 0
        if truth["persistent"] or premise or truth["ranks"] == 1:
            break
        print(f"{name}: no worker read past another rank's next epoch start; again")
    else:
        raise SystemExit(f"{name}: the premise did not show in {tries} captures")
    torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2"] if launcher else []
    expected = {
        "source": "examples/shards_tar.py, dlreplay capture"
        + ("" if hooks else " --no-loader-hooks"),
        "command": [*torchrun, "examples/shards_tar.py", *base[3:]],
        "truth": truth,
        "premise_workers_across_ranks_epochs": premise,
    }
    keep_capture(out, HERE / "streams" / name, expected, f"premise: {premise} worker(s)")


def keep_capture(out: Path, dest: Path, expected: dict[str, Any], more: str = "") -> None:
    """Copy a capture's trace files, manifest and dataset fingerprint from *out* to *dest* (made
    anew), with *expected* as its ``expected.json``; says its size."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in sorted(out.iterdir()):
        if f.name.endswith(".pfw.gz") or f.name in ("manifest.json", "dataset-fingerprint.json"):
            shutil.copy(f, dest / f.name)
    (dest / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"{dest.name}: {size / 1024:.0f} KiB -> {dest}" + (f" ({more})" if more else ""))


def capture_example(
    name: str, work: Path, script: str, args: list[str], *, loader_hooks: bool
) -> tuple[Path, list[str]]:
    """Generate the dataset of ``examples/<script>`` with *args* in ``work/name/data``, then
    capture the job (DFTracer's POSIX calls alone unless *loader_hooks*); returns (the
    capture's folder, the job's arguments after the script's path). Stops on a failed job."""
    job = work / name
    if job.exists():
        shutil.rmtree(job)
    data = job / "data"
    base = [str(REPO / "examples" / script), "--data-dir", str(data), "--quiet", *args]
    subprocess.run([sys.executable, *base, "--generate-only"], check=True, capture_output=True)
    out = job / "trace"
    res = run_capture(
        CaptureConfig(
            command=(sys.executable, *base),
            out=out,
            data_dirs=(str(data),),
            name=name,
            cwd=job,
            loader_hooks=loader_hooks,
        )
    )
    if res.exit_code != 0:
        raise SystemExit(f"{name}: job failed ({res.exit_code})")
    return out, base[1:]


def run_makers(doc: str, names: Any, make_one: Any, work: str) -> None:
    """The makers' command line: ``[--only NAME] [--work DIR]``, then *make_one(name, work)* for
    each of *names* (or the one asked for)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--only", default=None)
    ap.add_argument("--work", type=Path, default=Path(work))
    a = ap.parse_args()
    for name in names:
        if a.only in (None, name):
            make_one(name, a.work)


def main() -> None:
    run_makers(__doc__ or "", TRACES, make, "/tmp/dlreplay-stream-traces")


if __name__ == "__main__":
    main()
