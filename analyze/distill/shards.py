"""Shards streamed by an ``IterableDataset`` (WebDataset tar shards, Arrow IPC stream files):
recognised from the trace and modelled.

A streaming job's loader workers each open a shard, read it through in the library's read
size, and yield many samples from that one open; the map-style reading of the other sections
("one item = one file read") would model each shard as one sample. :func:`streamed_shards`
recognises it: the dataset's files are tar or Arrow shards (their first bytes, else their
extension) and the loader yields more samples per epoch than it opens shards; in a trace
without the loader's events (DFTracer's POSIX calls alone), every open of a shard read it
through and a shard holds more than one sample (its headers, or the capture's dataset
fingerprint, say how many). It then says:

* ``dataset``: format ``tar``/``arrow``, samples and bytes per shard, and the members of each
  sample (``layout.shard_members``: tar members sharing a key, or Arrow columns; the Arrow
  record batch rows), read from the shards' headers where the files are at hand, else from
  the trace (samples per epoch over shards opened per epoch; one part per sample);
* ``reader.streaming``: the library (tar: ``tarfile`` reads 10 KiB records in stream mode;
  ``webdataset`` reads through a buffered file), the split of shards over ranks and workers
  (``interleaved``: a worker's shards are R*W apart; ``contiguous``: adjacent), the shuffle
  buffer (samples a worker read before its first batch was complete, beyond the batch);
* ``reader.read_threads`` (worker processes reading shards per epoch and rank),
  ``persistent_workers``, ``open_per_sample`` false and opens/closes per sample;
* ``reader.preprocess_time`` (seconds per sample of the workers' batch fetches outside their
  shard reads) and ``reader.preprocess_host_cpu`` (CPU seconds per sample in those fetches).

Units: bytes, samples.
"""

from __future__ import annotations

import tarfile
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import polars as pl

from dlreplay.capture.fingerprint.shards import (
    arrow_parts,
    is_arrow_header,
    is_tar_header,
    tar_parts,
)
from dlreplay.model import Dataset, Distribution, Layout, Reader, ShardMember, Streaming
from dlreplay.schema import CLOSE_OPS, OPEN_OPS

from ..infer import PosixLoop
from .base import US, Facts, Observed, num, observed
from .measure import file_sizes

__all__ = ["SHARD_EXTENSIONS", "TAR_RECORD", "shard_format", "streamed_shards"]

#: Shard file extensions and their format.
SHARD_EXTENSIONS = {".tar": "tar", ".arrow": "arrow"}
#: tarfile's stream-mode read size (``tarfile.RECORDSIZE``, 20 blocks of 512 bytes).
TAR_RECORD = tarfile.RECORDSIZE
#: Shards whose headers distill reads for the member layout (a bounded sample).
SHARDS_SAMPLED = 4


def shard_format(paths: list[str]) -> str | None:
    """``tar`` or ``arrow`` when the files are such shards (the first readable file's magic:
    ``ustar`` at byte 257, an Arrow stream's continuation marker or file magic), else by their
    extension when none is readable; None otherwise."""
    for p in paths[:SHARDS_SAMPLED]:
        try:
            with open(p, "rb") as fh:
                head = fh.read(264)
        except OSError:
            continue
        if is_tar_header(head):
            return "tar"
        if is_arrow_header(head, PurePosixPath(p).suffix):
            return "arrow"
        return None
    exts = {PurePosixPath(p).suffix for p in paths}
    return SHARD_EXTENSIONS.get(exts.pop()) if len(exts) == 1 else None


