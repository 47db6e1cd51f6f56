"""torch.distributed hooks injected into a captured job: each rank process's rank, and its
collectives' time, as DFTracer ``comm`` events (DFTracer's AI logging conventions,
``dftracer.python.ai``: ``ai.comm.all_reduce``, ``ai.comm.barrier``, ...).

A hook family of :mod:`capture.inject.hooks` (see its ``EXTENSIONS``): in the job this file is
the top-level module ``_dlreplay_distributed``, in dlreplay's own process
``dlreplay.capture.inject.distributed``. Self-contained like the core: imports nothing of
dlreplay but the core hooks module. Every hook calls the original exactly once with the job's
arguments and returns its result or raises its exception; what it cannot record is a miss.

=============  ====================================  ==========================================
cat            name                                  meaning (args)
=============  ====================================  ==========================================
comm           ``comm.rank<R>.world<W>.init``        ``init_process_group`` in the process of
                                                     rank R of W (``rank``, ``world_size``,
                                                     ``local_rank``: the launcher's
                                                     ``LOCAL_RANK``, -1 without; ``backend``)
comm           ``all_reduce``, ``barrier``, ``bcast``  one collective call of the job, outermost
               ``reduce``, ``gather``, ``all_gather``  only (``bytes``: tensor bytes it was given,
               ``scatter``, ``reduce_scatter``,        ``async``: 1 when ``async_op=True``: the
               ``all_to_all``, ``send``, ``receive``   event is then the call, not the transfer)
=============  ====================================  ==========================================

The rank is in the init event's *name* as well as its args because the trace loader keeps a
fixed set of args (``rank`` is not one of them): the name is what every reader of the trace
sees. The init event's form ``X.init`` is DFTracer's constructor-hook form (``ai.comm.init``
derived for one rank). Processes forked from a rank (its DataLoader workers) write no init
event: a worker is never a rank. The launcher's own process (torchrun's agent) calls no
``init_process_group``: it is never a rank either.

DistributedDataParallel's gradient all-reduce runs in C++ autograd hooks (the reducer), not
through these functions: it is not an event; the wait it causes shows in the step's time,
across ranks (see ``analyze/passes/ranks.py``).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

try:  # dlreplay's own process: the package capture.inject
    from . import hooks as core
except ImportError:  # in the job: top-level modules beside each other
    import _dlreplay_hooks as core  # type: ignore[no-redef]

#: torch.distributed function -> DFTracer ``comm`` event name (``CommunicationEvent``).
COLLECTIVES: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "broadcast": "bcast",
    "broadcast_object_list": "bcast",
    "reduce": "reduce",
    "gather": "gather",
    "gather_object": "gather",
    "all_gather": "all_gather",
    "all_gather_object": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "scatter": "scatter",
    "scatter_object_list": "scatter",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send",
    "recv": "receive",
}

#: The module the functions live in; ``torch.distributed`` re-exports them.
C10D = "torch.distributed.distributed_c10d"

_depth = threading.local()  # collectives call each other (all_gather_object -> all_gather)


def init_name(rank: int, world: int) -> str:
    """The init event's name for rank *rank* of *world* (``comm.rank1.world2.init``)."""
    return f"comm.rank{rank}.world{world}.init"


def _tensor_bytes(obj: Any, limit: int = 1024) -> int | None:
    """Bytes of the tensors in *obj* (a tensor or a list of them); None when it holds none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    items = obj if isinstance(obj, (list, tuple)) else [obj]
    total, found = 0, False
    for t in items[:limit]:
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
            found = True
    return total if found else None


def _wrap_collective(orig: Callable[..., Any], name: str) -> Callable[..., Any]:
    """*orig* as a ``comm`` event *name* (outermost calls only), called exactly once."""
    hook = f"torch.distributed.{orig.__name__}"

    def begin(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        nbytes = _tensor_bytes(args[0]) if args else None
        asynchronous = 1 if kwargs.get("async_op") else None
        return core.REGIONS.begin(name, "comm", bytes=nbytes, **{"async": asynchronous})

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        handle = core.guard(hook, begin, args, kwargs) if depth == 0 else None
        _depth.n = depth + 1
        try:
            return orig(*args, **kwargs)
        finally:
            _depth.n = depth
            if handle is not None:
                core.guard(hook, core.REGIONS.end, handle)

    wrapper._dlreplay_orig = orig  # type: ignore[attr-defined]
    return wrapper


def _rank_args(mod: Any, backend: Any) -> tuple[str, dict[str, Any]]:
    """(the init event's name, its args) once the group is made."""
    rank, world = int(mod.get_rank()), int(mod.get_world_size())
    local = os.environ.get("LOCAL_RANK", "")
    return init_name(rank, world), {
        "rank": rank,
        "world_size": world,
        "local_rank": int(local) if local.lstrip("-").isdigit() else -1,
        "backend": str(mod.get_backend()) if backend is None else str(backend),
    }


def _wrap_init(orig: Callable[..., Any], mod: Any) -> Callable[..., Any]:
    """``init_process_group`` as the rank's init event, named once the call tells the rank."""
    hook = "torch.distributed.init_process_group"

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        region = core.guard(hook, core.REGIONS.begin_unnamed, "comm", 48)
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            if region is not None:  # no group, no rank: the event names the failed call
                core.guard(
                    hook, functools.partial(core.REGIONS.end_named, region, "comm.init", error=1)
                )
            raise
        if region is not None:
            backend = kwargs.get("backend", args[0] if args else None)
            named = core.guard(hook, _rank_args, mod, backend)
            if named is None:
                core.guard(hook, core.REGIONS.end_named, region, "comm.init")
            else:
                core.guard(
                    hook, functools.partial(core.REGIONS.end_named, region, named[0], **named[1])
                )
        return result

    wrapper._dlreplay_orig = orig  # type: ignore[attr-defined]
    return wrapper


def _patch_c10d(mod: Any) -> None:
    """Wrap the collectives and ``init_process_group`` of *mod* (and ``torch.distributed``'s
    re-exports of them, when that module is already there)."""
    if getattr(mod, "_dlreplay_patched", False):
        return
    wrapped: dict[str, Any] = {}
    for fn, event in COLLECTIVES.items():
        orig = getattr(mod, fn, None)
        if callable(orig):
            wrapped[fn] = _wrap_collective(orig, event)
    if callable(getattr(mod, "init_process_group", None)):
        wrapped["init_process_group"] = _wrap_init(mod.init_process_group, mod)
    for fn, w in wrapped.items():
        setattr(mod, fn, w)
    mod._dlreplay_patched = True
    _reexport(sys.modules.get("torch.distributed"))


def _reexport(dist: Any) -> None:
    """``torch.distributed.X`` is the c10d function it imported: point it at the wrapper."""
    mod = sys.modules.get(C10D)
    if dist is None or mod is None:
        return
    for fn in (*COLLECTIVES, "init_process_group"):
        mine = getattr(mod, fn, None)
        theirs = getattr(dist, fn, None)
        if mine is not None and getattr(mine, "_dlreplay_orig", None) is theirs:
            setattr(dist, fn, mine)


core.add_patch(C10D, _patch_c10d)
core.add_patch("torch.distributed", _reexport)
