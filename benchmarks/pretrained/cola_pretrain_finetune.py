"""Does a pretrained trunk learn CoLA where a scratch one predicts the majority (dev MCC
0.00, docs/multitask.md)? Issue 39, item 6, at the scale this machine allows: a small
random GPT-2 (byte-level BPE trained here on the bundled English text) is first
pretrained by packtrain's own LM head on that text — CoLA's training sentences, their
labels unused, and the bundled English fortunes — then fine-tuned on CoLA with both
heads (`MultiTaskModel(trunk=the pretrained folder)`); the same model fine-tuned from
its random start, for the same epochs, is the scratch baseline. Dev MCC and accuracy
of both, stated whatever they are. Nothing is downloaded.

    PYTHONPATH=build/python python benchmarks/pretrained/cola_pretrain_finetune.py --out results.json
"""
import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import tokenizers
import torch
import transformers

import packtrain

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", ROOT / "data"))
EOT = "<|endoftext|>"


def cola(name):
    rows = [line.split("\t") for line in (DATA / "cola" / name).read_text().splitlines()]
    return [r[3] for r in rows], [int(r[1]) for r in rows]


def english_fortunes():
    rows = [line.split("\t", 1) for line in (DATA / "fortunes-languages" / "train.tsv").read_text().splitlines()]
    names = (DATA / "fortunes-languages" / "labels.txt").read_text().split()
    return [text for label, text in rows if names[int(label)].lower() == "english"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--pretrain-epochs", type=int, default=8)
    parser.add_argument("--finetune-epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-balance", action="store_true",
                        help="fine-tune without balance_classes (CoLA's train set is 70%% acceptable: the plain "
                             "loss lets a weak model answer the majority class, MCC 0)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train, labels = cola("in_domain_train.tsv")
    dev, dev_labels = cola("in_domain_dev.tsv")
    corpus = train + english_fortunes()
    work = Path(tempfile.mkdtemp())
    start_dir = work / "random"
    start_dir.mkdir()
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
        vocab_size=2000, special_tokens=[EOT], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(start_dir / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=args.width, n_layer=args.layers,
        n_head=args.width // 32, bos_token_id=eot, eos_token_id=eot)).save_pretrained(start_dir)
    common = dict(buckets=[32, 64], batch_size=32, warmup_steps=100, device="cpu", classes=2)

    t0 = time.perf_counter()
    pretrain = packtrain.MultiTaskModel(trunk=str(start_dir), classification_weight=0.0, lm_weight=1.0, lr=1e-3,
                                        **common)
    pretrain.fit(corpus, [0] * len(corpus), epochs=args.pretrain_epochs,
                 callback=lambda r: print(f"  pretrain epoch {r['epoch']}: LM loss {r['lm_loss']:.3f}", flush=True))
    pretrain.save_pretrained(work / "pretrained")
    pretrain_s = time.perf_counter() - t0

    results = {}
    for name, folder in (("scratch (random trunk)", start_dir), ("pretrained trunk", work / "pretrained")):
        t0 = time.perf_counter()
        model = packtrain.MultiTaskModel(trunk=str(folder), lr=3e-4, balance_classes=not args.no_balance, **common)
        model.fit(train, labels, epochs=args.finetune_epochs,
                  callback=lambda r: print(f"  {name} epoch {r['epoch']}: classification loss "
                                           f"{r['classification_loss']:.3f}", flush=True))
        metrics = model.evaluate(dev, dev_labels)
        results[name] = {**{k: metrics[k] for k in ("accuracy", "mcc", "lm_loss", "perplexity") if k in metrics},
                         "seconds": time.perf_counter() - t0}
        print(f"{name:<24} dev MCC {metrics['mcc']:+.3f}, accuracy {metrics['accuracy']:.3f} "
              f"(majority {max(dev_labels.count(0), dev_labels.count(1)) / len(dev_labels):.3f}), "
              f"LM perplexity {metrics.get('perplexity', float('nan')):.2f}", flush=True)
    out = {"width": args.width, "layers": args.layers, "pretrain_epochs": args.pretrain_epochs,
           "finetune_epochs": args.finetune_epochs, "balance_classes": not args.no_balance,
           "corpus_sentences": len(corpus), "pretrain_seconds": pretrain_s,
           "results": results, "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
