"""A small PyTorch training job annotated by hand with DFTracer's AI logging conventions.

It uses ``dftracer.python.ai`` (``from dftracer.logger import ai`` in older pydftracer
releases; DFTracer docs, "AI/DL Logging") the way a user would, without dlreplay: the
epoch loop in ``ai.pipeline.epoch.iter`` (``epoch.block`` / ``epoch.iter`` events),
the batch loop in ``ai.dataloader.fetch.iter`` (``fetch.iter``: waiting for a batch,
``fetch.block``: the loop body), ``@ai.compute`` around the step with ``forward``,
``backward`` and ``step`` children, ``@ai.data.item`` on ``Dataset.__getitem__`` (in
the DataLoader's worker processes), ``ai.data.preprocess``, ``ai.device.transfer``,
``ai.comm.barrier``, ``ai.checkpoint.capture`` around ``torch.save``, the training
phase in the start/stop form (``ai.pipeline.train.start()`` / ``stop()``) and each
epoch's start also as a metadata record (``epoch.start(metadata=True)``).

    python traces/ai_annotated_job.py --make traces/ai_annotated   # trace + expected.json

``--make`` generates the dataset, runs this script under DFTracer's Python API in a
child process (``DFTRACER_ENABLE=1 DFTRACER_INIT=FUNCTION DFTRACER_INC_METADATA=1``)
and writes the gzipped trace and ``expected.json`` (the job's own counts and timings).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def generate(data: Path, files: int, record: int) -> None:
    import numpy as np

    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for i in range(files):
        np.save(data / f"sample_{i:04d}.npy", rng.integers(0, 255, size=record, dtype=np.uint8))


def train(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    try:
        from dftracer.python import ai, dftracer
    except ImportError:  # pydftracer < 2
        from dftracer.logger import ai, dftracer  # type: ignore[no-redef]

    log = dftracer.initialize_log(
        logfile=str(args.log), data_dir=f"{args.data_dir}:{args.checkpoint_dir}", process_id=-1
    )
    files = sorted(Path(args.data_dir).glob("*.npy"))

    class Samples(Dataset):
        def __len__(self) -> int:
            return len(files)

        @ai.data.item
        def __getitem__(self, idx: int) -> torch.Tensor:
            ai.data.item.update(image_idx=idx)
            arr = np.load(files[idx])
            with ai.data.preprocess:
                return torch.from_numpy(arr.astype(np.float32) / 255.0)

    model = torch.nn.Linear(1024, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @ai.compute.forward
    def forward(x: torch.Tensor) -> torch.Tensor:
        return model(x[:, :1024]).square().mean()

    @ai.compute
    def compute(x: torch.Tensor) -> float:
        t0 = time.perf_counter()
        loss = forward(x)
        with ai.compute.backward:
            loss.backward()
        with ai.compute.step:
            opt.step()
            opt.zero_grad()
        # the accelerator's share of the step: pad the tiny model up to a fixed step time
        rest = args.compute - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
        return time.perf_counter() - t0

    loader = DataLoader(
        Samples(),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=True,
        multiprocessing_context="fork",
        generator=torch.Generator().manual_seed(0),
    )
    steps, compute_s, epoch_s, ckpts = 0, [], [], []
    ai.pipeline.train.start()
    for epoch in ai.pipeline.epoch.iter(range(args.epochs)):
        ai.pipeline.epoch.start(metadata=True)
        ai.update(epoch=epoch)
        t_epoch = time.perf_counter()
        for step, batch in ai.dataloader.fetch.iter(enumerate(loader)):
            ai.update(epoch=epoch, step=step)
            with ai.device.transfer:
                x = batch.to("cpu")
            compute_s.append(compute(x))
            with ai.comm.barrier:
                pass
            steps += 1
            if args.checkpoint_every and steps % args.checkpoint_every == 0:
                path = Path(args.checkpoint_dir) / f"ckpt_{steps:04d}.pt"
                with ai.checkpoint.capture:
                    torch.save(model.state_dict(), path)
                ckpts.append(os.path.getsize(path))
        epoch_s.append(time.perf_counter() - t_epoch)
        ai.pipeline.epoch.stop(metadata=True)
    ai.pipeline.train.stop()
    log.finalize()
    return {
        "epochs": args.epochs,
        "steps": steps,
        "compute_s": compute_s,
        "epoch_s": epoch_s,
        "checkpoints": ckpts,
    }


def make(out: Path, work: Path) -> None:
    data, ckpt = work / "data", work / "checkpoints"
    for d in (work,):
        if d.exists():
            shutil.rmtree(d)
    ckpt.mkdir(parents=True)
    cfg = {
        "files": 32,
        "record": 64 << 10,
        "batch_size": 4,
        "workers": 2,
        "epochs": 3,
        "compute": 0.03,
        "checkpoint_every": 5,
    }
    generate(data, cfg["files"], cfg["record"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACER_")}
    env.update({"DFTRACER_ENABLE": "1", "DFTRACER_INIT": "FUNCTION", "DFTRACER_INC_METADATA": "1"})
    report = work / "report.json"
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--data-dir",
            str(data),
            "--checkpoint-dir",
            str(ckpt),
            "--log",
            str(work / "trace" / "ai"),
            "--report",
            str(report),
            *(f"--{k.replace('_', '-')}={v}" for k, v in cfg.items() if k != "files"),
        ],
        check=True,
        env=env,
    )
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for t in sorted((work / "trace").glob("*.pfw*")):
        name = t.name if t.name.endswith(".gz") else t.name + ".gz"
        with open(t, "rb") as src:
            raw = src.read()
        if t.name.endswith(".gz"):
            (out / name).write_bytes(raw)
        else:
            with gzip.open(out / name, "wb", compresslevel=9) as dst:
                dst.write(raw)
    rep = json.loads(report.read_text())
    steady = sorted(rep["compute_s"][1:])
    expected = {
        "source": "traces/ai_annotated_job.py under DFTracer's Python API (pydftracer AI conventions)",
        "model": {
            "format": "npy",
            "num_files": cfg["files"],
            "num_samples_per_file": 1,
            "record_length": cfg["record"],
            "batch_size": cfg["batch_size"],
            "read_threads": cfg["workers"],
            "epochs": cfg["epochs"],
            "computation_time": steady[len(steady) // 2],
            "steps_between_checkpoints": cfg["checkpoint_every"],
        },
        "steps": rep["steps"],
        "epoch_times_s": rep["epoch_s"],
        "checkpoints": len(rep["checkpoints"]),
        "checkpoint_bytes": sum(rep["checkpoints"]),
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(
        f"{out.name}: {len(list(out.glob('*.pfw.gz')))} trace file(s), {size / 1024:.0f} KiB -> {out}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--make", type=Path, help="write the corpus trace directory here (runs the job)"
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/dlreplay-ai-annotated"))
    ap.add_argument("--data-dir", type=Path)
    ap.add_argument("--checkpoint-dir", type=Path)
    ap.add_argument("--log", type=Path)
    ap.add_argument("--report", type=Path)
    ap.add_argument("--record", type=int, default=64 << 10)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--compute", type=float, default=0.03, help="seconds per training step")
    ap.add_argument("--checkpoint-every", type=int, default=0)
    args = ap.parse_args()
    if args.make:
        make(args.make.resolve(), args.work)
        return
    args.log.parent.mkdir(parents=True, exist_ok=True)
    report = train(args)
    args.report.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
