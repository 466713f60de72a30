#!/usr/bin/env python3
"""The peers benchmark's same-work check and harness, on CPU (CTest: PeersSameWork).

packtrain's loss curve (`packtrain_peers reference`, the trainer's step) must be
reproduced by the PyTorch peers trained from the same weights on the same batch;
a peer with a 1% different learning rate must be refused; JAX is checked when it
is importable (the benchmark installs it; the project's setup does not). And the
one command's core, run_peers.py, must write a table, JSON and plot with figures.

Usage: same_work_test.py BUILD_BIN_DIR   (packtrain_peers and packtrain_bench there)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PEERS = os.path.join(ROOT, "benchmarks", "peers")
BIN = None


def peer_check(peer, directory, *extra):
    done = subprocess.run([sys.executable, os.path.join(PEERS, "peers.py"), peer, directory, "--check-only", *extra],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


class SameWork(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.ref = os.path.join(cls.tmp.name, "ref")
        subprocess.run([os.path.join(BIN, "packtrain_peers"), "reference", "--members", "4", "--hidden", "16",
                        "--batch", "32", "--depth", "2", "--steps", "15", "--device", "cpu", "--out", cls.ref],
                       check=True, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_reference_has_a_moving_loss_curve(self):
        with open(os.path.join(self.ref, "manifest.json")) as f:
            manifest = json.load(f)
        losses = manifest["losses"]
        self.assertEqual(len(losses), 15)
        self.assertEqual(len(losses[0]), 4)
        for k in range(4):  # every member trained: its loss went down
            self.assertLess(losses[-1][k], losses[0][k])

    def assert_matches(self, result):
        self.assertTrue(result["check"]["passed"], result["check"])
        self.assertLess(result["check"]["max_rel_error"], 1e-5, result["check"])

    def test_pytorch_loop_does_the_same_work(self):
        self.assert_matches(peer_check("torch-loop", self.ref))

    def test_vmap_does_the_same_work_foreach_and_fused(self):
        for impl in ("foreach", "fused"):
            with self.subTest(impl=impl):
                self.assert_matches(peer_check("torch-vmap", self.ref, "--impl", impl))

    def test_a_different_learning_rate_is_refused(self):
        result = peer_check("torch-vmap", self.ref, "--perturb-lr", "1.01")
        self.assertFalse(result["check"]["passed"], result["check"])
        self.assertNotIn("timing", result)

    def test_jax_does_the_same_work(self):
        try:
            import jax  # noqa: F401
            import optax  # noqa: F401
        except ImportError:
            self.skipTest("JAX/optax not installed here (benchmarks/peers/run.sh installs them for the benchmark)")
        self.assert_matches(peer_check("jax", self.ref))

    def test_cuda_graph_peer_says_it_needs_a_gpu_on_cpu(self):
        result = peer_check("torch-cudagraph", self.ref)
        self.assertIn("CUDA", result["unsupported"])


class Harness(unittest.TestCase):
    def test_run_peers_writes_table_json_and_plot(self):
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([sys.executable, os.path.join(PEERS, "run_peers.py"), "--build-dir",
                            os.path.dirname(BIN), "--device", "cpu", "--members", "1", "--peers",
                            "torch-loop,torch-vmap:foreach", "--repeats", "1", "--min-time", "0.01",
                            "--check-steps", "5", "--out", out], check=True, capture_output=True, timeout=900)
            with open(os.path.join(out, "results.json")) as f:
                results = json.load(f)
            row = next(r for r in results["rows"] if r["workload"]["members"] == 1)
            self.assertGreater(row["systems"]["packtrain"]["member_steps_per_s"], 0)
            self.assertGreater(row["systems"]["PyTorch loop"]["member_steps_per_s"], 0)
            self.assertEqual(row["systems"]["PyTorch loop"]["status"], "ok")
            self.assertIsNone(row["systems"]["JAX vmap + jit"]["member_steps_per_s"])  # not selected
            with open(os.path.join(out, "results.md")) as f:
                table = f.read()
            self.assertIn("| members | hidden | batch | packtrain |", table)
            with open(os.path.join(out, "results.svg")) as f:
                svg = f.read()
            self.assertTrue(svg.startswith("<svg") or svg.startswith("<?xml"), svg[:80])
            self.assertIn("PyTorch loop", svg)
            self.assertIn("packtrain", svg)


if __name__ == "__main__":
    BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
