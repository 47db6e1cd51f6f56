"""Host CPU of the training step: what the job's compute took from the host's cores.

A step's compute runs somewhere: on an accelerator, the training process mostly waits
(little host CPU: launching kernels, the optimizer's bookkeeping); on a CPU-trained model
it runs on the host's cores, in the training process and torch's intra-op threads, and
takes them from the DataLoader workers. DLIO replaces the step by a sleep, which is the
accelerator case. ``train.computation_host_cpu`` (CPU seconds per step, measured by
``dlreplay capture``) and ``train.computation_host_threads`` say how much of the host the
job's step used; :class:`HostCpu` spends it: ``threads`` threads each run a GIL-free
busy loop (SHA-256 over a buffer: ``hashlib`` releases the GIL for buffers over 2 KiB,
so the training process's other threads, which hand index lists to the DataLoader's
workers, keep running as they do beside torch's kernels) until its own CPU clock
(``CLOCK_THREAD_CPUTIME_ID``) has advanced by its share. The engine then sleeps the rest
of the step's compute time. The step's wall time is the model's: the CPU work stops at
the end of the step's compute time even when it has not spent all its seconds (a host
busier than the job's was gives it less; ``metrics.json`` reports the CPU spent beside
the modelled). Letting it run on stretched the steps of the jobs whose workers compete
for the cores beyond their measured wall time (the job's step time holds that
competition already), and raised the replay's AU.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time

#: Bytes hashed per round of the busy loop (tens of microseconds; the GIL is free meanwhile).
_CHUNK = bytes(32 << 10)


def burn(seconds: float, deadline: float | None = None) -> float:
    """Spend *seconds* of the calling thread's CPU time; returns the CPU seconds spent
    (at least *seconds*: the loop stops at the first check past it), less when the wall
    clock (``time.perf_counter``) reaches *deadline* first."""
    if seconds <= 0:
        return 0.0
    clock = time.thread_time
    start = clock()
    goal = start + seconds
    now = start
    chunk = _CHUNK
    wall = time.perf_counter
    end = float("inf") if deadline is None else deadline
    while now < goal and wall() < end:
        hashlib.sha256(chunk)
        now = clock()
    return now - start


class HostCpu:
    """Spends CPU seconds in ``threads`` threads at once: the calling thread and
    ``threads - 1`` helpers (daemon threads, started on first use, stopped by :meth:`close`)."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = max(1, int(threads))
        self._tasks: list[queue.SimpleQueue[tuple[float, float | None] | None]] = []
        self._done: queue.SimpleQueue[float] = queue.SimpleQueue()
        self._helpers: list[threading.Thread] = []

    def _start(self) -> None:
        for i in range(self.threads - 1):
            q: queue.SimpleQueue[tuple[float, float | None] | None] = queue.SimpleQueue()
            t = threading.Thread(
                target=self._helper, args=(q,), name=f"dlreplay-host-cpu-{i + 1}", daemon=True
            )
            t.start()
            self._tasks.append(q)
            self._helpers.append(t)

    def _helper(self, tasks: queue.SimpleQueue[tuple[float, float | None] | None]) -> None:
        while True:
            task = tasks.get()
            if task is None:
                return
            self._done.put(burn(*task))

    def spend(self, seconds: float, deadline: float | None = None) -> float:
        """Spend *seconds* of CPU time, all threads together, split evenly over the threads;
        returns the CPU seconds spent (by the threads' own CPU clocks): less when the wall
        clock (``time.perf_counter``) reaches *deadline* first."""
        if seconds <= 0:
            return 0.0
        if self.threads > 1 and not self._helpers:
            self._start()
        share = seconds / self.threads
        for q in self._tasks:
            q.put((share, deadline))
        spent = burn(share, deadline)
        for _ in self._tasks:
            spent += self._done.get()
        return spent

    def close(self) -> None:
        """Stop the helper threads."""
        for q in self._tasks:
            q.put(None)
        for t in self._helpers:
            t.join(5.0)
        self._tasks.clear()
        self._helpers.clear()
