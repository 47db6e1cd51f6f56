"""``dlreplay distill``: infer a workload model from a trace."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from dlreplay.commands.common import Status, check_output, echo


@click.command(short_help="Infer a workload model (YAML, DLIO-compatible) from a trace.")
@click.argument("trace", type=click.Path(path_type=Path))
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    required=True,
    help="Model file to write (YAML).",
)
@click.option(
    "--data-dir", "data_dirs", multiple=True, help="Treat files under this path as the dataset."
)
@click.option("--force", is_flag=True, help="Overwrite an existing model file.")
@click.option("--quiet", "-q", is_flag=True, help="Do not print the model summary.")
def distill(
    trace: Path, output: Path, data_dirs: tuple[str, ...], force: bool, quiet: bool
) -> None:
    """Infer a workload model from TRACE and write it to --output (YAML).

    Dataset geometry (format, files, samples per file, record length) and layout
    (the files' inside: from the dataset fingerprint made at capture, else from a
    reachable --data-dir fingerprinted now, else what the reads show), reader
    (batch size, workers, shuffle, transfer sizes, access pattern, metadata per
    sample), training (epochs, compute time per step), checkpoints and processes.
    Every field records how it was obtained and a confidence (measured, inferred,
    default); the summary lists the fields that could not be inferred.
    """
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill import distill as run_distill
    from dlreplay.analyze.layout import resolve_fingerprint
    from dlreplay.analyze.trace.inputs import trace_notes
    from dlreplay.model import save_model

    check_output(output, force, inputs=(trace,))
    with Status(f"loading {trace}"):
        loaded = load_trace(trace)
    notes = trace_notes(trace, loaded.files)
    for w in notes.warnings:  # before the model: it is derived from what the trace holds
        echo(f"warning: {w}")
    with Status("reading the dataset fingerprint"):
        fingerprint, where = resolve_fingerprint(trace, data_dirs)
    model = run_distill(
        loaded.events,
        manifest=loaded.manifest,
        data_dirs=list(data_dirs) or None,
        source=str(trace),
        fingerprint=fingerprint,
        fingerprint_origin=where,
    )
    if notes.warnings:  # the model file says so too
        model = dataclasses.replace(
            model,
            provenance=dataclasses.replace(
                model.provenance,
                notes=[
                    *(f"distilled from an incomplete trace: {w}" for w in notes.gaps),
                    *(f"trace warning: {w}" for w in notes.warnings if w not in notes.gaps),
                    *model.provenance.notes,
                ],
            ),
        )
    save_model(model, output)
    if not quiet:
        _print_model(model, loaded)
    echo(f"model: {output}")
    echo(f"next: dlreplay model export-dlio {output} -o workload.yaml")


def _print_model(model: Any, loaded: Any) -> None:
    """The model's summary, its notes, and what was lost to a damaged trace."""
    from dlreplay.analyze.trace.hidden import recovered_note
    from dlreplay.model import summarize_model

    echo(summarize_model(model))
    for note in model.provenance.notes:  # what was left out or set apart, and where the time went
        echo(f"  note: {note}")
    recovered = recovered_note(loaded.files)
    if recovered:  # reads the model counts that the trace's own calls do not show
        echo(f"  note: {recovered}")
    if loaded.damaged:
        echo(f"warning: {loaded.describe_damage()}")
