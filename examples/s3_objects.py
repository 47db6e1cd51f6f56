#!/usr/bin/env python
"""A training job that reads its samples from S3 objects with boto3.

A map-style ``torch.utils.data.Dataset`` over the objects under ``s3://<bucket>/<prefix>``
(one sample per object: ``.npy`` float32 arrays, or ``.jpg`` images decoded with Pillow), read
with ``get_object``: the whole object in one GET (default), or in ranged GETs of
``--range-bytes`` each (``Range: bytes=a-b``, as chunked readers and s3torchconnector's
range-based reader do); ``--client s3torchconnector`` reads through s3torchconnector's
``S3MapDataset`` instead, ``--client s3fs`` through s3fs (fsspec; aiobotocore underneath):
``cat_file`` of the whole object, or of each range. A ``DataLoader`` with ``--workers`` worker processes (each its own
boto3 client) feeds a tiny model.

The endpoint and credentials come from the usual places boto3 reads (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``~/.aws``), never
from arguments, and nothing of them is written into ``--report``.

``--populate`` uploads the dataset (``--num-objects`` objects of ``--sample-bytes`` bytes of
payload each, deterministic from ``--seed``) to the bucket, creating it, and exits.

``--report PATH`` writes JSON: objects, GETs and bytes read per epoch, and the SHA-256 of every
sample's bytes with how many times it was read (the same with and without a capture).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys

JOB = "s3_objects"
SCHEMA = "dlreplay.example.s3_objects"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=f"{JOB}.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--bucket", default="dlreplay-s3-objects")
    p.add_argument("--prefix", default="train/", help="key prefix of the dataset's objects")
    p.add_argument("--format", choices=("npy", "jpeg"), default="npy")
    p.add_argument("--num-objects", type=int, default=16)
    p.add_argument(
        "--sample-bytes", type=int, default=65536, help="payload bytes per sample (npy data)"
    )
    p.add_argument(
        "--range-bytes", type=int, default=0, help="ranged GETs of this many bytes (0: whole)"
    )
    p.add_argument(
        "--client",
        choices=("boto3", "s3torchconnector", "s3fs"),
        default="boto3",
        help="s3torchconnector: its S3MapDataset's readers (sequential; range-based, unbuffered, "
        "with --range-bytes); s3fs: cat_file of the object or of each range",
    )
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compute-ms", type=float, default=5.0, help="extra sleep per step (ms)")
    p.add_argument("--populate", action="store_true", help="upload the dataset and exit")
    p.add_argument("--report", default=None, help="write a JSON report here")
    args = p.parse_args(argv)
    if args.num_objects < 1 or args.sample_bytes < 16 or args.range_bytes < 0:
        p.error("--num-objects >= 1, --sample-bytes >= 16, --range-bytes >= 0")
    return args


def client():
    """A boto3 S3 client configured from the environment and ~/.aws (one per process)."""
    import boto3

    return boto3.session.Session().client("s3")


def sample_body(fmt: str, i: int, nbytes: int, seed: int) -> bytes:
    """The bytes of object *i*: an ``.npy`` of float32, or a JPEG of about that many pixels."""
    import numpy as np

    rng = np.random.default_rng([seed, i])
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, rng.standard_normal(max(1, nbytes // 4), dtype=np.float32))
        return buf.getvalue()
    from PIL import Image

    side = max(8, int((nbytes / 3) ** 0.5))
    pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def populate(args) -> int:
    s3 = client()
    try:
        s3.create_bucket(Bucket=args.bucket)
    except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        pass
    ext = "npy" if args.format == "npy" else "jpg"
    for i in range(args.num_objects):
        body = sample_body(args.format, i, args.sample_bytes, args.seed)
        s3.put_object(Bucket=args.bucket, Key=f"{args.prefix}sample_{i:05d}.{ext}", Body=body)
    print(f"{JOB}: uploaded {args.num_objects} objects to s3://{args.bucket}/{args.prefix}")
    return 0


class S3Objects:
    """Map-style dataset: index -> (tensor, bytes read, GETs). Keys and sizes are listed once
    (in the main process); each worker process opens its own client on first use."""

    def __init__(
        self,
        bucket: str,
        objects: list[tuple[str, int]],
        fmt: str,
        range_bytes: int,
        library: str = "boto3",
    ):
        self.bucket, self.objects, self.fmt, self.range_bytes = bucket, objects, fmt, range_bytes
        self.library = library
        self._client = None
        self._pid = None

    def __len__(self):
        return len(self.objects)

    def _s3(self):
        if self._client is None or self._pid != os.getpid():
            make = {"boto3": client, "s3fs": self._fsspec}.get(self.library, self._torch_dataset)
            self._client, self._pid = make(), os.getpid()
        return self._client

    def _torch_dataset(self):
        """s3torchconnector's map dataset over the objects (endpoint and region from the
        environment; path-style addressing when an endpoint is given)."""
        from s3torchconnector import S3ClientConfig, S3MapDataset, S3ReaderConstructor

        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
        readers = (
            S3ReaderConstructor.range_based(buffer_size=0)
            if self.range_bytes
            else S3ReaderConstructor.sequential()
        )
        return S3MapDataset.from_objects(
            [f"s3://{self.bucket}/{key}" for key, _ in self.objects],
            region=region,
            endpoint=endpoint,
            s3client_config=S3ClientConfig(force_path_style=bool(endpoint)),
            reader_constructor=readers,
        )

    @staticmethod
    def _fsspec():
        """s3fs's file system (endpoint and credentials from the environment), one per process."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True)

    def _fetch_fsspec(self, idx: int) -> tuple[bytes, int]:
        key, size = self.objects[idx]
        fs, path = self._s3(), f"{self.bucket}/{key}"
        if not self.range_bytes:
            return fs.cat_file(path), 1
        parts = [
            fs.cat_file(path, start=off, end=min(off + self.range_bytes, size))
            for off in range(0, size, self.range_bytes)
        ]
        return b"".join(parts), len(parts)

    def _fetch_torch(self, idx: int) -> tuple[bytes, int]:
        _, size = self.objects[idx]
        reader = self._s3()[idx]
        if not self.range_bytes:
            return reader.read(), 1
        parts = []
        for off in range(0, size, self.range_bytes):
            reader.seek(off)
            parts.append(reader.read(min(self.range_bytes, size - off)))
        return b"".join(parts), len(parts)

    def fetch(self, idx: int) -> tuple[bytes, int]:
        """The object's bytes and how many GETs read them."""
        if self.library == "s3fs":
            return self._fetch_fsspec(idx)
        if self.library != "boto3":
            return self._fetch_torch(idx)
        key, size = self.objects[idx]
        s3 = self._s3()
        if not self.range_bytes:
            return s3.get_object(Bucket=self.bucket, Key=key)["Body"].read(), 1
        parts = []
        for off in range(0, size, self.range_bytes):
            last = min(off + self.range_bytes, size) - 1
            resp = s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={off}-{last}")
            parts.append(resp["Body"].read())
        return b"".join(parts), len(parts)

    def __getitem__(self, idx):
        import numpy as np
        import torch

        data, gets = self.fetch(idx)
        if self.fmt == "npy":
            x = np.load(io.BytesIO(data))
        else:
            from PIL import Image

            x = np.asarray(Image.open(io.BytesIO(data)), dtype=np.float32).ravel()
        digest = hashlib.sha256(data).hexdigest()
        return (
            torch.from_numpy(np.ascontiguousarray(x[:16], dtype=np.float32)),
            len(data),
            gets,
            digest,
        )


