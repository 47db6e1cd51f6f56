"""What DLIO 2.0.0 writes: its data generators' file layouts and its checkpoint files.

DLIO (``dlio_benchmark`` 2.0.0 on PyPI) generates every dataset from the record length
alone, the same way for every run (``dlio_benchmark/data_generator/*.py``):

* the sample is a square ``uint8`` array of side ``dimension = int(sqrt(record_length))``
  (each side drawn from a normal distribution when ``record_length_stdev`` > 0), filled
  with ``np.random.randint(255)`` noise;
* **npz**: ``np.savez(path, x=records, y=[0] * samples)`` (``np.savez_compressed`` with
  ``compression: zip``), ``records`` of shape ``(d1, d2, samples_per_file)``;
* **npy**: ``np.save(path, records)``, the same array;
* **hdf5**: ``records`` of shape ``(samples_per_file, d1, d2)`` (chunks ``(1, c, c)`` with
  ``enable_chunking``, ``c = ceil(sqrt(chunk_size))``; ``compression``/``compression_level``
  as given), then ``labels`` (``int64``, one per sample), h5py's defaults otherwise;
* **jpeg** / **png**: ``PIL.Image.fromarray(records).save(path, format=..., bits=8)`` of a
  ``(d1, d2)`` grayscale array: mode ``L``, Pillow's default JPEG quality (75).

DLIO's readers then read a sample by opening its file (``read_type: on_demand``, the
default): ``np.load(path)['x']`` (npz), ``np.load(path)`` (npy),
``h5py.File(path)['records'][k]`` (hdf5), ``np.asarray(PIL.Image.open(path))`` (images).

:func:`generated_layout` is that layout as a :class:`~dlreplay.model.Layout`
(``source: dlio``); :func:`array_file_bytes` the exact size of the file DLIO writes for
given dimensions, so the dimensions can be found from a trace's file sizes
(:func:`dims_from_file_bytes`).
"""

from __future__ import annotations

import functools
import io
import math
import os
from typing import Any

import numpy as np

from dlreplay.model import ArrayFile, ArrayMember, ImageFile, Layout

__all__ = [
    "DLIO_READER_FORMATS",
    "array_file_bytes",
    "dims_from_file_bytes",
    "dims_from_image_bytes",
    "dlio_dimension",
    "generated_dims",
    "generated_layout",
    "image_file_bytes",
    "resized_sample_bytes",
]

#: DLIO 2.0.0's reader classes (as its trace names them: ``reader/<Class>.read_index``) ->
#: the formats they read.
DLIO_READER_FORMATS: dict[str, tuple[str, ...]] = {
    "NPZReader": ("npz",),
    "NPYReader": ("npy",),
    "HDF5Reader": ("hdf5",),
    "ImageReader": ("jpeg", "png"),
    "TFReader": ("tfrecord",),
    "CSVReader": ("csv",),
    "IndexedBinaryReader": ("indexed_binary",),
    "IndexedBinaryMMapReader": ("indexed_binary",),
}
#: Pillow's JPEG quality when ``save`` is given none (DLIO gives none).
PIL_DEFAULT_JPEG_QUALITY = 75


def dlio_dimension(record_length: float) -> int:
    """DLIO's sample side (elements) for a record length in bytes: ``int(sqrt(record_length))``."""
    return max(int(math.sqrt(max(record_length, 0.0))), 1)


def generated_layout(
    fmt: str,
    samples_per_file: int,
    dims: tuple[int, int],
    *,
    compression: str = "none",
    compression_level: int | None = None,
    chunk_size: int | None = None,
) -> Layout | None:
    """The layout DLIO 2.0.0's generator writes for *fmt* with samples of ``dims = (d1, d2)``
    elements (``chunk_size``: bytes, when ``enable_chunking``); None for formats whose
    files have no inner structure to speak of (tfrecord, csv, indexed_binary)."""
    d1, d2, spf = int(dims[0]), int(dims[1]), int(samples_per_file)
    if fmt == "npz":
        return _npz_layout(spf, d1, d2, compression)
    if fmt == "npy":
        return _npy_layout(spf, d1, d2)
    if fmt == "hdf5":
        return _hdf5_layout(spf, d1, d2, compression, compression_level, chunk_size)
    if fmt in ("jpeg", "png"):
        return _image_layout(fmt, d1, d2)
    return None


