"""Analysis stage: load DFTracer traces into the event table, classify files, summarise.

>>> from dlreplay.analyze import load_trace, render_text, summarize
>>> loaded = load_trace("out/trace")  # doctest: +SKIP
>>> dirs = (loaded.manifest or {}).get("data_dirs")  # doctest: +SKIP
>>> print(render_text(summarize(loaded.events, dirs, per_process=loaded.per_process)))  # doctest: +SKIP

``loaded.per_process`` (the per-(file, host, pid) table the loader counts from integer
keys) saves :func:`summarize` its largest group-by; without it, it is computed from
the table.
"""

from __future__ import annotations

import sys as _sys

from .trace import FileReport, LoadedTrace, TraceDamageWarning, load, load_trace, vocabulary

# The event vocabulary lives in the trace layer (dlreplay.analyze.trace.vocabulary); its
# earlier name keeps working for code written against it.
_sys.modules.setdefault(f"{__name__}.vocabulary", vocabulary)

from .files import classify_files  # noqa: E402
from .summary import Summary, render_text, summarize  # noqa: E402

__all__ = [
    "FileReport",
    "LoadedTrace",
    "Summary",
    "TraceDamageWarning",
    "classify_files",
    "load",
    "load_trace",
    "render_text",
    "summarize",
    "vocabulary",
]
