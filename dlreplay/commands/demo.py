"""``dlreplay demo``: the whole pipeline on the bundled NPZ example job."""

from __future__ import annotations

from pathlib import Path

import click

from dlreplay.commands.common import echo


@click.command(short_help="Run the whole pipeline on a bundled example job.")
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="Directory for the demo's dataset, trace and reports.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Kept for old scripts: a previous demo run in --out is replaced without it (only the "
    "demo's own files), and a directory the demo did not make is refused even with it.",
)
def demo(out: Path, force: bool) -> None:
    """Run the whole pipeline on the bundled NPZ example job; print where everything is.

    Generates a small NPZ dataset, captures the training job under DFTracer
    (2 fork-started DataLoader workers, checkpoints), analyses the trace, distills
    the workload model, replays it (compute replaced by sleep, itself traced) and
    exports both timelines for Perfetto.
    """
    from dlreplay.demo import DemoConfig, run_demo

    run_demo(DemoConfig(out=out, force=force), echo=echo)
