"""Where a model node's request is served: here, or at the group peer that holds its prefix.

`Router` sits between a request's way in (the Generate RPC, the overlay's clove intake) and
the local engine. Per request it tokenizes the prompt with the engine's own tokenizer, runs
Algorithm 2 on the group's HR-tree and node table (`GroupRouting.decide`), and either serves
locally (`LocalGenerator`) or calls the chosen peer's `Forward` RPC with hops = 1 and streams
the peer's chunks back unchanged: the serving node signs the receipt and names itself in
`served_by`, so a user can check who served it and send follow-ups there. A forwarded request
is served where it lands unless that node is overloaded by its own fresh load, which passes it
on once more with hops + 1 (`gentorrent/routing/policy.py`; never beyond ROUTING.max_hops: no
loops).

A forward that fails before its first chunk (peer down, busy, unreachable within
`forward_connect_timeout_s`) is served locally instead; one that fails mid-stream fails the
request (half a reply from one node and half from another could not be signed as one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import AsyncIterator, Callable

import grpc

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.crypto import tls
from model_node.gossip import GroupGossip
from model_node.engine import EngineError
from model_node.service import LocalGenerator
from gentorrent.channels import ChannelPool
from gentorrent.ledger.sections import ModelRecord
from gentorrent.routing.group import GroupRouting, LocalLoad
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)
_LATENCY_EWMA = 0.2  # weight of the newest request in the reported mean latency
RECENT_FORWARDS = 16  # forwards `status()` lists (where each went, at which matched depth)


class Router:
    """Serve-or-forward for one model node. Call it like a LocalGenerator (hops = 0)."""

    def __init__(self, generator: LocalGenerator, group: GroupRouting,
                 peers: Callable[[str], ModelRecord | None], channels: ChannelPool | None = None,
                 params: RoutingParams = ROUTING, clock: Callable[[], float] = time.monotonic) -> None:
        self.generator = generator
        self.group = group
        self.peers = peers
        self.channels = channels or ChannelPool()
        self.params = params
        self.clock = clock
        self.latency_s = 0.0
        self.recent_forwards: deque[dict] = deque(maxlen=RECENT_FORWARDS)

    @property
    def model(self) -> str:
        return self.generator.model

    def local_load(self) -> LocalLoad:
        """The engine's load (running + queued; our admission count if it is ahead)."""
        load = self.generator.engine.load()
        active = max(load.active + load.queued, self.generator.admission.inflight)
        return LocalLoad(active=active, queued=load.queued, kv_usage=load.kv_cache_usage,
                         latency_s=self.latency_s)

    # -- ways in --------------------------------------------------------------------------

    def __call__(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateChunk]:
        return self._route(request, hops=0)

    def forward(self, request: pb.ForwardRequest) -> AsyncIterator[pb.GenerateChunk]:
        """The Forward RPC: a peer sent us this request; it is served here, whatever the tree says."""
        return self._route(request.request, hops=max(1, request.hops))

    # -- the decision ---------------------------------------------------------------------

    async def _route(self, request: pb.GenerateRequest, hops: int) -> AsyncIterator[pb.GenerateChunk]:
        gen = self.generator
        prepared = gen.prepare(request)  # bad input: raise, no state change
        tokens = list(prepared.prompt_ids)
        decision = self.group.decide(tokens, hops, self.clock(), self.local_load())
        if decision.forward:
            peer = self.peers(decision.node_id)
            if peer is not None:
                started = False
                try:
                    async for chunk in self._call_peer(peer, request, hops + 1):
                        started = True
                        if chunk.final and not chunk.error:  # noted before it leaves: a consumer
                            # stops at the final chunk, and this generator is then closed here
                            self.recent_forwards.append({"to": decision.node_id, "reason": decision.reason.value,
                                                         "depth": decision.depth, "prompt_tokens": len(tokens),
                                                         "at_ms": int(time.time() * 1000)})
                        yield chunk
                    return
                except (grpc.aio.AioRpcError, tls.TlsError, OSError, asyncio.TimeoutError) as exc:
                    if started:
                        raise EngineError(f"forwarded request failed at {peer.node_id_hex[:12]}: {exc}") from exc
                    log.info("forward to %s failed (%s); serving locally", peer.node_id_hex[:12], exc)
                    await self.channels.forget(peer.address)
            self.group.forward_failed(tokens, decision.node_id, self.clock())
        t0 = self.clock()
        async for chunk in gen.serve(prepared):
            if chunk.final:  # measured before it leaves: the overlay intake stops at the final chunk
                self.latency_s += _LATENCY_EWMA * ((self.clock() - t0) - self.latency_s)
            yield chunk

    async def _call_peer(self, peer: ModelRecord, request: pb.GenerateRequest, hops: int
                         ) -> AsyncIterator[pb.GenerateChunk]:
        channel = self.channels.to(peer)
        await asyncio.wait_for(channel.channel_ready(), self.params.forward_connect_timeout_s)
        call = rpc.ModelNodeStub(channel).Forward(
            pb.ForwardRequest(request=request, origin_node_id=self.generator.identity.node_id,
                              hops=hops),
            timeout=self.params.forward_timeout_s)
        async for chunk in call:
            yield chunk

    # -- reporting ------------------------------------------------------------------------

    def status(self) -> dict:
        """Routing figures for `gt-model status` and /metrics."""
        out = self.group.status()
        load = self.generator.engine.load()
        out["prefix_cache_hit_rate"] = (round(load.prefix_hits / load.prefix_queries, 4)
                                        if load.prefix_queries else 0.0)
        out["mean_latency_s"] = round(self.latency_s, 3)
        out["recent_forwards"] = list(self.recent_forwards)
        return out


# --------------------------------------------------------------------------- wiring


def kv_capacity_tokens(engine) -> int:
    """Tokens of KV cache the engine has (what bounds our own HR-subtree)."""
    try:
        cache = engine.llm.vllm_config.cache_config
        blocks = cache.num_gpu_blocks or engine.params.kv_cache_blocks
        if blocks:
            return int(blocks) * int(cache.block_size)
    except AttributeError:
        pass
    return ROUTING.default_kv_capacity_tokens


def build_routing(identity, generator: LocalGenerator, capacity: int, directory,
                  interval_s: float | None = None, params: RoutingParams = ROUTING):
    """The Router and the gossip shell of one model node, sharing one `GroupRouting`."""
    group = GroupRouting(identity.node_id_hex, capacity, kv_capacity_tokens(generator.engine),
                         version_base=int(time.time() * 1000), params=params)
    channels = ChannelPool()
    router = Router(generator, group, lambda node_id: None, channels, params)

    def prefix_counters() -> tuple[int, int]:
        load = generator.engine.load()
        return load.prefix_queries, load.prefix_hits

    gossip = GroupGossip(identity, generator.model, group, directory, router.local_load,
                         prefix_counters=prefix_counters, channels=channels, params=params,
                         interval_s=interval_s)
    router.peers = lambda node_id: gossip.roster.get(node_id)  # the roster gossip keeps fresh
    return router, gossip
