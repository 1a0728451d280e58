"""Where a model node sends a request: Algorithm 2 of the paper (load balancing on the HR-tree).

Relative load = (active requests + requests we forwarded since the last report) / capacity
score (1..10). On a tree match (depth >= tau_c) the candidates whose relative load is at or
above ROUTING.load_threshold are dropped and the least loaded one is taken; on a miss, or if
no candidate is left, the least relatively loaded live member of the group is taken. Ties go
to the local node (a forward costs a hop), then to the smallest node id, so every node decides
the same way on the same view. One refinement for stale gossip: the local node keeps the
request (a miss while it is under the threshold, or a match it holds itself) unless the best
other choice is lighter by more than ROUTING.forward_margin -- otherwise every node, seeing
the same 5-s-old loads, would forward to the same "least loaded" peer at once (herding). A request that already made one hop (hops > 0) is served
where it is: forwarding is at most one hop, so no loops.

This module decides; it sends nothing. The caller (the model-node service) serves or forwards,
calls `NodeTable.note_forwarded(target)` and, for a forward, `HRTree.insert(tokens, target,
now)` so that the next similar requests follow before the target's own gossip arrives.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.routing.hrtree import NodeLoad, NodeTable, SearchResult


class Reason(enum.Enum):
    ALREADY_FORWARDED = "already_forwarded"  # hops > 0: serve locally, never forward again
    TREE_MATCH = "tree_match"  # a holder of the matched prefix under the load threshold
    LEAST_LOADED = "least_loaded"  # miss, or every holder over the threshold


@dataclass(frozen=True)
class RouteDecision:
    node_id: str  # who serves
    reason: Reason
    forward: bool  # node_id != local node
    depth: int  # matched tree depth (0 when not searched)
    relative_load: float  # of the chosen node, as we believed it


def choose_node(local_id: str, match: SearchResult, table: NodeTable, *, hops: int,
                now: float, params: RoutingParams = ROUTING) -> RouteDecision:
    """Algorithm 2. `match` is `HRTree.search(prompt)`; `table` must have a row for local_id."""
    if hops < 0:
        raise ValueError("hops must be >= 0")
    local = table.get(local_id)
    if local is None:
        raise ValueError("the node table has no row for the local node")
    if hops > 0:
        return RouteDecision(local_id, Reason.ALREADY_FORWARDED, False, match.depth,
                        local.relative_load)
    live = {row.node_id: row for row in table.live(now, always=local_id)}
    holders = [live[c] for c in match.candidates if c in live]
    under = [row for row in holders if row.relative_load < params.load_threshold]
    if under:
        best = _keep_local(_least_loaded(under, local_id), local, under, params)
        return RouteDecision(best.node_id, Reason.TREE_MATCH, best.node_id != local_id,
                        match.depth, best.relative_load)
    best = _least_loaded(list(live.values()), local_id)
    if local.relative_load < params.load_threshold:
        best = _keep_local(best, local, list(live.values()), params)
    return RouteDecision(best.node_id, Reason.LEAST_LOADED, best.node_id != local_id, match.depth,
                    best.relative_load)


def _keep_local(best: NodeLoad, local: NodeLoad, pool: list[NodeLoad],
                params: RoutingParams) -> NodeLoad:
    """The local node instead of `best` when it is in the pool and within forward_margin."""
    if local in pool and local.relative_load <= best.relative_load + params.forward_margin:
        return local
    return best


def _least_loaded(rows: list[NodeLoad], local_id: str) -> NodeLoad:
    return min(rows, key=lambda r: (r.relative_load, r.node_id != local_id, r.node_id))
