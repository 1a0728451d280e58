"""What the chain keeps of a challenge reply: a commitment, never the receipt (pure).

A probed node's signed receipt carries the hash of the challenge prompt; posted in the public
state it would let the node find the exact challenge in its own request log afterwards (one
perfectly labelled example per epoch to learn from). So the leader posts, per probed node, only

    missing flag (and reason)  or  SHA-256(domain || node id || receipt || token ids)

and sends the full replies (receipt + tokens) to the other members privately, sealed like the
reveals (verifier.epochs.private). Each member checks its private copy against the public
digest and the node's registered key before it scores; a copy that does not match, or a
receipt the node did not sign, can only come from the leader, and the member attests "leader
faulty" (epoch_txs.VERDICT_LEADER_FAULTY). The digest is enough for later disputes: whoever
holds the reply can show that it is the one the leader committed to.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Mapping, Optional, Protocol, Sequence

from gentorrent import receipts
from gentorrent.wire import gentorrent_pb2 as pb

__all__ = ["reply_digest", "public_reply", "private_reply_problem", "signature_problem", "reply_signer",
           "is_forwarded", "node_lookup", "DIGEST_LEN"]

_DOMAIN = b"gentorrent/epoch-reply-digest/v1"
DIGEST_LEN = 32


class RegisteredNode(Protocol):
    """What a check needs of a model node's registration (ModelEntry and ModelRecord have it)."""

    public_key: bytes
    model: str


NodeLookup = Callable[[bytes], Optional[RegisteredNode]]  # registered model node by node id, or None


def node_lookup(models: Mapping[str, RegisteredNode]) -> NodeLookup:
    """A NodeLookup over registered nodes keyed by hex node id (as the directory lists them)."""
    return lambda node_id: models.get(node_id.hex())


def reply_digest(node_id: bytes, receipt: pb.ReplyReceipt, token_ids: Sequence[int]) -> bytes:
    """The commitment to one reply; deterministic serialization, lengths prefixed."""
    body = receipt.SerializeToString(deterministic=True)
    h = hashlib.sha256(_DOMAIN + len(node_id).to_bytes(2, "big") + node_id + len(body).to_bytes(4, "big") + body)
    h.update(len(token_ids).to_bytes(4, "big"))
    for t in token_ids:
        h.update(int(t).to_bytes(4, "big", signed=True))
    return h.digest()


def public_reply(full: pb.ProbeReply) -> pb.ProbeReply:
    """The public form of a reply: node, missing flag, reason, and the digest of what it carries."""
    if full.missing:
        return pb.ProbeReply(node_id=full.node_id, missing=True, reason=full.reason)
    return pb.ProbeReply(node_id=full.node_id, digest=reply_digest(full.node_id, full.receipt, list(full.token_ids)))


def reply_signer(receipt: pb.ReplyReceipt, probed_id: bytes, nodes: NodeLookup) -> RegisteredNode | None:
    """Whose key must verify the reply to a challenge sent to `probed_id`: the probed node's own,
    or, when the receipt names another node, that node's — if it is registered for the same
    model (the group the probed node may forward to). None: no node we may accept signed it."""
    probed = nodes(probed_id)
    if probed is None:
        return None
    if receipt.node_id == probed_id:
        return probed
    signer = nodes(receipt.node_id)
    return signer if signer is not None and signer.model == probed.model else None


def is_forwarded(reply: pb.ProbeReply) -> bool:
    """The probed node forwarded the challenge: another node served and signed the reply."""
    return reply.HasField("receipt") and reply.receipt.node_id != reply.node_id


def signature_problem(receipt: pb.ReplyReceipt, token_ids: Sequence[int], probed_id: bytes,
                      nodes: NodeLookup) -> str | None:
    """Why `receipt` is not a valid signature over `token_ids` by the probed node or a member
    of its model group (`reply_signer`) for that model, or None. The prober asks this of every
    reply it gets; the members ask it again of the leader's private copies."""
    signer = reply_signer(receipt, probed_id, nodes)
    if signer is None:
        return "the reply is signed by neither the probed node nor a registered node of its model"
    try:
        receipts.verify_receipt(receipt, signer.public_key, None, list(token_ids))
    except (receipts.ReceiptError, ValueError) as exc:
        return str(exc)
    if receipt.model != signer.model:
        return f"the reply names model {receipt.model!r}, the node registered {signer.model!r}"
    return None


def private_reply_problem(public: pb.ProbeReply, private: pb.ProbeReply, nodes: NodeLookup) -> str | None:
    """Why the leader's private copy of a reply is not the committed reply that the probed node
    (or the group member it forwarded to) signed, or None."""
    tokens = list(private.token_ids)
    if private.node_id != public.node_id or reply_digest(public.node_id, private.receipt, tokens) != public.digest:
        return "the private reply does not match the leader's public commitment"
    return signature_problem(private.receipt, tokens, public.node_id, nodes)
