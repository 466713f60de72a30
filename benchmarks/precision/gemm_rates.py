"""float32 against bfloat16 matrix products through LibTorch on this CPU (issue 40's
premise): the rate a bf16-mixed pack could reach is bounded by the bfloat16 GEMM rate,
so measure it first, beside float32's, in one run. Two shapes: a square 2048^2 product
and the pack's own (K = 64 members, a batched 128x64 . 64x64). Prints GFLOP/s (medians
of --repeats timings) and whether the CPU has AVX-512 BF16 or AMX (/proc/cpuinfo).

    python benchmarks/precision/gemm_rates.py --threads 2 --out results.json
"""
import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch


def gflops(fn, flops, repeats):
    fn()  # warm-up: oneDNN/MKL pick and cache their kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return flops / statistics.median(times) / 1e9


def cpu_flags():
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags.split() if "bf16" in f or f.startswith("amx"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        x, w = torch.randn(64, 128, 64, dtype=dtype), torch.randn(64, 64, 64, dtype=dtype)

        def batched():
            for _ in range(50):
                torch.bmm(x, w)

        rows[str(dtype).split(".")[1]] = {
            "mm_2048": gflops(lambda: torch.mm(a, b), 2 * 2048**3, args.repeats),
            "bmm_pack_k64": gflops(batched, 50 * 2 * 64 * 128 * 64 * 64, args.repeats),
        }
    flags = cpu_flags()
    for name, r in rows.items():
        print(f"{name:>9}: mm 2048^2 {r['mm_2048']:7.1f} GFLOP/s   bmm K=64 128x64.64x64 {r['bmm_pack_k64']:7.1f} GFLOP/s")
    ratio = {k: rows["bfloat16"][k] / rows["float32"][k] for k in rows["float32"]}
    print(f"bfloat16 / float32: mm {ratio['mm_2048']:.2f}x, pack bmm {ratio['bmm_pack_k64']:.2f}x; "
          f"CPU bf16/AMX flags: {', '.join(flags) or 'none'}")
    if args.out:
        Path(args.out).write_text(json.dumps({"gflops": rows, "bf16_over_fp32": ratio, "cpu_flags": flags,
                                              "threads": args.threads, "torch": torch.__version__,
                                              "machine": platform.processor() or platform.machine()}, indent=1))


if __name__ == "__main__":
    main()
