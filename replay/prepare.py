"""A replay's configuration, and what is settled before its accelerators start: the
dataset (generated if missing, then held for reading), the output directory (claimed),
the data loader, each worker's read spec; and the metrics document written at its end."""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dlreplay
from dlreplay.errors import InUseError
from dlreplay.model import WorkloadModel
from dlreplay.osutil import DirectoryClaim, claim_directory, is_empty_dir, share_directory

from .common import ReplayError, dataset_digest, read_dataset_manifest, streams_shards
from .direct import direct_plan
from .generate import GenerateConfig, cache_warnings, dataset_status, generate_dataset
from .loader import WorkerSpec
from .metrics import METRICS_FORMAT_VERSION, METRICS_SCHEMA, aggregate
from .plan import spends_host_cpu
from .s3 import s3_target

METRICS_NAME = "metrics.json"
ORDER_NAME = "sample-order.json"
#: Globs of the files a replay writes in its ``--out`` besides a traced replay's capture (the
#: capture's :data:`~dlreplay.capture.run.CAPTURE_FILES`): its metrics, sample order, the model
#: it ran, and the checkpoint files it kept.
REPLAY_FILES = (
    METRICS_NAME,
    ORDER_NAME,
    "model.yaml",
    "provenance.json",
    "checkpoints/checkpoint-*/part-*-of-*.bin",
)
IO_MODES = ("library", "posix")
#: --loader choices: auto = PyTorch's DataLoader when the model's loader is PyTorch's and torch is installed.
LOADERS = ("auto", "torch", "builtin")
#: Bytes per checkpoint write call when the model does not know it.
#: ``keep_checkpoints`` value: keep the files only when the rank succeeded (see ReplayConfig)
KEEP_ON_SUCCESS = "on-success"


@dataclass(frozen=True)
class ReplayConfig:
    """One replay. ``model`` already has overrides applied.

    ``accelerators``: local accelerator processes (ignored under MPI, where each rank is
    one; None: the model's ``processes.ranks``, as many as the traced job had); ``out``:
    result/trace directory (None = ``replays/<name>-<UTC time>``);
    ``trace``: run under DFTracer; ``generate``: generate the dataset if missing;
    ``io``: ``library`` or ``posix``; ``au_threshold``: pass/fail AU in percent;
    ``record_order``: write every epoch's sample order to ``sample-order.json``;
    ``loader``: ``auto`` (PyTorch's own DataLoader when the model's framework and data loader
    are PyTorch's, its workers processes, and torch is importable; else the builtin one),
    ``torch`` or ``builtin``.
    """

    model: WorkloadModel
    data_dir: Path
    accelerators: int | None = None
    out: Path | None = None
    trace: bool = True
    generate: bool = True
    io: str = "library"
    au_threshold: float = 90.0
    seed: int = 0
    record_order: bool = False
    #: keep the checkpoint files written (else each rank deletes its own at its end);
    #: :data:`KEEP_ON_SUCCESS`: only when the rank succeeded (a traced replay's files are deleted
    #: after the trace, outside it; a failed rank frees its space at once: the trace is still written)
    keep_checkpoints: bool | str = False
    traced: bool = False  # internal: this process is the captured child
    jobs: int | None = None
    loader: str = "auto"
    #: drop the dataset's pages before each epoch: "" (no), or a :data:`.served.COLD_METHODS`
    cold: str = ""


@dataclass(frozen=True)
class ReplayResult:
    """Outcome: where metrics (and the trace) are, the metrics dict, completeness."""

    out: Path
    metrics: dict[str, Any]
    complete: bool
    traced: bool
    warnings: tuple[str, ...] = field(default_factory=tuple)


def mpi_world() -> Any | None:
    """mpi4py's COMM_WORLD when launched by mpiexec with more than one rank, else None."""
    env_size = (
        os.environ.get("PMI_SIZE")
        or os.environ.get("OMPI_COMM_WORLD_SIZE")
        or os.environ.get("PMIX_SIZE")
    )
    if not env_size or int(env_size) <= 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ReplayError(
            f"launched under MPI ({env_size} ranks) but mpi4py is not importable ({exc}); "
            f"install dlreplay[mpi]"
        ) from None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


