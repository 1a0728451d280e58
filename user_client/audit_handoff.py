"""A proxy's part in audits: hand a sealed audit that arrived on one of its paths to the
committee member the user named (`Verifier.SubmitAudit`, pinned TLS).

The proxy knows neither who sent the audit (it sees its predecessor on the path only) nor
what it holds (it is sealed to the member's audit key); the member sees this proxy, not the
user. Hand-ins run in the background, a bounded number at a time: beyond that the clove is
refused (the user's first hop reports it, and the user keeps the audit for a later try).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Callable, Mapping

import grpc

from gentorrent.audits import AuditMember
from gentorrent.config import AUDITS, WIRE, AuditParams
from gentorrent.crypto import tls
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)

__all__ = ["CommitteeHandoff", "MAX_HANDOFFS"]

#: sealed audits this proxy hands on at once
MAX_HANDOFFS = 8


class CommitteeHandoff:
    """The proxy side; `take` is called from the relay's clove handler (in the event loop)."""

    def __init__(self, members: Callable[[], Mapping[bytes, AuditMember]], params: AuditParams = AUDITS,
                 timeout_s: float = WIRE.rpc_timeout_s) -> None:
        self.members, self.params, self.timeout_s = members, params, timeout_s
        self._tasks: set[asyncio.Task] = set()
        self.counts: Counter[str] = Counter()

    def take(self, member_id: bytes, sealed: bytes) -> bool:
        """Start handing `sealed` to `member_id`; False if it is no member or too many are on their way."""
        member = self.members().get(bytes(member_id))
        if member is None or not sealed or len(sealed) > self.params.max_submission_bytes + 1024:
            self.counts["refused_here"] += 1
            return False
        if len(self._tasks) >= MAX_HANDOFFS:
            self.counts["busy"] += 1
            return False
        task = asyncio.get_running_loop().create_task(self._hand(member, sealed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _hand(self, member: AuditMember, sealed: bytes) -> None:
        channel = None
        try:
            channel = await tls.connect(member.address, member.tls_cert_pem, timeout=self.timeout_s)
            ack = await rpc.VerifierStub(channel).SubmitAudit(pb.SealedAudit(sealed=sealed), timeout=self.timeout_s)
            self.counts["accepted" if ack.accepted else "refused"] += 1
            if not ack.accepted:
                log.info("member %s refused an audit: %s", member.node_id.hex()[:16], ack.reason)
        except (grpc.aio.AioRpcError, OSError, asyncio.TimeoutError, tls.TlsError) as exc:
            self.counts["failed"] += 1
            log.info("audit hand-in to %s failed: %s", member.node_id.hex()[:16], exc)
        finally:
            if channel is not None:
                await channel.close()

    def status(self) -> dict:
        return {"in_flight": len(self._tasks), **self.counts}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
