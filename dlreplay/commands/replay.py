"""``dlreplay replay``: replay a workload model on a dataset, compute replaced by sleep."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from dlreplay.commands.common import SEED, FiniteFloat, Processes, echo


@click.command(short_help="Replay a model on a dataset; report MLPerf Storage metrics.")
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "--data-dir", type=click.Path(path_type=Path), required=True, help="Dataset directory."
)
@click.option(
    "--accelerators",
    type=Processes(),
    default=None,
    help="Simulated accelerators (local processes; under mpiexec each rank is one). Default: the "
    "model's processes.ranks, as many as the traced job ran.",
)
@click.option(
    "--epochs", type=click.IntRange(min=1), default=None, help="Epochs (default: the model's)."
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a model field (repeatable).",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    default=None,
    help="Result directory (default replays/<model name>-<UTC time>).",
)
@click.option("--no-trace", is_flag=True, help="Do not run the replay under DFTracer.")
@click.option("--no-generate", is_flag=True, help="Fail instead of generating a missing dataset.")
@click.option(
    "--io",
    "io_mode",
    type=click.Choice(["library", "posix"]),
    default="library",
    show_default=True,
    help="Read through the format's library, or os.pread of the model's transfer size.",
)
@click.option(
    "--loader",
    type=click.Choice(["auto", "torch", "builtin"]),
    default="auto",
    show_default=True,
    help="Data loader: PyTorch's own DataLoader (torch), dlreplay's torch-free one (builtin), or auto: "
    "torch when the model's loader is PyTorch's and torch is installed.",
)
@click.option(
    "--au-threshold",
    type=FiniteFloat(0, 100),
    default=90.0,
    show_default=True,
    help="Pass/fail accelerator utilization, percent.",
)
@click.option(
    "--seed",
    type=SEED,
    default=0,
    show_default=True,
    help="Seed (dataset, shuffling, compute draws).",
)
@click.option(
    "--find-max-accelerators",
    is_flag=True,
    help="Try N = 1, 2, 4, ... then bisect while AU >= threshold.",
)
@click.option(
    "--record-order", is_flag=True, help="Write each epoch's sample order to sample-order.json."
)
@click.option(
    "--keep-checkpoints", is_flag=True, help="Keep the checkpoint files the replay wrote."
)
@click.option(
    "--cold",
    is_flag=True,
    help="Drop the dataset's pages from the page cache before each epoch (each file flushed, then "
    "posix_fadvise DONTNEED; with --cold-method auto also /proc/sys/vm/drop_caches when writable), so "
    "the storage serves every epoch; what was done is printed and kept in metrics.json.",
)
@click.option(
    "--cold-method",
    type=click.Choice(["auto", "fadvise"]),
    default="auto",
    show_default=True,
    help="--cold: auto (per-file fadvise, and drop_caches when writable: the whole host's cache) or "
    "fadvise (the dataset's files only).",
)
@click.option(
    "--mlperf",
    is_flag=True,
    help="MLPerf Storage rules: refuse unless the dataset is >= 5x host memory and every accelerator "
    "takes >= 500 steps per epoch; then a warm-up run and 5 measured runs (untraced) in --out, AU per "
    "run as MLPerf computes it, mlperf.json and provenance.json.",
)
@click.option(
    "--mlperf-check-only",
    is_flag=True,
    help="Only check the MLPerf Storage rules (dataset size, steps per epoch) and say what is short.",
)
@click.option("--quiet", "-q", is_flag=True, help="Print only the result line.")
@click.option("--_traced", "traced", is_flag=True, hidden=True)
@click.option("--_checkpoints-after-trace", "ckpt_after_trace", is_flag=True, hidden=True)
def replay(
    model_file: Path,
    data_dir: Path,
    accelerators: int | None,
    epochs: int | None,
    overrides: tuple[str, ...],
    out: Path | None,
    no_trace: bool,
    no_generate: bool,
    io_mode: str,
    loader: str,
    au_threshold: float,
    seed: int,
    find_max_accelerators: bool,
    record_order: bool,
    keep_checkpoints: bool,
    cold: bool,
    cold_method: str,
    mlperf: bool,
    mlperf_check_only: bool,
    quiet: bool,
    traced: bool,
    ckpt_after_trace: bool,
) -> None:
    """Replay MODEL_FILE on --data-dir with compute replaced by sleep; report MLPerf Storage metrics."""
    from dlreplay.model import apply_overrides, load_model
    from dlreplay.replay import ReplayConfig, run_replay
    from dlreplay.replay import find_max_accelerators as find_max
    from dlreplay.replay.engine import KEEP_ON_SUCCESS

    sets = list(overrides) + ([f"train.epochs={epochs}"] if epochs else [])
    m = apply_overrides(load_model(model_file), sets)
    config = ReplayConfig(
        model=m,
        data_dir=data_dir,
        accelerators=accelerators,
        out=out,
        trace=not no_trace,
        generate=not no_generate,
        io=io_mode,
        au_threshold=au_threshold,
        seed=seed,
        record_order=record_order,
        traced=traced,
        loader=loader,
        cold=cold_method if cold else "",
        keep_checkpoints=keep_checkpoints or (KEEP_ON_SUCCESS if ckpt_after_trace else False),
    )
    say = (lambda s: None) if quiet else (lambda s: echo(s, err=True))
    if mlperf or mlperf_check_only:
        _mlperf(config, mlperf_check_only, say)
        return
    if find_max_accelerators:
        for n, au in find_max(config, echo=say):
            echo(f"accelerators {n:>4}  AU {'-' if au is None else f'{au:.2f}'} %")
        return
    result = run_replay(config, echo=say)
    if traced:
        sys.exit(0 if result.complete else 130)
    from dlreplay.replay.mlperf import write_provenance

    write_provenance(result.out, m, data_dir, sys.argv, result.metrics)
    _print_result(result, quiet)
    if not result.complete:
        sys.exit(130)


def _mlperf(config: Any, check_only: bool, say: Any) -> None:
    """``--mlperf`` / ``--mlperf-check-only`` (see :mod:`dlreplay.replay.mlperf`)."""
    import dataclasses

    from dlreplay.replay import ReplayError, run_replay
    from dlreplay.replay.mlperf import (
        mlperf_shortfalls,
        render_mlperf,
        run_mlperf,
        shortfalls_text,
    )
    from dlreplay.replay.plan import model_accelerators
    from dlreplay.replay.prepare import default_out

    n = config.accelerators or model_accelerators(config.model)
    config = dataclasses.replace(
        config, accelerators=n, out=config.out or default_out(config.model)
    )
    if check_only:
        short = mlperf_shortfalls(config.model, n, config.data_dir)
        if short:
            raise ReplayError(shortfalls_text(short))
        echo(shortfalls_text(short))
        return
    try:
        doc = run_mlperf(config, sys.argv, lambda c: run_replay(c, echo=say), say)
    except KeyboardInterrupt:
        echo(f"MLPerf mode interrupted; the runs so far are in {config.out}", err=True)
        sys.exit(130)
    echo(render_mlperf(doc))
    echo(f"mlperf: {config.out / 'mlperf.json'}")


def _print_result(result: Any, quiet: bool) -> None:
    """The metrics (unless ``quiet``), warnings, where they were written, and what to run next."""
    from dlreplay.replay import render_result

    if not quiet:
        echo(render_result(result))
        for w in result.warnings:
            echo(f"warning: {w}", err=True)
    echo(f"metrics: {result.out / 'metrics.json'}" + ("" if result.complete else " (incomplete)"))
    if result.traced:
        echo(f"next: dlreplay analyze {result.out}")
