"""Sentry: system-prompt detection, the chunk-length array L, and group agreement on it."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gentorrent.config import ROUTING
from gentorrent.routing.chunking import ChunkLayout
from gentorrent.routing.sentry import (PrefixStat, Sentry, SentryError, StatsRecord, check_layout,
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
        sentries[(k // 3) % 3].observe(p)  # every node sees every system prompt
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


def _layout(epoch: int, *system_lengths: int) -> ChunkLayout:
    """A layout of the shape layout_from_records gives, for these system-prompt lengths."""
    d, chunks, prev = PARAMS.sentry_separator_tokens, [], 0
    for s in system_lengths:
        chunks += [s - prev - (d if prev else 0), d]
        prev = s
    return ChunkLayout(epoch, tuple(chunks), PARAMS.default_chunk_length, PARAMS.max_tree_depth)


def test_diverged_layouts_of_a_pair_converge_on_the_smaller_digest():
    a, b = Sentry("a", PARAMS), Sentry("b", PARAMS)
    small, big = sorted([_layout(1, 300), _layout(1, 700)], key=lambda l: l.digest)
    a._switch(big)
    b._switch(small)
    assert a.merge_layout(b.export_layout(), "b", ["b"], now=1.0) == small  # half the pair, and it wins
    assert b.merge_layout(a.export_layout(), "a", ["a"], now=1.0) is None
    assert a.layout == b.layout == small
    assert a.merge_layout(ChunkLayout.default(PARAMS).encode(), "b", ["b"], now=2.0) is None  # older epoch


def test_a_late_member_joins_the_layout_the_group_agrees_on():
    late = Sentry("late", PARAMS)
    group = ["m0", "m1", "m2"]
    agreed = _layout(5, 300, 700)
    assert late.merge_layout(agreed.encode(), "m0", group, now=1.0) is None  # 1 of 4 is no agreement
    assert late.merge_layout(agreed.encode(), "m1", group, now=1.0) == agreed  # 2 of 4, and it wins
    assert late.layout == agreed


def test_one_member_alone_never_moves_a_group_of_three():
    s = Sentry("me", PARAMS)
    for epoch in (1, 2**20, 2**32 - 1):
        assert s.merge_layout(_layout(epoch, 64).encode(), "liar", ["liar", "honest"], now=1.0) is None
    assert s.layout.epoch == 0
    # once the honest member advertises the same layout, the group agrees on it
    assert s.merge_layout(_layout(2**20, 64).encode(), "honest", ["liar", "honest"], now=1.0) is None
    moved = s.merge_layout(_layout(2**32 - 1, 64).encode(), "honest", ["liar", "honest"], now=1.0)
    assert moved is not None and moved.epoch == 2**32 - 1


def test_a_strict_majority_moves_the_minority_and_never_flips():
    members = ["a", "b", "c"]
    small, big = sorted([_layout(3, 300), _layout(3, 900)], key=lambda l: l.digest)
    sentries = {m: Sentry(m, PARAMS) for m in members}
    sentries["a"]._switch(big)
    sentries["b"]._switch(big)
    sentries["c"]._switch(small)  # the minority holds the layout that would win the join
    for _ in range(2):
        for speaker, s_from in sentries.items():
            for listener, s_to in sentries.items():
                if speaker != listener:
                    s_to.merge_layout(s_from.export_layout(), speaker,
                                      [m for m in members if m != listener], now=1.0)
    assert {s.layout for s in sentries.values()} == {big}


def test_votes_of_silent_or_departed_members_do_not_count():
    s = Sentry("me", PARAMS)
    agreed = _layout(2, 400)
    s.merge_layout(agreed.encode(), "x", ["x", "y"], now=0.0)
    later = PARAMS.peer_silence_s + 1
    assert s.merge_layout(agreed.encode(), "y", ["x", "y"], now=later) is None  # x's vote went stale
    assert s.tick(["y"], now=later) == agreed  # x left the roster: y alone is half of the pair


def test_a_refresh_due_at_the_last_epoch_does_not_raise():
    last = _layout(2**32 - 1, 300)
    s = Sentry("me", PARAMS, layout=last)
    for p in _prompts(4, PARAMS.sentry_refresh_requests):
        s.observe(p)
    assert s.tick([], now=0.0) is None and s.tick([], now=PARAMS.sentry_seal_timeout_s + 1) is None
    assert s.layout == last


def test_a_prefix_only_one_member_reports_stays_out_of_the_layout():
    honest = [StatsRecord(n, 0, 40, 40, True, (PrefixStat(300, b"s" * 8, 20),)) for n in ("n0", "n1")]
    liar = StatsRecord("liar", 0, 2**32 - 1, PARAMS.sentry_sample_size, True,
                       (PrefixStat(PARAMS.sentry_max_prefix_tokens - 1, b"x" * 8, PARAMS.sentry_sample_size),
                        PrefixStat(300, b"s" * 8, PARAMS.sentry_sample_size)))
    layout = layout_from_records(1, [*honest, liar], PARAMS)
    assert layout.lengths == (300, PARAMS.sentry_separator_tokens)  # corroborated: in; alone: out
    assert layout_from_records(1, [honest[0]], PARAMS).lengths == layout.lengths  # a lone node decides alone


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(PARAMS.sentry_min_prefix_tokens, PARAMS.sentry_max_prefix_tokens - 1),
                          st.integers(2, PARAMS.sentry_sample_size)), max_size=PARAMS.sentry_max_entries,
                unique_by=lambda entry: entry[0]))
def test_every_layout_the_sentry_derives_passes_the_layout_check(entries):
    rec = StatsRecord("n0", 0, 100, PARAMS.sentry_sample_size, True,
                      tuple(PrefixStat(length, length.to_bytes(8, "big"), count)
                            for length, count in entries))
    layout = layout_from_records(1, [StatsRecord.decode(rec.encode(), PARAMS)], PARAMS)
    assert check_layout(layout.encode(), PARAMS) == layout


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
           StatsRecord("p", 0, 7, 4, True, (PrefixStat(100, b"x" * 8, 3),) * 2).encode(),  # counted twice
           StatsRecord("p", 0, 7, 4, True,  # a prefix shorter than the Sentry detects
                       (PrefixStat(PARAMS.sentry_min_prefix_tokens - 1, b"x" * 8, 3),)).encode(),
           StatsRecord("p", 0, 7, 4, True, tuple(PrefixStat(100 + i, b"x" * 8, 2)
                                                 for i in range(40))).encode()]
    for data in bad:
        with pytest.raises(SentryError):
            s.merge_stats(data)
    d, lo = PARAMS.sentry_separator_tokens, PARAMS.sentry_min_prefix_tokens
    hi = PARAMS.sentry_max_prefix_tokens
    shapeless = [(5,), (300,), (300, d + 1), (lo - 1, d), (hi, d), (300, d, hi - 300 - d, d),
                 sum(((100, d) for _ in range(PARAMS.sentry_max_prompts + 1)), ())]
    for data in (b"", b"GTLY" + bytes(12) + b"\0", ChunkLayout(1, (5,), 7, 9).encode(),
                 *(ChunkLayout(1, ls, PARAMS.default_chunk_length, PARAMS.max_tree_depth).encode()
                   for ls in shapeless)):
        with pytest.raises(SentryError):
            s.merge_layout(data, "p", ["p"], now=0.0)
    assert [r.encode() for r in s.records()] == before and s.layout.epoch == 0
    assert s.tick(["p"], now=0.0) is None  # no vote was recorded
