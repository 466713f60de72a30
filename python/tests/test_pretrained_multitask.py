"""A GPT-2 or Llama checkpoint as the multi-task trunk (issue 39, item 4 on one process): a
small random GPT-2 saved by transformers beside a byte-level BPE tokenizer trained here
(nothing downloaded) is `MultiTaskModel(trunk=folder)`'s / `multitask train --trunk`'s
starting point — its greedy generation is transformers' before training, both heads
train in one step on it, the checkpoint reloads with the trunk's tokenizer, and
save_pretrained / `multitask export` write a folder transformers loads with the same
greedy continuation. A small random Llama beside a SentencePiece tokenizer.model does
the same with its own tokenizer."""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import packtrain

transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup.sh installs it)")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", ROOT / "data"))
CLI = os.environ.get("PACKTRAIN_BINARY")
EOT = "<|endoftext|>"


def fortunes(name):
    rows = [line.split("\t", 1) for line in (DATA / "fortunes-languages" / name).read_text().splitlines()]
    return [text for _, text in rows], [int(label) for label, _ in rows]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    texts, _ = fortunes("train.tsv")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=[EOT], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("gpt2_trunk")
    tok.save(str(path / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    save_random(transformers.GPT2LMHeadModel, transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=eot, eos_token_id=eot), path)
    return path


def save_random(model_class, config, path):
    """A random model of `config`, its weights moved off transformers' start (norms at
    1, biases at 0), saved to `path`."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(path)


def greedy_continuation(model_dir, prompt, new_tokens):
    """transformers' greedy continuation of `prompt`, decoded up to <|endoftext|>."""
    tok = tokenizers.Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    model = transformers.GPT2LMHeadModel.from_pretrained(model_dir).eval()
    ids = tok.encode(prompt).ids
    out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                         attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         pad_token_id=tok.token_to_id(EOT))[0, len(ids):].tolist()
    eot = tok.token_to_id(EOT)
    return tok.decode(out[:out.index(eot)] if eot in out else out)


OPTIONS = dict(members=2, buckets=[32, 64], batch_size=8, lr=3e-3, warmup_steps=0, device="cpu", classes=5)
PROMPT = "Il capo ha sempre"


def test_a_loaded_trunk_generates_as_transformers_then_trains_both_heads(folder, tmp_path):
    texts, labels = fortunes("train.tsv")
    untrained = packtrain.MultiTaskModel(trunk=str(folder), **OPTIONS).fit(texts[:64], labels[:64], epochs=0)
    expected = greedy_continuation(folder, PROMPT, 12)
    assert len(expected) > 5  # a real continuation, not an immediate end of text
    assert untrained.generate(PROMPT, max_new_tokens=12, temperature=0) == [expected, expected]  # both members
    model = packtrain.MultiTaskModel(trunk=str(folder), **OPTIONS).fit(texts[:200], labels[:200], epochs=4)
    history = model.history_
    assert history[-1]["lm_loss"] < history[0]["lm_loss"] and history[-1]["classification_loss"] < history[0][
        "classification_loss"]
    assert model.score(texts[:3]).shape == (3, 5)
    # The checkpoint reloads with the trunk's tokenizer: the same continuations.
    model.save(tmp_path / "mt.ckpt")
    again = packtrain.MultiTaskModel.load(tmp_path / "mt.ckpt")
    trained = model.generate(PROMPT, max_new_tokens=12, temperature=0)
    assert again.generate(PROMPT, max_new_tokens=12, temperature=0) == trained
    # Written back, transformers continues the prompt as the trained member 1 does.
    model.save_pretrained(tmp_path / "hf", member=1)
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    assert greedy_continuation(tmp_path / "hf", PROMPT, 12) == trained[1]
    np.testing.assert_array_equal(again.score(texts[:3]), model.score(texts[:3]))


