"""How committed epoch transactions and block times move a verification epoch (pure).

ARCHITECTURE.md §3.5 / paper §3.4, Algorithm 3, as a replicated state machine in the `epochs`
section of the registry. One epoch goes through these phases; every transition is a function
of (committed state, block), so every member applies it identically in FinalizeBlock:

    electing   members post ECVRF proofs over (chain id, epoch, hash of the block that closed
               the previous epoch); when all registered members have, or at the election
               deadline, the lowest valid output leads (vrf.elect_leader)
    planning   the leader posts one prompt commitment per node of the probe set (the plain
               prompts go privately to the other members, never on chain). The probe set is
               fixed at the election from committed state (challenges.select_probe_set over the
               registered model nodes and challenges.epoch_probe_seed): a plan that covers any
               other set makes its leader faulty and aborts the epoch
    probing    the leader sends the challenges through the overlay and posts, per node, only
               the digest of its signed reply (or a missing-reply report); the replies go to
               the members privately (verifier.epochs.reply_commitments), so the public state
               never shows a node which of its requests was the challenge
    attesting  EVERY member checks its private copy of every reply against the digest and the
               node's registered key (a mismatch or a receipt the node did not sign can only
               come from the leader: "leader faulty"), re-scores it with its own reference
               model and posts an attestation (score, "not the committed prompt" or "leader
               faulty"); once members with > 2/3 of
               the power have attested, the agreed credibility of a node is the median of their
               scores (at most f Byzantine attestors cannot move it outside the honest range),
               members > score_tolerance away from it get a disagreement mark, and if more than
               N/3 members say a reply is not for the committed prompt or not the node's
               signed reply, the leader altered it: faulty, abort
    resolving  nodes reported missing are probed by the other members with prompts of their own
               (epoch.node_decision): failures by more than (N - 1)/3 of them (the leader's
               report does not count) -> credibility 0; > 2N/3 successes -> disputed: that
               node is not scored this epoch, the others are, and the leader's dispute count
               grows (a node that stalls only for the probing phase cannot void the epoch)
    done       FinalizeBlock applies R(T) (verifier.epochs.reputation) to every scored node,
               updates its trusted flag, records a summary, and opens the next epoch

Why attestations instead of re-scoring inside ProcessProposal (the design's first sketch):
ProcessProposal must answer within a consensus timeout and be a pure function of the block, but
a reference-model pass takes seconds on a CPU and a float result depends on the engine build.
Re-scoring before the result, as signed integer attestations, keeps consensus fast and exactly
deterministic, and still lets no single verifier (the leader included) decide a score.

Deadlines are block times (EpochRunParams), so a silent leader or a lost quorum never stalls
the committee: the epoch aborts and the next one elects a new leader.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Mapping, Protocol

from gentorrent.config import EPOCH_RUN, EPOCHS, REPUTATION, EpochRunParams
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.epoch_txs import (SCORE_SCALE, VERDICT_FORWARDED, VERDICT_LEADER_FAULTY, VERDICT_PROMPT_MISMATCH,
                                         VERDICT_SCORED)
from gentorrent.ledger.txs import CODE_INVALID_FIELD, CODE_UNAUTHORIZED, Tx, TxError
from verifier.epochs import reputation as rep
from verifier.epochs import vrf
from verifier.epochs.audits import agree_audit_scores, fold_credibility
from verifier.epochs.challenges import (ChallengeEntry, ChallengeError, ChallengePlan, check_plan, epoch_probe_seed,
                                        select_probe_set)
from verifier.epochs.epoch import (PUNISH, REACHED, REASONS_LISTED, EpochRecord, abort_reason, all_decided,
                                   node_decision, note_dispute)

ELECTING, PLANNING, PROBING, ATTESTING, RESOLVING = "electing", "planning", "probing", "attesting", "resolving"
DONE, ABORTED = "done", "aborted"
CODE_WRONG_PHASE = 30  # an epoch tx that does not fit the epoch's phase (a late or early one)

__all__ = ["next_section", "end_block", "leader_of", "member_keys_of", "phase_of", "CODE_WRONG_PHASE",
           "ELECTING", "PLANNING", "PROBING", "ATTESTING", "RESOLVING", "DONE", "ABORTED"]


class StateView(Protocol):
    """What the epoch rules read of (and write to) the registry state in a block: the
    application's `verifier.abci.state.StateView` satisfies it."""

    chain_id: str
    height: int
    time_ms: int
    epochs: pb.EpochsSection
    models: Mapping  # node id -> ModelRecord
    validators: tuple[tuple[bytes, int], ...]  # (public key, power)


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


