"""Build of the optional C extensions; metadata is in pyproject.toml.

``dlreplay.analyze.trace._pfwscan`` (the trace scanner) and ``dlreplay.analyze._kernels`` (the
analysis passes' per-event loops) are optional: when they do not compile, the install still
succeeds and the loader and passes use their Python/polars code (same results, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dlreplay.analyze.trace._pfwscan",
            sources=["analyze/trace/_pfwscan.c"],
            depends=["analyze/_pybuf.h"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-declaration-after-statement"],
            optional=True,
        ),
        Extension(
            "dlreplay.analyze._kernels",
            sources=["analyze/_kernels.c"],
            depends=["analyze/_pybuf.h"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-declaration-after-statement"],
            optional=True,
        ),
    ],
)
