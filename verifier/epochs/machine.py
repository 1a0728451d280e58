"""The verification epoch: one pure state machine (ARCHITECTURE.md §3.5; paper §3.4, Algorithm 3).

Everything that changes an epoch's state lives here. The registry application hands it every
committed epoch transaction (`apply`) and the end of every block (`end_block`); both are
functions of (committed state, input) only, so every member computes the same `epochs` section
and the app hash commits to it. The parameters are the chain's (`view.params`, fixed by the
genesis: gentorrent/ledger/chain_params.py), never a member's settings. Nothing else writes an
epoch's phase, and every phase change is held to TRANSITIONS, the table below; to add a rule,
add its event and its row there.

The phases (gentorrent.ledger.epoch_txs.Phase, the vocabulary every reader of the public state
shares) and what moves an epoch through them:

    (none)     members register their keys (epoch_member_keys: a VRF key for elections, an
               X25519 key for private reveals); at the end of a block in which members with
               > 2/3 of the power have, epoch 1 opens
    electing   members post ECVRF proofs over (chain id, epoch, hash of the block that closed
               the previous epoch); when all registered members have, or at the election
               deadline, the lowest valid output leads (vrf.elect_leader). The probe set is
               fixed now, from committed state (challenges.select_probe_set over the registered
               model nodes and challenges.epoch_probe_seed)
    planning   the leader posts one prompt commitment per node of the probe set (the plain
               prompts go privately to the other members, never on chain); a plan that covers
               any other set makes its leader faulty and aborts the epoch
    probing    the leader sends the challenges through the overlay and posts, per node, only
               the digest of its signed reply or a missing-reply report; the replies go to the
               members privately (verifier.epochs.reply_commitments), so the public state never
               shows a node which of its requests was the challenge
    attesting  EVERY member checks its private copy of every reply against the digest and the
               signer's registered key (a mismatch, or a receipt the node did not sign, can only
               come from the leader: "leader faulty"), re-scores it with its own reference model
               and posts an attestation; once members with > 2/3 of the power have, the agreed
               credibility of a node is the median of their scores (at most f Byzantine attestors
               cannot move it outside the honest range), members further than score_tolerance
               from it get a disagreement mark, and if more than N/3 members say a reply is not
               for the committed prompt or not the node's signed reply, the leader altered it:
               faulty, abort. A reply more than N/3 call forwarded is scored for the group member
               that served it (`_agree`)
    resolving  nodes reported missing are probed by the other members with prompts of their
               own; the reports decide them (`decision`), and the epoch is settled once every
               missing node is decided or every other member has reported
    done       at the end of the block: R(T) (verifier.epochs.reputation) for every scored
               node with its trusted flag, a summary, and the next epoch opens
    aborted    at the end of the block: a summary (and the leader's fault, if it was), and the
               next epoch opens; nobody's reputation changes

Deadlines (DEADLINES) are block times, so a silent leader or a lost quorum never stalls the
committee: the epoch aborts and the next one elects a new leader.

Missing replies. With N members, counting the reports of the N - 1 others (the leader's own
report is not a vote: an honest leader's probe of a slow honest node can fail, and with f faulty
members voting "failed" it made f + 1 > N/3 failures, the honest node zeroed):

    failures * 3 > N - 1    the node misbehaves on purpose: credibility 0 this epoch (at least
                            one honest member failed to reach it too; a committee of one
                            trusts its leader)
    successes * 3 > 2 * N   the leader's report is contradicted ("reached"): the node is not
                            scored this epoch, everyone else is, and the leader's dispute
                            count grows
    otherwise               undecided: no change for that node

With N = 3f + 1 and at most f faulty members, faulty members make at most f failure reports,
and f * 3 > 3f never holds, so they never punish an honest node; once the honest members'
successes are in (at least 2f + 1 of them when the leader is faulty), a leader's lie is always
contradicted. Both decisions together would need more than (N - 1)/3 + 2N/3 = N - 1/3 reports
of the N - 1 members, so they exclude each other and the outcome does not depend on the order
in which reports commit. A contradicted report does not prove the leader lied: a node that
answers every request but those of the (public) probing phase is missing for the leader and
reached by the members, who probe later. When that aborted the epoch, one such node voided
every epoch and every other node's score; now it voids only its own, and the leader's disputes
are counted in committed state (`MemberKeysEntry.disputes`).

Why attestations rather than re-scoring inside ProcessProposal: ProcessProposal must answer
within a consensus timeout and be a pure function of the block, but a reference-model pass takes
seconds on a CPU and a float result depends on the engine build. Re-scoring before the result,
as signed integer attestations, keeps consensus fast and exactly deterministic, and still lets
no single verifier (the leader included) decide a score.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Callable, Mapping, Protocol

from gentorrent.ledger.chain_params import ChainParams
from gentorrent.ledger.epoch_txs import (SCORE_SCALE, VERDICT_FORWARDED, VERDICT_LEADER_FAULTY, VERDICT_PROMPT_MISMATCH,
                                         VERDICT_SCORED, Phase)
from gentorrent.ledger.txs import CODE_INVALID_FIELD, CODE_UNAUTHORIZED, TxError
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.epochs import reputation as rep
from verifier.epochs import vrf
from verifier.epochs.audits import agree_audit_scores, fold
from verifier.epochs.challenges import (ChallengeEntry, ChallengeError, ChallengePlan, check_plan, epoch_probe_seed,
                                        select_probe_set)

__all__ = ["Phase", "Settled", "DeadlinePassed", "NextEpoch", "TRANSITIONS", "DEADLINES", "apply",
           "end_block", "Decision", "decision", "note_dispute", "abort_reason", "dispute_reason", "REASONS_LISTED",
           "CODE_WRONG_PHASE", "leader_of", "member_keys_of", "phase_of", "state_of", "standing_of"]

CODE_WRONG_PHASE = 30  # an epoch tx that does not fit the epoch's phase (a late or early one)
REASONS_LISTED = 4  # nodes named in one epoch's reason (the history keeps reasons: bounded)


class StateView(Protocol):
    """What the epoch machine reads of (and writes to) the registry state in a block: the
    application's `verifier.abci.state.StateView` satisfies it."""

    chain_id: str
    height: int
    time_ms: int
    params: ChainParams
    epochs: pb.EpochsSection
    models: Any  # node id -> ModelRecord (get, set, items)
    validators: tuple[tuple[bytes, int], ...]  # (public key, power)


