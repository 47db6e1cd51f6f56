"""Capture: run an unmodified training job under DFTracer (``dlreplay capture``).

Also the small annotation API for users who want their own events in a capture::

    from dlreplay.capture import region, traced

    with region("augment", cat="data", sample=i):
        ...

Both are no-ops when the process is not running under ``dlreplay capture``.
"""

from typing import TYPE_CHECKING, Any

from dlreplay.capture.inject import REGIONS, region, traced

if TYPE_CHECKING:
    from dlreplay.capture.run import (
        MANIFEST,
        CaptureConfig,
        CaptureResult,
        data_dir_spellings,
        preload_library,
        read_manifest,
        run_capture,
    )

_RUN = {
    "MANIFEST",
    "CaptureConfig",
    "CaptureResult",
    "data_dir_spellings",
    "preload_library",
    "read_manifest",
    "run_capture",
}


def __getattr__(name: str) -> Any:
    """The capture runner is imported on first use: a process that only annotates (a replay's
    spawned loader worker, a job using :func:`region`) does not pay for polars and the loader."""
    if name in _RUN:
        from dlreplay.capture import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MANIFEST",
    "REGIONS",
    "CaptureConfig",
    "CaptureResult",
    "data_dir_spellings",
    "preload_library",
    "read_manifest",
    "region",
    "run_capture",
    "traced",
]
