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
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    for entry in rest:
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_dlreplay_next_sitecustomize", candidate)
            if spec and spec.loader:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


_chain()
