"""Step time of a loaded GPT-2 trunk (issue 39, item 6): packtrain's trunk loaded from a
checkpoint folder against transformers' GPT2LMHeadModel in eager PyTorch and under
torch.compile, on the same batch: one next-token loss forward + backward (no optimizer:
the part the trunk's code decides). Random models of the tests' small shape and of
GPT-2 small's (124 M parameters), built here; nothing is downloaded. Medians of
--repeats timed steps after --warmup, every system in this one process (the same
LibTorch, the same intra-op threads), interleaved round by round.

    PYTHONPATH=build/python python benchmarks/pretrained/trunk_step.py --threads 1 --out results.json
"""
import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from packtrain import _core

SHAPES = {
    "small": dict(vocab_size=1000, n_positions=256, n_embd=64, n_layer=2, n_head=4),
    "gpt2-small": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,gpt2-small")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for shape in args.shapes.split(","):
        config = transformers.GPT2Config(**SHAPES[shape], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).train()
        folder = Path(tempfile.mkdtemp()) / shape
        model.save_pretrained(folder)
        trunk = _core.PretrainedTrunk(str(folder))
        tokens = torch.randint(0, config.vocab_size, (args.batch, args.length),
                               generator=torch.Generator().manual_seed(1))
        compiled = torch.compile(model)

        def hf_step(m):
            for p in model.parameters():
                p.grad = None
            loss = m(tokens, labels=tokens).loss
            loss.backward()
            return loss.item()

        systems = {
            "packtrain": lambda: trunk.lm_loss_and_gradients(tokens, named=False)[0],
            "transformers eager": lambda: hf_step(model),
            "transformers + torch.compile": lambda: hf_step(compiled),
        }
        losses = {name: step() for name, step in systems.items()}  # also compiles
        for _ in range(args.warmup):
            for step in systems.values():
                step()
        times = {name: [] for name in systems}
        for _ in range(args.repeats):  # interleaved: each round times every system once
            for name, step in systems.items():
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
        for name in systems:
            median = statistics.median(times[name])
            rows.append({"shape": shape, "system": name, "median_s": median, "times_s": times[name],
                         "loss": losses[name], "tokens_per_s": args.batch * args.length / median})
            print(f"{shape:>10}  {name:<30} {median * 1e3:9.1f} ms  loss {losses[name]:.5f}", flush=True)
        base = statistics.median(times["packtrain"])
        for name in systems:
            print(f"{shape:>10}  {name:<30} {statistics.median(times[name]) / base:6.2f}x packtrain's time")
    result = {"batch": args.batch, "length": args.length, "threads": args.threads, "repeats": args.repeats,
              "torch": torch.__version__, "transformers": transformers.__version__,
              "machine": platform.processor() or platform.machine(), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
