"""S3 object storage for a replay: ``generate`` uploads the dataset to the model's bucket with its
layout (one object per file, key ``<storage.prefix><relative path>``), and the replay's workers
read samples through the job's client library (:class:`S3Reader`) with the model's request size
(``storage.request_bytes``: one ranged GET per request, a whole-object GET when the request
covers the object) and the model's workers (each its own client).

The endpoint and credentials come from the usual environment and files that boto3 reads
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
``~/.aws``), never from the model or a trace; nothing here writes them anywhere.

The client: the model's (``storage.client``): s3torchconnector (its map dataset's sequential
reader for whole GETs, its unbuffered range-based reader for ranges) or s3fs (``cat_file``: one
GET per request, through aiobotocore) where the model names it and it is installed, else boto3
(also for a job of aiobotocore without s3fs: the same GETs). Each GET is a DFTracer ``S3``/``GetObject``
event with the args :mod:`dlreplay.capture.inject.s3` records, so a traced replay distills and
compares as the job's capture does. Bytes; seconds.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.capture import REGIONS
from dlreplay.model.sections import Storage, WorkloadModel

from .common import ReplayError

__all__ = ["S3Reader", "S3Target", "s3_target", "upload_dataset", "uploaded"]


@dataclass(frozen=True)
class S3Target:
    """Where a replay's objects are and how to read them (picklable, no credentials)."""

    bucket: str
    prefix: str
    request_bytes: int | None
    client: str = "boto3"
    #: the job read its objects in ranged GETs (else whole: one GET per sample, whatever its size)
    ranged: bool = True

    def key(self, relpath: str) -> str:
        """The object of a generated file: the prefix, then its relative path, less a first
        folder that the prefix already ends with (``train/`` + ``train/img_1_of_8.npy`` is
        ``train/img_1_of_8.npy``: DLIO's generator puts the samples in ``train/``)."""
        rel = relpath.replace(os.sep, "/")
        first, _, rest = rel.partition("/")
        if rest and self.prefix.rstrip("/").rpartition("/")[2] == first:
            rel = rest
        return self.prefix + rel


def s3_target(storage: Storage | None) -> S3Target | None:
    """The target of a model's ``storage`` section (None unless ``storage_type: s3``).
    Raises ReplayError for an s3 section without a bucket (``storage_root``)."""
    if storage is None or storage.storage_type != "s3":
        return None
    if not storage.storage_root:
        raise ReplayError("storage.storage_type is s3 but storage.storage_root names no bucket")
    # the client library imported here, before the workers fork, as the job's main process had
    # it (s3torchconnector imports torch: seconds in each worker of each epoch otherwise)
    if storage.client == "s3torchconnector" and torch_client_available():
        importlib.import_module("s3torchconnector")
    elif storage.client == "s3fs" and importlib.util.find_spec("s3fs") is not None:
        importlib.import_module("s3fs")
    else:
        client()
    return S3Target(
        storage.storage_root,
        storage.prefix or "",
        storage.request_bytes,
        storage.client or "boto3",
        storage.ranged,
    )


def client() -> Any:
    """A boto3 S3 client from the environment and ~/.aws (a new session: fork-safe)."""
    try:
        import boto3
    except ImportError:
        raise ReplayError(
            "the model's storage is s3: install boto3 (pip install 'dlreplay[s3]')"
        ) from None
    return boto3.session.Session().client("s3")