def member_keys_of(sec: pb.EpochsSection) -> dict[bytes, pb.MemberKeysEntry]:
    return {m.public_key: m for m in sec.members}


def leader_of(sec: pb.EpochsSection) -> bytes:
    return sec.current.leader


def phase_of(sec: pb.EpochsSection) -> str:
    return sec.current.phase


def _check_epoch(sec: pb.EpochsSection, epoch: int, *phases: str) -> pb.EpochStateEntry:
    cur = sec.current
    if sec.epoch == 0 or epoch != cur.epoch:
        raise _wrong_phase(f"epoch {epoch} is not the current epoch {cur.epoch}")
    if cur.phase not in phases:
        raise _wrong_phase(f"epoch {epoch} is {cur.phase}, not {' or '.join(phases)}")
    return cur


def _quorum(powers: dict[bytes, int], signers) -> bool:
    return 3 * sum(powers.get(s, 0) for s in set(signers)) > 2 * sum(powers.values())


# --------------------------------------------------------------------------- transactions


def next_section(view: StateView, tx: Tx) -> pb.EpochsSection:
    """The epochs section after `tx`, or TxError (and `view` is untouched either way)."""
    sec = _copy(view.epochs)
    m = tx.payload
    if tx.kind == "epoch_member_keys":
        _member_keys(sec, tx.signer, m)
    elif tx.kind == "epoch_vrf_proof":
        _vrf_proof(view, sec, tx.signer, m)
    elif tx.kind == "epoch_plan":
        _plan(view, sec, tx.signer, m)
    elif tx.kind == "epoch_replies":
        _replies(view, sec, tx.signer, m)
    elif tx.kind == "epoch_attestation":
        _attestation(view, sec, tx.signer, m)
    elif tx.kind == "epoch_probe_report":
        _probe_report(view, sec, tx.signer, m)
    elif tx.kind == "epoch_audit_report":
        _audit_report(sec, tx.signer, m)
    else:  # pragma: no cover
        raise AssertionError(tx.kind)
    return sec


def _member_keys(sec: pb.EpochsSection, signer: bytes, m: pb.EpochMemberKeys) -> None:
    if _member(sec, signer) is not None:
        raise TxError(CODE_INVALID_FIELD, "this member's epoch keys are already registered (keys are for life)")
    entries = list(sec.members) + [pb.MemberKeysEntry(public_key=signer, vrf_public_key=m.vrf_public_key,
                                                      box_public_key=m.box_public_key)]
    del sec.members[:]
    sec.members.extend(sorted(entries, key=lambda e: e.public_key))


def _vrf_proof(view: StateView, sec: pb.EpochsSection, signer: bytes, m: pb.EpochVrfProof) -> None:
    cur = _check_epoch(sec, m.epoch, ELECTING)
    member = _member(sec, signer)
    if member is None:
        raise TxError(CODE_UNAUTHORIZED, "register epoch keys before taking part in an election")
    if any(p.public_key == signer for p in cur.proofs):
        raise _bad("this member already sent its proof for this epoch")
    try:
        ok = vrf.verify(member.vrf_public_key, m.proof, vrf.election_input(view.chain_id, m.epoch, cur.seed))
    except vrf.VrfError:
        ok = None
    if ok is None:
        raise _bad("the VRF proof does not verify under the member's registered VRF key")
    cur.proofs.append(pb.VrfProofEntry(public_key=signer, proof=m.proof))
    if {p.public_key for p in cur.proofs} >= {e.public_key for e in sec.members}:
        _elect(view, sec)


def _elect(view: StateView, sec: pb.EpochsSection) -> None:
    cur = sec.current
    members = [(e.public_key.hex(), e.vrf_public_key) for e in sec.members]
    proofs = {p.public_key.hex(): p.proof for p in cur.proofs}
    cur.leader = bytes.fromhex(vrf.elect_leader(view.chain_id, cur.epoch, cur.seed, members, proofs))
    cur.probe_set.extend(bytes.fromhex(n) for n in _probe_set(view, cur))
    _enter(view, cur, PLANNING)


