"""Stored trace bytes -> decoded text in chunks of complete lines.

Gzip members are decoded one ``decompressobj`` each (:mod:`dlreplay.pfw`), damage
salvaged and counted there; :func:`text_chunks` cuts the decoded output into chunks of
about :data:`CHUNK_BYTES` that end on a newline (or at a damage point), as lists of the
decoder's pieces (:data:`Piece`, never copied), dropping over-long lines as they stream
by; :func:`prefetched` decodes one chunk ahead in a helper thread.
"""

from __future__ import annotations

import mmap
import queue
import threading
from collections.abc import Iterable

from dlreplay.pfw import DecodeStats as _Stats
from dlreplay.pfw import PlainFile, Slabs
from dlreplay.pfw import decoded_spans as _decoded_spans

__all__ = [
    "CHUNK_BYTES",
    "Piece",
    "joined",
    "line_segments",
    "prefetched",
    "split_tail",
    "text_chunks",
]

#: Decoded text per parse batch (bytes). Large batches amortise per-batch overhead; each
#: thread holds one batch's text and scan at a time (twice this raised a load's peak at
#: the same speed (measured: benchmarks/RESULTS.md)).
CHUNK_BYTES = 16 << 20


#: Longest line kept (bytes): a longer one is dropped as it streams by (see :func:`text_chunks`).
_MAX_LINE_BYTES = 4 << 20


#: A piece of decoded text: the bytes [lo, hi) of a bytes object or of a mapping of
#: :class:`~dlreplay.pfw.Slabs` (chunks of text are lists of pieces, so that decoded
#: output is sliced and regrouped without copying it).
Piece = tuple["bytes | mmap.mmap", int, int]


def split_tail(text: list[Piece]) -> tuple[list[Piece], int]:
    """Split ``text`` after its last newline: (complete lines, length of the trailing partial line)."""
    for i in range(len(text) - 1, -1, -1):
        b, lo, hi = text[i]
        k = b.rfind(b"\n", lo, hi)
        if k >= 0:
            body = [*text[:i], (b, lo, k + 1)]
            return body, hi - k - 1 + sum(p[2] - p[1] for p in text[i + 1 :])
    return [], sum(p[2] - p[1] for p in text)


def line_segments(text: list[Piece]) -> list[bytes | mmap.mmap | memoryview]:
    """``text`` (complete lines; the last one may lack its newline) as buffers of complete
    lines, each ending with a newline except maybe the last: views of the pieces, and the
    (short) lines that span two pieces joined."""
    out: list[bytes | mmap.mmap | memoryview] = []
    carry: list[memoryview] = []  # the start of a line that continues in the next piece
    for b, lo, hi in text:
        if lo >= hi:
            continue
        mv = memoryview(b)
        if carry:
            k = b.find(b"\n", lo, hi)
            if k < 0:
                carry.append(mv[lo:hi])
                continue
            carry.append(mv[lo : k + 1])
            out.append(b"".join(carry))
            carry, lo = [], k + 1
            if lo == hi:
                continue
        k = b.rfind(b"\n", lo, hi)
        if k >= lo:
            out.append(b if lo == 0 and k + 1 == len(b) else mv[lo : k + 1])
        if k + 1 < hi:
            carry.append(mv[max(lo, k + 1) : hi])
    if carry:
        out.append(b"".join(carry))
    return out


def joined(text: list[Piece]) -> bytes:
    """The bytes of ``text``."""
    if (
        len(text) == 1
        and isinstance(text[0][0], bytes)
        and text[0][1] == 0
        and text[0][2] == len(text[0][0])
    ):
        return text[0][0]
    return b"".join(memoryview(b)[lo:hi] for b, lo, hi in text)


