"""Shards streamed whole by an IterableDataset: WebDataset tar shards and Arrow IPC streams.

* ``tar``: each sample is a group of members sharing a key, ``<shard>_<sample>.<part>``
  (WebDataset's convention), one per part of ``layout.shard_members`` in order, with that
  part's bytes; USTAR headers (512 bytes a member, data padded to 512), written by
  :mod:`tarfile`, so a shard has the real one's members, sizes and read pattern.
* ``arrow``: an Arrow IPC stream (HF ``datasets``' cache files) of record batches of
  ``layout.rows_per_batch`` rows, one column per part: ``int64`` for 8-byte parts (labels),
  else ``binary`` of the part's bytes.

Without ``shard_members`` a sample is one part (``bin``) of the plan's bytes less the tar
header (tar) or the Arrow offsets (arrow). Content is seeded random bytes. Units: bytes.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlreplay.model import Layout

__all__ = ["TAR_BLOCK", "part_sizes", "write_arrow", "write_tar"]

#: A tar header's and a tar member's data block size (bytes).
TAR_BLOCK = 512


def part_sizes(
    sizes: Sequence[int], layout: Layout, rng: np.random.Generator, overhead: int
) -> list[list[tuple[str, int]]]:
    """Each sample's parts as (name, bytes): drawn from ``layout.shard_members`` (one draw per
    part and sample), else one ``bin`` part of the sample's planned bytes less *overhead*."""
    members = layout.shard_members
    if not members:
        return [[("bin", max(0, int(s) - overhead))] for s in sizes]
    n = len(sizes)
    drawn = [
        np.maximum(0, np.rint(m.bytes.sample(rng, n))).astype(np.int64).tolist() for m in members
    ]
    return [[(m.name, int(d[i])) for m, d in zip(members, drawn, strict=True)] for i in range(n)]


def write_tar(tmp: Path, sizes: Sequence[int], layout: Layout, rng: np.random.Generator) -> str:
    """Write a tar shard of ``len(sizes)`` samples at *tmp* (its members' keys numbered by the
    first number in its name, the shard's index); returns a note for the manifest."""
    samples = part_sizes(sizes, layout, rng, TAR_BLOCK)
    number = re.search(r"\d+", tmp.name)
    shard = int(number.group()) if number else 0
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, parts in enumerate(samples):
            for name, nbytes in parts:
                info = tarfile.TarInfo(f"{shard:06d}_{i:06d}.{name}")
                info.size, info.mtime, info.mode = nbytes, 0, 0o644
                tf.addfile(info, io.BytesIO(rng.bytes(nbytes)))
    return f"tarfile: {len(samples)} samples x {len(samples[0]) if samples else 0} member(s)"


def write_arrow(tmp: Path, sizes: Sequence[int], layout: Layout, rng: np.random.Generator) -> str:
    """Write an Arrow IPC stream shard at *tmp*; returns a note for the manifest."""
    import pyarrow as pa

    samples = part_sizes(sizes, layout, rng, 4)
    names = [name for name, _ in samples[0]] if samples else ["bin"]
    as_int = [all(s[j][1] == 8 for s in samples) for j in range(len(names))]
    schema = pa.schema(
        [(n, pa.int64() if i else pa.binary()) for n, i in zip(names, as_int, strict=True)]
    )
    rows = layout.rows_per_batch or max(1, len(samples))
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for b in range(0, len(samples), rows):
            part = samples[b : b + rows]
            cols = [
                pa.array(rng.integers(0, 1 << 20, len(part)), type=pa.int64())
                if as_int[j]
                else pa.array([rng.bytes(s[j][1]) for s in part], type=pa.binary())
                for j in range(len(names))
            ]
            writer.write_batch(pa.record_batch(cols, schema=schema))
    return f"pyarrow: {len(samples)} rows in batches of {rows}"
