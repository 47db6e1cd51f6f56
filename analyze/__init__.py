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

from . import trace as _trace
from .trace import FileReport, LoadedTrace, TraceDamageWarning, load, load_trace, vocabulary

# The trace layer's modules moved into dlreplay.analyze.trace; their earlier module names
# (dlreplay.analyze.load, .spill, .vocabulary) keep working for code written against them.
for _name in ("load", "spill", "vocabulary"):
    _sys.modules.setdefault(
        f"{__name__}.{_name}",
        getattr(_trace, _name)
        if _name == "vocabulary"
        else _sys.modules[f"{_trace.__name__}.{_name}"],
    )

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
