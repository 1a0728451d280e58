"""The linkability model of the code (sims/linkability.py) against cases with known answers."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from sims import linkability as lk
from sims.common import SimArgumentError

DAY = lk.DAY_S
P = lk.POLICY


def _setup(**kw) -> lk.Setup:
    base = dict(users=10_000, f=0.1, observed=400, asks_per_day=24.0, horizon_s=DAY, lifetime_s=math.inf)
    base.update(kw)
    return lk.Setup(**base)


def _bad(*cells, n=4, l=3) -> np.ndarray:
    """One ask whose colluding hops are the (path, hop) cells given (hop 0 = first)."""
    m = np.zeros((1, n, l), dtype=bool)
    for p, h in cells:
        m[0, p, h] = True
    return m


def test_no_colluders_no_link_and_entropy_one():
    for policy in lk.POLICIES:
        fig = lk.figures(lk.simulate(_setup(f=0.0), policy, seed=1))
        assert fig.asks > 0 and fig.asks_linked == 0 and fig.users_linked == 0
        assert fig.entropy == pytest.approx(1.0)


def test_position_known_a_colluding_first_hop_on_any_of_the_n_paths_names_the_sender():
    setup = _setup()
    fig = lk.figures(lk.simulate(setup, P["today"], seed=2))
    q = setup.colluders / setup.relays
    want = 1 - (1 - q) ** setup.n
    assert abs(fig.asks_named - want) < 4 * math.sqrt(want * (1 - want) / fig.asks) + 0.01
    # over a day a user meets 96 sets of 6 first hops: almost everyone is linked
    assert fig.users_linked > 0.99


def test_with_guards_a_user_is_linked_exactly_when_its_guard_colludes():
    setup = _setup(horizon_s=3 * DAY, observed=2_000)
    asks = lk.simulate(setup, P["all"], seed=3)
    fig = lk.figures(asks)
    assert abs(fig.users_linked - 0.1) < 4 * math.sqrt(0.09 / fig.users)
    per_user = {}
    for u, named in zip(asks.user, asks.named):
        per_user.setdefault(int(u), set()).add(bool(named))
    assert all(len(v) == 1 for v in per_user.values())  # one guard over 3 days: all or none


def test_guards_that_rotate_expose_a_user_once_per_guard():
    setup = _setup(horizon_s=3 * DAY, observed=2_000, guard_life_s=(DAY, DAY), asks_per_day=24.0)
    fig = lk.figures(lk.simulate(setup, P["guards"], seed=4))
    want = 1 - 0.9 ** 3
    assert abs(fig.users_linked - want) < 4 * math.sqrt(want * (1 - want) / fig.users)


def test_asks_of_one_renewal_period_share_proxies_and_fresh_proxies_share_none():
    one_window = _setup(horizon_s=600.0, asks_per_day=2_000.0)  # every ask inside one 15-min period
    assert lk.figures(lk.simulate(one_window, P["today"], seed=5)).pairs_proxy == 1.0
    assert lk.figures(lk.simulate(one_window, P["fresh"], seed=5)).pairs_proxy == 0.0
    day = lk.figures(lk.simulate(_setup(), P["today"], seed=5))
    assert 0 < day.pairs_proxy < 0.1  # pairs in one period of 96
    # shared proxies spread a named ask to the asks of its period
    assert day.asks_linked > day.asks_named


def test_two_asks_of_a_period_take_all_six_paths():
    setup = _setup()
    window = np.array([0, 0, 1])
    rank = np.array([0, 1, 0])
    picked = lk._pick(np.random.default_rng(1), window, rank, 2, setup)
    assert set(picked[0]) | set(picked[1]) == set(range(6)) and len(set(picked[0])) == 4


@pytest.mark.parametrize("cells, named, q", [
    ([(0, 0)], False, 0.5),  # one colluder at hop 1: hop 1 or hop 2, nothing tells
    ([(1, 1)], False, 0.5),  # ... at hop 2: the same view
    ([(0, 0), (1, 2)], True, 1.0),  # a colluding proxy on the ask anchors the levels
    ([(0, 0), (1, 0)], True, 1.0),  # two first hops with one predecessor: only the sender is that
    ([(0, 1), (2, 1)], False, 0.0),  # two hop-2 colluders, two predecessors: not hop 1
    ([(0, 0), (3, 1)], True, 1.0),  # levels 1 and 2 seen: absolute
    ([(2, 2)], False, 0.0),  # a colluding proxy alone names nobody
])
def test_hidden_position_inference(cells, named, q):
    got_named, got_q = lk.infer(_bad(*cells), P["hidden"], model_colludes=True)
    assert bool(got_named[0]) is named and got_q[0] == pytest.approx(q)
    known_named, _ = lk.infer(_bad(*cells), P["today"], model_colludes=True)
    assert bool(known_named[0]) is any(h == 0 for _, h in cells)


def test_without_the_model_node_naming_needs_a_colluding_proxy():
    hop1 = _bad((0, 0))
    assert lk.infer(hop1, P["today"], True)[0][0] and not lk.infer(hop1, P["today"], False)[0][0]
    assert lk.infer(_bad((0, 0), (2, 2)), P["today"], False)[0][0]


def test_exact_draws_are_distinct_per_row_and_avoid_the_guard():
    setup = _setup(users=20)
    rng = np.random.default_rng(7)
    ids = lk.draw_relays(rng, 50, 18, setup, avoid=np.full(50, 3))
    assert all(len(set(r)) == 18 for r in ids.tolist()) and not (ids == 3).any()
    wrap = lk.draw_relays(rng, 5, 30, setup)  # more slots than relays: every relay used, then again
    assert all(set(r[:19]) == set(range(19)) for r in wrap.tolist())


def test_the_defaults_meet_the_guard_bound_only_without_guard_turnover():
    setup = _setup(horizon_s=30 * DAY, observed=1_000, asks_per_day=6.0)
    still = lk.figures(lk.simulate(setup, P["all"], seed=8))
    churn = lk.figures(lk.simulate(replace(setup, lifetime_s=30 * DAY), P["all"], seed=8))
    assert still.users_linked < 0.1 + 4 * math.sqrt(0.09 / still.users)
    assert churn.users_linked > still.users_linked
    today = lk.figures(lk.simulate(setup, P["today"], seed=8))
    assert today.users_linked > 0.99


def test_interval_and_seed_reproduce():
    setup = _setup(users=20, observed=1, asks_per_day=200.0, horizon_s=3 * 3600.0)
    lo, mean, hi = lk.share_interval(setup, P["today"], "asks_named", runs=200, seed=1)
    assert 0 <= lo < mean < hi <= 1
    assert lk.share_interval(setup, P["today"], "asks_named", runs=200, seed=1) == (lo, mean, hi)


def test_cli_writes_csv_markdown_png(tmp_path):
    argv = ["--N", "2000", "--observed", "60", "--f", "0.1", "--goal-days", "2", "--sweep", "30,0",
            "--out", str(tmp_path)]
    assert lk.main(argv) == 0
    assert (tmp_path / "linkability.csv").read_text().startswith("policy,f,entropy,asks_named")
    md = (tmp_path / "linkability.md").read_text()
    assert "| f | today | hidden | guards | fresh | all |" in md and "The goal" in md
    assert (tmp_path / "linkability.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_parameters_are_refused(tmp_path):
    assert lk.run_main(lk.main, ["--N", "2", "--out", str(tmp_path)]) == 2
    with pytest.raises(SimArgumentError):
        lk.main(["--observed", "0", "--out", str(tmp_path)])
    assert not (tmp_path / "linkability.csv").exists()
