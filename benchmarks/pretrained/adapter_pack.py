"""K LoRA adapters trained as one pack against K separate PEFT runs (issue 39, items 5
and 6). The same training step on the same batches — a classifier on each row's last
real token and the causal-LM loss, one backward, AdamW on the adapters and the
classifier — on one frozen random GPT-2 trunk (built here, with a byte-level BPE
trained here on the bundled fortunes; nothing is downloaded):

  packtrain  MultiTaskModel(trunk=..., members=K, lora_rank=r): the K adapters one
             packed model, the trunk's GEMMs run once per step for all members;
  peft       what a PyTorch user writes: K peft LoRA models (LoraConfig on c_attn,
             c_proj and c_fc, the same rank and alpha) on the trunk, each stepped in
             turn — K forwards, K backwards, K optimizer steps per batch.

Reported: the median time of one training step of all K members (packtrain: an epoch's
seconds over its steps, medians over --epochs epochs; peft: timed steps), and the
memory each needs for its weights and optimizer state: the trunk once plus K adapters,
against K full copies (K fine-tuned models).

    PYTHONPATH=build/python python benchmarks/pretrained/adapter_pack.py --threads 2 --out results.json
"""
import argparse
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import peft
import tokenizers
import torch
import transformers

import packtrain

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", ROOT / "data"))
EOT = "<|endoftext|>"


def fortunes():
    rows = [line.split("\t", 1) for line in (DATA / "fortunes-languages" / "train.tsv").read_text().splitlines()]
    return [text for _, text in rows], [int(label) for label, _ in rows]


def make_trunk(folder, texts, width, layers, length):
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
        vocab_size=1000, special_tokens=[EOT], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    eot = tok.token_to_id(EOT)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=length, n_embd=width, n_layer=layers, n_head=width // 64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=eot, eos_token_id=eot))
    model.save_pretrained(folder)
    return tok, model


def peft_members(model, members, rank, alpha, classes, lr):
    """K peft adapters with a classifier each, and their AdamW optimizers."""
    out = []
    for k in range(members):
        torch.manual_seed(k)
        config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, fan_in_fan_out=True,
                                 target_modules=["c_attn", "c_proj", "c_fc"])
        member = peft.get_peft_model(copy.deepcopy(model), config).train()
        head = torch.nn.Linear(model.config.n_embd, classes)
        trained = [p for p in member.parameters() if p.requires_grad] + list(head.parameters())
        out.append((member, head, torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)))
    return out


def peft_step(members, tokens, lengths, labels, pad):
    """One step of every member: classifier on the last real token + next-token loss."""
    lm_labels = torch.where(torch.arange(tokens.size(1))[None] < lengths[:, None], tokens, -100)
    for member, head, optimizer in members:
        optimizer.zero_grad(set_to_none=True)
        out = member(input_ids=tokens, labels=lm_labels, output_hidden_states=True)
        pooled = out.hidden_states[-1][torch.arange(tokens.size(0)), lengths - 1]
        loss = torch.nn.functional.cross_entropy(head(pooled), labels) + out.loss
        loss.backward()
        optimizer.step()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sentences", type=int, default=160)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts, labels = fortunes()
    texts, labels = texts[:args.sentences], labels[:args.sentences]
    classes, alpha, lr = max(labels) + 1, 2.0 * args.rank, 1e-3
    folder = Path(tempfile.mkdtemp()) / "trunk"
    folder.mkdir()
    tok, model = make_trunk(folder, texts, args.width, args.layers, args.length)

    # packtrain: the K adapters as one pack (every sentence in one bucket of --length).
    pack = packtrain.MultiTaskModel(trunk=str(folder), members=args.members, lora_rank=args.rank, lora_alpha=alpha,
                                    buckets=[args.length], batch_size=args.batch, lr=lr, warmup_steps=0,
                                    weight_decay=0.0, classes=classes, device="cpu")
    pack.fit(texts, labels, epochs=args.epochs)
    per_step = [r["seconds"] / r["steps"] for r in pack.history_[1:] or pack.history_]
    packtrain_s = statistics.median(per_step)

    # peft: the same rows, padded to --length with EOT, stepped member by member.
    eot = tok.token_to_id(EOT)
    ids = [(tok.encode(t).ids + [eot])[:args.length] for t in texts]
    lengths = torch.tensor([len(i) for i in ids])
    tokens = torch.tensor([i + [eot] * (args.length - len(i)) for i in ids])
    y = torch.tensor(labels)
    members = peft_members(model, args.members, args.rank, alpha, classes, lr)
    steps = len(texts) // args.batch
    times = []
    for s in range(min(steps, 2 + 2 * args.epochs)):
        rows = slice((s % steps) * args.batch, (s % steps + 1) * args.batch)
        start = time.perf_counter()
        peft_step(members, tokens[rows], lengths[rows], y[rows], eot)
        times.append(time.perf_counter() - start)
    peft_s = statistics.median(times[2:])

    full = sum(p.numel() for p in model.parameters())
    adapter = sum(p.numel() for p in members[0][0].parameters() if p.requires_grad) + (args.width + 1) * classes
    # Weights + gradients + AdamW's two moments of what trains; the trunk's weights once.
    memory = {"packtrain: trunk once + K adapters": 4 * (full + 4 * args.members * adapter),
              "K full fine-tuned copies": 4 * 4 * args.members * full}
    result = {"members": args.members, "rank": args.rank, "width": args.width, "layers": args.layers,
              "length": args.length, "batch": args.batch, "threads": args.threads,
              "trunk_parameters": full, "adapter_parameters_per_member": adapter,
              "step_s": {"packtrain K-adapter pack": packtrain_s, "peft, K runs in turn": peft_s},
              "peft_over_packtrain": peft_s / packtrain_s, "memory_bytes": memory,
              "torch": torch.__version__, "peft": peft.__version__, "transformers": transformers.__version__,
              "machine": platform.processor() or platform.machine()}
    print(f"K={args.members} adapters of rank {args.rank} on a {full / 1e6:.1f} M-parameter GPT-2 trunk "
          f"({adapter / 1e3:.1f} k trained parameters per member), batch {args.batch} x {args.length} tokens")
    print(f"  packtrain pack:  {packtrain_s * 1e3:8.1f} ms per step of all K members")
    print(f"  peft, K in turn: {peft_s * 1e3:8.1f} ms per step of all K members "
          f"({peft_s / packtrain_s:.2f}x packtrain's time)")
    for what, b in memory.items():
        print(f"  {what:<36} {b / 2**20:8.1f} MiB (weights, gradients, AdamW state)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