def _probe_set(view: StateView, cur: pb.EpochStateEntry) -> list[str]:
    """The nodes this epoch's plan must cover: a function of committed state only (the model
    nodes registered now and the election's VRF outputs), so no leader can leave one out."""
    outputs = [vrf.proof_to_hash(p.proof) for p in sorted(cur.proofs, key=lambda p: p.public_key)]
    seed = epoch_probe_seed(cur.seed, outputs)
    return select_probe_set((node_id.hex() for node_id, _ in view.models.items()), seed, EPOCHS.max_probed_nodes)


def _enter(view: StateView, cur: pb.EpochStateEntry, phase: str) -> None:
    cur.phase = phase
    cur.phase_started_ms = view.time_ms


def _require_leader(cur: pb.EpochStateEntry, signer: bytes, what: str) -> None:
    if signer != cur.leader:
        raise TxError(CODE_UNAUTHORIZED, f"only the leader of epoch {cur.epoch} may post the {what}")


def _plan(view: StateView, sec: pb.EpochsSection, signer: bytes, m: pb.EpochPlan) -> None:
    cur = _check_epoch(sec, m.epoch, PLANNING)
    _require_leader(cur, signer, "plan")
    plan = ChallengePlan(m.epoch, tuple(ChallengeEntry(e.node_id.hex(), e.commitment) for e in m.entries))
    required = {n.hex() for n in cur.probe_set}
    if set(plan.node_ids) != required:
        left_out, extra = sorted(required - set(plan.node_ids)), sorted(set(plan.node_ids) - required)
        _abort(cur, faulty=True, reason=f"the plan does not cover the epoch's probe set (left out "
                                        f"{[n[:16] for n in left_out[:REASONS_LISTED]]}, {len(left_out)} in all; "
                                        f"not in it {[n[:16] for n in extra[:REASONS_LISTED]]})")
        return
    try:
        check_plan(plan, required, EPOCHS)
    except ChallengeError as exc:
        raise _bad(f"plan refused: {exc}") from exc
    cur.plan.extend(m.entries)
    if not m.entries:  # nothing to probe (no model node registered): the epoch is over
        _enter(view, cur, DONE)
    else:
        _enter(view, cur, PROBING)


def _replies(view: StateView, sec: pb.EpochsSection, signer: bytes, m: pb.EpochReplies) -> None:
    cur = _check_epoch(sec, m.epoch, PROBING)
    _require_leader(cur, signer, "replies")
    if [r.node_id for r in m.replies] != [e.node_id for e in cur.plan]:
        raise _bad("the replies must cover exactly the planned nodes (a skipped node is reported missing)")
    cur.replies.extend(m.replies)
    _enter(view, cur, ATTESTING if any(not r.missing for r in cur.replies) else RESOLVING)
    _maybe_settle(view, sec)


def _abort(cur: pb.EpochStateEntry, faulty: bool, reason: str) -> None:
    cur.phase = ABORTED
    cur.reason = abort_reason(cur.reason, ("faulty leader: " if faulty else "") + reason)


def _attestation(view: StateView, sec: pb.EpochsSection, signer: bytes, m: pb.EpochAttestation) -> None:
    cur = _check_epoch(sec, m.epoch, ATTESTING)
    if any(a.public_key == signer for a in cur.attestations):
        raise _bad("this member already attested this epoch")
    expected = [r.node_id for r in cur.replies if not r.missing]
    if [s.node_id for s in m.scores] != expected:
        raise _bad("an attestation scores exactly the replies the leader posted")
    cur.attestations.append(pb.AttestationEntry(public_key=signer, scores=m.scores))
    if _quorum(_powers(view), (a.public_key for a in cur.attestations)):
        _agree(view, sec)


def _agree(view: StateView, sec: pb.EpochsSection) -> None:
    """The quorum's agreed scores: medians, disagreement marks, prompt-alteration check.

    A reply more than N/3 of the members call forwarded (served and signed by another node of
    the group: reply_commitments) is scored for the member that served it, named by more than
    N/3 of the members, never for the probed node: the check is deterministic, so every honest
    member names the same server, and f Byzantine members can neither name another one nor
    frame the probed node. Without it, a node was scored only by the challenges routed to it as
    their prefix home: about one epoch in g for a group of g members."""
    cur = sec.current
    n = len(view.validators)
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
                _agree_score(sec, i, pb.NodeScore(node_id=server, verdict=VERDICT_FORWARDED, served_by=server), result)
            continue
        _agree_score(sec, i, pb.NodeScore(node_id=reply.node_id, verdict=VERDICT_SCORED), result)
    if unsigned:
        _abort(cur, faulty=True, reason=f"the leader's private replies of {unsigned[:REASONS_LISTED]} ({len(unsigned)} "
                                        "in all) do not open its public digests or their node did not sign them")
        return
    if mismatched:
        _abort(cur, faulty=True, reason=f"the replies of {mismatched} answer prompts other than the committed ones")
        return
    cur.result.extend(result)
    _enter(view, cur, RESOLVING)
    _maybe_settle(view, sec)


