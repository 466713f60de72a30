"""Issue 51, items 2-7 and 10 from the command line: every file a run reads is an input,
also when it sits inside a folder — a data directory's arrays and UCI files, a --trunk
folder's weights, config and tokenizer files — and no output may replace one (exit 2
before any work, the file untouched); an export folder is an output written as a unit,
never the trunk's own folder nor through a planted symlink; a checkpoint records its
trunk's files and refuses a folder whose files changed; a FIFO in the trunk folder,
a value of the wrong type in its config or tokenizer, a crafted token id and an
absurd --temperature are each one line and exit 2. The trunk is a small random GPT-2
saved by transformers beside a byte-level BPE trained here (nothing downloaded)."""
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup.sh installs it)")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", ROOT / "data")).resolve()
CLI = os.environ.get("PACKTRAIN_BINARY")
EOT = "<|endoftext|>"
pytestmark = pytest.mark.skipif(not CLI, reason="needs the packtrain CLI (PACKTRAIN_BINARY)")


def run(*args, cwd=None, timeout=120):
    env = {**os.environ, "PACKTRAIN_DATA_DIR": str(DATA)}  # absolute: some runs start in another directory
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)


def refused(result, *words):
    """Exit 2, one line, naming each of `words`."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("packtrain: error:"), result.stderr
    for w in words:
        assert str(w) in lines[0], lines[0]


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def fortunes(name):
    rows = [line.split("\t", 1) for line in (DATA / "fortunes-languages" / name).read_text().splitlines()]
    return [text for _, text in rows], [int(label) for label, _ in rows]


def save_gpt2(path, vocab, seed):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=16, n_layer=1, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(path)


@pytest.fixture(scope="module")
def trunk(tmp_path_factory):
    texts, _ = fortunes("train.tsv")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOT], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("trunk")
    tok.save(str(path / "tokenizer.json"))
    save_gpt2(path, tok.get_vocab_size(), seed=0)
    return path


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    texts, labels = fortunes("train.tsv")
    folder = tmp_path_factory.mktemp("texts")
    train = folder / "train.tsv"
    train.write_text("".join(f"{label}\t{text}\n" for label, text in zip(labels[:32], texts[:32])))
    dev = folder / "dev.tsv"
    dev.write_text("".join(f"{label}\t{text}\n" for label, text in zip(labels[32:48], texts[32:48])))
    return ["--train", train, "--dev", dev, "--class-names", DATA / "fortunes-languages" / "labels.txt",
            "--buckets", "64", "--batch", "8", "--device", "cpu"]


def copy_trunk(trunk, to):
    shutil.copytree(trunk, to)
    return to


@pytest.fixture(scope="module")
def lora_checkpoint(trunk, texts, tmp_path_factory):
    """A LoRA pack trained on a copy of the trunk (which the tests then change)."""
    where = tmp_path_factory.mktemp("lora")
    copy = copy_trunk(trunk, where / "trk")
    result = run("multitask", "train", "--trunk", "trk", *texts, "--lora-rank", "2", "--epochs", "1",
                 "-o", where / "lt.ckpt", cwd=where)  # a relative --trunk
    assert result.returncode == 0, result.stdout + result.stderr
    return where / "lt.ckpt", copy


# ---- Item 2: files inside folders are inputs ---------------------------------------------

def test_an_output_onto_a_file_of_an_array_directory_is_refused(tmp_path):
    data = tmp_path / "arrays"
    data.mkdir()
    rng = np.random.default_rng(0)
    np.save(data / "features.npy", rng.normal(size=(64, 3)).astype(np.float32))
    np.save(data / "labels.npy", rng.integers(0, 2, size=64))
    before = digests(data)
    for flag in ["--checkpoint", "--export", "--log"]:
        for name in ["labels.npy", "features.npy"]:
            refused(run("train", "--data", data, "--epochs", "1", flag, data / name),
                    flag, "same file as the input --data", data / name)
    refused(run("active-learn", "--data", data, "--rounds", "1", "--csv", data / "labels.npy"), "--csv")
    assert digests(data) == before


def test_an_output_onto_a_file_of_a_uci_directory_is_refused(tmp_path):
    uci = shutil.copytree(DATA / "concrete", tmp_path / "concrete")
    before = digests(uci)
    for name in ["data.txt", "index_features.txt", "index_train_0.txt"]:
        refused(run("train", "--data", uci, "--epochs", "1", "--checkpoint", uci / name), uci / name)
    # resume reads the same files
    ok = run("train", "--data", uci, "--epochs", "1", "--members", "2", "--checkpoint", tmp_path / "c.ckpt")
    assert ok.returncode == 0, ok.stderr
    refused(run("resume", tmp_path / "c.ckpt", "--epochs", "2", "--checkpoint", uci / "data.txt"), uci / "data.txt")
    assert digests(uci) == before
    # An earlier checkpoint of one's own inside the data folder is still replaced as before.
    again = run("train", "--data", uci, "--epochs", "1", "--members", "2", "--checkpoint", uci / "mine.ckpt")
    assert again.returncode == 0 and run("train", "--data", uci, "--epochs", "1", "--members", "2",
                                         "--checkpoint", uci / "mine.ckpt").returncode == 0


def test_an_output_onto_a_trunk_file_is_refused(trunk, texts, tmp_path):
    copy = copy_trunk(trunk, tmp_path / "trk")
    before = digests(copy)
    for name in ["config.json", "model.safetensors", "tokenizer.json"]:
        refused(run("multitask", "train", "--trunk", copy, *texts, "--epochs", "1", "-o", copy / name),
                "same file as the input --trunk", copy / name)
    ok = run("multitask", "train", "--trunk", copy, *texts, "--epochs", "1", "-o", tmp_path / "m.ckpt")
    assert ok.returncode == 0, ok.stderr
    refused(run("multitask", "resume", tmp_path / "m.ckpt", "--epochs", "2", "-o", copy / "model.safetensors"),
            copy / "model.safetensors")
    assert digests(copy) == before


# ---- Item 3: the export folder -----------------------------------------------------------

def test_export_never_replaces_the_trunk_or_what_is_not_an_export(trunk, texts, tmp_path):
    copy = copy_trunk(trunk, tmp_path / "trk")
    ok = run("multitask", "train", "--trunk", copy, *texts, "--epochs", "1", "-o", tmp_path / "m.ckpt")
    assert ok.returncode == 0, ok.stderr
    before = digests(copy)
    refused(run("multitask", "export", tmp_path / "m.ckpt", copy), "holds the input")
    refused(run("multitask", "export", tmp_path / "m.ckpt", tmp_path / "m.ckpt"), "is a regular file")
    refused(run("multitask", "export", tmp_path / "m.ckpt", tmp_path), "holds the input", tmp_path / "m.ckpt")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's own")
    refused(run("multitask", "export", tmp_path / "m.ckpt", mine), "'notes.txt', which an export does not write")
    refused(run("multitask", "export", tmp_path / "m.ckpt", ""), "empty")
    os.mkfifo(tmp_path / "fifo")
    refused(run("multitask", "export", tmp_path / "m.ckpt", tmp_path / "fifo"), "is a FIFO")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "model.safetensors").mkdir()
    refused(run("multitask", "export", tmp_path / "m.ckpt", busy), "'model.safetensors' is a directory")
    assert digests(copy) == before
    # Over an earlier export holding a planted symlink: replaced as a whole, the victim untouched.
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "tokenizer.json").symlink_to(victim)
    (out / "config.json").write_text('{"n_embd": 512}')
    done = run("multitask", "export", tmp_path / "m.ckpt", out)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious" and not (out / "tokenizer.json").is_symlink()
    assert (out / "tokenizer.json").read_bytes() == (copy / "tokenizer.json").read_bytes()
    assert json.loads((out / "config.json").read_text())["n_embd"] == 16
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp." in p.name) == []
    transformers.GPT2LMHeadModel.from_pretrained(out)  # a folder transformers loads


def test_save_pretrained_into_the_trunk_folder_is_a_value_error(trunk, tmp_path):
    import packtrain
    copy = copy_trunk(trunk, tmp_path / "trk")
    before = digests(copy)
    texts, labels = fortunes("train.tsv")
    model = packtrain.MultiTaskModel(trunk=str(copy), classes=5, batch_size=8, buckets=[64], device="cpu")
    model.fit(texts[:16], labels[:16], epochs=1)
    with pytest.raises(ValueError, match="holds the input"):
        model.save_pretrained(str(copy))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a regular file"):
        model.save_pretrained(str(tmp_path / "file"))
    assert digests(copy) == before


# ---- Item 4: a checkpoint records its trunk's files ---------------------------------------

def test_a_lora_checkpoint_refuses_a_trunk_whose_files_changed(lora_checkpoint, tmp_path):
    ckpt, copy = lora_checkpoint
    # The relative --trunk was recorded absolute: another working directory finds it.
    scored = run("multitask", "score", ckpt, "abc", "--device", "cpu", cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr
    weights = copy / "model.safetensors"
    saved = weights.read_bytes()
    try:
        save_gpt2(tmp_path / "other", json.loads((copy / "config.json").read_text())["vocab_size"], seed=1)
        shutil.copy(tmp_path / "other" / "model.safetensors", weights)  # another GPT-2 of the same shape
        for args in (["score", ckpt, "abc"], ["resume", ckpt, "--epochs", "2", "-o", tmp_path / "r.ckpt"],
                     ["export", ckpt, tmp_path / "e"]):
            refused(run("multitask", *args, *(["--device", "cpu"] if args[0] == "score" else []), cwd=tmp_path),
                    "trunk file", weights, "changed")
    finally:
        weights.write_bytes(saved)
    tokenizer = copy / "tokenizer.json"
    text = tokenizer.read_text()
    try:
        tokenizer.write_text(text + " ")  # the same tokens, other bytes: still another file
        refused(run("multitask", "score", ckpt, "abc", "--device", "cpu"), tokenizer, "changed")
    finally:
        tokenizer.write_text(text)
    assert run("multitask", "score", ckpt, "abc", "--device", "cpu").returncode == 0


# ---- Items 5 and 7: a FIFO, wrong types, crafted ids, an absurd temperature ------------------

@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "model.safetensors.index.json"])
def test_a_fifo_in_the_trunk_folder_is_refused_not_waited_on(trunk, texts, tmp_path, name):
    copy = copy_trunk(trunk, tmp_path / "trk")
    if name == "model.safetensors.index.json":
        (copy / "model.safetensors").unlink()
    else:
        (copy / name).unlink()
    os.mkfifo(copy / name)
    refused(run("multitask", "train", "--trunk", copy, *texts, "--epochs", "1", timeout=60), copy / name, "FIFO")
    (copy / name).unlink()
    (copy / name).mkdir()
    refused(run("multitask", "train", "--trunk", copy, *texts, "--epochs", "1", timeout=60), copy / name,
            "directory")


@pytest.mark.parametrize("key,value", [("activation_function", 5), ("activation_function", None),
                                       ("n_embd", "16"), ("tie_word_embeddings", "yes")])
def test_a_config_value_of_the_wrong_type_is_one_line(trunk, texts, tmp_path, key, value):
    copy = copy_trunk(trunk, tmp_path / "trk")
    config = json.loads((copy / "config.json").read_text())
    config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    refused(run("multitask", "train", "--trunk", copy, *texts, "--epochs", "1"), copy / "config.json", key)


@pytest.mark.parametrize("mutate", ["id -100000", "id 2e9", "id as text", "content 5", "use_regex text"])
def test_a_crafted_tokenizer_is_one_line_not_a_crash(trunk, texts, tmp_path, mutate):
    copy = copy_trunk(trunk, tmp_path / "trk")
    t = json.loads((copy / "tokenizer.json").read_text())
    if mutate == "id -100000":
        t["added_tokens"][0]["id"] = -100000
    elif mutate == "id 2e9":
        t["added_tokens"][0]["id"] = 2_000_000_000
    elif mutate == "id as text":
        t["added_tokens"][0]["id"] = "0"
    elif mutate == "content 5":
        t["added_tokens"][0]["content"] = 5
    else:
        t["pre_tokenizer"]["use_regex"] = "yes"
    (copy / "tokenizer.json").write_text(json.dumps(t))
    refused(run("multitask", "train", "--trunk", copy, *texts, "--epochs", "1", "-o", tmp_path / "x.ckpt"),
            copy / "tokenizer.json")
    assert not (tmp_path / "x.ckpt").exists()


def test_an_absurd_temperature_is_one_line(lora_checkpoint):
    ckpt, _ = lora_checkpoint
    refused(run("multitask", "generate", ckpt, "--prompt", "ab", "--temperature", "1e308", "--device", "cpu"),
            "temperature")


# ---- Item 9: Python's multi-task model -----------------------------------------------------

def test_python_generate_decodes_partial_utf8_and_score_takes_a_list_of_texts(trunk):
    import packtrain
    texts, labels = fortunes("train.tsv")
    model = packtrain.MultiTaskModel(trunk=str(trunk), classes=5, batch_size=8, buckets=[64], device="cpu")
    model.fit(texts[:16], labels[:16], epochs=1)
    # A random trunk over byte-level tokens samples bytes >= 0x80 alone: partial UTF-8.
    outs = [model.generate("ab", max_new_tokens=24, temperature=1.5, top_k=0, seed=s)[0] for s in range(8)]
    assert all(isinstance(o, str) for o in outs)
    assert any("\ufffd" in o for o in outs), outs
    with pytest.raises(TypeError, match="not one str"):
        model.score("abc")
    with pytest.raises(ValueError, match="text 2 is empty"):
        model.score(["abc", ""])
    assert model.score(["abc"]).shape == (1, 5)
