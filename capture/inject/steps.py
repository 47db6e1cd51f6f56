"""Training-step hooks injected into a captured job: the steps and compute of a PyTorch loop
that reads its own data (no ``DataLoader``), as DFTracer AI-convention events.

A hook family of :mod:`capture.inject.hooks` (see its ``EXTENSIONS``): in the job this file is
the top-level module ``_dlreplay_steps``. Self-contained like the core: imports nothing of
dlreplay but the core hooks module.

=============  ===========  =================================================================
cat            name         meaning (args)
=============  ===========  =================================================================
compute        compute      one training step's compute: from the first forward of a module
                            with autograd on (no step open) to the end of the optimizer's
                            ``step()`` (``epoch`` 0, ``step``: 0-based, ``count``: 1-based);
                            as if the job had written ``with ai.compute:`` around it
compute        backward     one ``Tensor.backward()`` inside a step (``step``)
pipeline       evaluate     an evaluation pass: from ``Module.eval()`` (``train(False)``) to the
                            next ``Module.train()``, with no step open (``step``: the steps
                            before it)
=============  ===========  =================================================================

How: global hooks PyTorch offers for this (``register_module_forward_pre_hook``,
``register_optimizer_step_post_hook``), and wrappers of ``Module.train`` and ``Tensor.backward``
that call the original once with the job's arguments and return its result. The time between
one step's end and the next step's first forward is the loop's data time (``get_batch``).

Not in ``DataLoader`` jobs: while a DataLoader epoch is open in the process its hooks mark the
steps (``fetch.iter``/``fetch.block``), and these hooks write nothing (no step counted twice).
Only the process's main thread is followed (a training loop's thread). Regions still open at
the process's end are closed then.
"""

from __future__ import annotations

import atexit
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


class _Loop:
    """The process's loop state: the open step and evaluation regions, the steps so far."""

    __slots__ = ("step", "compute", "evaluate", "main", "exit_registered")

    def __init__(self) -> None:
        self.step = 0
        self.compute: int | None = None
        self.evaluate: int | None = None
        self.main = threading.main_thread().ident
        self.exit_registered = False

    def after_fork(self) -> None:
        """A forked child (a worker) has no loop of its own open."""
        self.__init__()  # type: ignore[misc]


LOOP = _Loop()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=LOOP.after_fork)


def _loader_open() -> bool:
    """Whether a DataLoader epoch is open in this process: its hooks mark the steps then."""
    # the core's list of DataLoader iterations (its own state; read, never changed)
    # (newest last: an open epoch is found at once, however many epochs came before)
    states = getattr(core, "_open_iters", ())
    return any(not getattr(s, "done", True) for s in reversed(states))


def _followed() -> bool:
    return threading.get_ident() == LOOP.main and not _loader_open()


def _ensure_exit() -> None:
    if not LOOP.exit_registered:
        LOOP.exit_registered = True
        atexit.register(close_open)


def _begin_step() -> None:
    """A forward with autograd on: the step's compute begins (unless one is open)."""
    if LOOP.compute is not None or LOOP.evaluate is not None:
        return
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled() or not _followed():
        return
    _ensure_exit()
    LOOP.compute = core.REGIONS.begin(
        "compute", "compute", epoch=0, step=LOOP.step, count=LOOP.step + 1
    )


def _end_step() -> None:
    """The optimizer stepped: the step's compute ends."""
    if LOOP.compute is None or threading.get_ident() != LOOP.main:
        return
    handle, LOOP.compute = LOOP.compute, None
    core.REGIONS.end(handle)
    LOOP.step += 1


def _forward_pre_hook(module: Any, args: Any) -> None:
    if LOOP.compute is None:  # the hot path: one attribute read per module call
        core.guard("Module.forward", _begin_step)
    return None


def _step_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    core.guard("Optimizer.step", _end_step)


def _switch(mode: bool) -> None:
    """``Module.train(mode)``: ``eval()`` opens an evaluation pass, ``train()`` closes it."""
    if threading.get_ident() != LOOP.main:
        return
    if not mode and LOOP.evaluate is None and LOOP.compute is None and not _loader_open():
        _ensure_exit()
        LOOP.evaluate = core.REGIONS.begin("evaluate", "pipeline", epoch=0, step=LOOP.step)
    elif mode and LOOP.evaluate is not None:
        handle, LOOP.evaluate = LOOP.evaluate, None
        core.REGIONS.end(handle)


def _wrap_train(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def train(self: Any, mode: bool = True) -> Any:
        core.guard("Module.train", _switch, bool(mode) if isinstance(mode, bool) else True)
        return orig(self, mode)

    return train


def _wrap_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        handle = None
        if LOOP.compute is not None:
            handle = core.guard(
                "Tensor.backward",
                lambda: core.REGIONS.begin("backward", "compute", epoch=0, step=LOOP.step),
            )
        try:
            return orig(self, *args, **kwargs)
        finally:
            core.guard("Tensor.backward", core.REGIONS.end, handle)

    return backward


def _patch_module(mod: Any) -> None:
    cls = mod.Module
    if getattr(cls, "_dlreplay_steps", False):
        return
    mod.register_module_forward_pre_hook(_forward_pre_hook)
    cls.train = _wrap_train(cls.train)
    cls._dlreplay_steps = True


def _patch_optimizer(mod: Any) -> None:
    if getattr(mod, "_dlreplay_steps", False):
        return
    mod.register_optimizer_step_post_hook(_step_post_hook)
    mod._dlreplay_steps = True


def _patch_tensor(mod: Any) -> None:
    cls = mod.Tensor
    if getattr(cls, "_dlreplay_steps", False):
        return
    cls.backward = _wrap_backward(cls.backward)
    cls._dlreplay_steps = True


def close_open() -> None:
    """Close the step or evaluation still open (the process ends)."""
    for attr in ("compute", "evaluate"):
        handle = getattr(LOOP, attr)
        setattr(LOOP, attr, None)
        core.guard("exit", core.REGIONS.end, handle)


core.add_patch("torch.nn.modules.module", _patch_module)
core.add_patch("torch.optim.optimizer", _patch_optimizer)
core.add_patch("torch._tensor", _patch_tensor)
