"""The Hash-Radix tree: one node's view of which group member holds which prompt prefix.

Paper §3.3, Fig. 7 and Algorithm 1. A prompt is cut by the group's `ChunkLayout` and each
chunk hashed to ROUTING.hash_bits bits; the tree is a trie over those hashes. Every tree node
lists the model nodes ("origins") that hold the KV cache of its prefix; their load, capacity
and latency live in a separate `NodeTable` (the paper's "separate table").

Ownership. Each origin's part of the tree (its *subtree*) has exactly one author:
- the local node's own subtree is written by `insert(tokens, local_id, now)` whenever the
  local engine serves a prompt; it is bounded by the engine's KV capacity in tokens
  (`set_kv_capacity`) with LRU eviction of leaves -- the same leaf-first LRU that vLLM's and
  SGLang's prefix caches apply, so the subtree follows what the engine keeps (approximately:
  the engine also evicts for running requests' memory, which the tree does not see);
- a peer's subtree is replaced wholesale by `merge_delta` of that peer's `export_delta`.
  A forwarder may also `insert(tokens, peer_id, now)` right after forwarding to that peer
  (optimistic, as SGLang's router does), so that follow-up requests inside the 5-s gossip
  window go to the same peer; the peer's next delta replaces the guess.

Deltas. `export_delta(origin, since_version)` is a canonical encoding of the origin's whole
subtree (preorder; per tree node: its parent's index and its hash, 3 bytes) tagged with the
origin's subtree version and the layout id, or a header-only "unchanged" record when nothing
changed since `since_version`. Merge keeps, per origin, the highest version seen (last writer
wins on a version that only the origin itself increments), so merging any set of deltas in any
order gives the same tree. Malformed input raises `DeltaError` before any state changes.

Layout switches. A tree holds chunks of one `ChunkLayout` only; `LayoutSwitchingTree` (what
the model-node service holds) keeps the previous tree for whole lookups until the new one has
heard from every peer or `layout_switch_grace_s` passed, and `relayout` rebuilds the local
subtree from the prompts it remembers (bounded by the KV capacity).

Memory. At most `group_split_size` origins, each at most `max_subtree_nodes` tree nodes
(and the local one at most its KV capacity in tokens): `stats()` reports the actual counts.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.routing.chunking import ChunkHasher, ChunkLayout, as_token_array

_DELTA_MAGIC = b"GTHT"
_DELTA_FORMAT = 1
_FLAG_UNCHANGED = 0x01
_HEADER = struct.Struct(">4sBBBB")  # magic, format, flags, hash bits, id length
_TRAILER = struct.Struct(">I8sQI")  # layout epoch, layout digest, version, node count
_APPROX_BYTES_PER_TREE_NODE = 240  # CPython: slotted object + children dict + holder set


class DeltaError(ValueError):
    """A subtree delta that is malformed, oversized or inconsistent; nothing was merged."""


class MergeOutcome(enum.Enum):
    APPLIED = "applied"  # the origin's subtree was replaced by the delta's
    STALE = "stale"  # we already hold this version or a newer one
    UNCHANGED = "unchanged"  # header-only delta: the sender has nothing new
    OTHER_LAYOUT = "other_layout"  # built under another chunk layout (Sentry epoch)
    SELF = "self"  # our own subtree comes back: ours is authoritative
    GROUP_FULL = "group_full"  # a new origin while group_split_size origins are known


class HomeKeys(NamedTuple):
    """`HRTree.home_keys`: 8-byte names of two prefixes of a prompt (None: too short)."""

    next: bytes | None  # the matched prefix plus the next chunk
    matched: bytes | None  # the matched prefix


def _prefix_key(hashes: np.ndarray, k: int) -> bytes:
    k = min(len(hashes), k)
    return hashlib.blake2b(np.asarray(hashes[:k], dtype=">u2").tobytes(), digest_size=8,
                           person=b"gt-home").digest()


class DeltaHeader(NamedTuple):
    """What a delta says about itself: whose subtree, under which layout, at which version.

    A gossip receiver checks these against the message's signer before merging anything
    (ARCHITECTURE.md §3.4: a member speaks only for its own subtree)."""

    origin: str
    layout_id: tuple[int, bytes]
    version: int
    unchanged: bool


class SearchResult(NamedTuple):
    """Algorithm 1's answer: the origins holding the deepest matched prefix, and its depth.

    `candidates` is empty when depth < tau_c (no match)."""

    candidates: tuple[str, ...]
    depth: int


@dataclass
class NodeLoad:
    """One row of the node table: what gossip says about a group member."""

    node_id: str
    active: int = 0  # running + queued requests (the paper's load metric)
    queued: int = 0
    capacity: int = 1  # hardware capacity score, 1..10
    latency_s: float = 0.0  # recent mean request latency reported by the node
    kv_usage: float = 0.0  # 0..1
    updated_at: float = 0.0
    pending_forwards: int = 0  # requests we sent it since its last report

    @property
    def relative_load(self) -> float:
        return (self.active + self.pending_forwards) / max(1, self.capacity)


class NodeTable:
    """Load, capacity and latency of every group member, refreshed by gossip."""

    def __init__(self, params: RoutingParams = ROUTING) -> None:
        self._params = params
        self._rows: dict[str, NodeLoad] = {}

    def update(self, node_id: str, *, active: int, capacity: int, now: float,
               queued: int = 0, latency_s: float = 0.0, kv_usage: float = 0.0) -> None:
        """A fresh load report (from gossip, or the local engine); clears pending forwards."""
        if not 1 <= capacity <= 10:
            raise ValueError(f"capacity score must be 1..10, not {capacity}")
        if active < 0 or queued < 0 or latency_s < 0 or not 0.0 <= kv_usage <= 1.0:
            raise ValueError("load figures must be non-negative (kv_usage in 0..1)")
        if node_id not in self._rows and len(self._rows) >= self._params.group_split_size:
            raise ValueError("node table full (group_split_size members)")
        self._rows[node_id] = NodeLoad(node_id, active, queued, capacity, latency_s,
                                       kv_usage, now, 0)

    def note_forwarded(self, node_id: str) -> None:
        """Count a request we just sent, so stale gossip does not make us herd onto one peer."""
        row = self._rows.get(node_id)
        if row is not None:
            row.pending_forwards += 1

    def remove(self, node_id: str) -> None:
        self._rows.pop(node_id, None)

    def get(self, node_id: str) -> NodeLoad | None:
        return self._rows.get(node_id)

    def live(self, now: float, always: str | None = None) -> list[NodeLoad]:
        """Members heard from within peer_silence_s (plus `always`, the local node)."""
        horizon = now - self._params.peer_silence_s
        return [r for r in self._rows.values() if r.updated_at >= horizon or r.node_id == always]

    def __len__(self) -> int:
        return len(self._rows)


class _TreeNode:
    __slots__ = ("hash", "parent", "children", "holders", "depth")

    def __init__(self, hash_: int, parent: "_TreeNode | None", depth: int) -> None:
        self.hash = hash_
        self.parent = parent
        self.children: dict[int, _TreeNode] = {}
        self.holders: set[str] = set()
        self.depth = depth


class _Origin:
    """Bookkeeping of one origin's subtree: LRU order (oldest first), size, version."""

    __slots__ = ("lru", "tokens", "version", "kv_capacity", "updated_at")

    def __init__(self, kv_capacity: int) -> None:
        self.lru: OrderedDict[_TreeNode, None] = OrderedDict()
        self.tokens = 0
        self.version = 0
        self.kv_capacity = kv_capacity
        self.updated_at = 0.0


