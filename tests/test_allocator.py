"""dlreplay's setting for polars' allocator: applied before polars loads, never over the
user's own, never passed on to a captured job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import dlreplay

PROBE = """
import json, os, sys
first = sys.argv[1]
if first == "polars":
    import polars  # noqa: F401
import dlreplay
import polars  # noqa: F401
print(json.dumps({"set": dlreplay.JEMALLOC_SET_BY_DLREPLAY, "env": os.environ.get(dlreplay.JEMALLOC_ENV)}))
"""


def _probe(first: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != dlreplay.JEMALLOC_ENV}
    out = subprocess.run([sys.executable, "-c", PROBE, first], env={**clean, **env}, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def test_set_before_polars_loads() -> None:
    got = _probe("dlreplay")
    assert got["set"] is True
    # polars puts its defaults first and appends ours, so ours win
    assert got["env"].endswith(dlreplay.JEMALLOC_CONF) and got["env"] != dlreplay.JEMALLOC_CONF


def test_users_setting_and_an_earlier_polars_are_left_alone() -> None:
    got = _probe("dlreplay", **{dlreplay.JEMALLOC_ENV: "narenas:2"})
    assert got["set"] is False and dlreplay.JEMALLOC_CONF not in got["env"] and got["env"].endswith("narenas:2")
    got = _probe("polars")
    assert got["set"] is False and dlreplay.JEMALLOC_CONF not in got["env"]


@pytest.mark.parametrize("ours", [True, False])
def test_captured_job_does_not_inherit_it(tmp_path, monkeypatch: pytest.MonkeyPatch, ours: bool) -> None:
    from dlreplay.capture.run import CaptureConfig, build_env

    monkeypatch.setattr(dlreplay, "JEMALLOC_SET_BY_DLREPLAY", ours)
    monkeypatch.setenv(dlreplay.JEMALLOC_ENV, dlreplay.JEMALLOC_CONF)
    env = build_env(CaptureConfig(command=("true",)), tmp_path, tmp_path, tmp_path)
    assert (dlreplay.JEMALLOC_ENV in env) is not ours  # a user's own value is passed on
