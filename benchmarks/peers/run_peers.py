#!/usr/bin/env python3
"""packtrain against what users would run instead, on packtrain_bench's workloads.

The workloads are the shapes users train: depth 1, 2, 3 x hidden 32, 64, 256, 512 x
K = 1, 8, 64, 512, 4096 at batch 128 (packtrain_bench's grid, bench_workload.h),
less the packs whose weights, gradients and two AdamW moments exceed 1 GiB (named
in the results); --depths, --hiddens and --members narrow it. The CLI's default
shape (`packtrain train`: depth 2, hidden 64) is marked in the table.

For every workload (members, hidden width, batch, depth):
  1. packtrain_bench times packtrain (median of --repeats repetitions): on CPU its
     eager step (PackedEager, the fused member-wise step), on a GPU the trainer's
     captured, unrolled step (PackedGraphUnrolled, U steps per replay; PackedGraph,
     one step per replay, is kept in the JSON). Each row's achieved GFLOP/s (the
     step's GEMM FLOPs, the benchmark's gflops counter) is set against the
     machine's measured FP32 GEMM rate — on CPU, CpuGemmRate in the same
     packtrain_bench run (a 2048^3 at::mm on all threads); on a GPU, n/a;
  2. `packtrain_peers reference` writes the workload's initial weights, batch and
     packtrain's loss curve over --check-steps steps;
  3. every peer variant (benchmarks/peers/peers.py, each in its own process) trains
     the same members from the same weights, must reproduce that loss curve within
     the stated tolerance — or, failing that, be no further from the same training
     in float64 than packtrain's curve is (peers.py's float64 criterion; such figures
     are marked and their deviations listed) — and only then is timed; a peer that
     fails is refused and its speed is not reported. Each system's figure is its
     fastest variant that passed — each peer at its best as its documentation
     recommends: JAX with U steps per jitted call (lax.scan), PyTorch's whole step
     captured with torch.cuda.graphs, U steps per replay — with U packtrain's own
     unroll.
Writes results.json, results.md (each peer / packtrain, the best peer per row and
its ratio, packtrain's GFLOP/s and its fraction of the GEMM rate, and the verdict:
does packtrain lead the best peer by at least 1.2x at every K >= 8 row that ran)
and results.svg (member-steps/s against members, log-log, at the CLI's default
shape) into --out, after every variant and at the end, also when the run is cut
short.

Order and time budget: the peers' fastest forms run first on every workload, the
workloads in the order K = 8, 64, 512, 4096 at the CLI's default shape, then K >= 8
at the other shapes (by K, depth, hidden), then K < 8; then the other variants, the
Python loop last. With --time-budget S, a variant starts only if the time so far
plus its estimate (its time on the last workload it ran, scaled to this one; a
prior before that) fits in S; otherwise it is recorded as "not run: time budget".
A running variant is stopped at the budget.

--model cnn: the CNN rows instead (issue 38) — packtrain's default cnn shape (conv
blocks of 32 and 64 channels, kernel 3 "same", ReLU, max-pool 2, flatten, a 64-wide ReLU
hidden layer, 10 logits, cross-entropy) on the digits network's input (1x8x8) and
MNIST-1D's (1x40) (--networks), K = 1, 8, 64, 512 (--members), batch 128, AdamW as
above. packtrain's figure there is the trainer's step itself (runtime::EnsembleSteps
over PackedCNN, eager on CPU), timed by `packtrain_peers reference --model cnn
--time-repeats` right before the row's peers run (packtrain_bench has no CNN step);
the results go to results/<cpu|gpu>-cnn/ (results.svg: the digits network,
results_mnist1d.svg: MNIST-1D). --threads N runs every system (packtrain, PyTorch,
JAX's XLA) on N threads.

Usage: run_peers.py [--build-dir build] [--out DIR] [--device auto|cpu|cuda]
                    [--model mlp|cnn] [--networks digits,mnist1d] [--threads N]
                    [--repeats 5] [--min-time 0.3] [--check-steps 20] [--unroll U]
                    [--depths 1,2,3] [--hiddens 32,64,256,512] [--members 1,8,64]
                    [--peers torch-loop,jax:scan,...] [--time-budget SECONDS]
Run it through benchmarks/peers/run.sh, which builds packtrain and prepares Python.
"""
import argparse
import collections
import datetime
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, HERE)
import bench_ratio  # noqa: E402  (scripts/bench_ratio.py: Google Benchmark JSON -> rates)
import peers  # noqa: E402

# The systems in the table, in order, and the variants each one is the best of.
SYSTEMS = [
    ("PyTorch loop", ["torch-loop"]),
    ("torch.func vmap", ["torch-vmap:foreach", "torch-vmap:fused"]),
    ("vmap + torch.compile / CUDA graph", ["torch-compile", "torch-cudagraph", "torch-cudagraph:unrolled"]),
    ("JAX vmap + jit", ["jax", "jax:scan", "jax:scan-unrolled"]),
]
# The order the variants run in, tier by tier over all workloads: first each peer's
# documented fastest form (U steps per call, as packtrain's figure; on CPU eager vmap
# with the fused AdamW, which outran torch.compile there: 12.7 k against 6.6 k
# member-steps/s at depth 2, hidden 64, K 64, 2026-11-23), which decides the verdict;
# then the forms that may still beat them (the scan unrolled, JAX's one-step call,
# torch.compile); then the forms that run the same kernels as a faster one (one step
# per graph replay, the foreach AdamW); the Python loop (slowest, longest) last.
TIERS = [
    ["torch-cudagraph:unrolled", "jax:scan", "torch-vmap:fused"],
    ["jax:scan-unrolled", "jax", "torch-compile"],
    ["torch-cudagraph", "torch-vmap:foreach"],
    ["torch-loop"],
]
UNROLLED = {"torch-cudagraph:unrolled", "jax:scan", "jax:scan-unrolled"}
# packtrain's default unroll, runtime::kDefaultUnroll (runtime/trainers/ensemble/ensemble_steps.h),
# which packtrain_bench uses unless PACKTRAIN_BENCH_UNROLL says otherwise; on a GPU the
# benchmark's JSON context states the U it ran, and that is used.
DEFAULT_UNROLL = 8
CLI_DEPTH, CLI_HIDDEN = 2, 64  # `packtrain train`'s default shape (runtime/cli/trainer_flags.cpp)
# glibc's malloc as runtime::retain_freed_cpu_memory sets it for packtrain (mmap
# threshold 32 MiB, trim threshold 1 GiB, no mmap): on a CPU every peer runs with it.
CPU_ALLOCATOR = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_max=0"
LEAD = 1.2  # the verdict: packtrain at least this many times the best peer at every K >= 8
BUDGET_RESERVE_S = 5  # kept back from --time-budget for writing the results and the plot
NOT_RUN_BUDGET = "not run: time budget"
NO_CUDA_GRAPHS_ON_CPU = "not run: torch.cuda.graphs needs a CUDA device"  # peers.py says the same


