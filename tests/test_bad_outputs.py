"""Outputs never destroy what dlreplay did not write (issue #45, item 1).

``--force`` replaces only what dlreplay itself wrote (a capture recognised by its manifest and
marker, a demo's directory by its marker, a report's figures folder by holding only figures);
an existing output file is refused without ``--force``, and an output that is one of the
command's own inputs (or a file of an input trace) is refused with it too; names are names,
never paths. Every case runs the real CLI on real files and checks, byte for byte, that the
user's files are as they were.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import TRACES

TRACE = TRACES / "npz_fork"  # a small capture with a manifest (64 KiB)


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under *root*: a file's bytes, a link's target, a folder as ``dir``."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = f"link to {p.readlink()}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model distilled from the corpus trace and its DLIO workload, made once."""
    from .conftest import run_cli

    d = tmp_path_factory.mktemp("models")
    run_cli("distill", str(TRACE), "-o", str(d / "model.yaml"), "-q", check=True)
    run_cli("model", "export-dlio", str(d / "model.yaml"), "-o", str(d / "w.yaml"), check=True)
    return {"model": d / "model.yaml", "workload": d / "w.yaml"}


def test_capture_force_replaces_only_a_previous_capture(cli, tmp_path):
    """``capture --force`` in a directory that holds no capture (a user's manifest.json and
    ``*.pfw.gz``; a forged dlreplay manifest without the marker) changes nothing; a previous
    capture is replaced, its own files only. Was: the user's manifest replaced, their trace
    files deleted, the capture written beside their files."""
    users = tmp_path / "mine"
    users.mkdir()
    (users / "manifest.json").write_text('{"mine": true}\n')
    (users / "mydata.pfw.gz").write_bytes(b"\x1f\x8bnot really")
    (users / "notes.txt").write_text("notes\n")
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "manifest.json").write_text('{"schema": "dlreplay.trace", "format_version": 1}\n')
    (forged / "trace-1-app.pfw.gz").write_bytes(b"the user's")
    for d in (users, forged):
        before = snapshot(d)
        r = cli("capture", "--force", "--out", str(d), "-q", "--", "true")
        assert r.returncode == 1, r.stderr
        assert "holds no dlreplay capture" in r.stderr and "nothing was changed" in r.stderr
        assert snapshot(d) == before

    cap = tmp_path / "cap"
    cli("capture", "--out", str(cap), "-q", "--", "true", check=True)
    (cap / "report.html").write_text("the user's report\n")
    old = json.loads((cap / "manifest.json").read_text())
    r = cli("capture", "--out", str(cap), "-q", "--", "true")
    assert r.returncode == 1 and "pass --force" in r.stderr
    cli("capture", "--force", "--out", str(cap), "-q", "--", "true", check=True)
    assert (cap / "report.html").read_text() == "the user's report\n"
    assert json.loads((cap / "manifest.json").read_text())["start_time"] != old["start_time"]


@pytest.mark.parametrize("name", ["../../x", "{tmp}/abs", "a/b", "..", "", "a\nb"])
def test_capture_name_is_a_name_not_a_path(cli, tmp_path, name):
    """``capture --name`` with a path (``..``, absolute, a ``/``), a directory name, nothing or a
    control character: usage error naming --name, nothing written anywhere. Was: written
    outside ``traces/`` (``../../x-<time>``, ``/abs-<time>``)."""
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    r = cli("capture", "--name", name.format(tmp=tmp_path), "-q", "--", "true", cwd=work)
    assert r.returncode == 2, r.stderr
    assert "--name" in r.stderr and "not a plain name" in r.stderr
    assert snapshot(tmp_path) == {"a": "dir", "a/b": "dir"}


def test_export_refuses_an_existing_file_and_its_own_input(cli, tmp_path):
    """``export -o``: an existing file is kept without --force; the trace's own manifest (also
    through a link) is never written, --force or not; a folder is refused; a user's
    ``<out>.part`` is not the temporary file. Was: every one overwritten silently."""
    trace = tmp_path / "t"
    shutil.copytree(TRACE, trace)
    notes = tmp_path / "notes.perfetto-trace"
    notes.write_text("my notes\n")
    part = tmp_path / "notes.perfetto-trace.part"
    part.write_text("my part\n")
    (tmp_path / "link.json").symlink_to(trace / "manifest.json")
    (tmp_path / "folder.json").mkdir()
    before = snapshot(tmp_path)
    for out, force in [
        (notes, ()),
        (trace / "manifest.json", ("--force",)),
        (trace / "manifest.json", ()),
        (tmp_path / "link.json", ("--force",)),
        (tmp_path / "folder.json", ("--force",)),
    ]:
        r = cli("export", str(trace), "-o", str(out), *force)
        assert r.returncode == 2, (out, r.stdout, r.stderr)
        assert str(out) in r.stderr
        assert snapshot(tmp_path) == before, out
    cli("export", str(trace), "-o", str(notes), "--force", check=True)
    assert notes.read_bytes() != b"my notes\n" and part.read_text() == "my part\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["t", "notes.perfetto-trace", "notes.perfetto-trace.part", "link.json", "folder.json"]
    )