# --------------------------------------------------------------------------- events and the table


# The inputs are the committed epoch transactions (their pb message types, `apply`) and the end
# of each block (`end_block`); these events are what they fire, as rows of the table.


class Settled:
    """Fired after every input: a resolving epoch whose missing nodes are all decided, or that
    every other member has reported on, is done."""


class DeadlinePassed:
    """Fired by a block end whose time is past the phase's deadline (DEADLINES)."""


class NextEpoch:
    """Fired by a block end: the first epoch opens once a quorum of members registered keys;
    a done or aborted epoch closes (reputations, summary) and the next one opens."""


P = Phase
#: event -> {phase the event is accepted in: phases it may leave the epoch in}. An epoch
#: transaction in a phase its row does not list is refused (CODE_WRONG_PHASE) and changes
#: nothing; a handler that moves the epoch anywhere else is a bug (AssertionError).
TRANSITIONS: dict[type, dict[Phase, frozenset[Phase]]] = {
    pb.EpochMemberKeys: {phase: frozenset({phase}) for phase in Phase},  # keys are for life, in any phase
    pb.EpochVrfProof: {P.ELECTING: frozenset({P.ELECTING, P.PLANNING})},  # the last member's proof elects
    pb.EpochPlan: {P.PLANNING: frozenset({P.PROBING, P.DONE, P.ABORTED})},  # nothing to probe: done
    pb.EpochReplies: {P.PROBING: frozenset({P.ATTESTING, P.RESOLVING})},  # no reply to attest: resolving
    pb.EpochAttestation: {P.ATTESTING: frozenset({P.ATTESTING, P.RESOLVING, P.ABORTED})},
    pb.EpochProbeReport: {P.ATTESTING: frozenset({P.ATTESTING}), P.RESOLVING: frozenset({P.RESOLVING})},
    pb.EpochAuditReport: {phase: frozenset({phase}) for phase in (P.PROBING, P.ATTESTING, P.RESOLVING)},
    Settled: {P.RESOLVING: frozenset({P.DONE})},
    DeadlinePassed: {P.ELECTING: frozenset({P.PLANNING}), P.PLANNING: frozenset({P.ABORTED}),
                     P.PROBING: frozenset({P.ABORTED}), P.ATTESTING: frozenset({P.ABORTED}),
                     P.RESOLVING: frozenset({P.DONE})},
    NextEpoch: {P.NONE: frozenset({P.ELECTING}), P.DONE: frozenset({P.ELECTING}), P.ABORTED: frozenset({P.ELECTING})},
}


