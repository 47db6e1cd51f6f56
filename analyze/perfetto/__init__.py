"""The Perfetto pieces: export of the event table as a timeline (:mod:`.export`),
PerfettoSQL through a trace processor (:mod:`.processor`) and the local viewer
(:mod:`.view`). One direction: the viewer uses the processor, the processor the export
and the trace layer; the export only the event table.

>>> from dlreplay.analyze.perfetto import query
>>> query("out/trace", "io_by_file")  # doctest: +SKIP
"""

from __future__ import annotations

from .export import CHUNK_ROWS, ExportError, ExportStats, export_trace, format_for
from .processor import (
    ENV_TRACE_PROCESSOR,
    NAMED_QUERIES,
    QueryError,
    Timeline,
    TraceProcessorUnavailable,
    find_engine_bundle,
    find_ui_dist,
    open_timeline,
    query,
    timeline_file,
)

__all__ = [
    "CHUNK_ROWS",
    "ENV_TRACE_PROCESSOR",
    "NAMED_QUERIES",
    "ExportError",
    "ExportStats",
    "QueryError",
    "Timeline",
    "TraceProcessorUnavailable",
    "export_trace",
    "find_engine_bundle",
    "find_ui_dist",
    "format_for",
    "open_timeline",
    "query",
    "timeline_file",
]
