#!/usr/bin/env python
"""cosmoflow-like 3D regression trained on HDF5 files holding several samples each.

Each ``univ_XXXXX.h5`` holds dataset ``x`` (float32, [samples_per_file, C, V,
V, V]) and ``y`` (float32, [samples_per_file, 4]).  A global sample index maps
to ``(file, row) = divmod(index, samples_per_file)``; with ``--shuffle`` rows
are read in shuffled order.  Every sample opens its file with ``h5py.File`` on
an unbuffered, byte-counting ``io.FileIO`` (h5py's file-like-object driver) and
reads one row of ``x`` and ``y``.  The model is a small Conv3d regression net.
"""

from __future__ import annotations

import _common as C

JOB = "cosmoflow_h5"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=8, batch_size=8, workers=3)
    g = p.add_argument_group("cosmoflow")
    g.add_argument("--samples-per-file", type=C.positive_int, default=4)
    g.add_argument(
        "--volume",
        type=C.positive_int,
        default=32,
        help="edge V of the CxVxVxV samples (multiple of 4)",
    )
    g.add_argument("--channels", type=C.positive_int, default=4, help="channels C per sample")
    layout = g.add_mutually_exclusive_group()
    layout.add_argument(
        "--chunked",
        dest="chunked",
        action="store_true",
        help="store x/y chunked along the sample axis (--chunk-rows rows per chunk)",
    )
    layout.add_argument(
        "--contiguous", dest="chunked", action="store_false", help="contiguous layout (default)"
    )
    p.set_defaults(chunked=False)
    g.add_argument(
        "--chunk-rows", type=C.positive_int, default=1, help="samples per chunk with --chunked"
    )
    g.add_argument(
        "--chunk-edge",
        type=C.positive_int,
        default=None,
        help="with --chunked: chunks of 1 channel x E^3 voxels (tiny chunks: one sample becomes "
        "C*(V/E)^3 chunk reads); default: whole samples",
    )
    args = p.parse_args(argv)
    if args.volume % 4:
        p.error("--volume must be a multiple of 4")
    return args


def generate(args):
    import os

    import h5py
    import numpy as np

    n, c, v = args.samples_per_file, args.channels, args.volume

    def gen(data_dir):
        rel = []
        k = np.fft.fftfreq(v).astype(np.float32)
        k2 = k[:, None, None] ** 2 + k[None, :, None] ** 2 + k[None, None, :] ** 2
        for i in range(args.num_files):
            rng = np.random.default_rng([args.seed, i])
            # 4 "cosmological parameters" per sample; each sets the spectral
            # slope / amplitude of a Gaussian random field so the target is
            # learnable from the volume.
            y = rng.uniform(-1.0, 1.0, size=(n, 4)).astype(np.float32)
            x = np.empty((n, c, v, v, v), dtype=np.float32)
            for s in range(n):
                slope = 1.5 + 0.5 * y[s, 0]
                amp = np.exp(-(k2 + 1e-3) * (8.0 + 4.0 * y[s, 1])) / (k2 + 1e-3) ** (slope / 4)
                noise = rng.standard_normal((c, v, v, v), dtype=np.float32)
                field = np.fft.ifftn(np.fft.fftn(noise, axes=(1, 2, 3)) * amp, axes=(1, 2, 3)).real
                field /= field.std() + 1e-6
                x[s] = (field * (1.0 + 0.3 * y[s, 2]) + 0.3 * y[s, 3]).astype(np.float32)
            name = f"univ_{i:05d}.h5"
            kw = {}
            if args.chunked:
                rows = min(args.chunk_rows, n)
                e = min(args.chunk_edge or v, v)
                xchunk = (rows, c, v, v, v) if args.chunk_edge is None else (1, 1, e, e, e)
                kw = {"x": {"chunks": xchunk}, "y": {"chunks": (rows, 4)}}
            with h5py.File(os.path.join(data_dir, name), "w") as h:
                if args.chunked and args.chunk_edge:
                    # Tiny chunks land in the file in the order their writers finish them (as
                    # when many simulation ranks write blocks of one volume): write them in a
                    # seeded random order, so one sample's chunks are scattered over the file.
                    e = min(args.chunk_edge, v)
                    dx = h.create_dataset("x", shape=x.shape, dtype=x.dtype, **kw["x"])
                    blocks = [
                        (s, ch, a, b, d)
                        for s in range(n)
                        for ch in range(c)
                        for a in range(0, v, e)
                        for b in range(0, v, e)
                        for d in range(0, v, e)
                    ]
                    for k in rng.permutation(len(blocks)):
                        s, ch, a, b, d = blocks[k]
                        dx[s, ch, a : a + e, b : b + e, d : d + e] = x[
                            s, ch, a : a + e, b : b + e, d : d + e
                        ]
                else:
                    h.create_dataset("x", data=x, **kw.get("x", {}))
                h.create_dataset("y", data=y, **kw.get("y", {}))
            rel.append(name)
        return rel

    return gen


class H5Samples:
    """Map-style dataset: index -> (x, y, bytes read, read calls, pid)."""

    def __init__(self, files, samples_per_file, keep_open=False, by_path=False):
        self.files = list(files)
        self.spf = samples_per_file
        self.opener = C.Opener(keep_open)
        self.by_path = by_path

    def __len__(self):
        return len(self.files) * self.spf

    def __getitem__(self, idx):
        import h5py
        import torch

        fi, row = divmod(idx, self.spf)
        with C.CountedRead(self.by_path) as counted:
            if self.by_path:  # h5py's default (sec2) driver
                with h5py.File(self.files[fi], "r") as h:
                    x = h["x"][row]
                    y = h["y"][row]
            else:
                with self.opener(self.files[fi]) as f, h5py.File(f, "r") as h:
                    x = h["x"][row]
                    y = h["y"][row]
        return (torch.from_numpy(x), torch.from_numpy(y), *C.io_tensors(counted))


def build_model(channels, width):
    from torch import nn

    w = width
    return nn.Sequential(
        nn.Conv3d(channels, w, 2, stride=2),  # V/2
        nn.LeakyReLU(0.1, inplace=True),
        nn.Conv3d(w, w, 3, padding=1),
        nn.LeakyReLU(0.1, inplace=True),
        nn.MaxPool3d(2),  # V/4
        nn.Conv3d(w, 2 * w, 3, padding=1),
        nn.LeakyReLU(0.1, inplace=True),
        nn.AdaptiveAvgPool3d(1),
        nn.Flatten(),
        nn.Linear(2 * w, 2 * w),
        nn.LeakyReLU(0.1, inplace=True),
        nn.Linear(2 * w, 4),
        nn.Tanh(),
    )


def main(argv=None):
    args = parse_args(argv)
    params = {
        "seed": args.seed,
        "num_files": args.num_files,
        "samples_per_file": args.samples_per_file,
        "volume": args.volume,
        "channels": args.channels,
        "chunked": args.chunked,
        "chunk_rows": args.chunk_rows if args.chunked else None,
        "chunk_edge": args.chunk_edge if args.chunked else None,
    }

    def build(files):
        from torch import nn

        mse = nn.MSELoss()
        model = build_model(args.channels, C.scaled(8, args.compute_scale))
        return H5Samples(files, args.samples_per_file, args.keep_open, args.by_path), model, mse

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
