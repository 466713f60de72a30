#!/usr/bin/env python3
"""summary.txt of one scripts/device/phase.sh run, rewritten after every step: the
machine, every step's outcome (and those under way), every GPU test the phase runs or
would run with its outcome, memcheck's error summaries, the headline figures and the
targets (scripts/device/targets.py: PASS / FAIL / not run, why).

Usage: summarize.py PHASE WORK_DIR BUDGET_S ELAPSED_S [--final] [--tests-tsv PATH] [--brief PATH]
prints the summary; --tests-tsv: every GPU test as binary, test, outcome, detail;
--brief: the summary without the list of tests that passed or skipped (the phase
prints it last, so the call's output tail holds it); --final: the phase has ended.
Reads what phase.sh left in WORK_DIR: steps.tsv, running.tsv, machine_line.txt,
binaries.txt, no_gpu.txt, stopped.txt, notes.txt, stale.txt, plan.tsv (the GPU tests),
gtest_runs.tsv (each gtest run: index, binary, kind, JSON, log, names), json/*.json,
logs/*.log, targets.txt, peers/results.json. gtest writes its JSON only at the end of
a run, so a run still under way, killed or crashed is read from its text log's
[ RUN ] / [ OK ] / [ FAILED ] / [ SKIPPED ] lines. Standard library only.
"""
import argparse
import glob
import json
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import targets as target_table  # noqa: E402  (scripts/device/targets.py)


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


def tsv(path):
    return [line.rstrip("\n").split("\t") for line in read(path).splitlines() if line.strip()]


def steps_section(work, elapsed, final):
    rows = tsv(os.path.join(work, "steps.tsv"))
    running = tsv(os.path.join(work, "running.tsv"))
    lines, bad = [], []
    for row in sorted(rows, key=lambda r: int(r[0]) if r[0].isdigit() else 0):
        index, name, outcome, seconds = (row + [""] * 4)[:4]
        detail = row[4] if len(row) > 4 else ""
        if outcome.startswith(("failed", "timed out")):
            bad.append(name)
        if name == "machine":
            detail = ""  # on its own line above
        text = f"  [{index}] {name[:70]:<70} {outcome:<16} {seconds:>4} s"
        if detail:
            text += f"  {detail[:200]}"
        lines.append(text)
    for index, name, since in (r[:3] for r in running if len(r) >= 3):
        state, so_far = ("stopped", "  running when the phase stopped") if final else ("running", "  so far")
        lines.append(f"  [{index}] {name[:70]:<70} {state:<16} {elapsed - int(since):>4} s{so_far}")
    return lines, bad, rows, running


# --- the GPU tests

def log_states(log):
    """{test: (state, detail)} from a gtest text log: ok, failed (first failure line),
    skipped (the reason), unfinished (started, never ended)."""
    states, current, lines = {}, None, read(log).splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\[ *(RUN|OK|FAILED|SKIPPED) *\] (\S+?),?(?:\s|$)", line)
        if not m:
            if current and states[current][0] == "unfinished" and not states[current][1]:
                if re.search(r"(Failure|Skipped|error|Error|what\(\))", line):
                    nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
                    states[current] = ("unfinished", (line.strip() + (" " + nxt if nxt else ""))[:220])
            continue
        tag, name = m.group(1).strip(), m.group(2)
        if tag == "RUN":
            states[name], current = ("unfinished", ""), name
        elif name in states and states[name][0] == "unfinished":
            detail = states[name][1]
            if tag == "SKIPPED":
                detail = re.sub(r"^.*Skipped\s*", "", detail).strip()
            states[name] = ({"OK": "ok", "FAILED": "failed", "SKIPPED": "skipped"}[tag], detail)
            current = None
    return states


def json_states(path):
    """{test: (state, detail)} from gtest's JSON (written when the run ends), or None."""
    report = load(path) if path else None
    if not isinstance(report, dict) or "testsuites" not in report:
        return None
    states = {}
    for suite in report["testsuites"]:
        for test in suite.get("testsuite", []):
            name = f"{suite['name']}.{test['name']}"
            if test.get("failures"):
                message = test["failures"][0].get("failure", "").strip().replace("\n", " ")
                states[name] = ("failed", message[:220])
            elif test.get("result") == "SKIPPED":
                skipped = test.get("skipped") or [{}]
                states[name] = ("skipped", (skipped[0].get("message", "") if isinstance(skipped, list) else ""))
            elif test.get("status") == "NOTRUN":
                states[name] = ("not run", "disabled")
            else:
                states[name] = ("ok", f"{test.get('time', '')}")
    return states


def died(outcome):
    """"failed (exit 139)" -> "exit 139: SIGSEGV" (a shell's exit status 128 + N: signal N)."""
    m = re.search(r"exit (\d+)", outcome)
    if not m:
        return outcome
    code = int(m.group(1))
    try:
        return f"exit {code}: {signal.Signals(code - 128).name}" if code > 128 else f"exit {code}"
    except ValueError:
        return f"exit {code}"


