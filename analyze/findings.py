"""Bottleneck findings: rules over a :class:`~.passes.Characterization`.

A :class:`Finding` says what was seen (``evidence``: the numbers that triggered it and
the threshold they crossed), why it happens (``root_cause``), what to do
(``recommendation``) and, where the advice maps to a workload-model change, the exact
``--set`` overrides that let ``dlreplay replay`` (or ``dlreplay analyze --verify``)
predict its effect (``whatif``).

Every threshold lives in :class:`Thresholds` with its unit and meaning; a YAML file
(``dlreplay analyze --config rules.yaml``) overrides them::

    thresholds:
      au_target: 0.95          # MLPerf Storage asks 0.90 for unet3d, 0.70 for cosmoflow
      small_read_bytes: 131072
    disable: [page-cache]

Severity is ``high`` (costs a large share of the run), ``medium``, ``low`` or
``info``. Findings sort by severity, then by ``impact_s`` (seconds of the run the
finding concerns). A healthy run (AU at target, efficient I/O) yields no ``high``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from dlreplay.errors import UsageError
from dlreplay.units import human_bytes, human_seconds

from .distill.measure import workers_per_rank
from .passes import Characterization

__all__ = ["RULES", "SEVERITIES", "Finding", "Thresholds", "find", "load_thresholds", "top_cause"]

SEVERITIES = ("high", "medium", "low", "info")


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules compare against. Units in the field comments."""

    au_target: float = 0.90  # AU below this: the accelerator waits for data (MLPerf unet3d: 0.90)
    au_high: float = 0.70  # AU below this makes data-wait findings high severity
    worker_busy_low: float = 0.25  # ... idler than this (with AU at target) are more than needed
    small_read_bytes: int = (
        64 << 10
    )  # reads below this (bytes) are small (half the bytes moved in them)
    small_reads_per_sample: float = (
        4.0  # a sample taking at least this many reads is read in pieces
    )
    seeks_per_read: float = 1.0  # dataset lseeks per read at or above this: interleaved seeks
    meta_time_share: float = 0.30  # metadata calls' share of dataset I/O time at or above this
    small_file_bytes: int = (
        1 << 20
    )  # files below this (bytes) opened once per sample are "small files"
    small_file_count: int = 100  # ... when there are at least this many
    random_fraction: float = (
        0.30  # share of non-sequential dataset reads at or above this is random
    )
    large_file_bytes: int = 1 << 20  # files at least this big (bytes) count as large shared files
    imbalance_ratio: float = 1.5  # max/median (items or busy time of workers; epoch time of ranks)
    checkpoint_share: float = 0.05  # training blocked in checkpoint saves, share of the run
    checkpoint_share_high: float = 0.20  # ... high severity from this share
    checkpoint_write_bytes: int = (
        1 << 20
    )  # median checkpoint write call below this (bytes) is small
    preprocess_ratio: float = 5.0  # item time / POSIX time inside items at or above this
    device_bandwidth_bps: float = (
        3.0e9  # in-call read bandwidth above this (bytes/s) can only be page cache
    )
    cache_memory_share: float = (
        0.5  # dataset smaller than this share of host RAM and re-read: cached
    )
    overlap_min: float = 0.5  # share of dataset I/O time overlapped with compute below this
    io_share_min: float = 0.05  # ... only when dataset I/O is at least this share of the run
    startup_wait_share: float = 0.5  # epoch-start waits at or above this share of all data wait
    startup_wait_s: float = 0.5  # ... and at least this many seconds in all