def say(message):
    print(f"[peers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    """SIGTERM or SIGINT: stop, write what was measured."""


def on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


# --- variants ---------------------------------------------------------------------

def peer_arguments(variant, unroll, compile_impl):
    """peers.py's peer name and options for one variant."""
    return {
        "torch-loop": ["torch-loop"],
        "torch-vmap:foreach": ["torch-vmap", "--impl", "foreach"],
        "torch-vmap:fused": ["torch-vmap", "--impl", "fused"],
        "torch-compile": ["torch-compile", "--impl", compile_impl],
        "torch-cudagraph": ["torch-cudagraph"],
        "torch-cudagraph:unrolled": ["torch-cudagraph", "--unroll", str(unroll)],
        "jax": ["jax"],
        "jax:scan": ["jax", "--unroll", str(unroll)],
        "jax:scan-unrolled": ["jax", "--unroll", str(unroll), "--unroll-scan"],
    }[variant]


def form(variant, unroll):
    """What a reader calls the variant: 'JAX lax.scan U=8'."""
    return {
        "torch-loop": "Python loop, torch.optim.AdamW per member",
        "torch-vmap:foreach": "torch.func vmap, AdamW foreach",
        "torch-vmap:fused": "torch.func vmap, AdamW fused",
        "torch-compile": "torch.compile reduce-overhead",  # its AdamW: --compile-impl
        "torch-cudagraph": "torch.cuda.graphs U=1",
        "torch-cudagraph:unrolled": f"torch.cuda.graphs U={unroll}",
        "jax": "JAX jit, 1 step per call",
        "jax:scan": f"JAX lax.scan U={unroll}",
        "jax:scan-unrolled": f"JAX lax.scan U={unroll} (unroll=True)",
    }[variant]


def selected(variant, args, unroll):
    if unroll == 1 and variant in UNROLLED:
        return False  # the same as the one-step variant
    return args.peers is None or variant in args.peers or variant.split(":")[0] in args.peers


def steps_per_call(variant, unroll):
    return unroll if variant in UNROLLED else 1


# --- workloads --------------------------------------------------------------------

def parse_workload(rest):
    fields = dict(part.split(":") for part in rest.split("/") if ":" in part)
    return {k: int(v) for k, v in fields.items()}


CNN_NETWORKS = {"digits": (1, 8, 8), "mnist1d": (1, 40)}  # the input shapes (packtrain_peers --network)
CNN_CHANNELS, CNN_KERNEL, CNN_HIDDEN, CNN_CLASSES = (32, 64), 3, 64, 10  # packtrain's default cnn shape
CNN_MEMBERS = [1, 8, 64, 512]


def is_cnn(w):
    return w.get("model") == "cnn"


def workload_key(w):
    if is_cnn(w):
        return f"cnn_{w['network']}_k{w['members']}_b{w['batch']}"
    return f"k{w['members']}_h{w['hidden']}_b{w['batch']}_d{w['depth']}"


def cli_default(w):
    return not is_cnn(w) and w["depth"] == CLI_DEPTH and w["hidden"] == CLI_HIDDEN


def label(w):
    """'K 8' at the CLI's default shape, else 'K 8 (depth 1, hidden 32)'; CNN rows 'digits K 8'."""
    if is_cnn(w):
        return f"{w['network']} K {w['members']}"
    return f"K {w['members']}" + ("" if cli_default(w) else f" (depth {w['depth']}, hidden {w['hidden']})")


def cnn_macs(w):
    """Multiply-adds of one member's forward on one row (convolutions and head)."""
    shape = CNN_NETWORKS[w["network"]]
    spatial, channels, macs = list(shape[1:]), shape[0], 0
    for out in CNN_CHANNELS:
        pixels = math.prod(spatial)
        macs += pixels * out * channels * CNN_KERNEL ** len(spatial)
        spatial = [d // 2 for d in spatial]
        channels = out
    flat = channels * math.prod(spatial)
    return macs + flat * CNN_HIDDEN + CNN_HIDDEN * CNN_CLASSES


def priority_order(workloads):
    """K >= 8 at the CLI's default shape by K (8, 64, 512, 4096), then K >= 8 at the
    other shapes (by K, depth, hidden: the cheaper first), then K < 8: a run cut
    short has answered 'does packtrain lead at K >= 8' where users train most."""
    return sorted(workloads, key=lambda w: (0 if w["members"] >= 8 and cli_default(w) else 1 if w["members"] >= 8
                                            else 2, w["members"], w.get("network", ""), w.get("depth", 0),
                                            w.get("hidden", 0)))


def plan(workloads, args, unroll):
    """[(workload, variant)] in the order they run."""
    order = []
    for tier in TIERS:
        for w in priority_order(workloads):
            order += [(w, v) for v in tier if selected(v, args, unroll)]
    return order


# --- time budget ----------------------------------------------------------------

class Budget:
    """--time-budget: a variant starts only if the time so far plus its estimate fits.

    Estimate: a variant's fixed cost (start-up, compile, capture) plus its stepping
    — the check's steps, the calibration and `repeats` runs of at least min_time —
    at its seconds per step. Both come from the variant's last run, its step time
    scaled to the new workload (by members for the Python loop, by members x batch
    x parameters otherwise); before its first run, from a prior."""

    def __init__(self, seconds, args, device):
        self.seconds = seconds
        self.start = time.perf_counter()
        self.args, self.device = args, device
        self.seen = {}  # variant -> (workload, fixed_s, seconds_per_step or None)
        self.reference_s = 5.0

    def elapsed(self):
        return time.perf_counter() - self.start

    def left(self):
        return math.inf if self.seconds is None else self.seconds - self.elapsed() - BUDGET_RESERVE_S

    def stepping(self, t, per_call):
        a = self.args
        return (a.check_steps + 2 * per_call) * t + a.repeats * max(a.min_time, per_call * t)

    @staticmethod
    def work(w):
        if is_cnn(w):
            return w["members"] * w["batch"] * cnn_macs(w)
        h = w["hidden"]
        return w["members"] * w["batch"] * (8 * h + (w["depth"] - 1) * h * h + 2 * h + 1)

    def prior(self, variant, w):
        gpu = self.device != "cpu"
        if variant == "torch-compile":
            fixed = 90.0 if gpu else 60.0
        elif variant.startswith("jax"):
            fixed = 25.0 if gpu else 10.0
        else:
            fixed = 15.0 if gpu else 5.0
        if is_cnn(w):  # forward + two backward products at ~10 GFLOP/s on a CPU thread
            t = self.work(w) * 6 / (1e12 if gpu else 1e10) + w["members"] * (1e-3 if variant == "torch-loop" else 0)
        elif variant == "torch-loop":
            t = w["members"] * (1e-3 if gpu else 5e-4)
        else:
            t = max(1e-4, self.work(w) * 3e-12) if gpu else max(1e-3, self.work(w) * 1.2e-10)
        return fixed, t

    def estimate(self, variant, w, unroll):
        per_call = steps_per_call(variant, unroll)
        if variant in self.seen:
            seen_w, fixed, t = self.seen[variant]
            if t is None:
                t = self.prior(variant, w)[1]
            elif variant == "torch-loop":
                t *= w["members"] / seen_w["members"]
            else:
                t *= self.work(w) / self.work(seen_w)
        else:
            fixed, t = self.prior(variant, w)
        return fixed + self.stepping(t, per_call)

    def record(self, variant, w, unroll, wall_s, result):
        t = result.get("timing", {}).get("seconds_per_step")
        fixed = wall_s - self.stepping(t, steps_per_call(variant, unroll)) if t else wall_s
        self.seen[variant] = (w, max(0.0, fixed), t)


# --- running ----------------------------------------------------------------------

def bench_filter(args, device):
    """packtrain_bench's --benchmark_filter: the packed family over the selected
    shapes; on CPU also CpuGemmRate, the machine's GEMM rate."""
    # On a GPU the figure is PackedGraphUnrolled (PackedGraph kept beside it).
    families = "PackedEager" if device == "cpu" else "PackedGraph"
    pick = lambda values: "|".join(str(v) for v in values) if values else "[0-9]+"
    packed = (f"^({families})[A-Za-z]*/members:({pick(args.members)})/hidden:({pick(args.hiddens)})/batch:[0-9]+"
              f"/depth:({pick(args.depths)})(/|$)")
    return packed + ("|^CpuGemmRate(/|$)" if device == "cpu" else "")


def selected_shape(args, shape):
    """Whether "members:K/hidden:H/batch:B/depth:D" is among --members, --hiddens, --depths."""
    w = parse_workload(shape)
    return all(not chosen or w[field] in chosen
               for field, chosen in (("members", args.members), ("hidden", args.hiddens), ("depth", args.depths)))


def gemm_rate(report):
    """CpuGemmRate's gflops and threads (the median when repetitions ran), or None."""
    runs = [b for b in report["benchmarks"] if b.get("run_name", b["name"]).startswith("CpuGemmRate")
            and "gflops" in b and not b.get("error_occurred")]
    medians = [b for b in runs if b.get("aggregate_name") == "median"]
    runs = medians or [b for b in runs if "aggregate_name" not in b]
    if not runs:
        return None
    threads = runs[0].get("threads")
    return {"gflops": statistics.median(b["gflops"] for b in runs), "threads": int(threads) if threads else None}


def selection_error(args, device):
    """Why the selection has no workload in packtrain_bench's grid, or None."""
    listed = subprocess.run([os.path.join(args.build_dir, "bin", "packtrain_bench"), "--benchmark_list_tests",
                             f"--benchmark_filter={bench_filter(args, device)}"], capture_output=True, text=True,
                            env=dict(os.environ, PACKTRAIN_BENCH_DEVICE=device))
    if listed.returncode == 0 and any(line.startswith("Packed") for line in listed.stdout.splitlines()):
        return None
    depth = os.environ.get("PACKTRAIN_BENCH_DEPTH")
    return ("no packtrain_bench workload matches --members/--hiddens/--depths"
            + (f" and PACKTRAIN_BENCH_DEPTH={depth}" if depth else "") + ": the grid is depth 1, 2, 3; hidden 32, "
            "64, 256, 512; K 1, 8, 64, 512, 4096; batch 128, less the packs over 1 GiB of training state "
            "(`packtrain_bench --benchmark_list_tests` lists it)")


def workload_filter(w, device):
    """packtrain_bench's --benchmark_filter for one workload's packed family."""
    family = "PackedEager" if device == "cpu" else "PackedGraph"
    return (f"^({family})[A-Za-z]*/members:{w['members']}/hidden:{w['hidden']}/batch:{w['batch']}"
            f"/depth:{w['depth']}(/|$)")


def run_packtrain_bench(args, device, out_json, bench_filter_text=None):
    command = [os.path.join(args.build_dir, "bin", "packtrain_bench"),
               f"--benchmark_filter={bench_filter_text or bench_filter(args, device)}",
               f"--benchmark_repetitions={args.repeats}", f"--benchmark_min_time={args.min_time}",
               "--benchmark_report_aggregates_only=true",
               f"--benchmark_out={out_json}", "--benchmark_out_format=json"]
    env = dict(os.environ, PACKTRAIN_BENCH_DEVICE=device)
    if args.unroll is not None:
        env["PACKTRAIN_BENCH_UNROLL"] = str(args.unroll)
    say("packtrain: " + " ".join(command))
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(out_json) as f:
        report = json.load(f)
    rates, _ = bench_ratio.read_rates(report)
    return report, rates


def run_reference(args, device, workload, directory):
    os.makedirs(directory, exist_ok=True)
    if is_cnn(workload):
        return run_cnn_reference(args, device, workload, directory)["path"]
    command = [os.path.join(args.build_dir, "bin", "packtrain_peers"), "reference",
               "--members", str(workload["members"]), "--hidden", str(workload["hidden"]),
               "--batch", str(workload["batch"]), "--depth", str(workload["depth"]),
               "--steps", str(args.check_steps), "--device", device, "--out", directory]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(directory, "manifest.json")) as f:
        return json.load(f)["path"]


def run_cnn_reference(args, device, workload, directory):
    """packtrain_peers reference --model cnn: the weights, batch and loss curve, and
    packtrain's figure — the trainer's step timed (--time-repeats). Returns the manifest."""
    os.makedirs(directory, exist_ok=True)
    command = [os.path.join(args.build_dir, "bin", "packtrain_peers"), "reference", "--model", "cnn",
               "--network", workload["network"], "--members", str(workload["members"]),
               "--batch", str(workload["batch"]), "--steps", str(args.check_steps), "--device", device,
               "--time-repeats", str(args.repeats), "--min-time", str(args.min_time), "--out", directory]
    say("packtrain: " + " ".join(command))
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(directory, "manifest.json")) as f:
        return json.load(f)


