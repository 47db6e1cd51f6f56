"""The C extension ``_pfwscan`` (:data:`NATIVE`, None where it is not built) and the switch
that turns its scanner off (``DLREPLAY_PARSER=python``, :func:`native_parser_available`).
Its users read :data:`NATIVE` from this module when they run, so that switching it off
(tests do) reaches them all.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np
import polars as pl

__all__ = ["NATIVE", "PARSER_ENV", "native_parser_available"]

NATIVE: Any


try:  # optional: built by setup.py when a C compiler is available
    NATIVE = importlib.import_module("._pfwscan", __package__)
except ImportError:  # pragma: no cover - depends on the build
    NATIVE = None


if NATIVE is not None:
    # polars imports numpy lazily, on first use, through a proxy that is not thread-safe
    # (two loader threads building their first frame from numpy arrays at once raised
    # "TypeError: 'module' object does not support item assignment"): resolve it now.
    pl.DataFrame({"x": np.zeros(1, dtype=np.int64)})


#: Environment variable selecting the parser: ``python`` forces the Python/polars path.
PARSER_ENV = "DLREPLAY_PARSER"


def native_parser_available() -> bool:
    """True when the C scanner is built and not disabled by ``DLREPLAY_PARSER=python``."""
    return NATIVE is not None and os.environ.get(PARSER_ENV, "").strip().lower() != "python"
