"""The Sentry: finds common system prompts and sets the group's chunk-length array L.

Paper Appendix A3. With S = s1 < s2 < ... < sn the lengths of the common system prompts,
    L = [s1, delta, s2 - s1 - delta, delta, ..., sn - s(n-1) - delta, delta]
and the rest of a prompt is cut into default-length chunks (`ChunkLayout`). Each system
prompt then ends exactly on a chunk boundary, so prompts that share one share a tree path.

Detection (per node). A node keeps the heads of its last `sentry_sample_size` user requests
(the ones that entered the group through it). When it seals its statistics it sorts them,
computes the longest common prefix (LCP) of neighbours and enumerates the LCP intervals: each
interval is a maximal group of sampled prompts sharing a prefix of exactly that length. Those
lengths, with an 8-byte fingerprint of the prefix and the group size, are the node's
statistics for the epoch (at most `sentry_max_entries`).

Agreement (per group). L of epoch e+1 must be the same on every node, without a leader:
1. Statistics are a state-based CRDT: one record per (node, epoch), merged by a total order
   (sealed beats unsealed, then more requests, then the smaller encoding), so any two nodes
   that received the same records hold the same set, whatever the order of arrival.
2. A node seals its record of epoch e when the group's request count for e (the sum of the
   records it holds) reaches `sentry_refresh_requests`; a sealed record never changes.
3. L(e+1) = a deterministic function of the sealed records of epoch e of the roster (the
   group's members from the verified directory): computed once every roster member's sealed
   record is in, or `sentry_seal_timeout_s` after our own seal with those that are in.
   Equal inputs give equal L on every node.
4. If inputs differed (a record missed the timeout somewhere), or a node joins or restarts
   late, it learns the group's layout from the layouts members advertise (`merge_layout`,
   one vote per member, the sender bound by the gossip signature). A node adopts a layout
   of an epoch no older than its own only when the group agrees on it: more than half of
   the group (roster and us) advertises it, or exactly half does and it wins the join on
   (epoch, smaller digest). One member alone never moves a group of three or more, and
   every advertised layout must have the shape `layout_from_records` gives (`check_layout`).
   A strict majority is unique and nodes only move up the join, so the group converges.

Everything a peer sends is bound to it by the caller (the gossip shell checks signatures;
`GroupRouting.merge_peer` refuses statistics labelled with another node), so a member speaks
only for its own statistics and casts one vote.

Version switch. A layout is identified by (epoch, digest). The caller builds a fresh `HRTree`
for a new layout and drops the old one: a tree never holds chunks cut by two layouts, and
`HRTree.merge_delta` refuses deltas of another layout, so lookups never mix versions. Own
cache knowledge is rebuilt as requests are served again; peers' arrives with their next delta.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections import deque
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.routing.chunking import ChunkLayout, LayoutError, as_token_array

_STATS_MAGIC = b"GTSS"
_STATS_HEAD = struct.Struct(">4sBB")  # magic, sealed flag, id length
_STATS_BODY = struct.Struct(">IIIH")  # epoch, requests, sampled, entry count
_ENTRY = struct.Struct(">I8sI")  # length, fingerprint, count
_MAX_EPOCH = 2**32 - 1  # a layout's epoch is a uint32 on the wire


class SentryError(ValueError):
    """Malformed or oversized Sentry statistics or layout; nothing was merged."""


@dataclass(frozen=True, order=True)
class PrefixStat:
    length: int
    fingerprint: bytes
    count: int


@dataclass(frozen=True)
class StatsRecord:
    """One node's Sentry statistics for one epoch."""

    node_id: str
    epoch: int
    requests: int  # user requests that entered the group through this node in the epoch
    sampled: int  # prompts in the sample the entries were computed from (0 until sealed)
    sealed: bool
    entries: tuple[PrefixStat, ...]

    def encode(self) -> bytes:
        nid = self.node_id.encode()
        out = bytearray(_STATS_HEAD.pack(_STATS_MAGIC, int(self.sealed), len(nid)) + nid)
        out += _STATS_BODY.pack(self.epoch, self.requests, self.sampled, len(self.entries))
        for e in self.entries:
            out += _ENTRY.pack(e.length, e.fingerprint, e.count)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes, params: RoutingParams = ROUTING) -> "StatsRecord":
        try:
            data = bytes(data)
            magic, sealed, id_len = _STATS_HEAD.unpack_from(data, 0)
            if magic != _STATS_MAGIC or sealed > 1:
                raise SentryError("not Sentry statistics")
            if not 1 <= id_len <= params.max_node_id_bytes:
                raise SentryError("bad node id length")
            pos = _STATS_HEAD.size
            node_id = data[pos:pos + id_len].decode("utf-8")
            if len(node_id.encode()) != id_len:
                raise SentryError("truncated node id")
            pos += id_len
            epoch, requests, sampled, n = _STATS_BODY.unpack_from(data, pos)
            pos += _STATS_BODY.size
            if n > params.sentry_max_entries:
                raise SentryError("too many Sentry entries")
            if len(data) != pos + n * _ENTRY.size:
                raise SentryError("Sentry statistics length mismatch")
            if sampled > params.sentry_sample_size or (not sealed and (n or sampled)):
                raise SentryError("inconsistent Sentry statistics")
            entries = []
            for i in range(n):
                length, fp, count = _ENTRY.unpack_from(data, pos + i * _ENTRY.size)
                if (not params.sentry_min_prefix_tokens <= length < params.sentry_max_prefix_tokens
                        or not 2 <= count <= sampled):  # what common_prefixes can report
                    raise SentryError("Sentry entry out of range")
                entries.append(PrefixStat(length, fp, count))
            if len({(e.length, e.fingerprint) for e in entries}) != n:
                raise SentryError("duplicate Sentry entry")
        except (struct.error, UnicodeDecodeError) as exc:
            raise SentryError(f"malformed Sentry statistics: {exc}") from exc
        return cls(node_id, epoch, requests, sampled, bool(sealed), tuple(entries))