@dataclass(frozen=True)
class Deadline:
    """What happens to a phase still open `timeout` (an EpochParams field) after it began."""

    timeout: str
    then: Phase
    faulty: bool = False  # an abort that is the leader's fault
    reason: str = ""  # an abort's reason


DEADLINES: dict[Phase, Deadline] = {
    P.ELECTING: Deadline("election_timeout_ms", P.PLANNING),  # elect with the proofs present
    P.PLANNING: Deadline("plan_timeout_ms", P.ABORTED, faulty=True, reason="the leader posted no plan in time"),
    P.PROBING: Deadline("probe_timeout_ms", P.ABORTED, faulty=True, reason="the leader posted no replies in time"),
    P.ATTESTING: Deadline("attest_timeout_ms", P.ABORTED, reason="no attestation quorum in time"),
    P.RESOLVING: Deadline("attest_timeout_ms", P.DONE),  # probes still missing: those nodes stay as they are
}
assert set(DEADLINES) == set(TRANSITIONS[DeadlinePassed])


class _Step:
    """One event applied to a copy of the epochs section; `enter` is the only way its phase changes."""

    def __init__(self, view: StateView, sec: pb.EpochsSection, event: type) -> None:
        self.view, self.sec, self.event = view, sec, event

    @property
    def cur(self) -> pb.EpochStateEntry:
        return self.sec.current

    @property
    def params(self) -> ChainParams:
        return self.view.params

    def check(self, phase: Phase) -> None:
        allowed = TRANSITIONS[self.event].get(Phase(self.cur.phase), frozenset())
        if phase not in allowed:
            raise AssertionError(f"{self.event.__name__} may not move an epoch from {self.cur.phase!r} to {str(phase)!r}")

    def enter(self, phase: Phase) -> None:
        self.check(phase)
        self.cur.phase = phase
        self.cur.phase_started_ms = self.view.time_ms

    def abort(self, faulty: bool, reason: str) -> None:
        self.enter(P.ABORTED)
        self.cur.reason = abort_reason(self.cur.reason, ("faulty leader: " if faulty else "") + reason)


# --------------------------------------------------------------------------- transactions


def apply(view: StateView, signer: bytes, message) -> pb.EpochsSection:
    """The epochs section after the committed epoch transaction `message` of `signer`, or
    TxError (and `view` is untouched either way)."""
    sec = _copy(view.epochs)
    event = type(message)
    accepted = TRANSITIONS[event]
    cur = sec.current
    listed = _LISTED.get(event)
    if listed is not None and len(listed(message)) > view.params.epochs.max_probed_nodes:
        raise _bad(f"{event.__name__} lists more than this chain's {view.params.epochs.max_probed_nodes} nodes "
                   "(genesis epochs.max_probed_nodes)")
    if event is not pb.EpochMemberKeys:
        if sec.epoch == 0 or message.epoch != cur.epoch:
            raise _wrong_phase(f"epoch {message.epoch} is not the current epoch {cur.epoch}")
        if Phase(cur.phase) not in accepted:
            raise _wrong_phase(f"epoch {message.epoch} is {cur.phase}, not {' or '.join(accepted)}")
    _HANDLERS[event](_Step(view, sec, event), signer, message)
    _settle(view, sec)
    return sec


