"""Dataset layout fidelity: fingerprint -> distill's layout -> generate -> fingerprint.

Each case writes a small "real" dataset with the format's own library (np.savez, zipfile,
h5py, Pillow, polars, TFRecord framing), fingerprints it, turns the fingerprint into a
``dataset.layout``, generates a dataset from it and fingerprints that: the structure must
come back identical and sizes/compression ratios close.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from dlreplay.analyze.layout import infer_layout, layout_from_fingerprint, resolve_fingerprint
from dlreplay.capture.fingerprint import (
    FINGERPRINT_NAME,
    FingerprintLimits,
    fingerprint_dataset,
    jpeg_quality,
    read_fingerprint,
    write_fingerprint,
)
from dlreplay.errors import ArtifactVersionError
from dlreplay.model import (
    Dataset,
    Distribution,
    Layout,
    WorkloadModel,
    model_from_dict,
    model_to_dict,
)
from dlreplay.replay.generate import GenerateConfig, generate_dataset

from .conftest import EXAMPLES, run_cli

#: Per-structure fields compared with a tolerance (content-dependent), the rest must be equal.
_SIZE_KEYS = {
    "bytes",
    "file_bytes",
    "weight",
    "compression_ratio",
    "row_bytes",
    "disk_row_bytes",
    "line_bytes",
}


def _layout_dict(layout: Layout) -> dict[str, Any]:
    m = WorkloadModel(
        dataset=Dataset(
            format="raw",
            num_files=1,
            num_samples_per_file=1,
            record_length=Distribution.fixed(1),
            layout=layout,
        )
    )
    return model_to_dict(m)["dataset"]["layout"]


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {
            k: _strip(v) for k, v in obj.items() if k not in _SIZE_KEYS and k != "files_sampled"
        }
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _structures(layout: dict[str, Any]) -> list[dict[str, Any]]:
    return layout.get("arrays") or layout.get("images") or layout.get("tables") or []


def roundtrip(
    src: Path,
    fmt: str,
    tmp_path: Path,
    spf: int = 1,
    files: int | None = None,
    bytes_tol: float = 0.03,
    ratio_tol: float = 0.05,
) -> tuple[Layout, Layout]:
    """Fingerprint *src*, generate from its layout, fingerprint again; assert the layout came back."""
    doc = fingerprint_dataset([src])
    assert doc["problems"] == []
    real = layout_from_fingerprint(doc, fmt, [], spf)
    assert real is not None
    group = doc["groups"][0]
    sizes = np.array([f["bytes"] for f in group["files_sampled"]], dtype=float)
    record = Distribution.from_values(sizes / spf)
    if (
        real.layout.record_bytes is not None
    ):  # what distill does for TFRecord/CSV (per-record sizes)
        record = real.layout.record_bytes
    elif real.layout.tables and real.layout.tables[0].line_bytes is not None:
        record = real.layout.tables[0].line_bytes
    model = WorkloadModel(
        dataset=Dataset(
            format=fmt,
            num_files=files or group["files"],
            num_samples_per_file=spf,
            record_length=record,
            layout=real.layout,
        )
    )
    out = tmp_path / f"{src.name}-generated"
    generate_dataset(GenerateConfig(model=model, data_dir=out, jobs=1))
    again_doc = fingerprint_dataset([out / "train"])
    assert again_doc["problems"] == []
    again = layout_from_fingerprint(again_doc, fmt, [], spf)
    assert again is not None
    a, b = _layout_dict(real.layout), _layout_dict(again.layout)
    sa, sb = _structures(a), _structures(b)
    assert _strip(a) == _strip(b) or sorted(map(json.dumps, _strip(sa))) == sorted(
        map(json.dumps, _strip(sb))
    )
    by_key = {json.dumps(_strip(s)): s for s in sb}
    for s in sa:
        g = by_key[json.dumps(_strip(s))]
        if len(sa) == 1 and s.get("bytes"):
            assert g["bytes"] == pytest.approx(s["bytes"], rel=bytes_tol), (s, g)
        for key, real_ratio, got_ratio in _ratios(s, g):
            assert got_ratio == pytest.approx(real_ratio, rel=ratio_tol, abs=0.01), key
    return real.layout, again.layout


def _ratios(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, float, float]]:
    out = []
    if a.get("compression_ratio") is not None:
        out.append(("compression_ratio", a["compression_ratio"], b.get("compression_ratio", 1.0)))
    for ma, mb in zip(a.get("members", []), b.get("members", []), strict=True):
        if ma.get("compression_ratio") is not None:
            out.append((ma["name"], ma["compression_ratio"], mb.get("compression_ratio", 1.0)))
    return out


# --------------------------------------------------------------------------- NPZ / NPY


def test_npz_savez_members_roundtrip(tmp_path: Path) -> None:
    src = tmp_path / "npz"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.savez(
            src / f"vol_{i}.npz",
            x=rng.random((1, 16, 16, 16), dtype=np.float32),
            y=(rng.random((1, 16, 16, 16)) > 0.5).astype(np.uint8),
        )
    real, again = roundtrip(src, "npz", tmp_path)
    (s,) = real.arrays
    assert [(m.name, m.dtype, m.shape, m.storage, m.zip64) for m in s.members] == [
        ("x.npy", "<f4", [1, 16, 16, 16], "stored", True),
        ("y.npy", "|u1", [1, 16, 16, 16], "stored", True),
    ]
    assert again.arrays[0].bytes == s.bytes  # np.savez of the same members: the same bytes


def test_npz_savez_compressed_sizes_come_back(tmp_path: Path) -> None:
    src = tmp_path / "npzc"
    src.mkdir()
    rng = np.random.default_rng(1)
    for i in range(4):
        mask = (rng.random((1, 24, 24, 24)) > 0.9).astype(np.uint8)
        x = (mask + rng.standard_normal((1, 24, 24, 24)).astype(np.float32) * 0.7).astype(
            np.float32
        )
        np.savez_compressed(src / f"vol_{i}.npz", x=x, y=mask)
    real, _ = roundtrip(src, "npz", tmp_path)
    assert real.compressed and real.compression_level == 6
    x, y = real.arrays[0].members
    assert x.storage == y.storage == "deflated" and y.compression_ratio < 0.3 < x.compression_ratio


def test_npz_mixed_compression_and_levels(tmp_path: Path) -> None:
    """One member stored, one deflated at level 1 without zip64: written with zipfile, not np.savez."""
    from numpy.lib import format as npformat

    src = tmp_path / "mixed"
    src.mkdir()
    rng = np.random.default_rng(2)
    for i in range(3):
        with zipfile.ZipFile(src / f"m{i}.npz", "w") as zf:
            info = zipfile.ZipInfo("image.npy")
            with zf.open(info, "w") as f:
                npformat.write_array(f, rng.random((3, 17, 5)))
            info = zipfile.ZipInfo("label.npy")
            info.compress_type = zipfile.ZIP_DEFLATED
            info._compresslevel = 1  # type: ignore[attr-defined]
            with zf.open(info, "w", force_zip64=True) as f:
                npformat.write_array(f, np.zeros((3, 100), np.int32))
    real, again = roundtrip(src, "npz", tmp_path)
    image, label = real.arrays[0].members
    assert (image.storage, image.zip64, label.storage, label.compression_level, label.zip64) == (
        "stored",
        False,
        "deflated",
        1,
        True,
    )


def test_npy_fortran_order(tmp_path: Path) -> None:
    src = tmp_path / "npy"
    src.mkdir()
    for i in range(3):
        np.save(src / f"a{i}.npy", np.asfortranarray(np.ones((7, 9), dtype="<f4")))
    real, _ = roundtrip(src, "npy", tmp_path, spf=7)
    (m,) = real.arrays[0].members
    assert m.fortran_order and m.shape == [7, 9] and real.arrays[0].samples == 7


# --------------------------------------------------------------------------- HDF5


def test_hdf5_odd_chunks_filters_groups_attributes(tmp_path: Path) -> None:
    import h5py

    src = tmp_path / "h5"
    src.mkdir()
    rng = np.random.default_rng(3)
    for i in range(3):
        with h5py.File(src / f"f{i}.h5", "w", libver="latest") as f:
            f.attrs["version"] = "1.0"  # a variable-length string: a global heap in the file
            f.create_group("meta").create_dataset("mean", data=np.arange(3.0))
            x = f.create_dataset(
                "x",
                shape=(10, 11, 13),
                dtype="<f4",
                chunks=(3, 5, 7),
                compression="gzip",
                compression_opts=4,
                shuffle=True,
                fillvalue=-1,
            )
            x[...] = np.round(rng.random((10, 11, 13)), 2)
            x.attrs["units"] = np.arange(5)
            f.create_dataset("y", data=np.arange(10, dtype=np.int64))
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.COMPACT)
            f.create_dataset("small", shape=(10,), dtype="<i2", dcpl=dcpl)
    real, _ = roundtrip(src, "hdf5", tmp_path, spf=10, ratio_tol=0.08, bytes_tol=0.04)
    members = {m.name: m for m in real.arrays[0].members}
    x = members["/x"]
    assert (x.chunks, x.compression, x.compression_level, x.shuffle, x.fill_value) == (
        [3, 5, 7],
        "gzip",
        4,
        True,
        -1.0,
    )
    assert members["/small"].storage == "compact" and members["/y"].storage == "contiguous"
    assert real.arrays[0].groups == ["/meta"] and real.arrays[0].samples == 10
    assert (
        real.hdf5 is not None
        and real.hdf5.superblock_version == 3
        and real.hdf5.root_vlen_attributes == 1
    )
    assert (real.hdf5_chunk_shape, real.hdf5_compression) == ([3, 5, 7], "gzip")


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({}, None),  # HDF5's default 2 KiB: nothing recorded
        ({"meta_block_size": 65536}, 65536),
        ({"meta_block_size": 8192, "userblock_size": 512}, 8192),
        ({"meta_block_size": 65536, "alignment_threshold": 1, "alignment_interval": 4096}, 65536),
        ({"alignment_threshold": 1, "alignment_interval": 4096}, None),
    ],
    ids=["default", "64k", "8k-userblock", "64k-aligned", "aligned"],
)
def test_hdf5_metadata_block_size_round_trip(tmp_path: Path, kw: dict, want: int | None) -> None:
    """The writer's metadata block size is not stored in the file; the first raw data's address
    shows it (data is allocated after the first metadata block). Alignment is told from
    padding, not from addresses that happen to be multiples. The generated files put every
    dataset's data where the real ones do."""
    import h5py

    src = tmp_path / "h5m"
    src.mkdir()
    for i in range(3):
        with h5py.File(src / f"f{i}.h5", "w", **kw) as f:
            f.create_dataset("x", data=np.full((4, 64, 64), i, "<f4"), chunks=(1, 64, 64))
            f.create_dataset("y", data=np.arange(4, dtype="<i8"))
            f.create_dataset(
                "z", data=np.arange(1000, dtype="<i2")
            )  # 2000 B: aligned only if the file is
    real, again = roundtrip(src, "hdf5", tmp_path, spf=4)
    assert real.hdf5 is not None and real.hdf5.meta_block_size == want
    assert again.hdf5 is not None and again.hdf5.meta_block_size == want
    aligned = kw.get("alignment_interval")
    assert real.hdf5.alignment_interval == again.hdf5.alignment_interval == aligned

    def first_data(path: Path) -> int:
        with h5py.File(path) as f:
            return [f["x"].id.get_chunk_info(i).byte_offset for i in range(4)] + [
                f["y"].id.get_offset(),
                f["z"].id.get_offset(),
            ]

    generated = sorted((tmp_path / "h5m-generated" / "train").iterdir())
    assert [first_data(p) for p in generated] == [first_data(src / "f0.h5")] * 3


