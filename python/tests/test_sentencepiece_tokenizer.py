"""Llama's SentencePiece tokenizer in C++ (runtime/data/sentencepiece_tokenizer.h,
through Debian's libsentencepiece) against PyPI's `sentencepiece`, the library Llama's
tokenizer.model was made with: a BPE model with byte fallback (Llama's kind), trained
here, offline, on the bundled multilingual fortunes, must encode a corpus of non-ASCII
text, whitespace runs, digits and emoji to the same ids under Llama's convention (BOS,
pieces, EOS for a sentence; BOS, pieces for a prompt) and decode back."""
import os
from pathlib import Path

import pytest

from packtrain import _core

spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed (scripts/setup.sh installs it)")

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PACKTRAIN_DATA_DIR", ROOT / "data"))
CORPUS = [
    "Hello world! It's what they've said, isn't it? We'll see.",
    "  leading spaces,\ttabs\t\tand\n\nnewlines   and trailing   ",
    "Ünïcödé: café, naïve, São Paulo, Straße, ἀρχή, русский текст, 日本語のテキスト, 한국어",
    "numbers 12345 and 3.14159, 1e-3, -42, ½ ¾, ٣٤٥",
    "emoji 🙂🚀 and symbols ©®™ <> {} [] \\ | ~ ` ^",
    "nbsp\u00a0here and ideographic\u3000space",
    "",
    "a",
]


def fortunes(name):
    return [line.split("\t", 1)[1] for line in (DATA / "fortunes-languages" / name).read_text().splitlines()]


def train_llama_tokenizer(folder, vocab_size=600):
    """A SentencePiece model as Llama's: BPE with byte fallback; unk 0, BOS 1, EOS 2, no pad."""
    folder.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(fortunes("train.tsv")),
                                   model_prefix=str(folder / "tokenizer"), vocab_size=vocab_size, model_type="bpe",
                                   byte_fallback=True, character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, num_threads=1, minloglevel=2)
    (folder / "tokenizer.vocab").unlink()
    return spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama_tokenizer")
    return train_llama_tokenizer(folder), folder


def test_encoding_and_decoding_equal_sentencepiece_on_the_corpus(trained):
    sp, folder = trained
    ours = _core.CheckpointTokenizer(str(folder))
    assert ours.vocab == sp.get_piece_size() and ours.end == sp.eos_id() == ours.pad
    for text in CORPUS + fortunes("dev.tsv"):
        pieces = sp.encode(text)
        assert ours.encode(text, 1000) == [sp.bos_id(), *pieces, sp.eos_id()], text
        assert ours.encode_prompt(text, 1000) == [sp.bos_id(), *pieces], text
        # Generated ids decode up to EOS; BOS decodes to nothing, as sentencepiece decodes it.
        assert ours.decode([sp.bos_id(), *pieces, sp.eos_id(), *pieces]).decode("utf-8") == sp.decode(pieces), text
    assert any(sp.id_to_piece(i).startswith("<0x") for i in sp.encode("🙂"))  # byte fallback was exercised


def test_truncation_keeps_the_end_token_and_bad_input_is_refused(trained, tmp_path):
    sp, folder = trained
    ours = _core.CheckpointTokenizer(str(folder))
    text = CORPUS[2]
    assert ours.encode(text, 6) == [sp.bos_id(), *sp.encode(text)[:4], sp.eos_id()]
    with pytest.raises(ValueError, match="the prompt has .* tokens with BOS; the model has 3 positions"):
        ours.encode_prompt(text, 3)
    with pytest.raises(ValueError, match="is not in the vocabulary"):
        ours.decode([10**6])
    (tmp_path / "tokenizer.model").write_bytes(b"not a model proto")
    with pytest.raises(ValueError, match="is not a SentencePiece model"):
        _core.CheckpointTokenizer(str(tmp_path))
    # Without BOS/EOS ids, Llama's convention cannot be kept: refused by name.
    bare = tmp_path / "bare"
    bare.mkdir()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(fortunes("train.tsv")), model_prefix=str(bare / "tokenizer"),
                                   vocab_size=300, model_type="bpe", bos_id=-1, eos_id=-1, num_threads=1,
                                   minloglevel=2)
    with pytest.raises(ValueError, match="has no BOS or no EOS id"):
        _core.CheckpointTokenizer(str(bare))
