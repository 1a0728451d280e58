"""The vLLM worker extension a CPU engine names (`worker_extension_cls`): vLLM imports it in
every worker process before that worker builds its model runner, and importing it installs
the seeded-request fix there (model_node/vllm_cpu_seeds.py). The worker processes are started
by vLLM's executor, not forked from the model node, so a patch made in the node's own process
never reaches them: this is vLLM's own way into each of them."""

from __future__ import annotations

from model_node import vllm_cpu_seeds

vllm_cpu_seeds.install()


class SeededRequestsOnCpu:
    """Adds nothing to the worker: what matters is that naming it imports this module."""
