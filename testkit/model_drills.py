"""Misbehaving stand-in model nodes: fault drills for the user client (issue 10).

`python -m testkit.localnet echo-model --misbehave KIND` serves one of these instead of
the honest EchoModelNode, like `gt-model serve --dishonest` does for the verification tests.
They live here, outside the honest code, so nothing in a real node can switch them on.

Each lie is aimed at one check of the user client, so a test proves that check holds on
real processes:

- `garbage`: every reply message is random bytes, sealed with the right reply keys and split
  into correctly tagged cloves. The cloves pass every layer of crypto; only the decoder of
  the reply message (sealing.open_reply) stands between them and the user.
- `bad-signature`: a well-formed reply, the right text, a receipt naming this node and covering
  the right prompt and tokens, whose Ed25519 signature has one bit flipped. Only the receipt
  check (asking.receipt_is_valid) refuses it.
"""

from __future__ import annotations

import os
from typing import AsyncIterator

from gentorrent.crypto import sida
from gentorrent.overlay import sealing
from model_node.intake import CloveIntake
from gentorrent.wire import gentorrent_pb2 as pb
from testkit.localnet import EchoModelNode

MISBEHAVIOURS = ("garbage", "bad-signature")


class GarbageReplyIntake(CloveIntake):
    """Seals and tags every reply clove correctly, around a reply message of random bytes."""

    def _send_chunk(self, query: pb.OverlayQuery, seq: int, chunk: pb.GenerateChunk):
        honest = sealing.seal_reply(query.reply_key, pb.OverlayReply(seq=seq, chunk=chunk))
        garbage = os.urandom(len(honest))  # the size an honest reply would have on the wire
        tasks = []
        for index, (route, clove) in enumerate(zip(query.routes, sida.split(garbage, len(query.routes), query.k))):
            blob = sealing.seal_reply_clove(query.reply_key, index, seq, clove)
            tasks.append(self._spawn(self._send_clove(route, blob)))
        return tasks


class MisbehavingEchoModelNode(EchoModelNode):
    """The echo stand-in with one of MISBEHAVIOURS; everything else (keys, TLS, intake) is real."""

    def __init__(self, *args, misbehave: str, **kwargs) -> None:
        if misbehave not in MISBEHAVIOURS:
            raise ValueError(f"misbehave is one of {MISBEHAVIOURS}")
        super().__init__(*args, **kwargs)
        self.misbehave = misbehave
        if misbehave == "garbage":
            honest = self.intake
            self.intake = GarbageReplyIntake(honest.onion_key, self.generate, honest.proxy_certs, honest.channels,
                                             params=honest.params, max_active=honest.max_active,
                                             refresh=honest.refresh)
            self.intake.groups = honest.groups  # same clove parameters as the honest intake

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateChunk]:
        async for chunk in super().generate(request):
            if self.misbehave == "bad-signature" and chunk.HasField("receipt"):
                signature = bytearray(chunk.receipt.signature)
                signature[0] ^= 0x01
                chunk.receipt.signature = bytes(signature)
            yield chunk
