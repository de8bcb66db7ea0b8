# SPDX-License-Identifier: Apache-2.0
"""The Python module against a Redis Cluster node that lies (tests/remote/hostile_node.h, run as the
program ckv_hostile_node): a process that put with the remote tier on died with SIGABRT when a
node answered CLUSTER SLOTS with 13 bytes. Every behaviour must leave the process alive, each
call ending within its stated deadline (docs/remote.md): put and its publishing, lookup (a
fill), probe, a selecting Re-Prefill session, and close.

Run by ctest (python_hostile_node_test) with CKV_HOSTILE_NODE naming the program and PYTHONPATH
the build's python/ folder. Each case runs in a child interpreter, so that a crash is a failed
case rather than a dead test runner.
"""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

NODE = os.environ.get("CKV_HOSTILE_NODE", "")

BEHAVIOURS = [
    ("huge-array", False), ("huge-array", True), ("huge-bulk", False), ("huge-bulk", True),
    ("drip", False), ("drip", True), ("endless", True), ("wrong-types", False),
    ("moved-loop", False), ("ask-loop", False), ("bad-slot-map", False), ("out-of-order", False),
]

# The child: every entry point, each timed against its bound, then a line "ok".
CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import ckv
    seed, store = sys.argv[1], sys.argv[2]
    CALL, CONNECT, SLACK = 0.3, 0.2, 0.7
    ONE, FILL = CALL + CONNECT + SLACK, 2 * (CALL + CONNECT) + SLACK
    spec = ckv.ModelSpec(layers=4, q_heads=4, kv_heads=2, head_dim=8, dtype="fp16",
                         chunk_tokens=16, model_id="hostile")
    def timed(what, bound, fn):
        start = time.monotonic()
        out = fn()
        took = time.monotonic() - start
        if took > bound:
            sys.exit(f"{what} took {took:.2f} s, over {bound:.2f} s")
        return out
    n = 16 * 6
    rng = np.random.default_rng(3)
    k = [rng.standard_normal((n, 2, 8)).astype(np.float16) for _ in range(4)]
    v = [rng.standard_normal((n, 2, 8)).astype(np.float16) for _ in range(4)]
    tokens = np.arange(100, 100 + n, dtype=np.int32)
    opts = dict(remote=seed, remote_call_timeout_ms=300, remote_connect_timeout_ms=200)
    a = ckv.Engine.open(os.path.join(store, "a"), **opts)
    timed("put", 5.0, lambda: a.put(spec, tokens, k, v))
    timed("close after put", 2 * ONE, a.close)
    b = ckv.Engine.open(os.path.join(store, "b"), **opts)
    extent = timed("probe", ONE, lambda: b.probe(spec, tokens))
    assert extent["local_chunks"] == 0, extent
    try:
        s = timed("a selecting session", FILL,
                  lambda: b.begin_reprefill(spec, tokens, budget_fraction=0.5, selector="quest"))
        q = np.full((32, 4, 8), 0.25, dtype=np.float32)
        for layer in range(4):
            s.submit_queries(layer, q)
            view = timed("await_layer", ONE, lambda: s.await_layer(layer))
            for r in view.records:
                rows = slice(r.first_token, r.first_token + 16)
                assert r.k.tobytes() == k[layer][rows].tobytes(), "wrong K served"
                assert r.v.tobytes() == v[layer][rows].tobytes(), "wrong V served"
            del view
        s.finish()
        del s
    except ckv.Error as e:  # a clear error, never wrong bytes
        print("session:", type(e).__name__, e)
    found = timed("lookup", FILL, lambda: b.lookup(spec, tokens))
    assert found < 6, found  # nothing was published: nothing honest can be filled
    timed("close", ONE, b.close)
    print("ok")
""")


@unittest.skipUnless(NODE and os.access(NODE, os.X_OK), "CKV_HOSTILE_NODE names no program")
class HostileNodeTest(unittest.TestCase):
    def run_case(self, behaviour, honest_slot_map):
        args = [NODE, behaviour, "--seconds", "60"]
        if honest_slot_map:
            args.append("--honest-slot-map")
        node = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            line = node.stdout.readline().split()
            self.assertEqual(line[:1], ["port"], line)
            seed = "127.0.0.1:" + line[1]
            with tempfile.TemporaryDirectory() as store:
                child = subprocess.run([sys.executable, "-c", CHILD, seed, store],
                                       capture_output=True, text=True, timeout=60)
            self.assertEqual(child.returncode, 0,
                             f"exit {child.returncode}\n{child.stdout}\n{child.stderr}")
            self.assertIn("ok", child.stdout.splitlines())
            self.assertNotIn("\x1b", child.stderr)  # escapes from the node are never raw
        finally:
            node.stdin.close()
            node.wait(timeout=10)

    def test_every_behaviour(self):
        for behaviour, honest_slot_map in BEHAVIOURS:
            with self.subTest(behaviour=behaviour, honest_slot_map=honest_slot_map):
                self.run_case(behaviour, honest_slot_map)


if __name__ == "__main__":
    unittest.main()
