"""Reputation over epochs and each model node's last answered challenge, from committed state (pure).

The committee's state holds each model node's current reputation and a bounded list of closed
epochs (ARCHITECTURE.md §3.5), not the reputation each node had after each epoch. A verifier's
dashboard draws that curve, so the verifier records it itself, as blocks commit, whether or
not anyone looks at the page (`verifier.dashboard_live` feeds this core after every commit and
saves it in the node's home). One point per node when it first appears and one per closed
epoch; the last answered challenge of a node is the last closed epoch that scored a reply of it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

MAX_POINTS = 64  # reputation values kept per model node
MAX_NODES = 1024  # model nodes remembered (those gone from the directory are dropped first)


@dataclass(frozen=True)
class Point:
    epoch: int  # the last closed epoch when this value held (0: before any)
    height: int
    reputation: float


@dataclass(frozen=True)
class Answered:
    """A challenge reply the committee scored (the median credibility of its members)."""

    epoch: int
    score: float
    height: int


@dataclass(frozen=True)
class ClosedEpoch:
    """What the history needs of one closed epoch (the committed EpochSummary)."""

    epoch: int
    phase: str  # done | aborted
    scores: tuple[tuple[str, float], ...]  # (model node id hex, credibility) of the scored replies
    closed_height: int


@dataclass
class ReputationHistory:
    points: dict[str, list[Point]] = field(default_factory=dict)
    answered: dict[str, Answered] = field(default_factory=dict)
    last_closed: int = 0
    height: int = 0
    max_points: int = MAX_POINTS

    def observe(self, height: int, reputations: Iterable[tuple[str, float]],
                closed: Sequence[ClosedEpoch]) -> list[ClosedEpoch]:
        """Take the committed state at `height`; returns the epochs that closed since the last call."""
        if height <= self.height:
            return []  # already seen (or a replay of an older state)
        self.height = height
        new = sorted((e for e in closed if e.epoch > self.last_closed), key=lambda e: e.epoch)
        for epoch in new:
            for node, score in epoch.scores:
                self.answered[node] = Answered(epoch.epoch, score, epoch.closed_height)
        if new:
            self.last_closed = new[-1].epoch
        current = dict(reputations)
        for node, value in current.items():
            seen = self.points.setdefault(node, [])
            if not seen or new:
                seen.append(Point(self.last_closed, height, value))
                del seen[:-self.max_points]
        self._forget_beyond(MAX_NODES, keep=set(current))
        return new

    def reputations(self, node: str) -> tuple[float, ...]:
        return tuple(p.reputation for p in self.points.get(node, ()))

    def _forget_beyond(self, limit: int, keep: set[str]) -> None:
        for node in [n for n in self.points if n not in keep][: max(0, len(self.points) - limit)]:
            self.points.pop(node, None)
            self.answered.pop(node, None)

    # ------------------------------------------------------------------ saved form

    def to_json(self) -> dict:
        return {"last_closed": self.last_closed, "height": self.height,
                "points": {n: [asdict(p) for p in ps] for n, ps in self.points.items()},
                "answered": {n: asdict(a) for n, a in self.answered.items()}}

    @classmethod
    def from_json(cls, doc: dict) -> "ReputationHistory":
        """The saved history; a malformed document raises ValueError (the caller starts afresh)."""
        try:
            return cls({n: [Point(int(p["epoch"]), int(p["height"]), float(p["reputation"])) for p in ps]
                        for n, ps in dict(doc["points"]).items()},
                       {n: Answered(int(a["epoch"]), float(a["score"]), int(a["height"]))
                        for n, a in dict(doc["answered"]).items()},
                       int(doc["last_closed"]), int(doc["height"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a reputation history: {exc}") from exc