@dataclass(frozen=True)
class TreeStats:
    origins: int
    tree_nodes: int
    held_entries: int  # (tree node, origin) pairs
    approx_bytes: int
    max_bytes: int  # the bound implied by the parameters
    per_origin_nodes: dict[str, int]
    per_origin_tokens: dict[str, int]


class HRTree:
    """The aggregated Hash-Radix tree of one node, under one chunk layout."""

    def __init__(self, local_id: str, layout: ChunkLayout, params: RoutingParams = ROUTING,
                 hasher: ChunkHasher | None = None, version_base: int = 0) -> None:
        """`version_base`: where the local subtree's version starts. A restarted node must
        start above what peers hold of it, or they would ignore its deltas as stale: the
        shell passes e.g. milliseconds since the epoch."""
        if not local_id or len(local_id.encode()) > params.max_node_id_bytes:
            raise ValueError("local node id must be 1..max_node_id_bytes bytes")
        self.local_id = local_id
        self.layout = layout
        self.params = params
        self.hasher = hasher or ChunkHasher(params.hash_bits, params.hash_seed)
        if self.hasher.bits != params.hash_bits:
            raise ValueError("hasher bits differ from params.hash_bits")
        self._root = _TreeNode(-1, None, 0)
        self._origins: dict[str, _Origin] = {}
        self._tree_nodes = 0
        self._prompts: OrderedDict[bytes, np.ndarray] = OrderedDict()  # local, oldest first
        self._prompt_tokens = 0
        if not 0 <= version_base < 2**63:
            raise ValueError("version_base out of range")
        self._origin_for_insert(local_id).version = version_base
        if params.max_subtree_nodes >= 2**16:
            raise ValueError("max_subtree_nodes must fit the delta's 16-bit parent index")
        self._chunk_table: np.ndarray | None = None
        self._record_dtype = np.dtype([("parent", ">u2"),
                                       ("hash", "u1" if params.hash_bits <= 8 else ">u2")])

    # -- Algorithm 1 ----------------------------------------------------------------------

    def chunk_hashes(self, token_ids) -> np.ndarray:
        return self.hasher.hash_chunks(token_ids, self.layout)

    def search(self, token_ids, tau_c: int | None = None) -> SearchResult:
        return self.search_hashes(self.chunk_hashes(token_ids), tau_c)

    def home_keys(self, hashes: np.ndarray, depth: int) -> "HomeKeys":
        """The keys a request is homed by (policy.py), from `chunk_hashes(prompt)` and the
        matched `depth`: `next`, its first max(tau_c, depth + 1) chunks -- the matched prefix
        and the first chunk after it -- and `matched`, its first max(tau_c, depth) chunks.
        None for a prompt shorter than tau_c chunks.

        A node that has seen less of a prefix family matches it less deeply, so it keys a
        request by a shorter prefix -- the one the family's first request was keyed by: every
        entry node sends a new family to the same member before gossip tells who holds it."""
        tau = self.params.match_depth_threshold
        if len(hashes) < tau:
            return HomeKeys(None, None)
        return HomeKeys(_prefix_key(hashes, max(tau, depth + 1)), _prefix_key(hashes, max(tau, depth)))

    def search_hashes(self, hashes: Iterable[int], tau_c: int | None = None) -> SearchResult:
        """Walk from the root while a child matches the next chunk hash (Algorithm 1).

        Unlike the pseudocode's early return (line 15), the tau_c test applies whether the
        walk stopped on a mismatch or ran out of chunks: a depth below tau_c is never a match.
        """
        tau = self.params.match_depth_threshold if tau_c is None else tau_c
        node = self._root
        for h in hashes:
            child = node.children.get(int(h))
            if child is None:
                break
            node = child
        if node.depth < tau or node is self._root:
            return SearchResult((), node.depth)
        return SearchResult(tuple(sorted(node.holders)), node.depth)

    # -- local updates --------------------------------------------------------------------

    def insert(self, token_ids, node_id: str, now: float) -> int:
        """Record that `node_id` holds the KV of this prompt; returns the depth recorded.

        For the local node the prompt's tokens are also kept (bounded by its KV capacity),
        so that `relayout` can rebuild the local subtree under a new chunk layout."""
        tokens = as_token_array(token_ids)
        depth = self.insert_hashes(self.hasher.hash_chunks(tokens, self.layout), node_id, now)
        if node_id == self.local_id:
            self._remember(tokens)
        return depth

    def relayout(self, layout: ChunkLayout, now: float) -> "HRTree":
        """A new tree under `layout` (a Sentry switch): the local subtree is rebuilt from the
        prompts it remembers, peers' subtrees arrive with their next deltas."""
        tree = HRTree(self.local_id, layout, self.params, self.hasher,
                      version_base=self.version(self.local_id) + 1)
        for node_id, origin in self._origins.items():
            tree.set_kv_capacity(node_id, origin.kv_capacity)
        for tokens in self._prompts.values():  # oldest first, so LRU order is kept
            tree.insert(tokens, self.local_id, now)
        return tree

    def _remember(self, tokens: np.ndarray) -> None:
        key = hashlib.blake2b(tokens.tobytes(), digest_size=16).digest()
        old = self._prompts.pop(key, None)
        if old is None:
            self._prompt_tokens += len(tokens)
        self._prompts[key] = tokens.astype(np.uint32)
        budget = self._origins[self.local_id].kv_capacity
        while self._prompt_tokens > budget and self._prompts:
            _, dropped = self._prompts.popitem(last=False)
            self._prompt_tokens -= len(dropped)

    def insert_hashes(self, hashes: Iterable[int], node_id: str, now: float) -> int:
        origin = self._origin_for_insert(node_id)
        path: list[_TreeNode] = []
        node = self._root
        for h in hashes:
            h = int(h)
            child = node.children.get(h)
            if child is None:
                child = _TreeNode(h, node, node.depth + 1)
                node.children[h] = child
                self._tree_nodes += 1
            node = child
            path.append(node)
        changed = False
        for node in reversed(path):  # leaf first, so every ancestor ends up more recent
            if node_id not in node.holders:
                node.holders.add(node_id)
                origin.tokens += self.layout.chunk_length_at(node.depth)
                changed = True
            origin.lru[node] = None
            origin.lru.move_to_end(node)
        if changed and node_id == self.local_id:
            origin.version += 1
        origin.updated_at = now
        self._evict(node_id, origin)
        return len(path)

    def set_kv_capacity(self, node_id: str, tokens: int) -> None:
        """The KV budget (tokens) that bounds `node_id`'s subtree under local inserts."""
        if tokens < 0:
            raise ValueError("KV capacity must be non-negative")
        origin = self._origin_for_insert(node_id)
        origin.kv_capacity = tokens
        self._evict(node_id, origin)

    def remove_origin(self, node_id: str) -> None:
        """Forget a member (silent, untrusted or gone): its subtree leaves the tree."""
        origin = self._origins.pop(node_id, None)
        if origin is not None:
            for node in list(origin.lru):
                self._drop_holder(node, node_id)

    def version(self, node_id: str) -> int:
        origin = self._origins.get(node_id)
        return origin.version if origin else 0

    def _origin_for_insert(self, node_id: str) -> _Origin:
        origin = self._origins.get(node_id)
        if origin is None:
            if not node_id or len(node_id.encode()) > self.params.max_node_id_bytes:
                raise ValueError("node id must be 1..max_node_id_bytes bytes")
            if len(self._origins) >= self.params.group_split_size:
                raise ValueError("tree full: group_split_size origins known")
            origin = _Origin(self.params.default_kv_capacity_tokens)
            self._origins[node_id] = origin
        return origin

    def _evict(self, node_id: str, origin: _Origin) -> None:
        """Drop least recently used leaves until the subtree fits its KV and node budgets."""
        evicted = False
        while origin.lru and (origin.tokens > origin.kv_capacity
                              or len(origin.lru) > self.params.max_subtree_nodes):
            node, _ = origin.lru.popitem(last=False)
            origin.tokens -= self.layout.chunk_length_at(node.depth)
            self._drop_holder(node, node_id)
            evicted = True
        if evicted and node_id == self.local_id:
            origin.version += 1

    def _drop_holder(self, node: _TreeNode, node_id: str) -> None:
        node.holders.discard(node_id)
        while node is not self._root and not node.holders and not node.children:
            parent = node.parent
            del parent.children[node.hash]
            self._tree_nodes -= 1
            node = parent

    # -- deltas ---------------------------------------------------------------------------

    def export_delta(self, node_id: str, since_version: int) -> bytes:
        """Compact, canonical encoding of `node_id`'s subtree (normally our own).

        Header-only ("unchanged") if the receiver already has `since_version` >= our
        version; otherwise the whole subtree in preorder, children in hash order, one
        record per tree node: (parent's preorder index + 1: uint16, hash: 1 or 2 bytes), so
        3 bytes per tree node with 8-bit hashes and at most max_subtree_nodes records."""
        origin = self._origins.get(node_id)
        version = origin.version if origin else 0
        id_bytes = node_id.encode()
        if not id_bytes or len(id_bytes) > self.params.max_node_id_bytes:
            raise ValueError("node id must be 1..max_node_id_bytes bytes")
        unchanged = since_version >= version
        head = _HEADER.pack(_DELTA_MAGIC, _DELTA_FORMAT, _FLAG_UNCHANGED if unchanged else 0,
                            self.params.hash_bits, len(id_bytes)) + id_bytes
        if unchanged or origin is None:
            return head + _TRAILER.pack(self.layout.epoch, self.layout.digest, version, 0)
        parents: list[int] = []
        hashes: list[int] = []
        stack: list[tuple[_TreeNode, int]] = [(self._root, 0)]
        while stack:  # preorder: a parent always precedes its children
            node, parent_plus_one = stack.pop()
            if node is not self._root:
                parents.append(parent_plus_one)
                hashes.append(node.hash)
                parent_plus_one = len(parents)
            kids = sorted((c for c in node.children.values() if node_id in c.holders),
                          key=lambda c: c.hash, reverse=True)
            stack.extend((k, parent_plus_one) for k in kids)
        records = np.empty(len(parents), dtype=self._record_dtype)
        records["parent"] = parents
        records["hash"] = hashes
        return (head + _TRAILER.pack(self.layout.epoch, self.layout.digest, version,
                                     len(parents)) + records.tobytes())

    def check_delta(self, data: bytes) -> DeltaHeader:
        """Raise DeltaError unless `data` is a well-formed delta, else return its header;
        changes nothing. Lets a caller validate a whole gossip message (and bind the delta to
        its signer) before merging any part of it."""
        parsed = self._parse_delta(data)
        return DeltaHeader(parsed.origin_id, (parsed.epoch, parsed.digest), parsed.version, parsed.unchanged)

    def merge_delta(self, data: bytes, now: float = 0.0) -> MergeOutcome:
        """Merge a peer's delta: replace its subtree if the delta is newer. Order-independent."""
        parsed = self._parse_delta(data)
        origin_id, epoch, digest, version, unchanged = parsed[:5]
        if (epoch, digest) != self.layout.layout_id:
            return MergeOutcome.OTHER_LAYOUT
        if origin_id == self.local_id:
            return MergeOutcome.SELF
        known = self._origins.get(origin_id)
        if unchanged:
            return MergeOutcome.UNCHANGED
        if known is not None and version <= known.version:
            return MergeOutcome.STALE
        if known is None and len(self._origins) >= self.params.group_split_size:
            return MergeOutcome.GROUP_FULL
        self._replace_subtree(origin_id, version, parsed, now)
        return MergeOutcome.APPLIED

    def _replace_subtree(self, origin_id: str, version: int, parsed: "_ParsedDelta",
                         now: float) -> None:
        """Make the origin hold exactly the delta's nodes, reusing tree nodes already there."""
        old = self._origins.get(origin_id)
        origin = _Origin(old.kv_capacity if old else self.params.default_kv_capacity_tokens)
        origin.version = version
        origin.updated_at = now
        placed: list[_TreeNode] = []
        root, add = self._root, placed.append
        for parent_plus_one, h in zip(parsed.parents, parsed.hashes):
            parent = placed[parent_plus_one - 1] if parent_plus_one else root
            child = parent.children.get(h)
            if child is None:
                child = _TreeNode(h, parent, parent.depth + 1)
                parent.children[h] = child
                self._tree_nodes += 1
            child.holders.add(origin_id)
            add(child)
        if len(parsed.depths):
            origin.tokens = int(self._chunk_lengths()[parsed.depths].sum())
        origin.lru = OrderedDict.fromkeys(reversed(placed))  # leaves before ancestors
        self._origins[origin_id] = origin
        if old is not None:
            keep = origin.lru
            for node in old.lru:
                if node not in keep:
                    self._drop_holder(node, origin_id)

    def _chunk_lengths(self) -> np.ndarray:
        """Tokens of the chunk at each depth 0..max_depth (index 0 unused)."""
        if self._chunk_table is None:
            self._chunk_table = np.array(
                [0] + [self.layout.chunk_length_at(d) for d in range(1, self.layout.max_depth + 1)],
                dtype=np.int64)
        return self._chunk_table

    def _parse_delta(self, data: bytes) -> "_ParsedDelta":
        """Decode and fully validate a delta; no side effects. Parsing is memoised across
        trees (a model node checks each delta before it merges it; a simulator merges one
        delta into many trees): equal bytes under equal bounds parse to the same result."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DeltaError("delta must be bytes")
        p = self.params
        return _parse_delta(bytes(data), p.hash_bits, p.max_node_id_bytes, p.max_subtree_nodes,
                            self.layout.max_depth)

    # -- reporting ------------------------------------------------------------------------

    def stats(self) -> TreeStats:
        held = sum(len(o.lru) for o in self._origins.values())
        bound = (self.params.group_split_size * self.params.max_subtree_nodes
                 * _APPROX_BYTES_PER_TREE_NODE)
        return TreeStats(
            origins=len(self._origins),
            tree_nodes=self._tree_nodes,
            held_entries=held,
            approx_bytes=(self._tree_nodes * _APPROX_BYTES_PER_TREE_NODE + held * 16
                          + 4 * self._prompt_tokens),
            max_bytes=bound,
            per_origin_nodes={k: len(o.lru) for k, o in self._origins.items()},
            per_origin_tokens={k: o.tokens for k, o in self._origins.items()},
        )

    def origins(self) -> list[str]:
        return sorted(self._origins)

    def subtree_paths(self, node_id: str) -> set[tuple[int, ...]]:
        """Every hash path `node_id` holds (for tests and debugging; O(subtree))."""
        origin = self._origins.get(node_id)
        if origin is None:
            return set()
        out = set()
        for node in origin.lru:
            path = []
            n = node
            while n is not self._root:
                path.append(n.hash)
                n = n.parent
            out.add(tuple(reversed(path)))
        return out


class _ParsedDelta(NamedTuple):
    origin_id: str
    epoch: int
    digest: bytes
    version: int
    unchanged: bool
    parents: tuple[int, ...]  # per record in preorder: parent's index + 1 (0: the root)
    hashes: tuple[int, ...]
    depths: np.ndarray  # per record, 1 for the root's children


@functools.lru_cache(maxsize=8)
def _parse_delta(data: bytes, hash_bits: int, max_id_bytes: int, max_nodes: int,
                 max_depth: int) -> _ParsedDelta:
    """`HRTree._parse_delta`: decode and validate, or raise DeltaError."""
    if len(data) < _HEADER.size + 1 + _TRAILER.size:
        raise DeltaError("delta too short")
    magic, fmt, flags, bits, id_len = _HEADER.unpack_from(data, 0)
    if magic != _DELTA_MAGIC or fmt != _DELTA_FORMAT:
        raise DeltaError("not an HR-tree delta of a known format")
    if flags & ~_FLAG_UNCHANGED:
        raise DeltaError("unknown delta flags")
    if bits != hash_bits:
        raise DeltaError(f"delta uses {bits}-bit hashes, we use {hash_bits}")
    if not 1 <= id_len <= max_id_bytes:
        raise DeltaError("bad origin id length")
    pos = _HEADER.size
    if len(data) < pos + id_len + _TRAILER.size:
        raise DeltaError("delta truncated")
    try:
        origin_id = data[pos:pos + id_len].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DeltaError("origin id is not UTF-8") from exc
    pos += id_len
    epoch, digest, version, count = _TRAILER.unpack_from(data, pos)
    pos += _TRAILER.size
    if flags & _FLAG_UNCHANGED:
        if count != 0 or pos != len(data):
            raise DeltaError("an unchanged delta carries no tree nodes")
        return _ParsedDelta(origin_id, epoch, digest, version, True, (), (), np.zeros(0, np.int64))
    if count > max_nodes:
        raise DeltaError(f"{count} tree nodes exceeds max_subtree_nodes")
    if version == 0:
        raise DeltaError("a subtree delta has version >= 1")
    dtype = np.dtype([("parent", ">u2"), ("hash", "u1" if hash_bits <= 8 else ">u2")])
    if len(data) - pos != count * dtype.itemsize:
        raise DeltaError("delta body size does not match its node count")
    records = np.frombuffer(data, dtype=dtype, count=count, offset=pos)
    depths = _check_records(records, hash_bits, max_depth)
    return _ParsedDelta(origin_id, epoch, digest, version, False,
                        tuple(records["parent"].tolist()), tuple(records["hash"].tolist()), depths)


def _check_records(records: np.ndarray, hash_bits: int, max_depth: int) -> np.ndarray:
    """Vectorised structure checks (a forest in preorder, unique siblings, bounded depth);
    returns every record's depth."""
    n = len(records)
    if n == 0:
        return np.zeros(0, np.int64)
    parent = records["parent"].astype(np.int64) - 1  # -1 is the root
    hashes = records["hash"].astype(np.int64)
    if int(hashes.max()) >= 1 << hash_bits:
        raise DeltaError("hash value wider than hash_bits")
    if bool(np.any(parent >= np.arange(n))):
        raise DeltaError("a tree node's parent does not precede it")
    if len(np.unique((parent + 1) * 65536 + hashes)) != n:
        raise DeltaError("two siblings with the same hash")
    depth = [0] * n  # parents precede children, so one pass computes every depth
    for i, p in enumerate(parent.tolist()):
        depth[i] = depth[p] + 1 if p >= 0 else 1
    if max(depth) > max_depth:
        raise DeltaError("delta subtree deeper than max_tree_depth")
    return np.array(depth, dtype=np.int64)