def _npz_layout(spf: int, d1: int, d2: int, compression: str) -> Layout:
    """``np.savez`` (``np.savez_compressed`` with ``compression: zip``) of ``x`` (the records,
    ``(d1, d2, spf)``) and ``y`` (the labels)."""
    storage = "deflated" if compression == "zip" else "stored"
    comp = "deflate" if storage == "deflated" else None
    members = [
        ArrayMember(
            name="x.npy",
            dtype="|u1",
            shape=[d1, d2, spf],
            storage=storage,
            compression=comp,
            zip64=True,
        ),
        ArrayMember(
            name="y.npy",
            dtype="<i8",
            shape=[spf],
            storage=storage,
            compression=comp,
            zip64=True,
        ),
    ]
    size = array_file_bytes("npz", spf, (d1, d2)) if storage == "stored" else None
    return Layout(
        compressed=storage == "deflated",
        source="dlio",
        arrays=[ArrayFile(bytes=size, samples=spf, members=members)],
    )


def _npy_layout(spf: int, d1: int, d2: int) -> Layout:
    """``np.save`` of the records, ``(d1, d2, spf)``."""
    member = ArrayMember(name="", dtype="|u1", shape=[d1, d2, spf])
    return Layout(
        source="dlio",
        arrays=[
            ArrayFile(bytes=array_file_bytes("npy", spf, (d1, d2)), samples=spf, members=[member])
        ],
    )


def _hdf5_layout(
    spf: int,
    d1: int,
    d2: int,
    compression: str | None,
    compression_level: int | None,
    chunk_size: int | None,
) -> Layout:
    """``/records`` ``(spf, d1, d2)`` (chunked ``(1, c, c)`` with ``chunk_size``, filtered with
    ``compression``), then ``/labels``, h5py's defaults otherwise, in that order in the file
    (DLIO writes the records first). DLIO's HDF5 reader reads a sample's row of ``/records``
    and never ``/labels``."""
    chunks = None
    if chunk_size:
        c = min(int(math.ceil(math.sqrt(chunk_size))), d1)
        chunks = [1, c, c]
    filt = None if compression in (None, "none") else compression
    level = compression_level if filt == "gzip" else None
    records = ArrayMember(
        name="/records",
        dtype="|u1",
        shape=[spf, d1, d2],
        storage="chunked" if chunks or filt else "contiguous",
        chunks=chunks,
        compression=filt,
        compression_level=level,
        fill_value=0.0,
        track_times=True,
    )
    labels = ArrayMember(
        name="/labels",
        dtype="<i8",
        shape=[spf],
        storage="contiguous",
        fill_value=0.0,
        track_times=True,
        read_per_sample=False,
    )
    size = array_file_bytes("hdf5", spf, (d1, d2)) if records.storage == "contiguous" else None
    return Layout(
        source="dlio",
        hdf5_compression=filt,
        compression_level=level,
        hdf5_chunk_shape=chunks,
        arrays=[ArrayFile(bytes=size, samples=spf, members=[records, labels])],
    )


def _image_layout(fmt: str, d1: int, d2: int) -> Layout:
    """A ``(d1, d2)`` grayscale image (mode ``L``), JPEG at Pillow's default quality."""
    return Layout(
        source="dlio",
        images=[
            ImageFile(
                width=d2,
                height=d1,
                mode="L",
                quality=PIL_DEFAULT_JPEG_QUALITY if fmt == "jpeg" else None,
            )
        ],
    )


