"""Reputation math of ARCHITECTURE.md §3.5 on hand-computed sequences, and detection behaviour."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gentorrent.config import REPUTATION
from verifier.epochs import reputation as rep


def run(credibilities, params=REPUTATION, state=None):
    state = state or rep.initial_state(params)
    out = []
    for c in credibilities:
        state = rep.update(state, c, params)
        out.append(state)
    return out


def test_plain_moving_average_by_hand():
    # C = 0.5 is not abnormal (tau = 0.5, strictly below counts): R = 0.4 R + 0.6 C
    states = run([0.5, 0.5, 0.5])
    assert [s.reputation for s in states] == pytest.approx([0.7, 0.58, 0.532])
    assert [s.untrusted for s in states] == [False, False, False]
    assert states[-1].window == (0.5, 0.5, 0.5)
    assert states[-1].epochs == 3


def test_punishment_starts_at_second_abnormal_value_by_hand():
    # C = 0.45 < tau. Epoch 1: c = 1, 1/5 > 1/5 is false -> 0.4 + 0.6*0.45 = 0.67.
    # Epoch 2: c = 2 -> weight (5+1)/(5+2/(1/5)+2) = 6/17: 0.4*0.67 + 0.45*6/17 = 0.426823...
    # Epoch 3: c = 3 -> 6/22: 0.4*0.4268235 + 0.45*6/22 = 0.293456...  (untrusted, < 0.4)
    states = run([0.45, 0.45, 0.45])
    r1 = 0.4 * 1.0 + 0.6 * 0.45
    r2 = 0.4 * r1 + 6 / 17 * 0.45
    r3 = 0.4 * r2 + 6 / 22 * 0.45
    assert [s.reputation for s in states] == pytest.approx([0.67, 0.42682353, 0.29345668], abs=1e-8)
    assert [s.reputation for s in states] == pytest.approx([r1, r2, r3])
    assert [s.untrusted for s in states] == [False, False, True]


def test_abnormal_values_leave_the_window_after_w_epochs():
    # 0.1 then four 0.9s: the second 0.1 at epoch 6 sees only one abnormal value in its window
    states = run([0.1, 0.9, 0.9, 0.9, 0.9, 0.1])
    expect = [0.46, 0.724, 0.8296, 0.87184, 0.888736, 0.4 * 0.888736 + 0.6 * 0.1]
    assert [s.reputation for s in states] == pytest.approx(expect)
    assert states[-1].window == (0.9, 0.9, 0.9, 0.9, 0.1)
    assert not states[-1].untrusted
    # ... whereas the same 0.1 one epoch earlier falls inside the window and is punished
    states = run([0.1, 0.9, 0.9, 0.9, 0.1])
    assert states[-1].reputation == pytest.approx(0.4 * 0.87184 + 6 / 17 * 0.1)
    assert states[-1].untrusted


def test_gamma_levels():
    one_third = replace(REPUTATION, gamma=1 / 3)
    s = run([0.2, 0.2], one_third)[-1]  # c = 2: 2/5 > 1/3 -> weight 6/(5+6+2)
    assert s.reputation == pytest.approx(0.4 * (0.4 + 0.6 * 0.2) + 6 / 13 * 0.2)
    lenient = replace(REPUTATION, gamma=1.0)  # c/W > 1 never holds: no punishment at all
    states = run([0.2] * 6, lenient)
    r = 1.0
    for s in states:
        r = 0.4 * r + 0.6 * 0.2
        assert s.reputation == pytest.approx(r)


def test_sticky_untrusted_and_recovery():
    states = run([0.0, 0.9])  # one zero: 0.4 * 1.0 = 0.4 is not below 0.4; another zero would be
    assert not states[0].untrusted
    states = run([0.9, 0.0, 0.9])
    assert states[1].untrusted and not states[2].untrusted  # recovers by default
    sticky = replace(REPUTATION, sticky_untrusted=True)
    states = run([0.9, 0.0, 0.9, 0.9, 0.9], sticky)
    assert all(s.untrusted for s in states[1:])


def _cheat_whenever_trusted(params, epochs=35) -> list[rep.ReputationState]:
    """A selective cheater that real asks (and so audits) reach only while it is trusted: it
    scores 0 in every epoch it starts trusted, and answers every challenge honestly otherwise."""
    state, out = rep.initial_state(params), []
    for _ in range(epochs):
        state = rep.update(state, 1.0 if state.untrusted else 0.0, params)
        out.append(state)
    return out


def test_attack_a_cheater_trusted_again_after_each_clean_epoch_is_held_on_probation():
    """The attack: untrusted, a selective cheater gets no real asks and so no audits, answers its
    challenges honestly and is trusted again one epoch later; then it cheats on real asks until
    audits catch it, and again. R alone let it be trusted in 17 of 35 epochs. Probation doubles
    with each loss of trust (1, 2, 4, 8, 16 clean epochs): 5 of 35, each time shorter."""
    without = replace(REPUTATION, probation_growth=1)
    assert sum(not s.untrusted for s in _cheat_whenever_trusted(without)) == 17
    states = _cheat_whenever_trusted(REPUTATION)
    assert sum(not s.untrusted for s in states) == 5
    runs, run = [], 0
    for s in states:  # lengths of the untrusted stretches
        if s.untrusted:
            run += 1
        elif run:
            runs, run = runs + [run], 0
    assert runs == [1, 2, 4, 8]
    assert states[-1].offences == 5 and rep.probation_required(5) == 16
    assert rep.probation_left(states[-1]) == 16 - states[-1].clean and not rep.in_good_standing(states[-1])
    assert rep.probation_left(states[0]) == 0 and rep.in_good_standing(rep.initial_state())
    assert rep.probation_required(40) == REPUTATION.probation_max and rep.probation_required(0) == 0


def test_a_first_loss_of_trust_costs_no_more_than_without_probation():
    """An honest node untrusted once (two epochs down, scored 0) comes back as it did before."""
    outage = [0.95, 0.0, 0.0] + [0.95] * 6
    plain = run(outage, replace(REPUTATION, probation_epochs=0))
    held = run(outage)
    assert [s.untrusted for s in held] == [s.untrusted for s in plain]
    back = next(i for i in range(3, len(held)) if not held[i].untrusted)
    assert held[2].untrusted and back == 4 and held[-1].offences == 1  # R needs two clean epochs anyway


def test_a_node_clean_for_forgive_after_epochs_has_one_loss_forgotten():
    params = replace(REPUTATION, forgive_after=6)
    states = run([0.0, 0.0] + [0.95] * 12, params)
    assert states[1].untrusted and states[1].offences == 1
    first_forgiven = next(i for i in range(2, len(states)) if states[i].offences == 0)
    assert first_forgiven == 1 + 6 and not states[first_forgiven].untrusted  # 6 clean epochs after the loss
    assert all(s.offences == 1 for s in states[1:first_forgiven])


def test_bad_input_is_rejected_without_state_change():
    state = rep.initial_state()
    for bad in (-0.1, 1.5, float("nan"), "0.5", None):
        with pytest.raises(rep.ReputationError):
            rep.update(state, bad)  # type: ignore[arg-type]
    states = {"a": state}
    with pytest.raises(rep.ReputationError):
        rep.update_all(states, {"a": 0.9, "b": 2.0})
    assert states == {"a": state}
    with pytest.raises(rep.ReputationError):
        rep.epoch_credibility([])


def test_update_all_and_trusted_nodes():
    states = {"honest": rep.initial_state(), "idle": rep.initial_state()}
    for _ in range(3):
        states = rep.update_all(states, {"honest": 0.9, "cheater": 0.1})
    assert states["idle"] == rep.initial_state()  # not probed: unchanged
    assert states["cheater"].untrusted and not states["honest"].untrusted
    assert rep.trusted_nodes(states) == ["honest", "idle"]
    assert rep.epoch_credibility([0.2, 0.4, 0.9]) == pytest.approx(0.5)


def _epochs_until_untrusted(draw, params=REPUTATION, epochs=35):
    state = rep.initial_state(params)
    for t in range(1, epochs + 1):
        state = rep.update(state, draw(), params)
        if state.untrusted:
            return t
    return None


@pytest.mark.parametrize("seed", range(20))
def test_simulated_cheaters_untrusted_within_5_epochs_honest_never(seed):
    rng = random.Random(seed)
    # a cheater whose every reply scores below tau
    assert _epochs_until_untrusted(lambda: rng.uniform(0.0, 0.49)) <= 5
    # a selective cheater: honest-looking on 40 % of the challenges
    assert _epochs_until_untrusted(lambda: 0.9 if rng.random() < 0.4 else rng.uniform(0.0, 0.45)) <= 8
    # honest nodes with sampling noise in [0.7, 0.95] over 35 epochs
    state = rep.initial_state()
    for _ in range(35):
        state = rep.update(state, rng.uniform(0.7, 0.95))
        assert not state.untrusted and state.reputation >= 0.7


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.7, max_value=1.0), min_size=1, max_size=35))
def test_honest_credibilities_never_untrusted(credibilities):
    for state in run(credibilities):
        assert not state.untrusted


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=20),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_reputation_stays_in_unit_interval_and_is_monotone_in_credibility(history, c):
    state = run(history)[-1]
    lo = rep.update(state, c * 0.5)
    hi = rep.update(state, c)
    assert 0.0 <= lo.reputation <= 1.0 and 0.0 <= hi.reputation <= 1.0
    # a better reply never earns less: same window except the new value
    assert hi.reputation >= lo.reputation - 1e-12


# --------------------------------------------------------------------------- several challenges an epoch


def test_one_abnormal_challenge_among_an_epochs_several_is_not_the_epochs_credibility():
    """The demo's honest 0.34 among otherwise clean replies: C(T) is not abnormal."""
    from verifier.epochs.reputation import robust_credibility

    assert robust_credibility([1.0, 0.34, 1.0, 0.98, 1.0, 1.0]) >= REPUTATION.abnormal_threshold
    assert robust_credibility([1.0, 0.34, 0.1, 1.0, 1.0, 1.0]) >= REPUTATION.abnormal_threshold


def test_a_cheater_abnormal_on_half_its_challenges_has_an_abnormal_epoch():
    from verifier.epochs.reputation import robust_credibility

    assert robust_credibility([0.0, 0.1, 0.2, 1.0, 1.0, 1.0]) < REPUTATION.abnormal_threshold
    assert robust_credibility([0.3]) == 0.3  # one challenge: its score, as before
    assert robust_credibility([0.3, 0.9]) == 0.3  # never half of them ignored
    assert robust_credibility([0.3, 0.9, 0.8]) == 0.8


def test_the_robust_credibility_refuses_bad_scores_and_changes_nothing():
    from verifier.epochs.reputation import ReputationError, robust_credibility

    for bad in ([], [1.2], [float("nan"), 1.0]):
        with pytest.raises(ReputationError):
            robust_credibility(bad)
