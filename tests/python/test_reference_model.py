# SPDX-License-Identifier: Apache-2.0
"""End-to-end tests: the reference decoder (python/ckv_ref) stores its KV in ckv and Re-Prefills
from it, with the trained weights (python/ckv_ref/weights/tiny.npz).

Run by ctest (reference_model_test) with PYTHONPATH holding the build's python/ folder and the
source's python/ folder; skipped, saying so, when torch is not installed (Debian: python3-torch)
or the training text is missing.
"""
import glob
import json
import math
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import ckv

try:
    import torch
except ImportError as e:  # pragma: no cover - the set-up script installs python3-torch
    raise unittest.SkipTest(f"torch is not installed ({e}); Debian: python3-torch")

from ckv_ref import ckvio, corpus
from ckv_ref.model import load_weights

try:
    corpus.files()
except FileNotFoundError as e:  # pragma: no cover - Debian's python3 ships these sources
    raise unittest.SkipTest(f"no held-out text: {e}")

WEIGHTS = os.environ.get("CKV_REF_WEIGHTS") or os.path.join(os.path.dirname(ckvio.__file__),
                                                              "weights", "tiny.npz")
# A Re-Prefill at a full budget differs from a full recompute only by the float16 rounding of
# the stored K and V (relative 2^-11): on the trained weights the logits differ by at most
# 0.0013 (median 0.0002) over these 20 prompts, with logits in -9..7.
LOGIT_TOLERANCE = 0.005

_model = None
_held = None


def model():
    global _model
    if _model is None:
        # One thread: ctest runs two tests at once on two cores, and OpenMP's threads spin at
        # their barriers when a core is taken (2.4 s against 0.13 s for one 560-token prefill).
        torch.set_num_threads(1)
        _model = load_weights(WEIGHTS)
    return _model


def held_out():
    global _held
    if _held is None:
        _held = corpus.split()[1]
    return _held


def prompts(count, length, seed):
    """Held-out prompts as the model was trained: after BOS when it has one (ref2k)."""
    return corpus.prompts(held_out(), count, length, seed=seed, bos=model().cfg.bos)


def find_in_sparse_file(path, needle):
    """Offsets of `needle` in the file, reading only its data extents (segments are sparse)."""
    found = []
    with open(path, "rb") as f:
        fd, size, at = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while at < size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past `at`
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            f.seek(start)
            data = f.read(end - start)
            i = data.find(needle)
            while i >= 0:
                found.append(start + i)
                i = data.find(needle, i + 1)
            at = end
    return found


class ReferenceModelTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckv-reference-test.")
        self.path = os.path.join(self.dir, "store")
        self.engine = ckv.Engine.open(self.path)
        self.spec = ckvio.spec_of(model())

    def tearDown(self):
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_full_budget_reprefill_matches_a_full_recompute_on_20_prompts(self):
        m, c = model(), self.spec.chunk_tokens
        worst = 0.0
        for i, prompt in enumerate(prompts(20, 560, seed=7)):
            prefix = 400 + 7 * i  # a tail of prefix % 16 tokens that is not stored
            res = ckvio.store(self.engine, self.spec, m, prompt[:prefix])
            self.assertEqual(res["chunks"], prefix // c)
            self.assertEqual(res["tail_tokens"], prefix % c)
            full = m.forward_full(prompt)[0]
            # Half the prompts submit their queries, half none (a connector without queries).
            got = ckvio.reprefill(self.engine, self.spec, m, prompt, budget=1.0,
                                  with_queries=i % 2 == 0)
            self.assertEqual(got.matched_chunks, prefix // c, i)
            self.assertEqual(got.new_tokens, len(prompt) - (prefix // c) * c, i)
            for layer, chunks in enumerate(got.selections):
                self.assertEqual(chunks, list(range(prefix // c)), (i, layer))
            self.assertEqual(got.stats["records_served"], (prefix // c) * self.spec.layers)
            self.assertEqual(int(got.logits.argmax()), int(full.argmax()), f"prompt {i}")
            diff = float((got.logits - full).abs().max())
            self.assertLess(diff, LOGIT_TOLERANCE, f"prompt {i}")
            worst = max(worst, diff)
        # The stored float16 KV does make a difference: the comparison is not of a thing to itself.
        self.assertGreater(worst, 0.0)

    def test_a_sparse_reprefill_computes_what_its_selection_says(self):
        # A session below a full budget serves some chunks per layer; computing the same
        # selection without ckv (ckvio.masked, the token-level baselines' path) gives the same
        # logits: the served chunks sit at their true positions, and nothing else is attended.
        m, c = model(), self.spec.chunk_tokens
        prompt = prompts(1, 512, seed=9)[0]
        prefix = 448
        ckvio.store(self.engine, self.spec, m, prompt[:prefix])
        for selector in ("period-exact", "quest"):
            got = ckvio.reprefill(self.engine, self.spec, m, prompt, selector=selector,
                                  budget=0.25)
            self.assertEqual(got.matched_chunks, prefix // c)
            keeps = got.attended(prefix)
            for layer, chunks in enumerate(got.selections):
                self.assertEqual(len(chunks), 7, (selector, layer))  # round(0.25 * 28)
                self.assertIn(0, chunks)                               # the sink chunk
                self.assertIn(prefix // c - 1, chunks)                 # the recent chunk
                self.assertEqual(int(keeps[layer].sum()), 7 * c, (selector, layer))
            want, _ = ckvio.masked(m, prompt, prefix, keeps)
            self.assertLess(float((got.logits - want).abs().max()), 1e-3, selector)
            # And it is not the full computation.
            full = m.forward_full(prompt)[0]
            self.assertGreater(float((got.logits - full).abs().max()), 1e-3, selector)

    def test_estimating_the_chunks_not_loaded_brings_the_first_token_closer(self):
        # At a quarter of the chunks, the virtual tokens of the chunks not loaded
        # (estimate_rest) bring the first token's distribution closer to the full computation's
        # than dropping them does, over 8 held-out prompts.
        m, c = model(), self.spec.chunk_tokens
        prefix = 448

        def kl(full, got):
            p, q = torch.log_softmax(full, -1), torch.log_softmax(got, -1)
            return float((p.exp() * (p - q)).sum())

        drop, est = [], []
        for prompt in prompts(8, 512, seed=31):
            ckvio.store(self.engine, self.spec, m, prompt[:prefix])
            full = m.forward_full(prompt)[0]
            a = ckvio.reprefill(self.engine, self.spec, m, prompt, selector="mean-key",
                                period_selection=True, budget=0.25)
            b = ckvio.reprefill(self.engine, self.spec, m, prompt, selector="mean-key",
                                period_selection=True, budget=0.25, estimate=True)
            # Layer 0 sees the same queries; later layers see what the estimate changed.
            self.assertEqual(a.selections[0], b.selections[0])
            self.assertEqual(b.stats["unestimated_chunks"], 0)
            self.assertEqual(b.stats["virtual_tokens_served"],
                             sum(prefix // c - len(s) for s in b.selections))
            drop.append(kl(full, a.logits))
            est.append(kl(full, b.logits))
        self.assertLess(np.mean(est), np.mean(drop), (est, drop))

    def test_the_oracle_maps_query_heads_to_their_kv_heads_as_the_model_does(self):
        # ckv's oracle scores each layer by exact attention: per query and q head the softmax
        # over the stored keys of the KV head that q head reads, averaged, summed per chunk
        # (kernels/selector.h). Recomputed here from the session's own queries and the stored
        # float16 keys, with Qwen2's GQA mapping (q head h reads KV head h // group), it picks
        # the chunks the session served; with another mapping (h % kv_heads) it does not.
        m, c = model(), self.spec.chunk_tokens
        prompt = prompts(1, 512, seed=17)[0]
        prefix = 448
        n = prefix // c
        ckvio.store(self.engine, self.spec, m, prompt[:prefix])
        got = ckvio.reprefill(self.engine, self.spec, m, prompt, selector="oracle", budget=0.25)
        keys = ckv.chunk_keys(self.spec, prompt[:prefix])
        group = self.spec.q_heads // self.spec.kv_heads

        def pick(layer, kv_of):
            k = np.concatenate([self.engine.read_record(self.spec, key, layer)[0] for key in keys])
            k = torch.from_numpy(k.astype(np.float32))                 # [prefix, kv, d]
            q = torch.from_numpy(got.queries[layer])                   # [w, q_heads, d]
            kk = k[:, [kv_of(h) for h in range(self.spec.q_heads)]]    # [prefix, q_heads, d]
            p = torch.softmax(torch.einsum("whd,thd->hwt", q, kk) / math.sqrt(q.shape[-1]), -1)
            mass = p.mean((0, 1)).reshape(n, c).sum(-1)
            mass[0] = mass[n - 1] = float("inf")                       # sink and recent kept
            order = sorted(range(n), key=lambda j: (-float(mass[j]), j))
            return sorted(order[:round(0.25 * n)])

        right = [pick(l, lambda h: h // group) == got.selections[l] for l in range(m.cfg.layers)]
        wrong = [pick(l, lambda h: h % self.spec.kv_heads) == got.selections[l]
                 for l in range(m.cfg.layers)]
        self.assertEqual(right, [True] * m.cfg.layers, got.selections)
        self.assertIn(False, wrong)

    def test_a_four_turn_conversation_reuses_each_earlier_turn(self):
        # Each turn's prompt is the conversation so far: the previous prompt, the model's own
        # greedy reply to it (4 tokens, the first from the ckv Re-Prefill), and the next user
        # message (held-out text). Each turn is stored; the next reuses it.
        m, c = model(), self.spec.chunk_tokens
        text = prompts(1, 1300, seed=11)[0]
        reply_tokens, message_tokens = 4, 196
        prompt, used = text[:500], 500
        stored = 0  # tokens of the conversation stored so far
        turn_prompts = []
        for t in range(4):
            turn_prompts.append(prompt)
            self.assertEqual(self.engine.probe(self.spec, prompt)["chunks"], stored // c,
                             f"turn {t}")
            self.assertEqual(self.engine.lookup(self.spec, prompt), stored // c, f"turn {t}")
            full = m.forward_full(prompt)[0]
            first = int(full.argmax())
            if stored:
                got = ckvio.reprefill(self.engine, self.spec, m, prompt, budget=1.0)
                self.assertEqual(got.matched_chunks, stored // c, f"turn {t}")
                self.assertEqual(int(got.logits.argmax()), first, f"turn {t}")
                self.assertLess(float((got.logits - full).abs().max()), LOGIT_TOLERANCE)
            # The turn's context is stored; the chunks the previous turn stored are not rewritten.
            res = ckvio.store(self.engine, self.spec, m, prompt)
            self.assertEqual(res["chunks"], len(prompt) // c)
            self.assertEqual(res["chunks_written"], len(prompt) // c - stored // c, f"turn {t}")
            stored = len(prompt)
            reply = [first]
            while len(reply) < reply_tokens:
                context = np.concatenate([prompt, np.asarray(reply, np.int32)])
                reply.append(int(m.forward_full(context)[0].argmax()))
            message = text[used:used + message_tokens]
            used += message_tokens
            prompt = np.concatenate([prompt, np.asarray(reply, np.int32), message])
        self.assertEqual([len(p) for p in turn_prompts], [500, 700, 900, 1100])
        self.assertEqual(self.engine.lookup(self.spec, prompt), len(turn_prompts[-1]) // c)
        self.assertEqual(len(self.engine.list_prefixes()), 4)

    def test_a_tampered_record_is_refused_and_never_becomes_a_token(self):
        m = model()
        prompt = prompts(1, 560, seed=3)[0]
        ckvio.store(self.engine, self.spec, m, prompt[:512])
        key = ckv.chunk_keys(self.spec, prompt[:512])[5]
        k, _ = self.engine.read_record(self.spec, key, 2)
        needle = k.tobytes()
        self.engine.close()
        # The record's bytes are in one segment file: flip one of its key bytes there.
        hits = []
        for seg in glob.glob(os.path.join(self.path, "**", "*"), recursive=True):
            if os.path.isfile(seg):
                hits += [(seg, at) for at in find_in_sparse_file(seg, needle)]
        self.assertEqual(len(hits), 1, hits)
        seg, at = hits[0]
        with open(seg, "r+b") as f:
            f.seek(at + 100)
            byte = f.read(1)
            f.seek(at + 100)
            f.write(bytes([byte[0] ^ 0x10]))
        self.engine = ckv.Engine.open(self.path)
        with self.assertRaises(ckv.DataLossError) as cm:
            ckvio.reprefill(self.engine, self.spec, m, prompt, budget=1.0)
        self.assertEqual(cm.exception.code, "DATA_LOSS")
        self.assertIn(f"record {key[:16]}/L2", str(cm.exception))
        with self.assertRaises(ckv.DataLossError):
            self.engine.read_record(self.spec, key, 2)
        # The other layers of the chunk, and the other chunks, are intact.
        self.engine.read_record(self.spec, key, 3)
        self.assertFalse(self.engine.verify()["ok"])

    def test_cpu_torch_tensors_are_taken_as_they_are(self):
        # put and submit_queries take CPU torch tensors (through numpy.asarray, no copy), and a
        # tensor of the wrong dtype is refused naming it, as a numpy array would be.
        m = model()
        prompt = prompts(1, 512, seed=13)[0]
        _, ks, vs, qs, _ = m.forward_full(prompt)
        k = [x[:448].half().contiguous() for x in ks]
        v = [x[:448].half().contiguous() for x in vs]
        res = self.engine.put(self.spec, torch.from_numpy(prompt[:448]), k, v)
        self.assertEqual(res["chunks"], 28)
        key = ckv.chunk_keys(self.spec, prompt[:448])[3]
        k_c, v_c = self.engine.read_record(self.spec, key, 4)
        self.assertEqual(k_c.tobytes(), k[4][48:64].numpy().tobytes())
        self.assertEqual(v_c.tobytes(), v[4][48:64].numpy().tobytes())
        with self.assertRaises(ValueError) as cm:
            self.engine.put(self.spec, prompt[:448], [x.float() for x in k], v)
        self.assertIn("k[0]: expected dtype float16", str(cm.exception))
        s = self.engine.begin_reprefill(self.spec, prompt[:448], budget_fraction=0.5, window=32,
                                        period_layers=2)
        for layer in range(self.spec.layers):
            s.submit_queries(layer, qs[layer][-32:].contiguous())  # float32 torch tensor
            self.assertEqual(len(s.await_layer(layer)), 14)
        s.finish()

    def test_bf16_torch_tensors_go_in_as_their_raw_bits(self):
        # numpy has no bfloat16: a torch bfloat16 tensor is read in place as its 16 raw bits (the
        # module's bf16 is uint16), and comes back bit for bit. Something numpy cannot read in
        # place is a ValueError naming the tensor.
        spec = ckv.ModelSpec(layers=2, q_heads=2, kv_heads=1, head_dim=8, dtype="bf16",
                             chunk_tokens=4, model_id="bf16-torch")
        g = torch.Generator().manual_seed(3)
        k = [torch.randn(8, 1, 8, generator=g).to(torch.bfloat16) for _ in range(2)]
        v = [torch.randn(8, 1, 8, generator=g).to(torch.bfloat16) for _ in range(2)]
        tokens = torch.arange(100, 108, dtype=torch.int32)
        self.assertEqual(self.engine.put(spec, tokens, k, v)["chunks"], 2)
        k_c, v_c = self.engine.read_record(spec, ckv.chunk_keys(spec, tokens.numpy())[1], 1)
        self.assertEqual(k_c.dtype, np.uint16)
        self.assertEqual(k_c.tobytes(), k[1][4:8].view(torch.int16).numpy().tobytes())
        self.assertEqual(v_c.tobytes(), v[1][4:8].view(torch.int16).numpy().tobytes())
        back = torch.from_numpy(k_c.view(np.int16).copy()).view(torch.bfloat16)
        self.assertTrue(torch.equal(back, k[1][4:8]))

        class NoArray:
            def __array__(self, dtype=None):
                raise TypeError("can't convert cuda:0 device type tensor to numpy")
        with self.assertRaises(ValueError) as cm:
            self.engine.put(spec, tokens, [k[0], NoArray()], v)
        self.assertIn("k[1]: cannot be read in place as an array", str(cm.exception))
        self.assertIn("cuda:0", str(cm.exception))

    def test_the_exported_profile_is_what_reprefill_bench_stores_and_scores(self):
        # export_profile (Python) writes the file that reprefill_bench (C++) reads as its
        # trained-tiny attention profile: the bench must accept it, take its shape, and store
        # the network's own float16 K and V under its chunk keys.
        bench = os.environ.get("CKV_REPREFILL_BENCH")
        if not bench or not os.path.exists(bench):
            self.skipTest("reprefill_bench was not built (CKV_REPREFILL_BENCH)")
        from ckv_ref import export_profile
        profile = os.path.join(self.dir, "trained-tiny.safetensors")
        args = dict(conversations=2, prefix_tokens=64, suffix_tokens=32, turns=2, window=8,
                    seed=31)
        export_profile.main(["--out", profile, "--weights", WEIGHTS] +
                            [f"--{k.replace('_', '-')}={v}" for k, v in args.items()])
        store = os.path.join(self.dir, "bench-store")
        out_json = os.path.join(self.dir, "bench.json")
        ran = subprocess.run(
            [bench, "--store", store, "--attention-profile", "trained-tiny", "--profile-file",
             profile, "--budgets", "50", "--systems", "full,ckv", "--rounds", "1", "--no-fio",
             "--gpu-tier-bytes", "0", "--cpu-tier-bytes", "0", "--json", out_json],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(ran.returncode, 0, ran.stdout + ran.stderr)
        with open(out_json) as f:
            workload = json.load(f)["workload"]
        self.assertEqual(workload["model"], ckvio.model_id_of(model()))
        self.assertEqual((workload["prefix_tokens"], workload["suffix_tokens"],
                          workload["conversations"], workload["turns"], workload["window"]),
                         (64, 32, 2, 2, 8))
        # The bench's store holds the network's KV of the first conversation's prefix.
        m = model()
        tokens = prompts(2, 64 + 2 * 32, seed=31)[0]
        _, ks, vs, _, _ = m.forward_full(tokens)
        k16, v16 = ckvio.kv_arrays(ks, vs)
        spec = ckvio.spec_of(m)
        with ckv.Engine.open_read_only(os.path.join(store, "layer-major")) as reader:
            self.assertGreaterEqual(reader.lookup(spec, tokens[:64]), 4)
            key = ckv.chunk_keys(spec, tokens[:64])[2]
            k_c, v_c = reader.read_record(spec, key, 3)
        self.assertEqual(k_c.tobytes(), k16[3][32:48].tobytes())
        self.assertEqual(v_c.tobytes(), v16[3][32:48].tobytes())

    def test_kv_of_another_spec_is_refused(self):
        m = model()
        prompt = prompts(1, 560, seed=5)[0]
        _, ks, vs, _, _ = m.forward_full(prompt[:512])
        k, v = ckvio.kv_arrays(ks, vs)
        # A spec with more KV heads than this model has: the arrays' shape is refused by name.
        wide = ckv.ModelSpec(layers=self.spec.layers, q_heads=self.spec.q_heads,
                             kv_heads=2 * self.spec.kv_heads, head_dim=self.spec.head_dim,
                             model_id=ckvio.model_id_of(model()))
        with self.assertRaises(ValueError) as cm:
            self.engine.put(wide, prompt[:512], k, v)
        self.assertIn("k[0]", str(cm.exception))
        # Fewer layers than the spec has.
        with self.assertRaises(ValueError) as cm:
            self.engine.put(self.spec, prompt[:512], k[:-1], v[:-1])
        layers = self.spec.layers
        self.assertIn(f"k: expected {layers} tensors (one per layer), got {layers - 1}",
                      str(cm.exception))
        # float32 where the spec says float16.
        with self.assertRaises(ValueError) as cm:
            self.engine.put(self.spec, prompt[:512], [x.astype(np.float32) for x in k], v)
        self.assertIn("float16", str(cm.exception))
        self.assertEqual(self.engine.lookup(self.spec, prompt), 0)
        # Stored under this model's spec, the KV is another model's to nobody: a foreign spec of
        # the same shape finds nothing, and cannot read this model's records by key.
        self.engine.put(self.spec, prompt[:512], k, v)
        other = ckvio.spec_of(m, model_id="another-model")
        self.assertNotEqual(other.fingerprint, self.spec.fingerprint)
        self.assertEqual(self.engine.lookup(other, prompt), 0)
        key = ckv.chunk_keys(self.spec, prompt[:512])[0]
        with self.assertRaises(ckv.FailedPreconditionError) as cm:
            self.engine.read_record(other, key, 0)
        self.assertIn(f"stored under model {ckvio.model_id_of(m)}", str(cm.exception))
        self.assertIn("not another-model", str(cm.exception))
        got = ckvio.reprefill(self.engine, other, m, prompt, budget=1.0)
        self.assertEqual(got.matched_chunks, 0)


@unittest.skipUnless(os.path.basename(WEIGHTS) == "ref2k.npz",
                     "run with the ref2k weights (ctest reference_model_2k_test)")
class TrainingReproducesTest(unittest.TestCase):
    """The committed ref2k weights come from ckv_ref.train: its first steps, run again here,
    give the losses and parameter probes its loss curve recorded (never training further)."""

    def test_the_first_steps_reproduce_the_committed_curve(self):
        from ckv_ref import train
        weights_dir = os.path.join(os.path.dirname(ckvio.__file__), "weights")
        with open(os.path.join(weights_dir, "ref2k.loss.csv")) as f:
            rows = [line.strip().split(",") for line in f][1:3]
        out = os.path.join(tempfile.mkdtemp(prefix="ckv-train-test."), "ref2k.npz")
        try:
            # The committed run's thread count: the probe's last digits depend on it.
            train.main(["--preset", "ref2k", "--steps", "2", "--long-steps", "0",
                        "--eval-every", "0", "--stats-prompts", "0", "--out", out])
            with open(os.path.splitext(out)[0] + ".loss.csv") as f:
                got = [line.strip().split(",") for line in f][1:3]
        finally:
            torch.set_num_threads(1)  # as the other tests run
            shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        for want, have in zip(rows, got):
            step = want[0]
            self.assertEqual(have[0], step)
            self.assertAlmostEqual(float(have[2]), float(want[2]), delta=2e-4,
                                   msg=f"loss, step {step}")
            # A probe of other weights or other batches differs by tens; threads by 1e-6.
            self.assertAlmostEqual(float(have[5]), float(want[5]), delta=1e-3,
                                   msg=f"probe, step {step}")


class SummaryRecallTest(unittest.TestCase):
    """ckv_ref.summary_recall's chunk summaries, on chunks whose log-mean-exp is known."""

    def test_summaries_are_exact_where_their_model_of_the_chunk_is(self):
        from ckv_ref import summary_recall
        rng = np.random.default_rng(3)
        d, c = 16, 16
        q = rng.normal(size=d)
        same = np.repeat(rng.normal(size=(3, 1, d)), c, axis=1)  # every token of a chunk alike
        want = same[:, 0] @ q / math.sqrt(d)
        for name in summary_recall.SUMMARIES:
            np.testing.assert_allclose(summary_recall.chunk_logits(name, same, q, q * q), want,
                                       rtol=1e-12, atol=1e-12, err_msg=name)
        # c - 1 alike and one apart: outlier-1 keeps the one apart and is exact; mean-key is not.
        odd = same.copy()
        odd[:, 5] += 4 * rng.normal(size=(3, d))
        exact = summary_recall.chunk_logits("exact-lse", odd, q, q * q)
        np.testing.assert_allclose(summary_recall.chunk_logits("outlier-1", odd, q, q * q), exact,
                                   rtol=1e-12)
        self.assertGreater(np.abs(summary_recall.chunk_logits("mean-key", odd, q, q * q)
                                  - exact).max(), 1e-3)


if __name__ == "__main__":
    unittest.main()