class _CountingSink(io.RawIOBase):
    """A seekable binary sink that keeps no data, only the file's extent (bytes)."""

    def __init__(self) -> None:
        self.pos = 0
        self.size = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        self.pos += n
        self.size = max(self.size, self.pos)
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (
            offset if whence == 0 else (self.pos + offset if whence == 1 else self.size + offset)
        )
        return self.pos

    def tell(self) -> int:
        return self.pos


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only uint8 array of *shape* backed by one byte (no memory per element)."""
    return np.lib.stride_tricks.as_strided(
        np.zeros(1, dtype=np.uint8), shape=shape, strides=(0,) * len(shape)
    )


#: Bytes of sample data up to which :func:`array_file_bytes` writes the file to a counting sink
#: (numpy's own writer, exact by construction); past it the size is computed from the formats'
#: structure (:func:`npy_file_bytes`, :func:`zip_file_bytes`), which takes no time for a file of
#: any size (writing a 1 TB file to the sink took minutes before anything was said).
MEASURED_BYTES = 16 * 2**20


def npy_header_bytes(shape: tuple[int, ...], descr: str) -> int:
    """Bytes of the header ``np.save`` writes for an array of *shape* and dtype *descr*."""
    sink = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": tuple(int(n) for n in shape)}
    try:
        np.lib.format.write_array_header_1_0(sink, header)
    except ValueError:  # a header over 64 KiB: numpy's format 2.0, as np.save chooses
        sink = io.BytesIO()
        np.lib.format.write_array_header_2_0(sink, header)
    return sink.tell()


def npy_file_bytes(shape: tuple[int, ...], descr: str, itemsize: int) -> int:
    """Bytes of the file ``np.save`` writes for a C-ordered array of *shape*."""
    return npy_header_bytes(shape, descr) + math.prod(int(n) for n in shape) * itemsize


#: What Python's :mod:`zipfile` writes past 2 GiB - 1 as zip64 (``zipfile.ZIP64_LIMIT``).
_ZIP64_LIMIT = (1 << 31) - 1


def zip_file_bytes(members: list[tuple[str, int]]) -> int:
    """Bytes of the zip :mod:`zipfile` writes (uncompressed, ``force_zip64`` as ``np.savez`` opens
    each member, to a seekable file) of *members* (name, bytes): each member's local header with
    its zip64 extra field and data, the central directory (zip64 fields for the sizes and
    offsets past the limit), and the end records (zip64 ones past the limit)."""
    offset = 0
    central = 0
    for name, size in members:
        over = 2 * (size > _ZIP64_LIMIT) + (offset > _ZIP64_LIMIT)
        central += 46 + len(name.encode()) + (4 + 8 * over if over else 0)
        offset += 30 + len(name.encode()) + 20 + size  # 20: the zip64 extra field
    end = 22 + (56 + 20 if offset > _ZIP64_LIMIT or central > _ZIP64_LIMIT else 0)
    return offset + central + end


def array_file_bytes(fmt: str, samples_per_file: int, dims: tuple[int, int]) -> int | None:
    """Bytes of the file DLIO 2.0.0 writes (uncompressed npz, npy, contiguous hdf5) for samples of
    ``dims`` elements; None for other formats. Computed, not written, past :data:`MEASURED_BYTES`."""
    d1, d2, spf = int(dims[0]), int(dims[1]), int(samples_per_file)
    if fmt == "hdf5":
        return _hdf5_overhead(spf) + d1 * d2 * spf
    if fmt not in ("npz", "npy"):
        return None
    if d1 * d2 * spf + 8 * spf > MEASURED_BYTES:
        x = npy_file_bytes((d1, d2, spf), "|u1", 1)
        if fmt == "npy":
            return x
        return zip_file_bytes([("x.npy", x), ("y.npy", npy_file_bytes((spf,), "<i8", 8))])
    sink = _CountingSink()
    if fmt == "npz":
        np.savez(sink, x=_zeros((d1, d2, spf)), y=[0] * spf)
    else:
        np.save(sink, _zeros((d1, d2, spf)))
    return sink.size


_H5_OVERHEAD: dict[int, int] = {}
#: Samples per file up to which :func:`_hdf5_overhead` writes a probe file; past it, each sample
#: more adds its int64 label (8 bytes) to the probe's overhead: the records and labels are each
#: one contiguous block, their headers of a fixed size.
_H5_PROBED_SAMPLES = 4096


def _hdf5_overhead(spf: int) -> int:
    """Bytes of a DLIO HDF5 file besides the records' data (contiguous storage keeps its
    data in one block, so this does not depend on the sample's size)."""
    if spf > _H5_PROBED_SAMPLES:
        return _hdf5_overhead(_H5_PROBED_SAMPLES) + 8 * (spf - _H5_PROBED_SAMPLES)
    if spf not in _H5_OVERHEAD:
        import tempfile

        import h5py

        # a real file: h5py's in-memory drivers size files differently from the default (sec2) driver
        with tempfile.TemporaryDirectory(prefix="dlreplay-dlio-") as tmp:
            path = os.path.join(tmp, "probe.hdf5")
            with h5py.File(path, "w") as hf:
                hf.create_dataset("records", (spf, 1, 1), dtype=np.uint8)[0:spf] = 0
                hf.create_dataset("labels", data=[0] * spf)
            _H5_OVERHEAD[spf] = os.path.getsize(path) - spf
    return _H5_OVERHEAD[spf]