def _errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def upload_dataset(model: WorkloadModel, data_dir: Path, files: Sequence[dict[str, Any]]) -> int:
    """Put each file of the generated dataset (the manifest's ``files``: ``path``, ``bytes``) into
    the model's bucket (created when missing) unless an object of the same size is there.
    Returns how many objects were uploaded; nothing for a model whose storage is not s3."""
    target = s3_target(model.storage)
    if target is None:
        return 0
    s3 = client()
    try:
        if target.bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", ())}:
            s3.create_bucket(Bucket=target.bucket)
        have: dict[str, int] = {}
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=target.bucket, Prefix=target.prefix
        )
        for page in pages:
            have.update((o["Key"], int(o["Size"])) for o in page.get("Contents", ()))
        sent = 0
        for f in files:
            key = target.key(f["path"])
            if have.get(key) == int(f["bytes"]):
                continue
            with open(data_dir / f["path"], "rb") as fh:
                s3.put_object(Bucket=target.bucket, Key=key, Body=fh)
            sent += 1
        return sent
    except _errors() as exc:
        raise ReplayError(f"s3://{target.bucket}/{target.prefix}: upload failed ({exc})") from None


def uploaded(result: Any, model: WorkloadModel) -> Any:
    """A generate result (``data_dir``, ``manifest``), after :func:`upload_dataset` of its files."""
    upload_dataset(model, Path(result.data_dir), result.manifest.get("files", ()))
    return result


class _TorchObjects:
    """s3torchconnector's map dataset over the replay's objects: its sequential reader for a job
    of whole GETs, its unbuffered range-based reader (one GET per read) for a job of ranges."""

    def __init__(self, target: S3Target, keys: Sequence[str]) -> None:
        from s3torchconnector import S3ClientConfig, S3MapDataset, S3ReaderConstructor

        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
        self.index = {k: i for i, k in enumerate(keys)}
        self.ranged = target.ranged
        self.objects = S3MapDataset.from_objects(
            [f"s3://{target.bucket}/{k}" for k in keys],
            region=region,
            endpoint=endpoint,
            s3client_config=S3ClientConfig(force_path_style=bool(endpoint)),
            reader_constructor=(
                S3ReaderConstructor.range_based(buffer_size=0)
                if target.ranged
                else S3ReaderConstructor.sequential()
            ),
        )

    def get(self, key: str, offset: int, length: int, whole: bool) -> bytes:
        reader = self.objects[self.index[key]]
        if not self.ranged:
            return bytes(reader.read())
        reader.seek(offset)
        return bytes(reader.read(length))


class _FsspecObjects:
    """s3fs's file system (fsspec) over the replay's bucket: ``cat_file`` of a range (one ranged
    GET) or of the whole object (one GET: objects below s3fs's block size)."""

    def __init__(self, target: S3Target) -> None:
        import s3fs

        self.bucket = target.bucket
        # a new instance per worker process (fsspec's instance cache and I/O loop are per process)
        self.fs = s3fs.S3FileSystem(skip_instance_cache=True)

    def get(self, key: str, offset: int, length: int, whole: bool) -> bytes:
        path = f"{self.bucket}/{key}"
        if whole:
            return bytes(self.fs.cat_file(path))
        return bytes(self.fs.cat_file(path, start=offset, end=offset + length))


def library_of(client_name: str | None) -> str:
    """The library the replay reads with for a model's ``storage.client``: s3torchconnector or
    s3fs where named and installed, else boto3."""
    if client_name == "s3torchconnector" and torch_client_available():
        return "s3torchconnector"
    if client_name == "s3fs" and importlib.util.find_spec("s3fs") is not None:
        return "s3fs"
    return "boto3"


def torch_client_available() -> bool:
    """Whether s3torchconnector can be imported here."""
    return importlib.util.find_spec("s3torchconnector") is not None


