#!/usr/bin/env python3
"""summary.txt of one scripts/device/phase.sh run: the machine, every step's outcome,
the tests' counts and failures, memcheck's error summaries and the headline figures.

Usage: summarize.py PHASE WORK_DIR BUDGET_S ELAPSED_S   (prints to stdout)
Reads what phase.sh left in WORK_DIR: steps.tsv, machine_line.txt, binaries.txt,
notes.txt, stale.txt, json/*.json (gtest, Google Benchmark, packtrain --json),
logs/*.log, targets.txt, peers/results.json. Standard library only.
"""
import glob
import json
import os
import re
import sys


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def steps_section(work):
    rows = [line.rstrip("\n").split("\t") for line in read(os.path.join(work, "steps.tsv")).splitlines() if line]
    lines, bad = [], []
    total = len(rows)
    for row in rows:
        index, name, outcome, seconds = row[:4]
        detail = row[4] if len(row) > 4 else ""
        if outcome.startswith(("failed", "timed out")):
            bad.append(name)
        if name == "machine":
            detail = ""  # on its own line above
        text = f"  [{index}/{total}] {name:<58} {outcome:<16} {seconds:>4} s"
        if detail:
            text += f"  {detail[:160]}"
        lines.append(text)
    return lines, bad, rows


def gtest_section(work):
    lines = []
    for path in sorted(glob.glob(os.path.join(work, "json", "*.json"))):
        report = load(path)
        if not isinstance(report, dict) or "testsuites" not in report:
            continue
        passed, skipped, failed = 0, [], []
        for suite in report["testsuites"]:
            for test in suite.get("testsuite", []):
                name = f"{suite['name']}.{test['name']}"
                if test.get("failures"):
                    failed.append(name)
                elif test.get("result") == "SKIPPED" or test.get("status") == "NOTRUN":
                    skipped.append(name)
                else:
                    passed += 1
        label = os.path.basename(path)[:-5]
        lines.append(f"  {label}: {passed} passed, {len(failed)} failed, {len(skipped)} skipped"
                     + (f" (skipped: {skip_reason(work, label)})" if skipped and not passed and not failed else ""))
        lines += [f"    FAILED {name}" for name in failed[:25]]
        if len(failed) > 25:
            lines.append(f"    ... and {len(failed) - 25} more")
    for log in sorted(glob.glob(os.path.join(work, "logs", "*memcheck*.log"))):
        found = re.findall(r"ERROR SUMMARY: (\d+) errors?", read(log))
        label = os.path.basename(log)[3:-4]
        if found:
            lines.append(f"  {label}: compute-sanitizer ERROR SUMMARY {found[-1]} errors")
    return lines


def skip_reason(work, label):
    """The reason gtest printed for the first skipped test of that step."""
    for log in glob.glob(os.path.join(work, "logs", f"*{label}*.log")):
        m = re.search(r"Skipped\s*\n(.*)", read(log))
        if m:
            return m.group(1).strip()[:140]
    return "see the log"


