"""Verification-epoch transactions: builders and their stateless checks.

Seven kinds, all signed by committee members (txs.COMMITTEE_KINDS), carried in TxBody fields
20..26, each with a message type of its own (MESSAGES). What each one means, and the stateful
rules, are in verifier.epochs.machine:

    epoch_member_keys   a member's VRF key (leader election) and X25519 key (private reveals)
    epoch_vrf_proof     a member's ECVRF proof for the election of one epoch
    epoch_plan          the leader's probe set with one prompt commitment per model node
    epoch_replies       per probed node, the digest of its signed reply or a missing-reply report
                        (the replies themselves go privately to the members)
    epoch_attestation   a member's own re-scoring of every reply with its reference model
    epoch_probe_report  a member's own probe of a node the leader reported missing
    epoch_audit_report  a member's score per node of the users' audits it scored

Scores travel as integer micro-units so that the agreed result (a median) and everything
derived from it is bit-identical on every member. `Phase` is the vocabulary of the epochs
section's phases, shared by everyone who reads the public state (what moves an epoch from one
phase to the next is the transition table of verifier.epochs.machine).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Callable, NamedTuple, Sequence

from gentorrent.config import MAX_NODES_PER_EPOCH_TX
from gentorrent.crypto.keys import Identity
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.signed_tx import CODE_INVALID_FIELD, TxError, body, sign

__all__ = ["Phase", "MESSAGES", "member_keys", "vrf_proof", "plan", "replies", "attestation", "probe_report", "audit_report", "validate",
           "SCORE_SCALE", "VERDICT_SCORED", "VERDICT_PROMPT_MISMATCH", "VERDICT_UNSCORABLE", "VERDICT_LEADER_FAULTY",
           "VERDICT_FORWARDED", "Verdict", "to_micros"]



class Phase(StrEnum):
    """The phases of a verification epoch, as the epochs section stores them
    (EpochStateEntry.phase, EpochSummary.phase: a string on the wire)."""

    NONE = ""  # no epoch opened yet: members register their keys
    ELECTING = "electing"
    PLANNING = "planning"
    PROBING = "probing"
    ATTESTING = "attesting"
    RESOLVING = "resolving"
    DONE = "done"
    ABORTED = "aborted"


#: TxBody field -> the message type of that epoch kind (one type per kind: dispatch is by type)
MESSAGES: dict[str, type] = {
    "epoch_member_keys": pb.EpochMemberKeys,
    "epoch_vrf_proof": pb.EpochVrfProof,
    "epoch_plan": pb.EpochPlan,
    "epoch_replies": pb.EpochReplies,
    "epoch_attestation": pb.EpochAttestation,
    "epoch_probe_report": pb.EpochProbeReport,
    "epoch_audit_report": pb.EpochAuditReport,
}
_KIND_OF = {cls: name for name, cls in MESSAGES.items()}

SCORE_SCALE = 1_000_000
VERDICT_SCORED = 0
VERDICT_PROMPT_MISMATCH = 1  # the signed reply answers a prompt other than the committed one
VERDICT_UNSCORABLE = 2  # this member's reference model could not score it (no vote on the score)
VERDICT_LEADER_FAULTY = 3  # the leader's private copy of the reply does not open its public digest,
# or carries a receipt the node did not sign (verifier.epochs.reply_commitments)
VERDICT_FORWARDED = 4  # the node forwarded the challenge to a member of its model group, which served and
# signed it: a genuine reply, but a sample of the server's serving, not of the probed node's (it is scored
# for the server, named in served_by; the probed node gets no score and no punishment)
_VERDICTS = (VERDICT_SCORED, VERDICT_PROMPT_MISMATCH, VERDICT_UNSCORABLE, VERDICT_LEADER_FAULTY, VERDICT_FORWARDED)
DIGEST_BYTES = 32
NODE_ID_BYTES = 32
MAX_REASON_CHARS = 200


class Verdict(NamedTuple):
    """One member's verdict on one posted reply (what an attestation carries per reply)."""

    node_id: bytes  # the probed node
    score_micros: int
    verdict: int
    served_by: bytes = b""  # VERDICT_FORWARDED: the group member that served and signed the reply


