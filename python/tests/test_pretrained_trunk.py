"""Bring your own language model (issue 39): GPT-2 and Llama checkpoints saved by
transformers (small random models built here; nothing is downloaded) load as
packtrain's trunk with transformers' logits, next-token loss and gradients, and greedy
KV-cached generation token for token; sharded and bfloat16 checkpoints load too; the trunk saved back loads in transformers with the same logits;
what packtrain cannot load is refused by name.

The reference is transformers itself (PyPI), not a copy of its formulas."""
import json

import numpy as np
import pytest
import torch

from packtrain import _core

transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup.sh installs it)")


def small_gpt2(tmp_path, name="gpt2", seed=0, dtype=None, shard=None, **overrides):
    config = dict(vocab_size=97, n_positions=24, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0)
    config.update(overrides)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    with torch.no_grad():  # transformers starts biases and norms at 0 and 1: move them off
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    if dtype is not None:
        model = model.to(dtype)
    path = tmp_path / name
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return model, path


def tokens(batch=3, length=17, vocab=97, seed=1):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def relative_gap(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def expect_one_step_equals_transformers(trunk, model, x):
    """The trunk's logits, next-token loss and every gradient of one step (under
    transformers' names; score.* is packtrain's own classifier) are transformers'."""
    with torch.no_grad():
        assert relative_gap(trunk.lm_logits(x), model(x).logits) <= 1e-5
    out = model(x, labels=x)
    out.loss.backward()
    loss, grads = trunk.lm_loss_and_gradients(x)
    assert loss == pytest.approx(out.loss.item(), rel=1e-6)
    theirs = dict(model.named_parameters())
    ours = {name: grad for name, grad in grads.items() if not name.startswith("score.")}
    assert set(ours) == set(theirs)  # every parameter (a tied lm_head is wte's)
    for name, grad in ours.items():
        assert relative_gap(grad, theirs[name].grad) <= 1e-4, name


def test_gpt2_logits_loss_and_gradients_equal_transformers(tmp_path):
    model, path = small_gpt2(tmp_path)
    trunk = _core.PretrainedTrunk(str(path), classes=2)
    assert trunk.options["gelu_tanh"] and trunk.options["layers"] == 2 and trunk.options["max_length"] == 24
    expect_one_step_equals_transformers(trunk, model, tokens())


def test_kv_cached_greedy_generation_equals_transformers_token_for_token(tmp_path):
    model, path = small_gpt2(tmp_path, seed=4)
    trunk = _core.PretrainedTrunk(str(path))
    for prompt in ([5], [3, 14, 15, 92, 65]):
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0,
                                  attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):]
        assert trunk.greedy(prompt, 12) == expected.tolist()
    with pytest.raises(ValueError, match="positions in all"):
        trunk.greedy([1] * 20, 5)


def test_exact_gelu_sharded_and_bfloat16_checkpoints_load(tmp_path):
    x = tokens(seed=2)
    model, path = small_gpt2(tmp_path, "exact", activation_function="gelu", n_inner=64, layer_norm_epsilon=1e-6)
    trunk = _core.PretrainedTrunk(str(path))
    assert not trunk.options["gelu_tanh"] and trunk.options["mlp_ratio"] == 2 and trunk.options["norm_eps"] == 1e-6
    with torch.no_grad():
        assert relative_gap(trunk.lm_logits(x), model(x).logits) <= 1e-5
    model, path = small_gpt2(tmp_path, "sharded", shard="20KB")
    assert (path / "model.safetensors.index.json").exists() and len(list(path.glob("*.safetensors"))) > 2
    with torch.no_grad():
        assert relative_gap(_core.PretrainedTrunk(str(path)).lm_logits(x), model(x).logits) <= 1e-5
    model, path = small_gpt2(tmp_path, "bf16", dtype=torch.bfloat16)
    with torch.no_grad():  # the bfloat16 weights, computed in float32 by both
        expected = model.float()(x).logits
    assert relative_gap(_core.PretrainedTrunk(str(path)).lm_logits(x), expected) <= 1e-5


def test_a_saved_trunk_loads_in_transformers_with_the_same_logits(tmp_path):
    _, path = small_gpt2(tmp_path)
    trunk = _core.PretrainedTrunk(str(path), classes=3, seed=5)
    x = tokens(seed=3)
    trunk.save(str(tmp_path / "saved"))
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        assert relative_gap(trunk.lm_logits(x), again(x).logits) <= 1e-5
    # The classifier travels as score.weight (transformers' GPT2ForSequenceClassification
    # reads it) and score.bias; packtrain reads both back.
    reloaded = _core.PretrainedTrunk(str(tmp_path / "saved"), classes=3, seed=9)
    ours, back = trunk.named_tensors(), reloaded.named_tensors()
    assert ours.keys() == back.keys()
    for name in ours:
        assert torch.equal(ours[name], back[name]), name
    classifier = transformers.GPT2ForSequenceClassification.from_pretrained(tmp_path / "saved")
    assert torch.equal(classifier.score.weight.detach(), ours["score.weight"])


def write_config(path, **config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))


