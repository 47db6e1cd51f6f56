"""Bad model and DLIO config files, and overrides that cannot take effect (issue #45, items 4, 5
and 7, the parts in the core's model and DLIO code).

Through the real CLI: each case ends in one line naming the file (or the override) and what to
do, exit 1, quickly and in bounded memory, never a traceback; an error quotes at most a short
cut of a bad value and says how long it was.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from .conftest import TRACES

#: A small DLIO workload; each test adds or replaces keys.
DLIO = """\
framework: pytorch
workflow: {{generate_data: false, train: true}}
dataset:
  data_folder: data/x
  format: {fmt}
  num_files_train: {files}
  num_samples_per_file: {spf}
  record_length_bytes: {length}
reader: {{batch_size: 2, read_threads: 1}}
train: {{epochs: 1, computation_time: 0.01}}
"""


def dlio(tmp_path: Path, name: str = "workload.yaml", **kw: object) -> Path:
    values = {"fmt": "npz", "files": 4, "spf": 2, "length": 4096, **kw}
    path = tmp_path / name
    path.write_text(DLIO.format(**values))
    return path


def error_line(proc) -> str:
    """The one error line of a failed run (exit 1)."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dlreplay: error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


def imported(cli, tmp_path: Path, **kw: object) -> Path:
    """A model imported from :func:`dlio`'s workload."""
    out = tmp_path / "model.yaml"
    cli("model", "import-dlio", str(dlio(tmp_path, **kw)), "-o", str(out), check=True)
    return out


# --------------------------------------------------------------------------- sizes read (5)


def test_model_show_of_an_endless_file_stops_at_the_limit(cli) -> None:
    """``model show /dev/zero`` read 4 GB before it said anything; now it reads 16 MiB at most."""
    line = error_line(cli("model", "show", "/dev/zero", timeout=60))
    assert "/dev/zero: larger than 16 MiB, the most dlreplay reads" in line


def test_a_config_over_the_limit_is_refused_before_parsing(cli, tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "w") as fh:  # valid YAML, all of it: a comment line repeated
        fh.write("framework: pytorch\n" + ("# " + "x" * 1021 + "\n") * (17 * 1024))
    line = error_line(cli("model", "import-dlio", str(big), "-o", str(tmp_path / "m.yaml")))
    assert f"{big}: larger than 16 MiB" in line
    assert not (tmp_path / "m.yaml").exists()


# --------------------------------------------------------------------------- values echoed (5)


def test_a_megabyte_value_is_cut_in_the_message(cli, tmp_path: Path) -> None:
    path = dlio(tmp_path, fmt="x" * 2_000_000)
    line = error_line(cli("model", "import-dlio", str(path), "-o", str(tmp_path / "m.yaml")))
    assert "dataset.format: expected one of" in line
    assert "... (2,000,000 characters)" in line
    assert len(line) < 1000


def test_a_megabyte_key_and_override_are_cut(cli, tmp_path: Path) -> None:
    good = imported(cli, tmp_path)
    model = tmp_path / "long-key.yaml"
    key = "k" * 1_000_000  # an explicit key (``? KEY``): a plain one ends at 1,024 characters
    text = good.read_text().replace("reader:\n", f"reader:\n  ? {key}\n  : 1\n", 1)
    model.write_text(text)
    line = error_line(cli("model", "show", str(model)))
    assert "reader.kkkk" in line and "... (1,000,007 characters): unknown field" in line
    assert len(line) < 1000
    long_set = "dataset.num_files=" + "9" * 100_000
    # the exponent-notation pattern backtracked quadratically on 100,000 digits (a minute)
    proc = cli("generate", str(good), "--data-dir", str(tmp_path / "d"),
               "--set", long_set, timeout=20)  # fmt: skip
    line = error_line(proc)
    assert "characters)" in line and len(line) < 1000


# --------------------------------------------------------------------------- nesting (4)


@pytest.mark.parametrize(
    "where",
    ["block string", "override"],
)
def test_deep_nesting_is_an_error_not_a_recursion(cli, tmp_path: Path, where: str) -> None:
    deep = "[" * 20_000 + "]" * 20_000
    if where == "block string":  # DLIO's sections may be YAML inside a string
        path = tmp_path / "deep.yaml"
        path.write_text(f'framework: pytorch\ndataset: "{deep}"\n')
        line = error_line(cli("model", "import-dlio", str(path), "-o", str(tmp_path / "m.yaml")))
        assert f"{path}: dataset: not valid YAML inside the block string: exceeded" in line
    else:
        model = imported(cli, tmp_path)
        proc = cli("generate", str(model), "--data-dir", str(tmp_path / "d"),
                   "--set", f"dataset.layout={deep}")  # fmt: skip
        line = error_line(proc)
        assert "dataset.layout: expected a mapping" in line and "(40,000 characters)" in line