def to_micros(score: float) -> int:
    """A credibility in [0, 1] as the integer the chain carries."""
    if not 0.0 <= score <= 1.0:
        raise TxError(CODE_INVALID_FIELD, f"score {score!r} outside [0, 1]")
    return int(round(score * SCORE_SCALE))


# --------------------------------------------------------------------------- builders


def member_keys(identity: Identity, vrf_public_key: bytes, box_public_key: bytes, sequence: int, *,
                chain_id: str) -> bytes:
    msg = pb.EpochMemberKeys(vrf_public_key=vrf_public_key, box_public_key=box_public_key)
    return _build(identity, sequence, msg, chain_id)


def vrf_proof(identity: Identity, epoch: int, proof: bytes, sequence: int, *, chain_id: str) -> bytes:
    return _build(identity, sequence, pb.EpochVrfProof(epoch=epoch, proof=proof), chain_id)


def plan(identity: Identity, epoch: int, entries: Sequence[tuple[bytes, bytes]], sequence: int, *,
         chain_id: str) -> bytes:
    """`entries`: (model node id, prompt commitment), any order (sorted here)."""
    msg = pb.EpochPlan(epoch=epoch, entries=[pb.ChallengeCommitment(node_id=n, commitment=c)
                                             for n, c in sorted(entries)])
    return _build(identity, sequence, msg, chain_id)


def replies(identity: Identity, epoch: int, items: Sequence[pb.ProbeReply], sequence: int, *,
            chain_id: str) -> bytes:
    msg = pb.EpochReplies(epoch=epoch, replies=sorted(items, key=lambda r: r.node_id))
    return _build(identity, sequence, msg, chain_id)


def attestation(identity: Identity, epoch: int, scores: Sequence[tuple], sequence: int, *,
                chain_id: str) -> bytes:
    """`scores`: Verdicts, or tuples (model node id, score micros, verdict[, served_by])."""
    verdicts = sorted(Verdict(*s) for s in scores)
    msg = pb.EpochAttestation(epoch=epoch, scores=[pb.NodeScore(node_id=v.node_id, score_micros=v.score_micros,
                                                                verdict=v.verdict, served_by=v.served_by)
                                                   for v in verdicts])
    return _build(identity, sequence, msg, chain_id)


def probe_report(identity: Identity, epoch: int, node_id: bytes, ok: bool, sequence: int, *,
                 chain_id: str) -> bytes:
    msg = pb.EpochProbeReport(epoch=epoch, node_id=node_id, ok=ok)
    return _build(identity, sequence, msg, chain_id)


def audit_report(identity: Identity, epoch: int, scores: Sequence[tuple[bytes, int]], receipts_digest: bytes,
                 sequence: int, *, chain_id: str) -> bytes:
    """`scores`: (model node id, audit score in micros: verifier.epochs.audits.audit_score)."""
    msg = pb.EpochAuditReport(epoch=epoch, scores=[pb.NodeScore(node_id=n, score_micros=s) for n, s in sorted(scores)],
                              receipts_digest=receipts_digest)
    return _build(identity, sequence, msg, chain_id)


def _build(identity: Identity, sequence: int, msg, chain_id: str) -> bytes:
    validate(msg)  # fail at the member, not in every mempool
    return sign(identity, body(identity, sequence, _KIND_OF[type(msg)], msg, chain_id))


# --------------------------------------------------------------------------- stateless checks


def _bad(message: str) -> TxError:
    return TxError(CODE_INVALID_FIELD, message)


def _check_ids_sorted_unique(ids: Sequence[bytes], what: str) -> None:
    if any(len(i) != NODE_ID_BYTES for i in ids):
        raise _bad(f"{what}: node ids are {NODE_ID_BYTES} bytes")
    if any(a >= b for a, b in zip(ids, ids[1:])):
        raise _bad(f"{what}: entries must be sorted and unique by node id")


def validate(m) -> None:
    """Field formats of an epoch payload (state decides the rest: how many nodes the chain's
    parameters let one list, verifier.epochs.machine)."""
    check = _CHECKS.get(type(m))
    if check is None:
        raise _bad(f"{type(m).__name__} is not an epoch transaction")
    if not isinstance(m, pb.EpochMemberKeys) and m.epoch < 1:
        raise _bad("epochs are numbered from 1")
    check(m)


