"""Users break reputation ties fairly: nodes within OVERLAY.reputation_band of the best are
shuffled, so a node one float step below 1.0 still gets its share of first choices."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gentorrent.config import OverlayParams
from test_faults_models import _Models, _record  # a directory of model records, for Asker units
from user_client.asking import Asker
from user_client.ranking import rank_by_reputation


def test_a_node_one_float_step_below_one_gets_a_fair_share_of_first_choices():
    """The attack on exact ranking: 0.99999994 was first choice in 0 of 10,000 asks."""
    unlucky = _record("u", 0.99999994)
    records = [_record("a", 1.0), _record("b", 1.0), _record("c", 1.0), unlucky]
    asker = Asker(_Models(records), paths=None, params=OverlayParams(), rng=random.Random(18))
    first = Counter(asker.candidates("m", None, None)[0].node_id_hex for _ in range(4000))
    assert set(first) == {r.node_id_hex for r in records}
    for record in records:  # 1000 expected each; a fair binomial stays within +-150 (5 sigma)
        assert 850 <= first[record.node_id_hex] <= 1150, first


def test_a_clearly_lower_reputation_is_still_tried_after_the_band():
    rng = random.Random(3)
    reps = {"low": 0.9, "top": 1.0, "near": 0.985, "mid": 0.95}
    for _ in range(50):
        order = rank_by_reputation(list(reps), reps.__getitem__, 0.02, rng)
        assert set(order[:2]) == {"top", "near"} and order[2:] == ["mid", "low"]


def test_band_zero_is_the_exact_order_and_a_negative_band_is_refused():
    reps = {"a": 0.3, "b": 0.9, "c": 0.5}
    assert rank_by_reputation(list(reps), reps.__getitem__, 0.0, random.Random(1)) == ["b", "c", "a"]
    with pytest.raises(ValueError):
        rank_by_reputation(list(reps), reps.__getitem__, -0.1, random.Random(1))
