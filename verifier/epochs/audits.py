"""The committee's audit desk: admitting users' audits of real replies, and what they weigh.

Users hand in a random share of their real asks (gentorrent/audits.py decides which, and
checks that a submission is one of them). The desk adds what needs an epoch's memory:

* one audit per receipt (a replayed submission is refused, also in the next epoch, since a
  receipt stays fresh for two epochs);
* caps per model node, per arriving overlay link and overall per epoch, so that anonymous
  submitters cannot flood the committee's reference model. The committee cannot tell users
  apart (that is the point), so it cannot cap per user; a link cap limits what one proxy
  channels, and every submission needs its own receipt signed by a registered node, so a
  flooder pays one real generation per audit it hands in;
* scoring exactly like a challenge reply: the same single teacher-forced pass and the same
  honest-sampling tests (verifier/epochs/scoring.py) under the sampling parameters the node
  signed. An honest node's reply scores ~1 whatever the prompt, so an audit cannot frame it:
  the tokens scored are the ones the node signed, under the parameters it signed.

How audits weigh in an epoch (`audit_score`, `fold_credibility`): a node's audit score is
the SECOND-LOWEST credibility of its audits (the only one when there is one), and its epoch
credibility the lower of that and its challenge credibility. Why not the mean: a cheater can
hand in audits of its own honest replies (it can ask itself) and dilute a mean at will, while
two bad real replies stay two bad replies however many good ones it adds. Why not the
minimum: honest noise would then punish a node more often the more it is audited; the second
lowest falls under tau for an honest node with probability ~ C(k, 2) p^2 (p the per-reply
rate, k audits), negligible for the per-node cap of 16, and a node cheating on a share s of
its real traffic is caught once two of its audited replies are bad.

Pure: refusals change nothing (every transition returns a new desk); the shell
(verifier/epochs/audit_service.py) holds the desk, the clock and the reference model.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from gentorrent import audits
from gentorrent.config import AUDITS, AuditParams
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.epochs.scoring import SamplingSpec, TokenScores, score_reply

__all__ = ["AuditRefused", "AuditDesk", "sampling_spec_of", "audit_credibility", "audit_score",
           "fold_credibility", "agree_audit_scores"]


class AuditRefused(ValueError):
    """A submission the desk does not take (bad, duplicate or over a cap); nothing changed."""


@dataclass(frozen=True)
class AuditDesk:
    """One epoch's admitted audits and counters."""

    epoch: int
    params: AuditParams = AUDITS
    seen: frozenset[bytes] = frozenset()  # receipt keys of this and the previous epoch
    per_node: Mapping[bytes, int] = field(default_factory=dict)
    per_channel: Mapping[str, int] = field(default_factory=dict)
    queue: tuple[audits.CheckedAudit, ...] = ()

    def admit(self, data: bytes, channel: str, models: Mapping[bytes, audits.RegisteredModel],
              window: audits.AuditWindow) -> tuple["AuditDesk", audits.CheckedAudit]:
        """The desk with one more audit queued, and that audit; AuditRefused otherwise."""
        try:
            checked = audits.check_submission(data, models, window, self.params)
        except audits.AuditError as exc:
            raise AuditRefused(str(exc)) from exc
        if checked.key in self.seen:
            raise AuditRefused("this receipt was audited already")
        if len(self.queue) >= self.params.max_per_epoch:
            raise AuditRefused("the committee takes no more audits this epoch")
        if self.per_node.get(checked.node_id, 0) >= self.params.max_per_node_epoch:
            raise AuditRefused("the committee takes no more audits of this node this epoch")
        if self.per_channel.get(channel, 0) >= self.params.max_per_channel_epoch:
            raise AuditRefused("the committee takes no more audits over this link this epoch")
        per_node = Counter(self.per_node)
        per_node[checked.node_id] += 1
        per_channel = Counter(self.per_channel)
        per_channel[channel] += 1
        return replace(self, seen=self.seen | {checked.key}, per_node=dict(per_node), per_channel=dict(per_channel),
                       queue=self.queue + (checked,)), checked

    def next_epoch(self, epoch: int) -> "AuditDesk":
        """A fresh desk; this epoch's receipts stay refused (they are still fresh next epoch)."""
        if epoch <= self.epoch:
            raise AuditRefused(f"epoch {epoch} does not follow {self.epoch}")
        return AuditDesk(epoch, self.params, seen=frozenset(a.key for a in self.queue))


def sampling_spec_of(request: pb.GenerateRequest) -> SamplingSpec:
    """The sampling the node signed, as the scorer takes it (proto3 0 means default top_p 1)."""
    s = request.sampling
    return SamplingSpec(temperature=float(s.temperature), top_p=float(s.top_p) or 1.0,
                        top_k=int(s.top_k) if s.top_k > 0 else 0)


def audit_credibility(audit: audits.CheckedAudit, scores: TokenScores) -> float:
    """Credibility of one audited reply: the challenge scorer, under the audited sampling."""
    return score_reply(scores, sampling_spec_of(audit.request)).credibility


def audit_score(audit_scores: Sequence[float]) -> float | None:
    """A node's audit score: the second-lowest of its audit credibilities (the only one when
    there is one; None without audits). The module docstring says why."""
    values = sorted(float(v) for v in audit_scores)
    if any(not (math.isfinite(v) and 0.0 <= v <= 1.0) for v in values):
        raise ValueError("audit credibilities are in [0, 1]")
    if not values:
        return None
    return values[1] if len(values) > 1 else values[0]


def fold_credibility(challenge: float | None, audit_scores: Sequence[float]) -> float | None:
    """A node's epoch credibility from its challenge score (None: not probed) and its audits'
    scores: the lower of the challenge and the audit score."""
    audited = audit_score(audit_scores)
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
