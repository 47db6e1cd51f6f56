"""Regenerate ``traces/parts/``: captures (with the loader hooks) for tests/test_sample_parts.py.

* ``examples/paired_files.py``, whose every sample is a group of files read whole in its
  ``__getitem__`` (an image and its mask, and a weight map): distill finds the files a sample
  reads and their order, and the replay reads the same groups. The two differ in each of
  these: 2 or 3 files a sample, NPY or PNG, the image or the mask read first, 2 workers or
  none, batch 2 or 3, shuffled or not.
* ``examples/pt_samples.py``, a file a sample read by ``torch.load`` in ``__getitem__``: each
  load is the sample's read, not a checkpoint restore. They differ in tensors a file (1, 2),
  workers (2, 0), batch (4, 2), shuffle and the image's size.
* ``examples/mapped_rows.py``, rows of one NPY file mapped in each process
  (``np.load(mmap_mode="r")``): the samples are the windows the items take (page faults, no
  read call). They differ in rows (256, 96), row bytes (16 KiB, 64 KiB), dtype, workers (2, 0),
  batch (8, 4), shuffle and epochs.
* ``examples/jsonl_lines.py``, JSON lines read by ``seek`` + ``readline`` on a file a worker
  keeps open: each line's size comes from the offsets the items seek to (the reads are the
  file's buffer), and a pass over every file before the first epoch (the Dataset indexing its
  lines) is modelled. They differ in files (2, 3), lines a file (256, 96), line sizes
  (512-3072 B, 200-1200 B), the index (a scan, or .idx.npy side files), workers (2, 0), batch
  (8, 4) and epochs (3, 2).
* ``examples/parquet_rows.py``, Parquet rows read by the row group holding them
  (``ParquetFile.read_row_group``, a file opened once a process, the last group kept): the
  replay reads row groups, not whole files. They differ in files (2, 3), rows (512, 256),
  rows a group (64, 32), row bytes (1024, 512), codec (snappy, zstd), the columns read (all,
  two of three), workers (2, 0), batch (16, 8), shuffle and epochs (3, 2).

``expected.json`` holds the truth, from the job's arguments.

    python traces/make_parts_traces.py [--only NAME] [--work /tmp/dlreplay-parts-traces]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from make_stream_traces import capture_example, keep_capture, run_makers  # noqa: E402

#: name -> (the job's arguments, the truth distill must find); the job by the name's prefix
TRACES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "npy_pairs": (
        ["--format", "npy", "--parts", "2", "--num-files", "24", "--workers", "2"]
        + ["--batch-size", "2", "--shuffle", "--epochs", "3"],
        {"files_per_sample": 2, "samples": 24, "num_files": 48, "format": "npy",
         "first_part": "image", "batch_size": 2, "read_threads": 2, "epochs": 3},
    ),
    "png_triples": (
        ["--format", "png", "--parts", "3", "--part-order", "mask-first", "--num-files", "18"]
        + ["--workers", "0", "--batch-size", "3", "--no-shuffle", "--epochs", "3"],
        {"files_per_sample": 3, "samples": 18, "num_files": 54, "format": "png",
         "first_part": "mask", "batch_size": 3, "read_threads": 0, "epochs": 3},
    ),
    # the same two families with DFTracer's POSIX calls alone: the groups from the files'
    # names (a suffix token, a folder) and the order the reads take them in
    "npy_pairs_posix": (
        ["--format", "npy", "--parts", "2", "--num-files", "24", "--workers", "2"]
        + ["--batch-size", "2", "--shuffle", "--epochs", "3"],
        {"files_per_sample": 2, "samples": 24, "num_files": 48, "format": "npy",
         "first_part": "image", "batch_size": 2, "read_threads": 2, "epochs": 3,
         "sample_shuffle": True},
    ),
    "png_triples_posix": (
        ["--format", "png", "--parts", "3", "--part-order", "mask-first", "--naming", "folders"]
        + ["--num-files", "18", "--workers", "0", "--batch-size", "3", "--no-shuffle"]
        + ["--epochs", "3"],
        {"files_per_sample": 3, "samples": 18, "num_files": 54, "format": "png",
         "first_part": "mask", "batch_size": 3, "read_threads": 0, "epochs": 3,
         "sample_shuffle": False},
    ),
    "pt_w2_b4": (
        ["--tensors", "1", "--edge", "64", "--num-files", "32", "--workers", "2"]
        + ["--batch-size", "4", "--shuffle", "--epochs", "3"],
        {"files_per_sample": 1, "samples": 32, "num_files": 32, "format": "pt",
         "batch_size": 4, "read_threads": 2, "epochs": 3},
    ),
    "rows_w2_b8": (
        ["--num-files", "256", "--row-bytes", "16384", "--dtype", "float32", "--workers", "2"]
        + ["--batch-size", "8", "--shuffle", "--epochs", "3"],
        {"files_per_sample": 1, "samples": 256, "num_files": 1, "format": "npy",
         "record_length": 16384, "batch_size": 8, "read_threads": 2, "epochs": 3},
    ),
    "rows_w0_b4": (
        ["--num-files", "96", "--row-bytes", "65536", "--dtype", "uint8", "--workers", "0"]
        + ["--batch-size", "4", "--no-shuffle", "--epochs", "2"],
        {"files_per_sample": 1, "samples": 96, "num_files": 1, "format": "npy",
         "record_length": 65536, "batch_size": 4, "read_threads": 0, "epochs": 2},
    ),
    # the same job with DFTracer's POSIX calls alone (names ending in _posix): the header reads
    # and the mappings, no row
    "rows_w2_b8_posix": (
        ["--num-files", "256", "--row-bytes", "16384", "--dtype", "float32", "--workers", "2"]
        + ["--batch-size", "8", "--shuffle", "--epochs", "3"],
        {"files_per_sample": 1, "samples": 256, "num_files": 1, "format": "npy",
         "record_length": 16384, "batch_size": 8, "read_threads": 2, "epochs": 3},
    ),
    "rows_arrow_w2_b4": (
        ["--format", "arrow", "--num-files", "192", "--row-bytes", "32768", "--workers", "2"]
        + ["--batch-size", "4", "--persistent-workers", "--rows-per-batch", "48", "--epochs", "2"],
        {"files_per_sample": 1, "samples": 192, "num_files": 1, "format": "arrow",
         "record_length": 32768 + 8, "batch_size": 4, "read_threads": 2, "epochs": 2},
    ),
    # JSON lines read by seek + readline: the lines' sizes from the seeks' offsets; the pass
    # over every file that indexes the lines at the Dataset's making (--index scan) or none
    # (--index sidecar: the offsets from .idx.npy side files)
    "jsonl_w2_b8": (
        ["--num-files", "2", "--lines", "256", "--min-line", "512", "--max-line", "3072"]
        + ["--index", "scan", "--workers", "2", "--batch-size", "8", "--shuffle", "--epochs", "3"],
        {"samples_per_file": 256, "num_files": 2, "format": "raw", "scan_read_size": 4096,
         "side_files": 1, "batch_size": 8, "read_threads": 2, "epochs": 3},
    ),
    # the same job with DFTracer's POSIX calls alone: the lines from the seeks, the pass before
    # the workers' first epoch
    "jsonl_w2_b8_posix": (
        ["--num-files", "2", "--lines", "256", "--min-line", "512", "--max-line", "3072"]
        + ["--index", "scan", "--workers", "2", "--batch-size", "8", "--shuffle", "--epochs", "3"],
        {"samples_per_file": 256, "num_files": 2, "format": "raw", "scan_read_size": 4096,
         "side_files": 1, "batch_size": 8, "read_threads": 2, "epochs": 3},
    ),
    "jsonl_w0_b4": (
        ["--num-files", "3", "--lines", "96", "--min-line", "200", "--max-line", "1200"]
        + ["--index", "sidecar", "--workers", "0", "--batch-size", "4", "--shuffle"]
        + ["--epochs", "2"],
        {"samples_per_file": 96, "num_files": 3, "format": "raw", "scan_read_size": 0,
         "side_files": 4, "batch_size": 4, "read_threads": 0, "epochs": 2},
    ),
    # no workers, DFTracer's POSIX calls alone: the training process indexes its lines by a
    # pass over the files (an open of each read through), then reads them through a second
    # open it keeps (the pass is no epoch); in order, no seek shows the lines (the
    # fingerprint counts them); or the offsets come from .idx.npy side files
    "jsonl_w0_scan_posix": (
        ["--num-files", "3", "--lines", "128", "--min-line", "300", "--max-line", "1500"]
        + ["--index", "scan", "--workers", "0", "--batch-size", "4", "--shuffle", "--epochs", "2"],
        {"samples_per_file": 128, "num_files": 3, "format": "raw", "scan_read_size": 4096,
         "side_files": 1, "read_threads": 0, "epochs": 2},
    ),
    "jsonl_w0_b2_posix": (
        ["--num-files", "2", "--lines", "200", "--min-line", "150", "--max-line", "600"]
        + ["--index", "scan", "--workers", "0", "--batch-size", "2", "--shuffle", "--epochs", "3"],
        {"samples_per_file": 200, "num_files": 2, "format": "raw", "scan_read_size": 4096,
         "side_files": 1, "read_threads": 0, "epochs": 3},
    ),
    "jsonl_w0_sorted_posix": (
        ["--num-files", "2", "--lines", "160", "--min-line", "400", "--max-line", "2000"]
        + ["--index", "scan", "--workers", "0", "--batch-size", "4", "--no-shuffle"]
        + ["--epochs", "2"],
        {"samples_per_file": 160, "num_files": 2, "format": "raw", "scan_read_size": 4096,
         "side_files": 1, "read_threads": 0, "epochs": 2},
    ),
    "jsonl_w0_sidecar_posix": (
        ["--num-files", "3", "--lines", "96", "--min-line", "200", "--max-line", "1200"]
        + ["--index", "sidecar", "--workers", "0", "--batch-size", "4", "--shuffle"]
        + ["--epochs", "2"],
        {"samples_per_file": 96, "num_files": 3, "format": "raw", "scan_read_size": 0,
         "side_files": 4, "read_threads": 0, "epochs": 2},
    ),
    # Parquet rows read by the row group holding them (pyarrow's read_row_group, the last group
    # kept): a row group's column chunks an item, not the file
    "parquet_w2_b16": (
        ["--num-files", "2", "--rows", "512", "--row-group", "64", "--row-bytes", "1024"]
        + ["--compression", "snappy", "--workers", "2", "--batch-size", "16", "--shuffle"]
        + ["--epochs", "3"],
        {"samples_per_file": 512, "num_files": 2, "format": "parquet", "row_groups": 8,
         "row_group_reads": True, "batch_size": 16, "read_threads": 2, "epochs": 3,
         "columns_unread": []},
    ),
    # the same job with DFTracer's POSIX calls alone: no sample shows, the row groups' reads do;
    # one column of three read
    "parquet_w2_b16_posix": (
        ["--num-files", "2", "--rows", "512", "--row-group", "64", "--row-bytes", "1024"]
        + ["--compression", "snappy", "--columns", "features", "--workers", "2"]
        + ["--batch-size", "16", "--shuffle", "--epochs", "3"],
        {"samples_per_file": 512, "num_files": 2, "format": "parquet", "row_groups": 8,
         "row_group_reads": True, "batch_size": 16, "read_threads": 2, "epochs": 3,
         "columns_unread": ["id", "label"]},
    ),
    "parquet_w0_b8": (
        ["--num-files", "3", "--rows", "256", "--row-group", "32", "--row-bytes", "512"]
        + ["--compression", "zstd", "--columns", "features,label", "--workers", "0"]
        + ["--batch-size", "8", "--no-shuffle", "--epochs", "2"],
        {"samples_per_file": 256, "num_files": 3, "format": "parquet", "row_groups": 8,
         "row_group_reads": True, "batch_size": 8, "read_threads": 0, "epochs": 2,
         "columns_unread": ["id"]},
    ),
    "pt_w0_b2": (
        ["--tensors", "2", "--edge", "48", "--num-files", "20", "--workers", "0"]
        + ["--batch-size", "2", "--no-shuffle", "--epochs", "2"],
        {"files_per_sample": 1, "samples": 20, "num_files": 20, "format": "pt",
         "batch_size": 2, "read_threads": 0, "epochs": 2},
    ),
}  # fmt: skip


#: the job of each name's prefix (else paired_files.py)
_JOBS = {
    "pt": "pt_samples.py",
    "rows": "mapped_rows.py",
    "jsonl": "jsonl_lines.py",
    "parquet": "parquet_rows.py",
}


def make(name: str, work: Path) -> None:
    args, truth = TRACES[name]
    script = _JOBS.get(name.split("_")[0], "paired_files.py")
    posix = name.endswith("_posix")
    out, command = capture_example(name, work, script, args, loader_hooks=not posix)
    if script == "jsonl_lines.py":  # the lines' sizes, from the files
        lines = [
            len(x) for f in sorted((work / name / "data").glob("*.jsonl")) for x in open(f, "rb")
        ]
        truth = {**truth, "line_bytes": sorted(lines)}
    expected = {
        "source": f"examples/{script}, dlreplay capture"
        + (" --no-loader-hooks" if posix else " (loader hooks on)"),
        "command": [f"examples/{script}", *command[2:]],
        "truth": truth,
    }
    keep_capture(out, HERE / "parts" / name, expected)


def main() -> None:
    run_makers(__doc__ or "", TRACES, make, "/tmp/dlreplay-parts-traces")


if __name__ == "__main__":
    main()
