#!/usr/bin/env python
"""Image-tile classification from ONE HDF5 file of many small tiles, read in shuffled order.

``tiles.h5`` holds dataset ``x`` (uint8, [N, C, T, T]) chunked one tile per chunk
(so every sample is one chunk read plus the B-tree lookups that find it) and ``y``
(int64 labels, [N]).  Like most HDF5 training code, each DataLoader worker opens the
file once with ``h5py.File(path, "r")`` (h5py's default sec2 driver) and keeps it
open; samples are visited in shuffled order.  The model is a small 2D CNN.

``--num-files`` is the number of tiles here (the dataset is one file; ``--keep-open`` is
implied: every worker keeps its handle).
"""

from __future__ import annotations

import _common as C

JOB = "tiles_h5"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=4096, batch_size=64, workers=3)
    g = p.add_argument_group("tiles")
    g.add_argument("--tile", type=C.positive_int, default=32, help="tile edge T (pixels)")
    g.add_argument("--channels", type=C.positive_int, default=3, help="channels C per tile")
    g.add_argument("--num-classes", type=C.positive_int, default=8)
    return p.parse_args(argv)


def generate(args):
    import os

    import h5py
    import numpy as np

    n, c, t = args.num_files, args.channels, args.tile

    def gen(data_dir):
        rng = np.random.default_rng([args.seed, 0x711E])
        y = rng.integers(0, args.num_classes, size=n).astype(np.int64)
        yy, xx = np.mgrid[:t, :t].astype(np.float32) / t
        name = "tiles.h5"
        with h5py.File(os.path.join(data_dir, name), "w") as h:
            dx = h.create_dataset("x", shape=(n, c, t, t), dtype=np.uint8, chunks=(1, c, t, t))
            block = 256
            for a in range(0, n, block):
                b = min(n, a + block)
                lab = y[a:b, None, None, None].astype(np.float32)
                theta = np.pi * lab / args.num_classes
                wave = np.sin(2 * np.pi * (2 + lab) * (xx * np.cos(theta) + yy * np.sin(theta)))
                img = 0.5 + 0.35 * wave + rng.normal(0, 0.1, size=(b - a, c, t, t))
                dx[a:b] = (np.clip(img, 0, 1) * 255).astype(np.uint8)
            h.create_dataset("y", data=y)
        return [name]

    return gen


class H5Tiles:
    """Map-style dataset over one HDF5 file: index -> (x, y, bytes read, read calls, pid)."""

    def __init__(self, path, by_path=False):
        import h5py

        self.path = path
        self.by_path = by_path
        with h5py.File(path, "r") as h:
            self.n = int(h["x"].shape[0])
        self._pid = -1
        self._h5 = None
        self._fh = None

    def __getstate__(self):
        return {**self.__dict__, "_pid": -1, "_h5": None, "_fh": None}

    def __len__(self):
        return self.n

    def _file(self):
        import os

        import h5py

        if self._pid != os.getpid():  # one handle per worker process, opened on first use
            self._pid = os.getpid()
            if self.by_path:
                self._h5 = h5py.File(self.path, "r")
            else:
                self._fh = C.CountingFileIO(self.path)
                self._h5 = h5py.File(self._fh, "r")
        return self._h5

    def __getitem__(self, idx):
        import torch

        with C.CountedRead(self.by_path) as counted:
            h = self._file()
            x = h["x"][idx]
            y = h["y"][idx]
        xt = torch.from_numpy(x).float().div_(255.0)
        return (xt, torch.tensor(int(y), dtype=torch.int64), *C.io_tensors(counted))


def build_model(channels, num_classes, width):
    from torch import nn

    w = width
    return nn.Sequential(
        nn.Conv2d(channels, w, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * w, num_classes),
    )


def main(argv=None):
    args = parse_args(argv)
    params = {
        "seed": args.seed,
        "num_tiles": args.num_files,
        "tile": args.tile,
        "channels": args.channels,
        "num_classes": args.num_classes,
    }

    def build(files):
        from torch import nn

        model = build_model(args.channels, args.num_classes, C.scaled(16, args.compute_scale))
        return H5Tiles(files[0], args.by_path), model, nn.CrossEntropyLoss()

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
