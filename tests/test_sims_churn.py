"""The churn simulator against analytic cases (paper §5.2)."""

from __future__ import annotations

import numpy as np
import pytest

from sims import churn as ch

USERS, RATE = 3_119, 200


def _schedule(seed=1, horizon=1_900.0):
    return ch.ChurnSchedule(USERS, RATE, horizon, np.random.default_rng(seed))


def test_next_departure_is_the_first_leave_after_the_instant():
    s = _schedule()
    keys = s._keys  # (slot * span + time), sorted
    slots = np.floor(keys / s._span).astype(np.int64)
    times = keys - slots * s._span
    slot = int(slots[0])
    mine = np.sort(times[slots == slot])
    assert s.next_departure(np.array([slot]), 0.0)[0] == pytest.approx(mine[0])
    assert s.next_departure(np.array([slot]), float(mine[0]))[0] == pytest.approx(
        mine[1] if mine.size > 1 else np.inf)
    quiet = sorted(set(range(USERS)) - set(slots.tolist()))
    if quiet:  # a slot nobody leaves from lives through the horizon
        assert np.isinf(s.next_departure(np.array([quiet[0]]), 0.0)[0])
    assert (times >= 0).all() and times.size == RATE * 33


def test_n_equals_k_one_relay_failure_loses_the_message():
    alive = np.array([True, True, False, True])
    assert not ch.survives(alive, k=4)
    assert ch.survives(alive, k=3)
    assert ch.survives(np.ones(4, dtype=bool), k=4)


@pytest.mark.parametrize("n", [1, 3])
def test_k_one_survival_is_one_minus_path_failure_to_the_n(n):
    runs = 8
    system = ch.System("x", "x", paths=n, hops=3, k=1, repair=False)
    grid = np.array([60.0, 180.0, 300.0])
    got = np.zeros(grid.size)
    for r in range(runs):
        rng = np.random.default_rng([7, r])
        got += ch.static_survival(_schedule(r + 1, 400.0), system, grid, 0.0, rng)
    got /= runs
    for t, g in zip(grid, got):
        path_alive = ch.relay_survival(USERS, RATE, t / 60.0) ** 3
        want = 1.0 - (1.0 - path_alive) ** n
        assert g == pytest.approx(want, abs=0.02)


def test_instant_repair_always_survives():
    system = ch.System("r", "r", paths=4, hops=3, k=3, repair=True)
    grid = np.arange(0.0, 601.0, 10.0)
    surv = ch.repair_survival(_schedule(horizon=700.0), system, grid, request_s=0.0,
                              detect_s=0.0, renewal_s=900.0, rng=np.random.default_rng(3))
    assert surv.min() == 1.0


def test_repair_that_never_happens_equals_static_paths():
    grid = np.arange(0.0, 601.0, 30.0)
    sched = _schedule(horizon=700.0)
    static = ch.System("s", "s", 4, 3, 3, False)
    late = ch.System("r", "r", 4, 3, 3, True)
    a = ch.static_survival(sched, static, grid, 0.0, np.random.default_rng(5))
    b = ch.repair_survival(sched, late, grid, 0.0, detect_s=10_000.0, renewal_s=10_000.0,
                           rng=np.random.default_rng(5))
    assert np.array_equal(a, b)
    assert a[-1] < 0.2  # and the static paths do die


def test_repair_beats_static_and_detection_delay_matters():
    kw = dict(users=1_000, leaves_per_min=64, duration_min=10.0, step_s=30.0, n=4, k=3, l=3,
              onion_l=3, walk_hops=6, runs=2, seed=4, renewal_s=900.0, request_s=0.0)
    fast = ch.run(detect_s=1.0, **kw)
    slow = ch.run(detect_s=60.0, **kw)
    worst = {t: min(float(d["survival"]) for d in t.select(system="gentorrent_repair"))
             for t in (fast, slow)}
    assert worst[fast] > worst[slow]
    last_static = fast.select(system="gentorrent_static")[-1]["survival"]
    assert worst[fast] > 0.99 > last_static


def test_seed_reproduces_exactly():
    kw = dict(users=500, leaves_per_min=30, duration_min=5.0, step_s=30.0, n=4, k=3, l=3,
              onion_l=3, walk_hops=6, runs=2, detect_s=10.0, renewal_s=900.0, request_s=0.0)
    assert ch.run(seed=1, **kw) == ch.run(seed=1, **kw)
    assert ch.run(seed=1, **kw).column("survival") != ch.run(seed=2, **kw).column("survival")


def test_cli_writes_outputs_and_refuses_bad_input(tmp_path):
    args = ["--N", "400", "--churn", "20", "--duration", "4", "--step-s", "30", "--runs", "2",
            "--sweep", "10,40", "--sweep-runs", "1", "--out", str(tmp_path)]
    assert ch.main(args) == 0
    for name in ("churn.csv", "churn.md", "churn.png", "churn_sweep.csv", "churn_sweep.png"):
        assert (tmp_path / name).stat().st_size > 0
    bad = tmp_path / "bad"
    assert ch.run_main(ch.main, ["--churn", "-1", "--out", str(bad)]) == 2
    assert ch.run_main(ch.main, ["--sweep", "x", "--out", str(bad)]) == 2
    assert not bad.exists()


def test_closed_form_matches_simulation_and_threshold():
    system = ch.System("s", "s", 4, 3, 3, False)
    grid = np.array([120.0])
    got = np.mean([ch.static_survival(_schedule(r + 1, 300.0), system, grid, 0.0,
                                      np.random.default_rng(r))[0] for r in range(6)])
    assert got == pytest.approx(ch.static_survival_analytic(system, USERS, RATE, 2.0), abs=0.02)
    r80 = ch.max_churn_for(system, USERS, 15.0, 0.8)
    assert ch.static_survival_analytic(system, USERS, r80, 15.0) == pytest.approx(0.8, abs=1e-6)
    assert ch.static_survival_analytic(system, USERS, RATE, 15.0) < 0.8
