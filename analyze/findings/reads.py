"""Finding rules about how the dataset is read: small reads, interleaved seeks, metadata-heavy
access to many small files, small random reads and reads served by the page cache."""

from __future__ import annotations

import math

from dlreplay.units import human_bytes

from ..passes import Characterization
from .base import (
    Finding,
    Thresholds,
    dataset_files,
    reading_library,
    top_extension,
)


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
    lib, why = reading_library(c)
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
                "format": top_extension(c),
                "read_time_s": io_s,
            },
            threshold=f">= {t.small_reads_per_sample} reads per sample and half the bytes in reads <= half a sample",
            root_cause=f"The reads come from {lib} ({calls}): {why}. Each call is a round trip to storage; on a "
            "network or parallel file system the per-call latency, not bandwidth, sets the sample rate.",
            recommendation="Read each sample with one large call and decode from memory (e.g. "
            "np.load(io.BytesIO(f.read())), open(path, 'rb', buffering=1<<20)), or store samples in a "
            "format read in large blocks (HDF5 with sample-sized chunks, TFRecord/WebDataset shards).",
            impact_s=float(io_s),
            files=dataset_files(c),
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
    lib, _ = reading_library(c)
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
            files=dataset_files(c),
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
            files=dataset_files(c),
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
    lib, why = reading_library(c)
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
            files=dataset_files(c),
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
            files=dataset_files(c, 3),
        )
    ]
