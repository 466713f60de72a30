#!/usr/bin/env python3
"""packtrain against what users would run instead, on packtrain_bench's workloads.

For every workload packtrain_bench measures (members, hidden width, batch, depth):
  1. packtrain_bench times packtrain (median of --repeats repetitions): on CPU its
     eager step (PackedEager, the fused member-wise step), on a GPU the trainer's
     captured, unrolled step (PackedGraphUnrolled; PackedGraph is kept in the JSON);
  2. `packtrain_peers reference` writes the workload's initial weights, batch and
     packtrain's loss curve over --check-steps steps;
  3. every peer (benchmarks/peers/peers.py, each in its own process) trains the
     same members from the same weights, must reproduce that loss curve within the
     stated tolerance, and only then is timed; a peer that fails is refused and its
     speed is not reported.
Writes results.json, results.md and results.svg (member-steps/s against members,
log-log, one line per system) into --out.

Usage: run_peers.py [--build-dir build] [--out DIR] [--device auto|cpu|cuda]
                    [--repeats 5] [--min-time 0.3] [--check-steps 20]
                    [--members 1,8,64] [--peers torch-loop,torch-vmap,...]
Run it through benchmarks/peers/run.sh, which builds packtrain and prepares Python.
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, HERE)
import bench_ratio  # noqa: E402  (scripts/bench_ratio.py: Google Benchmark JSON -> rates)
import peers  # noqa: E402

# The systems in the table, in order, and the peers.py variants each one is the best of.
SYSTEMS = [
    ("PyTorch loop", ["torch-loop"]),
    ("torch.func vmap", ["torch-vmap:foreach", "torch-vmap:fused"]),
    ("vmap + torch.compile / CUDA graph", ["torch-compile", "torch-cudagraph"]),
    ("JAX vmap + jit", ["jax"]),
]


def say(message):
    print(f"[peers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_workload(rest):
    fields = dict(part.split(":") for part in rest.split("/") if ":" in part)
    return {k: int(v) for k, v in fields.items()}


def run_packtrain_bench(args, device, out_json):
    families = "PackedEager" if device == "cpu" else "PackedEager|PackedGraph"
    members = "|".join(str(m) for m in args.members) if args.members else "[0-9]+"
    command = [os.path.join(args.build_dir, "bin", "packtrain_bench"),
               f"--benchmark_filter=^({families})[A-Za-z]*/members:({members})/",
               f"--benchmark_repetitions={args.repeats}", f"--benchmark_min_time={args.min_time}",
               "--benchmark_report_aggregates_only=true",
               f"--benchmark_out={out_json}", "--benchmark_out_format=json"]
    env = dict(os.environ, PACKTRAIN_BENCH_DEVICE=device)
    say("packtrain: " + " ".join(command))
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(out_json) as f:
        report = json.load(f)
    rates, _ = bench_ratio.read_rates(report)
    return report, rates


def run_reference(args, device, workload, depth, directory):
    command = [os.path.join(args.build_dir, "bin", "packtrain_peers"), "reference",
               "--members", str(workload["members"]), "--hidden", str(workload["hidden"]),
               "--batch", str(workload["batch"]), "--depth", str(depth),
               "--steps", str(args.check_steps), "--device", device, "--out", directory]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(directory, "manifest.json")) as f:
        return json.load(f)["path"]


def run_peer(args, variant, directory, device, impl=None):
    name, _, variant_impl = variant.partition(":")
    command = [sys.executable, os.path.join(HERE, "peers.py"), name, directory, "--device", device,
               "--repeats", str(args.repeats), "--min-time", str(args.min_time)]
    if variant_impl or impl:
        command += ["--impl", variant_impl or impl]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.peer_timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {args.peer_timeout} s"}
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": f"error: {tail[:300]}"}
    result = json.loads(lines[-1])
    if "unsupported" in result:
        result["status"] = "not run: " + result["unsupported"]
    elif not result["check"]["passed"]:
        c = result["check"]
        result["status"] = (f"refused: loss curve differs from packtrain's (max relative error "
                            f"{c['max_rel_error']:.2e} > rtol {c['rtol']:g})")
    else:
        result["status"] = "ok"
    return result


def best_of(results):
    """The fastest variant that passed the check; else the first failure's status."""
    ok = [(v, r) for v, r in results.items() if r["status"] == "ok"]
    if ok:
        variant, result = max(ok, key=lambda vr: vr[1]["timing"]["member_steps_per_s"])
        return {"member_steps_per_s": result["timing"]["member_steps_per_s"], "variant": variant,
                "impl": result.get("impl"), "check": result["check"], "status": "ok",
                "variants": {v: summarize(r) for v, r in results.items()}}
    return {"member_steps_per_s": None, "status": "; ".join(f"{v}: {r['status']}" for v, r in results.items()),
            "variants": {v: summarize(r) for v, r in results.items()}}


