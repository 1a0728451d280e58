"""The link emulator's pure core: what happens to each packet, decided in virtual time.

`AccessLink` is one direction of one node's access line: a FIFO queue drained at the line's
rate, then a propagation delay with jitter, and loss; a packet that would queue longer than
`queue_s` is dropped (a full buffer). `Wan` routes packets between nodes by destination
address: a packet from A to B crosses A's uplink, then B's downlink, each admitted at the
virtual time it reaches that link, so a late wake-up of the I/O shell delays a delivery but
never shifts the schedule. Every decision draws from one seeded generator per link: the same
seed and the same arrivals give the same deliveries (tests run it without sockets or clocks).

Only IPv4 is routed, and only to the nodes' own addresses: anything else is dropped and
counted, so no packet can leave the box through the emulator.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from dataclasses import dataclass

from devnet.wan.profiles import LinkParams

MIN_IPV4_HEADER = 20


def ipv4_destination(packet: bytes) -> bytes | None:
    """The destination address of an IPv4 packet (4 bytes), None for anything else."""
    if len(packet) < MIN_IPV4_HEADER or packet[0] >> 4 != 4:
        return None
    return bytes(packet[16:20])


class AccessLink:
    """One direction of one access line (pure: times are passed in)."""

    def __init__(self, params: LinkParams, rng: random.Random) -> None:
        self.params = params
        self.rng = rng
        self.free_at = 0.0  # when the line finishes sending what it has queued
        self.last_exit = 0.0  # FIFO: no packet leaves before the one ahead of it
        self.dropped = Counter()
        self.passed = 0
        self.passed_bytes = 0

    def admit(self, now: float, size: int) -> float | None:
        """When a packet of `size` bytes reaching the line at `now` leaves its far end; None
        when it is lost or the queue is full."""
        p = self.params
        if p.perfect:
            self.passed += 1
            self.passed_bytes += size
            return now
        if p.loss and self.rng.random() < p.loss:
            self.dropped["loss"] += 1
            return None
        start = max(now, self.free_at)
        if start - now > p.queue_s:
            self.dropped["queue"] += 1
            return None
        sent = start + (size * 8 / p.rate_bps if p.rate_bps else 0.0)
        self.free_at = sent
        exit_at = max(sent + p.delay_s + (self.rng.uniform(0, p.jitter_s) if p.jitter_s else 0.0), self.last_exit)
        self.last_exit = exit_at
        self.passed += 1
        self.passed_bytes += size
        return exit_at

    def set_params(self, params: LinkParams) -> None:
        self.params = params


@dataclass
class Node:
    name: str
    address: bytes  # the node's public IPv4 address, 4 bytes
    up: AccessLink
    down: AccessLink


#: an event in flight: (due time, sequence number, stage, destination node, packet); stage 1:
#: it left the sender's uplink, stage 2: the receiver's downlink. Plain tuples: the heap
#: compares them per packet, and (time, sequence) is unique, so the rest is never compared.
_Event = tuple[float, int, int, str, bytes]


class Wan:
    """Packets in, deliveries out, in virtual time (the sans-I/O core of the emulator)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.nodes: dict[str, Node] = {}
        self.by_address: dict[bytes, str] = {}
        self._events: list[_Event] = []
        self._seq = itertools.count()
        self.dropped = Counter()
        self.delivered = 0

    def add_node(self, name: str, address: bytes, params: LinkParams) -> None:
        if name in self.nodes or address in self.by_address:
            raise ValueError(f"node {name!r} or its address is taken")
        rng = lambda direction: random.Random(f"{self.seed}/{name}/{direction}")  # noqa: E731
        self.nodes[name] = Node(name, address, AccessLink(params, rng("up")), AccessLink(params, rng("down")))
        self.by_address[address] = name

    def set_link(self, name: str, params: LinkParams) -> None:
        """Change one node's line from now on (the benchmark's loss levels)."""
        self.nodes[name].up.set_params(params)
        self.nodes[name].down.set_params(params)

    def send(self, now: float, src: str, packet: bytes) -> None:
        """Node `src` put `packet` on its line at `now`."""
        address = ipv4_destination(packet)
        dst = None if address is None else self.by_address.get(address)
        if dst is None:  # IPv6 (a device's router solicitations), or an address outside the box
            self.dropped["not_ipv4" if address is None else "no_route"] += 1
            return
        left = self.nodes[src].up.admit(now, len(packet))
        if left is None:
            self.dropped["uplink"] += 1
            return
        heapq.heappush(self._events, (left, next(self._seq), 1, dst, packet))

    def next_at(self) -> float | None:
        """When the next event is due (None: nothing in flight)."""
        return self._events[0][0] if self._events else None

    def advance(self, now: float) -> list[tuple[str, bytes, float]]:
        """Every (node, packet, due time) delivered by `now`, in delivery order."""
        out = []
        events = self._events
        while events and events[0][0] <= now:
            at, _, stage, dst, packet = heapq.heappop(events)
            if stage == 2:
                out.append((dst, packet, at))
                self.delivered += 1
                continue
            arrived = self.nodes[dst].down.admit(at, len(packet))
            if arrived is None:
                self.dropped["downlink"] += 1
                continue
            heapq.heappush(events, (arrived, next(self._seq), 2, dst, packet))
        return out

    def in_flight(self) -> int:
        return len(self._events)

    def stats(self) -> dict:
        return {"delivered": self.delivered, "in_flight": self.in_flight(), "dropped": dict(self.dropped),
                "nodes": {n.name: {"up": n.up.passed, "down": n.down.passed,
                                   "up_bytes": n.up.passed_bytes, "down_bytes": n.down.passed_bytes,
                                   "lost": n.up.dropped["loss"] + n.down.dropped["loss"],
                                   "queue_full": n.up.dropped["queue"] + n.down.dropped["queue"]}
                          for n in self.nodes.values()}}
