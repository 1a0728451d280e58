"""The ModelNode gRPC service: generation, scoring, status, and the overlay's entry points.

`LocalGenerator` is the one code path that turns a GenerateRequest into signed chunks on this
node's engine; the Generate RPC, the clove intake (overlay) and the group forwarder (routing)
all call it, so a reply looks and is signed the same whichever way the request came in.
Link (the overlay), Forward and Gossip are handled by objects injected into the servicer by the
issues that own them; until one is given, its RPC answers UNIMPLEMENTED.

Admission is bounded: beyond `max_running_requests + max_queued_requests` in flight, a
request is refused at once with RESOURCE_EXHAUSTED "busy" rather than queued without end.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable, Protocol

import grpc

from gentorrent.config import MODEL_NODE, ModelNodeParams
from gentorrent.crypto.keys import Identity
from gentorrent import generation, receipts
from model_node import tools
from model_node.engine import Engine, EngineError
from gentorrent.overlay.reply_pacing import merge_chunks
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)
VERSION = "0.1.0"


class BusyError(RuntimeError):
    """The node is at its admission limit (gRPC RESOURCE_EXHAUSTED "busy")."""

    code = "busy"  # a reply saying so starts "busy: " (sealing.BUSY_ERROR): the user moves on at once


def status_code_of(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status a model-node error maps to."""
    if isinstance(exc, generation.WrongModelError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, generation.BadRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, BusyError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, EngineError):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