def test_outputs_never_overwrite_their_inputs(cli, tmp_path, models):
    """``distill -o``, ``model export-dlio -o`` and ``model import-dlio -o`` naming their own
    input (the trace's manifest or a trace file, the same file, a hard link to it) are refused
    with --force too (exit 2, the input unchanged). Was: the input replaced."""
    trace = tmp_path / "t"
    shutil.copytree(TRACE, trace)
    model = tmp_path / "model.yaml"
    shutil.copy(models["model"], model)
    workload = tmp_path / "w.yaml"
    shutil.copy(models["workload"], workload)
    (tmp_path / "hard.yaml").hardlink_to(workload)
    first = sorted(trace.glob("trace-*.pfw.gz"))[0]
    before = snapshot(tmp_path)
    for args in [
        ("distill", str(trace), "-o", str(trace / "manifest.json")),
        ("distill", str(trace), "-o", str(first)),
        ("model", "export-dlio", str(model), "-o", str(model)),
        ("model", "import-dlio", str(workload), "-o", str(workload)),
        ("model", "import-dlio", str(workload), "-o", str(tmp_path / "hard.yaml")),
    ]:
        r = cli(*args, "--force")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "never writes over what it reads" in r.stderr
        assert snapshot(tmp_path) == before, args


def test_a_report_never_deletes_a_folder_it_did_not_write(cli, tmp_path):
    """A Markdown report's figures folder (``<stem>.figures``) that holds a user's file, or is
    the input trace itself, is never deleted (``analyze``/``compare --report … --force``);
    one of figures only is replaced with --force alone. Was: deleted with everything in it."""
    trace = tmp_path / "t.figures"  # a trace whose name is the report's figures folder
    shutil.copytree(TRACE, trace)
    figs = tmp_path / "r.figures"
    figs.mkdir()
    (figs / "notes.txt").write_text("mine\n")
    pngs = tmp_path / "p.figures"
    pngs.mkdir()
    (pngs / "au.png").write_bytes(b"\x89PNG old")
    before = snapshot(tmp_path)
    for args, code in [
        (("analyze", str(trace), "--report", str(tmp_path / "t.md"), "--force"), 1),
        (("analyze", str(trace), "--report", str(tmp_path / "r.md"), "--force"), 1),
        (("compare", str(trace), str(trace), "--report", str(tmp_path / "r.md"), "--force"), 1),
        (("analyze", str(trace), "--report", str(tmp_path / "p.md")), 2),
    ]:
        r = cli(*args)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert ".figures" in r.stderr
        assert snapshot(tmp_path) == before, args


def test_demo_never_writes_into_or_deletes_what_it_did_not_make(cli, tmp_path):
    """``demo --force --out DIR`` with a directory it did not make, and a directory it made
    whose ``replay/`` holds a user's file: refused before anything runs, nothing changed.
    Was: the user's file in ``DIR/replay/`` deleted, the dataset written beside theirs."""
    users = tmp_path / "users"
    (users / "replay").mkdir(parents=True)
    (users / "replay" / "keep.txt").write_text("mine\n")
    (users / "mydata.txt").write_text("mine\n")
    made = tmp_path / "made"
    (made / "replay").mkdir(parents=True)
    (made / ".dlreplay-demo").write_text("made by dlreplay demo\n")
    (made / "replay" / "keep.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    for out, says in ((users, "was not made by `dlreplay demo`"), (made, "keep.txt")):
        r = cli("demo", "--force", "--out", str(out), timeout=120)
        assert r.returncode == 2, r.stderr
        assert says in r.stderr and "nothing was changed" in r.stderr
        assert snapshot(tmp_path) == before


def test_a_replays_default_out_is_named_from_the_model_safely(cli, tmp_path, models):
    """A model named with a NUL byte or a path gives a default ``replays/<name>-<time>`` inside
    ``replays/``, never elsewhere. Was: a traceback (``embedded null byte``)."""
    text = models["model"].read_text()
    assert "\n  name: null\n" in text
    for i, name in enumerate(['"a\\0b"', '"../../../evil"']):
        model = tmp_path / f"m{i}.yaml"
        model.write_text(text.replace("\n  name: null\n", f"\n  name: {name}\n", 1))
        r = cli(
            "replay",
            str(model),
            "--data-dir",
            "nodata",
            "--no-generate",
            "--no-trace",
            cwd=tmp_path,
        )
        assert r.returncode == 1 and "no complete dlreplay dataset" in r.stderr, r.stderr
    made = sorted(p.name for p in (tmp_path / "replays").iterdir())
    assert [n.rsplit("-", 1)[0] for n in made] == [".._.._.._evil", "a_b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m0.yaml", "m1.yaml", "replays"]
