"""The pass over what a job read through memory maps: the files it mapped, the windows it took
of them (the ``data/io.mmap`` and ``data/io.window`` events of ``dlreplay capture``'s mapped
hooks, read from the trace files by :func:`~..distill.mapped.mapped_events`: the event table
keeps no offset or bytes of annotation events), the pages of those windows faulted in from
storage, and the data time of the steps that took them.

A mapped file has no read calls: its reads are page faults, which the tracer does not time.
What is measured, per window: its bytes (from its first to its last byte, the job's read unit)
and its *cold* pages, not resident in the page cache when the window was taken (``mincore(2)``
in the job), which storage had to supply for it (readahead around a fault may read more,
counted in no window). A step is *cold* when one of its windows had cold pages; the data time
of cold steps over that of warm ones is the time the loop waited for storage.

Units: bytes, seconds (``*_s``), counts; ``cold_share`` is a fraction of the windows' pages.
"""

from __future__ import annotations

import mmap
from typing import Any

import polars as pl

from dlreplay.units import human_bytes, human_seconds

from ..distill.mapped import merged_windows
from ..trace import vocabulary as voc
from .numbers import US, rounded

__all__ = ["MAPPED_NOTE", "MAPPED_TOP_FILES", "mapped_headline", "mapped_reads", "pass_mapped"]

#: Mapped files listed in the pass's ``per_file``, the most bytes taken first.
MAPPED_TOP_FILES = 10
#: The report's note on a trace with mapped windows.
MAPPED_NOTE = (
    "mapped: the dataset is read through memory maps: its reads are page faults, which no read "
    "call shows (the access, transfer, bandwidth, metadata and page-cache passes see read calls "
    "only); the mapped hooks' windows, and their pages not in the page cache, are counted instead "
    "(the mapped data rows), and a page fault is not timed"
)
#: Warm steps needed to take their median data time as the loop's data time without storage.
_MIN_WARM_STEPS = 3


def _empty() -> dict[str, Any]:
    return {"maps": 0, "windows": 0, "files": 0, "per_file": []}


def pass_mapped(v: Any) -> dict[str, Any]:
    """What the job read through memory maps (:attr:`~.view.TraceView.mapped`, :func:`mapped_reads`)."""
    return v.mapped


def mapped_reads(v: Any) -> dict[str, Any]:
    """Mapped files, windows taken, bytes touched and faulted in, windows and data time per
    step, and the storage stall of the steps whose windows were cold (see the module doc)."""
    ev = v.mapped_events
    if ev is None or ev.is_empty():
        return _empty()
    page = mmap.PAGESIZE
    maps = ev.filter(pl.col("name") == "io.mmap")
    windows = (
        ev.filter(pl.col("name") == "io.window")
        .drop_nulls(["offset", "bytes"])
        .with_columns(
            ((pl.col("offset") + pl.col("bytes") - 1) // page - pl.col("offset") // page + 1).alias(
                "pages"
            )
        )
    )
    measured = bool(windows.height) and windows["cold"].null_count() < windows.height
    out: dict[str, Any] = {
        "maps": maps.height,
        "windows": windows.height,
        "files": int(ev["path"].n_unique()),
        "file_bytes": _file_bytes(maps),
        "bytes_touched": int(windows["bytes"].sum() or 0),
        "pages_touched": int(windows["pages"].sum() or 0),
        "page_size": page,
        "cold_measured": measured,
        "cold_bytes": int(windows["cold"].sum() or 0) * page if measured else None,
        "slice_bytes": _median(windows["bytes"]),
        "per_file": _per_file(maps, windows, page, measured),
        # files whose first window found pages not in the page cache: storage served that file
        # (its readahead may have brought in most of what later windows took)
        "files_cold_at_start": int(
            windows.sort("ts", maintain_order=True)
            .group_by("path")
            .agg(pl.col("cold").first())["cold"]
            .fill_null(0)
            .gt(0)
            .sum()
        )
        if measured
        else None,
        "host_memory_bytes": (v.manifest or {}).get("mem_total_bytes"),
    }
    pages = out["pages_touched"]
    out["cold_share"] = rounded(out["cold_bytes"] / page / pages, 4) if measured and pages else None
    out.update(_per_step(v, windows, measured, page))
    return out


def _median(s: pl.Series) -> int | None:
    return int(round(float(s.median()))) if s.len() else None  # type: ignore[arg-type]


def _median_f(s: pl.Series) -> float:
    return float(s.median() or 0) if s.len() else 0.0  # type: ignore[arg-type]


