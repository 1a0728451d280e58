"""Property tests of the HR-tree delta merge under hostile input (oracle: testkit/fuzzing/hrtree.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gentorrent.routing.hrtree import DeltaError, HRTree
from testkit.fuzzing import filtered_check
from testkit.fuzzing.hrtree import _LAYOUT, snapshot

check = filtered_check("hrtree")

_paths = st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=_LAYOUT.max_depth), min_size=1, max_size=5)


def _tree_with(paths, local="local") -> HRTree:
    tree = HRTree(local, _LAYOUT)
    for p in paths:
        tree.insert_hashes(p, local, now=1.0)
    return tree


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=500))
def test_oracle_holds_on_arbitrary_input(data: bytes) -> None:
    check(data)


@settings(max_examples=150, deadline=None)
@given(_paths, _paths, st.data())
def test_corrupted_delta_is_rejected_without_state_change_or_merged_consistently(mine, theirs, data) -> None:
    tree = _tree_with(mine)
    delta = bytearray(_tree_with(theirs, "peer").export_delta("peer", 0))
    i = data.draw(st.integers(0, len(delta) - 1))
    delta[i] = data.draw(st.integers(0, 255).filter(lambda b: b != delta[i]))
    before = snapshot(tree)
    try:
        tree.merge_delta(bytes(delta))
    except DeltaError:
        assert snapshot(tree) == before
        return
    assert tree.stats().tree_nodes >= 1


@settings(max_examples=100, deadline=None)
@given(_paths, _paths)
def test_genuine_delta_reproduces_the_subtree(mine, theirs) -> None:
    tree = _tree_with(mine)
    peer = _tree_with(theirs, "peer")
    tree.merge_delta(peer.export_delta("peer", 0))
    assert tree.subtree_paths("peer") == peer.subtree_paths("peer")


@pytest.mark.parametrize("blob", [b"", b"GTHT", b"GTHT\x01\x00\x08\x05peer-" + bytes(24), b"\x00" * 64])
def test_short_or_foreign_blobs_raise_delta_error(blob: bytes) -> None:
    tree = _tree_with([[1, 2, 3]])
    before = snapshot(tree)
    with pytest.raises(DeltaError):
        tree.merge_delta(blob)
    assert snapshot(tree) == before


def test_delta_deeper_than_the_layout_is_rejected_without_state_change() -> None:
    deep = HRTree("peer", _LAYOUT)
    deep.insert_hashes(list(range(_LAYOUT.max_depth + 1)), "peer", now=1.0)  # insert_hashes does not truncate
    tree = _tree_with([[1, 2]])
    before = snapshot(tree)
    with pytest.raises(DeltaError):
        tree.merge_delta(deep.export_delta("peer", 0))
    assert snapshot(tree) == before


def test_a_new_origin_beyond_group_split_size_changes_nothing() -> None:
    tree = _tree_with([[1]])
    for i in range(tree.params.group_split_size - 1):
        tree.merge_delta(_tree_with([[i % 256, 7]], f"p{i}").export_delta(f"p{i}", 0))
    before = snapshot(tree)
    outcome = tree.merge_delta(_tree_with([[9]], "late").export_delta("late", 0))
    assert outcome.value == "group_full" and snapshot(tree) == before
