"""The proxy's cover holds (gentorrent/overlay/cover_timing.py): one draw per ask's replies,
fresh draws elsewhere, within the bound, bounded memory."""

from __future__ import annotations

import random

import pytest

from gentorrent.overlay.cover_timing import ReplyHolds


def _holds(bound=0.2, idle=10.0, links=4, seed=1):
    return ReplyHolds(bound, idle, links, random.Random(seed))


def test_every_reply_clove_of_one_ask_waits_the_same_and_asks_differ():
    holds = _holds()
    first = holds.reply(b"ask-1", 0.0)
    assert 0.0 <= first <= 0.2
    assert [holds.reply(b"ask-1", t) for t in (0.25, 0.5, 3.0)] == [first] * 3  # the answer keeps its pace
    others = {holds.reply(bytes([i]), 1.0) for i in range(3)}
    assert len(others | {first}) == 4


def test_fresh_holds_are_uniform_within_the_bound():
    holds = _holds(seed=2)
    draws = [holds.fresh() for _ in range(5_000)]
    assert 0.0 <= min(draws) and max(draws) <= 0.2
    assert sum(draws) / len(draws) == pytest.approx(0.1, abs=0.005)
    assert sum(d < 0.05 for d in draws) / len(draws) == pytest.approx(0.25, abs=0.03)


def test_memory_is_bounded_and_idle_links_are_forgotten():
    holds = _holds(links=4, idle=10.0)
    for i in range(100):
        holds.reply(i.to_bytes(4, "big"), float(i) * 0.01)
    assert len(holds) == 4
    holds.reply(b"late", 100.0)  # everything else idle for > 10 s
    assert len(holds) == 1


def test_a_zero_bound_holds_nothing_and_bad_parameters_are_refused():
    holds = _holds(bound=0.0)
    assert holds.fresh() == 0.0 and holds.reply(b"x", 0.0) == 0.0
    for bad in ((-1.0, 1.0, 1), (0.2, 0.0, 1), (0.2, 1.0, 0)):
        with pytest.raises(ValueError):
            ReplyHolds(*bad, random.Random(1))
