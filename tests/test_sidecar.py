"""The side reader of arguments the event table has no column for (analyze/trace/sidecar.py):
each line decoded on its own, so odd lines cost only themselves."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import polars as pl

from dlreplay.analyze.trace.sidecar import fields_of, matching_lines

OPEN = re.compile(rb'^\{[^\n]*"name":"open64","cat":"POSIX"[^\n]*"flags":[^\n]*$', re.M)
SCHEMA = {
    "pid": ("$.pid", pl.Int64),
    "ts": ("$.ts", pl.Int64),
    "fhash": ("$.args.fhash", pl.String),
    "flags": ("$.args.flags", pl.Int64),
}


def _open(pid: object, ts: object, fhash: object, flags: object, extra: str = "") -> bytes:
    return (
        f'{{"id":1,"name":"open64","cat":"POSIX","pid":{pid},"tid":1,"ts":{ts},"dur":2,"ph":"X",'
        f'"args":{{"fhash":{fhash},"flags":{flags}{extra}}}}}'
    ).encode()


def test_odd_lines_read_as_nulls_and_leave_the_others(tmp_path: Path) -> None:
    lines = [
        _open(7, 100, '"a1"', 0),
        _open(7, 200, '"a1"', 16384, ',"flags":16448'),  # a key given twice: the last wins
        _open(7, "300.0", '"b2"', 1),  # a whole number written as a float
        _open('"x"', 400, '"c3"', '"0x2"'),  # values of another type
        _open(7, 500, '"d4"', 2)[:-3],  # a line cut short
        b'{"name":"open64","cat":"POSIX","pid":7,"ts":600,"args":{"fhash":"\xff\xfe","flags":1}}',
    ]
    f = tmp_path / "t.pfw"
    f.write_bytes(b"\n".join([b"[", *lines, b'{"name":"read","cat":"POSIX","pid":7}']) + b"\n")
    got = matching_lines(tmp_path, OPEN)
    assert len(got) == len(lines)
    df = fields_of(got, SCHEMA)
    assert df.schema == pl.Schema({k: t for k, (_p, t) in SCHEMA.items()})
    assert df.row(0) == (7, 100, "a1", 0)
    assert df.row(1) == (7, 200, "a1", 16448)
    assert df.row(2) == (7, 300, "b2", 1)
    assert df.row(3) == (None, 400, "c3", None)
    assert df.row(4) == (None, None, None, None)
    assert df.row(5) == (
        7,
        600,
        "\ufffd\ufffd",
        1,
    )  # invalid UTF-8 kept as U+FFFD, as the loader does


def test_a_damaged_gzip_gives_the_lines_before_the_damage(tmp_path: Path) -> None:
    good = b"\n".join(_open(1, 10 * i, f'"h{i}"', 0) for i in range(2000)) + b"\n"
    whole = gzip.compress(good) + gzip.compress(good)  # two members, as DFTracer's flushes
    (tmp_path / "a.pfw.gz").write_bytes(whole[: len(whole) - 200])  # the second member cut
    got = matching_lines(tmp_path / "a.pfw.gz", OPEN)
    assert 2000 <= len(got) < 4000  # the first member whole, the second as far as it goes
    assert fields_of(got[:2000], SCHEMA)["fhash"].to_list() == [f"h{i}" for i in range(2000)]
    assert matching_lines(tmp_path / "gone", OPEN) == [] and matching_lines(None, OPEN) == []


def test_one_read_serves_every_pattern_and_a_rewritten_file_is_read_again(
    tmp_path: Path, monkeypatch
) -> None:
    from dlreplay.analyze.trace import sidecar

    reads: list[Path] = []
    real = sidecar._read
    monkeypatch.setattr(sidecar, "_read", lambda p: reads.append(p) or real(p))
    get = sidecar.register(re.compile(rb'^\{[^\n]*"name":"GetObject","cat":"S3"[^\n]*$', re.M))
    f = tmp_path / "t.pfw"
    get_line = b'{"name":"GetObject","cat":"S3","pid":3,"ts":9,"args":{"bucket":"b","key":"k"}}'
    f.write_bytes(b"\n".join([_open(7, 100, '"a1"', 0), get_line]) + b"\n")
    assert len(matching_lines(tmp_path, OPEN)) == 1
    assert matching_lines(tmp_path, get) == [get_line]
    assert len(reads) == 1  # one read of the file for both patterns
    f.write_bytes(b"\n".join([_open(7, 100, '"a1"', 0), _open(7, 200, '"b2"', 1)]) + b"\n")
    assert len(matching_lines(tmp_path, OPEN)) == 2 and matching_lines(tmp_path, get) == []
    assert len(reads) == 2


def test_needles_find_the_lines_the_whole_text_pattern_finds(tmp_path: Path) -> None:
    """A registered pattern's lines are found from its needles (a plain search) and matched one
    by one: the same lines, in order, as the pattern run over the whole text, on the committed
    traces and on lines built to sit at the edges (the last line without its newline, a needle
    twice in a line, a needle in a line the pattern refuses, one file of NUL bytes)."""
    import dlreplay.analyze.analysis  # noqa: F401  (every pass's patterns registered)
    from dlreplay.analyze.distill import direct, storage
    from dlreplay.analyze.trace import sidecar

    assert direct._LINE in sidecar._NEEDLES and storage._LINE in sidecar._NEEDLES
    assert len(sidecar._NEEDLES) >= 7
    built = tmp_path / "built.pfw"
    built.write_bytes(
        b"\n".join(
            [
                b"[",
                _open(7, 1, '"a"', 0, ',"note":"name open64 cat POSIX"'),
                b'{"id":2,"name":"open64","cat":"POSIX","pid":7,"args":{"fhash":"b"}}',  # no flags
                _open(7, 3, '"c"', 0) + b' {"name":"open64","cat":"POSIX"}',  # the needle twice
                b'{"name":"GetObject","cat":"S3","pid":3,"ts":9,"args":{"key":"k"}}',
                _open(7, 4, '"d"', 1),  # the last line, no newline after it
            ]
        )
    )
    (tmp_path / "nul.pfw").write_bytes(bytes(1 << 16))
    repo = Path(__file__).resolve().parent.parent
    files = [built, tmp_path / "nul.pfw", *sidecar.trace_files(repo / "traces")[:120]]
    found = 0
    for f in files:
        data = sidecar._read(f)
        for pattern, needles in sidecar._NEEDLES.items():
            want = pattern.findall(data)
            assert sidecar._lines_with(data, pattern, needles) == want, (f, pattern.pattern)
            found += len(want)
    assert found > 1000
    assert (
        len(sidecar._lines_with(built.read_bytes(), direct._LINE, sidecar._NEEDLES[direct._LINE]))
        == 3
    )
