"""A leader that misbehaves on purpose, for the tests of faulty-leader detection only.

It plugs into a verifier's epoch runner through the runner's one seam for how a member leads
(verifier.epochs.runner.LeaderConduct); no product code can reach this module (the import
contracts in pyproject.toml), so a deployed verifier always leads honestly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from gentorrent import receipts
from gentorrent.crypto.keys import Identity
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.epochs.runner import LeaderConduct

__all__ = ["LeaderFaults", "FORGED_TOKENS", "forged_receipt"]

FORGED_TOKENS = tuple(b"a reply the leader wrote itself")  # token ids of the forged text


@dataclass
class LeaderFaults(LeaderConduct):
    """Node ids (hex) whose reply this leader drops (reports missing), alters (a token changed
    after the node signed), forges (never asked: the leader posts text of its own with a
    well-formed receipt that names the node but carries the leader's signature, as a leader
    framing an honest node or vouching for a cheat would) or omits (leaves out of the plan, as a
    leader shielding a cheater from probes would; the chain makes the leader faulty). The sets
    may change while the committee runs: every epoch reads them afresh."""

    drop: set[str] = field(default_factory=set)
    alter: set[str] = field(default_factory=set)
    forge: set[str] = field(default_factory=set)
    omit: set[str] = field(default_factory=set)

    def plans(self, node_id_hex: str) -> bool:
        return node_id_hex not in self.omit

    async def challenge(self, node_id_hex: str, request: pb.GenerateRequest, leader: Identity,
                        ask: Callable[[], Awaitable[pb.ProbeReply]]) -> pb.ProbeReply:
        node = bytes.fromhex(node_id_hex)
        if node_id_hex in self.drop:
            return pb.ProbeReply(node_id=node, missing=True, reason="no reply")
        if node_id_hex in self.forge:
            tokens = list(FORGED_TOKENS)
            return pb.ProbeReply(node_id=node, token_ids=tokens, receipt=forged_receipt(leader, node, request, tokens))
        reply = await ask()
        if node_id_hex in self.alter and reply.token_ids:
            reply.token_ids[-1] = (reply.token_ids[-1] + 1) % 1000
        return reply


def forged_receipt(leader: Identity, node_id: bytes, request: pb.GenerateRequest,
                   token_ids: list[int]) -> pb.ReplyReceipt:
    """A receipt covering exactly `request` and `token_ids` and naming `node_id`, signed by the
    leader: everything a receipt check compares matches except the signature."""
    receipt = receipts.make_receipt(leader, request.model, request, token_ids, int(time.time() * 1000))
    receipt.node_id = node_id
    receipt.signature = leader.sign(receipts.signed_message(receipt))
    return receipt