def _file_bytes(maps: pl.DataFrame) -> int:
    """Bytes of the mapped files: each file's largest mapping."""
    if maps.is_empty():
        return 0
    return int(maps.group_by("path").agg(pl.col("bytes").max())["bytes"].sum() or 0)


def _per_file(
    maps: pl.DataFrame, windows: pl.DataFrame, page: int, measured: bool
) -> list[dict[str, Any]]:
    per_map = maps.group_by("path").agg(
        pl.len().alias("maps"), pl.col("bytes").max().alias("file_bytes")
    )
    per_win = windows.group_by("path").agg(
        pl.len().alias("windows"),
        pl.col("bytes").sum().alias("bytes_touched"),
        (pl.col("cold").sum() * page).alias("cold_bytes"),
    )
    rows = (
        per_map.join(per_win, on="path", how="full", coalesce=True)
        .fill_null(0)
        .sort(["bytes_touched", "path"], descending=[True, False])
        .rename({"path": "file"})
        .head(MAPPED_TOP_FILES)
    )
    if not measured:
        rows = rows.with_columns(pl.lit(None, pl.Int64).alias("cold_bytes"))
    return [dict(r) for r in rows.iter_rows(named=True)]


def _eval_spans(v: Any) -> pl.DataFrame:
    return (
        v.role(voc.EVALUATE)
        .select(
            pl.col("pid").cast(pl.Int64),
            pl.col("ts").cast(pl.Int64).alias("e_ts"),
            (pl.col("ts") + pl.col("dur").fill_null(0)).cast(pl.Int64).alias("e_end"),
        )
        .sort("e_ts")
    )


def _steps(v: Any, spans: pl.DataFrame) -> pl.DataFrame:
    """The training steps (pid, ts, data_us, steady): ``data_us`` is the time from the previous
    step's end to this one's compute; ``steady``: not a consumer's first step, not after a
    validation pass or a checkpoint (those gaps hold more than the step's data)."""
    st = v.step_table
    if st.is_empty():
        return pl.DataFrame(
            schema={"pid": pl.Int64, "ts": pl.Int64, "data_us": pl.Int64, "steady": pl.Boolean}
        )
    st = (
        st.select(
            pl.col("pid").cast(pl.Int64),
            pl.col("ts").cast(pl.Int64),
            pl.col("end").cast(pl.Int64),
            (pl.col("wait_us").fill_null(0) + pl.col("other_us").fill_null(0)).alias("data_us"),
            pl.col("ckpt_us").fill_null(0),
        )
        .sort("ts")
        .with_columns(pl.col("end").shift(1).over("pid").alias("prev_end"))
    )
    if spans.height:
        st = st.join_asof(
            spans.select("pid", "e_ts"),
            left_on="ts",
            right_on="e_ts",
            by="pid",
            strategy="backward",
            check_sortedness=False,
        )
    else:
        st = st.with_columns(pl.lit(None, pl.Int64).alias("e_ts"))
    after_eval = pl.col("e_ts").is_not_null() & (pl.col("e_ts") >= pl.col("prev_end"))
    steady = (
        pl.col("prev_end").is_not_null() & ~after_eval.fill_null(False) & (pl.col("ckpt_us") == 0)
    )
    return st.select("pid", "ts", "data_us", steady.alias("steady"))


