"""Private reveals between committee members: only the addressee opens them, only members send them."""

from __future__ import annotations

import pytest

from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.traffic.model import ChatRequest
from verifier.epochs.challenges import Reveal
from verifier.epochs.private import PrivateError, open_reveals, seal_reveals

LEADER, OTHER = Identity.from_seed(b"\x01" * 32), Identity.from_seed(b"\x02" * 32)
BOX, ELSEWHERE = OnionKey.generate(), OnionKey.generate()
REVEALS = [Reveal("ab" * 32, b"\x05" * 32, ChatRequest.question("How do volcanoes form?")),
           Reveal("cd" * 32, b"\x06" * 32, ChatRequest((("system", "Réponds en français."), ("user", "Pourquoi le ciel est-il bleu ?"),
                                                        ("assistant", "La diffusion."), ("user", "Et la nuit ?")),
                                                       0.0, 0.9, 512, False, "00ff00ff00ff00ff"))]
MEMBERS = {LEADER.public_key, OTHER.public_key}


def test_the_addressee_opens_what_a_member_sealed():
    bundle = open_reveals(seal_reveals(LEADER, BOX.public_key, 7, REVEALS), BOX.private_key, BOX.public_key, MEMBERS)
    assert bundle.epoch == 7 and bundle.sender == LEADER.public_key and list(bundle.reveals) == REVEALS


def test_nobody_else_opens_it_and_forgeries_are_refused():
    payload = seal_reveals(LEADER, BOX.public_key, 7, REVEALS)
    with pytest.raises(PrivateError):  # another member's key: the signature names BOX's key
        open_reveals(payload, ELSEWHERE.private_key, ELSEWHERE.public_key, MEMBERS)
    with pytest.raises(PrivateError):  # not from a member
        open_reveals(payload, BOX.private_key, BOX.public_key, {OTHER.public_key})
    tampered = payload[:-1] + bytes([payload[-1] ^ 1])
    with pytest.raises(PrivateError):
        open_reveals(tampered, BOX.private_key, BOX.public_key, MEMBERS)
    forged = OTHER.public_key + payload[32:]  # claims another sender
    with pytest.raises(PrivateError):
        open_reveals(forged, BOX.private_key, BOX.public_key, MEMBERS)
    for junk in (b"", b"\x00" * 100):
        with pytest.raises(PrivateError):
            open_reveals(junk, BOX.private_key, BOX.public_key, MEMBERS)


def test_replies_travel_sealed_too_and_are_not_taken_for_reveals():
    """The full replies (receipts carry the prompt hash) reach the members only this way."""
    from gentorrent.wire import gentorrent_pb2 as pb
    from verifier.epochs.private import RepliesBundle, open_private, seal_replies
    replies = [pb.ProbeReply(node_id=b"\x01" * 32, token_ids=[5, 6], receipt=pb.ReplyReceipt(model="m", signature=b"s")),
               pb.ProbeReply(node_id=b"\x02" * 32, missing=True, reason="no reply")]
    payload = seal_replies(LEADER, BOX.public_key, 9, replies)
    bundle = open_private(payload, BOX.private_key, BOX.public_key, MEMBERS)
    assert isinstance(bundle, RepliesBundle) and bundle.epoch == 9 and list(bundle.replies) == replies
    with pytest.raises(PrivateError, match="not reveals"):
        open_reveals(payload, BOX.private_key, BOX.public_key, MEMBERS)
    with pytest.raises(PrivateError):
        open_private(payload, ELSEWHERE.private_key, ELSEWHERE.public_key, MEMBERS)


def test_a_reveal_with_a_malformed_request_is_refused():
    """A member gets a reveal whose request breaks the traffic bounds (here: no user message last):
    it is refused as a whole, not half-used."""
    bad = Reveal("ab" * 32, b"\x05" * 32, ChatRequest((("user", "hi"), ("assistant", "hello")), 0.7, 1.0, 64, True))
    payload = seal_reveals(LEADER, BOX.public_key, 7, [bad])
    with pytest.raises(PrivateError):
        open_reveals(payload, BOX.private_key, BOX.public_key, MEMBERS)
