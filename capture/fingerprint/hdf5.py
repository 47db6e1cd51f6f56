"""HDF5 files: superblock and file-space settings, groups, and per dataset its dtype, shape,
storage (chunks and where they sit in the file), filters, fill value and attributes; for the
file, the writer's alignment and metadata block size where the addresses show them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .common import FingerprintLimits, spread

_FS_STRATEGIES = {0: "fsm_aggr", 1: "page", 2: "aggr", 3: "none"}
_LAYOUTS = {0: "compact", 1: "contiguous", 2: "chunked", 3: "virtual"}


def _chunk_addresses(
    dset: Any, grid: Sequence[int], limit: int
) -> tuple[list[tuple[tuple[int, ...], int, int]], int, bool]:
    """(logical offset, file address, stored bytes) of chunks, the chunks allocated, and
    whether that count is estimated.

    Up to *limit* chunks in the grid, every allocated chunk (one pass over the chunk
    index); beyond, *limit* chunks spread over the grid looked up by coordinate, so a
    dataset of millions of chunks costs what *limit* index lookups cost.
    """
    dsid = dset.id
    total = int(np.prod(grid, dtype=np.int64)) if len(grid) else 1
    out: list[tuple[tuple[int, ...], int, int]] = []
    if total <= limit:
        if hasattr(dsid, "chunk_iter"):
            dsid.chunk_iter(
                lambda info: out.append((tuple(info.chunk_offset), info.byte_offset, info.size))
            )
        else:
            for i in range(dsid.get_num_chunks()):
                info = dsid.get_chunk_info(i)
                out.append((tuple(info.chunk_offset), info.byte_offset, info.size))
        return out, len(out), False
    probes = spread(total, min(limit, 1024))
    for i in probes:
        coord = tuple(
            int(c) * int(k) for c, k in zip(np.unravel_index(i, grid), dset.chunks, strict=True)
        )
        info = dsid.get_chunk_info_by_coord(coord)
        if info.byte_offset is not None:
            out.append((coord, info.byte_offset, info.size))
    return out, round(len(out) * total / max(len(probes), 1)), True


def _attr_bytes(obj: Any) -> tuple[int, int, int]:
    """(attributes, bytes of their values, variable-length ones) of an HDF5 object, without
    reading the values. Variable-length values (h5py's default for str) live in a global heap."""
    import h5py

    names = list(obj.attrs.keys())
    total = vlen = 0
    for name in names:
        try:
            aid = h5py.h5a.open(obj.id, name.encode() if isinstance(name, str) else name)
            total += aid.get_storage_size()
            text = h5py.check_string_dtype(aid.dtype)
            if (text is not None and text.length is None) or h5py.check_vlen_dtype(
                aid.dtype
            ) is not None:
                vlen += 1
        except Exception:  # an attribute of a type h5py cannot open
            pass
    return len(names), total, vlen


def _hdf5_dataset(
    name: str, dset: Any, limits: FingerprintLimits, addresses: list[tuple[int, int]]
) -> dict[str, Any]:
    """One dataset's layout; the file addresses of its raw data (a contiguous dataset's, or
    its first chunks') are added to *addresses*."""
    dcpl = dset.id.get_create_plist()
    layout = _LAYOUTS.get(dcpl.get_layout(), "other")
    dtype = _dtype_name(dset.dtype)
    itemsize = dset.dtype.itemsize if dtype not in ("vlen-str", "vlen") else 16
    logical = int(np.prod(dset.shape, dtype=np.int64)) * itemsize if dset.shape is not None else 0
    d: dict[str, Any] = {
        "name": name,
        "dtype": dtype,
        "shape": list(dset.shape) if dset.shape is not None else [],
        "storage": layout,
        "logical_bytes": logical,
        "track_times": bool(dcpl.get_obj_track_times()),
    }
    if dset.maxshape is not None and tuple(dset.maxshape) != tuple(dset.shape or ()):
        d["maxshape"] = [-1 if m is None else m for m in dset.maxshape]
    if dset.chunks:
        d["chunks"] = list(dset.chunks)
    d["filters"] = _filters(dset, dcpl)
    fv = dset.fillvalue
    if isinstance(fv, (np.number, int, float, np.bool_)) and np.isfinite(fv):
        d["fill_value"] = float(fv)
    d["attributes"], d["attribute_bytes"], d["vlen_attributes"] = _attr_bytes(dset)
    if layout == "chunked" and dset.chunks:
        d.update(_chunked_storage(dset, limits, addresses))
    else:
        d.update(_unchunked_storage(dset, layout, addresses))
    return d


def _dtype_name(dt: np.dtype) -> str:
    """The dtype as numpy spells it, or ``vlen-str`` / ``vlen`` for variable-length types."""
    import h5py

    vlen = h5py.check_string_dtype(dt)
    if vlen is not None and vlen.length is None:
        return "vlen-str"
    if h5py.check_vlen_dtype(dt) is not None:
        return "vlen"
    return dt.str if dt.names is None else str(dt.descr)


def _filters(dset: Any, dcpl: Any) -> dict[str, Any]:
    """The dataset's filters that are set, and the ids of those h5py does not name."""
    import h5py

    filters = {
        "compression": dset.compression,
        "compression_opts": dset.compression_opts,
        "shuffle": bool(dset.shuffle),
        "fletcher32": bool(dset.fletcher32),
        "scaleoffset": dset.scaleoffset,
    }
    out = {k: v for k, v in filters.items() if v not in (None, False)}
    nfilters = dcpl.get_nfilters()
    known = {
        h5py.h5z.FILTER_DEFLATE,
        h5py.h5z.FILTER_SHUFFLE,
        h5py.h5z.FILTER_FLETCHER32,
        h5py.h5z.FILTER_SZIP,
        h5py.h5z.FILTER_SCALEOFFSET,
        32000,
    }  # 32000: lzf
    others = [dcpl.get_filter(i)[0] for i in range(nfilters) if dcpl.get_filter(i)[0] not in known]
    if others:
        out["other_filter_ids"] = others
    return out


def _chunked_storage(
    dset: Any, limits: FingerprintLimits, addresses: list[tuple[int, int]]
) -> dict[str, Any]:
    """A chunked dataset's storage: chunks allocated of the grid, their stored bytes, where the
    first sits and whether the file holds them in logical order."""
    grid = [-(-s // c) for s, c in zip(dset.shape, dset.chunks, strict=True)]
    chunks, allocated, estimated = _chunk_addresses(dset, grid, limits.chunks_per_dataset)
    total = int(np.prod(grid, dtype=np.int64)) if grid else 1
    d: dict[str, Any] = {"chunks_allocated": allocated, "chunks_total": total}
    if estimated:  # the stored size of every chunk would read the whole chunk index
        d["chunks_estimated"] = True
        d["stored_bytes"] = (
            round(float(np.mean([c[2] for c in chunks])) * allocated) if chunks else 0
        )
    else:
        d["stored_bytes"] = sum(c[2] for c in chunks)
    if chunks:
        chunks.sort()  # logical (row-major) order
        offsets = np.array([c[1] for c in chunks], dtype=np.int64)
        sizes = np.array([c[2] for c in chunks], dtype=np.int64)
        d["address"] = int(offsets.min())
        inc = float((np.diff(offsets) > 0).mean()) if offsets.size > 1 else 1.0
        d["chunk_order"] = "sequential" if inc >= 0.9 else "scattered"
        d["chunk_increasing"] = round(inc, 4)
        d["chunk_stored_bytes"] = {
            "min": int(sizes.min()),
            "median": float(np.median(sizes)),
            "max": int(sizes.max()),
        }
        addresses.extend((int(o), int(s)) for o, s in zip(offsets[:64], sizes[:64], strict=True))
    return d


def _unchunked_storage(dset: Any, layout: str, addresses: list[tuple[int, int]]) -> dict[str, Any]:
    """A contiguous (or compact, or virtual) dataset's stored bytes, and a contiguous one's address."""
    d: dict[str, Any] = {"stored_bytes": int(dset.id.get_storage_size())}
    off = dset.id.get_offset() if layout == "contiguous" else None
    if off is not None:
        d["offset"] = d["address"] = int(off)
        addresses.append((int(off), d["stored_bytes"]))
    return d


def _alignment(addresses: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(threshold, interval) of the writer's ``H5Pset_alignment``, where the file shows it.

    Every raw-data address must be a multiple of a power of two >= 4 KiB, and at least one
    object must have been padded to it: it starts at a multiple past the end of the object
    before it, which did not end on one. Objects packed end to end whose sizes happen to be
    multiples (16 KiB chunks after a 64 KiB metadata block) are not evidence of alignment."""
    if len(addresses) < 3:
        return None
    ordered = sorted(addresses)
    interval = 1 << 24
    while interval >= 4096:
        if all(a % interval == 0 for a, _ in ordered):
            padded = any(
                (a + n) % interval and b > a + n
                for (a, n), (b, _) in zip(ordered, ordered[1:], strict=False)
            )
            return (min(n for _, n in ordered), interval) if padded else None
        interval >>= 1
    return None


#: HDF5's default metadata block size (H5Pset_meta_block_size), bytes
_DEFAULT_META_BLOCK = 2048


def _meta_block_size(
    addresses: list[tuple[int, int]], userblock: int, alignment: int | None
) -> int | None:
    """The writer's metadata block size (``H5Pset_meta_block_size``; h5py's
    ``File(meta_block_size=)``), where the file shows it: HDF5 allocates metadata (superblock,
    object headers, chunk indexes) from a block of that size and raw data after it, so the
    first raw data sits at the block's end when the first objects' metadata fits in it. The
    setting itself is not stored in the file. Recorded only when that first address (after
    the user block) is a power of two above HDF5's default 2 KiB that alignment does not
    explain; ``None`` otherwise (the default, or a file that does not tell)."""
    if not addresses:
        return None
    rel = min(a for a, _ in addresses) - userblock
    if rel <= _DEFAULT_META_BLOCK or rel & (rel - 1) or (alignment and rel <= alignment):
        return None
    return rel


def inspect_hdf5(path: str, limits: FingerprintLimits) -> dict[str, Any]:
    """The file's settings, its groups and datasets (up to ``limits.max_objects`` each), and the
    alignment and metadata block size the datasets' addresses show."""
    import h5py

    datasets: list[dict[str, Any]] = []
    groups: list[str] = []
    addresses: list[tuple[int, int]] = []
    omitted = 0
    with h5py.File(path, "r") as f:
        fcpl = f.id.get_create_plist()
        version = fcpl.get_version()
        out: dict[str, Any] = {
            "superblock_version": int(version[0]),
            "userblock_size": int(fcpl.get_userblock()),
            "offset_bytes": int(fcpl.get_sizes()[0]),
        }
        try:
            strategy, _persist, _threshold = fcpl.get_file_space_strategy()
            out["file_space_strategy"] = _FS_STRATEGIES.get(int(strategy), str(strategy))
            if out["file_space_strategy"] == "page":
                out["file_space_page_size"] = int(fcpl.get_file_space_page_size())
        except Exception:  # older HDF5 without file-space strategies
            pass
        out["root_attributes"], out["root_attribute_bytes"], out["root_vlen_attributes"] = (
            _attr_bytes(f)
        )

        # Links walked depth first in h5py's link order (by name unless track_order), as
        # visititems goes; not visititems itself, whose object info reads every chunk index.
        def walk(group: Any) -> None:
            nonlocal omitted
            for key in group:
                if not isinstance(group.get(key, getlink=True), h5py.HardLink):
                    continue  # soft/external links point at objects listed elsewhere (or in other files)
                obj = group[key]
                if isinstance(obj, h5py.Group):
                    if len(groups) < limits.max_objects:
                        groups.append(obj.name)
                    walk(obj)
                elif isinstance(obj, h5py.Dataset):
                    if len(datasets) < limits.max_objects:
                        datasets.append(_hdf5_dataset(obj.name, obj, limits, addresses))
                    else:
                        omitted += 1

        walk(f)
    if omitted:
        out["datasets_omitted"] = omitted
    aligned = _alignment(addresses)
    if aligned:
        out["alignment_threshold"], out["alignment_interval"] = aligned
    meta_block = _meta_block_size(addresses, out["userblock_size"], aligned[1] if aligned else None)
    if meta_block:
        out["meta_block_size"] = meta_block
    out.update(groups=groups, datasets=datasets)
    return out
