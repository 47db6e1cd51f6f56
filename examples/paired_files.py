#!/usr/bin/env python
"""Segmentation where each sample is a group of files: an image and its mask, and optionally
a weight map, each in its own file (MLPerf unet3d's ``case_XXXXX_x.npy`` and
``case_XXXXX_y.npy``; a segmentation set's ``img.png`` and ``mask.png``).

``--num-files`` counts samples; the dataset holds ``--parts`` files for each. Every part is
opened by path through the format's library (``numpy.load``, ``PIL.Image.open``), one after
the other in ``--part-order``, inside the Dataset's ``__getitem__``, and the sample is fed to a
tiny 2D convolution through a ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import _common as C

JOB = "paired_files"
#: the parts a sample can have, in their file-name suffix order
PARTS = ("image", "mask", "weight")


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=24, batch_size=2, workers=2)
    g = p.add_argument_group("paired files")
    g.add_argument("--format", choices=("npy", "png"), default="npy", help="every part's format")
    g.add_argument("--parts", type=int, choices=(2, 3), default=2, help="files a sample")
    g.add_argument(
        "--part-order",
        choices=("image-first", "mask-first"),
        default="image-first",
        help="which file of a sample __getitem__ reads first",
    )
    g.add_argument("--edge", type=C.positive_int, default=32, help="image edge (pixels)")
    g.add_argument(
        "--naming",
        choices=("suffix", "folders"),
        default="suffix",
        help="a sample's files: case_00007_image.npy, case_00007_mask.npy (suffix) or "
        "image/00007.npy, mask/00007.npy (folders)",
    )
    return p.parse_args(argv)


def _name(i: int, part: str, fmt: str, naming: str = "suffix") -> str:
    return f"{part}/{i:05d}.{fmt}" if naming == "folders" else f"case_{i:05d}_{part}.{fmt}"


def generate(args):
    import os

    import numpy as np

    e, parts = args.edge, PARTS[: args.parts]

    def gen(data_dir):
        from PIL import Image

        rel = []
        for i in range(args.num_files):
            rng = np.random.default_rng([args.seed, i])
            image = rng.random((3, e, e), dtype=np.float32)
            mask = (image.mean(axis=0) > 0.5).astype(np.uint8)
            weight = rng.random((e, e), dtype=np.float32)
            arrays = {"image": image, "mask": mask, "weight": weight}
            for part in parts:
                name = _name(i, part, args.format, args.naming)
                os.makedirs(os.path.dirname(os.path.join(data_dir, name)), exist_ok=True)
                a = arrays[part]
                if args.format == "npy":
                    np.save(os.path.join(data_dir, name), a)
                else:  # 8-bit RGB image, L mask, 16-bit weight map
                    if part == "image":
                        im = Image.fromarray((a.transpose(1, 2, 0) * 255).astype(np.uint8))
                    elif part == "mask":
                        im = Image.fromarray(a * 255)
                    else:
                        im = Image.fromarray((a * 65535).astype(np.uint16))
                    im.save(os.path.join(data_dir, name), format="PNG")
                rel.append(name)
        return rel

    return gen


class PairedFiles:
    """Map-style dataset: index -> (image, mask, bytes read, read calls, pid), each part read
    from its own file by path."""

    def __init__(self, data_dir, n, fmt, parts, mask_first, naming="suffix"):
        self.data_dir, self.n, self.fmt, self.naming = data_dir, n, fmt, naming
        order = list(PARTS[:parts])
        if mask_first:
            order.remove("mask")
            order.insert(0, "mask")
        self.order = order

    def __len__(self):
        return self.n

    def _load(self, path):
        import numpy as np
        from PIL import Image

        if self.fmt == "npy":
            return np.load(path)
        with Image.open(path) as im:
            return np.array(im)

    def __getitem__(self, idx):
        import os

        import numpy as np
        import torch

        with C.CountedRead(True) as counted:
            got = {
                p: self._load(os.path.join(self.data_dir, _name(idx, p, self.fmt, self.naming)))
                for p in self.order
            }
        image = np.asarray(got["image"], dtype=np.float32)
        if image.ndim == 3 and image.shape[-1] == 3:  # PNG: HWC bytes
            image = image.transpose(2, 0, 1) / 255.0
        mask = (np.asarray(got["mask"]) > 0).astype(np.float32)[None]
        if "weight" in got:
            mask = mask * (np.asarray(got["weight"], dtype=np.float32)[None] > 0)
        x = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32))
        return (x, torch.from_numpy(mask), *C.io_tensors(counted))


def main(argv=None):
    args = parse_args(argv)
    params = {
        "seed": args.seed,
        "num_files": args.num_files,
        "format": args.format,
        "parts": args.parts,
        "edge": args.edge,
        "naming": args.naming,
    }

    def build(files):
        from torch import nn

        w = C.scaled(8, args.compute_scale)
        model = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(w, 1, 1)
        )
        dataset = PairedFiles(
            args.data_dir,
            args.num_files,
            args.format,
            args.parts,
            args.part_order == "mask-first",
            args.naming,
        )
        return dataset, model, nn.BCEWithLogitsLoss()

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
