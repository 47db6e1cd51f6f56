"""A one-screen summary of a loaded trace: what ran, what it read, how, and from where.

:func:`summarize` computes a :class:`Summary` from the event table; ``Summary.to_dict()``
is JSON-safe (for ``--json`` output); :func:`render_text` formats it for a terminal.

Units: durations and times in seconds (``*_s``), sizes in bytes, counts in events.
Transfer-size histograms use Darshan's buckets (upper bounds inclusive, powers of 1024).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal, NamedTuple

import polars as pl

from dlreplay.schema import READ_OPS, WRITE_OPS
from dlreplay.units import human_bytes, human_seconds, printable

from .files import classify_files, file_process_table
from .trace import vocabulary as voc

__all__ = ["HISTOGRAM_BUCKETS", "Summary", "histogram", "render_text", "summarize"]

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
_Engine = Literal["streaming", "auto"]


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
    #: what the job read through memory maps (the ``mapped`` pass, :mod:`.passes.mapped`); empty
    #: without mapped files
    mapped: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """A JSON-safe dict (pid keys become strings)."""
        d = asdict(self)
        d["dataset_bytes_read_per_pid"] = {
            str(k): v for k, v in self.dataset_bytes_read_per_pid.items()
        }
        return d


def _bucket(size: pl.Expr) -> pl.Expr:
    """Index of the Darshan bucket of ``size`` (bytes)."""
    idx = pl.lit(0, dtype=pl.Int32)
    for _, ub in HISTOGRAM_BUCKETS[:-1]:
        idx = idx + (size > ub).cast(pl.Int32)
    return idx


def histogram(sizes: pl.Series) -> dict[str, int]:
    """Counts of ``sizes`` (bytes) per Darshan bucket, every bucket present."""
    counts = dict(
        sizes.to_frame("s").select(_bucket(pl.col("s")).alias("b")).group_by("b").len().iter_rows()
    )
    return {label: int(counts.get(i, 0)) for i, (label, _) in enumerate(HISTOGRAM_BUCKETS)}


def summarize(
    events: pl.DataFrame | pl.LazyFrame,
    data_dirs: Iterable[str] | None = None,
    *,
    per_process: pl.DataFrame | None = None,
) -> Summary:
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
    engine: _Engine = "streaming" if isinstance(events, pl.LazyFrame) else "auto"
    ev = events.lazy()
    # four independent passes over the table, run together
    totals_df, threads, ops, hist_df, ann = pl.collect_all(_queries(ev), engine=engine)
    totals = totals_df.row(0, named=True)
    t0, t1 = totals["t0"], totals["t1"]
    hist = {(r, b): n for r, b, n in hist_df.iter_rows()}
    bytes_read, bytes_written = _bytes_moved(ops)
    ds = _dataset(files, per_process)
    loader = _loader_counts(ann)
    return Summary(
        events=int(totals["events"]),
        duration_s=(t1 - t0) / 1e6 if t0 is not None and t1 is not None else 0.0,
        processes=int(threads.select("host", "pid").unique().height),
        threads=int(threads.height),
        operations=[
            OpRow(
                r["cat"] or "",
                r["name"] or "",
                int(r["count"]),
                int(r["bytes"] or 0),
                float(r["time_s"] or 0.0),
            )
            for r in ops.iter_rows(named=True)
        ],
        top_files=[
            FileRow(
                r["file"], r["role"], int(r["bytes_read"]), int(r["reads"]), int(r["processes"])
            )
            for r in files.filter(pl.col("bytes_read") > 0).head(TOP_FILES).iter_rows(named=True)
        ],
        read_histogram=_bucket_counts(hist, True),
        write_histogram=_bucket_counts(hist, False),
        bytes_read=bytes_read,
        bytes_written=bytes_written,
        dataset_bytes_read=ds.bytes_read,
        dataset_bytes_read_per_pid=ds.bytes_read_per_pid,
        dataset_files=ds.files,
        dataset_read_calls=ds.read_calls,
        roles=ds.roles,
        epochs=_epochs(ann, ev, engine),
        fetch_events=loader.fetches,
        item_events=loader.items,
        checkpoint_saves=loader.saves,
        checkpoint_save_bytes=loader.save_bytes,
        checkpoint_loads=loader.loads,
        data_dirs=dirs,
        unknown_annotations=voc.unknown_annotations(events),
    )


def _queries(ev: pl.LazyFrame) -> list[pl.LazyFrame]:
    """The passes :func:`summarize` runs together: totals, threads, operations, size
    histogram, and the annotation events (roles) the loader counts come from."""
    name, cat = pl.col("name"), pl.col("cat")
    return [
        ev.select(
            pl.len().alias("events"),
            pl.col("ts").min().alias("t0"),
            (pl.col("ts") + pl.col("dur").fill_null(0)).max().alias("t1"),
        ),
        ev.select("pid", "tid", "host").unique(),  # the threads (a plain unique is the quickest)
        # (an event without a category is counted: its bytes are in the dataset's and files' totals)
        ev.filter(cat.ne_missing("dftracer"))
        .group_by("cat", "name")
        .agg(
            pl.len().alias("count"),
            pl.col("size").sum().alias("bytes"),
            (pl.col("dur").sum() / 1e6).alias("time_s"),
        )
        .sort(["time_s", "count", "cat", "name"], descending=[True, True, False, False]),
        ev.filter(pl.col("size") >= 0)
        .select(name.is_in(READ_OPS).alias("r"), name.is_in(WRITE_OPS).alias("w"), "size")
        .filter(pl.col("r") | pl.col("w"))
        .group_by("r", _bucket(pl.col("size")).alias("b"))
        .len(),
        ev.filter(pl.col("role").is_not_null() & (pl.col("role") != voc.INTERNAL)).select(
            "pid", "ts", "dur", "epoch", "role", "size", "batch_size"
        ),
    ]


def _bucket_counts(hist: dict[tuple[bool, int], int], reads: bool) -> dict[str, int]:
    """The read (or write) histogram from the (is read, bucket) -> count pass."""
    return {label: int(hist.get((reads, i), 0)) for i, (label, _) in enumerate(HISTOGRAM_BUCKETS)}


def _bytes_moved(ops: pl.DataFrame) -> tuple[int, int]:
    """(bytes read, bytes written) from the per-operation totals."""
    name = pl.col("name")
    in_ops = ops.filter(name.is_in(READ_OPS + WRITE_OPS))
    return (
        int(in_ops.filter(name.is_in(READ_OPS))["bytes"].sum() or 0),
        int(in_ops.filter(name.is_in(WRITE_OPS))["bytes"].sum() or 0),
    )


class _DatasetReads(NamedTuple):
    files: int
    bytes_read: int
    bytes_read_per_pid: dict[int, int]
    read_calls: int
    roles: dict[str, int]  # role -> files


def _dataset(files: pl.DataFrame, per_process: pl.DataFrame) -> _DatasetReads:
    """The dataset's files, the bytes read from them (in all and per process), the read
    calls, and how many files each role has."""
    dataset = files.filter(pl.col("role") == "dataset")["file"]
    ds = per_process.filter(pl.col("file").is_in(dataset.implode()))
    per_pid = ds.group_by("pid").agg(pl.col("rb").sum()).sort("pid")
    return _DatasetReads(
        files=int(dataset.len()),
        bytes_read=int(per_pid["rb"].sum() or 0),
        bytes_read_per_pid={int(p): int(b or 0) for p, b in per_pid.iter_rows()},
        read_calls=int(ds["reads"].sum() or 0),
        roles={role: int(n) for role, n in files.group_by("role").len().sort("role").iter_rows()},
    )


class _LoaderCounts(NamedTuple):
    fetches: int
    items: int
    saves: int
    save_bytes: int
    loads: int


def _loader_counts(ann: pl.DataFrame) -> _LoaderCounts:
    """Batches fetched, samples loaded, checkpoint saves (and their bytes) and loads."""

    def role_total(role: str, col: str | None = None) -> int:
        hit = ann.filter(pl.col("role") == role)
        return hit.height if col is None else int(hit[col].sum() or 0)

    fetches = ann.filter(
        (pl.col("role") == voc.FETCH) & (pl.col("batch_size").fill_null(1) > 0)
    ).height
    return _LoaderCounts(
        # batches consumed: the training steps (DLIO logs no wait for an epoch's last batch)
        fetches=int(max(fetches, voc.training_step_count(ann))),
        items=int(role_total(voc.ITEM)),
        saves=int(role_total(voc.CKPT_SAVE)),
        save_bytes=int(role_total(voc.CKPT_SAVE, "size") or 0),
        loads=int(role_total(voc.CKPT_LOAD)),
    )


def _epochs(ann: pl.DataFrame, ev: pl.LazyFrame, engine: _Engine) -> int:
    """Epochs: the most epoch spans of one process, else the distinct epoch numbers."""
    spans = voc.epoch_spans(ann)
    epochs = spans.group_by("pid").len()["len"].max() if spans.height else 0
    epochs = int(epochs) if isinstance(epochs, int) else 0
    if not epochs:  # no epoch spans: the distinct epoch numbers (a pass over the table only then)
        values, nulls = (
            ev.select(pl.col("epoch").n_unique().alias("n"), pl.col("epoch").null_count())
            .collect(engine=engine)
            .row(0)
        )
        epochs = int(values) - (1 if nulls else 0)
    return epochs


# ---------------------------------------------------------------------------------------
# Text rendering


def _table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]
) -> list[str]:
    """Aligned plain-text table (``right[i]`` right-aligns column i)."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def _short(path: str, width: int = 60) -> str:
    """*path* shown safely (control characters escaped), its last *width* characters when longer."""
    path = printable(path)
    return path if len(path) <= width else "…" + path[-(width - 1) :]


