"""Dishonest weight variants are real, loadable, deterministic models."""

from __future__ import annotations

import json

import pytest

from testkit.variants import add_noise, prune_layers


# torch and transformers are imported by the tests that use them, not at collection (seconds each)
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, torch, transformers):
    """A 4-layer random Llama in an HF folder (the shape SmolLM2 has, at toy size)."""
    path = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def _logits(torch, transformers, path, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_pruned_model_has_half_the_layers_and_loads(tiny_model, tmp_path, torch, transformers):
    out = prune_layers(tiny_model, tmp_path / "pruned")
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    honest = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    # layer 2 of the honest model became layer 1 of the pruned one
    assert torch.equal(model.model.layers[1].mlp.up_proj.weight, honest.model.layers[2].mlp.up_proj.weight)
    assert not torch.allclose(_logits(torch, transformers, out, [1, 2, 3]),
                              _logits(torch, transformers, tiny_model, [1, 2, 3]))


def test_noise_is_relative_deterministic_and_spares_norms(tiny_model, tmp_path, torch):
    a = add_noise(tiny_model, tmp_path / "a", relative_sigma=0.1, seed=7)
    b = add_noise(tiny_model, tmp_path / "b", relative_sigma=0.1, seed=7)
    from safetensors.torch import load_file

    honest, na, nb = (load_file(str(p / "model.safetensors")) for p in (tiny_model, a, b))
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(na[name], nb[name])
    ratio = ((na[name] - honest[name]).std() / honest[name].std()).item()
    assert 0.07 < ratio < 0.13
    assert torch.equal(na["model.norm.weight"], honest["model.norm.weight"])


def test_refuses_nonsense(tiny_model, tmp_path):
    with pytest.raises(ValueError):
        prune_layers(tiny_model, tmp_path / "x", keep_every=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError):
        prune_layers(empty, tmp_path / "y")
