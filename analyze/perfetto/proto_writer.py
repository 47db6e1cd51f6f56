"""The native Perfetto timeline (``.perfetto-trace``/``.pftrace``): ``TrackEvent`` packets on
one sequence, with interned strings, written in chunks of :data:`~.slices.CHUNK_ROWS`
events. Times are nanoseconds (the event table's microseconds x 1000).

Imported only when a native timeline is written (the protobuf classes take a while to
load).
"""

from __future__ import annotations

from typing import IO, Any

import polars as pl
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    CounterDescriptor,
    Trace,
    TrackEvent,
)
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from .counters import bandwidth, in_flight
from .slices import CHUNK_ROWS, Sweep, close_all, event_chunks, nest, slice_args, sorted_for_nesting
from .stats import ExportStats
from .tracks import Layout

__all__ = ["write_proto"]

_SEQ = 1  # the one trusted packet sequence
_CLEARED = 1  # TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_NEEDS = 2  # TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
#: The counter tracks: name, unit.
_COUNTERS = (("read bandwidth (MB/s)", "MB/s"), ("reads in flight", "reads"))

FlowIds = dict[tuple[int, int, int], list[int]]


def write_proto(
    fh: IO[bytes],
    events: pl.DataFrame,
    layout: Layout,
    stats: ExportStats,
    flow_table: pl.DataFrame | None,
) -> None:
    """Write the timeline to ``fh``: track descriptors, slices (with flows), then counters."""
    uuid, counter_uuid = _describe_tracks(StreamingTraceProtoBuilder(fh), layout)
    flow_out: FlowIds = {}
    flow_in: FlowIds = {}
    if flow_table is not None:
        for n, (sp, st, sts, dp, dt, dts) in enumerate(flow_table.iter_rows(), start=1):
            flow_out.setdefault((sp, st, sts), []).append(n)
            flow_in.setdefault((dp, dt, dts), []).append(n)
        stats.flows = flow_table.height
    _SliceWriter(fh, uuid, flow_out, flow_in).write(events, stats)
    _write_counters(fh, events, counter_uuid, stats)


def _describe_tracks(
    builder: Any, layout: Layout
) -> tuple[dict[tuple[int, int], int], dict[str, int]]:
    """Track descriptors: processes, threads, counters (uuids are small positive ints).

    Returns the uuid of each process (``(pid, -1)``) and thread (``(pid, tid)``), and of
    each counter track by name.
    """
    uuid: dict[tuple[int, int], int] = {}
    next_uuid = 1
    for pid, name in layout.process_names.items():
        p = builder.create_packet()
        p.trusted_packet_sequence_id = _SEQ
        if next_uuid == 1:
            p.first_packet_on_sequence = True
            p.sequence_flags = _CLEARED
        p.track_descriptor.uuid = next_uuid
        p.track_descriptor.process.pid = pid
        p.track_descriptor.process.process_name = name
        builder.write_packet(p)
        uuid[(pid, -1)] = next_uuid
        next_uuid += 1
    for (pid, tid), name in layout.thread_names.items():
        p = builder.create_packet()
        p.trusted_packet_sequence_id = _SEQ
        p.track_descriptor.uuid = next_uuid
        p.track_descriptor.parent_uuid = uuid[(pid, -1)]
        p.track_descriptor.thread.pid = pid
        p.track_descriptor.thread.tid = tid
        p.track_descriptor.thread.thread_name = name
        builder.write_packet(p)
        uuid[(pid, tid)] = next_uuid
        next_uuid += 1
    counter_uuid: dict[str, int] = {}
    for track, unit in _COUNTERS:
        p = builder.create_packet()
        p.trusted_packet_sequence_id = _SEQ
        p.track_descriptor.uuid = next_uuid
        p.track_descriptor.name = track
        p.track_descriptor.counter.unit = CounterDescriptor.UNIT_COUNT
        p.track_descriptor.counter.unit_name = unit
        builder.write_packet(p)
        counter_uuid[track] = next_uuid
        next_uuid += 1
    return uuid, counter_uuid