def _named_server(forwarded: list, committee_size: int) -> bytes | None:
    """The server more than N/3 of the members name (one, as honest members agree), or None."""
    counts = Counter(v.served_by for v in forwarded)
    named = sorted(server for server, c in counts.items() if 3 * c > committee_size)
    return named[0] if len(named) == 1 else None


def _agree_score(sec: pb.EpochsSection, i: int, agreed: pb.NodeScore, result: list[pb.NodeScore]) -> None:
    """Into result: `agreed` with the median score of the members' votes on reply i that share
    its verdict and server; a member more than the tolerance off the median is marked."""
    cur = sec.current
    tolerance = int(round(EPOCHS.score_tolerance * SCORE_SCALE))
    votes = [(a, a.scores[i]) for a in cur.attestations]
    votes = [(a, v) for a, v in votes if v.verdict == agreed.verdict and v.served_by == agreed.served_by]
    if not votes:
        return
    scored = sorted(v.score_micros for _, v in votes)
    agreed.score_micros = scored[(len(scored) - 1) // 2]
    result.append(agreed)
    for a, v in votes:
        if abs(v.score_micros - agreed.score_micros) > tolerance:
            member = _member(sec, a.public_key)
            if member is not None:
                member.disagreements += 1


def _record(view: StateView, sec: pb.EpochsSection) -> EpochRecord:
    cur = sec.current
    committee = tuple(sorted(k.hex() for k, _ in view.validators))
    reports: dict[str, dict[str, bool]] = {}
    missing = tuple(r.node_id.hex() for r in cur.replies if r.missing)
    for node in missing:
        reports[node] = {}
    for p in cur.probes:
        reports.setdefault(p.node_id.hex(), {})[p.public_key.hex()] = p.ok
    return EpochRecord(cur.epoch, cur.leader.hex(), committee, tuple(e.node_id.hex() for e in cur.plan),
                       phase="resolving", missing=missing, reports=reports)


def _probe_report(view: StateView, sec: pb.EpochsSection, signer: bytes, m: pb.EpochProbeReport) -> None:
    cur = _check_epoch(sec, m.epoch, ATTESTING, RESOLVING)
    if signer == cur.leader:
        raise TxError(CODE_UNAUTHORIZED, "the leader's report is its missing-reply claim; it cannot probe too")
    if not any(r.node_id == m.node_id and r.missing for r in cur.replies):
        raise _bad(f"{m.node_id.hex()[:16]} was not reported missing")
    if any(p.node_id == m.node_id and p.public_key == signer for p in cur.probes):
        raise _bad("this member already reported on that node")
    before = node_decision(_record(view, sec), m.node_id.hex())
    cur.probes.append(pb.ProbeReportEntry(node_id=m.node_id, public_key=signer, ok=m.ok))
    if before != REACHED and node_decision(_record(view, sec), m.node_id.hex()) == REACHED:
        # contradicted: a lying leader or a node that answered all but it (epoch.py); no abort
        cur.reason = note_dispute(cur.reason, m.node_id.hex())
        leader = _member(sec, cur.leader)
        if leader is not None:
            leader.disputes += 1
    _maybe_settle(view, sec)


def _maybe_settle(view: StateView, sec: pb.EpochsSection) -> None:
    """RESOLVING -> DONE once every missing node is decided or every other member reported."""
    cur = sec.current
    if cur.phase != RESOLVING:
        return
    if all_decided(_record(view, sec)):
        cur.phase = DONE


# --------------------------------------------------------------------------- end of block


def end_block(view: StateView, block_hash: bytes, params: EpochRunParams = EPOCH_RUN) -> None:
    """Deadlines, the close of a finished epoch (reputation update) and the opening of the next.

    Called by FinalizeBlock after the block's transactions, with the block's hash (the "final
    commit hash" the next election draws on).
    """
    sec = _copy(view.epochs)
    cur = sec.current
    powers = _powers(view)
    if sec.epoch == 0:
        if sec.members and _quorum(powers, (m.public_key for m in sec.members)):
            _open(view, sec, 1, block_hash)
            view.epochs = sec
        return
    waited = view.time_ms - cur.phase_started_ms
    if cur.phase == ELECTING and waited >= params.election_timeout_ms:
        _elect(view, sec)
    elif cur.phase == PLANNING and waited >= params.plan_timeout_ms:
        _abort(cur, faulty=True, reason="the leader posted no plan in time")
    elif cur.phase == PROBING and waited >= params.probe_timeout_ms:
        _abort(cur, faulty=True, reason="the leader posted no replies in time")
    elif cur.phase == ATTESTING and waited >= params.attest_timeout_ms:
        _abort(cur, faulty=False, reason="no attestation quorum in time")
    elif cur.phase == RESOLVING and waited >= params.attest_timeout_ms:
        cur.phase = DONE  # probes still missing: those nodes stay as they are
    if cur.phase in (DONE, ABORTED):
        _close(view, sec, params)
        _open(view, sec, cur.epoch + 1, block_hash)
    view.epochs = sec


def _audit_report(sec: pb.EpochsSection, signer: bytes, m: pb.EpochAuditReport) -> None:
    """A member's audit scores, once per member per epoch, until the epoch is decided."""
    cur = _check_epoch(sec, m.epoch, PROBING, ATTESTING, RESOLVING)
    if _member(sec, signer) is None:
        raise _bad("audit reports come from members with registered epoch keys")
    if any(r.public_key == signer for r in cur.audit_reports):
        raise _bad("this member already reported its audits this epoch")
    cur.audit_reports.append(pb.AuditReportEntry(public_key=signer, scores=m.scores,
                                                 receipts_digest=m.receipts_digest))


def _open(view: StateView, sec: pb.EpochsSection, epoch: int, seed: bytes) -> None:
    sec.epoch = epoch
    sec.current.CopyFrom(pb.EpochStateEntry(epoch=epoch, phase=ELECTING, seed=seed, phase_started_ms=view.time_ms,
                                            opened_height=view.height))


def _credibilities(view: StateView, sec: pb.EpochsSection) -> dict[bytes, float]:
    cur = sec.current
    out: dict[bytes, float] = {}
    for s in cur.result:  # a node may serve its own challenge and a peer's: the lower counts
        out[s.node_id] = min(out.get(s.node_id, 1.0), s.score_micros / SCORE_SCALE)
    rec = _record(view, sec)
    for r in cur.replies:
        if r.missing and node_decision(rec, r.node_id.hex()) == PUNISH:
            out[r.node_id] = 0.0
    reports = {e.public_key.hex(): {s.node_id: s.score_micros / SCORE_SCALE for s in e.scores}
               for e in cur.audit_reports}
    for node_id, audited in agree_audit_scores(reports, len(view.validators)).items():
        out[node_id] = fold_credibility(out.get(node_id), [audited])
    return out


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


def _close(view: StateView, sec: pb.EpochsSection, params: EpochRunParams) -> None:
    cur = sec.current
    faulty = cur.reason.startswith("faulty leader")
    scored: list[pb.NodeScore] = []
    if cur.phase == DONE:
        windows = {w.node_id: w for w in sec.windows}
        for node_id, cred in sorted(_credibilities(view, sec).items()):
            record = view.models.get(node_id)
            if record is None:
                continue
            w = windows.get(node_id) or pb.ReputationWindow(node_id=node_id)
            # R and trust as the directory lists them (a node never scored has no window yet)
            state = replace(state_of(w), reputation=record.reputation, untrusted=not record.trusted)
            new = rep.update(state, cred, REPUTATION)
            view.models.set(node_id, replace(record, reputation=new.reputation, trusted=not new.untrusted,
                                             updated_height=view.height))
            windows[node_id] = _window_of(node_id, new)
            scored.append(pb.NodeScore(node_id=node_id, score_micros=int(round(cred * SCORE_SCALE))))
        del sec.windows[:]
        sec.windows.extend(windows[k] for k in sorted(windows)
                           if view.models.get(k) is not None or not rep.in_good_standing(state_of(windows[k])))
    if faulty:
        leader = _member(sec, cur.leader)
        if leader is not None:
            leader.faults += 1
    sec.history.append(pb.EpochSummary(epoch=cur.epoch, phase=cur.phase, leader=cur.leader, faulty_leader=faulty,
                                       reason=cur.reason, result=scored, closed_height=view.height))
    if len(sec.history) > params.history_kept:
        del sec.history[: len(sec.history) - params.history_kept]
