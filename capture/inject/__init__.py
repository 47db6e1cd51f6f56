"""What ``dlreplay capture`` places on a job's ``PYTHONPATH`` (``sitecustomize`` and the hooks
it installs). In the job these are top-level modules (``hooks.py`` is copied there as
``_dlreplay_hooks``, a name no job's own module has); in dlreplay's own process the public
annotation API is reached through :mod:`dlreplay.capture`."""

from .hooks import REGIONS, region, traced

__all__ = ["REGIONS", "region", "traced"]
