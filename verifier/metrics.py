"""The verifier's Prometheus families (served at `gt-verifier start --dashboard`'s /metrics).

The chain (height, round, last block time, connected peers) is read at each scrape; epochs and
reputations are set as committed blocks close epochs (verifier.dashboard_live records them
whether or not anyone scrapes), so the reputation series exist from the first closed epoch on.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from gentorrent.metrics import RoleMetrics


class VerifierMetrics(RoleMetrics):
    role = "verifier"

    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.consensus_height = Gauge("gentorrent_consensus_height", "last committed height", registry=r)
        self.consensus_round = Gauge("gentorrent_consensus_round", "current round", registry=r)
        self.block_time = Gauge("gentorrent_block_time_seconds", "header time of the last committed block (unix)",
                                registry=r)
        self.peers = Gauge("gentorrent_peers", "committee members this one heard from lately", registry=r)
        self.halted = Gauge("gentorrent_consensus_halted", "1 when this member's consensus has halted (its log says "
                            "why; the process exits soon after, for its supervisor to restart it)", registry=r)
        self.epoch = Gauge("gentorrent_epoch", "current verification epoch", registry=r)
        self.epochs = Counter("gentorrent_epochs", "closed verification epochs by result", ["result"], registry=r)
        self.reputation = Gauge("gentorrent_reputation", "reputation of model nodes", ["node"], registry=r)
        self.trusted = Gauge("gentorrent_trusted", "1 if the committee trusts the model node", ["node"], registry=r)
        self.committee_members = Gauge("gentorrent_committee_members", "members of the committee signing the next "
                                       "block", registry=r)
        self.removed = Gauge("gentorrent_member_removed", "1 for each member removed from the committee, by name "
                             "and why (double-signed: proven by evidence in a block)", ["member", "reason"], registry=r)

    def set_committee(self, members: int, removed) -> None:
        """The committee's size and every removal (JSON rows of the node's committee view)."""
        self.committee_members.set(members)
        for r in removed:
            reason = "double-signed" if r["reason"].startswith("double-signed") else "committee change"
            self.removed.labels(member=r["name"], reason=reason).set(1)

    def update_chain(self, height: int, round_: int, block_time_ms: int, peers: int, halted: bool = False) -> bytes:
        self.halted.set(1 if halted else 0)
        self.consensus_height.set(height)
        self.consensus_round.set(max(0, round_))
        self.block_time.set(block_time_ms / 1000)
        self.peers.set(peers)
        return self.render()

    def set_models(self, models) -> None:
        """(node id hex, reputation, trusted) of every registered model node."""
        for node, reputation, trusted in models:
            self.reputation.labels(node=node[:16]).set(reputation)
            self.trusted.labels(node=node[:16]).set(1 if trusted else 0)
