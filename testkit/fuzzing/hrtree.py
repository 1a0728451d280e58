"""Oracle for the HR-tree delta merge (gentorrent.routing.hrtree.HRTree.merge_delta).

Contract checked:
1. merge_delta of arbitrary bytes, or of a genuine delta with bytes changed, raises only
   DeltaError, and a DeltaError (or any outcome other than APPLIED) leaves the tree exactly
   as it was (origins, versions, every held path, node count, tokens);
2. an APPLIED delta leaves a consistent tree: the node count equals the number of distinct
   held prefixes, each origin's tokens are the sum of its chunks, and the origin's subtree
   re-exported and merged elsewhere gives the same paths;
3. merging two genuine deltas of one origin gives the same tree in either order.
"""

from __future__ import annotations

import struct

from gentorrent.routing.chunking import ChunkLayout
from gentorrent.routing.hrtree import _HEADER, DeltaError, HRTree, MergeOutcome
from testkit.fuzzing import Draw, Finding, cpu_budget, expect

_LAYOUT = ChunkLayout(1, (5, 3), 4, 16)  # small and shallow: fuzz inputs reach max depth
_PEERS = ["peer-a", "peer-b", "local", "ü" * 3]


def _hash_paths(d: Draw, count: int) -> list[list[int]]:
    return [[d.uint(1) % 8 if d.flag() else d.uint(1) for _ in range(d.between(1, _LAYOUT.max_depth))] for _ in range(count)]


def _tree(d: Draw, local_id: str = "local") -> HRTree:
    tree = HRTree(local_id, _LAYOUT)
    for path in _hash_paths(d, d.below(4)):
        tree.insert_hashes(path, local_id, now=1.0)
    return tree


def _delta(d: Draw, origin: str) -> bytes:
    """A genuine delta of `origin`, version chosen by the input."""
    src = HRTree(origin, _LAYOUT)
    for path in _hash_paths(d, d.between(1, 4)):
        src.insert_hashes(path, origin, now=2.0)
    if d.below(8) == 0:  # a header-only "unchanged" delta
        return src.export_delta(origin, since_version=src.version(origin))
    data = bytearray(src.export_delta(origin, 0))
    at = _HEADER.size + len(origin.encode()) + 12  # trailer: epoch (4), digest (8), version (8)
    data[at:at + 8] = struct.pack(">Q", d.between(1, 6))
    return bytes(data)


def snapshot(tree: HRTree) -> tuple:
    s = tree.stats()
    return (tuple((o, tree.version(o), frozenset(tree.subtree_paths(o))) for o in tree.origins()),
            s.tree_nodes, s.held_entries, tuple(sorted(s.per_origin_tokens.items())))


def _consistent(tree: HRTree) -> None:
    prefixes = set()
    for o in tree.origins():
        tokens = 0
        for path in tree.subtree_paths(o):
            tokens += _LAYOUT.chunk_length_at(len(path))
            prefixes.update(path[:i] for i in range(1, len(path) + 1))
        expect(tree.stats().per_origin_tokens[o] == tokens, f"origin {o!r}: token count off")
    expect(tree.stats().tree_nodes == len(prefixes),
           f"tree_nodes {tree.stats().tree_nodes} but {len(prefixes)} distinct held prefixes")


def _merge(tree: HRTree, data: bytes) -> MergeOutcome | None:
    before = snapshot(tree)
    try:
        with cpu_budget(5.0, "HRTree.merge_delta"):
            outcome = tree.merge_delta(data, now=3.0)
    except DeltaError:
        expect(snapshot(tree) == before, "a rejected delta changed the tree")
        return None
    expect(isinstance(outcome, MergeOutcome), f"merge_delta returned {outcome!r}")
    if outcome is not MergeOutcome.APPLIED:
        expect(snapshot(tree) == before, f"a {outcome.value} delta changed the tree")
    _consistent(tree)
    return outcome


def _mutated(d: Draw, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(d.between(1, 4)):
        how = d.below(3)
        if how == 0 and b:
            b[d.below(len(b))] = d.uint(1)
        elif how == 1:
            cut = d.below(len(b) + 1)
            b = b[:cut] + b[cut + d.below(4):]
        else:
            at = d.below(len(b) + 1)
            b[at:at] = d.blob(4)
    return bytes(b)


def check(data: bytes) -> None:
    d = Draw(data)
    mode = d.below(4)
    tree = _tree(d)
    for origin in ("peer-a", "peer-b")[:d.below(3)]:
        tree.merge_delta(_delta(d, origin))
    if mode == 0:
        _merge(tree, d.rest())
    elif mode == 1:
        _merge(tree, _mutated(d, _delta(d, d.choice(_PEERS))))
    elif mode == 2:
        origin = d.choice(_PEERS)
        delta = _delta(d, origin)
        if _merge(tree, delta) is MergeOutcome.APPLIED:
            other = HRTree("elsewhere", _LAYOUT)
            other.merge_delta(tree.export_delta(origin, 0))
            expect(other.subtree_paths(origin) == tree.subtree_paths(origin),
                   "re-exported subtree differs from the merged one")
    else:
        origin = d.choice(_PEERS[:2])
        first, second = _delta(d, origin), _delta(d, origin)
        tree, twin = HRTree("local", _LAYOUT), HRTree("local", _LAYOUT)
        for delta in (first, second):
            _merge(tree, delta)
        for delta in (second, first):
            _merge(twin, delta)
        a, b = snapshot(tree), snapshot(twin)
        if a[0] != b[0] and not _same_version_tie(first, second):
            raise Finding("two deltas of one origin merged in two orders gave two trees")


def _same_version_tie(first: bytes, second: bytes) -> bool:
    """Two different subtrees under one version: last-writer-wins cannot order them; only
    the origin increments its version, so an honest origin never sends such a pair."""
    return first != second and _version(first) == _version(second)


def _version(delta: bytes) -> int:
    id_len = delta[_HEADER.size - 1]
    return struct.unpack_from(">Q", delta, _HEADER.size + id_len + 12)[0]
