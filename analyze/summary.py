"""A one-screen summary of a loaded trace: what ran, what it read, how, and from where.

:func:`summarize` computes a :class:`Summary` from the event table; ``Summary.to_dict()``
is JSON-safe (for ``--json`` output); :func:`render_text` formats it for a terminal.

Units: durations and times in seconds (``*_s``), sizes in bytes, counts in events.
Transfer-size histograms use Darshan's buckets (upper bounds inclusive, powers of 1024).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import polars as pl

from dlreplay.schema import READ_OPS, WRITE_OPS
from dlreplay.units import human_bytes, human_seconds, printable

from .files import classify_files, file_process_table
from .trace import vocabulary as voc

__all__ = ["HISTOGRAM_BUCKETS", "Summary", "render_text", "summarize"]

#: Darshan's access-size buckets: (label, inclusive upper bound in bytes; None = open).
HISTOGRAM_BUCKETS: tuple[tuple[str, int | None], ...] = (
    ("0-100", 100),
    ("100-1K", 1 << 10),
    ("1K-10K", 10 << 10),
    ("10K-100K", 100 << 10),
    ("100K-1M", 1 << 20),
    ("1M-4M", 4 << 20),
    ("4M-10M", 10 << 20),
    ("10M-100M", 100 << 20),
    ("100M-1G", 1 << 30),
    ("1G+", None),
)
TOP_FILES = 10


@dataclass(frozen=True)
class OpRow:
    """Totals of one operation: events, bytes transferred, summed duration (s)."""

    cat: str
    name: str
    count: int
    bytes: int
    time_s: float


@dataclass(frozen=True)
class FileRow:
    """One of the most-read files."""

    file: str
    role: str
    bytes_read: int
    reads: int
    processes: int


@dataclass(frozen=True)
class Summary:
    """What :func:`summarize` found. Sizes in bytes, times in seconds."""

    events: int
    duration_s: float
    processes: int
    threads: int
    operations: list[OpRow]
    top_files: list[FileRow]
    read_histogram: dict[str, int]
    write_histogram: dict[str, int]
    bytes_read: int
    bytes_written: int
    dataset_bytes_read: int
    dataset_bytes_read_per_pid: dict[int, int]
    dataset_files: int
    dataset_read_calls: int
    roles: dict[str, int]
    epochs: int
    fetch_events: int
    item_events: int
    checkpoint_saves: int
    checkpoint_save_bytes: int
    checkpoint_loads: int
    data_dirs: list[str] = field(default_factory=list)
    #: annotation-like events no convention explains: [{cat, name, count}] (see :mod:`.vocabulary`)
    unknown_annotations: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """A JSON-safe dict (pid keys become strings)."""
        d = asdict(self)
        d["dataset_bytes_read_per_pid"] = {str(k): v for k, v in self.dataset_bytes_read_per_pid.items()}
        return d


def _bucket(size: pl.Expr) -> pl.Expr:
    """Index of the Darshan bucket of ``size`` (bytes)."""
    idx = pl.lit(0, dtype=pl.Int32)
    for _, ub in HISTOGRAM_BUCKETS[:-1]:
        idx = idx + (size > ub).cast(pl.Int32)
    return idx


def _histogram(sizes: pl.Series) -> dict[str, int]:
    """Counts of ``sizes`` (bytes) per Darshan bucket, every bucket present."""
    counts = dict(sizes.to_frame("s").select(_bucket(pl.col("s")).alias("b")).group_by("b").len().iter_rows())
    return {label: int(counts.get(i, 0)) for i, (label, _) in enumerate(HISTOGRAM_BUCKETS)}


def summarize(events: pl.DataFrame | pl.LazyFrame, data_dirs: Iterable[str] | None = None, *,
              per_process: pl.DataFrame | None = None) -> Summary:
    """Summarise an event table (see :data:`dlreplay.schema.EVENT_SCHEMA`).

    ``data_dirs`` (e.g. a capture manifest's ``data_dirs``) decides which files are the
    dataset; without it the files read by data-loader workers are (see
    :func:`~dlreplay.analyze.files.classify_files`). A LazyFrame (a spilled table) is
    aggregated with polars' streaming engine, never loaded whole. ``per_process`` reuses
    a :func:`~dlreplay.analyze.files.file_process_table` already computed.
    """
    dirs = [str(d) for d in data_dirs] if data_dirs else []
    if isinstance(events, pl.DataFrame):
        events = voc.ensure_roles(events)
    if per_process is None:
        per_process = file_process_table(events)
    files = classify_files(events, dirs or None, per_process=per_process)
    name, cat = pl.col("name"), pl.col("cat")
    ev = events.lazy()
    # four independent passes over the table, run together
    totals_df, threads, ops, hist_df, ann = pl.collect_all([
        ev.select(
            pl.len().alias("events"),
            pl.col("ts").min().alias("t0"),
            (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("t1"),
        ),
        ev.select("pid", "tid", "host").unique(),  # the threads (a plain unique: 15 vs 20 ms on 2.1 M rows)
        ev.filter(cat != "dftracer")
        .group_by("cat", "name")
        .agg(pl.len().alias("count"), pl.col("size").sum().alias("bytes"),
             (pl.col("dur").sum() / 1e6).alias("time_s"))
        .sort(["time_s", "count", "cat", "name"], descending=[True, True, False, False]),
        ev.filter(pl.col("size") >= 0)
        .select(name.is_in(READ_OPS).alias("r"), name.is_in(WRITE_OPS).alias("w"), "size")
        .filter(pl.col("r") | pl.col("w"))
        .group_by("r", _bucket(pl.col("size")).alias("b")).len(),
        ev.filter(pl.col("role").is_not_null() & (pl.col("role") != voc.INTERNAL))
        .select("pid", "ts", "dur", "epoch", "role", "size", "batch_size"),
    ], engine="streaming" if isinstance(events, pl.LazyFrame) else "auto")
    totals = totals_df.row(0, named=True)

    def role_total(role: str, col: str | None = None) -> int:
        hit = ann.filter(pl.col("role") == role)
        return hit.height if col is None else int(hit[col].sum() or 0)

    dataset = files.filter(pl.col("role") == "dataset")["file"]
    ds = per_process.filter(pl.col("file").is_in(dataset.implode()))
    per_pid = ds.group_by("pid").agg(pl.col("rb").sum()).sort("pid")
    hist = {(r, b): n for r, b, n in hist_df.iter_rows()}
    in_ops = ops.filter(name.is_in(READ_OPS + WRITE_OPS))
    bytes_read = int(in_ops.filter(name.is_in(READ_OPS))["bytes"].sum() or 0)
    bytes_written = int(in_ops.filter(name.is_in(WRITE_OPS))["bytes"].sum() or 0)
    totals.update(
        processes=threads.select("host", "pid").unique().height, threads=threads.height,
        bytes_read=bytes_read, bytes_written=bytes_written,
        items=role_total(voc.ITEM),
        fetches=ann.filter((pl.col("role") == voc.FETCH) & (pl.col("batch_size").fill_null(1) > 0)).height,
        saves=role_total(voc.CKPT_SAVE), save_bytes=role_total(voc.CKPT_SAVE, "size"),
        loads=role_total(voc.CKPT_LOAD),
    )
    # batches consumed: the training steps (DLIO logs no wait for an epoch's last batch)
    totals["fetches"] = max(totals["fetches"], voc.training_step_count(ann))
    spans = voc.epoch_spans(ann)
    epochs = spans.group_by("pid").len()["len"].max() if spans.height else 0
    epochs = int(epochs) if isinstance(epochs, int) else 0
    ds_calls = int(ds["reads"].sum() or 0)

    if not epochs:  # no epoch spans: the distinct epoch numbers (a pass only then: 8-10 ms on 2 M events)
        values, nulls = ev.select(pl.col("epoch").n_unique().alias("n"), pl.col("epoch").null_count()).collect(
            engine="streaming" if isinstance(events, pl.LazyFrame) else "auto").row(0)
        epochs = int(values) - (1 if nulls else 0)
    t0, t1 = totals["t0"], totals["t1"]
    return Summary(
        events=int(totals["events"]),
        duration_s=(t1 - t0) / 1e6 if t0 is not None and t1 is not None else 0.0,
        processes=int(totals["processes"]),
        threads=int(totals["threads"]),
        operations=[OpRow(r["cat"] or "", r["name"] or "", int(r["count"]), int(r["bytes"] or 0),
                          float(r["time_s"] or 0.0)) for r in ops.iter_rows(named=True)],
        top_files=[FileRow(r["file"], r["role"], int(r["bytes_read"]), int(r["reads"]), int(r["processes"]))
                   for r in files.filter(pl.col("bytes_read") > 0).head(TOP_FILES).iter_rows(named=True)],
        read_histogram={label: int(hist.get((True, i), 0)) for i, (label, _) in enumerate(HISTOGRAM_BUCKETS)},
        write_histogram={label: int(hist.get((False, i), 0)) for i, (label, _) in enumerate(HISTOGRAM_BUCKETS)},
        bytes_read=int(totals["bytes_read"] or 0),
        bytes_written=int(totals["bytes_written"] or 0),
        dataset_bytes_read=int(per_pid["rb"].sum() or 0),
        dataset_bytes_read_per_pid={int(p): int(b or 0) for p, b in per_pid.iter_rows()},
        dataset_files=int(dataset.len()),
        dataset_read_calls=int(ds_calls),
        roles={role: int(n) for role, n in files.group_by("role").len().sort("role").iter_rows()},
        epochs=epochs,
        fetch_events=int(totals["fetches"]),
        item_events=int(totals["items"]),
        checkpoint_saves=int(totals["saves"]),
        checkpoint_save_bytes=int(totals["save_bytes"] or 0),
        checkpoint_loads=int(totals["loads"]),
        data_dirs=dirs,
        unknown_annotations=voc.unknown_annotations(events),
    )


# ---------------------------------------------------------------------------------------
# Text rendering


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    """Aligned plain-text table (``right[i]`` right-aligns column i)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def _short(path: str, width: int = 60) -> str:
    """*path* shown safely (control characters escaped), its last *width* characters when longer."""
    path = printable(path)
    return path if len(path) <= width else "…" + path[-(width - 1):]


def render_text(summary: Summary, *, max_ops: int = 12) -> str:
    """A compact terminal summary with aligned tables and human-readable sizes."""
    s = summary
    out: list[str] = []
    out.append(
        f"{s.events:,} events over {human_seconds(s.duration_s)} from {s.processes} process(es), "
        f"{s.threads} thread(s); read {human_bytes(s.bytes_read)}, wrote {human_bytes(s.bytes_written)}"
    )
    out.append("")
    if s.dataset_files:
        out.append(f"Dataset: {s.dataset_files} file(s), {human_bytes(s.dataset_bytes_read)} read "
                   f"in {s.dataset_read_calls:,} call(s)"
                   + (f" (data dirs: {', '.join(s.data_dirs)})" if s.data_dirs else ""))
        rows = [[str(pid), human_bytes(b)] for pid, b in s.dataset_bytes_read_per_pid.items()]
        out += ["  " + line for line in _table(["pid", "dataset bytes read"], rows, [True, True])]
    else:
        out.append("Dataset: no dataset reads found"
                   + (f" under {', '.join(s.data_dirs)}" if s.data_dirs else
                      " (no data-loader item events; pass the data directories to classify files)"))
    out.append("")
    loader = []
    if s.epochs or s.fetch_events or s.item_events:
        loader.append(f"{s.epochs} epoch(s), {s.fetch_events:,} batch fetch(es), {s.item_events:,} sample(s) loaded")
    else:
        loader.append("no data-loader events found (a POSIX-only trace: loop parameters are inferred from "
                      "the I/O; see `dlreplay distill`)")
    if s.checkpoint_saves or s.checkpoint_loads:
        loader.append(f"{s.checkpoint_saves} checkpoint save(s) of {human_bytes(s.checkpoint_save_bytes)}"
                      + (f", {s.checkpoint_loads} load(s)" if s.checkpoint_loads else ""))
    else:
        loader.append("no checkpoint events found")
    out.append("Data loader: " + "; ".join(loader))
    if s.unknown_annotations:
        out.append("Annotations not understood (no DFTracer AI, DLIO or dlreplay meaning; left out of the "
                   "analysis): " + ", ".join(f"{u['cat']}/{u['name']} x{u['count']:,}"
                                             for u in s.unknown_annotations[:8])
                   + (f", … {len(s.unknown_annotations) - 8} more" if len(s.unknown_annotations) > 8 else ""))
    out.append("")

    if s.operations:
        out.append("Operations (by time)")
        rows = [[o.cat, o.name, f"{o.count:,}", human_bytes(o.bytes) if o.bytes else "-", human_seconds(o.time_s)]
                for o in s.operations[:max_ops]]
        out += ["  " + line for line in _table(["cat", "op", "count", "bytes", "time"], rows,
                                                [False, False, True, True, True])]
        if len(s.operations) > max_ops:
            out.append(f"  … {len(s.operations) - max_ops} more operation(s)")
    else:
        out.append("Operations: no events")
    out.append("")

    if s.top_files:
        out.append("Top files by bytes read (roles: "
                   + ", ".join(f"{n} {r}" for r, n in s.roles.items()) + ")")
        rows = [[_short(f.file), f.role, human_bytes(f.bytes_read), f"{f.reads:,}", str(f.processes)]
                for f in s.top_files]
        out += ["  " + line for line in _table(["file", "role", "read", "reads", "procs"], rows,
                                                [False, False, True, True, True])]
    else:
        out.append("Top files: no file reads found")
    out.append("")

    hist_rows = [[label, f"{s.read_histogram[label]:,}", f"{s.write_histogram[label]:,}"]
                 for label, _ in HISTOGRAM_BUCKETS]
    if any(s.read_histogram.values()) or any(s.write_histogram.values()):
        out.append("Transfer sizes (Darshan buckets)")
        out += ["  " + line for line in _table(["size", "reads", "writes"], hist_rows, [False, True, True])]
    else:
        out.append("Transfer sizes: no reads or writes found")
    return "\n".join(out).rstrip() + "\n"