def test_an_integer_longer_than_python_converts_is_an_error(cli, tmp_path: Path) -> None:
    path = dlio(tmp_path, files="9" * 5000)
    line = error_line(cli("model", "import-dlio", str(path), "-o", str(tmp_path / "m.yaml")))
    assert f"{path}: not valid YAML: Exceeds the limit (4300 digits)" in line


def test_a_size_beyond_any_byte_count_is_a_usage_error(cli) -> None:
    """``--memory-limit 9...9`` (400 digits) overflowed float into a traceback."""
    proc = cli("analyze", str(TRACES / "dlio_npz_2ranks"), "--memory-limit", "9" * 400)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "(400 characters) is too large a size (at most 8 EiB)" in proc.stderr


# --------------------------------------------------------------------------- DLIO import (4, 5)


@pytest.mark.parametrize(
    ("fmt", "spf", "length"),
    [
        ("npz", 10**12, 4096),  # np.savez of [0] * 10**12 labels: MemoryError
        ("npy", 10**12, 4096),  # np.save of 4 PB to a counting sink: hours
        ("npz", 1, 10**15),  # a record of 1 PB: the same
        ("hdf5", 10**8, 4096),  # an HDF5 probe file of 10**8 samples: minutes
    ],
)
def test_import_of_huge_dlio_files_is_computed_not_written(
    cli, tmp_path: Path, fmt: str, spf: int, length: int
) -> None:
    """The file DLIO would write is sized by its structure, at once, whatever its size."""
    out = tmp_path / "m.yaml"
    path = dlio(tmp_path, fmt=fmt, spf=spf, length=length)
    cli("model", "import-dlio", str(path), "-o", str(out), check=True, timeout=30)
    model = yaml.safe_load(out.read_text())
    side = math.isqrt(length)
    data = side * side * spf
    assert data < model["dataset"]["file_size"]["value"] < data + 9 * spf + 4096


@pytest.mark.parametrize(
    ("fmt", "spf", "length", "message"),
    [
        (
            "tfrecord",
            10**26,
            4096,
            "dataset.num_samples_per_file: num_samples_per_file x record length = "
            "100000000000000000000000000 x 4,096 bytes: files larger than any file can be (8 EiB)",
        ),
        (
            "npz",
            "9" * 4000,  # Python's float() of it overflowed
            1,
            "x 1 bytes: files larger than any file can be",
        ),
        (
            "jpeg",
            1,
            10**11,
            "dataset.record_length_bytes: 100,000,000,000 bytes: a JPEG of 316,227 x 316,227 pixels",
        ),
    ],
)
def test_import_refuses_files_that_cannot_exist(
    cli, tmp_path: Path, fmt: str, spf: object, length: int, message: str
) -> None:
    path = dlio(tmp_path, fmt=fmt, spf=spf, length=length)
    line = error_line(cli("model", "import-dlio", str(path), "-o", str(tmp_path / "m.yaml")))
    assert f"{path}: " in line and message in line


def test_a_count_past_int64_is_refused_in_config_model_and_override(cli, tmp_path: Path) -> None:
    huge = "9" * 4000  # below Python's 4,300 digits: it parses, then overflowed a float
    path = dlio(tmp_path, files=huge)
    line = error_line(cli("model", "import-dlio", str(path), "-o", str(tmp_path / "m.yaml")))
    assert (
        "dataset.num_files: expected at most 2^63 - 1, got an integer of about 4,000 digits" in line
    )
    model = imported(cli, tmp_path)
    proc = cli("generate", str(model), "--data-dir", str(tmp_path / "d"),
               "--set", f"dataset.record_length.mean={huge}")  # fmt: skip
    assert "dataset.record_length.mean: expected a number or null, got an integer of about" in (
        error_line(proc)
    )