def describe(state, detail, step, final):
    """One attempt's outcome in words; step: (outcome, detail) of the run's step, or None
    while it runs (or, final, when the phase was stopped while it ran)."""
    if step is None and final:
        if state == "unfinished":
            return "stopped", "running when the phase was stopped"
        if state not in ("ok", "failed", "skipped"):
            return "not run", "the phase was stopped first"
    if state == "ok":
        return "passed", ""
    if state == "failed":
        return "FAILED", detail
    if state == "skipped":
        return "skipped", re.sub(r"^.*?: Skipped\s*", "", detail)
    if state == "unfinished":
        if step is None:
            return "running", ""
        if step[0] == "timed out":
            return "HUNG", "still running when its binary reached its time cap"
        if step[0] == "ok":
            return "FAILED", "started and never ended, yet the binary exited 0"
        return "CRASHED", f"the binary died while it ran ({died(step[0])}){': ' + detail if detail else ''}"
    if step is None:
        return "queued", "the binary is still running"
    return "not run", f"the binary stopped before it ({step[0]})"


def gpu_tests(work, final):
    """[(binary, test, outcome, detail)] for every planned GPU test, in plan order."""
    plan = [r[:2] for r in tsv(os.path.join(work, "plan.tsv")) if len(r) >= 2]
    if not plan:
        return None
    steps = {r[0]: (r[2], r[4] if len(r) > 4 else "") for r in tsv(os.path.join(work, "steps.tsv")) if len(r) >= 3}
    attempts = {}  # (binary, test) -> [(outcome, detail, kind)]
    for run in tsv(os.path.join(work, "gtest_runs.tsv")):
        index, binary, kind, jpath, log, names = (run + [""] * 6)[:6]
        wanted = [n for n in read(names).splitlines() if n.strip()]
        step = steps.get(index)
        if not log:  # never started: its step says why
            why = step[1] if step else "not started"
            for test in wanted:
                attempts.setdefault((binary, test), []).append(("not run", why, kind))
            continue
        states = log_states(log)
        ended = json_states(jpath) if step is not None else None
        if ended is not None:  # the JSON's verdicts, the log's skip reasons
            states = {t: (st, d or states.get(t, ("", ""))[1]) for t, (st, d) in ended.items()}
        for test in wanted:
            state, detail = states.get(test, ("", ""))
            outcome, detail = describe(state, detail, step, final)
            if outcome in ("FAILED", "CRASHED", "HUNG"):
                detail += f" [logs/{os.path.basename(log)}]"
            attempts.setdefault((binary, test), []).append((outcome, detail, kind))
    rows = []
    for binary, test in plan:
        tries = attempts.get((binary, test))
        if not tries:
            why = "the phase stopped before its binary" if final else "queued"
            rows.append((binary, test, "not run" if final else "queued", why))
            continue
        # Not reached in one run, run on in the next ("rest"); then perhaps rerun.
        while len(tries) > 1 and tries[0][0] == "not run":
            tries = tries[1:]
        outcome, detail, _ = tries[0]
        if len(tries) > 1:
            again, again_detail, _ = tries[-1]
            detail = (detail + "; " if detail else "") + f"rerun with C++ stack traces: {again}" + \
                (f" ({again_detail[:200]})" if again_detail and again != "passed" else "")
        rows.append((binary, test, outcome, detail))
    return rows


def tests_section(work, rows, brief):
    """Counts per binary, every test not passed or skipped (brief) or every test."""
    counts = {}
    for binary, _, outcome, _ in rows:
        counts.setdefault(binary, {}).setdefault(outcome, 0)
        counts[binary][outcome] += 1
    total = {}
    for per in counts.values():
        for k, n in per.items():
            total[k] = total.get(k, 0) + n
    order = ["passed", "FAILED", "CRASHED", "HUNG", "skipped", "running", "queued", "stopped", "not run"]
    tally = lambda per: ", ".join(f"{per[k]} {k}" for k in order + sorted(set(per) - set(order)) if per.get(k))
    lines = [f"GPU tests: {len(rows)} (every test whose full name matches /cuda|gpu/i in its binary's "
             f"--gtest_list_tests; scripts/device/gpu_tests.py): {tally(total)}"]
    for binary, per in counts.items():
        reasons = {d for b, _, o, d in rows if b == binary and o == "skipped"}
        why = f" -- skipped: {next(iter(reasons))[:150]}" if len(reasons) == 1 and per.get("skipped") else ""
        lines.append(f"  {binary} ({sum(per.values())}): {tally(per)}{why}")
    shown = [r for r in rows if not brief or r[2] not in ("passed", "skipped", "queued", "running", "not run")]
    if brief and len(shown) < len(rows):
        lines.append(f"  (the {len(rows)} tests one by one: summary.txt and tests.tsv in $OUT)")
    if shown:
        lines.append("  every GPU test:" if not brief else "  not passed:")
        for binary, test, outcome, detail in shown:
            text = f"    {outcome:<8} {binary} {test}"
            if detail and (outcome != "skipped" or len(reasons_of(rows, binary)) > 1):
                text += f"  -- {detail[:220]}"
            lines.append(text)
    return lines


