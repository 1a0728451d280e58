"""One model node's view of its group: the routing cores wired together, still without I/O.

The HR-tree, the node table, the Sentry and Algorithm 2 are separate pure cores; a model node
needs them together, in one order, on two paths:
- a request arrives (`decide`): sample it for the Sentry if it entered the group here,
  refresh our own load row, search the tree, choose, and record the choice in the tree;
- a peer's gossip arrives (`merge_peer`) or a round is due (`outgoing`, `tick`).
Keeping that order here, with `now` passed in, lets the async shells (gossip.py and
model_node/forwarding.py) stay thin and lets tests drive a whole group deterministically.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.routing.chunking import ChunkLayout, LayoutError
from gentorrent.routing.hrtree import HRTree, LayoutSwitchingTree, MergeOutcome, NodeTable
from gentorrent.routing.policy import RouteDecision, Reason, choose_node
from gentorrent.routing.sentry import Sentry, SentryError, StatsRecord


class GossipRejected(ValueError):
    """A peer's gossip that is malformed or inconsistent; nothing of it was merged."""


@dataclass(frozen=True)
class LocalLoad:
    """What the local engine reports (active includes queued requests, as in the paper)."""

    active: int
    queued: int = 0
    kv_usage: float = 0.0
    latency_s: float = 0.0


@dataclass(frozen=True)
class PeerReport:
    """The decoded content of one peer's gossip message."""

    node_id: str
    load: LocalLoad
    capacity: int
    kv_capacity_tokens: int
    tree_delta: bytes
    sentry_stats: bytes
    layout: bytes


@dataclass
class RoutingCounters:
    """Running totals behind the forward rate and the tree hit rate."""

    requests: int = 0  # decisions on requests that entered the group here (hops == 0)
    tree_hits: int = 0  # of those, a search with candidates (depth >= tau_c)
    forwarded: int = 0  # of those, sent to a peer
    served_for_peers: int = 0  # hops > 0: served here for a peer
    passed_on: int = 0  # hops > 0, but this node was overloaded: sent on to another peer
    fallbacks: int = 0  # a forward that failed before its first chunk, served here instead
    decisions: dict[str, int] = field(default_factory=dict)  # by Reason and forward/local