def kill_group(proc):
    """The peer and whatever it started (torch.compile's workers): its own process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_peer(args, variant, directory, device, unroll, compile_impl, timeout, budget_bound):
    name, *options = peer_arguments(variant, unroll, compile_impl)
    command = [sys.executable, os.path.join(HERE, "peers.py"), name, directory, *options, "--device", device,
               "--repeats", str(args.repeats), "--min-time", str(args.min_time)]
    if name == "jax" and args.model == "cnn":
        command += ["--jax-layout", args.jax_layout, "--jax-conv", args.jax_conv]
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.communicate()
        ran = time.perf_counter() - started
        if budget_bound:
            return {"status": f"{NOT_RUN_BUDGET} (stopped after {ran:.0f} s)"}
        return {"status": f"timed out after {ran:.0f} s"}
    except BaseException:
        kill_group(proc)
        proc.communicate()
        raise
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": f"error: {tail[:300]}"}
    result = json.loads(lines[-1])
    if "unsupported" in result:
        result["status"] = "not run: " + result["unsupported"]
    elif not result["check"]["passed"]:
        c = result["check"]
        result["status"] = (f"refused: loss curve differs from packtrain's (max relative error "
                            f"{c['max_rel_error']:.2e} > rtol {c['rtol']:g})")
        if "float64" in c:
            result["status"] += f" and from float64 by more than packtrain's ({float64_text(c['float64'])})"
    else:
        result["status"] = "ok"
    return result


def float64_text(f):
    """The float64 criterion's measures: 'max rel. deviation from float64: packtrain 6.5e-03,
    peer 1.2e-03 (≤ bound 5.2e-02); median member: packtrain 6.9e-06, peer 5.3e-07 (≤ bound
    1.0e-04)', and which float64 curve the peer was measured from when not packtrain's."""
    parts = []
    for key, name in (("worst_member", "max rel. deviation from float64"), ("median_member", "median member")):
        m = f[key]
        parts.append(f"{name}: packtrain {m['packtrain_rel_dev']:.1e}, peer {m['peer_rel_dev']:.1e} "
                     f"({'≤' if m['passed'] else '>'} bound {m['bound']:.1e})")
    text = "; ".join(parts)
    if f["peer_bias_correction"] != "float64":
        text += f"; the peer's float64 curve with {f['peer_bias_correction']} bias corrections, as its AdamW"
    return text


# --- results ----------------------------------------------------------------------

def summarize(result, variant, unroll):
    out = {"status": result["status"], "form": form(variant, unroll)}
    if "timing" in result:
        out["member_steps_per_s"] = result["timing"]["member_steps_per_s"]
        out["runs"] = result["timing"]["runs"]
        out["steps_per_call"] = result["timing"]["steps_per_call"]
    if "check" in result:
        out["check_max_rel_error"] = result["check"]["max_rel_error"]
        out["check_criterion"] = result["check"].get("criterion")
        if "float64" in result["check"]:
            out["check_float64"] = result["check"]["float64"]
    for key in ("impl", "wall_s", "estimate_s", "load_1min"):
        if key in result:
            out[key] = result[key]
    return out


def best_of(results, unroll):
    """The fastest variant that passed the check; else the variants' statuses."""
    variants = {v: summarize(r, v, unroll) for v, r in results.items()}
    ok = [(v, r) for v, r in results.items() if r["status"] == "ok"]
    if ok:
        variant, result = max(ok, key=lambda vr: vr[1]["timing"]["member_steps_per_s"])
        return {"member_steps_per_s": result["timing"]["member_steps_per_s"], "variant": variant,
                "form": form(variant, unroll), "impl": result.get("impl"), "check": result["check"],
                "status": "ok", "variants": variants}
    statuses = {r["status"] for r in results.values()}
    status = statuses.pop() if len(statuses) == 1 else "; ".join(f"{v}: {r['status']}" for v, r in results.items())
    return {"member_steps_per_s": None, "status": status, "variants": variants}


