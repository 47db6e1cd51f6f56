"""``dlreplay generate``: write a dataset with a workload model's shape."""

from __future__ import annotations

from pathlib import Path

import click

from dlreplay.commands.common import SEED, Processes, echo, fail


@click.command(short_help="Write a dataset with a model's shape (resumable, reproducible).")
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Directory to write the dataset in.",
)
@click.option(
    "--seed", type=SEED, default=0, show_default=True, help="Seed of record sizes and contents."
)
@click.option(
    "--jobs", type=Processes(), default=None, help="Generator processes (default min(4, CPUs))."
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace a dlreplay dataset of another model/seed (only its own files).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a model field (repeatable).",
)
@click.option(
    "--scale-to",
    metavar="SIZE",
    default=None,
    help="Write as many files of the model's layout as hold SIZE (e.g. 5x-memory: five times this "
    "host's memory, MLPerf Storage's rule; or 200GB): dataset.num_files is raised, never lowered "
    "(replay with the --set dataset.num_files=N it prints).",
)
def generate(
    model_file: Path,
    data_dir: Path,
    seed: int,
    jobs: int | None,
    force: bool,
    overrides: tuple[str, ...],
    scale_to: str | None,
) -> None:
    """Write a dataset with MODEL_FILE's shape into --data-dir (resumable, reproducible).

    With a dataset.layout from a fingerprint, files get the real files' inside
    (members, compression, HDF5 chunks and filters, image coding), written by the
    formats' own libraries; the dataset manifest records the layout written.
    """
    from dlreplay.model import apply_overrides, load_model
    from dlreplay.replay import GenerateConfig, generate_dataset

    m = apply_overrides(load_model(model_file), overrides)
    if scale_to:
        from dlreplay.replay.mlperf import files_for_bytes, scale_target

        files = files_for_bytes(m, scale_target(scale_to))
        m = apply_overrides(m, [f"dataset.num_files={files}"])
        echo(
            f"--scale-to {scale_to}: dataset.num_files={files} (replay with --set "
            f"dataset.num_files={files})",
            err=True,
        )
    try:
        res = generate_dataset(
            GenerateConfig(model=m, data_dir=data_dir, seed=seed, jobs=jobs, force=force)
        )
    except KeyboardInterrupt:
        fail(
            f"interrupted (Ctrl-C): {data_dir} holds a partial dataset (no complete manifest, so nothing "
            f"will use it); rerun the same command to resume",
            130,
        )
    echo(
        f"dataset: {data_dir} ({res.files} {m.dataset.format} files, {res.total_bytes / 1e6:,.1f} MB; "
        f"{res.generated} generated, {res.reused} reused, {res.seconds:.1f} s)"
    )
    for w in res.warnings:
        echo(f"warning: {w}", err=True)
    scaled = f" --set dataset.num_files={m.dataset.num_files}" if scale_to else ""
    echo(f"next: dlreplay replay {model_file} --data-dir {data_dir}{scaled}")
