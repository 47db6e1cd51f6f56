"""Build of the optional C scanner (``dlreplay.analyze.trace._pfwscan``); metadata is in pyproject.toml.

The extension is optional: when it does not compile, the install still succeeds and the
trace loader uses its Python/polars parser (same results, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dlreplay.analyze.trace._pfwscan",
            sources=["analyze/trace/_pfwscan.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-declaration-after-statement"],
            optional=True,
        )
    ],
)
