#!/usr/bin/env python3
"""bf16-mixed on the compute-bound rows (issue 40, item 3), side by side in one run.

Rows: the peers grid's MLP rows with depth >= 2, hidden >= 256 and K >= 64 within its
1 GiB state limit (bench_workload.h): the regression MLP, batch 128, AdamW. For each:
  - packtrain_bench's CpuTrainStepPrecision: packtrain fp32 (the fused member-wise
    step), bf16-mixed as the trainer runs it (on a CPU with bfloat16 matrix units,
    autograd under LibTorch's autocast: oneDNN's bfloat16 kernels; without them the
    fused step), and bf16-mixed in the fused step (float32 GEMMs of bfloat16-rounded
    operands) — with CpuGemmRate and CpuBf16GemmRate, the float32 and bfloat16 2048^3
    GEMM rates measured in the same process (the rows' limits);
  - the peers in bfloat16 (benchmarks/peers/peers.py --precision bf16-mixed), each in
    its own process, after packtrain_peers reference --precision bf16-mixed wrote the
    row's weights, batch and packtrain's bf16-mixed loss curve: torch.func (vmap +
    functional_call, AdamW foreach) and torch.compile (mode reduce-overhead) under
    torch.autocast(bfloat16), and JAX (vmap + jit, lax.scan over --unroll steps,
    optax.adamw) with a bfloat16 compute policy (parameters and inputs cast to
    bfloat16 in the loss, float32 master weights). A peer whose loss curve is not
    packtrain's to within peers.check_bf16's bounds is refused and not timed.
Writes results.json and results.md to --out: per row each system's ms per step
(median), GFLOP/s (the step's GEMM FLOPs) and its fraction of the bfloat16 GEMM rate,
bf16-mixed against packtrain fp32 and against the best peer.

Run through benchmarks/precision/run_bf16.sh (the peers' Python environment).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PEERS = os.path.join(ROOT, "benchmarks", "peers", "peers.py")
INPUTS, OUTPUTS, BATCH = 8, 1, 128  # bench_workload.h
STATE_LIMIT = 1024.0**3
ROUTES = {0: "fp32", 1: "bf16-mixed", 2: "bf16-mixed fused"}


def member_parameters(hidden, depth):
    total, width = 0, INPUTS
    for layer in range(depth + 1):
        out = hidden if layer < depth else OUTPUTS
        total += width * out + out
        width = out
    return total


def step_flops(hidden, depth, members):
    """The step's GEMM FLOPs (bench_workload.h's step_flops x members)."""
    macs, above_first, width = 0, 0, INPUTS
    for layer in range(depth + 1):
        out = hidden if layer < depth else OUTPUTS
        macs += width * out
        if layer > 0:
            above_first += width * out
        width = out
    return 2.0 * BATCH * (2 * macs + above_first) * members


def rows(depths, hiddens, members):
    return [(d, h, k) for d in depths for h in hiddens for k in members
            if 16.0 * k * member_parameters(h, d) <= STATE_LIMIT]


def say(text):
    print(f"[bf16] {text}", file=sys.stderr, flush=True)


def packtrain_bench(build, repetitions):
    command = [os.path.join(build, "bin", "packtrain_bench"),
               "--benchmark_filter=^(CpuGemmRate|CpuBf16GemmRate|CpuTrainStepPrecision/)",
               f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true",
               "--benchmark_format=json"]
    say(" ".join(command))
    report = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    medians = [b for b in report["benchmarks"] if b.get("aggregate_name") == "median"]
    rates = {b["run_name"]: b["gflops"] for b in medians if b["run_name"].startswith(("CpuGemmRate", "CpuBf16Gemm"))}
    steps = {}
    for b in medians:
        if not b["run_name"].startswith("CpuTrainStepPrecision/"):
            continue
        args = dict(part.split(":") for part in b["run_name"].split("/")[1:] if ":" in part)
        key = (int(args["depth"]), int(args["hidden"]), int(args["members"]))
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        steps.setdefault(key, {})[ROUTES[int(args["precision"])]] = {
            "seconds_per_step": b["real_time"] * unit, "gflops": b["gflops"]}
    return {"fp32_gemm_gflops": rates.get("CpuGemmRate/min_time:1.000"),
            "bf16_gemm_gflops": rates.get("CpuBf16GemmRate/min_time:1.000"),
            "context": report["context"], "rows": steps}


def run_peer(args, peer, directory, unroll):
    command = [sys.executable, PEERS, peer, directory, "--device", "cpu", "--precision", "bf16-mixed",
               "--repeats", str(args.repeats), "--min-time", str(args.min_time)]
    if unroll > 1:
        command += ["--unroll", str(unroll)]
    say(" ".join(command[1:]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.peer_timeout)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-600:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_markdown(results, path):
    bench = results["packtrain"]
    limit = bench["bf16_gemm_gflops"]
    lines = [f"# bf16-mixed on the compute-bound rows: {results['machine']}, {results['date']}", "",
             f"Command: `{results['command']}` (packtrain {results['commit']}). Batch 128, 8 inputs, 1 output, "
             "MSE, AdamW; ms per training step of all K members (median); GFLOP/s: the step's GEMM FLOPs per "
             f"second. Limits measured in the same packtrain_bench run: float32 GEMM {bench['fp32_gemm_gflops']:.1f} "
             f"GFLOP/s, bfloat16 GEMM {limit:.1f} GFLOP/s (2048^3 at::mm, {results['threads']} thread(s)). Peers "
             "in bfloat16 (torch.autocast; JAX: a bfloat16 compute policy), each checked against packtrain's "
             f"bf16-mixed loss curve over 20 steps (each member's max relative deviation: the median member's "
             f"<= {results['bf16_rtol']:g}, the worst's <= {results['bf16_worst_rtol']:g}) before it is timed.", "",
             "| depth | hidden | K | packtrain fp32 ms | bf16-mixed ms | bf16-mixed fused ms | torch.func bf16 ms "
             "| torch.compile bf16 ms | JAX bf16 ms | bf16-mixed / fp32 | bf16-mixed / best bf16 peer "
             "| bf16-mixed GFLOP/s (of bf16 GEMM) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in results["rows"]:
        p = row["packtrain"]
        ms = {name: p[name]["seconds_per_step"] * 1e3 for name in p}
        peer_ms = {}
        for name, r in row["peers"].items():
            timing = r.get("timing")
            peer_ms[name] = timing["seconds_per_step"] * 1e3 if timing else None

        def cell(name, source):
            v = source.get(name)
            if v is None:
                r = row["peers"].get(name, {})
                return "refused" if "check" in r else ("n/a" if "unsupported" in r else "failed")
            return f"{v:.1f}"
        best_peer = min((v for v in peer_ms.values() if v is not None), default=None)
        mixed = ms.get("bf16-mixed")
        gf = p["bf16-mixed"]["gflops"]
        lines.append(
            f"| {row['depth']} | {row['hidden']} | {row['members']} | {ms['fp32']:.1f} | {mixed:.1f} | "
            f"{ms['bf16-mixed fused']:.1f} | {cell('torch-vmap', peer_ms)} | {cell('torch-compile', peer_ms)} | "
            f"{cell('jax', peer_ms)} | {ms['fp32'] / mixed:.2f}x | "
            f"{(best_peer / mixed) if best_peer else float('nan'):.2f}x | {gf:.1f} ({gf / limit:.0%}) |")
    lines += ["", "Targets (issue 40): bf16-mixed >= 2x packtrain fp32, >= 1.2x the best peer in bfloat16, "
              ">= 60% of the bfloat16 GEMM rate."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--depths", default="2,3")
    ap.add_argument("--hiddens", default="256,512")
    ap.add_argument("--members", default="64,512")
    ap.add_argument("--peers", default="torch-vmap,torch-compile,jax")
    ap.add_argument("--unroll", type=int, default=4, help="JAX: steps per jitted lax.scan")
    ap.add_argument("--repetitions", type=int, default=3, help="packtrain_bench repetitions (the median is kept)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per peer (the median is kept)")
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--peer-timeout", type=float, default=900)
    args = ap.parse_args()
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    selected = rows(ints(args.depths), ints(args.hiddens), ints(args.members))
    os.makedirs(args.out, exist_ok=True)
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    import peers as peer_module  # noqa: E402  (benchmarks/peers on sys.path below)
    results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
               "threads": int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())),
               "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "commit": commit,
               "bf16_rtol": peer_module.BF16_RTOL, "bf16_worst_rtol": peer_module.BF16_WORST_RTOL, "rows": []}
    results["packtrain"] = packtrain_bench(args.build_dir, args.repetitions)
    # The rows' weights and batches (hundreds of MB at K 512): a temporary directory.
    scratch = tempfile.TemporaryDirectory(prefix="packtrain-bf16-rows-")
    references = scratch.name
    for depth, hidden, members in selected:
        directory = os.path.join(references, f"d{depth}_h{hidden}_k{members}")
        subprocess.run([os.path.join(args.build_dir, "bin", "packtrain_peers"), "reference", "--members",
                        str(members), "--hidden", str(hidden), "--depth", str(depth), "--batch", str(BATCH),
                        "--steps", "20", "--device", "cpu", "--precision", "bf16-mixed", "--out", directory],
                       check=True, stdout=subprocess.DEVNULL)
        row = {"depth": depth, "hidden": hidden, "members": members,
               "packtrain": results["packtrain"]["rows"][(depth, hidden, members)], "peers": {}}
        for peer in args.peers.split(","):
            row["peers"][peer] = run_peer(args, peer, directory, args.unroll if peer == "jax" else 1)
            say(f"d{depth} h{hidden} K{members} {peer}: {json.dumps(row['peers'][peer].get('timing', row['peers'][peer]))[:300]}")
        results["rows"].append(row)
        serializable = dict(results, packtrain={**results["packtrain"], "rows": {
            f"{d},{h},{k}": v for (d, h, k), v in results["packtrain"]["rows"].items()}})
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(serializable, f, indent=1)
        write_markdown(results, os.path.join(args.out, "results.md"))
    print(open(os.path.join(args.out, "results.md")).read())
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))
    sys.exit(main())