def _per_step(v: Any, windows: pl.DataFrame, measured: bool, page: int) -> dict[str, Any]:
    """Windows per step and the data time of cold and warm steps (validation passes apart)."""
    spans = _eval_spans(v)
    w = windows.sort("ts")
    if spans.height:
        w = w.join_asof(
            spans,
            left_on="ts",
            right_on="e_ts",
            by="pid",
            strategy="backward",
            check_sortedness=False,
        )
        in_eval = (pl.col("e_end").is_not_null() & (pl.col("ts") < pl.col("e_end"))).fill_null(
            False
        )
        eval_w, w = w.filter(in_eval), w.filter(~in_eval)
    else:
        eval_w = w.head(0)
    steps = _steps(v, spans)
    out: dict[str, Any] = {"eval_windows": eval_w.height, "steps": steps.height}
    if steps.is_empty() or w.is_empty():
        return out | {
            "missing_steps": "no training steps" if steps.is_empty() else "no windows in steps"
        }
    # each window belongs to the step whose compute follows it (the batch it was read for)
    stepped = w.join_asof(
        steps.select("pid", pl.col("ts").alias("s_ts")),
        left_on="ts",
        right_on="s_ts",
        by="pid",
        strategy="forward",
        check_sortedness=False,
    ).drop_nulls("s_ts")
    per = stepped.group_by("pid", "s_ts").agg(
        pl.len().alias("windows"),
        pl.col("bytes").sum().alias("bytes"),
        pl.col("cold").sum().alias("cold"),
    )
    st = steps.join(
        per.rename({"s_ts": "ts"}), on=["pid", "ts"], how="left", maintain_order="left"
    ).with_columns(pl.col("windows", "bytes", "cold").fill_null(0))
    # the first step that takes windows waited for the mapped loop's start too (a model built,
    # another loop before it): not steady
    took_any = pl.col("windows") > 0
    first = took_any & (took_any.cast(pl.Int64).cum_sum().over("pid") == 1)
    st = st.with_columns((pl.col("steady") & ~first).alias("steady"))
    took = st.filter(pl.col("windows") > 0)
    if took.is_empty():
        return out | {
            "steps_with_windows": 0,
            "missing_steps": "no window taken by a process with steps (taken in loader workers?)",
        }
    # a step's overlapping slices (an input and its target one token on) are one window
    merged = merged_windows(
        stepped.select(
            (pl.col("pid").cast(pl.String) + ":" + pl.col("s_ts").cast(pl.String)).alias("step"),
            "offset",
            "bytes",
        )
    )
    t0, t1 = steps["ts"].min(), v.step_table["end"].max()
    out |= {
        "steps_with_windows": took.height,
        "slices_per_step": rounded(_median_f(took["windows"]), 2),
        "windows_per_step": rounded(_median_f(merged.group_by("step").len()["len"]), 2),
        "window_bytes": _median(merged["bytes"]),
        "bytes_per_step": _median(took["bytes"]),
        "data_time_s": _seconds(st.filter(pl.col("steady"))["data_us"]),
        "loop_s": rounded((int(t1) - int(t0)) * US, 6),  # type: ignore[arg-type]
    }
    if measured:
        out |= _stall(st.filter(pl.col("steady")), took, page)
    return out


def _seconds(us: pl.Series) -> float | None:
    return rounded(float(us.median()) * US, 6) if us.len() else None  # type: ignore[arg-type]


def _stall(steady: pl.DataFrame, took: pl.DataFrame, page: int) -> dict[str, Any]:
    """Cold steps (a window with pages not in the page cache) and the extra data time they
    took over the warm steps' median: the loop's wait for storage (an upper bound, the cold
    steps' whole data time, with fewer than :data:`_MIN_WARM_STEPS` warm steps to compare)."""
    cold = steady.filter(pl.col("cold") > 0)
    warm = steady.filter((pl.col("cold") == 0) & (pl.col("windows") > 0))
    base = float(warm["data_us"].median()) if warm.height >= _MIN_WARM_STEPS else 0.0  # type: ignore[arg-type]
    extra = (cold["data_us"].cast(pl.Float64) - base).clip(lower_bound=0.0)
    return {
        "cold_steps": int((took["cold"] > 0).sum()),
        "cold_bytes_per_cold_step": _median(cold["cold"] * page) if cold.height else 0,
        "data_time_cold_s": _seconds(cold["data_us"]),
        "data_time_warm_s": _seconds(warm["data_us"]),
        "stall_s": rounded(float(extra.sum()) * US, 6),
        "stall_basis": (
            "cold steps' data time over the warm steps' median"
            if warm.height >= _MIN_WARM_STEPS
            else "cold steps' whole data time (an upper bound: too few warm steps to compare)"
        ),
    }


def mapped_headline(res: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's headline rows for the mapped pass's result *res* (none without windows)."""
    if not res.get("windows"):
        return []
    cold = res.get("cold_bytes")
    rows = [
        (
            "mapped data",
            "the dataset's reads: "
            f"{res['files']} file(s) of {human_bytes(res.get('file_bytes') or 0)} mapped "
            f"{res['maps']:,} time(s); {res['windows']:,} slices taken, "
            f"{human_bytes(res['bytes_touched'])} touched; "
            + (
                f"{human_bytes(cold)} faulted in from storage (cold pages, {res['cold_share']:.1%})"
                if cold is not None
                else "pages faulted in unknown (no page residency measured)"
            ),
        )
    ]
    if res.get("windows_per_step") is not None:
        dt = res.get("data_time_s")
        rows.append(
            (
                "mapped windows per step",
                f"{res['windows_per_step']:g} of {human_bytes(res.get('window_bytes') or 0)} "
                f"({res['slices_per_step']:g} slices of {human_bytes(res.get('slice_bytes') or 0)}); "
                f"data time between steps {human_seconds(dt) if dt is not None else '-'} (median)"
                + (
                    f"; {res['cold_steps']} step(s) with cold pages, "
                    f"{human_seconds(res['stall_s'])} waited for storage"
                    if res.get("cold_steps")
                    else ""
                ),
            )
        )
    return rows