class Admission:
    """Counts requests in flight and refuses beyond the limit (no queue without end)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.inflight = 0
        self.refused = 0

    def __enter__(self) -> "Admission":
        if self.inflight >= self.limit:
            self.refused += 1
            raise BusyError("busy")
        self.inflight += 1
        return self

    def __exit__(self, *exc) -> None:
        self.inflight -= 1


@dataclass(frozen=True)
class PreparedJob:
    """A GenerateRequest checked and tokenized once (`LocalGenerator.prepare`): routing decides
    on these token ids and serving runs them, so neither parses or checks the request again."""

    request: pb.GenerateRequest
    job: generation.GenerateJob
    prompt_ids: tuple[int, ...]


@dataclass
class LocalGenerator:
    """Serves GenerateRequests on this node's engine; every reply is signed.

    Calling it yields pb.GenerateChunk messages: one per engine delta, the last one
    `final` with the receipt. Bad requests raise (BadRequestError, BusyError, EngineError)
    before the first chunk; `status_code_of` maps them to gRPC codes.
    """

    engine: Engine
    identity: Identity
    params: ModelNodeParams = MODEL_NODE
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    tool_parser: str | None = tools.DEFAULT_TOOL_PARSER  # vLLM's --tool-call-parser, for tool_choice "auto"
    # (prompt tokens, output tokens, time to first token or None, end to end) of every finished
    # generation: the node's metrics (model_node.metrics.ModelMetrics.observe_request)
    on_finished: Callable[[int, int, float | None, float], None] | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.admission = Admission(self.params.max_running_requests + self.params.max_queued_requests)
        self.served = 0

    @property
    def model(self) -> str:
        return self.engine.model

    def prepare(self, request: pb.GenerateRequest) -> PreparedJob:
        """Check and tokenize a request once; bad input raises here, before any state changes."""
        job = generation.parse_generate(request, self.model, self.params)
        if job.operation == pb.GenerateRequest.DETOKENIZE:
            vocab = len(self.engine.tokenizer)
            if any(t >= vocab for t in job.token_ids):
                raise generation.BadRequestError(f"token ids must be below the vocabulary's {vocab}")
            return PreparedJob(request, job, ())
        constraint = tools.constraint(job)  # a forced tool choice: guided by the tools' schema
        if constraint is not None:
            job = replace(job, sampling=replace(job.sampling, structured=constraint))
        prompt_ids = self.engine.encode(job.prompt)
        self.engine.check_fits(prompt_ids)
        return PreparedJob(request, job, tuple(prompt_ids))

    async def __call__(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateChunk]:
        async for chunk in self.serve(self.prepare(request)):
            yield chunk

    async def serve(self, prepared: PreparedJob) -> AsyncIterator[pb.GenerateChunk]:
        """Run a prepared job on the engine and sign the reply (variants override this)."""
        request, job = prepared.request, prepared.job
        if job.operation != pb.GenerateRequest.GENERATE:
            yield self._sign(self._token_operation(prepared), prepared)
            return
        served_by = self.identity.node_id_hex
        final = None
        held: list[pb.GenerateChunk] = []  # a reply that may be tool calls goes out whole, parsed
        t0, first = self.clock(), None
        with self.admission:  # the slot is freed as soon as the engine is done
            out: list[int] = []
            logprobs = job.sampling.top_logprobs if request.return_logprobs else None
            async for d in self.engine.generate(prepared.prompt_ids, job.sampling, request.request_id or None,
                                                logprobs):
                out.extend(d.token_ids)
                if first is None and d.token_ids:
                    first = self.clock() - t0
                chunk = pb.GenerateChunk(text=d.text, token_ids=d.token_ids, served_by=served_by,
                                         logprobs=d.logprobs)
                if logprobs is not None:
                    chunk.top_logprobs.extend(self._alternatives(d))
                if d.finished:
                    final = chunk
                    break
                if job.calls_tools:
                    held.append(chunk)
                else:
                    yield chunk
        if final is None:
            raise EngineError("the engine ended the request without a final output")
        final.final = True
        final.finish_reason = d.finish_reason
        if job.calls_tools:
            final = _with_tool_calls(merge_chunks(held + [final]), job, self.engine.tokenizer, self.tool_parser)
        if self.on_finished is not None:
            self.on_finished(len(prepared.prompt_ids), len(out), first, self.clock() - t0)
        yield self._sign(final, prepared, out)

    def _alternatives(self, d) -> list[pb.TokenAlternatives]:
        """Per output token: its text and its top alternatives (ids, logprobs, texts)."""
        text = self.engine.token_text
        out = []
        for i, token in enumerate(d.token_ids):
            alts = d.top[i] if i < len(d.top) else ()
            out.append(pb.TokenAlternatives(token=text(token), token_ids=[a for a, _ in alts],
                                            logprobs=[lp for _, lp in alts], tokens=[text(a) for a, _ in alts],
                                            logprob=d.logprobs[i] if i < len(d.logprobs) else 0.0))
        return out

    def _token_operation(self, prepared: PreparedJob) -> pb.GenerateChunk:
        """TOKENIZE: the prompt's tokens (chat template applied); DETOKENIZE: the text of ids."""
        if prepared.job.operation == pb.GenerateRequest.TOKENIZE:
            return pb.GenerateChunk(token_ids=prepared.prompt_ids, served_by=self.identity.node_id_hex,
                                    final=True, finish_reason="stop", max_model_len=self.engine.max_model_len)
        ids = prepared.job.token_ids
        return pb.GenerateChunk(text=self.engine.decode(ids), token_ids=ids, served_by=self.identity.node_id_hex,
                                final=True, finish_reason="stop")

    def _sign(self, final: pb.GenerateChunk, prepared: PreparedJob, out: list[int] | None = None) -> pb.GenerateChunk:
        final.receipt.CopyFrom(receipts.make_receipt(self.identity, self.model, prepared.request,
                                                     list(final.token_ids) if out is None else out, self.clock_ms(),
                                                     prompt_tokens=len(prepared.prompt_ids)))
        self.served += 1
        return final

    async def score(self, request: pb.ScoreRequest) -> pb.ScoreReply:
        job = generation.parse_score(request, self.model, self.params)
        with self.admission:
            result = await self.engine.score(job.prompt, job.text or None,
                                             job.token_ids or None, job.top_k)
        return pb.ScoreReply(
            prompt_tokens=result.prompt_tokens, served_by=self.identity.node_id_hex,
            tokens=[pb.TokenScore(token_id=t.token_id, logprob=t.logprob, rank=t.rank,
                                  top_ids=[i for i, _ in t.top], top_logprobs=[lp for _, lp in t.top])
                    for t in result.tokens],
        )


def _with_tool_calls(final: pb.GenerateChunk, job: generation.GenerateJob, tokenizer,
                     parser: str | None) -> pb.GenerateChunk:
    content, calls = tools.parse_reply(job, final.text, tokenizer, parser)
    if calls:
        final.text = content
        final.tool_calls.extend(calls)
        final.finish_reason = "tool_calls"
    return final


# --------------------------------------------------------------------------- injected parts


class CloveHandler(Protocol):
    async def Link(self, request_iterator, context) -> None: ...


class ForwardHandler(Protocol):
    def forward(self, request: pb.ForwardRequest) -> AsyncIterator[pb.GenerateChunk]: ...


class GossipHandler(Protocol):
    async def gossip(self, message: pb.GossipMessage) -> pb.GossipReply: ...