def test_hdf5_scattered_tiny_chunks(tmp_path: Path) -> None:
    """Chunks written out of order (as many writers finishing blocks) stay scattered."""
    import h5py

    src = tmp_path / "h5s"
    src.mkdir()
    rng = np.random.default_rng(4)
    for i in range(2):
        with h5py.File(src / f"f{i}.h5", "w") as f:
            dx = f.create_dataset(
                "x", shape=(4, 2, 16, 16, 16), dtype="<f4", chunks=(1, 1, 8, 8, 8)
            )
            blocks = [
                (s, c, a, b, e)
                for s in range(4)
                for c in range(2)
                for a in (0, 8)
                for b in (0, 8)
                for e in (0, 8)
            ]
            for k in rng.permutation(len(blocks)):
                s, c, a, b, e = blocks[k]
                dx[s, c, a : a + 8, b : b + 8, e : e + 8] = rng.random((8, 8, 8))
            f.create_dataset("y", data=rng.random((4, 4)).astype("<f4"), chunks=(1, 4))
    real, again = roundtrip(src, "hdf5", tmp_path, spf=4)
    x = {m.name: m for m in again.arrays[0].members}["/x"]
    assert x.chunk_order == "scattered" and x.chunks == [1, 1, 8, 8, 8]
    assert again.arrays[0].bytes == real.arrays[0].bytes


