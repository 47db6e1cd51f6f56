"""dlreplay: trace-driven capture, distillation, replay and analysis of deep-learning I/O.

Stages live in subpackages: :mod:`dlreplay.capture`, :mod:`dlreplay.analyze`,
:mod:`dlreplay.replay`. This core package (errors, event schema) imports none of them.

Importing dlreplay changes nothing in the process. The work that loads traces starts with
:func:`prepare_process` (the command line's ``main()`` calls it first), which sets the two
environment variables below for the libraries that read them once, when they load.
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

#: Environment variable that sets how many threads numpy's OpenBLAS starts.
BLAS_ENV = "OPENBLAS_NUM_THREADS"

#: True once :func:`prepare_process` has set :data:`JEMALLOC_ENV` in this process
#: (``dlreplay capture`` then removes it from the traced job's environment).
JEMALLOC_SET_BY_DLREPLAY = False
#: True once :func:`prepare_process` has set :data:`BLAS_ENV` in this process.
BLAS_SET_BY_DLREPLAY = False


def _polars_allocator_conf() -> str:
    """:data:`JEMALLOC_CONF`, plus :data:`ONE_ARENA` where this process may use at most
    :data:`ONE_ARENA_CORES` cores.

    jemalloc gives a process 4 arenas a core (one on a single core), and each thread
    allocates from its own: memory that one thread frees (a parse thread's batches, the
    main thread's parts) is not reused by another (polars' pool, which builds the next
    columns), which faults in new pages instead. On a few cores the threads outnumber the
    cores anyway and one arena serves them all, with a lower peak and fewer page faults
    (measured on the ingest benchmark: ``benchmarks/RESULTS.md``). Not set on more cores,
    where threads that allocate at once would wait for the one arena's locks.
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
    and every reuse faulted them in again, a large share of a load's CPU time
    (``benchmarks/ingest.py``; the price is a slightly higher peak RSS). Processes that
    import polars first keep polars' setting (results are the same, only slower).
    """
    if "polars" in _sys.modules or JEMALLOC_ENV in _os.environ:
        return False
    _os.environ[JEMALLOC_ENV] = _polars_allocator_conf()
    return True


def _one_blas_thread() -> bool:
    """Set :data:`BLAS_ENV` to 1 unless numpy is already imported or the user set it; True
    when set.

    numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins for
    work for a while before it sleeps. dlreplay gives it none (no matrix products:
    polars, the C passes and SHA-256 for host CPU do the work), so the spinning only costs
    CPU, in this process and again in each spawned replay worker and Dask worker.
    """
    if "numpy" in _sys.modules or BLAS_ENV in _os.environ:
        return False
    _os.environ[BLAS_ENV] = "1"
    return True


def prepare_process() -> None:
    """Set up this process for dlreplay's work: polars' allocator settings
    (:data:`JEMALLOC_ENV`) and one OpenBLAS thread (:data:`BLAS_ENV`).

    Both are read once, when polars or numpy is first imported, so call this before either
    is (the command line's ``main()`` does, first thing; a script that loads traces does
    before it imports polars, numpy or a stage of dlreplay). A user's own value of either
    variable is kept, and so is the setting of a library imported already. Processes this
    one starts inherit the settings, except the job ``dlreplay capture`` traces: it gets
    the environment as the user set it. Calling it again changes nothing.
    """
    global JEMALLOC_SET_BY_DLREPLAY, BLAS_SET_BY_DLREPLAY
    JEMALLOC_SET_BY_DLREPLAY = _tune_polars_allocator() or JEMALLOC_SET_BY_DLREPLAY
    BLAS_SET_BY_DLREPLAY = _one_blas_thread() or BLAS_SET_BY_DLREPLAY
