"""Collecting the cloves of one S-IDA message until they decode (pure, bounded).

Both ends of the overlay need it: the model node's intake groups query cloves by the group
value found inside their seals, the user groups reply cloves by (request, chunk). A group is
decoded as soon as k cloves are in; a corrupted clove only delays decoding until the next one
arrives (sida.combine skips it). Bounds: at most `max_groups` open groups and `max_cloves`
per group; a group that never completes expires; cloves arriving after decoding are `late`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable

from gentorrent.crypto import sida
from gentorrent.overlay.pathtable import Drop, DropReason


@dataclass
class _Group:
    created: float
    cloves: list[bytes] = field(default_factory=list)


class CloveGroups:
    def __init__(self, k: int, max_groups: int, timeout_s: float, max_cloves: int = 16,
                 remember_done: int = 4096, n: int | None = None) -> None:
        self.k = k
        self.expect = (n, k) if n is not None else None  # cloves claiming other (n, k) are junk
        self.max_groups = max_groups
        self.timeout_s = timeout_s
        self.max_cloves = max_cloves
        self.remember_done = remember_done
        self._open: dict[Hashable, _Group] = {}
        self._done: OrderedDict[Hashable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def add(self, key: Hashable, clove: bytes, now: float) -> bytes | None:
        """Add a clove; returns the decoded message once k good cloves are in, else None.

        Raises Drop for a late, duplicate or excess clove, or when too many groups are open;
        after `max_cloves` cloves that still do not decode the group is dropped (undecodable).
        """
        if key in self._done:
            raise Drop(DropReason.LATE)
        group = self._open.get(key)
        if group is None:
            if len(self._open) >= self.max_groups:
                raise Drop(DropReason.BUSY, "too many undecoded messages")
            group = self._open[key] = _Group(now)
        if clove in group.cloves:
            raise Drop(DropReason.REPLAY)
        group.cloves.append(clove)
        if len(group.cloves) < self.k:
            return None
        try:
            message = sida.combine(group.cloves, expect=self.expect)
        except sida.CloveError as exc:
            if len(group.cloves) >= self.max_cloves:
                self.finish(key)
                raise Drop(DropReason.UNDECODABLE, str(exc)) from exc
            return None
        self.finish(key)
        return message

    def finish(self, key: Hashable) -> None:
        """Forget the cloves of `key` and treat later ones as late."""
        self._open.pop(key, None)
        self._done[key] = None
        if len(self._done) > self.remember_done:
            self._done.popitem(last=False)

    def discard(self, key: Hashable) -> None:
        """Forget `key` entirely (its request was abandoned)."""
        self._open.pop(key, None)
        self._done.pop(key, None)

    def expire(self, now: float) -> int:
        stale = [key for key, g in self._open.items() if now - g.created > self.timeout_s]
        for key in stale:
            self.finish(key)
        return len(stale)
