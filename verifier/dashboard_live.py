"""The dashboard and /metrics of a running verifier: snapshots of a live `VerifierNode`.

`verifier.dashboard` renders; this module reads the node (its application's committed
/directory, its consensus status) into `DashboardData` and Prometheus gauges, and remembers
each model node's reputation as it changes so the page can draw it over epochs. Started by
`gt-verifier start --dashboard HOST:PORT`; read-only, so it serves no request that could
change state.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gentorrent.metrics import NodeMetrics
from verifier.dashboard import DashboardData, MemberRow, ModelRow, make_app, serve

MAX_HISTORY = 64  # reputation values kept per model node


class LiveDashboard:
    def __init__(self, node: Any) -> None:
        self.node = node
        self.metrics = NodeMetrics("verifier")
        self.history: dict[str, list[float]] = {}
        self._epochs_counted = 0
        self.runner = None
        self.port = 0

    async def start(self, listen: str) -> int:
        host, _, port = listen.rpartition(":")
        self.runner, self.port = await serve(make_app(self.snapshot, self.render_metrics), host, int(port))
        return self.port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def snapshot(self) -> DashboardData:
        from gentorrent.ledger.sections import decode_directory

        status = json.loads(self.node.status().json or "{}")
        q = self.node.app.query("/directory", b"", 0)
        directory = decode_directory(q.value) if q.code == 0 else None
        models = directory.models if directory else ()
        for m in models:
            seen = self.history.setdefault(m.node_id.hex(), [])
            if not seen or seen[-1] != m.reputation:
                seen.append(m.reputation)
                del seen[:-MAX_HISTORY]
        genesis = self.node.genesis
        members = tuple(MemberRow(v.node_id.hex(), v.address, v.power, i == self.node.me)
                        for i, v in enumerate(genesis.validators))
        rows = tuple(ModelRow(m.node_id.hex(), m.address, m.model, m.capacity, m.trusted,
                              tuple(self.history.get(m.node_id.hex(), ())))
                     for m in models)
        last_ms = status.get("last_commit_time_ms") or 0
        return DashboardData(
            chain_id=genesis.chain_id, height=int(status.get("height", 0)), app_hash=status.get("app_hash", ""),
            members=members, models=rows, users=len(directory.users) if directory else 0,
            last_epoch=self._last_epoch(),
            last_commit_age_s=round(time.time() - last_ms / 1000, 1) if last_ms else None,
        )

    def _last_epoch(self) -> dict:
        """The current epoch and the last closed one, from the committed epochs section."""
        from gentorrent.wire import gentorrent_pb2 as pb

        q = self.node.app.query("/epochs", b"", 0)
        if q.code != 0 or not q.value:
            return {}
        section = pb.EpochsSection()
        try:
            section.ParseFromString(q.value)
        except Exception:  # a malformed value is shown as nothing rather than breaking the page
            return {}
        summary: dict = {}
        if section.epoch:
            summary["current epoch"] = f"{section.epoch} ({section.current.phase or '–'})"
        if section.history:
            last = section.history[-1]
            summary.update({
                "last closed epoch": last.epoch, "result": last.phase, "leader": last.leader.hex()[:16],
                "faulty leader": last.faulty_leader, "closed at height": last.closed_height,
                "scores": ", ".join(f"{s.node_id.hex()[:8]}: {s.score_micros / 1e6:.3f}" for s in last.result),
            })
            if last.reason:
                summary["reason"] = last.reason
            self._count_epochs(section)
        return summary

    def _count_epochs(self, section) -> None:
        for summary in section.history:
            if summary.epoch > self._epochs_counted:
                self.metrics.epochs.labels(result=summary.phase or "unknown").inc()
                self._epochs_counted = summary.epoch

    def render_metrics(self) -> bytes:
        status = json.loads(self.node.status().json or "{}")
        self.metrics.consensus_height.set(status.get("height", 0))
        self.metrics.consensus_round.set(max(0, status.get("consensus", {}).get("round", 0) or 0))
        self._last_epoch()  # brings the epochs counter up to date
        for node_id, values in self.history.items():
            if values:
                self.metrics.reputation.labels(node=node_id[:16]).set(values[-1])
        return self.metrics.render()