def dims_from_file_bytes(
    fmt: str, samples_per_file: int, file_bytes: int, unseen: int = 0
) -> tuple[int, int] | None:
    """The square sample ``(d, d)`` whose DLIO file (:func:`array_file_bytes`) has *file_bytes*
    bytes, or up to *unseen* bytes more (a trace that saw the file up to its last read, not
    its end); None when there is none (not DLIO's generator, compressed or chunked files,
    or sides drawn at random)."""
    spf = max(int(samples_per_file), 1)
    base = array_file_bytes(fmt, spf, (1, 1))
    if base is None or file_bytes + unseen < base:
        return None
    guess = math.isqrt(max((file_bytes - base) // spf + 1, 1))
    for d in (guess, guess + 1, guess - 1, guess + 2):
        size = array_file_bytes(fmt, spf, (d, d)) if d >= 1 else None
        if size is not None and file_bytes <= size <= file_bytes + unseen:
            return d, d
    return None


#: Pixels of the largest image :func:`image_file_bytes` encodes; a larger one's size is that
#: image's bytes per pixel times its pixels (noise codes to the same bytes per pixel at any size,
#: within 0.1 % past 1024 x 1024), so a config's huge record length costs no minutes of encoding.
IMAGE_PROBE_PIXELS = 4096 * 4096
#: The largest side a JPEG may have (libjpeg's JPEG_MAX_DIMENSION).
JPEG_MAX_SIDE = 65500


@functools.lru_cache(maxsize=4)
def _probe_bytes_per_pixel(fmt: str) -> float:
    side = math.isqrt(IMAGE_PROBE_PIXELS)
    return image_file_bytes(fmt, (side, side)) / (side * side)


def image_file_bytes(fmt: str, dims: tuple[int, int]) -> int:
    """Bytes of one image DLIO 2.0.0 writes for *dims* ``(d1, d2)``: its noise (seeded as its
    generator seeds it), grayscale, saved by Pillow with DLIO's arguments; past
    :data:`IMAGE_PROBE_PIXELS`, estimated from an image of that many pixels."""
    from PIL import Image

    d1, d2 = int(dims[0]), int(dims[1])
    if d1 * d2 > IMAGE_PROBE_PIXELS:
        return round(_probe_bytes_per_pixel(fmt) * d1 * d2)
    records = np.random.RandomState(10).randint(255, size=(d1, d2), dtype=np.uint8)
    bio = io.BytesIO()
    Image.fromarray(records).save(bio, format="JPEG" if fmt == "jpeg" else "PNG", bits=8)
    return len(bio.getvalue())


def dims_from_image_bytes(
    fmt: str, file_bytes: float, tolerance: float = 0.02
) -> tuple[int, int] | None:
    """The square side whose DLIO image (:func:`image_file_bytes`) is nearest *file_bytes* (the
    files' median), within *tolerance* (relative); None when no side comes that close. JPEG
    sides are found to a multiple of 8 (the sides of one 8x8-block count encode to the same
    size give or take the noise)."""
    if fmt not in ("jpeg", "png") or file_bytes <= 0:
        return None
    step = 8 if fmt == "jpeg" else 1
    probe = 64
    per_pixel = image_file_bytes(fmt, (probe, probe)) / probe**2
    d = max(int(round(math.sqrt(file_bytes / per_pixel) / step)) * step, step)
    seen: dict[int, int] = {}
    for _ in range(16):  # move the window of 5 sides until the nearest is inside it
        for side in range(d - 2 * step, d + 3 * step, step):
            if side >= step and side not in seen:
                seen[side] = image_file_bytes(fmt, (side, side))
        best = min(seen, key=lambda k: abs(seen[k] - file_bytes))
        if abs(best - d) < 2 * step:
            break
        d = best
    best = min(seen, key=lambda k: abs(seen[k] - file_bytes))
    if abs(seen[best] - file_bytes) > tolerance * file_bytes:
        return None
    return best, best


def resized_sample_bytes(fmt: str, layout: Layout) -> int | None:
    """Bytes of the sample DLIO's reader hands over for a dataset of :func:`generated_layout`:
    its ``resized_image``, ``max_dimension**2`` uint8 with ``max_dimension`` the sample's side
    (``int(sqrt(record_length))``; ``record_length_resize`` when the config sets one, which a
    trace does not show)."""
    if fmt in ("jpeg", "png") and layout.images:
        side = int(math.sqrt(layout.images[0].width * layout.images[0].height))
        return side * side
    if fmt in ("npz", "npy", "hdf5") and layout.arrays and layout.arrays[0].members:
        member = next(
            (m for m in layout.arrays[0].members if m.name in ("x.npy", "", "/records")), None
        )
        if member is None or len(member.shape) != 3:
            return None
        d1, d2 = (
            (member.shape[0], member.shape[1])
            if fmt != "hdf5"
            else (member.shape[1], member.shape[2])
        )
        side = int(math.sqrt(d1 * d2))
        return side * side
    return None


def generated_dims(fmt: str, samples_per_file: int, layout: Layout) -> tuple[int, int] | None:
    """The sample ``(d1, d2)`` for which *layout* is what DLIO 2.0.0's generator writes (its
    structure: member names, dtypes, shapes and storage; images' size, mode and quality);
    None when it is not (a layout DLIO cannot write from its record length alone)."""
    if fmt in ("jpeg", "png"):
        if not layout.images or len(layout.images) != 1:
            return None
        im = layout.images[0]
        dims = (im.height, im.width)
    elif fmt in ("npz", "npy", "hdf5"):
        if not layout.arrays or len(layout.arrays) != 1 or not layout.arrays[0].members:
            return None
        s = layout.arrays[0]
        main = next((m for m in s.members if m.name in ("x.npy", "", "/records")), None)
        if main is None or len(main.shape) != 3:
            return None
        dims = (main.shape[1], main.shape[2]) if fmt == "hdf5" else (main.shape[0], main.shape[1])
    else:
        return None
    want = generated_layout(
        fmt,
        samples_per_file,
        dims,
        compression="zip" if layout.compressed else (layout.hdf5_compression or "none"),
        compression_level=layout.compression_level,
        chunk_size=layout.hdf5_chunk_bytes,
    )
    if want is None:
        return None
    if fmt in ("jpeg", "png"):
        a, b = layout.images[0], want.images[0]  # type: ignore[index]
        same = (
            a.width,
            a.height,
            a.mode,
            a.quality or None,
            a.progressive,
            a.subsampling in (None, "4:2:0"),
        ) == (b.width, b.height, b.mode, b.quality, False, True)
        return dims if same else None

    def key(m: ArrayMember) -> tuple[Any, ...]:
        return m.name, m.dtype, list(m.shape), m.storage or None, m.compression, m.chunks

    got = sorted(key(m) for m in layout.arrays[0].members)  # type: ignore[index]
    return dims if got == sorted(key(m) for m in want.arrays[0].members) else None  # type: ignore[index]
