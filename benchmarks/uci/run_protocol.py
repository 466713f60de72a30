#!/usr/bin/env python3
"""The standard UCI regression protocol over the nine bundled sets, with packtrain.

Every standard split of each set (20; protein 5): train on the split's training rows
(a seeded 10% of them held out for validation, as `packtrain train` does), report the
ensemble's test RMSE and the NLL of its moment-matched Gaussian (what the
deep-ensemble papers report) in original units; mean ± sd over splits, and the
seconds per split (whole `packtrain train` process). The test rows are never seen in
training or in any choice: a recipe's choices are fixed in advance or made by
`--select best` on the validation rows.

Recipes:
  paper    Lakshminarayanan et al. (2017)'s setting: 5 members, one hidden layer of 50
           (100 for protein), 40 epochs, batch 100, Adam, no bagging (shared order);
           the learning rate chosen per split on the validation rows from 1e-3, 3e-3,
           1e-2 (a sweep in one pack, --select best).
  default  packtrain train's defaults (16 members, 2 x 64, no dropout, AdamW 3e-3,
           weight decay 1e-4, batch 64, up to 200 epochs): the stopping epoch chosen on
           the validation rows (the ensemble's validation NLL, patience 50, the best
           epoch's weights kept), then the predictive variance recalibrated on the
           same validation rows (--recalibrate variance: one scale, the moment-matched
           Gaussian NLL's minimum there).
  default-uncalibrated  the defaults with --recalibrate none (the default recipe
           before recalibration existed).
  default-bf16  the defaults with --precision bf16-mixed (issue 40: bfloat16 products,
           float32 weights, optimizer, losses and metrics), beside default in one run.
  The recipes below, measured before recalibration existed, keep --recalibrate none.
  dropout  the defaults with --dropout 0.1 after each hidden activation.
  default-dropout-select  the defaults with the dropout rate chosen per split on the
           validation rows from 0 and 0.1 (32 members in one pack, --select best keeps
           16).
  select   the defaults without dropout, 5 members per configuration and the weight
           decay chosen on the validation rows from 1e-4, 1e-3, 1e-2 (15 members in
           one pack, --select best keeps 5).
  select-dropout  as select, crossed with dropout 0 and 0.1 (30 members, 5 kept).

The published column is the Deep Ensembles column of Table 1 of Lakshminarayanan,
Pritzel and Blundell, "Simple and Scalable Predictive Uncertainty Estimation using
Deep Ensembles", NeurIPS 2017 (pp. 6402-6413), copied from the paper's text; their
recipe also used adversarial training (epsilon 0.01 x each input's range).

Usage: run_protocol.py [--build-dir build] [--recipes paper,default] [--datasets a,b]
                       [--splits N] [--out benchmarks/uci/results] [--markdown-only] [--append]
Writes results.json and results.md into --out (--markdown-only: results.md again from
the results.json there; --append: keeps the rows already there for other data sets or
recipes, and names the earlier runs' commands).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# Lakshminarayanan et al. (2017), Table 1, Deep Ensembles: (RMSE mean, sd), (NLL mean, sd)
# over the same splits; values as printed (two decimals).
PUBLISHED = {
    "bostonHousing": ((3.28, 1.00), (2.41, 0.25)),
    "concrete": ((6.03, 0.58), (3.06, 0.18)),
    "energy": ((2.09, 0.29), (1.38, 0.22)),
    "kin8nm": ((0.09, 0.00), (-1.20, 0.02)),
    "naval-propulsion-plant": ((0.00, 0.00), (-5.63, 0.05)),
    "power-plant": ((4.11, 0.17), (2.79, 0.04)),
    "protein-tertiary-structure": ((4.71, 0.06), (2.83, 0.02)),
    "wine-quality-red": ((0.64, 0.04), (0.94, 0.12)),
    "yacht": ((1.58, 0.48), (1.18, 0.21)),
}
DATASETS = ["bostonHousing", "concrete", "energy", "kin8nm", "naval-propulsion-plant", "power-plant",
            "protein-tertiary-structure", "wine-quality-red", "yacht"]


def recipe_flags(recipe, dataset):
    if recipe == "paper":
        hidden = 100 if dataset.startswith("protein") else 50
        return ["--members", "5", "--depth", "1", "--hidden", str(hidden), "--epochs", "40", "--batch", "100",
                "--optimizer", "adam", "--weight-decay", "0", "--dropout", "0", "--order", "shared",
                "--lr", "1e-3,3e-3,1e-2", "--select", "best", "--recalibrate", "none"]
    if recipe == "default":
        return []
    none = ["--recalibrate", "none"]
    if recipe == "default-uncalibrated":
        return none
    if recipe == "default-bf16":
        return ["--precision", "bf16-mixed"]
    if recipe == "select":
        return ["--members", "5", "--weight-decay", "1e-4,1e-3,1e-2", "--dropout", "0", "--select", "best", *none]
    if recipe == "select-dropout":
        return ["--members", "5", "--weight-decay", "1e-4,1e-3,1e-2", "--dropout", "0,0.1", "--select", "best", *none]
    if recipe == "dropout":
        return ["--dropout", "0.1", *none]
    if recipe == "default-dropout-select":
        return ["--dropout", "0,0.1", "--select", "best", *none]
    raise ValueError(recipe)


def splits_of(dataset):
    with open(os.path.join(ROOT, "data", dataset, "n_splits.txt")) as f:
        return int(f.read().split()[0])


def run_split(binary, dataset, split, recipe):
    command = [binary, "train", "--data", dataset, "--split", str(split), "--device", "cpu", "--json", "--quiet",
               *recipe_flags(recipe, dataset)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-400:]}")
    out = json.loads(done.stdout)
    chosen = None
    if "configurations" in out:
        kept = [c for c in out["configurations"]
                if out["members"][c["first_member"]]["status"] != "deselected"]
        if len(kept) == 1:
            c = kept[0]
            swept = [k for k in ("lr", "weight_decay", "dropout")
                     if len({d.get(k) for d in out["configurations"]}) > 1]
            chosen = ", ".join(f"{k.replace('weight_decay', 'wd')} {c[k]:g}" for k in swept)
    best = [m.get("best_epoch") for m in out["members"] if m.get("status") != "deselected"]
    best = [b for b in best if isinstance(b, int) and b > 0]
    return {"split": split, "rmse": out["ensemble"]["rmse"], "nll": out["ensemble"]["nll"],
            "epochs": max(best) if best else None,
            "mixture_nll": out["calibration"]["mixture_nll"], "seconds": seconds, "chosen_lr": chosen,
            "variance_scale": out.get("variance_scale", 1.0),
            "coverage_90": next(i["coverage"] for i in out["calibration"]["intervals"] if i["level"] == 0.9)}


def summary(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def compare(mean, published):
    """'at' (equal at the paper's two decimals, or below), 'within sd', or 'above'."""
    value, sd = published
    if round(mean, 2) <= value:
        return "at or below"
    return "within 1 sd" if mean <= value + sd + 0.005 else "above"


def write_markdown(results, path):
    lines = [f"# packtrain on the standard UCI protocol: {results['machine']}, {results['date']}", "",
             "Every standard split (20; protein 5): test RMSE and NLL of the ensemble's moment-matched Gaussian "
             "(original units), mean ± sd over splits; s/split: the whole `packtrain train` process. Test rows "
             "never enter training or any choice. Recipes: " + "; ".join(
                 f"**{r}**: {results['recipes'][r]}" for r in results["recipes"]) + ".", "",
             "Published: Lakshminarayanan et al. (2017), Table 1, Deep Ensembles (5 networks, 1 x 50, 40 epochs, "
             "adversarial training), as printed. vs published: at or below its mean at its two decimals, within one "
             "published sd above it, or above.", "",
             *([f"Command: `{results.get('command', '')}` (packtrain {results.get('commit', '?')}); rows of other data "
                "sets from earlier runs into the same directory: " + "; ".join(
                    f"`{e.get('command', '')}` ({e.get('date', '')}, packtrain {e.get('commit', '?')})"
                    for e in results["earlier"]), ""] if results.get("earlier") else []),
             "| data set | splits | recipe | RMSE | NLL | published RMSE | published NLL | vs published (RMSE; NLL) "
             "| NLL of the mixture | 90% coverage | variance scale (median) | s/split | choices (splits) |",
             "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    tally = {}
    for row in results["rows"]:
        rm, rs = summary([s["rmse"] for s in row["splits"]])
        nm, ns = summary([s["nll"] for s in row["splits"]])
        mm, ms = summary([s["mixture_nll"] for s in row["splits"]])
        cov = statistics.mean(s["coverage_90"] for s in row["splits"])
        secs = statistics.mean(s["seconds"] for s in row["splits"])
        scale = statistics.median(s.get("variance_scale", 1.0) for s in row["splits"])  # 1: not recalibrated
        chosen = {}
        for s in row["splits"]:
            if s["chosen_lr"] is not None:
                chosen[s["chosen_lr"]] = chosen.get(s["chosen_lr"], 0) + 1
        chosen_text = ", ".join(f"{c} ({n})" for c, n in sorted(chosen.items()))
        epochs = [s["epochs"] for s in row["splits"] if s.get("epochs") is not None]
        if epochs and row["recipe"] != "paper":
            chosen_text = f"best epoch {min(epochs)}-{max(epochs)} (median {statistics.median(epochs):g})"
        (pr, prs), (pn, pns) = PUBLISHED[row["dataset"]]
        verdict = (compare(rm, (pr, prs)), compare(nm, (pn, pns)))
        both = all(v == "at or below" for v in verdict)
        tally.setdefault(row["recipe"], [0, 0, 0])
        tally[row["recipe"]][0] += both
        tally[row["recipe"]][1] += all(v != "above" for v in verdict)
        tally[row["recipe"]][2] += 1
        lines.append(f"| {row['dataset']} | {len(row['splits'])} | {row['recipe']} | {rm:.3f} ± {rs:.3f} | "
                     f"{nm:.2f} ± {ns:.2f} | {pr:.2f} ± {prs:.2f} | {pn:.2f} ± {pns:.2f} | "
                     f"{verdict[0]}; {verdict[1]} | {mm:.2f} ± {ms:.2f} | {cov:.1%} | {scale:.3g} | {secs:.1f} | "
                     f"{chosen_text or 'fixed'} |")
    lines.append("")
    for recipe, (both, within, sets) in tally.items():
        lines.append(f"**{recipe}**: at or below the published mean RMSE and NLL on {both} of {sets} sets; "
                     f"at or within one published sd on both on {within} of {sets}.")
    lines += ["", f"Command: `{results['command']}`. packtrain {results['commit']}."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--recipes", default="paper,default")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--splits", type=int, default=None, help="at most this many splits per set (default: all)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--markdown-only", action="store_true", help="rewrite results.md from --out's results.json")
    ap.add_argument("--append", action="store_true",
                    help="keep --out's earlier rows of other (data set, recipe) pairs, with their commands")
    args = ap.parse_args()
    if args.markdown_only:
        with open(os.path.join(args.out, "results.json")) as f:
            write_markdown(json.load(f), os.path.join(args.out, "results.md"))
        print(open(os.path.join(args.out, "results.md")).read())
        return 0
    binary = os.path.join(args.build_dir, "bin", "packtrain")
    if not os.access(binary, os.X_OK):
        ap.error(f"{binary} not found: build packtrain (cmake --build build) or pass --build-dir")
    os.makedirs(args.out, exist_ok=True)
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
               "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "commit": commit,
               "recipes": {r: " ".join(recipe_flags(r, "concrete")) or "packtrain train's defaults"
                           for r in args.recipes.split(",")},
               "rows": []}
    earlier = os.path.join(args.out, "results.json")
    if args.append and os.path.exists(earlier):
        with open(earlier) as f:
            before = json.load(f)
        ran = {(d, r) for d in args.datasets.split(",") for r in args.recipes.split(",")}
        results["rows"] = [row for row in before["rows"] if (row["dataset"], row["recipe"]) not in ran]
        results["earlier"] = [{k: before[k] for k in ("date", "command", "commit") if k in before}] + \
            before.get("earlier", [])
        results["recipes"] = {**before.get("recipes", {}), **results["recipes"]}
    for dataset in args.datasets.split(","):
        n = splits_of(dataset) if args.splits is None else min(args.splits, splits_of(dataset))
        for recipe in args.recipes.split(","):
            row = {"dataset": dataset, "recipe": recipe, "splits": []}
            for split in range(n):
                row["splits"].append(run_split(binary, dataset, split, recipe))
                print(f"[uci] {dataset} split {split} {recipe}: RMSE {row['splits'][-1]['rmse']:.4f}, "
                      f"NLL {row['splits'][-1]['nll']:.3f}", file=sys.stderr, flush=True)
            results["rows"].append(row)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
            write_markdown(results, os.path.join(args.out, "results.md"))
    print(open(os.path.join(args.out, "results.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
