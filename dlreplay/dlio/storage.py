"""DLIO's ``storage`` section <-> the model's ``storage`` (:class:`~dlreplay.model.sections.Storage`).

DLIO (and MLPerf Storage's object-storage configs) write ``storage: {storage_type: local_fs | s3,
storage_root: <bucket or directory>, storage_options: {...}}``, with ``dataset.data_folder``
relative to the root. Both ways keep ``storage_type`` and ``storage_root``, and of
``storage_options`` the client library (``storage_library``) and dlreplay's own
``request_bytes``, ``object_bytes``, ``ranged`` and ``prefix``. Endpoints and credentials
(``endpoint_url``, ``access_key_id``, ``secret_access_key``, ...) are never read into a model:
they stay in the config and are listed among the keys without effect (by name, never by value).
"""

from __future__ import annotations

from typing import Any

from dlreplay.model.sections import S3_CLIENTS, STORAGE_TYPES, Storage

from .reading import Importer

#: ``storage_options`` keys a model keeps: DLIO/MLPerf key -> Storage field.
OPTION_FIELDS = {
    "storage_library": "client",
    "prefix": "prefix",
    "object_bytes": "object_bytes",
    "request_bytes": "request_bytes",
    "ranged": "ranged",
}
_KINDS = {"client": "str", "prefix": "str", "object_bytes": "int>=0", "request_bytes": "int>0"}


def import_storage(imp: Importer) -> dict[str, Any] | None:
    """The model's ``storage`` from the config's ``storage`` section (None without one)."""
    if not imp.has("storage"):
        return None
    out: dict[str, Any] = {}
    kind, given = imp.get("storage.storage_type", "str", "local_fs")
    if kind not in STORAGE_TYPES:
        raise imp.fail(
            "storage.storage_type", f"expected one of {', '.join(STORAGE_TYPES)}, got {kind!r}"
        )
    out["storage_type"] = kind
    imp.mark("storage.storage_type", "storage.storage_type" if given else None)
    root, given = imp.get("storage.storage_root", "str")
    if given:
        out["storage_root"] = root
        imp.mark("storage.storage_root", "storage.storage_root")
    for key, name in OPTION_FIELDS.items():
        value, given = imp.get(f"storage.storage_options.{key}", _KINDS.get(name, "bool"))
        if not given:
            continue
        if name == "client" and value not in S3_CLIENTS:
            imp.notes.append(
                f"storage.storage_options.storage_library {value!r}: replayed with boto3"
            )
            continue
        out[name] = value
        imp.mark(f"storage.{name}", f"storage.storage_options.{key}")
    return out


def export_storage(storage: Storage | None) -> dict[str, Any] | None:
    """DLIO's ``storage`` section for the model's (None for a model without one)."""
    if storage is None:
        return None
    out: dict[str, Any] = {"storage_type": storage.storage_type}
    if storage.storage_root is not None:
        out["storage_root"] = storage.storage_root
    options = {
        key: getattr(storage, name)
        for key, name in OPTION_FIELDS.items()
        if getattr(storage, name) not in (None, False)
    }
    if options:
        out["storage_options"] = options
    return out