def streamed_shards(
    obs: Observed,
    dataset: Dataset,
    reader: Reader,
    facts: Facts,
    fingerprint: dict[str, Any] | None = None,
) -> tuple[Dataset, Reader, PosixLoop | None]:
    """(dataset, reader, the POSIX loop) modelling streamed shards when the trace shows them (see
    module doc); unchanged otherwise. The POSIX loop (a trace without loader events) is the
    inference's, seen through the streamed samples where their batches show. *fingerprint*:
    the dataset fingerprint, for the shards' insides where the files are not at hand."""
    fmt = shard_format(obs.paths)
    posix_only = not obs.has_loader
    if fmt == "arrow" and obs.mapped and obs.reads.is_empty():
        return (*_mapped_table_rows(obs, dataset, reader, facts, fingerprint), obs.posix)
    if fmt is None or obs.reads.is_empty() or (posix_only and obs.posix is None):
        return dataset, reader, obs.posix
    files = pl.DataFrame({"file": obs.paths, "shard": range(len(obs.paths))})
    io = obs.io.with_columns(pl.col("file").cast(pl.String)).join(files, on="file")
    # the opens of processes that read shards (not those that wrote them: a job making its data)
    readers = obs.reads.select("pid", pl.col("file").cast(pl.String)).unique()
    opens = io.filter(pl.col("name").is_in(OPEN_OPS)).join(readers, on=["pid", "file"], how="semi")
    inside = _inside(obs.paths, fmt, fingerprint)
    if posix_only:
        got = _posix_stream(obs, opens, inside, facts)
        if got is None:
            return dataset, reader, obs.posix
        epochs, samples = got
    else:
        epochs = max(1, int(obs.steps["epoch"].n_unique()))
        samples = _samples_per_epoch(obs, epochs)
    opens_per_epoch = opens.height / epochs
    if not opens.height or samples <= opens_per_epoch:
        return dataset, reader, obs.posix  # one open per sample: map-style reads of whole files
    spf_trace = max(1, round(samples / opens_per_epoch))
    spf = inside[0] if inside else spf_trace
    facts.put("dataset.format", f"{fmt} shards (the files' magic or extension)", "measured")
    # the map-style sections' word on the layout is superseded: say where the shards' comes from
    facts.notes[:] = [n for n in facts.notes if "layout inferred from the trace" not in n]
    facts.notes.append(
        f"{fmt} shards streamed whole by an IterableDataset: {len(obs.paths)} shards, "
        f"{samples:.0f} samples per epoch from {opens_per_epoch:.0f} shard opens per epoch"
    )
    facts.put(
        "dataset.num_samples_per_file",
        f"samples per shard read from {inside[3]}"
        if inside
        else f"{samples:.0f} samples per epoch over {opens_per_epoch:.0f} shard opens per epoch",
        "measured" if inside else "inferred",
    )
    sizes = np.asarray([_size(p) or num(dataset.file_size.mean) for p in obs.paths], dtype=float)
    layout = Layout(
        source="fingerprint" if inside else "inferred",
        files_sampled=len(obs.paths[:SHARDS_SAMPLED]) if inside else None,
        shard_members=inside[1] if inside else None,
        rows_per_batch=inside[2] if inside else None,
    )
    facts.put(
        "dataset.layout",
        f"members per sample read from {inside[3]}"
        if inside
        else "the shards were not at hand: one part per sample",
        "measured" if inside else "default",
    )
    dataset = replace(
        dataset,
        format=fmt,
        num_files=len(obs.paths),
        num_samples_per_file=spf,
        record_length=observed(sizes / spf),
        layout=layout,
    )
    facts.put("dataset.record_length", "shard bytes over samples per shard", "measured")
    posix = obs.posix
    if posix_only:
        reader, posix = _streamed_batch(obs, opens, spf, reader, facts)
    return dataset, _reader(obs, io, opens, reader, fmt, epochs, samples, facts), posix