def test_hdf5_lzf_sparse_scalar_and_strings(tmp_path: Path) -> None:
    """Corner cases: an lzf-filtered dataset, a sparse one (few chunks written), a scalar and
    variable-length strings (a global heap)."""
    import h5py

    src = tmp_path / "h5c"
    src.mkdir()
    for i in range(2):
        with h5py.File(src / f"f{i}.h5", "w") as f:
            f.create_dataset(
                "big", shape=(300, 500), dtype="<f4", chunks=(100, 100), compression="lzf"
            )[...] = 1.0
            f.create_dataset(
                "names", data=np.array(["ab", "cde"], dtype=object), dtype=h5py.string_dtype()
            )
            f.create_dataset("scalar", data=3.5)
            f.create_dataset("sparse", shape=(100, 100), dtype="<i4", chunks=(10, 10))[0:20, :] = 1
    real, _ = roundtrip(src, "hdf5", tmp_path, spf=300, ratio_tol=0.1, bytes_tol=0.05)
    members = {m.name: m for m in real.arrays[0].members}
    assert members["/big"].compression == "lzf" and members["/sparse"].chunks_allocated == 0.2
    assert members["/names"].dtype == "vlen-str" and members["/scalar"].shape == []


def test_hdf5_samples_per_file_override_scales_the_sample_axis(tmp_path: Path) -> None:
    import h5py

    src = tmp_path / "h5n"
    src.mkdir()
    with h5py.File(src / "f.h5", "w") as f:
        f.create_dataset("x", data=np.zeros((4, 8), "<f4"), chunks=(1, 8))
        f.create_dataset("mean", data=np.zeros(3))
    layout = layout_from_fingerprint(fingerprint_dataset([src]), "hdf5", [], 4).layout
    model = WorkloadModel(
        dataset=Dataset(
            format="hdf5",
            num_files=1,
            num_samples_per_file=6,
            record_length=Distribution.fixed(32),
            layout=layout,
        )
    )
    generate_dataset(GenerateConfig(model=model, data_dir=tmp_path / "gen", jobs=1))
    (path,) = (tmp_path / "gen" / "train").iterdir()
    with h5py.File(path) as f:
        assert f["x"].shape == (6, 8) and f["mean"].shape == (3,)


# --------------------------------------------------------------------------- images


def test_jpeg_modes_quality_subsampling_progressive(tmp_path: Path) -> None:
    from PIL import Image

    src = tmp_path / "jpg"
    src.mkdir()
    rng = np.random.default_rng(5)
    for i in range(6):
        arr = (
            (
                128
                + 60 * np.sin(np.arange(64) / 5.0 + i)[None, :, None]
                + rng.normal(0, 10, (48, 64, 3))
            )
            .clip(0, 255)
            .astype(np.uint8)
        )
        im = Image.fromarray(arr)
        if i % 3 == 0:
            im.save(src / f"a{i}.jpg", quality=90)
        elif i % 3 == 1:
            im.convert("L").save(src / f"a{i}.jpg", quality=75, progressive=True)
        else:
            im.save(
                src / f"a{i}.jpg", quality=95, subsampling=0, optimize=True, restart_marker_blocks=4
            )
    real, _ = roundtrip(src, "jpeg", tmp_path, files=18)
    kinds = {
        (i.mode, i.quality, i.subsampling, i.progressive, i.optimize, i.restart_interval)
        for i in real.images
    }
    assert kinds == {
        ("RGB", 90, "4:2:0", False, False, 0),
        ("L", 75, None, True, False, 0),
        ("RGB", 95, "4:4:4", False, True, 4),
    }


def test_jpeg_size_follows_the_plan(tmp_path: Path) -> None:
    """One kind of image, varying sizes: each generated file is within 5 % of its planned size."""
    from PIL import Image

    src = tmp_path / "jpgsize"
    src.mkdir()
    rng = np.random.default_rng(6)
    for i in range(5):
        noise = rng.normal(0, 5 + 10 * i, (64, 64, 3))
        Image.fromarray((128 + noise).clip(0, 255).astype(np.uint8)).save(
            src / f"a{i}.jpg", quality=85
        )
    real, again = roundtrip(
        src, "jpeg", tmp_path, files=5, bytes_tol=0.5
    )  # 5 draws: the median moves
    manifest = json.loads((tmp_path / "jpgsize-generated" / ".dlreplay-dataset.json").read_text())
    from dlreplay.replay.common import plan_dataset

    model = WorkloadModel(
        dataset=Dataset(
            format="jpeg",
            num_files=5,
            num_samples_per_file=1,
            record_length=Distribution.from_values(
                [f["bytes"] for f in fingerprint_dataset([src])["groups"][0]["files_sampled"]]
            ),
            layout=real,
        )
    )
    for spec, entry in zip(plan_dataset(model, 0), manifest["files"], strict=True):
        assert entry["bytes"] == pytest.approx(spec.sizes[0], rel=0.05)


