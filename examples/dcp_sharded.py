#!/usr/bin/env python
"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP) under ``torchrun``.

Run as ``torchrun --nproc-per-node N examples/dcp_sharded.py ...``: each rank (``RANK``,
``WORLD_SIZE`` from the launcher) joins a gloo process group (CPU), reads its share of the
unet3d example's NPZ volumes (``vol_XXXXX.npz``) through a ``DistributedSampler`` and a
``DataLoader`` with ``--workers`` workers of its own, and trains a small voxel MLP (``--hidden``
units: the model size, hence the checkpoint's) wrapped in ``DistributedDataParallel``.

Every ``--checkpoint-every N`` global steps all ranks call ``dcp.save`` of the model and
optimizer state into ``<checkpoint-dir>/step_<SSSSSS>/``: each rank writes its shard file
``__<rank>_0.distcp`` (DCP spreads the replicated tensors over the ranks), rank 0 the
``.metadata``; ``--fsync`` makes DCP fsync each file. At start, when the checkpoint directory
holds a complete checkpoint (a ``.metadata``), every rank ``dcp.load``\\ s the latest into its
model and optimizer first and training goes on from its step (``--no-resume``: never).
``--keep K``: rank 0 deletes all but the newest K checkpoints after each save.
``--writer torch``: plain per-rank shards instead, each rank ``torch.save``\\ s its own
``rank<r>.pt`` (fsync'd with ``--fsync``) and restores it with ``torch.load`` (rank 0's when it
has none). Run without ``torchrun`` it is one rank (a gloo group of one).

The report (``--report``, by rank 0) holds the epoch times, the steps, the checkpoints written
(step, directory, every file's bytes) and the one restored, with its bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import _common as C
import ddp_torchrun as D
import unet3d_npz as U

JOB = "dcp_sharded"


def parse_args(argv=None):
    p = C.make_parser(JOB, __doc__, num_files=16, batch_size=2, workers=1, epochs=2)
    g = p.add_argument_group("dcp")
    g.add_argument(
        "--volume", type=C.positive_int, default=16, help="edge V of the 1xVxVxV volumes (x4)"
    )
    g.add_argument("--compressed", action="store_true", help="np.savez_compressed volumes")
    g.add_argument(
        "--hidden",
        type=C.positive_int,
        default=64,
        help="hidden units of the voxel MLP (V^3 -> hidden -> V^3): the model size; a "
        "checkpoint holds its fp32 weights and Adam's two moments (about 3 x 8 x V^3 x hidden B)",
    )
    g.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="dcp.load the latest checkpoint of --checkpoint-dir at start when there is one",
    )
    g.add_argument("--fsync", action="store_true", help="fsync each checkpoint file")
    g.add_argument(
        "--writer",
        choices=("dcp", "torch"),
        default="dcp",
        help="dcp: dcp.save/dcp.load; torch: each rank torch.save/torch.load its own rank<r>.pt",
    )
    g.add_argument(
        "--keep", type=C.nonneg_int, default=2, help="checkpoints kept (0: all); rank 0 deletes"
    )
    g.add_argument(
        "--drop-last",
        action="store_true",
        help="DistributedSampler(drop_last=True): drop the tail instead of padding ranks",
    )
    args = p.parse_args(argv)
    if args.volume % 4:
        p.error("--volume must be a multiple of 4")
    if not args.checkpoint_every:
        args.checkpoint_every = 4
    return args


def build_model(volume: int, hidden: int):
    from torch import nn

    n = volume**3
    return nn.Sequential(nn.Flatten(), nn.Linear(n, hidden), nn.ReLU(), nn.Linear(hidden, n))


def _checkpoints(folder: str) -> list[tuple[int, str]]:
    """(step, directory) of the complete checkpoints in *folder*, oldest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(folder, name)
        done = (os.path.join(path, m) for m in (".metadata", "rank0.pt"))
        if name.startswith("step_") and any(os.path.isfile(m) for m in done):
            out.append((int(name[5:]), path))
    return sorted(out)


def _files(path: str) -> dict[str, int]:
    return {f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))}


def _state(model, opt, step: int):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "progress": {"step": step}}


def _restore(args, model, opt, dist) -> dict | None:
    """dcp.load of the latest checkpoint into model and optimizer; None when there is none."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    found = _checkpoints(args.checkpoint_dir) if args.resume else []
    if not found:
        return None
    step, path = found[-1]
    t0 = time.perf_counter()
    if args.writer == "torch":
        mine = os.path.join(path, f"rank{dist.get_rank()}.pt")
        mine = mine if os.path.isfile(mine) else os.path.join(path, "rank0.pt")
        state = torch.load(mine, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        nbytes = os.path.getsize(mine)
    else:
        state = _state(model, opt, 0)
        state["progress"]["step"] = torch.tensor(0)
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        nbytes = sum(_files(path).values())
    dist.barrier()
    return {
        "step": int(state["progress"]["step"]),
        "path": path,
        "bytes": nbytes,
        "seconds": time.perf_counter() - t0,
    }


def _save(args, model, opt, step: int, rank: int, dist) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    path = os.path.join(args.checkpoint_dir, f"step_{step:06d}")
    state = _state(model, opt, step)
    state["progress"]["step"] = torch.tensor(step)
    t0 = time.perf_counter()
    if args.writer == "torch":
        os.makedirs(path, exist_ok=True)
        plain = {
            "model": model.module.state_dict(),
            "optim": opt.state_dict(),
            "progress": {"step": step},
        }
        with open(os.path.join(path, f"rank{rank}.pt"), "wb") as fh:
            torch.save(plain, fh)
            if args.fsync:
                fh.flush()
                os.fsync(fh.fileno())
    else:
        writer = dcp.FileSystemWriter(path, sync_files=args.fsync)
        dcp.save(state, storage_writer=writer)
    dist.barrier()  # every rank's shard is written before rank 0 prunes or reports
    seconds = time.perf_counter() - t0
    files = _files(path) if rank == 0 else {}
    if rank == 0 and args.keep:
        for _old_step, old in _checkpoints(args.checkpoint_dir)[: -args.keep]:
            shutil.rmtree(old, ignore_errors=True)
    return {"step": step, "path": path, "files": files, "seconds": seconds}


def train(args, files: list[str], rank: int, world: int, dist) -> dict:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dataset = U.NpzVolumes(files, args.keep_open, args.by_path)
    sampler, loader = D._loader(dataset, args, rank, world)
    model = DDP(build_model(args.volume, C.scaled(args.hidden, args.compute_scale)))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    bce = nn.BCEWithLogitsLoss()
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    restored = _restore(args, model, opt, dist)
    step = restored["step"] if restored else 0
    epoch_times, saves, losses = [], [], []
    dist.barrier()
    t_start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        t_epoch = time.perf_counter()
        for x, y, _b, _c, _pid in loader:
            opt.zero_grad(set_to_none=True)
            loss = bce(model(x).view_as(y), y.float())
            loss.backward()
            opt.step()
            losses.append(round(float(loss.detach()), 6))
            step += 1
            if step % args.checkpoint_every == 0:
                saves.append(_save(args, model, opt, step, rank, dist))
        epoch_times.append(time.perf_counter() - t_epoch)
        if rank == 0 and not args.quiet:
            print(f"[{JOB}] epoch {epoch + 1}/{args.epochs}: step {step}", flush=True)
    C._let_queue_feeders_finish(loader)
    return {
        "epoch_times_s": epoch_times,
        "steps": step,
        "losses": losses,
        "checkpoints": saves,
        "restored": restored,
        "train_s": time.perf_counter() - t_start,
    }


def main(argv=None):
    args = C.finalize_args(parse_args(argv))
    params = {
        "seed": args.seed,
        "num_files": args.num_files,
        "volume": args.volume,
        "compressed": args.compressed,
    }
    gen = U.generate(args)
    rank, world, _local = D._world()
    if args.generate_only:
        files, _ = C.ensure_dataset(args.data_dir, U.JOB, params, gen)
        print(f"[{JOB}] dataset {args.data_dir}: {len(files)} files", flush=True)
        return 0
    import torch

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    dist = D._init_group(rank, world)
    try:
        if rank == 0:
            C.ensure_dataset(args.data_dir, U.JOB, params, gen)
        dist.barrier()
        files, _ = C.ensure_dataset(args.data_dir, U.JOB, params, gen)
        mine = train(args, files, rank, world, dist)
        everyone = D._gather(dist, mine, world)
        D.all_done(dist, rank, world)  # every rank done with the group before any tears it down
    finally:
        dist.destroy_process_group()
    if rank == 0:
        restored = mine["restored"]
        report = {
            "job": JOB,
            "args": vars(args),
            "world_size": world,
            "steps": mine["steps"],
            "losses_per_rank": [r["losses"] for r in everyone],
            "epoch_times_s": [
                max(t) for t in zip(*(r["epoch_times_s"] for r in everyone), strict=False)
            ],
            "checkpoints": mine["checkpoints"],
            "restored": restored,
            "train_s": max(r["train_s"] for r in everyone),
            "exit_code": 0,
        }
        if args.report:
            C.write_json_atomic(args.report, report)
        written = sum(sum(c["files"].values()) for c in mine["checkpoints"])
        print(
            f"[{JOB}] done: {world} rank(s), step {mine['steps']}, "
            f"{len(mine['checkpoints'])} checkpoint(s) of {written} bytes in all, restored "
            + (f"step {restored['step']} ({restored['bytes']} bytes)" if restored else "none"),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    C.run(main)