class GroupRouting:
    """The routing state of one model node: Sentry, layout-switching HR-tree, node table."""

    def __init__(self, local_id: str, capacity: int, kv_capacity_tokens: int, version_base: int,
                 params: RoutingParams = ROUTING) -> None:
        self.local_id = local_id
        self.capacity = capacity
        self.kv_capacity_tokens = kv_capacity_tokens
        self.params = params
        self.sentry = Sentry(local_id, params)
        self.trees = LayoutSwitchingTree(HRTree(local_id, self.sentry.layout, params,
                                                version_base=version_base))
        self.trees.set_kv_capacity(local_id, kv_capacity_tokens)
        self.table = NodeTable(params)
        self.table.update(local_id, active=0, capacity=capacity, now=0.0)
        self.counters = RoutingCounters()

    # -- requests -------------------------------------------------------------------------

    def decide(self, tokens, hops: int, now: float, load: LocalLoad) -> RouteDecision:
        """Where this request is served (Algorithm 2), recorded in the tree and counters."""
        if hops == 0:
            self.sentry.observe(tokens)
        self._update_local(load, now)
        match, homes = self.trees.search_with_homes(tokens, now)
        decision = choose_node(self.local_id, match, self.table, hops=hops, now=now,
                               params=self.params, homes=homes if self.params.homes else None)
        c = self.counters
        if hops == 0:
            c.requests += 1
            c.tree_hits += bool(match.candidates)
            c.forwarded += decision.forward
        elif decision.forward:
            c.passed_on += 1
        else:
            c.served_for_peers += 1
        key = f"{decision.reason.value}:{'forward' if decision.forward else 'local'}"
        c.decisions[key] = c.decisions.get(key, 0) + 1
        if decision.forward:
            self.table.note_forwarded(decision.node_id)
        self.trees.insert(tokens, decision.node_id, now)
        return decision

    def forward_failed(self, tokens, peer_id: str, now: float) -> RouteDecision:
        """The peer did not take the request: it is served here, and the tree says so."""
        self.counters.fallbacks += 1
        self.trees.insert(tokens, self.local_id, now)
        row = self.table.get(self.local_id)
        return RouteDecision(self.local_id, Reason.LEAST_LOADED, False, 0,
                        row.relative_load if row else 0.0)

    def _update_local(self, load: LocalLoad, now: float) -> None:
        self.table.update(self.local_id, active=load.active, queued=load.queued,
                          capacity=self.capacity, now=now, latency_s=load.latency_s,
                          kv_usage=min(1.0, max(0.0, load.kv_usage)))

    # -- gossip ---------------------------------------------------------------------------

    def outgoing_delta(self, peer_holds_version: int) -> bytes:
        return self.trees.export_delta(self.local_id, peer_holds_version)

    def holds_version(self, peer_id: str) -> int:
        return self.trees.version(peer_id)

    def merge_peer(self, report: PeerReport, now: float) -> MergeOutcome:
        """Merge a verified peer's gossip. Everything is decoded and checked first, so a bad
        message raises GossipRejected with no change of state."""
        if report.node_id == self.local_id:
            raise GossipRejected("gossip claims to come from this node")
        if not 1 <= report.capacity <= 10:
            raise GossipRejected(f"capacity score {report.capacity} is not 1..10")
        ld = report.load
        if ld.active < 0 or ld.queued < 0 or not 0.0 <= ld.kv_usage <= 1.0 or not ld.latency_s >= 0:
            raise GossipRejected("load figures out of range")
        if report.kv_capacity_tokens >= 2**40:
            raise GossipRejected("KV capacity out of range")
        try:
            ChunkLayout.decode(report.layout)
            if report.sentry_stats:
                StatsRecord.decode(report.sentry_stats, self.params)
            self.trees.current.check_delta(report.tree_delta)
        except (LayoutError, SentryError, ValueError) as exc:
            raise GossipRejected(str(exc)) from exc
        if report.node_id not in self.trees.current.origins() and \
                len(self.trees.current.origins()) >= self.params.group_split_size:
            raise GossipRejected("group full (group_split_size members)")
        try:
            new_layout = self.sentry.merge_layout(report.layout)
        except SentryError as exc:  # e.g. other default chunk parameters
            raise GossipRejected(str(exc)) from exc
        if new_layout is not None:
            self.trees.switch(new_layout, now)
        outcome = self.trees.merge_delta(report.tree_delta, now)
        self.table.update(report.node_id, active=ld.active, queued=ld.queued,
                          capacity=report.capacity, now=now, latency_s=ld.latency_s,
                          kv_usage=ld.kv_usage)
        self.trees.set_kv_capacity(report.node_id, report.kv_capacity_tokens)
        if report.sentry_stats:
            self.sentry.merge_stats(report.sentry_stats)
        return outcome

    def tick(self, roster: set[str], now: float) -> list[str]:
        """A gossip round: Sentry refresh, and drop members that left the roster or fell
        silent. Returns the dropped members."""
        new_layout = self.sentry.tick(roster, now)
        if new_layout is not None:
            self.trees.switch(new_layout, now)
        horizon = now - self.params.peer_silence_s
        known = set(self.trees.current.origins()) | {
            r.node_id for r in self.table.live(float("-inf"))}
        dropped = []
        for node_id in sorted(known - {self.local_id}):
            row = self.table.get(node_id)
            if node_id not in roster or row is None or row.updated_at < horizon:
                self.drop(node_id)
                dropped.append(node_id)
        return dropped

    def drop(self, node_id: str) -> None:
        if node_id != self.local_id:
            self.trees.remove_origin(node_id)
            self.table.remove(node_id)

    # -- reporting ------------------------------------------------------------------------

    def status(self) -> dict:
        c = self.counters
        st = self.trees.stats()
        return {
            "requests": c.requests, "forwarded": c.forwarded, "tree_hits": c.tree_hits,
            "served_for_peers": c.served_for_peers, "passed_on": c.passed_on,
            "fallbacks": c.fallbacks,
            "forward_rate": round(c.forwarded / c.requests, 4) if c.requests else 0.0,
            "tree_hit_rate": round(c.tree_hits / c.requests, 4) if c.requests else 0.0,
            "decisions": dict(c.decisions),
            "layout_epoch": self.sentry.layout.epoch,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "members": sorted(r.node_id for r in self.table.live(float("-inf"))),
            "tree": {"origins": st.origins, "tree_nodes": st.tree_nodes,
                     "approx_bytes": st.approx_bytes, "max_bytes": st.max_bytes},
        }