def unmeasured(status):
    """A variant whose figure is missing for want of a run (time budget, error, a library
    missing), not by the rules: refused by the check, or CUDA graphs on a CPU run."""
    return not (status == "ok" or status.startswith("refused") or status == NO_CUDA_GRAPHS_ON_CPU)


def best_peer(systems):
    """The row's fastest peer with a figure: {"system", "form", "member_steps_per_s",
    "over_packtrain"}, or None when no peer has one."""
    rated = [(name, systems[name]) for name, _ in SYSTEMS if systems[name]["member_steps_per_s"] is not None]
    if not rated:
        return None
    name, s = max(rated, key=lambda ns: ns[1]["member_steps_per_s"])
    return {"system": name, "form": s.get("form"), "member_steps_per_s": s["member_steps_per_s"],
            "over_packtrain": s["member_steps_per_s"] / systems["packtrain"]["member_steps_per_s"]}


def verdict(rows):
    """Does packtrain lead the best peer by at least LEAD at every row with K >= 8?"""
    considered, short, missing, leads = [], [], [], []
    by_workload = {id(r["workload"]): r for r in rows}
    for w in priority_order([r["workload"] for r in rows]):
        if w["members"] < 8:
            continue
        row = by_workload[id(w)]
        where = label(w)
        considered.append(where)
        gaps = [v for name, _ in SYSTEMS for v, r in row["systems"][name].get("variants", {}).items()
                if unmeasured(r["status"])]
        best = best_peer(row["systems"])
        if gaps or best is None:
            missing.append(f"{where}: {', '.join(gaps) or 'no peer passed the check'}")
        if best is None:
            continue
        lead = 1 / best["over_packtrain"]
        leads.append((lead, where))
        if lead < LEAD:
            short.append(f"{where}: {best['system']} ({best['form']}) {best['over_packtrain']:.2f}x packtrain, "
                         f"a lead of {lead:.2f}x")
    least = min(leads) if leads else None
    if not considered:
        text = "not measured (no workload with K ≥ 8 in this run)"
    elif not leads:
        text = "not measured (" + "; ".join(missing) + ")"
    else:
        if short:
            text = "no (" + "; ".join(short) + ")"
        else:
            led = [where for _, where in leads]
            rows_text = ", ".join(led) if len(led) <= 6 else f"all {len(led)} rows with a peer figure"
            if len(led) < len(considered):
                rows_text += f"; {len(considered) - len(led)} of the {len(considered)} rows have none"
            text = f"yes ({rows_text}; least lead {least[0]:.2f}x at {least[1]})"
        if missing:
            text += ("; " if short else " among the variants measured; ") + "not measured: " + "; ".join(missing)
    return {"leads": bool(leads) and not short, "complete": not missing, "margin": LEAD, "workloads": considered,
            "losses": short, "not_measured": missing,
            "least_lead": {"lead": least[0], "workload": least[1]} if least else None,
            "text": f"packtrain leads the best peer by ≥ {LEAD:g}x at every K ≥ 8 row: " + text}


def chosen_forms(rows):
    """['JAX vmap + jit: JAX lax.scan U=8', 'torch.func vmap: ... fused (K 1, K 8); ... foreach (K 512)']"""
    parts = []
    for name, _ in SYSTEMS:
        by_form = {}
        for row in rows:
            chosen = row["systems"][name].get("form")
            if chosen:
                by_form.setdefault(chosen, []).append(label(row["workload"]))
        if len(by_form) == 1:
            parts.append(f"{name}: {next(iter(by_form))}")
        elif by_form:
            parts.append(f"{name}: " + "; ".join(f"{f} ({', '.join(ks)})" for f, ks in by_form.items()))
    return parts


def assemble(state):
    """results.json's content from what has run so far."""
    args, unroll = state["args"], state["unroll"]
    rows = []
    for w in sorted(state["workloads"], key=lambda w: (w.get("network", ""), w.get("depth", 0), w.get("hidden", 0),
                                                       w["members"], w["batch"])):
        key = workload_key(w)
        if state["packtrain"].get(key, {}).get("member_steps_per_s") is None:
            continue  # a CNN row whose reference (packtrain's figure) has not run yet
        systems = {"packtrain": state["packtrain"][key]}
        for name, variants in SYSTEMS:
            chosen = [v for v in variants if selected(v, args, unroll)]
            results = {v: state["results"].get((key, v), {"status": state["pending"]}) for v in chosen}
            systems[name] = best_of(results, unroll) if results else {"member_steps_per_s": None,
                                                                        "status": "not selected"}
        rows.append({"workload": w, "cli_default": cli_default(w), "systems": systems,
                     "best_peer": best_peer(systems)})
    device = state["device"]
    results = {
        "date": state["date"], "device": device, "device_name": state["device_name"], "host": platform.node(),
        "versions": state["versions"], "repeats": args.repeats, "min_time_s": args.min_time,
        "model": args.model, "threads": args.threads,
        "depths": sorted({w["depth"] for w in state["workloads"] if not is_cnn(w)}), "unroll": unroll,
        "cli_default_shape": {"depth": CLI_DEPTH, "hidden": CLI_HIDDEN},
        "gemm": state["gemm"], "skipped_over_memory": state["skipped"],
        "check": {"steps": args.check_steps, "rtol": peers.RTOL, "atol": peers.ATOL,
                  "float64_factor": peers.FLOAT64_FACTOR},
        "packtrain_path": (f"{state['family']}" + (f" (U={unroll} steps per replay)" if device != "cpu" else "")
                           + f" (timed); reference loss curve from {state['packtrain_path'] or 'no workload run'}"),
        "torch_threads": state["torch_threads"], "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "time_budget_s": args.time_budget, "elapsed_s": round(state["budget"].elapsed(), 1),
        "run_order": [f"{workload_key(w)} {v}" for w, v in state["plan"]],
        "error": state.get("error"),
        "rows": rows,
    }
    results["verdict"] = verdict(rows)
    return results


