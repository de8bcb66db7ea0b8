# SPDX-License-Identifier: Apache-2.0
"""Trains the reference decoder, deterministically, on 2 CPU cores.

  python3 -m ckv_ref.train --out python/ckv_ref/weights/tiny.npz      (from python/)

A fixed seed, a fixed number of steps and a fixed batch order (seeded random windows of the
training text), AdamW with a linear warm-up and a cosine decay, gradient clipping at 1. The
result depends only on the corpus (its digest is recorded), the code and torch's CPU kernels at
a given thread count. Writes the weights (float16 .npz, with the configuration and the training
record), the loss curve as CSV beside them (step, tokens, train loss, held-out loss, seconds)
and, when gnuplot is installed, its plot as PNG.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from . import corpus
from .model import Config, Decoder, save_weights


def init_weights(model: Decoder, seed: int) -> None:
    """Normal(0, 0.02) for every matrix and the embedding, zero biases, unit norms."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def batches(data: np.ndarray, batch: int, seq: int, seed: int):
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - seq - 1, size=batch)
        x = np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(x)


@torch.no_grad()
def held_out_loss(model: Decoder, held: np.ndarray, seq: int) -> float:
    x = next(batches(held, 8, seq, seed=12345))
    logits = model.train_forward(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()


def plot(csv_path: str, png_path: str) -> None:
    script = (f"set terminal png size 800,480\nset output '{png_path}'\n"
              "set datafile separator ','\nset key top right\nset grid\n"
              "set xlabel 'step'\nset ylabel 'cross-entropy (nats per byte)'\n"
              "set title 'ckv reference decoder: training on the Python standard library'\n"
              f"plot '{csv_path}' every ::1 using 1:3 with lines title 'train', "
              f"'' every ::1 using 1:4 with linespoints title 'held out'\n")
    try:
        subprocess.run(["gnuplot"], input=script.encode(), check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"train: gnuplot failed ({e}); no plot drawn", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="weights file (.npz); the curve goes beside it")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=50)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train, held, digest = corpus.split()
    cfg = Config()
    model = Decoder(cfg)
    init_weights(model, args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"train: {params / 1e6:.2f} M parameters; corpus {len(train) / 1e6:.1f} MB train, "
          f"{len(held) / 1e6:.1f} MB held out (digest {digest}); {args.steps} steps of "
          f"{args.batch} x {args.seq} tokens on {args.threads} threads", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    base = os.path.splitext(args.out)[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rows = ["step,tokens,train_loss,held_out_loss,seconds"]
    start = time.monotonic()
    it = batches(train, args.batch, args.seq, args.seed)
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x = next(it)
        model.train()
        logits = model.train_forward(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = step + 1 == args.steps
        held_loss = ""
        if step % args.eval_every == 0 or last:
            model.eval()
            held_loss = f"{held_out_loss(model, held, args.seq):.4f}"
        elapsed = time.monotonic() - start
        rows.append(f"{step + 1},{(step + 1) * args.batch * args.seq},{loss.item():.4f},"
                    f"{held_loss},{elapsed:.1f}")
        if held_loss or sys.stdout.isatty():
            print(f"train: step {step + 1}/{args.steps} loss {loss.item():.3f} "
                  f"held-out {held_loss or '-'} {elapsed:.0f} s", flush=True)
    seconds = time.monotonic() - start
    with open(base + ".loss.csv", "w") as f:
        f.write("\n".join(rows) + "\n")
    model.eval()
    meta = {"steps": args.steps, "batch": args.batch, "seq": args.seq, "lr": args.lr,
            "warmup": args.warmup, "seed": args.seed, "threads": args.threads,
            "corpus_digest": digest, "seconds": round(seconds, 1),
            "final_held_out_loss": float(rows[-1].split(",")[3]), "torch": torch.__version__}
    save_weights(model, args.out, meta)
    plot(base + ".loss.csv", base + ".loss.png")
    print(f"train: wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB) in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