def list_objects(bucket: str, prefix: str) -> list[tuple[str, int]]:
    s3 = client()
    out: list[tuple[str, int]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [(o["Key"], int(o["Size"])) for o in page.get("Contents", ())]
    return sorted(out)


def train(args) -> dict:
    import time

    import torch
    from torch.utils.data import DataLoader

    objects = list_objects(args.bucket, args.prefix)
    if not objects:
        raise SystemExit(f"{JOB}: no objects under s3://{args.bucket}/{args.prefix} (--populate)")
    ds = S3Objects(args.bucket, objects, args.format, args.range_bytes, args.client)
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(args.seed),
        persistent_workers=False,
    )
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    epochs, digests = [], {}
    for epoch in range(args.epochs):
        nbytes = gets = 0
        for x, n, g, d in loader:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.compute_ms / 1000.0)
            nbytes += int(n.sum())
            gets += int(g.sum())
            for k in d:
                digests[k] = digests.get(k, 0) + 1
        epochs.append({"epoch": epoch, "bytes": nbytes, "gets": gets})
    return {
        "schema": SCHEMA,
        "format_version": 1,
        "objects": len(objects),
        "object_bytes": sum(s for _, s in objects),
        "epochs": epochs,
        # SHA-256 of each sample's bytes, with how many times the epochs read it
        "sample_digests": dict(sorted(digests.items())),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.populate:
        return populate(args)
    report = train(args)
    print(f"{JOB}: {report['objects']} objects, epochs {report['epochs']}")
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
