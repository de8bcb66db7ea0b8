# SPDX-License-Identifier: Apache-2.0
"""The reference decoder's KV into ckv, and its Re-Prefill out of ckv.

store()      a full prefill of the prompt; its post-RoPE K and V (float16), every layer, go to
             ckv by Engine.put (whole chunks; the tail after the last whole chunk is not stored)
reprefill()  a later request with a stored prefix: a ckv session serves each layer's selected
             chunks, and the request's new tokens (the unstored tail and the suffix) are
             computed over them at their true positions, layer after layer, to the first token
masked()     the same computation over any per-layer token selection of the prefix, without ckv:
             how the token-level baselines' selections are turned into a first token
Both take `then`: tokens that follow the prompt, decoded after the Re-Prefill (teacher-forced)
over what it loaded, the prompt's new tokens and each other, so that more than the first
token is judged (next_logits: one row per predicted token).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import torch

import ckv

from .model import Decoder, attend

MODEL_ID = "ckv-ref-tiny"


def model_id_of(model: Decoder) -> str:
    """ckv-ref-tiny, ckv-ref-ref2k: the configuration's name (ckv_ref.model.PRESETS)."""
    return f"ckv-ref-{model.cfg.name}"


def spec_of(model: Decoder, chunk_tokens: int = 16, model_id: Optional[str] = None,
            codec: str = "none") -> "ckv.ModelSpec":
    """The model's ckv spec; `codec` stores its records quantised (docs/format.md)."""
    c = model.cfg
    model_id = model_id or model_id_of(model)
    return ckv.ModelSpec(layers=c.layers, q_heads=c.q_heads, kv_heads=c.kv_heads,
                         head_dim=c.head_dim, dtype="fp16", chunk_tokens=chunk_tokens,
                         model_id=model_id, codec=codec)


def as_tokens(tokens) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(tokens, dtype=np.int32))


def kv_arrays(ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor]):
    """Per-layer float16 numpy K and V [n, kv_heads, head_dim], as ckv stores them."""
    to16 = lambda t: np.ascontiguousarray(t.numpy().astype(np.float16))
    return [to16(k) for k in ks], [to16(v) for v in vs]


@torch.no_grad()
def store(engine: "ckv.Engine", spec: "ckv.ModelSpec", model: Decoder, tokens) -> dict:
    """Prefills `tokens` in full and puts their KV; returns put()'s result."""
    tokens = as_tokens(tokens)
    _, ks, vs, _, _ = model.forward_full(tokens)
    k, v = kv_arrays(ks, vs)
    return engine.put(spec, tokens, k, v)


@dataclasses.dataclass
class Reprefilled:
    logits: torch.Tensor               # of the prompt's last token [vocab]
    matched_chunks: int                # stored leading chunks the session served from
    new_tokens: int                    # tokens computed: the unstored tail and the suffix
    selections: list[list[int]]        # per layer, the chunks served
    probs: list[Optional[torch.Tensor]]  # per layer, with keep_probs: [q_heads, new, attended]
    stats: dict                        # the session's figures (finish())
    queries: list[np.ndarray]          # per layer, what submit_queries got (empty without)
    chunk_tokens: int = 16
    # The prompt's last token's logits, then each `then` token's: [1 + len(then), vocab].
    next_logits: Optional[torch.Tensor] = None

    def attended(self, prefix_tokens: int) -> list[torch.Tensor]:
        """Per layer, a bool mask over the first prefix_tokens tokens of what the new tokens
        attended to: the served chunks' tokens and the unstored tail (recomputed), as
        masked() takes it."""
        c = self.chunk_tokens
        masks = []
        for chunks in self.selections:
            keep = torch.zeros(prefix_tokens, dtype=torch.bool)
            keep[self.matched_chunks * c:] = True
            for j in chunks:
                keep[j * c:(j + 1) * c] = True
            masks.append(keep)
        return masks


