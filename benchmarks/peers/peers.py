#!/usr/bin/env python3
"""One peer system on one packtrain_bench workload: check the same work, then time it.

A peer loads what `packtrain_peers reference` wrote (initial packed weights, the
fixed batch, AdamW's hyperparameters, packtrain's per-member loss at each step),
trains the same K members from the same weights on the same batch, and must
reproduce packtrain's loss curve within the tolerance before it is timed:

    |loss_peer - loss_packtrain| <= rtol * |loss_packtrain| + atol   (every step, every member)

or, where it does not (deep and wide shapes: training amplifies float32 rounding until two
honest float32 curves part by more than rtol), be no further from the same training in
float64 than packtrain's own curve is (the float64 criterion; check() says why these bounds):

    dev_k(c) = max over steps |c - loss_f64| / |loss_f64|, for member k
    max_k dev_k(peer) <= max(FLOAT64_FACTOR * max_k dev_k(packtrain), rtol)
    median_k dev_k(peer) <= max(FLOAT64_FACTOR * median_k dev_k(packtrain), rtol)

with every loss finite. The float64 curve (float64_losses) is eager torch.func.vmap and
torch.optim.AdamW in float64 from the same weights, batch and hyperparameters; for a peer
whose AdamW computes its bias corrections 1 - beta^t in float32 (optax; torch's AdamW
compiled or capturable: a float32 step count) it computes them so too, each side judged
against float64 training of its own arithmetic.

Peers (what a user would pick instead of packtrain):
  torch-loop      one nn.Sequential and one torch.optim.AdamW per member, a Python
                  loop over members (what torchensemble does); AdamW's default
                  implementation for the device
  torch-vmap      torch.func.stack_module_state + vmap(functional_call), one AdamW
                  over the stacked parameters (--impl foreach or fused)
  torch-compile   torch-vmap's step under torch.compile (mode="reduce-overhead":
                  CUDA graphs on a GPU) with the optimizer step compiled too
  torch-cudagraph torch-vmap's whole step — forward, backward and a capturable AdamW —
                  captured with torch.cuda.graphs and replayed (GPU only); with
                  --unroll U, U whole steps are captured into one graph, one replay
                  per U steps (as packtrain's unrolled step)
  jax             jax.vmap + jax.jit over the members, optax.adamw, float32 matmuls
                  at "highest" precision (no TF32), buffers donated; one step per
                  jitted call, or with --unroll U a jax.lax.scan over U steps inside
                  the one jitted call (the carry — parameters and optimizer state —
                  donated; --unroll-scan also unrolls the scan's loop)

The CNN workload (`packtrain_peers reference --model cnn`; manifest workload "model": "cnn"):
each peer builds the same member network — Unflatten to (C, H, W) or (C, L); per block a
Conv2d/Conv1d (kernel k, "same" padding k/2), ReLU, MaxPool 2; Flatten; the hidden Linear +
ReLU layers; the output Linear — loads the pack's weights (conv<b>.weight (K, Cout, Cin,
k[, k]) as torch's Conv weight; Linear weights (K, I, O) transposed) and trains it with
cross-entropy against the class indices y (B). JAX: lax.conv_general_dilated (--jax-layout
NCHW with OIHW weights, or NHWC with HWIO), max pooling by lax.reduce_window, as flax's
max_pool; vmap turns the members' convolutions into grouped ones. --jax-conv im2col instead
writes each convolution as lax.conv_general_dilated_patches and a matmul (vmap: a batched
matmul over the members), which XLA runs much faster than a grouped convolution on CPU.

Every call of a peer's step() trains the members `steps per call` times (1, or U)
and returns each of those steps' per-member losses; the check compares every step,
the timing counts every step.

Prints one JSON object on stdout: {"peer", "impl", "unroll", "check": {...}, "timing": {...}}.
Usage: peers.py PEER MANIFEST_DIR [--impl foreach|fused] [--device cpu|cuda] [--unroll U]
                [--unroll-scan] [--jax-layout NCHW|NHWC] [--jax-conv lax|im2col]
                [--repeats 5] [--min-time 0.3]
                [--check-only]
"""
import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time

import numpy as np

