"""WAN profiles: what a node's access link is like, drawn per node from a seeded generator.

A packet from node A to node B crosses A's uplink and B's downlink (`links.Wan`), so each node
gets half of a pair's one-way delay: a profile that says "15-60 ms one way" draws every node's
own share from 7.5-30 ms, and any two nodes are then 15-60 ms apart one way. Loss is split the
same way: each crossing drops with 1 - sqrt(1 - loss), so a packet between two nodes is lost
with the profile's `loss`. Rate is per direction of each access link (a home line's 20 Mbit/s
up and down). Jitter delays a packet by up to `jitter_s` more on each crossing, without
reordering a link's packets (one access line is one queue).

The operator's seat (`OPERATOR`: `gt-devnet status`, `ask`, the health checks of `up`) and a
node started with a `local` link (the verifiers' shared reference engine, which a real
verifier would run beside itself) get perfect links: what they send is not what is measured.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class LinkParams:
    """One direction of one node's access link."""

    delay_s: float = 0.0  # fixed one-way propagation of this crossing
    jitter_s: float = 0.0  # up to this much more, uniformly, per packet (never reordering)
    loss: float = 0.0  # probability that a packet is dropped on this crossing
    rate_bps: float = 0.0  # serialisation rate, bits per second (0: unlimited)
    queue_s: float = 0.25  # a packet that would wait longer than this behind others is dropped

    def __post_init__(self) -> None:
        if not (0 <= self.delay_s <= 10 and 0 <= self.jitter_s <= 10 and 0 <= self.loss < 1
                and self.rate_bps >= 0 and self.queue_s > 0):
            raise ValueError(f"link parameters out of range: {self}")

    @property
    def perfect(self) -> bool:
        return not (self.delay_s or self.jitter_s or self.loss or self.rate_bps)


PERFECT = LinkParams()


def crossing_loss(loss: float) -> float:
    """Each of a packet's two crossings drops with this, so that a pair of nodes loses `loss`."""
    return 1 - math.sqrt(1 - loss)


@dataclass(frozen=True)
class WanProfile:
    """What `gt-devnet up --wan NAME` builds: the pair figures of the issue, and who is behind NAT."""

    name: str
    one_way_s: tuple[float, float]  # one-way delay between two nodes, drawn per node (half each)
    jitter_s: float  # per pair, split between the two crossings
    loss: float  # per packet between two nodes
    rate_bps: float  # each node's access link, each direction
    nat_users: float = 0.0  # share of user nodes behind NAT (at least one when > 0 and users > 1)
    nat_models: float = 0.0  # share of model nodes behind NAT
    description: str = ""

    def with_loss(self, loss: float) -> "WanProfile":
        return replace(self, loss=loss)

    def draw(self, rng: random.Random) -> LinkParams:
        """One node's access link (the same both ways)."""
        low, high = self.one_way_s
        return LinkParams(delay_s=rng.uniform(low, high) / 2, jitter_s=self.jitter_s / 2,
                          loss=crossing_loss(self.loss), rate_bps=self.rate_bps)

    def behind_nat(self, role: str, count: int) -> int:
        """How many of `count` nodes of `role` sit behind NAT (the rest have public addresses)."""
        share = {"user": self.nat_users, "model": self.nat_models}.get(role, 0.0)
        if share <= 0 or count <= 1:
            return 0
        return min(count - 1, max(1, round(share * count)))

    def describe(self) -> dict:
        return asdict(self)


MBIT = 1_000_000

PROFILES: dict[str, WanProfile] = {p.name: p for p in (
    WanProfile("home", (0.015, 0.060), 0.004, 0.005, 20 * MBIT, nat_users=0.25, nat_models=0.34,
               description="volunteers on home lines: 15-60 ms one way, 0.5 % loss, 20 Mbit/s, a quarter of "
                           "the users and a third of the model nodes behind NAT"),
    WanProfile("global", (0.040, 0.150), 0.010, 0.01, 20 * MBIT, nat_users=0.25, nat_models=0.34,
               description="across continents: 40-150 ms one way, 1 % loss, 20 Mbit/s"),
    # what make test runs: real delays, loss and NAT, short enough for the suite
    WanProfile("short", (0.004, 0.020), 0.002, 0.005, 20 * MBIT, nat_users=0.2, nat_models=0.0,
               description="make test's WAN: 4-20 ms one way, 0.5 % loss, 20 Mbit/s, a fifth of the users "
                           "behind NAT"),
    # the emulator's own floor: every link perfect, every packet still through the emulator
    WanProfile("zero", (0.0, 0.0), 0.0, 0.0, 0.0,
               description="perfect links through the emulator: its own cost"),
)}


def profile(name: str) -> WanProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown WAN profile {name!r}; one of {', '.join(PROFILES)}") from None
