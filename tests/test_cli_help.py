"""The command line's help is complete and true (issue #42): ``dlreplay --help`` lists every
command, in pipeline order, each with a one-line summary; every group's help lists each of
its commands; every command a help text names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

import dlreplay
from dlreplay.cli import main

from .conftest import check_no_traceback

#: The order data flows through the tool (issue #42).
PIPELINE = [
    "capture",
    "analyze",
    "distill",
    "generate",
    "replay",
    "compare",
    "export",
    "view",
    "sql",
    "model",
    "demo",
]

ENTRY = re.compile(r"^  (\S+)(?:\s{2,}(\S.*))?$")


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """A CliRunner whose runs leave this process as they found it: the group sets polars' and
    OpenBLAS's variables (and dlreplay's flags saying so) before any command."""
    for name in (dlreplay.JEMALLOC_ENV, dlreplay.BLAS_ENV):
        was = os.environ.get(name)
        monkeypatch.setenv(name, was or "")  # restored to what it was (or removed) after the test
        if was is None:
            monkeypatch.delenv(name)
    for flag in ("JEMALLOC_SET_BY_DLREPLAY", "BLAS_SET_BY_DLREPLAY"):
        monkeypatch.setattr(dlreplay, flag, getattr(dlreplay, flag))
    return CliRunner()


def _help(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(main, [*args, "--help"], prog_name="dlreplay")
    assert result.exit_code == 0, result.output
    check_no_traceback(result.output, what=" ".join([*args, "--help"]))
    return result.output


def _listed(text: str) -> list[tuple[str, str]]:
    """(name, summary) of each entry of the help's ``Commands:`` section; a summary wrapped
    onto a second line shows as an entry without a name."""
    lines = text.split("Commands:\n", 1)[1].splitlines()
    out = []
    for line in lines:
        if not line.strip():
            break
        m = ENTRY.match(line)
        out.append((m.group(1), m.group(2) or "") if m else ("", line.strip()))
    return out


def _groups() -> list[tuple[tuple[str, ...], click.Group]]:
    """Every group of the command line (the top level first) with the words that reach it."""
    found: list[tuple[tuple[str, ...], click.Group]] = []

    def walk(path: tuple[str, ...], group: click.Group) -> None:
        found.append((path, group))
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                walk((*path, name), cmd)

    walk((), main)
    return found


def _all_commands() -> list[tuple[str, ...]]:
    return [(*path, name) for path, group in _groups() for name in group.commands]


def test_top_level_help_lists_every_command_in_pipeline_order(runner: CliRunner) -> None:
    listed = _listed(_help(runner))
    assert [name for name, _ in listed] == PIPELINE
    assert sorted(main.commands) == sorted(PIPELINE)  # nothing registered that the help leaves out


def test_each_command_has_a_one_line_summary(runner: CliRunner) -> None:
    for path, _group in _groups():
        listed = _listed(_help(runner, *path))
        assert all(name for name, _ in listed), (
            path,
            listed,
        )  # no summary wrapped onto a second line
        for name, summary in listed:
            assert summary and not summary.endswith("..."), (path, name, summary)  # not cut short
    for name in PIPELINE:
        assert main.commands[name].short_help, name


def test_every_group_lists_each_of_its_commands(runner: CliRunner) -> None:
    for path, group in _groups():
        listed = [name for name, _ in _listed(_help(runner, *path))]
        assert sorted(listed) == sorted(group.commands), path


def _named_in(text: str) -> list[tuple[str, ...]]:
    """The commands a help text names as ``dlreplay COMMAND [SUBCOMMAND]`` (in its usage line,
    an example's line, or in backquotes; not "a dlreplay dataset" in prose): the words after
    ``dlreplay`` up to the first option, argument or path (``traces/x``, ``MODEL_FILE``)."""
    out = []
    for m in re.finditer(r"(?:^\s*|Usage: |`)dlreplay((?: [a-z][a-z-]*)+)", text, re.M):
        out.append(tuple(m.group(1).split()))
    return out


def _resolves(words: tuple[str, ...]) -> bool:
    """Whether ``words`` start with a command of the command line (a group's next word, when
    there is one, being one of its commands)."""
    cmd: click.Command = main
    for i, word in enumerate(words):
        if not isinstance(cmd, click.Group):
            return i > 0  # the rest are the command's arguments
        if word not in cmd.commands:
            return False
        cmd = cmd.commands[word]
    return True


def test_every_command_a_help_names_exists(runner: CliRunner) -> None:
    registered = set(_all_commands())
    for path, _group in _groups():
        for name, _summary in _listed(_help(runner, *path)):
            assert (*path, name) in registered, (path, name)
    for words in [(), *_all_commands()]:
        text = _help(runner, *words)
        for named in _named_in(text):
            assert _resolves(named), (words, named)
    # the top-level description names the commands in words of their own: each is one
    description = _help(runner).split("Options:", 1)[0]
    words_named = [word for word in re.findall(r"\b[a-z]+\b", description) if word in PIPELINE]
    assert sorted(set(words_named)) == sorted(PIPELINE)
    assert all(word in main.commands for word in words_named)


def test_model_help_promises_only_its_own_commands(runner: CliRunner) -> None:
    """``dlreplay model --help`` once promised a ``check`` command that did not exist."""
    text = _help(runner, "model")
    group = main.commands["model"]
    assert isinstance(group, click.Group)
    assert (
        sorted(name for name, _ in _listed(text))
        == sorted(group.commands)
        == ["export-dlio", "import-dlio", "show"]
    )
    assert "check" not in text


def test_python_m_dlreplay_help_lists_every_command_in_pipeline_order() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dlreplay", "--help"], capture_output=True, text=True, timeout=120
    )
    check_no_traceback(proc.stdout, proc.stderr, what="--help")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    listed = _listed(proc.stdout)
    assert [name for name, _ in listed] == PIPELINE
    assert all(summary and not summary.endswith("...") for _, summary in listed), listed
