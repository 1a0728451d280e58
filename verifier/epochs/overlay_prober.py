"""Probing model nodes as an ordinary user node through the anonymous overlay.

A verifier owns a `user_client.node.UserNode` (its own keys, relay service and proxy paths) and
asks challenges with `ask_request`, the very call a user's `gt-user ask` makes: same request
format, same sealing, same cloves, so a model node cannot tell a challenge from user traffic.
"""

from __future__ import annotations

import asyncio

from gentorrent.wire import gentorrent_pb2 as pb
from user_client.asking import NO_PATHS, AskError
from user_client.node import UserNode
from verifier.epochs.runner import ProbeAnswer, ProbeFailed

__all__ = ["OverlayProber"]


class OverlayProber:
    """`patience_s`: how long a challenge waits for this member's own paths. A member that
    reported a node missing because its own overlay was short of paths (just started, or its
    single-use paths used up by the last challenges) had the node probed by every other member
    and, when they reached it, was blamed as a faulty leader: seen in the demo's first epoch."""

    def __init__(self, user: UserNode, patience_s: float) -> None:
        self.user = user
        self.patience_s = patience_s

    async def ask(self, request: pb.GenerateRequest, node_id_hex: str) -> ProbeAnswer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.patience_s
        while True:
            try:
                answer = await self.user.ask_request(request, node_id=node_id_hex)
                break
            except AskError as exc:
                if exc.code != NO_PATHS or loop.time() >= deadline:
                    raise ProbeFailed(str(exc)[:300]) from exc
                # the asker already waited OverlayParams.path_wait_s for paths: go again
                await asyncio.sleep(self.user.params.path_retry_s)
        if answer.receipt is None:
            raise ProbeFailed("the reply carries no signed receipt")
        # served_by may be a group member the node forwarded to: the runner decides whether
        # that signer is acceptable (reply_commitments.reply_signer) and whom the reply scores
        return ProbeAnswer(list(answer.token_ids), answer.receipt)
