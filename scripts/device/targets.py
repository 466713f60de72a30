#!/usr/bin/env python3
"""The issue's performance targets against a GPU run: each target with the measured
value, the threshold and PASS / FAIL, or "not run (why)" when its benchmark is absent
(a CPU run, a family filtered out, a counter this build does not have).

Usage: scripts/device/targets.py FILE...  [--strict] [--no-gpu REASON]
FILEs: Google Benchmark JSON from packtrain_bench (--benchmark_out, several are
merged; medians are used where repetitions ran) and/or benchmarks/peers results.json,
told apart by their content. --strict: exit 1 when a target fails. --no-gpu: this
machine has no GPU (the dry run): every target "not run (REASON)".
summarize.py imports evaluate() for the summary's table.

Targets:
  1. PackedGraphUnrolled host_us_per_step <= 15 at every K
  2. PackedGraphUnrolled member-steps/s >= 50 x NaiveLoop's at K=64 (hidden 64, batch 128)
  3. K=4096: PackedGraphUnrolled device_us_per_step <= 2 x copy_bound_us_per_step
     (the bound from a measured device-to-device copy; bound_us_per_step, the
     theoretical one from the peak bandwidth, is reported beside it)
  4. PackedGraphUnrolled device_us_per_step at K=2048 <= 2 x at K=1
  5. MultiTaskGraph real_time <= MultiTaskTwoForward real_time / 2
  6. DecodeGraph >= 3x faster than DecodeEager (batch 1)
  7. peers: packtrain leads every peer at every K >= 8
"""
import argparse
import json
import re
import sys

MAIN = "hidden:64/batch:128/depth:1"  # the main workload's width, batch and depth (the targets' shape)
UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


TITLES = {
    1: "PackedGraphUnrolled host_us_per_step <= 15 at every K",
    2: "PackedGraphUnrolled >= 50x NaiveLoop member-steps/s at K=64 (hidden 64, batch 128)",
    3: "K=4096 PackedGraphUnrolled device_us_per_step <= 2 x copy_bound_us_per_step",
    4: "PackedGraphUnrolled device_us_per_step at K=2048 <= 2 x at K=1",
    5: "MultiTaskGraph real_time <= MultiTaskTwoForward real_time / 2",
    6: "DecodeGraph >= 3x faster than DecodeEager (batch 1)",
    7: "peers: packtrain leads every peer at every K >= 8",
}


def k_of(rest):
    m = re.search(r"members:(\d+)", rest)
    return int(m.group(1)) if m else None


class Bench:
    def __init__(self):
        self.rows = {}  # (family, "members:64/hidden:64/batch:128/depth:1") -> entry
        self.files, self.devices, self.medians = [], set(), False
        self.notes = []  # families the runs said they did not run

    def add(self, path, report):
        self.files.append(path)
        ctx = report.get("context", {})
        if ctx.get("device"):
            self.devices.add(ctx["device"])
        medians = any(b.get("aggregate_name") == "median" for b in report["benchmarks"])
        self.medians |= medians
        for b in report["benchmarks"]:
            if medians and b.get("aggregate_name") != "median":
                continue
            name = b.get("run_name", b["name"])
            family, _, rest = name.partition("/")
            rest = re.sub(r"(^|/)(real|manual)_time$", "", rest)
            if b.get("error_occurred") or b.get("skipped"):
                self.notes.append(f"{name}: {b.get('error_message') or b.get('skip_message') or 'skipped'}")
                continue
            self.rows[(family, rest)] = b

    def family(self, family):
        return {rest: b for (f, rest), b in self.rows.items() if f == family}

    def why_absent(self, what):
        if not self.files:
            return "not run (no packtrain_bench JSON given)"
        if self.devices and all(not d.startswith("cuda") for d in self.devices):
            return f"not run ({what} absent: the benchmarks ran on {', '.join(sorted(self.devices))}; CUDA graphs need a GPU)"
        return f"not run ({what} absent from {', '.join(self.files)})"


def time_us(b):
    return b["real_time"] * UNIT_US.get(b.get("time_unit", "ns"), 1e-3)