def _mapped_table_rows(
    obs: Observed,
    dataset: Dataset,
    reader: Reader,
    facts: Facts,
    fingerprint: dict[str, Any] | None,
) -> tuple[Dataset, Reader]:
    """(dataset, reader) of Arrow files that the loader mapped and never read (HF ``datasets``'
    map-style access: ``pa.ipc.open_stream(pa.memory_map(path))``, a row a sample): the rows a
    file and each row's columns from the files' headers or the fingerprint, the files mapped
    in the replay (``reader.memory_map``), which takes each sample's row out of the mapping.
    Unchanged where neither shows the rows (the trace has no bytes of them)."""
    inside = _inside(obs.paths, "arrow", fingerprint)
    if inside is None or inside[0] < 1:
        return dataset, reader
    rows, members, per_batch, where = inside
    row_bytes = sum(num(m.bytes.mean) for m in members) or num(dataset.file_size.mean) / rows
    facts.put("dataset.format", "Arrow files (the files' magic or extension), mapped", "measured")
    facts.put(
        "dataset.num_samples_per_file",
        f"the Arrow table's rows, from {where}: the loader mapped the files and took a row an "
        "item (page faults, no read call)",
        "measured",
    )
    facts.put("dataset.record_length", f"a row's columns, from {where}", "measured")
    facts.put("dataset.layout", f"columns per row from {where}", "measured")
    facts.put("reader.memory_map", "the Arrow files were mapped (mmap) and never read", "measured")
    layout = Layout(
        source="fingerprint",
        files_sampled=len(obs.paths[:SHARDS_SAMPLED]),
        shard_members=members,
        rows_per_batch=per_batch,
    )
    facts.notes.append(
        f"Arrow files mapped by the loader, a row an item ({rows} rows a file): the replay maps "
        "them and copies each sample's row out"
    )
    dataset = replace(
        dataset,
        format="arrow",
        num_samples_per_file=rows,
        record_length=Distribution.fixed(float(row_bytes)),
        layout=layout,
    )
    return dataset, replace(reader, memory_map=True, open_per_sample=False)


def _posix_stream(
    obs: Observed, opens: pl.DataFrame, inside: tuple[int, Any, Any, str] | None, facts: Facts
) -> tuple[int, float] | None:
    """(epochs, samples per epoch) of shards streamed whole in a trace without loader events,
    or None when it does not show them.

    Without the loader's events the samples are not in the trace: they come from the shards'
    headers (samples per shard, where the files are at hand) times the shards opened per epoch;
    the epochs from the POSIX inference (passes over the files, re-forked workers). Streamed,
    not read as samples: every open of a shard read it through (within tarfile's two closing
    records, or an Arrow stream's end), and a shard holds more than one sample. A map-style
    job reading members of a tar by offset reads parts of it per open and stays map-style."""
    if inside is None or inside[0] <= 1 or opens.is_empty():
        return None
    seen = dict(file_sizes(obs.io.with_columns(pl.col("file").cast(pl.String))).iter_rows())
    sizes = {p: _size(p) or seen.get(p) for p in obs.paths}  # on disk, else as far as read
    per_open = (
        obs.reads.with_columns(pl.col("file").cast(pl.String))
        .group_by("pid", "file")
        .agg(pl.col("size").sum().alias("bytes"))
        .join(opens.group_by("pid", "file").len(), on=["pid", "file"])
        .with_columns(pl.col("file").replace_strict(sizes, default=None).alias("of"))
        .drop_nulls("of")
    )
    whole = per_open.filter(pl.col("bytes") / pl.col("len") >= pl.col("of") - 2 * TAR_RECORD)
    if per_open.is_empty() or whole.height < per_open.height:
        return None
    assert obs.posix is not None
    epochs = max(1, int(num(obs.posix.epochs.value or 1)))
    # a shard read whole at every open is what streaming is: the map-style view's doubt whether
    # E passes of k samples per file were E/d passes of k*d does not apply
    facts.notes[:] = [n for n in facts.notes if "every visit read its file whole" not in n]
    facts.notes.append(
        "streamed shards in a trace without loader events: the samples per epoch are the "
        "shards' headers' count times the shards opened per epoch; batch size, shuffle buffer "
        "and compute are not in such a trace"
    )
    return epochs, inside[0] * opens.height / epochs