# The compute-limit target: >= 60% of the GEMM rate on the compute-bound rows.
GEMM_TARGET = 0.60


def compute_bound(w):
    return w["depth"] >= 2 and w["hidden"] >= 64 and w["members"] >= 64


def training_state_gb(w):
    """Weights, gradients and two AdamW moments, float32."""
    h, d = w["hidden"], w["depth"]
    params = 8 * h + h + (d - 1) * (h * h + h) + h + 1
    return w["members"] * params * 4 * 4 / 1e9


def bound_note(w):
    """What bounds a compute-bound row under the target, from the profile behind it."""
    if w["hidden"] == 64:
        return ("profile (perf record, depth 2, hidden 64, K 512, 2026-11-23): the 128x64x64 GEMMs are 91% of "
                "the FLOPs and 56% of the time, at 123-142 GFLOP/s on one thread (64-74% of a thread's share of "
                "the GEMM rate: MKL's rate on a 64-wide GEMM); elementwise bias/ReLU/its gradient/column sums/"
                "loss 14%, AdamW 11%, the 8-wide first and 1-wide last layers 8%. 60% needs that non-GEMM 44% "
                "halved at today's GEMM speed. Tried: members handed out in chunks (13% barrier spin -> 1.4%, "
                "adopted), own loops for the 8-wide layer (30 GFLOP/s vs MKL's 77-106, dropped), oneDNN brgemm "
                "for the 128x64x64 GEMM (138-150 vs MKL's 142, dropped)"
                + (f"; at K {w['members']} the training state ({training_state_gb(w):.2f} GB) streams from "
                   "memory every step" if training_state_gb(w) > 0.1 else ""))
    return (f"training state {training_state_gb(w):.2f} GB (weights, gradients, two AdamW moments) that the "
            "optimizer streams through memory every step; the GEMMs themselves ran at 63-74% on the narrower "
            "and smaller rows of this width (not profiled separately)")


def shape_text(w):
    if is_cnn(w):
        return f"cnn {w['network']}, K {w['members']}"
    return f"depth {w['depth']}, hidden {w['hidden']}, K {w['members']}"


def peer_cells(row, names, notes, by_float64, number):
    """A table row's cells for every peer ('rate | ratio', † where the float64 criterion passed it) and
    the best peer; what is missing goes to notes, the float64 passes to by_float64."""
    w, systems, cells = row["workload"], row["systems"], []
    base = systems["packtrain"]["member_steps_per_s"]
    for name in names:
        s = systems[name]
        rate = s["member_steps_per_s"]
        if rate is None:
            cells.append("— | —")
            notes.append(f"{label(w)}: {name}: {s['status']}")
            continue
        check = s.get("check", {})
        dagger = "†" if check.get("criterion") == "float64" else ""
        if dagger:
            by_float64.append(f"{label(w)}: {name} ({s['form']}): {float64_text(check['float64'])}; "
                              f"from packtrain's curve {check['max_rel_error']:.1e}")
        cells.append(f"{number.format(rate)}{dagger} | {rate / base:.2f}x")
        missing = [f"{v} ({r['status']})" for v, r in s["variants"].items() if unmeasured(r["status"])
                   or r["status"].startswith("refused")]
        if missing:
            notes.append(f"{label(w)}: {name}: figure from {s['variant']}; " + ", ".join(missing))
    best = row.get("best_peer")
    cells.append(f"{best['system']} | {best['over_packtrain']:.2f}x" if best else "— | —")
    return cells


def budget_lines(results, names):
    """'Time budget S s (elapsed E s): n of m variant runs not run for it.' or nothing."""
    if results.get("time_budget_s") is None:
        return []
    variants = [r for row in results["rows"] for n in names for r in row["systems"][n].get("variants", {}).values()]
    skipped = sum(1 for r in variants if r["status"].startswith(NOT_RUN_BUDGET))
    return [f"Time budget {results['time_budget_s']:g} s (elapsed {results['elapsed_s']:.0f} s): "
            f"{skipped} of {len(variants)} variant runs not run for it" + (" (listed below)." if skipped else "."), ""]


