#!/usr/bin/env python
"""Streaming shards: an ``IterableDataset`` over WebDataset-style tar shards (or Arrow files).

The dataset is ``--num-files`` shards of ``--samples-per-shard`` samples each:

* ``--format tar`` (default): ``shard-00000.tar`` ... , each sample a group of tar members
  sharing a key (``000000_000003.npy`` + ``000000_000003.cls``: an ``np.save`` array of
  ``--sample-bytes`` bytes, or a JPEG of ``--image-size`` pixels with ``--member jpeg``, and
  its label as ASCII), as WebDataset writes them;
* ``--format arrow``: ``shard-00000.arrow``, an Arrow IPC stream (HF ``datasets``' cache
  format) of record batches of ``--rows-per-batch`` rows, columns ``data`` (the sample's
  bytes) and ``label``.

Each DataLoader worker streams whole shards, one after the other, and yields their samples:
the shards are split over ranks (``RANK``/``WORLD_SIZE``) then workers
(``get_worker_info``), ``--split interleaved`` (rank r takes shards r::R, worker w of those
w::W, as webdataset's ``split_by_node``/``split_by_worker``) or ``contiguous`` (blocks). A
``--shuffle-buffer N`` shuffles samples through a buffer of N per worker (webdataset's
``.shuffle(N)``).

Readers: ``--reader tarfile`` reads a tar shard with ``tarfile`` in stream mode (``r|``) on a
byte-counting unbuffered file (``--by-path``: ``tarfile.open(path, "r|")``), ``--reader
webdataset`` through the ``webdataset`` library (``pip install webdataset``), ``--reader
pyarrow`` an Arrow shard with ``pyarrow.ipc.open_stream`` on a ``pyarrow.OSFile``.
"""

from __future__ import annotations

import _common as C

JOB = "shards_tar"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=8, batch_size=8, workers=2)
    p.set_defaults(shuffle=False)  # an IterableDataset has no sampler; --shuffle-buffer instead
    g = p.add_argument_group("shards")
    g.add_argument("--format", choices=("tar", "arrow"), default="tar", help="shard format")
    g.add_argument(
        "--reader",
        choices=("tarfile", "webdataset", "pyarrow"),
        default=None,
        help="library reading the shards (default: tarfile for tar, pyarrow for arrow)",
    )
    g.add_argument("--samples-per-shard", type=C.positive_int, default=16)
    g.add_argument(
        "--sample-bytes", type=C.positive_int, default=8192, help="bytes of each sample's array"
    )
    g.add_argument("--member", choices=("npy", "jpeg"), default="npy", help="tar sample member")
    g.add_argument("--image-size", type=C.positive_int, default=32, help="--member jpeg: edge")
    g.add_argument(
        "--rows-per-batch", type=C.positive_int, default=4, help="arrow: rows per record batch"
    )
    g.add_argument("--split", choices=("interleaved", "contiguous"), default="interleaved")
    g.add_argument("--shuffle-buffer", type=C.nonneg_int, default=0, help="samples (0: no shuffle)")
    g.add_argument("--num-classes", type=C.positive_int, default=4)
    args = p.parse_args(argv)
    if args.shuffle:
        p.error("--shuffle: an IterableDataset cannot be shuffled by the loader; --shuffle-buffer")
    args.reader = args.reader or ("pyarrow" if args.format == "arrow" else "tarfile")
    if (args.format == "arrow") != (args.reader == "pyarrow"):
        p.error(f"--reader {args.reader} does not read --format {args.format} shards")
    return args


