"""Sentry: system-prompt detection, the chunk-length array L, and group agreement on it."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest

from gentorrent.config import ROUTING
from gentorrent.routing.chunking import ChunkLayout
from gentorrent.routing.sentry import (PrefixStat, Sentry, SentryError, StatsRecord,
                                       common_prefixes, layout_from_records)

PARAMS = replace(ROUTING, sentry_refresh_requests=90, sentry_separator_tokens=16,
                 sentry_min_prefix_tokens=32, sentry_sample_size=64)
IDS = ["n0", "n1", "n2"]


def _prompts(seed: int, n: int, system_lengths=(300, 700, 1200)):
    """Requests that start with one of a few system prompts, then unique user text."""
    rng = np.random.default_rng(0)
    systems = [rng.integers(0, 40_000, s) for s in system_lengths]
    rng = np.random.default_rng(seed)
    return [np.concatenate([systems[i % len(systems)], rng.integers(0, 40_000, 200)])
            for i in range(n)]


def test_layout_follows_appendix_a3_formula():
    recs = [StatsRecord("n0", 0, 100, 50, True, (
        PrefixStat(300, b"a" * 8, 20), PrefixStat(700, b"b" * 8, 15),
        PrefixStat(1200, b"c" * 8, 10), PrefixStat(900, b"d" * 8, 2)))]  # 2 < ceil(5% of 50)
    layout = layout_from_records(1, recs, PARAMS)
    d = PARAMS.sentry_separator_tokens
    assert layout.lengths == (300, d, 700 - 300 - d, d, 1200 - 700 - d, d)
    assert list(np.cumsum(layout.lengths))[0::2] == [300, 700, 1200]
    assert layout.epoch == 1
    assert layout_from_records(1, [], PARAMS).lengths == ()


def test_common_prefixes_finds_system_prompt_lengths():
    heads = [p[: PARAMS.sentry_max_prefix_tokens].astype(">u4").tobytes()
             for p in _prompts(1, 30)]
    found = {s.length: s.count for s in common_prefixes(heads, PARAMS)}
    assert found == {300: 10, 700: 10, 1200: 10}


def _exchange(sentries, order):
    for i, j in order:
        if i != j:
            sentries[j].merge_stats(sentries[i].export_stats())


def _run_group(seed: int, shuffle_seed: int):
    sentries = [Sentry(n, PARAMS) for n in IDS]
    prompts = _prompts(seed, 120)
    for k, p in enumerate(prompts[:PARAMS.sentry_refresh_requests]):
        sentries[k % 3].observe(p)
    pairs = list(itertools.permutations(range(3), 2))
    random.Random(shuffle_seed).shuffle(pairs)
    _exchange(sentries, pairs)  # counts reach every node
    for s in sentries:
        assert s.tick(IDS, now=1.0) is None  # seals its record, waits for the others'
    random.Random(shuffle_seed + 1).shuffle(pairs)
    _exchange(sentries, pairs)  # sealed records reach every node
    return [s.tick(IDS, now=2.0) or s.layout for s in sentries], sentries


@pytest.mark.parametrize("shuffle_seed", [0, 1, 2])
def test_layout_identical_on_every_node_after_exchanging_statistics(shuffle_seed):
    layouts, sentries = _run_group(5, shuffle_seed)
    assert layouts[0].epoch == 1 and layouts[0].lengths  # found the system prompts
    assert len({(l.epoch, l.lengths, l.digest) for l in layouts}) == 1
    ends = set(np.cumsum(layouts[0].lengths).tolist())
    assert {300, 700, 1200} <= ends
    # statistics of the next epoch start from zero
    assert all(s.group_requests() == 0 for s in sentries)


def test_no_refresh_before_enough_requests_and_timeout_without_silent_member():
    s = [Sentry(n, PARAMS) for n in IDS]
    for p in _prompts(2, 50):
        s[0].observe(p)
    assert s[0].tick(IDS, now=0) is None and s[0].layout.epoch == 0
    for p in _prompts(3, 50):
        s[0].observe(p)
    assert s[0].tick(IDS, now=10.0) is None  # sealed, waiting for n1 and n2
    new = s[0].tick(IDS, now=10.0 + PARAMS.sentry_seal_timeout_s)
    assert new is not None and new.epoch == 1


def test_diverged_layouts_converge_on_higher_epoch_then_smaller_digest():
    a, b = Sentry("a", PARAMS), Sentry("b", PARAMS)
    l1 = ChunkLayout(1, (300, 16), PARAMS.default_chunk_length, PARAMS.max_tree_depth)
    l2 = ChunkLayout(1, (700, 16), PARAMS.default_chunk_length, PARAMS.max_tree_depth)
    small, big = sorted([l1, l2], key=lambda l: l.digest)
    a.merge_layout(big.encode())
    b.merge_layout(small.encode())
    a.merge_layout(b.export_layout())
    b.merge_layout(a.export_layout())
    assert a.layout == b.layout == small
    assert a.merge_layout(ChunkLayout.default(PARAMS).encode()) is None  # older epoch loses


def test_stats_merge_is_order_independent_and_sealed_wins():
    recs = [StatsRecord("p", 0, 5, 0, False, ()), StatsRecord("p", 0, 9, 0, False, ()),
            StatsRecord("p", 0, 7, 4, True, (PrefixStat(100, b"x" * 8, 3),))]
    results = set()
    for perm in itertools.permutations(recs):
        s = Sentry("me", PARAMS)
        for r in perm:
            s.merge_stats(r.encode())
        results.add(tuple(r.encode() for r in s.records()))
    assert len(results) == 1
    held = [r for r in Sentry("me", PARAMS).records()]
    assert len(held) == 1


def test_malformed_statistics_and_layouts_are_rejected_without_state_change():
    s = Sentry("me", PARAMS)
    good = StatsRecord("p", 0, 7, 4, True, (PrefixStat(100, b"x" * 8, 3),)).encode()
    s.merge_stats(good)
    before = [r.encode() for r in s.records()]
    bad = [b"", good[:-1], good + b"\0", b"XXXX" + good[4:], good[:4] + b"\x02" + good[5:],
           StatsRecord("p", 0, 7, 4, True, (PrefixStat(100, b"x" * 8, 9),)).encode(),  # 9 > 4
           StatsRecord("p", 0, 7, 3, False, ()).encode(),  # unsealed with a sample
           StatsRecord("p", 0, 7, 4, True, tuple(PrefixStat(100 + i, b"x" * 8, 2)
                                                 for i in range(40))).encode()]
    for data in bad:
        with pytest.raises(SentryError):
            s.merge_stats(data)
    for data in (b"", b"GTLY" + bytes(12) + b"\0", ChunkLayout(1, (5,), 7, 9).encode()):
        with pytest.raises(SentryError):
            s.merge_layout(data)
    assert [r.encode() for r in s.records()] == before and s.layout.epoch == 0
