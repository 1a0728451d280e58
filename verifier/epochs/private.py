"""Private reveals between committee members (the `Verifier.Private` RPC payload), pure.

The leader's plain challenge requests must reach every other member and nobody else: a model
node that saw them could answer challenges with extra care. The same holds for the full
challenge replies (receipts carry the prompt hash: verifier.epochs.reply_commitments). Each
private message is

    sender public key (32) || Ed25519 signature (64) || sealed box to the recipient

sealed (gentorrent.overlay.sealing: ephemeral X25519 + HKDF + AES-GCM) to the recipient's
X25519 key as registered on chain (epoch_member_keys), and signed by the sender's identity over
a domain, the recipient's key and the box, so a reveal can be neither read by anyone else nor
forged or redirected. The TLS channel it travels on is pinned as well; this layer makes the
secrecy independent of transport and of who relays the bytes.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from gentorrent.crypto.keys import Identity, SignatureError, verify_signature
from gentorrent.overlay import sealing
from gentorrent.traffic.model import ChatRequest
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.epochs.challenges import Reveal
from verifier.epochs.probe_format import REVEAL_LABEL

__all__ = ["PrivateError", "RevealBundle", "RepliesBundle", "seal_reveals", "seal_replies", "open_reveals",
           "open_private", "MAX_PRIVATE_BYTES"]

_SIGN_DOMAIN = b"gentorrent/epoch-private/v1\x00"
MAX_PRIVATE_BYTES = 2 * 1024 * 1024  # 64 reveals of a full transcript (TRAFFIC.max_prompt_bytes) fit in half


class PrivateError(ValueError):
    """A private message that is malformed, unsigned, not from a member, or not for us."""


@dataclass(frozen=True)
class RevealBundle:
    epoch: int
    sender: bytes  # the leader's public key
    reveals: tuple[Reveal, ...]


@dataclass(frozen=True)
class RepliesBundle:
    """The leader's full challenge replies (receipts and tokens): the chain holds only digests."""

    epoch: int
    sender: bytes
    replies: tuple[pb.ProbeReply, ...]


def _seal(sender: Identity, recipient_box_key: bytes, body: dict) -> bytes:
    box = sealing.seal_to(recipient_box_key, json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8"), REVEAL_LABEL)
    signature = sender.sign(_SIGN_DOMAIN + recipient_box_key + box)
    return sender.public_key + signature + box


def seal_reveals(sender: Identity, recipient_box_key: bytes, epoch: int, reveals: list[Reveal]) -> bytes:
    return _seal(sender, recipient_box_key, {"epoch": epoch, "reveals": [
        {"node_id": r.node_id, "nonce": r.nonce.hex(), "request": r.request.to_dict()} for r in reveals]})


def seal_replies(sender: Identity, recipient_box_key: bytes, epoch: int, replies: list[pb.ProbeReply]) -> bytes:
    data = pb.EpochReplies(epoch=epoch, replies=replies).SerializeToString()
    return _seal(sender, recipient_box_key, {"epoch": epoch, "replies": base64.b64encode(data).decode()})


def open_private(payload: bytes, my_box: X25519PrivateKey, my_box_public: bytes,
                 members: set[bytes]) -> RevealBundle | RepliesBundle:
    """Check and open one private message (reveals or replies); PrivateError on anything wrong."""
    if not 96 + 48 <= len(payload) <= MAX_PRIVATE_BYTES:
        raise PrivateError("private payload size out of range")
    sender, signature, box = payload[:32], payload[32:96], payload[96:]
    if sender not in members:
        raise PrivateError("sender is not a committee member")
    try:
        verify_signature(sender, signature, _SIGN_DOMAIN + my_box_public + box)
    except (SignatureError, ValueError) as exc:
        raise PrivateError("private payload signature does not verify") from exc
    try:
        body = json.loads(sealing.open_sealed(my_box, box, REVEAL_LABEL))
        epoch = int(body["epoch"])
        if "replies" in body:
            replies = pb.EpochReplies.FromString(base64.b64decode(body["replies"], validate=True))
            if replies.epoch != epoch:
                raise ValueError("the replies name another epoch")
            return RepliesBundle(epoch, sender, tuple(replies.replies))
        reveals = tuple(Reveal(str(r["node_id"]), bytes.fromhex(r["nonce"]), ChatRequest.from_dict(r["request"]))
                        for r in body["reveals"])
    except (sealing.SealError, ValueError, KeyError, TypeError, DecodeError) as exc:  # TrafficError is a ValueError
        raise PrivateError(f"private payload does not open: {exc}") from exc
    return RevealBundle(epoch, sender, reveals)


def open_reveals(payload: bytes, my_box: X25519PrivateKey, my_box_public: bytes,
                 members: set[bytes]) -> RevealBundle:
    """Check and open one reveal message; PrivateError on anything wrong (or on replies)."""
    bundle = open_private(payload, my_box, my_box_public, members)
    if not isinstance(bundle, RevealBundle):
        raise PrivateError("the private payload carries replies, not reveals")
    return bundle
