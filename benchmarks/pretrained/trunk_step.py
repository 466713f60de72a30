"""Step time of a loaded GPT-2 or Llama trunk (issue 39, item 6): packtrain's trunk
loaded from a checkpoint folder against transformers' GPT2LMHeadModel /
LlamaForCausalLM in eager PyTorch and under torch.compile, on the same batch: one
next-token loss forward + backward (no optimizer: the part the trunk's code decides).
Random models of a small shape and of GPT-2 small's (124 M parameters) for each family
(the Llama one with grouped-query attention), built here; nothing is downloaded. Medians of
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
    "small": ("gpt2", dict(vocab_size=1000, n_positions=256, n_embd=64, n_layer=2, n_head=4)),
    "gpt2-small": ("gpt2", dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)),
    "llama-small": ("llama", dict(vocab_size=1000, max_position_embeddings=256, hidden_size=64, intermediate_size=172,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)),
    "llama-124m": ("llama", dict(vocab_size=32000, max_position_embeddings=1024, hidden_size=768,
                                 intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                                 num_key_value_heads=4)),
}


def build(shape):
    family, config = SHAPES[shape]
    if family == "gpt2":
        config = transformers.GPT2Config(**config, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return config, transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(**config, tie_word_embeddings=False)
    return config, transformers.LlamaForCausalLM(config)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,gpt2-small,llama-small,llama-124m")
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
        torch.manual_seed(0)
        config, model = build(shape)
        model = model.train()
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