def render_text(summary: Summary, *, max_ops: int = 12) -> str:
    """A compact terminal summary with aligned tables and human-readable sizes."""
    s = summary
    out: list[str] = []
    out.append(
        f"{s.events:,} events over {human_seconds(s.duration_s)} from {s.processes} process(es), "
        f"{s.threads} thread(s); read {human_bytes(s.bytes_read)}, wrote {human_bytes(s.bytes_written)}"
    )
    out.append("")
    for section in (
        _dataset_lines(s),
        _loader_lines(s),
        _operation_lines(s, max_ops),
        _top_file_lines(s),
        _histogram_lines(s),
    ):
        out += section
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _indented(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]
) -> list[str]:
    return ["  " + line for line in _table(headers, rows, right)]


def _dataset_lines(s: Summary) -> list[str]:
    if not s.dataset_files and s.mapped.get("maps"):
        return _mapped_lines(s.mapped)
    if not s.dataset_files:
        return [
            "Dataset: no dataset reads found"
            + (
                f" under {', '.join(s.data_dirs)}"
                if s.data_dirs
                else " (no data-loader item events; pass the data directories to classify files)"
            )
        ]
    out = [
        f"Dataset: {s.dataset_files} file(s), {human_bytes(s.dataset_bytes_read)} read "
        f"in {s.dataset_read_calls:,} call(s)"
        + (f" (data dirs: {', '.join(s.data_dirs)})" if s.data_dirs else "")
    ]
    rows = [[str(pid), human_bytes(b)] for pid, b in s.dataset_bytes_read_per_pid.items()]
    out += _indented(["pid", "dataset bytes read"], rows, [True, True])
    return out + (_mapped_lines(s.mapped) if s.mapped.get("maps") else [])