def _streamed_batch(
    obs: Observed, opens: pl.DataFrame, spf: int, reader: Reader, facts: Facts
) -> tuple[Reader, PosixLoop | None]:
    """(*reader* with the batch size a trace without loader events shows in its streamed
    shards, the POSIX loop seen through the streamed samples), where it shows it:

    * in the samples (:func:`_sample_batches`): a batch's end falls inside a shard;
    * in the shards: a batch of whole shards (``batch`` a multiple of the samples per shard),
      where the POSIX inference found a period of k shard opens: k x the samples per shard.
      The POSIX inference counted shards as samples; its batch, in shards, is never kept as is
      (over the sweep's shard runs it was 2-8x under the truth in 7 of 16, marked inferred).

    Elsewhere the batch is a guess, 1, and said so."""
    found = _sample_batches(obs, opens, spf, facts) if obs.posix is not None else None
    if found is not None:
        return replace(reader, batch_size=found[0]), found[1]
    posix = obs.posix
    shards = int(posix.batch_size.value or 0) if posix is not None else 0
    if shards >= 2:
        facts.put(
            "reader.batch_size",
            f"streamed shards: {shards} shard(s) a batch x {spf} samples a shard "
            f"({posix.batch_size.evidence if posix else ''})",
            "inferred",
        )
        return replace(reader, batch_size=shards * spf), posix
    said = facts.fields.get("reader.batch_size")
    if reader.batch_size != 1 or said is None or said.confidence != "default":
        facts.put(
            "reader.batch_size",
            "streamed shards: no batch in the samples' reads, nor a whole number of shards a "
            "batch: taken as 1 (a guess)",
            "default",
        )
        facts.notes.append(
            "guess: reader.batch_size 1: the trace cannot tell the batch size of these streamed "
            "shards; set it with --set reader.batch_size=N, or capture with the loader hooks"
        )
    return replace(reader, batch_size=1), posix


