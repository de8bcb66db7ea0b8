# SPDX-License-Identifier: Apache-2.0
"""ckv_ref: a small Qwen2-architecture decoder in PyTorch that prefills through ckv.

model.py   the decoder (RMSNorm, q/k/v projections with bias, RoPE, GQA, SwiGLU) and its weights
corpus.py  the training text: the Python standard library's sources that Debian ships, as bytes
train.py   deterministic training on 2 cores; writes the weights and the loss curve
ckvio.py   the decoder's KV into ckv (put) and its Re-Prefill through a ckv session
"""