def test_small_png_masks_take_their_planned_sizes(tmp_path: Path) -> None:
    """Segmentation masks (a few class labels in blobs, 32x32 and 48x48 grey PNGs of 200-700 B)
    come back within 1 % of their sizes on average: their size curve is steep at small noise
    amplitudes (82 B flat, 402 B at 1 %), where secant steps alone ended 4.4 % off (385 B
    for 328)."""
    from PIL import Image

    from dlreplay.replay.writers.images import image_for

    src = tmp_path / "masks"
    src.mkdir()
    rng = np.random.default_rng(11)
    for i in range(12):
        side = 32 if i % 2 else 48
        yy, xx = np.mgrid[:side, :side]
        mask = np.zeros((side, side), np.uint8)
        for label in range(1, 2 + i % 3):  # 1-3 blobs of their own class
            cy, cx, r = rng.integers(4, side - 4, 2).tolist() + [int(rng.integers(3, side // 3))]
            mask[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = label * 60
        edge = rng.random((side, side)) < 0.02 * (1 + i % 4)  # ragged borders
        mask[edge] = rng.integers(0, 4, int(edge.sum())) * 60
        Image.fromarray(mask, "L").save(src / f"m{i}.png")
    doc = fingerprint_dataset([src])
    real = layout_from_fingerprint(doc, "png", [], 1)
    assert real is not None and {i.mode for i in real.layout.images} == {"L"}
    errors = []
    for kind in real.layout.images:
        for want in kind.file_bytes or [kind.bytes]:
            got = len(image_for(kind, "png", int(want), np.random.default_rng(int(want))))
            errors.append(abs(got - want) / want)
    assert len(errors) >= 8
    assert float(np.mean(errors)) < 0.01, errors


def test_png_grayscale_rgba_palette(tmp_path: Path) -> None:
    from PIL import Image

    src = tmp_path / "png"
    src.mkdir()
    rng = np.random.default_rng(7)
    for i in range(6):
        arr = (rng.random((40, 30, 4)) * 40 + 100).astype(np.uint8)
        im = Image.fromarray(arr, "RGBA")
        if i % 3 == 0:
            im.save(src / f"a{i}.png")
        elif i % 3 == 1:
            im.convert("L").save(src / f"a{i}.png")
        else:
            im.convert("RGB").quantize(16).save(src / f"a{i}.png")
    real, _ = roundtrip(src, "png", tmp_path, files=18, ratio_tol=0.5)
    assert {(i.mode, i.interlaced) for i in real.images} == {
        ("RGBA", False),
        ("L", False),
        ("P", False),
    }


def test_png_idat_chunk_size_is_kept(tmp_path: Path) -> None:
    """A PNG written by another encoder with 8 KiB IDAT chunks (libpng's default) keeps them."""
    from PIL import Image

    from dlreplay.replay.writers.images import png_rechunk as _png_rechunk

    src = tmp_path / "pngchunks"
    src.mkdir()
    rng = np.random.default_rng(8)
    for i in range(2):
        import io

        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (80, 80, 3), dtype=np.uint8)).save(buf, "PNG")
        (src / f"a{i}.png").write_bytes(_png_rechunk(buf.getvalue(), 8192, 0))
    real, again = roundtrip(src, "png", tmp_path, files=2)
    assert real.images[0].chunk_bytes == again.images[0].chunk_bytes == 8192


@pytest.mark.parametrize(
    ("mode", "bits", "width", "height"),
    [
        ("RGB", None, 37, 23),
        ("L", None, 64, 64),
        ("RGBA", None, 9, 5),
        ("LA", None, 17, 3),
        ("P", 4, 21, 13),
        ("P", 1, 13, 7),
        ("P", 2, 11, 9),
        ("I;16", None, 19, 11),
        ("1", None, 23, 17),
        ("RGB", None, 1, 1),
    ],
)
def test_png_adam7_encoding_decodes_to_the_same_pixels(
    mode: str, bits: int | None, width: int, height: int
) -> None:
    """The Adam7 writer (Pillow cannot interlace): Pillow reads the file back as interlaced,
    in the same mode, with the same pixels, for every bit depth (1, 2, 4, 8, 16) and
    filter path, and for images smaller than a pass."""
    import io

    from PIL import Image

    from dlreplay.replay.writers.images import image_pixels as _image_pixels
    from dlreplay.replay.writers.images import png_interlaced as _png_interlaced

    img = _image_pixels(width, height, mode, 0.7, np.random.default_rng(13), bits)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    out = _png_interlaced(buf.getvalue(), img)
    assert out is not None
    back = Image.open(io.BytesIO(out))
    back.load()
    assert back.info.get("interlace") == 1 and back.mode == img.mode
    assert np.array_equal(np.asarray(back), np.asarray(img))


def test_png_interlaced_round_trip(tmp_path: Path) -> None:
    """Interlaced PNGs (RGB and a 16-colour palette) are fingerprinted as interlaced and
    generated interlaced, of the same dimensions, modes and sizes."""
    import io

    from PIL import Image

    from dlreplay.replay.writers.images import png_interlaced as _png_interlaced

    src = tmp_path / "adam7"
    src.mkdir()
    rng = np.random.default_rng(14)
    for i in range(4):
        img = Image.fromarray((rng.random((48, 40, 3)) * 60 + 90).astype(np.uint8), "RGB")
        if i % 2:
            img = img.quantize(16)
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        (src / f"a{i}.png").write_bytes(_png_interlaced(buf.getvalue(), img) or b"")
    real, again = roundtrip(src, "png", tmp_path, files=4, ratio_tol=0.5)
    assert {(i.mode, i.interlaced) for i in real.images} == {("RGB", True), ("P", True)}
    assert {(i.mode, i.interlaced) for i in again.images} == {("RGB", True), ("P", True)}
    generated = sorted((tmp_path / "adam7-generated" / "train").rglob("*.png"))
    assert generated and all(Image.open(p).info.get("interlace") == 1 for p in generated)


def test_jpeg_quality_estimate_matches_pillow() -> None:
    import io

    from PIL import Image

    for q in (10, 50, 75, 90, 100):
        buf = io.BytesIO()
        Image.new("RGB", (16, 16)).save(buf, "JPEG", quality=q)
        buf.seek(0)
        with Image.open(buf) as im:
            assert jpeg_quality(im.quantization[0]) == q


# --------------------------------------------------------------------------- records and tables


def test_tfrecord_record_sizes(tmp_path: Path) -> None:
    from dlreplay.replay.writers import tfrecord_frame

    src = tmp_path / "tfr"
    src.mkdir()
    rng = np.random.default_rng(9)
    for i in range(3):
        with open(src / f"a{i}.tfrecord", "wb") as f:
            for _ in range(50):
                f.write(tfrecord_frame(rng.bytes(int(rng.integers(100, 300)))))
    real, again = roundtrip(src, "tfrecord", tmp_path, spf=50)
    assert real.records_per_file == again.records_per_file == 50
    assert again.record_bytes.mean == pytest.approx(real.record_bytes.mean, rel=0.1)
    assert again.record_bytes.stdev == pytest.approx(real.record_bytes.stdev, rel=0.3)


def test_parquet_columns_codecs_row_groups(tmp_path: Path) -> None:
    import polars as pl

    pytest.importorskip("pyarrow")
    src = tmp_path / "pq"
    src.mkdir()
    rng = np.random.default_rng(10)
    for i in range(3):
        pl.DataFrame(
            {
                "id": np.arange(100),
                "v": rng.random(100),
                "blob": [rng.bytes(50) for _ in range(100)],
            }
        ).write_parquet(src / f"a{i}.parquet", compression="zstd", row_group_size=30)
    real, again = roundtrip(src, "parquet", tmp_path, spf=100, ratio_tol=0.15, bytes_tol=0.05)
    (t,) = real.tables
    assert t.row_groups == 4 and t.rows == 100
    # the writer's row group size, its last group the rest (30/30/30/10, not 25 each)
    assert t.row_group_rows == again.tables[0].row_group_rows == 30
    # each column's chunks on disk: an id of 100 values, random doubles, random blobs
    for want, got in zip(t.columns, again.tables[0].columns, strict=True):
        assert got.disk_row_bytes == pytest.approx(want.disk_row_bytes, rel=0.1), want.name
    assert [(c.name, c.type, c.compression) for c in t.columns] == [
        ("id", "int64", "zstd"),
        ("v", "double", "zstd"),
        ("blob", "byte_array", "zstd"),
    ]


@pytest.mark.parametrize(
    "writer",
    [
        {"data_page_size": 8192},  # narrow columns cut by size, the wide one after every batch
        {"data_page_size": 64 << 10, "data_page_version": "2.0", "write_batch_size": 500},
        {},  # pyarrow's default 1 MiB pages: only the wide column has several per chunk
    ],
    ids=["8KiB-v1", "64KiB-v2-batch500", "default"],
)
def test_parquet_data_pages_round_trip(tmp_path: Path, writer: dict[str, Any]) -> None:
    """The page headers give the writer's page size, batch and page version; the generated
    files have the same pages per column chunk, of the same size and value count."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "pq"
    src.mkdir()
    rng = np.random.default_rng(12)
    n = 20000
    table = pa.table(
        {
            "id": np.arange(n),
            "v": rng.random(n).astype(np.float32),
            "blob": pa.array([rng.bytes(200) for _ in range(n)], type=pa.binary()),
        }
    )
    for i in range(2):
        pq.write_table(
            table, src / f"a{i}.parquet", row_group_size=10000, use_dictionary=False, **writer
        )
    real, again = roundtrip(src, "parquet", tmp_path, spf=n, bytes_tol=0.05)
    (t,), (g,) = real.tables, again.tables
    assert (
        t.data_page_size
        and t.data_page_batch
        and t.data_page_version == (2 if writer.get("data_page_version") else 1)
    )
    if "write_batch_size" in writer:
        assert t.data_page_batch == writer["write_batch_size"]
    assert (g.data_page_values, g.data_page_batch, g.data_page_version) == (
        t.data_page_values,
        t.data_page_batch,
        t.data_page_version,
    )
    assert g.data_page_size == pytest.approx(t.data_page_size, rel=0.02)

    def pages(root: Path) -> list[tuple[str, float, int]]:
        f = fingerprint_dataset([root])["groups"][0]["files_sampled"][0]
        return [(c["name"], c["data_pages"], c["page_values"]) for c in f["columns"]]

    assert pages(tmp_path / "pq-generated" / "train") == pages(src)


def test_parquet_damaged_page_header_keeps_the_columns(tmp_path: Path) -> None:
    """A page header that does not parse leaves the page fields out; the rest of the file's
    fingerprint stands and nothing is reported as a problem."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "pq"
    src.mkdir()
    path = src / "a.parquet"
    pq.write_table(
        pa.table({"id": np.arange(5000)}), path, data_page_size=4096, use_dictionary=False
    )
    start = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    raw = bytearray(path.read_bytes())
    raw[start] = 0x0F  # a field header of an unknown wire type
    path.write_bytes(bytes(raw))
    doc = fingerprint_dataset([src])
    f = doc["groups"][0]["files_sampled"][0]
    assert doc["problems"] == [] and [c["name"] for c in f["columns"]] == ["id"]
    assert "data_page_size" not in f and "data_pages" not in f["columns"][0]


@pytest.mark.parametrize(
    "header",
    [
        b"\x1c" * 5000,  # structs nested 5,000 deep
        b"\x19" * 5000,  # lists of lists
        b"\x19\xf7" + b"\xff" * 9 + b"\x01",  # a list of 2**63 doubles in 12 bytes
        b"\x18\x7f",  # a binary field longer than the header
    ],
)
def test_thrift_reader_refuses_crafted_headers(header: bytes) -> None:
    """A damaged or crafted page header ends in the reader's own error, never in a
    RecursionError or an endless loop (the fingerprint then leaves the page fields out)."""
    from dlreplay.capture.fingerprint.parquet import _Compact, _ThriftError

    with pytest.raises(_ThriftError):
        _Compact(header).struct()


def test_csv_delimiter_header_columns(tmp_path: Path) -> None:
    src = tmp_path / "csv"
    src.mkdir()
    rng = np.random.default_rng(11)
    for i in range(3):
        lines = ["a;b;c"] + [f"{k};{rng.random():.6f};{rng.integers(1000)}" for k in range(50)]
        (src / f"a{i}.csv").write_text("\n".join(lines) + "\n")
    real, _ = roundtrip(src, "csv", tmp_path, spf=50)
    (t,) = real.tables
    assert (t.header, t.delimiter, [c.name for c in t.columns]) == (True, ";", ["a", "b", "c"])


# --------------------------------------------------------------------------- the fingerprint itself


def test_sampling_is_bounded_and_spread(tmp_path: Path) -> None:
    src = tmp_path / "many"
    for sub in range(4):
        (src / f"d{sub}").mkdir(parents=True)
        for i in range(50):
            np.save(src / f"d{sub}" / f"a{i:03d}.npy", np.zeros(4, dtype=np.uint8))
    (src / ".hidden-marker").write_text("x")
    doc = fingerprint_dataset([src], limits=FingerprintLimits(files_per_group=8))
    (group,) = doc["groups"]
    assert group["files"] == 200 and group["sampled"] == 8 and not group["bytes_estimated"]
    picked = [f["path"] for f in group["files_sampled"]]
    assert picked[0] == "d0/a000.npy" and picked[-1] == "d3/a049.npy"
    assert {p.split("/")[0] for p in picked} == {"d0", "d1", "d2", "d3"}
    limited = fingerprint_dataset([src], limits=FingerprintLimits(files_per_group=2, max_stat=10))
    assert (
        limited["groups"][0]["bytes_estimated"] and limited["groups"][0]["bytes"] == group["bytes"]
    )


def test_unreadable_and_unknown_datasets_are_problems_not_errors(tmp_path: Path) -> None:
    import h5py

    src = tmp_path / "bad"
    src.mkdir()
    with h5py.File(src / "ok.h5", "w") as f:
        f.create_dataset("x", data=np.zeros(10))
    (src / "broken.h5").write_bytes((src / "ok.h5").read_bytes()[:100])
    (src / "blob.xyz").write_bytes(os.urandom(100))
    os.symlink(src / "missing.npz", src / "dangling.npz")
    doc = fingerprint_dataset([src, tmp_path / "nowhere"])
    problems = "\n".join(doc["problems"])
    assert f"{tmp_path / 'nowhere'}: no such directory" in problems
    assert "(.xyz, 1 file): format unknown" in problems
    assert "(.h5, 2 files): 1 sampled file(s) unreadable" in problems
    assert "(.npz, 1 file): 1 sampled file(s) unreadable (No such file or directory)" in problems
    assert len(doc["problems"]) == 4
    h5 = next(g for g in doc["groups"] if g["extension"] == ".h5")
    assert h5["sampled"] == 1 and h5["format"] == "hdf5"


def test_fingerprint_file_is_versioned_plain_json(tmp_path: Path) -> None:
    src = tmp_path / "d"
    src.mkdir()
    np.save(src / "a.npy", np.zeros(3))
    doc = fingerprint_dataset([src])
    path = write_fingerprint(doc, tmp_path)
    plain = json.loads(path.read_text())
    assert plain["schema"] == "dlreplay.dataset-fingerprint" and plain["format_version"] == 1
    assert read_fingerprint(tmp_path) == plain
    plain["format_version"] = 99
    path.write_text(json.dumps(plain))
    with pytest.raises(
        ArtifactVersionError, match=f"{FINGERPRINT_NAME}: format_version 99 is newer"
    ):
        read_fingerprint(tmp_path)
    path.write_text("{not json")
    with pytest.raises(ArtifactVersionError, match="not a readable dataset fingerprint"):
        read_fingerprint(tmp_path)


def test_find_group_prefers_the_traces_dataset(tmp_path: Path) -> None:
    for name in ("train", "valid"):
        (tmp_path / name).mkdir()
    for i in range(3):
        np.savez(tmp_path / "train" / f"t{i}.npz", x=np.zeros((1, 8), np.float32))
        np.savez(tmp_path / "valid" / f"v{i}.npz", x=np.zeros((1, 4), np.float64))
    doc = fingerprint_dataset([tmp_path / "train", tmp_path / "valid"])
    paths = [str(tmp_path / "valid" / f"v{i}.npz") for i in range(3)]
    res = layout_from_fingerprint(doc, "npz", paths, 1)
    assert res is not None and res.layout.arrays[0].members[0].dtype == "<f8"
    assert "dataset fingerprint" in res.fields["dataset.layout"][0]


def test_layout_survives_the_model_file(tmp_path: Path) -> None:
    src = tmp_path / "d"
    src.mkdir()
    np.savez_compressed(src / "a.npz", x=np.zeros((1, 8, 8), np.float32), y=np.ones(4, np.int64))
    layout = layout_from_fingerprint(fingerprint_dataset([src]), "npz", [], 1).layout
    model = WorkloadModel(
        dataset=Dataset(
            format="npz",
            num_files=1,
            num_samples_per_file=1,
            record_length=Distribution.fixed(100),
            layout=layout,
        )
    )
    again = model_from_dict(model_to_dict(model))
    assert again.dataset.layout == layout


def test_infer_layout_from_reads() -> None:
    import polars as pl

    reads = pl.DataFrame({"file": ["f"] * 10, "size": [4096] * 8 + [512, 96]})
    res = infer_layout("hdf5", reads, record_length=65536)
    assert res.layout.source == "inferred" and res.layout.hdf5_chunk_bytes == 4096
    assert res.fields["dataset.layout.hdf5_chunk_bytes"][1] == "inferred"
    plain = infer_layout("jpeg", reads, record_length=5000)
    assert plain.layout == Layout() and plain.fields["dataset.layout"][1] == "default"


def test_resolve_fingerprint_prefers_the_trace_then_data_dir(tmp_path: Path) -> None:
    src = tmp_path / "data"
    src.mkdir()
    np.save(src / "a.npy", np.zeros(3))
    trace = tmp_path / "trace"
    trace.mkdir()
    assert resolve_fingerprint(trace, []) == (None, None)
    doc, where = resolve_fingerprint(trace, [str(src)])
    assert doc is not None and "made by distill" in where
    write_fingerprint(doc, trace)
    _, where = resolve_fingerprint(trace, [str(src)])
    assert "made at capture" in where


# --------------------------------------------------------------------------- readers, DLIO


def test_library_reader_reads_every_npz_member(tmp_path: Path) -> None:
    from dlreplay.replay.formats import LibraryReader

    path = tmp_path / "a.npz"
    np.savez(path, x=np.zeros((1, 64, 64), np.float32), y=np.zeros((1, 64, 64), np.uint8))
    reader = LibraryReader("npz", open_per_sample=True)
    got = reader.read(str(path), 0, None)
    assert got >= 64 * 64 * 5  # both members' data


def test_dlio_export_carries_chunking_and_lists_the_rest(tmp_path: Path) -> None:
    import h5py

    from dlreplay.dlio import model_to_dlio

    src = tmp_path / "h5"
    src.mkdir()
    with h5py.File(src / "f.h5", "w") as f:
        f.create_dataset(
            "x",
            data=np.zeros((4, 16, 16), "<f4"),
            chunks=(1, 8, 8),
            compression="gzip",
            compression_opts=3,
        )
        f.create_dataset("y", data=np.zeros((4, 2), "<i8"))
    layout = layout_from_fingerprint(fingerprint_dataset([src]), "hdf5", [], 4).layout
    model = WorkloadModel(
        dataset=Dataset(
            format="hdf5",
            num_files=2,
            num_samples_per_file=4,
            record_length=Distribution.fixed(1024),
            layout=layout,
        )
    )
    config, warnings = model_to_dlio(model)
    ds = config["dataset"]
    assert (
        ds["enable_chunking"]
        and ds["chunk_size"] == 8 * 8 * 4
        and ds["hdf5"]["chunk_dims"] == [1, 8, 8]
    )
    assert ds["compression"] == "gzip" and ds["compression_level"] == 3
    assert ds["record_dims"] == [16, 16] and ds["record_element_type"] == "float32"
    assert any("/y" in w and "DLIO" in w for w in warnings)


# --------------------------------------------------------------------------- capture -> distill -> generate


@pytest.mark.slow
def test_capture_fingerprints_the_dataset_and_distill_uses_it(tmp_path: Path) -> None:
    import sys

    data = tmp_path / "data"
    job = [
        sys.executable,
        str(EXAMPLES / "unet3d_npz.py"),
        "--data-dir",
        str(data),
        "--num-files",
        "4",
        "--batch-size",
        "2",
        "--workers",
        "0",
        "--epochs",
        "1",
        "--volume",
        "16",
        "--compressed",
        "--quiet",
    ]
    import subprocess

    subprocess.run([*job, "--generate-only"], check=True, capture_output=True)
    trace = tmp_path / "trace"
    cap = run_cli(
        "capture",
        "--data-dir",
        str(data),
        "--data-dir",
        str(tmp_path / "nowhere"),
        "--out",
        str(trace),
        "--",
        *job,
    )
    assert cap.returncode == 0, cap.stderr
    assert (
        cap.stderr.count("dataset fingerprint:") == 1 and "nowhere: no such directory" in cap.stderr
    )
    manifest = json.loads((trace / "manifest.json").read_text())
    assert (
        manifest["status"] == "complete"
        and manifest["dataset_fingerprint"]["file"] == FINGERPRINT_NAME
    )
    run_cli("distill", str(trace), "-o", str(tmp_path / "m.yaml"), check=True)
    from dlreplay.model import load_model

    model = load_model(tmp_path / "m.yaml")
    lay = model.dataset.layout
    assert lay.source == "fingerprint" and lay.compressed
    assert [m.name for m in lay.arrays[0].members] == ["x.npy", "y.npy"]
    assert model.provenance.fields["dataset.layout.arrays"].confidence == "measured"
    run_cli("generate", str(tmp_path / "m.yaml"), "--data-dir", str(tmp_path / "gen"), check=True)
    gen = fingerprint_dataset([tmp_path / "gen" / "train"])["groups"][0]
    real = fingerprint_dataset([data])["groups"][0]
    assert gen["bytes"] == pytest.approx(real["bytes"], rel=0.03)


def test_distill_data_dir_fingerprints_a_foreign_traces_dataset(tmp_path: Path) -> None:
    """A trace captured elsewhere (paths that do not exist here, no fingerprint: DFTracer's
    preload alone) and its dataset copied to a new place: distill --data-dir fingerprints the
    copy and still finds the trace's dataset."""
    import shutil
    import subprocess
    import sys

    from dlreplay.model import load_model

    from .conftest import TRACES

    trace = tmp_path / "npz_spawn"
    shutil.copytree(
        TRACES / "npz_spawn", trace, ignore=shutil.ignore_patterns("dataset-fingerprint.json")
    )
    data = tmp_path / "copy-of-the-data"
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "unet3d_npz.py"),
            "--data-dir",
            str(data),
            "--num-files",
            "8",
            "--generate-only",
            "--quiet",
        ],
        check=True,
        capture_output=True,
    )
    out = tmp_path / "m.yaml"
    proc = run_cli("distill", str(trace), "--data-dir", str(data), "-o", str(out), check=True)
    assert (
        "layout      x.npy <f4 [1, 32, 32, 32] stored, y.npy |u1 [1, 32, 32, 32] stored (fingerprint)"
        in proc.stdout
    )
    model = load_model(out)
    assert model.dataset.num_files == 8 and model.dataset.layout.source == "fingerprint"
    assert "made by distill" in model.provenance.fields["dataset.layout"].method
    bare = run_cli("distill", str(trace), "-o", str(tmp_path / "bare.yaml"), check=True)
    assert "layout " not in bare.stdout
    assert (
        load_model(tmp_path / "bare.yaml").provenance.fields["dataset.layout"].confidence
        == "default"
    )