def load_thresholds(path: str | Path | None) -> tuple[Thresholds, set[str]]:
    """Thresholds (and disabled rule ids) from a YAML config; defaults without a path.

    Unknown keys and wrong types are errors naming the key and the file.
    """
    if path is None:
        return Thresholds(), set()
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{p}: cannot read the rules config: {exc}") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{p}: expected a mapping with `thresholds:` and/or `disable:`")
    unknown = set(doc) - {"thresholds", "disable"}
    if unknown:
        raise UsageError(
            f"{p}: unknown key(s) {', '.join(sorted(unknown))}; expected thresholds, disable"
        )
    known = {f.name: f for f in fields(Thresholds)}
    values: dict[str, Any] = {}
    for key, value in (doc.get("thresholds") or {}).items():
        if key not in known:
            raise UsageError(f"{p}: thresholds.{key} is not a threshold; known: {', '.join(known)}")
        default = getattr(Thresholds(), key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise UsageError(f"{p}: thresholds.{key} must be a non-negative number, got {value!r}")
        values[key] = (
            type(default)(value)
            if isinstance(default, float) or float(value).is_integer()
            else value
        )
    disable = doc.get("disable") or []
    if not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
        raise UsageError(f"{p}: disable must be a list of rule ids")
    bad = [d for d in disable if d not in RULES]
    if bad:
        raise UsageError(
            f"{p}: disable: unknown rule id(s) {', '.join(bad)}; known: {', '.join(RULES)}"
        )
    return Thresholds(**values), set(disable)


@dataclass
class Finding:
    """One diagnosed problem. ``evidence`` values are numbers from the trace (units in keys)."""

    id: str
    severity: str
    title: str
    evidence: dict[str, Any]
    threshold: str
    root_cause: str
    recommendation: str
    impact_s: float = 0.0
    kind: str = "cause"  # "symptom" (what training feels: data-wait) or "cause" (why)
    files: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    whatif: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------
# Rules. Each takes (characterization, thresholds) and returns findings.

Rule = Callable[[Characterization, Thresholds], list[Finding]]

#: Which library issues the reads, by dataset file extension (for the root cause).
LIBRARY_OF = {
    ".npz": (
        "numpy.load on a zip archive",
        "zipfile reads each member's local header (tens of bytes) and numpy "
        "reads the array through the zip stream in pieces of at most 256 KiB (numpy.lib.format's "
        "BUFFER_SIZE)",
    ),
    ".npy": ("numpy.load", "numpy reads the header, then the array in pieces of at most 256 KiB"),
    ".h5": (
        "h5py / the HDF5 library",
        "HDF5 reads the superblock, object headers and B-tree/heap metadata in "
        "small pieces, then one read per chunk",
    ),
    ".hdf5": (
        "h5py / the HDF5 library",
        "HDF5 reads metadata in small pieces, then one read per chunk",
    ),
    ".jpg": (
        "Pillow (PIL.Image.open / load)",
        "Pillow parses JPEG markers a few bytes at a time and reads the "
        "data in small blocks; through an unbuffered file object every one is a read(2)",
    ),
    ".jpeg": ("Pillow (PIL.Image.open / load)", "Pillow parses markers a few bytes at a time"),
    ".png": ("Pillow (PIL.Image.open / load)", "Pillow reads PNG chunks one at a time"),
    ".tfrecord": ("the TFRecord reader", "records are read one length-prefixed record at a time"),
    ".parquet": ("pyarrow", "Parquet footers and column chunks are read separately"),
    ".csv": ("the CSV reader", "rows are read line by line"),
}


def _top_ext(c: Characterization) -> str:
    exts = c["transfer"].get("extensions") or {}
    return max(exts, key=lambda e: exts[e]) if exts else ""


def _library(c: Characterization) -> tuple[str, str]:
    return LIBRARY_OF.get(
        _top_ext(c), ("the data-loading code", "the reader issues many small read calls")
    )


def _dataset_files(c: Characterization, n: int = 5) -> list[str]:
    return [r["file"] for r in c["access"].get("per_file", [])[:n]]


def _workers(c: Characterization) -> int:
    """Loader workers per rank (0 = the consumer reads itself)."""
    v = c.view
    if not v.workers:
        return 0
    wi = v.items.filter(pl.col("pid").is_in(v.workers))
    return max(workers_per_rank(wi, v.epochs, v.consumers or [0]), 1)


def _worker_busy(c: Characterization) -> float | None:
    busy = [
        p["busy"]
        for p in c["processes"]["processes"]
        if p["role"] == "worker" and p["busy"] is not None
    ]
    if not busy:
        return None
    busy.sort()
    return busy[len(busy) // 2]


def rule_data_wait(c: Characterization, t: Thresholds) -> list[Finding]:
    """AU counting data waits only (checkpoint stalls have findings of their own)."""
    s = c["steps"]
    au = s.get("au_data", s.get("au"))
    if au is None or au >= t.au_target:
        return []
    without = " without checkpoint time" if (s.get("checkpoint_s") or 0) > 0 else ""
    return [
        Finding(
            id="data-wait",
            severity="high" if au < t.au_high else "medium",
            title=f"The training loop waits for data: AU {au:.0%}{without} (target {t.au_target:.0%})",
            evidence={
                "au_data": au,
                "au": s.get("au"),
                "wait_s": s["wait_s"],
                "compute_s": s["compute_s"],
                "checkpoint_s": s["checkpoint_s"],
                "steps": s["steps"] - s["warmup_steps"],
                "steps_waiting_longer_than_compute": s["steps_waiting_longer_than_compute"],
                "median_wait_s": s["median_wait_s"],
                "median_compute_s": s["median_compute_s"],
                "worst_waits": s["worst_waits"][:3],
            },
            threshold=f"compute / (compute + data wait) < {t.au_target} (high below {t.au_high})",
            root_cause=(
                f"Batches arrive slower than the model consumes them: the consumer spent "
                f"{human_seconds(s['wait_s'])} waiting and {human_seconds(s['compute_s'])} computing over "
                f"{s['steps'] - s['warmup_steps']} steady-state steps. See the other findings for why the "
                "loader is slow."
            ),
            recommendation="Fix the loader bottleneck named by the findings below (workers, read sizes, file "
            "layout), then re-measure AU; `dlreplay analyze --verify` predicts the effect by replay.",
            impact_s=float(s["wait_s"] or 0.0),
            processes=sorted({w["pid"] for w in s["worst_waits"]}),
            kind="symptom",
        )
    ]


def rule_workers(c: Characterization, t: Thresholds) -> list[Finding]:
    """Too few workers: the consumer waits in steady state (first batch of each epoch excluded).

    In steady state with the loader as the bottleneck, n workers deliver one batch per
    (compute + wait); n / AU workers would deliver one per compute step. The
    recommendation adds 25 % headroom.
    """
    s = c["steps"]
    au, steady = s.get("au"), s.get("au_data_steady", s.get("au_steady"))
    n = _workers(c)
    busy = _worker_busy(c)
    out: list[Finding] = []
    if steady is not None and steady < t.au_target:
        more = max(n + 1, math.ceil(max(n, 1) / max(steady, 0.05) * 1.25))
        what = (
            "the consumer reads and decodes every sample itself (0 loader workers)"
            if n == 0
            else f"{n} loader worker(s) per rank deliver a batch every "
            f"{human_seconds((s['median_compute_s'] or 0) + (s['median_wait_s'] or 0))} while a step computes in "
            f"{human_seconds(s['median_compute_s'] or 0)}"
        )
        out.append(
            Finding(
                id="too-few-workers",
                severity="high" if steady < t.au_high else "medium",
                title=f"Too few data-loader workers: {n} per rank, steady-state AU {steady:.0%}",
                evidence={
                    "workers_per_rank": n,
                    "au_steady": steady,
                    "au": au,
                    "worker_busy": busy,
                    "median_wait_s": s["median_wait_s"],
                    "median_compute_s": s["median_compute_s"],
                    "wait_s": s["wait_s"],
                },
                threshold=f"compute / (compute + data wait) without each epoch's first batch < {t.au_target}",
                root_cause=f"Loading is the bottleneck in steady state, not only at epoch start: {what}, so the "
                "consumer waits at almost every step.",
                recommendation=f"Raise DataLoader(num_workers=...) to about {more} per rank (n / AU + 25 %, CPU cores "
                "permitting) and keep prefetch_factor >= 2; or make each sample cheaper to load (see "
                "the I/O findings).",
                impact_s=float(s["wait_s"] or 0.0) - float(s.get("epoch_start_wait_s") or 0.0),
                processes=c.view.workers[:16],
                whatif=[f"reader.read_threads={more}"],
            )
        )
    elif (
        au is not None
        and au >= t.au_target
        and busy is not None
        and busy < t.worker_busy_low
        and n > 2
    ):
        fewer = max(1, math.ceil(n * busy * 2))
        out.append(
            Finding(
                id="idle-workers",
                severity="low",
                title=f"Loader workers mostly idle: {n} per rank, busy {busy:.0%}",
                evidence={"workers_per_rank": n, "worker_busy": busy, "au": au},
                threshold=f"worker busy < {t.worker_busy_low} with au >= {t.au_target} and more than 2 workers",
                root_cause="The loader delivers far faster than the model consumes; extra workers hold memory and "
                "CPU (pinned pages, decoded batches) without raising AU.",
                recommendation=f"{fewer} worker(s) per rank would keep the same AU; give the CPU to other work.",
                processes=c.view.workers[:16],
                whatif=[f"reader.read_threads={fewer}"],
            )
        )
    return out


def rule_small_reads(c: Characterization, t: Thresholds) -> list[Finding]:
    """A sample arrives in many pieces: most of its bytes move in reads under half its size."""
    tr = c["transfer"]
    rs = tr["read_size"]
    per_sample, sample_bytes, typical = (
        tr.get("reads_per_sample"),
        tr.get("bytes_per_sample"),
        rs.get("bytes_weighted_median"),
    )
    if per_sample is None or sample_bytes is None or typical is None:
        return []
    if per_sample < t.small_reads_per_sample or typical > sample_bytes / 2:
        return []
    lib, why = _library(c)
    calls = ", ".join(f"{n:,} {k}() calls" for k, n in tr["calls"].items())
    io_s = c["metadata"].get("data_time_s") or 0.0
    au = c["steps"].get("au")
    severity = "medium" if au is None or au < t.au_target or typical < t.small_read_bytes else "low"
    return [
        Finding(
            id="small-reads",
            severity=severity,
            title=f"Samples read in pieces: {per_sample:g} reads per {human_bytes(sample_bytes)} sample, most "
            f"bytes in reads of {human_bytes(typical)} (median read {human_bytes(rs['median'] or 0)})",
            evidence={
                "reads_per_sample": per_sample,
                "bytes_per_sample": sample_bytes,
                "bytes_weighted_median_read": typical,
                "median_read_bytes": rs["median"],
                "max_read_bytes": rs["max"],
                "read_calls": rs["count"],
                "calls": tr["calls"],
                "format": _top_ext(c),
                "read_time_s": io_s,
            },
            threshold=f">= {t.small_reads_per_sample} reads per sample and half the bytes in reads <= half a sample",
            root_cause=f"The reads come from {lib} ({calls}): {why}. Each call is a round trip to storage; on a "
            "network or parallel file system the per-call latency, not bandwidth, sets the sample rate.",
            recommendation="Read each sample with one large call and decode from memory (e.g. "
            "np.load(io.BytesIO(f.read())), open(path, 'rb', buffering=1<<20)), or store samples in a "
            "format read in large blocks (HDF5 with sample-sized chunks, TFRecord/WebDataset shards).",
            impact_s=float(io_s),
            files=_dataset_files(c),
            # no replay what-if: a library-mode replay reads through the same library (same calls), and a
            # posix-mode replay draws call sizes from one distribution, which cannot express "15 calls, most
            # bytes in 256 KiB pieces" faithfully enough to predict the gain
        )
    ]


def rule_seeks(c: Characterization, t: Thresholds) -> list[Finding]:
    m = c["metadata"]
    spr = m.get("seeks_per_read")
    if spr is None or spr < t.seeks_per_read:
        return []
    lib, _ = _library(c)
    return [
        Finding(
            id="seek-interleaved",
            severity="low",
            title=f"Reads interleaved with lseeks: {spr:.2f} seeks per read",
            evidence={"seeks": m["seeks"], "data_calls": m["data_calls"], "seeks_per_read": spr},
            threshold=f"seeks per read >= {t.seeks_per_read}",
            root_cause=f"{lib} positions the file with lseek before (and after) its reads to find headers and "
            "members; each seek is a system call and defeats kernel read-ahead heuristics.",
            recommendation="Read whole samples in one call (pread at a known offset or a buffered read) so the "
            "library parses from memory.",
            impact_s=float(m.get("meta_time_s") or 0.0),
            files=_dataset_files(c),
        )
    ]


def rule_metadata(c: Characterization, t: Thresholds) -> list[Finding]:
    m = c["metadata"]
    if m.get("missing"):
        return []
    share, ops, size, files = (
        m.get("meta_share"),
        m.get("opens_per_sample"),
        m.get("mean_file_size"),
        m["files"],
    )
    small_files = (
        ops is not None
        and ops >= 1
        and size is not None
        and size < t.small_file_bytes
        and files >= t.small_file_count
    )
    if not (small_files or (share is not None and share >= t.meta_time_share)):
        return []
    au = c["steps"].get("au")
    # high only when the metadata calls themselves cost a fifth of the training loop
    loop = c["checkpoints"].get("training_s") or 0.0
    costly = loop > 0 and (m.get("meta_time_s") or 0.0) >= 0.2 * loop
    severity = "high" if costly and au is not None and au < t.au_target else "medium"
    # ~64 MiB shards, but keep at least 8 files so loader workers still share them out
    spf = max(1, min(int((64 << 20) // max(size or 1, 1)), files // 8))
    new_files = max(1, math.ceil(files / spf))
    return [
        Finding(
            id="metadata-heavy",
            severity=severity,
            title=f"Metadata-dominated I/O: {m['opens']} opens for {files} files, metadata "
            f"{(share or 0):.0%} of dataset I/O time",
            evidence={
                "opens": m["opens"],
                "files": files,
                "opens_per_sample": ops,
                "mean_file_size_bytes": size,
                "meta_calls": m["meta_calls"],
                "data_calls": m["data_calls"],
                "meta_time_s": m["meta_time_s"],
                "data_time_s": m["data_time_s"],
                "meta_share": share,
            },
            threshold=f"metadata share >= {t.meta_time_share}, or >= {t.small_file_count} files under "
            f"{t.small_file_bytes} B opened once per sample",
            root_cause="Every sample is its own small file, opened, stat'ed, seeked and closed per access: on a "
            "parallel or network file system each open is a metadata-server round trip, so the file "
            "count, not the bytes, limits the sample rate.",
            recommendation=f"Pack samples into larger files (e.g. ~{spf} samples per file: {new_files} HDF5, TFRecord "
            "or WebDataset shards) and keep them open across samples.",
            impact_s=float(m.get("meta_time_s") or 0.0),
            files=_dataset_files(c),
            whatif=[
                f"dataset.num_samples_per_file={spf}",
                f"dataset.num_files={new_files}",
                "reader.open_per_sample=false",
            ]
            if small_files
            else ["reader.open_per_sample=false"],
        )
    ]


def rule_random(c: Characterization, t: Thresholds) -> list[Finding]:
    a, m, tr = c["access"], c["metadata"], c["transfer"]
    rnd, med, size = (
        a.get("random"),
        tr["read_size"].get("bytes_weighted_median"),
        m.get("mean_file_size"),
    )
    if (
        rnd is None
        or med is None
        or rnd < t.random_fraction
        or med >= t.small_read_bytes
        or size is None
        or size < t.large_file_bytes
    ):
        return []
    lib, why = _library(c)
    return [
        Finding(
            id="small-random-reads",
            severity="medium",
            title=f"Small random reads inside large files: {rnd:.0%} random, most bytes in {human_bytes(med)} reads in "
            f"{human_bytes(size)} files",
            evidence={
                "random": rnd,
                "sequential": a["sequential"],
                "consecutive": a["consecutive"],
                "reads": a["reads"],
                "bytes_weighted_median_read": med,
                "mean_file_size_bytes": size,
                "reads_per_sample": tr.get("reads_per_sample"),
            },
            threshold=f"random >= {t.random_fraction}, half the bytes in reads < {t.small_read_bytes} B, files >= "
            f"{t.large_file_bytes} B",
            root_cause=f"{lib} jumps around inside each file ({why}); small chunks or scattered metadata turn one "
            "sample into many small reads at random offsets, the slowest pattern for disks and "
            "parallel file systems.",
            recommendation="Store each sample contiguously (HDF5 chunks of one whole sample, or contiguous "
            "layout), consolidate metadata (h5py: libver='latest', paged aggregation), or read the "
            "sample's byte range in one call.",
            impact_s=float(m.get("data_time_s") or 0.0),
            files=_dataset_files(c),
        )
    ]


def rule_imbalance(c: Characterization, t: Thresholds) -> list[Finding]:
    b = c["balance"]
    out: list[Finding] = []
    w = b.get("workers")
    # a worker's share is only comparable over many samples (few batches split unevenly by design)
    if w and w["count"] >= 2 and (w["items"]["median"] or 0) >= 32:
        ratio = (w["items"]["max"] or 0) / w["items"]["median"]
        if ratio >= t.imbalance_ratio:
            out.append(
                Finding(
                    id="worker-imbalance",
                    severity="low",
                    title=f"Loader workers unevenly loaded: max/median items {ratio:.2f}",
                    evidence={
                        "workers": w["count"],
                        "items": w["items"],
                        "busy_s": w["busy_s"],
                        "items_max_over_median": round(ratio, 3),
                    },
                    threshold=f"max/median items per worker >= {t.imbalance_ratio}",
                    root_cause="Some workers handled more samples than others (uneven batch assignment, or "
                    "workers that started late).",
                    recommendation="Check for workers stalled at start-up and for uneven sample sizes.",
                    processes=c.view.workers[:16],
                )
            )
    r = b.get("ranks")
    if (
        r
        and r["count"] >= 2
        and r.get("max_over_median")
        and r["max_over_median"] >= t.imbalance_ratio
    ):
        slow = max(r["per_rank"], key=lambda x: x["epoch_s"] or 0)
        out.append(
            Finding(
                id="rank-imbalance",
                severity="medium",
                title=f"Straggler rank: pid {slow['pid']} takes {r['max_over_median']:.2f}x the median epoch time",
                evidence={
                    "ranks": r["count"],
                    "per_rank": r["per_rank"],
                    "max_over_median": r["max_over_median"],
                },
                threshold=f"max/median epoch time over ranks >= {t.imbalance_ratio}",
                root_cause="One rank's loader or storage path is slower; in synchronous data-parallel training "
                "every rank waits for it at each all-reduce.",
                recommendation="Compare the straggler's read sizes and bandwidth with the others' (node-local "
                "cache, noisy neighbour, uneven file sizes).",
                impact_s=float(slow["wait_s"] or 0.0),
                processes=[slow["pid"]],
            )
        )
    return out


def rule_checkpoint(c: Characterization, t: Thresholds) -> list[Finding]:
    k = c["checkpoints"]
    out: list[Finding] = []
    if not k["saves"]:
        return out
    share = k.get("share_of_training") or 0.0
    if share >= t.checkpoint_share:
        out.append(
            Finding(
                id="checkpoint-stall",
                severity="high" if share >= t.checkpoint_share_high else "medium",
                title=f"Training blocked in checkpoints: {share:.0%} of training time ({k['saves']} saves, "
                f"{human_bytes(k['bytes'])})",
                evidence={
                    "saves": k["saves"],
                    "bytes": k["bytes"],
                    "blocked_s": k["blocked_s"],
                    "share_of_training": share,
                    "training_s": k["training_s"],
                    "save_time_s": k["save_time"],
                    "bandwidth_bps": k["bandwidth_bps"],
                },
                threshold=f"blocked share >= {t.checkpoint_share} (high from {t.checkpoint_share_high})",
                root_cause="torch.save runs in the training loop: the model and optimizer state are serialised and "
                f"written synchronously at {human_bytes(k['bandwidth_bps'] or 0)}/s while the accelerator idles.",
                recommendation="Checkpoint less often, write asynchronously (torch.distributed.checkpoint async_save, "
                "or copy state to host memory and write from a thread), or to faster storage.",
                impact_s=float(k["blocked_s"] or 0.0),
                processes=c.view.consumers[:8],
                whatif=["checkpoint.steps_between_checkpoints=" + str(_double_interval(c))],
            )
        )
    ws = k["write_size"]
    if k["writes_visible"] and ws["median"] is not None and ws["median"] < t.checkpoint_write_bytes:
        out.append(
            Finding(
                id="checkpoint-small-writes",
                severity="low",
                title=f"Checkpoints written in small calls: median {human_bytes(ws['median'])}",
                evidence={"write_calls": k["write_calls"], "write_size": ws},
                threshold=f"median checkpoint write < {t.checkpoint_write_bytes} B",
                root_cause="The serialiser writes through small buffers; each write is a system call.",
                recommendation="Write through a large buffer (open(..., buffering=16<<20)) or serialise to memory "
                "first.",
            )
        )
    if k["fsyncs"] == 0:
        out.append(
            Finding(
                id="checkpoint-no-fsync",
                severity="info",
                title="Checkpoints are not fsync'ed",
                evidence={"saves": k["saves"], "fsyncs": 0},
                threshold="checkpoint saves without fsync/fdatasync",
                root_cause="torch.save returns when the bytes are in the page cache; a node crash can lose the "
                "checkpoint, and the measured save time hides the real cost of reaching storage.",
                recommendation="fsync checkpoint files where durability is expected, and replay with "
                "checkpoint.fsync=true to measure the real cost.",
                whatif=["checkpoint.fsync=true"],
            )
        )
    return out


def _double_interval(c: Characterization) -> int:
    v = c.view
    saves = v.saves.height
    steps = v.steps.height
    return max(2, 2 * max(1, round(steps / saves))) if saves else 2


def rule_preprocess(c: Characterization, t: Thresholds) -> list[Finding]:
    p = c["preprocess"]
    ratio = p.get("ratio")
    if ratio is None or ratio < t.preprocess_ratio:
        return []
    au = c["steps"].get("au")
    lib, _ = _library(c)
    starving = au is not None and au < t.au_target
    per_sample = c["transfer"].get("reads_per_sample") or 0
    # hundreds of reads per sample: the library's time is per-call work for them (chunk
    # lookups, buffer copies); the read-pattern findings name the cause, this one follows
    many_calls = per_sample >= 8 * t.small_reads_per_sample
    severity = ("low" if many_calls else "medium") if starving else "info"
    return [
        Finding(
            id="decode-overhead",
            severity=severity,
            title=f"Loader time goes to decoding, not I/O: {ratio:.1f}x the POSIX time inside samples",
            evidence={
                "items": p["items"],
                "item_time_s": p["item_time_s"],
                "io_in_items_s": p["io_in_items_s"],
                "non_io_s": p["non_io_s"],
                "ratio": ratio,
                "per_item_s": p["per_item_s"],
                "au": au,
            },
            threshold=f"item time / POSIX time inside items >= {t.preprocess_ratio}",
            root_cause=f"Each Dataset.__getitem__ spends {human_seconds(p['per_item_s'] or 0)}, mostly in "
            f"{lib} and transforms (deserialisation, decompression, augmentation) rather than in reads"
            + (
                ": faster storage would not raise AU"
                if starving
                else "; it is hidden behind compute today"
            )
            + (
                f". Much of it is the library's per-call work for {per_sample:g} reads per sample (see the "
                "read-pattern findings)."
                if many_calls
                else "."
            ),
            recommendation="Add workers, decode cheaper formats (raw arrays instead of compressed/encoded), move "
            "augmentation to the accelerator (e.g. NVIDIA DALI), or cache decoded samples.",
            impact_s=float(p["non_io_s"] or 0.0) if starving else 0.0,
            processes=c.view.workers[:16],
            whatif=[f"reader.read_threads={max(2, 2 * _workers(c))}"] if starving else [],
        )
    ]


def rule_page_cache(c: Characterization, t: Thresholds) -> list[Finding]:
    pc = c["page_cache"]
    bps = pc.get("large_read_bps") or 0.0
    mem, ds, reread = (
        pc.get("host_memory_bytes"),
        pc.get("dataset_bytes") or 0,
        pc.get("reread_factor") or 0,
    )
    fits = bool(mem and ds and ds < t.cache_memory_share * mem and reread >= 1.5)
    fast = bps >= t.device_bandwidth_bps
    if not (fits or fast):
        return []
    why = []
    if fast:
        why.append(
            f"reads of >= 64 KiB ran at {human_bytes(bps)}/s inside the call, above "
            f"{human_bytes(t.device_bandwidth_bps)}/s that storage devices deliver"
        )
    if fits:
        why.append(
            f"the dataset ({human_bytes(ds)}) is {ds / (mem or 1):.1%} of host memory ({human_bytes(mem)}) and "
            f"was read {reread:.1f}x"
        )
    return [
        Finding(
            id="page-cache",
            severity="medium",
            title="Reads were served from the page cache: the run says little about the storage",
            evidence={
                "large_read_bps": pc.get("large_read_bps"),
                "in_call_bps": pc.get("in_call_bps"),
                "dataset_bytes": ds,
                "host_memory_bytes": mem,
                "host_memory_source": pc.get("host_memory_source"),
                "reread_factor": reread,
            },
            threshold=f"in-call bandwidth >= {t.device_bandwidth_bps:g} B/s, or dataset < {t.cache_memory_share} x RAM "
            "and re-read",
            root_cause="; ".join(why)
            + ". After the first epoch the kernel serves the data from memory.",
            recommendation="For storage measurements use a dataset larger than the nodes' RAM (MLPerf Storage: at "
            "least 5x), drop caches between runs (echo 3 > /proc/sys/vm/drop_caches), or use O_DIRECT.",
            files=_dataset_files(c, 3),
        )
    ]


def rule_overlap(c: Characterization, t: Thresholds) -> list[Finding]:
    o, dur = c["overlap"], c.view.duration_s
    ov, io_s = o.get("overlap"), o.get("io_time_s") or 0.0
    if ov is None or not dur or io_s / dur < t.io_share_min or ov >= t.overlap_min:
        return []
    in_consumer = o.get("io_in_consumer_s") or 0.0
    return [
        Finding(
            id="no-overlap",
            severity="medium",
            title=f"I/O not overlapped with compute: {ov:.0%} of {human_seconds(io_s)} dataset I/O during compute",
            evidence={
                "overlap": ov,
                "io_time_s": io_s,
                "overlapped_s": o["overlapped_s"],
                "io_in_consumer_s": in_consumer,
                "run_s": round(dur, 6),
            },
            threshold=f"overlap < {t.overlap_min} with dataset I/O >= {t.io_share_min} of the run",
            root_cause=(
                "The training process reads samples itself, between steps"
                if in_consumer >= 0.5 * io_s
                else "Loader workers read only while the consumer waits (prefetch too shallow)"
            )
            + ", so I/O time adds to step time instead of hiding behind it.",
            recommendation="Use DataLoader workers (num_workers > 0) with prefetch_factor >= 2 so reading overlaps "
            "the training step.",
            impact_s=float(io_s - (o["overlapped_s"] or 0.0)),
            whatif=[f"reader.read_threads={max(2, _workers(c))}", "reader.prefetch_factor=2"],
        )
    ]


def rule_startup(c: Characterization, t: Thresholds) -> list[Finding]:
    """Long waits at the first batch of each epoch: new worker processes start every epoch."""
    v = c.view
    fetch = v.fetches.filter(pl.col("batch_size").fill_null(1) > 0).sort("ts")
    if fetch.is_empty() or not v.workers or fetch["epoch"].n_unique() < 2:
        return []
    first = (
        fetch.group_by("pid", "epoch")
        .agg(pl.col("dur").first().alias("w"))
        .filter(pl.col("epoch") > 0)
    )
    startup_us = int(first["w"].sum() or 0)
    # waits of the later epochs' batches after the first
    total_us = int(fetch.filter(pl.col("epoch") > 0)["dur"].sum() or 0)
    if (
        not total_us
        or startup_us / total_us < t.startup_wait_share
        or startup_us * 1e-6 < t.startup_wait_s
    ):
        return []
    persistent = _persistent(c)
    if persistent:
        return []
    return [
        Finding(
            id="worker-startup",
            severity="medium",
            title=f"Loader workers restart every epoch: {human_seconds(startup_us * 1e-6)} waiting for first batches",
            evidence={
                "epoch_start_wait_s": round(startup_us * 1e-6, 6),
                "later_epochs_wait_s": round(total_us * 1e-6, 6),
                "share": round(startup_us / total_us, 4),
                "epochs": int(fetch["epoch"].n_unique()),
                "worker_processes": len(v.workers),
            },
            threshold=f"first-batch waits >= {t.startup_wait_share} of all waits after epoch 0 and >= "
            f"{t.startup_wait_s} s",
            root_cause="Without persistent_workers, PyTorch starts new worker processes at every epoch; with the "
            "spawn/forkserver start methods each imports torch and the dataset code again before the "
            "first batch.",
            recommendation="DataLoader(persistent_workers=True) keeps workers across epochs.",
            impact_s=startup_us * 1e-6,
            processes=v.workers[:16],
            whatif=["reader.persistent_workers=true"],
        )
    ]


def _persistent(c: Characterization) -> bool:
    """True when the same worker pids serve several epochs."""
    v = c.view
    it = v.items.filter(pl.col("pid").is_in(v.workers)).sort("ts")
    ep = v.epochs.select(pl.col("ts").alias("e_ts"), pl.col("epoch").alias("win")).sort("e_ts")
    if it.is_empty() or ep.height < 2:
        return False
    tagged = it.join_asof(ep, left_on="ts", right_on="e_ts", strategy="backward")
    spans = tagged.group_by("pid").agg(pl.col("win").n_unique().alias("n"))
    return float((spans["n"] > 1).cast(pl.Float64).mean() or 0.0) > 0.5  # type: ignore[arg-type]


#: Every rule by the finding id(s) it emits.
RULES: dict[str, Rule] = {
    "data-wait": rule_data_wait,
    "too-few-workers": rule_workers,
    "idle-workers": rule_workers,
    "small-random-reads": rule_random,
    "small-reads": rule_small_reads,
    "seek-interleaved": rule_seeks,
    "metadata-heavy": rule_metadata,
    "worker-imbalance": rule_imbalance,
    "rank-imbalance": rule_imbalance,
    "checkpoint-stall": rule_checkpoint,
    "checkpoint-small-writes": rule_checkpoint,
    "checkpoint-no-fsync": rule_checkpoint,
    "decode-overhead": rule_preprocess,
    "page-cache": rule_page_cache,
    "no-overlap": rule_overlap,
    "worker-startup": rule_startup,
}


def find(
    c: Characterization, thresholds: Thresholds | None = None, disable: Iterable[str] = ()
) -> list[Finding]:
    """Run every rule; findings sorted by severity, then impact (seconds), largest first."""
    t = thresholds or Thresholds()
    off = set(disable)
    seen: set[Rule] = set()
    out: list[Finding] = []
    for rule in RULES.values():
        if rule in seen:
            continue
        seen.add(rule)
        out.extend(f for f in rule(c, t) if f.id not in off)
    _relate(out)
    order = {rid: i for i, rid in enumerate(RULES)}  # ties: the more specific rule first
    return sorted(
        out,
        key=lambda f: (
            f.kind != "symptom",
            SEVERITIES.index(f.severity),
            -round(f.impact_s, 6),
            order[f.id],
        ),
    )


def _relate(findings: list[Finding]) -> None:
    """Fold findings that explain another one into it (one root cause, one top finding).

    With too few workers, the decoding time inside samples is *why* the workers are
    slow; it stays as supporting detail (low severity) so the fix (more workers)
    ranks first.
    """
    ids = {f.id for f in findings}
    for f in findings:
        if (
            f.id == "decode-overhead"
            and "too-few-workers" in ids
            and f.severity in ("high", "medium")
        ):
            f.severity = "low"
            f.root_cause += " This is the per-sample work that the too-few-workers finding spreads over more workers."


def top_cause(findings: list[Finding]) -> Finding | None:
    """The first finding that is a cause (not the data-wait symptom)."""
    return next((f for f in findings if f.kind == "cause"), None)
