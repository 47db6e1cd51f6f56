"""Transfers DFTracer cannot see: numpy's array reads and writes through a duplicated descriptor.

``np.load`` of a ``.npy``, ``np.fromfile`` and ``ndarray.tofile`` (so ``np.save``) on a Python
file object move the array's bytes with ``fread``/``fwrite`` on a ``FILE*`` that numpy makes
with ``dup`` and ``fdopen`` (``npy_PyFile_Dup2``). DFTracer's preload traces neither: the
duplicated descriptor was never opened by name, and glibc's ``fread`` calls its own ``read``.
A 1 MiB ``np.load`` shows as one 4 KiB read (the file object's buffer, holding the header).

What the preload does see is numpy's trail on the original descriptor, three ``lseek`` calls
with nothing between them on that descriptor:

1. the file object's ``tell`` before the transfer (``lseek(fd, 0, SEEK_CUR)``: returns P);
2. numpy's restore after it (``lseek(fd, P, SEEK_SET)``: returns P again);
3. the file object's seek to where the transfer ended (``lseek(fd, E, SEEK_SET)``: E > P).

The table gives a ``SEEK_SET`` lseek its target as ``offset`` and a ``tell`` none
(:func:`~.offsets.file_offsets`), so a tell, a seek to the place it told and a seek
further are told apart from other runs of seeks: PyTorch's zip reader (``torch.load``, DCP)
tells twice and then seeks to the end, which is no trail.

:func:`recover_hidden` finds these trails per (thread, file) stream and adds the transfer
they bound as the call numpy made, an ``fread`` or ``fwrite`` (category ``STDIO``) of
``E - S`` bytes at offset S, timed between the first and second seeks (where the transfer
ran). The direction is the stream's last visible transfer since its open: after a write
(``np.save`` wrote the header) a write from P; after a read a read. A read starts at P,
except after a buffer refill that ended at P (a read of at most :data:`BUFFER_BYTES`
asked, as ``np.load`` reads the header through the file object's buffer), whose bytes
numpy reads again from the file object's position inside them: the trail does not give
that position, so the read is taken from the refill's start (over by the bytes consumed
before it: an ``.npy`` header, 128 bytes, for ``np.load``). A trail with no transfer
before it since the open (``np.fromfile(path)``, ``arr.tofile(path)``) is counted and not
recovered: the table does not keep the open's access mode, which alone would tell a read
from a write. A trail whose end is not past P (an array within the buffered bytes)
transferred nothing storage saw anew: not recovered.

Each file of the trace gets a note with the count and bytes (:data:`RECOVERED`); the rows
are in the table as the job's, so every total, size histogram and model counts them.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from dlreplay.schema import OPEN_OPS, READ_OPS, WRITE_OPS

from .shapes import MAX_CALL_BYTES

__all__ = ["BUFFER_BYTES", "RECOVERED", "UNRECOVERED", "recover_hidden", "recovered_note"]

#: The largest read taken for a Python file object's buffer refill: its buffer is the file's
#: st_blksize (4 KiB on local file systems, 4 MiB on Lustre and up to 16 MiB on GPFS), else
#: io.DEFAULT_BUFFER_SIZE (8 KiB). On Lustre an np.load of 10 MiB refills 4 MiB and numpy
#: reads the 10 MiB again from the header's end: taken from the refill's start, not its end.
BUFFER_BYTES = 16 << 20

#: The note of a file whose trails were recovered (a count and bytes precede it).
RECOVERED = (
    "numpy array transfers through a duplicated descriptor (DFTracer does not see them), "
    "recovered from their seek trails"
)
#: The note of trails whose direction the table cannot tell.
UNRECOVERED = (
    "seek trail(s) of a numpy array transfer with no read or write on the descriptor before "
    "them (np.fromfile or tofile on a path): read or write cannot be told, not recovered"
)

_SEEKS = ("lseek", "lseek64")
_TRANSFERS = [*READ_OPS, *WRITE_OPS]


def _on_files(names: list[str]) -> pl.Expr:
    """POSIX calls named ``names`` on a file, by a known process."""
    return (
        pl.col("name").is_in(names)
        & (pl.col("cat") == "POSIX")
        & pl.col("file").is_not_null()
        & pl.col("pid").is_not_null()
    )


def _key() -> pl.Expr:
    """A stream, (thread, file), as one integer: numpy's trail is one thread's, and threads
    that load the same file at once interleave their calls. The thread id (the process's
    where none is recorded; thread ids are unique across a host's processes) and the
    resolved path (DFTracer 1.x, as DLIO's traces have it, names files by path, not hash)."""
    thread = pl.coalesce(pl.col("tid"), pl.col("pid")).cast(pl.Int64)
    return thread * (1 << 32) + pl.col("file").to_physical().cast(pl.Int64)


def _trails(ev: pl.DataFrame) -> pl.DataFrame:
    """The trails: for each, the rows of its three seeks (``__r``, ``__r1``, ``__r2``) and P
    (``ret``), and the row of the stream's last transfer, open or close before it (``__rl``,
    null for none).

    First among each (thread, file) stream's seeks alone: a tell returning P, a seek to P and a
    seek further, in a row (narrow columns over few rows, sorted by stream, so that a trace
    without trails costs little: loading's peak memory is bound per event); then, for those
    streams, no other call on the file between the first and the third, open or close
    included (the next one after the first comes after the third)."""
    p, r, key = pl.col("ret"), pl.col("__r"), pl.col("__key")

    def ahead(c: pl.Expr, k: int) -> pl.Expr:
        """``c`` of the stream's k-th next row (null past the stream's end): the rows sorted by
        stream (stable: in time within one), so a shift (a window per stream cost more)."""
        return pl.when(key.shift(-k) == key).then(c.shift(-k))

    # a tell (no place: SEEK_CUR), a seek to the place it told, a seek further
    told, placed = pl.col("offset").is_null(), pl.col("offset") == p
    trail = (
        told
        & ahead(placed, 1)
        & ahead(pl.col("offset"), 2).is_not_null()
        & (ahead(p, 1) == p)
        & (ahead(p, 2) > p)
        # (no call moves more than 1 TiB: the loader's bound on a byte count)
        & (ahead(p, 2) - p <= MAX_CALL_BYTES - BUFFER_BYTES)
        & (p >= 0)
    )
    seeks = (
        ev.lazy()
        .with_row_index("__r")
        .filter(_on_files(list(_SEEKS)))
        .select("__r", _key().alias("__key"), "ret", "offset")
        .sort("__key", maintain_order=True)
        .with_columns(
            trail.fill_null(False).alias("__t"),
            ahead(r, 1).alias("__r1"),
            ahead(r, 2).alias("__r2"),
        )
        .filter(pl.col("__t"))
        .drop("__t", "offset")
        .sort("__r")
        .collect()
    )
    if seeks.height == 0:
        return seeks
    others = (
        ev.lazy()
        .with_row_index("__r")
        .filter(_on_files([*_TRANSFERS, *OPEN_OPS, "close"]))
        .select("__r", _key().alias("__key"))
        .join(seeks.lazy().select("__key").unique(), on="__key", how="semi")
        .with_columns(pl.col("__r").alias("__rl"), pl.col("__r").alias("__rn"))
        .collect()
    )
    with warnings.catch_warnings():  # (sorted by row: polars cannot check it within groups)
        warnings.simplefilter("ignore", UserWarning)
        nxt = seeks.join_asof(others.drop("__rl"), on="__r", by="__key", strategy="forward")
        both = nxt.join_asof(others.drop("__rn"), on="__r", by="__key", strategy="backward")
    return both.filter(pl.col("__rn").is_null() | (pl.col("__rn") > pl.col("__r2"))).drop(
        "__rn", "__key"
    )


def recover_hidden(ev: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, list[str]]]:
    """``ev`` (an event table in ``ts`` order) with numpy's unseen transfers added where their
    seek trails show them (see the module), and each trace file's note by name."""
    notes: dict[str, list[str]] = {}
    trails = _trails(ev) if ev.height else None
    if trails is None or trails.height == 0:
        return ev, notes
    last = trails["__rl"]
    # (gathered by expression: a constant column taken out as a Series is built per row)
    at_last = ev.select(
        pl.col("name", "offset", "size", "size_requested").gather(last.fill_null(0))
    )
    name = at_last["name"].cast(pl.String)
    kind = (
        pl.when(last.is_null())
        .then(0)
        .when(name.is_in(list(READ_OPS)))
        .then(1)
        .when(name.is_in(list(WRITE_OPS)))
        .then(2)
        .otherwise(0)
    )
    trail = trails.with_columns(
        pl.select(kind).to_series().alias("__k"),
        at_last["offset"].alias("__lo"),
        at_last["size"].alias("__ls"),
        at_last["size_requested"].alias("__lq"),
        ev.select(pl.col("source").gather(trails["__r"]))["source"],
    )
    p = pl.col("ret")
    refill = (
        (pl.col("__k") == 1)
        & (pl.col("__lo") + pl.col("__ls") == p)
        & (pl.col("__lq").fill_null(BUFFER_BYTES + 1) <= BUFFER_BYTES)
    ).fill_null(False)
    known = pl.col("__k") > 0
    found = trail.filter(known).with_columns(
        pl.when(refill).then(pl.col("__lo")).otherwise(p).alias("__st")
    )
    for source, n in trail.filter(~known).group_by("source").len().sort("source").iter_rows():
        notes.setdefault(str(source), []).append(f"{n} {UNRECOVERED}")
    if found.height == 0:
        return ev, notes
    added = _rows(ev, found)
    for source, n, b in (
        added.group_by("source").agg(pl.len(), pl.col("size").sum()).sort("source").iter_rows()
    ):
        notes.setdefault(str(source), []).append(f"{n} ({b} bytes) {RECOVERED}")
    out = pl.concat([ev, added], how="vertical").sort("ts", maintain_order=True)
    return out, notes


def _rows(ev: pl.DataFrame, found: pl.DataFrame) -> pl.DataFrame:
    """The event rows (``ev``'s schema) of the ``found`` transfers: the call numpy made, in the
    first seek's process, thread and file, between the first seek's end and the second's start."""
    like = ("pid", "tid", "ppid", "host", "file", "fhash", "source")
    base = ev.select(like).gather(found["__r"])
    first = ev.select(pl.col("ts", "dur").gather(found["__r"]))
    end = first["ts"] + first["dur"].fill_null(0)
    nbytes = ev.select(pl.col("ret").gather(found["__r2"]))["ret"] - found["__st"]
    values = {
        "ts": end,
        "dur": (ev.select(pl.col("ts").gather(found["__r1"]))["ts"] - end).clip(lower_bound=0),
        "cat": pl.Series(["STDIO"] * found.height),
        "name": pl.Series(np.where(found["__k"].to_numpy() == 2, "fwrite", "fread")),
        "size_requested": nbytes,
        "size": nbytes,
        "ret": nbytes,
        "offset": found["__st"],
    }
    return pl.DataFrame(
        {
            c: base[c]
            if c in like
            else values[c].cast(t)
            if c in values
            else pl.Series([None] * found.height, dtype=t)
            for c, t in ev.schema.items()
        }
    )


def recovered_note(files: list) -> str | None:
    """One sentence for a trace whose files' reports say numpy transfers were recovered (or
    could not be): None when none was."""
    n = b = lost = 0
    for f in files:
        for p in f.problems:
            head = p.split(" ", 1)[0]
            if p.endswith(RECOVERED) and head.isdigit():
                n += int(head)
                b += int(p.split("(", 1)[1].split(" ", 1)[0])
            elif p.endswith(UNRECOVERED) and head.isdigit():
                lost += int(head)
    if not n and not lost:
        return None
    parts = []
    if n:
        parts.append(
            f"{n} numpy array transfer(s) of {b:,} bytes in all (np.load, np.fromfile, tofile "
            "through a duplicated descriptor, which DFTracer does not see) were recovered from "
            "their seek trails and are counted as fread/fwrite calls"
        )
    if lost:
        parts.append(
            f"{lost} more such trail(s) had no read or write before them to tell their "
            "direction and are not counted"
        )
    return "; ".join(parts) + "."
