# SPDX-License-Identifier: Apache-2.0
"""Tests of the Python module ckv (python/ckv_module.cc), with the standard library's unittest.

Run by ctest (python_test) with PYTHONPATH set to the build's python/ folder, or by hand:
  PYTHONPATH=build/python python3 -m unittest discover -s tests/python -v
"""
import os
import shutil
import socket
import tempfile
import threading
import time
import unittest

import numpy as np

import ckv

# A small model: 4 layers, 4 query heads, 2 KV heads, head dim 8, 16-token chunks.
SPEC = ckv.ModelSpec(layers=4, q_heads=4, kv_heads=2, head_dim=8, dtype="fp16",
                     chunk_tokens=16, model_id="test-model")


def make_kv(spec, n, seed=0):
    """Per-layer K and V lists of random fp16 arrays [n, kv_heads, head_dim]."""
    rng = np.random.default_rng(seed)
    shape = (n, spec.kv_heads, spec.head_dim)
    k = [rng.standard_normal(shape).astype(np.float16) for _ in range(spec.layers)]
    v = [rng.standard_normal(shape).astype(np.float16) for _ in range(spec.layers)]
    return k, v


def tokens_of(n, start=1000):
    return np.arange(start, start + n, dtype=np.int32)


class OneNodeCluster:
    """A Redis Cluster of one master on a free loopback port, owning all 16384 slots."""

    def __init__(self, process, port):
        self.process = process
        self.port = port

    def stop(self):
        self.process.kill()
        self.process.wait()


