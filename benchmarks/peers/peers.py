#!/usr/bin/env python3
"""One peer system on one packtrain_bench workload: check the same work, then time it.

A peer loads what `packtrain_peers reference` wrote (initial packed weights, the
fixed batch, AdamW's hyperparameters, packtrain's per-member loss at each step),
trains the same K members from the same weights on the same batch, and must
reproduce packtrain's loss curve within the tolerance before it is timed:

    |loss_peer - loss_packtrain| <= rtol * |loss_packtrain| + atol   (every step, every member)

Peers (what a user would pick instead of packtrain):
  torch-loop      one nn.Sequential and one torch.optim.AdamW per member, a Python
                  loop over members (what torchensemble does); AdamW's default
                  implementation for the device
  torch-vmap      torch.func.stack_module_state + vmap(functional_call), one AdamW
                  over the stacked parameters (--impl foreach or fused)
  torch-compile   torch-vmap's step under torch.compile (mode="reduce-overhead":
                  CUDA graphs on a GPU) with the optimizer step compiled too
  torch-cudagraph torch-vmap's whole step captured with torch.cuda.graphs and a
                  capturable AdamW, replayed (GPU only)
  jax             jax.vmap + jax.jit over the members, optax.adamw, float32 matmuls
                  at "highest" precision (no TF32), buffers donated

Prints one JSON object on stdout: {"peer", "impl", "check": {...}, "timing": {...}}.
Usage: peers.py PEER MANIFEST_DIR [--impl foreach|fused] [--device cpu|cuda]
                [--repeats 5] [--min-time 0.3] [--check-only]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

RTOL = 1e-4
ATOL = 1e-6


def load_reference(directory):
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    arrays = {}
    for name, t in manifest["tensors"].items():
        data = np.fromfile(os.path.join(directory, t["file"]), dtype="<f4")
        arrays[name] = data.reshape(t["shape"])
    manifest["arrays"] = arrays
    manifest["losses"] = np.asarray(manifest["losses"], dtype=np.float64)  # (steps, K)
    return manifest


def layers(ref):
    """[(W (K, I, O), b (K, 1, O)), ...] in order."""
    out, i = [], 0
    while f"linear{i}.weight" in ref["arrays"]:
        out.append((ref["arrays"][f"linear{i}.weight"], ref["arrays"][f"linear{i}.bias"]))
        i += 1
    return out


# --- PyTorch ------------------------------------------------------------------

class TorchPeer:
    """The PyTorch peers. step() trains all K members once and returns the (K)
    per-member loss before the update as a tensor (not synchronized)."""

    def __init__(self, ref, device, kind, impl):
        import torch
        self.torch = torch
        self.device = torch.device(device)
        self.kind = kind
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls, as packtrain
        torch.backends.cudnn.allow_tf32 = False
        adamw = ref["adamw"]
        self.adamw_kwargs = dict(lr=adamw["lr"], betas=(adamw["beta1"], adamw["beta2"]), eps=adamw["eps"],
                                 weight_decay=adamw["weight_decay"])
        self.x = torch.from_numpy(ref["arrays"]["x"].copy()).to(self.device)
        self.y = torch.from_numpy(ref["arrays"]["y"].copy()).to(self.device)
        self.models = [self._member(ref, k) for k in range(ref["workload"]["members"])]
        self.impl = impl
        if kind == "torch-loop":
            self.impl = "default"
            self.optimizers = [torch.optim.AdamW(m.parameters(), **self.adamw_kwargs) for m in self.models]
            self.step = self._loop_step
            return
        from torch.func import functional_call, stack_module_state
        import copy
        self.params, self.buffers = stack_module_state(self.models)
        base = copy.deepcopy(self.models[0]).to("meta")
        self.models = None  # the stacked tensors are the model now

        def member(p, b, x):
            return functional_call(base, (p, b), (x,))

        self.vmapped = torch.vmap(member, in_dims=(0, 0, None))
        if kind == "torch-cudagraph":
            if self.device.type != "cuda":
                raise Unsupported("torch.cuda.graphs needs a CUDA device")
            self.impl = "foreach, capturable"
            self.optimizer = torch.optim.AdamW(self.params.values(), capturable=True, foreach=True,
                                               **self.adamw_kwargs)
            self.step = self._graph_step
            self.graph = None
            self.warmup_left = 3
            return
        options = {"fused": True} if impl == "fused" else {"foreach": True}
        self.optimizer = torch.optim.AdamW(self.params.values(), **options, **self.adamw_kwargs)
        if kind == "torch-vmap":
            self.step = self._vmap_step
        elif kind == "torch-compile":
            self.impl = f"{impl}, mode=reduce-overhead"
            self.compiled_loss = torch.compile(self._losses, mode="reduce-overhead")
            self.compiled_opt_step = torch.compile(self.optimizer.step, mode="reduce-overhead")
            self.step = self._compiled_step
        else:
            raise ValueError(kind)

    def _member(self, ref, k):
        torch = self.torch
        seq = []
        pairs = layers(ref)
        for i, (w, b) in enumerate(pairs):
            lin = torch.nn.Linear(w.shape[1], w.shape[2])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w[k].T.copy()))
                lin.bias.copy_(torch.from_numpy(b[k, 0].copy()))
            seq.append(lin)
            if i + 1 < len(pairs):
                seq.append(torch.nn.ReLU())
        return torch.nn.Sequential(*seq).to(self.device)

    def _loop_step(self):
        torch = self.torch
        losses = []
        for model, opt in zip(self.models, self.optimizers):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(self.x), self.y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    def _losses(self):
        pred = self.vmapped(self.params, self.buffers, self.x)  # (K, B, O)
        return ((pred - self.y) ** 2).mean(dim=(1, 2))  # (K)

    def _vmap_step(self):
        self.optimizer.zero_grad()
        losses = self._losses()
        losses.sum().backward()
        self.optimizer.step()
        return losses.detach()

    def _compiled_step(self):
        self.optimizer.zero_grad()
        losses = self.compiled_loss()
        losses.sum().backward()
        self.compiled_opt_step()
        return losses.detach().clone()  # cudagraph outputs are overwritten by the next replay

    def _graph_step(self):
        torch = self.torch
        if self.graph is None and self.warmup_left > 0:  # eager warm-up on a side stream, as the docs show
            self.warmup_left -= 1
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                losses = self._vmap_step()
            torch.cuda.current_stream().wait_stream(stream)
            return losses
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(self.graph):
                self.static_losses = self._losses()
                self.static_losses.sum().backward()
                self.optimizer.step()
        self.graph.replay()
        return self.static_losses.detach().clone()

    def losses_to_numpy(self, losses):
        torch = self.torch
        if isinstance(losses, list):
            losses = torch.stack(losses)
        return losses.double().cpu().numpy()

    def synchronize(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


# --- JAX ------------------------------------------------------------------------

class JaxPeer:
    def __init__(self, ref, device, kind, impl):
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with nothing else's pool
        import jax
        import jax.numpy as jnp
        import optax
        jax.config.update("jax_default_matmul_precision", "highest")  # float32, no TF32: the same arithmetic
        platform = "gpu" if device.startswith("cuda") else "cpu"
        try:
            dev = jax.devices(platform)[0]
        except RuntimeError as e:
            raise Unsupported(f"JAX has no {platform} device here ({e})")
        self.jax, self.dev = jax, dev
        self.impl = "optax.adamw, jit, donated buffers"
        put = lambda a: jax.device_put(jnp.asarray(a), dev)
        self.params = [(put(w), put(b)) for w, b in layers(ref)]
        self.x, self.y = put(ref["arrays"]["x"]), put(ref["arrays"]["y"])
        a = ref["adamw"]
        opt = optax.adamw(a["lr"], b1=a["beta1"], b2=a["beta2"], eps=a["eps"], weight_decay=a["weight_decay"])
        self.opt_state = jax.device_put(opt.init(self.params), dev)

        def member_loss(params, x, y):
            h = x
            for i, (w, b) in enumerate(params):
                h = h @ w + b
                if i + 1 < len(params):
                    h = jax.nn.relu(h)
            return jnp.mean((h - y) ** 2)

        member_losses = jax.vmap(member_loss, in_axes=(0, None, None))

        def total(params, x, y):
            losses = member_losses(params, x, y)
            return losses.sum(), losses

        def step(params, opt_state, x, y):
            (_, losses), grads = jax.value_and_grad(total, has_aux=True)(params, x, y)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, losses

        self._step = jax.jit(step, donate_argnums=(0, 1))

    def step(self):
        self.params, self.opt_state, losses = self._step(self.params, self.opt_state, self.x, self.y)
        return losses

    def losses_to_numpy(self, losses):
        return np.asarray(losses, dtype=np.float64)

    def synchronize(self):
        self.jax.block_until_ready(self.params)


class Unsupported(Exception):
    """The peer cannot run on this machine (stated in the results, not an error)."""


PEERS = {"torch-loop": TorchPeer, "torch-vmap": TorchPeer, "torch-compile": TorchPeer,
         "torch-cudagraph": TorchPeer, "jax": JaxPeer}


def check(peer, ref):
    expected = ref["losses"]
    got = np.stack([peer.losses_to_numpy(peer.step()) for _ in range(expected.shape[0])])
    error = np.abs(got - expected)
    bound = RTOL * np.abs(expected) + ATOL
    worst = np.unravel_index(np.argmax(error / bound), error.shape)
    return {
        "steps": int(expected.shape[0]),
        "rtol": RTOL,
        "atol": ATOL,
        "passed": bool(np.all(error <= bound) and np.all(np.isfinite(got))),
        "max_abs_error": float(error.max()),
        "max_rel_error": float((error / np.maximum(np.abs(expected), 1e-12)).max()),
        "worst": {"step": int(worst[0]), "member": int(worst[1]), "expected": float(expected[worst]),
                  "got": float(got[worst])},
    }


def time_steps(peer, members, repeats, min_time):
    """Median member-steps/s over `repeats` runs of n steps, n chosen so that a run
    takes at least `min_time` seconds (after the check's steps warmed everything)."""
    peer.step()
    peer.synchronize()
    t0 = time.perf_counter()
    peer.step()
    peer.synchronize()
    one = time.perf_counter() - t0
    n = max(1, math.ceil(min_time / max(one, 1e-9)))
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            peer.step()
        peer.synchronize()
        rates.append(n * members / (time.perf_counter() - t0))
    return {"member_steps_per_s": statistics.median(rates), "runs": rates, "steps_per_run": n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peer", choices=sorted(PEERS))
    ap.add_argument("manifest_dir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--impl", default="foreach", choices=["foreach", "fused"],
                    help="torch.optim.AdamW implementation for the stacked peers")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per timed run, at least")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--perturb-lr", type=float, default=1.0,
                    help="multiply the learning rate (a self-test: the check must then fail)")
    args = ap.parse_args()
    ref = load_reference(args.manifest_dir)
    ref["adamw"]["lr"] *= args.perturb_lr
    result = {"peer": args.peer}
    try:
        peer = PEERS[args.peer](ref, args.device, args.peer, args.impl)
    except Unsupported as e:
        result["unsupported"] = str(e)
        print(json.dumps(result))
        return 0
    result["impl"] = peer.impl
    result["check"] = check(peer, ref)
    if result["check"]["passed"] and not args.check_only:
        result["timing"] = time_steps(peer, ref["workload"]["members"], args.repeats, args.min_time)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
