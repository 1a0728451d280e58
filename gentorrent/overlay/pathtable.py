"""The relay's path state: which link IDs it knows, where each leads, and why it dropped things.

A relay learns one `HopEntry` per proxy path through it when it peels an establishment onion
(ARCHITECTURE.md §3.2): the link ID on the predecessor side (`link_in`), the one on the
successor side (`link_out`), both neighbours *as node ids* (the predecessor is the node whose
registered certificate authenticated the link the onion came on, never a claimed address)
and the per-hop keys. After that, forwarding is a dictionary lookup and one symmetric layer:
no public-key work. The table is a pure data structure: time is passed in, nothing here does
I/O, so expiry, limits and replay windows are tested without clocks.

Replay defences are per link, and checked only after authentication:

* forward cloves carry a per-path number under this hop's MAC (crypto.onion); `SeqWindow`
  (one per entry: the highest number seen and a bitmap of the ones below it) refuses a
  number seen before or older than the window, for the whole life of the path. Junk cannot
  flush it: junk fails the MAC before the window is consulted, and only the user can make
  a valid MAC. (The old single FIFO of 65,536 digests, filled before authentication, was
  flushed with junk in 7 s and then accepted a replay.)
* return cloves cannot be authenticated by an intermediate hop (it shares no key with the
  proxy); `RecentSet` per entry drops exact repeats, so a replay from one successor
  cannot flush another path's memory.
* establishment onions carry the user's clock (`issued_s`) under each hop's AEAD;
  `OnionReplayCache` refuses onions older than `onion_max_age_s` and remembers the
  ephemeral keys of the younger ones, so a captured onion cannot re-install its keys and
  link IDs once the path expired.

A proxy's entry also keeps `ReplyLinks`: the next few fresh reply link IDs the user may name in
a query (crypto.onion.reply_link), so the model node sees a new link ID per ask.

Every refusal is a `Drop` with a stable reason word, counted in `DropCounter`, because a relay
that silently loses traffic cannot be debugged and one that crashes on bad input is a target.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from enum import Enum

from gentorrent.config import CLOVES, OVERLAY, OverlayParams
from gentorrent.crypto import onion


class DropReason(str, Enum):
    """Why a message was not relayed. The value is the word counted and carried in hop-local acks."""

    UNKNOWN_LINK = "unknown_link"
    OVERSIZE = "oversize"
    REPLAY = "replay"
    STALE = "stale"  # an onion or a query older than its age limit
    BAD_ONION = "bad_onion"
    BAD_LAYER = "bad_layer"
    DUPLICATE_LINK = "duplicate_link"
    PEER_LIMIT = "peer_limit"
    TABLE_FULL = "table_full"
    UNKNOWN_PEER = "unknown_peer"
    UNAUTHENTICATED = "unauthenticated"  # a link whose caller proved no registered identity
    UNKNOWN_DESTINATION = "unknown_destination"
    NEXT_HOP_UNREACHABLE = "next_hop_unreachable"
    NEXT_HOP_REFUSED = "next_hop_refused"
    BAD_INSTRUCTION = "bad_instruction"
    BAD_SEAL = "bad_seal"
    UNKNOWN_REQUEST = "unknown_request"
    LATE = "late"
    UNDECODABLE = "undecodable"
    BAD_QUERY = "bad_query"
    TOO_MANY_ROUTES = "too_many_routes"
    BAD_REPLY = "bad_reply"
    BAD_SIGNATURE = "bad_signature"
    BUSY = "busy"
    EXPIRED = "expired"
    NO_ANSWER = "no_answer"
    UNPROVEN_DELIVERY = "unproven_delivery"  # the model node's reply never listed a clove's token
    QUEUE_FULL = "queue_full"
    PATH_CLOSED = "path_closed"  # a hop closed the path: its successor was gone (user_client.relay)


#: what a successor's ack says of a path that no longer goes on from there: it does not know
#: the link (it restarted, or forgot the path), the path idled out there, or the link to it died
PATH_GONE = frozenset({DropReason.UNKNOWN_LINK, DropReason.EXPIRED, DropReason.NEXT_HOP_UNREACHABLE})


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


# --------------------------------------------------------------------------- replay windows


class SeqWindow:
    """Clove numbers seen on one link: the highest, and a bitmap of the `size` below it."""

    __slots__ = ("size", "top", "bits")

    def __init__(self, size: int = OVERLAY.forward_replay_window) -> None:
        self.size = size
        self.top: int | None = None
        self.bits = 0  # bit i set: number top - i was seen

    def check_and_add(self, seq: int) -> None:
        """Record `seq`, or raise Drop(REPLAY) (window unchanged) if it was seen or is too old."""
        if self.top is None:
            self.top, self.bits = seq, 1
            return
        if seq > self.top:
            shift = seq - self.top
            self.bits = ((self.bits << shift) | 1) & ((1 << self.size) - 1) if shift < self.size else 1
            self.top = seq
            return
        age = self.top - seq
        if age >= self.size or self.bits >> age & 1:
            raise Drop(DropReason.REPLAY)
        self.bits |= 1 << age


class RecentSet:
    """The last `capacity` values seen on one link; a value seen again is a replay."""

    __slots__ = ("capacity", "_seen")

    def __init__(self, capacity: int = OVERLAY.return_replay_window) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def check_and_add(self, value: bytes) -> None:
        if value in self._seen:
            raise Drop(DropReason.REPLAY)
        self._seen[value] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)


class OnionReplayCache:
    """Ephemeral keys of establishment onions younger than `max_age_s`; older onions are stale."""

    def __init__(self, max_age_s: float = OVERLAY.onion_max_age_s, capacity: int = 2 * OVERLAY.max_paths) -> None:
        self.max_age_s = max_age_s
        self.capacity = capacity
        self._seen: OrderedDict[bytes, float] = OrderedDict()  # ephemeral key -> when it stops mattering

    def check_and_add(self, ephemeral: bytes, issued_s: float, now_s: float) -> None:
        """Record an onion made at `issued_s` (the user's clock), or raise Drop: STALE when it is
        further than max_age_s from `now_s` (either way), REPLAY when seen, BUSY when full."""
        if abs(now_s - issued_s) > self.max_age_s:
            raise Drop(DropReason.STALE, f"onion made {now_s - issued_s:.0f} s ago")
        while self._seen and next(iter(self._seen.values())) < now_s:
            self._seen.popitem(last=False)
        if ephemeral in self._seen:
            raise Drop(DropReason.REPLAY)
        if len(self._seen) >= self.capacity:
            raise Drop(DropReason.BUSY, "too many young onions")
        # refusing it after max_age_s is the age check's job from then on; entries expire in
        # insertion order give or take the clock skew, which only keeps some a little longer
        self._seen[ephemeral] = now_s + 2 * self.max_age_s


# --------------------------------------------------------------------------- entries


class ReplyLinks:
    """A proxy's window of fresh reply link IDs for one path: counters [low, low + size)."""

    __slots__ = ("keys", "size", "low", "ids")

    def __init__(self, keys: onion.HopKeys, size: int) -> None:
        self.keys, self.size, self.low = keys, size, 0
        self.ids: dict[bytes, int] = {}

    def fill(self) -> list[bytes]:
        """Compute the IDs of counters low .. low + size - 1 not held yet; returns the new ones."""
        held = set(self.ids.values())
        new = []
        for j in range(self.low, self.low + self.size):
            if j not in held:
                link = onion.reply_link(self.keys, j)
                self.ids[link] = j
                new.append(link)
        return new

    def slide(self, used: int) -> tuple[list[bytes], list[bytes]]:
        """Counter `used` was used: keep half a window behind it. Returns (dropped, added) IDs."""
        if used <= self.low + self.size // 2:
            return [], []
        self.low = used - self.size // 2
        dropped = [link for link, j in self.ids.items() if j < self.low]
        for link in dropped:
            del self.ids[link]
        return dropped, self.fill()


@dataclass
class HopEntry:
    """One proxy path through this relay. `successor` None: this relay is the path's proxy."""

    link_in: bytes
    link_out: bytes
    predecessor: str  # node id (hex) of the authenticated peer the onion came from
    successor: str | None  # node id (hex), None for the proxy
    hop_key: bytes
    created: float
    last_used: float
    forwarded: int = 0
    returned: int = 0
    keys: onion.HopKeys | None = None
    forward_window: SeqWindow = field(default_factory=SeqWindow)
    return_window: RecentSet = field(default_factory=RecentSet)
    reply: ReplyLinks | None = None
    linger_s: float = 0.0  # idle time allowed once a clove passed (its onion's; 0: the table's expiry)

    def __post_init__(self) -> None:
        if self.keys is None:
            self.keys = onion.hop_keys(self.hop_key)

    @property
    def is_proxy(self) -> bool:
        return self.successor is None


class PathTable:
    """Link-ID tables of a relay, bounded in total and per predecessor, with idle expiry."""

    def __init__(self, params: OverlayParams = OVERLAY, idle_expiry_s: float | None = None) -> None:
        self.params = params
        self.idle_expiry_s = CLOVES.path_idle_expiry_s if idle_expiry_s is None else idle_expiry_s
        self._by_in: dict[bytes, HopEntry] = {}
        self._by_out: dict[bytes, HopEntry] = {}  # successor side; a proxy's fresh reply links
        self._per_peer: Counter = Counter()

    def __len__(self) -> int:
        return len(self._by_in)

    def add(self, entry: HopEntry) -> None:
        """Remember a new path hop, or raise Drop (table unchanged)."""
        entry.forward_window = SeqWindow(self.params.forward_replay_window)
        entry.return_window = RecentSet(self.params.return_replay_window)
        outs = [entry.link_out]
        if entry.is_proxy:
            entry.reply = ReplyLinks(entry.keys, self.params.reply_link_window)
            outs = entry.reply.fill()
        if (entry.link_in in self._by_in or entry.link_in in outs or any(o in self._by_out for o in outs)
                or len(set(outs)) != len(outs)):
            raise Drop(DropReason.DUPLICATE_LINK)
        if len(self._by_in) >= self.params.max_paths:
            raise Drop(DropReason.TABLE_FULL)
        if self._per_peer[entry.predecessor] >= self.params.max_paths_per_peer:
            raise Drop(DropReason.PEER_LIMIT, entry.predecessor[:16])
        self._by_in[entry.link_in] = entry
        for out in outs:
            self._by_out[out] = entry
        self._per_peer[entry.predecessor] += 1

    def remove(self, entry: HopEntry) -> None:
        if self._by_in.get(entry.link_in) is not entry:
            return
        del self._by_in[entry.link_in]
        for out in (entry.reply.ids if entry.reply is not None else (entry.link_out,)):
            self._by_out.pop(out, None)
        self._per_peer[entry.predecessor] -= 1
        if self._per_peer[entry.predecessor] <= 0:
            del self._per_peer[entry.predecessor]

    def holds(self, entry: HopEntry) -> bool:
        return self._by_in.get(entry.link_in) is entry

    def forward_entry(self, link_id: bytes, peer: str, now: float) -> HopEntry:
        """The entry a forward clove on `link_id` from the authenticated `peer` belongs to. A
        link ID used by anyone but the path's predecessor is unknown (knowing it is not enough).
        Nothing is counted until the clove is authenticated (`used`): junk keeps no path alive."""
        entry = self._by_in.get(link_id)
        if entry is None or entry.predecessor != peer:
            raise Drop(DropReason.UNKNOWN_LINK)
        return self._alive(entry, now)

    def return_entry(self, link_id: bytes, peer: str, peer_is_model: bool, now: float) -> HopEntry:
        """The entry a return clove on `link_id` from the authenticated `peer` belongs to: from
        the path's successor, or for a proxy from a registered model node on one of its fresh
        reply links (which model node the user asked is the user's secret, not the proxy's)."""
        entry = self._by_out.get(link_id)
        if entry is None or (not peer_is_model if entry.is_proxy else entry.successor != peer or peer_is_model):
            raise Drop(DropReason.UNKNOWN_LINK)
        entry = self._alive(entry, now)
        if entry.reply is not None:
            dropped, added = entry.reply.slide(entry.reply.ids[link_id])
            for link in dropped:
                self._by_out.pop(link, None)
            for link in added:
                self._by_out[link] = entry
        return entry

    def idle_limit(self, entry: HopEntry) -> float:
        """How long `entry` may idle: the table's expiry, or, once the path has carried a clove,
        the shorter time its onion asked for (a single-use path whose ask is over). Only ever
        shorter: an onion cannot make a relay keep state longer than the relay allows."""
        if entry.linger_s and (entry.forwarded or entry.returned):
            return min(entry.linger_s, self.idle_expiry_s)
        return self.idle_expiry_s

    def _alive(self, entry: HopEntry, now: float) -> HopEntry:
        if now - entry.last_used > self.idle_limit(entry):
            self.remove(entry)
            raise Drop(DropReason.EXPIRED)
        return entry

    @staticmethod
    def used(entry: HopEntry, now: float, forward: bool) -> None:
        """Count a clove that passed every check (it also keeps the path from idling out)."""
        entry.last_used = now
        if forward:
            entry.forwarded += 1
        else:
            entry.returned += 1

    def expire(self, now: float) -> list[HopEntry]:
        """Forget paths idle for longer than the expiry; returns what was forgotten."""
        stale = [e for e in self._by_in.values() if now - e.last_used > self.idle_limit(e)]
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