def _sample_batches(
    obs: Observed, opens: pl.DataFrame, spf: int, facts: Facts
) -> tuple[int, PosixLoop] | None:
    """(batch size, the POSIX loop seen through the streamed samples: its batch size, sample
    visits and steady intervals between a worker's batches) where the samples' reads show it:
    a worker reads a batch's samples back to back, then collates, hands the batch over and,
    ahead of the consumer, waits; the gap before every B-th sample of its epoch is the long one
    (:func:`~dlreplay.analyze.infer.batch_period`, as for files read per sample). A read
    belongs to the sample its offset falls in (the shard's bytes over its samples, tar headers
    included), the sample's visit from its first read to its last. Samples smaller than two
    reads leave some with no read of their own, and no period to count. The gap before a
    shard's first sample is left out: opening the next shard takes the library longer than a
    batch boundary (with webdataset, 18-40 ms against under 1 ms, and the shard's samples then
    looked like the batch)."""
    from dlreplay.analyze.infer import Inferred, batch_period, steady_batch_intervals

    assert obs.posix is not None
    reads = obs.reads.filter(
        (pl.col("size") > 0) & pl.col("offset").is_not_null() & ~pl.col("pid").is_in(obs.consumers)
    ).with_columns(pl.col("file").cast(pl.String))
    seen = file_sizes(obs.io.with_columns(pl.col("file").cast(pl.String)))
    sizes = pl.DataFrame(
        {"file": obs.paths, "bytes": [_size(p) for p in obs.paths]},
        schema={"file": pl.String, "bytes": pl.Int64},
    ).join(seen, on="file", how="left")
    per = sizes.select("file", (pl.coalesce("bytes", "size") / max(spf, 1)).alias("per"))
    if reads.is_empty() or num(per["per"].median()) < 2 * num(reads["size"].median()):
        return None
    starts = opens.select("pid", "file", pl.col("ts").alias("opened")).sort("opened")
    spans = pl.DataFrame(
        {
            "epoch": [e for e, _, _ in obs.posix.epoch_spans] or [0],
            "a": [a for _, a, _ in obs.posix.epoch_spans] or [0],
        },
        schema={"epoch": pl.Int64, "a": pl.Int64},
    )
    visits = (
        reads.sort("ts")
        .join_asof(
            starts, left_on="ts", right_on="opened", by=["pid", "file"], strategy="backward",
            check_sortedness=False,
        )
        .join(per, on="file")
        .with_columns(sample=(pl.col("offset") // pl.col("per")).cast(pl.Int64))
        .group_by("pid", "file", "opened", "sample")
        .agg(pl.col("ts").min(), (pl.col("ts") + pl.col("dur")).max().alias("end"))
        .sort("ts")
        # the gap before a shard's first sample is its open's (the library's), not a batch's
        .with_columns(masked=pl.col("opened") != pl.col("opened").shift(1).over("pid"))
        .join_asof(spans.sort("a"), left_on="ts", right_on="a", strategy="backward")
        .with_columns(pl.col("epoch").fill_null(0))
    )  # fmt: skip
    batch, how = batch_period(visits)
    if batch is None:
        return None
    facts.put("reader.batch_size", f"streamed shards: {how}", "inferred")
    facts.notes[:] = [n for n in facts.notes if not n.startswith("guess: reader.batch_size")]
    # the step's time from the streamed samples' batches, as for files read per sample: the
    # interval between a worker's batch starts over the workers (an upper bound, said so)
    vals, what = steady_batch_intervals(visits, batch, int(obs.posix.read_threads.value or 1))
    posix = replace(
        obs.posix,
        batch_size=Inferred(batch, how),
        visits=visits.height,
        **(
            {
                "compute_samples": [float(v) for v in vals],
                "computation_time": Inferred(float(np.median(vals)), f"streamed shards: {what}"),
            }
            if vals.size
            else {}
        ),
    )
    return batch, posix


def _samples_per_epoch(obs: Observed, epochs: int) -> float:
    """Samples the consumers received per epoch (their batches' sizes)."""
    got = obs.fetch.filter(pl.col("batch_size") > 0)
    return num(got["batch_size"].sum()) / epochs


def _size(path: str) -> int | None:
    try:
        return Path(path).stat().st_size
    except OSError:
        return None


def _inside(
    paths: list[str], fmt: str, fingerprint: dict[str, Any] | None
) -> tuple[int, list[ShardMember], int | None, str] | None:
    """(samples per shard, each sample's parts, Arrow rows per record batch, where they were
    read) from the first readable shards' headers (tar: members grouped by key; Arrow: columns,
    rows), else from the dataset fingerprint (the shards it sampled); None when neither has
    them."""
    counts: list[int] = []
    parts: dict[str, list[int]] = {}
    rows: list[int] = []
    for p in paths[:SHARDS_SAMPLED]:
        try:
            if fmt == "tar":
                got = tar_parts(p)
            else:
                n, cols, batch_rows = arrow_parts(p)
                got = (n, cols)
                rows.extend(batch_rows)
        except (OSError, tarfile.TarError, ValueError, ImportError):
            continue
        counts.append(got[0])
        for name, sizes in got[1].items():
            parts.setdefault(name, []).extend(sizes)
    where = f"{len(counts)} shard(s)' headers"
    if not counts:
        where = "the dataset fingerprint's shards (the files are not at hand)"
        for entry in _fingerprinted(fingerprint, fmt):
            try:  # a damaged document's entry is skipped, not trusted
                got_parts = {str(k): [int(v) for v in vs] for k, vs in entry["parts"].items()}
                got_rows = [int(v) for v in entry.get("rows_per_batch", [])]
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
            counts.append(int(entry["samples"]))
            for name, sizes in got_parts.items():
                parts.setdefault(name, []).extend(sizes)
            rows.extend(got_rows)
    if not counts or not parts:
        return None
    spf = int(np.bincount(counts).argmax())
    members = [ShardMember(name=n, bytes=observed(np.asarray(s))) for n, s in parts.items()]
    return spf, members, (int(np.bincount(rows).argmax()) if rows else None), where


def _fingerprinted(fingerprint: dict[str, Any] | None, fmt: str) -> list[dict[str, Any]]:
    """The shards of format *fmt* the dataset fingerprint sampled (entries with ``samples``)."""
    out: list[dict[str, Any]] = []
    for group in (fingerprint or {}).get("groups", []):
        if not isinstance(group, dict) or group.get("format") != fmt:
            continue
        for entry in group.get("files_sampled") or []:
            if isinstance(entry, dict) and isinstance(entry.get("samples"), int):
                out.append(entry)
    return out[:SHARDS_SAMPLED]


def _reader(
    obs: Observed,
    io: pl.DataFrame,
    opens: pl.DataFrame,
    reader: Reader,
    fmt: str,
    epochs: int,
    samples: float,
    facts: Facts,
) -> Reader:
    """The reader of streamed shards: library, split, shuffle buffer, workers (see module doc)."""
    reads = obs.reads.with_columns(pl.col("file").cast(pl.String))
    workers = reads.filter(~pl.col("pid").is_in(obs.consumers))
    read_threads, persistent = _workers(obs, workers, epochs, reader.persistent_workers, facts)
    library = "pyarrow"
    if fmt == "tar":
        records = bool(((reads["size"] % TAR_RECORD) == 0).all())
        library = "tarfile" if records else "webdataset"
        facts.put(
            "reader.streaming.library",
            f"tar reads {'all' if records else 'not all'} multiples of tarfile's "
            f"{TAR_RECORD} B records",
            "inferred",
        )
    else:
        facts.put("reader.streaming.library", "Arrow IPC stream shards", "inferred")
    split = _split(reads, obs.paths)
    buffer = _shuffle_buffer(obs, reads, reader.batch_size, samples, opens.height / epochs)
    facts.put(
        "reader.streaming.shuffle_buffer",
        "samples read by a worker before its first batch was complete, beyond the batch"
        if obs.has_loader
        else "no batches in a trace without loader events: none assumed",
        "inferred" if obs.has_loader else "default",
    )
    facts.put("reader.streaming.split", split[1], split[2])
    facts.put("reader.open_per_sample", "each shard opened once for many samples", "measured")
    preprocess, cpu, start, start_cpu = _worker_work(obs, reads, samples * epochs, facts)
    n_opens = opens.height
    return replace(
        reader,
        preprocess_time=preprocess if preprocess is not None else reader.preprocess_time,
        preprocess_host_cpu=cpu if cpu is not None else reader.preprocess_host_cpu,
        read_threads=read_threads,
        persistent_workers=persistent,
        open_per_sample=False,
        streaming=Streaming(
            library=library,
            split=split[0],
            shuffle_buffer=buffer,
            worker_start_time=start,
            worker_start_cpu=start_cpu,
        ),
        metadata_per_sample=replace(
            reader.metadata_per_sample,
            opens=n_opens / max(samples * epochs, 1),
            closes=io.filter(pl.col("name").is_in(CLOSE_OPS)).height / max(samples * epochs, 1),
        ),
    )


def _workers(
    obs: Observed, workers: pl.DataFrame, epochs: int, persistent: bool, facts: Facts
) -> tuple[int, bool]:
    """(worker processes reading shards per rank and epoch, whether they persist across epochs):
    non-persistent workers are new every epoch, so a rank's distinct pids are epochs x its
    share. Without loader events, both are the POSIX inference's word (a consumer that reads
    its shards itself has no workers: 0; the shard readers counted it as one)."""
    if obs.posix is not None and not obs.has_loader:
        threads = int(obs.posix.read_threads.value or 0)
        facts.put("reader.read_threads", str(obs.posix.read_threads.evidence), "inferred")
        if threads and obs.posix.persistent.value is not None:
            persistent = bool(obs.posix.persistent.value)
            facts.put("reader.persistent_workers", obs.posix.persistent.evidence, "inferred")
        return threads, persistent and threads > 0
    facts.put("reader.read_threads", "processes reading shards per rank and epoch", "measured")
    per_rank = (
        workers.group_by("ppid").agg(pl.col("pid").n_unique().alias("n"))["n"]
        if workers.height
        else pl.Series([0])
    )
    distinct = int(num(per_rank.max()))
    # non-persistent workers are new every epoch: each epoch's share of the distinct pids
    read_threads = distinct
    if distinct and epochs >= 2:
        persistent = _recurring(workers, obs.epochs)
        read_threads = distinct if persistent else max(1, round(distinct / epochs))
        facts.put(
            "reader.persistent_workers",
            "shard-reading worker pids reused across epochs"
            if persistent
            else "new shard-reading worker pids every epoch",
            "measured",
        )
    return read_threads, persistent


def _recurring(reads: pl.DataFrame, spans: pl.DataFrame) -> bool:
    """Whether a process read shards in more than one epoch (*spans*: the consumers' epochs,
    µs): a persistent loader's workers stream every epoch, a non-persistent loader's are new
    processes each epoch.

    A worker's reads are placed in its own consumer's epochs (its parent's), where every
    reader's parent has epochs: ranks do not start their epochs together, and a worker of one
    rank still reading after another rank's next epoch began was taken for a persistent one
    (2 ranks under torchrun, 2 non-persistent workers each: 6 "persistent" workers a rank)."""
    if reads.is_empty() or spans.is_empty():
        return False
    starts = spans.select(pl.col("pid").alias("ppid"), "ts", "epoch").sort("ts")
    own = bool(reads["ppid"].is_in(starts["ppid"].implode()).all())
    tagged = (
        reads.select("pid", "ppid", "ts")
        .sort("ts")
        .join_asof(
            starts,
            on="ts",
            by="ppid" if own else None,
            strategy="backward",
            check_sortedness=False,  # sorted by time, so within each parent too
        )
    )
    per = tagged.drop_nulls("epoch").group_by("pid").agg(pl.col("epoch").n_unique().alias("n"))
    return bool((per["n"] > 1).any())


def _one_reader_at_a_time(reads: pl.DataFrame) -> bool:
    """Whether the processes reading shards never overlap in time (one worker, or a consumer
    reading itself, in each epoch; re-forked workers follow one another)."""
    spans = reads.group_by("pid").agg(pl.col("ts").min().alias("a"), pl.col("ts").max().alias("b"))
    spans = spans.sort("a")
    return bool((spans["a"].shift(-1) > spans["b"]).fill_null(True).all())


def _split(reads: pl.DataFrame, paths: list[str]) -> tuple[str, str, str]:
    """(split, how it was found, confidence): each reading process's shards (indices in the
    sorted shard list) are R*W apart (interleaved) or adjacent (contiguous)."""
    index = pl.DataFrame({"file": sorted(paths), "shard": range(len(paths))})
    per = (
        reads.join(index, on="file")
        .group_by("pid")
        .agg(pl.col("shard").unique().sort().diff().drop_nulls().alias("gaps"))
        .explode("gaps")
        .drop_nulls("gaps")
    )
    if per.is_empty():
        return "interleaved", "every process read one shard: the split does not show", "default"
    readers = reads["pid"].n_unique()
    if _one_reader_at_a_time(reads):
        # one reader a rank reads every shard in order: interleaved and contiguous alike
        return (
            "interleaved",
            "one process read the shards at a time: the split does not show",
            "default",
        )
    gaps = per["gaps"]
    if bool((gaps == 1).all()):
        return "contiguous", "each process read adjacent shards", "measured"
    if bool((gaps == gaps[0]).all()):
        return (
            "interleaved",
            f"each process read every {int(gaps[0])}th shard ({readers} reading processes)",
            "measured",
        )
    return "interleaved", "shards read in no regular split; interleaved assumed", "default"


#: (seconds, CPU seconds) per sample of the workers' fetches, then per worker start (None: not in
#: the trace)
WorkerWork = tuple[Distribution | None, Distribution | None, Distribution, Distribution]


def _worker_work(obs: Observed, reads: pl.DataFrame, samples: float, facts: Facts) -> WorkerWork:
    """What the workers spent in their batch fetches (``items`` events) outside their shard
    reads (decoding, the Dataset's own steps, the library's parsing, the collation): seconds
    and CPU seconds (``cpu_time``, µs of the worker process's CPU clock, written by ``dlreplay
    capture``) per sample, and per worker process the start (a worker's first fetch beyond its
    later ones': imports, the dataset's setup, the shuffle buffer's fill), the start counted
    apart so that a worker's first batch is as late as the job's. Time: None without items
    events in the workers; CPU: None where the fetches carry no CPU time (an older capture)."""
    zero = Distribution.fixed(0.0)
    per = _per_worker(obs, reads)
    if per.is_empty() or samples <= 0:
        return None, None, zero, zero
    later = per.filter(pl.col("n") > 1)
    # the first fetch's time (its reads apart) beyond the mean of the worker's later fetches
    rest = (pl.col("dur") - pl.col("d0") - pl.col("r") + pl.col("r0")) / (pl.col("n") - 1)
    start = num(later.select((pl.col("d0") - pl.col("r0") - rest).clip(0).mean()).item()) * US
    procs = per.height
    wall = (num(per["dur"].sum()) - num(per["r"].sum())) * US - start * procs
    facts.put(
        "reader.preprocess_time",
        "the workers' batch fetches (items) less their shard reads and their starts, per sample",
        "measured",
    )
    facts.put(
        "reader.streaming.worker_start_time",
        f"a worker's first fetch beyond its later ones ({later.height} worker processes)",
        "measured" if later.height else "default",
    )
    if per["c"].null_count() > per.height // 2:
        return Distribution.fixed(max(0.0, wall) / samples), None, Distribution.fixed(start), zero
    c_rest = (pl.col("c") - pl.col("c0")) / (pl.col("n") - 1)
    c_start = num(later.select((pl.col("c0") - c_rest).clip(0).mean()).item()) * US
    cpu = num(per["c"].mean()) * procs * US - c_start * procs
    facts.put(
        "reader.preprocess_host_cpu",
        "the workers' CPU time in their batch fetches (items cpu_time: reads, parsing, decode, "
        "collation) less their starts', per sample",
        "measured",
    )
    return (
        Distribution.fixed(max(0.0, wall) / samples),
        Distribution.fixed(max(0.0, cpu) / samples),
        Distribution.fixed(start),
        Distribution.fixed(c_start),
    )


def _per_worker(obs: Observed, reads: pl.DataFrame) -> pl.DataFrame:
    """One row per worker process with batch fetches (µs): ``n`` fetches, their ``dur`` and
    ``c`` (CPU; null where not measured), the first fetch's ``d0``, ``c0`` and the time of the
    reads inside it ``r0``, all the process's reads ``r``."""
    items = obs.annotated.filter((pl.col("name") == "items") & ~pl.col("pid").is_in(obs.consumers))
    cpu = pl.col("cpu_time") if "cpu_time" in items.columns else pl.lit(None, pl.Int64)
    per = (
        items.sort("ts")
        .group_by("pid")
        .agg(
            pl.len().alias("n"),
            pl.col("dur").sum().alias("dur"),
            # a fetch the hook could not measure counts as the measured ones' mean
            (cpu.mean() * pl.len()).alias("c"),
            pl.col("ts").first().alias("t0"),
            pl.col("dur").first().alias("d0"),
            cpu.first().alias("c0"),
        )
    )
    r = reads.select("pid", "ts", "dur").join(per.select("pid", "t0", "d0"), on="pid")
    inside = (pl.col("ts") >= pl.col("t0")) & (pl.col("ts") < pl.col("t0") + pl.col("d0"))
    got = r.group_by("pid").agg(
        pl.col("dur").sum().alias("r"), pl.col("dur").filter(inside).sum().alias("r0")
    )
    return per.join(got, on="pid", how="left").with_columns(
        pl.col("r").fill_null(0),
        pl.col("r0").fill_null(0),
        pl.col("c0").fill_null(pl.col("c") / pl.col("n")),
    )


def _shuffle_buffer(
    obs: Observed, reads: pl.DataFrame, batch: int, samples: float, opens: float
) -> int:
    """Samples of a worker's shuffle buffer: the bytes it read until its first batch was complete,
    in samples, less the batch (median over workers); 0 below the read size's granularity."""
    items = obs.annotated.filter(pl.col("name") == "items")
    if items.is_empty() or reads.is_empty() or opens <= 0:
        return 0
    first = items.group_by("pid").agg((pl.col("ts") + pl.col("dur")).min().alias("ready"))
    before = (
        reads.join(first, on="pid")
        .filter(pl.col("ts") < pl.col("ready"))
        .group_by("pid")
        .agg(pl.col("size").sum().alias("bytes"))
    )
    if before.is_empty():
        return 0
    per_sample = num(reads["size"].sum()) / max(samples * max(1, obs.steps["epoch"].n_unique()), 1)
    read_size = num(reads["size"].median())
    slack = int(np.ceil(read_size / max(per_sample, 1))) + 1
    got = num((before["bytes"] / max(per_sample, 1)).median())
    extra = int(round(got)) - batch
    return extra if extra > slack else 0
