"""Shared pieces of the replay stage: the error class, the dataset plan, the manifest.

The *plan* of a dataset is a pure function of the workload model's ``dataset``
section and a seed: the file names, and for every file the byte size of each
sample (record). :mod:`dlreplay.replay.generate` writes it; the replay engine reads
the manifest generation leaves behind (``.dlreplay-dataset.json``).

Units: sizes and offsets in bytes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.errors import DlreplayError
from dlreplay.interrupt import INTERRUPT
from dlreplay.model import WorkloadModel, model_to_dict
from dlreplay.osutil import atomic_write_text, confined_path, host_memory_bytes, process_limit
from dlreplay.units import human_bytes

MANIFEST_NAME = ".dlreplay-dataset.json"
JOURNAL_NAME = ".dlreplay-dataset.partial.json"
DATASET_SCHEMA = "dlreplay.dataset"
DATASET_FORMAT_VERSION = 1
TMP_SUFFIX = ".dlreplay-tmp"

#: File name extension per dataset format.
EXTENSIONS = {
    "npz": "npz",
    "npy": "npy",
    "hdf5": "h5",
    "jpeg": "jpg",
    "png": "png",
    "tfrecord": "tfrecord",
    "csv": "csv",
    "indexed_binary": "bin",
    "parquet": "parquet",
    "raw": "raw",
    "tar": "tar",
    "arrow": "arrow",
    "pt": "pt",
}
#: Formats whose samples are byte ranges recorded in the manifest (``offsets``).
RECORD_FORMATS = ("raw", "tfrecord", "indexed_binary")
#: Formats that store one image per file. Several samples per file are DLIO's: the file's
#: one image, read whole for each of its samples (DLIO 2.0's image reader; its generator
#: writes one image per file whatever ``num_samples_per_file`` says).
ONE_SAMPLE_FORMATS = ("jpeg", "png", "pt")
#: Formats whose shards an IterableDataset streams whole (:mod:`.streaming`).
SHARD_FORMATS = ("tar", "arrow")


def streams_shards(model: Any) -> bool:
    """Whether *model*'s files are shards an IterableDataset streams whole: tar and Arrow, but
    not Arrow files a map-style Dataset maps and takes rows of (``reader.memory_map``)."""
    ds = model.dataset
    return ds.format in SHARD_FORMATS and not (ds.format == "arrow" and model.reader.memory_map)


#: Formats whose samples are rows of a rectangular array (one record length per file).
ARRAY_FORMATS = ("npz", "npy", "hdf5")


class ReplayError(DlreplayError):
    """Dataset generation or a replay failed; the message names the path and what to do."""


def worker_message(exc: BaseException) -> str:
    """The one-line cause of an error re-raised from a DataLoader worker (torch wraps it in
    "Caught X in DataLoader worker process N. Original Traceback ..."; keep the cause)."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else type(exc).__name__
    for prefix in ("dlreplay.replay.common.ReplayError: ", "ReplayError: "):
        if last.startswith(prefix):
            return last[len(prefix) :]
    return last


def worker_failure(exc: RuntimeError) -> BaseException:
    """What a PyTorch DataLoader's RuntimeError about its workers means for the replay: a
    ReplayError naming the cause ("DataLoader worker (pid N) is killed by signal: ..."), or a
    KeyboardInterrupt where a terminal's Ctrl-C reached the workers too (they stop quietly, as
    asked). PyTorch raises it from the batch wait or, through its SIGCHLD handler, from
    wherever the training process is when a worker dies (a compute sleep, a checkpoint)."""
    if INTERRUPT.requested:
        return KeyboardInterrupt()
    return ReplayError(f"data-loader worker failed: {worker_message(exc)}")


def is_worker_failure(exc: RuntimeError) -> bool:
    """Whether *exc* is PyTorch's report of a DataLoader worker's death (its SIGCHLD handler's
    or the batch wait's), not another RuntimeError."""
    return "DataLoader worker" in str(exc)


@dataclass(frozen=True)
class FileSpec:
    """One dataset file of the plan: its index, path relative to the data dir, sample sizes (bytes)."""

    index: int
    relpath: str
    sizes: tuple[int, ...]


