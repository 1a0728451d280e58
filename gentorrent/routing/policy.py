"""Where a model node sends a request: Algorithm 2 of the paper (load balancing on the HR-tree).

Relative load = (active requests + requests we forwarded since the last report) / capacity
score (1..10); a member is *under threshold* when its relative load is below
ROUTING.load_threshold. For a request that entered the group here (hops = 0), with H the live
holders of its deepest tree match (depth >= tau_c):

1. H is a small part of the group: the least loaded holder under threshold (Algorithm 2).
2. No match, or H has 2 members or more and at least ROUTING.shared_match_fraction of the
   group (a system prompt every member holds says nothing about where the rest of the
   prompt is cached): the request goes *home* -- the first member under threshold in the
   rendezvous order (highest random weight, capacity-weighted, fast engines first while
   lightly loaded: `_first_under`) of `HomeKeys.next`, its matched prefix plus the next chunk, among H if there is a match, else among all. Every
   node computes the same order from the same roster, so the requests of a new prefix
   family (a new tool document after a shared system prompt, the turns of one chat) meet on
   one member before any gossip tells who holds what; the paper's miss branch ("the least
   loaded member") sends each entry node's requests wherever its gossip view, up to 5 s
   old, says is least loaded, so a new prefix is prefilled on many members.
3. Every holder over threshold: the first member under threshold in the rendezvous order of
   `HomeKeys.matched`, so the overflow of a hot prefix lands on the same next members from
   every entry node.
4. Nobody under threshold: the least loaded live member.

ROUTING.homes = False restores the paper's branches (1, then 4). Ties go to the local node (a
forward costs a hop), then to the member with the most capacity, then to the smallest node
id, so every node decides the same way on the same view. Stale gossip makes every node see the
same "least loaded" peer (herding), so in steps 1 and 4 the local node keeps the request when
it is a candidate within ROUTING.forward_margin of the best.

A forwarded request (hops >= 1) is served where it lands -- unless that node, whose own load
is fresh, finds itself more than ROUTING.overload_margin above the least loaded member it
knows of; then it decides once more among the others, and the next node serves it whatever
its load (hops = ROUTING.max_hops). The forwarder's view of the target was up to a gossip
interval old; the target's view of itself is not. At most max_hops hops: no loops.

This module decides; it sends nothing. The caller (the model-node service) serves or forwards,
calls `NodeTable.note_forwarded(target)` and, for a forward, `HRTree.insert(tokens, target,
now)` so that the next similar requests follow before the target's own gossip arrives.
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.routing.hrtree import HomeKeys, NodeLoad, NodeTable, SearchResult


class Reason(enum.Enum):
    ALREADY_FORWARDED = "already_forwarded"  # forwarded here: serve (see the docstring)
    TREE_MATCH = "tree_match"  # a holder of the matched prefix under the load threshold
    HOME = "home"  # no holder under threshold: the rendezvous home of the request's prefix
    LEAST_LOADED = "least_loaded"  # nobody under threshold: the least loaded member


@dataclass(frozen=True)
class RouteDecision:
    node_id: str  # who serves
    reason: Reason
    forward: bool  # node_id != local node
    depth: int  # matched tree depth (0 when not searched)
    relative_load: float  # of the chosen node, as we believed it


def choose_node(local_id: str, match: SearchResult, table: NodeTable, *, hops: int,
                now: float, params: RoutingParams = ROUTING,
                homes: HomeKeys | None = None) -> RouteDecision:
    """Algorithm 2 with rendezvous homes (see the module docstring). `match` is
    `HRTree.search(prompt)`, `homes` its `HRTree.home_keys` (None: the paper's branches only);
    `table` must have a row for local_id."""
    if hops < 0:
        raise ValueError("hops must be >= 0")
    local = table.get(local_id)
    if local is None:
        raise ValueError("the node table has no row for the local node")
    live = {row.node_id: row for row in table.live(now, always=local_id)}
    if hops > 0:
        floor = min(row.relative_load for row in live.values())
        if hops >= params.max_hops or local.relative_load <= floor + params.overload_margin:
            return _decision(local, Reason.ALREADY_FORWARDED, local_id, match.depth)
        del live[local_id]  # overloaded: pass it on to one of the others
        if not live:
            return _decision(local, Reason.ALREADY_FORWARDED, local_id, match.depth)
    thr = params.load_threshold
    holders = [live[c] for c in match.candidates if c in live]
    under = [row for row in holders if row.relative_load < thr]
    homes = homes or HomeKeys(None, None)
    shared = len(holders) >= max(2, params.shared_match_fraction * len(live))
    if under and not (shared and homes.next is not None):
        best = _keep_local(_least_loaded(under, local_id), local, under, params)
        return _decision(best, Reason.TREE_MATCH, local_id, match.depth)
    if under or not holders:  # a match most members hold, or none: the prefix's home
        home = _first_under(homes.next, under or list(live.values()), params)
        if home is not None:
            return _decision(home, Reason.HOME, local_id, match.depth)
    else:  # every holder is busy: the overflow's home
        home = _first_under(homes.matched, list(live.values()), params)
        if home is not None:
            return _decision(home, Reason.HOME, local_id, match.depth)
    best = _least_loaded(list(live.values()), local_id)
    if local.relative_load < thr and local.node_id in live:
        best = _keep_local(best, local, list(live.values()), params)
    return _decision(best, Reason.LEAST_LOADED, local_id, match.depth)


def _first_under(key: bytes | None, rows: list[NodeLoad], params: RoutingParams) -> NodeLoad | None:
    """The home of `key` among `rows`: its first member by capacity**home_capacity_exponent
    while that member is lightly loaded (fast engines first: see config.py), else the first
    member under the load threshold by capacity (every member equally busy)."""
    if key is None or not rows:
        return None
    fast = rendezvous_order(key, rows, params.home_capacity_exponent)[0]
    if fast.relative_load < min(params.fast_home_load, params.load_threshold):
        return fast
    order = rendezvous_order(key, rows)
    return next((r for r in order if r.relative_load < params.load_threshold), None)


def rendezvous_order(key: bytes, rows, exponent: float = 1.0) -> list[NodeLoad]:
    """Members by weighted rendezvous score for `key` (Schindelhauer & Schomaker's
    logarithmic method): each gets -capacity**exponent / ln(u), u uniform in (0, 1) from a
    hash of (key, node id), highest first. A member's share of keys is proportional to its
    weight capacity**exponent, and a member joining or leaving moves only the keys it wins
    or held. Homes use ROUTING.home_capacity_exponent (config.py says why it is not 1)."""
    def score(row: NodeLoad) -> tuple[float, str]:
        h = hashlib.blake2b(key + row.node_id.encode(), digest_size=8, person=b"gt-rdv").digest()
        u = (int.from_bytes(h, "big") + 0.5) / 2**64
        return (-float(max(1, row.capacity)) ** exponent / math.log(u), row.node_id)
    return sorted(rows, key=score, reverse=True)


def _decision(row: NodeLoad, reason: Reason, local_id: str, depth: int) -> RouteDecision:
    return RouteDecision(row.node_id, reason, row.node_id != local_id, depth, row.relative_load)


def _keep_local(best: NodeLoad, local: NodeLoad, pool: list[NodeLoad],
                params: RoutingParams) -> NodeLoad:
    """The local node instead of `best` when it is in the pool and within forward_margin."""
    if local in pool and local.relative_load <= best.relative_load + params.forward_margin:
        return local
    return best


def _least_loaded(rows: list[NodeLoad], local_id: str) -> NodeLoad:
    return min(rows, key=lambda r: (r.relative_load, r.node_id != local_id, -r.capacity,
                                    r.node_id))
