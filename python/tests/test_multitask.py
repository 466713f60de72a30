"""The multi-task transformer from Python: trains on labelled sentences, scores,
generates, and its checkpoint is the CLI's."""
import os
import subprocess

import numpy as np
import pytest

import packtrain

CLI = os.environ.get("PACKTRAIN_BINARY")
TEXTS = ["the cat sat on the mat.", "mat the on sat cat the.", "a dog ran in the park.", "park the in ran dog a."] * 8
LABELS = [1, 0, 1, 0] * 8
SMALL = dict(width=32, layers=1, heads=2, batch_size=8, buckets=[32], max_length=32, warmup_steps=2, lr=3e-3)


def test_trains_scores_and_generates(tmp_path):
    model = packtrain.MultiTaskModel(device="cpu", **SMALL).fit(TEXTS, LABELS, epochs=15)
    history = model.history_
    assert len(history) == 15 and history[-1]["lm_loss"] < history[0]["lm_loss"]
    probs = model.score(["the cat sat on the mat.", "mat the on sat cat the."])
    assert probs.shape == (2, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1, rtol=1e-6)
    metrics = model.evaluate(TEXTS, LABELS)
    assert metrics["examples"] == len(TEXTS) and 0 <= metrics["accuracy"] <= 1 and metrics["perplexity"] > 1
    first = model.generate("the cat", max_new_tokens=12, seed=3)
    assert len(first) == 1 and first == model.generate("the cat", max_new_tokens=12, seed=3)  # the seed decides
    model.save(tmp_path / "mt.ckpt")
    again = packtrain.MultiTaskModel.load(tmp_path / "mt.ckpt")
    np.testing.assert_allclose(again.score(TEXTS[:4]), model.score(TEXTS[:4]), rtol=1e-6)
    if CLI:  # the CLI reads the same checkpoint
        out = subprocess.run([CLI, "multitask", "score", str(tmp_path / "mt.ckpt"), TEXTS[0], "--json"],
                             capture_output=True, text=True, check=True).stdout
        assert '"probabilities"' in out or "probab" in out


def test_rejects_unknown_options_and_mismatched_labels():
    with pytest.raises(TypeError, match="unknown option"):
        packtrain.MultiTaskModel(widht=3)
    with pytest.raises(ValueError, match="differ in length"):
        packtrain.MultiTaskModel(device="cpu", **SMALL).fit(TEXTS, LABELS[:-1], epochs=1)


def _yes_no_tsv(rows):
    lines = [f"{k % 2}\t{'yes the cat sat.' if k % 2 else 'no a dog ran.'}" for k in range(rows)]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(not CLI, reason="needs the packtrain CLI (PACKTRAIN_BINARY) to write a run's checkpoint")
def test_resume_multitask_continues_a_cli_run_exactly(tmp_path):
    (tmp_path / "train.tsv").write_text(_yes_no_tsv(16))
    (tmp_path / "dev.tsv").write_text(_yes_no_tsv(8))
    shape = ["--width", "16", "--layers", "1", "--heads", "2", "--max-length", "32", "--batch", "4",
             "--buckets", "16,32", "--device", "cpu", "-q", "--train", str(tmp_path / "train.tsv"),
             "--dev", str(tmp_path / "dev.tsv")]
    for epochs, name in ((1, "a.ckpt"), (3, "b.ckpt")):
        subprocess.run([CLI, "multitask", "train", *shape, "--epochs", str(epochs), "-o", str(tmp_path / name)],
                       check=True, capture_output=True)
    reports = []
    resumed = packtrain.resume_multitask(tmp_path / "a.ckpt", epochs=3, device="cpu", callback=reports.append)
    assert [r["epoch"] for r in reports] == [2, 3] and resumed.history_ == reports
    straight = packtrain.MultiTaskModel.load(tmp_path / "b.ckpt")
    texts = ["yes the cat sat.", "no a dog ran."]
    np.testing.assert_array_equal(resumed.score(texts), straight.score(texts))  # as if it had not stopped
    with pytest.raises(ValueError, match="is at epoch 3"):
        packtrain.resume_multitask(tmp_path / "b.ckpt", epochs=3, device="cpu")
    with pytest.raises(FileNotFoundError):
        packtrain.resume_multitask(tmp_path / "none.ckpt")
