"""HR-tree: Algorithm 1, hashing false positives, eviction, deltas and their merge."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gentorrent.config import ROUTING
from gentorrent.routing.chunking import ChunkHasher, ChunkLayout, LayoutError, TokenError
from gentorrent.routing.hrtree import DeltaError, HRTree, MergeOutcome, SearchResult

LAYOUT = ChunkLayout(0, (), default_length=4, max_depth=64)


def tree(local="a", layout=LAYOUT, **kw) -> HRTree:
    return HRTree(local, layout, replace(ROUTING, **kw) if kw else ROUTING)


# ----------------------------------------------------------------------------- Algorithm 1


def test_search_follows_algorithm_1_on_hand_made_tree():
    t = tree()
    t.insert_hashes([0x0A, 0x8B, 0x11], "a", 0)
    t.insert_hashes([0x0A, 0x8B, 0x22, 0x33], "b", 0)
    t.insert_hashes([0x0A, 0x7F], "c", 0)
    # full match of a's path: depth 3, holders of the deepest node only
    assert t.search_hashes([0x0A, 0x8B, 0x11]) == SearchResult(("a",), 3)
    # stops at the first chunk without a child: depth 2, both a and b hold 0A/8B
    assert t.search_hashes([0x0A, 0x8B, 0x99, 0x33]) == SearchResult(("a", "b"), 2)
    # the query runs out before the tree does
    assert t.search_hashes([0x0A, 0x8B, 0x22]) == SearchResult(("b",), 3)
    # depth 1 < tau_c = 2: no match, even though 0A is shared by everyone
    assert t.search_hashes([0x0A, 0x55]) == SearchResult((), 1)
    assert t.search_hashes([0x0A, 0x7F], tau_c=2) == SearchResult(("c",), 2)
    assert t.search_hashes([0x0A, 0x7F], tau_c=3) == SearchResult((), 2)
    assert t.search_hashes([]) == SearchResult((), 0)
    assert t.search_hashes([0x01]) == SearchResult((), 0)


def test_search_on_tokens_matches_shared_prefix_and_ignores_partial_chunk():
    t = tree()
    shared = list(range(100, 116))  # 4 full chunks
    t.insert(shared + [1, 2, 3, 4], "b", 0)
    assert t.search(shared + [9, 9, 9, 9]) == SearchResult(("b",), 4)
    # a trailing partial chunk is not hashed: 18 tokens = 4 chunks
    assert t.search(shared + [1, 2]).depth == 4
    assert t.search([7] * 16).candidates == ()


def test_chunk_layout_cuts_sentry_array_then_default_chunks():
    layout = ChunkLayout(3, (5, 2, 3), default_length=4, max_depth=6)
    assert layout.chunk_ends(30).tolist() == [5, 7, 10, 14, 18, 22]  # capped at depth 6
    assert layout.chunk_ends(9).tolist() == [5, 7]
    assert layout.chunk_length_at(1) == 5 and layout.chunk_length_at(5) == 4
    assert ChunkLayout.decode(layout.encode()) == layout
    assert layout.digest != ChunkLayout(3, (5, 2, 4), 4, 6).digest
    with pytest.raises(LayoutError):
        ChunkLayout(0, (0,))
    with pytest.raises(LayoutError):
        ChunkLayout.decode(layout.encode()[:-1])


def test_bad_tokens_are_rejected():
    t = tree()
    for bad in ([-1, 2, 3, 4], [[1, 2], [3, 4]], [1.5, 2.0, 3.0, 4.0], [2**40] * 4):
        with pytest.raises(TokenError):
            t.insert(bad, "a", 0)
    assert t.stats().tree_nodes == 0


# ----------------------------------------------------------------------------- hashing


def test_hash_is_seeded_and_vectorised_consistently():
    h1 = ChunkHasher(8, seed=1)
    h2 = ChunkHasher(8, seed=2)
    toks = np.arange(64)
    a = h1.hash_chunks(toks, LAYOUT)
    assert len(a) == 16 and a.max() < 256
    assert not np.array_equal(a, h2.hash_chunks(toks, LAYOUT))
    # hashing a chunk alone gives the same value as inside a prompt
    single = h1.hash_chunks(toks[8:12], ChunkLayout(0, (), 4, 64))
    assert single[0] == a[2]


@pytest.mark.parametrize("depth", [1, 2])
def test_false_positive_rate_of_8_bit_hashes_is_256_to_the_minus_depth(depth):
    """One stored prompt; random unrelated queries match it to depth >= d at rate 1/256^d."""
    rng = np.random.default_rng(depth)
    hasher = ChunkHasher(8, ROUTING.hash_seed)
    layout = ChunkLayout(0, (), 4, 64)
    stored = hasher.hash_chunks(rng.integers(0, 50_000, 4 * depth), layout)
    trials, batch = (400_000, 400_000) if depth == 1 else (2_000_000, 500_000)
    hits = 0
    for _ in range(trials // batch):  # bounded memory: one batch of queries at a time
        queries = rng.integers(0, 50_000, (batch, 4 * depth), dtype=np.int32)
        starts = np.arange(0, batch * 4 * depth, 4)
        flat = hasher.hash_segments(queries.ravel(), starts, starts + 4).reshape(batch, depth)
        hits += int(np.all(flat == stored, axis=1).sum())
    expected = trials / 256**depth
    # within 5 standard deviations of the binomial mean
    assert abs(hits - expected) < 5 * np.sqrt(expected) + 1, (hits, expected)
    # and the tree agrees with the bulk measurement on a sample
    t = tree(layout=layout)
    t.insert_hashes(stored.tolist(), "b", 0)
    sample = flat[:2000]
    tree_hits = sum(t.search_hashes(q.tolist(), tau_c=depth).depth >= depth for q in sample)
    assert tree_hits == int(np.all(sample == stored, axis=1).sum())


# ----------------------------------------------------------------------------- eviction


def test_local_subtree_is_bounded_by_kv_capacity_with_lru_leaves():
    t = tree()
    t.set_kv_capacity("a", 40)  # 10 chunks of 4 tokens
    t.insert_hashes([1, 2, 3, 4], "a", 0)  # 16 tokens
    t.insert_hashes([1, 2, 5, 6], "a", 1)  # +8 tokens (shares 1, 2)
    t.insert_hashes([9, 8, 7], "a", 2)  # +12 -> 36
    assert t.stats().per_origin_tokens["a"] == 36
    t.insert_hashes([1, 2, 5, 6], "a", 3)  # touch: now the most recent
    t.insert_hashes([9, 8, 7, 6], "a", 4)  # +4 -> 40, fits
    t.insert_hashes([11, 12], "a", 5)  # +8 -> 48: evict the LRU leaves 4 then 3
    paths = t.subtree_paths("a")
    assert (1, 2, 3, 4) not in paths and (1, 2, 3) not in paths
    assert (1, 2, 5, 6) in paths and (9, 8, 7, 6) in paths and (11, 12) in paths
    assert t.stats().per_origin_tokens["a"] == 40
    assert t.search_hashes([1, 2, 3, 4]) == SearchResult(("a",), 2)


def test_subtree_node_bound_and_stats():
    t = tree(max_subtree_nodes=50)
    rng = np.random.default_rng(0)
    for i in range(40):
        t.insert_hashes(rng.integers(0, 256, 5).tolist(), "a", i)
    s = t.stats()
    assert s.per_origin_nodes["a"] <= 50 and s.tree_nodes <= 50
    assert 0 < s.approx_bytes <= s.max_bytes


def test_relayout_rebuilds_local_subtree_only():
    t = tree()
    prompt = list(range(40))
    t.insert(prompt, "a", 0)
    t.insert(list(range(100, 140)), "b", 0)
    new = t.relayout(ChunkLayout(1, (8,), 4, 64), now=1)
    assert new.layout.epoch == 1
    assert new.search(prompt) == SearchResult(("a",), 9)  # 8 + 4*8 tokens
    assert new.search(list(range(100, 140))).candidates == ()


# ----------------------------------------------------------------------------- deltas


def _populated(local: str, seed: int, n: int = 30) -> HRTree:
    t = tree(local)
    rng = np.random.default_rng(seed)
    for i in range(n):
        t.insert(rng.integers(0, 8, 4 * int(rng.integers(1, 12))).tolist(), local, i)
    return t


def test_delta_roundtrip_unchanged_and_stale():
    a, b = _populated("a", 1), tree("b")
    delta = a.export_delta("a", 0)
    assert len(delta) <= 64 + 3 * a.stats().per_origin_nodes["a"]
    assert b.merge_delta(delta) is MergeOutcome.APPLIED
    assert b.subtree_paths("a") == a.subtree_paths("a")
    assert b.merge_delta(delta) is MergeOutcome.STALE
    assert b.merge_delta(a.export_delta("a", b.version("a"))) is MergeOutcome.UNCHANGED
    assert a.merge_delta(delta) is MergeOutcome.SELF
    other = tree("c", layout=ChunkLayout(1, (), 4, 64))
    assert other.merge_delta(delta) is MergeOutcome.OTHER_LAYOUT
    # the sender evicts: the receiver follows the newer version exactly
    a.set_kv_capacity("a", 16)
    assert b.merge_delta(a.export_delta("a", b.version("a"))) is MergeOutcome.APPLIED
    assert b.subtree_paths("a") == a.subtree_paths("a")


def _snapshot(t: HRTree):
    return ({o: frozenset(t.subtree_paths(o)) for o in t.origins() if o != t.local_id},
            t.stats().tree_nodes)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_merge_of_deltas_is_order_independent(script, rnd):
    """Deltas of several versions of several origins, merged in two orders: same tree."""
    origins = [_populated(name, seed=i, n=3) for i, name in enumerate(("p", "q", "r"))]
    rng = np.random.default_rng(len(script))
    deltas = []
    for who, grow in script:
        o = origins[who]
        for _ in range(grow):
            o.insert(rng.integers(0, 8, 4 * int(rng.integers(1, 8))).tolist(), o.local_id, 0)
        deltas.append(o.export_delta(o.local_id, 0))
    x, y = tree("x"), tree("y")
    for d in deltas:
        x.merge_delta(d)
    shuffled = deltas[:]
    rnd.shuffle(shuffled)
    for d in shuffled + shuffled[:2]:  # duplicates are harmless too
        y.merge_delta(d)
    assert _snapshot(x) == _snapshot(y)


def _bad_deltas(good: bytes) -> list[bytes]:
    head = 8 + 1  # header + 1-byte id "a"
    trailer = head + 24
    bad = [b"", b"GTHT", good[:-1], good + b"\x00", b"XXXX" + good[4:],
           good[:4] + b"\x09" + good[5:],  # format
           good[:5] + b"\x80" + good[6:],  # flags
           good[:6] + b"\x10" + good[7:],  # hash bits
           good[:7] + b"\x00" + good[8:],  # id length 0
           good[:7] + b"\x40" + good[8:],  # id length beyond the data
           good[:head - 1] + b"\xff" + good[head:],  # id not UTF-8
           good[:trailer - 4] + (999_999).to_bytes(4, "big") + good[trailer:],  # count
           good[:trailer - 12] + bytes(8) + good[trailer - 4:],  # version 0
           good[:trailer] + b"\x00\x05" + good[trailer + 2:],  # parent after child
           ]
    # two siblings with one hash: duplicate the first record
    bad.append(good[:trailer - 4] + (int.from_bytes(good[trailer - 4:trailer], "big") + 1)
               .to_bytes(4, "big") + good[trailer:trailer + 3] + good[trailer:])
    return bad


def test_malformed_deltas_are_rejected_without_state_change():
    a, b = _populated("a", 3), _populated("b", 4)
    b.merge_delta(_populated("c", 5).export_delta("c", 0))
    before = _snapshot(b)
    for data in _bad_deltas(a.export_delta("a", 0)):
        with pytest.raises(DeltaError):
            b.merge_delta(data)
        assert _snapshot(b) == before
    with pytest.raises(DeltaError):
        b.merge_delta("not bytes")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fuzzed_deltas_either_apply_cleanly_or_change_nothing(data):
    a = _populated("a", 6, n=10)
    good = bytearray(a.export_delta("a", 0))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(good) - 1))
        good[i] = data.draw(st.integers(0, 255))
    b = _populated("b", 7, n=5)
    before = _snapshot(b)
    try:
        b.merge_delta(bytes(good))
    except DeltaError:
        assert _snapshot(b) == before
    else:  # accepted: the tree is still consistent (every held path leads to its holder)
        for origin in b.origins():
            for path in b.subtree_paths(origin):
                assert origin in b.search_hashes(list(path), tau_c=1).candidates


def test_layout_switch_searches_old_tree_until_new_one_is_warm():
    from gentorrent.routing.hrtree import LayoutSwitchingTree

    params = replace(ROUTING, layout_switch_grace_s=10.0)
    old_layout, new_layout = LAYOUT, ChunkLayout(1, (8,), 4, 64)
    peer = HRTree("b", old_layout, params)
    peer_prompt = list(range(200, 240))
    peer.insert(peer_prompt, "b", 0)
    me = LayoutSwitchingTree(HRTree("a", old_layout, params))
    me.merge_delta(peer.export_delta("b", 0), 0)
    me.insert(list(range(40)), "a", 0)
    me.switch(new_layout, now=100)
    # the new tree has not heard from b yet: whole lookups still use the old layout
    assert me.search(peer_prompt, now=101) == SearchResult(("b",), 10)
    assert me.lookup_tree(101).layout == old_layout
    # b switches too and sends its new-layout delta: lookups move to the new tree
    peer = peer.relayout(new_layout, 101)
    assert me.merge_delta(peer.export_delta("b", 0), 102) is MergeOutcome.APPLIED
    assert me.lookup_tree(102).layout == new_layout
    assert me.search(peer_prompt, now=102) == SearchResult(("b",), 9)
    assert me.search(list(range(40)), now=102).candidates == ("a",)
    # without a word from a peer, the grace period ends the old tree
    lone = LayoutSwitchingTree(HRTree("a", old_layout, params))
    lone.insert([1] * 8, "c", 0)  # what we know of peer c, under the old layout
    lone.switch(new_layout, now=0)
    assert lone.lookup_tree(5).layout == old_layout
    assert lone.lookup_tree(10).layout == new_layout