@pytest.mark.parametrize(("side", "spf"), [(1, 1), (64, 2), (317, 9), (1000, 17)])
def test_computed_dlio_file_sizes_are_numpys(side: int, spf: int) -> None:
    """The sizes computed past 16 MiB are what np.save / np.savez write (checked small here,
    and once at 2 and 4 GiB where zip64 fields appear)."""
    import io

    import numpy as np

    from dlreplay.dlio.generator import npy_file_bytes, zip_file_bytes

    records = np.zeros((side, side, spf), dtype=np.uint8)
    npy, npz = io.BytesIO(), io.BytesIO()
    np.save(npy, records)
    np.savez(npz, x=records, y=[0] * spf)
    x = npy_file_bytes((side, side, spf), "|u1", 1)
    assert x == len(npy.getvalue())
    y = npy_file_bytes((spf,), "<i8", 8)
    assert zip_file_bytes([("x.npy", x), ("y.npy", y)]) == len(npz.getvalue())


# --------------------------------------------------------------------------- overrides (7)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (  # the issue's case: DLIO's npz layout lists the arrays, 64 x 64 x 2 bytes of samples
            ("dataset.record_length=65536",),
            "override 'dataset.record_length=65536': dataset.record_length: cannot take effect: "
            "dataset.layout.arrays decides (each npz file holds the arrays it lists (x.npy "
            "[64, 64, 2] |u1, y.npy [2] <i8: 8,698 bytes a file) whatever the record length",
        ),
        (  # DLIO's npz holds its samples on the last axis, which generate does not resize
            ("dataset.num_samples_per_file=4",),
            "dataset.num_samples_per_file: cannot take effect: "
            "dataset.layout.arrays[0].members[0].shape decides",
        ),
        (
            ("dataset.layout.compressed=true",),
            "dataset.layout.compressed: cannot take effect: dataset.layout.arrays decides",
        ),
        (
            ("dataset.layout.hdf5_chunk_shape=[1, 64]",),
            "cannot take effect: dataset.format decides (npz files have no hdf5_chunk_shape",
        ),
        (
            ("dataset.file_size=100000",),
            "dataset.file_size: cannot take effect: dataset.record_length x "
            "dataset.num_samples_per_file decides",
        ),
        (
            ("checkpoint.bytes_per_checkpoint=1000000",),
            "cannot take effect: checkpoint.enabled decides (false: no checkpoint is written)",
        ),
        (
            (
                "checkpoint.enabled=true",
                "checkpoint.steps_between_checkpoints=4",
                "checkpoint.checkpoint_after_epoch=2",
            ),  # fmt: skip
            "checkpoint.checkpoint_after_epoch: cannot take effect: "
            "checkpoint.steps_between_checkpoints decides",
        ),
        (
            ("reader.file_shuffle=seed",),
            "reader.file_shuffle: cannot take effect: reader.sample_order decides",
        ),
        (
            ("reader.read_threads=0", "reader.prefetch_factor=8"),
            "reader.prefetch_factor: cannot take effect: reader.read_threads decides",
        ),
    ],
)
def test_an_override_that_cannot_take_effect_names_the_field_that_wins(
    cli, tmp_path: Path, sets: tuple[str, ...], message: str
) -> None:
    model = imported(cli, tmp_path)
    data = tmp_path / "d"
    args = [x for s in sets for x in ("--set", s)]
    line = error_line(cli("generate", str(model), "--data-dir", str(data), *args))
    assert message in line
    assert not data.exists()  # refused before anything was written


def test_an_image_size_the_layout_cannot_reach_is_refused(cli, tmp_path: Path) -> None:
    model = imported(cli, tmp_path, fmt="jpeg", spf=1)  # a 64 x 64 grayscale JPEG
    proc = cli("generate", str(model), "--data-dir", str(tmp_path / "d"),
               "--set", "dataset.record_length=65536")  # fmt: skip
    assert "cannot take effect: dataset.layout.images decides (a 64 x 64 L image codes to at " in (
        error_line(proc)
    )


def test_the_issues_override_is_refused_and_the_way_out_takes_effect(cli, tmp_path: Path) -> None:
    """``--set dataset.record_length=65536`` wrote DLIO's 8,698-byte files silently; now it is
    refused, and the way out its message names (the arrays cleared) writes files of that size."""
    model = imported(cli, tmp_path, files=2)
    data = tmp_path / "d"
    sets = ["dataset.record_length=65536"]
    args = ["generate", str(model), "--data-dir", str(data), "--jobs", "1"]
    line = error_line(cli(*args, *[x for s in sets for x in ("--set", s)]))
    assert "set dataset.layout.arrays=null as well for files of the plan's sizes" in line
    sets.append("dataset.layout.arrays=null")
    cli(*args, *[x for s in sets for x in ("--set", s)], check=True)
    sizes = [p.stat().st_size for p in (data / "train").iterdir()]
    assert len(sizes) == 2 and all(s > 2 * 65536 for s in sizes)
