#!/usr/bin/env python
"""Preprocessed tensors, one ``torch.save``\\ d file a sample (``sample_XXXXX.pt``), read with
``torch.load(path)`` in the Dataset's ``__getitem__``, as much research code keeps a dataset it
preprocessed once. ``--tensors 2`` saves a dict of an image and a mask, 1 an image alone (with
its label); each is fed to a tiny 2D convolution through a ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import _common as C

JOB = "pt_samples"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=32, batch_size=4, workers=2)
    g = p.add_argument_group("pt samples")
    g.add_argument("--tensors", type=int, choices=(1, 2), default=1, help="tensors a file")
    g.add_argument("--edge", type=C.positive_int, default=64, help="image edge (pixels)")
    return p.parse_args(argv)


def generate(args):
    import os

    import torch

    def gen(data_dir):
        rel = []
        g = torch.Generator().manual_seed(args.seed)
        for i in range(args.num_files):
            image = torch.rand(3, args.edge, args.edge, generator=g)
            item = {"image": image, "label": torch.tensor(i % 4)}
            if args.tensors == 2:
                item["mask"] = (image.mean(0, keepdim=True) > 0.5).to(torch.uint8)
            name = f"sample_{i:05d}.pt"
            torch.save(item, os.path.join(data_dir, name))
            rel.append(name)
        return rel

    return gen


class PtFiles:
    """Map-style dataset: index -> (image, label, bytes read, read calls, pid)."""

    def __init__(self, files):
        self.files = list(files)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, idx):
        import torch

        with C.CountedRead(True) as counted:
            item = torch.load(self.files[idx])
        x = item["image"]
        if "mask" in item:
            x = x * item["mask"]
        return (x, item["label"], *C.io_tensors(counted))


def main(argv=None):
    args = parse_args(argv)
    params = {
        "seed": args.seed,
        "num_files": args.num_files,
        "tensors": args.tensors,
        "edge": args.edge,
    }

    def build(files):
        from torch import nn

        w = C.scaled(4, args.compute_scale)
        model = nn.Sequential(
            nn.Conv2d(3, w, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w, 4)
        )
        return PtFiles(files), model, nn.CrossEntropyLoss()

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
