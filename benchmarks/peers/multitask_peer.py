#!/usr/bin/env python3
"""packtrain's multi-task transformer step in plain PyTorch, timed on the CPU.

The peer of `packtrain_bench`'s `MultiTaskShared` (benchmarks/multitask_bench.cpp):
ensemble::multitask_train_step on one PackedTransformer (K = 1 member) — one trunk
forward, the classification head and the causal-LM head on its output, the summed
loss (weights 1, 1), one backward, one AdamW update — written as a PyTorch user
would: an nn.Module, F.scaled_dot_product_attention(is_causal=True),
F.cross_entropy, torch.optim.AdamW, float32.

Model (ensemble/packed_transformer.{h,cpp}, PackedTransformerOptions defaults except
what the bench sets): vocab 259 (bytes + 3 specials), width d, `layers` pre-norm
blocks [LN -> qkv Linear(d, 3d) -> causal SDPA over `heads` heads -> Linear(d, d),
residual; LN -> Linear(d, 4d) -> exact (erf) GELU -> Linear(4d, d), residual],
learned positions for max(seq, 128) positions, final LN (eps 1e-5 everywhere);
classifier Linear(d, 2) on each row's last real token (lengths - 1); LM logits =
hidden @ token_embedding^T (tied, no bias), next-token cross-entropy averaged over
the batch's real targets (position t < length - 1). AdamW lr 1e-4, betas
(0.9, 0.999), eps 1e-8, weight decay 1e-2 on every parameter (one group).

Data (as the bench): a CPU generator seeded 1 draws tokens (B, T) in [0, 256), lengths
(B) in [T/2, T] and labels (B) in {0, 1}, in that order — the same ATen calls, so the
same values. Initial weights: packtrain's own (GPT-2 scheme, drawn exactly as
PackedTransformer::reinitialize does with seed 0, so the first-step losses can be
compared with packtrain's), not that timing depends on them.

Variants (each from the same initial weights; their first two steps' losses are
compared with the first variant's):
  eager/foreach           eager step, AdamW(foreach=True)
  eager/fused             eager step, AdamW(fused=True)
  compile/fused           torch.compile(forward + both losses) (backward through
                          AOTAutograd), AdamW(fused=True) eager
  compile/compiled-opt    the same, and AdamW(foreach=True).step under torch.compile
  max-autotune/fused      as compile/fused with mode="max-autotune-no-cudagraphs"
  max-autotune/compiled-opt
Compile time (the first call, warm-up steps excluded) is reported apart from the timing.
Timing: after --warmup steps, --repeats runs of --steps steps each; a run's ms/step is
its wall time / steps; the figure is the median over runs.

Like packtrain_bench's main (runtime/measure/cpu_memory.h), the process first raises glibc's
M_MMAP_THRESHOLD (32 MiB) and M_TRIM_THRESHOLD (1 GiB) so freed activation buffers
are reused rather than returned to the kernel (--no-retain-memory: leave malloc as is).

Usage:
  multitask_peer.py [--width 256 --layers 4 --heads 8 --batch 32 --seq 64]
                    [--steps 5 --repeats 5 --warmup 2 --threads N]
                    [--variants eager/foreach,compile/fused,...] [--no-compile] [--smoke]
Defaults follow the bench, PACKTRAIN_BENCH_MT_{LAYERS,WIDTH,SEQ,BATCH} included.
"""
import argparse
import copy
import ctypes
import ctypes.util
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 259
CLASSES = 2
MLP_RATIO = 4
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-8, 1e-2
W_CLS, W_LM = 1.0, 1.0  # TaskWeights{} in the bench
ALL_VARIANTS = ["eager/foreach", "eager/fused", "compile/fused", "compile/compiled-opt",
                "max-autotune/fused", "max-autotune/compiled-opt"]