def _member_keys(step: _Step, signer: bytes, m: pb.EpochMemberKeys) -> None:
    if _member(step.sec, signer) is not None:
        raise _bad("this member's epoch keys are already registered (keys are for life)")
    entries = list(step.sec.members) + [pb.MemberKeysEntry(public_key=signer, vrf_public_key=m.vrf_public_key,
                                                           box_public_key=m.box_public_key)]
    del step.sec.members[:]
    step.sec.members.extend(sorted(entries, key=lambda e: e.public_key))


def _vrf_proof(step: _Step, signer: bytes, m: pb.EpochVrfProof) -> None:
    member, cur = _member(step.sec, signer), step.cur
    if member is None:
        raise TxError(CODE_UNAUTHORIZED, "register epoch keys before taking part in an election")
    if any(p.public_key == signer for p in cur.proofs):
        raise _bad("this member already sent its proof for this epoch")
    try:
        ok = vrf.verify(member.vrf_public_key, m.proof, vrf.election_input(step.view.chain_id, m.epoch, cur.seed))
    except vrf.VrfError:
        ok = None
    if ok is None:
        raise _bad("the VRF proof does not verify under the member's registered VRF key")
    cur.proofs.append(pb.VrfProofEntry(public_key=signer, proof=m.proof))
    if {p.public_key for p in cur.proofs} >= {e.public_key for e in step.sec.members}:
        _elect(step)


def _elect(step: _Step) -> None:
    cur, view = step.cur, step.view
    members = [(e.public_key.hex(), e.vrf_public_key) for e in step.sec.members]
    proofs = {p.public_key.hex(): p.proof for p in cur.proofs}
    cur.leader = bytes.fromhex(vrf.elect_leader(view.chain_id, cur.epoch, cur.seed, members, proofs))
    cur.probe_set.extend(bytes.fromhex(n) for n in _probe_set(view, cur))
    step.enter(P.PLANNING)


def _probe_set(view: StateView, cur: pb.EpochStateEntry) -> list[str]:
    """The nodes this epoch's plan must cover: a function of committed state only (the model
    nodes registered now and the election's VRF outputs), so no leader can leave one out."""
    outputs = [vrf.proof_to_hash(p.proof) for p in sorted(cur.proofs, key=lambda p: p.public_key)]
    seed = epoch_probe_seed(cur.seed, outputs)
    return select_probe_set((node_id.hex() for node_id, _ in view.models.items()), seed,
                            view.params.epochs.max_probed_nodes)


def _plan(step: _Step, signer: bytes, m: pb.EpochPlan) -> None:
    cur, rules = step.cur, step.params.epochs
    _require_leader(cur, signer, "plan")
    plan = ChallengePlan(m.epoch, tuple(ChallengeEntry(e.node_id.hex(), e.commitment) for e in m.entries))
    required = {n.hex() for n in cur.probe_set}
    if set(plan.node_ids) != required:
        left_out, extra = sorted(required - set(plan.node_ids)), sorted(set(plan.node_ids) - required)
        step.abort(faulty=True, reason=f"the plan does not cover the epoch's probe set (left out "
                                       f"{[n[:16] for n in left_out[:REASONS_LISTED]]}, {len(left_out)} in all; "
                                       f"not in it {[n[:16] for n in extra[:REASONS_LISTED]]})")
        return
    try:
        check_plan(plan, required, rules.max_probed_nodes)
    except ChallengeError as exc:
        raise _bad(f"plan refused: {exc}") from exc
    cur.plan.extend(m.entries)
    step.enter(P.PROBING if m.entries else P.DONE)  # nothing to probe (no model node registered): over


