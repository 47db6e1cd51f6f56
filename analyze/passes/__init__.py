"""Characterisation passes: what a traced job did, measured from the event table.

Each pass is a function ``pass_x(view: TraceView) -> dict`` over one shared
:class:`TraceView` (the event table plus the frames every pass needs: dataset I/O,
data-loader events, file roles), returns JSON-safe numbers and can be run and tested
alone. :func:`characterize` runs them all (or a chosen few) into a
:class:`Characterization`; the findings rules (:mod:`.findings`), the report
(:mod:`.report`) and ``compare`` read it.

Units: times in seconds (``*_s``), sizes in bytes, bandwidths in bytes/s (``*_bps``),
fractions in 0..1, counts in events. A value that the trace cannot give (for example
AU without data-loader events) is ``None``, and the pass says why under ``missing``.

The passes by family: :mod:`.reads` (what the job read: overview, access, transfer,
bandwidth, metadata, page cache), :mod:`.loop` (the training loop: steps, epochs, overlap,
checkpoints), :mod:`.processes` (processes, balance, preprocess); :mod:`.view` holds the
view they share and the per-event loops in C, :mod:`.numbers` their JSON-safe numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import polars as pl

from dlreplay.allocator import release_free_memory

from .loop import au_dlio, pass_checkpoints, pass_epochs, pass_overlap, pass_steps
from .mapped import pass_mapped
from .processes import pass_balance, pass_preprocess, pass_processes
from .ranks import pass_ranks
from .reads import (
    META_OPS,
    TIMELINE_BINS,
    pass_access,
    pass_bandwidth,
    pass_metadata,
    pass_overview,
    pass_page_cache,
    pass_transfer,
)
from .view import (
    DATASET_IO_COLUMNS,
    TraceView,
    darshan_pattern,
    flag_reads,
    flag_reads_lazy,
    sessions,
)

__all__ = [
    "DATASET_IO_COLUMNS",
    "META_OPS",
    "PASSES",
    "TIMELINE_BINS",
    "Characterization",
    "PassFn",
    "TraceView",
    "au_dlio",
    "characterize",
    "darshan_pattern",
    "flag_reads",
    "flag_reads_lazy",
    "pass_access",
    "pass_balance",
    "pass_bandwidth",
    "pass_checkpoints",
    "pass_epochs",
    "pass_metadata",
    "pass_overlap",
    "pass_mapped",
    "pass_overview",
    "pass_page_cache",
    "pass_preprocess",
    "pass_processes",
    "pass_ranks",
    "pass_steps",
    "pass_transfer",
    "sessions",
]

PassFn = Callable[[TraceView], dict]
#: Every pass, in report order.
PASSES: dict[str, PassFn] = {
    "overview": pass_overview,
    "access": pass_access,
    "transfer": pass_transfer,
    "bandwidth": pass_bandwidth,
    "processes": pass_processes,
    "steps": pass_steps,
    "epochs": pass_epochs,
    "overlap": pass_overlap,
    "metadata": pass_metadata,
    "checkpoints": pass_checkpoints,
    "balance": pass_balance,
    "ranks": pass_ranks,
    "preprocess": pass_preprocess,
    "page_cache": pass_page_cache,
    "mapped": pass_mapped,
}


@dataclass
class Characterization:
    """The passes' results by pass name (JSON-safe), plus the view they ran on."""

    results: dict[str, dict]
    view: TraceView = field(repr=False)
    #: the report's figures once drawn (see :func:`~dlreplay.analyze.report.figures`)
    figures: dict[str, tuple[str, bytes | None]] | None = field(default=None, repr=False)

    def __getitem__(self, key: str) -> dict:
        return self.results[key]

    def to_dict(self) -> dict:
        return dict(self.results)


def characterize(
    events: pl.DataFrame | pl.LazyFrame | TraceView,
    *,
    manifest: dict | None = None,
    data_dirs: list[str] | None = None,
    passes: Iterable[str] | None = None,
    per_process: pl.DataFrame | None = None,
    mapped_events: pl.DataFrame | None = None,
    by_loader: bool = True,
) -> Characterization:
    """Run the characterisation ``passes`` (default: all of :data:`PASSES`) over an event table.

    ``per_process`` is the table's :func:`file_process_table` when already known (e.g.
    :attr:`~.load.LoadedTrace.per_process`); ``mapped_events`` are the trace's mapped-hook
    events (:func:`~..distill.mapped.mapped_events`), for the ``mapped`` pass.
    """
    view = (
        events
        if isinstance(events, TraceView)
        else TraceView(
            events,
            manifest,
            data_dirs,
            per_process,
            mapped_events=mapped_events,
            by_loader=by_loader,
        )
    )
    names = list(passes) if passes is not None else list(PASSES)
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise KeyError(f"unknown pass(es): {', '.join(unknown)}; known: {', '.join(PASSES)}")
    out = {}
    for n in names:
        out[n] = PASSES[n](view)
        release_free_memory()  # what the pass built and dropped, before the next allocates its own
    return Characterization(out, view)
