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
dlreplay.prepare_process()  # what the command line does first (importing dlreplay sets nothing)
import polars  # noqa: F401
print(json.dumps({"set": dlreplay.JEMALLOC_SET_BY_DLREPLAY, "env": os.environ.get(dlreplay.JEMALLOC_ENV)}))
"""


def _probe(first: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != dlreplay.JEMALLOC_ENV}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, first],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def test_set_before_polars_loads() -> None:
    got = _probe("dlreplay")
    assert got["set"] is True
    # polars puts its defaults first and appends ours, so ours win
    assert (
        got["env"].endswith(dlreplay._polars_allocator_conf())
        and dlreplay.JEMALLOC_CONF in got["env"]
    )
    assert got["env"] != dlreplay._polars_allocator_conf()


def test_one_arena_only_on_few_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    for cores, one in (
        (1, True),
        (2, True),
        (dlreplay.ONE_ARENA_CORES, True),
        (dlreplay.ONE_ARENA_CORES + 1, False),
        (64, False),
    ):
        monkeypatch.setattr(
            os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)), raising=False
        )
        conf = dlreplay._polars_allocator_conf()
        assert conf.startswith(dlreplay.JEMALLOC_CONF)
        assert (dlreplay.ONE_ARENA in conf.split(",")) is one, (cores, conf)


def test_one_arena_leaves_the_large_blocks_arena_alone() -> None:
    """With one arena, a release between a load's steps purges it and keeps jemalloc's
    arena of large blocks (the one after the automatic arenas). On 2 cores jemalloc's
    default is 8 arenas (on 1 core it has 1 anyway): the probe runs on 2 where it can."""
    probe = (
        "import json, dlreplay; dlreplay.prepare_process(); import dlreplay.allocator as A, polars as pl; "
        "A._resolve(); "
        "print(json.dumps([A._mallctl is not None, [n.decode() for n in A._purges]]))"
    )
    clean = {k: v for k, v in os.environ.items() if k != dlreplay.JEMALLOC_ENV}
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    out = subprocess.run(
        ["taskset", "-c", cores, sys.executable, "-c", probe],
        env=clean,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found, purges = json.loads(out.stdout)
    if not found:
        pytest.skip("polars' jemalloc cannot be reached here")
    assert purges == ["arena.0.purge"]


def test_users_setting_and_an_earlier_polars_are_left_alone() -> None:
    got = _probe("dlreplay", **{dlreplay.JEMALLOC_ENV: "narenas:2"})
    assert (
        got["set"] is False
        and dlreplay.JEMALLOC_CONF not in got["env"]
        and got["env"].endswith("narenas:2")
    )
    got = _probe("polars")
    assert got["set"] is False and dlreplay.JEMALLOC_CONF not in got["env"]


@pytest.mark.parametrize("ours", [True, False])
def test_captured_job_does_not_inherit_it(
    tmp_path, monkeypatch: pytest.MonkeyPatch, ours: bool
) -> None:
    from dlreplay.capture.run import CaptureConfig, build_env

    monkeypatch.setattr(dlreplay, "JEMALLOC_SET_BY_DLREPLAY", ours)
    monkeypatch.setenv(dlreplay.JEMALLOC_ENV, dlreplay.JEMALLOC_CONF)
    env = build_env(CaptureConfig(command=("true",)), tmp_path, tmp_path, tmp_path)
    assert (dlreplay.JEMALLOC_ENV in env) is not ours  # a user's own value is passed on


BLAS_PROBE = """
import json, os, sys
if sys.argv[1] == "numpy":
    import numpy  # noqa: F401
import dlreplay
dlreplay.prepare_process()  # what the command line does first (importing dlreplay sets nothing)
import numpy  # noqa: F401
print(json.dumps({"set": dlreplay.BLAS_SET_BY_DLREPLAY, "env": os.environ.get(dlreplay.BLAS_ENV),
                  "threads": len(os.listdir("/proc/self/task"))}))
"""


def _blas_probe(first: str, **env: str) -> dict:
    # OpenBLAS also takes its thread count from GOTO_NUM_THREADS and OMP_NUM_THREADS (which a
    # CI image may set): none of them is passed on, so numpy imported first starts its own
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in (dlreplay.BLAS_ENV, "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    }
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    out = subprocess.run(
        ["taskset", "-c", cores, sys.executable, "-c", BLAS_PROBE, first],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def test_numpy_gets_one_blas_thread() -> None:
    """numpy imported after dlreplay starts no OpenBLAS threads (each spun ~70 ms of CPU at
    import); imported first, or with the user's own setting, it keeps its own (on 2 cores
    where the machine has them: one more thread)."""
    ours = _blas_probe("dlreplay")
    assert ours["set"] is True and ours["env"] == "1"
    users = _blas_probe("dlreplay", **{dlreplay.BLAS_ENV: "3"})
    assert users["set"] is False and users["env"] == "3"
    first = _blas_probe("numpy")
    assert first["set"] is False and first["env"] is None
    if len(os.sched_getaffinity(0)) >= 2:
        assert first["threads"] == 2 and ours["threads"] == 1, (first, ours)


@pytest.mark.parametrize("ours", [True, False])
def test_captured_job_keeps_its_blas_threads(
    tmp_path, monkeypatch: pytest.MonkeyPatch, ours: bool
) -> None:
    from dlreplay.capture.run import CaptureConfig, build_env

    monkeypatch.setattr(dlreplay, "BLAS_SET_BY_DLREPLAY", ours)
    monkeypatch.setenv(dlreplay.BLAS_ENV, "1")
    env = build_env(CaptureConfig(command=("true",)), tmp_path, tmp_path, tmp_path)
    assert (dlreplay.BLAS_ENV in env) is not ours  # a user's own value is passed on


RELEASE_PROBE = """
import json, sys
import dlreplay.allocator as A
import polars as pl

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096