@torch.no_grad()
def reprefill(engine: "ckv.Engine", spec: "ckv.ModelSpec", model: Decoder, tokens, *,
              selector: str = "period-exact", budget: float = 1.0, window: int = 32,
              period_layers: int = 2, period_selection: bool = False, with_queries: bool = True,
              keep_probs: bool = False, estimate: bool = False,
              target_mass: float = 0.0, then: Sequence[int] = ()) -> Reprefilled:
    """The first token of `tokens` from a ckv Re-Prefill of its stored leading chunks.

    The session is begun on tokens[:-1], so at least the last token is computed (as a serving
    system recomputes the last token of a prompt it holds whole). The window is the last
    min(window, new tokens) queries. with_queries=False (budget 1 only) submits none: every
    matched chunk is served, as a connector with no queries would get them. estimate=True asks
    the session for the chunks it did not load as virtual tokens (docs/estimate.md), which the
    attention takes beside the loaded tokens, each with its logit bias. target_mass > 0 has each
    layer load the fewest chunks whose scores reach it (ReprefillOptions::target_mass), with
    `budget` the ceiling. `then` (see the module's note) is decoded after the prompt over the
    same selection: its tokens never choose chunks.
    """
    tokens = as_tokens(tokens)
    then = as_tokens(then)
    if len(tokens) < 1:
        raise ValueError("reprefill: an empty prompt")
    if not with_queries and budget < 1.0:
        raise ValueError(f"reprefill: with_queries=False needs budget 1, not {budget}")
    c = spec.chunk_tokens
    # probe, not lookup: with a remote tier, lookup would fetch the whole chain before the
    # session, which then could not read only the records it selects from the cluster.
    matched = engine.probe(spec, tokens[:-1])["chunks"]
    w = max(1, min(window, len(tokens) - matched * c))
    session = engine.begin_reprefill(spec, tokens[:-1], selector=selector, budget_fraction=budget,
                                     window=w, period_layers=period_layers,
                                     period_selection=period_selection, estimate_rest=estimate,
                                     target_mass=target_mass)
    try:
        matched = session.matched_chunks
        start = matched * c
        prompt_new = len(tokens) - start  # the prompt's tokens computed here; `then` follows
        new = torch.as_tensor(np.concatenate([tokens[start:], then]).astype(np.int64))
        if prompt_new < w:
            raise RuntimeError(f"reprefill: {prompt_new} new tokens, fewer than the window {w}: "
                               "the store changed between probe and the session")
        pos = torch.arange(start, start + new.shape[0])
        cos, sin = model.cos[pos], model.sin[pos]
        h = model.embed(new)
        selections, probs, queries = [], [], []
        for l, layer in enumerate(model.layers):
            q, k, v = layer.qkv(h, cos, sin)
            window_q = np.ascontiguousarray(q[prompt_new - w:prompt_new].numpy(),
                                            dtype=np.float32)
            queries.append(window_q if with_queries else window_q[:0])
            if with_queries:
                session.submit_queries(l, window_q)
            view = session.await_layer(l)
            chunks = [r.chunk for r in view]
            if chunks:
                k_sel = torch.from_numpy(np.concatenate([r.k for r in view]).astype(np.float32))
                v_sel = torch.from_numpy(np.concatenate([r.v for r in view]).astype(np.float32))
                p_sel = torch.cat([torch.arange(r.first_token, r.first_token + c) for r in view])
                k_all, v_all = torch.cat([k_sel, k]), torch.cat([v_sel, v])
                p_all = torch.cat([p_sel, pos])
            else:
                k_all, v_all, p_all = k, v, pos
            bias = None
            vt = view.virtual_tokens
            if vt is not None:
                # In the prefix, before every new token (position 0 is visible to all of them),
                # each with its bias; the real tokens get none.
                m = len(vt["chunks"])
                k_all = torch.cat([torch.from_numpy(vt["keys"]), k_all])
                v_all = torch.cat([torch.from_numpy(vt["values"]), v_all])
                p_all = torch.cat([torch.zeros(m, dtype=p_all.dtype), p_all])
                bias = torch.cat([torch.from_numpy(vt["bias"]).T,
                                  torch.zeros(q.shape[1], k_all.shape[0] - m)], dim=1)
            del view  # unpins its records: the tensors above are copies
            out, p = attend(q, k_all, v_all, pos, p_all, return_probs=True, bias=bias)
            selections.append(chunks)
            probs.append(p if keep_probs else None)
            h = layer.finish(h, out)
        next_logits = model.logits(h[prompt_new - 1:])
    except BaseException:
        session.finish()
        raise
    stats = session.finish()
    return Reprefilled(next_logits[0], matched, prompt_new, selections, probs, stats, queries, c,
                       next_logits)


