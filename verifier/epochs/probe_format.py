"""What a challenge looks like on the wire, and the keys a member uses for epochs (pure).

Every member must rebuild, from a revealed request alone, the exact GenerateRequest the leader
sent: its attestation checks the node's signed receipt against that request's prompt hash and
sampling hash, and scores the reply with the request's own sampling parameters. The request is
built by the very function user nodes use for their own asks (gentorrent.generation.make_request,
through gentorrent.traffic.ChatRequest), so a challenge is byte-for-byte an ordinary ask of the
shape the traffic model drew: messages, sampling, streaming and session id as a client sets them.
"""

from __future__ import annotations

from gentorrent.crypto.keys import Identity
from gentorrent.receipts import request_prompt_hash, request_sampling_hash
from gentorrent.traffic.model import ChatRequest
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.epochs import vrf

__all__ = ["challenge_request", "receipt_matches_request", "vrf_secret_of", "vrf_public_of", "REVEAL_LABEL"]

#: sealed-box label of the private reveals between committee members
REVEAL_LABEL = b"gentorrent/epoch-reveals/v1"


def challenge_request(request: ChatRequest, model: str) -> pb.GenerateRequest:
    """The ask that carries a challenge (or a member's own probe) to a model node."""
    return request.to_generate_request(model)


def receipt_matches_request(receipt: pb.ReplyReceipt, request: pb.GenerateRequest) -> bool:
    """Whether a signed receipt covers exactly this prompt and these sampling parameters."""
    return (receipt.prompt_hash == request_prompt_hash(request)
            and receipt.sampling_hash == request_sampling_hash(request))


def vrf_secret_of(identity: Identity) -> bytes:
    return vrf.derive_vrf_secret(identity.seed())


def vrf_public_of(identity: Identity) -> bytes:
    return vrf.public_key(vrf_secret_of(identity))
