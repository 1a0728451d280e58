"""The result of one verification epoch: judging the leader's proposal, resolving missing
replies, and the credibilities the reputation update applies (paper §3.4, §4.4, Algorithm 3;
ARCHITECTURE.md §3.5).

Two pure pieces:

* :func:`judge_proposal` is what every verifier runs in ABCI ProcessProposal on the leader's
  epoch result: the result must cover exactly the committed plan (no skipped node, no extra
  one); every reply must carry a valid model-node signature, the very prompt that was committed
  to, and the model name the node registered; and every score must match the verifier's own
  recomputation (with its own reference model) within ``EPOCHS.score_tolerance``. Missing or
  invalid replies are reported without penalty. Any failure -> reject.

* :class:`EpochRecord` and its transitions are what FinalizeBlock applies, identically on every
  member, to committed transactions: the accepted result, then the other verifiers' own probe
  reports for each node the leader reported missing. With N committee members, counting the
  reports of the N - 1 others (the leader's own report is not counted: an honest leader's probe
  of a slow honest node can fail, and with f faulty members voting "failed" it made f + 1 > N/3
  failures: the honest node zeroed):

    failures * 3 > N - 1    the node misbehaves on purpose: credibility 0 this epoch (at least
                            one honest member failed to reach it too; a committee of one
                            trusts its leader)
    successes * 3 > 2 * N   the leader's report is contradicted ("reached"): the node is not
                            scored this epoch, everyone else is, and the leader's dispute
                            count grows
    otherwise               undecided: no change for that node

  With N = 3f + 1 and at most f faulty members, faulty members can produce at most f failure
  reports, and f * 3 > 3f never holds, so an honest node is never punished by them; and once the
  honest members' successes are in (at least 2f + 1 of them when the leader is faulty), a
  leader's lie is always contradicted. The two decisions exclude each other (together they
  would need more than (N - 1)/3 + 2N/3 = N - 1/3 reports, and only N - 1 members report), so
  the outcome does not depend on the order in which reports commit.

  A contradicted report does not prove the leader lied: a node that answers every request but
  those of the probing phase (public on chain) is missing for the leader and reached by the
  members, who probe later. When a contradicted report aborted the epoch, such a node voided
  every epoch, and with it every other node's scores (and got honest leaders blamed). Now it
  voids only its own score, which it could as well get by not answering at all, except that
  failing the members' probes too is punished; a lying leader can leave unscored only the nodes
  it reports missing in the epochs it leads, and its disputes are counted in committed state
  (`MemberKeysEntry.disputes`, where a stalling node raises them against every leader alike).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from gentorrent.config import EPOCHS, REPUTATION, EpochParams, ReputationParams
from verifier.epochs import reputation as rep
from verifier.epochs.challenges import ChallengePlan

__all__ = [
    "EpochError",
    "SignedReply",
    "ReplyOutcome",
    "MissingOutcome",
    "EpochProposal",
    "Verdict",
    "integrity_problems",
    "judge_proposal",
    "replies_to_score",
    "ProbeReport",
    "Phase",
    "EpochRecord",
    "start_epoch",
    "apply_result",
    "apply_probe_report",
    "close_epoch",
    "node_decision",
    "all_decided",
    "dispute_reason",
    "note_dispute",
    "REASONS_LISTED",
    "abort_reason",
    "PUNISH",
    "REACHED",
    "UNDECIDED",
    "epoch_credibilities",
    "finalize_reputations",
]


class EpochError(ValueError):
    """A transaction that does not fit the epoch's state (and therefore changes nothing)."""


@dataclass(frozen=True)
class SignedReply:
    """A model node's signed reply as the leader received it through the overlay.

    The signature covers (at least) node id, prompt, model and reply; checking it is the
    injected ``check_signature`` (the shell knows the receipt's byte layout and the node's key).
    """

    node_id: str
    prompt: str
    model: str
    reply: str
    signature: bytes


@dataclass(frozen=True)
class ReplyOutcome:
    reply: SignedReply
    score: float  # the leader's credibility for the reply


@dataclass(frozen=True)
class MissingOutcome:
    node_id: str
    reason: str = "no reply"  # "no reply", "bad signature", ... - reported, never punished alone


Outcome = ReplyOutcome | MissingOutcome


@dataclass(frozen=True)
class EpochProposal:
    """The leader's epoch result: one outcome per planned node."""

    epoch: int
    leader: str
    outcomes: Mapping[str, Outcome]


@dataclass(frozen=True)
class Verdict:
    accept: bool
    reasons: tuple[str, ...] = ()


SignatureCheck = Callable[[SignedReply], bool]


