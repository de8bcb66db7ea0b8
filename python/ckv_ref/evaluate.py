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

budgets: at each budget, per system, over the prompts, each against the full recompute:
  top-1      agreement of the first token
  KL         KL(full || system) of the first token's distribution (nats)
  greedy16   the share of the full computation's next 16 greedy tokens that the system's
             decoding predicts, teacher-forced on them (decoding after the Re-Prefill attends to
             what the system loaded, the suffix and the tokens decoded so far)
  dNLL       the system's mean negative log-likelihood of the next 64 tokens of held-out text
             less the full computation's (nats per token; exp of it is the perplexity ratio)
  recall     the share of the full computation's attention mass (window queries over the
             prefix) on the tokens the system attends to; mean over layers, q heads and queries
  attended   the share of the prefix attended to, the sink and the recent chunk counted
  read       the bytes read per layer, as a share of the prefix's K and V (what `full` reads)
The systems:
  ckv-paper  ckv session, period-exact, period --period layers
  ckv        ckv session, mean-key with period selection, period --period layers (the benchmark's
             `ckv`)
  quest      ckv session, quest at every layer
  mean-key, outlier-key  ckv session, mean-key or outlier-key at every layer
  oracle     ckv session, exact attention at every layer (an upper bound for chunk selection)
  ckv-est, oracle-est  ckv and oracle with estimate_rest: the chunks not loaded as virtual
             tokens (docs/estimate.md)
  mean-key-est  mean-key at every layer, with estimate_rest
  mean-key-est-target, oracle-est-target  the same and oracle-est with the budget read as a
             target mass (ReprefillOptions::target_mass, no ceiling): `attended` says how much
             each loaded
  h2o        H2O's heavy hitters: per KV head, the tokens with the most attention accumulated
             over the prefix's own prefill (every causal query row summed), known when the
             prefix was stored; reads only the tokens it attends to
  impress    IMPRESS: 3 probe q heads of one GQA group score the prefix with the Re-Prefill's
             own window queries against their KV head's keys (read for every token); when their
             top-k sets agree (Jaccard >= budget^0.6) every q head of that group ranks, else
             every q head over every KV head's keys; one token set for every head
  token-oracle  the top tokens of the full computation's own attention (mean over heads and
             window queries): unknowable before computing, an oracle
Every token-level system attends to the same share of the prefix as the budget says, the sink
and the recent chunk counted in it. The ckv systems run through a real ckv store and session;
the token-level ones through ckvio.masked_run with the same float16-rounded prefix KV.
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
from .attention_stats import full_computation, over_prefix, stats
from .model import attend, load_weights

DEFAULT_WEIGHTS = os.path.join(os.path.dirname(__file__), "weights", "tiny.npz")
CKV_SYSTEMS = {
    "ckv-paper": dict(selector="period-exact", period_selection=False),
    "ckv": dict(selector="mean-key", period_selection=True),
    "ckv-est": dict(selector="mean-key", period_selection=True, estimate=True),
    "quest": dict(selector="quest", period_selection=False),
    "mean-key": dict(selector="mean-key", period_selection=False),
    "outlier-key": dict(selector="outlier-key", period_selection=False),
    "oracle": dict(selector="oracle", period_selection=False),
    "oracle-est": dict(selector="oracle", period_selection=False, estimate=True),
    "mean-key-est": dict(selector="mean-key", period_selection=False, estimate=True),
    "mean-key-est-target": dict(selector="mean-key", period_selection=False, estimate=True,
                                target=True),
    "oracle-est-target": dict(selector="oracle", period_selection=False, estimate=True,
                              target=True),
}
TOKEN_SYSTEMS = ("h2o", "impress", "token-oracle")
GREEDY_TOKENS = 16   # the full computation's greedy continuation, judged token by token
TEXT_TOKENS = 64     # the held-out text after the prompt, whose perplexity is judged


def attended_budget(budget, prefix, c):
    """Tokens a token-level system attends to at `budget`: the share of the prefix, the sink and
    the recent chunk counted in it (as a ckv session counts them in its chunks)."""
    return min(prefix, max(2 * c, math.floor(budget * prefix + 0.5)))