def reasons_of(rows, binary):
    return {d for b, _, o, d in rows if b == binary and o == "skipped"}


def memcheck_lines(work):
    lines = []
    for log in sorted(glob.glob(os.path.join(work, "logs", "*memcheck*.log"))):
        found = re.findall(r"ERROR SUMMARY: (\d+) errors?", read(log))
        if found:
            lines.append(f"  {os.path.basename(log)[3:-4]}: compute-sanitizer ERROR SUMMARY {found[-1]} errors")
    return lines


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


def targets_lines(work, phase):
    """targets.py's table: its step's output when it ran, else computed from the
    benchmark JSON there is so far (or every target not run, and why)."""
    ran = read(os.path.join(work, "targets.txt")).strip()
    if ran:
        return ran.splitlines()
    no_gpu = read(os.path.join(work, "no_gpu.txt")).strip()
    files = sorted(glob.glob(os.path.join(work, "json", "bench_*.json")))
    if phase == "peers":
        files += [p for p in [os.path.join(work, "peers", "results.json")] if os.path.exists(p)]
    _, lines, _ = target_table.evaluate(files, no_gpu or None)
    if not files and not no_gpu:
        lines = [re.sub(r": not run \(.*\)$", ": not run (no benchmark has run yet in this phase)", l) for l in lines]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("phase")
    ap.add_argument("work")
    ap.add_argument("budget", type=int)
    ap.add_argument("elapsed", type=int)
    ap.add_argument("--final", action="store_true")
    ap.add_argument("--tests-tsv")
    ap.add_argument("--brief")
    args = ap.parse_args()
    work, phase = args.work, args.phase
    steps, bad, rows, running = steps_section(work, args.elapsed, args.final)
    state = "FINAL" if args.final else "IN PROGRESS"
    head = [f"packtrain device phase: {phase}, {state} ({args.elapsed} s of a {args.budget} s budget)",
            "machine: " + (read(os.path.join(work, "machine_line.txt")).strip() or "not recorded yet"),
            "binaries: " + (read(os.path.join(work, "binaries.txt")).strip() or "none yet")]
    stopped = read(os.path.join(work, "stopped.txt")).strip()
    if stopped:
        head.append("STOPPED: " + stopped.replace("\n", "; "))
        bad.append("the phase was stopped")
    stale = read(os.path.join(work, "stale.txt")).strip()
    if stale:
        head.append("WARNING: " + stale)
    no_gpu = read(os.path.join(work, "no_gpu.txt")).strip()
    if no_gpu:
        head.append(f"{no_gpu}: the CUDA steps are skipped and the GPU tests skip themselves")
    tests = gpu_tests(work, args.final)
    if tests and any(o in ("FAILED", "CRASHED", "HUNG") for _, _, o, _ in tests):
        bad.append("GPU tests")
    body = ["steps:"] + steps
    for title, section in (("memcheck:", memcheck_lines(work)), ("headline:", bench_section(work)),
                           ("peers:", peers_section(work))):
        if section:
            body += [title] + section
    if phase in ("gpu", "bench", "peers"):
        body += ["targets:"] + ["  " + l for l in targets_lines(work, phase)]
    notes = read(os.path.join(work, "notes.txt")).strip()
    if notes:
        body += ["notes:"] + ["  " + l for l in notes.splitlines()]
    counts = {}
    for row in rows:
        key = row[2].split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    if running:
        counts["stopped" if args.final else "running"] = len(running)
    tally = ", ".join(f"{n} {k}" for k, n in counts.items())
    end = [f"outcome: {'FAILED: ' + '; '.join(bad) if bad else 'ok'} ({tally or 'no'} steps)"]
    full = head + body + (tests_section(work, tests, False) if tests else []) + end
    print("\n".join(full))
    if args.brief:
        with open(args.brief, "w") as f:
            f.write("\n".join(head + body + (tests_section(work, tests, True) if tests else []) + end) + "\n")
    if args.tests_tsv and tests is not None:
        with open(args.tests_tsv, "w") as f:
            f.write("binary\ttest\toutcome\tdetail\n")
            for row in tests:
                f.write("\t".join(c.replace("\t", " ").replace("\n", " ") for c in row) + "\n")


if __name__ == "__main__":
    main()
