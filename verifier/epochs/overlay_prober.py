"""Probing model nodes as an ordinary user node through the anonymous overlay.

A verifier owns a `user_client.node.UserNode` (its own keys, relay service and proxy paths) and
asks challenges with `ask_request`, the very call a user's `gt-user ask` makes: same request
format, same sealing, same cloves, so a model node cannot tell a challenge from user traffic.
"""

from __future__ import annotations

from gentorrent.wire import gentorrent_pb2 as pb
from user_client.asking import AskError
from user_client.node import UserNode
from verifier.epochs.runner import ProbeAnswer, ProbeFailed

__all__ = ["OverlayProber"]


class OverlayProber:
    def __init__(self, user: UserNode) -> None:
        self.user = user

    async def ask(self, request: pb.GenerateRequest, node_id_hex: str) -> ProbeAnswer:
        try:
            answer = await self.user.ask_request(request, node_id=node_id_hex)
        except AskError as exc:
            raise ProbeFailed(str(exc)[:300]) from exc
        if answer.receipt is None:
            raise ProbeFailed("the reply carries no signed receipt")
        # served_by may be a group member the node forwarded to: the runner decides whether
        # that signer is acceptable (reply_commitments.reply_signer) and whom the reply scores
        return ProbeAnswer(list(answer.token_ids), answer.receipt)
