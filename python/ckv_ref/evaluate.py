# SPDX-License-Identifier: Apache-2.0
"""What the trained reference decoder's attention looks like, and what selection costs it.

  python3 -m ckv_ref.evaluate stats   [--prompts 16] [--json PATH]
  python3 -m ckv_ref.evaluate budgets [--prompts 16] [--budgets 5,10,25,50] [--json PATH]
                                      [--plot PATH]

(from python/, with the ckv module on PYTHONPATH: PYTHONPATH=../build/python:.)

Prompts are held-out Python sources (ckv_ref.corpus): a prefix of --prefix-tokens tokens
(stored in ckv, 16-token chunks) and a suffix of --suffix-tokens, whose last --window tokens'
queries are a layer's window, as in bench/attention_stats.cc.

stats: per layer and over the layers, as bench/attention_stats.cc reports them for the synthetic
generator, on each query's attention over the prefix alone (renormalised; the suffix's own
tokens left out): sink (mass of the window's queries on the first 4 tokens), top5 / top10 (mass
held by the top 5% / 10% of prefix tokens, per q head), adj (|A n B| / |A| of the top-10% chunks of a
layer and the previous one, on the q heads' averaged mass) and the overlap of adjacent period
heads' top-10% chunks (layers 0, p, 2p, ...).

budgets: at each budget, per system, over the prompts: top-1 agreement of the first token with
the full recompute, KL(full || system) of the first token's distribution (nats), and attention
recall (the share of the full computation's attention mass, window queries over the prefix, on
the tokens the system attends to; mean over layers, q heads and queries). The systems:
  ckv-paper  ckv session, period-exact, period --period layers
  ckv        ckv session, mean-key with period selection, period --period layers (the benchmark's
             `ckv`)
  quest      ckv session, quest at every layer
  oracle     ckv session, exact attention at every layer (an upper bound for chunk selection)
  ckv-est, oracle-est  ckv and oracle with estimate_rest: the chunks not loaded as virtual
             tokens (docs/estimate.md)
  mean-key-est  mean-key at every layer, with estimate_rest
  mean-key-est-target, oracle-est-target  the same and oracle-est with the budget read as a
             target mass (ReprefillOptions::target_mass, no ceiling): `attended` says how much
             each loaded
  h2o        token-level top-k of the window's attention, mean over every q head (as
             kernels::Select's h2o), plus the sink and the recent chunk
  impress    token-level top-k of 3 probe q heads' mean attention, falling back to every head
             when the probes' top-k sets agree less than budget^0.6 (Jaccard), plus the sink and
             the recent chunk (as bench/reprefill/system_impress)
The ckv systems run through a real ckv store and session; the token-level ones through
ckvio.masked with the same float16-rounded prefix KV. The token-level baselines pick their tokens
from the full computation's attention (each query's softmax over the prefix alone, as
kernels::TokenAttention), where the ckv sessions score with the queries of their own, sparse,
Re-Prefill: a small advantage to the baselines.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

from . import ckvio, corpus
from .model import load_weights

DEFAULT_WEIGHTS = os.path.join(os.path.dirname(__file__), "weights", "tiny.npz")
CKV_SYSTEMS = {
    "ckv-paper": dict(selector="period-exact", period_selection=False),
    "ckv": dict(selector="mean-key", period_selection=True),
    "ckv-est": dict(selector="mean-key", period_selection=True, estimate=True),
    "quest": dict(selector="quest", period_selection=False),
    "oracle": dict(selector="oracle", period_selection=False),
    "oracle-est": dict(selector="oracle", period_selection=False, estimate=True),
    "mean-key-est": dict(selector="mean-key", period_selection=False, estimate=True),
    "mean-key-est-target": dict(selector="mean-key", period_selection=False, estimate=True,
                                target=True),
    "oracle-est-target": dict(selector="oracle", period_selection=False, estimate=True,
                              target=True),
}
TOKEN_SYSTEMS = ("h2o", "impress")


def full_computation(model, tokens, window):
    """The full computation's last-token logits and, per layer, the attention of the last
    `window` queries, [q_heads, w, n]."""
    logits, _, _, _, probs = model.forward_full(tokens, keep_probs=True)
    return logits, [p[:, -window:, :] for p in probs]


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


def stats(model, prompts, prefix, window, period, c=16):
    layers = model.cfg.layers
    per_layer = {k: np.zeros(layers) for k in ("sink", "top5", "top10", "adj")}
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
                   "period_head_overlap": float(np.mean(period_overlap)) if period_overlap
                   else float("nan")}
    return out


def token_selection(system, p_window, prefix, budget, c, kv_heads):
    """The prefix tokens a token-level baseline attends to at one layer: a bool [prefix]."""
    q_heads = p_window.shape[0]
    per_head = over_prefix(p_window, prefix).mean(1)  # [q_heads, prefix], each head's mean
    k = min(prefix, max(1, math.floor(budget * prefix + 0.5)))
    if system == "h2o":
        mass = per_head.mean(0)
    else:  # impress: 3 probe q heads, spread (q_heads / 3 apart), with the Jaccard gate
        probes = [i * q_heads // 3 for i in range(3)]
        mass = per_head[probes].mean(0)
        # The gate falls back to every head when the probes disagree, which needs the keys of
        # the KV heads the probes do not cover; when they cover all (as here: q heads 0, 1, 2
        # over 2 KV heads), there is nothing to fall back to (bench/reprefill/system_impress).
        group = q_heads // kv_heads
        if len({h // group for h in probes}) < kv_heads:
            sets = [set(torch.topk(per_head[h], k).indices.tolist()) for h in probes]
            pairs = [(0, 1), (0, 2), (1, 2)]
            jac = np.mean([len(sets[a] & sets[b]) / max(1, len(sets[a] | sets[b]))
                           for a, b in pairs])
            if jac < budget ** 0.6:
                mass = per_head.mean(0)
    keep = torch.zeros(prefix, dtype=torch.bool)
    keep[torch.topk(mass, k).indices] = True
    keep[:c] = True                            # the sink chunk
    keep[(prefix // c - 1) * c:prefix] = True  # the recent chunk (and the tail)
    return keep


def recall(p_window, prefix, keep):
    """Share of the window's attention mass over the prefix on the kept tokens (mean over q heads
    and queries)."""
    return float((over_prefix(p_window, prefix) * keep[None, None, :]).sum(-1).mean())


def kl(p_logits, q_logits):
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return float((lp.exp() * (lp - lq)).sum())


def budgets(model, prompts, prefix, window, period, budget_list, store_dir, c=16, systems=None):
    import ckv
    spec = ckvio.spec_of(model, chunk_tokens=c)
    ckv_systems = {k: v for k, v in CKV_SYSTEMS.items() if systems is None or k in systems}
    token_systems = [k for k in TOKEN_SYSTEMS if systems is None or k in systems]
    rows = {}
    with ckv.Engine.open(store_dir) as engine:
        for i, tokens in enumerate(prompts):
            ckvio.store(engine, spec, model, tokens[:prefix])
            full, probs = full_computation(model, tokens, window)
            for b in budget_list:
                for name, opts in ckv_systems.items():
                    opts = dict(opts)
                    # A target system reads the budget as its target mass, with no ceiling.
                    target = opts.pop("target", False)
                    got = ckvio.reprefill(engine, spec, model, tokens, budget=1.0 if target else b,
                                          target_mass=b if target else 0.0, window=window,
                                          period_layers=period, **opts)
                    add(rows, name, b, full, got.logits, probs, prefix, got.attended(prefix))
                for name in token_systems:
                    keeps = [token_selection(name, p, prefix, b, c, model.cfg.kv_heads)
                             for p in probs]
                    logits, _ = ckvio.masked(model, tokens, prefix, keeps)
                    add(rows, name, b, full, logits, probs, prefix, keeps)
            if sys.stderr.isatty():
                print(f"\rbudgets: prompt {i + 1}/{len(prompts)}", end="", file=sys.stderr)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    out = []
    for (name, b), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        n = len(r["top1"])
        out.append({"system": name, "budget": b, "prompts": n,
                    "top1_agreement": sum(r["top1"]) / n, "kl_mean": float(np.mean(r["kl"])),
                    "kl_max": float(np.max(r["kl"])),
                    "attention_recall": float(np.mean(r["recall"])),
                    "attended_share": float(np.mean(r["attended"]))})
    return out


def add(rows, name, b, full, logits, probs, prefix, keeps):
    r = rows.setdefault((name, b), {"top1": [], "kl": [], "recall": [], "attended": []})
    r["top1"].append(int(logits.argmax()) == int(full.argmax()))
    r["kl"].append(kl(full, logits))
    r["recall"].append(float(np.mean([recall(p, prefix, k) for p, k in zip(probs, keeps)])))
    r["attended"].append(float(np.mean([float(k.float().mean()) for k in keeps])))


def plot(rows, path):
    systems = sorted({r["system"] for r in rows})
    blocks = ["\n".join(f"{r['budget'] * 100:g} {r['kl_mean']:.6f}" for r in rows
                        if r["system"] == s) + "\ne\n" for s in systems]
    script = (f"set terminal png size 800,480\nset output '{path}'\nset logscale y\nset grid\n"
              "set xlabel 'budget (% of the prefix)'\nset ylabel 'KL(full || system), nats'\n"
              "set title 'Reference decoder: first-token KL against a full recompute'\n"
              "plot " + ", ".join(f"'-' with linespoints title '{s}'" for s in systems) + "\n" +
              "".join(blocks))
    try:
        subprocess.run(["gnuplot"], input=script.encode(), check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"evaluate: gnuplot failed ({e}); no plot drawn", file=sys.stderr)


def table(rows):
    lines = [f"{'budget':>6}  {'system':<10} {'top-1':>6} {'KL mean':>9} {'KL max':>8} "
             f"{'recall':>7} {'attended':>8}"]
    for r in rows:
        lines.append(f"{r['budget'] * 100:5.0f}%  {r['system']:<10} {r['top1_agreement']:6.2f} "
                     f"{r['kl_mean']:9.5f} {r['kl_max']:8.4f} {r['attention_recall']:7.3f} "
                     f"{r['attended_share']:8.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["stats", "budgets"])
    ap.add_argument("--weights", default=DEFAULT_WEIGHTS)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prefix-tokens", type=int, default=448)
    ap.add_argument("--suffix-tokens", type=int, default=64)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--period", type=int, default=2)
    ap.add_argument("--budgets", default="5,10,25,50")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--systems", help="budgets: a comma-separated subset of "
                    + ", ".join(list(CKV_SYSTEMS) + list(TOKEN_SYSTEMS)) + " (default: all)")
    ap.add_argument("--json", help="write the figures as JSON here")
    ap.add_argument("--plot", help="budgets: draw KL against the budget (PNG, gnuplot)")
    args = ap.parse_args(argv)
    systems = None if args.systems is None else args.systems.split(",")
    for s in systems or []:
        if s not in CKV_SYSTEMS and s not in TOKEN_SYSTEMS:
            ap.error(f"--systems: unknown system {s!r}")
    if not 0 < args.window <= args.suffix_tokens:
        ap.error(f"--window {args.window} must be in [1, --suffix-tokens {args.suffix_tokens}]")
    torch.set_num_threads(1)  # see tests/python/test_reference_model.py
    model = load_weights(args.weights)
    held = corpus.split()[1]
    prompts = corpus.prompts(held, args.prompts, args.prefix_tokens + args.suffix_tokens,
                             seed=args.seed)
    if args.what == "stats":
        result = stats(model, prompts, args.prefix_tokens, args.window, args.period)
        for k, v in result.items():
            print(f"{k:>6}: {v}")
    else:
        budget_list = [float(x) / 100 for x in args.budgets.split(",")]
        tmp = tempfile.mkdtemp(prefix="ckv-ref-budgets.")
        try:
            result = budgets(model, prompts, args.prefix_tokens, args.window, args.period,
                             budget_list, os.path.join(tmp, "store"), systems=systems)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(table(result))
        if args.plot:
            plot(result, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": args.what, "args": vars(args), "result": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
