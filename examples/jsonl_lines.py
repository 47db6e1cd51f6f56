#!/usr/bin/env python
"""Text samples as the lines of JSON-lines files (``shard_XXXXX.jsonl``), as NLP fine-tuning
code reads them: the Dataset knows each line's offset (``--index scan``: it reads every file
through once in ``__init__`` and notes where each line starts; ``--index sidecar``: from
``shard_XXXXX.idx.npy``, written with the data), opens each file once a process with
``open(path, "rb")`` and, per item, ``seek``\\ s to the line and ``readline``\\ s it (the
buffered file reads its buffer from the line's offset), then ``json.loads`` it and encodes
its text as bytes. Lines are ``--min-line`` to ``--max-line`` bytes, uniformly spread.
"""

from __future__ import annotations

import _common as C

JOB = "jsonl_lines"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=2, batch_size=8, workers=2)
    g = p.add_argument_group("json lines")
    g.add_argument("--lines", type=C.positive_int, default=256, help="lines (samples) a file")
    g.add_argument("--min-line", type=C.positive_int, default=512, help="shortest line (bytes)")
    g.add_argument("--max-line", type=C.positive_int, default=3072, help="longest line (bytes)")
    g.add_argument("--index", choices=("scan", "sidecar"), default="scan",
                   help="where the lines' offsets come from")  # fmt: skip
    g.add_argument("--tokens", type=C.positive_int, default=256, help="tokens a sample")
    args = p.parse_args(argv)
    if args.min_line < 64 or args.max_line < args.min_line:
        p.error("--min-line must be >= 64 and <= --max-line")
    return args


def generate(args):
    import json
    import os

    import numpy as np

    def gen(data_dir):
        rng = np.random.default_rng(args.seed)
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
        rel = []
        for f in range(args.num_files):
            name = f"shard_{f:05d}.jsonl"
            offsets, pos = [], 0
            with open(os.path.join(data_dir, name), "wb") as fh:
                for i in range(args.lines):
                    want = int(rng.integers(args.min_line, args.max_line + 1))
                    head = json.dumps({"id": f * args.lines + i, "label": i % 4, "text": ""})
                    n = max(want - len(head) - 1, 1)  # the newline
                    text = rng.choice(letters, n).tobytes().decode()
                    line = (head[:-3] + json.dumps(text) + "}\n").encode()
                    fh.write(line)
                    offsets.append(pos)
                    pos += len(line)
            rel.append(name)
            if args.index == "sidecar":
                np.save(os.path.join(data_dir, f"shard_{f:05d}.idx.npy"), np.asarray(offsets))
                rel.append(f"shard_{f:05d}.idx.npy")
        return rel

    return gen


class JsonLines:
    """Map-style dataset: index -> (token bytes as float, label, bytes read, read calls, pid).
    Each file opened once a process (at its first item there), kept open."""

    def __init__(self, files, index):
        import numpy as np

        self.files = list(files)
        self.offsets = []
        for path in self.files:
            if index == "sidecar":
                self.offsets.append(np.load(path[: -len(".jsonl")] + ".idx.npy").tolist())
                continue
            starts, pos = [], 0
            with open(path, "rb") as fh:
                for line in fh:
                    starts.append(pos)
                    pos += len(line)
            self.offsets.append(starts)
        self.where = [(f, k) for f, offs in enumerate(self.offsets) for k in range(len(offs))]
        self.handles = {}

    def __len__(self):
        return len(self.where)

    def __getitem__(self, idx):
        import json

        import torch

        f, k = self.where[idx]
        with C.CountedRead(True) as counted:
            fh = self.handles.get(f)
            if fh is None:
                fh = self.handles[f] = open(self.files[f], "rb")  # noqa: SIM115
            fh.seek(self.offsets[f][k])
            row = json.loads(fh.readline())
        text = row["text"].encode()[: self.tokens]
        x = torch.zeros(self.tokens)
        x[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8).float() / 255
        return (x, torch.tensor(row["label"]), *C.io_tensors(counted))


def main(argv=None):
    args = parse_args(argv)
    params = {"seed": args.seed, "num_files": args.num_files, "lines": args.lines,
              "min_line": args.min_line, "max_line": args.max_line,
              "index": args.index}  # fmt: skip

    def build(files):
        from torch import nn

        data = JsonLines([f for f in files if f.endswith(".jsonl")], args.index)
        data.tokens = args.tokens
        w = C.scaled(64, args.compute_scale)
        model = nn.Sequential(nn.Linear(args.tokens, w), nn.ReLU(), nn.Linear(w, 4))
        return data, model, nn.CrossEntropyLoss()

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
