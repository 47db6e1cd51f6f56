"""What every section of distill shares: the provenance it collects while inferring, its
error, and the conversions of polars values it makes everywhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from dlreplay.errors import TraceError
from dlreplay.model import Distribution, FieldProvenance

from ..infer import PosixLoop
from ..trace import vocabulary as voc

#: Seconds per microsecond (the event table's ``ts`` and ``dur`` are µs).
US = 1e-6


class DistillError(TraceError):
    """The trace has nothing to distill (no events, no dataset reads, no file names)."""


@dataclass
class Facts:
    """Field path -> provenance, collected while inferring."""

    fields: dict[str, FieldProvenance] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def put(self, path: str, method: str, confidence: str) -> None:
        self.fields[path] = FieldProvenance(method=method, confidence=confidence)


def role_events(ev: pl.DataFrame, *roles: str) -> pl.DataFrame:
    """Events of these vocabulary roles (whatever their spelling)."""
    return ev.filter(voc.has_role(roles))


def num(value: Any, default: float = 0.0) -> float:
    """A polars aggregate (typed loosely by polars) as a float; None -> default."""
    return default if value is None else float(value)


def observed(values: Any) -> Distribution:
    """Empirical distribution of observed values (array or Series); ``unknown`` when there are none."""
    arr = np.asarray(values.to_numpy() if isinstance(values, pl.Series) else values, dtype=float)
    return Distribution.from_values(arr) if arr.size else Distribution.unknown()


def mode(series: pl.Series) -> int | None:
    """The most common value of ``series`` (nulls left out), None when it has none."""
    s = series.drop_nulls()
    if s.is_empty():
        return None
    counts = s.value_counts(sort=True)
    return int(counts[s.name][0])


@dataclass
class Observed:
    """What distill reads from the trace, found once for every section: the dataset's files
    and the I/O on them, and the training loop's events (or, without them, the loop
    inferred from the I/O)."""

    #: the training phase's events (the evaluation passes' are modelled apart)
    events: pl.DataFrame
    #: the dataset's sample files
    paths: list[str]
    #: POSIX/STDIO calls on them, and those of them that read bytes
    io: pl.DataFrame
    reads: pl.DataFrame
    #: the files were memory-mapped by the loader, never read
    mapped: bool
    #: the record-index side files' style (``dlio``, ``dlreplay``), None without them
    index_style: str | None
    #: every event with a vocabulary role, and those of the roles distill reads
    annotated: pl.DataFrame
    fetch: pl.DataFrame
    items: pl.DataFrame
    epochs: pl.DataFrame
    saves: pl.DataFrame
    #: one row per training step of each consumer (:func:`~..trace.vocabulary.training_steps`)
    steps: pl.DataFrame
    consumers: list[int]
    #: the consumer with the most steps (None without steps)
    main_pid: int | None
    #: the loop inferred from the I/O when the trace has no training-loop events
    posix: PosixLoop | None
    #: :attr:`io` with the item (sample) event enclosing each call
    tagged_io: pl.DataFrame
    #: DLIO's reader class when the sample reads are DLIO's
    dlio_reader: str | None
    #: the windows of mapped dataset files taken inside item events (a Dataset's rows of an
    #: ``np.load(mmap_mode="r")`` or ``np.memmap``: page faults, no read call): file, offset,
    #: bytes (µs ``ts``, ``pid``); empty where the samples are read
    item_windows: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: POSIX calls alone: the consumer's pass over its files before it read its samples
    #: through files it kept open was found and left out of the loop's epochs
    #: (:func:`~.scan.index_pass`)
    index_pass: bool = False

    @property
    def has_loader(self) -> bool:
        """True when the trace has training-loop events."""
        return self.steps.height > 0
