#!/usr/bin/env python3
"""Ratios of member-steps/s between benchmark families, from one packtrain_bench run.

Usage: scripts/bench_ratio.py BENCH_JSON [--base NaiveLoop] [--families PackedEager ...]
Reads Google Benchmark's JSON (--benchmark_out=F --benchmark_out_format=json, with
--benchmark_repetitions=N: medians are used when present) and prints, for every
argument set both families ran, each family's member-steps/s and its ratio to the base.
With --counter NAME (repeatable) it also prints each family's NAME counter
(host_us_per_step, device_us_per_step, bound_us_per_step, ...).
GPU run: --families PackedEager PackedGraph PackedGraphUnrolled --counter host_us_per_step
"""
import argparse
import json
import re
import sys


def read_rates(report):
    """{(family, "members:8/hidden:64/batch:128/depth:2"): (items_per_second, the benchmark's entry)}
    from Google Benchmark's JSON (medians when repetitions were run), and whether
    they are medians. Skipped or failed benchmarks are left out."""
    found = {}
    have_medians = any(b.get("aggregate_name") == "median" for b in report["benchmarks"])
    for b in report["benchmarks"]:
        if have_medians and b.get("aggregate_name") != "median":
            continue
        name = b["run_name"] if "run_name" in b else b["name"]
        family, _, rest = name.partition("/")
        rest = rest.removesuffix("/real_time").removesuffix("/manual_time")
        if "items_per_second" not in b:  # skipped or failed
            continue
        found[(family, rest)] = (b["items_per_second"], b)
    return found, have_medians


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("--base", default="NaiveLoop")
    ap.add_argument("--families", nargs="*", default=["PackedEager"])
    ap.add_argument("--counter", action="append", default=[])
    args = ap.parse_args()
    with open(args.bench_json) as f:
        report = json.load(f)
    found, have_medians = read_rates(report)
    rates = {key: rate for key, (rate, _) in found.items()}
    counters = {key: bench for key, (_, bench) in found.items()}
    ctx = report.get("context", {})
    print(f"# {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs, device {ctx.get('device', '?')}, "
          f"{ctx.get('date', '?')}, {'median of repetitions' if have_medians else 'single run'}")
    print(f"| workload | {args.base} member-steps/s | " + " | ".join(f"{f} member-steps/s | {f} / {args.base}" for f in args.families) + " |")
    print("|---|---:|" + "---:|---:|" * len(args.families))
    for (family, rest), base_rate in sorted(rates.items(), key=lambda kv: [int(n) for n in re.findall(r"\d+", kv[0][1])]):
        if family != args.base:
            continue
        cells = []
        for f in args.families:
            r = rates.get((f, rest))
            cells.append("n/a | n/a" if r is None else f"{r:,.0f} | {r / base_rate:.1f}x")
        print(f"| {rest} | {base_rate:,.0f} | " + " | ".join(cells) + " |")
    families = [args.base] + args.families
    for name in args.counter:
        print(f"\n{name}\n| workload | " + " | ".join(families) + " |")
        print("|---|" + "---:|" * len(families))
        for rest in sorted({r for (_, r) in rates}, key=lambda r: [int(n) for n in re.findall(r"\d+", r)]):
            cells = [f"{counters[(f, rest)][name]:,.1f}" if name in counters.get((f, rest), {}) else "n/a" for f in families]
            print(f"| {rest} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
