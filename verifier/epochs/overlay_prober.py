"""Probing model nodes as an ordinary user node through the anonymous overlay.

A verifier owns a `user_client.node.UserNode` (its own keys, relay service and proxy paths) and
asks challenges with `ask_request`, the very call a user's `gt-user ask` makes: same request
format, same sealing, same cloves, so a model node cannot tell a challenge from user traffic.
"""

from __future__ import annotations

import asyncio
import logging

from gentorrent.config import EPOCH_RUN
from gentorrent.wire import gentorrent_pb2 as pb
from user_client.asking import NO_ANSWER, NO_PATHS, OVERLOADED, AskError
from user_client.node import UserNode
from verifier.epochs.runner import ProbeAnswer, ProbeFailed

__all__ = ["OverlayProber"]

log = logging.getLogger(__name__)


class OverlayProber:
    """`patience_s`: how long a challenge waits for this member's own paths. A member that
    reported a node missing because its own overlay was short of paths (just started, or its
    single-use paths used up by the last challenges) had the node probed by every other member
    and, when they reached it, was blamed as a faulty leader: seen in the demo's first epoch.

    `attempts`: how often a node that did not answer in time (or was busy) is asked, over fresh
    paths, before it is reported missing. Seen in the devnet test: under load (audits at rate 1,
    users asking) an honest node's reply to the leader's one attempt took over the user node's
    60 s, the other members reached it a minute later, and the honest leader was blamed and the
    epoch lost. A user asks again when a node does not answer; so does the prober (its asks
    must look like a user's). A hung node costs each probe `attempts` waits."""

    def __init__(self, user: UserNode, patience_s: float, attempts: int = EPOCH_RUN.probe_attempts) -> None:
        self.user = user
        self.patience_s = patience_s
        self.attempts = attempts

    async def ask(self, request: pb.GenerateRequest, node_id_hex: str) -> ProbeAnswer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.patience_s
        unanswered = 0
        while True:
            try:
                answer = await self.user.ask_request(request, node_id=node_id_hex)
                break
            except AskError as exc:
                if loop.time() >= deadline:
                    raise ProbeFailed(str(exc)[:300]) from exc
                if exc.code == NO_PATHS:
                    # the asker already waited OverlayParams.path_wait_s for paths: go again
                    await asyncio.sleep(self.user.params.path_retry_s)
                    continue
                unanswered += 1
                if exc.code not in (NO_ANSWER, OVERLOADED) or unanswered >= self.attempts:
                    raise ProbeFailed(str(exc)[:300]) from exc
                log.info("probe of %s: %s; asking again over fresh paths (%d of %d)", node_id_hex[:12],
                         str(exc)[:160], unanswered + 1, self.attempts)
        if answer.receipt is None:
            raise ProbeFailed("the reply carries no signed receipt")
        # served_by may be a group member the node forwarded to: the runner decides whether
        # that signer is acceptable (reply_commitments.reply_signer) and whom the reply scores
        return ProbeAnswer(list(answer.token_ids), answer.receipt)