def dataset_digest(model: WorkloadModel) -> str:
    """SHA-256 (hex) of the model's dataset shape: equal digests mean identical datasets.

    Only ``dataset`` fields that change bytes on disk count (``data_folder`` does not), so
    replays that change the reader, training or checkpoints reuse the same dataset.
    """
    ds = dict(model_to_dict(model)["dataset"])
    ds.pop("data_folder", None)
    ds.pop("record_length_resize", None)
    ds.pop("file_size", None)
    ds.pop("num_files_eval", None)
    text = json.dumps(ds, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


#: Bytes of memory per sample of the dataset plan and of an epoch's sample order (Python ints and tuples).
PLAN_BYTES_PER_SAMPLE = 160
#: Bytes of memory per file of the plan and of the manifest.
PLAN_BYTES_PER_FILE = 600
#: Longest sleep a replay step may be asked for, seconds (longer ones overflow or never end).
MAX_SLEEP_S = 1e6
#: Seeds are integers in 0 .. SEED_LIMIT - 1 (numpy generators and JSON readers take them).
SEED_LIMIT = 2**63


def _mean(d: Any) -> float:
    """The mean of a size distribution in bytes (0 when unknown)."""
    mean = d.mean if d.mean is not None else d.value
    return float(mean) if mean is not None and math.isfinite(float(mean)) else 0.0


def _free(path: Path) -> tuple[float, float]:
    """(bytes, inodes) available to this user on the file system of *path* (its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return float("inf"), float("inf")
    return float(st.f_bavail * st.f_frsize), float(st.f_favail) if st.f_files else float("inf")


def check_plan_size(model: WorkloadModel, seed: int) -> None:
    """Refuse, in a moment, a dataset whose plan (a size per sample) cannot be held in memory, and a bad seed."""
    if not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ReplayError(f"seed: expected an integer in 0..2**63-1, got {seed!r}")
    ds = model.dataset
    samples = ds.num_files * ds.num_samples_per_file // max(1, ds.files_per_sample)
    need = samples * PLAN_BYTES_PER_SAMPLE + ds.num_files * PLAN_BYTES_PER_FILE
    ram = host_memory_bytes()
    if ram and need > ram // 2:
        raise ReplayError(
            f"dataset.num_files x dataset.num_samples_per_file = {ds.num_files:,} x {ds.num_samples_per_file:,} = "
            f"{samples:,} samples: their sizes and order alone need ~{human_bytes(need)} of memory, more than half "
            f"of this host's {human_bytes(ram)}; lower dataset.num_files or dataset.num_samples_per_file"
        )


def check_generate_resources(
    model: WorkloadModel,
    data_dir: Path,
    jobs: int,
    reusable_bytes: int = 0,
    reusable_files: int = 0,
) -> None:
    """Refuse, before any file is written, a dataset that cannot be generated in *data_dir*.

    A file is generated whole in memory (one per generator process: *jobs*), and all files
    must fit in the free space (bytes and inodes) of *data_dir*'s file system, counting the
    *reusable_bytes* / *reusable_files* of an earlier run as already there.
    """
    ds = model.dataset
    record = _mean(ds.record_length)
    file_bytes = record * ds.num_samples_per_file
    ram = host_memory_bytes()
    if ram and file_bytes * max(1, jobs) > ram // 2:
        raise ReplayError(
            f"dataset.record_length x dataset.num_samples_per_file = {human_bytes(record)} x "
            f"{ds.num_samples_per_file:,}: one file of {human_bytes(file_bytes)} is generated in memory, "
            f"{max(1, jobs)} at a time, which needs more than half of this host's {human_bytes(ram)}; lower them "
            f"(or --jobs)"
        )
    total = file_bytes * ds.num_files
    free, inodes = _free(data_dir)
    if total - reusable_bytes > free:
        raise ReplayError(
            f"dataset.num_files x dataset.num_samples_per_file x dataset.record_length = {ds.num_files:,} x "
            f"{ds.num_samples_per_file:,} x {human_bytes(record)} = {human_bytes(total)}, but the file system "
            f"of {data_dir} has {human_bytes(free)} free; choose a --data-dir with more space or a smaller dataset"
        )
    if ds.num_files - reusable_files > inodes:
        raise ReplayError(
            f"dataset.num_files: {ds.num_files:,} files, but the file system of {data_dir} can "
            f"create only {int(inodes):,} more (free inodes); choose another --data-dir or fewer files"
        )


def check_replay_resources(model: WorkloadModel, accelerators: int, out: Path | None) -> None:
    """Refuse, before a replay starts, what it cannot honour: more loader processes than this
    system allows one command, a batch larger than memory, checkpoints larger than *out*'s free space."""
    rd, ck, ds = model.reader, model.checkpoint, model.dataset
    limit, why = process_limit()
    procs = max(1, accelerators) * max(1, rd.read_threads)
    if procs > limit:
        raise ReplayError(
            f"reader.read_threads: {rd.read_threads} loader worker(s) x {accelerators} accelerator(s) "
            f"= {procs:,} processes, more than one command may start here (at most {limit}: {why}); "
            f"lower reader.read_threads"
        )
    for name, dist in (
        ("train.computation_time", model.train.computation_time),
        ("reader.preprocess_time", rd.preprocess_time),
    ):
        worst = max(_mean(dist), float(dist.max) if dist.max is not None else 0.0)
        if worst > MAX_SLEEP_S:
            raise ReplayError(
                f"{name}: {worst:.3g} s per step cannot be replayed (a sleep of at most "
                f"{MAX_SLEEP_S:.0e} s, {MAX_SLEEP_S / 86400:.0f} days); check the unit (seconds)"
            )
    ram = host_memory_bytes()
    k = max(1, ds.files_per_sample)  # record_length is then a file's, k files a sample
    in_batch = min(rd.batch_size, ds.num_files * ds.num_samples_per_file // k) * k
    batch = _mean(ds.record_length) * in_batch * max(1, accelerators) * (1 + rd.prefetch_factor)
    if ram and batch > ram // 2:
        raise ReplayError(
            f"reader.batch_size x dataset.record_length: {in_batch:,} samples of "
            f"{human_bytes(_mean(ds.record_length))} per batch, with prefetching on "
            f"{accelerators} accelerator(s), need ~{human_bytes(batch)} of memory, more than half of "
            f"this host's {human_bytes(ram)}; lower reader.batch_size"
        )
    if ck.enabled and ck.bytes_per_checkpoint > 0 and out is not None:
        free, inodes = _free(out)
        if ck.bytes_per_checkpoint > free:
            raise ReplayError(
                f"checkpoint.bytes_per_checkpoint: {human_bytes(ck.bytes_per_checkpoint)} per "
                f"checkpoint, but the file system of {out} has {human_bytes(free)} free; choose "
                f"another --out or a smaller checkpoint"
            )
        if ck.files_per_checkpoint > inodes:
            raise ReplayError(
                f"checkpoint.files_per_checkpoint: {ck.files_per_checkpoint:,} files, but the file "
                f"system of {out} can create only {int(inodes):,} more; choose another --out"
            )


def plan_dataset(model: WorkloadModel, seed: int) -> list[FileSpec]:
    """The files of the dataset and each sample's size in bytes, from *model* and *seed*.

    File ``i`` draws its sizes from ``numpy.random.default_rng([seed, i])`` (an empirical
    distribution stratified over the files by one seeded permutation), so the plan (and the
    bytes written) do not depend on how generation is split over processes.
    Array formats (npz, npy, hdf5) use one record length per file (rectangular arrays).
    """
    check_plan_size(model, seed)
    ds = model.dataset
    n = ds.num_files
    width = len(str(max(n - 1, 0)))
    ext = EXTENSIONS[ds.format]
    out = []
    k = ds.num_samples_per_file
    # one record length a file: an array's rows, or an image file's one image that each of
    # its samples reads whole
    per_file = 1 if ds.format in ARRAY_FORMATS or ds.format in ONE_SAMPLE_FORMATS else k
    # an empirical distribution (the real files' sizes) is drawn stratified: each draw from its own
    # 1/N of the probabilities (in a seeded order over the files), so N files have the real
    # distribution's quantiles, not N random draws' noise
    strata = (
        np.random.default_rng([seed, 0x57A7]).permutation(n * per_file)
        if ds.record_length.type == "empirical"
        else None
    )
    parts = _part_sizes(ds, seed) if ds.files_per_sample > 1 else None
    if strata is not None and ds.files_per_sample > 1:
        strata = _part_strata(ds, strata)
    for i in range(n):
        rng = np.random.default_rng([seed, i, 0x5EED])
        if strata is not None:
            probs = (
                strata[i * per_file : (i + 1) * per_file] + rng.uniform(0.0, 1.0, per_file)
            ) / (n * per_file)
            draws = ds.record_length.quantile(probs)
        else:
            draws = ds.record_length.sample(rng, per_file)
        sizes = np.maximum(1, np.rint(draws)).astype(np.int64)
        if parts is not None:
            sizes = parts[i : i + 1]
        if per_file == 1:
            sizes = np.repeat(sizes, k)
        name = f"img_{i:0{width}d}_of_{n}.{ext}"
        rel = f"train/{i % ds.num_subfolders}/{name}" if ds.num_subfolders > 0 else f"train/{name}"
        out.append(FileSpec(index=i, relpath=rel, sizes=tuple(int(s) for s in sizes)))
    return out


def _part_sizes(ds: Any, seed: int) -> np.ndarray | None:
    """Each file's size (bytes) where a sample's ``k = files_per_sample`` files are the layout's
    ``k`` structures in turn and each structure lists its sampled files' sizes: file ``i``
    takes one of structure ``i % k``'s, in a seeded order that deals them out evenly. None
    without such a layout (:func:`_part_strata` then bands the record lengths)."""
    k, n = ds.files_per_sample, ds.num_files
    structures = list(ds.layout.arrays or ds.layout.images or [])
    if len(structures) != k or not all(st.file_bytes for st in structures):
        return None
    out = np.zeros(n, dtype=np.int64)
    for j, st in enumerate(structures):
        sizes = np.asarray(st.file_bytes, dtype=np.int64)
        picks = np.random.default_rng([seed, j, 0x9A27]).permutation(n // k) % sizes.size
        out[j::k] = sizes[picks]
    return out


def _part_strata(ds: Any, strata: np.ndarray) -> np.ndarray:
    """Strata of the files of samples of ``k = files_per_sample`` files: file ``i`` is part
    ``i % k`` of sample ``i // k``, and each part draws from its own band of the sizes' quantiles
    (a sample's image from the images' sizes, its mask from the masks'). Part ``j``'s band is
    the rank of the layout's ``j``-th structure among the structures' sizes where the layout
    has one structure a part (distill orders them by part), else ``j`` (smallest first)."""
    k, n = ds.files_per_sample, strata.size
    per = n // k
    structures = list(ds.layout.arrays or ds.layout.images or [])
    sizes = [getattr(st, "bytes", None) for st in structures]
    bands = list(range(k))
    if len(structures) == k and all(isinstance(b, int) for b in sizes):
        known = [int(b or 0) for b in sizes]
        bands = [sorted(range(k), key=lambda j: known[j]).index(j) for j in range(k)]
    order = strata[strata < per]  # a seeded permutation of the samples, from the files' own
    i = np.arange(n)
    return np.asarray([bands[j] for j in i % k]) * per + order[i // k]


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write *payload* as JSON to *path* atomically; OS errors become one-line ReplayErrors."""
    try:
        atomic_write_text(path, json.dumps(payload, indent=1) + "\n")
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ReplayError(
                f"{path}: cannot write: no space left on the device; free space or choose "
                f"another directory"
            ) from None
        raise ReplayError(f"{path}: cannot write ({exc.strerror or exc})") from None


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in *path*, or None when the file is missing or unreadable as JSON."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _byte_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def listed_files(data_dir: Path, doc: dict[str, Any], source: Path) -> dict[str, dict[str, Any]]:
    """The file entries of a dataset manifest or journal *doc* read from *source*, by relative path.

    Every entry must be an object with a ``path`` inside *data_dir* (see
    :func:`dlreplay.osutil.confined_path`) and integer byte counts; anything else raises
    (:class:`~dlreplay.errors.UnsafePathError` or :class:`ReplayError`) naming *source*, so
    nothing it lists is ever read, overwritten or deleted.
    """
    files = doc.get("files", [])
    entries = list(files.values()) if isinstance(files, dict) else files
    side = doc.get("side_files", [])  # the model's dataset.side_files, as written
    if not isinstance(entries, list) or not isinstance(side, list):
        raise ReplayError(
            f"{source}: 'files' is not a list of files; delete {source} (it is not a file dlreplay "
            f"wrote) or choose another --data-dir"
        )
    entries = entries + side
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        rel = e.get("path") if isinstance(e, dict) else e
        confined_path(data_dir, rel, source)
        if not (
            isinstance(e, dict)
            and _byte_count(e.get("bytes"))
            and _byte_count(e.get("aux_bytes", 0))
        ):
            raise ReplayError(
                f"{source}: the entry for {rel!r} has no valid byte count; delete {source} (it is not "
                f"a file dlreplay wrote) or choose another --data-dir"
            )
        aux = e.get("aux", {})
        if not isinstance(aux, dict) or not all(
            isinstance(k, str) and AUX_SUFFIX.fullmatch(k) and _byte_count(v)
            for k, v in aux.items()
        ):
            raise ReplayError(
                f"{source}: the entry for {rel!r} lists side files that are not a dataset's; delete "
                f"{source} (it is not a file dlreplay wrote) or choose another --data-dir"
            )
        for suffix in aux_files(e):
            confined_path(
                data_dir, str(rel) + suffix, source
            )  # rel: a str (confined_path checked it)
        out[str(rel)] = e
    return out


#: A side file's suffix (``.idx``, ``.off.idx``): dots and letters, never a path.
AUX_SUFFIX = re.compile(r"(\.[A-Za-z0-9_]{1,16}){1,3}")


def aux_files(entry: dict[str, Any]) -> dict[str, int]:
    """The side files of a listed data file (an indexed_binary file's record index): {suffix:
    bytes}; ``aux`` where the entry lists them, else one ``.idx`` of ``aux_bytes``."""
    aux = entry.get("aux")
    if isinstance(aux, dict) and aux:
        return {str(k): int(v) for k, v in aux.items()}
    n = entry.get("aux_bytes") or 0
    return {".idx": int(n)} if n else {}


def file_problems(data_dir: Path, files: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Listed files that are missing or whose size differs from the listing (``bytes``, ``aux_bytes``).

    Returns {relative path: what is wrong, e.g. ``train/a.npz: 4096 bytes, listed 8192``}. One
    ``stat`` per file: a dataset whose files were deleted or truncated after generation is
    never reused as complete.
    """
    out: dict[str, str] = {}
    for rel, e in files.items():
        for name, want in (
            (rel, e["bytes"]),
            *((rel + suffix, n) for suffix, n in aux_files(e).items()),
        ):
            try:
                st = (Path(data_dir) / name).stat()
                have = st.st_size if stat.S_ISREG(st.st_mode) else None
            except OSError:
                have = None
            if have != want:
                out[rel] = (
                    f"{name}: {'missing' if have is None else f'{have} bytes'}, listed {want}"
                )
                break
    return out


def read_dataset_manifest(data_dir: Path) -> dict[str, Any] | None:
    """The complete dataset manifest of *data_dir*, or None if there is no complete one.

    Its file paths are checked to stay inside *data_dir* (raises, naming the manifest).
    """
    source = Path(data_dir) / MANIFEST_NAME
    data = read_json(source)
    if not data or data.get("schema") != DATASET_SCHEMA or data.get("complete") is not True:
        return None
    if (
        not isinstance(data.get("format_version", 0), int)
        or data.get("format_version", 0) > DATASET_FORMAT_VERSION
    ):
        raise ReplayError(
            f"{source}: format_version {data.get('format_version')!r} is not one this dlreplay reads "
            f"({DATASET_FORMAT_VERSION}); upgrade dlreplay or regenerate the dataset."
        )
    listed_files(Path(data_dir), data, source)
    return data
