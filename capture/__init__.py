"""Capture: run an unmodified training job under DFTracer (``dlreplay capture``).

Also the small annotation API for users who want their own events in a capture::

    from dlreplay.capture import region, traced

    with region("augment", cat="data", sample=i):
        ...

Both are no-ops when the process is not running under ``dlreplay capture``.
"""

from dlreplay.capture.inject._dlreplay_hooks import region, traced
from dlreplay.capture.run import (
    MANIFEST,
    CaptureConfig,
    CaptureResult,
    data_dir_spellings,
    preload_library,
    read_manifest,
    run_capture,
)

__all__ = [
    "MANIFEST",
    "CaptureConfig",
    "CaptureResult",
    "data_dir_spellings",
    "preload_library",
    "read_manifest",
    "region",
    "run_capture",
    "traced",
]
