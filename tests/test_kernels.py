"""The passes' C kernels (``dlreplay.analyze._kernels``) against the polars queries they replace.

The polars queries stay in :mod:`dlreplay.analyze.passes` as the definition and the path
taken without the extension; here both run on generated rows (nulls, ties in time, opens
between reads, intervals of equal starts) and on every trace of the corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlreplay.analyze.passes.view as P
from dlreplay.analyze import load_trace
from dlreplay.analyze.analysis import analyze_trace
from dlreplay.analyze.passes import characterize
from dlreplay.schema import READ_OPS

from .conftest import TRACES

pytestmark = pytest.mark.skipif(P._KERNELS is None, reason="dlreplay.analyze._kernels is not built")


def test_the_kernels_are_built() -> None:
    """CI builds the extension (a C compiler is there): the kernels' path is the one tested."""
    assert P._KERNELS is not None


_IO_ROW = st.tuples(
    st.one_of(st.none(), st.integers(1, 3)),
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 6),
    st.sampled_from(["open64", "read", "pread64", "lseek64", "close"]),
    st.one_of(st.none(), st.integers(0, 400)),
    st.one_of(st.none(), st.integers(0, 150)),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(_IO_ROW, max_size=60))
def test_read_flags_count_what_flag_reads_flags(rows) -> None:
    """``read_flags`` in one pass over the rows in time order gives, per (file, size), the
    reads and their sequential / consecutive counts that flag_reads (its stable sort by
    process and file) gives: null pids, opens between reads, reads without an offset or
    bytes, equal timestamps."""
    io = pl.DataFrame(
        sorted(rows, key=lambda r: r[2]),
        schema={
            "pid": pl.Int32,
            "file": pl.Categorical,
            "ts": pl.Int64,
            "name": pl.Categorical,
            "offset": pl.Int64,
            "size": pl.Int64,
        },
        orient="row",
    )
    want = (
        P.flag_reads(io)
        .group_by("file", "size")
        .agg(
            pl.len().alias("n"),
            pl.col("seq").sum().alias("__seq"),
            pl.col("consec").sum().alias("__con"),
        )
    )
    rows = io.select(P._read_flag_columns())
    files = io["file"].unique()
    got = P._read_flag_counts([rows], files)
    # rows in batches give the same counts: the state carries each (process, file)'s last read
    assert (
        P._read_flag_counts([rows[:7], rows[7:20], rows[20:]], files)
        .sort(pl.all())
        .equals(got.sort(pl.all()))
    )

    def norm(f: pl.DataFrame) -> list:
        return sorted(
            f.select(
                pl.col("file").cast(pl.String),
                "size",
                *(pl.col(c).cast(pl.Int64) for c in ("n", "__seq", "__con")),
            ).rows()
        )

    assert norm(got) == norm(want)
    assert got.height == 0 or got["file"].dtype == io["file"].dtype


_ITEM = st.tuples(
    st.one_of(st.none(), st.integers(1, 3)),
    st.one_of(st.none(), st.integers(0, 40)),
    st.one_of(st.none(), st.integers(0, 12)),
)
_ROW = st.tuples(
    st.one_of(st.none(), st.integers(1, 3)),
    st.one_of(st.none(), st.integers(0, 60)),
    st.integers(0, 20),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_ITEM, max_size=25), st.lists(_ROW, max_size=60), st.booleans())
def test_interval_sums_match_polars_join_asof(items, rows, rows_in_time_order) -> None:
    """``interval_sums`` against polars' backward join_asof by key (what the polars passes
    run): per interval, the rows inside it and their values (sample reads and bytes,
    I/O inside items), and the time of each row inside its interval (overlap). Intervals
    with equal starts, null keys, starts and ends; rows in time order or not."""
    it = pl.DataFrame(
        items, schema={"pid": pl.Int32, "ts": pl.Int64, "dur": pl.Int64}, orient="row"
    )
    rw = pl.DataFrame(rows, schema={"pid": pl.Int32, "ts": pl.Int64, "v": pl.Int64}, orient="row")
    if rows_in_time_order:
        rw = rw.sort("ts", maintain_order=True)
    iv = P._intervals(it, pl.col("pid"), pl.col("ts") + pl.col("dur"))
    counts, sums = np.zeros(len(iv[0]), np.int64), np.zeros(len(iv[0]), np.int64)
    P._interval_sums(
        rw.select(P._i64(pl.col("pid"), "k"), P._i64(pl.col("ts"), "t"), "v"), iv, counts, sums
    )
    ov_counts, ov = np.zeros(len(iv[0]), np.int64), np.zeros(len(iv[0]), np.int64)
    P._interval_sums(
        rw.select(P._i64(pl.col("pid"), "k"), P._i64(pl.col("ts"), "t"), "v"),
        iv,
        ov_counts,
        ov,
        overlap=True,
    )

    right = (
        it.filter(pl.col("pid").is_not_null() & pl.col("ts").is_not_null())
        .select("pid", pl.col("ts").alias("s"), (pl.col("ts") + pl.col("dur")).alias("e"))
        .sort("s", maintain_order=True)
    )
    j = (
        rw.filter(pl.col("ts").is_not_null())
        .sort("ts", maintain_order=True)
        .join_asof(
            right, left_on="ts", right_on="s", by="pid", strategy="backward", check_sortedness=False
        )
    )
    inside = j.filter(pl.col("e").is_not_null() & (pl.col("ts") <= pl.col("e")))
    want = (
        inside.group_by("pid", "s")
        .agg(pl.len().alias("n"), pl.col("v").sum())
        .sort("pid", "s")
        .rows()
    )
    got = (
        pl.DataFrame({"pid": iv[0], "s": iv[1], "n": counts, "v": sums})
        .filter(pl.col("n") > 0)
        .group_by("pid", "s")
        .agg(pl.col("n").sum(), pl.col("v").sum())
        .sort("pid", "s")
        .rows()
    )
    assert got == want
    ov_want = j.select(
        pl.when(pl.col("e").is_not_null())
        .then(
            (pl.min_horizontal(pl.col("ts") + pl.col("v"), pl.col("e")) - pl.col("ts")).clip(
                lower_bound=0
            )
        )
        .fill_null(0)
        .sum()
    ).item()
    assert int(ov.sum()) == ov_want
    assert int(ov_counts.sum()) == j.filter(pl.col("e").is_not_null()).height