cols = [pl.int_range(0, 100_000 + i, eager=True) * 2 for i in range(400)]  # ~320 MB in jemalloc's small classes
held = rss()
del cols
freed = rss()
A.release_free_memory()
print(json.dumps({"available": A.releaser_available(), "held": held, "freed": freed, "released": rss()}))
"""


LARGE_PROBE = """
import json, sys
import dlreplay.allocator as A
import polars as pl

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096

def freed_columns():
    cols = [pl.int_range(0, 3_000_000 + i, eager=True) * 2 for i in range(12)]  # 24 MB each: ~290 MB
    held = rss()
    del cols
    return held

out = {}
held = freed_columns()
A.release_free_memory(keep_large=True)
out["kept"] = (held, rss())
held = freed_columns()  # built again in the kept pages
out["reused"] = (held, rss())
A.release_free_memory()
out["released"] = rss()
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc and polars' jemalloc on Linux"
)
def test_between_steps_the_arena_of_large_blocks_is_kept() -> None:
    """Whole columns (blocks of 8 MiB and more) live in one jemalloc arena that every thread
    shares: between the steps of a load it is not purged, so the next step builds its
    columns in those pages instead of faulting new ones; at a stage's end it is."""
    env = {**os.environ, dlreplay.JEMALLOC_ENV: "dirty_decay_ms:-1,muzzy_decay_ms:-1"}
    out = subprocess.run(
        [sys.executable, "-c", LARGE_PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    got = json.loads(out.stdout)
    held, kept = got["kept"]
    assert kept > held - (50 << 20)  # the 290 MB stayed
    held2, after = got["reused"]
    assert held2 < held + (50 << 20)  # and were used again, not added to
    assert got["released"] < after - (200 << 20)


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc and polars' jemalloc on Linux"
)
@pytest.mark.parametrize("setting", ["1", "0"])
def test_release_free_memory_returns_polars_pages(setting: str) -> None:
    """Columns polars freed stay resident until purged (as with dlreplay's 10 s decay, here
    with decay off so that no purge depends on how long the probe takes on a loaded machine):
    the release hands them back (found through the runtime library's symbol table), unless
    turned off."""
    from dlreplay.allocator import RELEASE_ENV

    env = {
        **os.environ,
        dlreplay.JEMALLOC_ENV: "dirty_decay_ms:-1,muzzy_decay_ms:-1",
        RELEASE_ENV: setting,
    }
    out = subprocess.run(
        [sys.executable, "-c", RELEASE_PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    got = json.loads(out.stdout)
    assert got["available"] == [True, True]
    assert got["freed"] > got["held"] - (100 << 20)  # the decay kept them
    if setting == "1":
        assert got["released"] < got["freed"] - (200 << 20)
    else:
        assert got["released"] > got["freed"] - (50 << 20)


def test_symbol_lookup_refuses_what_is_not_elf(tmp_path) -> None:
    from dlreplay.allocator import _symbols

    junk = tmp_path / "lib.so"
    junk.write_bytes(b"not an ELF file" * 100)
    assert _symbols(str(junk), (b"_rjem_mallctl",)) == {}
    junk.write_bytes(
        b"\x7fELF\x02\x01" + b"\0" * 200
    )  # a header whose section table is out of the file
    assert _symbols(str(junk), (b"_rjem_mallctl",)) == {}


def test_finding_mallctl_survives_a_held_view_of_the_symbol_table(monkeypatch) -> None:
    """Dask's workers sample their threads' stacks: a frame of ``np.isin`` held by the
    profiler keeps its arguments alive after the call. The symbol lookup must not hand it a
    view of the library's mapping, whose close then raised BufferError ("cannot close
    exported pointers exist") inside a worker's first release of memory (seen as an
    intermittent failure of ``analyze --workers 2``)."""
    import sys

    import numpy as np
    import polars  # noqa: F401

    from dlreplay import allocator

    path = getattr(sys.modules.get("polars._plr"), "__file__", None)
    if not path or not path.endswith(".so") or not sys.platform.startswith("linux"):
        pytest.skip("polars' runtime is not an ELF shared library here")
    held = []
    real_isin = np.isin

    def isin(a, *args, **kwargs):
        held.append(a)  # what a profiler's frame reference does
        return real_isin(a, *args, **kwargs)

    monkeypatch.setattr(allocator.np, "isin", isin)
    found = allocator._symbols(path, (b"_rjem_mallctl",))
    assert held and b"_rjem_mallctl" in found


def _runtime_library() -> str:
    import polars  # noqa: F401

    path = getattr(sys.modules.get("polars._plr"), "__file__", None)
    if not path or not path.endswith(".so") or not sys.platform.startswith("linux"):
        pytest.skip("polars' runtime is not an ELF shared library here")
    return path


def test_found_symbols_are_kept_per_library_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Searching the runtime's 40 MB symbol table cost every process 50-110 ms; what it found is
    kept in the cache directory by library file and used, without the search, by the next."""
    from dlreplay import allocator

    path = _runtime_library()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert allocator._find_mallctl() is not None
    kept = json.loads((tmp_path / "dlreplay" / "jemalloc-symbols.json").read_text())
    assert list(kept) == [allocator._file_key(path)]
    assert set(kept[allocator._file_key(path)]) == {"_rjem_mallctl", "PyInit__polars_runtime"}
    real = allocator._symbols

    def no_search(path, wanted, at=None):
        assert at is not None, "the symbol table was searched although where to look was kept"
        return real(path, wanted, at)

    monkeypatch.setattr(allocator, "_symbols", no_search)
    assert allocator._find_mallctl() is not None
    assert real(
        path,
        allocator._WANTED,
        {b"_rjem_mallctl": kept[allocator._file_key(path)]["_rjem_mallctl"]},
    ) == {b"_rjem_mallctl": real(path, allocator._WANTED)[b"_rjem_mallctl"]}


@pytest.mark.parametrize("kept", ["garbage", "another symbol", "out of the table", "empty entry"])
def test_a_bad_kept_entry_is_never_called_and_is_replaced(
    tmp_path, monkeypatch: pytest.MonkeyPatch, kept: str
) -> None:
    """A damaged or stale cache is only a hint: the kept indices are used only where the
    file's own symbol table names the wanted symbols there; otherwise the table is searched
    again and the entry rewritten."""
    from dlreplay import allocator

    path = _runtime_library()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "dlreplay" / "jemalloc-symbols.json"
    cache.parent.mkdir(parents=True)
    right = allocator._symbols(path, allocator._WANTED)
    key = allocator._file_key(path)
    anchor = right[allocator._ANCHOR][3]
    if kept == "garbage":
        cache.write_bytes(b"\x00{not json")
    elif kept == "another symbol":  # the entry next to mallctl's: a function of its own
        cache.write_text(
            json.dumps(
                {
                    key: {
                        "_rjem_mallctl": right[b"_rjem_mallctl"][3] + 1,
                        "PyInit__polars_runtime": anchor,
                    }
                }
            )
        )
    elif kept == "out of the table":
        cache.write_text(
            json.dumps({key: {"_rjem_mallctl": 1 << 40, "PyInit__polars_runtime": -1}})
        )
    else:
        cache.write_text(json.dumps({key: {}}))
    searched = []
    real = allocator._symbols

    def counting(path, wanted, at=None):
        searched.append(at is None)
        return real(path, wanted, at)

    monkeypatch.setattr(allocator, "_symbols", counting)
    assert allocator._find_mallctl() is not None
    assert (
        searched[-1] is True and searched.count(True) == 1
    )  # one full search, after the hint failed
    assert json.loads(cache.read_text())[key] == {k.decode(): v[3] for k, v in right.items()}


def test_the_cache_keeps_no_entry_of_a_library_gone_or_changed(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each virtual environment adds its polars' entry; entries of files deleted or rebuilt
    since are dropped when the cache is written, so it does not grow without bound."""
    from dlreplay import allocator

    path = _runtime_library()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    other, gone, changed = tmp_path / "other.so", tmp_path / "gone.so", tmp_path / "changed.so"
    for f in (other, gone, changed):
        f.write_bytes(b"lib")
    entry = {"_rjem_mallctl": 1, "PyInit__polars_runtime": 2}
    kept = {allocator._file_key(str(f)): entry for f in (other, gone, changed)}
    gone.unlink()
    changed.write_bytes(b"rebuilt library")
    cache = tmp_path / "cache" / "dlreplay" / "jemalloc-symbols.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(kept))
    assert allocator._find_mallctl() is not None
    assert set(json.loads(cache.read_text())) == {
        allocator._file_key(str(other)),
        allocator._file_key(path),
    }


def test_an_unwritable_cache_directory_only_costs_the_search(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlreplay import allocator

    _runtime_library()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert allocator._find_mallctl() is not None
    assert blocker.read_text() == "not a directory" and list(tmp_path.iterdir()) == [blocker]