def integrity_problems(
    plan: ChallengePlan,
    prompts: Mapping[str, str],
    proposal: EpochProposal,
    registered_models: Mapping[str, str],
    check_signature: SignatureCheck,
) -> list[str]:
    """Everything wrong with a proposal that needs no reference model (skips, alterations)."""
    problems = []
    if proposal.epoch != plan.epoch:
        problems.append(f"proposal is for epoch {proposal.epoch}, plan for {plan.epoch}")
    planned, proposed = set(plan.node_ids), set(proposal.outcomes)
    if planned - proposed:
        problems.append(f"leader skipped planned nodes {sorted(planned - proposed)}")
    if proposed - planned:
        problems.append(f"leader added unplanned nodes {sorted(proposed - planned)}")
    for node_id in sorted(planned & proposed):
        outcome = proposal.outcomes[node_id]
        if isinstance(outcome, MissingOutcome):
            if outcome.node_id != node_id:
                problems.append(f"{node_id}: missing-report names {outcome.node_id}")
            continue
        if not isinstance(outcome, ReplyOutcome):
            problems.append(f"{node_id}: unknown outcome type")
            continue
        reply = outcome.reply
        if reply.node_id != node_id:
            problems.append(f"{node_id}: reply is from {reply.node_id}")
        elif not check_signature(reply):
            problems.append(f"{node_id}: reply signature invalid (altered reply)")
        elif reply.prompt != prompts.get(node_id):
            problems.append(f"{node_id}: reply answers a prompt other than the committed one")
        elif reply.model != registered_models.get(node_id):
            problems.append(f"{node_id}: reply claims model {reply.model!r}, node registered "
                            f"{registered_models.get(node_id)!r}")
        if not (isinstance(outcome.score, (int, float)) and 0.0 <= outcome.score <= 1.0):
            problems.append(f"{node_id}: score {outcome.score!r} outside [0, 1]")
    return problems


def judge_proposal(
    plan: ChallengePlan,
    prompts: Mapping[str, str],
    proposal: EpochProposal,
    registered_models: Mapping[str, str],
    check_signature: SignatureCheck,
    my_scores: Mapping[str, float],
    params: EpochParams = EPOCHS,
) -> Verdict:
    """ProcessProposal on one verifier: accept only an intact result whose scores it reproduces.

    `prompts` are the plan's revealed prompts (challenges.check_reveals); `my_scores` are this
    verifier's own credibilities for the proposal's replies (scoring.credibility on its own
    reference-model pass); a reply it could not score counts as a mismatch.
    """
    problems = integrity_problems(plan, prompts, proposal, registered_models, check_signature)
    for node_id in sorted(set(plan.node_ids) & set(proposal.outcomes)):
        outcome = proposal.outcomes[node_id]
        if not isinstance(outcome, ReplyOutcome):
            continue
        mine = my_scores.get(node_id)
        if mine is None or not math.isfinite(mine):
            problems.append(f"{node_id}: no local score to compare with")
        elif isinstance(outcome.score, (int, float)) and abs(outcome.score - mine) > params.score_tolerance:
            problems.append(f"{node_id}: leader score {outcome.score:.4f} vs local {mine:.4f}")
    return Verdict(not problems, tuple(problems))


def replies_to_score(proposal: EpochProposal) -> dict[str, SignedReply]:
    """The replies a verifier must score before judging (node id -> reply)."""
    return {n: o.reply for n, o in proposal.outcomes.items() if isinstance(o, ReplyOutcome)}


# --------------------------------------------------------------------------- the epoch record


class Phase:
    AWAITING_RESULT = "awaiting_result"
    RESOLVING = "resolving"  # some nodes were reported missing; verifiers are probing them
    DONE = "done"
    ABORTED = "aborted"


@dataclass(frozen=True)
class ProbeReport:
    """A non-leader verifier's own probe of a node the leader reported missing."""

    verifier_id: str
    node_id: str
    ok: bool  # got a valid, signed reply to its own fresh prompt


@dataclass(frozen=True)
class EpochRecord:
    """Replicated state of one epoch; every transition returns a new record or raises."""

    epoch: int
    leader: str
    committee: tuple[str, ...]
    planned: tuple[str, ...]
    phase: str = Phase.AWAITING_RESULT
    scores: Mapping[str, float] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    reports: Mapping[str, Mapping[str, bool]] = field(default_factory=dict)  # node -> verifier -> ok
    faulty_leader: bool = False
    reason: str = ""


def start_epoch(epoch: int, leader: str, committee: Sequence[str], plan: ChallengePlan) -> EpochRecord:
    """A new epoch with its elected leader and its committed plan."""
    members = tuple(sorted(set(committee)))
    if len(members) != len(committee) or not members:
        raise EpochError("committee must be non-empty with unique ids")
    if leader not in members:
        raise EpochError(f"leader {leader} is not a committee member")
    if plan.epoch != epoch:
        raise EpochError("plan is for another epoch")
    return EpochRecord(epoch, leader, members, tuple(sorted(plan.node_ids)))


def apply_result(rec: EpochRecord, proposal: EpochProposal) -> EpochRecord:
    """The committed (hence accepted) leader result."""
    if rec.phase != Phase.AWAITING_RESULT:
        raise EpochError(f"epoch {rec.epoch} is {rec.phase}, not awaiting a result")
    if proposal.epoch != rec.epoch or proposal.leader != rec.leader:
        raise EpochError("result is not from this epoch's leader")
    if set(proposal.outcomes) != set(rec.planned):
        raise EpochError("result does not cover exactly the planned nodes")
    scores, missing = {}, []
    for node_id in rec.planned:
        outcome = proposal.outcomes[node_id]
        if isinstance(outcome, ReplyOutcome):
            if not 0.0 <= outcome.score <= 1.0:
                raise EpochError(f"score of {node_id} outside [0, 1]")
            scores[node_id] = float(outcome.score)
        else:
            missing.append(node_id)
    phase = Phase.RESOLVING if missing else Phase.DONE
    return replace(rec, phase=phase, scores=scores, missing=tuple(missing), reports={n: {} for n in missing})