def default_out(model: WorkloadModel) -> Path:
    """``replays/<model name>-<UTC time>``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    # a name, never a path: no '/' (outside replays/), NUL or control character (no such file)
    name = re.sub(r"[/\x00-\x1f\x7f]", "_", model.model.name or model.dataset.format)[:200]
    return Path("replays") / f"{name}-{stamp}"


def choose_loader(config: ReplayConfig) -> tuple[str, str]:
    """(``torch`` | ``builtin``, why) for this replay (see :class:`ReplayConfig`)."""
    m = config.model
    have_torch = importlib.util.find_spec("torch") is not None
    if streams_shards(m):  # the streaming loader is PyTorch's, whatever the model
        if not have_torch:
            raise ReplayError(
                f"{m.dataset.format} shards are streamed through PyTorch's DataLoader: torch is "
                "not importable here; install dlreplay[torch] (torch==2.13.0)"
            )
        return "torch", "streamed shards: PyTorch's DataLoader over an IterableDataset" + (
            " (--loader builtin does not apply)" if config.loader == "builtin" else ""
        )
    if config.loader == "builtin":
        return "builtin", "--loader builtin"
    if config.loader == "torch":
        if not have_torch:
            raise ReplayError(
                "--loader torch: torch is not importable here; install dlreplay[torch] "
                "(torch==2.13.0) or use --loader builtin"
            )
        if m.reader.worker_kind == "thread":
            raise ReplayError(
                "--loader torch: reader.worker_kind=thread has no PyTorch DataLoader equivalent "
                "(its workers are processes); use --loader builtin"
            )
        return "torch", "--loader torch"
    if m.framework != "pytorch" or m.reader.data_loader != "pytorch":
        return (
            "builtin",
            f"the model's loader is {m.framework}/{m.reader.data_loader}, not PyTorch's DataLoader",
        )
    if m.reader.worker_kind == "thread":
        return "builtin", "reader.worker_kind=thread (PyTorch's workers are processes)"
    if not have_torch:
        return (
            "builtin",
            "torch is not installed (pip install 'dlreplay[torch]' for PyTorch's own DataLoader)",
        )
    return "torch", "the model's loader is PyTorch's DataLoader"


def import_loader(loader: str) -> None:
    """Import torch before the replay starts (seconds on a loaded machine), as a training script
    does before its first epoch; accelerator processes forked from here inherit it."""
    if loader == "torch":
        from . import torchloader  # noqa: F401


def worker_spec(config: ReplayConfig, manifest: dict[str, Any]) -> WorkerSpec:
    """What each loader worker needs to read the dataset *manifest* lists as *config* says."""
    m = config.model
    files = manifest["files"]
    md = m.reader.metadata_per_sample
    return WorkerSpec(
        data_dir=str(config.data_dir.resolve()),
        fmt=m.dataset.format,
        io=config.io,
        paths=tuple(f["path"] for f in files),
        file_bytes=tuple(int(f["bytes"]) for f in files),
        records=tuple(
            tuple((int(a), int(b)) for a, b in f["records"]) if f.get("records") else None
            for f in files
        ),
        samples_per_file=m.dataset.num_samples_per_file,
        open_per_sample=m.reader.open_per_sample,
        transfer_size=m.reader.transfer_size,
        preprocess_time=m.reader.preprocess_time,
        stats_per_sample=float(md.stats or 0.0) if config.io == "posix" else 0.0,
        lseeks_per_sample=float(md.lseeks or 0.0) if config.io == "posix" else 0.0,
        seed=config.seed,
        file_buffering=m.reader.file_buffering,
        resize_bytes=m.dataset.record_length_resize,
        preprocess_cpu=m.reader.preprocess_host_cpu,
        start_method=m.reader.multiprocessing_context,
        files_per_sample=m.dataset.files_per_sample,
        batch_tensors=m.reader.batch_tensors,
        index_style=m.dataset.layout.index,
        memory_map=m.reader.memory_map and m.dataset.format in ("indexed_binary", "npy", "arrow"),
        row_groups=m.reader.row_group_reads and m.dataset.format == "parquet",
        cold=config.cold,
        s3=s3_target(m.storage),
        direct_io=direct_plan(m, config.io, _first_file(config, files))[0],
        direct_io_threshold=m.reader.direct_io_threshold,
        between_reads=m.train.timed_between_reads and m.reader.read_threads == 0,
        unread=tuple(
            sorted(
                {
                    member.name
                    for a in m.dataset.layout.arrays or ()
                    for member in a.members or ()
                    if not member.read_per_sample
                }
                | {
                    c.name
                    for t in m.dataset.layout.tables or ()
                    for c in t.columns or ()
                    if not c.read_per_sample
                }
            )
        ),
    )


def _first_file(config: ReplayConfig, files: list[dict[str, Any]]) -> Path | None:
    """The dataset's first file (where ``O_DIRECT`` is tried), None without files."""
    return config.data_dir / files[0]["path"] if files else None


