# SPDX-License-Identifier: Apache-2.0
"""What the chunk summaries miss on a trained network's attention: the recall each summary's
selection keeps, as a share of the chunk oracle's, from an attention profile file
(ckv_ref.export_profile). The same summaries as `selector_fidelity --proposals`, in float64 from
the keys:

  mean-key    the key mean (what ckv stores and scores today, unquantised)
  exact-lse   the chunk's log-mean-exp of q.k/sqrt(d) from every key: the best any chunk summary
              scored with the window's mean query can do (a reference, not a selector)
  gauss-var   the key mean plus a per-channel variance, with the window's mean q^2
  gauss-box   the same with the variance from the min/max box ((max - min) / 3.53)
  outlier-1   the key farthest from the mean kept exactly, the rest as their mean
  outlier-2   the two farthest kept exactly

Per conversation and layer: the window's queries of the first turn over the stored prefix, the
truth the mean over queries and q heads of the softmax over every prefix token, per chunk; each
summary's score per q head is the softmax over chunks of its logit for the window's mean query,
averaged over q heads; the top budget x chunks are selected (no sink or recent chunk forced).

  python3 -m ckv_ref.summary_recall PROFILE [--budgets 0.05,0.1,0.25] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import struct
import sys

import numpy as np

SUMMARIES = ("mean-key", "exact-lse", "gauss-var", "gauss-box", "outlier-1", "outlier-2")
_DTYPES = {"F16": np.float16, "F32": np.float32, "I32": np.int32}


def read_safetensors(path: str, names) -> tuple[dict, dict]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        out = {}
        for name in names:
            if name not in header:
                raise SystemExit(f"summary_recall: {path} has no tensor {name!r}")
            h = header[name]
            a, b = h["data_offsets"]
            f.seek(8 + n + a)
            out[name] = np.frombuffer(f.read(b - a), _DTYPES[h["dtype"]]).reshape(h["shape"])
    return out, header.get("__metadata__", {})


def _lme(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return (m + np.log(np.exp(x - m).mean(axis=axis, keepdims=True))).squeeze(axis)


def chunk_logits(name: str, k: np.ndarray, qbar: np.ndarray, q2: np.ndarray) -> np.ndarray:
    """k [chunks, c, d] of one kv head; the chunks' estimated log-mean-exp under `name`."""
    d = k.shape[-1]
    c = k.shape[1]
    isd = 1.0 / np.sqrt(d)
    mean = k.mean(1)
    lin = mean @ qbar * isd
    if name == "mean-key":
        return lin
    if name == "exact-lse":
        return _lme(k @ qbar * isd)
    if name in ("gauss-var", "gauss-box"):
        var = k.var(1) if name == "gauss-var" else ((k.max(1) - k.min(1)) / 3.53) ** 2
        return lin + 0.5 * (var @ q2) / d
    m = int(name[-1])
    far = np.argsort(-((k - mean[:, None]) ** 2).sum(-1), axis=1, kind="stable")
    kept = np.take_along_axis(k, far[:, :m, None], axis=1)           # [chunks, m, d]
    rest = np.take_along_axis(k, far[:, m:, None], axis=1).mean(1)   # [chunks, d]
    x = np.concatenate([kept @ qbar * isd, np.repeat((rest @ qbar * isd)[:, None], c - m, 1)], 1)
    return _lme(x)


def measure(K: np.ndarray, Q: np.ndarray, prefix: int, c: int, budgets) -> dict:
    convs, layers, _, kv_heads, d = K.shape
    q_heads = Q.shape[4]
    group = q_heads // kv_heads
    chunks = prefix // c
    sums = {(s, b): 0.0 for s in ("oracle",) + SUMMARIES for b in budgets}
    for conv in range(convs):
        for l in range(layers):
            k = K[conv, l, :chunks * c].astype(np.float64).reshape(chunks, c, kv_heads, d)
            q = Q[conv, 0, l].astype(np.float64)  # [window, q_heads, d]
            mass = np.zeros(chunks)
            scores = {s: np.zeros(chunks) for s in SUMMARIES}
            for g in range(q_heads):
                kh = k[:, :, g // group]
                logits = q[:, g] @ kh.reshape(chunks * c, d).T / np.sqrt(d)
                p = np.exp(logits - logits.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                mass += p.mean(0).reshape(chunks, c).sum(1) / q_heads
                qbar, q2 = q[:, g].mean(0), (q[:, g] ** 2).mean(0)
                for s in SUMMARIES:
                    x = chunk_logits(s, kh, qbar, q2)
                    x = np.exp(x - x.max())
                    scores[s] += x / x.sum() / q_heads
            for b in budgets:
                n = max(1, int(round(b * chunks)))
                best = np.sort(mass)[::-1][:n].sum()
                sums[("oracle", b)] += best
                for s in SUMMARIES:
                    sel = np.argsort(-scores[s], kind="stable")[:n]
                    sums[(s, b)] += mass[sel].sum() / best
    return {key: v / (convs * layers) for key, v in sums.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--budgets", default="0.05,0.1,0.25")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    budgets = [float(x) for x in args.budgets.split(",")]
    if any(not 0 < b <= 1 for b in budgets):
        ap.error(f"--budgets {args.budgets}: each must be in (0, 1]")
    t, meta = read_safetensors(args.profile, ("k", "q"))
    prefix, c = int(meta.get("prefix_tokens", 0)), int(meta.get("chunk_tokens", 0))
    if prefix < c or c <= 0:
        ap.error(f"{args.profile}: metadata prefix_tokens {prefix}, chunk_tokens {c}")
    res = measure(t["k"], t["q"], prefix, c, budgets)
    print(f"{meta.get('model_id', '?')}: {t['k'].shape[0]} conversations, {prefix}-token prefixes, "
          f"{prefix // c} chunks; recall as a share of the chunk oracle's")
    print(f"{'summary':<12}" + "".join(f"{b:>9.0%}" for b in budgets))
    for s in ("oracle",) + SUMMARIES:
        label = "oracle (abs)" if s == "oracle" else s
        print(f"{label:<12}" + "".join(f"{res[(s, b)]:>9.3f}" for b in budgets))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{s}@{b}": v for (s, b), v in res.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