MODES = {"compile": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def env_or(name, fallback):
    v = os.environ.get(name)
    return int(v) if v is not None else fallback


def retain_freed_cpu_memory():
    """glibc mallopt(M_MMAP_THRESHOLD, 32 MiB), mallopt(M_TRIM_THRESHOLD, 1 GiB), as packtrain_bench."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1
    except (OSError, AttributeError):
        return False


# --- the model ------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, MLP_RATIO * d)
        self.proj = nn.Linear(MLP_RATIO * d, d)

    def forward(self, x):  # (B, T, d)
        B, T, d = x.shape
        H = self.heads
        # qkv columns are [3][H][dh], as packtrain's view (K, B, T, 3, H, dh).
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)  # (B, H, T, dh)
        x = x + self.out(attended.transpose(1, 2).reshape(B, T, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class MultiTaskTransformer(nn.Module):
    def __init__(self, width, layers, heads, max_length):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, width)
        self.pos_emb = nn.Embedding(max_length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        self.cls = nn.Linear(width, CLASSES)
        # LM head tied to tok_emb (tie_lm_head = true): no parameters of its own.

    def trunk(self, tokens):  # (B, T) -> (B, T, d)
        T = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb.weight[:T]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def losses(self, tokens, lengths, labels):
        """Both tasks' mean losses from one trunk forward (multitask_losses, shared batch)."""
        hidden = self.trunk(tokens)
        B, T, _ = hidden.shape
        pooled = hidden[torch.arange(B, device=tokens.device), lengths - 1]  # last real token
        cls_loss = F.cross_entropy(self.cls(pooled), labels)
        logits = hidden @ self.tok_emb.weight.t()  # (B, T, V), as packtrain's lm_logits
        targets = tokens[:, 1:].masked_fill(
            torch.arange(T - 1, device=tokens.device).view(1, -1) >= (lengths - 1).view(-1, 1), -100)
        lm_loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
        return cls_loss, lm_loss


def cpp_parameter_count(width, layers, max_length):
    """PackedTransformer's per-member parameter count (transformer_specs, tied LM head)."""
    d, r = width, MLP_RATIO * width
    per_block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * r + r) + (r * d + d)
    return VOCAB * d + max_length * d + layers * per_block + 2 * d + (d * CLASSES + CLASSES)


def member_seed(seed, member):
    """ensemble/member_seed.h: splitmix64 of (seed, member)."""
    mask = (1 << 64) - 1
    z = (seed + 0x9E3779B97F4A7C15 * (member + 1)) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


@torch.no_grad()
def packtrain_init(model, layers, seed=0):
    """PackedTransformer::reinitialize(seed) for member 0: one flat row in
    transformer_specs order, drawn slot by slot from member_seed(seed, 0); packtrain
    stores linear weights as (in, out) (x @ W), nn.Linear as (out, in)."""
    specs = [("tok_emb.weight", model.tok_emb.weight, False), ("pos_emb.weight", model.pos_emb.weight, False)]
    for i, b in enumerate(model.blocks):
        specs += [(f"block{i}.ln1.weight", b.ln1.weight, False), (f"block{i}.ln1.bias", b.ln1.bias, False),
                  (f"block{i}.attn.qkv.weight", b.qkv.weight, True), (f"block{i}.attn.qkv.bias", b.qkv.bias, False),
                  (f"block{i}.attn.out.weight", b.out.weight, True), (f"block{i}.attn.out.bias", b.out.bias, False),
                  (f"block{i}.ln2.weight", b.ln2.weight, False), (f"block{i}.ln2.bias", b.ln2.bias, False),
                  (f"block{i}.mlp.fc.weight", b.fc.weight, True), (f"block{i}.mlp.fc.bias", b.fc.bias, False),
                  (f"block{i}.mlp.proj.weight", b.proj.weight, True), (f"block{i}.mlp.proj.bias", b.proj.bias, False)]
    specs += [("ln_f.weight", model.ln_f.weight, False), ("ln_f.bias", model.ln_f.bias, False),
              ("cls.weight", model.cls.weight, True), ("cls.bias", model.cls.bias, False)]
    generator = torch.Generator().manual_seed(member_seed(seed, 0))
    residual_std = 0.02 / math.sqrt(2.0 * layers)
    row = torch.empty(sum(p.numel() for _, p, _ in specs), dtype=torch.float32)
    offset = 0
    for name, p, transposed in specs:
        slot = row.narrow(0, offset, p.numel())
        offset += p.numel()
        if ".ln" in name or name.startswith("ln_f"):
            slot.fill_(1.0 if name.endswith(".weight") else 0.0)
        elif name.endswith(".bias"):
            slot.zero_()
        else:
            residual = name.endswith("attn.out.weight") or name.endswith("mlp.proj.weight")
            slot.normal_(0.0, residual_std if residual else 0.02, generator=generator)
        value = slot.view(p.shape[::-1]).t() if transposed else slot.view(p.shape)
        p.copy_(value)