def ensure_dataset(
    config: ReplayConfig, echo: Callable[[str], None]
) -> tuple[dict[str, Any], list[str]]:
    """The dataset's manifest (generated first when missing, unless ``generate`` is off) and the
    replay's warnings; the dataset is held for reading until the replay ends (:data:`CLAIMS`)."""
    if not config.model.train.enabled and config.model.checkpoint.enabled:
        echo("checkpoint-only workload (train.enabled false): it reads no dataset, none generated")
        return {"files": [], "total_bytes": 0}, []
    status = dataset_status(config.model, config.data_dir, config.seed)
    if status != "ready":
        if not config.generate:
            what = (
                "files were deleted or changed size since it was generated"
                if status == "damaged"
                else f"status: {status}"
            )
            raise ReplayError(
                f"{config.data_dir}: no complete dlreplay dataset for this model and seed "
                f"({what}); run `dlreplay generate MODEL --data-dir {config.data_dir}` "
                f"or drop --no-generate"
            )
        echo(f"generating the dataset in {config.data_dir} …")
        res = generate_dataset(
            GenerateConfig(
                model=config.model, data_dir=config.data_dir, seed=config.seed, jobs=config.jobs
            )
        )
        echo(
            f"generated {res.generated} file(s), {res.total_bytes / 1e6:,.1f} MB in {res.seconds:.1f} s"
        )
    # Held (shared) until the replay ends: no dlreplay command rewrites the dataset meanwhile.
    try:
        hold = share_directory(config.data_dir, "--data-dir")
    except InUseError as exc:
        raise ReplayError(str(exc)) from None
    except OSError as exc:
        raise ReplayError(
            f"{config.data_dir}: cannot hold the dataset for reading ({exc.strerror or exc})"
        ) from None
    if hold is not None:
        CLAIMS.append(hold)
    if status != "ready" and dataset_status(config.model, config.data_dir, config.seed) != "ready":
        raise ReplayError(
            f"{config.data_dir}: the dataset changed after it was generated (another command "
            f"wrote there); run the replay again"
        )
    manifest = read_dataset_manifest(config.data_dir)
    if manifest is None or manifest.get("model_digest") != dataset_digest(config.model):
        raise ReplayError(
            f"{config.data_dir}: dataset manifest missing or for another model; regenerate it"
        )
    direct, direct_lines = direct_plan(
        config.model, config.io, _first_file(config, manifest.get("files") or [])
    )
    return manifest, [
        # (a --cold replay drops the dataset's pages before each epoch, and O_DIRECT reads
        # bypass them: no page-cache warning)
        *(
            cache_warnings(int(manifest.get("total_bytes", 0)))
            if not config.cold and direct != "on"
            else []
        ),
        *model_warnings(config.model),
        *direct_lines,
    ]


def model_warnings(model: WorkloadModel) -> list[str]:
    """Parts of the model this replay does not reproduce yet (said, never silently dropped)."""
    out = []
    if model.train.evaluation is not None:
        out.append(
            "evaluation phases (train.evaluation) are replayed as their compute time per step; the "
            "reads of the evaluation files are not (no evaluation files are generated)"
        )
    return out


#: Output and dataset claims taken by the run_replay call in progress (released when it returns).
CLAIMS: list[DirectoryClaim] = []


def check_out(out: Path, allow_existing: bool) -> None:
    """Claim *out* (one writer per directory) and refuse it unless empty; ``allow_existing``: the
    traced child writing into the ``--out`` its parent claimed."""
    if out.exists() and not out.is_dir():
        raise ReplayError(f"{out} exists and is not a directory; choose another --out")
    try:
        if allow_existing:
            out.mkdir(parents=True, exist_ok=True)
            return
        CLAIMS.append(claim_directory(out, "--out"))
    except OSError as exc:
        raise ReplayError(
            f"{out}: cannot create the output directory ({exc.strerror or exc})"
        ) from None
    if not is_empty_dir(out):
        raise ReplayError(
            f"{out} is not empty; choose another --out (results are never written over)"
        )


def metrics_doc(
    config: ReplayConfig,
    ranks: list[dict[str, Any]],
    manifest: dict[str, Any],
    started: str,
    wall: float,
    interrupted: bool,
    warnings: Sequence[str],
    size: int,
    mpi: bool,
) -> dict[str, Any]:
    """The document written to ``metrics.json``: the run's settings and its ranks' aggregated metrics."""
    agg = aggregate(ranks, config.au_threshold)
    complete = not interrupted and all(r["complete"] for r in ranks) and len(ranks) == size
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    m = config.model
    return {
        "schema": METRICS_SCHEMA,
        "format_version": METRICS_FORMAT_VERSION,
        "complete": complete,
        "interrupted": interrupted,
        "errors": errors,
        "model_name": m.model.name,
        "dataset_format": m.dataset.format,
        "model_digest": dataset_digest(m),
        "data_dir": str(config.data_dir),
        "dataset_bytes": int(manifest.get("total_bytes", 0)),
        "io": config.io,
        "loader": choose_loader(config)[0],
        "loader_reason": choose_loader(config)[1],
        "accelerators": size,
        "mpi": mpi,
        "seed": config.seed,
        "batch_size": m.reader.batch_size,
        "read_threads": m.reader.read_threads,
        # the step's host CPU model (train.computation_host_cpu): mean CPU seconds per step, threads
        "host_cpu_per_step_s": m.train.computation_host_cpu.mean if spends_host_cpu(m) else 0.0,
        "host_cpu_threads": m.train.computation_host_threads if spends_host_cpu(m) else 0,
        "epochs_planned": m.train.epochs,
        "cold": config.cold or None,
        "dlreplay_version": dlreplay.__version__,
        "started": started,
        "wall_time_s": wall,
        "warnings": list(warnings),
        **agg,
    }


def now_utc() -> str:
    """The time now, UTC, ISO 8601 to the millisecond."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
