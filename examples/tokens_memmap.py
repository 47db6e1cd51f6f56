#!/usr/bin/env python
"""A nanoGPT-style language-model loop over a memory-mapped token file, without a DataLoader.

``train.bin`` and ``val.bin`` hold ``uint16`` token ids (generated here, deterministically from
``--seed``, when missing; ``--tokens`` sets the training file's size, the validation file is a
tenth of it). Every batch maps the file anew with ``np.memmap`` (as nanoGPT's ``get_batch``
does, so no mapping outlives a batch), picks ``--batch`` random offsets and takes a window of
``--block`` + 1 tokens at each (input and target, shifted by one token). No read(2) reaches the
file: its pages are faulted in from storage as the windows are copied out. The model is a small
transformer trained with AdamW; every ``--eval-interval`` steps a validation pass of
``--eval-iters`` batches over ``val.bin`` (``model.eval()``, ``torch.no_grad()``), and a
``torch.save`` of model and optimizer at the end.

The report (``--report``) has ``epoch_times_s`` (one entry: the whole loop, evaluation passes
included), ``steps``, ``windows`` (slices taken of the mapped files), ``window_bytes`` and the
final losses.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def _positive(s: str) -> int:
    v = int(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{s}: must be > 0")
    return v


def _nonneg(s: str) -> int:
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s}: must be >= 0")
    return v


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tokens_memmap.py",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--data-dir", default=os.path.join("data", "tokens_memmap"))
    p.add_argument("--tokens", type=_positive, default=2_000_000, help="tokens in train.bin")
    p.add_argument("--vocab", type=_positive, default=512, help="vocabulary size (< 65536)")
    p.add_argument("--block", type=_positive, default=128, help="window size (tokens)")
    p.add_argument("--batch", type=_positive, default=8, help="windows per step")
    p.add_argument("--steps", type=_positive, default=60, help="optimizer steps")
    p.add_argument("--eval-interval", type=_nonneg, default=20, help="steps between validations")
    p.add_argument("--eval-iters", type=_positive, default=4, help="batches per validation")
    p.add_argument("--width", type=_positive, default=64, help="model width (d_model)")
    p.add_argument("--threads", type=_nonneg, default=1, help="torch threads (0 = default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generate-only", action="store_true", help="write the token files and exit")
    p.add_argument("--checkpoint-dir", default=None, help="default: <data-dir>/../checkpoints")
    p.add_argument("--report", default=None, metavar="PATH", help="write a JSON report here")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.vocab >= 65536:
        p.error("--vocab must be below 65536 (uint16 tokens)")
    args.data_dir = os.path.abspath(args.data_dir)
    if args.checkpoint_dir is None:
        args.checkpoint_dir = os.path.join(os.path.dirname(args.data_dir), "checkpoints")
    return args


def ensure_tokens(args: argparse.Namespace) -> dict[str, str]:
    """The token files (generated when missing or of another size): split -> path."""
    import numpy as np

    os.makedirs(args.data_dir, exist_ok=True)
    paths = {}
    for split, n, salt in (
        ("train", args.tokens, 1),
        ("val", max(args.tokens // 10, 4 * args.block + 2), 2),
    ):
        path = os.path.join(args.data_dir, f"{split}.bin")
        paths[split] = path
        if os.path.isfile(path) and os.path.getsize(path) == 2 * n:
            continue
        rng = np.random.default_rng([args.seed, salt])
        # a little structure to learn: runs of rising ids with random restarts
        steps = rng.integers(0, 3, size=n, dtype=np.int64)
        tokens = (
            np.cumsum(steps) + rng.integers(0, args.vocab, size=n) * (steps == 0)
        ) % args.vocab
        tmp = path + ".tmp"
        tokens.astype(np.uint16).tofile(tmp)
        os.replace(tmp, path)
    return paths


def build_model(args: argparse.Namespace):
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(args.vocab, args.width)
            self.pos = nn.Embedding(args.block, args.width)
            self.block = nn.TransformerEncoderLayer(
                args.width, nhead=2, dim_feedforward=2 * args.width, batch_first=True, dropout=0.0
            )
            self.head = nn.Linear(args.width, args.vocab)

        def forward(self, idx, targets):
            t = idx.shape[1]
            h = self.tok(idx) + self.pos(torch.arange(t))
            mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
            logits = self.head(self.block(h, src_mask=mask, is_causal=True))
            return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return TinyLM()


class Batches:
    """nanoGPT's ``get_batch``: a new ``np.memmap`` each batch, ``batch`` random windows."""

    def __init__(self, paths: dict[str, str], args: argparse.Namespace) -> None:
        import torch

        self.paths, self.args = paths, args
        self.gen = torch.Generator().manual_seed(args.seed)
        self.windows = 0
        self.window_bytes = 0

    def get(self, split: str):
        import numpy as np
        import torch

        block = self.args.block
        data = np.memmap(self.paths[split], dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - block - 1, (self.args.batch,), generator=self.gen)
        x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + block].astype(np.int64)) for i in ix]
        )
        self.windows += 2 * len(ix)
        self.window_bytes += 2 * len(ix) * block * data.itemsize
        return x, y


def evaluate(model, batches: Batches, args: argparse.Namespace) -> float:
    import torch

    model.eval()
    losses = []
    with torch.no_grad():
        for _ in range(args.eval_iters):
            x, y = batches.get("val")
            losses.append(float(model(x, y)))
    model.train()
    return sum(losses) / len(losses)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paths = ensure_tokens(args)
    if args.generate_only:
        return 0
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    batches = Batches(paths, args)
    train_loss = val_loss = math.nan
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = batches.get("train")
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        train_loss = loss.item()
        if args.eval_interval and (step + 1) % args.eval_interval == 0:
            val_loss = evaluate(model, batches, args)
            if not args.quiet:
                print(f"step {step + 1}: train {train_loss:.3f} val {val_loss:.3f}", flush=True)
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    ckpt = os.path.join(args.checkpoint_dir, "tokens_memmap.pt")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt)
    wall = time.perf_counter() - t0
    report = {
        "job": "tokens_memmap",
        "epoch_times_s": [wall],
        "steps": args.steps,
        "block": args.block,
        "batch": args.batch,
        "windows": batches.windows,
        "window_bytes": batches.window_bytes,
        "train_loss": train_loss,
        "val_loss": None if math.isnan(val_loss) else val_loss,
        "checkpoint_bytes": os.path.getsize(ckpt),
    }
    if args.report:
        tmp = args.report + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
        os.replace(tmp, args.report)
    if not args.quiet:
        print(f"{args.steps} steps in {wall:.2f} s, train loss {train_loss:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
