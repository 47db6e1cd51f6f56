#!/usr/bin/env python
"""Tabular samples as the rows of Parquet files (``part-XXXXX.parquet``), as recommender and
tabular training code and Hugging Face ``datasets``' Parquet exports are read: each process
opens each file once with ``pyarrow.parquet.ParquetFile`` (the footer read once), and an item
reads the row group that holds its row (``read_row_group``: that group's column chunks, the
``--columns`` it needs), keeping the last group it read, so rows in order hit it and shuffled
rows mostly read a group each. A row is ``--row-bytes`` of features and a label.
"""

from __future__ import annotations

import _common as C

JOB = "parquet_rows"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=2, batch_size=16, workers=2)
    g = p.add_argument_group("parquet rows")
    g.add_argument("--rows", type=C.positive_int, default=512, help="rows (samples) a file")
    g.add_argument("--row-group", type=C.positive_int, default=64, help="rows a row group")
    g.add_argument("--row-bytes", type=C.positive_int, default=1024, help="feature bytes a row")
    g.add_argument("--compression", choices=("none", "snappy", "zstd"), default="snappy")
    g.add_argument("--columns", type=_columns, default="all",
                   help="the columns an item reads: all, or some of features,label,id "
                        "(comma-separated; pyarrow reads those columns' chunks alone)")  # fmt: skip
    return p.parse_args(argv)


def _columns(text):
    """``all`` (None: every column), or a comma-separated list of the file's columns."""
    import argparse

    if text == "all":
        return None
    names = [n for n in text.split(",") if n]
    if not names or set(names) - {"features", "label", "id"}:
        raise argparse.ArgumentTypeError("all, or a comma-separated list of features,label,id")
    return names


def generate(args):
    import os

    import numpy as np

    def gen(data_dir):
        import pyarrow as pa
        import pyarrow.parquet as pq

        rng = np.random.default_rng(args.seed)
        rel = []
        for f in range(args.num_files):
            n = args.rows
            # features: half noise, half zeros, so a codec has something to do
            feats = [
                rng.integers(0, 256, args.row_bytes // 2, dtype=np.uint8).tobytes()
                + bytes(args.row_bytes - args.row_bytes // 2)
                for _ in range(n)
            ]
            table = pa.table(
                {
                    "features": pa.array(feats, pa.binary()),
                    "label": pa.array(rng.integers(0, 4, n)),
                    "id": pa.array(np.arange(f * n, (f + 1) * n)),
                }
            )
            name = f"part-{f:05d}.parquet"
            pq.write_table(
                table,
                os.path.join(data_dir, name),
                row_group_size=args.row_group,
                compression=None if args.compression == "none" else args.compression,
            )
            rel.append(name)
        return rel

    return gen


class ParquetRows:
    """Map-style dataset: index -> (features as float, label, bytes read, read calls, pid).
    Each file opened once a process (its footer read then), the last row group kept."""

    def __init__(self, files, rows, group, columns):
        self.files, self.rows, self.group = list(files), rows, group
        self.columns = columns  # None: all
        self.handles, self.cached = {}, (None, None, None)

    def __len__(self):
        return len(self.files) * self.rows

    def __getitem__(self, idx):
        import numpy as np
        import pyarrow.parquet as pq
        import torch

        f, row = divmod(idx, self.rows)
        g, k = divmod(row, self.group)
        with C.CountedRead(True) as counted:
            if self.cached[:2] != (f, g):
                pf = self.handles.get(f)
                if pf is None:
                    pf = self.handles[f] = pq.ParquetFile(self.files[f])
                self.cached = (f, g, pf.read_row_group(g, columns=self.columns))
            table = self.cached[2]
            names = table.column_names
            feats = table.column("features")[k].as_py() if "features" in names else b"\0"
            label = table.column("label")[k].as_py() if "label" in names else 0
        x = torch.from_numpy(np.frombuffer(feats, dtype=np.uint8).astype(np.float32) / 255)
        return (x, torch.tensor(label), *C.io_tensors(counted))


def main(argv=None):
    args = parse_args(argv)
    params = {"seed": args.seed, "num_files": args.num_files, "rows": args.rows,
              "row_group": args.row_group, "row_bytes": args.row_bytes,
              "compression": args.compression}  # fmt: skip

    def build(files):
        from torch import nn

        data = ParquetRows(files, args.rows, args.row_group, args.columns)
        w = C.scaled(32, args.compute_scale)
        model = nn.Sequential(nn.Linear(args.row_bytes, w), nn.ReLU(), nn.Linear(w, 4))
        return data, model, nn.CrossEntropyLoss()

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