def test_kernels_refuse_unsorted_intervals_and_unlike_lengths() -> None:
    """Intervals out of (key, start) order, buffers of unlike lengths or a state of another
    kind are refused (ValueError), never read past."""
    k = np.array([1, 1], np.int64)
    z = np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="not sorted"):
        P._KERNELS.interval_sums(
            k,
            z,
            z,
            k,
            np.array([5, 1], np.int64),
            z,
            False,
            np.zeros(2, np.int64),
            np.zeros(2, np.int64),
        )
    with pytest.raises(ValueError, match="unlike lengths"):
        P._KERNELS.interval_sums(
            k, z, z, k, z, z, False, np.zeros(1, np.int64), np.zeros(2, np.int64)
        )
    with pytest.raises(ValueError, match="differ in length"):
        P._KERNELS.read_flags(
            P._KERNELS.read_flags_new(), k, np.zeros(2, np.uint32), np.zeros(1, np.uint8), z, z
        )
    with pytest.raises(ValueError):  # not a read_flags state
        P._KERNELS.read_flags(object(), k, np.zeros(2, np.uint32), np.zeros(2, np.uint8), z, z)


def _corpus() -> list[str]:
    return sorted(
        p.name for p in TRACES.iterdir() if (p / "manifest.json").is_file() or any(p.glob("*.pfw*"))
    )


@pytest.mark.parametrize("name", _corpus())
def test_passes_with_kernels_give_the_polars_results(
    name: str, monkeypatch, tmp_path: Path
) -> None:
    """Every pass gives the same results with the kernels as with the polars queries, on every
    trace of the corpus (ours and DLIO's): in memory, in one slice of the table and in
    many, and over a spilled table (where the kernels take the processes in batches)."""

    def spilled(sub: str) -> str:
        a = analyze_trace(TRACES / name, memory_limit=1, spill_dir=tmp_path / sub, figures=False)
        return json.dumps(a.characterization.to_dict(), sort_keys=True, default=str)

    lt = load_trace(TRACES / name)
    with_kernels = json.dumps(
        characterize(lt.events, manifest=lt.manifest).to_dict(), sort_keys=True, default=str
    )
    monkeypatch.setattr(P, "ROW_BATCH", 97)  # many slices of the in-memory table, cut anywhere
    assert (
        json.dumps(
            characterize(lt.events, manifest=lt.manifest).to_dict(), sort_keys=True, default=str
        )
        == with_kernels
    )
    assert lt.events.height > 3 * 97
    monkeypatch.setattr(P, "PID_BATCH_MIN_ROWS", 0)
    spilled_kernels = spilled("k")
    monkeypatch.setattr(P, "_KERNELS", None)
    polars_only = json.dumps(
        characterize(lt.events, manifest=lt.manifest).to_dict(), sort_keys=True, default=str
    )
    assert with_kernels == polars_only
    assert spilled_kernels == spilled("p")


def test_the_corpus_has_reads_items_and_steps_for_the_kernels() -> None:
    """The comparison above is not empty: the corpus holds traces whose passes run each kernel."""
    lt = load_trace(TRACES / "npz_fork")
    c = characterize(
        lt.events, manifest=lt.manifest, passes=["access", "transfer", "overlap", "preprocess"]
    )
    assert c["access"]["reads"] > 100 and c["transfer"]["samples_with_reads"] > 10
    assert c["overlap"]["io_time_s"] > 0 and c["preprocess"]["io_in_items_s"] > 0
    assert lt.events.filter(pl.col("name").is_in(READ_OPS)).height > 100
