"""``dlreplay compare``: compare the I/O of two traces (real vs replay, storage A vs B)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from dlreplay.commands.common import FiniteFloat, Status, check_report, echo, fail


@click.command(short_help="Compare the I/O of two traces (real vs replay, storage A vs B).")
@click.argument("trace_a", type=click.Path(path_type=Path))
@click.argument("trace_b", type=click.Path(path_type=Path))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the comparison as JSON (similarity under `similarity`).",
)
@click.option(
    "--min-similarity",
    type=FiniteFloat(0, 1),
    default=None,
    help="Exit with code 1 when the similarity is below this (0..1), or when either trace is "
    "incomplete (a capture that did not end, a killed job, a process file gone or cut).",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path),
    help="Write overlay plots and the table: .html (self-contained) or .md.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing --report file.")
def compare(
    trace_a: Path,
    trace_b: Path,
    as_json: bool,
    min_similarity: float | None,
    report_path: Path | None,
    force: bool,
) -> None:
    """Compare the I/O of TRACE_A and TRACE_B (real vs replay, storage A vs storage B).

    Prints the DLIO paper's feature vectors side by side (I/O time, bytes, transfer
    sizes, bandwidth, % sequential/consecutive, files) and their cosine similarity
    (each feature normalised by the larger value; 1.0 = same shape), KS distances of
    read sizes and inter-batch gaps, epoch times and AU.
    """
    from dlreplay.analyze.compare import compare_traces, write_comparison_report

    if report_path is not None:
        check_report(report_path, force, inputs=(trace_a, trace_b))
    with Status(f"comparing {trace_a} and {trace_b}"):
        cmp = compare_traces(trace_a, trace_b)
    if report_path is not None:
        write_comparison_report(cmp, report_path)
    if as_json:
        # stdout stays JSON (its "warnings"); the warnings are said first all the same
        _warn(cmp, trace_a, trace_b, err=True)
        echo(json.dumps(cmp.to_dict(), indent=2))
    else:
        _print_comparison(cmp, trace_a, trace_b, report_path)
    if min_similarity is not None and cmp.incomplete_sides():
        side, path, gaps = cmp.incomplete_sides()[0]
        fail(
            f"--min-similarity: trace {side} ({path}) is incomplete ({gaps[0]}), so its similarity "
            f"proves nothing; capture the job again and compare the complete trace",
            1,
        )
    if min_similarity is not None and cmp.similarity < min_similarity:
        echo(
            f"dlreplay: similarity {cmp.similarity:.4f} is below --min-similarity {min_similarity}",
            err=True,
        )
        sys.exit(1)


def _print_comparison(cmp: Any, trace_a: Path, trace_b: Path, report_path: Path | None) -> None:
    """Each side's warnings, then the comparison table, then where the report is."""
    from dlreplay.analyze.compare import render_comparison

    _warn(cmp, trace_a, trace_b)
    echo(render_comparison(cmp))
    if report_path is not None:
        echo(f"report: {report_path}")


def _warn(cmp: Any, trace_a: Path, trace_b: Path, err: bool = False) -> None:
    """Each side's warnings: before the numbers derived from them."""
    for side, path, warnings in (("A", trace_a, cmp.warnings_a), ("B", trace_b, cmp.warnings_b)):
        for w in warnings:
            echo(f"warning: {side} ({path}): {w}", err=err)