def prefetched(
    data: bytes | PlainFile, stats: _Stats, slabs: Slabs | None = None
) -> Iterable[tuple[list[Piece], bool, bool]]:
    """:func:`text_chunks`, decoded one chunk ahead in a helper thread, into ``slabs``
    (a new :class:`~dlreplay.pfw.Slabs` when None; the caller's when it releases the
    chunks it has parsed).

    The helper counts into its own stats; what it counted up to each chunk is added to
    ``stats`` when that chunk is handed over, so problems keep the order of a
    sequential decode.
    """
    q: queue.Queue = queue.Queue(maxsize=1)
    mine = _Stats()
    stop = threading.Event()

    def delta(seen: list[int]) -> tuple[int, int, int, list[str]]:
        d = (
            mine.members - seen[0],
            mine.dropped_lines - seen[1],
            mine.dropped_bytes - seen[2],
            mine.problems[seen[3] :],
        )
        seen[:] = [mine.members, mine.dropped_lines, mine.dropped_bytes, len(mine.problems)]
        return d

    def produce() -> None:
        seen = [0, 0, 0, 0]
        mine_slabs = slabs if slabs is not None else Slabs()
        try:
            for chunk in text_chunks(data, mine, mine_slabs):
                if stop.is_set():
                    return
                q.put((chunk, delta(seen), None))
            mine_slabs.finish()  # (before the end is handed over: the kept slabs go now)
            q.put((None, delta(seen), None))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            q.put((None, delta(seen), exc))
        finally:
            mine_slabs.finish()  # (stopped, or failed)

    helper = threading.Thread(target=produce, name="dlreplay-decode", daemon=True)
    helper.start()
    try:
        while True:
            chunk, (members, lines, nbytes, problems), exc = q.get()
            stats.members += members
            stats.drop(lines, nbytes)
            stats.problems.extend(problems)
            if exc is not None:
                raise exc
            if chunk is None:
                return
            yield chunk
    finally:
        stop.set()
        while helper.is_alive():  # unblock a helper waiting to put
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        helper.join()


def text_chunks(
    data: bytes | PlainFile, stats: _Stats, slabs: Slabs | None = None
) -> Iterable[tuple[list[Piece], bool, bool]]:
    """Yield (text, damaged_after, cut) chunks of decoded text of about ``CHUNK_BYTES``,
    each a list of pieces of the decoder's output (in ``slabs`` when given; never copied
    here).

    Chunks end on a newline except the last one before a damage point (then
    ``damaged_after`` is True and its tail is a partial line) or at the end of input.
    ``cut`` is True for a chunk ended because it reached the size (more may follow).
    A line longer than :data:`_MAX_LINE_BYTES` (no trace event is; a file of NUL bytes or
    other garbage has one) is dropped and counted as it streams by, never held: memory
    stays bounded by the chunk size, whatever the file holds.
    """
    pending: list[Piece] = []
    size = 0
    skipping = False  # inside an over-long line: drop until its newline
    for buf, lo, hi, damage in _decoded_spans(data, stats, slabs):
        if skipping and hi > lo:
            k = buf.find(b"\n", lo, hi)
            stats.drop(0, (hi if k < 0 else k + 1) - lo)
            if k < 0:
                if damage:
                    skipping = False
                continue
            skipping, lo = False, k + 1
        if hi > lo:
            if pending and pending[-1][0] is buf and pending[-1][2] == lo:  # continues in a slab
                pending[-1] = (buf, pending[-1][1], hi)
            else:
                pending.append((buf, lo, hi))
            size += hi - lo
        if damage:
            if pending:
                if slabs is not None:
                    slabs.seal([])
                yield pending, True, False
            pending, size = [], 0
        elif size >= CHUNK_BYTES:
            # cut after the last newline, found from the end
            j, k = len(pending) - 1, -1
            while j >= 0 and (k := pending[j][0].rfind(b"\n", pending[j][1], pending[j][2])) < 0:
                j -= 1
            if j >= 0:
                b, lo, hi = pending[j]
                chunk = [*pending[:j], (b, lo, k + 1)]
                pending = [x for x in [(b, k + 1, hi), *pending[j + 1 :]] if x[2] > x[1]]
                size = sum(x[2] - x[1] for x in pending)
                if slabs is not None:
                    slabs.seal(
                        pending
                    )  # (before the chunk goes: its parser may release it at once)
                yield chunk, False, True
                del chunk
            if size > _MAX_LINE_BYTES:  # what is left is one unfinished line, already too long
                stats.drop(1, size)
                stats.problems.append(
                    f"dropped a line longer than {_MAX_LINE_BYTES >> 20} MiB (no trace event is; "
                    f"garbage such as NUL bytes)"
                )
                pending, size, skipping = [], 0, True
    if pending:
        if slabs is not None:
            slabs.seal([])
        yield pending, False, False
