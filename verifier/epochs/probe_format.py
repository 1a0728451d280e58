"""What a challenge looks like on the wire, and the keys a member uses for epochs (pure).

Every member must rebuild, from a revealed prompt alone, the exact GenerateRequest the leader
sent: its attestation checks the node's signed receipt against that request's prompt hash and
sampling hash. The request is built by the very function user nodes use for their own asks
(gentorrent.generation.make_request: a one-message chat, the users' sampling parameters, no seed, no
session), so a challenge is byte-for-byte an ordinary ask.
"""

from __future__ import annotations

from gentorrent.config import EPOCH_RUN, EpochRunParams
from gentorrent.crypto.keys import Identity
from gentorrent.receipts import request_prompt_hash, sampling_hash
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.generation import make_request
from verifier.epochs import vrf

__all__ = ["challenge_request", "receipt_matches_request", "vrf_secret_of", "vrf_public_of", "REVEAL_LABEL"]

#: sealed-box label of the private reveals between committee members
REVEAL_LABEL = b"gentorrent/epoch-reveals/v1"


def challenge_request(prompt: str, model: str, params: EpochRunParams = EPOCH_RUN) -> pb.GenerateRequest:
    """The ask that carries a challenge (or a member's own probe) to a model node."""
    return make_request(messages=[{"role": "user", "content": prompt}], model=model,
                        max_tokens=params.challenge_max_tokens, temperature=params.challenge_temperature,
                        top_p=params.challenge_top_p)


def receipt_matches_request(receipt: pb.ReplyReceipt, request: pb.GenerateRequest) -> bool:
    """Whether a signed receipt covers exactly this prompt and these sampling parameters."""
    return receipt.prompt_hash == request_prompt_hash(request) and receipt.sampling_hash == sampling_hash(
        request.sampling)


def vrf_secret_of(identity: Identity) -> bytes:
    return vrf.derive_vrf_secret(identity.seed())


def vrf_public_of(identity: Identity) -> bytes:
    return vrf.public_key(vrf_secret_of(identity))
