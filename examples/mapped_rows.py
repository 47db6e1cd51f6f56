#!/usr/bin/env python
"""Samples as rows of one large table, memory-mapped: the Dataset maps ``rows.npy`` with
``np.load(path, mmap_mode="r")`` once in each process (at its first item, so every DataLoader
worker maps it itself) and copies row *i* out of the mapping in ``__getitem__``, as Megatron-
style indexed datasets and preprocessed feature arrays are read. ``--format arrow``: an Arrow
IPC stream (``data-00000-of-00001.arrow``, a binary column and a label) mapped with
``pa.ipc.open_stream(pa.memory_map(path))``, as Hugging Face ``datasets`` reads its cache files
in map-style access. The rows' pages are faulted in from storage: no read call shows them.
"""

from __future__ import annotations

import _common as C

JOB = "mapped_rows"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=256, batch_size=8, workers=2)
    g = p.add_argument_group("mapped rows")
    g.add_argument("--row-bytes", type=C.positive_int, default=16384, help="bytes a row (sample)")
    g.add_argument("--dtype", choices=("float32", "uint8"), default="float32")
    g.add_argument("--format", choices=("npy", "arrow"), default="npy", help="the table's file")
    g.add_argument("--rows-per-batch", type=C.positive_int, default=64, help="arrow: record batch")
    args = p.parse_args(argv)
    if args.row_bytes % 4 and args.dtype == "float32":
        p.error("--row-bytes must be a multiple of 4 for float32 rows")
    return args


def generate(args):
    import os

    import numpy as np

    def gen(data_dir):
        rng = np.random.default_rng(args.seed)
        if args.format == "arrow":
            import pyarrow as pa

            name = "data-00000-of-00001.arrow"
            x = pa.array([rng.bytes(args.row_bytes) for _ in range(args.num_files)], pa.binary())
            table = pa.table({"x": x, "label": pa.array(np.arange(args.num_files) % 2)})
            with pa.OSFile(os.path.join(data_dir, name), "wb") as sink:
                with pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table, max_chunksize=args.rows_per_batch)
            return [name]
        n = args.row_bytes // np.dtype(args.dtype).itemsize
        rows = rng.integers(0, 256, (args.num_files, n), dtype=np.uint8).astype(args.dtype)
        np.save(os.path.join(data_dir, "rows.npy"), rows)
        return ["rows.npy"]

    return gen


class MappedRows:
    """Map-style dataset: index -> (row as float, label, bytes read, read calls, pid); the
    array mapped at the first item of each process. ``--num-files`` counts rows. Bytes read:
    the header's read calls and the row taken out of the mapping."""

    def __init__(self, path, n):
        self.path, self.n, self.arr = path, n, None

    def __len__(self):
        return self.n

    def _map(self):
        import numpy as np

        if self.path.endswith(".arrow"):
            import pyarrow as pa

            return pa.ipc.open_stream(pa.memory_map(self.path)).read_all()
        return np.load(self.path, mmap_mode="r")

    def __getitem__(self, idx):
        import numpy as np
        import torch

        with C.CountedRead(True) as counted:
            if self.arr is None:
                self.arr = self._map()
            if self.path.endswith(".arrow"):
                stored = np.frombuffer(self.arr.column("x")[idx].as_py(), dtype=np.uint8)
            else:
                stored = self.arr[idx]
            row = np.array(stored, dtype=np.float32)
        # the row's bytes came out of the mapping (page faults: the kernel's read count misses
        # them); the header's reads are counted
        counted.bytes += stored.nbytes
        return (torch.from_numpy(row), torch.tensor(idx % 2), *C.io_tensors(counted))


def main(argv=None):
    args = parse_args(argv)
    params = {"seed": args.seed, "rows": args.num_files, "row_bytes": args.row_bytes,
              "dtype": args.dtype, "format": args.format,
              "rows_per_batch": args.rows_per_batch}  # fmt: skip

    def build(files):
        import numpy as np
        from torch import nn

        itemsize = 1 if args.format == "arrow" else np.dtype(args.dtype).itemsize
        model = nn.Linear(args.row_bytes // itemsize, 2)
        return MappedRows(files[0], args.num_files), model, nn.CrossEntropyLoss()

    return C.main_wrapper(JOB, args, params, generate(args), build)


if __name__ == "__main__":
    C.run(main)
