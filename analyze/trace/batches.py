"""Parse batches and what a part keeps of them: :func:`new_batch` picks the scanner's
batch (:class:`~.scan.NativeBatch`) or the reference parser's (:class:`~.reference.Batch`);
:class:`Compacted` takes each flushed batch's rows in compact form (:mod:`.compact`) until
the part is resolved (:mod:`.resolve`).
"""

from __future__ import annotations

import polars as pl

from dlreplay.pfw import DecodeStats as _Stats

from .compact import compact_rows, one_frame
from .native import native_parser_available
from .reference import Batch
from .scan import MetaRows, NativeBatch, meta_frames
from .shapes import CHUNK_SCHEMA, HOSTS_SCHEMA, STARTS_SCHEMA, concat_raw, count_problem

__all__ = ["Compacted", "new_batch"]


def new_batch() -> Batch | NativeBatch:
    return NativeBatch() if native_parser_available() else Batch()


class Compacted:
    """What one part keeps of its parsed batches, in the compact forms of :func:`compact_rows`;
    the lists are handed over (emptied) by :meth:`pop`, so their memory is freed as
    soon as the resolved columns no longer need it."""

    def __init__(self) -> None:
        self.stats: dict[int, _Stats] = {}
        self.rows: list[pl.DataFrame] = []
        self.meta: list[pl.DataFrame | MetaRows] = []
        self.starts: list[pl.DataFrame] = []
        self.hosts: list[pl.DataFrame] = []

    def take(self, batch: Batch | NativeBatch) -> None:
        """Compact the rows the batch parsed since the last call (and forget them there)."""
        events, batch.events = batch.events, []
        self.meta.extend(m for m in batch.meta if m.height)
        batch.meta = []
        while events:
            raw = events.pop(0)
            if isinstance(raw, tuple):  # compacted by the scanner's path
                rows, starts, hosts, nulled = raw
            elif not raw.height:
                continue
            else:
                rows, starts, hosts, nulled = compact_rows(raw)
            del raw
            self.rows.append(rows)
            if starts.height:
                self.starts.append(starts)
            if hosts.height:
                self.hosts.append(hosts)
            for src, counts in nulled.items():
                for what, n in counts.items():
                    count_problem(self.stats[src].problems, n, what)

    def pop(self) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """(rows, meta, starts, hosts), each one frame; the lists are emptied."""
        out = (
            one_frame(self.rows, CHUNK_SCHEMA),
            concat_raw(meta_frames(self.meta)),
            one_frame(self.starts, STARTS_SCHEMA),
            one_frame(self.hosts, HOSTS_SCHEMA),
        )
        self.rows, self.meta, self.starts, self.hosts = [], [], [], []
        return out
