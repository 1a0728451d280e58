"""Collecting the cloves of one S-IDA message until they decode (pure, bounded).

Both ends of the overlay need it: the model node's intake groups query cloves by their ask
(`AskBook` below: found by envelope tag), the user groups reply cloves by (request, message). A group is
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


# --------------------------------------------------------------------------- the model node's asks


@dataclass
class Ask:
    """One ask as the model node knows it, from its first clove until its delivery grace ends."""

    secret: bytes
    n: int
    k: int
    tags: list[bytes]
    created: float
    received: set[int] = field(default_factory=set)  # clove indices in
    tokens: list[bytes] = field(default_factory=list)  # their delivery tokens, in arrival order
    decoded: bool = False
    last_reply_at: float | None = None  # when the final reply message left
    reported: int = 0  # delivery reports sent for cloves that came after it
    routes: list = field(default_factory=list)  # the query's reply routes, once decoded
    sealer: object | None = None  # its sealing.ReplySealer, once decoded


class AskBook:
    """The model node's table of asks in progress (pure; time passed in).

    An ask is found by the tag of any of its envelopes once one envelope's box was opened
    (gentorrent.overlay.sealing), so an ask costs one public-key operation however many cloves
    arrive. A secret is remembered for `seen_s` after its ask is forgotten: cloves replayed
    later are refused before anything is decoded or served again (and the query's own time
    refuses anything older). Bounded: at most `max_asks` asks in progress.
    """

    def __init__(self, max_asks: int, timeout_s: float, seen_s: float, grace_s: float) -> None:
        self.max_asks = max_asks
        self.timeout_s = timeout_s
        self.seen_s = seen_s
        self.grace_s = grace_s
        self._by_tag: dict[bytes, tuple[Ask, int]] = {}
        self._asks: dict[bytes, Ask] = {}
        self._seen: OrderedDict[bytes, float] = OrderedDict()  # secret -> forget after
        self._expired_at = float("-inf")

    def __len__(self) -> int:
        return len(self._asks)

    def lookup(self, tag: bytes) -> tuple[Ask, int] | None:
        return self._by_tag.get(tag)

    def add(self, secret: bytes, n: int, k: int, tags: list[bytes], now: float) -> Ask:
        """A new ask, or Drop: REPLAY (this secret was seen), BUSY (too many in progress)."""
        if now - self._expired_at >= min(1.0, self.grace_s) or len(self._asks) >= self.max_asks:
            self.expire(now)  # a scan of the table, at most about once a second
        if secret in self._asks or secret in self._seen:
            raise Drop(DropReason.REPLAY)
        if len(self._asks) >= self.max_asks:
            raise Drop(DropReason.BUSY, "too many asks in progress")
        ask = self._asks[secret] = Ask(secret, n, k, tags, now)
        for i, tag in enumerate(tags):
            self._by_tag[tag] = (ask, i)
        return ask

    def replied(self, ask: Ask, now: float) -> None:
        """The final reply message of `ask` left now: keep it `grace_s` for late cloves."""
        ask.last_reply_at = now

    def expire(self, now: float) -> None:
        self._expired_at = now
        for secret, ask in list(self._asks.items()):
            ended = ask.last_reply_at is not None and now - ask.last_reply_at > self.grace_s
            if ended or (ask.last_reply_at is None and not ask.decoded and now - ask.created > self.timeout_s):
                self._forget(ask, now)
        while self._seen and next(iter(self._seen.values())) < now:
            self._seen.popitem(last=False)

    def forget(self, ask: Ask, now: float) -> None:
        self._forget(ask, now)

    def _forget(self, ask: Ask, now: float) -> None:
        if self._asks.pop(ask.secret, None) is None:
            return
        for tag in ask.tags:
            self._by_tag.pop(tag, None)
        self._seen[ask.secret] = now + self.seen_s
