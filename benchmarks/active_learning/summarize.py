"""Tables and one plot from `packtrain active-learn` learning curves.

usage: summarize.py OUT_SVG DIR [DIR ...]

Each DIR holds one <strategy>.csv per strategy, all from the same --al-seed (so the
same initial labelled rows); the random column is taken from the CSVs that have one
(runs with --no-random-baseline leave it empty; random's curve depends only on the
seeds, not on the strategy beside it). Prints a markdown table per DIR (test accuracy
in %, mean over the --runs of that invocation, and the difference to random), then,
with several DIRs, the mean over them. Plots the mean over the DIRs to OUT_SVG.
"""
import csv
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.fonttype"] = "none"
matplotlib.rcParams["svg.hashsalt"] = "packtrain"
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ("bald", "batchbald", "entropy", "margin")


def read(directory):
    curves, random = {}, None
    for f in sorted(directory.glob("*.csv")):
        rows = list(csv.DictReader(open(f)))
        s = f.stem
        curves[s] = {int(r["labelled"]): float(r[f"{s}_accuracy"]) for r in rows}
        if rows[0]["random_accuracy"]:
            rnd = {int(r["labelled"]): float(r["random_accuracy"]) for r in rows}
            if random is None or len(rnd) > len(random):
                random = rnd
    return curves, random


def table(title, curves, random):
    order = [s for s in ORDER if s in curves]
    labels = sorted(random)
    print(f"\n{title}\n")
    print("| labelled | random | " + " | ".join(order) + " |")
    print("|---|---|" + "---|" * len(order))
    for n in labels:
        cells = [f"{100 * random[n]:.1f}"]
        for s in order:
            a = curves[s].get(n)
            cells.append("" if a is None else f"{100 * a:.1f} ({100 * (a - random[n]):+.1f})")
        print(f"| {n} | " + " | ".join(cells) + " |")
    h = len(labels) // 2
    for part in (labels[:h], labels[h:]):
        mean = lambda c: 100 * sum(c[n] for n in part) / len(part)  # noqa: E731
        print(f"\nmean over labelled {part[0]}-{part[-1]}: random {mean(random):.1f}; " +
              "; ".join(f"{s} {mean(curves[s]):.1f}" for s in order))


def main():
    out = pathlib.Path(sys.argv[1])
    dirs = [pathlib.Path(d).resolve() for d in sys.argv[2:]]
    read_all = [read(d) for d in dirs]
    for d, (curves, random) in zip(dirs, read_all):
        table(d.name, curves, random)
    common = [s for s in ORDER if all(s in c for c, _ in read_all)]
    labels = sorted(read_all[0][1])
    avg = lambda key: {n: sum((c[key] if key != "random" else r)[n] for c, r in read_all) / len(read_all)  # noqa: E731
                       for n in labels}
    mean_curves = {s: avg(s) for s in common}
    mean_random = avg("random")
    if len(dirs) > 1:
        table(f"mean over {len(dirs)} initial sets ({', '.join(d.name for d in dirs)})", mean_curves, mean_random)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s, c in [("random", mean_random)] + [(s, mean_curves[s]) for s in common]:
        ax.plot(labels, [c[n] for n in labels], label=s, marker="o", ms=3, lw=1.2,
                color="black" if s == "random" else None, ls="--" if s == "random" else "-")
    ax.set_xlabel("labelled rows")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"acquisition vs random, mean over {len(dirs)} x runs")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, metadata={"Date": None})


if __name__ == "__main__":
    main()
