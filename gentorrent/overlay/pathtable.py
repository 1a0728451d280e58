"""The relay's path state: which link IDs it knows, where each leads, and why it dropped things.

A relay learns one `HopEntry` per proxy path through it when it peels an establishment onion
(ARCHITECTURE.md §3.2): the link ID on the predecessor side (`link_in`), the one on the successor side
(`link_out`), both neighbours and the symmetric hop key. After that, forwarding is a dictionary
lookup and one symmetric layer: no public-key work. The table is a pure data structure: time
is passed in, nothing here does I/O, so expiry and limits are tested without clocks.

Every refusal is a `Drop` with a stable reason word, counted in `DropCounter`, because a relay
that silently loses traffic cannot be debugged and one that crashes on bad input is a target.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from enum import Enum

from gentorrent.config import CLOVES, OVERLAY, OverlayParams


class DropReason(str, Enum):
    """Why a message was not relayed. The value is the word carried in `Ack.reason`."""

    UNKNOWN_LINK = "unknown_link"
    OVERSIZE = "oversize"
    REPLAY = "replay"
    BAD_ONION = "bad_onion"
    BAD_LAYER = "bad_layer"
    DUPLICATE_LINK = "duplicate_link"
    PEER_LIMIT = "peer_limit"
    TABLE_FULL = "table_full"
    UNKNOWN_PEER = "unknown_peer"
    UNKNOWN_DESTINATION = "unknown_destination"
    NEXT_HOP_UNREACHABLE = "next_hop_unreachable"
    NEXT_HOP_REFUSED = "next_hop_refused"
    BAD_INSTRUCTION = "bad_instruction"
    BAD_SEAL = "bad_seal"
    UNKNOWN_REQUEST = "unknown_request"
    LATE = "late"
    UNDECODABLE = "undecodable"
    BAD_QUERY = "bad_query"
    BAD_REPLY = "bad_reply"
    BAD_SIGNATURE = "bad_signature"
    BUSY = "busy"
    EXPIRED = "expired"
    NO_ANSWER = "no_answer"
    UNPROVEN_DELIVERY = "unproven_delivery"  # an ok Ack without the model node's delivery token


class Drop(ValueError):
    """A message refused for `reason`; the state it was checked against is unchanged."""

    def __init__(self, reason: DropReason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason


@dataclass
class DropCounter:
    """Counts of drops by reason: what `gt-user status` and the tests read."""

    counts: Counter = field(default_factory=Counter)

    def count(self, reason: DropReason) -> None:
        self.counts[reason.value] += 1

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))


@dataclass
class HopEntry:
    """One proxy path through this relay. `successor` None: this relay is the path's proxy."""

    link_in: bytes
    link_out: bytes
    predecessor: str
    successor: str | None
    hop_key: bytes
    created: float
    last_used: float
    forwarded: int = 0
    returned: int = 0

    @property
    def is_proxy(self) -> bool:
        return self.successor is None


class PathTable:
    """Link-ID tables of a relay, bounded in total and per predecessor, with idle expiry."""

    def __init__(self, params: OverlayParams = OVERLAY, idle_expiry_s: float | None = None) -> None:
        self.params = params
        self.idle_expiry_s = CLOVES.path_idle_expiry_s if idle_expiry_s is None else idle_expiry_s
        self._by_in: dict[bytes, HopEntry] = {}
        self._by_out: dict[bytes, HopEntry] = {}
        self._per_peer: Counter = Counter()

    def __len__(self) -> int:
        return len(self._by_in)

    def add(self, entry: HopEntry) -> None:
        """Remember a new path hop, or raise Drop (table unchanged)."""
        if entry.link_in in self._by_in or entry.link_out in self._by_out or entry.link_in == entry.link_out:
            raise Drop(DropReason.DUPLICATE_LINK)
        if len(self._by_in) >= self.params.max_paths:
            raise Drop(DropReason.TABLE_FULL)
        if self._per_peer[entry.predecessor] >= self.params.max_paths_per_peer:
            raise Drop(DropReason.PEER_LIMIT, entry.predecessor)
        self._by_in[entry.link_in] = entry
        self._by_out[entry.link_out] = entry
        self._per_peer[entry.predecessor] += 1

    def remove(self, entry: HopEntry) -> None:
        if self._by_in.get(entry.link_in) is not entry:
            return
        del self._by_in[entry.link_in]
        del self._by_out[entry.link_out]
        self._per_peer[entry.predecessor] -= 1
        if self._per_peer[entry.predecessor] <= 0:
            del self._per_peer[entry.predecessor]

    def forward_entry(self, link_id: bytes, now: float) -> HopEntry:
        """The entry a Forward on `link_id` (from the predecessor) belongs to."""
        return self._touch(self._by_in.get(link_id), now, forward=True)

    def return_entry(self, link_id: bytes, now: float) -> HopEntry:
        """The entry a Return on `link_id` (from the successor or model node) belongs to."""
        return self._touch(self._by_out.get(link_id), now, forward=False)

    def _touch(self, entry: HopEntry | None, now: float, forward: bool) -> HopEntry:
        if entry is None:
            raise Drop(DropReason.UNKNOWN_LINK)
        if now - entry.last_used > self.idle_expiry_s:
            self.remove(entry)
            raise Drop(DropReason.EXPIRED)
        entry.last_used = now
        if forward:
            entry.forwarded += 1
        else:
            entry.returned += 1
        return entry

    def expire(self, now: float) -> list[HopEntry]:
        """Forget paths idle for longer than the expiry; returns what was forgotten."""
        stale = [e for e in self._by_in.values() if now - e.last_used > self.idle_expiry_s]
        for entry in stale:
            self.remove(entry)
        return stale

    def stats(self) -> dict[str, int]:
        entries = list(self._by_in.values())
        return {
            "paths": len(entries),
            "as_proxy": sum(e.is_proxy for e in entries),
            "forwarded": sum(e.forwarded for e in entries),
            "returned": sum(e.returned for e in entries),
            "peers": len(self._per_peer),
        }


class ReplayFilter:
    """Remembers digests of the last `capacity` blobs; a blob seen again is a replay.

    Every legitimate blob carries fresh nonces, so an exact repeat on the same link is never
    honest traffic; replaying it would let an observer tag a path by watching the echo.
    """

    def __init__(self, capacity: int = OVERLAY.replay_window) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def check_and_add(self, link_id: bytes, payload: bytes) -> None:
        digest = hashlib.blake2b(link_id + b"|" + payload, digest_size=16).digest()
        if digest in self._seen:
            raise Drop(DropReason.REPLAY)
        self._seen[digest] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