@dataclasses.dataclass
class Masked:
    next_logits: torch.Tensor            # the prompt's last token's, then each `then` token's
    probs: list[Optional[torch.Tensor]]  # per layer, with keep_probs: [q_heads, new, all]
    keeps: list[torch.Tensor]            # per layer, the mask the new tokens attended through


@torch.no_grad()
def masked(model: Decoder, tokens, prefix_tokens: int, keep, keep_probs: bool = False):
    """The first token when the new tokens (those from prefix_tokens on) attend to only part of
    the prefix: (logits [vocab], per layer probs [q_heads, new, prefix + new] or None), from
    masked_run()."""
    got = masked_run(model, tokens, prefix_tokens, keep, keep_probs=keep_probs)
    return got.next_logits[0], got.probs


@torch.no_grad()
def masked_run(model: Decoder, tokens, prefix_tokens: int, keep, keep_probs: bool = False,
               then: Sequence[int] = (), prefix_kv=None, window: int = 32) -> Masked:
    """The new tokens (those from prefix_tokens on, then `then`) computed over part of the
    prefix. keep[l] is a bool mask over the prefix's tokens, [prefix_tokens] (one set for every
    head) or [kv_heads, prefix_tokens] (a set per KV head, shared by its query heads); or keep
    is a function (layer, window_queries [w, q_heads, d], prefix_keys [prefix, kv_heads, d]) ->
    such a mask, which chooses at each layer from the queries of the Re-Prefill itself (the
    prompt's last `window` new tokens, or fewer), as a baseline that scores keys does. The
    prefix's K and V are rounded to float16, as ckv stores them, so that a selection gives here
    what a ckv session serving it would; `prefix_kv` (ks, vs as forward_full returns them) saves
    the prefix's prefill when the caller has it.
    """
    tokens = as_tokens(tokens)
    then = as_tokens(then)
    prompt_new = len(tokens) - prefix_tokens
    tokens = np.concatenate([tokens, then])
    n = len(tokens)
    if prefix_kv is None:
        _, ks, vs, _, _ = model.forward_full(tokens[:prefix_tokens])
    else:
        ks, vs = prefix_kv
    ks = [k.half().float() for k in ks]
    vs = [v.half().float() for v in vs]
    w = max(1, min(window, prompt_new))
    pos = torch.arange(prefix_tokens, n)
    cos, sin = model.cos[pos], model.sin[pos]
    h = model.embed(torch.as_tensor(tokens[prefix_tokens:].astype(np.int64)))
    all_pos = torch.arange(n)
    group = model.cfg.q_heads // model.cfg.kv_heads
    probs, keeps = [], []
    for l, layer in enumerate(model.layers):
        q, k, v = layer.qkv(h, cos, sin)
        k_all, v_all = torch.cat([ks[l], k]), torch.cat([vs[l], v])
        mask = keep(l, q[prompt_new - w:prompt_new], ks[l]) if callable(keep) else keep[l]
        keeps.append(mask)
        if mask.dim() == 1:
            mask = mask[None, :].expand(model.cfg.kv_heads, -1)
        mask = mask.repeat_interleave(group, dim=0)  # [q_heads, prefix]
        visible = torch.cat([mask, torch.ones(mask.shape[0], n - prefix_tokens, dtype=torch.bool)],
                            dim=1)
        out, p = attend(q, k_all, v_all, pos, all_pos, return_probs=True, visible=visible)
        probs.append(p if keep_probs else None)
        h = layer.finish(h, out)
    return Masked(model.logits(h[prompt_new - 1:]), probs, keeps)