class _Interner:
    """Interning tables (per sequence; new entries ride on the packet that first uses them)."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, int]] = {"name": {}, "cat": {}, "arg": {}, "str": {}}

    def iid(self, kind: str, value: str, packet: Any) -> int:
        table = self.tables[kind]
        got = table.get(value)
        if got is not None:
            return got
        got = len(table) + 1
        table[value] = got
        idata = packet.interned_data
        entry = {
            "name": idata.event_names,
            "cat": idata.event_categories,
            "arg": idata.debug_annotation_names,
            "str": idata.debug_annotation_string_values,
        }[kind].add()
        entry.iid = got
        if kind == "str":
            entry.str = value.encode("utf-8", "surrogateescape")
        else:
            entry.name = value
        return got


class _SliceWriter:
    """Every event as a begin/end pair on its thread's track, clipped to nest in its parent;
    the flow ids ride on the slices they start from or end at (keyed by pid, tid, ts)."""

    def __init__(
        self, fh: IO[bytes], uuid: dict[tuple[int, int], int], flow_out: FlowIds, flow_in: FlowIds
    ) -> None:
        self.fh = fh
        self.uuid = uuid
        self.flow_out = flow_out
        self.flow_in = flow_in
        self.interner = _Interner()
        self.ends: list[tuple[int, int, int]] = []

    def write(self, events: pl.DataFrame, stats: ExportStats) -> None:
        sweep = Sweep()
        ends = self.ends
        for chunk in event_chunks(sorted_for_nesting(events)):
            trace = Trace()
            pid_c, tid_c, ts_c, dur_c = (chunk[c] for c in ("pid", "tid", "ts", "dur"))
            for i in range(len(ts_c)):
                pid, tid, ts = pid_c[i], tid_c[i], ts_c[i]
                nest(sweep, pid, tid, ts, dur_c[i], ends)
                if ends:
                    self._write_ends(trace)
                self._begin(trace, chunk, i)
            stats.slices += len(ts_c)
            self.fh.write(trace.SerializeToString())
        close_all(sweep, ends)
        if ends:
            trace = Trace()
            self._write_ends(trace)
            self.fh.write(trace.SerializeToString())
        stats.clipped = sweep.clipped

    def _write_ends(self, trace: Any) -> None:
        for end_ts, epid, etid in self.ends:
            q = trace.packet.add()
            q.timestamp = end_ts * 1000
            q.trusted_packet_sequence_id = _SEQ
            q.sequence_flags = _NEEDS
            q.track_event.type = TrackEvent.TYPE_SLICE_END
            q.track_event.track_uuid = self.uuid[(epid, etid)]
        self.ends.clear()

    def _begin(self, trace: Any, chunk: dict[str, list[Any]], i: int) -> None:
        """The slice-begin packet of row ``i`` of ``chunk``, with its args and flow ids."""
        pid, tid, ts = chunk["pid"][i], chunk["tid"][i], chunk["ts"][i]
        iid = self.interner.iid
        p = trace.packet.add()
        p.timestamp = ts * 1000
        p.trusted_packet_sequence_id = _SEQ
        p.sequence_flags = _NEEDS
        te = p.track_event
        te.type = TrackEvent.TYPE_SLICE_BEGIN
        te.track_uuid = self.uuid[(pid, tid)]
        te.name_iid = iid("name", chunk["name"][i] or "", p)
        te.category_iids.append(iid("cat", chunk["cat"][i] or "", p))
        for key, value in slice_args(chunk, i):
            a = te.debug_annotations.add()
            a.name_iid = iid("arg", key, p)
            if isinstance(value, str):
                a.string_value_iid = iid("str", value, p)
            else:
                a.int_value = value
        if self.flow_out or self.flow_in:
            k = (pid, tid, ts)
            if k in self.flow_out:
                te.flow_ids.extend(self.flow_out[k])
            if k in self.flow_in:
                te.terminating_flow_ids.extend(self.flow_in[k])


def _write_counters(
    fh: IO[bytes], events: pl.DataFrame, counter_uuid: dict[str, int], stats: ExportStats
) -> None:
    """The counter tracks' values, a packet per change."""
    for track, table in (
        ("read bandwidth (MB/s)", bandwidth(events)),
        ("reads in flight", in_flight(events)),
    ):
        for part in table.iter_slices(CHUNK_ROWS):
            trace = Trace()
            for t, v in part.iter_rows():
                q = trace.packet.add()
                q.timestamp = t * 1000
                q.trusted_packet_sequence_id = _SEQ
                q.sequence_flags = _NEEDS
                q.track_event.type = TrackEvent.TYPE_COUNTER
                q.track_event.track_uuid = counter_uuid[track]
                q.track_event.double_counter_value = v
            stats.counter_points += part.height
            fh.write(trace.SerializeToString())
