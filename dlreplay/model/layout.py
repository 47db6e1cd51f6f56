"""The files' inside: how samples sit in the dataset's files (:class:`Layout` and the
structures it lists)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlreplay.model.base import model_field
from dlreplay.model.distribution import Distribution

#: Where a dataset layout came from: a fingerprint of the real files, inference from a
#: trace's reads, a DLIO config, or a user's edit.
LAYOUT_SOURCES = ("fingerprint", "inferred", "dlio", "user")
#: Where an indexed_binary file's record offsets and sizes are (:attr:`Layout.index`).
INDEX_STYLES = ("dlreplay", "dlio")
#: How an array is stored: NPZ members (``stored`` | ``deflated``), HDF5 datasets
#: (``contiguous`` | ``chunked`` | ``compact``).
ARRAY_STORAGE = ("stored", "deflated", "contiguous", "chunked", "compact")
#: File order of an HDF5 dataset's chunks relative to their logical (row-major) order.
CHUNK_ORDERS = ("sequential", "scattered")
#: JPEG chroma subsampling (Pillow's names).
SUBSAMPLINGS = ("4:4:4", "4:2:2", "4:2:0")


@dataclass(frozen=True, kw_only=True)
class ArrayMember:
    """One array inside a dataset file: an NPZ member, an HDF5 dataset, an NPY file's array.

    Sizes are in elements (``shape``, ``chunks``) or bytes; ``compression_ratio`` is
    stored bytes / logical bytes (how well the content compressed, e.g. 0.12).
    """

    name: str = model_field(doc="NPZ member name (x.npy), HDF5 dataset path (/group/x); NPY: empty")
    dtype: str = model_field(
        doc="numpy dtype string (<f4, |u1, |S16); HDF5 variable-length strings: vlen-str"
    )
    shape: list[int] = model_field(
        check="nonneg", doc="shape in elements; the sample axis first when there is one"
    )
    fortran_order: bool = model_field(False, doc="NPY/NPZ: column-major data")
    storage: str | None = model_field(
        None,
        choices=ARRAY_STORAGE,
        doc="stored | deflated (NPZ); contiguous | chunked | compact (HDF5)",
    )
    chunks: list[int] | None = model_field(
        None, check="positive", doc="HDF5 chunk shape in elements"
    )
    compression: str | None = model_field(
        None, doc="deflate (NPZ); HDF5 filter gzip | lzf | szip | ...; null = none"
    )
    compression_level: int | None = model_field(
        None, check="nonneg", doc="deflate/gzip level 0..9 (estimated for NPZ)"
    )
    compression_ratio: float | None = model_field(
        None, check="positive", doc="stored bytes / logical bytes"
    )
    shuffle: bool = model_field(False, doc="HDF5 byte-shuffle filter")
    fletcher32: bool = model_field(False, doc="HDF5 checksum filter")
    scaleoffset: int | None = model_field(None, doc="HDF5 scale-offset filter parameter")
    fill_value: float | None = model_field(None, doc="HDF5 fill value (numbers only)")
    chunk_order: str | None = model_field(
        None,
        choices=CHUNK_ORDERS,
        doc="HDF5: chunks in the file in logical order or scattered (written out of order)",
    )
    chunks_allocated: float | None = model_field(
        None, check="fraction", doc="HDF5: fraction of chunks written (sparse)"
    )
    track_times: bool = model_field(False, doc="HDF5: object modification times in the header")
    zip64: bool = model_field(
        False, doc="NPZ: the local header carries a zip64 extra field (numpy always writes one)"
    )
    attributes: int = model_field(0, check="nonneg", doc="HDF5 attributes on the dataset")
    attribute_bytes: int = model_field(0, check="nonneg", doc="bytes of those attributes' values")
    vlen_attributes: int = model_field(
        0, check="nonneg", doc="of those, variable-length (strings: a global heap)"
    )
    read_per_sample: bool = model_field(
        True,
        doc="the job reads this array's row of each sample it takes; false: it is in the "
        "file and never read (DLIO's HDF5 reader reads /records, not /labels)",
    )

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class ArrayFile:
    """One structure of an array file (NPZ, NPY, HDF5) and the share of files that have it."""

    weight: float = model_field(
        1.0, check="fraction", doc="share of the sampled files with this structure"
    )
    bytes: int | None = model_field(None, check="nonneg", doc="file size (median of those files)")
    file_bytes: list[int] | None = model_field(
        None, check="nonneg", doc="sizes of the sampled files with this structure"
    )
    samples: int | None = model_field(
        None, check="positive", doc="samples in such a file (the sample axis' length)"
    )
    members: list[ArrayMember] = model_field(factory=list, doc="arrays in file order")
    groups: list[str] = model_field(factory=list, doc="HDF5 groups other than the root")

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Hdf5File:
    """File-level HDF5 settings that move metadata and data in the file."""

    superblock_version: int | None = model_field(
        None, check="nonneg", doc="0/1: libver earliest; 2: v108; 3: v110+"
    )
    userblock_size: int = model_field(0, check="nonneg", doc="bytes before the superblock")
    alignment_interval: int | None = model_field(
        None, check="positive", doc="data addresses are multiples of this (H5Pset_alignment), bytes"
    )
    alignment_threshold: int | None = model_field(
        None, check="nonneg", doc="objects at least this large are aligned, bytes"
    )
    meta_block_size: int | None = model_field(
        None,
        check="positive",
        doc="metadata block size (H5Pset_meta_block_size), bytes; None: HDF5's 2048",
    )
    file_space_strategy: str | None = model_field(
        None, doc="fsm_aggr | page | aggr | none (H5Pset_file_space_strategy)"
    )
    file_space_page_size: int | None = model_field(
        None, check="positive", doc="page size of paged aggregation, bytes"
    )
    root_attributes: int = model_field(0, check="nonneg")
    root_attribute_bytes: int = model_field(0, check="nonneg")
    root_vlen_attributes: int = model_field(
        0, check="nonneg", doc="variable-length (string) root attributes"
    )

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class ImageFile:
    """One kind of image file (JPEG, PNG) and the share of files that look like it."""

    weight: float = model_field(1.0, check="fraction", doc="share of the sampled files")
    bytes: int | None = model_field(None, check="nonneg", doc="file size (median)")
    file_bytes: list[int] | None = model_field(
        None, check="nonneg", doc="sizes of the sampled files of this kind"
    )
    width: int = model_field(check="positive", doc="pixels")
    height: int = model_field(check="positive", doc="pixels")
    mode: str = model_field("RGB", doc="Pillow mode: L, LA, RGB, RGBA, P, CMYK, I;16")
    bits: int | None = model_field(
        None, check="positive", doc="PNG bit depth per channel (palette images: 1, 2, 4 or 8)"
    )
    quality: int | None = model_field(
        None, check="positive", doc="JPEG quality 1..100 (estimated from the tables)"
    )
    qtables: list[list[int]] | None = model_field(
        None, check="positive", doc="JPEG quantization tables (64 each)"
    )
    subsampling: str | None = model_field(None, choices=SUBSAMPLINGS, doc="JPEG chroma subsampling")
    progressive: bool = model_field(False, doc="JPEG progressive scans")
    optimize: bool = model_field(False, doc="JPEG optimized (non-standard) Huffman tables")
    restart_interval: int = model_field(
        0, check="nonneg", doc="JPEG restart interval (MCUs; 0 = none)"
    )
    interlaced: bool = model_field(False, doc="PNG Adam7 interlacing")
    chunk_bytes: int | None = model_field(
        None, check="positive", doc="PNG: bytes per IDAT chunk (the largest)"
    )
    compression_ratio: float | None = model_field(
        None, check="positive", doc="PNG: IDAT bytes / raw pixel bytes"
    )
    extra_bytes: int = model_field(
        0, check="nonneg", doc="metadata segments/chunks (EXIF, ICC, text), bytes"
    )

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class TableColumn:
    """One column of a Parquet/CSV file."""

    name: str = model_field()
    type: str = model_field(
        doc="Parquet physical/logical type (e.g. double, int64, binary); CSV: str"
    )
    compression: str | None = model_field(
        None, doc="Parquet codec (snappy, zstd, gzip, ...); null = uncompressed"
    )
    dictionary: bool = model_field(False, doc="Parquet dictionary encoding")
    row_bytes: float | None = model_field(
        None, check="nonneg", doc="Parquet: uncompressed bytes per row of this column"
    )
    disk_row_bytes: float | None = model_field(
        None,
        check="nonneg",
        doc="Parquet: bytes per row of this column's chunks on disk (encoded and compressed)",
    )
    read_per_sample: bool = model_field(
        True,
        doc="Parquet: the job reads this column (its chunk of each row group it takes); "
        "false: it is in the file and never read (a reader's columns=[...])",
    )

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class TableFile:
    """One structure of a table file (Parquet row groups and columns; CSV lines)."""

    weight: float = model_field(1.0, check="fraction")
    bytes: int | None = model_field(None, check="nonneg")
    file_bytes: list[int] | None = model_field(
        None, check="nonneg", doc="sizes of the sampled files with this structure"
    )
    rows: int | None = model_field(None, check="nonneg")
    row_groups: int | None = model_field(None, check="positive", doc="Parquet row groups per file")
    row_group_rows: int | None = model_field(
        None,
        check="positive",
        doc="Parquet: rows of a file's first row group (a writer's row_group_size: the last "
        "group holds the rest); null: the rows split evenly over row_groups",
    )
    data_page_size: int | None = model_field(
        None,
        check="positive",
        doc="Parquet data page size, uncompressed bytes: where the writer cut pages (the "
        "smallest pages of a column with several per chunk)",
    )
    data_page_values: int | None = model_field(
        None,
        check="positive",
        doc="Parquet values per data page of that column (a wide column's page holds at "
        "least the writer's batch of values)",
    )
    data_page_batch: int | None = model_field(
        None,
        check="positive",
        doc="Parquet values the writer added at a time (it checks the page size after each batch)",
    )
    data_page_version: int | None = model_field(
        None, check="positive", doc="Parquet data page format, 1 or 2"
    )
    compression_ratio: float | None = model_field(
        None, check="positive", doc="Parquet compressed / uncompressed bytes"
    )
    columns: list[TableColumn] = model_field(factory=list)
    header: bool = model_field(False, doc="CSV: the first line names the columns")
    delimiter: str | None = model_field(None, doc="CSV field delimiter")
    line_bytes: Distribution | None = model_field(
        None, check="nonneg", doc="CSV bytes per line, newline included"
    )

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class ShardMember:
    """One part of every sample of a shard (tar, arrow): a tar member's suffix (``npy``,
    ``jpg``, ``cls``: WebDataset's ``<key>.<suffix>`` members) or an Arrow column's name."""

    name: str = model_field(doc="tar member suffix or Arrow column name")
    bytes: Distribution = model_field(check="nonneg", doc="bytes of this part per sample")

    _track_defaults: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Per-format facts about how samples sit in files, that shape the I/O.

    The first six fields are the summary DLIO can express. The rest describe the
    files' inside as a dataset fingerprint saw it (``source: fingerprint``), as a trace's
    reads suggest (``inferred``) or as a config states: the structures observed, each
    with its share of files (``weight``) when files differ. ``generate`` reproduces them
    with the formats' own libraries; null = unknown (the generator's defaults).
    """

    compressed: bool = model_field(
        False, doc="npz: members deflate-compressed (np.savez_compressed)"
    )
    compression_level: int | None = model_field(
        None, check="nonneg", doc="compressor level (gzip 0..9)"
    )
    hdf5_chunk_shape: list[int] | None = model_field(
        None, check="positive", doc="HDF5 chunk shape in elements; null = contiguous"
    )
    hdf5_chunk_bytes: int | None = model_field(
        None, check="positive", doc="HDF5 chunk size in bytes (DLIO chunk_size)"
    )
    hdf5_compression: str | None = model_field(
        None, doc="HDF5 filter (gzip, lzf, ...); null = none"
    )
    records_per_file: int | None = model_field(
        None, check="positive", doc="physical records per file when not num_samples_per_file"
    )
    source: str | None = model_field(
        None, choices=LAYOUT_SOURCES, doc="where the fields below come from"
    )
    files_sampled: int | None = model_field(
        None, check="nonneg", doc="dataset files the fingerprint read"
    )
    arrays: list[ArrayFile] | None = model_field(
        None, doc="npz/npy/hdf5: file structures, most common first"
    )
    hdf5: Hdf5File | None = model_field(None, doc="HDF5 file-level settings")
    images: list[ImageFile] | None = model_field(
        None, doc="jpeg/png: kinds of images, most common first"
    )
    tables: list[TableFile] | None = model_field(None, doc="parquet/csv: file structures")
    record_bytes: Distribution | None = model_field(
        None, check="nonneg", doc="tfrecord: payload bytes per record"
    )
    index: str | None = model_field(
        None,
        choices=INDEX_STYLES,
        doc="indexed_binary: the record index; dlreplay: <file>.idx of (offset, length) "
        "pairs, read per sample; dlio: DLIO 2.0's <file>.off.idx and <file>.sz.idx "
        "(8-byte offsets and sizes), each read whole by every reader when it starts; "
        "null = dlreplay",
    )
    shard_members: list[ShardMember] | None = model_field(
        None,
        doc="tar/arrow shards: each sample's parts in order (tar members sharing a key, "
        "Arrow columns) and their bytes",
    )
    rows_per_batch: int | None = model_field(
        None, check="positive", doc="arrow: rows per record batch of an IPC stream shard"
    )

    # Unset fields are not written; their provenance is the one distill records for the
    # layout (``dataset.layout``), not one default per absent field.
    _omit_none: ClassVar[bool] = True
    _track_defaults: ClassVar[bool] = False
