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

What counts as evidence, so that no one can frame an honest node with a repeat. Only outputs
of at least `repeat_min_tokens` tokens sampled at a temperature above zero count. For each reply
the scoring pass bounds the chance that honest sampling gives exactly this output for its own
prompt (ScoreReport.log_prob_bound, b). When a node has given one output to several prompts, one
of them may be its honest sample, whatever its b; the others are coincidences of probability at
most e^b each. So the evidence is the sum of the b of all occurrences but the one most favourable
to the node, and the output is a replay when that sum is at most `repeat_max_log_prob` (e^-20).
Challenge occurrences always count: the committee chose their prompts and scores every reply, so
a sum over them is the chance of the whole coincidence (a generic reply replayed to challenge
after challenge is caught once its repeats add up). An audited occurrence counts only when its
own b is at most the bound: users choose which replies to hand in, so a user who asks prompt A,
receives a sampled output O, then asks "repeat exactly: O" until the node repeats it, and hands
in the copies, selects likely coincidences; only one that honest sampling gives with probability
at most e^-20 can be selected at that price, and then it is evidence on its own. A canned reply
(a refusal a model gives every prompt) is likely wherever it comes, so it never adds up; a greedy
replay falls to the scoring pass's support test instead.

Challenges and audits share one memory per member (verifier/epochs/wiring.py): a node that
replays on real traffic, or hands a challenge the answer it gave a user, is caught the same way.
The memory is bounded (`ScoringParams.repeat_memory` outputs per node, oldest forgotten first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gentorrent.config import SCORING, ScoringParams

__all__ = ["Occurrence", "OutputMemory", "CommitteeMemory", "Scored"]


class Scored(Protocol):
    """What the memory needs of the scoring pass's report (verifier.epochs.scoring.ScoreReport)."""

    n_tokens: int
    credibility: float
    log_prob_bound: float


@dataclass(frozen=True)
class Occurrence:
    """One reply's output as the memory keeps it (hashes only)."""

    prompt_hash: bytes
    output_hash: bytes
    log_prob_bound: float  # ScoreReport.log_prob_bound of the reply
    audited: bool  # a user's audit (the user chose to hand it in), not a challenge


@dataclass(frozen=True)
class OutputMemory:
    """One node's last outputs, oldest first."""

    seen: tuple[Occurrence, ...] = ()
    params: ScoringParams = field(default=SCORING, compare=False)

    def evidence(self, new: Occurrence) -> float | None:
        """The log of the chance that `new` and the earlier occurrences of its output for other
        prompts all came from honest sampling, but for the one most favourable to the node
        (module docstring); None when the output was not given to another prompt."""
        by_prompt = {o.prompt_hash: o for o in self.seen if o.output_hash == new.output_hash}
        by_prompt[new.prompt_hash] = new
        if len(by_prompt) < 2:
            return None
        limit = self.params.repeat_max_log_prob
        counted = [o.log_prob_bound for o in by_prompt.values() if not o.audited or o.log_prob_bound <= limit]
        return sum(counted) - min(counted, default=0.0)

    def remember(self, new: Occurrence) -> "OutputMemory":
        kept = (self.seen + (new,))[-max(1, self.params.repeat_memory):]
        return OutputMemory(kept, self.params)


@dataclass
class CommitteeMemory:
    """A member's memories for every node it attested (bounded in nodes, too)."""

    params: ScoringParams = SCORING
    max_nodes: int = 100_000
    nodes: dict[str, OutputMemory] = field(default_factory=dict)

    def judge(self, node_id: str, prompt_hash: bytes, output_hash: bytes, temperature: float,
              report: Scored, audited: bool = False) -> float:
        """The credibility to attest for a reply the scoring pass reported on: 0 for a replayed
        output, else the report's; remembers the output when it counts (module docstring).
        `audited`: the reply is a user's audit, not a challenge."""
        memory = self.nodes.pop(node_id, OutputMemory(params=self.params))
        counts = temperature > 0 and report.n_tokens >= self.params.repeat_min_tokens
        new = Occurrence(prompt_hash, output_hash, report.log_prob_bound, audited)
        evidence = memory.evidence(new) if counts else None
        replayed = evidence is not None and evidence <= self.params.repeat_max_log_prob
        self.nodes[node_id] = memory.remember(new) if counts else memory
        while len(self.nodes) > self.max_nodes:  # the longest-unseen node is forgotten first
            self.nodes.pop(next(iter(self.nodes)))
        return 0.0 if replayed else report.credibility