def top_tokens(score, prefix, budget, c):
    """A bool mask [..., prefix]: the sink chunk, the recent chunk (and the tail), and the
    highest-scoring other tokens, attended_budget() in all per row of `score` [..., prefix]."""
    keep = torch.zeros(score.shape, dtype=torch.bool)
    keep[..., :c] = True
    keep[..., (prefix // c - 1) * c:prefix] = True
    rest = attended_budget(budget, prefix, c) - int(keep[(0,) * (keep.dim() - 1)].sum())
    if rest > 0:
        free = score.masked_fill(keep, float("-inf"))
        idx = torch.topk(free, rest, dim=-1).indices
        keep.scatter_(-1, idx, True)
    return keep


def h2o_scores(prefix_probs, kv_heads):
    """H2O's heavy hitters: per layer and KV head, the attention each prefix token accumulated
    from every query of the prefix's own prefill (the causal rows summed), over the KV head's
    query heads: [kv_heads, prefix]. Known when the prefix was stored, before any request."""
    out = []
    for p in prefix_probs:  # [q_heads, n, n]
        acc = p.sum(1)      # [q_heads, n]
        out.append(acc.reshape(kv_heads, -1, acc.shape[-1]).sum(1))
    return out


def impress_keep(model, budget, c, probes, gate=True):
    """IMPRESS at one layer: its 3 probe q heads (one GQA group: one KV head's keys, read for
    every prefix token) score the prefix with the Re-Prefill's own window queries; when their
    top-k sets agree (Jaccard >= budget^0.6, the gate) every q head of that KV head scores, and
    when they disagree every q head over every KV head's keys (the fallback). A bool [prefix],
    one set for every head, as IMPRESS loads every head of a token it selects."""
    cfg = model.cfg
    group = cfg.q_heads // cfg.kv_heads
    kv = probes[0] // group
    fallbacks = []

    def keep(layer, q_window, prefix_keys):
        prefix = prefix_keys.shape[0]
        kk = prefix_keys.repeat_interleave(group, dim=1)  # [prefix, q_heads, d]
        scores = torch.einsum("whd,phd->hwp", q_window, kk) / math.sqrt(cfg.head_dim)
        mass = torch.softmax(scores, -1).mean(1)  # [q_heads, prefix], each head's window mean
        k = attended_budget(budget, prefix, c)
        sets = [set(torch.topk(mass[h], k).indices.tolist()) for h in probes]
        jac = np.mean([len(sets[a] & sets[b]) / max(1, len(sets[a] | sets[b]))
                       for a, b in ((0, 1), (0, 2), (1, 2))])
        agree = not gate or jac >= budget ** 0.6
        fallbacks.append(not agree)
        score = mass[kv * group:(kv + 1) * group].mean(0) if agree else mass.mean(0)
        return top_tokens(score, prefix, budget, c)

    keep.fallbacks = fallbacks
    return keep


def recall(p_window, prefix, keep):
    """Share of the window's attention mass over the prefix on the kept tokens (mean over q heads
    and queries); keep is [prefix] or [kv_heads, prefix]."""
    if keep.dim() == 2:
        keep = keep.repeat_interleave(p_window.shape[0] // keep.shape[0], dim=0)[:, None, :]
    else:
        keep = keep[None, None, :]
    return float((over_prefix(p_window, prefix) * keep).sum(-1).mean())


def kl(p_logits, q_logits):
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return float((lp.exp() * (lp - lq)).sum())


@torch.no_grad()
def greedy_continuation(model, tokens, n):
    """The full computation's next n greedy tokens after `tokens`, decoding with a KV cache."""
    logits, ks, vs, _, _ = model.forward_full(tokens)
    ks, vs = list(ks), list(vs)
    out, pos = [int(logits.argmax())], len(tokens)
    while len(out) < n:
        p = torch.tensor([pos])
        h = model.embed(torch.tensor([out[-1]]))
        for l, layer in enumerate(model.layers):
            q, k, v = layer.qkv(h, model.cos[p], model.sin[p])
            ks[l], vs[l] = torch.cat([ks[l], k]), torch.cat([vs[l], v])
            h = layer.finish(h, attend(q, ks[l], vs[l], p, torch.arange(pos + 1)))
        out.append(int(model.logits(h[-1]).argmax()))
        pos += 1
    return out


@torch.no_grad()
def text_nll(model, tokens, text):
    """The full computation's mean negative log-likelihood of `text` following `tokens`."""
    x = torch.as_tensor(np.concatenate([tokens, text]).astype(np.int64))[None]
    logits = model.train_forward(x)[0, len(tokens) - 1:-1]
    return float(torch.nn.functional.cross_entropy(logits, torch.as_tensor(text, dtype=torch.long)))


def budgets(model, prompts, prefix, window, period, budget_list, store_dir, c=16, systems=None,
            codec="none"):
    """Every system at every budget over `prompts` (each prefix + suffix + TEXT_TOKENS of held-out
    text that follows), against the full computation. `codec`: how the ckv systems' store keeps
    its records (the token-level systems attend to float16 K and V)."""
    import ckv
    spec = ckvio.spec_of(model, chunk_tokens=c, codec=codec)
    cfg = model.cfg
    ckv_systems = {k: v for k, v in CKV_SYSTEMS.items() if systems is None or k in systems}
    token_systems = [k for k in TOKEN_SYSTEMS if systems is None or k in systems]
    token_bytes = 2 * cfg.kv_heads * cfg.head_dim * 2  # one token's K and V at one layer, fp16
    probes = [0, 1, 2]  # IMPRESS's 3 probe heads, in KV head 0's group
    rows = {}
    with ckv.Engine.open(store_dir) as engine:
        for i, whole in enumerate(prompts):
            tokens, text = whole[:-TEXT_TOKENS], whole[-TEXT_TOKENS:]
            ckvio.store(engine, spec, model, tokens[:prefix])
            full, probs = full_computation(model, tokens, window)
            _, pks, pvs, _, pprobs = model.forward_full(tokens[:prefix], keep_probs=True)
            heavy = h2o_scores(pprobs, cfg.kv_heads)
            del pprobs
            greedy = greedy_continuation(model, tokens, GREEDY_TOKENS)
            truth = {"full": full, "greedy": greedy, "nll": text_nll(model, tokens, text),
                     "text": text, "probs": probs}
            for b in budget_list:
                for name, opts in ckv_systems.items():
                    opts = dict(opts)
                    # A target system reads the budget as its target mass, with no ceiling.
                    target = opts.pop("target", False)
                    runs = [ckvio.reprefill(engine, spec, model, tokens,
                                            budget=1.0 if target else b,
                                            target_mass=b if target else 0.0, window=window,
                                            period_layers=period, then=then, **opts)
                            for then in (greedy[:-1], text[:-1])]
                    got = runs[0]
                    chunks = sum(len(sel) for sel in got.selections) / cfg.layers
                    read = chunks * c / prefix
                    add(rows, name, b, truth, prefix, got.attended(prefix),
                        [r.next_logits for r in runs], read)
                for name in token_systems:
                    if name == "h2o":
                        keep = [top_tokens(s, prefix, b, c) for s in heavy]
                    elif name == "impress":
                        keep = impress_keep(model, b, c, probes)
                    else:  # the oracle: the full computation's own attention (unknowable)
                        keep = [top_tokens(over_prefix(p, prefix).mean((0, 1)), prefix, b, c)
                                for p in probs]
                    runs = [ckvio.masked_run(model, tokens, prefix, keep, then=then,
                                             prefix_kv=(pks, pvs), window=window)
                            for then in (greedy[:-1], text[:-1])]
                    keeps = runs[0].keeps
                    attended = np.mean([float(k.float().mean()) for k in keeps])
                    read = attended  # the attended tokens' K and V, token by token
                    if name == "impress":
                        # the probe heads' KV heads' keys of every token (one KV head when the
                        # probes share a group), and every KV head's keys on the layers whose
                        # gate fell back
                        group = cfg.q_heads // cfg.kv_heads
                        probe_kv = len({h // group for h in probes})
                        falls = keep.fallbacks[:cfg.layers]
                        read += np.mean([(cfg.kv_heads if f else probe_kv) / (2 * cfg.kv_heads)
                                         for f in falls])
                    add(rows, name, b, truth, prefix, keeps, [r.next_logits for r in runs], read)
            if sys.stderr.isatty():
                print(f"\rbudgets: prompt {i + 1}/{len(prompts)}", end="", file=sys.stderr)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    out = []
    for (name, b), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        n = len(r["top1"])
        out.append({"system": name, "budget": b, "prompts": n,
                    "oracle": name.startswith("oracle") or name == "token-oracle",
                    "top1_agreement": sum(r["top1"]) / n, "kl_mean": float(np.mean(r["kl"])),
                    "kl_max": float(np.max(r["kl"])),
                    "greedy16_agreement": float(np.mean(r["greedy"])),
                    "text_nll_delta": float(np.mean(r["nll"])),
                    "attention_recall": float(np.mean(r["recall"])),
                    "attended_share": float(np.mean(r["attended"])),
                    "read_share": float(np.mean(r["read"])),
                    "read_bytes_per_layer": float(np.mean(r["read"])) * prefix * token_bytes})
    return out


def add(rows, name, b, truth, prefix, keeps, next_logits, read):
    """One prompt's figures for (name, b). next_logits: the system's logits over the greedy
    continuation and over the held-out text, each [1 + len - 1, vocab]."""
    r = rows.setdefault((name, b), {k: [] for k in ("top1", "kl", "greedy", "nll", "recall",
                                                    "attended", "read")})
    logits = next_logits[0][0]
    full = truth["full"]
    r["top1"].append(int(logits.argmax()) == int(full.argmax()))
    r["kl"].append(kl(full, logits))
    greedy = torch.as_tensor(truth["greedy"])
    r["greedy"].append(float((next_logits[0].argmax(-1) == greedy).float().mean()))
    text = torch.as_tensor(truth["text"], dtype=torch.long)
    nll = float(torch.nn.functional.cross_entropy(next_logits[1], text))
    r["nll"].append(nll - truth["nll"])
    r["recall"].append(float(np.mean([recall(p, prefix, k)
                                      for p, k in zip(truth["probs"], keeps)])))
    r["attended"].append(float(np.mean([float(k.float().mean()) for k in keeps])))
    r["read"].append(read)


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
    lines = [f"{'budget':>6}  {'system':<20} {'top-1':>6} {'KL mean':>9} {'KL max':>8} "
             f"{'greedy16':>8} {'dNLL':>7} {'recall':>7} {'attended':>8} {'read':>6}"]
    for r in rows:
        name = r["system"] + (" (oracle)" if r["oracle"] else "")
        lines.append(f"{r['budget'] * 100:5.0f}%  {name:<20} {r['top1_agreement']:6.2f} "
                     f"{r['kl_mean']:9.5f} {r['kl_max']:8.4f} {r['greedy16_agreement']:8.3f} "
                     f"{r['text_nll_delta']:7.4f} {r['attention_recall']:7.3f} "
                     f"{r['attended_share']:8.3f} {r['read_share']:6.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["stats", "budgets"])
    ap.add_argument("--weights", default=DEFAULT_WEIGHTS)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prefix-tokens", type=int,
                    help="default: 2048 for a model trained after BOS (ref2k), else 448")
    ap.add_argument("--suffix-tokens", type=int, default=64)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--period", type=int, default=2)
    ap.add_argument("--budgets", default="5,10,25,50")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--systems", help="budgets: a comma-separated subset of "
                    + ", ".join(list(CKV_SYSTEMS) + list(TOKEN_SYSTEMS)) + " (default: all)")
    ap.add_argument("--codec", default="none", choices=["none", "fp8", "int8", "int4"],
                    help="budgets: how the ckv systems' store keeps its records")
    ap.add_argument("--shard", default="0/1", metavar="K/N",
                    help="evaluate the prompts k, k + n, k + 2n, ... of the --prompts (so that n "
                         "processes share the cores; their JSON rows merge by prompt counts)")
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
    if args.prefix_tokens is None:
        args.prefix_tokens = 2048 if model.cfg.bos >= 0 else 448
    length = args.prefix_tokens + args.suffix_tokens + (TEXT_TOKENS if args.what == "budgets" else 0)
    if length > model.cfg.max_tokens:
        ap.error(f"{length} tokens per prompt; the model's positions end at {model.cfg.max_tokens}")
    held = corpus.split()[1]
    prompts = corpus.prompts(held, args.prompts, length, seed=args.seed, bos=model.cfg.bos)
    try:
        shard, shards = (int(x) for x in args.shard.split("/"))
        if not 0 <= shard < shards:
            raise ValueError
    except ValueError:
        ap.error(f"--shard {args.shard}: want K/N with 0 <= K < N")
    prompts = prompts[shard::shards]
    if args.what == "stats":
        result = stats(model, prompts, args.prefix_tokens, args.window, args.period)
        for k, v in result.items():
            print(f"{k:>6}: {v}")
    else:
        budget_list = [float(x) / 100 for x in args.budgets.split(",")]
        tmp = tempfile.mkdtemp(prefix="ckv-ref-budgets.")
        try:
            result = budgets(model, prompts, args.prefix_tokens, args.window, args.period,
                             budget_list, os.path.join(tmp, "store"), systems=systems,
                             codec=args.codec)
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
