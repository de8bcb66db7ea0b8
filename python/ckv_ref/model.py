# SPDX-License-Identifier: Apache-2.0
"""A Qwen2-architecture decoder, small enough to train and run on 2 CPU cores.

The layers follow Qwen2 (transformers' modeling_qwen2): RMSNorm before attention and before the
MLP, q/k/v projections with bias and an output projection without, rotary position embedding
applied to q and k by rotate_half, grouped-query attention (kv_heads < q_heads, each KV head
serving q_heads / kv_heads query heads), a SwiGLU MLP, a final RMSNorm and an LM head tied to the
embedding. Tokens are bytes (vocabulary 256), so no tokenizer is needed.

The KV a serving system caches is each layer's K after RoPE and V, per token:
[tokens, kv_heads, head_dim]. `forward` returns it beside the logits, and `attend` is the one
attention routine that a full prefill and a Re-Prefill over selected chunks both use.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    hidden: int = 128
    layers: int = 6
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 384
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    max_tokens: int = 2048  # positions the RoPE tables cover
    # The token every training window and every prompt starts with (a BOS outside the bytes'
    # range, vocab - 1), or -1 for none (tiny: windows start anywhere, and no sink forms).
    bos: int = -1
    name: str = "tiny"  # ckv_ref.model.PRESETS's; the ckv model id is ckv-ref-<name>

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Config":
        return Config(**json.loads(text))


# The trained configurations (python/ckv_ref/weights/<name>.npz):
#   tiny   6 layers, 4 q heads over 2 KV heads, windows of 512 bytes starting anywhere;
#   ref2k  8 layers, 8 q heads over 2 KV heads (groups of 4, so that IMPRESS's 3 probe heads fit
#          in one), Qwen2's long-context RoPE base (1e6), windows of 2,176 tokens that all start
#          with BOS, so that a 2,048-token prefix, its suffix and what follows fit.
PRESETS = {
    "tiny": Config(),
    "ref2k": Config(vocab=257, hidden=128, layers=8, q_heads=8, kv_heads=2, head_dim=16,
                    intermediate=384, rope_theta=1e6, max_tokens=2304, bos=256, name="ref2k"),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rope_tables(cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_tokens, head_dim], Qwen2's layout (the frequencies twice)."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) /
                                    cfg.head_dim))
    t = torch.arange(cfg.max_tokens, dtype=torch.float64)
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., tokens, heads, head_dim]; cos, sin [tokens, head_dim] of the tokens' positions."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
           k_pos: torch.Tensor, return_probs: bool = False,
           visible: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None):
    """Causal GQA attention of queries over keys at arbitrary positions.

    q [n, q_heads, d]; k, v [m, kv_heads, d]; q_pos [n], k_pos [m] (token positions: a query sees
    the keys at positions <= its own); visible [q_heads, m], when given, hides the keys a head
    may not see; bias [q_heads, m], when given, is added to the logits (ckv's virtual tokens).
    Returns out [n, q_heads, d] (and the probabilities [q_heads, n, m] when asked).
    """
    group = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1)  # [m, q_heads, d]
    vv = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q, kk) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias[:, None, :]
    hide = (k_pos[None, :] > q_pos[:, None])[None]  # [1, n, m]
    if visible is not None:
        hide = hide | ~visible[:, None, :]
    scores = scores.masked_fill(hide, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("hnm,mhd->nhd", probs, vv)
    return (out, probs) if return_probs else out


class Layer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.input_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.q_proj = nn.Linear(cfg.hidden, cfg.q_heads * cfg.head_dim, bias=True)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=True)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=True)
        self.o_proj = nn.Linear(cfg.q_heads * cfg.head_dim, cfg.hidden, bias=False)
        self.post_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def qkv(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [..., n, q_heads, d], k and v [..., n, kv_heads, d], q and k after RoPE."""
        c = self.cfg
        x = self.input_norm(h)
        shape = x.shape[:-1]
        q = self.q_proj(x).view(*shape, c.q_heads, c.head_dim)
        k = self.k_proj(x).view(*shape, c.kv_heads, c.head_dim)
        v = self.v_proj(x).view(*shape, c.kv_heads, c.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """The residual around attention (attn_out [..., n, q_heads, d]), then the MLP's."""
        h = h + self.o_proj(attn_out.flatten(-2))
        x = self.post_norm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Decoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        cos, sin = rope_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h) @ self.embed.weight.T  # the LM head is tied to the embedding

    def train_forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [batch, n, vocab] of a batch [batch, n] (training: batched causal attention)."""
        n = tokens.shape[1]
        cos, sin = self.cos[:n], self.sin[:n]
        h = self.embed(tokens)
        group = self.cfg.q_heads // self.cfg.kv_heads
        mask = torch.full((n, n), float("-inf")).triu(1)
        for layer in self.layers:
            q, k, v = layer.qkv(h, cos, sin)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, heads, n, d]
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.cfg.head_dim) + mask
            out = torch.softmax(scores, dim=-1) @ v
            h = layer.finish(h, out.transpose(1, 2))
        return self.logits(h)

    @torch.no_grad()
    def forward_full(self, tokens, keep_probs: bool = False):
        """A full prefill of one prompt (a 1-D sequence of token ids).

        Returns (logits of the last token [vocab], ks, vs, qs, probs): per layer, K after RoPE
        and V [n, kv_heads, d], q after RoPE [n, q_heads, d], and with keep_probs the attention
        probabilities [q_heads, n, n] (else None).
        """
        t = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        n = t.shape[0]
        pos = torch.arange(n)
        cos, sin = self.cos[:n], self.sin[:n]
        h = self.embed(t)
        ks, vs, qs, probs = [], [], [], []
        for layer in self.layers:
            q, k, v = layer.qkv(h, cos, sin)
            out, p = attend(q, k, v, pos, pos, return_probs=True)
            ks.append(k)
            vs.append(v)
            qs.append(q)
            probs.append(p if keep_probs else None)
            h = layer.finish(h, out)
        return self.logits(h[-1]), ks, vs, qs, (probs if keep_probs else None)


def save_weights(model: Decoder, path: str, meta: Optional[dict] = None) -> None:
    """Weights as float16 in a numpy .npz, with the configuration (and `meta`) as JSON."""
    arrays = {name: p.detach().numpy().astype(np.float16) for name, p in model.state_dict().items()}
    arrays["__config__"] = np.frombuffer(model.cfg.to_json().encode(), dtype=np.uint8)
    if meta is not None:
        arrays["__meta__"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8)
    np.savez_compressed(path, **arrays)


def load_weights(path: str) -> Decoder:
    """The decoder saved by save_weights, in float32."""
    with np.load(path) as z:
        cfg = Config.from_json(bytes(z["__config__"]).decode())
        model = Decoder(cfg)
        state = {name: torch.from_numpy(z[name].astype(np.float32))
                 for name in z.files if not name.startswith("__")}
    model.load_state_dict(state)
    model.eval()
    return model
