"""The trace layer: DFTracer trace files in, the compact event table out.

One loading engine (:mod:`.load`): files and gzip members parsed on every core, each file
resolved where it was parsed, the parts combined once, every event given its meaning
in the one event vocabulary (:mod:`.vocabulary`); the same parts go to memory
(:func:`load_trace`), to Parquet under a memory limit (:mod:`.spill`) or to a Dask
cluster (:mod:`dlreplay.analyze.distributed`). The layers above (passes, findings,
reports, Perfetto) read the table it returns and import nothing of it but this API.
"""

from __future__ import annotations

from . import counts, vocabulary
from .load import (
    CHUNK_SCHEMA,
    PART_SCHEMA,
    FileDamage,
    FileReport,
    LoadedTrace,
    RangePart,
    RunTables,
    TraceDamageWarning,
    TracePart,
    available_cores,
    combine,
    combine_parts,
    finalize,
    load,
    load_trace,
    member_ranges,
    parse_part,
    parse_parts,
    resolve_ranges,
    run_tables,
    trace_warnings,
)
from .spill import ORDER_COL, MemoryPlan, SpilledTrace, plan_memory, spilled_trace

__all__ = [
    "CHUNK_SCHEMA",
    "ORDER_COL",
    "PART_SCHEMA",
    "FileDamage",
    "FileReport",
    "LoadedTrace",
    "MemoryPlan",
    "RangePart",
    "RunTables",
    "SpilledTrace",
    "TraceDamageWarning",
    "TracePart",
    "available_cores",
    "combine",
    "combine_parts",
    "finalize",
    "load",
    "load_trace",
    "member_ranges",
    "parse_part",
    "parse_parts",
    "plan_memory",
    "resolve_ranges",
    "run_tables",
    "spilled_trace",
    "trace_warnings",
    "counts",
    "vocabulary",
]
