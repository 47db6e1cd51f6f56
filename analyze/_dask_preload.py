"""Dask worker preload of ``dlreplay analyze --workers N``: a worker process ignores Ctrl-C.

The terminal sends SIGINT to the whole process group. The dlreplay process answers it and
closes the cluster; a worker process that also received it would die of it, printing a
traceback of its own (issue #18: no traceback from any command).
"""

from __future__ import annotations

import signal
from typing import Any


def dask_setup(worker: Any) -> None:
    """Called by Dask in the worker process, on its main thread, before it connects."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
