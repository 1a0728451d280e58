"""How long a proxy holds what crosses it, so that no hop learns its position from timing (pure).

A hop that times a round trip through the rest of the path learns how many hops follow it: the
reply delay (forward clove to the first reply clove, less the generation time that a colluding
model node tells it), the establishment round trip (onion out, confirmation back), and with
synchronised clocks the one-way times to and from the model node. Each further hop adds a hop
latency d. The proxy, the one relay that knows where it is, therefore holds

* every clove it hands to a model node, for a fresh draw;
* every reply clove of one ask (one fresh reply link), for one draw made at its first clove, so
  that the answer keeps its pace and the later messages tell nothing the first did not;
* its establishment confirmation, for a fresh draw;

each draw uniform in [0, bound] from the OS's CSPRNG. Every round trip and one-way time a hop
can measure then crosses one hold of the proxy, so the positions differ by d inside a spread of
`bound`: one observation tells hop 1 from hop 2 with probability at most 1/2 + d / (2 bound)
(the uniform distribution is the one of bounded support that hides a shift best). What it costs:
the model node decodes a query at its k-th clove and the user a reply message at its k-th, each
the k-th of n holds: k/(n+1) of the bound on average, each way (measured in
bench/reply_timing.py --cover). `OverlayParams.position_cover_s` is the bound; 0 turns it off.

`ReplyHolds` remembers the hold of each reply link it has seen (bounded, forgotten once idle).
"""

from __future__ import annotations

import random
from collections import OrderedDict


class ReplyHolds:
    """The hold of each fresh reply link a proxy carries replies on."""

    __slots__ = ("bound_s", "idle_s", "max_links", "_rng", "_links")

    def __init__(self, bound_s: float, idle_s: float, max_links: int, rng: random.Random) -> None:
        if bound_s < 0 or idle_s <= 0 or max_links < 1:
            raise ValueError("a hold bound >= 0, a positive idle time and at least one link")
        self.bound_s = bound_s
        self.idle_s = idle_s
        self.max_links = max_links
        self._rng = rng
        self._links: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # link -> (hold, last seen)

    def fresh(self) -> float:
        """A hold of its own (a clove to a model node, a confirmation)."""
        return self._rng.uniform(0.0, self.bound_s) if self.bound_s else 0.0

    def reply(self, link_id: bytes, now: float) -> float:
        """The hold of every reply clove on `link_id`: drawn at its first, the same after."""
        self._forget(now)
        held = self._links.pop(link_id, None)
        hold = held[0] if held is not None else self.fresh()
        self._links[link_id] = (hold, now)
        while len(self._links) > self.max_links:  # the oldest first: a flood forgets, it never grows
            self._links.popitem(last=False)
        return hold

    def _forget(self, now: float) -> None:
        while self._links:
            link, (_, seen) = next(iter(self._links.items()))
            if now - seen < self.idle_s:
                return
            del self._links[link]

    def __len__(self) -> int:
        return len(self._links)