def test_generation_with_a_layout_is_reproducible(tmp_path: Path) -> None:
    """Same model and seed: the same bytes, whether one process writes every file or two share them."""
    import h5py
    from PIL import Image

    rng = np.random.default_rng(12)
    cases = {"jpg": "jpeg", "npzc": "npz", "h5": "hdf5"}
    for name in cases:
        (tmp_path / name).mkdir()
    for i in range(3):
        noise = rng.normal(0, 10 + 20 * i, (24, 32, 3))
        Image.fromarray((128 + noise).clip(0, 255).astype(np.uint8)).save(
            tmp_path / "jpg" / f"{i}.jpg", quality=80
        )
        np.savez_compressed(tmp_path / "npzc" / f"{i}.npz", x=np.round(rng.random((1, 20, 20)), 1))
        with h5py.File(tmp_path / "h5" / f"{i}.h5", "w") as f:
            f.create_dataset(
                "x", data=np.round(rng.random((4, 8, 8)), 2), chunks=(1, 4, 4), compression="gzip"
            )
    for name, fmt in cases.items():
        doc = fingerprint_dataset([tmp_path / name])
        spf = 4 if fmt == "hdf5" else 1
        layout = layout_from_fingerprint(doc, fmt, [], spf).layout
        sizes = [f["bytes"] / spf for f in doc["groups"][0]["files_sampled"]]
        model = WorkloadModel(
            dataset=Dataset(
                format=fmt,
                num_files=6,
                num_samples_per_file=spf,
                record_length=Distribution.from_values(sizes),
                layout=layout,
            )
        )
        digests = []
        for jobs in (1, 2):
            out = tmp_path / f"{name}-gen-{jobs}"
            generate_dataset(GenerateConfig(model=model, data_dir=out, jobs=jobs, seed=7))
            digests.append(
                {p.name: _content_digest(p, fmt) for p in sorted((out / "train").iterdir())}
            )
        assert digests[0] == digests[1], name


