"""The committee's audit desk: admitting users' audits of real replies, and what they weigh.

Users hand in a random share of their real asks (gentorrent/audits.py decides which, and
checks that a submission is one of them). The desk adds what needs an epoch's memory:

* one audit per receipt (a replayed submission is refused, also in the next epoch, since a
  receipt stays fresh for two epochs);
* bounds, so that anonymous submitters cannot flood the committee's reference model: per
  arriving overlay link and overall per epoch on what is admitted, and per model node on what
  is scored. The committee cannot tell users apart (that is the point), so it cannot cap per
  user; a link cap limits what one proxy channels, and every submission needs its own receipt
  signed by a registered node, so a flooder pays one real generation per audit it hands in;
* a per-node SAMPLE, not a first-come quota: of all the audits of a node admitted in an epoch,
  the desk keeps the `max_per_node_epoch` of lowest rank, the rank a keyed hash of the receipt
  under this member's secret salt of the epoch. With a first-come quota a cheater's accomplice
  fills the node's quota early with audits of replies the cheater answered honestly, and every
  real user's audit of it that epoch is refused: audits never see it. With the sample, whatever
  the order of arrival, each admitted audit is kept with the same chance, so the accomplice
  must outnumber the real audits many times over (and pay an honest generation for each) to
  push the real ones out, and cannot aim: the salt is secret, so it cannot grind receipts that
  rank low;
* scoring exactly like a challenge reply: the same single teacher-forced pass and the same
  honest-sampling tests (verifier/epochs/scoring.py) under the sampling parameters the node
  signed, and the same memory of the node's outputs (verifier/epochs/repeats.py: a real reply
  that repeats an earlier output for another prompt is a replay). An honest node's reply scores
  ~1 whatever the prompt, so an audit cannot frame it: the tokens scored are the ones the node
  signed, under the parameters it signed.

How audits weigh in an epoch (`audit_score`, `fold_credibility`): a node's audit score is
the k-th LOWEST credibility of its n audits (the only one when there is one), and its epoch
credibility the lower of that and its challenge credibility. k (`condemning_count`) is the
fewest abnormal replies that an honest node, whose replies are abnormal with probability
`AuditParams.honest_abnormal_bound`, shows among n audits with probability at most
`honest_alpha`; never fewer than 2. Why not the mean: a cheater can hand in audits of its own
honest replies (it can ask itself) and dilute a mean at will, while k bad real replies stay k
bad replies however many good ones it adds — and k is at most 3 for the per-node cap of 16
(at the defaults). Why not the minimum, or a fixed second-lowest: honest noise would punish
a node more often the more it is audited, which is what kept the audit rate low (at the upper
end of the honest false-positive interval, the detection bench untrusted 36 % of honest runs
at rate 0.05 with the second-lowest rule, 16 % with this one — 13 % with challenges alone).

Pure: refusals change nothing (every transition returns a new desk); the shell
(verifier/epochs/audit_service.py) holds the desk, the clock and the reference model.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from gentorrent import audits
from gentorrent.config import AUDITS, AuditParams
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.epochs.scoring import SamplingSpec, ScoreReport, TokenScores, score_reply

__all__ = ["AuditRefused", "AuditDesk", "sampling_spec_of", "audit_report", "audit_score",
           "fold_credibility", "fold", "agree_audit_scores"]


class AuditRefused(ValueError):
    """A submission the desk does not take (bad, duplicate or over a cap); nothing changed."""


@dataclass(frozen=True)
class AuditDesk:
    """One epoch's admitted audits: counters, and each node's sample (module docstring)."""

    epoch: int
    params: AuditParams = AUDITS
    salt: bytes = b""  # this member's secret of the epoch, for the sample's ranks (the shell draws it)
    previous: frozenset[bytes] = frozenset()  # receipt keys admitted the epoch before (still fresh)
    per_channel: Mapping[str, int] = field(default_factory=dict)
    sample: Mapping[bytes, tuple[audits.CheckedAudit, ...]] = field(default_factory=dict)  # node -> by rank
    this_epoch: frozenset[bytes] = frozenset()  # receipt keys admitted this epoch

    @property
    def queue(self) -> tuple[audits.CheckedAudit, ...]:
        """Every sampled audit, by node, then by rank: what the shell scores."""
        return tuple(a for node in sorted(self.sample) for a in self.sample[node])

    def rank(self, audit: audits.CheckedAudit) -> bytes:
        """An audit's place in its node's sample: unpredictable without the salt."""
        return hashlib.blake2b(audit.key, key=self.salt[:64], digest_size=16, person=b"gt-audit-rank").digest()

    def admit(self, data: bytes, channel: str, models: Mapping[bytes, audits.RegisteredModel],
              window: audits.AuditWindow) -> tuple["AuditDesk", audits.CheckedAudit]:
        """The desk with one more audit admitted (in its node's sample, or ranked out of it), and
        that audit; AuditRefused otherwise."""
        try:
            checked = audits.check_submission(data, models, window, self.params)
        except audits.AuditError as exc:
            raise AuditRefused(str(exc)) from exc
        if checked.key in self.this_epoch or checked.key in self.previous:
            raise AuditRefused("this receipt was audited already")
        if len(self.this_epoch) >= self.params.max_admitted_per_epoch:
            raise AuditRefused("the committee takes no more audits this epoch")
        if self.per_channel.get(channel, 0) >= self.params.max_per_channel_epoch:
            raise AuditRefused("the committee takes no more audits over this link this epoch")
        per_channel = Counter(self.per_channel)
        per_channel[channel] += 1
        kept = sorted(self.sample.get(checked.node_id, ()) + (checked,), key=self.rank)
        sample = {**self.sample, checked.node_id: tuple(kept[: self.params.max_per_node_epoch])}
        return replace(self, this_epoch=self.this_epoch | {checked.key}, per_channel=dict(per_channel),
                       sample=sample), checked

    def next_epoch(self, epoch: int, salt: bytes = b"") -> "AuditDesk":
        """A fresh desk; this epoch's receipts stay refused (they are still fresh next epoch)."""
        if epoch <= self.epoch:
            raise AuditRefused(f"epoch {epoch} does not follow {self.epoch}")
        return AuditDesk(epoch, self.params, salt=salt, previous=self.this_epoch)


def sampling_spec_of(request: pb.GenerateRequest) -> SamplingSpec:
    """The sampling the node signed, as the scorer takes it (proto3 0 means default top_p 1)."""
    s = request.sampling
    return SamplingSpec(temperature=float(s.temperature), top_p=float(s.top_p) or 1.0,
                        top_k=int(s.top_k) if s.top_k > 0 else 0)


def audit_report(audit: audits.CheckedAudit, scores: TokenScores) -> ScoreReport:
    """The scoring pass's report on one audited reply: the challenge scorer, under the audited sampling."""
    return score_reply(scores, sampling_spec_of(audit.request))


@functools.lru_cache(maxsize=1024)
def condemning_count(n: int, p0: float, alpha: float) -> int:
    """The fewest abnormal replies among `n` audits that an honest node (each reply abnormal with
    probability `p0`) reaches with probability <= `alpha`; at least 2 (the binomial upper tail)."""
    tail = 1.0  # P(X >= k), from k = 0 upwards
    for k in range(n + 1):
        if k >= 2 and tail <= alpha:
            return k
        tail -= math.comb(n, k) * p0 ** k * (1 - p0) ** (n - k)
    return n + 1


def audit_score(audit_scores: Sequence[float], params: AuditParams = AUDITS) -> float | None:
    """A node's audit score: the k-th lowest of its audit credibilities, k = `condemning_count`
    (the highest, when k exceeds their number; the only one when there is one; None without
    audits). The module docstring says why."""
    values = sorted(float(v) for v in audit_scores)
    if any(not (math.isfinite(v) and 0.0 <= v <= 1.0) for v in values):
        raise ValueError("audit credibilities are in [0, 1]")
    if not values:
        return None
    k = condemning_count(len(values), params.honest_abnormal_bound, params.honest_alpha)
    return values[min(k, len(values)) - 1]


def fold_credibility(challenge: float | None, audit_scores: Sequence[float]) -> float | None:
    """A node's epoch credibility from its challenge score (None: not probed) and its audits'
    scores: the lower of the challenge and the audit score."""
    return fold(challenge, audit_score(audit_scores))


def fold(challenge: float | None, audited: float | None) -> float | None:
    """The lower of a challenge score and an audit score, either absent (None). The chain folds
    the committee's agreed audit score with it (verifier.epochs.machine): no desk parameter."""
    if challenge is None:
        return audited
    return challenge if audited is None else min(challenge, audited)


def agree_audit_scores(reports: Mapping[str, Mapping[bytes, float]], committee_size: int) -> dict[bytes, float]:
    """The committee's audit score per node from its members' reports (member -> node -> the
    audit score of the audits that member scored): for a node that more than 2/3 of the members
    report, the median report. Fewer reporters: no audit score (a minority, possibly all
    faulty, must not decide). With at most f < N/3 faulty members, faulty reports are fewer
    than half of any such set, so the median lies within the honest members' reports: a
    faulty minority can neither frame an honest node nor shield a cheater."""
    if committee_size < 1 or len(reports) > committee_size:
        raise ValueError("more reporting members than the committee has")
    by_node: dict[bytes, list[float]] = {}
    for scores in reports.values():
        for node, value in scores.items():
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError("audit scores are in [0, 1]")
            by_node.setdefault(node, []).append(float(value))
    return {node: sorted(values)[(len(values) - 1) // 2]
            for node, values in sorted(by_node.items()) if 3 * len(values) > 2 * committee_size}
