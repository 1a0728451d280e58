"""The user's side of audits: commit before asking, hand in the asks that drew an audit.

Before each ask the node draws a fresh audit secret and puts its commitment in the request
(gentorrent/audits.py); after the answer, the ask is audited iff the secret and the prompt
hash draw under the committee's rate. An audited ask becomes a submission (request, reply
tokens, the node's signed receipt, the secret) waiting in a bounded outbox until it is handed
to the committee. With audits off no secret is drawn: the request carries random bytes that
look the same, so a model node cannot tell which users audit.

The hand-in must go through the anonymous overlay, so that the committee learns what was asked
and answered but not who asked; `flush` takes any `AuditChannel` that does so. It waits a
random delay first, so the hand-in does not follow the ask at a fixed interval.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import deque
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from gentorrent import audits
from gentorrent.crypto import onion
from gentorrent.config import AUDIT_COMMITMENT_BYTES, AUDITS, AuditParams
from gentorrent.wire import gentorrent_pb2 as pb
from user_client.asking import Answer

if TYPE_CHECKING:
    from user_client.paths import PathManager

log = logging.getLogger(__name__)

__all__ = ["Auditor", "AuditChannel", "OverlayAuditChannel"]

#: submissions kept waiting for a channel; beyond this the oldest are dropped
OUTBOX_LIMIT = 64
#: a hand-in waits a uniform random delay up to this long (seconds)
MAX_HAND_IN_DELAY_S = 60.0


class AuditChannel(Protocol):
    """Delivers one encoded AuditSubmission to a committee member through the overlay."""

    async def submit(self, data: bytes) -> pb.AuditAck: ...


class Auditor:
    """One user node's audit decisions and its outbox."""

    def __init__(self, params: AuditParams = AUDITS, enabled: bool | None = None,
                 secret_bytes: Callable[[int], bytes] = os.urandom, rng: random.Random | None = None) -> None:
        self.params = params
        self.enabled = params.user_enabled if enabled is None else enabled
        self.secret_bytes = secret_bytes
        self.rng = rng or random.SystemRandom()
        self.outbox: deque[bytes] = deque(maxlen=OUTBOX_LIMIT)
        self.counts = {"asked": 0, "audited": 0, "handed_in": 0, "refused": 0, "failed": 0}

    def ticket(self) -> audits.AuditTicket | None:
        """The ticket of the next ask (None with audits off: the request gets random bytes)."""
        if not self.enabled:
            return None
        return audits.AuditTicket(self.secret_bytes(AUDIT_COMMITMENT_BYTES))

    def commitment(self, ticket: audits.AuditTicket | None) -> bytes | None:
        return ticket.commitment if ticket is not None else None

    def after(self, answer: Answer, ticket: audits.AuditTicket | None) -> bool:
        """Note a completed ask; queue it for hand-in if its draw selected it. True if queued."""
        if ticket is None:
            return False
        self.counts["asked"] += 1
        if answer.receipt is None or not answer.token_ids or not ticket.selects(answer.request, self.params.rate):
            return False
        if answer.receipt.audit_commitment != ticket.commitment:
            return False  # (the asker checked the receipt; a reply without our commitment is no audit)
        submission = audits.make_submission(answer.request, answer.token_ids, answer.receipt, ticket,
                                            reusable=self.params.user_reusable)
        try:
            self.outbox.append(audits.encode_submission(submission, self.params))
        except audits.AuditError as exc:
            log.info("audited ask too large to hand in: %s", exc)
            return False
        self.counts["audited"] += 1
        return True

    async def flush(self, channel: AuditChannel, max_delay_s: float = MAX_HAND_IN_DELAY_S) -> int:
        """Hand every waiting submission in, each after its own random delay; returns how
        many the committee accepted. A submission that fails to arrive is kept for later."""
        accepted = 0
        for _ in range(len(self.outbox)):
            data = self.outbox.popleft()
            await asyncio.sleep(self.rng.uniform(0.0, max_delay_s))
            try:
                ack = await channel.submit(data)
            except Exception as exc:  # the channel's transport failed: keep it for the next flush
                log.info("audit hand-in failed: %s", exc)
                self.counts["failed"] += 1
                self.outbox.append(data)
                continue
            if ack.accepted:
                accepted += 1
                self.counts["handed_in"] += 1
            else:
                log.info("the committee refused an audit: %s", ack.reason)
                self.counts["refused"] += 1
        return accepted

    def status(self) -> dict:
        return {"enabled": self.enabled, "rate": self.params.rate, "reusable": self.params.user_reusable,
                "waiting": len(self.outbox), **self.counts}


class OverlayAuditChannel:
    """Hands a submission to every committee member that takes audits (so that more than 2/3
    of them score the same audits and agree: verifier/epochs/audits.agree_audit_scores),
    each copy sealed to its member's audit key and sent over one of this node's proxy paths
    (a different one per member while there are enough), wrapped in the path's layers like a
    clove of an ask, with the member named where a model node would be (the proxy hands it
    on: user_client/audit_handoff.py). Delivery is acknowledged hop by hop, like every clove:
    an ack says the first hop took the copy, not what the member decided."""

    def __init__(self, paths: "PathManager", members: Callable[[], Mapping[bytes, audits.AuditMember]],
                 timeout_s: float = 10.0) -> None:
        self.paths, self.members, self.timeout_s = paths, members, timeout_s

    async def submit(self, data: bytes) -> pb.AuditAck:
        members = sorted(self.members().values(), key=lambda m: m.node_id)
        if not members:
            raise ConnectionError("no committee member takes audits")
        paths = await self.paths.pick(len(members))
        if not paths:
            raise ConnectionError("no proxy path to hand an audit in")
        try:
            sent = await asyncio.gather(*(self._send(m, paths[i % len(paths)], data) for i, m in enumerate(members)))
        finally:
            self.paths.release(paths)
        if 3 * sum(sent) <= 2 * len(members):
            raise ConnectionError(f"only {sum(sent)} of {len(members)} members' copies left this node")
        return pb.AuditAck(accepted=True)

    async def _send(self, member: audits.AuditMember, path, data: bytes) -> bool:
        instruction = pb.ProxyInstruction(committee_member=member.node_id, payload=audits.seal_for(member, data))
        blob = onion.wrap_forward(path.secrets, instruction.SerializeToString(), path.take_seq())
        link = self.paths.relay.hub.link_to(path.first_hop)
        if link is None:
            return False
        ack = link.send(True, [pb.Clove(link_id=path.first_link, payload=blob)], ack=True)
        try:
            result = await asyncio.wait_for(ack, self.timeout_s)
        except asyncio.TimeoutError:
            result = None
        if result != []:
            self.paths.mark_failed(path)
            return False
        return True
