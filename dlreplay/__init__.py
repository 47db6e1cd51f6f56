"""dlreplay: trace-driven capture, distillation, replay and analysis of deep-learning I/O.

Stages live in subpackages: :mod:`dlreplay.capture`, :mod:`dlreplay.analyze`,
:mod:`dlreplay.replay`. This core package (errors, event schema) imports none of them.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

#: Environment variable through which polars' bundled jemalloc takes settings (polars
#: appends its value to its own defaults when polars is imported).
JEMALLOC_ENV = "_RJEM_MALLOC_CONF"
#: What dlreplay sets there: jemalloc's standard decay (freed pages go back to the OS after
#: about 10 s), instead of polars' 0.5 s / 1 s.
JEMALLOC_CONF = "dirty_decay_ms:10000,muzzy_decay_ms:10000"
#: Added to :data:`JEMALLOC_CONF` where the process may run on at most
#: :data:`ONE_ARENA_CORES` cores: one arena for every thread (see :func:`_polars_allocator_conf`).
ONE_ARENA = "narenas:1"
ONE_ARENA_CORES = 4


def _polars_allocator_conf() -> str:
    """:data:`JEMALLOC_CONF`, plus :data:`ONE_ARENA` where this process may use at most
    :data:`ONE_ARENA_CORES` cores.

    jemalloc gives a process 4 arenas a core (one on a single core), and each thread
    allocates from its own: memory that one thread frees (a parse thread's batches, the
    main thread's parts) is not reused by another (polars' pool, which builds the next
    columns), which faults in new pages instead. On a few cores the threads outnumber the
    cores anyway and one arena serves them all: loading the 9-file ingest benchmark trace
    on 2 cores peaked at 165 bytes an event instead of 176, with 9-12 k fewer page faults,
    and took 0-2.7 % less time (seven interleaved sittings of 6-12 runs; within this VM's
    noise); the single-file trace, the same time and peak (on 1 core nothing changes: one
    arena is the default). Not set on more cores, where threads that allocate at once
    would wait for the one arena's locks (not measured).
    """
    try:
        cores = len(_os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = _os.cpu_count() or 1
    return JEMALLOC_CONF + ("," + ONE_ARENA if cores <= ONE_ARENA_CORES else "")


def _tune_polars_allocator() -> bool:
    """Set :data:`JEMALLOC_CONF` (:func:`_polars_allocator_conf`) for polars, unless polars
    is already imported or the user set :data:`JEMALLOC_ENV`; True when set.

    Loading a trace builds, frees and rebuilds column buffers of hundreds of MB within a
    second or two. With polars' short decay the freed pages went back to the OS at once
    and every reuse faulted them in again: 470k minor page faults and about a fifth of
    the CPU time of loading a 2.1 M-event trace (``benchmarks/ingest.py``; 140-160k with
    this setting, peak RSS about 7 % higher). Processes that import polars first keep
    polars' setting (results are the same, only slower). ``dlreplay capture`` removes the
    variable from the traced job's environment when dlreplay set it.
    """
    if "polars" in _sys.modules or JEMALLOC_ENV in _os.environ:
        return False
    _os.environ[JEMALLOC_ENV] = _polars_allocator_conf()
    return True


#: True when :func:`_tune_polars_allocator` set the variable in this process.
JEMALLOC_SET_BY_DLREPLAY = _tune_polars_allocator()


#: Environment variable that sets how many threads numpy's OpenBLAS starts.
BLAS_ENV = "OPENBLAS_NUM_THREADS"


def _one_blas_thread() -> bool:
    """Set :data:`BLAS_ENV` to 1 unless numpy is already imported or the user set it; True
    when set.

    numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins for
    work for about 70 ms before it sleeps. dlreplay gives it none (no matrix products:
    polars, the C passes and SHA-256 for host CPU do the work). On 2 cores the import cost
    0.13 s of CPU instead of 0.06, and ``dlreplay analyze`` of a small trace 0.58 s instead
    of 0.55 (0.58 s of user CPU against 0.47). Each spawned replay worker and Dask worker
    imports numpy again and pays the same, once per spinning thread.
    ``dlreplay capture`` removes the variable from the traced job's environment when
    dlreplay set it: the job's numpy keeps its own threads.
    """
    if "numpy" in _sys.modules or BLAS_ENV in _os.environ:
        return False
    _os.environ[BLAS_ENV] = "1"
    return True


#: True when :func:`_one_blas_thread` set the variable in this process.
BLAS_SET_BY_DLREPLAY = _one_blas_thread()
