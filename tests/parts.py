"""The committed captures of ``traces/parts/`` (``traces/make_parts_traces.py``): each one's
truth, its distilled model and its reads, for the tests of the families they hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from dlreplay.analyze import load_trace
from dlreplay.analyze.distill import distill
from dlreplay.schema import READ_OPS

PARTS = Path(__file__).resolve().parent.parent / "traces" / "parts"


def truth(name: str) -> dict[str, Any]:
    """The capture's truth (from the job's arguments)."""
    return json.loads((PARTS / name / "expected.json").read_text())["truth"]


def model(name: str) -> tuple[Any, Any]:
    """(the capture's distilled model, the loaded capture)."""
    lt = load_trace(PARTS / name)
    return distill(lt.events, manifest=lt.manifest, source=str(PARTS / name)), lt


def reads_of(lt: Any, pattern: str) -> pl.DataFrame:
    """A trace's reads of bytes from the files whose path matches *pattern*."""
    return lt.events.filter(
        pl.col("name").is_in(list(READ_OPS))
        & (pl.col("size") > 0)
        & pl.col("file").cast(pl.String).str.contains(pattern)
    )