def _sample_payload(args, shard, i, rng):
    """(member suffix, bytes) of one sample's data."""
    import io

    import numpy as np

    if args.member == "jpeg":
        from PIL import Image

        s = args.image_size
        arr = (rng.random((s, s, 3)) * 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr, "RGB").save(buf, format="JPEG", quality=90)
        return "jpg", buf.getvalue()
    buf = io.BytesIO()
    np.save(buf, rng.standard_normal(max(1, args.sample_bytes // 4)).astype(np.float32))
    return "npy", buf.getvalue()


def generate(args):
    import io
    import os
    import tarfile

    import numpy as np

    def gen(data_dir):
        rel = []
        for s in range(args.num_files):
            rng = np.random.default_rng([args.seed, s])
            name = f"shard-{s:05d}.{args.format}"
            samples = []
            for i in range(args.samples_per_shard):
                label = (s * args.samples_per_shard + i) % args.num_classes
                samples.append((f"{s:06d}_{i:06d}", *_sample_payload(args, s, i, rng), label))
            path = os.path.join(data_dir, name)
            if args.format == "tar":
                with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
                    for key, ext, payload, label in samples:
                        for suffix, blob in ((ext, payload), ("cls", str(label).encode())):
                            info = tarfile.TarInfo(f"{key}.{suffix}")
                            info.size, info.mtime, info.mode = len(blob), 0, 0o644
                            tf.addfile(info, io.BytesIO(blob))
            else:
                _write_arrow(path, samples, args.rows_per_batch)
            rel.append(name)
        return rel

    return gen


def _write_arrow(path, samples, rows_per_batch):
    import pyarrow as pa

    schema = pa.schema([("key", pa.string()), ("data", pa.binary()), ("label", pa.int64())])
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for b in range(0, len(samples), rows_per_batch):
            part = samples[b : b + rows_per_batch]
            writer.write_batch(
                pa.record_batch(
                    [
                        pa.array([k for k, *_ in part]),
                        pa.array([p for _, _, p, _ in part], type=pa.binary()),
                        pa.array([lab for *_, lab in part], type=pa.int64()),
                    ],
                    schema=schema,
                )
            )


def split_shards(shards, rank, world, worker, workers, how):
    """This worker's shards: split over ranks, then over the rank's workers."""
    import numpy as np

    if how == "interleaved":
        return list(shards)[rank::world][worker::workers]
    mine = list(np.array_split(np.arange(len(shards)), world)[rank])
    return [shards[i] for i in np.array_split(np.asarray(mine, dtype=int), workers)[worker]]


def _where():
    """(rank, world size, worker id, workers) of the calling process."""
    import os

    from torch.utils.data import get_worker_info

    info = get_worker_info()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return rank, world, (info.id if info else 0), (info.num_workers if info else 1)


def _shuffled(samples, buffer, seed):
    """webdataset's ``.shuffle(buffer)``: a buffer of *buffer* samples, a random one out each time."""
    import random

    if buffer <= 1:
        yield from samples
        return
    rng, buf = random.Random(seed), []
    for s in samples:
        buf.append(s)
        if len(buf) >= buffer:
            yield buf.pop(rng.randrange(len(buf)))
    while buf:
        yield buf.pop(rng.randrange(len(buf)))


class ShardStream:
    """Mixin body of the IterableDataset (built in :func:`make_dataset`, torch imported late)."""

    def __init__(self, files, args):
        self.files, self.args = sorted(files), args

    def __len__(self):
        rank, world = _where()[:2]
        return len(self.files[rank::world]) * self.args.samples_per_shard

    def _raw_samples(self, shards):
        """(data bytes, member suffix, label) of every sample of *shards*, streamed in order."""
        a = self.args
        if a.reader == "pyarrow":
            yield from _arrow_samples(shards)
        elif a.reader == "webdataset":
            yield from _wds_samples(shards)
        else:
            yield from _tar_samples(shards, a.by_path)

    def __iter__(self):
        import torch

        a = self.args
        rank, world, worker, workers = _where()
        shards = split_shards(self.files, rank, world, worker, workers, a.split)
        by_path = a.by_path or a.reader != "tarfile"
        counter = C.CountedRead(by_path)
        counter.__enter__()
        seed = (torch.initial_seed() + worker) % 2**32
        for data, ext, label in _shuffled(self._raw_samples(shards), a.shuffle_buffer, seed):
            counter.__exit__()  # the bytes read since the last sample go with this one
            x = _decode(data, ext, a)
            out = (x, torch.tensor(label, dtype=torch.int64), *C.io_tensors(counter))
            counter.__enter__()
            yield out


def _tar_samples(shards, by_path):
    import tarfile

    for path in shards:
        fh = None if by_path else C.CountingFileIO(path)
        with tarfile.open(path if by_path else None, "r|", fileobj=fh) as tf:
            group, key = {}, None
            for m in tf:
                k, _, ext = m.name.partition(".")
                if key is not None and k != key:
                    yield _group(group)
                    group = {}
                key = k
                group[ext] = tf.extractfile(m).read()
            if group:
                yield _group(group)
        if fh is not None:
            fh.close()


def _group(group):
    ext = "jpg" if "jpg" in group else "npy"
    return group[ext], ext, int(group["cls"])


def _wds_samples(shards):
    import webdataset as wds

    # the shards are this worker's already: no further split by node or worker
    ds = wds.WebDataset(
        shards,
        shardshuffle=False,
        nodesplitter=None,
        workersplitter=None,
        empty_check=False,
    )
    for sample in ds:
        ext = "jpg" if "jpg" in sample else "npy"
        yield sample[ext], ext, int(sample["cls"])


def _arrow_samples(shards):
    import pyarrow as pa

    for path in shards:
        with pa.OSFile(path, "rb") as f:
            reader = pa.ipc.open_stream(f)
            for batch in reader:
                data = batch.column("data").to_pylist()
                labels = batch.column("label").to_pylist()
                yield from ((d, "npy", lab) for d, lab in zip(data, labels, strict=True))


def _decode(data, ext, args):
    import io

    import numpy as np
    import torch

    if ext == "jpg":
        from PIL import Image

        im = Image.open(io.BytesIO(data)).convert("RGB")
        arr = np.asarray(im, dtype=np.float32).reshape(-1) / 255.0
    else:
        arr = np.load(io.BytesIO(data))
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))


def make_dataset(files, args):
    from torch.utils.data import IterableDataset

    cls = type("ShardDataset", (ShardStream, IterableDataset), {})
    return cls(files, args)


def main(argv=None):
    args = parse_args(argv)
    params = {
        "seed": args.seed,
        "num_files": args.num_files,
        "format": args.format,
        "samples_per_shard": args.samples_per_shard,
        "member": args.member,
        "sample_bytes": args.sample_bytes if args.member == "npy" else None,
        "image_size": args.image_size if args.member == "jpeg" else None,
        "rows_per_batch": args.rows_per_batch if args.format == "arrow" else None,
        "num_classes": args.num_classes,
    }

    def build(files):
        import warnings

        from torch import nn

        if args.reader != "tarfile":  # imported here, as a job does: forked workers inherit it
            __import__(args.reader)
        # a worker's last batch may be partial: the loader yields more batches than len() says
        warnings.filterwarnings("ignore", message=r".*IterableDataset.*length")
        n = 3 * args.image_size**2 if args.member == "jpeg" else max(1, args.sample_bytes // 4)
        width = C.scaled(64, args.compute_scale)
        model = nn.Sequential(
            nn.Linear(n, width), nn.ReLU(inplace=True), nn.Linear(width, args.num_classes)
        )
        return make_dataset(files, args), model, nn.CrossEntropyLoss()

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
