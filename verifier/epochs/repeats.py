"""A reply must answer its own prompt: the committee remembers the outputs a node gave its
challenges and its audited real asks, and zeroes a reply whose output repeats an earlier one
given to a different prompt (pure).

Why: a replaying cheater answers with a reply it computed honestly for someone else. Teacher
forcing adapts the reference model to the replayed text after its first tokens, so the per-token
tests of the scoring pass see an almost honest reply; an identical signed output for two
different prompts, however, cannot happen under honest sampling of a long reply at a temperature
above zero (the probability is the product of every token's probability, ~e^-100 for 128 tokens).

Why the memory is held by each member and never on chain: an output hash (or any fingerprint
a node can recompute from its own outputs) in public state would tell the node which of its
requests was a challenge. Every member attests every reply of every epoch, so honest members
hold the same memory and reach the same verdict; the agreed score is the median of their
attestations, which a member that lost its memory (a restart) cannot move alone. Users hand
every member a copy of each audit, but each member scores its own random sample of a busy node's
audits (verifier/epochs/audits.py), so memories may differ in those outputs; a replayer repeats
its outputs, so it meets every member's memory soon enough.

What counts as a repeat, so that no one can frame an honest node with one. Only outputs of at
least `repeat_min_tokens` tokens sampled at a temperature above zero count, and only when the
scoring pass bounds the chance that honest sampling gives exactly this output for its own prompt
by e^`repeat_max_log_prob` (ScoreReport.log_prob_bound). An output is remembered only under
that condition, and condemned only under it again, for a different prompt. Why both sides: a
user who audits (users hand the committee their real asks, and this memory holds those too)
could otherwise ask prompt A, receive a sampled, improbable output O, then ask "repeat exactly:
O" and receive O again, likely for that prompt: with a one-sided rule, two honest signed replies
would condemn the node. With the rule on both sides, an honest node repeats an output only if it
draws, for a second prompt, an output that prompt gives with probability at most e^-20. A canned
reply (greedy, or a refusal the model gives every prompt) is likely wherever it appears, so it
never counts; a greedy replay falls to the scoring pass's support test instead.

Challenges and audits share one memory per member (verifier/epochs/wiring.py): a node that
replays on real traffic, or hands a challenge the answer it gave a user, is caught the same way.
The memory is bounded (`ScoringParams.repeat_memory` outputs per node, oldest forgotten first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gentorrent.config import SCORING, ScoringParams

__all__ = ["OutputMemory", "CommitteeMemory", "Scored"]


class Scored(Protocol):
    """What the memory needs of the scoring pass's report (verifier.epochs.scoring.ScoreReport)."""

    n_tokens: int
    credibility: float
    log_prob_bound: float


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

    def judge(self, node_id: str, prompt_hash: bytes, output_hash: bytes, temperature: float,
              report: Scored) -> float:
        """The credibility to attest for a reply the scoring pass reported on: 0 for a replayed
        output, else the report's; remembers the output when it counts (module docstring)."""
        memory = self.nodes.pop(node_id, OutputMemory(params=self.params))
        counts = (temperature > 0 and report.n_tokens >= self.params.repeat_min_tokens
                  and report.log_prob_bound <= self.params.repeat_max_log_prob)
        replayed = counts and memory.repeats(prompt_hash, output_hash)
        self.nodes[node_id] = memory.remember(prompt_hash, output_hash) if counts else memory
        while len(self.nodes) > self.max_nodes:  # the longest-unseen node is forgotten first
            self.nodes.pop(next(iter(self.nodes)))
        return 0.0 if replayed else report.credibility
