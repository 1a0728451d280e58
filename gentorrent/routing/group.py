"""One model node's view of its group: the routing cores wired together, still without I/O.

The HR-tree, the node table, the Sentry and Algorithm 2 are separate pure cores; a model node
needs them together, in one order, on two paths:
- a request arrives (`decide`): sample it for the Sentry if it entered the group here,
  refresh our own load row, search the tree, choose, and record the choice in the tree;
- a peer's gossip arrives (`merge_peer`) or a round is due (`outgoing`, `tick`).
Keeping that order here, with `now` passed in, lets the async shells (gossip.py and
model_node/forwarding.py) stay thin and lets tests drive a whole group deterministically.

What a member may say (ARCHITECTURE.md §3.4). The roster -- the group's members in the
committee's certified directory, each with its registered capacity score -- is passed in by
the shell, which has already checked the message's signature against the sender's registered
key. `merge_peer` then binds everything in the message to that sender: its subtree delta and
its Sentry statistics must be labelled with the sender's own id, its subtree version may not
run ahead of its signed clock by more than `gossip_max_skew_s` (so no accepted version can
keep the owner's later deltas out for longer than that), its layout is one vote that counts
only when the group agrees (`Sentry.merge_layout`), and routing uses the registered
capacity, never the one the sender claims. A member can thus only speak for itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.routing.chunking import LayoutError
from gentorrent.routing.hrtree import (DeltaError, HRTree, LayoutSwitchingTree, MergeOutcome,
                                       NodeTable)
from gentorrent.routing.policy import RouteDecision, Reason, choose_node
from gentorrent.routing.sentry import Sentry, SentryError, StatsRecord, check_layout


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
    """The decoded content of one peer's gossip message (its signature already checked)."""

    node_id: str
    sequence: int  # the sender's signed clock, ms since the epoch
    load: LocalLoad
    capacity: int  # what the sender claims; routing uses the registered capacity instead
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
    sentry_errors: int = 0  # Sentry refreshes that failed (the round went on without one)
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
        self.last_sentry_error = ""

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

    def merge_peer(self, report: PeerReport, now: float, roster: Mapping[str, int]) -> MergeOutcome:
        """Merge a verified peer's gossip. `roster`: the group's members (ourselves left out)
        with their registered capacity scores. Everything is decoded and checked first, so a
        bad message raises GossipRejected with no change of state."""
        self._check_report(report, roster)
        sender = report.node_id
        try:
            new_layout = self.sentry.merge_layout(report.layout, sender, roster, now)
        except SentryError as exc:  # checked above; kept so that no path merges half a message
            raise GossipRejected(str(exc)) from exc
        if new_layout is not None:
            self.trees.switch(new_layout, now)
        outcome = self.trees.merge_delta(report.tree_delta, now)
        ld = report.load
        self.table.update(sender, active=ld.active, queued=ld.queued, capacity=roster[sender],
                          now=now, latency_s=ld.latency_s, kv_usage=ld.kv_usage)
        self.trees.set_kv_capacity(sender, report.kv_capacity_tokens)
        if report.sentry_stats:
            self.sentry.merge_stats(report.sentry_stats)
        return outcome

    def _check_report(self, report: PeerReport, roster: Mapping[str, int]) -> None:
        """Raise GossipRejected unless every part of the message is well-formed and speaks only
        for its sender."""
        sender = report.node_id
        if sender == self.local_id:
            raise GossipRejected("gossip claims to come from this node")
        if sender not in roster:
            raise GossipRejected("sender is not in the group's roster")
        if not 1 <= roster[sender] <= 10:
            raise GossipRejected(f"registered capacity score {roster[sender]} is not 1..10")
        if not 1 <= report.capacity <= 10:
            raise GossipRejected(f"capacity score {report.capacity} is not 1..10")
        ld = report.load
        if ld.active < 0 or ld.queued < 0 or not 0.0 <= ld.kv_usage <= 1.0 or not ld.latency_s >= 0:
            raise GossipRejected("load figures out of range")
        if report.kv_capacity_tokens >= 2**40:
            raise GossipRejected("KV capacity out of range")
        try:
            check_layout(report.layout, self.params)
            stats = StatsRecord.decode(report.sentry_stats, self.params) if report.sentry_stats else None
            delta = self.trees.current.check_delta(report.tree_delta)
        except (LayoutError, SentryError, DeltaError) as exc:
            raise GossipRejected(str(exc)) from exc
        if stats is not None and stats.node_id != sender:
            raise GossipRejected(f"Sentry statistics labelled {stats.node_id[:16]}, not its sender")
        if delta.origin != sender:
            raise GossipRejected(f"subtree delta labelled {delta.origin[:16]}, not its sender")
        if delta.version > report.sequence + int(self.params.gossip_max_skew_s * 1000):
            raise GossipRejected("subtree version runs ahead of its sender's clock")
        origins = self.trees.current.origins()
        if sender not in origins and len(origins) >= self.params.group_split_size:
            raise GossipRejected("group full (group_split_size members)")

    def tick(self, roster: Mapping[str, int] | set[str], now: float) -> list[str]:
        """A gossip round: Sentry refresh, and drop members that left the roster or fell
        silent. Returns the dropped members. A Sentry refresh that fails is counted and
        skipped: the rest of the round (and the gossip after it) goes on."""
        try:
            new_layout = self.sentry.tick(roster, now)
        except (SentryError, LayoutError) as exc:
            self.counters.sentry_errors += 1
            self.last_sentry_error = str(exc)
            new_layout = None
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
            "sentry_errors": c.sentry_errors, "last_sentry_error": self.last_sentry_error,
            "forward_rate": round(c.forwarded / c.requests, 4) if c.requests else 0.0,
            "tree_hit_rate": round(c.tree_hits / c.requests, 4) if c.requests else 0.0,
            "decisions": dict(c.decisions),
            "layout_epoch": self.sentry.layout.epoch,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "members": sorted(r.node_id for r in self.table.live(float("-inf"))),
            "tree": {"origins": st.origins, "tree_nodes": st.tree_nodes,
                     "approx_bytes": st.approx_bytes, "max_bytes": st.max_bytes},
        }