def result(number, title, verdict, detail):
    return f"[{number}] {verdict:<5} {title}: {detail}" if verdict in ("PASS", "FAIL") else f"[{number}] {title}: {verdict}"


def target_1(bench):
    title = TITLES[1]
    rows = bench.family("PackedGraphUnrolled")
    values = sorted(((k_of(r), r, b.get("host_us_per_step")) for r, b in rows.items()), key=lambda x: (x[0] or 0, x[1]))
    values = [v for v in values if v[2] is not None]
    if not values:
        return result(1, title, bench.why_absent("PackedGraphUnrolled"), "")
    worst = max(v[2] for v in values)
    detail = ", ".join(f"K={k}{'' if MAIN in r else ' (' + r.split('/', 1)[1] + ')'} {h:.2f}" for k, r, h in values)
    return result(1, title, "PASS" if worst <= 15 else "FAIL", f"max {worst:.2f} us (threshold 15); {detail}")


def target_2(bench):
    title = TITLES[2]
    key = f"members:64/{MAIN}"
    g = bench.rows.get(("PackedGraphUnrolled", key))
    n = bench.rows.get(("NaiveLoop", key))
    if g is None or n is None:
        return result(2, title, bench.why_absent(("PackedGraphUnrolled" if g is None else "NaiveLoop") + "/" + key), "")
    ratio = g["items_per_second"] / n["items_per_second"]
    return result(2, title, "PASS" if ratio >= 50 else "FAIL",
                  f"{ratio:.1f}x (threshold 50x): {g['items_per_second']:,.0f} vs {n['items_per_second']:,.0f} member-steps/s")


def target_3(bench):
    title = TITLES[3]
    g = bench.rows.get(("PackedGraphUnrolled", f"members:4096/{MAIN}"))
    if g is None:
        return result(3, title, bench.why_absent("PackedGraphUnrolled/members:4096"), "")
    theory = g.get("bound_us_per_step")
    theory_text = f"; theoretical bound_us_per_step {theory:.2f}" if theory is not None else ""
    if g.get("copy_bound_us_per_step") is None:
        return result(3, title, f"not run (no copy_bound_us_per_step counter in this build; device_us_per_step "
                                f"{g['device_us_per_step']:.2f}{theory_text})", "")
    dev, bound = g["device_us_per_step"], g["copy_bound_us_per_step"]
    return result(3, title, "PASS" if dev <= 2 * bound else "FAIL",
                  f"{dev:.2f} us vs 2 x {bound:.2f} = {2 * bound:.2f} us ({dev / bound:.2f}x the copy bound{theory_text})")


def target_4(bench):
    title = TITLES[4]
    g1 = bench.rows.get(("PackedGraphUnrolled", f"members:1/{MAIN}"))
    g2 = bench.rows.get(("PackedGraphUnrolled", f"members:2048/{MAIN}"))
    if g1 is None or g2 is None:
        return result(4, title, bench.why_absent("PackedGraphUnrolled/members:" + ("1" if g1 is None else "2048")), "")
    a, b = g1["device_us_per_step"], g2["device_us_per_step"]
    return result(4, title, "PASS" if b <= 2 * a else "FAIL", f"K=2048 {b:.2f} us vs 2 x K=1 {a:.2f} = {2 * a:.2f} us ({b / a:.2f}x)")


def target_5(bench):
    title = TITLES[5]
    g, t = bench.rows.get(("MultiTaskGraph", "")), bench.rows.get(("MultiTaskTwoForward", ""))
    if g is None or t is None:
        return result(5, title, bench.why_absent("MultiTaskGraph" if g is None else "MultiTaskTwoForward"), "")
    a, b = time_us(g), time_us(t)
    return result(5, title, "PASS" if a <= b / 2 else "FAIL",
                  f"{a / 1e3:.3f} ms vs {b / 1e3:.3f} ms / 2 = {b / 2e3:.3f} ms ({b / a:.2f}x faster)")


