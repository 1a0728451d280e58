"""The dashboard and /metrics of a running verifier: snapshots of a live `VerifierNode`.

`verifier.dashboard` renders; this module reads the node (its application's committed
its registry (a local query of its own state) and /epochs, its consensus status) into `DashboardData` and Prometheus gauges.
A background task follows the committed height and feeds `verifier.history` after every
commit, so reputation over epochs, each node's last answered challenge and the reputation
series in /metrics are recorded whether or not anyone loads the page; the history is saved
in the node's home and survives a restart. Started by `gt-verifier start --dashboard
HOST:PORT`; read-only, so it serves no request that could change state.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from gentorrent.crypto.keys import node_id_of
from gentorrent.ledger.sections import LOCAL_MODELS, decode_models
from gentorrent.metrics import serve_app
from gentorrent.wire import gentorrent_pb2 as pb
from verifier.consensus.home import DATA_DIR
from verifier.dashboard import DashboardData, MemberRow, ModelRow, make_app
from verifier.epochs.reputation import probation_left
from verifier.epochs.machine import state_of
from verifier.history import ClosedEpoch, ReputationHistory
from verifier.metrics import VerifierMetrics

log = logging.getLogger(__name__)

HISTORY_FILE = "dashboard_history.json"  # in the node's data directory
POLL_S = 0.5  # how often the recorder looks for a new committed height


class LiveDashboard:
    def __init__(self, node: Any, poll_s: float = POLL_S) -> None:
        self.node = node
        self.poll_s = poll_s
        self.metrics = VerifierMetrics()
        self.path = Path(node.home) / DATA_DIR / HISTORY_FILE
        self.history = self._load()
        self.runner = None
        self.port = 0
        self._task: asyncio.Task | None = None

    async def start(self, listen: str) -> int:
        self.record()
        self._task = asyncio.ensure_future(self._follow())
        host, _, port = listen.rpartition(":")
        self.runner, self.port = await serve_app(make_app(self.snapshot, self.render_metrics), host, int(port))
        return self.port

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.runner is not None:
            await self.runner.cleanup()

    # ------------------------------------------------------------------ recording

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                self.record()
            except Exception:  # a bad state read must not stop the recording for good
                log.exception("recording the reputation history failed")

    def record(self) -> None:
        """Feed the committed state at the node's height to the history (once per height)."""
        height = self.node.consensus.host.height
        if height <= self.history.height:
            return
        models, section = self._models(), self._epochs()
        new = self.history.observe(height, ((m.node_id.hex(), m.reputation) for m in models),
                                   [_closed(s) for s in (section.history if section else ())])
        for epoch in new:
            self.metrics.epochs.labels(result=epoch.phase or "unknown").inc()
        if section is not None:
            self.metrics.epoch.set(section.epoch)
        self.metrics.set_models((m.node_id.hex(), m.reputation, m.trusted) for m in models)
        if new or any(len(self.history.points.get(m.node_id.hex(), ())) == 1 for m in models):
            self._save()

    def _models(self) -> tuple:
        q = self.node.app.query(LOCAL_MODELS, b"", 0)
        return decode_models(q.value) if q.code == 0 else ()

    def _users(self) -> int:
        q = self.node.app.query("/info", b"", 0)
        return int(json.loads(q.value).get("users", 0)) if q.code == 0 else 0

    def _epochs(self) -> pb.EpochsSection | None:
        q = self.node.app.query("/epochs", b"", 0)
        if q.code != 0 or not q.value:
            return None
        section = pb.EpochsSection()
        try:
            section.ParseFromString(q.value)
        except Exception:  # a malformed value is shown as nothing rather than breaking the page
            return None
        return section

    def _load(self) -> ReputationHistory:
        try:
            return ReputationHistory.from_json(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return ReputationHistory()
        except (OSError, ValueError) as exc:
            log.warning("%s: %s; starting a new history", self.path, exc)
            return ReputationHistory()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.history.to_json()))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot save the reputation history to %s: %s", self.path, exc)

    # ------------------------------------------------------------------ views

    async def snapshot(self) -> DashboardData:
        status = json.loads(self.node.status().json or "{}")
        models, section = self._models(), self._epochs()
        genesis = self.node.genesis
        committee = status.get("committee") or self.node.consensus.committee_view()
        me = self.node.identity.public_key.hex()
        members = tuple(MemberRow(node_id_of(bytes.fromhex(m["public_key"])).hex(), m["address"], m["power"],
                                  m["public_key"] == me, m["name"]) for m in committee["members"])
        windows = {w.node_id: w for w in section.windows} if section else {}
        rows = tuple(ModelRow(m.node_id.hex(), m.address, m.model, m.capacity, m.trusted,
                              self.history.reputations(m.node_id.hex()),
                              answered=_answered(self.history, m.node_id.hex()),
                              probation=probation_left(state_of(windows[m.node_id])) if m.node_id in windows else 0)
                     for m in models)
        last_ms = status.get("last_commit_time_ms") or 0
        block = getattr(self.node.consensus.host, "last_block", None)
        return DashboardData(
            chain_id=genesis.chain_id, height=int(status.get("height", 0)), app_hash=status.get("app_hash", ""),
            members=members, models=rows, users=self._users(),
            last_epoch=_last_epoch(section),
            last_commit_age_s=round(time.time() - last_ms / 1000, 1) if last_ms else None,
            block_time_ms=block.header.time_ms if block is not None else 0,
            peers=(len(self.node.status().peers), max(0, len(members) - 1)),
            epoch=section.epoch if section else 0,
            epoch_phase=section.current.phase if section and section.epoch else "",
            removed=tuple(committee.get("removed", ())),
            halted=status.get("halted"),
        )

    def render_metrics(self) -> bytes:
        status = json.loads(self.node.status().json or "{}")
        block = getattr(self.node.consensus.host, "last_block", None)
        committee = status.get("committee") or {}
        self.metrics.set_committee(len(committee.get("members", ())), committee.get("removed", ()))
        return self.metrics.update_chain(int(status.get("height", 0)),
                                         int(status.get("consensus", {}).get("round", 0) or 0),
                                         block.header.time_ms if block is not None else 0,
                                         len(self.node.status().peers), halted=bool(status.get("halted")))


def _closed(summary: pb.EpochSummary) -> ClosedEpoch:
    return ClosedEpoch(summary.epoch, summary.phase,
                       tuple((s.node_id.hex(), s.score_micros / 1e6) for s in summary.result), summary.closed_height)


def _answered(history: ReputationHistory, node: str) -> dict | None:
    a = history.answered.get(node)
    return None if a is None else {"epoch": a.epoch, "score": a.score, "height": a.height}


def _last_epoch(section: pb.EpochsSection | None) -> dict:
    """The current epoch and the last closed one, from the committed epochs section."""
    if section is None:
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
    return summary