class ModelNodeService(rpc.ModelNodeServicer):
    """gRPC face of a model node. Overlay/routing parts are injected (or set later)."""

    def __init__(self, generator: LocalGenerator, capacity: int = MODEL_NODE.default_capacity,
                 address: str = "", clove_intake: CloveHandler | None = None,
                 forwarder: ForwardHandler | None = None, gossip: GossipHandler | None = None,
                 generate_route: Callable[[pb.GenerateRequest], AsyncIterator[pb.GenerateChunk]] | None = None,
                 serving: pb.CatalogueEntry | None = None) -> None:
        """`serving`: the weights digest and engine options it runs, as Status reports them (a
        verifier checks its reference with them); by default only the model's name."""
        self.generator = generator
        self.serving = serving
        self.capacity = capacity
        self.address = address
        self.clove_intake = clove_intake
        self.forwarder = forwarder
        self.gossip_handler = gossip
        # what Generate runs: the local engine, or (routing) a forwarding policy
        self.generate_route = generate_route or generator
        self.started = time.time()

    @property
    def engine(self) -> Engine:
        return self.generator.engine

    # ------------------------------------------------------------------ generation

    async def Generate(self, request: pb.GenerateRequest, context) -> AsyncIterator[pb.GenerateChunk]:
        async for chunk in self._stream(self.generate_route(request), context):
            yield chunk

    async def Forward(self, request: pb.ForwardRequest, context):
        if self.forwarder is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "forwarding is not enabled on this node")
        async for chunk in self._stream(self.forwarder.forward(request), context):
            yield chunk

    async def _stream(self, chunks: AsyncIterator[pb.GenerateChunk], context):
        try:
            async for chunk in chunks:
                yield chunk
        except (generation.BadRequestError, BusyError, EngineError) as exc:
            await context.abort(status_code_of(exc), str(exc))

    async def Score(self, request: pb.ScoreRequest, context) -> pb.ScoreReply:
        try:
            return await self.generator.score(request)
        except (generation.BadRequestError, BusyError, EngineError) as exc:
            await context.abort(status_code_of(exc), str(exc))

    # ------------------------------------------------------------------ overlay

    async def Link(self, request_iterator, context) -> None:
        """The overlay link from proxies (model_node.intake)."""
        if self.clove_intake is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "clove intake is not enabled on this node")
        await self.clove_intake.Link(request_iterator, context)

    async def Gossip(self, request: pb.GossipMessage, context) -> pb.GossipReply:
        if self.gossip_handler is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "gossip is not enabled on this node")
        return await self.gossip_handler.gossip(request)

    # ------------------------------------------------------------------ status

    def load_report(self) -> pb.LoadReport:
        load = self.engine.load()
        return pb.LoadReport(active=load.active, queued=load.queued, kv_cache_usage=load.kv_cache_usage,
                             capacity=self.capacity, prefix_queries=load.prefix_queries,
                             prefix_hits=load.prefix_hits)

    def status_dict(self) -> dict:
        load = self.engine.load()
        return {
            "node_id": self.generator.identity.node_id_hex, "model": self.engine.model,
            "address": self.address, "capacity": self.capacity, "version": VERSION,
            "max_model_len": self.engine.max_model_len, "uptime_s": round(time.time() - self.started, 1),
            "engine_startup_s": round(self.engine.startup_s, 1), "served": self.generator.served,
            "refused_busy": self.generator.admission.refused,
            # scoring calls (a verifier's reference) and the passes they took: identical calls share one
            "scoring": {"requests": self.engine.shared_passes.requests, "passes": self.engine.shared_passes.passes},
            "load": {"active": load.active, "queued": load.queued,
                     "kv_cache_usage": round(load.kv_cache_usage, 4),
                     "prefix_queries": load.prefix_queries, "prefix_hits": load.prefix_hits},
            "overlay": {"clove_intake": self.clove_intake is not None,
                        "forwarding": self.forwarder is not None, "gossip": self.gossip_handler is not None},
            # --- routing: forward rate, tree hit rate, prefix-cache hit rate, gossip
            "routing": {**(self.forwarder.status() if hasattr(self.forwarder, "status") else {}),
                        "gossip": (self.gossip_handler.status()
                                   if hasattr(self.gossip_handler, "status") else {})},
        }

    async def Status(self, request: pb.Empty, context) -> pb.StatusReply:
        return pb.StatusReply(node_id=self.generator.identity.node_id_hex, model=self.engine.model,
                              load=self.load_report(), address=self.address,
                              json=json.dumps(self.status_dict(), sort_keys=True),
                              serving=self.serving or pb.CatalogueEntry(model=self.engine.model))

    async def Health(self, request: pb.Empty, context) -> pb.HealthReply:
        return pb.HealthReply(node_id=self.generator.identity.node_id_hex, role="model",
                              version=VERSION, serving=await self.engine.check_health())
