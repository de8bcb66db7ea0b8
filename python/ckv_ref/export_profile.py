# SPDX-License-Identifier: Apache-2.0
"""Writes the trained reference decoder's KV and queries as an attention profile for
bench/reprefill_bench (`--attention-profile trained-tiny --profile-file PATH`).

  python3 -m ckv_ref.export_profile --out build/trained-tiny.safetensors     (from python/)

Conversations are held-out Python sources (ckv_ref.corpus), each --prefix-tokens tokens followed
by --turns suffixes of --suffix-tokens. The file (safetensors) holds:
  k       float16 [conversations, layers, total_tokens, kv_heads, head_dim]  K after RoPE
  v       float16 [conversations, layers, total_tokens, kv_heads, head_dim]
  q       float32 [conversations, turns, layers, window, q_heads, head_dim]   queries after RoPE
          of the last `window` tokens of each turn's suffix
  tokens  int32   [conversations, total_tokens]
with total_tokens = prefix_tokens + turns * suffix_tokens, and as metadata (strings) model_id,
layers, q_heads, kv_heads, head_dim, chunk_tokens, prefix_tokens, suffix_tokens, turns, window,
rope_theta, hidden, intermediate. Token i's K and V depend on tokens <= i only, so one
conversation's arrays serve every turn.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

from . import ckvio, corpus
from .model import load_weights

DEFAULT_WEIGHTS = os.path.join(os.path.dirname(__file__), "weights", "tiny.npz")
_DTYPES = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}


def write_safetensors(path: str, tensors: dict, metadata: dict) -> None:
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    offset = 0
    arrays = []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for a in arrays:
            f.write(a.tobytes())
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--weights", default=DEFAULT_WEIGHTS)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=384)
    ap.add_argument("--suffix-tokens", type=int, default=64)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--chunk-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=31)
    args = ap.parse_args(argv)
    if not 0 < args.window <= args.suffix_tokens:
        ap.error(f"--window {args.window} must be in [1, --suffix-tokens {args.suffix_tokens}]")
    torch.set_num_threads(1)  # see tests/python/test_reference_model.py
    model = load_weights(args.weights)
    cfg = model.cfg
    total = args.prefix_tokens + args.turns * args.suffix_tokens
    if total > cfg.max_tokens:
        ap.error(f"{total} tokens per conversation; the model's positions end at {cfg.max_tokens}")
    convs = corpus.prompts(corpus.split()[1], args.conversations, total, seed=args.seed,
                           bos=cfg.bos)
    k = np.zeros((len(convs), cfg.layers, total, cfg.kv_heads, cfg.head_dim), np.float16)
    v = np.zeros_like(k)
    q = np.zeros((len(convs), args.turns, cfg.layers, args.window, cfg.q_heads, cfg.head_dim),
                 np.float32)
    for c, tokens in enumerate(convs):
        _, ks, vs, qs, _ = model.forward_full(tokens)
        k16, v16 = ckvio.kv_arrays(ks, vs)
        for l in range(cfg.layers):
            k[c, l], v[c, l] = k16[l], v16[l]
            for t in range(args.turns):
                end = args.prefix_tokens + (t + 1) * args.suffix_tokens
                q[c, t, l] = qs[l][end - args.window:end].numpy()
    meta = {"model_id": ckvio.model_id_of(model), "layers": cfg.layers, "q_heads": cfg.q_heads,
            "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "chunk_tokens": args.chunk_tokens,
            "prefix_tokens": args.prefix_tokens, "suffix_tokens": args.suffix_tokens,
            "turns": args.turns, "window": args.window, "rope_theta": cfg.rope_theta,
            "hidden": cfg.hidden, "intermediate": cfg.intermediate}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_safetensors(args.out, {"k": k, "v": v, "q": q, "tokens": np.stack(convs)}, meta)
    print(f"export_profile: wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB): "
          f"{len(convs)} conversations of {total} tokens, {args.turns} turns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
