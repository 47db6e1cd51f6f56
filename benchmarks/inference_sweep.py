"""How often distill infers each field right, over a grid of real runs (#44).

Two kinds of real runs, each distilled without its configuration:

* the example jobs (``examples/*.py``) captured with ``dlreplay capture --no-loader-hooks``:
  DFTracer's preload alone, POSIX events only (what a user without the hooks has);
* DLIO 2.0.0 runs traced by DLIO itself (``DFTRACER_ENABLE=1``), distilled twice: the whole
  trace (DLIO's own annotations) and its POSIX/STDIO events alone.

The grid: workers 0, 1, 2, 4, 8; persistent workers on/off; samples per file 1, 2, 4, 8, 16;
batch 1..64; shuffle on/off; 1 and 2 ranks (DLIO under mpiexec); checkpoints on/off; the
formats the examples write (npz, hdf5 per sample and one HDF5 file of tiles, jpeg, png, tar
shards streamed by an ``IterableDataset`` through tarfile or webdataset, samples of 2 or 3
NPY or PNG files named by a suffix or a folder, JSON lines of ``16 x spf`` lines a file read by
``seek`` + ``readline`` and indexed by a scan or side files: the source's ``variant``, in its
name) and DLIO's npz, npy, hdf5, jpeg and indexed_binary. The design is fractional and balanced: for each
source its factors' levels are dealt out in seeded permutations, so every level of every
factor appears about equally often; interactions are sampled, not crossed. Levels a source
cannot take are mapped to the nearest it can (the examples' npz/jpeg files hold one sample,
DLIO's loader always keeps its workers, examples run one rank but ``ddp_torchrun`` (1-3
ranks) and ``shards_tar`` (1-2), which run under ``torchrun`` with every file traced).

Runs are cached under ``bench-data/inference_sweep/<config>/`` (the trace, and
``result.json``: the truth, and the distilled fields with their confidence and evidence); a
cached configuration is not run again, only distilled again with the code as it is. For each field it prints how often the value is exact (counts, formats,
booleans) or within 5 % (times), per confidence (measured: high, inferred: medium, default:
a guess), every miss with its configuration, and the high-confidence fields that were wrong.

    python benchmarks/inference_sweep.py [--limit N] [--subset examples|dlio|NAME-PREFIX]
        [--dlio-venv /work/dlio-venv] [--dir bench-data/inference_sweep] [--list]
        [--batches-per-worker K]   # K batches per worker an epoch (default 2, all prefetched)
    python benchmarks/inference_sweep.py --versus   # against dftracer_gen_dlio_config
    python benchmarks/inference_sweep.py --replay N [--seed S] [--as-sleep]   # distill, generate,
        # replay and compare N cached configurations drawn with seed S: similarity and epoch
        # times each (--as-sleep: the compute a pure sleep, the host-CPU inference ablated)
    python benchmarks/inference_sweep.py --between-reads-ab R   # the cached runs without workers
        # replayed R times each with train.timed_between_reads on and off, interleaved: the
        # last epoch's error against the job's, both ways, and the paired difference
    python benchmarks/inference_sweep.py --subset examples --dir bench-data/inference_sweep_rep2
    python benchmarks/inference_sweep.py --subset examples --self-similarity bench-data/inference_sweep_rep2
        # each job against its second run: the similarity metric's own floor
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "traces"))

SCHEMA = {"schema": "dlreplay.inference_sweep.result", "format_version": 1}

WORKERS = (0, 1, 2, 4, 8)
SPF = (1, 2, 4, 8, 16)
BATCH = (1, 2, 4, 8, 16, 32, 64)
#: source -> (how many configurations, the factors it varies)
SOURCES: dict[str, int] = {
    "unet3d_npz": 24,
    "cosmoflow_h5": 24,
    "tiles_h5": 24,
    "resnet_jpeg": 16,
    "resnet_png": 8,
    "shards_tar": 16,
    "ddp_torchrun": 12,
    "paired_files": 12,
    "jsonl_lines": 12,
    "dlio_npz": 16,
    "dlio_hdf5": 16,
    "dlio_jpeg": 16,
    "dlio_indexed_binary": 16,
    # np.load a sample: the array's read DFTracer does not see, recovered by the loader
    "dlio_npy": 16,
}
#: fields compared: model path -> kind (exact or within 5 %)
FIELDS = {
    "train.epochs": "exact",
    "reader.read_threads": "exact",
    "dataset.num_samples_per_file": "exact",
    "dataset.num_files": "exact",
    "reader.batch_size": "exact",
    "dataset.format": "exact",
    "reader.persistent_workers": "exact",
    "processes.ranks": "exact",
    "reader.sample_shuffle": "exact",
    "checkpoint.enabled": "exact",
    "dataset.record_length": "5%",
    "train.computation_time": "5%",
    "dataset.files_per_sample": "exact",
}


def grid(seed: int = 44, per_worker: int = 2) -> list[dict[str, Any]]:
    """Every configuration of the fractional design, in a fixed order (see the module doc);
    *per_worker*: batches per loader worker an epoch (:func:`_files`)."""
    out = []
    for source, n in SOURCES.items():
        rng = random.Random(f"{seed}-{source}")

        def deal(levels: tuple, n: int = n, rng: random.Random = rng) -> list:
            order = list(levels) * (n // len(levels) + 1)
            rng.shuffle(order)
            return order[:n]

        cols = {
            "workers": deal(WORKERS),
            "persistent": deal((True, False)),
            "spf": deal(SPF),
            "batch": deal(BATCH),
            "shuffle": deal((True, False)),
            "ranks": deal((1, 2, 3) if source == "ddp_torchrun" else (1, 2)),
            "checkpoint": deal((True, False)),
        }
        for i in range(n):
            c = {k: v[i] for k, v in cols.items()}
            c["source"] = source
            if per_worker != 2:
                c["per_worker"] = per_worker
            out.append(_feasible(c))
    for c in out:
        c["name"] = _name(c)
    # sources interleaved, so that any --limit N runs a varied part
    by_source: dict[str, list[dict[str, Any]]] = {}
    for c in out:
        by_source.setdefault(c["source"], []).append(c)
    rounds = max(len(v) for v in by_source.values())
    return [v[i] for i in range(rounds) for v in by_source.values() if i < len(v)]


def _feasible(c: dict[str, Any]) -> dict[str, Any]:
    """The configuration a source can run: its fixed factors set."""
    s = c["source"]
    if s.startswith("dlio_"):
        c["persistent"] = True  # DLIO 2.0's TorchDataLoader keeps its workers
        c["workers"] = max(c["workers"], 1)  # DLIO 2.0 with read_threads 0 reads in the consumer
        c["batch"] = min(c["batch"], 16)
    elif s == "ddp_torchrun":  # ranks under torchrun, each with its own workers
        c["spf"] = 1
        c["workers"] = min(c["workers"], 4 if c["ranks"] == 1 else 2)  # 2 cores
    elif s == "shards_tar":  # 2 ranks under torchrun; a shard of one sample is a file a sample
        c["spf"] = max(c["spf"], 2)
        c["workers"] = min(c["workers"], 8 if c["ranks"] == 1 else 4)  # 2 cores
    elif s == "paired_files":  # a sample of 2 or 3 files, NPY or PNG, named by suffix or folder
        c["ranks"] = 1
        c["variant"] = (
            ("png" if c["spf"] in (2, 8) else "npy")
            + ("3" if c["batch"] in (1, 4, 16, 64) else "2")
            + ("f" if c["spf"] in (4, 16) else "s")
        )
        c["spf"] = 1
    elif s == "jsonl_lines":  # 16 x spf lines a file; the index a scan or side files
        c["ranks"] = 1
        c["variant"] = ("scan" if c["batch"] in (1, 4, 16, 64) else "idx") + (
            "S" if c["shuffle"] else "L"
        )
    else:
        c["ranks"] = 1
        if s in ("unet3d_npz", "resnet_jpeg", "resnet_png"):
            c["spf"] = 1
    if c["workers"] == 0:
        c["persistent"] = False
    return c


def _name(c: dict[str, Any]) -> str:
    return (
        f"{c['source']}-w{c['workers']}{'p' if c['persistent'] else ''}-s{c['spf']}-b{c['batch']}"
        f"-{'sh' if c['shuffle'] else 'ns'}-r{c['ranks']}{'-ck' if c['checkpoint'] else ''}"
        + (f"-{c['variant']}" if c.get("variant") else "")
        + (f"-q{c['per_worker']}" if c.get("per_worker", 2) != 2 else "")
    )


def _files(c: dict[str, Any]) -> int:
    """Files so that an epoch has ``per_worker`` batches per worker (2 unless the
    configuration says; a worker without a batch reads nothing, and no trace can show it),
    and twice that per rank without workers (at least 2 files). With 2 every worker's batches
    are prefetched at the epoch's start (``prefetch_factor`` 2), so no read waits for the
    consumer; with more, the workers reach a steady state paced by the slower of the loader
    and the consumer's steps."""
    k = int(c.get("per_worker", 2))
    samples = max(2 * k, k * c["workers"]) * c["batch"] * c["ranks"]
    return max(2, -(-samples // c["spf"]))


# ---------------------------------------------------------------------------- examples


def _capture_posix(
    c: dict[str, Any], job: Path, script: str, args: list[str], ranks: int = 0
) -> dict[str, Any]:
    """Generate the dataset of ``examples/<script>.py`` with *args* in ``job/data``, capture the
    job POSIX-only into ``job/trace`` and return its report; with *ranks*, the job runs under
    ``torchrun`` with that many ranks and every file is traced, as a capture without
    ``--data-dir`` does (the job's report and the launcher's files in the trace too)."""
    from dlreplay.capture import CaptureConfig, run_capture

    data, report = job / "data", job / "report.json"
    script_args = [str(REPO / "examples" / f"{script}.py"), "--data-dir", str(data)]
    script_args += [*args, "--quiet"]
    subprocess.run(
        [sys.executable, *script_args, "--generate-only"], check=True, capture_output=True
    )
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    base = [sys.executable, *(launch if ranks else []), *script_args]
    res = run_capture(
        CaptureConfig(
            command=(*base, "--report", str(report)),
            out=job / "trace",
            # the checkpoint directory too where the job writes one: a POSIX-only trace of the
            # data directory alone cannot show a checkpoint (DFTRACER_DATA_DIR=all would)
            data_dirs=()
            if ranks
            else (str(data), str(job / "ckpt"))
            if c["checkpoint"]
            else (str(data),),
            name=c["name"],
            loader_hooks=False,
        )
    )
    if res.exit_code != 0:
        raise RuntimeError(f"job failed ({res.exit_code})")
    return json.loads(report.read_text())


def run_example(c: dict[str, Any], job: Path) -> dict[str, Any]:
    """Capture the example job POSIX-only; returns the truth from its report."""
    s = c["source"]
    script = {"resnet_png": "resnet_jpeg"}.get(s, s)
    files = _files(c)
    args = ["--batch-size", str(c["batch"]), "--workers", str(c["workers"]), "--epochs", "2"]
    args += ["--shuffle" if c["shuffle"] else "--no-shuffle", "--num-files"]
    if s == "tiles_h5":
        args += [str(files * c["spf"]), "--tile", "16"]
    else:
        args += [str(files)]
    if s == "cosmoflow_h5":
        args += ["--samples-per-file", str(c["spf"]), "--volume", "16"]
    if s == "unet3d_npz":
        args += ["--volume", "16"]
    if s.startswith("resnet"):
        args += ["--format", "png" if s == "resnet_png" else "jpeg", "--image-size", "32"]
    if c["persistent"] and c["workers"]:
        args.append("--persistent-workers")
    if c["checkpoint"]:
        args += ["--checkpoint-every-epoch", "--checkpoint-dir", str(job / "ckpt")]
    rep = _capture_posix(c, job, script, args)
    steps = rep.get("step_compute_s") or []
    tail = sorted(steps[1:] or steps)
    return {
        "train.epochs": rep["epochs"],
        "reader.read_threads": c["workers"],
        "dataset.num_samples_per_file": files * c["spf"] if s == "tiles_h5" else c["spf"],
        "dataset.num_files": 1 if s == "tiles_h5" else files,
        "reader.batch_size": c["batch"],
        "dataset.format": {"resnet_jpeg": "jpeg", "resnet_png": "png", "unet3d_npz": "npz"}.get(
            s, "hdf5"
        ),
        "reader.persistent_workers": c["persistent"] if c["workers"] else None,
        "processes.ranks": 1,
        "reader.sample_shuffle": "seed" if c["shuffle"] else "off",
        "checkpoint.enabled": c["checkpoint"],
        "train.computation_time": tail[len(tail) // 2] if tail else None,
    }


def run_family(c: dict[str, Any], job: Path) -> dict[str, Any]:
    """Capture ``examples/paired_files.py`` (a sample of 2 or 3 files, NPY or PNG, named by a
    suffix or a folder: ``variant``) or ``examples/jsonl_lines.py`` (``16 x spf`` JSON lines a
    file, indexed by a scan or ``.idx.npy`` side files, lines of 200-1200 B shuffled, 400-2000
    B in order) POSIX-only; returns the truth from its report and its files."""
    s, v = c["source"], c["variant"]
    samples = _files(c) * (16 * c["spf"] if s == "jsonl_lines" else 1)
    args = ["--batch-size", str(c["batch"]), "--workers", str(c["workers"]), "--epochs", "2"]
    args += ["--shuffle" if c["shuffle"] else "--no-shuffle"]
    if s == "paired_files":
        parts, files = int(v[3]), samples
        args += ["--num-files", str(files), "--format", v[:3], "--parts", str(parts)]
        args += ["--naming", "folders" if v[4] == "f" else "suffix"]
    else:
        lines = 16 * c["spf"]
        files = max(2, -(-samples // lines))
        args += ["--num-files", str(files), "--lines", str(lines)]
        args += ["--index", "scan" if v.startswith("scan") else "sidecar"]
        args += ["--min-line", "200", "--max-line", "1200"] if c["shuffle"] else []
        args += [] if c["shuffle"] else ["--min-line", "400", "--max-line", "2000"]
    if c["persistent"] and c["workers"]:
        args.append("--persistent-workers")
    if c["checkpoint"]:
        args += ["--checkpoint-every-epoch", "--checkpoint-dir", str(job / "ckpt")]
    rep = _capture_posix(c, job, s, args)
    steps = sorted((rep.get("step_compute_s") or [])[1:])
    truth = {
        "train.epochs": rep["epochs"],
        "reader.read_threads": c["workers"],
        "reader.batch_size": c["batch"],
        "reader.persistent_workers": c["persistent"] if c["workers"] else None,
        "processes.ranks": 1,
        "reader.sample_shuffle": "seed" if c["shuffle"] else "off",
        "checkpoint.enabled": c["checkpoint"],
        "train.computation_time": steps[len(steps) // 2] if steps else None,
    }
    if s == "paired_files":
        return {
            **truth,
            "dataset.num_samples_per_file": 1,
            "dataset.num_files": files * parts,
            "dataset.format": v[:3],
            "dataset.files_per_sample": parts,
        }
    data = sorted((job / "data").glob("*.jsonl"))
    line_bytes = [len(x) for f in data for x in f.read_bytes().splitlines(keepends=True)]
    return {
        **truth,
        "dataset.num_samples_per_file": 16 * c["spf"],
        "dataset.num_files": len(data),
        "dataset.format": "raw",
        "dataset.record_length": float(np.mean(line_bytes)),
        "dataset.files_per_sample": 1,
    }


def run_shards(c: dict[str, Any], job: Path) -> dict[str, Any]:
    """Capture ``examples/shards_tar.py`` POSIX-only: tar shards of ``spf`` samples of 30 kB
    (two of tarfile's reads and more) streamed by an ``IterableDataset``; ``shuffle`` picks the
    library (an ``IterableDataset`` has no sampler to shuffle): webdataset, else tarfile; the
    split alternates with the batch size; 2 ranks run under ``torchrun`` (the shards split
    over the ranks, then their workers; every file traced). Returns the truth from its report
    and its shards."""
    data = job / "data"
    files = max(_files(c), c["workers"] * c["ranks"], c["ranks"])  # every worker a shard at least
    args = ["--batch-size", str(c["batch"]), "--workers", str(c["workers"]), "--epochs", "2"]
    args += ["--num-files", str(files), "--samples-per-shard", str(c["spf"])]
    args += ["--sample-bytes", "30000", "--threads", "1"]
    args += ["--reader", "webdataset" if c["shuffle"] else "tarfile"]
    args += ["--split", "contiguous" if c["batch"] in (2, 8, 32) else "interleaved"]
    if c["persistent"] and c["workers"]:
        args.append("--persistent-workers")
    if c["checkpoint"]:
        args += ["--checkpoint-every-epoch", "--checkpoint-dir", str(job / "ckpt")]
    rep = _capture_posix(c, job, "shards_tar", args, ranks=c["ranks"] if c["ranks"] > 1 else 0)
    steps = sorted((rep.get("step_compute_s") or [])[1:])
    shards = sorted(data.glob("*.tar"))
    return {
        "train.epochs": rep["epochs"],
        "reader.read_threads": c["workers"],
        "dataset.num_samples_per_file": c["spf"],
        "dataset.num_files": len(shards),
        "reader.batch_size": c["batch"],
        "dataset.format": "tar",
        "reader.persistent_workers": c["persistent"] if c["workers"] else None,
        "processes.ranks": c["ranks"],
        "reader.sample_shuffle": "off",
        "checkpoint.enabled": c["checkpoint"],
        "dataset.record_length": float(np.mean([p.stat().st_size for p in shards])) / c["spf"],
        "train.computation_time": steps[len(steps) // 2] if steps else None,
    }


def run_torchrun(c: dict[str, Any], job: Path) -> dict[str, Any]:
    """Capture ``examples/ddp_torchrun.py`` POSIX-only under ``torchrun`` with ``ranks`` ranks
    (gloo DDP, a ``DistributedSampler``, each rank its own workers, rank 0 ``torch.save``\\ s
    every epoch with ``checkpoint``), every file traced; returns the truth from its report."""
    args = ["--batch-size", str(c["batch"]), "--workers", str(c["workers"]), "--epochs", "2"]
    args += ["--shuffle" if c["shuffle"] else "--no-shuffle", "--num-files", str(_files(c))]
    args += ["--volume", "16", "--by-path", "--threads", "1"]
    if c["persistent"] and c["workers"]:
        args.append("--persistent-workers")
    if c["checkpoint"]:
        args += ["--checkpoint-every-epoch", "--checkpoint-dir", str(job / "ckpt")]
    rep = _capture_posix(c, job, "ddp_torchrun", args, ranks=c["ranks"])
    steps = sorted((rep.get("step_compute_s") or [])[1:])
    return {
        "train.epochs": rep["epochs"],
        "reader.read_threads": c["workers"],
        "dataset.num_samples_per_file": 1,
        "dataset.num_files": _files(c),
        "reader.batch_size": c["batch"],
        "dataset.format": "npz",
        "reader.persistent_workers": c["persistent"] if c["workers"] else None,
        "processes.ranks": c["ranks"],
        "reader.sample_shuffle": "seed" if c["shuffle"] else "off",
        "checkpoint.enabled": c["checkpoint"],
        "train.computation_time": steps[len(steps) // 2] if steps else None,
    }


# ---------------------------------------------------------------------------- DLIO


def run_dlio_job(c: dict[str, Any], job: Path, venv: Path) -> dict[str, Any]:
    """A DLIO 2.0.0 run traced by DLIO (make_dlio_corpus.run_dlio); returns its truth."""
    import make_dlio_corpus as mdc

    fmt = c["source"][len("dlio_") :]
    files = _files(c)
    workload: dict[str, Any] = {
        "model": {"name": c["name"].replace("-", "_")},
        "framework": "pytorch",
        "workflow": {"checkpoint": c["checkpoint"]},
        "dataset": {
            "format": fmt,
            "num_files_train": files,
            "num_samples_per_file": c["spf"],
            "record_length": 16 << 10,
            "record_length_stdev": 0,
            "record_length_resize": 0,
        },
        "reader": {
            "data_loader": "pytorch",
            "batch_size": c["batch"],
            "read_threads": c["workers"],
            "file_shuffle": "seed" if c["shuffle"] else "off",
            "sample_shuffle": "seed" if c["shuffle"] else "off",
        },
        "train": {"epochs": 2, "computation_time": 0.01},
    }
    if c["checkpoint"]:
        workload["checkpoint"] = {"steps_between_checkpoints": 2}
        workload["model"]["model_size"] = 1 << 20
    data, out = job / "data", job / "out"

    def config(generate: bool) -> dict[str, Any]:
        w = json.loads(json.dumps(workload))
        w["workflow"].update({"generate_data": generate, "train": not generate})
        if generate:
            w["workflow"]["checkpoint"] = False
            # DLIO 2.0 draws generation_buffer_size (default 2 GiB) of random bytes for each
            # HDF5 or indexed-binary file it generates, whatever the file's size: 4 s a file
            # here. 16 MiB still covers every file of this grid in one draw (the bytes are
            # random either way); the traced run is not affected
            w["dataset"]["generation_buffer_size"] = 16 << 20
        w["dataset"]["data_folder"] = str(data)
        w["output"] = {"folder": str(job / ("gen-out" if generate else "out"))}
        if w["workflow"].get("checkpoint"):
            w["checkpoint"]["checkpoint_folder"] = str(job / "ckpt")
        return w

    mdc.run_dlio(venv, config(True), job / "conf-gen", job, trace=False, ranks=c["ranks"])
    mdc.run_dlio(venv, config(False), job / "conf", job, trace=True, ranks=c["ranks"])
    (job / "trace").mkdir()
    for t in sorted(out.glob("*.pfw")):
        shutil.move(str(t), job / "trace" / t.name)
    return {
        "train.epochs": 2,
        "reader.read_threads": c["workers"],
        "dataset.num_samples_per_file": c["spf"],
        "dataset.num_files": files,
        "reader.batch_size": c["batch"],
        "dataset.format": fmt,
        "reader.persistent_workers": True,
        "processes.ranks": c["ranks"],
        "reader.sample_shuffle": "seed" if c["shuffle"] else "off",
        "checkpoint.enabled": c["checkpoint"],
        # a JPEG's record_length is DLIO's pixels, not the compressed file's bytes: not compared
        "dataset.record_length": None if fmt == "jpeg" else 16 << 10,
        "train.computation_time": 0.01,
    }


#: DLIO 2.0's own event of the step's compute (its ``sleep(computation_time)``, timed by DLIO)
DLIO_COMPUTE = "TorchFramework.compute"


def dlio_compute(trace: Path) -> float | None:
    """What a DLIO run's compute per step took, by DLIO's own clock: the median (upper, as
    for the examples' steps) of its compute events, each rank's first left out. DLIO sleeps
    ``computation_time`` (0.01 s here); on this loaded VM its sleeps lasted 10-18 ms, and the
    run is what a replay reproduces (the configured value is kept as ``.config``)."""
    import polars as pl

    from dlreplay.analyze import load_trace

    ev = load_trace(trace).events.filter(pl.col("name").cast(pl.String) == DLIO_COMPUTE)
    tail = (
        ev.sort("ts")
        .filter(pl.int_range(pl.len()).over("pid") > 0)["dur"]
        .drop_nulls()
        .sort()
        .to_list()
    )
    return tail[len(tail) // 2] * 1e-6 if tail else None


# ---------------------------------------------------------------------------- distill


def _value(model: Any, path: str) -> Any:
    if path == "train.computation_time":
        d = model.train.computation_time
        return d.quantiles.get("p50") if d.is_known and d.quantiles else d.mean
    if path == "dataset.record_length":
        return model.dataset.record_length.mean
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def distilled(trace: Path, posix_only: bool) -> dict[str, Any]:
    """Each compared field's value, confidence and evidence, and distill's notes."""
    import polars as pl

    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill import distill

    lt = load_trace(trace)
    ev = lt.events
    if posix_only:
        ev = ev.filter(pl.col("cat").is_in(["POSIX", "STDIO"])).with_columns(
            pl.lit(None, pl.String).alias("role")
        )
    model = distill(ev, manifest=lt.manifest, source=str(trace))  # as `dlreplay distill DIR`
    f = model.provenance.fields
    out = {}
    for path in FIELDS:
        p = f.get(path)
        out[path] = {
            "value": _value(model, path),
            "confidence": p.confidence if p else "default",
            "evidence": p.method if p else "",
        }
    guesses = [n for n in model.provenance.notes if n.startswith("guess:")]
    return {"fields": out, "guesses": guesses}


def run_one(c: dict[str, Any], root: Path, venv: Path) -> dict[str, Any]:
    """The cached run of configuration ``c`` (its trace and truth), running it when not
    cached, distilled with the code as it is now (a cached run is distilled again)."""
    job = root / c["name"]
    cached = job / "result.json"
    if cached.exists():
        result = json.loads(cached.read_text())
        result["truth"].setdefault("reader.sample_shuffle", "seed" if c["shuffle"] else "off")
        result["truth"].setdefault("checkpoint.enabled", c["checkpoint"])
        if c["source"].startswith("dlio_"):
            result["truth"]["dataset.record_length"] = (
                None if c["source"] == "dlio_jpeg" else 16 << 10
            )
    else:
        if job.exists():
            shutil.rmtree(job)
        job.mkdir(parents=True)
        t0 = time.monotonic()
        if c["source"].startswith("dlio_"):
            truth = run_dlio_job(c, job, venv)
        elif c["source"] == "shards_tar":
            truth = run_shards(c, job)
        elif c["source"] == "ddp_torchrun":
            truth = run_torchrun(c, job)
        elif c["source"] in ("paired_files", "jsonl_lines"):
            truth = run_family(c, job)
        else:
            truth = run_example(c, job)
        result = {**SCHEMA, "config": c, "truth": truth, "run_s": round(time.monotonic() - t0, 1)}
        shutil.rmtree(job / "data", ignore_errors=True)  # the trace stays
    if c["source"].startswith("dlio_"):
        result["truth"]["train.computation_time"] = dlio_compute(job / "trace")
        result["truth"]["train.computation_time.config"] = 0.01
        views = {"dlio": distilled(job / "trace", False), "posix": distilled(job / "trace", True)}
    else:
        views = {"posix": distilled(job / "trace", False)}
    result["views"] = views
    cached.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


# ---------------------------------------------------------------------------- report


def right(kind: str, got: Any, want: Any) -> bool:
    if kind == "5%":
        return got is not None and want not in (None, 0) and abs(got - want) <= 0.05 * abs(want)
    return got == want


def report(results: list[dict[str, Any]]) -> int:
    """Print the per-field table, the misses and the wrong high-confidence fields; returns how
    many high-confidence fields were wrong."""
    stats: dict[tuple[str, str], dict[str, list[int]]] = {}
    misses, high_wrong = [], []
    for r in results:
        for view, got in r["views"].items():
            for path, kind in FIELDS.items():
                want = r["truth"].get(path)
                if want is None:
                    continue
                g = got["fields"][path]
                ok = int(right(kind, g["value"], want))
                s = stats.setdefault((view, path), {})
                s.setdefault(g["confidence"], [0, 0])
                s[g["confidence"]][0] += ok
                s[g["confidence"]][1] += 1
                if not ok:
                    misses.append((r["config"]["name"], view, path, g, want))
                    if g["confidence"] == "measured":
                        high_wrong.append((r["config"]["name"], view, path))
    print(f"{len(results)} configurations\n")
    print("| view | field | right / all | measured (high) | inferred | default (guess) |")
    print("|---|---|---|---|---|---|")
    for (view, path), s in sorted(stats.items()):
        good = sum(v[0] for v in s.values())
        n = sum(v[1] for v in s.values())
        cells = [
            f"{s[c][0]}/{s[c][1]}" if c in s else "-" for c in ("measured", "inferred", "default")
        ]
        print(f"| {view} | {path} | {good}/{n} ({good / n:.0%}) | " + " | ".join(cells) + " |")
    print(f"\nmisses ({len(misses)}):")
    for name, view, path, g, want in misses:
        val = g["value"]
        shown = f"{val:.4g}" if isinstance(val, float) else val
        print(
            f"  {name} [{view}] {path}: {shown} (truth {want}; {g['confidence']}: {g['evidence'][:110]})"
        )
    tot = {c: [0, 0] for c in ("measured", "inferred", "default")}
    for st in stats.values():
        for c, (k, n) in st.items():
            tot[c][0] += k
            tot[c][1] += n
    ok_all, n_all = sum(v[0] for v in tot.values()), sum(v[1] for v in tot.values())
    print(
        f"\nall fields: {ok_all}/{n_all} right ({ok_all / max(n_all, 1):.1%}); "
        + "; ".join(
            f"{c}: {v[0]}/{v[1]} ({v[0] / max(v[1], 1):.1%})" for c, v in tot.items() if v[1]
        )
        + " (default = distill says it could not infer the field: a guess)"
    )
    claimed = (
        [tot[c][0] for c in ("measured", "inferred")],
        [tot[c][1] for c in ("measured", "inferred")],
    )
    print(
        f"fields distill claims (measured or inferred, not said to be a guess): "
        f"{sum(claimed[0])}/{sum(claimed[1])} right ({sum(claimed[0]) / max(sum(claimed[1]), 1):.1%})"
    )
    cfg = [
        (view, int(right("5%", got["fields"]["train.computation_time"]["value"], want)))
        for r in results
        if (want := r["truth"].get("train.computation_time.config")) is not None
        for view, got in r["views"].items()
    ]
    for view in sorted({v for v, _ in cfg}):
        hits = [k for v, k in cfg if v == view]
        print(
            f"DLIO train.computation_time [{view}] against its configured sleep (0.01 s) "
            f"instead of its own compute events: {sum(hits)}/{len(hits)}"
        )
    print(f"\nhigh-confidence (measured) fields wrong: {len(high_wrong)}")
    by_field: dict[str, int] = {}
    for _, view, path in high_wrong:
        by_field[f"{path} [{view}]"] = by_field.get(f"{path} [{view}]", 0) + 1
    for key, n in sorted(by_field.items()):
        print(f"   {key}: {n}")
    for h in high_wrong:
        print("  ", *h)
    return len(high_wrong)


#: DLIO 2.0.0's own event names for dftracer_gen_dlio_config's components (its defaults are
#: the AI conventions' dataloader/fetch.block, data/preprocess, ...)
DLIO2_EVENT_MAP = """fetch_block: {cat: ai_framework, name: TorchFramework.compute}
fetch_iter: {cat: dlio_benchmark, name: "<module>.iter"}
preprocess: {cat: reader, name: FormatReader.preprocess}
item: {cat: data_loader, name: TorchDataset.__getitem__}
"""
#: committed traces for the head-to-head (truth in each one's expected.json)
VERSUS = (
    "ai_annotated",
    "dlio_h5_multi",
    "dlio_npz_starved",
    "dlio_jpeg_ckpt",
    "sweep/dlio_hdf5_8spf",
    "sweep/dlio_npz_4spf",
)


def _mixture_mean(d: dict[str, Any] | None) -> float | None:
    """The mean of dftracer_gen_dlio_config's distribution (a mixture of normals, or one)."""
    if not isinstance(d, dict):
        return None
    if d.get("type") == "mixture":
        return sum(c["weight"] * c["params"]["mean"] for c in d.get("components", []))
    return d.get("mean")


def versus(work: Path) -> None:
    """dftracer_gen_dlio_config (dftracer-utils) against distill on the same committed traces:
    which of the compared fields each recovers, and how close (a markdown table)."""
    tool = shutil.which("dftracer_gen_dlio_config") or str(
        Path(sys.executable).parent / "dftracer_gen_dlio_config"
    )
    (work / "versus").mkdir(parents=True, exist_ok=True)
    emap = work / "versus" / "dlio2-event-map.yaml"
    emap.write_text(DLIO2_EVENT_MAP)
    keys = {
        "train.epochs": "epochs",
        "reader.read_threads": "read_threads",
        "dataset.num_samples_per_file": "num_samples_per_file",
        "dataset.num_files": "num_files",
        "reader.batch_size": "batch_size",
        "dataset.format": "format",
        "train.computation_time": "computation_time",
    }
    print(
        "| trace | truth: epochs / workers / samples per file / files / batch / format / "
        "compute s | distill: right (confidence) | distill, POSIX events only | "
        "dftracer_gen_dlio_config: recovered, right |"
    )
    print("|---|---|---|---|---|")
    for name in VERSUS:
        trace = REPO / "traces" / name
        truth = json.loads((trace / "expected.json").read_text())["model"]
        d = distilled(trace, False)["fields"]
        out = _gen_dlio_config(tool, trace, work / "versus" / name.replace("/", "_"), emap, truth)
        want = [truth[k] for k in keys.values()]
        mine = [right(FIELDS[p], d[p]["value"], truth[k]) for p, k in keys.items()]
        confs = sorted({d[p]["confidence"] for p in keys})
        px = distilled(trace, True)["fields"]
        px_ok = sum(int(right(FIELDS[p], px[p]["value"], truth[k])) for p, k in keys.items())
        theirs = _mixture_mean(((out or {}).get("train") or {}).get("computation_time"))
        got = f"1 of {len(keys)} (compute {theirs:.4g} s)" if theirs is not None else "0"
        ok = theirs is not None and right("5%", theirs, truth["computation_time"])
        print(
            f"| {name} | {' / '.join(f'{w:.3g}' if isinstance(w, float) else str(w) for w in want)} "
            f"| {sum(mine)} of {len(keys)} ({', '.join(confs)}) | {px_ok} of {len(keys)} "
            f"| {got}, {int(ok)} right |"
        )


def _gen_dlio_config(
    tool: str, trace: Path, job: Path, emap: Path, truth: dict[str, Any]
) -> dict[str, Any] | None:
    """dftracer_gen_dlio_config's YAML for ``trace`` (None when it wrote none)."""
    import yaml

    shutil.rmtree(job, ignore_errors=True)
    (job / "in").mkdir(parents=True)
    for f in trace.glob("*.pfw.gz"):
        shutil.copy(f, job / "in" / f.name)
    cmd = [tool, "-d", str(job / "in"), "-o", str(job / "out.yaml"), "--index-dir"]
    cmd += [str(job / "idx"), "--num-workers", str(truth["read_threads"]), "-t", "100"]
    if trace.name != "ai_annotated":  # DLIO 2.0's own event names
        cmd += ["--event-map", str(emap)]
    subprocess.run(cmd, capture_output=True, text=True)
    return yaml.safe_load((job / "out.yaml").read_text()) if (job / "out.yaml").exists() else None


REPLAY_SCHEMA = {"schema": "dlreplay.inference_sweep.replay", "format_version": 1}
#: the issue's target for the replay of every configuration
SIMILARITY_TARGET = 0.97


def replay_one(c: dict[str, Any], root: Path, as_sleep: bool = False) -> dict[str, Any]:
    """Distill the cached run of ``c`` (its trace as captured: POSIX-only for the examples,
    DLIO's own annotations for DLIO), generate its dataset, replay it traced and compare the
    two traces: similarity, epoch times (job's and replay's, s) and the model's loop fields.
    Saved as ``replay.json`` in the run's folder; the replay's dataset is removed after.
    ``as_sleep``: distilled as from a capture that did not record the host's accelerators
    (its compute a pure sleep: the ablation of the host-CPU inference)."""
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.compare import compare_traces
    from dlreplay.analyze.distill import distill
    from dlreplay.replay import ReplayConfig, run_replay

    job = root / c["name"]
    lt = load_trace(job / "trace")
    manifest = dict(lt.manifest or {})
    if as_sleep:
        manifest.pop("accelerators", None)
    # the trace's folder: its dataset fingerprint (the layout: chunks, arrays) is read there
    model = distill(lt.events, manifest=manifest, source=str(job / "trace"))
    out, data = job / "replay", job / "replay-data"
    for p in (out, data):
        shutil.rmtree(p, ignore_errors=True)
    t0 = time.monotonic()
    try:
        res = run_replay(ReplayConfig(model=model, data_dir=data, out=out), echo=lambda s: None)
        cmp = compare_traces(job / "trace", out, data_dirs_a=[str(job / "data")])
    finally:
        shutil.rmtree(data, ignore_errors=True)
    rep = job / "report.json"
    real = (
        json.loads(rep.read_text()).get("epoch_times_s")
        if rep.exists()
        else dlio_epoch_times(job / "out" / "per_epoch_stats.json")
    )
    row = {
        **REPLAY_SCHEMA,
        "name": c["name"],
        "similarity": round(cmp.similarity, 4),
        "replay_epochs_s": [round(e["epoch_time_s"], 4) for e in res.metrics["epochs"]],
        "job_epochs_s": [round(x, 4) for x in real] if real else None,
        "model": {
            "batch_size": model.reader.batch_size,
            "read_threads": model.reader.read_threads,
            "epochs": model.train.epochs,
            "samples_per_file": model.dataset.num_samples_per_file,
            "compute_s": model.train.computation_time.mean,
        },
        "features": {"job": cmp.features_a, "replay": cmp.features_b},
        "replay_s": round(time.monotonic() - t0, 1),
    }
    (job / ("replay-sleep.json" if as_sleep else "replay.json")).write_text(
        json.dumps(row, indent=1, default=str) + "\n"
    )
    return row


def dlio_epoch_times(stats: Path) -> list[float] | None:
    """A DLIO run's epoch times (s) from its ``per_epoch_stats.json``: each epoch's end less its
    start (DLIO's own ``duration`` is rounded to 10 ms); None where the file is missing."""
    if not stats.is_file():
        return None
    doc = json.loads(stats.read_text())
    out = []
    for key in sorted((k for k in doc if str(k).isdigit()), key=int):
        e = doc[key]
        if not (isinstance(e, dict) and e.get("start") and e.get("end")):
            return None
        t0, t1 = (datetime.datetime.fromisoformat(e[k]) for k in ("start", "end"))
        out.append((t1 - t0).total_seconds())
    return out or None


def replay_subset(
    configs: list[dict[str, Any]], root: Path, n: int, seed: int, as_sleep: bool = False
) -> int:
    """Replay ``n`` cached configurations drawn with ``seed``; print each one's similarity;
    returns how many fell under :data:`SIMILARITY_TARGET`."""
    cached = [c for c in configs if (root / c["name"] / "trace").is_dir()]
    pick = sorted(random.Random(seed).sample(cached, min(n, len(cached))), key=lambda c: c["name"])
    under = 0
    errors: list[float] = []
    print(
        "| configuration | similarity | job epochs s | replay epochs s | batch / threads / compute s |"
    )
    print("|---|---|---|---|---|")
    for c in pick:
        try:
            r = replay_one(c, root, as_sleep)
        except Exception as exc:  # a failed replay is a result of the sweep, not its end
            print(f"| {c['name']} | failed: {str(exc)[-200:]} | | | |", flush=True)
            under += 1
            continue
        m = r["model"]
        under += r["similarity"] < SIMILARITY_TARGET
        if r["job_epochs_s"] and r["replay_epochs_s"]:
            errors.append(r["replay_epochs_s"][-1] / r["job_epochs_s"][-1] - 1)
        print(
            f"| {c['name']} | {r['similarity']:.3f} | {r['job_epochs_s']} | {r['replay_epochs_s']} "
            f"| {m['batch_size']} / {m['read_threads']} / {m['compute_s'] or 0:.4g} |",
            flush=True,
        )
    print(f"\n{len(pick) - under} of {len(pick)} at similarity >= {SIMILARITY_TARGET}")
    if errors:
        e = np.abs(np.asarray(errors))
        print(
            f"last epoch against the job's: median error {np.median(e):.1%}; within 10 %: "
            f"{int((e <= 0.10).sum())}, within 25 %: {int((e <= 0.25).sum())} of {e.size}"
        )
    return under


def between_reads_ab(configs: list[dict[str, Any]], root: Path, repeats: int) -> None:
    """``train.timed_between_reads`` on and off (the replay's loader work taken out of the
    compute, or added to it) on the cached example runs without workers, whose distilled
    models set it: each replayed ``repeats`` times both ways, the order alternating; prints
    the last epoch's error against the job's per run, then the medians and the paired
    difference."""
    import dataclasses

    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill import distill
    from dlreplay.replay import ReplayConfig, run_replay

    runs = [c for c in configs if not c["source"].startswith("dlio_") and c["workers"] == 0]
    runs = [c for c in runs if (root / c["name"] / "report.json").is_file()]
    errors: dict[bool, list[float]] = {True: [], False: []}
    models = {}
    for c in runs:  # distilled once, replayed 2 x repeats times
        lt = load_trace(root / c["name"] / "trace")
        src = str(root / c["name"] / "trace")
        models[c["name"]] = distill(lt.events, manifest=dict(lt.manifest or {}), source=src)
    for rep in range(repeats):
        for i, c in enumerate(runs):
            job, model = root / c["name"], models[c["name"]]
            real = json.loads((job / "report.json").read_text())["epoch_times_s"]
            got = {}
            for flag in (True, False) if (i + rep) % 2 == 0 else (False, True):
                train = dataclasses.replace(model.train, timed_between_reads=flag)
                out, data = job / "replay-ab", job / "replay-ab-data"
                shutil.rmtree(out, ignore_errors=True)
                try:
                    res = run_replay(
                        ReplayConfig(
                            model=dataclasses.replace(model, train=train), data_dir=data, out=out
                        ),
                        echo=lambda s: None,
                    )
                finally:
                    shutil.rmtree(data, ignore_errors=True)
                    shutil.rmtree(out, ignore_errors=True)
                got[flag] = res.metrics["epochs"][-1]["epoch_time_s"] / real[-1] - 1
                errors[flag].append(got[flag])
            print(
                f"{c['name']:40s} on {got[True]:+.1%}  off {got[False]:+.1%}"
                f"  (set by distill: {model.train.timed_between_reads})",
                flush=True,
            )
    on, off = np.asarray(errors[True]), np.asarray(errors[False])
    if not on.size:
        print("no cached runs without workers")
        return
    for name, e in (("on", on), ("off", off)):
        print(
            f"{name}: median error {np.median(e):+.1%}, within 10 %: {int((abs(e) <= 0.1).sum())} "
            f"of {e.size}"
        )
    d = on - off
    print(
        f"paired difference (on - off): median {np.median(d):+.1%}, {int((d < 0).sum())} of {d.size} shorter"
    )


def self_similarity(configs: list[dict[str, Any]], root: Path, again: Path) -> None:
    """The similarity metric's floor: each configuration run twice (``root`` and ``again``,
    two sweeps of the same grid), the two jobs' traces compared with each other as a replay
    is with its job, beside the replay's similarity (``replay.json``) where there is one."""
    from dlreplay.analyze.compare import compare_traces

    rows = []
    print("| configuration | job vs job again | replay vs job |")
    print("|---|---|---|")
    for c in configs:
        a, b = root / c["name"], again / c["name"]
        if not ((a / "trace").is_dir() and (b / "trace").is_dir()):
            continue
        cmp = compare_traces(
            a / "trace", b / "trace", data_dirs_a=[str(a / "data")], data_dirs_b=[str(b / "data")]
        )
        rep = a / "replay.json"
        r = json.loads(rep.read_text())["similarity"] if rep.exists() else None
        rows.append((cmp.similarity, r))
        print(f"| {c['name']} | {cmp.similarity:.3f} | {'-' if r is None else f'{r:.3f}'} |")
    jobs = np.asarray([j for j, _ in rows])
    both = [(j, r) for j, r in rows if r is not None]
    print(
        f"\n{len(rows)} configurations run twice: job vs job again >= {SIMILARITY_TARGET} in "
        f"{int((jobs >= SIMILARITY_TARGET).sum())} (median {np.median(jobs):.3f})"
        if rows
        else "no configuration run in both folders"
    )
    if both:
        under = [(j, r) for j, r in both if r < SIMILARITY_TARGET]
        print(
            f"replays under {SIMILARITY_TARGET}: {len(under)} of {len(both)}; of those, the job "
            f"against itself was under it too in {sum(j < SIMILARITY_TARGET for j, _ in under)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--limit", type=int, default=None, help="run at most N configurations")
    ap.add_argument(
        "--subset", default=None, help="'examples', 'dlio', or a configuration name prefix"
    )
    ap.add_argument("--dir", type=Path, default=REPO / "bench-data" / "inference_sweep")
    ap.add_argument(
        "--dlio-venv", type=Path, default=Path(os.environ.get("DLIO_VENV", "/work/dlio-venv"))
    )
    ap.add_argument(
        "--batches-per-worker",
        type=int,
        default=2,
        metavar="K",
        help="batches per loader worker an epoch (default 2: every batch prefetched at the "
        "epoch's start; more gives steady-state epochs, names end in -qK)",
    )
    ap.add_argument("--list", action="store_true", help="list the configurations and exit")
    ap.add_argument(
        "--versus",
        action="store_true",
        help="only the head-to-head with dftracer_gen_dlio_config on committed traces",
    )
    ap.add_argument(
        "--cached-only", action="store_true", help="report the cached results, run nothing"
    )
    ap.add_argument(
        "--replay",
        type=int,
        default=None,
        metavar="N",
        help="distill, replay and compare N cached configurations (drawn with --seed)",
    )
    ap.add_argument("--seed", type=int, default=44, help="the draw of --replay's configurations")
    ap.add_argument(
        "--self-similarity",
        type=Path,
        default=None,
        metavar="DIR",
        help="compare each job with the same configuration's job in DIR (a second sweep, "
        "--dir DIR): the similarity metric's floor, beside the replays'",
    )
    ap.add_argument(
        "--between-reads-ab",
        type=int,
        default=None,
        metavar="R",
        help="replay the cached runs without workers R times each with "
        "train.timed_between_reads on and off (the replay's loader work taken out of the "
        "compute, or added)",
    )
    ap.add_argument(
        "--as-sleep",
        action="store_true",
        help="--replay: distill as if the captures had not recorded the host's accelerators "
        "(compute a pure sleep; the ablation of the host-CPU inference)",
    )
    args = ap.parse_args()
    if args.versus:
        versus(args.dir)
        return
    configs = grid(per_worker=args.batches_per_worker)
    if args.subset == "examples":
        configs = [c for c in configs if not c["source"].startswith("dlio_")]
    elif args.subset == "dlio":
        configs = [c for c in configs if c["source"].startswith("dlio_")]
    elif args.subset:
        configs = [c for c in configs if c["name"].startswith(args.subset)]
    if args.list:
        for c in configs:
            print(c["name"])
        print(f"{len(configs)} configurations")
        return
    if args.self_similarity is not None:
        self_similarity(configs, args.dir, args.self_similarity)
        return
    if args.between_reads_ab is not None:
        between_reads_ab(configs, args.dir, args.between_reads_ab)
        return
    if args.replay is not None:
        bad = replay_subset(configs, args.dir, args.replay, args.seed, args.as_sleep)
        sys.exit(1 if bad else 0)
    if args.limit is not None:
        configs = configs[: args.limit]
    results = []
    for c in configs:
        cached = (args.dir / c["name"] / "result.json").exists()
        if args.cached_only and not cached:
            continue
        if (
            c["source"].startswith("dlio_")
            and not (args.dlio_venv / "bin" / "dlio_benchmark").exists()
        ):
            print(f"skip {c['name']}: no DLIO in {args.dlio_venv}", file=sys.stderr)
            continue
        try:
            results.append(run_one(c, args.dir, args.dlio_venv))
        except (RuntimeError, SystemExit, subprocess.CalledProcessError) as exc:
            print(f"failed {c['name']}: {str(exc)[-300:]}", file=sys.stderr)
            continue
        if not cached:
            print(f"ran {c['name']} ({results[-1]['run_s']} s)", file=sys.stderr, flush=True)
    sys.exit(1 if report(results) else 0)


if __name__ == "__main__":
    main()