def _check_member_keys(m: pb.EpochMemberKeys) -> None:
    if len(m.vrf_public_key) != 32 or len(m.box_public_key) != 32 or not any(m.box_public_key):
        raise _bad("member keys are a 32-byte VRF key and a non-zero 32-byte X25519 key")


def _check_vrf_proof(m: pb.EpochVrfProof) -> None:
    if len(m.proof) != 80:
        raise _bad("an ECVRF proof is 80 bytes")


def _check_plan(m: pb.EpochPlan) -> None:
    if len(m.entries) > MAX_NODES_PER_EPOCH_TX:
        raise _bad(f"a plan probes at most {MAX_NODES_PER_EPOCH_TX} nodes")
    _check_ids_sorted_unique([e.node_id for e in m.entries], "plan")
    if any(len(e.commitment) != 32 for e in m.entries):
        raise _bad("commitments are 32-byte SHA-256 digests")


def _check_replies(m: pb.EpochReplies) -> None:
    if len(m.replies) > MAX_NODES_PER_EPOCH_TX:
        raise _bad(f"at most {MAX_NODES_PER_EPOCH_TX} replies")
    _check_ids_sorted_unique([r.node_id for r in m.replies], "replies")
    for r in m.replies:
        if len(r.reason) > MAX_REASON_CHARS:
            raise _bad("reason too long")
        if r.token_ids or r.HasField("receipt"):  # they would label the challenge in the node's log
            raise _bad("the public replies carry no tokens and no receipt (only their digest)")
        if r.missing and r.digest:
            raise _bad("a missing reply carries no digest")
        if not r.missing and len(r.digest) != DIGEST_BYTES:
            raise _bad(f"a reply carries the {DIGEST_BYTES}-byte digest of its receipt and tokens")


def _check_attestation(m: pb.EpochAttestation) -> None:
    if len(m.scores) > MAX_NODES_PER_EPOCH_TX:
        raise _bad(f"at most {MAX_NODES_PER_EPOCH_TX} scores")
    _check_ids_sorted_unique([s.node_id for s in m.scores], "attestation")
    for s in m.scores:
        if s.score_micros > SCORE_SCALE or s.verdict not in _VERDICTS:
            raise _bad(f"score_micros must be <= 1e6 and verdict one of {', '.join(map(str, _VERDICTS))}")
        if s.verdict == VERDICT_FORWARDED and (len(s.served_by) != NODE_ID_BYTES or s.served_by == s.node_id):
            raise _bad(f"a forwarded verdict names the {NODE_ID_BYTES}-byte id of the member that served it")
        if s.verdict != VERDICT_FORWARDED and s.served_by:
            raise _bad("only a forwarded verdict names who served the reply")


def _check_probe_report(m: pb.EpochProbeReport) -> None:
    if len(m.node_id) != NODE_ID_BYTES:
        raise _bad(f"node ids are {NODE_ID_BYTES} bytes")


def _check_audit_report(m: pb.EpochAuditReport) -> None:
    if not m.scores or len(m.scores) > MAX_NODES_PER_EPOCH_TX:
        raise _bad(f"an audit report scores 1 to {MAX_NODES_PER_EPOCH_TX} nodes")
    _check_ids_sorted_unique([s.node_id for s in m.scores], "audit report")
    if any(s.score_micros > SCORE_SCALE or s.verdict != VERDICT_SCORED or s.served_by for s in m.scores):
        raise _bad("audit scores are scored (verdict 0) micros <= 1e6")
    if len(m.receipts_digest) != 32:
        raise _bad("the receipts digest is a 32-byte SHA-256")


_CHECKS: dict[type, Callable[[Any], None]] = {
    pb.EpochMemberKeys: _check_member_keys,
    pb.EpochVrfProof: _check_vrf_proof,
    pb.EpochPlan: _check_plan,
    pb.EpochReplies: _check_replies,
    pb.EpochAttestation: _check_attestation,
    pb.EpochProbeReport: _check_probe_report,
    pb.EpochAuditReport: _check_audit_report,
}
assert set(_CHECKS) == set(MESSAGES.values())
