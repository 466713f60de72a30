#!/usr/bin/env python3
"""Rebuilds data/fortunes-languages/ (the bundled language-identification task of
`packtrain multitask train`) from Debian's fortune-cookie packages.

    python3 scripts/make_fortunes_languages.py [--debs DIR] [--out data/fortunes-languages]

Each package's `.deb` is fetched with `apt-get download` into DIR (default
~/.cache/packtrain/fortunes-debs) unless it is there already, unpacked with
`dpkg-deb -x`, and its cookie files read: a cookie is the text between lines that
are a lone "%". The attribution lines ("-- Author") are dropped, whitespace runs
become one space, and cookies of 30 to 126 UTF-8 bytes are kept (a sentence then
fits the longest bucket, 128 tokens with BOS and EOS, untruncated). Art-like cookies
(under 70% letters and spaces) and texts seen twice (in any language) are dropped.
Then, with a fixed seed, 1,600 training and 200 dev cookies per language are drawn:
the five classes are balanced, so the majority baseline is 20% accuracy and
Matthews correlation 0.

Prints each .deb's version and SHA-256 (recorded in the data's README) and writes
train.tsv and dev.tsv as (label, sentence) rows plus labels.txt, line k naming
class k.
"""
import argparse
import hashlib
import os
import random
import re
import subprocess
import sys
import tempfile

# class, package, where its cookie files are, files left out (pictures, not text)
LANGUAGES = [
    ("English", "fortunes", "usr/share/games/fortunes", {"ascii-art"}),
    ("German", "fortunes-de", "usr/share/games/fortunes/de", {"asciiart"}),
    ("Spanish", "fortunes-es", "usr/share/games/fortunes/es", set()),
    ("Italian", "fortunes-it", "usr/share/games/fortunes/it", {"banner"}),
    ("Portuguese", "fortunes-br", "usr/share/games/fortunes", set()),
]
TRAIN_PER_CLASS, DEV_PER_CLASS = 1600, 200
MIN_BYTES, MAX_BYTES = 30, 126
SEED = 20261123


def fetch(package, debs):
    found = [f for f in os.listdir(debs) if f.startswith(package + "_") and f.endswith(".deb")]
    if not found:
        subprocess.run(["apt-get", "download", package], cwd=debs, check=True)
        found = [f for f in os.listdir(debs) if f.startswith(package + "_") and f.endswith(".deb")]
    if len(found) != 1:
        sys.exit(f"{debs}: expected one {package}_*.deb, found {found}")
    return os.path.join(debs, found[0])


def cookies(directory, skip):
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name in skip or name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        text = open(path, "rb").read().decode("utf-8")
        for cookie in re.split(r"\n%\n", text):
            lines = [l for l in cookie.split("\n") if not l.strip().startswith("--")]
            sentence = " ".join(" ".join(lines).split())
            size = len(sentence.encode("utf-8"))
            if not MIN_BYTES <= size <= MAX_BYTES:
                continue
            if sum(c.isalpha() or c == " " for c in sentence) < 0.7 * len(sentence):
                continue
            yield sentence


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--debs", default=os.path.expanduser("~/.cache/packtrain/fortunes-debs"))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "fortunes-languages"))
    args = parser.parse_args()
    os.makedirs(args.debs, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    per_class, seen, repeated = [], set(), set()
    with tempfile.TemporaryDirectory() as unpacked:
        for label, (language, package, where, skip) in enumerate(LANGUAGES):
            deb = fetch(package, args.debs)
            digest = hashlib.sha256(open(deb, "rb").read()).hexdigest()
            print(f"{language}: {os.path.basename(deb)} sha256 {digest}")
            root = os.path.join(unpacked, package)
            subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
            found = list(cookies(os.path.join(root, where), skip))
            for s in found:
                (repeated if s in seen else seen).add(s)
            per_class.append(found)
    rng = random.Random(SEED)
    train, dev = [], []
    for label, found in enumerate(per_class):
        unique = sorted(set(s for s in found if s not in repeated))
        need = TRAIN_PER_CLASS + DEV_PER_CLASS
        if len(unique) < need:
            sys.exit(f"{LANGUAGES[label][0]}: {len(unique)} usable cookies, {need} needed")
        print(f"{LANGUAGES[label][0]}: {len(unique)} usable cookies, {need} drawn")
        drawn = rng.sample(unique, need)
        train += [(label, s) for s in drawn[:TRAIN_PER_CLASS]]
        dev += [(label, s) for s in drawn[TRAIN_PER_CLASS:]]
    rng.shuffle(train)
    rng.shuffle(dev)
    for name, rows in (("train.tsv", train), ("dev.tsv", dev)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="\n") as f:
            f.writelines(f"{label}\t{s}\n" for label, s in rows)
    with open(os.path.join(args.out, "labels.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.writelines(language + "\n" for language, *_ in LANGUAGES)
    print(f"wrote {len(train)} training and {len(dev)} dev sentences to {args.out}")


if __name__ == "__main__":
    main()
