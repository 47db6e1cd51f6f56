#!/usr/bin/env python
"""resnet-like image classification on many small JPEG (or PNG) files.

Images live in class sub-folders (``class_0/img_00000.jpg``, ...).  Every
sample is opened on an unbuffered, byte-counting ``io.FileIO`` (``--by-path``:
by path, as torchvision's default loader does), decoded with
``PIL.Image.open(f).convert("RGB")``, resized to ``--image-size`` when the files
have other sizes (``--source-size MIN MAX``: every file gets its own width and
height in that range, like a photo collection) and fed to a tiny residual CNN.
"""

from __future__ import annotations

import _common as C

JOB = "resnet_jpeg"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=256, batch_size=32, workers=2)
    g = p.add_argument_group("resnet")
    g.add_argument("--format", choices=("jpeg", "png"), default="jpeg", help="image file format")
    g.add_argument(
        "--image-size", type=C.positive_int, default=32, help="square image edge (pixels)"
    )
    g.add_argument("--num-classes", type=C.positive_int, default=4)
    g.add_argument("--quality", type=int, default=90, help="JPEG quality")
    g.add_argument(
        "--source-size",
        type=C.positive_int,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=None,
        help="stored images get random widths and heights in [MIN, MAX] (seeded); samples are "
        "resized to --image-size after decoding (default: stored at --image-size)",
    )
    args = p.parse_args(argv)
    if args.source_size and args.source_size[0] > args.source_size[1]:
        p.error("--source-size: MIN must be <= MAX")
    return args


def generate(args):
    import os

    import numpy as np
    from PIL import Image

    s, k = args.image_size, args.num_classes
    ext = "jpg" if args.format == "jpeg" else "png"

    def gen(data_dir):
        rel = []
        for c in range(k):
            os.makedirs(os.path.join(data_dir, f"class_{c}"), exist_ok=True)
        for i in range(args.num_files):
            rng = np.random.default_rng([args.seed, i])
            if args.source_size:
                lo, hi = args.source_size
                h, w = (int(v) for v in rng.integers(lo, hi + 1, size=2))
            else:
                h = w = s
            yy, xx = np.mgrid[:h, :w].astype(np.float32) / np.float32(max(h, w))
            c = i % k
            # Class-dependent stripe orientation/frequency and colour + noise.
            theta = np.pi * c / k + rng.normal(0, 0.1)
            freq = 2.0 + c + rng.normal(0, 0.3)
            wave = np.sin(
                2 * np.pi * freq * (xx * np.cos(theta) + yy * np.sin(theta)) + rng.uniform(0, 6.3)
            )
            color = np.array([np.cos(c), np.sin(c), np.cos(2 * c)], dtype=np.float32) * 0.35
            img = 0.5 + 0.3 * wave[..., None] + color + rng.normal(0, 0.08, (h, w, 3))
            arr = (np.clip(img, 0, 1) * 255).astype(np.uint8)
            name = os.path.join(f"class_{c}", f"img_{i:05d}.{ext}")
            im = Image.fromarray(arr, "RGB")
            if args.format == "jpeg":
                im.save(os.path.join(data_dir, name), format="JPEG", quality=args.quality)
            else:
                im.save(os.path.join(data_dir, name), format="PNG")
            rel.append(name)
        return rel

    return gen


class ImageFolderFiles:
    """Map-style dataset: index -> (image CHW float, label, bytes read, read calls, pid)."""

    def __init__(self, files, keep_open=False, by_path=False, size=None):
        import os

        self.files = list(files)
        self.labels = [int(os.path.basename(os.path.dirname(f)).split("_")[1]) for f in self.files]
        self.opener = C.Opener(keep_open)
        self.by_path = by_path
        self.size = size  # resize decoded images to size x size (None: as stored)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, idx):
        import numpy as np
        import torch
        from PIL import Image

        with C.CountedRead(self.by_path) as counted:
            if self.by_path:  # torchvision.datasets.folder.pil_loader
                with open(self.files[idx], "rb") as f:
                    im = Image.open(f).convert("RGB")
            else:
                with self.opener(self.files[idx]) as f, Image.open(f) as raw:
                    im = raw.convert("RGB")
        if self.size is not None and im.size != (self.size, self.size):
            im = im.resize((self.size, self.size), Image.BILINEAR)
        arr = np.array(im)
        x = torch.from_numpy(arr).permute(2, 0, 1).float().div_(255.0)
        y = torch.tensor(self.labels[idx], dtype=torch.int64)
        return (x, y, *C.io_tensors(counted))


def build_model(num_classes, width):
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.skip = (
                nn.Identity()
                if stride == 1 and cin == cout
                else nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
                )
            )
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    w = width
    return nn.Sequential(
        nn.Conv2d(3, w, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(w),
        nn.ReLU(inplace=True),
        Block(w, w, 1),
        Block(w, 2 * w, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * w, num_classes),
    )


def main(argv=None):
    args = parse_args(argv)
    params = {
        "seed": args.seed,
        "num_files": args.num_files,
        "format": args.format,
        "image_size": args.image_size,
        "num_classes": args.num_classes,
        "quality": args.quality if args.format == "jpeg" else None,
        **({"source_size": list(args.source_size)} if args.source_size else {}),
    }

    def build(files):
        from torch import nn

        model = build_model(args.num_classes, C.scaled(16, args.compute_scale))
        return (
            ImageFolderFiles(
                files, args.keep_open, args.by_path, args.image_size if args.source_size else None
            ),
            model,
            nn.CrossEntropyLoss(),
        )

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