def _mapped_lines(m: dict) -> list[str]:
    """The mapped data (the ``mapped`` pass's result *m*): files, windows, pages faulted in."""
    cold = m.get("cold_bytes")
    out = [
        f"Mapped data: {m['files']} file(s) of {human_bytes(m.get('file_bytes') or 0)} mapped "
        f"{m['maps']:,} time(s), {m['windows']:,} slice(s) taken, "
        f"{human_bytes(m.get('bytes_touched') or 0)} touched, "
        + (
            f"{human_bytes(cold)} faulted in from storage (pages not in the page cache; "
            f"{m.get('files_cold_at_start') or 0} file(s) cold at their first window)"
            if cold is not None
            else "pages faulted in not measured"
        )
    ]
    if m.get("windows_per_step") is not None:
        dt = m.get("data_time_s")
        out.append(
            f"  {m['windows_per_step']:g} window(s) of {human_bytes(m.get('window_bytes') or 0)} per step "
            f"({m['slices_per_step']:g} slice(s) of {human_bytes(m.get('slice_bytes') or 0)}) "
            f"over {m['steps_with_windows']:,} step(s)"
            + (f", {m['eval_windows']:,} in validation passes" if m.get("eval_windows") else "")
            + (f"; data time between steps {human_seconds(dt)} (median)" if dt is not None else "")
        )
    rows = [
        [
            _short(f["file"]),
            human_bytes(f["file_bytes"]),
            f"{f['maps']:,}",
            f"{f['windows']:,}",
            human_bytes(f["bytes_touched"]),
            human_bytes(f["cold_bytes"]) if f.get("cold_bytes") is not None else "-",
        ]
        for f in m.get("per_file", [])
    ]
    return out + _indented(
        ["file", "size", "maps", "slices", "touched", "faulted in"],
        rows,
        [False, True, True, True, True, True],
    )


