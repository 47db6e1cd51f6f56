"""The command line's commands, one module each (``dlreplay.cli`` holds the group).

Each command is thin: it checks its inputs, builds one config, calls one library function
and prints a short summary plus the next command to run. None imports polars, numpy or a
stage of dlreplay when it is imported (only when it runs): the group sets those libraries'
environment first (:func:`dlreplay.prepare_process`).
"""

from __future__ import annotations

from dlreplay.commands import (
    analyze,
    capture,
    compare,
    demo,
    distill,
    export,
    generate,
    model,
    replay,
    sql,
    view,
)

#: Every command, in the order data flows through the tool (the order ``dlreplay --help`` lists).
PIPELINE = (
    capture.capture,
    analyze.analyze,
    distill.distill,
    generate.generate,
    replay.replay,
    compare.compare,
    export.export,
    view.view,
    sql.sql,
    model.model,
    demo.demo,
)

__all__ = ["PIPELINE"]
