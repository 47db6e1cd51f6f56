"""MLPerf Storage rules as a replay mode, and a replay's provenance.

* **The rules checked** (:func:`mlperf_shortfalls`): the dataset is at least
  :data:`MEMORY_FACTOR` times the host's memory (``MemTotal``: the page cache cannot hold it),
  and every accelerator takes at least :data:`MIN_STEPS` steps per epoch. A replay in MLPerf
  mode refuses to start when one is short, saying what and by how much (``dlreplay generate
  --scale-to 5x-memory`` writes a larger dataset of the same layout).
* **The runs** (:func:`run_mlperf`): one warm-up run (its results are not counted), then
  :data:`MEASURED_RUNS` measured runs, each untraced, in ``<out>/warmup`` and
  ``<out>/run-<i>``, each with its ``metrics.json`` and ``provenance.json``; ``<out>/mlperf.json``
  sums them up.
* **AU as MLPerf computes it**: per run, the mean over its epochs of each epoch's AU
  (DLIO's ``train_au_mean_percentage``, which MLPerf Storage's report reads), the run passing
  when that is at least the threshold; the submission passes when every measured run does.
  Throughput per run is the mean over epochs of samples/s (``train_throughput_mean_samples_per_second``)
  and of MB/s (10^6 bytes).
* **provenance.json** (:func:`provenance`): versions, host, command, model digest, dataset
  digest (SHA-256 over the dataset manifest's paths and sizes), the storage's mount and device
  (an S3 replay's: its objects' ``s3://`` prefix and client as well; never the endpoint or a
  credential).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import platform
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dlreplay
from dlreplay.model import WorkloadModel

from .common import ReplayError, dataset_digest, read_dataset_manifest, write_json_atomic
from .plan import steps_per_epoch
from .served import device_counters, filesystem_of

__all__ = [
    "MEASURED_RUNS",
    "MEMORY_FACTOR",
    "MIN_STEPS",
    "MLPERF_SCHEMA",
    "PROVENANCE_NAME",
    "PROVENANCE_SCHEMA",
    "estimated_dataset_bytes",
    "files_for_bytes",
    "host_memory_bytes",
    "mlperf_shortfalls",
    "provenance",
    "render_mlperf",
    "run_mlperf",
    "scale_target",
    "shortfalls_text",
    "write_provenance",
]

MEMORY_FACTOR = 5
MIN_STEPS = 500
MEASURED_RUNS = 5
PROVENANCE_NAME = "provenance.json"
PROVENANCE_SCHEMA = "dlreplay.provenance"
PROVENANCE_FORMAT_VERSION = 1
MLPERF_NAME = "mlperf.json"
MLPERF_SCHEMA = "dlreplay.mlperf"
MLPERF_FORMAT_VERSION = 1


def host_memory_bytes() -> int:
    """The host's memory in bytes (``MemTotal`` of ``/proc/meminfo``; else pages * page size)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def estimated_dataset_bytes(model: WorkloadModel, data_dir: Path | None = None) -> tuple[int, bool]:
    """(dataset bytes, measured): the generated dataset's own total when *data_dir* holds the
    model's, else files * samples per file * the mean record length (an estimate)."""
    if data_dir is not None:
        man = read_dataset_manifest(data_dir)
        if man and man.get("model_digest") == dataset_digest(model):
            return int(man.get("total_bytes", 0)), True
    ds = model.dataset
    mean = float(ds.record_length.mean or 0.0)
    return int(ds.num_files * ds.num_samples_per_file * mean), False


def files_for_bytes(model: WorkloadModel, target: int) -> int:
    """Files of *model*'s layout that hold at least *target* bytes (its files' mean size kept)."""
    ds = model.dataset
    per_file = ds.num_samples_per_file * float(ds.record_length.mean or 0.0)
    if per_file <= 0:
        raise ReplayError(
            "dataset.record_length has no known mean: the files' size, so how many files a size "
            "needs, cannot be told"
        )
    k = max(1, ds.files_per_sample)  # whole samples of k files each
    return max(ds.num_files, math.ceil(target / per_file / k) * k)