def _loader_lines(s: Summary) -> list[str]:
    loader = []
    if s.epochs or s.fetch_events or s.item_events:
        loader.append(
            f"{s.epochs} epoch(s), {s.fetch_events:,} batch fetch(es), {s.item_events:,} sample(s) loaded"
        )
    else:
        loader.append(
            "no data-loader events found (a POSIX-only trace: loop parameters are inferred from "
            "the I/O; see `dlreplay distill`)"
        )
    if s.checkpoint_saves or s.checkpoint_loads:
        loader.append(
            f"{s.checkpoint_saves} checkpoint save(s) of {human_bytes(s.checkpoint_save_bytes)}"
            + (f", {s.checkpoint_loads} load(s)" if s.checkpoint_loads else "")
        )
    else:
        loader.append("no checkpoint events found")
    out = ["Data loader: " + "; ".join(loader)]
    unknown = s.unknown_annotations
    if unknown:
        out.append(
            "Annotations not understood (no DFTracer AI, DLIO or dlreplay meaning; left out of the "
            "analysis): "
            + ", ".join(f"{u['cat']}/{u['name']} x{u['count']:,}" for u in unknown[:8])
            + (f", … {len(unknown) - 8} more" if len(unknown) > 8 else "")
        )
    return out


def _operation_lines(s: Summary, max_ops: int) -> list[str]:
    if not s.operations:
        return ["Operations: no events"]
    rows = [
        [
            o.cat,
            o.name,
            f"{o.count:,}",
            human_bytes(o.bytes) if o.bytes else "-",
            human_seconds(o.time_s),
        ]
        for o in s.operations[:max_ops]
    ]
    out = [
        "Operations (by time)",
        *_indented(["cat", "op", "count", "bytes", "time"], rows, [False, False, True, True, True]),
    ]
    if len(s.operations) > max_ops:
        out.append(f"  … {len(s.operations) - max_ops} more operation(s)")
    return out


def _top_file_lines(s: Summary) -> list[str]:
    if not s.top_files:
        return ["Top files: no file reads found"]
    rows = [
        [_short(f.file), f.role, human_bytes(f.bytes_read), f"{f.reads:,}", str(f.processes)]
        for f in s.top_files
    ]
    return [
        "Top files by bytes read (roles: "
        + ", ".join(f"{n} {r}" for r, n in s.roles.items())
        + ")",
        *_indented(
            ["file", "role", "read", "reads", "procs"], rows, [False, False, True, True, True]
        ),
    ]


def _histogram_lines(s: Summary) -> list[str]:
    if not (any(s.read_histogram.values()) or any(s.write_histogram.values())):
        return ["Transfer sizes: no reads or writes found"]
    rows = [
        [label, f"{s.read_histogram[label]:,}", f"{s.write_histogram[label]:,}"]
        for label, _ in HISTOGRAM_BUCKETS
    ]
    return [
        "Transfer sizes (Darshan buckets)",
        *_indented(["size", "reads", "writes"], rows, [False, True, True]),
    ]
