#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes an attention profile file of seeded random data, in the format a trained network's
profile has (tools/attention_profile_file.h; docs/generator.md, "A trained network's attention"),
to try reprefill_bench --attention-profile trained-tiny without the network. Standard library only.

    tools/random_attention_profile.py OUT.safetensors [--conversations 2] [--layers 2] ...
"""
import argparse
import json
import random
import struct


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    dims = dict(conversations=2, layers=2, q_heads=14, kv_heads=2, head_dim=64, chunk_tokens=16,
                prefix_tokens=256, suffix_tokens=32, turns=3, window=8)
    for name, default in dims.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    ap.add_argument("--model-id", default="random/trained-tiny")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    c, l, t = a.conversations, a.layers, a.prefix_tokens + a.turns * a.suffix_tokens
    kv_shape = [c, l, t, a.kv_heads, a.head_dim]
    q_shape = [c, a.turns, l, a.window, a.q_heads, a.head_dim]

    def count(shape):
        n = 1
        for d in shape:
            n *= d
        return n

    def gauss(n, fmt):
        return struct.pack("<%d%s" % (n, fmt), *(rng.gauss(0, 1) for _ in range(n)))

    # Sorted by name, as safetensors writers lay them out.
    tensors = {
        "k": ("F16", kv_shape, gauss(count(kv_shape), "e")),
        "q": ("F32", q_shape, gauss(count(q_shape), "f")),
        "tokens": ("I32", [c, t], struct.pack("<%di" % (c * t),
                                              *(rng.randrange(151643) for _ in range(c * t)))),
        "v": ("F16", kv_shape, gauss(count(kv_shape), "e")),
    }
    meta = {"model_id": a.model_id, "rope_theta": "1000000.0"}
    meta.update({k: str(getattr(a, k)) for k in dims if k != "conversations"})
    header = {"__metadata__": meta}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(a.out, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, data in tensors.values():
            f.write(data)


if __name__ == "__main__":
    main()
