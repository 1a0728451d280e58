"""A reply must answer its own prompt: the committee remembers the outputs a node was challenged
with and zeroes a reply whose output repeats an earlier one given to a different prompt (pure).

Why: a replaying cheater answers with a reply it computed honestly for someone else. Teacher
forcing adapts the reference model to the replayed text after its first tokens, so the per-token
tests of the scoring pass see an almost honest reply; an identical signed output for two
different prompts, however, cannot happen under honest sampling of a long reply at a temperature
above zero (the probability is the product of every token's probability, ~e^-100 for 128 tokens).

Why the memory is held by each member and never on chain: an output hash (or any fingerprint
a node can recompute from its own outputs) in public state would tell the node which of its
requests was a challenge. Every member attests every reply of every epoch, so honest members
hold the same memory and reach the same verdict; the agreed score is the median of their
attestations, which a member that lost its memory (a restart) cannot move alone.

The memory is bounded (`ScoringParams.repeat_memory` outputs per node, oldest forgotten first),
and only replies of at least `repeat_min_tokens` tokens sampled at a temperature above zero
count: greedy decoding may honestly give one short canned reply to two prompts (a greedy replay
falls to the scoring pass's support test instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gentorrent.config import SCORING, ScoringParams

__all__ = ["OutputMemory", "CommitteeMemory"]


@dataclass(frozen=True)
class OutputMemory:
    """One node's last outputs as (prompt hash, output hash) pairs, oldest first."""

    seen: tuple[tuple[bytes, bytes], ...] = ()
    params: ScoringParams = field(default=SCORING, compare=False)

    def repeats(self, prompt_hash: bytes, output_hash: bytes) -> bool:
        """Whether this output was already given to a different prompt."""
        return any(out == output_hash and prompt != prompt_hash for prompt, out in self.seen)

    def remember(self, prompt_hash: bytes, output_hash: bytes) -> "OutputMemory":
        kept = (self.seen + ((prompt_hash, output_hash),))[-max(1, self.params.repeat_memory):]
        return OutputMemory(kept, self.params)


@dataclass
class CommitteeMemory:
    """A member's memories for every node it attested (bounded in nodes, too)."""

    params: ScoringParams = SCORING
    max_nodes: int = 100_000
    nodes: dict[str, OutputMemory] = field(default_factory=dict)

    def judge(self, node_id: str, prompt_hash: bytes, output_hash: bytes, temperature: float, n_tokens: int,
              credibility: float) -> float:
        """The credibility to attest: 0 for a replayed output, else `credibility`; remembers it."""
        memory = self.nodes.pop(node_id, OutputMemory(params=self.params))
        counts = temperature > 0 and n_tokens >= self.params.repeat_min_tokens
        replayed = counts and memory.repeats(prompt_hash, output_hash)
        self.nodes[node_id] = memory.remember(prompt_hash, output_hash) if counts else memory
        while len(self.nodes) > self.max_nodes:  # the longest-unseen node is forgotten first
            self.nodes.pop(next(iter(self.nodes)))
        return 0.0 if replayed else credibility