class LayoutSwitchingTree:
    """The HR-tree across Sentry layout switches: what the model-node service holds.

    After `switch`, the new tree knows only the local subtree (rebuilt by `relayout`); peers'
    subtrees under the new layout arrive with their next deltas. Until the new tree has a
    delta from every peer the old tree knew, or `layout_switch_grace_s` has passed, lookups
    use the old tree -- whole lookups, never a mix: a search runs on exactly one tree, with
    that tree's layout. Inserts go to both trees; deltas go to the tree of their layout."""

    def __init__(self, tree: HRTree) -> None:
        self.current = tree
        self.previous: HRTree | None = None
        self._switched_at = 0.0

    @property
    def layout(self) -> ChunkLayout:
        return self.current.layout

    def switch(self, layout: ChunkLayout, now: float) -> None:
        if layout.layout_id == self.current.layout.layout_id:
            return
        self.previous = self.current
        self.current = self.current.relayout(layout, now)
        self._switched_at = now

    def lookup_tree(self, now: float) -> HRTree:
        prev = self.previous
        if prev is None:
            return self.current
        peers = [o for o in prev.origins() if o != prev.local_id]
        warm = all(self.current.version(o) > 0 for o in peers)
        if warm or now - self._switched_at >= self.current.params.layout_switch_grace_s:
            self.previous = None
            return self.current
        return prev

    def search(self, token_ids, now: float, tau_c: int | None = None) -> SearchResult:
        return self.lookup_tree(now).search(token_ids, tau_c)

    def search_with_homes(self, token_ids, now: float) -> tuple[SearchResult, HomeKeys]:
        """`search` and the `home_keys` of the same lookup tree (one layout for both)."""
        tree = self.lookup_tree(now)
        hashes = tree.chunk_hashes(token_ids)
        match = tree.search_hashes(hashes)
        return match, tree.home_keys(hashes, match.depth)

    def insert(self, token_ids, node_id: str, now: float) -> int:
        if self.previous is not None:
            self.previous.insert(token_ids, node_id, now)
        return self.current.insert(token_ids, node_id, now)

    def merge_delta(self, data: bytes, now: float = 0.0) -> MergeOutcome:
        outcome = self.current.merge_delta(data, now)
        if outcome is MergeOutcome.OTHER_LAYOUT and self.previous is not None:
            return self.previous.merge_delta(data, now)
        return outcome

    def export_delta(self, node_id: str, since_version: int) -> bytes:
        return self.current.export_delta(node_id, since_version)

    def version(self, node_id: str) -> int:
        return self.current.version(node_id)

    def set_kv_capacity(self, node_id: str, tokens: int) -> None:
        for tree in (self.current, self.previous):
            if tree is not None:
                tree.set_kv_capacity(node_id, tokens)

    def remove_origin(self, node_id: str) -> None:
        for tree in (self.current, self.previous):
            if tree is not None:
                tree.remove_origin(node_id)

    def stats(self) -> TreeStats:
        return self.current.stats()