def _replies(step: _Step, signer: bytes, m: pb.EpochReplies) -> None:
    cur = step.cur
    _require_leader(cur, signer, "replies")
    if [r.node_id for r in m.replies] != [e.node_id for e in cur.plan]:
        raise _bad("the replies must cover exactly the planned nodes (a skipped node is reported missing)")
    cur.replies.extend(m.replies)
    step.enter(P.ATTESTING if any(not r.missing for r in cur.replies) else P.RESOLVING)


def _attestation(step: _Step, signer: bytes, m: pb.EpochAttestation) -> None:
    cur = step.cur
    if any(a.public_key == signer for a in cur.attestations):
        raise _bad("this member already attested this epoch")
    expected = [r.node_id for r in cur.replies if not r.missing]
    if [s.node_id for s in m.scores] != expected:
        raise _bad("an attestation scores exactly the replies the leader posted")
    cur.attestations.append(pb.AttestationEntry(public_key=signer, scores=m.scores))
    if _quorum(_powers(step.view), (a.public_key for a in cur.attestations)):
        _agree(step)


def _agree(step: _Step) -> None:
    """The quorum's agreed scores: medians, disagreement marks, prompt-alteration check.

    A reply more than N/3 of the members call forwarded (served and signed by another node of
    the group: reply_commitments) is scored for the member that served it, named by more than
    N/3 of the members, never for the probed node: the check is deterministic, so every honest
    member names the same server, and f Byzantine members can neither name another one nor
    frame the probed node. Without it, a node was scored only by the challenges routed to it as
    their prefix home: about one epoch in g for a group of g members."""
    cur = step.cur
    n = len(step.view.validators)
    result, mismatched, unsigned = [], [], []
    for i, reply in enumerate(r for r in cur.replies if not r.missing):
        votes = [a.scores[i] for a in cur.attestations]
        if 3 * sum(1 for v in votes if v.verdict == VERDICT_LEADER_FAULTY) > n:
            unsigned.append(reply.node_id.hex()[:16])
        elif 3 * sum(1 for v in votes if v.verdict in (VERDICT_PROMPT_MISMATCH, VERDICT_LEADER_FAULTY)) > n:
            mismatched.append(reply.node_id.hex()[:16])
        forwarded = [v for v in votes if v.verdict == VERDICT_FORWARDED]
        if 3 * len(forwarded) > n:
            server = _named_server(forwarded, n)
            if server is not None:
                _agree_score(step, i, pb.NodeScore(node_id=server, verdict=VERDICT_FORWARDED, served_by=server),
                             result)
            continue
        _agree_score(step, i, pb.NodeScore(node_id=reply.node_id, verdict=VERDICT_SCORED), result)
    if unsigned:
        step.abort(faulty=True, reason=f"the leader's private replies of {unsigned[:REASONS_LISTED]} "
                                       f"({len(unsigned)} in all) do not open its public digests or their node "
                                       "did not sign them")
        return
    if mismatched:
        step.abort(faulty=True, reason=f"the replies of {mismatched} answer prompts other than the committed ones")
        return
    cur.result.extend(result)
    step.enter(P.RESOLVING)


def _named_server(forwarded: list, committee_size: int) -> bytes | None:
    """The server more than N/3 of the members name (one, as honest members agree), or None."""
    counts = Counter(v.served_by for v in forwarded)
    named = sorted(server for server, c in counts.items() if 3 * c > committee_size)
    return named[0] if len(named) == 1 else None


