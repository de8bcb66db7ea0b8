# SPDX-License-Identifier: Apache-2.0
"""Trains the reference decoder, deterministically, on 2 CPU cores.

  python3 -m ckv_ref.train --out ckv_ref/weights/tiny.npz                   (from python/)
  python3 -m ckv_ref.train --preset ref2k --out ckv_ref/weights/ref2k.npz

A fixed seed, a fixed number of steps and a fixed batch order (seeded random windows of the
training text, each after BOS when the configuration has one), AdamW with a linear warm-up and a
cosine decay, gradient clipping at 1. The result depends only on the corpus (its digest is
recorded), the code and torch's CPU kernels at a given thread count. Writes the weights (float16
.npz, with the configuration and the training record), the loss curve as CSV beside them (step,
tokens, train loss, held-out loss, seconds, the parameters' probe, and with --stats-prompts the
attention statistics of ckv_ref.attention_stats at each evaluation) and, when gnuplot is
installed, its plot as PNG.

The probe is the sum of every parameter times a fixed pseudo-random sign, after each step: a
run that starts from other weights or sees other batches gives other probes from the first
step, where the loss alone barely moves from ln(vocab); thread counts change it only in its
last digits. The suite trains the first steps again and compares both (tests/python).
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
from .attention_stats import stats
from .model import PRESETS, Decoder, save_weights

# Per preset: steps, batch, seq (tokens per window, BOS included), lr, warm-up, stats prompts,
# and the last long_steps steps' windows (long_batch of long_seq tokens): short windows first,
# the full context last, as long-context models are trained, since a step's attention grows with
# the square of its window (11.5 s for 2 x 2,176 tokens here, 3.2 s for 8 x 512).
DEFAULTS = {
    "tiny": dict(steps=400, batch=8, seq=512, lr=3e-3, warmup=30, stats_prompts=0,
                 long_steps=0, long_batch=2, long_seq=2176),
    "ref2k": dict(steps=560, batch=8, seq=512, lr=3e-3, warmup=30, stats_prompts=2,
                  long_steps=70, long_batch=2, long_seq=2176),
}
# The statistics' prompts: a 2,048-token prefix (or what the window leaves) and a 64-token
# suffix whose last 32 queries are the window, as evaluate.py measures them.
STATS_SUFFIX, STATS_WINDOW = 64, 32


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


def batches(data: np.ndarray, batch: int, seq: int, seed: int, bos: int = -1):
    """Windows of seq + 1 tokens (inputs and the next-token targets): text from seeded offsets,
    after BOS when `bos` is a token."""
    rng = np.random.default_rng(seed)
    body = seq + 1 - (1 if bos >= 0 else 0)
    while True:
        starts = rng.integers(0, len(data) - body, size=batch)
        x = np.stack([data[s:s + body] for s in starts]).astype(np.int64)
        if bos >= 0:
            x = np.concatenate([np.full((batch, 1), bos, np.int64), x], axis=1)
        yield torch.from_numpy(x)


@torch.no_grad()
def held_out_loss(model: Decoder, held: np.ndarray, seq: int) -> float:
    x = next(batches(held, 8 if seq <= 512 else 2, seq, seed=12345, bos=model.cfg.bos))
    logits = model.train_forward(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()


def probe_signs(model: Decoder) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(20260101)
    return [torch.randint(0, 2, p.shape, generator=g).double() * 2 - 1 for p in model.parameters()]


@torch.no_grad()
def probe(model: Decoder, signs: list[torch.Tensor]) -> float:
    return float(sum((p.double() * s).sum() for p, s in zip(model.parameters(), signs)))


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
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                    help="the configuration (ckv_ref.model.PRESETS) and its training defaults")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=50,
                    help="steps between held-out evaluations (0: none, not even the last)")
    ap.add_argument("--stats-prompts", type=int,
                    help="held-out prompts whose attention statistics each evaluation logs")
    ap.add_argument("--long-steps", type=int, help="the last steps, on long windows")
    ap.add_argument("--long-batch", type=int)
    ap.add_argument("--long-seq", type=int)
    args = ap.parse_args(argv)
    for key, value in DEFAULTS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train, held, digest = corpus.split()
    cfg = PRESETS[args.preset]
    context = max(args.seq, args.long_seq if args.long_steps > 0 else 0)
    if context > cfg.max_tokens:
        ap.error(f"windows of {context} tokens; the RoPE tables have {cfg.max_tokens} positions")
    if not 0 <= args.long_steps <= args.steps:
        ap.error(f"--long-steps {args.long_steps} must be in [0, --steps {args.steps}]")
    model = Decoder(cfg)
    stats_prompts = []
    if args.stats_prompts > 0:
        stats_prefix = min(2048, context - STATS_SUFFIX)
        stats_prompts = corpus.prompts(held, args.stats_prompts, stats_prefix + STATS_SUFFIX,
                                       seed=777, bos=cfg.bos)
    init_weights(model, args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"train: {params / 1e6:.2f} M parameters; corpus {len(train) / 1e6:.1f} MB train, "
          f"{len(held) / 1e6:.1f} MB held out (digest {digest}); {args.steps - args.long_steps} "
          f"steps of {args.batch} x {args.seq} tokens, then {args.long_steps} of "
          f"{args.long_batch} x {args.long_seq}, on {args.threads} threads", flush=True)
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
    signs = probe_signs(model)
    header = "step,tokens,train_loss,held_out_loss,seconds,probe"
    if stats_prompts:
        header += ",sink_layers_1_up,top5,top10,adj"
    rows = [header]
    start = time.monotonic()
    it = batches(train, args.batch, args.seq, args.seed, bos=cfg.bos)
    long_it = batches(train, args.long_batch, args.long_seq, args.seed + 1, bos=cfg.bos)
    tokens = 0
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x = next(long_it if step >= args.steps - args.long_steps else it)
        tokens += x.shape[0] * (x.shape[1] - 1)
        model.train()
        logits = model.train_forward(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = step + 1 == args.steps
        held_loss, attention = "", ""
        if args.eval_every > 0 and (step % args.eval_every == 0 or last):
            model.eval()
            held_loss = f"{held_out_loss(model, held, context):.4f}"
            if stats_prompts:
                m = stats(model, stats_prompts, stats_prefix, STATS_WINDOW, period=2)["mean"]
                attention = (f"{m['sink_layers_1_up']:.4f},{m['top5']:.4f},{m['top10']:.4f},"
                             f"{m['adj']:.4f}")
        elapsed = time.monotonic() - start
        row = (f"{step + 1},{tokens},{loss.item():.4f},"
               f"{held_loss},{elapsed:.1f},{probe(model, signs):.6f}")
        if stats_prompts:
            row += "," + (attention or ",,,")
        rows.append(row)
        if held_loss or sys.stdout.isatty():
            print(f"train: step {step + 1}/{args.steps} loss {loss.item():.3f} "
                  f"held-out {held_loss or '-'} {elapsed:.0f} s"
                  + (f" (sink, top5, top10, adj: {attention})" if attention else ""), flush=True)
    seconds = time.monotonic() - start
    with open(base + ".loss.csv", "w") as f:
        f.write("\n".join(rows) + "\n")
    model.eval()
    meta = {"preset": args.preset, "steps": args.steps, "batch": args.batch, "seq": args.seq,
            "long_steps": args.long_steps, "long_batch": args.long_batch,
            "long_seq": args.long_seq, "lr": args.lr,
            "warmup": args.warmup, "seed": args.seed, "threads": args.threads,
            "corpus_digest": digest, "seconds": round(seconds, 1),
            "final_held_out_loss": float(rows[-1].split(",")[3] or "nan"),
            "torch": torch.__version__}
    save_weights(model, args.out, meta)
    plot(base + ".loss.csv", base + ".loss.png")
    print(f"train: wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB) in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
