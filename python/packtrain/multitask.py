"""MultiTaskModel: the multi-task transformer of `packtrain multitask` — one trunk, a
classification head and a causal-LM head trained together (one trunk forward, one
backward per step; on a GPU each length bucket's step is one captured graph).

    model = packtrain.MultiTaskModel(width=128, layers=2).fit(texts, labels, epochs=6)
    model.score(["The cat sat on the mat."])        # (N, C) class probabilities
    model.generate("The cat", max_new_tokens=40)     # one continuation per member

Options and defaults are `packtrain multitask train`'s (read from the C++ trainer).
`trunk="folder"` starts from a Hugging Face GPT-2 or Llama checkpoint (its shape,
weights and tokenizer); save_pretrained() writes the trained trunk back as one.
`lora_rank=r` with a trunk trains each member as a low-rank adapter on that one frozen
trunk (K adapters as one pack); member_probabilities() and uncertainty() give the
ensemble's predictive distribution and its BALD score.
"""
import json
import os

from . import _core
from .estimators import _check_folder_of, _resolve_device

# The options schema of the C++ trainer (`multitask train`'s flags come from it too):
# each option a Python user may set, with its default.
_DEFAULTS = {f["name"]: f["default"] for f in json.loads(_core.multitask_option_schema()) if f["python"]}


def _texts(texts):
    """`texts` as a list of non-empty str, as `packtrain multitask score` takes them: one
    str is refused (it would be scored as its characters), an empty text too."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"texts must be a list of texts, not one {type(texts).__name__}: pass [text]")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise TypeError(f"text {i + 1} is a {type(text).__name__}, not a str")
        if not text:
            raise ValueError(f"text {i + 1} is empty")
    return out


class MultiTaskModel:
    def __init__(self, device="auto", **options):
        unknown = set(options) - set(_DEFAULTS)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}; options: {', '.join(_DEFAULTS)}")
        self.options = {**_DEFAULTS, **options}
        self.device = device
        self._trainer = None

    def fit(self, texts, labels, epochs=6, callback=None, validation=None):
        """Trains `epochs` epochs on the sentences and their labels (0 .. classes-1).
        `callback(report)` after each epoch (epoch, steps, classification_loss,
        lm_loss, seconds; with patience also member_validation_loss,
        members_training and events); returning False stops. `validation=(texts,
        labels)`: the sentences early stopping (patience=N) watches; the fit ends
        when every member has stopped, each member at its best epoch's weights."""
        texts, labels = list(texts), [int(v) for v in labels]
        if self.options["patience"] > 0 and validation is None:
            raise ValueError(f"patience={self.options['patience']} watches each member's loss on validation "
                             "sentences: pass fit(..., validation=(texts, labels))")
        self._trainer = _core.MultiTask(json.dumps(self.options), _resolve_device(self.device))
        self.truncated_ = self._trainer.set_training_data(texts, labels)
        if validation is not None:
            val_texts, val_labels = validation
            self._trainer.set_validation_data(list(val_texts), [int(v) for v in val_labels])
        self.history_ = []
        return self._train(int(epochs), callback)

    def _train(self, epochs, callback):
        for _ in range(epochs):
            if self._trainer.members_training == 0:
                break
            report = self._trainer.train_epoch()
            self.history_.append(report)
            if callback is not None and callback(report) is False:
                break
        self._trainer.restore_best_members()  # patience: each member at its best epoch (no-op without)
        return self

    def _check_fitted(self):
        if self._trainer is None:
            raise RuntimeError("this MultiTaskModel is not fitted yet: call fit(texts, labels) first")

    def score(self, texts):
        """Class probabilities (N, C), the members' mean, as a numpy array."""
        self._check_fitted()
        return self._trainer.score(_texts(texts)).numpy()

    def member_probabilities(self, texts):
        """Each member's class probabilities (K, N, C): the ensemble's predictive
        distribution (score() is their mean)."""
        self._check_fitted()
        return self._trainer.member_scores(_texts(texts)).numpy()

    def uncertainty(self, texts):
        """The ensemble's uncertainty about each text, for acquisition: `entropy` of the
        mean prediction (total), `aleatoric_entropy` (the members' mean entropy) and
        `mutual_information` (BALD: total - aleatoric), each (N,)."""
        import torch
        members = torch.from_numpy(self.member_probabilities(texts))
        parts = _core.decompose({"member_probabilities": members})
        return {name: value.numpy() for name, value in parts.items()}

    def evaluate(self, texts, labels):
        """Accuracy, Matthews correlation, LM loss per token and perplexity."""
        self._check_fitted()
        return self._trainer.evaluate(_texts(texts), [int(v) for v in labels])

    def generate(self, prompt, max_new_tokens=64, temperature=0.8, top_k=20, seed=0):
        """One continuation of `prompt` per member (sampled; temperature 0: greedy)."""
        self._check_fitted()
        return self._trainer.generate(prompt, int(max_new_tokens), float(temperature), int(top_k), int(seed))

    def save(self, path):
        """A checkpoint `packtrain multitask score/generate/resume` read."""
        self._check_fitted()
        _check_folder_of(path)
        self._trainer.save(str(path))

    def save_pretrained(self, directory, member=0):
        """Member `member` as a Hugging Face GPT-2 folder (config.json, model.safetensors
        and the trunk's tokenizer files) that transformers' from_pretrained loads."""
        self._check_fitted()
        self._trainer.save_pretrained(os.fspath(directory), int(member))

    @classmethod
    def load(cls, path, device="cpu"):
        trainer = _core.MultiTask.load(str(path), _resolve_device(device))
        model = cls(device=device, **{k: v for k, v in json.loads(trainer.options_json).items() if k in _DEFAULTS})
        model._trainer = trainer
        return model


def resume_multitask(checkpoint, epochs=None, device="auto", callback=None):
    """Continues a run of `packtrain multitask train` from its checkpoint exactly as
    if it had not stopped (`packtrain multitask resume` from Python) and returns the
    MultiTaskModel: the sentence files the checkpoint names are reloaded and checked
    to be the ones it was trained on. `epochs`: train until this many epochs in all
    (default: the run's own; it must be above the checkpoint's); `callback` as in
    fit(). A checkpoint of MultiTaskModel.save() names no files: load() it instead."""
    path = os.fspath(checkpoint)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint (write one with `packtrain multitask train -o`)")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    trainer, total, truncated = _core.resume_multitask(path, _resolve_device(device), 0 if epochs is None else epochs)
    model = MultiTaskModel(device=device, **{k: v for k, v in json.loads(trainer.options_json).items() if k in _DEFAULTS})
    model._trainer, model.truncated_, model.history_ = trainer, truncated, []
    return model._train(total - trainer.epochs_done, callback)
