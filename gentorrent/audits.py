"""Audits of real replies: which asks are audited, and what makes an audit admissible.

Challenges alone let a model node answer well only what looks like a challenge. Users
therefore hand a random share of their own completed asks (request, reply tokens, the serving
node's signed receipt) to the committee, which scores them like challenge replies. Two parties
must be kept from steering that sample:

* the model node must not know which of its replies will be audited, or it would answer those
  honestly and cheat on the rest;
* the user must not pick, after reading a reply, the replies it dislikes (to frame a node).

Both follow from one commitment. Before asking, the user draws a fresh secret s and puts
c = H(s) in the request; the serving node signs c in its receipt along with the prompt hash p.
The ask is audited iff H(s || p) < rate * 2^256, with the committee's rate. The node sees c and
p but cannot invert H, so it cannot tell an audited ask from any other; the user fixed s before
the reply existed, and the committee checks c = H(s) against the signed receipt, so the user
can hand in only asks selected before they were answered. (A user may draw secrets until an
ask is selected: that chooses which asks to audit before their replies exist, which is the
same as auditing them all, and the per-epoch caps bound it.)

Everything here is pure: the caller brings the secret's randomness, the registered nodes and
the time window; this module never reads a clock or the network.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Protocol

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from gentorrent import generation, receipts
from gentorrent.config import AUDIT_COMMITMENT_BYTES, AUDITS, AuditParams
from gentorrent.overlay import sealing
from gentorrent.wire import gentorrent_pb2 as pb

__all__ = [
    "AuditError",
    "AuditTicket",
    "AuditWindow",
    "CheckedAudit",
    "commitment_of",
    "is_audited",
    "receipt_key",
    "make_submission",
    "encode_submission",
    "check_submission",
    "AuditMember",
    "seal_for",
    "open_sealed_audit",
    "members_among", "members_of",
]

COMMIT_DOMAIN = b"gentorrent/audit-commitment/v1\x00"
SELECT_DOMAIN = b"gentorrent/audit-selection/v1\x00"
RECEIPT_DOMAIN = b"gentorrent/audit-receipt/v1\x00"
SEAL_LABEL = b"gentorrent/audit-submission/v1"


class AuditError(ValueError):
    """An audit submission the committee must not score (the reason says why)."""


class RegisteredModel(Protocol):
    """What the check needs of a registered model node (sections.ModelRecord has it), and the
    weights it claims (what a reference must run to score it: catalogue.reference_mismatch)."""

    public_key: bytes
    model: str
    weights_digest: str


def commitment_of(secret: bytes) -> bytes:
    """c = H(secret): what the request carries and the receipt signs."""
    if len(secret) != AUDIT_COMMITMENT_BYTES:
        raise AuditError(f"an audit secret is {AUDIT_COMMITMENT_BYTES} bytes")
    return hashlib.sha256(COMMIT_DOMAIN + secret).digest()


def is_audited(secret: bytes, prompt_hash: bytes, rate: float = AUDITS.rate) -> bool:
    """Whether the ask with this secret and prompt hash is in the audit sample.

    The prompt hash is mixed in so that one secret reused for two prompts draws twice."""
    if len(secret) != AUDIT_COMMITMENT_BYTES:
        raise AuditError(f"an audit secret is {AUDIT_COMMITMENT_BYTES} bytes")
    draw = int.from_bytes(hashlib.sha256(SELECT_DOMAIN + secret + prompt_hash).digest(), "big")
    return draw < int(rate * (1 << 256))


@dataclass(frozen=True)
class AuditTicket:
    """The user's half of one ask's audit decision: kept on the user's node, never sent
    until the ask turns out to be audited."""

    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != AUDIT_COMMITMENT_BYTES:
            raise AuditError(f"an audit secret is {AUDIT_COMMITMENT_BYTES} bytes")

    @property
    def commitment(self) -> bytes:
        return commitment_of(self.secret)

    def selects(self, request: pb.GenerateRequest, rate: float = AUDITS.rate) -> bool:
        """Whether this ask is audited: drawn by the rate, and one the committee can score
        (generation.is_plain: a constrained or penalised reply is never handed in)."""
        return generation.is_plain(request) and is_audited(self.secret, receipts.request_prompt_hash(request), rate)


def receipt_key(receipt: pb.ReplyReceipt) -> bytes:
    """One audit per receipt: the hash of what the node signed (not of the signature bytes,
    so a second valid signature of the same reply is the same receipt)."""
    return hashlib.sha256(RECEIPT_DOMAIN + receipts.signed_message(receipt)).digest()


def make_submission(request: pb.GenerateRequest, token_ids: list[int], receipt: pb.ReplyReceipt,
                    ticket: AuditTicket, reusable: bool = False) -> pb.AuditSubmission:
    """The submission of one audited ask. The request goes without its request and session
    ids: the receipt does not cover them, and a session id would link a user's audits.
    `reusable`: the asker lets the committee reuse the ask, rewritten, as a challenge."""
    bare = pb.GenerateRequest()
    bare.CopyFrom(request)
    bare.request_id = ""
    bare.session_id = ""
    return pb.AuditSubmission(request=bare, token_ids=token_ids, receipt=receipt, secret=ticket.secret,
                              reusable=reusable)


def encode_submission(submission: pb.AuditSubmission, params: AuditParams = AUDITS) -> bytes:
    data = submission.SerializeToString()
    if len(data) > params.max_submission_bytes:
        raise AuditError(f"an audit submission is at most {params.max_submission_bytes} bytes")
    return data


@dataclass(frozen=True)
class AuditWindow:
    """Receipt times the desk accepts (ms, block or wall time as the shell decides): from the
    start of the previous epoch to now plus clock skew, so an audit is of a recent reply."""

    min_time_ms: int
    max_time_ms: int


@dataclass(frozen=True)
class CheckedAudit:
    """An admissible audit: what the scorer needs, and the key it is deduplicated by."""

    node_id: bytes
    request: pb.GenerateRequest
    token_ids: tuple[int, ...]
    key: bytes
    reusable: bool = False  # the asker lets the committee reuse it as a challenge (AuditSubmission.reusable)


def _decode(data: bytes, params: AuditParams) -> pb.AuditSubmission:
    if len(data) > params.max_submission_bytes:
        raise AuditError(f"an audit submission is at most {params.max_submission_bytes} bytes")
    sub = pb.AuditSubmission()
    try:
        sub.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise AuditError("an audit submission that does not decode") from exc
    return sub


def _check_shape(sub: pb.AuditSubmission, params: AuditParams) -> None:
    if not sub.HasField("request") or not sub.HasField("receipt"):
        raise AuditError("an audit carries the request and the receipt")
    if not generation.is_plain(sub.request):  # see generation.is_plain: no honest score exists for it
        raise AuditError("an ask under guided decoding, penalties, tools or another operation is not audited")
    if not 1 <= len(sub.token_ids) <= params.max_reply_tokens:
        raise AuditError(f"an audited reply has 1 to {params.max_reply_tokens} tokens")
    if any(t < 0 for t in sub.token_ids):
        raise AuditError("token ids are non-negative")
    if len(sub.secret) != AUDIT_COMMITMENT_BYTES or len(sub.request.audit_commitment) != AUDIT_COMMITMENT_BYTES:
        raise AuditError(f"the secret and the commitment are {AUDIT_COMMITMENT_BYTES} bytes each")


def _check_receipt(sub: pb.AuditSubmission, models: Mapping[bytes, RegisteredModel]) -> None:
    node = models.get(bytes(sub.receipt.node_id))
    if node is None:
        raise AuditError("the receipt names no registered model node")
    if sub.receipt.model != node.model:
        raise AuditError(f"the receipt names model {sub.receipt.model!r}, the node registered {node.model!r}")
    try:
        generation.parse_generate(sub.request, node.model)
        receipts.verify_receipt(sub.receipt, node.public_key, sub.request, list(sub.token_ids))
    except (generation.BadRequestError, receipts.ReceiptError, ValueError) as exc:
        raise AuditError(f"the receipt does not cover this ask: {exc}") from exc


def check_submission(data: bytes, models: Mapping[bytes, RegisteredModel], window: AuditWindow,
                     params: AuditParams = AUDITS) -> CheckedAudit:
    """Decode and check one submission; raise AuditError with the reason, or return it checked.

    Checked: size bounds; a receipt signed by the registered node it names, for the model that
    node registered, covering exactly this request (prompt, sampling, commitment) and these
    tokens; a recent receipt; the revealed secret opens the signed commitment and selects this
    ask under the committee's rate. Caps and duplicates are the desk's (it holds the epoch)."""
    sub = _decode(data, params)
    _check_shape(sub, params)
    _check_receipt(sub, models)
    if not window.min_time_ms <= sub.receipt.time_ms <= window.max_time_ms:
        raise AuditError("the receipt is not from the current or the previous epoch")
    if commitment_of(sub.secret) != sub.receipt.audit_commitment:
        raise AuditError("the secret does not open the commitment the node signed")
    if not is_audited(sub.secret, sub.receipt.prompt_hash, params.rate):
        raise AuditError("this ask was not selected for audit when it was asked")
    return CheckedAudit(bytes(sub.receipt.node_id), sub.request, tuple(sub.token_ids), receipt_key(sub.receipt),
                        sub.reusable)


@dataclass(frozen=True)
class AuditMember:
    """A committee member that takes audits: where a proxy reaches it (its pinned TLS
    certificate) and the X25519 key a user seals a submission to, so the proxy and the relays
    before it carry the audit without reading it."""

    node_id: bytes
    address: str
    tls_cert_pem: bytes
    audit_key: bytes


#: sealed audits are padded to this size or the next power of two, so relays see size classes
SEAL_MIN_BYTES = 16 * 1024


def seal_for(member: AuditMember, data: bytes) -> bytes:
    return sealing.seal_to(member.audit_key, sealing.pad(data, SEAL_MIN_BYTES), SEAL_LABEL)


def open_sealed_audit(private: X25519PrivateKey, blob: bytes, params: AuditParams = AUDITS) -> bytes:
    """The submission inside a sealed audit; AuditError if it is not sealed to this key."""
    if len(blob) > params.max_submission_bytes + 1024:
        raise AuditError(f"an audit submission is at most {params.max_submission_bytes} bytes")
    try:
        return sealing.unpad(sealing.open_sealed(private, blob, SEAL_LABEL))
    except (sealing.SealError, ValueError) as exc:
        raise AuditError("a sealed audit that does not open with this member's key") from exc


def members_of(genesis) -> dict[bytes, AuditMember]:
    """The genesis validators that take audits (those that publish an audit key)."""
    return members_among(genesis.validators)


def members_among(validators) -> dict[bytes, AuditMember]:
    """Of these committee members (GenesisValidator records), the ones that take audits."""
    return {v.node_id: AuditMember(v.node_id, v.address, v.tls_cert_pem, v.audit_key)
            for v in validators if v.audit_key}
