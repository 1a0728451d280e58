"""A verifier's reference model, reached through a model node's `Generate` and `Score` RPCs.

Why a service and not an engine inside every verifier process: a committee member on its own
machine runs `gt-model serve` with the honest weights next to its verifier and points
`--reference-model` at it; on ONE machine (devnet, tests) the four members share one such
engine, since four CPU engines would not fit two cores. The scoring call is one teacher-forced
pass (`Score`: vLLM prompt_logprobs with the top-k alternatives), never one request per token.

A reference scores a reply only when it runs the weights (and the scoring options) the
catalogue lists for the node that generated it: a member whose reference runs other weights (an
old checkpoint, a dtype the entry does not name) would condemn honest nodes, so it abstains
(VERDICT_UNSCORABLE: no vote on the score) and says why in its log. One reference engine may
score several catalogue names that share its weights: a model is its weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Iterable

import grpc

from gentorrent.config import EPOCH_RUN, SCORING, EpochRunParams
from gentorrent.crypto import tls
from gentorrent.audits import RegisteredModel
from gentorrent.ledger import catalogue
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from verifier.epochs.scoring import TokenScores

__all__ = ["ReferenceModelError", "RemoteReference", "committed_catalogue", "token_scores_of"]

log = logging.getLogger(__name__)


class ReferenceModelError(RuntimeError):
    """The reference model could not answer (down, busy, or it refused the request), or may
    not score this reply (it runs other weights than the catalogue lists for the node's)."""


def token_scores_of(reply: pb.ScoreReply) -> TokenScores:
    """The Score RPC's answer as the pure scorer's input."""
    logprob, rank, top = [], [], []
    for t in reply.tokens:
        logprob.append(float(t.logprob))
        rank.append(int(t.rank) or 1)
        alts = {int(i): float(lp) for i, lp in zip(t.top_ids, t.top_logprobs)}
        top.append(alts or {int(t.token_id): float(t.logprob)})
    return TokenScores(logprob, rank, top)


def committed_catalogue(query: Callable[[str], tuple[int, bytes]]) -> list[pb.CatalogueEntry]:
    """The committee's catalogue as this member's committed state holds it."""
    code, value = query("/catalogue")
    if code != 0:
        return []
    return [catalogue.entry_of({k: e[k] for k in catalogue.FIELDS}) for e in json.loads(value)]


class RemoteReference:
    """Score (replies) on a `gt-model serve` reachable over pinned TLS, when it runs the
    weights the reply is claimed to come from (`catalogue.reference_mismatch`)."""

    def __init__(self, address: str, cert_pem: bytes, params: EpochRunParams = EPOCH_RUN,
                 timeout_s: float = 600.0,
                 catalogue_of: Callable[[], Iterable[pb.CatalogueEntry]] = tuple) -> None:
        """`catalogue_of`: the committee's catalogue as committed (attach_epochs gives the
        member's own state); by default none, so a reply is matched by its model's name."""
        self.address, self.cert_pem, self.params, self.timeout_s = address, cert_pem, params, timeout_s
        self.catalogue_of = catalogue_of
        self._channel: grpc.aio.Channel | None = None
        self.serving = pb.CatalogueEntry()  # what the reference runs, from its Status

    @classmethod
    def from_args(cls, address: str, cert_file: Path) -> "RemoteReference":
        return cls(address, Path(cert_file).read_bytes())

    async def _stub(self) -> rpc.ModelNodeStub:
        if self._channel is None:
            self._channel = await tls.connect(self.address, self.cert_pem, timeout=30.0)
            status = await rpc.ModelNodeStub(self._channel).Status(pb.Empty(), timeout=30.0)
            self.serving = status.serving if status.HasField("serving") else pb.CatalogueEntry(model=status.model)
            self._say_what_it_scores()
        return rpc.ModelNodeStub(self._channel)

    def _say_what_it_scores(self) -> None:
        """Tell the operator at once which catalogue names this reference can score, and warn when
        the catalogue lists its model with other weights only (it would abstain on all of them)."""
        listed = list(self.catalogue_of())
        names = sorted({e.model for e in listed if e.weights_digest == self.serving.weights_digest})
        log.info("the reference model at %s runs %s%s", self.address, catalogue.as_json(self.serving),
                 f"; it scores the catalogue's {', '.join(names)}" if names else "")
        if not names and any(e.model == self.serving.model for e in listed):
            log.warning("the reference model at %s runs %s with weights %s, which the catalogue does not list: "
                        "this member abstains on every node that registered listed weights (serve a listed "
                        "checkpoint as the reference: `gt-verifier catalogue list`)", self.address,
                        self.serving.model, self.serving.weights_digest or "(no digest)")

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def score(self, request: pb.GenerateRequest, token_ids: list[int],
                    served_by: RegisteredModel | None = None) -> TokenScores:
        """Log-probabilities of `token_ids` after the request's prompt, in one pass; `served_by`:
        the record of the node that generated them (without one, the request's model name)."""
        stub = await self._stub()
        model, digest = (served_by.model, served_by.weights_digest) if served_by is not None else (request.model, "")
        problem = catalogue.reference_mismatch(self.serving, self.catalogue_of(), model, digest)
        if problem is not None:
            raise ReferenceModelError(problem)
        score_request = pb.ScoreRequest(model=self.serving.model, prompt=request.prompt, messages=request.messages,
                                        token_ids=token_ids, top_k=SCORING.top_k)
        try:
            reply = await stub.Score(score_request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise ReferenceModelError(f"reference Score failed: {exc.code().name} {exc.details()}") from exc
        if len(reply.tokens) != len(token_ids):
            raise ReferenceModelError("the reference scored a different number of tokens")
        return token_scores_of(reply)