def _better(a: StatsRecord, b: StatsRecord) -> StatsRecord:
    """The join of two records of one (node, epoch): a total order, so merge commutes."""
    ka, kb = (a.sealed, a.requests), (b.sealed, b.requests)
    if ka != kb:
        return a if ka > kb else b
    return a if a.encode() <= b.encode() else b


def fingerprint(head: bytes, length: int) -> bytes:
    """8-byte name of a prompt prefix (its first `length` tokens, big-endian uint32)."""
    return hashlib.blake2b(head[: 4 * length], digest_size=8).digest()


def common_prefixes(heads: list[bytes], params: RoutingParams = ROUTING) -> list[PrefixStat]:
    """Maximal groups of sampled prompts that share a prefix (the LCP-interval tree).

    `heads` are prompt heads as big-endian uint32 bytes, so byte order is token order.
    Lengths equal to the head cap are dropped: they say "at least this long", not where a
    system prompt ends."""
    heads = sorted(heads)
    n = len(heads)
    if n < 2:
        return []
    arrays = [np.frombuffer(h, dtype=">u4") for h in heads]
    lcp = [0] * (n + 1)  # lcp[i] between heads[i-1] and heads[i]; lcp[n] = 0 sentinel
    for i in range(1, n):
        a, b = arrays[i - 1], arrays[i]
        m = min(len(a), len(b))
        eq = a[:m] == b[:m]
        lcp[i] = m if bool(eq.all()) else int(np.argmin(eq))
    found: dict[tuple[int, bytes], int] = {}
    stack: list[list[int]] = [[0, 0]]  # [lcp value, left bound]
    for i in range(1, n + 1):
        lb = i - 1
        while stack[-1][0] > lcp[i]:
            value, left = stack.pop()
            count = i - left
            if params.sentry_min_prefix_tokens <= value < params.sentry_max_prefix_tokens:
                key = (value, fingerprint(heads[left], value))
                found[key] = max(found.get(key, 0), count)
            lb = left
        if stack[-1][0] < lcp[i]:
            stack.append([lcp[i], lb])
    stats = [PrefixStat(length, fp, count) for (length, fp), count in found.items()]
    stats.sort(key=lambda s: (-s.count, s.length, s.fingerprint))
    return stats[: params.sentry_max_entries]


