#!/usr/bin/env python3
"""Which tests need a GPU, by one documented rule: a test needs a GPU when its full
gtest name (Suite.Test, Instantiation/Suite.Test/param) matches /cuda|gpu/i. Every
device-parameterized test has a .../cuda instance, and a plain test that needs a GPU
says so in its name (Cli.ACpuCheckpointEvaluatesPredictsExportsAndResumesOnTheGpu,
MemoryEstimate.FreeDeviceMemoryIsReadOnAGpu, CheckpointFile.CudaTensors_LoadOnCpu).

Usage:
  gpu_tests.py list BINARY      the binary's GPU tests, one a line (from --gtest_list_tests)
  gpu_tests.py filter BINARY    the same as one gtest filter (':'-separated)
  gpu_tests.py lint [TESTS_DIR] plain TEST/TEST_F bodies that use a CUDA device
                                (kCUDA, "cuda...") under a name the rule misses;
                                exit 1 when there is one (bundle.sh runs it)
Standard library only.
"""
import pathlib
import re
import subprocess
import sys

RULE = re.compile(r"cuda|gpu", re.IGNORECASE)


def listed(binary):
    """Every test of a gtest binary, full names, in the binary's order."""
    text = subprocess.run([binary, "--gtest_list_tests"], capture_output=True, text=True, timeout=120).stdout
    names, suite = [], ""
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split()[0]
        else:
            names.append(suite + line.split()[0])
    return names


def gpu_tests(names):
    return [n for n in names if RULE.search(n)]


def lint(tests_dir):
    """(file, Suite.Test) for plain tests that use a CUDA device but whose name the rule misses."""
    start = re.compile(r"^(?:TEST|TEST_F)\((\w+),\s*(\w+)\)", re.M)
    uses_cuda = re.compile(r'kCUDA|"cuda')
    missed = []
    for path in sorted(pathlib.Path(tests_dir).rglob("*.cpp")):
        text = path.read_text(errors="replace")
        for m in start.finditer(text):
            end = text.find("\n}", m.end())
            body = text[m.end():end if end >= 0 else len(text)]
            name = f"{m.group(1)}.{m.group(2)}"
            if uses_cuda.search(body) and not RULE.search(name):
                missed.append((str(path), name))
    return missed


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("list", "filter", "lint"):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "lint":
        missed = lint(sys.argv[2] if len(sys.argv) > 2 else "tests")
        for path, name in missed:
            print(f"{path}: {name} uses a CUDA device but its name does not match /cuda|gpu/i: "
                  "the GPU run would not select it (name it ...OnAGpu / ...Cuda...)")
        return 1 if missed else 0
    names = gpu_tests(listed(sys.argv[2]))
    print(":".join(names) if sys.argv[1] == "filter" else "\n".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
