#!/usr/bin/env python3
"""The peers benchmark's CNN rows: the same-work check and the harness, on CPU
(CTest: PeersSameWorkCnn).

`packtrain_peers reference --model cnn` writes a PackedCNN workload (packtrain's default
cnn shape on the digits network's 1x8x8 input and MNIST-1D's 1x40, cross-entropy; conv
weights (K, Cout, Cin, k[, k])) and packtrain's loss curve through the trainer's step;
the PyTorch peers (a loop of torch.nn members, torch.func vmap with the fused and foreach
AdamW) must reproduce it from the same weights, a 1% different learning rate must be
refused, and JAX — lax.conv_general_dilated and the im2col form, one step per call and
lax.scan — must pass where it is importable (run.sh's cached install, as
same_work_test.py finds it). run_peers.py --model cnn must write the CNN table, JSON
and plot with packtrain's figure and the verdict line.

Usage: same_work_cnn_test.py BUILD_BIN_DIR   (packtrain_peers there)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import same_work_test as mlp  # noqa: E402  (the peers' helpers, JAX's environment)

BIN = None
STEPS = 10


def reference(directory, network, members=3, batch=16, *extra):
    subprocess.run([os.path.join(BIN, "packtrain_peers"), "reference", "--model", "cnn", "--network", network,
                    "--members", str(members), "--batch", str(batch), "--steps", str(STEPS), "--device", "cpu",
                    "--out", directory, *extra], check=True, capture_output=True)
    with open(os.path.join(directory, "manifest.json")) as f:
        return json.load(f)


class SameWorkCnn(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.refs = {n: os.path.join(cls.tmp.name, n) for n in ("digits", "mnist1d")}
        cls.manifests = {n: reference(d, n) for n, d in cls.refs.items()}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_reference_writes_the_cnn_and_a_falling_loss_curve(self):
        for network, shape in (("digits", [1, 8, 8]), ("mnist1d", [1, 40])):
            with self.subTest(network=network):
                m = self.manifests[network]
                self.assertEqual(m["workload"]["model"], "cnn")
                self.assertEqual(m["workload"]["input_shape"], shape)
                self.assertEqual(m["workload"]["loss"], "cross_entropy")
                kernel = [3] * (len(shape) - 1)
                self.assertEqual(m["tensors"]["conv0.weight"]["shape"], [3, 32, 1] + kernel)
                self.assertEqual(m["tensors"]["conv1.weight"]["shape"], [3, 64, 32] + kernel)
                self.assertEqual(m["tensors"]["y"]["shape"], [16])
                losses = m["losses"]
                self.assertEqual((len(losses), len(losses[0])), (STEPS, 3))
                for k in range(3):
                    self.assertLess(losses[-1][k], losses[0][k])

    def test_torch_peers_do_the_same_work(self):
        for network, directory in self.refs.items():
            for peer, extra in (("torch-loop", []), ("torch-vmap", ["--impl", "fused"]),
                                ("torch-vmap", ["--impl", "foreach"])):
                with self.subTest(network=network, peer=peer, options=" ".join(extra)):
                    result = mlp.peer_check(peer, directory, *extra)
                    self.assertTrue(result["check"]["passed"], result["check"])
                    self.assertEqual(result["check"]["criterion"], "packtrain", result["check"])

    def test_a_different_learning_rate_is_refused(self):
        for network, directory in self.refs.items():
            with self.subTest(network=network):
                result = mlp.peer_check("torch-vmap", directory, "--impl", "fused", "--perturb-lr", "1.01")
                self.assertFalse(result["check"]["passed"], result["check"])

    def test_jax_does_the_same_work_in_both_convolution_forms(self):
        if mlp.JAX_ENV is None:
            self.skipTest(mlp.NO_JAX)
        for network, directory in self.refs.items():
            for extra in (["--jax-conv", "lax"], ["--jax-conv", "im2col", "--unroll", "4"],
                          ["--jax-conv", "im2col", "--jax-layout", "NHWC"]):
                with self.subTest(network=network, options=" ".join(extra)):
                    result = mlp.peer_check("jax", directory, *extra, env=mlp.JAX_ENV)
                    self.assertTrue(result["check"]["passed"], result["check"])

    def test_jax_with_a_different_learning_rate_is_refused(self):
        if mlp.JAX_ENV is None:
            self.skipTest(mlp.NO_JAX)
        result = mlp.peer_check("jax", self.refs["digits"], "--jax-conv", "im2col", "--perturb-lr", "1.01",
                                env=mlp.JAX_ENV)
        self.assertFalse(result["check"]["passed"], result["check"])

    def test_reference_times_the_trainers_step(self):
        with tempfile.TemporaryDirectory() as tmp:
            m = reference(tmp, "mnist1d", 2, 16, "--time-repeats", "2", "--min-time", "0.01")
        self.assertEqual(len(m["timing"]["runs"]), 2)
        self.assertGreater(m["timing"]["member_steps_per_s"], 0)
        self.assertIn("EnsembleSteps", m["timing"]["path"])

    def test_run_peers_writes_the_cnn_table(self):
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run([sys.executable, os.path.join(mlp.PEERS, "run_peers.py"), "--build-dir",
                                   os.path.dirname(BIN), "--out", out, "--model", "cnn", "--networks", "mnist1d",
                                   "--members", "8", "--peers", "torch-vmap:fused", "--check-steps", "3",
                                   "--repeats", "1", "--min-time", "0.01", "--threads", "1"],
                                  capture_output=True, text=True, timeout=600)
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            with open(os.path.join(out, "results.json")) as f:
                results = json.load(f)
            with open(os.path.join(out, "results.md")) as f:
                table = f.read()
            self.assertTrue(os.path.getsize(os.path.join(out, "results.svg")) > 0)
        self.assertEqual(results["model"], "cnn")
        [row] = results["rows"]
        self.assertEqual(row["workload"], {"model": "cnn", "network": "mnist1d", "members": 8, "batch": 128})
        self.assertGreater(row["systems"]["packtrain"]["member_steps_per_s"], 0)
        vmap = row["systems"]["torch.func vmap"]
        self.assertEqual(vmap["status"], "ok", vmap)
        self.assertEqual(row["best_peer"]["system"], "torch.func vmap")
        self.assertIn("every K ≥ 8 row", results["verdict"]["text"])
        self.assertIn("| mnist1d | 8 |", table)
        self.assertIn(results["verdict"]["text"], table)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