def bench_inputs(batch, seq):
    """multitask_bench.cpp inputs(): the same draws from a CPU generator seeded 1."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (batch, seq), generator=g, dtype=torch.long)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g, dtype=torch.long)
    labels = torch.randint(0, 2, (batch,), generator=g, dtype=torch.long)
    return tokens, lengths, labels


# --- a variant's step -----------------------------------------------------------------

def make_step(variant, reference, data):
    """Returns (step, model): step() runs one full training step and returns the
    detached (classification, language-model) losses."""
    model = copy.deepcopy(reference)
    kind, opt_kind = variant.split("/")
    compile_opt = opt_kind == "compiled-opt"
    options = {"fused": True} if opt_kind == "fused" else {"foreach": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                  weight_decay=WEIGHT_DECAY, **options)
    tokens, lengths, labels = data

    def losses():
        cls_loss, lm_loss = model.losses(tokens, lengths, labels)
        return cls_loss * W_CLS + lm_loss * W_LM, cls_loss, lm_loss

    if kind == "eager":
        forward, opt_step = losses, optimizer.step
    else:
        forward = torch.compile(losses, mode=MODES[kind])
        if compile_opt:
            @torch.compile(mode=MODES[kind])
            def opt_step():
                optimizer.step()
        else:
            opt_step = optimizer.step

    def step():
        optimizer.zero_grad(set_to_none=True)
        total, cls_loss, lm_loss = forward()
        total.backward()
        opt_step()
        return cls_loss.detach(), lm_loss.detach()

    return step, model


def run_variant(variant, reference, data, args):
    step, _ = make_step(variant, reference, data)
    start = time.perf_counter()
    first = [float(x) for x in step()]  # compiles, for the compiled forms
    first_call_s = time.perf_counter() - start
    second = [float(x) for x in step()]
    for _ in range(max(0, args.warmup - 2)):
        step()
    runs = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        runs.append((time.perf_counter() - start) * 1000.0 / args.steps)
    return {"variant": variant, "first_call_s": first_call_s, "losses": [first, second],
            "ms": statistics.median(runs), "runs": runs}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=env_or("PACKTRAIN_BENCH_MT_WIDTH", 256))
    p.add_argument("--layers", type=int, default=env_or("PACKTRAIN_BENCH_MT_LAYERS", 4))
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=env_or("PACKTRAIN_BENCH_MT_BATCH", 32))
    p.add_argument("--seq", type=int, default=env_or("PACKTRAIN_BENCH_MT_SEQ", 64))
    p.add_argument("--max-length", type=int, default=None, help="positions (default max(seq, 128), as the bench)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per run")
    p.add_argument("--repeats", type=int, default=5, help="timed runs; the figure is their median")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 2: the loss check's)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--variants", default=",".join(ALL_VARIANTS), help="comma-separated, of: " + ", ".join(ALL_VARIANTS))
    p.add_argument("--no-compile", action="store_true", help="only the eager variants")
    p.add_argument("--no-retain-memory", action="store_true", help="leave glibc's malloc thresholds as they are")
    p.add_argument("--smoke", action="store_true",
                   help="width 16, 1 layer, batch 4, seq 16, 2 steps x 1 run, eager only (unless --variants)")
    args = p.parse_args()
    explicit_variants = any(a == "--variants" or a.startswith("--variants=") for a in sys.argv[1:])
    if args.smoke:
        args.width, args.layers, args.batch, args.seq = 16, 1, 4, 16
        args.steps, args.repeats, args.warmup = 2, 1, 2
        if not explicit_variants:
            args.no_compile = True
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in ALL_VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {ALL_VARIANTS}")
    if args.no_compile:
        variants = [v for v in variants if v.startswith("eager/")]
    if args.width % args.heads:
        p.error(f"width {args.width} is not a multiple of heads {args.heads}")
    if args.seq < 2:
        p.error("seq must be >= 2")
    max_length = args.max_length or max(args.seq, 128)
    retained = False if args.no_retain_memory else retain_freed_cpu_memory()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    reference = MultiTaskTransformer(args.width, args.layers, args.heads, max_length)
    packtrain_init(reference, args.layers)
    data = bench_inputs(args.batch, args.seq)
    n_torch = sum(p.numel() for p in reference.parameters())
    n_cpp = cpp_parameter_count(args.width, args.layers, max_length)

    print(f"multitask peer: torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, float32, "
          f"malloc thresholds {'raised' if retained else 'default'}")
    print(f"shape: layers {args.layers}, width {args.width}, heads {args.heads}, seq {args.seq}, batch {args.batch}, "
          f"max_length {max_length}, vocab {VOCAB}, mlp {MLP_RATIO}x, K = 1 member")
    print(f"parameters: PyTorch {n_torch:,}  packtrain (transformer_specs arithmetic) {n_cpp:,}  "
          f"{'equal' if n_torch == n_cpp else 'DIFFERENT'}")
    print(f"timing: {args.warmup} warm-up steps, median of {args.repeats} runs x {args.steps} steps", flush=True)

    results = []
    for variant in variants:
        try:
            r = run_variant(variant, reference, data, args)
        except Exception as e:  # a compile mode that does not work here: report, go on
            print(f"  {variant}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            results.append({"variant": variant, "error": f"{type(e).__name__}"})
            continue
        results.append(r)
        print(f"  {variant}: {r['ms']:.2f} ms/step (runs {', '.join(f'{x:.2f}' for x in r['runs'])}), "
              f"first call {r['first_call_s']:.2f} s, losses step 1 cls {r['losses'][0][0]:.6f} "
              f"lm {r['losses'][0][1]:.6f}", flush=True)

    ok = [r for r in results if "error" not in r]
    if not ok:
        return 1
    base = ok[0]["losses"]
    print()
    print(f"| {'variant':<26} | {'ms/step (median)':>16} | {'steps/s':>8} | {'compile s':>9} | {'loss check':>13} |")
    print(f"|{'-' * 28}|{'-' * 18}|{'-' * 10}|{'-' * 11}|{'-' * 15}|")
    status = 0
    for r in results:
        if "error" in r:
            print(f"| {r['variant']:<26} | {'failed: ' + r['error']:>16} | {'':>8} | {'':>9} | {'':>13} |")
            continue
        err = max(abs(a - b) / max(abs(b), 1e-6) for s, t in zip(r["losses"], base) for a, b in zip(s, t))
        check = f"rel {err:.1e}" if err <= 1e-3 else f"MISMATCH {err:.0e}"
        if err > 1e-3:
            status = 1
        compile_s = f"{r['first_call_s']:.1f}" if not r["variant"].startswith("eager") else "-"
        print(f"| {r['variant']:<26} | {r['ms']:>16.2f} | {1000.0 / r['ms']:>8.2f} | {compile_s:>9} | {check:>13} |")
    best = min(ok, key=lambda r: r["ms"])
    print(f"\nbest: {best['variant']}, {best['ms']:.2f} ms/step, {1000.0 / best['ms']:.2f} steps/s "
          f"(compare MultiTaskShared's real_time in ms / items_per_second)")
    print("losses at step 1 (before any update) from packtrain's initial weights: "
          f"cls {base[0][0]:.6f}, lm {base[0][1]:.6f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
