"""``dlreplay model``: workload models, to and from DLIO's workload configs, and shown."""

from __future__ import annotations

from pathlib import Path

import click

from dlreplay.commands.common import check_output, echo


@click.group(short_help="Import/export DLIO workload configs; validate and show a model.")
def model() -> None:
    """Workload models: import from or export to DLIO workload configs, validate and show."""


@model.command(
    "import-dlio", short_help="Convert a DLIO workload YAML into a dlreplay workload model."
)
@click.argument("workload", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), required=True, help="Model file to write."
)
@click.option("--force", is_flag=True, help="Overwrite an existing model file.")
@click.option(
    "--dlio-version",
    type=click.Choice(["auto", "2.0.0", "later"]),
    default="auto",
    show_default=True,
    help="Whose checkpoint sizing to follow: DLIO 2.0.0 (the PyPI release: checkpoint.model_size, "
    "num_layers, layer_parameters, whose defaults add a 24.8 MB layer file) or later releases "
    "(model.model_size_bytes, num_layers, parallelism, transformer); auto: later when the model "
    "section sizes the model.",
)
def model_import_dlio(workload: Path, output: Path, force: bool, dlio_version: str) -> None:
    """Convert a DLIO workload YAML (WORKLOAD) into a dlreplay workload model."""
    from dlreplay.dlio import import_dlio
    from dlreplay.model import save_model

    check_output(output, force, inputs=(workload,))
    m = import_dlio(workload, dlio_version=dlio_version)
    save_model(m, output)
    echo(
        f"model: {output} ({m.dataset.format}, {m.dataset.num_files} files, batch {m.reader.batch_size})"
    )
    for note in m.provenance.notes:
        echo(f"note: {note}")


@model.command("export-dlio", short_help="Write a model as a DLIO workload config.")
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    required=True,
    help="DLIO workload YAML to write.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def model_export_dlio(model_file: Path, output: Path, force: bool) -> None:
    """Write MODEL_FILE as a DLIO workload config (only keys DLIO accepts)."""
    from dlreplay.dlio import export_dlio
    from dlreplay.model import load_model

    check_output(output, force, inputs=(model_file,))
    warnings = export_dlio(load_model(model_file), output)
    for w in warnings:
        echo(f"lossy: {w}")
    echo(f"DLIO workload: {output}")


@model.command("show")
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
def model_show(model_file: Path) -> None:
    """Validate MODEL_FILE and print a readable summary of it."""
    from dlreplay.model import load_model, summarize_model

    echo(summarize_model(load_model(model_file)))