def _agree_score(step: _Step, i: int, agreed: pb.NodeScore, result: list[pb.NodeScore]) -> None:
    """Into result: `agreed` with the median score of the members' votes on reply i that share
    its verdict and server; a member more than the tolerance off the median is marked."""
    tolerance = int(round(step.params.epochs.score_tolerance * SCORE_SCALE))
    votes = [(a, a.scores[i]) for a in step.cur.attestations]
    votes = [(a, v) for a, v in votes if v.verdict == agreed.verdict and v.served_by == agreed.served_by]
    if not votes:
        return
    scored = sorted(v.score_micros for _, v in votes)
    agreed.score_micros = scored[(len(scored) - 1) // 2]
    result.append(agreed)
    for a, v in votes:
        if abs(v.score_micros - agreed.score_micros) > tolerance:
            member = _member(step.sec, a.public_key)
            if member is not None:
                member.disagreements += 1


def _probe_report(step: _Step, signer: bytes, m: pb.EpochProbeReport) -> None:
    cur, n = step.cur, len(step.view.validators)
    if signer == cur.leader:
        raise TxError(CODE_UNAUTHORIZED, "the leader's report is its missing-reply claim; it cannot probe too")
    if not any(r.node_id == m.node_id and r.missing for r in cur.replies):
        raise _bad(f"{m.node_id.hex()[:16]} was not reported missing")
    if any(p.node_id == m.node_id and p.public_key == signer for p in cur.probes):
        raise _bad("this member already reported on that node")
    before = decision(_reports(cur, m.node_id), n)
    cur.probes.append(pb.ProbeReportEntry(node_id=m.node_id, public_key=signer, ok=m.ok))
    if before != Decision.REACHED and decision(_reports(cur, m.node_id), n) == Decision.REACHED:
        # contradicted: a lying leader or a node that answered all but it (module docstring); no abort
        cur.reason = note_dispute(cur.reason, m.node_id.hex())
        leader = _member(step.sec, cur.leader)
        if leader is not None:
            leader.disputes += 1


def _audit_report(step: _Step, signer: bytes, m: pb.EpochAuditReport) -> None:
    """A member's audit scores, once per member per epoch, until the epoch is decided."""
    if _member(step.sec, signer) is None:
        raise _bad("audit reports come from members with registered epoch keys")
    if any(r.public_key == signer for r in step.cur.audit_reports):
        raise _bad("this member already reported its audits this epoch")
    step.cur.audit_reports.append(pb.AuditReportEntry(public_key=signer, scores=m.scores,
                                                      receipts_digest=m.receipts_digest))


#: the nodes an epoch transaction lists: at most the chain's max_probed_nodes
_LISTED: dict[type, Callable[[Any], Any]] = {
    pb.EpochPlan: lambda m: m.entries, pb.EpochReplies: lambda m: m.replies, pb.EpochAttestation: lambda m: m.scores,
    pb.EpochAuditReport: lambda m: m.scores,
}
_HANDLERS: dict[type, Callable[[_Step, bytes, Any], None]] = {
    pb.EpochMemberKeys: _member_keys, pb.EpochVrfProof: _vrf_proof, pb.EpochPlan: _plan,
    pb.EpochReplies: _replies, pb.EpochAttestation: _attestation, pb.EpochProbeReport: _probe_report,
    pb.EpochAuditReport: _audit_report,
}


def _settle(view: StateView, sec: pb.EpochsSection) -> None:
    """RESOLVING -> DONE once every missing node is decided or every other member reported."""
    cur = sec.current
    if cur.phase == P.RESOLVING and _settled(cur, len(view.validators)):
        _Step(view, sec, Settled).enter(P.DONE)


# --------------------------------------------------------------------------- missing replies


class Decision(StrEnum):
    """What the members' probe reports say of a node the leader reported missing."""

    PUNISH = "punish"  # credibility 0 this epoch
    REACHED = "reached"  # the leader's report is contradicted: unscored this epoch, a dispute
    UNDECIDED = "undecided"  # no change for that node


def decision(reports: Mapping[bytes, bool], committee_size: int) -> Decision:
    """The decision on a missing node from the other members' reports (member -> got a valid
    signed reply; never the leader's); the module docstring says why these thresholds."""
    successes = sum(1 for ok in reports.values() if ok)
    failures = len(reports) - successes
    if successes * 3 > 2 * committee_size:
        return Decision.REACHED
    if failures * 3 > committee_size - 1 or committee_size == 1:
        return Decision.PUNISH
    return Decision.UNDECIDED


def _reports(cur: pb.EpochStateEntry, node_id: bytes) -> dict[bytes, bool]:
    return {p.public_key: p.ok for p in cur.probes if p.node_id == node_id}


def _missing_reports(cur: pb.EpochStateEntry) -> dict[bytes, dict[bytes, bool]]:
    """Every node reported missing -> the other members' reports on it (one pass over the probes)."""
    out: dict[bytes, dict[bytes, bool]] = {r.node_id: {} for r in cur.replies if r.missing}
    for p in cur.probes:
        if p.node_id in out:
            out[p.node_id][p.public_key] = p.ok
    return out


def _settled(cur: pb.EpochStateEntry, committee_size: int) -> bool:
    """Every node reported missing is decided, or every member but the leader reported on it."""
    return all(decision(reports, committee_size) != Decision.UNDECIDED or len(reports) >= committee_size - 1
               for reports in _missing_reports(cur).values())


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


# --------------------------------------------------------------------------- end of block


def end_block(view: StateView, block_hash: bytes) -> None:
    """The end of a block: deadlines, the close of a finished epoch (reputation update) and the
    opening of the next. Called by FinalizeBlock after the block's transactions, with the block's
    hash (the "final commit hash" the next election draws on)."""
    sec = _copy(view.epochs)
    cur = sec.current
    if sec.epoch == 0:
        if sec.members and _quorum(_powers(view), (m.public_key for m in sec.members)):
            _open(_Step(view, sec, NextEpoch), 1, block_hash)
            view.epochs = sec
        return
    deadline = DEADLINES.get(Phase(cur.phase))
    if deadline is not None and view.time_ms - cur.phase_started_ms >= getattr(view.params.epochs, deadline.timeout):
        step = _Step(view, sec, DeadlinePassed)
        if deadline.then == P.PLANNING:
            _elect(step)
        elif deadline.then == P.ABORTED:
            step.abort(deadline.faulty, deadline.reason)
        else:
            step.enter(deadline.then)
    if cur.phase in (P.DONE, P.ABORTED):
        _close(view, sec)
        _open(_Step(view, sec, NextEpoch), cur.epoch + 1, block_hash)
    view.epochs = sec


def _open(step: _Step, epoch: int, seed: bytes) -> None:
    step.check(P.ELECTING)
    step.sec.epoch = epoch
    step.cur.CopyFrom(pb.EpochStateEntry(epoch=epoch, phase=P.ELECTING, seed=seed, phase_started_ms=step.view.time_ms,
                                         opened_height=step.view.height))


def _credibilities(view: StateView, sec: pb.EpochsSection) -> dict[bytes, float]:
    """C(T) per node of a done epoch: the agreed scores (a node that served its own challenge
    and a peer's gets the lower), 0 for the missing nodes the members' reports punish, each
    folded with the committee's audit score of the node."""
    cur, n = sec.current, len(view.validators)
    out: dict[bytes, float] = {}
    for s in cur.result:
        out[s.node_id] = min(out.get(s.node_id, 1.0), s.score_micros / SCORE_SCALE)
    for node, reports in _missing_reports(cur).items():
        if decision(reports, n) == Decision.PUNISH:
            out[node] = 0.0
    reports = {e.public_key.hex(): {s.node_id: s.score_micros / SCORE_SCALE for s in e.scores}
               for e in cur.audit_reports}
    for node_id, audited in agree_audit_scores(reports, n).items():
        out[node_id] = fold(out.get(node_id), audited)
    return out


def _close(view: StateView, sec: pb.EpochsSection) -> None:
    """A finished epoch's effects: R(T) and trust of every scored node (done only), the leader's
    fault, the summary in the bounded history."""
    cur, rules = sec.current, view.params
    faulty = cur.reason.startswith("faulty leader")
    scored: list[pb.NodeScore] = []
    if cur.phase == P.DONE:
        windows = {w.node_id: w for w in sec.windows}
        for node_id, cred in sorted(_credibilities(view, sec).items()):
            record = view.models.get(node_id)
            if record is None:
                continue
            w = windows.get(node_id) or pb.ReputationWindow(node_id=node_id)
            # R and trust as the directory lists them (a node never scored has no window yet)
            state = replace(state_of(w), reputation=record.reputation, untrusted=not record.trusted)
            new = rep.update(state, cred, rules.reputation)
            view.models.set(node_id, replace(record, reputation=new.reputation, trusted=not new.untrusted,
                                             updated_height=view.height))
            windows[node_id] = _window_of(node_id, new)
            scored.append(pb.NodeScore(node_id=node_id, score_micros=int(round(cred * SCORE_SCALE))))
        del sec.windows[:]
        sec.windows.extend(windows[k] for k in sorted(windows) if view.models.get(k) is not None
                           or not rep.in_good_standing(state_of(windows[k]), rules.reputation))
    if faulty:
        leader = _member(sec, cur.leader)
        if leader is not None:
            leader.faults += 1
    sec.history.append(pb.EpochSummary(epoch=cur.epoch, phase=cur.phase, leader=cur.leader, faulty_leader=faulty,
                                       reason=cur.reason, result=scored, closed_height=view.height))
    if len(sec.history) > rules.epochs.history_kept:
        del sec.history[: len(sec.history) - rules.epochs.history_kept]


# --------------------------------------------------------------------------- reading the section


def member_keys_of(sec: pb.EpochsSection) -> dict[bytes, pb.MemberKeysEntry]:
    return {m.public_key: m for m in sec.members}


def leader_of(sec: pb.EpochsSection) -> bytes:
    return sec.current.leader


def phase_of(sec: pb.EpochsSection) -> Phase:
    return Phase(sec.current.phase)


def state_of(w: pb.ReputationWindow) -> rep.ReputationState:
    """The committee's memory of a node (`ReputationWindow`) as the pure reputation state."""
    return rep.ReputationState(w.reputation, tuple(v / SCORE_SCALE for v in w.window_micros), w.untrusted,
                               w.epochs, w.offences, w.clean)


def _window_of(node_id: bytes, state: rep.ReputationState) -> pb.ReputationWindow:
    return pb.ReputationWindow(node_id=node_id, window_micros=[int(round(v * SCORE_SCALE)) for v in state.window],
                               epochs=state.epochs, offences=state.offences, clean=state.clean,
                               reputation=state.reputation, untrusted=state.untrusted)


def standing_of(sec: pb.EpochsSection, node_id: bytes) -> tuple[float, bool] | None:
    """(reputation, trusted) a model node resumes when it registers again under a key the
    committee scored before: leaving and coming back (or letting the lease lapse) must not reset
    an untrusted node to the initial reputation. None: a key never scored."""
    for w in sec.windows:
        if w.node_id == node_id and w.epochs:
            return w.reputation, not w.untrusted
    return None


# --------------------------------------------------------------------------- small helpers


def _copy(section: pb.EpochsSection) -> pb.EpochsSection:
    out = pb.EpochsSection()
    out.CopyFrom(section)
    return out


def _wrong_phase(message: str) -> TxError:
    return TxError(CODE_WRONG_PHASE, message)


def _bad(message: str) -> TxError:
    return TxError(CODE_INVALID_FIELD, message)


def _powers(view: StateView) -> dict[bytes, int]:
    return {k: p for k, p in view.validators}


def _member(sec: pb.EpochsSection, public_key: bytes) -> pb.MemberKeysEntry | None:
    return next((m for m in sec.members if m.public_key == public_key), None)


def _require_leader(cur: pb.EpochStateEntry, signer: bytes, what: str) -> None:
    if signer != cur.leader:
        raise TxError(CODE_UNAUTHORIZED, f"only the leader of epoch {cur.epoch} may post the {what}")


def _quorum(powers: dict[bytes, int], signers) -> bool:
    return 3 * sum(powers.get(s, 0) for s in set(signers)) > 2 * sum(powers.values())