@pytest.mark.skipif(not CLI, reason="needs the packtrain CLI (PACKTRAIN_BINARY)")
def test_multitask_train_trunk_and_export_from_the_cli(folder, tmp_path):
    texts, labels = fortunes("train.tsv")
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"{label}\t{text}\n" for label, text in zip(labels[:96], texts[:96])))
    dev = tmp_path / "dev.tsv"
    dev.write_text((DATA / "fortunes-languages" / "dev.tsv").read_text())
    run = subprocess.run([CLI, "multitask", "train", "--trunk", str(folder), "--train", str(train), "--dev", str(dev),
                          "--class-names", str(DATA / "fortunes-languages" / "labels.txt"), "--buckets", "32,64",
                          "--batch", "8", "--epochs", "1", "--device", "cpu", "--json", "-o",
                          str(tmp_path / "cli.ckpt")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(run.stdout)
    assert out["dev_metrics"]["examples"] > 0
    exported = subprocess.run([CLI, "multitask", "export", str(tmp_path / "cli.ckpt"), str(tmp_path / "out")],
                              capture_output=True, text=True)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    generated = subprocess.run([CLI, "multitask", "generate", str(tmp_path / "cli.ckpt"), "--prompt", PROMPT,
                                "--temperature", "0", "--max-new-tokens", "12", "--json", "--device", "cpu"],
                               capture_output=True, text=True)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert json.loads(generated.stdout)["continuations"][0] == greedy_continuation(tmp_path / "out", PROMPT, 12)
    # --member-lrs reads one float per member: a count that is not K is refused by name.
    rates = subprocess.run([CLI, "multitask", "train", "--trunk", str(folder), "--train", str(train), "--dev", str(dev),
                            "--buckets", "32,64", "--members", "3", "--member-lrs", "1e-3,2.5e-3", "--device", "cpu"],
                           capture_output=True, text=True)
    assert rates.returncode == 2 and "member_lrs holds 2 learning rates for 3 members" in rates.stderr, rates.stderr
    # A folder that is not a checkpoint: exit 2 naming it.
    bad = subprocess.run([CLI, "multitask", "train", "--trunk", str(tmp_path), "--train", str(train), "--dev",
                          str(dev), "--epochs", "1", "--device", "cpu"], capture_output=True, text=True)
    assert bad.returncode == 2 and "config.json" in bad.stdout + bad.stderr


def train_one_and_split(trunk, tmp_path, sentences, epochs):
    """`multitask train --trunk` on the first `sentences` sentences, in one process
    (one.ckpt) and over two pipeline ranks (split.ckpt): (its arguments, one process's
    dev metrics, rank 0's)."""
    texts, labels = fortunes("train.tsv")
    train = tmp_path / "t.tsv"
    train.write_text("".join(f"{label}\t{text}\n" for label, text in zip(labels[:sentences], texts[:sentences])))
    common = ["multitask", "train", "--trunk", str(trunk), "--train", str(train), "--dev",
              str(DATA / "fortunes-languages" / "dev.tsv"), "--class-names",
              str(DATA / "fortunes-languages" / "labels.txt"), "--buckets", "32,64", "--batch", "8", "--epochs",
              str(epochs), "--device", "cpu", "--json"]
    one = subprocess.run([CLI, *common, "-o", str(tmp_path / "one.ckpt")], capture_output=True, text=True)
    assert one.returncode == 0, one.stdout + one.stderr
    split = subprocess.run([CLI, "launch", "--nproc", "2", "--", *common, "--pipeline-stages", "2", "-o",
                            str(tmp_path / "split.ckpt")], capture_output=True, text=True, timeout=600)
    assert split.returncode == 0, split.stdout + split.stderr
    rank0 = "\n".join(line[len("[rank 0] "):] for line in split.stdout.splitlines() if line.startswith("[rank 0] "))
    return common, json.loads(one.stdout)["dev_metrics"], json.loads(rank0[rank0.index("{"):])["dev_metrics"]


@pytest.mark.skipif(not CLI, reason="needs the packtrain CLI (PACKTRAIN_BINARY)")
def test_a_loaded_trunk_split_over_two_pipeline_ranks_trains_as_one_process(folder, tmp_path):
    """`launch --nproc 2 -- multitask train --trunk DIR --pipeline-stages 2`: the loaded
    blocks placed over two ranks, the tied embedding's copies on the first and last
    stage; the run ends where one process ends (dev metrics, greedy continuation).
    Data parallel over two ranks ends near it."""
    common, ours, theirs = train_one_and_split(folder, tmp_path, sentences=64, epochs=2)
    for key in ("accuracy", "lm_loss"):
        assert theirs[key] == pytest.approx(ours[key], rel=1e-4), key

    def greedy(ckpt):
        out = subprocess.run([CLI, "multitask", "generate", str(ckpt), "--prompt", PROMPT, "--temperature", "0",
                              "--max-new-tokens", "10", "--json", "--device", "cpu"], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)["continuations"]

    assert greedy(tmp_path / "split.ckpt") == greedy(tmp_path / "one.ckpt")
    # Data parallel (two ranks, half the batch each, gradients averaged): each rank's
    # LM loss is its own rows' token mean, so the run ends near, not at, one process.
    dp = subprocess.run([CLI, "launch", "--nproc", "2", "--", *common, "-o", str(tmp_path / "dp.ckpt")],
                        capture_output=True, text=True, timeout=600)
    assert dp.returncode == 0, dp.stdout + dp.stderr
    rank0 = "\n".join(line[len("[rank 0] "):] for line in dp.stdout.splitlines() if line.startswith("[rank 0] "))
    assert json.loads(rank0[rank0.index("{"):])["dev_metrics"]["lm_loss"] == pytest.approx(ours["lm_loss"], rel=1e-3)


def test_packtrains_own_trunk_exports_as_a_gpt2_transformers_loads(tmp_path):
    """A trunk trained from scratch (byte tokenizer, exact GELU) written by save_pretrained
    is a GPT-2 transformers loads: the same greedy bytes after BOS."""
    texts, labels = fortunes("train.tsv")
    model = packtrain.MultiTaskModel(width=32, layers=2, heads=4, max_length=64, buckets=[32, 64], batch_size=8,
                                     classes=5, device="cpu").fit(texts[:64], labels[:64], epochs=1)
    model.save_pretrained(tmp_path / "own")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "own").eval()
    assert loaded.config.activation_function == "gelu" and loaded.config.vocab_size == 259
    prompt = "Die Katze"
    ids = [257] + list(prompt.encode())  # BOS, then the bytes (runtime/data/byte_tokenizer.h)
    out = loaded.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, pad_token_id=256,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
    out = out[:out.index(258)] if 258 in out else out  # up to EOS
    expected = bytes(b for b in out if b < 256).decode("utf-8", errors="replace")
    assert len(expected) == 10  # ten bytes, no early end
    assert model.generate(prompt, max_new_tokens=10, temperature=0) == [expected]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A small random Llama (grouped-query attention, untied head) beside a SentencePiece
    tokenizer.model trained here, as a Llama checkpoint folder holds them."""
    from test_sentencepiece_tokenizer import train_llama_tokenizer
    path = tmp_path_factory.mktemp("llama_trunk")
    sp = train_llama_tokenizer(path, vocab_size=400)
    save_random(transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=sp.get_piece_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        bos_token_id=sp.bos_id(), eos_token_id=sp.eos_id()), path)
    return path


def llama_greedy_continuation(model_dir, prompt, new_tokens):
    """transformers' greedy continuation of BOS + `prompt`'s pieces, decoded up to EOS."""
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=str(Path(model_dir) / "tokenizer.model"))
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir).eval()
    ids = [sp.bos_id(), *sp.encode(prompt)]
    out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                         attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         pad_token_id=sp.eos_id())[0, len(ids):].tolist()
    return sp.decode(out[:out.index(sp.eos_id())] if sp.eos_id() in out else out)


def test_a_llama_trunk_with_its_sentencepiece_tokenizer_generates_trains_and_saves_back(llama_folder, tmp_path):
    pytest.importorskip("sentencepiece")
    texts, labels = fortunes("train.tsv")
    untrained = packtrain.MultiTaskModel(trunk=str(llama_folder), **OPTIONS).fit(texts[:64], labels[:64], epochs=0)
    expected = llama_greedy_continuation(llama_folder, PROMPT, 12)
    assert len(expected) > 5
    assert untrained.generate(PROMPT, max_new_tokens=12, temperature=0) == [expected, expected]
    model = packtrain.MultiTaskModel(trunk=str(llama_folder), **OPTIONS).fit(texts[:200], labels[:200], epochs=3)
    history = model.history_
    assert history[-1]["lm_loss"] < history[0]["lm_loss"]
    assert history[-1]["classification_loss"] < history[0]["classification_loss"]
    trained = model.generate(PROMPT, max_new_tokens=12, temperature=0)
    model.save_pretrained(tmp_path / "hf", member=0)
    assert (tmp_path / "hf" / "tokenizer.model").exists()
    assert llama_greedy_continuation(tmp_path / "hf", PROMPT, 12) == trained[0]


def test_k_adapters_train_as_one_pack_each_as_it_would_alone(folder, tmp_path):
    """K LoRA adapters on the one frozen trunk (lora_rank), each with its own learning
    rate (member_lrs): member k of the pack ends where one adapter trained alone
    (first_member=k, lr its rate, the same seed and batches) ends;
    the ensemble's predictive distribution and its BALD score come per text (baal is
    the reference); a member saved back is a plain GPT-2 transformers loads."""
    baal_heuristics = pytest.importorskip("baal.active.heuristics")
    texts, labels = fortunes("train.tsv")
    dev, _ = fortunes("dev.tsv")
    adapters = dict(OPTIONS, lora_rank=4, lora_alpha=8.0, seed=3)
    rates = [1e-2, 3e-3, 2e-2]
    pack = packtrain.MultiTaskModel(trunk=str(folder), **{**adapters, "members": 3, "member_lrs": rates})
    pack.fit(texts[:96], labels[:96], epochs=2)
    assert pack.history_[-1]["classification_loss"] < pack.history_[0]["classification_loss"]
    members = pack.member_probabilities(dev[:40])
    assert members.shape == (3, 40, 5)
    np.testing.assert_allclose(members.mean(0), pack.score(dev[:40]), rtol=1e-12)
    for k in range(3):
        alone = packtrain.MultiTaskModel(trunk=str(folder), **{**adapters, "members": 1, "first_member": k,
                                                               "lr": rates[k]})
        alone.fit(texts[:96], labels[:96], epochs=2)
        np.testing.assert_allclose(alone.member_probabilities(dev[:40])[0], members[k], atol=2e-4)
    assert np.abs(members[0] - members[1]).max() > 1e-3  # the members differ
    u = pack.uncertainty(dev[:40])
    by_baal = members.transpose(1, 2, 0)  # (N, C, K): baal's layout
    np.testing.assert_allclose(u["mutual_information"], baal_heuristics.BALD().compute_score(by_baal), atol=1e-9)
    np.testing.assert_allclose(u["entropy"], baal_heuristics.Entropy().compute_score(by_baal), atol=1e-9)
    # Member 2 saved back: the trunk with its adapter merged in, greedy as packtrain's member 2.
    pack.save_pretrained(tmp_path / "hf", member=2)
    assert greedy_continuation(tmp_path / "hf", PROMPT, 12) == pack.generate(PROMPT, max_new_tokens=12,
                                                                             temperature=0)[2]
    # The checkpoint holds the adapters only and reloads onto the same trunk.
    pack.save(tmp_path / "pack.ckpt")
    np.testing.assert_array_equal(packtrain.MultiTaskModel.load(tmp_path / "pack.ckpt").score(dev[:5]),
                                  pack.score(dev[:5]))
    with pytest.raises(ValueError, match="member_lrs holds 2 learning rates for 3 members"):
        packtrain.MultiTaskModel(trunk=str(folder), **{**adapters, "members": 3, "member_lrs": [1e-3, 1e-3]}).fit(
            texts[:16], labels[:16], epochs=1)
    with pytest.raises(ValueError, match="lora_rank=4 trains adapters on a pretrained trunk"):
        packtrain.MultiTaskModel(**{**adapters, "trunk": ""}).fit(texts[:16], labels[:16], epochs=1)


@pytest.mark.skipif(not CLI, reason="needs the packtrain CLI (PACKTRAIN_BINARY)")
def test_a_llama_trunk_trains_from_the_cli_and_splits_over_two_pipeline_ranks(llama_folder, tmp_path):
    """`multitask train --trunk LLAMA` reads the sentence files with the SentencePiece
    tokenizer; over two pipeline ranks (rotary blocks on both stages, the untied head on
    the last) it ends where one process ends, and the checkpoint generates."""
    pytest.importorskip("sentencepiece")
    _, ours, theirs = train_one_and_split(llama_folder, tmp_path, sentences=48, epochs=1)
    for key in ("accuracy", "lm_loss"):
        assert theirs[key] == pytest.approx(ours[key], rel=1e-4), key
    generated = subprocess.run([CLI, "multitask", "generate", str(tmp_path / "one.ckpt"), "--prompt", PROMPT,
                                "--temperature", "0", "--max-new-tokens", "8", "--json", "--device", "cpu"],
                               capture_output=True, text=True)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert len(json.loads(generated.stdout)["continuations"]) == 1  # one member


def test_adapter_members_stop_early_each_at_its_own_best_epoch(folder, tmp_path):
    """patience=1 on K adapters of one trunk, one learning fast enough to overfit: the
    validation loss the run reports for each member after each epoch is scikit-learn's
    log_loss of that member's probabilities, the run ends when every member has
    stopped, and each member ends with the probabilities of its best epoch. From the
    CLI, --patience does the same on the dev file and says who stopped."""
    metrics = pytest.importorskip("sklearn.metrics")
    texts, labels = fortunes("train.tsv")
    dev, dev_labels = fortunes("dev.tsv")
    dev, dev_labels = dev[:40], dev_labels[:40]
    options = dict(OPTIONS, lora_rank=4, lora_alpha=8.0, seed=3, members=3, member_lrs=[3e-3, 3e-2, 0.3],
                   patience=1)
    seen = []  # (each member's log loss by scikit-learn, each member's probabilities) after every epoch

    def after_epoch(report):
        p = pack.member_probabilities(dev)
        seen.append(([metrics.log_loss(dev_labels, p[k], labels=range(5)) for k in range(3)], p))

    pack = packtrain.MultiTaskModel(trunk=str(folder), **options)
    with pytest.raises(ValueError, match="patience=1 watches each member's loss on validation sentences"):
        pack.fit(texts[:64], labels[:64], epochs=2)
    pack.fit(texts[:64], labels[:64], epochs=12, validation=(dev, dev_labels), callback=after_epoch)
    assert len(pack.history_) < 12, "no member stopped: the test exercises nothing"
    assert pack.history_[-1]["members_training"] == 0
    best = [None] * 3  # per member: [loss, probabilities, stopped, epoch] of its best epoch
    for epoch, (report, (losses, probabilities)) in enumerate(zip(pack.history_, seen), start=1):
        for k in range(3):
            if best[k] is not None and best[k][2]:
                np.testing.assert_array_equal(probabilities[k], best[k][1])  # frozen at its best
                continue
            if any(f"member {k} stopped early at epoch {epoch}" in e for e in report["events"]):
                # Measured no better on this epoch's weights, then its best epoch's restored.
                assert report["member_validation_loss"][k] >= best[k][0]
                np.testing.assert_allclose(probabilities[k], best[k][1], atol=1e-12)
                best[k][2] = True
                continue
            assert report["member_validation_loss"][k] == pytest.approx(losses[k], rel=1e-6), (epoch, k)
            assert best[k] is None or losses[k] < best[k][0], f"member {k} should have stopped at epoch {epoch}"
            best[k] = [losses[k], probabilities[k], False, epoch]
    assert all(b[2] for b in best)
    final = pack.member_probabilities(dev)
    for k in range(3):
        np.testing.assert_allclose(final[k], best[k][1], atol=1e-12, err_msg=f"member {k}")
    if not CLI:
        return
    train = tmp_path / "t.tsv"
    train.write_text("".join(f"{label}\t{text}\n" for label, text in zip(labels[:64], texts[:64])))
    run = subprocess.run([CLI, "multitask", "train", "--trunk", str(folder), "--train", str(train), "--dev",
                          str(DATA / "fortunes-languages" / "dev.tsv"), "--class-names",
                          str(DATA / "fortunes-languages" / "labels.txt"), "--buckets", "32,64", "--batch", "8",
                          "--members", "2", "--lora-rank", "4", "--member-lrs", "0.003,0.5", "--patience", "1",
                          "--epochs", "12", "--device", "cpu", "--json", "-o", str(tmp_path / "p.ckpt")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    epochs = json.loads(run.stdout)["epochs"]
    assert len(epochs) < 12 and epochs[-1]["members_training"] == 0
    assert any("member 1 stopped early at epoch" in e for epoch in epochs for e in epoch["events"])