def scale_target(text: str) -> int:
    """``--scale-to``'s bytes: ``<N>x-memory`` (N times this host's memory) or a size
    (``200GB``, ``1.5TiB``); ReplayError naming the text otherwise."""
    from dlreplay.units import parse_bytes

    t = text.strip().lower()
    if t.endswith("x-memory"):
        try:
            factor = float(t[: -len("x-memory")])
        except ValueError:
            factor = -1.0
        if not math.isfinite(factor) or factor <= 0:
            raise ReplayError(
                f"--scale-to {text!r}: expected <N>x-memory with N > 0, e.g. 5x-memory"
            )
        return int(factor * host_memory_bytes())
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise ReplayError(f"--scale-to: {exc} (or <N>x-memory, e.g. 5x-memory)") from None


def mlperf_shortfalls(
    model: WorkloadModel, accelerators: int, data_dir: Path | None = None
) -> list[str]:
    """What *model*, replayed by *accelerators*, lacks for MLPerf Storage's rules (one
    sentence each; empty when it meets them)."""
    from dlreplay.units import human_bytes

    out = []
    mem = host_memory_bytes()
    size, measured = estimated_dataset_bytes(model, data_dir)
    need = MEMORY_FACTOR * mem
    if size < need:
        files = files_for_bytes(model, need) if model.dataset.record_length.mean else None
        out.append(
            f"the dataset is {human_bytes(size)} ({'measured' if measured else 'estimated'}), "
            f"{size / mem:.2g}x this host's memory ({human_bytes(mem)}); MLPerf needs at least "
            f"{MEMORY_FACTOR}x ({human_bytes(need)})"
            + (
                f": dataset.num_files={files} instead of {model.dataset.num_files} "
                f"(`dlreplay generate --scale-to {MEMORY_FACTOR}x-memory`)"
                if files
                else ""
            )
        )
    steps = steps_per_epoch(model, accelerators)
    if steps < MIN_STEPS:
        out.append(
            f"{steps} step(s) per epoch on {accelerators} accelerator(s); MLPerf needs at least "
            f"{MIN_STEPS} (more files, a smaller reader.batch_size or fewer accelerators)"
        )
    return out