def _content_digest(path: Path, fmt: str) -> str:
    """The file's bytes; for HDF5, its size and every dataset's values: object headers carry
    modification times when the real files track them (h5py's default), so bytes differ by those."""
    import hashlib

    import h5py

    if fmt != "hdf5":
        return hashlib.sha256(path.read_bytes()).hexdigest()
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with h5py.File(path) as f:
        for name in sorted(f):
            h.update(name.encode() + np.ascontiguousarray(f[name][()]).tobytes())
    return h.hexdigest()


class _LoggedFile(io.RawIOBase):
    """A file whose reads are logged as ``(offset, bytes)``: the bytes a library touched."""

    def __init__(self, path: Path, log: list[tuple[int, int]]) -> None:
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115
        self._log = log

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, b: Any) -> int:
        at = self._f.tell()
        n = self._f.readinto(b) or 0
        if n:
            self._log.append((at, n))
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def _read_samples(paths: list[Path], fmt: str, arrays: tuple[str, ...], spf: int) -> pl.DataFrame:
    """The reads a job makes taking sample k's row of *arrays* from each file (h5py through a
    file object, numpy.load of the archive): file, offset, size."""
    import h5py

    rows = []
    for p in paths:
        log: list[tuple[int, int]] = []
        for k in range(spf):
            fh = _LoggedFile(p, log)
            if fmt == "hdf5":
                with h5py.File(fh, "r") as f:
                    for a in arrays:
                        np.asarray(f[a][k])
            else:
                with np.load(fh) as z:
                    for a in arrays:
                        np.asarray(z[a])
            fh.close()
        rows += [(str(p), o, n) for o, n in log]
    return pl.DataFrame(rows, schema=["file", "offset", "size"], orient="row")


