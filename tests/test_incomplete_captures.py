"""Missing parts of a capture (issue #45 item 3): a trace file the manifest lists is gone or
emptied, the capture was interrupted, its job killed or failed. ``analyze``, ``distill`` and
``compare`` say so before anything else and mark what they derive from it; ``compare
--min-similarity`` fails on an incomplete side. Distill samples the layout only from the trace's
own dataset files, never from other files of a fingerprint's root."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import TRACES

SRC = TRACES / "npz_spawn"  # 5 process files, a manifest that lists them, a dataset fingerprint


def _copy(tmp_path: Path, name: str = "trace") -> Path:
    trace = tmp_path / name
    shutil.copytree(SRC, trace)
    return trace


def _edit_manifest(trace: Path, **changes) -> None:
    path = trace / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def _listed(trace: Path) -> list[str]:
    return [f["name"] for f in json.loads((trace / "manifest.json").read_text())["files"]]


def _gone(trace: Path) -> None:
    (trace / _listed(trace)[0]).unlink()


def _emptied(trace: Path) -> None:
    (trace / _listed(trace)[1]).write_bytes(b"")


def _interrupted(trace: Path) -> None:
    _edit_manifest(trace, status="interrupted", exit_code=130, killed_by_signal=2)


def _killed(trace: Path) -> None:
    _edit_manifest(trace, status="failed", exit_code=137, killed_by_signal=9)


def _failed(trace: Path) -> None:
    _edit_manifest(trace, status="failed", exit_code=1, killed_by_signal=None)


CASES = {
    "gone": (_gone, "trace file(s) that the manifest.json lists are gone"),
    "emptied": (_emptied, "trace file(s) are shorter than the manifest.json recorded at capture"),
    "interrupted": (_interrupted, "the capture was interrupted"),
    "killed": (_killed, "the captured job was killed by SIGKILL"),
    "failed": (_failed, "the captured job failed (exit code 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_is_said_first_and_fails_min_similarity(case: str, cli, tmp_path: Path) -> None:
    """Each case: compare's first line names it (analyze and distill share that account, see the
    next test), and --min-similarity, with a threshold any similarity passes, fails with a sentence."""
    make, said = CASES[case]
    trace = _copy(tmp_path)
    make(trace)
    proc = cli("compare", str(SRC), str(trace), "--min-similarity", "0")
    assert proc.returncode == 1, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"warning: B ({trace}): ") and said in first, first
    assert "similarity (cosine" in proc.stdout  # the comparison is still shown
    error = proc.stderr.split("dlreplay: error: ", 1)[1]
    assert (
        error.startswith(f"--min-similarity: trace B ({trace}) is incomplete (") and said in error
    )
    assert "so its similarity proves nothing" in error


def test_a_gone_file_is_said_first_and_marked_everywhere(cli, tmp_path: Path) -> None:
    """analyze --json (warnings first, on stderr too), the distilled model's notes, compare's text
    and report, and --min-similarity with the incomplete trace on side A."""
    trace = _copy(tmp_path)
    name = _listed(trace)[0]
    _gone(trace)
    said = f"1 trace file(s) that the manifest.json lists are gone ({name}): the 178 event(s)"
    ana = cli("analyze", str(trace), "--json", check=True)
    payload = json.loads(ana.stdout)
    assert payload["incomplete"] is True and payload["warnings"][0].startswith(said)
    assert ana.stderr.startswith(f"warning: {said}")
    model = tmp_path / "m.yaml"
    dis = cli("distill", str(trace), "-o", str(model), check=True)
    assert dis.stdout.startswith(f"warning: {said}")
    from dlreplay.model import load_model

    notes = load_model(model).provenance.notes
    assert notes[0].startswith(f"distilled from an incomplete trace: {said}")
    report = tmp_path / "cmp.md"
    cmp = cli("compare", str(trace), str(SRC), "--report", str(report), check=True)
    assert cmp.stdout.startswith(f"warning: A ({trace}): {said}")
    text = report.read_text()
    assert (
        text.startswith("# Comparison: similarity") and "(incomplete trace)" in text.splitlines()[0]
    )
    assert f"> **Warning:** A ({trace}): {said}" in text
    failed = cli("compare", str(trace), str(SRC), "--min-similarity", "0.5")
    assert failed.returncode == 1 and f"trace A ({trace}) is incomplete" in failed.stderr


def test_every_listed_file_gone_names_the_manifest(cli, tmp_path: Path) -> None:
    trace = _copy(tmp_path)
    for name in _listed(trace):
        (trace / name).unlink()
    proc = cli("analyze", str(trace))
    assert proc.returncode == 1
    assert "though its manifest.json lists 5: they were moved or deleted after the capture" in (
        proc.stderr
    )


def test_complete_traces_still_pass_min_similarity(cli) -> None:
    proc = cli("compare", str(SRC), str(SRC), "--json", "--min-similarity", "0.99", check=True)
    assert proc.stderr == "" and json.loads(proc.stdout)["incomplete"] == {"a": False, "b": False}


def _fingerprint_with_strangers(trace: Path, keep_own: bool) -> None:
    """The trace's fingerprint as if made of a wider root (its data dir's grandparent): the trace's
    own files (when *keep_own*) beside another dataset's npz files of a different structure."""
    path = trace / "dataset-fingerprint.json"
    doc = json.loads(path.read_text())
    group = doc["groups"][0]
    own_root = Path(group["root"])  # .../npz_spawn/data
    wide = own_root.parent.parent
    stranger = {
        "format": "npz",
        "bytes": 1000,
        "members": [{"name": "z.npy", "dtype": "<f8", "shape": [7], "stored": True, "bytes": 56}],
    }
    own = [
        dict(f, path=str((own_root / f["path"]).relative_to(wide))) for f in group["files_sampled"]
    ]
    others = [dict(stranger, path=f"other/data/z_{i}.npz") for i in range(16)]
    group.update(
        root=str(wide), files=24, sampled=24, files_sampled=(own if keep_own else []) + others
    )
    path.write_text(json.dumps(doc))


