# SPDX-License-Identifier: Apache-2.0
"""The training text: the Python standard library's sources that Debian ships, as bytes.

The files are Debian's python3.11 library (libpython3.11-stdlib, which every python3 install
has), `*.py` under /usr/lib/python3.11 without site-packages, dist-packages, test suites and
idlelib, sorted by path. Every 20th file (by that order) is held out: the validation loss and
the prompts of the tests and of the budget sweep come from those files, never seen in training.
"""
from __future__ import annotations

import glob
import hashlib
import os

import numpy as np

ROOT = "/usr/lib/python3.11"
_SKIP = ("site-packages", "dist-packages", "/test/", "/tests/", "idlelib", "lib2to3/tests")


def files(root: str = ROOT) -> list[str]:
    paths = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    out = [p for p in paths if not any(s in p for s in _SKIP)]
    if not out:
        raise FileNotFoundError(f"no Python sources under {root} (Debian: libpython3.11-stdlib)")
    return out


def split(root: str = ROOT) -> tuple[np.ndarray, np.ndarray, str]:
    """(training bytes, held-out bytes, a digest of both) as uint8 arrays, files joined by NUL."""
    train, held = [], []
    digest = hashlib.sha256()
    for i, path in enumerate(files(root)):
        with open(path, "rb") as f:
            data = f.read() + b"\0"
        digest.update(os.path.relpath(path, root).encode() + b"\0" + data)
        (held if i % 20 == 19 else train).append(data)
    to_array = lambda parts: np.frombuffer(b"".join(parts), dtype=np.uint8)
    return to_array(train), to_array(held), digest.hexdigest()[:16]


def prompts(held: np.ndarray, count: int, length: int, seed: int = 1,
            bos: int = -1) -> list[np.ndarray]:
    """`count` token sequences of `length` tokens from the held-out text, at seeded offsets:
    bytes, or BOS and `length - 1` bytes when `bos` is a token (>= 0), as the model was trained."""
    body = length - (1 if bos >= 0 else 0)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(held) - body, size=count)
    head = [np.int32(bos)] if bos >= 0 else []
    return [np.concatenate([np.asarray(head, np.int32), held[s:s + body].astype(np.int32)])
            for s in sorted(starts)]
