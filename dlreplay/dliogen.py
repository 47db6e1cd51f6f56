"""What DLIO 2.0.0 writes: moved to :mod:`dlreplay.dlio.generator`; this name stays importable."""

from __future__ import annotations

from dlreplay.dlio.generator import (  # noqa: F401 (PIL_DEFAULT_JPEG_QUALITY: importable as before)
    DLIO_READER_FORMATS,
    PIL_DEFAULT_JPEG_QUALITY,
    array_file_bytes,
    dims_from_file_bytes,
    dims_from_image_bytes,
    dlio_dimension,
    generated_dims,
    generated_layout,
    image_file_bytes,
    resized_sample_bytes,
)

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
