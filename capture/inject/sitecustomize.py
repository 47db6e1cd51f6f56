"""Placed on a captured job's PYTHONPATH by ``dlreplay capture`` (in a temporary dir).

Installs the data-loader instrumentation, then runs the ``sitecustomize`` that the
job would have run without us (if any), so user site customisation still happens.
"""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))

try:
    import _dlreplay_hooks

    _dlreplay_hooks.install()
except Exception as _exc:  # never break the user's job
    print(f"dlreplay: data-loader instrumentation disabled: {_exc}", file=sys.stderr)


def _chain() -> None:
    """Run the job's own ``sitecustomize`` once, as Python would have: the first one on
    ``sys.path`` that is not a dlreplay copy (captures nest: ``dlreplay capture -- dlreplay
    replay`` puts two on the path), imported under its own name ``sitecustomize``."""
    if getattr(sys, "_dlreplay_sitecustomize_chained", False):
        return
    sys._dlreplay_sitecustomize_chained = True  # type: ignore[attr-defined]
    ours = sys.modules.get("sitecustomize")
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder == _here or os.path.isfile(os.path.join(folder, "_dlreplay_hooks.py")):
            continue  # a dlreplay copy (this one, or an outer capture's)
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("sitecustomize", candidate)
            if spec and spec.loader:
                module = importlib.util.module_from_spec(spec)
                sys.modules["sitecustomize"] = (
                    module  # `import sitecustomize` gives the job its own
                )
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    sys.modules["sitecustomize"] = ours  # type: ignore[assignment]
                    raise
            return


_chain()
