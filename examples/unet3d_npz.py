#!/usr/bin/env python
"""unet3d-like 3D segmentation trained on NPZ volumes (one sample per file).

Each ``vol_XXXXX.npz`` holds ``x`` (float32, 1 x V x V x V) and ``y`` (uint8
mask, same shape), written with ``np.savez`` (``--compressed``:
``np.savez_compressed``).  Samples are read per sample with ``np.load`` on an
unbuffered, byte-counting ``io.FileIO`` (``--by-path``: ``np.load(path)``, as
real training code does) and fed to a tiny Conv3d encoder/decoder through a
``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import _common as C

JOB = "unet3d_npz"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=24, batch_size=2, workers=2)
    g = p.add_argument_group("unet3d")
    g.add_argument(
        "--volume",
        type=C.positive_int,
        default=32,
        help="edge V of the 1xVxVxV volumes (multiple of 4)",
    )
    g.add_argument(
        "--compressed",
        action="store_true",
        help="write with np.savez_compressed instead of np.savez",
    )
    g.add_argument(
        "--arch",
        choices=("unet", "pointwise"),
        default="unet",
        help="unet: the 3D U-Net; pointwise: one 1x1x1 convolution (a real but tiny "
        "forward/backward, to make the input pipeline the bottleneck)",
    )
    args = p.parse_args(argv)
    if args.volume % 4:
        p.error("--volume must be a multiple of 4")
    return args


def generate(args):
    import os

    import numpy as np

    v = args.volume

    def gen(data_dir):
        save = np.savez_compressed if args.compressed else np.savez
        zz, yy, xx = np.ogrid[:v, :v, :v]
        rel = []
        for i in range(args.num_files):
            rng = np.random.default_rng([args.seed, i])
            mask = np.zeros((v, v, v), dtype=bool)
            for _ in range(int(rng.integers(1, 4))):
                c = rng.uniform(0.2 * v, 0.8 * v, size=3)
                r = rng.uniform(0.08 * v, 0.25 * v)
                mask |= (zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2 <= r * r
            x = mask.astype(np.float32) + rng.standard_normal((v, v, v), dtype=np.float32) * 0.7
            name = f"vol_{i:05d}.npz"
            save(os.path.join(data_dir, name), x=x[None], y=mask.astype(np.uint8)[None])
            rel.append(name)
        return rel

    return gen


class NpzVolumes:
    """Map-style dataset: index -> (x, y, bytes read, read calls, pid)."""

    def __init__(self, files, keep_open=False, by_path=False):
        self.files = list(files)
        self.opener = C.Opener(keep_open)
        self.by_path = by_path

    def __len__(self):
        return len(self.files)

    def __getitem__(self, idx):
        import numpy as np
        import torch

        with C.CountedRead(self.by_path) as counted:
            if self.by_path:
                with np.load(self.files[idx]) as z:
                    x = z["x"]
                    y = z["y"]
            else:
                with self.opener(self.files[idx]) as f, np.load(f) as z:
                    x = z["x"]
                    y = z["y"]
        return (torch.from_numpy(x), torch.from_numpy(y), *C.io_tensors(counted))


def build_model(width, arch="unet"):
    import torch
    from torch import nn

    if arch == "pointwise":
        return nn.Conv3d(1, 1, 1)

    class TinyUNet3D(nn.Module):
        """Two-level 3D U-Net: patchify stem (stride 2), one skip, transposed-conv head."""

        def __init__(self, w):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv3d(1, w, 2, stride=2), nn.ReLU(inplace=True))
            self.enc = nn.Sequential(nn.Conv3d(w, w, 3, padding=1), nn.ReLU(inplace=True))
            self.down = nn.MaxPool3d(2)
            self.mid = nn.Sequential(nn.Conv3d(w, 2 * w, 3, padding=1), nn.ReLU(inplace=True))
            self.up = nn.ConvTranspose3d(2 * w, w, 2, stride=2)
            self.dec = nn.Sequential(nn.Conv3d(2 * w, w, 3, padding=1), nn.ReLU(inplace=True))
            self.head = nn.ConvTranspose3d(w, 1, 2, stride=2)

        def forward(self, x):
            e = self.enc(self.stem(x))
            m = self.mid(self.down(e))
            return self.head(self.dec(torch.cat([self.up(m), e], dim=1)))

    return TinyUNet3D(width)


def main(argv=None):
    args = parse_args(argv)
    params = {
        "seed": args.seed,
        "num_files": args.num_files,
        "volume": args.volume,
        "compressed": args.compressed,
    }

    def build(files):
        from torch import nn

        bce = nn.BCEWithLogitsLoss()
        model = build_model(C.scaled(8, args.compute_scale), args.arch)
        return (
            NpzVolumes(files, args.keep_open, args.by_path),
            model,
            lambda out, y: bce(out, y.float()),
        )

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
