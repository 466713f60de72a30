#!/usr/bin/env python3
"""Lists C++ function bodies longer than N lines.

A long function hides its steps; issue 37 asks for functions over ~80 lines to
be cut into named steps. This script finds them by brace matching, without a
compiler: it blanks comments, string and character literals and preprocessor
lines, then walks the braces of each file. A `{` at namespace or class scope
opens a function body when the text since the previous `;`, `{` or `}` holds a
parameter list `(` and no `=` outside parentheses (which would make it an
initializer); `namespace`, `class`, `struct`, `union` and `enum` blocks are
walked into, other blocks are skipped. A constructor's brace initializers
(`: a_{x}, b_{y} {`) count as part of its definition. Macro bodies such as
`TEST(Suite, Name) {` and `PYBIND11_MODULE(m, m) {` count as functions.
Lambdas count as part of the function that holds them. The length is from the
line where the definition starts to the line of its closing brace, both
included.

    scripts/long_functions.py [--root DIR] [--min N] [DIR ...]
        # every function of N lines or more (default 80), longest first:
        # "lines  path:line  name"
    scripts/long_functions.py --max N [--allow NAME ...] [DIR ...]
        # exit 1 and one line per function longer than N lines (a check);
        # --allow names a function (as listed) the check leaves out, for one
        # that is being cut elsewhere
    scripts/long_functions.py --self-test

DIR (a folder or a file) defaults to the source folders: base, ensemble, graphs, profiling, runtime,
python/bindings. Tests, benchmarks and examples are not read unless named.
"""

import argparse
import os
import re
import sys
import tempfile

SOURCE_DIRS = ("base", "ensemble", "graphs", "profiling", "runtime", "python/bindings")
EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
SCOPE_KEYWORDS = re.compile(r"\b(namespace|class|struct|union)\b")
ENUM = re.compile(r"\benum\b")
OPERATOR = re.compile(r"\boperator\s*(?:\(\)|[^\s(]+)")


def blank_code(text):
    """The text with comments, string/char literals and preprocessor lines
    replaced by spaces (newlines kept, so line numbers stay right)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":
            # A preprocessor line, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        line_start = False
        if c == "\n":
            out.append(c)
            line_start = True
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and (i == 0 or not (text[i - 1].isalnum() or
                                                                             text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            end = text.find(")" + delim + '"', open_paren)
            end = n if end < 0 else end + len(delim) + 2
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:end - 1]) + '"')
            i = end
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                # A digit separator (1'000'000).
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


def outside_parens(chunk):
    """The chunk with everything inside parentheses removed."""
    out, depth = [], 0
    for c in chunk:
        if c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(c)
    return "".join(out)


def definition_name(chunk):
    """A short name for the definition whose header is chunk."""
    flat = " ".join(chunk.split())
    paren = flat.find("(")
    head = flat[:paren].split()
    name = head[-1] if head else flat[:40]
    if name.isupper() or name.startswith(("TEST", "PYBIND11")):
        close = flat.find(")", paren)
        return name + flat[paren:close + 1] if close > 0 else name
    return name


def functions(code):
    """(start offset, end offset, name) of every function definition in code."""
    found = []

    def walk(begin, end):
        chunk_start = begin
        k = begin
        while k < end:
            c = code[k]
            if c in ";}":
                chunk_start = k + 1
            elif c == "{":
                chunk = code[chunk_start:k]
                outer = OPERATOR.sub("operator", outside_parens(chunk))
                close = matching_brace(code, k)
                if SCOPE_KEYWORDS.search(outer) and "(" not in chunk:
                    walk(k + 1, close)
                elif "(" in chunk and "=" not in outer and not ENUM.search(outer):
                    # A function body; a constructor's brace initializers and
                    # then its body follow one another.
                    while True:
                        after = close + 1
                        while after < end and code[after].isspace():
                            after += 1
                        if after < end and code[after] in ",{":
                            nxt = code.find("{", after) if code[after] == "," else after
                            if nxt < 0 or nxt >= end:
                                break
                            close = matching_brace(code, nxt)
                            continue
                        break
                    start = chunk_start
                    while start < k and code[start].isspace():
                        start += 1
                    found.append((start, close, definition_name(chunk)))
                k = close
                chunk_start = close + 1
            k += 1

    walk(0, len(code))
    return found


def long_functions(root, dirs, minimum):
    rows = []
    paths = []
    for d in dirs:
        top = os.path.join(root, d)
        if os.path.isfile(top):
            paths.append(top)
        for dirpath, dirnames, names in os.walk(top):
            dirnames.sort()
            paths.extend(os.path.join(dirpath, name) for name in sorted(names) if name.endswith(EXTENSIONS))
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            code = blank_code(f.read())
        for start, close, fname in functions(code):
            first = code.count("\n", 0, start) + 1
            last = code.count("\n", 0, close) + 1
            lines = last - first + 1
            if lines >= minimum:
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                rows.append((lines, f"{rel}:{first}", fname))
    rows.sort(key=lambda r: (-r[0], r[1]))
    return rows


def self_test():
    sample = r'''
#include "x.h"
namespace a {
namespace {
const char* kText = "{ not a brace";
int table[] = {1, 2, 3};
enum class E { A, B };
}  // namespace
struct S {
  int f() const {
    return 1;
  }
};
Foo::Foo(int x) : a_{x}, b_(x) {
  // }
  g();
  g();
}
void long_one(int n = 3) {
  auto l = [] { return '}'; };
  for (;;) {
  }
  auto s = R"(})";
}
TEST(Suite, Name) {
  x();
}
}  // namespace a
'''
    code = blank_code(sample)
    got = [(code.count("\n", 0, s) + 1, code.count("\n", 0, e) + 1, n) for s, e, n in functions(code)]
    want = [(10, 12, "f"), (14, 18, "Foo::Foo"), (19, 24, "long_one"), (25, 27, "TEST(Suite, Name)")]
    if got != want:
        print(f"long_functions self-test: expected {want}, got {got}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "src"))
        with open(os.path.join(tmp, "src", "a.cpp"), "w") as f:
            f.write(sample)
        rows = long_functions(tmp, ["src"], 5)
        if [r[1] for r in rows] != ["src/a.cpp:19", "src/a.cpp:14"]:
            print(f"long_functions self-test: unexpected rows {rows}")
            return 1
    print("long_functions self-test: ok")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--min", type=int, default=80, help="list functions of this many lines or more")
    parser.add_argument("--max", type=int, help="fail when a function is longer than this")
    parser.add_argument("--allow", action="append", default=[], help="a function name --max leaves out")
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("dirs", nargs="*")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)
    dirs = args.dirs or list(SOURCE_DIRS)
    if args.max is not None:
        rows = [r for r in long_functions(root, dirs, args.max + 1) if r[2] not in args.allow]
        for lines, where, name in rows:
            print(f"{where}: {name} is {lines} lines (limit {args.max}): cut it into named steps")
        return 1 if rows else 0
    for lines, where, name in long_functions(root, dirs, args.min):
        print(f"{lines:5d}  {where}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