def check_layout(data: bytes, params: RoutingParams = ROUTING) -> ChunkLayout:
    """Decode a layout a peer advertises and check that `layout_from_records` could have made it
    (Appendix A3's shape: [s1, d, s2 - s1 - d, d, ...] with d the separator, every system-prompt
    length s_i a detectable one, at most sentry_max_prompts of them, our default chunking).

    Anything else -- a first chunk no prompt fills, a stray separator, a foreign chunk
    length -- is refused with SentryError before it can reach a vote."""
    try:
        layout = ChunkLayout.decode(data)
    except (LayoutError, struct.error) as exc:
        raise SentryError(f"malformed chunk layout: {exc}") from exc
    if (layout.default_length, layout.max_depth) != (params.default_chunk_length, params.max_tree_depth):
        raise SentryError("layout uses other default chunk parameters")
    lengths, delta = layout.lengths, params.sentry_separator_tokens
    if len(lengths) % 2 or len(lengths) > 2 * params.sentry_max_prompts:
        raise SentryError("layout is not a list of (system prompt, separator) pairs")
    if any(sep != delta for sep in lengths[1::2]):
        raise SentryError(f"layout separators are not {delta} tokens")
    ends = np.cumsum(lengths[0::2]) + delta * np.arange(len(lengths) // 2)  # s_1 .. s_n
    if len(ends) and (ends[0] < params.sentry_min_prefix_tokens
                      or ends[-1] >= params.sentry_max_prefix_tokens):
        raise SentryError("layout's system-prompt lengths are outside what the Sentry detects")
    return layout


def layout_from_records(epoch: int, records: Iterable[StatsRecord],
                        params: RoutingParams = ROUTING) -> ChunkLayout:
    """L of `epoch` from the sealed records of epoch-1: the deterministic rule every node runs.

    A prefix counts only when at least `sentry_min_reporters` of the records (all of them, if
    fewer) report it: a member's record is its own word, so one member alone -- however many
    requests and samples it claims -- cannot put a system-prompt length into the group's L."""
    records = sorted(records, key=lambda r: r.node_id)
    total_sampled = sum(r.sampled for r in records)
    merged: dict[tuple[int, bytes], int] = {}
    reporters: dict[tuple[int, bytes], set[str]] = {}
    for r in records:
        for e in r.entries:
            key = (e.length, e.fingerprint)
            merged[key] = merged.get(key, 0) + e.count
            reporters.setdefault(key, set()).add(r.node_id)
    need = max(2, math.ceil(params.sentry_min_support * total_sampled))
    quorum = min(params.sentry_min_reporters, len(records))
    support: dict[int, int] = {}
    for (length, fp), count in merged.items():
        if count >= need and len(reporters[(length, fp)]) >= quorum:
            support[length] = max(support.get(length, 0), count)
    ranked = sorted(support, key=lambda s: (-support[s], s))[: params.sentry_max_prompts]
    delta = params.sentry_separator_tokens
    lengths: list[int] = []
    for s in sorted(ranked):
        if not lengths or s - lengths[-1] > delta:
            lengths.append(s)
    chunks: list[int] = []
    prev = 0
    for s in lengths:
        chunks.append(s - prev - (delta if prev else 0))
        chunks.append(delta)
        prev = s
    return ChunkLayout(epoch, tuple(chunks), params.default_chunk_length, params.max_tree_depth)


class Sentry:
    """One node's Sentry: sample, statistics, agreement and the active layout."""

    def __init__(self, node_id: str, params: RoutingParams = ROUTING,
                 layout: ChunkLayout | None = None) -> None:
        if not node_id or len(node_id.encode()) > params.max_node_id_bytes:
            raise ValueError("node id must be 1..max_node_id_bytes bytes")
        self.node_id = node_id
        self.params = params
        self.layout = layout or ChunkLayout.default(params)
        self._sample: deque[bytes] = deque(maxlen=params.sentry_sample_size)
        self._records: dict[tuple[str, int], StatsRecord] = {}
        self._own = StatsRecord(node_id, self.layout.epoch, 0, 0, False, ())
        self._sealed_at: float | None = None
        self._closed: StatsRecord | None = None  # our sealed record of the epoch before this one
        self._votes: dict[str, tuple[ChunkLayout, float]] = {}  # member -> layout it advertised, when

    # -- local input ----------------------------------------------------------------------

    def observe(self, token_ids) -> None:
        """A user request entered the group here (hops == 0): sample and count it."""
        tokens = as_token_array(token_ids)[: self.params.sentry_max_prefix_tokens]
        self._sample.append(tokens.astype(">u4").tobytes())
        if not self._own.sealed:
            o = self._own
            self._own = StatsRecord(o.node_id, o.epoch, min(o.requests + 1, 2**32 - 1), 0,
                                    False, ())

    # -- gossip ---------------------------------------------------------------------------

    def export_stats(self) -> bytes:
        """Our record of the current epoch -- or, until the new epoch has a request of ours,
        the sealed record of the epoch we just closed, so that members still waiting for it
        compute the same L instead of timing out (a member speaks only for its own record,
        so nobody else can deliver it for us)."""
        if self._closed is not None and self._own.requests == 0:
            return self._closed.encode()
        return self._own.encode()

    def merge_stats(self, data: bytes) -> bool:
        """Merge a peer's record; returns whether anything changed. Order-independent."""
        rec = StatsRecord.decode(data, self.params)
        if rec.node_id == self.node_id or rec.epoch < self.layout.epoch:
            return False
        if rec.epoch > self.layout.epoch + 1:
            return False  # too far ahead to be useful; its layout will reach us by gossip
        key = (rec.node_id, rec.epoch)
        old = self._records.get(key)
        if old is None and len(self._records) >= 2 * self.params.group_split_size:
            return False
        new = rec if old is None else _better(old, rec)
        self._records[key] = new
        return new is not old

    def export_layout(self) -> bytes:
        return self.layout.encode()

    def merge_layout(self, data: bytes, sender: str, roster: Iterable[str],
                     now: float) -> ChunkLayout | None:
        """`sender`'s advertised layout, counted as its vote; returns the layout this call
        switched to, if the group now agrees on one (agreement rule 4 above)."""
        layout = check_layout(data, self.params)
        roster = set(roster)
        if sender == self.node_id:
            raise SentryError("a layout vote in our own name")
        if sender not in self._votes and len(self._votes) >= 2 * self.params.group_split_size:
            self._votes = {k: v for k, v in self._votes.items() if k in roster}
            if len(self._votes) >= 2 * self.params.group_split_size:
                return None
        self._votes[sender] = (layout, now)
        return self._adopt_agreed(roster, now)

    def _adopt_agreed(self, roster: Iterable[str], now: float) -> ChunkLayout | None:
        """Switch to the layout the group agrees on, if it is not ours (rule 4)."""
        group = set(roster) | {self.node_id}
        horizon = now - self.params.peer_silence_s
        support: dict[tuple[int, bytes], int] = {}
        layouts: dict[tuple[int, bytes], ChunkLayout] = {}
        for member, (layout, heard_at) in self._votes.items():
            if member in group and member != self.node_id and heard_at >= horizon:
                support[layout.layout_id] = support.get(layout.layout_id, 0) + 1
                layouts[layout.layout_id] = layout
        mine = _rank(self.layout)
        agreed = [layouts[k] for k, votes in support.items()
                  if k[0] >= self.layout.epoch and k != self.layout.layout_id
                  and (2 * votes > len(group) or (2 * votes == len(group) and _rank(layouts[k]) > mine))]
        if not agreed:
            return None
        best = max(agreed, key=lambda l: (2 * support[l.layout_id] > len(group), _rank(l)))
        self._switch(best)
        return best

    # -- refresh --------------------------------------------------------------------------

    def group_requests(self) -> int:
        """Requests of the current epoch the group has seen, as far as we know."""
        e = self.layout.epoch
        return self._own.requests + sum(r.requests for (n, ep), r in self._records.items()
                                        if ep == e)

    def tick(self, roster: Iterable[str], now: float) -> ChunkLayout | None:
        """Seal and refresh when due, or join the layout the group agrees on. Returns the new
        layout when this call switched to one. Never raises on what peers sent: their input
        was checked when it was merged, and the last epoch there is simply stays."""
        roster = set(roster) | {self.node_id}
        agreed = self._adopt_agreed(roster, now)
        if agreed is not None:
            return agreed
        if not self._own.sealed and self.group_requests() >= self.params.sentry_refresh_requests:
            self._seal(now)
        e = self.layout.epoch
        if not self._own.sealed or e + 1 > _MAX_EPOCH:
            return None
        sealed = {n: r for (n, ep), r in self._records.items()
                  if ep == e and r.sealed and n in roster}
        sealed[self.node_id] = self._own
        complete = roster <= set(sealed)
        if not complete and now - (self._sealed_at or now) < self.params.sentry_seal_timeout_s:
            return None
        new = layout_from_records(e + 1, sealed.values(), self.params)
        self._switch(new)
        return new

    def _seal(self, now: float) -> None:
        heads = list(self._sample)
        entries = common_prefixes(heads, self.params)
        o = self._own
        self._own = StatsRecord(o.node_id, o.epoch, o.requests, len(heads), True, tuple(entries))
        self._sealed_at = now

    def _switch(self, layout: ChunkLayout) -> None:
        self._closed = self._own if self._own.sealed else None
        self.layout = layout
        self._own = StatsRecord(self.node_id, layout.epoch, 0, 0, False, ())
        self._sealed_at = None
        self._records = {k: r for k, r in self._records.items() if k[1] >= layout.epoch}

    def records(self) -> list[StatsRecord]:
        """Every record held (ours included), for tests and monitoring."""
        return sorted([*self._records.values(), self._own], key=lambda r: (r.epoch, r.node_id))


def _neg(digest: bytes) -> bytes:
    """Order-reversing map on digests, so the smaller digest compares as larger."""
    return bytes(255 - b for b in digest)


def _rank(layout: ChunkLayout) -> tuple[int, bytes]:
    """The join order on layouts: a higher epoch wins, then the smaller digest."""
    return (layout.epoch, _neg(layout.digest))