def test_distill_samples_only_the_traces_own_dataset(cli, tmp_path: Path) -> None:
    """A fingerprint group whose root holds another dataset of the same format: the layout comes
    from the trace's own files only; with none of them sampled, from the trace (never the others)."""
    from dlreplay.model import load_model

    trace = _copy(tmp_path)
    _fingerprint_with_strangers(trace, keep_own=True)
    model = tmp_path / "own.yaml"
    cli("distill", str(trace), "-o", str(model), "-q", check=True)
    arrays = load_model(model).dataset.layout.arrays or []
    names = {m.name for a in arrays for m in a.members}
    assert names == {"x.npy", "y.npy"}, names
    _fingerprint_with_strangers(trace, keep_own=False)
    cli("distill", str(trace), "-o", str(model), "-q", "--force", check=True)
    m = load_model(model)
    assert "z.npy" not in str(m.dataset.layout)
    assert any("holds none of the trace's npz dataset files" in n for n in m.provenance.notes)


@pytest.mark.parametrize("root", ["/", "//", "/tmp/", "/tmp/dlreplay-corpus/npz_fork/"])
def test_a_data_dir_that_ends_at_a_separator_holds_what_is_under_it(root: str, cli) -> None:
    """``--data-dir /`` (or any prefix ending at a separator) finds the dataset reads under it:
    the same bytes as the capture's own, narrower data dirs (it once found none under ``/``)."""
    own = cli("analyze", "--json", str(TRACES / "npz_fork"), check=True)
    wide = cli("analyze", "--json", str(TRACES / "npz_fork"), "--data-dir", root, check=True)
    own_bytes = json.loads(own.stdout)["dataset_bytes_read"]
    wide_bytes = json.loads(wide.stdout)["dataset_bytes_read"]
    assert own_bytes > 0 and wide_bytes >= own_bytes


def test_a_manifest_nested_too_deep_is_set_aside_not_a_traceback(cli, tmp_path: Path) -> None:
    """A manifest.json of 200,000 nested arrays (json's RecursionError was a traceback in
    analyze, distill and compare): warned about by name, the trace read without it."""
    trace = _copy(tmp_path)
    (trace / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    for args in (
        ("analyze", str(trace)),
        ("distill", str(trace), "-o", str(tmp_path / "m.yaml")),
        ("compare", str(trace), str(TRACES / "npz_spawn")),
    ):
        proc = cli(*args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "manifest.json is unreadable" in proc.stderr
