#!/usr/bin/env python3
"""Finds repository paths named in comments and docs that do not exist.

A comment that says `see runtime/ensemble_trainer.h` outlives a move of that
file unless something reads it. This script reads the comments of the C++,
CUDA, Python, shell and CMake files and the whole text of the Markdown files
the repository tracks, takes every token that looks like a repository path
(`runtime/trainers/ensemble/ensemble_steps.h`, `ensemble/optimizers/`,
`packtrain/graphs/captured_step.h`, `optimizers/adam_math.h` beside its
folder) and reports those that name no tracked file or folder, and every
relative Markdown link that leads nowhere from its own file's folder (or to a
heading the file does not have):

    scripts/check_stale_paths.py [--root DIR]   # exit 1 and one line per stale path
    scripts/check_stale_paths.py --self-test    # the check itself, on a made-up tree

What counts as a path: a token of two or more `/`-separated parts that ends in a
known extension (.h, .cpp, .cu, .py, .sh, .md, .cmake, .txt, .json, .toml, .csv,
.svg) or in `/`, and whose first part is a folder of the repository (a top-level
one, or one that exists somewhere in it, such as `trainers/` or `optimizers/`).
Headers of other projects (`torch/nn.h`, `ATen/cuda/CUDAGraph.h`) start with no
such folder and are not checked. A path is found when it exists relative to the
repository root, to the file's own folder or one above it, or to a layer's folder
(`packtrain/<layer>/...` is the include spelling of `<layer>/...`). Placeholders
(`<layer>`, `*`, `{a,b}`) end a token, so `include/packtrain/<layer>/` is not read.
Tracked means in git's index: a new file counts once it is `git add`ed. Registered
as the CTest test StalePaths (and StalePathsSelfTest).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

EXTENSIONS = (".h", ".hpp", ".cpp", ".cu", ".py", ".sh", ".md", ".cmake", ".txt", ".json", ".toml", ".csv",
              ".svg", ".in")
# A path token: parts of word characters, dots and dashes joined by '/', not
# preceded by a character that would make it part of a URL, a variable or a
# longer name (':' of https://, '$', '~', '<', '.', '/', word characters).
PATH_TOKEN = re.compile(r"(?<![\w.$~:/<@-])((?:[\w.-]+/)+[\w.-]*)")
LAYERS = ("base", "profiling", "ensemble", "graphs", "runtime")

# Tokens that look like repository paths but name files of something else; each
# with where it lives.
NOT_REPOSITORY_PATHS = {
    "peers/results.json": "the GPU run's output tarball (scripts/device/phase.sh peers)",
    "peers/peers/results.json": "the GPU run's output tarball, unpacked (scripts/device/README.md)",
}

C_LIKE = (".h", ".hpp", ".cpp", ".cu", ".cc")
HASH_COMMENTS = (".py", ".sh", ".cmake", ".toml", ".in")


def tracked_files(root):
    """The repository's tracked files (git ls-files), or every file under root
    when root is not a git checkout (the self-test's tree)."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout
        return [p for p in out.decode().split("\0") if p]
    except (subprocess.CalledProcessError, FileNotFoundError):
        files = []
        for dirpath, _, names in os.walk(root):
            for name in names:
                files.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
        return files


def comment_text(path, text):
    """The parts of a file a reader takes as prose: comments of code files, all of
    a Markdown file. Lines of code are blanked (kept as empty lines, so line
    numbers stay right)."""
    name = os.path.basename(path)
    if path.endswith(".md"):
        return text
    lines = text.split("\n")
    out = []
    if path.endswith(C_LIKE):
        in_block = False
        for line in lines:
            kept = []
            i = 0
            while i < len(line):
                if in_block:
                    end = line.find("*/", i)
                    if end < 0:
                        kept.append(line[i:])
                        break
                    kept.append(line[i:end])
                    i, in_block = end + 2, False
                    continue
                if line.startswith("#include", i):
                    break  # an include is checked by the compiler
                line_comment, block = line.find("//", i), line.find("/*", i)
                if line_comment >= 0 and (block < 0 or line_comment < block):
                    kept.append(line[line_comment + 2:])
                    break
                if block >= 0:
                    i, in_block = block + 2, True
                    continue
                break
            out.append(" ".join(kept))
        return "\n".join(out)
    if path.endswith(HASH_COMMENTS) or name == "CMakeLists.txt" or name == "run":
        in_docstring = False
        for line in lines:
            stripped = line.strip()
            if path.endswith(".py") and (stripped.startswith('"""') or in_docstring):
                # Python docstrings are documentation too.
                quotes = stripped.count('"""')
                out.append(line)
                if quotes % 2 == 1:
                    in_docstring = not in_docstring
                continue
            hash_at = line.find("#")
            out.append(line[hash_at + 1:] if hash_at >= 0 else "")
        return "\n".join(out)
    return ""


def candidates(text, known_dirs):
    """(line, token) for every token of text that looks like a repository path."""
    for number, line in enumerate(text.split("\n"), start=1):
        for match in PATH_TOKEN.finditer(line):
            token = match.group(1).rstrip(".,;:)")
            parts = token.rstrip("/").split("/")
            if len(parts) < 2 or token in NOT_REPOSITORY_PATHS:
                continue  # a lone folder (`trainers/`) is too common a word to check
            if not token.endswith("/") and not token.endswith(EXTENSIONS):
                continue
            first = parts[0]
            if first == "packtrain" and len(parts) > 1 and parts[1] in LAYERS:
                yield number, token
            elif first in known_dirs and not first.startswith("."):
                yield number, token


def exists(token, source, files, dirs):
    """Whether token names a tracked file or folder, relative to the root, to the
    source file's folder or one above it, or to a layer's folder."""
    path = token.rstrip("/")
    if path.startswith("packtrain/"):
        path = path[len("packtrain/"):]
    bases = [""]
    folder = os.path.dirname(source)
    while folder:
        bases.append(folder + "/")
        folder = os.path.dirname(folder)
    bases += [layer + "/" for layer in LAYERS]
    for base in bases:
        full = os.path.normpath(base + path).replace(os.sep, "/")
        if full in files or full in dirs:
            return True
    return False


# This script's own examples name made-up paths on purpose.
SELF = "scripts/check_stale_paths.py"


def stale_paths(root, skip=(SELF,)):
    files = tracked_files(root)
    file_set = set(files)
    dirs = set()
    for f in files:
        d = os.path.dirname(f)
        while d:
            dirs.add(d)
            d = os.path.dirname(d)
    known_dirs = {part for d in dirs for part in d.split("/")}
    found = []
    for source in sorted(files):
        if source in skip or source.startswith("data/"):
            continue
        full = os.path.join(root, source)
        if not os.path.isfile(full):
            continue
        try:
            with open(full, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        for line, token in candidates(comment_text(source, text), known_dirs):
            if not exists(token, source, file_set, dirs):
                found.append((source, line, token))
        if source.endswith(".md"):
            found += [(source, line, target) for line, target in broken_links(source, text, file_set, dirs, root)]
    return sorted(set(found), key=lambda f: (f[0], f[1], f[2]))  # a link's text and target may name one path


MARKDOWN_LINK = re.compile(r"\]\(([^()\s#]*)(?:#([^()\s]*))?\)")


def heading_anchors(text):
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation
    dropped, spaces to dashes; a repeated heading gets -1, -2, ..."""
    anchors, seen, fenced = set(), {}, False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"^#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_links(source, text, files, dirs, root):
    """(line, target) for every relative Markdown link that leads nowhere: a link
    is read relative to its own file's folder, so a section moved into docs/ must
    have its links rewritten; a link to a heading (`guide.md#checkpoints`) must
    name one of that file's headings."""
    folder = os.path.dirname(source)
    for number, line in enumerate(text.split("\n"), start=1):
        for match in MARKDOWN_LINK.finditer(line):
            target, anchor = match.group(1), match.group(2)
            if re.match(r"^[a-z]+:", target) or target.startswith("/"):
                continue  # https:, mailto:, an absolute path: not the repository's
            full = os.path.normpath(os.path.join(folder, target)).replace(os.sep, "/") if target else source
            if full not in files and full not in dirs:
                yield number, target
            elif anchor and full.endswith(".md") and full in files:
                with open(os.path.join(root, full), encoding="utf-8") as f:
                    if anchor not in heading_anchors(f.read()):
                        yield number, f"{target}#{anchor}"


def self_test():
    """The check on a made-up tree: one stale path of each kind must be reported,
    and none of the paths that exist."""
    files = {
        "ensemble/packed_mlp.h": "// Uses ensemble/packed_linear.h and optimizers/adam.h (beside it).\n"
                                 "// Moved: ensemble/packed_gone.h.\n#include \"ensemble/not_checked.h\"\n",
        "ensemble/packed_linear.h": "/* packtrain/ensemble/packed_mlp.h, and\n   runtime/old_trainer.h */\n",
        "ensemble/optimizers/adam.h": "// torch/nn.h and ATen/cuda/CUDAGraph.h are not ours.\n",
        "runtime/trainers/steps.cpp": "// trainers/steps.cpp is here; runtime/trainers/ too; runtime/profile/ is not.\n",
        "scripts/tool.py": "\"\"\"Reads scripts/missing_tool.sh.\"\"\"\nx = 'runtime/in_code.h'  # runtime/trainers/steps.cpp\n",
        "docs/guide.md": "See [it](../ensemble/packed_mlp.h), ensemble/packed_mlp.h and docs/gone.md;\n"
                         "`packtrain/`, `trainers/` and peers/results.json are not checked.\n"
                         "A [link](ensemble/packed_mlp.h) is read from docs/, [this one](../ensemble/) too.\n"
                         "Links to [a heading](#a-heading-here) and [none](#no-heading).\n"
                         "## A heading, here\n",
    }
    expected = {("ensemble/packed_mlp.h", 2, "ensemble/packed_gone.h"),
                ("ensemble/packed_linear.h", 2, "runtime/old_trainer.h"),
                ("runtime/trainers/steps.cpp", 1, "runtime/profile/"),
                ("scripts/tool.py", 1, "scripts/missing_tool.sh"),
                ("docs/guide.md", 1, "docs/gone.md"),
                ("docs/guide.md", 3, "ensemble/packed_mlp.h"),
                ("docs/guide.md", 4, "#no-heading")}
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
        found = set(stale_paths(root))
    if found != expected:
        print("self-test failed:\n  missed: {}\n  wrongly reported: {}".format(
            sorted(expected - found), sorted(found - expected)))
        return 1
    print(f"self-test passed: {len(expected)} stale paths reported, none of the existing ones")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the repository's root (default: this script's checkout)")
    parser.add_argument("--self-test", action="store_true", help="check the check on a made-up tree")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    found = stale_paths(args.root)
    for source, line, token in found:
        print(f"{source}:{line}: '{token}' names no file or folder of the repository")
    if found:
        print(f"{len(found)} stale path(s): fix the comment, or the path if the file moved")
        return 1
    print("no stale paths in comments and docs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
