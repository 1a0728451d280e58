"""A verifier's reference model, reached through a model node's `Generate` and `Score` RPCs.

Why a service and not an engine inside every verifier process: a committee member on its own
machine runs `gt-model serve` with the honest weights next to its verifier and points
`--reference-model` at it; on ONE machine (devnet, tests) the four members share one such
engine, since four CPU engines would not fit two cores. The scoring call is one teacher-forced
pass (`Score`: vLLM prompt_logprobs with the top-k alternatives), never one request per token.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from gentorrent.config import EPOCH_RUN, SCORING, EpochRunParams
from gentorrent.crypto import tls
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from verifier.epochs.scoring import TokenScores

__all__ = ["ReferenceModelError", "RemoteReference", "token_scores_of"]


class ReferenceModelError(RuntimeError):
    """The reference model could not answer (down, busy, or it refused the request)."""


def token_scores_of(reply: pb.ScoreReply) -> TokenScores:
    """The Score RPC's answer as the pure scorer's input."""
    logprob, rank, top = [], [], []
    for t in reply.tokens:
        logprob.append(float(t.logprob))
        rank.append(int(t.rank) or 1)
        alts = {int(i): float(lp) for i, lp in zip(t.top_ids, t.top_logprobs)}
        top.append(alts or {int(t.token_id): float(t.logprob)})
    return TokenScores(logprob, rank, top)


class RemoteReference:
    """Score (replies) on a `gt-model serve` reachable over pinned TLS."""

    def __init__(self, address: str, cert_pem: bytes, params: EpochRunParams = EPOCH_RUN,
                 timeout_s: float = 600.0) -> None:
        self.address, self.cert_pem, self.params, self.timeout_s = address, cert_pem, params, timeout_s
        self._channel: grpc.aio.Channel | None = None
        self.model = ""

    @classmethod
    def from_args(cls, address: str, cert_file: Path) -> "RemoteReference":
        return cls(address, Path(cert_file).read_bytes())

    async def _stub(self) -> rpc.ModelNodeStub:
        if self._channel is None:
            self._channel = await tls.connect(self.address, self.cert_pem, timeout=30.0)
            status = await rpc.ModelNodeStub(self._channel).Status(pb.Empty(), timeout=30.0)
            self.model = status.model
        return rpc.ModelNodeStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def score(self, request: pb.GenerateRequest, token_ids: list[int]) -> TokenScores:
        """Log-probabilities of `token_ids` after the request's prompt, in one pass."""
        stub = await self._stub()
        if request.model != self.model:
            raise ReferenceModelError(f"the reference serves {self.model!r}, not {request.model!r}")
        score_request = pb.ScoreRequest(model=request.model, prompt=request.prompt, messages=request.messages,
                                        token_ids=token_ids, top_k=SCORING.top_k)
        try:
            reply = await stub.Score(score_request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise ReferenceModelError(f"reference Score failed: {exc.code().name} {exc.details()}") from exc
        if len(reply.tokens) != len(token_ids):
            raise ReferenceModelError("the reference scored a different number of tokens")
        return token_scores_of(reply)
