"""GPT-2's byte-level BPE in C++ (runtime/data/bpe_tokenizer.h) against Hugging Face's
`tokenizers` (PyPI), the implementation transformers uses: a byte-level BPE trained
here, offline, on the bundled multilingual fortunes, saved both as tokenizer.json and
as GPT-2's vocab.json + merges.txt, must encode a corpus of non-ASCII text, whitespace
runs, contractions, digits, emoji and special tokens to the same ids, and decode back."""
import os
from pathlib import Path

import pytest

from packtrain import _core

tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed (scripts/setup.sh installs it)")

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", ROOT / "data"))
SPECIAL = ["<|endoftext|>", "<|pad|>"]


def fortunes(name):
    return [line.split("\t", 1)[1] for line in (DATA / "fortunes-languages" / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIAL,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(fortunes("train.tsv"), trainer)
    folder = tmp_path_factory.mktemp("bpe")
    tok.save(str(folder / "tokenizer.json"))
    gpt2 = tmp_path_factory.mktemp("gpt2_files")
    tok.model.save(str(gpt2))  # vocab.json + merges.txt, GPT-2's own files
    return tok, folder, gpt2


CORPUS = [
    "Hello world! It's what they've said, isn't it? We'll see; I'd go, you're late, I'm here.",
    "  leading spaces,\ttabs\t\tand\n\nnewlines   and trailing   ",
    "Ünïcödé: café, naïve, São Paulo, Straße, ἀρχή, русский текст, 日本語のテキスト, 한국어",
    "numbers 12345 and 3.14159, 1e-3, -42, ½ ¾, ٣٤٥",
    "emoji 🙂🚀 and symbols ©®™ <> {} [] \\ | ~ ` ^",
    "special<|endoftext|>tokens <|pad|> in the middle<|endoftext|>",
    "nbsp\u00a0here and ideographic\u3000space and \u2003em",
    "",
    " ",
    "a",
]


@pytest.mark.parametrize("source", ["tokenizer.json", "vocab.json + merges.txt"])
def test_encoding_equals_tokenizers_on_the_corpus(trained, source):
    tok, folder, gpt2 = trained
    ours = _core.BpeTokenizer(str(folder if source == "tokenizer.json" else gpt2))
    texts = CORPUS + fortunes("dev.tsv")
    if source != "tokenizer.json":
        # GPT-2's files carry no added tokens but <|endoftext|> (from the vocab): texts without the others.
        tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        texts = [t for t in texts if "<|pad|>" not in t]
    assert ours.vocab_size == tok.get_vocab_size()
    for text in texts:
        expected = tok.encode(text).ids
        assert ours.encode(text) == expected, text
        assert ours.decode(expected).decode("utf-8") == tok.decode(expected, skip_special_tokens=False), text


def test_special_tokens_and_bad_input(trained, tmp_path):
    tok, folder, _ = trained
    ours = _core.BpeTokenizer(str(folder))
    assert ours.encode("<|endoftext|>") == [tok.token_to_id("<|endoftext|>")]
    assert ours.token_id("<|pad|>") == tok.token_to_id("<|pad|>")
    with pytest.raises(ValueError, match="is not in the vocabulary"):
        ours.decode([10**6])
    with pytest.raises(ValueError, match="neither tokenizer.model .* nor tokenizer.json, nor vocab.json and merges.txt"):
        _core.BpeTokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordPiece"}}')
    with pytest.raises(ValueError, match="model type 'WordPiece' is not BPE"):
        _core.BpeTokenizer(str(tmp_path))