def _dataset_files_digest(data_dir: Path) -> str | None:
    """SHA-256 over the dataset manifest's (path, bytes) of every file; None without a manifest."""
    man = read_dataset_manifest(data_dir)
    if not man:
        return None
    h = hashlib.sha256()
    for f in man.get("files", []):
        h.update(f"{f.get('path')}\0{f.get('bytes')}\n".encode())
    return h.hexdigest()


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {
        "dlreplay": dlreplay.__version__,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    for name in ("numpy", "torch", "h5py", "pyarrow", "dftracer"):
        mod = sys.modules.get(name)
        out[name] = str(getattr(mod, "__version__", "")) or None if mod is not None else None
    return out


def provenance(
    model: WorkloadModel, data_dir: Path, command: Sequence[str], metrics: dict[str, Any]
) -> dict[str, Any]:
    """The ``provenance.json`` of a replay (see the module doc) whose metrics are *metrics*."""
    fstype, source, mount = filesystem_of(str(data_dir))
    dev = device_counters(str(data_dir))
    return {
        "schema": PROVENANCE_SCHEMA,
        "format_version": PROVENANCE_FORMAT_VERSION,
        "versions": _versions(),
        "host": {
            "name": socket.gethostname(),
            "cpus": os.cpu_count(),
            "memory_bytes": host_memory_bytes(),
            "machine": platform.machine(),
        },
        "command": list(command),
        "model_name": model.model.name,
        "model_digest": dataset_digest(model),
        "dataset_digest": _dataset_files_digest(data_dir),
        "dataset_bytes": metrics.get("dataset_bytes"),
        "storage": {
            "data_dir": str(Path(data_dir).resolve()),
            "mount": mount,
            "filesystem": fstype,
            "source": source,
            "device": dev[0] if dev else None,
            # an S3 replay reads objects, not data_dir (its local copy): where they are, no endpoint
            **(
                {
                    "objects": f"s3://{model.storage.storage_root}/{model.storage.prefix or ''}",
                    "client": model.storage.client,
                }
                if model.storage is not None and model.storage.storage_type == "s3"
                else {}
            ),
        },
        "started": metrics.get("started"),
        "cold": metrics.get("cold"),
    }


def write_provenance(
    out: Path, model: WorkloadModel, data_dir: Path, command: Sequence[str], metrics: dict[str, Any]
) -> Path:
    """Write ``<out>/provenance.json`` beside the replay's metrics.json; returns its path."""
    path = Path(out) / PROVENANCE_NAME
    write_json_atomic(path, provenance(model, data_dir, command, metrics))
    return path


def _run_figures(metrics: dict[str, Any], threshold: float) -> dict[str, Any]:
    """One run's MLPerf figures from its metrics document (see the module doc)."""
    epochs = metrics.get("epochs") or []
    aus = [e["au_percent"] for e in epochs if e.get("au_percent") is not None]
    sps = [e["samples_per_s"] for e in epochs if e.get("samples_per_s") is not None]
    mbs = [e["io_mb_per_s"] for e in epochs if e.get("io_mb_per_s") is not None]
    au = sum(aus) / len(aus) if aus else None
    return {
        "au_percent": au,
        "samples_per_s": sum(sps) / len(sps) if sps else None,
        "io_mb_per_s": sum(mbs) / len(mbs) if mbs else None,
        "cache_served_percent": (metrics.get("overall") or {}).get("cache_served_percent"),
        "complete": bool(metrics.get("complete")),
        "pass": bool(au is not None and au >= threshold and metrics.get("complete")),
    }


def run_mlperf(
    config: Any,
    command: Sequence[str],
    run: Callable[[Any], Any],
    echo: Callable[[str], None],
) -> dict[str, Any]:
    """A warm-up run, then :data:`MEASURED_RUNS` measured runs of the replay *config* (a
    :class:`~.prepare.ReplayConfig`; its ``out`` the mode's directory), each by *run* (the
    replay's run function); writes ``mlperf.json`` and returns it. Refuses (ReplayError)
    when the rules are not met (:func:`mlperf_shortfalls`)."""
    assert config.accelerators is not None
    short = mlperf_shortfalls(config.model, config.accelerators, config.data_dir)
    if short:
        raise ReplayError(
            "MLPerf Storage rules not met: " + "; ".join(short) + " (--mlperf-check-only to check)"
        )
    base = Path(config.out)
    runs = []
    for i in range(MEASURED_RUNS + 1):
        name = "warmup" if i == 0 else f"run-{i}"
        echo(f"MLPerf mode: {name} ({i} of {MEASURED_RUNS} measured runs done)")
        res = run(dataclasses.replace(config, out=base / name, trace=False))
        write_provenance(base / name, config.model, config.data_dir, command, res.metrics)
        if not res.complete:
            raise KeyboardInterrupt
        if i:
            runs.append({"run": name, **_run_figures(res.metrics, config.au_threshold)})
    aus = [r["au_percent"] for r in runs if r["au_percent"] is not None]
    mean = sum(aus) / len(aus) if aus else None
    doc = {
        "schema": MLPERF_SCHEMA,
        "format_version": MLPERF_FORMAT_VERSION,
        "au_threshold_percent": config.au_threshold,
        "runs": runs,
        "au_percent": {
            "mean": mean,
            "stdev": math.sqrt(sum((a - mean) ** 2 for a in aus) / len(aus))
            if aus and mean is not None
            else None,
        },
        "pass": bool(runs) and all(r["pass"] for r in runs),
    }
    write_json_atomic(base / MLPERF_NAME, doc)
    write_provenance(base, config.model, config.data_dir, command, res.metrics)
    return doc


def render_mlperf(doc: dict[str, Any]) -> str:
    """The MLPerf mode's table: one line per measured run, then the verdict."""

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"{'run':>6} {'AU %':>7} {'samples/s':>10} {'MB/s':>10} {'cache %':>8} {'':>5}"]
    for r in doc["runs"]:
        lines.append(
            f"{r['run']:>6} {f(r['au_percent'], '.2f'):>7} {f(r['samples_per_s'], '.1f'):>10} "
            f"{f(r['io_mb_per_s'], '.1f'):>10} {f(r['cache_served_percent'], '.1f'):>8} "
            f"{'pass' if r['pass'] else 'FAIL':>5}"
        )
    au = doc["au_percent"]
    lines.append(
        f"AU over {len(doc['runs'])} runs: {f(au['mean'], '.2f')} ± {f(au['stdev'], '.2f')} %; "
        f"MLPerf ({doc['au_threshold_percent']} % in every run): {'PASS' if doc['pass'] else 'FAIL'}"
    )
    return "\n".join(lines)


def shortfalls_text(short: list[str]) -> str:
    """The check's answer: what is short, or that the rules are met."""
    if not short:
        return "MLPerf Storage rules met: dataset >= 5x host memory, >= 500 steps per epoch"
    return "MLPerf Storage rules not met: " + "; ".join(short)