class S3Reader:
    """A worker's reader of samples from objects (the interface of the replay's file readers:
    :meth:`read` for ``--io posix``, :meth:`read_decoded` for ``--io library``). The client is
    the model's (``storage.client``, see :func:`library_of`)."""

    def __init__(self, target: S3Target, data_dir: str, sizes: dict[str, int], per_file: int):
        self.target, self.data_dir, self.sizes, self.per_file = target, data_dir, sizes, per_file
        self.library = library_of(target.client)
        self._client: Any = None
        self._pid = 0
        #: bytes the object store returned to this reader's GETs (``Content-Length``, or the bytes
        #: the client library handed over): what the storage served it
        self.returned_bytes = 0
        #: (the file readers' wait on a library's own threads: none here)
        self.library_wait = 0.0

    def _s3(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            if self.library == "boto3":
                self._client = client()
            elif self.library == "s3fs":
                self._client = _FsspecObjects(self.target)
            else:
                self._client = _TorchObjects(self.target, [self.target.key(p) for p in self.sizes])
            self._pid = os.getpid()
        return self._client

    def _fetch(self, key: str, offset: int, length: int, whole: bool) -> tuple[bytes, int | None]:
        """(the bytes, ContentLength when the client says it) of one GET."""
        s3 = self._s3()
        if self.library != "boto3":
            data = s3.get(key, offset, length, whole)
            return data, len(data)
        params: dict[str, Any] = {"Bucket": self.target.bucket, "Key": key}
        if not whole:
            params["Range"] = f"bytes={offset}-{offset + length - 1}"
        resp = s3.get_object(**params)
        return resp["Body"].read(), resp.get("ContentLength")

    def _get(self, key: str, offset: int, length: int, size: int) -> bytes:
        """One GET (a whole-object GET when the request is the whole object), traced: by the
        capture's hooks where the replay runs under them (``_dlreplay_s3`` loaded), else here."""
        whole = offset == 0 and length >= size
        hooked = "_dlreplay_s3" in sys.modules
        handle = None if hooked else REGIONS.begin("GetObject", "S3")
        try:
            data, nbytes = self._fetch(key, offset, length, whole)
        except Exception as exc:  # the client's own errors (botocore's, S3Exception)
            REGIONS.end(handle, error=1)
            raise ReplayError(
                f"s3://{self.target.bucket}/{key}: GET failed ({type(exc).__name__}: {exc})"
            ) from None
        self.returned_bytes += len(data) if nbytes is None else int(nbytes)
        REGIONS.end(
            handle,
            url=f"s3://{self.target.bucket}/{key}",
            bucket=self.target.bucket,
            key=key,
            offset=offset,
            length=None if whole else length,
            bytes=nbytes,
            object_size=size,
            client=self.library,
        )
        return data

    def _read(self, path: str, offset: int, length: int, transfer: int) -> list[bytes]:
        """The GETs' bodies for bytes [offset, offset+length) of *path*'s object, in order (not
        joined: a posix-mode read only counts them, and a 4 MiB join costs about a millisecond
        of CPU that the GET loop it is measured against does not spend)."""
        rel = os.path.relpath(path, self.data_dir)
        size = self.sizes[rel]
        step = max(1, int(self.target.request_bytes or transfer or length))
        if not self.target.ranged:  # whole GETs (a generated object may be a header longer)
            step = max(1, length)
        key = self.target.key(rel)
        return [
            self._get(key, pos, min(step, offset + length - pos), size)
            for pos in range(offset, offset + length, step)
        ]

    def read(self, path: str, offset: int, length: int, transfer: int, direct: bool = False) -> int:
        """Bytes [offset, offset+length) of *path*'s object in GETs; returns bytes read
        (*direct*, the file readers' O_DIRECT, has no meaning for objects: ignored)."""
        return sum(map(len, self._read(path, offset, length, transfer)))

    def read_decoded(self, path: str, k: int, rec: Sequence[int] | None) -> tuple[int, np.ndarray]:
        """Sample *k* of *path*'s object (its record *rec*, else its share of the object): (bytes
        read, the bytes as stored, uint8)."""
        size = self.sizes[os.path.relpath(path, self.data_dir)]
        if rec is not None:
            offset, length = int(rec[0]), int(rec[1])
        else:
            offset = size * k // self.per_file
            length = size * (k + 1) // self.per_file - offset
        data = b"".join(self._read(path, offset, length, 0))
        return len(data), np.frombuffer(data, dtype=np.uint8)

    def returned(self) -> int:
        """Bytes the object store has returned to this reader's GETs so far (see
        :attr:`returned_bytes`)."""
        return self.returned_bytes

    def close(self) -> None:
        self._client = None