def test_what_cannot_be_loaded_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        _core.PretrainedTrunk(str(tmp_path / "absent"))
    write_config(tmp_path / "mistral", model_type="mistral")
    with pytest.raises(ValueError, match="model_type 'mistral' is not supported.*GPT-2 .gpt2. and Llama"):
        _core.PretrainedTrunk(str(tmp_path / "mistral"))
    model, path = small_gpt2(tmp_path, "untied", tie_word_embeddings=False)
    with pytest.raises(ValueError, match="untied LM head"):
        _core.PretrainedTrunk(str(path))
    _, path = small_gpt2(tmp_path, "good")
    config = json.loads((path / "config.json").read_text())
    config["n_embd"] = 48  # the weights no longer fit the config
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tensor 'transformer.wte.weight' in '.*' has shape \[97, 32\]"):
        _core.PretrainedTrunk(str(path))
    write_config(tmp_path / "noweights", **{**config, "n_embd": 32})
    with pytest.raises(ValueError, match="neither model.safetensors nor model.safetensors.index.json"):
        _core.PretrainedTrunk(str(tmp_path / "noweights"))
    # A file longer than its header says, and one whose header is cut short.
    _, path = small_gpt2(tmp_path, "long")
    with open(path / "model.safetensors", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(ValueError, match="holds .* bytes of data, its header accounts for"):
        _core.PretrainedTrunk(str(path))
    _, path = small_gpt2(tmp_path, "cut")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:40])
    with pytest.raises(ValueError, match="header length .* runs past the file"):
        _core.PretrainedTrunk(str(path))
    # A shard the index names that does not hold the tensor.
    _, path = small_gpt2(tmp_path, "shards", shard="20KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    first = sorted(index["weight_map"])[0]
    other = next(f for f in sorted(set(index["weight_map"].values())) if f != index["weight_map"][first])
    index["weight_map"][first] = other
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=f"puts tensor '{first}' in {other}, which does not hold it"):
        _core.PretrainedTrunk(str(path))
    assert np.isfinite(model.transformer.wte.weight.detach().numpy()).all()


def small_llama(tmp_path, name="llama", seed=0, **overrides):
    config = dict(vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=24, rms_norm_eps=1e-6, tie_word_embeddings=False)
    config.update(overrides)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    with torch.no_grad():  # norms start at 1: move them off
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    path = tmp_path / name
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("variant", [dict(), dict(tie_word_embeddings=True, num_key_value_heads=4, rope_theta=500.0)])
def test_llama_logits_and_loss_equal_transformers(tmp_path, variant):
    """Llama's block (RMSNorm, rotary positions, grouped-query attention, SwiGLU, no
    biases; untied and tied heads) loads with transformers' logits, next-token loss and
    gradients, and saves back to a folder transformers loads with the same logits."""
    model, path = small_llama(tmp_path, **variant)
    trunk = _core.PretrainedTrunk(str(path))
    x = tokens(seed=5)
    expect_one_step_equals_transformers(trunk, model, x)
    # Written back, transformers loads it with the same logits.
    trunk.save(str(tmp_path / "back"))
    again = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert relative_gap(trunk.lm_logits(x), again(x).logits) <= 1e-5


@pytest.mark.parametrize("variant", [dict(), dict(tie_word_embeddings=True, num_key_value_heads=1)])
def test_llama_kv_cached_greedy_generation_equals_transformers_token_for_token(tmp_path, variant):
    """Rotary positions at the decode step's position and grouped-query attention over
    the cache's key/value heads: transformers' greedy tokens, one for one."""
    model, path = small_llama(tmp_path, seed=6, **variant)
    trunk = _core.PretrainedTrunk(str(path))
    for prompt in ([7], [2, 71, 82, 81, 8]):
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=14, do_sample=False, pad_token_id=0,
                                  attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):]
        assert trunk.greedy(prompt, 14) == expected.tolist()


def test_adapters_on_one_loaded_trunk_compute_what_peft_computes(tmp_path):
    """K LoRA adapters on the one frozen GPT-2 trunk (lora_rank): member k with peft's
    adapter weights (LoraConfig on c_attn, c_proj and c_fc, GPT-2's Conv1D layout) gives
    peft's logits; before any is set, every member is the trunk itself."""
    peft = pytest.importorskip("peft", reason="peft is not installed (scripts/setup.sh installs it)")
    import copy
    model, path = small_gpt2(tmp_path, seed=7)
    rank, alpha, K = 4, 8.0, 3
    trunk = _core.PretrainedTrunk(str(path), members=K, lora_rank=rank, lora_alpha=alpha)
    x = tokens(seed=8)
    with torch.no_grad():
        plain = model(x).logits
        for k in range(K):
            assert relative_gap(trunk.lm_logits(x, member=k)[None], plain) <= 1e-5  # B starts at zero
    sites = {"attn.qkv": "attn.c_attn", "attn.out": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    references = []
    for k in range(K):
        torch.manual_seed(100 + k)
        config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, fan_in_fan_out=True,
                                 target_modules=["c_attn", "c_proj", "c_fc"], init_lora_weights=False)
        ref = peft.get_peft_model(copy.deepcopy(model), config).eval()
        with torch.no_grad():
            for layer, block in enumerate(ref.base_model.model.transformer.h):
                for ours, theirs in sites.items():
                    module = block.get_submodule(theirs)
                    trunk.parameter(f"block{layer}.{ours}.lora_a")[k].copy_(module.lora_A["default"].weight.t())
                    trunk.parameter(f"block{layer}.{ours}.lora_b")[k].copy_(module.lora_B["default"].weight.t())
            references.append(ref(x).logits)
    with torch.no_grad():
        for k in range(K):
            assert relative_gap(trunk.lm_logits(x, member=k)[None], references[k]) <= 1e-5, k
        assert relative_gap(references[0], references[1]) > 1e-3  # the members differ
    # Saved back, member 0 is one plain GPT-2 with its adapter merged in.
    assert {"transformer.h.0.attn.c_attn.weight", "score.weight"} <= set(trunk.named_tensors())
    trunk.save(str(tmp_path / "merged"))
    merged = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        assert relative_gap(merged(x).logits, references[0]) <= 1e-5