def write_markdown(results, path):
    if results.get("model") == "cnn":
        return write_markdown_cnn(results, path)
    rows = results["rows"]
    names = [name for name, _ in SYSTEMS]
    gemm = results.get("gemm")
    lines = [f"# packtrain vs peers: {results['device_name']}, {results['date']}", ""]
    if results.get("error"):
        lines += [f"**Run stopped: {results['error']}** — what follows is what was measured before.", ""]
    lines += [f"**{results['verdict']['text']}.**", "",
              "Member-steps/s (one member taking one AdamW step), median of "
              f"{results['repeats']} timed runs; `÷ pt` = peer / packtrain (below 1: packtrain is faster); "
              "`best peer` is the row's fastest peer and `best ÷ pt` its ratio (packtrain leads by "
              f"≥ {LEAD:g}x where it is at most {1 / LEAD:.2f}). "
              f"Same-work check: {results['check']['steps']} steps from the same weights and batch, every "
              f"member's loss within rtol {results['check']['rtol']:g} + atol {results['check']['atol']:g} "
              "of packtrain's — or, where a deep, wide pack amplifies float32 rounding past that, no further "
              "from the same training in float64 than packtrain's own curve is (the float64 criterion: each "
              "member's max relative deviation from the float64 curve over the steps, the peer's worst "
              f"member and its median member each at most {results['check']['float64_factor']:g}x "
              "packtrain's, or rtol; every loss finite; a peer whose AdamW computes the bias corrections "
              "1 - β^t in float32 — JAX's optax, torch.compile's and capturable AdamW — is measured from "
              "float64 training with float32 bias corrections, packtrain from float64 training with double "
              "ones, as it computes them; figures that passed so are marked † and listed below). A peer "
              "that fails both is refused (no figure). Each system's figure is its fastest "
              f"form that passed; U = {results['unroll']} steps per call, packtrain's unroll.", ""]
    lines += budget_lines(results, names)
    lines += ["| depth | hidden | members | batch | packtrain | GFLOP/s | ÷ GEMM | "
              + " | ".join(f"{n} | ÷ pt" for n in names) + " | best peer | best ÷ pt |",
              "|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(names) + "---|---:|"]
    notes, by_float64, bounds = [], [], []
    for row in rows:
        w, systems = row["workload"], row["systems"]
        packtrain = systems["packtrain"]
        base = packtrain["member_steps_per_s"]
        flops = packtrain.get("gflops")
        under = bool(flops and gemm and compute_bound(w) and flops / gemm["gflops"] < GEMM_TARGET)
        if under:
            bounds.append(f"{label(w)}: {flops / gemm['gflops']:.1%}: {bound_note(w)}")
        cells = [f"{flops:,.1f}" if flops else "—",
                 (f"{flops / gemm['gflops']:.1%}" + ("‡" if under else "")) if flops and gemm else "n/a"]
        cells += peer_cells(row, names, notes, by_float64, "{:,.0f}")
        mark = (lambda v: f"**{v}**") if row.get("cli_default") else str
        lines.append(f"| {mark(w['depth'])} | {mark(w['hidden'])} | {w['members']} | {w['batch']} | {base:,.0f} | "
                     + " | ".join(cells) + " |")
    gemm_text = (f"the machine's measured FP32 GEMM rate, {gemm['gflops']:,.1f} GFLOP/s (CpuGemmRate: one 2048³ "
                 f"at::mm through LibTorch's BLAS on {gemm.get('threads') or '?'} threads, in the same "
                 "packtrain_bench run)" if gemm else
                 "the machine's FP32 GEMM rate: n/a (measured on CPU runs only)")
    lines += ["", f"**Bold** depth and hidden: the CLI's default shape (`packtrain train`: depth {CLI_DEPTH}, "
              f"hidden {CLI_HIDDEN}). Depth = hidden layers; 8 inputs, 1 output, ReLU, MSE, AdamW "
              "(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), float32, one fixed batch on the device.",
              "GFLOP/s: packtrain's achieved rate, the step's GEMM FLOPs (forward, weight and input gradients) "
              f"per second; ÷ GEMM: its fraction of {gemm_text}."]
    if results.get("skipped_over_memory"):
        lines.append("Not run, training state (weights, gradients, two AdamW moments) over 1 GiB: "
                     + "; ".join(shape_text(w) for w in results["skipped_over_memory"]) + ".")
    retimed = sum(1 for row in rows if row["systems"]["packtrain"].get("timed_beside_peers"))
    if retimed:
        lines.append(f"packtrain's figure on {retimed} of {len(rows)} rows: timed again right before that row's peers "
                     "(the same packtrain_bench run, filtered to the row), so both sides of a ratio are measured "
                     "minutes apart; the start-of-run figure is kept in results.json.")
    lines += [f"packtrain path: {results['packtrain_path']}.",
              "Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v) + ".",
              "", "Forms used (each system's fastest that passed the check):"]
    lines += [f"- {part}" for part in chosen_forms(rows)] or ["- none"]
    if bounds:
        lines += ["", f"‡ Compute-bound rows (depth ≥ 2, hidden ≥ 64, K ≥ 64) under {GEMM_TARGET:.0%} of the GEMM "
                  "rate, what bounds each and what was tried:"] + [f"- {b}" for b in bounds]
    loads = [v["load_1min"] for row in rows for n in names
             for v in row["systems"][n].get("variants", {}).values() if "load_1min" in v]
    if loads:
        lines += ["", f"1-minute load average at the start of each peer run: {min(loads):.2f}-{max(loads):.2f} "
                  f"({os.cpu_count()} cores; the run itself keeps it near 1-2 here). Another job on the cores "
                  "slows every figure, the peers' OpenMP kernels most: two busy processes beside torch.compile "
                  "at depth 2, hidden 64, K 64 took it from about 6.5 k to 1.0-2.9 k member-steps/s "
                  "(2026-11-23)."]
    if by_float64:
        lines += ["", "† Passed by the float64 criterion (its loss curve more than rtol from packtrain's; each "
                  "side's relative deviation from float64 training, worst and median member, and the bounds):"]
        lines += [f"- {n}" for n in by_float64]
    if notes:
        lines += ["", "Not reported, or not every form measured:"] + [f"- {n}" for n in notes]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_markdown_cnn(results, path):
    """The CNN table: a row per (network, K); packtrain's figure, each peer's and its ratio."""
    rows = results["rows"]
    names = [name for name, _ in SYSTEMS]
    lines = [f"# packtrain vs peers, CNN members: {results['device_name']}, {results['date']}", ""]
    if results.get("error"):
        lines += [f"**Run stopped: {results['error']}** — what follows is what was measured before.", ""]
    threads = results.get("threads")
    lines += [f"**{results['verdict']['text']}.**", "",
              "Member-steps/s (one member taking one AdamW step on a batch of "
              f"{rows[0]['workload']['batch'] if rows else 128} rows), median of {results['repeats']} timed runs "
              f"of at least {results['min_time_s']:g} s; `÷ pt` = peer / packtrain (below 1: packtrain is faster); "
              f"`best ÷ pt` the row's fastest peer over packtrain (packtrain leads by ≥ {LEAD:g}x where it is at "
              f"most {1 / LEAD:.2f}). Every system on {threads or results['torch_threads']} thread(s)"
              + (" (--threads)" if threads else "")
              + (f", glibc malloc `GLIBC_TUNABLES={results['glibc_tunables']}` (as packtrain sets it)"
                 if results.get("glibc_tunables") else "") + ". Same-work check: "
              f"{results['check']['steps']} steps from the same weights and batch, every member's loss within rtol "
              f"{results['check']['rtol']:g} + atol {results['check']['atol']:g} of packtrain's, or the float64 "
              "criterion († , as for the MLP rows: no further from float64 training than packtrain's curve). "
              f"Each system's figure is its fastest form that passed; U = {results['unroll']} steps per call.", ""]
    lines += ["The network: packtrain's default cnn shape (ensemble/packed_cnn.h) — conv blocks of "
              f"{', '.join(map(str, CNN_CHANNELS))} channels, kernel {CNN_KERNEL} \"same\" padding, ReLU, max-pool 2, "
              f"flatten, a {CNN_HIDDEN}-wide ReLU hidden layer, {CNN_CLASSES} logits, cross-entropy; digits: input "
              "1x8x8 (Conv2d), MNIST-1D: input 1x40 (Conv1d). AdamW lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay "
              "0.01, float32, one fixed seeded batch (normal inputs, uniform labels) on the device. packtrain: "
              "the trainer's step (runtime::EnsembleSteps over PackedCNN: the members' convolutions as one grouped "
              "convolution each), timed by `packtrain_peers reference --model cnn --time-repeats` right before "
              "the row's peers.", ""]
    lines += budget_lines(results, names)
    lines += ["| network | members | packtrain | GFLOP/s | " + " | ".join(f"{n} | ÷ pt" for n in names)
              + " | best peer | best ÷ pt |", "|---|---:|---:|---:|" + "---:|---:|" * len(names) + "---|---:|"]
    notes, by_float64 = [], []
    for row in rows:
        w, systems = row["workload"], row["systems"]
        base = systems["packtrain"]["member_steps_per_s"]
        cells = [f"{base * w['batch'] * cnn_macs(w) * 6 / 1e9:,.1f}"]
        cells += peer_cells(row, names, notes, by_float64, "{:,.1f}")
        lines.append(f"| {w['network']} | {w['members']} | {base:,.1f} | " + " | ".join(cells) + " |")
    lines += ["", "GFLOP/s: packtrain's achieved rate counting forward, input- and weight-gradient multiply-adds "
              "of every convolution and linear layer (6 FLOPs per forward multiply-add; the first convolution's "
              "input gradient, which no one computes, included: an upper bound).",
              f"packtrain path: {results['packtrain_path']}.",
              "Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v) + ".",
              "", "Forms used (each system's fastest that passed the check):"]
    lines += [f"- {part}" for part in chosen_forms(rows)] or ["- none"]
    loads = [v["load_1min"] for row in rows for n in names
             for v in row["systems"][n].get("variants", {}).values() if "load_1min" in v]
    if loads:
        lines += ["", f"1-minute load average at the start of each peer run: {min(loads):.2f}-{max(loads):.2f} "
                  f"({os.cpu_count()} cores, shared with other jobs)."]
    if by_float64:
        lines += ["", "† Passed by the float64 criterion:"] + [f"- {n}" for n in by_float64]
    if notes:
        lines += ["", "Not reported, or not every form measured:"] + [f"- {n}" for n in notes]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def plot_shape(rows):
    """(depth, hidden) of the plot: the CLI's default shape when it ran, else the
    shape with the most rows."""
    shapes = collections.Counter((r["workload"]["depth"], r["workload"]["hidden"]) for r in rows)
    return (CLI_DEPTH, CLI_HIDDEN) if (CLI_DEPTH, CLI_HIDDEN) in shapes else shapes.most_common(1)[0][0]


def write_results(state, plot=False):
    results = assemble(state)
    out = state["out"]
    with open(os.path.join(out, "results.json.partial"), "w") as f:
        json.dump(results, f, indent=1)
    os.replace(os.path.join(out, "results.json.partial"), os.path.join(out, "results.json"))
    write_markdown(results, os.path.join(out, "results.md"))
    if plot:
        if not results["rows"]:
            say("results.svg not drawn: no workload measured")
            return
        if state["args"].model == "cnn":  # one plot per network: results.svg (the first), results_<network>.svg
            networks = [n for n in state["args"].networks if any(r["workload"]["network"] == n
                                                                  for r in results["rows"])]
            for i, network in enumerate(networks):
                svg = "results.svg" if i == 0 else f"results_{network}.svg"
                subprocess.run([os.path.join(state["args"].build_dir, "bin", "packtrain_peers"), "plot",
                                "--results", os.path.join(out, "results.json"), "--out", os.path.join(out, svg),
                                "--network", network], check=True, stdout=subprocess.DEVNULL)
            return
        depth, hidden = plot_shape(results["rows"])
        subprocess.run([os.path.join(state["args"].build_dir, "bin", "packtrain_peers"), "plot", "--results",
                        os.path.join(out, "results.json"), "--out", os.path.join(out, "results.svg"),
                        "--depth", str(depth), "--hidden", str(hidden)], check=True, stdout=subprocess.DEVNULL)


def versions():
    out = {"python": platform.python_version()}
    for module in ("torch", "jax", "jaxlib", "optax", "numpy"):
        try:
            out[module] = __import__(module).__version__
        except Exception:  # not installed: the peer reports itself unsupported
            out[module] = None
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        version = re.search(r"project\(packtrain VERSION ([0-9.]+)", f.read()).group(1)
    try:
        commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except Exception:
        commit = "unknown"
    out["packtrain"] = f"{version} ({commit})"
    return out


def device_name(device):
    if device != "cpu":
        import torch
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = re.search(r"model name\s*:\s*(.*)", f.read()).group(1).strip()
    except Exception:
        pass
    return f"{model}, {os.cpu_count()} cores"


def cnn_workloads(state):
    """The CNN rows (--networks x --members, batch 128); packtrain's figures come with
    each row's reference (run_cnn_reference), right before its peers."""
    args = state["args"]
    for network in args.networks:
        for members in args.members or CNN_MEMBERS:
            w = {"model": "cnn", "network": network, "members": members, "batch": 128}
            state["workloads"].append(w)
            state["packtrain"][workload_key(w)] = {"member_steps_per_s": None, "variant": "EnsembleSteps",
                                                   "status": "not run"}
    state["gemm"] = None


def run_all(state):
    """packtrain_bench, then every (workload, variant) of the plan within the budget."""
    args, device, budget = state["args"], state["device"], state["budget"]
    if args.model == "cnn":
        cnn_workloads(state)
        return run_plan(state)
    report, rates = run_packtrain_bench(args, device, os.path.join(state["work"], "packtrain_bench.json"))
    context = report["context"]
    state["unroll"] = unroll = int(context.get("unroll", state["unroll"]))
    state["gemm"] = gemm_rate(report) if device == "cpu" else None
    state["skipped"] = [parse_workload(shape) for shape in context.get("skipped_over_1gib", "").split(",")
                        if shape and selected_shape(args, shape)]
    family = state["family"]
    for rest in sorted({rest for (f, rest) in rates if f == family},
                       key=lambda r: [int(n) for n in re.findall(r"\d+", r)]):
        w = parse_workload(rest)
        if "depth" not in w:
            raise RuntimeError(f"{family}/{rest}: no depth argument; rebuild packtrain_bench (its workloads take "
                               "members/hidden/batch/depth)")
        state["workloads"].append(w)
        bench = rates[(family, rest)][1]
        packtrain = {"member_steps_per_s": rates[(family, rest)][0], "variant": family, "status": "ok",
                     "gflops": bench.get("gflops")}
        if device != "cpu" and ("PackedGraph", rest) in rates:
            packtrain["PackedGraph_member_steps_per_s"] = rates[("PackedGraph", rest)][0]
        state["packtrain"][workload_key(w)] = packtrain
    run_plan(state)


def run_plan(state):
    """Every (workload, variant) of the plan within the budget; each workload's reference first."""
    args, device, budget, unroll = state["args"], state["device"], state["budget"], state["unroll"]
    state["plan"] = plan(state["workloads"], args, unroll)
    if device == "cpu":  # said before anything runs, so a run cut short does not count them as missing
        for w, variant in state["plan"]:
            if variant.startswith("torch-cudagraph"):
                state["results"][(workload_key(w), variant)] = {"status": NO_CUDA_GRAPHS_ON_CPU}
    write_results(state)
    references = {}
    for i, (w, variant) in enumerate(state["plan"], 1):
        key = workload_key(w)
        where = f"[{i}/{len(state['plan'])}] {shape_text(w)}: {variant}"
        if (key, variant) in state["results"]:
            continue
        estimate = budget.estimate(variant, w, unroll) + (0 if key in references else budget.reference_s)
        if estimate > budget.left():
            state["results"][(key, variant)] = {"status": NOT_RUN_BUDGET, "estimate_s": round(estimate, 1)}
            say(f"{where}: {NOT_RUN_BUDGET} (estimate {estimate:.0f} s, {max(0, budget.left()):.0f} s left)")
            write_results(state)
            continue
        directory = os.path.join(state["work"], key)
        if key not in references:
            started = time.perf_counter()
            if is_cnn(w):
                manifest = run_cnn_reference(args, device, w, directory)
                references[key] = manifest["path"]
                timing = manifest["timing"]
                state["packtrain"][key].update({"member_steps_per_s": timing["member_steps_per_s"], "status": "ok",
                                                "runs": timing["runs"], "unroll": timing["unroll"],
                                                "timed": timing["path"]})
            else:
                retime_packtrain(state, w)
                references[key] = run_reference(args, device, w, directory)
            budget.reference_s = time.perf_counter() - started
            state["packtrain"][key]["reference"] = state["packtrain_path"] = references[key]
        timeout = min(args.peer_timeout, budget.left())
        load = os.getloadavg()[0]  # another job on the cores slows the peers' OpenMP kernels most: said per figure
        started = time.perf_counter()
        result = run_peer(args, variant, directory, device, unroll, args.compile_impl, timeout,
                          budget_bound=timeout < args.peer_timeout)
        result["wall_s"] = round(time.perf_counter() - started, 1)
        result["load_1min"] = round(load, 2)
        result["estimate_s"] = round(estimate, 1)
        budget.record(variant, w, unroll, result["wall_s"], result)
        state["results"][(key, variant)] = result
        rate = result.get("timing", {}).get("member_steps_per_s")
        say(f"{where}: {result['status']}" + (f", {rate:,.0f} member-steps/s" if rate else "")
            + f" ({result['wall_s']:.0f} s, estimated {estimate:.0f} s)")
        write_results(state)


def retime_packtrain(state, w):
    """Times packtrain again on workload `w` right before its peers run, and makes that
    the figure the row's ratios use: a machine shared with other jobs can be slower
    for minutes, and the start-of-run figure is then up to an hour older than the
    peers' (kept as start_of_run_member_steps_per_s)."""
    args, device, key = state["args"], state["device"], workload_key(w)
    out_json = os.path.join(state["work"], f"packtrain_bench_{key}.json")
    _, rates = run_packtrain_bench(args, device, out_json, workload_filter(w, device))
    family = state["family"]
    rest = next((r for (f, r) in rates if f == family), None)
    if rest is None:
        return
    packtrain = state["packtrain"][key]
    packtrain["start_of_run_member_steps_per_s"] = packtrain["member_steps_per_s"]
    packtrain["start_of_run_gflops"] = packtrain.get("gflops")
    packtrain["member_steps_per_s"] = rates[(family, rest)][0]
    packtrain["gflops"] = rates[(family, rest)][1].get("gflops")
    packtrain["timed_beside_peers"] = True


def int_list(text):
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,8,64, got {text!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"),
                    help="a directory with bin/packtrain_bench and bin/packtrain_peers")
    ap.add_argument("--out", default=None, help="output directory (default benchmarks/peers/results/<cpu|gpu>)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--check-steps", type=int, default=20)
    ap.add_argument("--unroll", type=int, default=None,
                    help="U, steps per call for packtrain (PACKTRAIN_BENCH_UNROLL) and the peers' unrolled forms "
                         f"(default: packtrain's, {DEFAULT_UNROLL})")
    ap.add_argument("--members", type=int_list, default=None,
                    help="only these member counts (comma-separated; default the grid's 1,8,64,512,4096)")
    ap.add_argument("--hiddens", type=int_list, default=None,
                    help="only these hidden widths (comma-separated; default the grid's 32,64,256,512)")
    ap.add_argument("--depths", type=int_list, default=None,
                    help="only these depths, hidden layers (comma-separated; default the grid's 1,2,3)")
    ap.add_argument("--peers", type=lambda s: s.split(","), default=None,
                    help="only these systems' variants, e.g. torch-loop,jax (all jax forms),jax:scan")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds for the whole run: a variant that would not fit is recorded as not run")
    ap.add_argument("--peer-timeout", type=int, default=1800, help="seconds per peer and workload")
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"],
                    help="mlp: packtrain_bench's MLP grid; cnn: the CNN rows (digits and MNIST-1D networks)")
    ap.add_argument("--networks", type=lambda s: s.split(","), default=list(CNN_NETWORKS),
                    help="--model cnn: these networks (comma-separated; default digits,mnist1d)")
    ap.add_argument("--jax-layout", default="NCHW", choices=["NCHW", "NHWC"],
                    help="--model cnn: the JAX peer's convolution layout")
    ap.add_argument("--jax-conv", default="im2col", choices=["lax", "im2col"],
                    help="--model cnn: the JAX peer's convolutions: lax.conv_general_dilated (vmap: grouped), or "
                         "patches + matmul (vmap: batched matmul; 3.7x faster on CPU at digits K 8, 2026-11-27)")
    ap.add_argument("--threads", type=int, default=None,
                    help="run every system on this many threads (OMP/MKL threads; XLA's CPU threads)")
    ap.add_argument("--compile-impl", default="foreach", choices=["foreach", "fused"],
                    help="AdamW implementation under torch.compile (foreach: inductor fuses its kernels)")
    args = ap.parse_args()
    if args.unroll is not None and args.unroll < 1:
        ap.error(f"--unroll must be at least 1, got {args.unroll}")
    args.build_dir = os.path.abspath(args.build_dir)
    for binary in ("packtrain_bench", "packtrain_peers"):
        if not os.access(os.path.join(args.build_dir, "bin", binary), os.X_OK):
            ap.error(f"{args.build_dir}/bin/{binary} not found: build it (cmake --build BUILD --target "
                     "packtrain_bench packtrain_peers) or pass --build-dir (run.sh: PACKTRAIN_BUILD_DIR)")
    for network in args.networks:
        if network not in CNN_NETWORKS:
            ap.error(f"--networks: {network!r} is not one of {', '.join(CNN_NETWORKS)}")
    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads must be at least 1, got {args.threads}")
        # Before torch loads here; the children (packtrain_bench/_peers, peers.py) inherit it.
        os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        if args.threads == 1:
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                       "intra_op_parallelism_threads=1").strip()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    device = args.device
    import torch
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and "GLIBC_TUNABLES" not in os.environ:
        # Every system keeps its freed CPU memory as packtrain does
        # (runtime::retain_freed_cpu_memory, which packtrain's binaries call): the
        # peers' processes inherit the same glibc settings.
        os.environ["GLIBC_TUNABLES"] = CPU_ALLOCATOR
    why = selection_error(args, device) if args.model == "mlp" else None
    if why:
        ap.error(why)
    out = os.path.abspath(args.out or os.path.join(HERE, "results", ("gpu" if device == "cuda" else "cpu")
                                                   + ("-cnn" if args.model == "cnn" else "")))
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    state = {
        "args": args, "device": device, "out": out, "work": work,
        "budget": Budget(args.time_budget, args, device),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device_name": device_name(device), "versions": versions(), "torch_threads": torch.get_num_threads(),
        "family": ("EnsembleSteps" if args.model == "cnn" else "PackedEager" if device == "cpu"
                   else "PackedGraphUnrolled"),
        "unroll": args.unroll or int(os.environ.get("PACKTRAIN_BENCH_UNROLL", DEFAULT_UNROLL)),
        "gemm": None, "skipped": [], "packtrain_path": None, "workloads": [], "packtrain": {}, "plan": [], "results": {},
        "pending": "not run: interrupted",
    }
    status = 0
    try:
        run_all(state)
    except Interrupted as e:
        state["error"] = f"interrupted ({e})"
        status = 130
    except Exception as e:
        state["error"] = f"{type(e).__name__}: {e}"
        status = 1
        raise
    finally:
        if state.get("error"):
            say(f"stopped: {state['error']}; writing what was measured")
        write_results(state, plot=True)
        say(f"wrote {out}/results.md, results.json, results.svg")
    with open(os.path.join(out, "results.md")) as f:
        print(f.read())
    return status


if __name__ == "__main__":
    sys.exit(main())