def bench_rows(work):
    """{(family, args): entry} from every Google Benchmark JSON of the phase (medians
    when repetitions ran)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(work, "json", "bench_*.json"))):
        report = load(path)
        if not report or "benchmarks" not in report:
            continue
        medians = any(b.get("aggregate_name") == "median" for b in report["benchmarks"])
        for b in report["benchmarks"]:
            if medians and b.get("aggregate_name") != "median":
                continue
            if b.get("error_occurred") or b.get("skipped"):
                continue
            name = b.get("run_name", b["name"])
            family, _, rest = name.partition("/")
            rest = re.sub(r"/(real|manual)_time$", "", rest)
            rest = "" if rest in ("real_time", "manual_time") else rest
            found[(family, rest)] = b
    return found


def fmt(value, digits=1):
    if value is None:
        return "n/a"
    if digits == 0 and abs(value) < 10:
        digits = 2  # a rate below 10/s
    return f"{value:,.{digits}f}"


def bench_section(work):
    lines = []
    rows = bench_rows(work)
    captured = sorted(((rest, b) for (f, rest), b in rows.items() if f == "PackedGraphUnrolled"),
                      key=lambda rb: [int(n) for n in re.findall(r"\d+", rb[0])])
    if captured:
        lines.append("  PackedGraphUnrolled (median): workload | member-steps/s | device us/step | host us/step | "
                     "bound us/step | copy-bound us/step")
        for rest, b in captured:
            lines.append(f"    {rest:<32} {fmt(b.get('items_per_second'), 0):>14} {fmt(b.get('device_us_per_step'), 2):>9}"
                         f" {fmt(b.get('host_us_per_step'), 2):>8} {fmt(b.get('bound_us_per_step'), 2):>8}"
                         f" {fmt(b.get('copy_bound_us_per_step'), 2):>8}")
    others = sorted((f"{f}/{rest}" if rest else f, b) for (f, rest), b in rows.items()
                    if f not in ("PackedGraphUnrolled", "PackedGraph"))
    for name, b in others:
        lines.append(f"  {name}: {fmt(b.get('real_time'), 3)} {b.get('time_unit', '')}/iteration, "
                     f"{fmt(b.get('items_per_second'), 0)} items/s")
    for k in (64, 4096):
        p = load(os.path.join(work, "json", f"profile_k{k}.json"))
        if not p:
            continue
        eager, graph = p.get("eager") or {}, p.get("graph") or {}
        lines.append(f"  profile K={k}: eager {fmt(eager.get('device_us_per_step'))} us device / "
                     f"{fmt(eager.get('host_us_per_step'))} us host, graph {fmt(graph.get('device_us_per_step'))} us "
                     f"device / {fmt(graph.get('host_us_per_step'))} us host per step")
        if p.get("verdict"):
            lines.append(f"    {p['verdict'][:300]}")
    train = load(os.path.join(work, "json", "train.json")) or load(os.path.join(work, "json", "train_smoke.json"))
    if train:
        lines.append(train_line("train", train))
    launch = read(os.path.join(work, "json", "launch1.txt"))
    if launch:
        rank0 = "\n".join(l[9:] for l in launch.splitlines() if l.startswith("[rank 0] "))
        try:
            lines.append(train_line("launch --nproc 1 train", json.loads(rank0)))
        except ValueError:
            lines.append("  launch --nproc 1 train: no JSON from rank 0 (see json/launch1.txt)")
    allreduce = load(os.path.join(work, "json", "allreduce.json"))
    if allreduce and allreduce.get("allreduce"):
        big = max(allreduce["allreduce"], key=lambda r: r.get("bytes", 0))
        lines.append(f"  NCCL all-reduce, world 1: {big['bytes'] / 2**20:.0f} MiB in {fmt(big.get('median_us'))} us "
                     f"(bus {fmt(big.get('bus_bandwidth_gb_s'))} GB/s)")
    return lines


def train_line(label, t):
    eager = [l for l in t.get("log", []) if "eager" in l]
    return (f"  {label}: {t.get('device')}, {t.get('epochs_run')} epochs in {fmt(t.get('train_seconds'), 2)} s, "
            f"{fmt(t.get('member_steps_per_second'), 0)} member-steps/s, ensemble RMSE "
            f"{fmt((t.get('ensemble') or {}).get('rmse'), 3)}"
            + (f"; {len(eager)} step(s) eager: {eager[0][:120]}" if eager else ""))


def peers_section(work):
    results = load(os.path.join(work, "peers", "results.json"))
    if not results:
        return []
    lines = [f"  {results.get('device_name')}: {(results.get('verdict') or {}).get('text', 'no verdict')}"]
    for row in results.get("rows", []):
        w, systems = row["workload"], row["systems"]
        base = systems["packtrain"]["member_steps_per_s"]
        best = max(((n, s["member_steps_per_s"]) for n, s in systems.items()
                    if n != "packtrain" and s.get("member_steps_per_s")), key=lambda ns: ns[1], default=None)
        lines.append(f"    K={w['members']} hidden {w['hidden']}: packtrain {fmt(base, 0)} member-steps/s"
                     + (f", best peer {best[0]} {fmt(best[1], 0)} ({best[1] / base:.2f}x)" if best else ", no peer measured"))
    if results.get("error"):
        lines.append(f"  stopped: {results['error']}")
    return lines


def main():
    phase, work, budget, elapsed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    steps, bad, rows = steps_section(work)
    out = [f"packtrain device phase: {phase}  ({elapsed} s of a {budget} s budget)",
           "machine: " + (read(os.path.join(work, "machine_line.txt")).strip() or "not recorded"),
           "binaries: " + (read(os.path.join(work, "binaries.txt")).strip() or "none")]
    stopped = read(os.path.join(work, "stopped.txt")).strip()
    if stopped:
        out.append("STOPPED: " + stopped)
        bad.append("the phase was " + stopped.split(",")[0])
    stale = read(os.path.join(work, "stale.txt")).strip()
    if stale:
        out.append("WARNING: " + stale)
    out += ["steps:"] + steps
    for title, section in (("tests:", gtest_section(work)), ("headline:", bench_section(work)),
                           ("peers:", peers_section(work))):
        if section:
            out += [title] + section
    targets = read(os.path.join(work, "targets.txt")).strip()
    if targets:
        out += ["targets:"] + ["  " + l for l in targets.splitlines()]
    notes = read(os.path.join(work, "notes.txt")).strip()
    if notes:
        out += ["notes:"] + ["  " + l for l in notes.splitlines()]
    counts = {}
    for row in rows:
        key = row[2].split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    tally = ", ".join(f"{n} {k}" for k, n in counts.items())
    out.append(f"outcome: {'FAILED: ' + '; '.join(bad) if bad else 'ok'} ({tally})")
    print("\n".join(out))


if __name__ == "__main__":
    main()