@pytest.mark.parametrize(
    ("fmt", "read", "order", "unread"),
    [
        # DLIO 2.0's files: /records written first, then /labels; its reader reads /records
        ("hdf5", ("records",), ["/records", "/labels"], {"/labels"}),
        ("hdf5", ("records", "labels"), ["/records", "/labels"], set()),
        ("npz", ("x", "y"), ["x.npy", "y.npy", "meta.npy"], {"meta.npy"}),
        ("npz", ("x",), ["x.npy", "y.npy", "meta.npy"], {"y.npy", "meta.npy"}),
        ("npz", ("x", "y", "meta"), ["x.npy", "y.npy", "meta.npy"], set()),
    ],
)
def test_arrays_the_job_never_reads_are_marked(tmp_path: Path, fmt, read, order, unread) -> None:
    """Arrays of the files that no read of the trace touched (DLIO's /labels, an NPZ member the
    job's Dataset never takes) are ``read_per_sample: false``; the others, and every array
    when the trace has no reads, stay read. HDF5 arrays are listed where their data lies,
    not by name (/labels came first, and the replay wrote it first)."""
    import h5py

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(7)
    paths = []
    for i in range(3):
        if fmt == "hdf5":
            p = src / f"img_{i}.hdf5"
            with h5py.File(p, "w") as f:
                d = f.create_dataset("records", (4, 64, 64), dtype=np.uint8)
                d[0:4] = rng.integers(0, 255, (4, 64, 64), dtype=np.uint8)
                f.create_dataset("labels", data=[0] * 4)
        else:
            p = src / f"s_{i}.npz"
            np.savez(p, x=rng.random((4, 32, 32)), y=np.arange(4), meta=rng.random(512))
        paths.append(p)
    doc = fingerprint_dataset([src])
    reads = _read_samples(paths, fmt, read, 4)
    got = layout_from_fingerprint(doc, fmt, [str(p) for p in paths], 4, "test", reads)
    assert got is not None
    members = got.layout.arrays[0].members
    assert [m.name for m in members] == order
    assert {m.name for m in members if not m.read_per_sample} == unread
    if unread:
        assert "never read per sample" in got.fields["dataset.layout.arrays"][0]
    none = layout_from_fingerprint(doc, fmt, [str(p) for p in paths], 4, "test", reads.clear())
    assert none is not None and all(m.read_per_sample for m in none.layout.arrays[0].members)
