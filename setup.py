"""Build of the optional C extensions; metadata is in pyproject.toml.

``dlreplay.analyze.trace._pfwscan`` (the trace scanner) and ``dlreplay.analyze._kernels`` (the
analysis passes' per-event loops) are optional: when they do not compile, the install still
succeeds and the loader and passes use their Python/polars code (same results, slower).
"""

from setuptools import Extension, setup


def _extension(name: str, source: str) -> Extension:
    """An optional C extension of dlreplay (with the shared buffer helper)."""
    return Extension(
        name,
        sources=[source],
        depends=["analyze/_pybuf.h"],
        optional=True,
        extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-declaration-after-statement"],
    )


setup(
    ext_modules=[
        _extension("dlreplay.analyze.trace._pfwscan", "analyze/trace/_pfwscan.c"),
        _extension("dlreplay.analyze._kernels", "analyze/_kernels.c"),
    ],
)