def summarize(result):
    out = {"status": result["status"]}
    if "timing" in result:
        out["member_steps_per_s"] = result["timing"]["member_steps_per_s"]
        out["runs"] = result["timing"]["runs"]
    if "check" in result:
        out["check_max_rel_error"] = result["check"]["max_rel_error"]
    if "impl" in result:
        out["impl"] = result["impl"]
    return out


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


def chosen_variants(rows):
    """'torch.func vmap: torch-vmap:fused at members 1, 8; torch-vmap:foreach at members 512; ...'"""
    parts = []
    for name, _ in SYSTEMS:
        by_variant = {}
        for row in rows:
            variant = row["systems"][name].get("variant")
            if variant:
                w = row["workload"]
                by_variant.setdefault(variant, []).append(
                    f"{w['members']}" + ("" if w["hidden"] == 64 else f" (hidden {w['hidden']})"))
        if len(by_variant) == 1:
            parts.append(f"{name}: {next(iter(by_variant))}")
        elif by_variant:
            parts.append(f"{name}: " + ", ".join(f"{v} at members {'/'.join(ks)}" for v, ks in by_variant.items()))
    return "; ".join(parts)


def write_markdown(results, path):
    rows = results["rows"]
    names = [name for name, _ in SYSTEMS]
    lines = [f"# packtrain vs peers: {results['device_name']}, {results['date']}", "",
             "Member-steps/s (one member taking one AdamW step), median of "
             f"{results['repeats']} timed runs; `÷ pt` = peer / packtrain (below 1: packtrain is faster). "
             f"Same-work check: {results['check']['steps']} steps from the same weights and batch, every "
             f"member's loss within rtol {results['check']['rtol']:g} + atol {results['check']['atol']:g} "
             "of packtrain's; a peer that fails is refused (no figure).", "",
             "| members | hidden | batch | packtrain | " + " | ".join(f"{n} | ÷ pt" for n in names) + " |",
             "|---:|---:|---:|---:|" + "---:|---:|" * len(names)]
    notes = []
    for row in rows:
        w, systems = row["workload"], row["systems"]
        base = systems["packtrain"]["member_steps_per_s"]
        cells = []
        for name in names:
            s = systems[name]
            rate = s["member_steps_per_s"]
            if rate is None:
                cells.append("— | —")
                notes.append(f"members {w['members']}, hidden {w['hidden']}: {name}: {s['status']}")
            else:
                cells.append(f"{rate:,.0f} | {rate / base:.2f}x")
        lines.append(f"| {w['members']} | {w['hidden']} | {w['batch']} | {base:,.0f} | " + " | ".join(cells) + " |")
    lines += ["", f"Depth {results['depth']} hidden layer(s), 8 inputs, 1 output, ReLU, MSE, AdamW "
              "(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), float32, one fixed batch on the device.",
              f"packtrain path: {results['packtrain_path']}. Variants chosen (fastest that passed): "
              + chosen_variants(rows) + ".",
              "Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v) + "."]
    if notes:
        lines += ["", "Not reported:"] + [f"- {n}" for n in notes]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=None, help="output directory (default benchmarks/peers/results/<cpu|gpu>)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--check-steps", type=int, default=20)
    ap.add_argument("--members", type=lambda s: [int(m) for m in s.split(",")], default=None,
                    help="only these member counts (comma-separated)")
    ap.add_argument("--peers", type=lambda s: s.split(","), default=None,
                    help="only these systems' variants, e.g. torch-loop,jax")
    ap.add_argument("--peer-timeout", type=int, default=1800, help="seconds per peer and workload")
    ap.add_argument("--compile-impl", default=None, choices=["foreach", "fused"],
                    help="AdamW implementation under torch.compile (default: the faster vmap one)")
    args = ap.parse_args()
    device = args.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or os.path.join(HERE, "results", "gpu" if device == "cuda" else "cpu")
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)

    report, rates = run_packtrain_bench(args, device, os.path.join(work, "packtrain_bench.json"))
    depth = int(report["context"].get("depth", 1))
    family = "PackedEager" if device == "cpu" else "PackedGraphUnrolled"
    workloads = sorted({rest for (f, rest) in rates if f == family},
                       key=lambda r: [int(n) for n in re.findall(r"\d+", r)])
    rows = []
    packtrain_path = None
    for i, rest in enumerate(workloads, 1):
        workload = dict(parse_workload(rest), depth=depth)
        directory = os.path.join(work, f"k{workload['members']}_h{workload['hidden']}_b{workload['batch']}")
        os.makedirs(directory, exist_ok=True)
        packtrain_path = run_reference(args, device, workload, depth, directory)
        systems = {"packtrain": {"member_steps_per_s": rates[(family, rest)][0], "variant": family,
                                 "status": "ok", "reference": packtrain_path}}
        if device != "cpu" and ("PackedGraph", rest) in rates:
            systems["packtrain"]["PackedGraph_member_steps_per_s"] = rates[("PackedGraph", rest)][0]
        for name, variants in SYSTEMS:
            chosen = [v for v in variants if args.peers is None or v in args.peers or v.split(":")[0] in args.peers]
            results = {}
            # torch.compile runs the AdamW implementation that was faster under vmap.
            vmap_variant = systems.get("torch.func vmap", {}).get("variant") or ""
            compile_impl = args.compile_impl or ("fused" if vmap_variant.endswith("fused") else "foreach")
            for variant in chosen:
                started = time.perf_counter()
                results[variant] = run_peer(args, variant, directory, device,
                                            compile_impl if variant == "torch-compile" else None)
                r = results[variant]
                rate = r.get("timing", {}).get("member_steps_per_s")
                say(f"[{i}/{len(workloads)}] {rest}: {variant}: {r['status']}"
                    + (f", {rate:,.0f} member-steps/s" if rate else "")
                    + f" ({time.perf_counter() - started:.0f} s)")
            systems[name] = best_of(results) if results else {"member_steps_per_s": None, "status": "not selected"}
        rows.append({"workload": workload, "systems": systems})

    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device, "device_name": device_name(device), "host": platform.node(),
        "versions": versions(), "repeats": args.repeats, "min_time_s": args.min_time, "depth": depth,
        "check": {"steps": args.check_steps, "rtol": peers.RTOL, "atol": peers.ATOL},
        "packtrain_path": f"{family} (timed); reference loss curve from {packtrain_path}",
        "torch_threads": __import__("torch").get_num_threads(),
        "rows": rows,
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    write_markdown(results, os.path.join(out, "results.md"))
    subprocess.run([os.path.join(args.build_dir, "bin", "packtrain_peers"), "plot", "--results",
                    os.path.join(out, "results.json"), "--out", os.path.join(out, "results.svg")], check=True)
    say(f"wrote {out}/results.md, results.json, results.svg")
    with open(os.path.join(out, "results.md")) as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