PUNISH, REACHED, UNDECIDED = "punish", "reached", "undecided"


def node_decision(rec: EpochRecord, node_id: str) -> str:
    """PUNISH, REACHED (the leader's report is contradicted: unscored) or UNDECIDED for a node
    the leader reported missing."""
    votes = rec.reports.get(node_id, {})
    n = len(rec.committee)
    failures = sum(1 for ok in votes.values() if not ok)  # the others' reports: never the leader's
    successes = sum(1 for ok in votes.values() if ok)
    if successes * 3 > 2 * n:
        return REACHED
    if failures * 3 > n - 1 or n == 1:
        return PUNISH
    return UNDECIDED


REASONS_LISTED = 4  # nodes named in one epoch's reason (the history keeps reasons: bounded)


def dispute_reason(node_id: str) -> str:
    """What an epoch's summary says of a contradicted missing-reply report."""
    return (f"disputed: the leader reported {node_id[:16]} missing but > 2/3 of the committee got valid "
            "replies from it (not scored this epoch)")


def note_dispute(reason: str, node_id: str) -> str:
    """`reason` with the dispute of `node_id` added, unless REASONS_LISTED disputes are named
    already (the leader's disputes counter counts them all)."""
    if reason.count("disputed:") >= REASONS_LISTED:
        return reason
    return "; ".join(filter(None, (reason, dispute_reason(node_id))))


def abort_reason(reason: str, why: str) -> str:
    """An aborted epoch's reason: why it aborted, then the disputes noted before. A probe report
    can settle a dispute while the epoch still attests, and the leader's disputes counter has
    counted it: the reason is the only record of which node it was."""
    return "; ".join([why, *(part for part in reason.split("; ") if part.startswith("disputed:"))])


def all_decided(rec: EpochRecord) -> bool:
    """Every node reported missing is decided, or every member but the leader has reported on it."""
    others = len(rec.committee) - 1
    return all(node_decision(rec, node) != UNDECIDED or len(rec.reports.get(node, {})) >= others
               for node in rec.missing)


def apply_probe_report(rec: EpochRecord, report: ProbeReport) -> EpochRecord:
    """One verifier's probe report; may decide the node and settle the epoch."""
    if rec.phase != Phase.RESOLVING:
        raise EpochError(f"epoch {rec.epoch} is {rec.phase}, not resolving missing replies")
    if report.verifier_id not in rec.committee:
        raise EpochError(f"{report.verifier_id} is not a committee member")
    if report.verifier_id == rec.leader:
        raise EpochError("the leader's report is its missing-reply claim; it cannot probe too")
    if report.node_id not in rec.missing:
        raise EpochError(f"{report.node_id} was not reported missing")
    votes = rec.reports[report.node_id]
    if report.verifier_id in votes:
        raise EpochError(f"{report.verifier_id} already reported on {report.node_id}")
    before = node_decision(rec, report.node_id)
    reports = dict(rec.reports)
    reports[report.node_id] = {**votes, report.verifier_id: bool(report.ok)}
    rec = replace(rec, reports=reports)
    if before != REACHED and node_decision(rec, report.node_id) == REACHED:
        rec = replace(rec, reason=note_dispute(rec.reason, report.node_id))
    if all_decided(rec):
        return replace(rec, phase=Phase.DONE)
    return rec


def close_epoch(rec: EpochRecord) -> EpochRecord:
    """The epoch's deadline height: no result -> aborted; pending probes settle as they stand."""
    if rec.phase in (Phase.DONE, Phase.ABORTED):
        return rec
    if rec.phase == Phase.AWAITING_RESULT:
        why = f"no accepted result from leader {rec.leader}"
        return replace(rec, phase=Phase.ABORTED, reason=abort_reason(rec.reason, why))
    return replace(rec, phase=Phase.DONE)


def epoch_credibilities(rec: EpochRecord) -> dict[str, float]:
    """C(T) per node to feed the reputation update: empty unless the epoch is DONE."""
    if rec.phase != Phase.DONE:
        return {}
    out = dict(rec.scores)
    for node_id in rec.missing:
        if node_decision(rec, node_id) == PUNISH:
            out[node_id] = 0.0
    return out


def finalize_reputations(
    states: Mapping[str, rep.ReputationState], rec: EpochRecord, params: ReputationParams = REPUTATION
) -> dict[str, rep.ReputationState]:
    """FinalizeBlock's deterministic reputation update for a closed epoch (no-op if aborted)."""
    if rec.phase not in (Phase.DONE, Phase.ABORTED):
        raise EpochError("close the epoch first")
    return rep.update_all(states, epoch_credibilities(rec), params)
