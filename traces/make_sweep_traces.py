"""Regenerate ``traces/sweep/tiles_*``: POSIX-only captures (``--no-loader-hooks``) of
examples/tiles_h5.py for tests/test_inference_sweep.py (#44's first class).

One shared HDF5 file of small tiles (one chunk each), read in shuffled order by DataLoader
workers that are NOT persistent (a new pool forked every epoch: tiles_w2_*, tiles_w3_*), or
by the consumer itself or one persistent worker (tiles_w0_*, tiles_w1p_*). The variants
differ in every parameter the fixes infer: tiles in the file (samples per file), workers,
persistence, epochs and batch size. ``cosmo_*``: examples/cosmoflow_h5.py, HDF5 files of one
sample opened for every sample (whose metadata reads are no sample regions). ``expected.json`` holds the job's own report (its true parameters).

    python traces/make_sweep_traces.py [--only NAME] [--work /tmp/dlreplay-sweep-traces]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from dlreplay.capture import CaptureConfig, run_capture  # noqa: E402

#: name -> tiles_h5.py arguments (no --persistent-workers: a new pool every epoch)
TRACES: dict[str, list[str]] = {
    "tiles_w2_t128": [
        *("--num-files", "128", "--tile", "8", "--batch-size", "8"),
        *("--workers", "2", "--epochs", "2"),
    ],
    "tiles_w3_t96": [
        *("--num-files", "96", "--tile", "8", "--batch-size", "4"),
        *("--workers", "3", "--epochs", "3"),
    ],
    # many re-forked workers over few tiles: more opens of the file than twice its regions
    "tiles_w4_t16": [
        *("--num-files", "16", "--tile", "8", "--batch-size", "4"),
        *("--workers", "4", "--epochs", "2"),
    ],
    "tiles_w4_t24": [
        *("--num-files", "24", "--tile", "8", "--batch-size", "2"),
        *("--workers", "4", "--epochs", "3"),
    ],
    # the file held open without a pool per epoch: the consumer reads itself, or one persistent
    # worker reads (the passes split per region of the file)
    "tiles_w0_t64": [
        *("--num-files", "64", "--tile", "8", "--batch-size", "4"),
        *("--workers", "0", "--epochs", "2"),
    ],
    "tiles_w1p_t48": [
        *("--num-files", "48", "--tile", "8", "--batch-size", "4"),
        *("--workers", "1", "--epochs", "3", "--persistent-workers"),
    ],
    # examples/cosmoflow_h5.py: HDF5 files of one sample, opened for every sample; the metadata
    # read at each open (a few KiB) is no sample region
    "cosmo_w0_s1": [
        *("--num-files", "16", "--samples-per-file", "1", "--volume", "16", "--batch-size", "4"),
        *("--workers", "0", "--epochs", "2"),
    ],
    "cosmo_w2_s1": [
        *("--num-files", "24", "--samples-per-file", "1", "--volume", "16", "--batch-size", "4"),
        *("--workers", "2", "--epochs", "3"),
    ],
    # the consumer reads its own batches (no workers): compute per step from its idle time
    # before each batch (expected.json keeps the job's own step_compute_s)
    "cosmo_w0_b8": [
        *("--num-files", "32", "--samples-per-file", "1", "--volume", "16", "--batch-size", "8"),
        *("--workers", "0", "--epochs", "2"),
    ],
    "tiles_w0_b2": [
        *("--num-files", "24", "--tile", "8", "--batch-size", "2"),
        *("--workers", "0", "--epochs", "2"),
    ],
    # batch 1 without workers: no period in the consumer's gaps, so no batch size to find;
    # every sample's idle time stands for a step's (per-sample files; a held-open file)
    "cosmo_w0_b1": [
        *("--num-files", "12", "--samples-per-file", "1", "--volume", "16", "--batch-size", "1"),
        *("--workers", "0", "--epochs", "2"),
    ],
    "tiles_w0_b1": [
        *("--num-files", "20", "--tile", "8", "--batch-size", "1"),
        *("--workers", "0", "--epochs", "3"),
    ],
}


# too few changes of file for the share going forward (under 20): the order from a likelihood
# ratio, unshuffled (per-sample regions of 8-sample files read by one worker; a held-open
# file of 8 tiles read by 2 workers forked every epoch) and shuffled (the consumer reading
# 2 files of 8 samples, batch 1)
TRACES |= {
    "cosmo_w1_b16_ordered": [
        *("--num-files", "8", "--samples-per-file", "8", "--volume", "16", "--batch-size", "16"),
        *("--workers", "1", "--epochs", "2", "--no-shuffle"),
    ],
    "tiles_w2_b1_ordered": [
        *("--num-files", "8", "--tile", "8", "--batch-size", "1"),
        *("--workers", "2", "--epochs", "2", "--no-shuffle"),
    ],
    "cosmo_w0_s8_b1": [
        *("--num-files", "2", "--samples-per-file", "8", "--volume", "16", "--batch-size", "1"),
        *("--workers", "0", "--epochs", "2"),
    ],
}


# ranks under torchrun that read their own samples (no workers): 2 ranks with every file traced
# (the launcher reads its entry points twice, beside 8 sample files), 3 ranks and 1 rank with
# the data directory alone
TRACES |= {
    "ddp_w0_r2_all": [
        *("--num-files", "8", "--volume", "16", "--batch-size", "1", "--by-path"),
        *("--workers", "0", "--epochs", "2", "--threads", "1"),
    ],
    "ddp_w0_r3": [
        *("--num-files", "24", "--volume", "16", "--batch-size", "2", "--by-path"),
        *("--workers", "0", "--epochs", "3", "--threads", "1", "--no-shuffle"),
    ],
    "ddp_w0_r1": [
        *("--num-files", "16", "--volume", "16", "--batch-size", "4", "--by-path"),
        *("--workers", "0", "--epochs", "2", "--threads", "1"),
    ],
    # 2 ranks of 2 workers, every batch prefetched (2 a worker): the step from each rank's
    # epoch span over its own steps
    "ddp_w2_r2": [
        *("--num-files", "32", "--volume", "16", "--batch-size", "4", "--by-path"),
        *("--workers", "2", "--epochs", "3", "--threads", "1"),
    ],
}
# the job generates its dataset inside the capture (an empty folder), then reads it through
# handles its 2 persistent workers keep open across epochs: the generator's opens are no visits
TRACES |= {
    "cosmo_w2p_keep_gen": [
        *("--num-files", "12", "--samples-per-file", "2", "--volume", "16", "--batch-size", "4"),
        *("--workers", "2", "--epochs", "3", "--keep-open", "--persistent-workers"),
    ],
}
# NPZ files read through handles 2 persistent workers keep open across epochs: no open per
# sample, each access re-reads the zip through the kept handle (1 rank, compressed, 3 epochs;
# 2 ranks, 2 epochs)
TRACES |= {
    "ddp_w2p_keep_r1": [
        *("--num-files", "24", "--volume", "16", "--batch-size", "3", "--compressed"),
        *("--workers", "2", "--epochs", "3", "--persistent-workers", "--keep-open"),
        *("--threads", "1"),
    ],
    "ddp_w2p_keep_r2": [
        *("--num-files", "32", "--volume", "16", "--batch-size", "2"),
        *("--workers", "2", "--epochs", "2", "--persistent-workers", "--keep-open"),
        *("--threads", "1"),
    ],
}
#: traces whose job generates its dataset inside the capture
GENERATED_IN_CAPTURE = {"cosmo_w2p_keep_gen"}
#: torchrun's ranks of the ``ddp_*`` traces
RANKS = {
    "ddp_w0_r2_all": 2,
    "ddp_w0_r3": 3,
    "ddp_w0_r1": 1,
    "ddp_w2_r2": 2,
    "ddp_w2p_keep_r1": 1,
    "ddp_w2p_keep_r2": 2,
}


def make(name: str, work: Path) -> None:
    job = work / name
    if job.exists():
        shutil.rmtree(job)
    data, out, report = job / "data", job / "trace", job / "report.json"
    script = {"tiles": "tiles_h5.py", "ddp_w": "ddp_torchrun.py"}.get(name[:5], "cosmoflow_h5.py")
    base = [sys.executable, str(REPO / "examples" / script), "--data-dir", str(data)]
    base += [*TRACES[name], "--quiet"]
    if name not in GENERATED_IN_CAPTURE:
        subprocess.run([*base, "--generate-only"], check=True, capture_output=True)
    launch = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node")
    if name in RANKS:
        base[1:1] = [*launch, str(RANKS[name])]
    res = run_capture(
        CaptureConfig(
            command=(*base, "--report", str(report)),
            out=out,
            data_dirs=() if name.endswith("_all") else (str(data),),
            name=name,
            loader_hooks=False,
        )
    )
    if res.exit_code != 0:
        raise SystemExit(f"{name}: job failed ({res.exit_code})")
    dest = HERE / "sweep" / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in sorted(out.iterdir()):
        if f.name.endswith(".pfw"):
            with open(f, "rb") as src, gzip.open(dest / (f.name + ".gz"), "wb", 9) as dst:
                shutil.copyfileobj(src, dst)
        elif f.is_file():
            shutil.copy(f, dest / f.name)
    rep = json.loads(report.read_text())
    args = rep["args"]
    expected = {
        "source": f"examples/{script} captured with dlreplay capture --no-loader-hooks",
        "model": {
            "format": "npz" if name in RANKS else "hdf5",
            "num_files": 1 if script == "tiles_h5.py" else args["num_files"],
            "num_samples_per_file": args["num_files"]
            if script == "tiles_h5.py"
            else args.get("samples_per_file", 1),
            "ranks": rep.get("world_size", 1),
            "batch_size": args["batch_size"],
            "read_threads": args["workers"],
            "persistent_workers": args["persistent_workers"],
            "epochs": rep["epochs"],
            "shuffle": args.get("shuffle", True),
        },
        "job": {"step_compute_s": rep["step_compute_s"], "epoch_times_s": rep.get("epoch_times_s")},
    }
    (dest / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"{name}: {size / 1024:.0f} KiB -> {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", action="append", choices=sorted(TRACES))
    ap.add_argument("--work", type=Path, default=Path("/tmp/dlreplay-sweep-traces"))
    args = ap.parse_args()
    for name in args.only or sorted(TRACES):
        make(name, args.work)


if __name__ == "__main__":
    main()
