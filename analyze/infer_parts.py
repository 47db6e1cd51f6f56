"""Samples made of several files, in DFTracer's POSIX calls alone: an image and its mask,
MLPerf unet3d's ``case_00007_x.npy`` and ``case_00007_y.npy``, ``images/0007.png`` and
``masks/0007.png``. With the loader's events each item names its files
(:func:`~.distill.dataset._sample_parts`); without them, each file's open looked like a
sample (48 files of 1 sample for 24 pairs), and the batch (files, not samples) and the order
(a pair's second file always after its first, in name order) came out wrong.

A group is found by two things at once, so neither alone can make one:

- **the names**: the files' paths split into tokens at ``/ _ . -``; leaving out one token
  position groups the files into groups of the same size *k* (2 to :data:`MAX_PARTS`), and
  that token takes exactly *k* values over all files (``image``/``mask``, ``x``/``y``, the
  folder ``images``/``masks``, the extension ``jpg``/``png``), with at least
  :data:`MIN_GROUPS` groups;
- **the reads**: in each process's visits in time order, each group's *k* files come one
  after another, in runs of exactly its *k* files, for :data:`RUN_SHARE` of the runs (a
  shuffled loader keeps a sample's files together; files of one-file samples read in name
  order make runs of one).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import polars as pl

#: most files a sample reads (parts), and fewest samples, for a grouping by name to count
MAX_PARTS, MIN_GROUPS = 8, 4
#: share of a process's runs of one group's visits that must be the group's k files exactly
RUN_SHARE = 0.9

_SPLIT = re.compile(r"[/_.\-]+")


@dataclass(frozen=True)
class SampleGroups:
    """Files a sample (``k``), each file's group (``group``) and part (``part``: its index in
    the order a sample reads its files), and the parts' name tokens in that order."""

    k: int
    group: dict[str, str]
    part: dict[str, int]
    names: list[str]
    evidence: str


def _candidates(files: list[str]) -> list[tuple[int, dict[str, str], dict[str, str]]]:
    """(k, file -> group key, file -> part token) for each token position that groups the
    files by name (see the module), smallest k first."""
    tokens = {f: _SPLIT.split(f) for f in files}
    lengths = {len(t) for t in tokens.values()}
    if len(lengths) != 1:
        return []
    out = []
    for p in range(lengths.pop()):
        key = {f: "\0".join(t[:p] + t[p + 1 :]) for f, t in tokens.items()}
        sizes = Counter(key.values())
        k = next(iter(sizes.values()))
        values = {t[p] for t in tokens.values()}
        if (
            2 <= k <= MAX_PARTS
            and all(n == k for n in sizes.values())
            and len(values) == k
            and len(sizes) >= MIN_GROUPS
        ):
            out.append((k, key, {f: t[p] for f, t in tokens.items()}))
    return sorted(out, key=lambda c: c[0])


def sample_groups(visits: pl.DataFrame) -> SampleGroups | None:
    """The groups of files each sample reads, from the names and the order of the *visits*
    (pid, file, ts: opens of dataset files); None where no grouping holds (see the module)."""
    files = sorted(visits["file"].cast(pl.String).unique().to_list())
    if len(files) < 2 * MIN_GROUPS:
        return None
    v = visits.select("pid", pl.col("file").cast(pl.String), "ts").sort("ts")
    for k, key, token in _candidates(files):
        g = v.with_columns(pl.col("file").replace_strict(key).alias("g")).with_columns(
            (pl.col("g") != pl.col("g").shift(1).over("pid"))
            .fill_null(True)
            .cum_sum()
            .over("pid")
            .alias("run")
        )
        runs = g.group_by("pid", "run").agg(
            pl.len().alias("n"), pl.col("file").n_unique().alias("distinct")
        )
        whole = runs.filter((pl.col("n") == k) & (pl.col("distinct") == k))
        if whole.height < RUN_SHARE * runs.height:
            continue
        # the parts in the order a sample reads them: each part's median place in its runs
        ordered = (
            g.with_columns(
                pl.int_range(pl.len()).over("pid", "run").alias("pos"),
                pl.col("file").replace_strict(token).alias("tok"),
            )
            .group_by("tok")
            .agg(pl.col("pos").median().alias("pos"))
            .sort("pos", "tok")
        )
        names = ordered["tok"].to_list()
        index = {t: i for i, t in enumerate(names)}
        return SampleGroups(
            k=k,
            group=key,
            part={f: index[token[f]] for f in files},
            names=names,
            evidence=(
                f"{len(files)} files named in {len(files) // k} groups of {k} "
                f"({' + '.join(names)}), and {whole.height} of {runs.height} runs of a "
                f"process's visits read one group's {k} files one after another"
            ),
        )
    return None
