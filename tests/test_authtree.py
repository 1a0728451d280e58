"""The Merkle treap of the registry (gentorrent.ledger.authtree) against a naive model: a dict.

Every property is checked on random operation sequences (hypothesis): the tree holds what the
dict holds, its root does not depend on the order the keys came in (history independence: the
reason replay and restarts agree byte for byte), and every proof verifies to the same root and
answers exactly what the dict answers, while a changed byte of a proof never verifies to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gentorrent.ledger import authtree
from gentorrent.ledger.authtree import Incomplete, ProofError, Tree, verify

ROOT = Path(__file__).resolve().parents[1]
KEYS = st.binary(min_size=1, max_size=4)  # small keys: collisions between operations are frequent
VALUES = st.binary(max_size=8)
OPS = st.lists(st.tuples(KEYS, st.one_of(st.none(), VALUES)), max_size=60)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(ops) -> tuple[Tree, dict]:
    """Apply `ops` in batches of three (several batches, several owners) to a tree and a dict."""
    tree, model = Tree(), {}
    for i in range(0, len(ops), 3):
        batch = dict(ops[i:i + 3])
        tree = tree.apply(batch)
        for k, v in batch.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
    return tree, model


@FAST
@given(OPS)
def test_the_tree_holds_what_the_dict_holds(ops):
    tree, model = build(ops)
    keys = sorted(model)
    assert list(tree.items()) == [(k, model[k]) for k in keys]
    assert tree.size == len(model)
    for rank, k in enumerate(keys):
        assert tree.get(k) == model[k] and tree.at(rank) == (k, model[k]) and tree.rank(k) == rank
    assert tree.get(b"\xff" * 9) is None


@FAST
@given(OPS, st.randoms(use_true_random=False))
def test_the_root_depends_on_the_keys_only_not_on_their_history(ops, rng):
    tree, model = build(ops)
    assert tree.root_hash == Tree.from_items(model.items()).root_hash
    shuffled = list(model.items())
    rng.shuffle(shuffled)
    one_by_one = Tree()
    for k, v in shuffled:
        one_by_one = one_by_one.apply({k: v})
    assert one_by_one.root_hash == tree.root_hash


@FAST
@given(OPS, OPS)
def test_old_snapshots_are_untouched_by_later_changes(ops, later):
    tree, model = build(ops)
    before = (tree.root_hash, list(tree.items()))
    tree.apply(dict(later))
    assert (tree.root_hash, list(tree.items())) == before == (Tree.from_items(model.items()).root_hash,
                                                             sorted(model.items()))


@FAST
@given(OPS, st.lists(KEYS, max_size=4), st.lists(st.integers(0, 80), max_size=4),
       st.lists(st.tuples(KEYS, KEYS), max_size=2), st.lists(KEYS, max_size=2))
def test_every_proof_answers_what_the_dict_answers(ops, keys, ranks, ranges, bounds):
    tree, model = build(ops)
    ordered = sorted(model)
    proof = tree.prove(keys=keys, ranks=ranks, ranges=ranges, bounds=bounds)
    seen = verify(proof)
    assert seen.root_hash == tree.root_hash and seen.size == len(model)
    for k in keys:
        assert seen.lookup(k) == model.get(k)
    for r in ranks:
        if r < len(ordered):
            assert seen.at(r) == (ordered[r], model[ordered[r]])
    for lo, hi in ranges:
        got = [(e.key, e.value) for e in seen.entries_in(lo, hi)]
        assert got == [(k, model[k]) for k in ordered if lo <= k < hi]
    for b in bounds:
        assert seen.rank_of(b) == sum(k < b for k in ordered)


@FAST
@given(OPS, st.tuples(KEYS, KEYS))
def test_withheld_values_come_as_hashes_the_client_can_check(ops, bounds):
    tree, model = build(ops)
    lo, hi = min(bounds), max(bounds) + b"\x00"
    held = {k: v for k, v in model.items() if k[0] % 2 == 0}  # what the client holds already
    seen = verify(tree.prove(ranges=[(lo, hi)], withhold=lambda k, v: k in held))
    assert seen.root_hash == tree.root_hash
    for e in seen.entries_in(lo, hi, held):
        if e.key in held:
            assert e.value is None and e.value_hash == authtree.value_hash(model[e.key])
        else:
            assert e.value == model[e.key]
    assert [e.key for e in seen.entries_in(lo, hi, held)] == [k for k in sorted(model) if lo <= k < hi]
    if any(lo <= k < hi for k in held):  # a client that holds something else is told so, never misled
        wrong = dict(held)
        wrong[next(k for k in sorted(held) if lo <= k < hi)] += b"!"
        with pytest.raises(Incomplete):
            assert [e.key for e in seen.entries_in(lo, hi, wrong)] == [k for k in sorted(model) if lo <= k < hi]
            assert all(e.value_hash == authtree.value_hash(model[e.key]) for e in seen.entries_in(lo, hi, wrong))
            raise Incomplete("every withheld entry came as a hash the client can check")


def test_what_changed_in_a_range_costs_proof_bytes_per_change_not_per_entry():
    """A client holding a range of 2,000 entries asks what changed: the entries it holds come as
    pruned subtrees it rebuilds, so one change costs about what one lookup costs; a client that
    lost an entry that is gone from the tree, or holds one it never should, is told Incomplete."""
    items = {b"G" + (b"%032d" % i): b"record %d" % i for i in range(2000)}
    items.update({b"A" + (b"%032d" % i): b"account" for i in range(2000)})
    rng = (b"G", b"H")
    tree = Tree.from_items(items.items())
    held = {k: v for k, v in items.items() if k.startswith(b"G")}
    changed = tree.apply({b"G" + b"%032d" % 700: b"record 700, changed"})
    proof = changed.prove(ranges=[rng], withhold=lambda k, v: held.get(k) == v)
    got = verify(proof).entries_in(*rng, held)
    assert [e.key for e in got] == sorted(held) and sum(e.value is not None for e in got) == 1
    assert len(proof) < 3 * len(tree.prove(keys=[b"G" + b"%032d" % 700]))
    assert len(proof) < 4 * len(held)  # shown by key and value hash, each entry held took 67 bytes
    gone = tree.apply({b"G" + b"%032d" % 900: None})
    proof = gone.prove(ranges=[rng], withhold=lambda k, v: held.get(k) == v)
    with pytest.raises(Incomplete):
        verify(proof).entries_in(*rng, held)  # the client still holds 900
    extra = {**held, b"G" + b"%032d" % 5000: b"never registered"}
    with pytest.raises(Incomplete):
        verify(tree.prove(ranges=[rng], withhold=lambda k, v: True)).entries_in(*rng, extra)


@FAST
@given(OPS, st.data())
def test_a_changed_byte_never_verifies_to_the_committed_root(ops, data):
    tree, model = build(ops)
    if not model:
        return
    proof = bytearray(tree.prove(keys=list(model)[:2], ranks=[0], ranges=[(b"\x00", b"\x80")]))
    i = data.draw(st.integers(0, len(proof) - 1))
    proof[i] ^= data.draw(st.integers(1, 255))
    try:
        seen = verify(bytes(proof))
    except ProofError:
        return
    assert seen.root_hash != tree.root_hash


@FAST
@given(OPS, KEYS)
def test_a_proof_that_leaves_the_answer_out_says_so(ops, key):
    tree, model = build(ops)
    seen = verify(tree.prove())  # shows the root only
    assert seen.root_hash == tree.root_hash
    if model:
        with pytest.raises(Incomplete):
            seen.lookup(key)
        with pytest.raises(Incomplete):
            seen.entries_in(b"\x00", b"\xff\xff\xff\xff\xff")
        with pytest.raises(Incomplete):
            seen.at(0)


def test_sampling_by_index_is_uniform_and_fixed_by_the_clients_draws():
    tree = Tree.from_items((bytes([i]) + b"k", b"v%d" % i) for i in range(50))
    start, count = tree.rank(b"\x0a"), tree.rank(b"\x14") - tree.rank(b"\x0a")  # keys 10..19
    draws = [0, 2**63, 2**64 - 1]
    ranks = authtree.sample_ranks(draws, start, count)
    assert ranks == [10, 15, 19]
    seen = verify(tree.prove(ranks=ranks, bounds=[b"\x0a", b"\x14"]))
    assert seen.rank_of(b"\x0a") == start and seen.rank_of(b"\x14") - start == count
    assert [seen.at(r)[0][0] for r in ranks] == [10, 15, 19]


def test_a_present_key_is_proven_by_hashes_along_its_path():
    """A peer lookup is the commonest query (bench/scale.py): a present key's proof shows no key
    but its own (its path by entry hashes), so it is smaller than the absence proof next to it,
    which needs the keys along the search path to rule the key out."""
    def key(i: int) -> bytes:  # the registry's keys: a kind byte and a 32-byte node id
        return b"U" + (b"%032d" % i)

    tree = Tree.from_items((key(i), b"v") for i in range(0, 4000, 2))
    present, absent = tree.prove(keys=[key(1000)]), tree.prove(keys=[key(1001)])
    shown = [e for e in verify(present).entries if e.key is not None]
    assert [e.key for e in shown] == [key(1000)] and verify(present).lookup(key(1000)) == b"v"
    assert verify(absent).lookup(key(1001)) is None
    assert len(present) < 0.7 * len(absent)


def test_malformed_proofs_are_refused_with_a_reason():
    for bad, reason in ((b"", "ends early"), (b"\x09", "unknown proof node kind"),
                        (b"\x00\x00", "trailing bytes"), (b"\x01" + bytes(32) + b"\x01", "non-empty"),
                        (b"\x04\x02ab\x00" + b"\x04\x02zz\x00\x00\x00" + b"\x00", "out of order")):
        with pytest.raises(ProofError, match=reason):
            verify(bad)
    deep = b"\x02" + bytes(32)
    with pytest.raises(ProofError, match="deeper"):
        verify(deep * (authtree.MAX_DEPTH + 2))


def test_the_root_is_the_same_under_every_hash_seed():
    """Python's str/bytes hash seed changes dict and set iteration order between runs: nothing in
    the tree may depend on it."""
    code = ("from gentorrent.ledger.authtree import Tree\n"
            "import random\n"
            "r = random.Random(7)\n"
            "changes = {bytes(r.randrange(256) for _ in range(6)): b'v' for _ in range(300)}\n"
            "t = Tree().apply(changes)\n"
            "t = t.apply({k: None for k in list(changes)[::3]})\n"
            "print(t.root_hash.hex())")
    roots = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                            env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("0", "1", "4242")}
    assert len(roots) == 1