def target_6(bench):
    title = TITLES[6]
    g, e = bench.rows.get(("DecodeGraph", "")), bench.rows.get(("DecodeEager", ""))
    if g is None or e is None:
        return result(6, title, bench.why_absent("DecodeGraph" if g is None else "DecodeEager"), "")
    speedup = time_us(e) / time_us(g)
    return result(6, title, "PASS" if speedup >= 3 else "FAIL",
                  f"{speedup:.2f}x (threshold 3x): {time_us(g) / 1e3:.3f} ms vs {time_us(e) / 1e3:.3f} ms per 120 tokens")


def target_7(peers, path):
    title = TITLES[7]
    if peers is None:
        return result(7, title, "not run (no peers results.json given)", "")
    rows = [r for r in peers.get("rows", []) if r["workload"]["members"] >= 8]
    if not rows:
        return result(7, title, f"not run (no workload with K >= 8 in {path})", "")
    losses, measured, unmeasured = [], 0, []
    for row in rows:
        w, systems = row["workload"], row["systems"]
        base = systems["packtrain"]["member_steps_per_s"]
        if "network" in w:  # a CNN row (run.sh --model cnn): the data set's network
            where = f"{w['network']} K={w['members']}"
        else:
            where = f"K={w['members']}" + ("" if w["hidden"] == 64 else f" hidden {w['hidden']}")
        for name, s in systems.items():
            if name == "packtrain":
                continue
            rate = s.get("member_steps_per_s")
            if rate is None:
                unmeasured.append(f"{where} {name}")
                continue
            measured += 1
            if rate >= base:
                losses.append(f"{where}: {name} {rate / base:.2f}x packtrain")
    detail = (f"{measured} peer figures at {len(rows)} workloads on {peers.get('device_name', peers.get('device'))}"
              + (f"; not measured: {', '.join(unmeasured[:8])}{' ...' if len(unmeasured) > 8 else ''}" if unmeasured else ""))
    if measured == 0:
        return result(7, title, f"not run (no peer was measured: {', '.join(unmeasured[:8])})", "")
    if losses:
        return result(7, title, "FAIL", "; ".join(losses) + "; " + detail)
    return result(7, title, "PASS", ("among the peers measured: " if unmeasured else "") + detail)


def evaluate(paths, no_gpu=None):
    """(header, the seven target lines, notes) from the given JSON files. no_gpu: the
    reason this machine has no GPU; every target is then "not run (no GPU: ...)"."""
    bench, peers, peers_path, unread = Bench(), None, None, []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            unread.append(f"{path}: {e}")
            continue
        if isinstance(data, dict) and "benchmarks" in data:
            bench.add(path, data)
        elif isinstance(data, dict) and "rows" in data:
            peers, peers_path = data, path
        else:
            unread.append(f"{path}: neither Google Benchmark JSON nor peers results.json")
    header = (f"# bench: {', '.join(bench.files) or 'none'} ({'medians of repetitions' if bench.medians else 'single runs'}, "
              f"device {', '.join(sorted(bench.devices)) or '?'}); peers: {peers_path or 'none'}")
    lines = [target_1(bench), target_2(bench), target_3(bench), target_4(bench), target_5(bench), target_6(bench),
             target_7(peers, peers_path)]
    if no_gpu:
        lines = [result(n, title, f"not run ({no_gpu})", "") for n, title in TITLES.items()]
    notes = [f"# benchmark not measured: {note}" for note in bench.notes] + [f"# not read: {u}" for u in unread]
    return header, lines, notes


def tally(lines):
    passed = sum(" PASS " in l for l in lines)
    failed = sum(" FAIL " in l for l in lines)
    return passed, failed, len(lines) - passed - failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    ap.add_argument("--no-gpu", metavar="REASON", help="this machine has no GPU (why): every target is not run")
    args = ap.parse_args()
    header, lines, notes = evaluate(args.files, args.no_gpu)
    print(header)
    print("\n".join(lines))
    for note in notes:
        print(note)
    passed, failed, not_run = tally(lines)
    print(f"# {passed} PASS, {failed} FAIL, {not_run} not run")
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
