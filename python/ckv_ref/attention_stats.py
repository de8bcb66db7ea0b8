# SPDX-License-Identifier: Apache-2.0
"""The reference decoder's attention measured as bench/attention_stats.cc measures the synthetic
generator's (docs/generator.md): sink share, top-5% and top-10% mass, adjacent-layer and
adjacent-period overlap. Needs torch and numpy only (training logs these as it goes)."""
from __future__ import annotations

import numpy as np
import torch


def full_computation(model, tokens, window):
    """The full computation's last-token logits and, per layer, the attention of the last
    `window` queries, [q_heads, w, n]."""
    logits, _, _, _, probs = model.forward_full(tokens, keep_probs=True)
    return logits, [p[:, -window:, :].clone() for p in probs]  # not the whole [n, n]


def over_prefix(p_window, prefix):
    """Each query's and head's attention over the prefix alone, renormalised to sum to 1, as
    kernels::TokenAttention computes it from the stored keys: [q_heads, w, prefix]."""
    pp = p_window[:, :, :prefix]
    return pp / pp.sum(-1, keepdim=True)


def top_set(x: torch.Tensor, frac: float) -> set:
    k = max(1, int(round(frac * x.numel())))
    return set(torch.topk(x, k).indices.tolist())


def chunk_mass(p: torch.Tensor, c: int) -> torch.Tensor:
    """[..., n] -> [..., n // c] summed per whole chunk."""
    n = p.shape[-1] // c * c
    return p[..., :n].reshape(*p.shape[:-1], n // c, c).sum(-1)


def head_agreement(per_head: torch.Tensor, kv_heads: int, frac: float = 0.05) -> float:
    """The mean top-5% Jaccard of two q heads of one GQA group (as attention_stats's jac-in),
    per_head [q_heads, prefix]; nan when a group has one q head."""
    group = per_head.shape[0] // kv_heads
    sets = [top_set(h, frac) for h in per_head]
    jac = [len(sets[a] & sets[b]) / len(sets[a] | sets[b])
           for g in range(kv_heads) for a in range(g * group, (g + 1) * group)
           for b in range(a + 1, (g + 1) * group)]
    return float(np.mean(jac)) if jac else float("nan")


def stats(model, prompts, prefix, window, period, c=16):
    layers = model.cfg.layers
    per_layer = {k: np.zeros(layers) for k in ("sink", "top5", "top10", "adj", "head_jac")}
    period_overlap = []
    for tokens in prompts:
        _, probs = full_computation(model, tokens, window)
        tops = []
        for l, p in enumerate(probs):
            per_head = over_prefix(p, prefix).mean(1)  # the window's mean per q head [q, prefix]
            per_layer["sink"][l] += float(per_head[:, :4].sum(-1).mean())
            for name, frac in (("top5", 0.05), ("top10", 0.10)):
                k = max(1, int(round(frac * prefix)))
                share = torch.topk(per_head, k, dim=-1).values.sum(-1) / per_head.sum(-1)
                per_layer[name][l] += float(share.mean())
            per_layer["head_jac"][l] += head_agreement(per_head, model.cfg.kv_heads)
            tops.append(top_set(chunk_mass(per_head.mean(0), c), 0.10))
            if l > 0:
                per_layer["adj"][l] += len(tops[l] & tops[l - 1]) / len(tops[l])
        heads = list(range(0, layers, period))
        for a, b in zip(heads, heads[1:]):
            period_overlap.append(len(tops[a] & tops[b]) / len(tops[b]))
    n = len(prompts)
    out = {k: (v / n).round(4).tolist() for k, v in per_layer.items()}
    out["adj"][0] = None  # layer 0 has no previous layer
    mean = lambda v, first: float(np.mean(v[first:])) if len(v) > first else float("nan")
    out["mean"] = {"sink_layers_1_up": mean(out["sink"], 1), "top5": mean(out["top5"], 0),
                   "top10": mean(out["top10"], 0), "adj": mean(out["adj"], 1),
                   "head_agreement": mean(out["head_jac"], 0),
                   "period_head_overlap": float(np.mean(period_overlap)) if period_overlap
                   else float("nan")}
    return out