RTOL = 1e-4
ATOL = 1e-6
# bf16-mixed curves (--precision bf16-mixed) against packtrain's bf16-mixed curve
# (check_bf16): the products round to bfloat16 (a step of 2^-8 = 0.4% relative)
# wherever their float32 sums differ in order, and the steps carry that on, further in
# a few members of a deep, wide pack (as float32's rounding is: check()). So each
# member's max relative deviation over the steps is bounded twice: the median member's
# by BF16_RTOL, the worst member's by BF16_WORST_RTOL. Measured (2026-12-07, AMD EPYC
# with AVX-512 BF16), median member: at K 4, hidden 64, depth 2, batch 64, 15 steps
# torch's loop 5e-7, torch.func 3.5e-4, torch.compile 3.8e-4, JAX 6.2e-4; at K 64,
# hidden 256, depth 2, batch 128, 20 steps all three 1.2e-3 to 1.3e-3 (worst member
# 3.1e-3 to 4.5e-3); torch.func with a learning rate 3% off 4.4e-3, 10% off 1.5e-2.
# So the check refuses a learning rate 10% off, not one 3% off: bfloat16's own
# rounding moves honest curves about as far.
BF16_RTOL = 2.0**-7
BF16_WORST_RTOL = 2.0**-4
# The float64 criterion: a peer's distance from the float64 curve may be this many times
# packtrain's (why this factor: check()).
FLOAT64_FACTOR = 8


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


def is_cnn(ref):
    return ref["workload"].get("model", "mlp") == "cnn"


def head_layers(ref):
    """The CNN's head: [(W (K, I, O), b (K, 1, O)), ...], the hidden layers then the output."""
    a, depth = ref["arrays"], ref["workload"]["depth"]
    names = [f"fc{l}" for l in range(depth)] + ["output"]
    return [(a[f"{n}.weight"], a[f"{n}.bias"]) for n in names]


def conv_layers(ref):
    """The CNN's convolutions: [(W (K, Cout, Cin, k[, k]), b (K, Cout)), ...] in order."""
    a = ref["arrays"]
    return [(a[f"conv{b}.weight"], a[f"conv{b}.bias"]) for b in range(len(ref["workload"]["channels"]))]


def layers(ref):
    """[(W (K, I, O), b (K, 1, O)), ...] in order."""
    out, i = [], 0
    while f"linear{i}.weight" in ref["arrays"]:
        out.append((ref["arrays"][f"linear{i}.weight"], ref["arrays"][f"linear{i}.bias"]))
        i += 1
    return out


# --- PyTorch ------------------------------------------------------------------