def start_one_node_cluster(redis_server, redis_cli, workdir):
    """Starts the node on a free port pair (the port and its cluster bus port, +10000); tries
    another when a concurrent test took one first (the node then exits, and another test's node
    could answer on the port: its process_id tells them apart)."""
    import socket
    import subprocess
    def free_port_pair():
        # A port whose cluster bus port (+10000, at most 65535) is free too, as redis-server
        # needs both.
        for _ in range(100):
            with socket.socket() as a:
                a.bind(("127.0.0.1", 0))
                port = a.getsockname()[1]
                if port + 10000 > 65535:
                    continue
                try:
                    with socket.socket() as b:
                        b.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
                return port
        raise RuntimeError("no free port pair on loopback")

    for attempt in range(5):
        port = free_port_pair()
        node_dir = os.path.join(workdir, "redis-%d" % attempt)
        os.makedirs(node_dir)
        process = subprocess.Popen(
            [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no",
             "--dir", node_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cli = [redis_cli, "-p", str(port)]
        ours = False
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and process.poll() is None:
            info = subprocess.run(cli + ["INFO", "server"], capture_output=True, text=True).stdout
            if "process_id:%d\r" % process.pid in info or "process_id:%d\n" % process.pid in info:
                ours = True
                break
            time.sleep(0.05)
        if not ours:
            process.kill()
            process.wait()
            continue
        added = subprocess.run(cli + ["CLUSTER", "ADDSLOTSRANGE", "0", "16383"],
                               capture_output=True, text=True)
        if added.returncode != 0 or added.stdout.strip() != "OK":
            process.kill()
            process.wait()
            raise RuntimeError("redis-server on port %d: CLUSTER ADDSLOTSRANGE answered %r %r"
                               % (port, added.stdout, added.stderr))
        while time.monotonic() < deadline:
            info = subprocess.run(cli + ["CLUSTER", "INFO"], capture_output=True,
                                  text=True).stdout
            if "cluster_state:ok" in info:
                return OneNodeCluster(process, port)
            time.sleep(0.05)
        process.kill()
        process.wait()
        raise RuntimeError("redis-server on port %d: the cluster did not come up" % port)
    raise RuntimeError("redis-server: no free port after 5 tries")


class CkvTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckv-python-test.")
        self.path = os.path.join(self.dir, "store")
        self.engine = ckv.Engine.open(self.path)

    def tearDown(self):
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_preset_spec(self):
        spec = ckv.ModelSpec.preset("qwen2.5-0.5b")
        self.assertEqual((spec.layers, spec.q_heads, spec.kv_heads, spec.head_dim),
                         (24, 14, 2, 64))
        self.assertEqual(spec.dtype, "fp16")
        self.assertEqual(spec.model_id, "qwen2.5-0.5b")
        self.assertEqual(spec.numpy_dtype, np.dtype(np.float16))
        self.assertEqual(spec.record_bytes, 2 * 16 * 2 * 64 * 2)
        self.assertIn("qwen2.5-0.5b", ckv.ModelSpec.preset_names())
        with self.assertRaises(ckv.InvalidArgumentError) as cm:
            ckv.ModelSpec(layers=0, q_heads=4, kv_heads=2, head_dim=8, model_id="m")
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        self.assertIn("layers", str(cm.exception))

    def test_close_with_a_live_session_releases_the_store(self):
        # Regression: close() while a session lived kept the store locked, and opening it again
        # said "open in another process".
        n = 16 * 4
        tokens = tokens_of(n)
        k, v = make_kv(SPEC, n)
        self.engine.put(SPEC, tokens, k, v)
        s = self.engine.begin_reprefill(SPEC, tokens, budget_fraction=1.0)
        self.engine.close()
        again = ckv.Engine.open(self.path)
        try:
            self.assertEqual(again.lookup(SPEC, tokens), 4)
            with self.assertRaises(ckv.FailedPreconditionError):
                s.await_layer(0)
        finally:
            del s
            again.close()

    def test_put_lookup_read_record(self):
        n = 16 * 5 + 7  # five whole chunks and a tail of 7
        tokens = tokens_of(n)
        k, v = make_kv(SPEC, n)
        res = self.engine.put(SPEC, tokens, k, v)
        self.assertEqual(res["chunks"], 5)
        self.assertEqual(res["chunks_written"], 5)
        self.assertEqual(res["tail_tokens"], 7)
        self.assertEqual(self.engine.lookup(SPEC, tokens), 5)
        self.assertEqual(self.engine.lookup(SPEC, tokens[:40]), 2)
        self.assertEqual(self.engine.lookup(SPEC, tokens_of(64, start=7)), 0)
        self.assertEqual(self.engine.probe(SPEC, tokens),
                         {"local_chunks": 5, "remote_chunks": 0, "chunks": 5})

        keys = ckv.chunk_keys(SPEC, tokens)
        self.assertEqual(len(keys), 5)
        self.assertTrue(all(len(key) == 32 for key in keys))
        self.assertEqual(res["prefix_id"], keys[-1])
        # A prefix of the tokens has the same leading keys (the hash chain).
        self.assertEqual(ckv.chunk_keys(SPEC, tokens[:32]), keys[:2])
        self.assertEqual(ckv.chunk_keys(SPEC, list(range(1000, 1032))), keys[:2])
        self.assertEqual([p["id"] for p in self.engine.list_prefixes()], [keys[-1]])

        for chunk, layer in [(0, 0), (3, 2), (4, 3)]:
            k_c, v_c = self.engine.read_record(SPEC, keys[chunk], layer)
            self.assertEqual(k_c.dtype, np.float16)
            self.assertEqual(k_c.shape, (16, SPEC.kv_heads, SPEC.head_dim))
            rows = slice(chunk * 16, (chunk + 1) * 16)
            self.assertEqual(k_c.tobytes(), k[layer][rows].tobytes())
            self.assertEqual(v_c.tobytes(), v[layer][rows].tobytes())

        # A second put of the same prefix writes nothing.
        again = self.engine.put(SPEC, tokens, k, v)
        self.assertEqual((again["chunks_written"], again["chunks_existing"]), (0, 5))

        stats = self.engine.stats()
        self.assertEqual(stats["puts"], 2)
        self.assertEqual(stats["chunks"], 5)
        self.assertEqual(stats["prefixes"], 1)
        self.assertIn("ckv_puts_total", self.engine.metrics())
        self.assertTrue(self.engine.verify()["ok"])

        self.engine.delete(SPEC, tokens[:80])
        self.assertEqual(self.engine.lookup(SPEC, tokens), 0)
        with self.assertRaises(ckv.NotFoundError) as cm:
            self.engine.read_record(SPEC, keys[0], 0)
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        with self.assertRaises(ckv.NotFoundError):
            self.engine.delete(SPEC, tokens[:80])

    def test_one_array_per_tensor_and_bf16(self):
        spec = ckv.ModelSpec(layers=2, q_heads=2, kv_heads=1, head_dim=4, dtype="bf16",
                             chunk_tokens=4, model_id="bf16-model")
        self.assertEqual(spec.numpy_dtype, np.dtype(np.uint16))
        rng = np.random.default_rng(1)
        k = rng.integers(0, 65535, size=(2, 8, 1, 4), dtype=np.uint16)
        v = rng.integers(0, 65535, size=(2, 8, 1, 4), dtype=np.uint16)
        res = self.engine.put(spec, tokens_of(8), k, v)
        self.assertEqual(res["chunks"], 2)
        k_c, v_c = self.engine.read_record(spec, ckv.chunk_keys(spec, tokens_of(8))[1], 1)
        self.assertEqual(k_c.dtype, np.uint16)
        np.testing.assert_array_equal(k_c, k[1, 4:8])
        np.testing.assert_array_equal(v_c, v[1, 4:8])

    def test_objects_with_array_interface_are_taken(self):
        # As a CPU torch tensor is (through __array__), without torch.
        class Wrapped:
            def __init__(self, a):
                self.a = a

            def __array__(self, dtype=None):
                return self.a

        k, v = make_kv(SPEC, 16, seed=5)
        res = self.engine.put(SPEC, Wrapped(tokens_of(16)), [Wrapped(x) for x in k], v)
        self.assertEqual(res["chunks_written"], 1)
        k_c, _ = self.engine.read_record(SPEC, res["prefix_id"], 2)
        self.assertEqual(k_c.tobytes(), k[2].tobytes())
        with self.assertRaises(ValueError) as cm:
            self.engine.put(SPEC, tokens_of(16), [x.tolist() for x in k], v)
        self.assertIn("k[0]: expected dtype float16", str(cm.exception))

    def test_bad_tensors_raise_value_error_naming_the_tensor(self):
        n = 32
        tokens = tokens_of(n)
        k, v = make_kv(SPEC, n)

        def expect(message, tokens=tokens, k=k, v=v):
            with self.assertRaises(ValueError) as cm:
                self.engine.put(SPEC, tokens, k, v)
            self.assertIn(message, str(cm.exception))
            self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")

        wrong_dtype = list(k)
        wrong_dtype[3] = k[3].astype(np.float32)
        expect("k[3]: expected dtype float16", k=wrong_dtype)
        wrong_shape = list(v)
        wrong_shape[1] = np.zeros((n, SPEC.kv_heads + 1, SPEC.head_dim), np.float16)
        expect("v[1]: expected shape [32, 2, 8], got [32, 3, 8]", v=wrong_shape)
        strided = list(k)
        strided[2] = np.zeros((n, SPEC.head_dim, SPEC.kv_heads), np.float16).transpose(0, 2, 1)
        expect("k[2]: expected a C-contiguous array", k=strided)
        expect("k: expected 4 tensors", k=k[:3])
        expect("tokens: expected dtype int32", tokens=tokens.astype(np.int64))
        expect("tokens: expected a C-contiguous array", tokens=tokens_of(2 * n)[::2])
        with self.assertRaises(ValueError) as cm:
            self.engine.put(SPEC, tokens, np.stack(k).astype(np.float32), v)
        self.assertIn("k: expected dtype float16", str(cm.exception))
        self.assertEqual(self.engine.lookup(SPEC, tokens), 0)

    def test_bad_token_sequences_raise_value_error_naming_tokens(self):
        # Sequences are checked, not cast: a nested list, floats, ids past int32 and a bare int
        # are refused naming `tokens`; a flat list of ints is taken as an array would be.
        def expect(message, tokens):
            with self.assertRaises(ValueError) as cm:
                self.engine.lookup(SPEC, tokens)
            self.assertIn(message, str(cm.exception))
            self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")

        expect("tokens: expected a flat sequence of token ids, got shape [16, 2]",
               [[i, i] for i in range(16)])
        expect("tokens: expected integer token ids, got float64 (tokens[3] = 2.5)",
               [1, 2, 3, 2.5] + [2] * 12)
        expect("tokens: token ids must fit int32, got 0..4294967296", [0] * 15 + [2 ** 32])
        expect("tokens: expected an int32 array or a sequence of token ids, got int", 7)
        n = 32
        k, v = make_kv(SPEC, n)
        self.engine.put(SPEC, tokens_of(n), k, v)
        self.assertEqual(self.engine.lookup(SPEC, [int(t) for t in tokens_of(n)]), 2)
        self.assertEqual(self.engine.lookup(SPEC, []), 0)

    def test_queries_of_the_wrong_window_raise_naming_the_shape(self):
        n = 16 * 4
        tokens = tokens_of(n)
        k, v = make_kv(SPEC, n, seed=6)
        self.engine.put(SPEC, tokens, k, v)
        s = self.engine.begin_reprefill(SPEC, tokens, budget_fraction=1.0, window=4,
                                        period_layers=2)
        with self.assertRaises(ValueError) as cm:
            s.submit_queries(0, np.zeros((0, SPEC.q_heads, SPEC.head_dim), np.float32))
        self.assertIn("queries: an array of 0 rows; pass None", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            s.submit_queries(0, np.zeros((3, SPEC.q_heads, SPEC.head_dim), np.float32))
        self.assertIn("queries: expected shape [4, 4, 8], got [3, 4, 8]", str(cm.exception))
        # Refused before the session took them: the layer can still be submitted.
        s.submit_queries(0, np.zeros((4, SPEC.q_heads, SPEC.head_dim), np.float32))
        self.assertEqual(len(s.await_layer(0)), 4)
        s.finish()

    def test_missing_store_raises_not_found(self):
        missing = os.path.join(self.dir, "missing")
        with self.assertRaises(ckv.NotFoundError) as cm:
            ckv.Engine.open(missing, create_if_missing=False)
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertIsInstance(cm.exception, ckv.Error)
        self.assertIsInstance(cm.exception, LookupError)
        with self.assertRaises(ckv.NotFoundError):
            ckv.Engine.open_read_only(missing)

    def test_read_only_engine_refuses_put_and_catches_up(self):
        tokens = tokens_of(32)
        k, v = make_kv(SPEC, 32)
        self.engine.put(SPEC, tokens[:16], [x[:16] for x in k], [x[:16] for x in v])
        with ckv.Engine.open_read_only(self.path) as reader:
            self.assertTrue(reader.read_only)
            self.assertEqual(reader.lookup(SPEC, tokens), 1)
            with self.assertRaises(ckv.FailedPreconditionError) as cm:
                reader.put(SPEC, tokens, k, v)
            self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
            self.engine.put(SPEC, tokens, k, v)
            self.assertEqual(reader.lookup(SPEC, tokens), 1)
            reader.catch_up()
            self.assertEqual(reader.lookup(SPEC, tokens), 2)
        with self.assertRaises(ckv.FailedPreconditionError):
            reader.lookup(SPEC, tokens)  # closed by the with block

    def test_reprefill_at_full_budget_serves_every_chunk(self):
        n = 16 * 6
        tokens = tokens_of(n)
        k, v = make_kv(SPEC, n, seed=3)
        self.engine.put(SPEC, tokens, k, v)
        window = 4
        rng = np.random.default_rng(4)
        for selector in ("quest", "period-exact"):
            s = self.engine.begin_reprefill(SPEC, tokens, selector=selector,
                                            budget_fraction=1.0, window=window, period_layers=2)
            self.assertEqual(s.matched_chunks, 6)
            views = []
            for layer in range(SPEC.layers):
                q = rng.standard_normal((window, SPEC.q_heads, SPEC.head_dim)).astype(np.float32)
                s.submit_queries(layer, q)
                view = s.await_layer(layer)
                self.assertEqual(view.layer, layer)
                self.assertEqual([r.chunk for r in view], list(range(6)))
                for r in view.records:
                    self.assertEqual(r.first_token, r.chunk * 16)
                    self.assertFalse(r.k.flags.writeable)
                    self.assertFalse(r.k.flags.owndata)  # a view over the pinned record
                    self.assertFalse(r.copied)
                    rows = slice(r.first_token, r.first_token + 16)
                    self.assertEqual(r.k.tobytes(), k[layer][rows].tobytes())
                    self.assertEqual(r.v.tobytes(), v[layer][rows].tobytes())
                views.append(view.records[0].k)  # an array alone keeps its view pinned
            stats = s.finish()
            self.assertEqual(stats["matched_chunks"], 6)
            self.assertEqual(stats["layers_served"], SPEC.layers)
            self.assertEqual(stats["records_served"], 6 * SPEC.layers)
            del s, view
            for layer, arr in enumerate(views):
                self.assertEqual(arr.tobytes(), k[layer][0:16].tobytes())

        s = self.engine.begin_reprefill(SPEC, tokens, selector="quest", window=window)
        with self.assertRaises(ValueError) as cm:
            s.submit_queries(0, np.zeros((window, SPEC.q_heads, SPEC.head_dim), np.float16))
        self.assertIn("queries: expected dtype float32", str(cm.exception))
        # No queries below a full budget: refused, naming the budget.
        with self.assertRaises(ckv.InvalidArgumentError) as cm:
            s.submit_queries(0, None)
        self.assertIn("budget_fraction 1", str(cm.exception))
        s.finish()

    def test_estimate_rest_hands_the_chunks_not_loaded_as_virtual_tokens(self):
        n = 16 * 8
        tokens = tokens_of(n, start=3000)
        k, v = make_kv(SPEC, n, seed=9)
        self.engine.put(SPEC, tokens, k, v)
        window = 4
        q = np.random.default_rng(3).standard_normal(
            (window, SPEC.q_heads, SPEC.head_dim)).astype(np.float32)
        s = self.engine.begin_reprefill(SPEC, tokens, selector="mean-key", budget_fraction=0.25,
                                        window=window, estimate_rest=True)
        for layer in range(SPEC.layers):
            s.submit_queries(layer, q)
            view = s.await_layer(layer)
            loaded = [r.chunk for r in view.records]
            vt = view.virtual_tokens
            self.assertEqual(list(vt["chunks"]), [j for j in range(8) if j not in loaded])
            m = len(vt["chunks"])
            self.assertEqual(vt["keys"].shape, (m, SPEC.kv_heads, SPEC.head_dim))
            self.assertEqual(vt["values"].shape, (m, SPEC.kv_heads, SPEC.head_dim))
            self.assertEqual(vt["bias"].shape, (m, SPEC.q_heads))
            # The value stands for the chunk's mean value (8-bit, so within a step).
            j = int(vt["chunks"][0])
            want = v[layer][16 * j:16 * (j + 1)].astype(np.float32).mean(axis=0)
            step = np.abs(want).max(axis=-1, keepdims=True) / 127
            self.assertTrue(np.all(np.abs(vt["values"][0] - want) <= 0.51 * step + 1e-3))
            # Each stands for the chunk's 16 tokens: the bias is log(16).
            self.assertTrue(np.allclose(vt["bias"], np.log(16)))
        stats = s.finish()
        self.assertEqual(stats["unestimated_chunks"], 0)
        self.assertEqual(stats["virtual_tokens_served"], 6 * SPEC.layers)
        # Without the option there are none.
        s = self.engine.begin_reprefill(SPEC, tokens, selector="mean-key", budget_fraction=0.25,
                                        window=window)
        s.submit_queries(0, q)
        self.assertIsNone(s.await_layer(0).virtual_tokens)
        s.finish()

    def test_a_target_mass_loads_per_layer_what_reaches_it(self):
        n = 16 * 8
        tokens = tokens_of(n, start=5000)
        k, v = make_kv(SPEC, n, seed=11)
        self.engine.put(SPEC, tokens, k, v)
        window = 4
        q = np.random.default_rng(5).standard_normal(
            (window, SPEC.q_heads, SPEC.head_dim)).astype(np.float32)
        loaded = {}
        for target in (0.3, 1.0):
            s = self.engine.begin_reprefill(SPEC, tokens, selector="mean-key", budget_fraction=1.0,
                                            window=window, target_mass=target)
            s.submit_queries(0, q)
            loaded[target] = len(s.await_layer(0).records)
            s.finish()
        self.assertGreaterEqual(loaded[0.3], 2)  # the sink and the recent chunk at least
        self.assertLess(loaded[0.3], 8)
        self.assertEqual(loaded[1.0], 8)
        with self.assertRaises(ckv.InvalidArgumentError) as cm:
            self.engine.begin_reprefill(SPEC, tokens, selector="mean-key", target_mass=2.0)
        self.assertIn("target_mass = 2", str(cm.exception))
        # rescore_layers: each layer of a period serves what its own queries choose, beside its
        # head's choice.
        s = self.engine.begin_reprefill(SPEC, tokens, selector="mean-key", budget_fraction=0.5,
                                        window=window, period_layers=SPEC.layers,
                                        period_selection=True, rescore_layers=True)
        chosen = []
        for layer in range(SPEC.layers):
            ql = np.random.default_rng(100 + layer).standard_normal(
                (window, SPEC.q_heads, SPEC.head_dim)).astype(np.float32)
            s.submit_queries(layer, ql)
            chosen.append([r.chunk for r in s.await_layer(layer).records])
        s.finish()
        self.assertTrue(all(set(chosen[0]) <= set(c) for c in chosen))
        self.assertGreater(len({tuple(c) for c in chosen}), 1)

    def test_a_codec_stores_fewer_bytes_and_views_hand_out_decoded_records(self):
        int8 = ckv.ModelSpec(layers=4, q_heads=4, kv_heads=2, head_dim=8, dtype="fp16",
                             chunk_tokens=16, model_id="test-model", codec="int8")
        self.assertEqual(int8.codec, "int8")
        self.assertEqual(SPEC.codec, "none")
        self.assertNotEqual(int8.fingerprint, SPEC.fingerprint)
        # K: 256 int8 and 16 fp16 channel scales; V: 256 int8 and 32 fp16 token scales.
        self.assertEqual(int8.record_bytes, 256 + 16 * 2 + 256 + 32 * 2)
        self.assertEqual(ckv.ModelSpec.preset("qwen2.5-7b", codec="int4").record_bytes, 10496)
        with self.assertRaises(ckv.InvalidArgumentError):
            ckv.ModelSpec.preset("qwen2.5-7b", codec="int3")
        n = 16 * 4
        tokens = tokens_of(n, start=7000)
        k, v = make_kv(int8, n, seed=21)
        self.engine.put(int8, tokens, k, v)
        s = self.engine.begin_reprefill(int8, tokens, selector="mean-key", budget_fraction=1.0)
        for layer in range(int8.layers):
            s.submit_queries(layer, None)
            view = s.await_layer(layer)
            self.assertEqual([r.chunk for r in view.records], [0, 1, 2, 3])
            for r in view.records:
                self.assertTrue(r.copied)  # decoded into arrays of their own
                want_k = k[layer][16 * r.chunk:16 * (r.chunk + 1)].astype(np.float32)
                want_v = v[layer][16 * r.chunk:16 * (r.chunk + 1)].astype(np.float32)
                self.assertEqual(r.k.dtype, np.float16)
                # int8 keeps each element within half a scale of max|x| / 127 of its group.
                self.assertLess(np.abs(r.k.astype(np.float32) - want_k).max(),
                                np.abs(want_k).max() / 127)
                self.assertLess(np.abs(r.v.astype(np.float32) - want_v).max(),
                                np.abs(want_v).max() / 127)
        s.finish()
        key = ckv.chunk_keys(int8, tokens)[1]
        rk, rv = self.engine.read_record(int8, key, 2)
        self.assertEqual(rk.shape, (16, 2, 8))
        self.assertLess(np.abs(rk.astype(np.float32) - k[2][16:32].astype(np.float32)).max(),
                        np.abs(k[2][16:32].astype(np.float32)).max() / 127)

    def test_a_full_budget_session_needs_no_queries(self):
        n = 16 * 5
        tokens = tokens_of(n)
        k, v = make_kv(SPEC, n, seed=5)
        self.engine.put(SPEC, tokens, k, v)
        s = self.engine.begin_reprefill(SPEC, tokens, budget_fraction=1.0, period_layers=2)
        for layer in range(SPEC.layers):
            if layer % 2 == 0:
                s.submit_queries(layer, None)  # explicitly none
            view = s.await_layer(layer)         # odd layers: await_layer submits none itself
            self.assertEqual([r.chunk for r in view], list(range(5)))
            for r in view:
                rows = slice(r.first_token, r.first_token + 16)
                self.assertEqual(r.k.tobytes(), k[layer][rows].tobytes())
                self.assertEqual(r.v.tobytes(), v[layer][rows].tobytes())
        self.assertEqual(s.finish()["records_served"], 5 * SPEC.layers)

    def test_a_gpu_tier_serves_the_stored_bytes(self):
        # A second session finds the records in the GPU tier. On a GPU (device memory) they are
        # copied to host arrays; without one (the host backend) they are views, as the others.
        n = 16 * 4
        tokens = tokens_of(n, start=5000)
        k, v = make_kv(SPEC, n, seed=6)
        path = os.path.join(self.dir, "tiered")
        with ckv.Engine.open(path, gpu_tier_bytes=1 << 20, cpu_tier_bytes=1 << 20) as eng:
            on_device = "\nckv_gpu_tier_on_device 1" in eng.metrics()
            eng.put(SPEC, tokens, k, v)
            for round_ in range(2):
                s = eng.begin_reprefill(SPEC, tokens, budget_fraction=1.0, period_layers=2)
                for layer in range(SPEC.layers):
                    for r in s.await_layer(layer):
                        rows = slice(r.first_token, r.first_token + 16)
                        self.assertEqual(r.k.tobytes(), k[layer][rows].tobytes())
                        self.assertEqual(r.v.tobytes(), v[layer][rows].tobytes())
                        if round_ == 1:
                            self.assertEqual(r.found_in, "gpu")
                            self.assertEqual(r.copied, on_device)
                stats = s.finish()
            self.assertEqual(stats["gpu_hits"], 4 * SPEC.layers)

    def test_bad_remote_options_raise_naming_the_field(self):
        with self.assertRaises(ckv.InvalidArgumentError) as cm:
            ckv.Engine.open(os.path.join(self.dir, "r1"), remote="no-port")
        self.assertIn("remote.seeds", str(cm.exception))
        with self.assertRaises(ckv.InvalidArgumentError) as cm:
            ckv.Engine.open(os.path.join(self.dir, "r2"), remote="127.0.0.1:1",
                            remote_call_timeout_ms=0)
        self.assertIn("call_timeout_ms", str(cm.exception))

    def test_two_engines_share_chunks_through_a_redis_cluster(self):
        redis_server = shutil.which("redis-server")
        redis_cli = shutil.which("redis-cli")
        if redis_server is None or redis_cli is None:
            self.skipTest("redis-server or redis-cli is not installed")
        cluster = start_one_node_cluster(redis_server, redis_cli, self.dir)
        try:
            seed = "127.0.0.1:%d" % cluster.port
            n = 16 * 8
            tokens = tokens_of(n, start=5000)
            k, v = make_kv(SPEC, n, seed=9)
            a = ckv.Engine.open(os.path.join(self.dir, "a"), remote=seed,
                                remote_key_prefix="py")
            a.put(SPEC, tokens, k, v)
            deadline = time.monotonic() + 10
            while a.stats()["remote_published_chunks"] < 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(a.stats()["remote_published_chunks"], 8)
            self.assertTrue(a.stats()["remote_enabled"])
            # B, an empty store: a quest session at half the budget reads the heads and the
            # records it selects from the cluster, bit-exact.
            b = ckv.Engine.open(os.path.join(self.dir, "b"), remote=seed,
                                remote_key_prefix="py")
            # What a scheduler asks first: probe, which fetches nothing.
            self.assertEqual(b.probe(SPEC, tokens),
                             {"local_chunks": 0, "remote_chunks": 8, "chunks": 8})
            self.assertEqual(b.stats()["chunks"], 0)
            self.assertEqual(b.stats()["remote_fetched_chunks"], 0)
            window = 4
            s = b.begin_reprefill(SPEC, tokens, selector="quest", budget_fraction=0.5,
                                  window=window)
            self.assertEqual(s.matched_chunks, 8)
            rng = np.random.default_rng(10)
            for layer in range(SPEC.layers):
                q = rng.standard_normal((window, SPEC.q_heads, SPEC.head_dim)).astype(np.float32)
                s.submit_queries(layer, q)
                view = s.await_layer(layer)
                self.assertEqual(len(view.records), 4)
                for r in view.records:
                    rows = slice(r.first_token, r.first_token + 16)
                    self.assertEqual(r.k.tobytes(), k[layer][rows].tobytes())
                    self.assertEqual(r.v.tobytes(), v[layer][rows].tobytes())
                del view, r
            stats = s.finish()
            del s
            self.assertEqual(stats["remote_chunks"], 8)
            self.assertEqual(stats["bytes_read"], 0)
            self.assertGreaterEqual(stats["remote_records"], 4 * SPEC.layers)
            # Finish queued the fill of the whole prefix into B's store.
            deadline = time.monotonic() + 10
            while b.stats()["remote_fetched_chunks"] < 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(b.stats()["remote_fetched_chunks"], 8)
            self.assertEqual(b.stats()["remote_fills_queued"], 1)
            fills = b.stats()["remote_fills"]
            self.assertEqual(b.lookup(SPEC, tokens), 8)  # local now: the cluster is not asked
            self.assertEqual(b.stats()["remote_fills"], fills)
            keys = ckv.chunk_keys(SPEC, tokens)
            self.assertEqual(b.read_record(SPEC, keys[5], 2)[0].tobytes(),
                             k[2][80:96].tobytes())
            a.close()
            b.close()
        finally:
            cluster.stop()

    def test_collecting_an_engine_releases_the_gil_while_it_waits(self):
        # An engine whose remote tier is a node that accepts and never answers: its destructor
        # waits for the publisher's call to time out. Python collects it with the GIL released,
        # so another Python thread keeps running meanwhile.
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        accepted = []
        threading.Thread(target=lambda: accepted.extend(server.accept() for _ in range(4)),
                         daemon=True).start()
        try:
            eng = ckv.Engine.open(os.path.join(self.dir, "silent"),
                                  remote=f"127.0.0.1:{server.getsockname()[1]}",
                                  remote_call_timeout_ms=500, remote_connect_timeout_ms=500)
            n = 16
            k, v = make_kv(SPEC, n)
            eng.put(SPEC, tokens_of(n), k, v)  # queues a publish, which will wait for the node
            ticks, stop = [0], threading.Event()

            def spin():
                while not stop.is_set():
                    ticks[0] += 1
                    time.sleep(0.001)
            spinner = threading.Thread(target=spin)
            spinner.start()
            time.sleep(0.05)
            before, start = ticks[0], time.monotonic()
            del eng
            waited, during = time.monotonic() - start, ticks[0] - before
            stop.set()
            spinner.join()
            self.assertGreater(waited, 0.2)  # it did wait for the silent node
            self.assertGreater(during, 20, f"{during} ticks of another thread in {waited:.2f} s")
        finally:
            server.close()

    def test_put_releases_the_gil(self):
        # A put of a large prefix (64 MiB, synced) runs in one thread while this one counts
        # sleeps of 0.5 ms; the count must advance during the put. Were the GIL held through the
        # put, this thread could run only before it (a tick or two) and after it.
        spec = ckv.ModelSpec(layers=32, q_heads=8, kv_heads=8, head_dim=128, chunk_tokens=16,
                             model_id="gil")
        n = 1024
        one = np.ones((n, 8, 128), np.float16)
        k = [one] * spec.layers
        started, done = threading.Event(), threading.Event()
        errors = []

        def put():
            started.set()
            try:
                self.engine.put(spec, tokens_of(n), k, k)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
            done.set()

        t = threading.Thread(target=put)
        start = time.monotonic()
        t.start()
        started.wait()
        ticks = 0
        while not done.is_set():
            ticks += 1
            time.sleep(0.0005)
        t.join()
        seconds = time.monotonic() - start
        self.assertEqual(errors, [])
        self.assertEqual(self.engine.lookup(spec, tokens_of(n)), n // 16)
        if seconds < 0.02:
            self.skipTest(f"the put took {seconds * 1e3:.1f} ms: too short to tell")
        self.assertGreaterEqual(ticks, 5, f"{ticks} ticks during a put of {seconds:.3f} s")


if __name__ == "__main__":
    unittest.main()