class TorchPeer:
    """The PyTorch peers. step() trains all K members once (torch-cudagraph with
    unroll U: U times per replay once captured) and returns the per-member losses
    before each update, (K) or (steps, K), as a tensor (not synchronized)."""

    def __init__(self, ref, device, kind, impl, unroll=1, dtype=None, precision="fp32"):
        import torch
        self.torch = torch
        # bf16-mixed: the forward under torch.autocast(bfloat16), as its docs show (the
        # backward follows the forward's casts); weights, AdamW and the loss float32.
        self.bf16 = precision == "bf16-mixed"
        self.dtype = dtype or torch.float32  # float64: the reference curve (float64_losses)
        self.unroll = unroll
        self.steps_done = 0  # training steps taken so far (the timing counts these)
        self.device = torch.device(device)
        self.kind = kind
        if kind == "torch-cudagraph" and self.device.type != "cuda":
            raise Unsupported("torch.cuda.graphs needs a CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls, as packtrain
        torch.backends.cudnn.allow_tf32 = False
        adamw = ref["adamw"]
        self.adamw_kwargs = dict(lr=adamw["lr"], betas=(adamw["beta1"], adamw["beta2"]), eps=adamw["eps"],
                                 weight_decay=adamw["weight_decay"])
        self.cnn = is_cnn(ref)
        self.x = torch.from_numpy(ref["arrays"]["x"].copy()).to(self.device, self.dtype)
        if self.cnn:  # class indices (B), exact in the manifest's float32
            self.y = torch.from_numpy(ref["arrays"]["y"].astype(np.int64)).to(self.device)
        else:
            self.y = torch.from_numpy(ref["arrays"]["y"].copy()).to(self.device, self.dtype)
        self.models = [(self._cnn_member if self.cnn else self._member)(ref, k)
                       for k in range(ref["workload"]["members"])]
        self.impl = impl
        # torch.optim.AdamW computes 1 - beta^t in double from a Python step count, except
        # where the step count is a float32 tensor in the arithmetic: capturable, or the
        # foreach step traced by torch.compile (float64_losses follows either).
        float32_step = kind == "torch-cudagraph" or (kind == "torch-compile" and impl != "fused")
        self.bias_correction = "float32" if float32_step else "float64"
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
            self.impl = f"foreach, capturable, {unroll} step(s) per replay"
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

    def _linear(self, w, b, k):
        lin = self.torch.nn.Linear(w.shape[1], w.shape[2])
        with self.torch.no_grad():
            lin.weight.copy_(self.torch.from_numpy(w[k].T.copy()))
            lin.bias.copy_(self.torch.from_numpy(b[k, 0].copy()))
        return lin

    def _cnn_member(self, ref, k):
        """Member k of the CNN as torch.nn modules, the pack's weights loaded."""
        nn = self.torch.nn
        w = ref["workload"]
        shape, kernel = w["input_shape"], w["kernel_size"]
        conv, pool = (nn.Conv2d, nn.MaxPool2d) if len(shape) == 3 else (nn.Conv1d, nn.MaxPool1d)
        seq = [nn.Unflatten(1, tuple(shape))]
        for weight, bias in conv_layers(ref):
            c = conv(weight.shape[2], weight.shape[1], kernel, padding=kernel // 2)
            with self.torch.no_grad():
                c.weight.copy_(self.torch.from_numpy(weight[k].copy()))
                c.bias.copy_(self.torch.from_numpy(bias[k].copy()))
            seq += [c, nn.ReLU(), pool(w["pool"])]
        seq.append(nn.Flatten())
        head = head_layers(ref)
        for i, (weight, bias) in enumerate(head):
            seq.append(self._linear(weight, bias, k))
            if i + 1 < len(head):
                seq.append(nn.ReLU())
        return nn.Sequential(*seq).to(self.device, self.dtype)

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
        return torch.nn.Sequential(*seq).to(self.device, self.dtype)

    def _loop_step(self):
        torch = self.torch
        self.steps_done += 1
        losses = []
        for model, opt in zip(self.models, self.optimizers):
            opt.zero_grad()
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                out = model(self.x)
            if self.cnn:
                loss = torch.nn.functional.cross_entropy(out.float(), self.y)
            else:
                loss = torch.nn.functional.mse_loss(out.float(), self.y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    def _losses(self):
        with self.torch.autocast(self.device.type, dtype=self.torch.bfloat16, enabled=self.bf16):
            pred = self.vmapped(self.params, self.buffers, self.x)  # (K, B, O)
        pred = pred.float()
        if self.cnn:  # cross-entropy per member: logits (K, C, B) against (K, B)
            return self.torch.nn.functional.cross_entropy(pred.transpose(1, 2), self.y.expand(pred.shape[0], -1),
                                                          reduction="none").mean(dim=1)
        return ((pred - self.y) ** 2).mean(dim=(1, 2))  # (K)

    def _vmap_step(self):
        self.steps_done += 1
        self.optimizer.zero_grad()
        losses = self._losses()
        losses.sum().backward()
        self.optimizer.step()
        return losses.detach()

    def _compiled_step(self):
        self.steps_done += 1
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
            self._capture()
        self.graph.replay()
        self.steps_done += self.unroll
        return self.static_losses.detach().clone()  # (U, K); the next replay overwrites it

    def _capture(self):
        """The whole iteration — forward, backward, AdamW — U times, as one graph
        (torch.cuda.graphs' whole-network capture, the optimizer capturable)."""
        torch = self.torch
        self.graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # the first backward allocates .grad in the graph's pool
        with torch.cuda.graph(self.graph):
            per_step = []
            for _ in range(self.unroll):
                self.optimizer.zero_grad(set_to_none=False)  # steps after the first: gradients back to zero
                losses = self._losses()
                losses.sum().backward()
                self.optimizer.step()
                per_step.append(losses.detach())
            self.static_losses = torch.stack(per_step)  # (U, K)

    def losses_to_numpy(self, losses):
        torch = self.torch
        if isinstance(losses, list):
            losses = torch.stack(losses)
        return np.atleast_2d(losses.double().cpu().numpy())  # (steps, K)

    def synchronize(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


# --- JAX ------------------------------------------------------------------------

class JaxPeer:
    """jax.vmap over members inside jax.jit; with unroll U > 1 a jax.lax.scan runs U
    steps per jitted call and returns the (U, K) per-step losses."""

    def __init__(self, ref, device, kind, impl, unroll=1, unroll_scan=False, layout="NCHW", conv="lax",
                 precision="fp32"):
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
        self.unroll = unroll
        self.bias_correction = "float32"  # optax: 1 - beta^count in float32
        self.steps_done = 0
        put = lambda a: jax.device_put(jnp.asarray(a), dev)
        if is_cnn(ref):
            member_loss, self.params, self.x, self.y = self._cnn(ref, layout, conv, put)
        else:
            self.params = [(put(w), put(b)) for w, b in layers(ref)]
            self.x, self.y = put(ref["arrays"]["x"]), put(ref["arrays"]["y"])

            def member_loss(params, x, y):
                h = x
                for i, (w, b) in enumerate(params):
                    h = h @ w + b
                    if i + 1 < len(params):
                        h = jax.nn.relu(h)
                return jnp.mean((h.astype(jnp.float32) - y) ** 2)
        if precision == "bf16-mixed":
            # A bfloat16 compute policy (jmp's / Flax's dtype=bfloat16 with float32
            # param_dtype): parameters and inputs cast to bfloat16 in the loss, the
            # products in bfloat16, the loss and the gradients (through the casts) float32.
            full_precision_loss = member_loss

            def member_loss(params, x, y):
                half = lambda a: a.astype(jnp.bfloat16)  # noqa: E731
                return full_precision_loss(jax.tree_util.tree_map(half, params), half(x), y)
        a = ref["adamw"]
        opt = optax.adamw(a["lr"], b1=a["beta1"], b2=a["beta2"], eps=a["eps"], weight_decay=a["weight_decay"])
        self.opt_state = jax.device_put(opt.init(self.params), dev)

        member_losses = jax.vmap(member_loss, in_axes=(0, None, None))

        def total(params, x, y):
            losses = member_losses(params, x, y)
            return losses.sum(), losses

        def step(params, opt_state, x, y):
            (_, losses), grads = jax.value_and_grad(total, has_aux=True)(params, x, y)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, losses

        def steps(params, opt_state, x, y):
            def body(carry, _):
                params, opt_state, losses = step(*carry, x, y)
                return (params, opt_state), losses

            (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), None, length=unroll,
                                                       unroll=True if unroll_scan else 1)
            return params, opt_state, losses  # losses (U, K)

        if unroll == 1:
            self.impl = "optax.adamw, one step per jit call, donated buffers"
            self._call = jax.jit(step, donate_argnums=(0, 1))
        else:
            self.impl = (f"optax.adamw, lax.scan over {unroll} steps per jit call"
                         + (" (unroll=True)" if unroll_scan else "") + ", carry donated")
            self._call = jax.jit(steps, donate_argnums=(0, 1))
        if is_cnn(ref):
            self.impl += (f", im2col (conv_general_dilated_patches + matmul) {layout}" if conv == "im2col"
                          else f", lax.conv_general_dilated {layout}")

    def _cnn(self, ref, layout, conv, put):
        """The CNN member's loss, its parameters ((convs), (head)) stacked over members, x and y.
        layout NCHW: x (B, C, H[, W]), weights OIHW as stored; NHWC: x (B, H[, W], C) and
        weights HWIO, transposed once here (channels last again before the flatten, so the
        head's weights keep torch's (C, H, W) order)."""
        jax, jnp, lax = self.jax, self.jax.numpy, self.jax.lax
        import optax
        w = ref["workload"]
        shape, kernel, window = tuple(w["input_shape"]), w["kernel_size"], w["pool"]
        spatial = len(shape) - 1
        x = ref["arrays"]["x"].reshape((-1,) + shape)
        convs = conv_layers(ref)
        if layout == "NCHW":
            numbers = ("NCHW", "OIHW", "NCHW") if spatial == 2 else ("NCH", "OIH", "NCH")
            pool_dims, channel_axis = (1, 1) + (window,) * spatial, 1
        elif layout == "NHWC":
            numbers = ("NHWC", "HWIO", "NHWC") if spatial == 2 else ("NHC", "HIO", "NHC")
            x = np.moveaxis(x, 1, -1)
            # (K, Cout, Cin, k[, k]) -> (K, k[, k], Cin, Cout)
            convs = [(np.ascontiguousarray(np.moveaxis(cw, (1, 2), (-1, -2))), cb) for cw, cb in convs]
            pool_dims, channel_axis = (1,) + (window,) * spatial + (1,), -1
        else:
            raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
        params = ([(put(cw), put(cb)) for cw, cb in convs], [(put(hw), put(hb)) for hw, hb in head_layers(ref)])
        pad = [(kernel // 2, kernel // 2)] * spatial
        bias_shape = [1] * (spatial + 2)
        bias_shape[channel_axis] = -1

        def member_loss(params, x, y):
            convs, head = params
            h = x
            for cw, cb in convs:
                if conv == "im2col":  # patches (B, Cin*k^d, ...) in (Cin, k...) order, as OIHW's rows
                    patches = lax.conv_general_dilated_patches(h, (kernel,) * spatial, (1,) * spatial, pad,
                                                               dimension_numbers=numbers,
                                                               precision=lax.Precision.HIGHEST)
                    if layout == "NCHW":
                        h = jnp.einsum("bp...,op->bo...", patches, cw.reshape(cw.shape[0], -1),
                                       precision=lax.Precision.HIGHEST)
                    else:  # HWIO weights back to (Cin, k...) rows
                        rows = jnp.moveaxis(cw, (-1, -2), (0, 1)).reshape(cw.shape[-1], -1)
                        h = jnp.einsum("b...p,op->b...o", patches, rows, precision=lax.Precision.HIGHEST)
                else:
                    h = lax.conv_general_dilated(h, cw, (1,) * spatial, pad, dimension_numbers=numbers,
                                                 precision=lax.Precision.HIGHEST)
                h = jax.nn.relu(h + cb.reshape(bias_shape))
                h = lax.reduce_window(h, -jnp.inf, lax.max, pool_dims, pool_dims, "VALID")
            if layout == "NHWC":
                h = jnp.moveaxis(h, -1, 1)
            h = h.reshape(h.shape[0], -1)  # (B, C*H*W), torch's Flatten order
            for i, (hw, hb) in enumerate(head):
                h = h @ hw + hb
                if i + 1 < len(head):
                    h = jax.nn.relu(h)
            return optax.softmax_cross_entropy_with_integer_labels(h.astype(jnp.float32), y).mean()

        y = ref["arrays"]["y"].astype(np.int32)
        self.layout = layout
        return member_loss, params, put(x), put(y)

    def step(self):
        self.params, self.opt_state, losses = self._call(self.params, self.opt_state, self.x, self.y)
        self.steps_done += self.unroll
        return losses

    def losses_to_numpy(self, losses):
        return np.atleast_2d(np.asarray(losses, dtype=np.float64))  # (steps, K)

    def synchronize(self):
        self.jax.block_until_ready(self.params)


class Unsupported(Exception):
    """The peer cannot run on this machine (stated in the results, not an error)."""


PEERS = {"torch-loop": TorchPeer, "torch-vmap": TorchPeer, "torch-compile": TorchPeer,
         "torch-cudagraph": TorchPeer, "jax": JaxPeer}


# --- float64 reference ---------------------------------------------------------

BIAS_CORRECTIONS = ("float64", "float32")


def float32_bias_correction(adamw, t):
    """torch.optim.AdamW's lr, eps and weight decay for step t (from 1) such that the update
    it applies — it computes bc1 = 1 - beta1^t and bc2 = 1 - beta2^t in double — is AdamW's
    with bc1', bc2' computed in float32 (float32 betas, float32 power), as optax and torch's
    compiled or capturable AdamW compute them:

        p <- p (1 - lr wd) - lr / bc1' * m / (sqrt(v) / sqrt(bc2') + eps)

    which torch.optim.AdamW applies with lr_t = lr r bc1 / bc1', eps_t = eps r and
    wd_t = wd lr / lr_t, r = sqrt(bc2' / bc2). (beta2 = 0.999 is 0.99900001 in float32 and
    1 - beta2^t cancels: bc2' is off by 1e-5 relative and more, the step size by half that.)"""
    f32 = np.float32
    beta1, beta2, lr = adamw["beta1"], adamw["beta2"], adamw["lr"]
    bc1, bc2 = 1 - beta1 ** t, 1 - beta2 ** t
    bc1_f32 = float(f32(1) - f32(beta1) ** f32(t))
    bc2_f32 = float(f32(1) - f32(beta2) ** f32(t))
    r = math.sqrt(bc2_f32 / bc2)
    lr_t = lr * r * bc1 / bc1_f32
    return {"lr": lr_t, "eps": adamw["eps"] * r, "weight_decay": adamw["weight_decay"] * lr / lr_t}


FLOAT64_CACHE_VERSION = b"float64_losses 1"  # change with float64_losses' arithmetic: old caches go unread


def manifest_key(directory):
    """A digest of the reference's content (manifest and tensors): the float64 cache's key."""
    digest = hashlib.sha256(FLOAT64_CACHE_VERSION)
    with open(os.path.join(directory, "manifest.json"), "rb") as f:
        manifest = f.read()
    digest.update(manifest)
    for t in sorted(json.loads(manifest)["tensors"].values(), key=lambda t: t["file"]):
        with open(os.path.join(directory, t["file"]), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def float64_losses(directory, bias_correction="float64", device="cpu"):
    """The reference's training in float64: the same initial weights (cast), batch, AdamW
    hyperparameters (the manifest's, never a --perturb-lr) and steps, run by the torch-vmap
    peer's own code (TorchPeer, AdamW foreach) in float64. bias_correction "float32" computes
    AdamW's 1 - beta^t as float32 arithmetic does (float32_bias_correction). Returns the
    per-member losses (steps, K); cached in the directory as
    float64_losses_<bias_correction>_<manifest_key>.npy."""
    if bias_correction not in BIAS_CORRECTIONS:
        raise ValueError(f"bias_correction must be one of {BIAS_CORRECTIONS}, got {bias_correction!r}")
    import torch
    cache = os.path.join(directory, f"float64_losses_{bias_correction}_{manifest_key(directory)}.npy")
    if os.path.exists(cache):
        return np.load(cache)
    ref = load_reference(directory)
    peer = TorchPeer(ref, device, "torch-vmap", "foreach", dtype=torch.float64)
    rows = []
    for t in range(1, ref["losses"].shape[0] + 1):
        if bias_correction == "float32":
            peer.optimizer.param_groups[0].update(float32_bias_correction(ref["adamw"], t))
        rows.append(peer.losses_to_numpy(peer.step()))
    losses = np.concatenate(rows)  # (steps, K)
    try:
        partial = f"{cache}.{os.getpid()}.partial.npy"
        np.save(partial, losses)
        os.replace(partial, cache)
    except OSError as e:  # a read-only reference directory: the curve is still right, only not kept
        print(f"peers: float64 curve not cached in {directory} ({e}); it is computed again next time",
              file=sys.stderr)
    return losses


def check_bf16(peer, ref):
    """check() for bf16-mixed peers: every step's losses against packtrain's bf16-mixed
    curve, the median member within BF16_RTOL and the worst within BF16_WORST_RTOL."""
    expected = ref["losses"]
    rows = []
    while sum(len(r) for r in rows) < expected.shape[0]:
        rows.append(peer.losses_to_numpy(peer.step()))
    got = np.concatenate(rows)[:expected.shape[0]]
    deviation = member_deviations(got, expected)  # (K)
    median, worst = float(np.median(deviation)), float(deviation.max())
    return {"steps": int(expected.shape[0]), "steps_run": int(sum(len(r) for r in rows)),
            "rtol": BF16_RTOL, "worst_rtol": BF16_WORST_RTOL, "median_member_rel_dev": median,
            "max_rel_error": worst, "passed": bool(median <= BF16_RTOL and worst <= BF16_WORST_RTOL),
            "criterion": "packtrain bf16-mixed"}


def member_deviations(curve, reference):
    """Each member's max over steps of |curve - reference| / |reference|, (K); inf where
    the curve is not finite."""
    dev = np.abs(curve - reference) / np.maximum(np.abs(reference), 1e-12)
    return np.where(np.all(np.isfinite(curve), axis=0), dev.max(axis=0), np.inf)


def check(peer, ref, float64=None):
    """Calls step() until it has taken the reference's number of steps (a peer that
    takes U steps per call may take a few more), then compares every step's losses.

    Passes by criterion "packtrain" when every loss is within rtol/atol of packtrain's.
    Else, given float64 (a function: bias_correction -> the float64 curve (steps, K); main
    passes float64_losses of this reference), by criterion "float64" when every loss is
    finite and the peer is no further from float64 training of its own AdamW arithmetic
    (its bias_correction) than packtrain is from float64 training of its own (double bias
    corrections), by two measures of each member's max relative deviation over the steps:
      - the worst member:   peer's <= max(FLOAT64_FACTOR x packtrain's, rtol)
      - the median member:  peer's <= max(FLOAT64_FACTOR x packtrain's, rtol)
    Why these bounds (20 steps, batch 128, measured on CPU): training amplifies float32
    rounding chaotically in a few members of a deep, wide pack (depth 3, hidden 512, K 64:
    1e-6 to 3e-2 across members), and the worst member measures that scale: honest float32
    curves — eager torch on a permuted batch, JAX and torch.compile against their own float64
    curves — came within 3.9x of packtrain's (torch.compile at depth 3, hidden 512, K 8);
    FLOAT64_FACTOR is twice that. A learning rate 1% off moved the worst member only 6x
    packtrain's (depth 3, hidden 256, K 64), but the median member — which honest curves keep
    at 1e-7 to 2e-5 — 5x to 500x past rtol at every shape; 0.1% off, 1.6x to 300x past it,
    except at depth 2, hidden 16 (K 4, batch 32, the test's shape) and depth 3, hidden 32,
    where it is within rtol of packtrain's curve as well. The float64 curves are computed
    only when the first criterion fails."""
    expected = ref["losses"]
    rows = []
    while sum(len(r) for r in rows) < expected.shape[0]:
        rows.append(peer.losses_to_numpy(peer.step()))
    got = np.concatenate(rows)[:expected.shape[0]]
    error = np.abs(got - expected)
    bound = RTOL * np.abs(expected) + ATOL
    worst = np.unravel_index(np.argmax(error / bound), error.shape)
    finite = bool(np.all(np.isfinite(got)))
    within = bool(np.all(error <= bound)) and finite
    result = {
        "steps": int(expected.shape[0]),
        "steps_run": int(sum(len(r) for r in rows)),
        "rtol": RTOL,
        "atol": ATOL,
        "passed": within,
        "criterion": "packtrain" if within else None,
        "max_abs_error": float(error.max()),
        "max_rel_error": float((error / np.maximum(np.abs(expected), 1e-12)).max()),
        "worst": {"step": int(worst[0]), "member": int(worst[1]), "expected": float(expected[worst]),
                  "got": float(got[worst])},
    }
    if within or float64 is None or not finite:
        return result
    bias_correction = getattr(peer, "bias_correction", "float64")
    exact = float64("float64")
    own = exact if bias_correction == "float64" else float64(bias_correction)
    packtrain_dev = member_deviations(expected, exact)  # (K)
    peer_dev = member_deviations(got, own)  # (K)
    measures = {}
    for name, stat in (("max", np.max), ("median", np.median)):
        allowed = max(FLOAT64_FACTOR * float(stat(packtrain_dev)), RTOL)
        measures[name] = {"packtrain_rel_dev": float(stat(packtrain_dev)), "peer_rel_dev": float(stat(peer_dev)),
                          "bound": allowed, "passed": bool(stat(peer_dev) <= allowed)}
    passed = all(m["passed"] for m in measures.values())
    result["float64"] = {
        "peer_bias_correction": bias_correction,  # the float64 curve the peer is measured from
        "factor": FLOAT64_FACTOR,
        # packtrain's and the peer's max relative deviation from float64 (every step, every member)
        "packtrain_max_rel_dev": measures["max"]["packtrain_rel_dev"],
        "peer_max_rel_dev": measures["max"]["peer_rel_dev"],
        "peer_max_rel_dev_double_bias_correction": float(member_deviations(got, exact).max()),
        "worst_member": measures["max"],
        "median_member": measures["median"],
        "passed": passed,
    }
    if passed:
        result["passed"], result["criterion"] = True, "float64"
    return result


def time_steps(peer, members, repeats, min_time):
    """Median member-steps/s over `repeats` runs of n calls of step(), n chosen so
    that a run takes at least `min_time` seconds (after the check's steps warmed
    everything). Every training step counts: U per call for the unrolled peers."""
    peer.step()
    peer.synchronize()
    t0, before = time.perf_counter(), peer.steps_done
    peer.step()
    peer.synchronize()
    one, steps_per_call = time.perf_counter() - t0, peer.steps_done - before
    n = max(1, math.ceil(min_time / max(one, 1e-9)))
    rates = []
    for _ in range(repeats):
        t0, before = time.perf_counter(), peer.steps_done
        for _ in range(n):
            peer.step()
        peer.synchronize()
        rates.append((peer.steps_done - before) * members / (time.perf_counter() - t0))
    rate = statistics.median(rates)
    return {"member_steps_per_s": rate, "runs": rates, "calls_per_run": n, "steps_per_call": steps_per_call,
            "steps_per_run": n * steps_per_call, "seconds_per_step": members / rate}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peer", choices=sorted(PEERS))
    ap.add_argument("manifest_dir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--impl", default="foreach", choices=["foreach", "fused"],
                    help="torch.optim.AdamW implementation for the stacked peers")
    ap.add_argument("--unroll", type=int, default=1,
                    help="steps per call: per graph replay (torch-cudagraph), per jitted lax.scan (jax)")
    ap.add_argument("--unroll-scan", action="store_true", help="jax: lax.scan(..., unroll=True)")
    ap.add_argument("--jax-layout", default="NCHW", choices=["NCHW", "NHWC"],
                    help="jax, CNN workloads: the convolutions' layout (NCHW/OIHW or NHWC/HWIO)")
    ap.add_argument("--jax-conv", default="lax", choices=["lax", "im2col"],
                    help="jax, CNN workloads: lax.conv_general_dilated, or patches + matmul")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"],
                    help="the peer's arithmetic; bf16-mixed is checked against a bf16-mixed reference "
                         "(packtrain_peers reference --precision bf16-mixed) by check_bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per timed run, at least")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--perturb-lr", type=float, default=1.0,
                    help="multiply the learning rate (a self-test: the check must then fail)")
    args = ap.parse_args()
    if args.unroll < 1:
        ap.error(f"--unroll must be at least 1, got {args.unroll}")
    if args.unroll != 1 and args.peer not in ("torch-cudagraph", "jax"):
        ap.error(f"--unroll {args.unroll}: only torch-cudagraph and jax take several steps per call, not {args.peer}")
    if args.unroll_scan and (args.peer != "jax" or args.unroll == 1):
        ap.error("--unroll-scan unrolls jax's lax.scan: it needs the jax peer and --unroll U > 1")
    ref = load_reference(args.manifest_dir)
    if ref.get("precision", "fp32") != args.precision:
        ap.error(f"the reference in {args.manifest_dir} trained in {ref.get('precision', 'fp32')}, not {args.precision}")
    ref["adamw"]["lr"] *= args.perturb_lr
    result = {"peer": args.peer, "unroll": args.unroll, "precision": args.precision}
    try:
        if args.peer == "jax":
            peer = JaxPeer(ref, args.device, args.peer, args.impl, args.unroll, args.unroll_scan, args.jax_layout,
                           args.jax_conv, precision=args.precision)
        else:
            peer = TorchPeer(ref, args.device, args.peer, args.impl, args.unroll, precision=args.precision)
    except Unsupported as e:
        result["unsupported"] = str(e)
        print(json.dumps(result))
        return 0
    result["impl"] = peer.impl
    if args.precision == "bf16-mixed":  # no float64 curve of bfloat16 arithmetic: packtrain's
        result["check"] = check_bf16(peer, ref)
    else:
        result["check"] = check(peer, ref, lambda bias_correction: float64_losses(args.manifest_dir, bias_correction,
                                                                                  args.device))
    if result["check"]["passed"] and not args.check_only:
        result["timing"] = time_steps(peer, ref["workload"]["members"], args.repeats, args.min_time)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
