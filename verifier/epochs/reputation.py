"""Reputation of one model node across verification epochs (ARCHITECTURE.md §3.5, paper §3.4).

    R(T) = alpha * R(T-1) + beta * C(T)
    and, when c / W > gamma for the c abnormal values (C < tau) among the last W credibilities,
    R(T) = alpha * R(T-1) + (W + 1) / (W + c / gamma + 2) * C(T)

The window includes C(T) itself, so a node is punished in the very epoch its abnormal count
crosses gamma (with W = 5, gamma = 1/5 that is the second abnormal value in five epochs), and it
holds fewer than W values at first; the count is divided by W all the same. The comparison
c / W > gamma is made on exact fractions, so gamma = 1/5 with c = 1 is *not* a punishment
(0.2 > 0.2 is false) on every machine. Below `untrusted_below` a node is untrusted.

Probation (not in the paper): R alone lets a node back in one good epoch after it lost trust. A
selective cheater uses that: untrusted, it gets no real asks and so no audits, answers its
challenges honestly, is trusted again, cheats on real asks until audits catch it, and so on.
So trust, once lost, returns only after `probation_required(offences)` clean epochs in a row
(1, 2, 4, ... for the 1st, 2nd, 3rd loss), and a trusted node whose last `forgive_after`
scored epochs were all clean has one loss forgotten. The cheater's share of trusted epochs
shrinks with every cycle, while an honest node untrusted once (an outage) comes back as soon
as R allows, as before (tests/test_epochs_reputation.py).

Why punishment is asymmetric: a cheater answering most prompts honestly must still lose its
reputation fast, while an honest node's sampling noise must never add up to punishment; both are
checked in tests/test_epochs_reputation.py. Every function here is pure: the committee applies
it in FinalizeBlock to agreed credibilities, so every member computes bit-identical floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Mapping

from gentorrent.config import REPUTATION, ReputationParams

__all__ = [
    "ReputationError",
    "ReputationState",
    "initial_state",
    "update",
    "epoch_credibility",
    "robust_credibility",
    "update_all",
    "is_punished",
    "probation_required",
    "probation_left",
    "in_good_standing",
    "trusted_nodes",
]


class ReputationError(ValueError):
    """A credibility or state outside its domain."""


@dataclass(frozen=True)
class ReputationState:
    """What the committee keeps per model node: R, the last W credibilities, and the verdict."""

    reputation: float
    window: tuple[float, ...] = field(default=())
    untrusted: bool = False
    epochs: int = 0  # epochs in which the node was scored
    offences: int = 0  # times the node lost trust, less those forgiven
    clean: int = 0  # scored epochs in a row with credibility >= tau (probation and forgiveness)


def initial_state(params: ReputationParams = REPUTATION) -> ReputationState:
    """A newly registered node: full reputation, empty window, trusted."""
    return ReputationState(reputation=params.initial_reputation)


def _check_unit(value: float, what: str) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ReputationError(f"{what} must be a number in [0, 1], got {value!r}")


def _gamma_fraction(gamma: float) -> Fraction:
    return Fraction(gamma).limit_denominator(1_000_000)


def is_punished(window: Iterable[float], params: ReputationParams = REPUTATION) -> bool:
    """Whether the abnormal count c of `window` (which includes the current C) has c/W > gamma."""
    c = sum(1 for value in window if value < params.abnormal_threshold)
    return Fraction(c, params.window) > _gamma_fraction(params.gamma)


def probation_required(offences: int, params: ReputationParams = REPUTATION) -> int:
    """Clean epochs in a row an untrusted node with `offences` losses of trust needs to be trusted."""
    if offences <= 0:
        return 0
    return min(params.probation_max, params.probation_epochs * params.probation_growth ** min(offences - 1, 32))


def probation_left(state: ReputationState, params: ReputationParams = REPUTATION) -> int:
    """Clean epochs an untrusted node still needs before its trust can return (R must also be
    back above the line); 0 for a trusted node."""
    if not state.untrusted:
        return 0
    return max(0, probation_required(state.offences, params) - state.clean)


def in_good_standing(state: ReputationState, params: ReputationParams = REPUTATION) -> bool:
    """Whether the committee may forget a node that left: coming back under the same key with a
    fresh state would gain it nothing (trusted, never untrusted, nothing abnormal pending)."""
    return (not state.untrusted and state.offences == 0
            and all(value >= params.abnormal_threshold for value in state.window))


def update(
    state: ReputationState, credibility: float, params: ReputationParams = REPUTATION
) -> ReputationState:
    """One epoch's update from the node's average credibility C(T) in [0, 1]."""
    _check_unit(credibility, "credibility")
    _check_unit(state.reputation, "reputation")
    if params.window < 1 or params.gamma <= 0:
        raise ReputationError("window must be >= 1 and gamma > 0")
    window = (state.window + (float(credibility),))[-params.window :]
    c = sum(1 for value in window if value < params.abnormal_threshold)
    if is_punished(window, params):
        weight = (params.window + 1) / (params.window + c / params.gamma + 2)
    else:
        weight = params.beta
    reputation = params.alpha * state.reputation + weight * credibility
    reputation = min(1.0, max(0.0, reputation))
    clean = state.clean + 1 if credibility >= params.abnormal_threshold else 0
    offences = state.offences
    if state.untrusted:
        untrusted = (reputation < params.untrusted_below or params.sticky_untrusted
                     or clean < probation_required(offences, params))
    else:
        untrusted = reputation < params.untrusted_below
        if untrusted:  # trust lost: one more offence, and probation counts from here
            offences, clean = offences + 1, 0
        elif offences and clean >= params.forgive_after:
            offences, clean = offences - 1, 0
    return ReputationState(reputation, window, untrusted, state.epochs + 1, offences, clean)


def epoch_credibility(scores: Iterable[float]) -> float:
    """C(T): the mean credibility of a node's challenges in one epoch (paper §3.4)."""
    values = list(scores)
    if not values:
        raise ReputationError("no challenge score in this epoch")
    for value in values:
        _check_unit(value, "challenge score")
    return math.fsum(values) / len(values)


def robust_credibility(scores: Iterable[float], params: ReputationParams = REPUTATION) -> float:
    """C(T) from the node's several challenges of one epoch, robust to `outliers_ignored` of them:
    their (outliers_ignored + 1)-th lowest score, never ignoring half of them or more (one
    challenge: its score; two: the lower; three: the median).

    Why not the mean (the paper's) or one challenge: one honest reply the scorer calls abnormal (a
    0.34 in the demo) pulls C(T) under tau, and two such epochs within the window untrust an honest
    node (and one, when R was just under 1: 0.4 R + 0.6 * 0 < 0.4). With m = 6 challenges and two
    outliers ignored, an honest node with a per-reply abnormal rate p has an abnormal epoch with
    probability ~20 p^3 (1.6e-4 at p = 2 %), while a cheater whose replies are abnormal with
    probability q has one with P(Binomial(6, q) >= 3) (66 % at q = 1/2): bench/detection.py
    (robust_rule) shows 0 of 1,000 honest runs untrusted at p = 2 % and every recorded cheater
    kind untrusted within 5 epochs in >= 96 % of runs. With one challenge it is that score.
    """
    values = sorted(float(v) for v in scores)
    if not values:
        raise ReputationError("no challenge score in this epoch")
    for value in values:
        _check_unit(value, "challenge score")
    if params.outliers_ignored < 0:
        raise ReputationError("outliers_ignored must be >= 0")
    return values[min(params.outliers_ignored, (len(values) - 1) // 2)]


def update_all(
    states: Mapping[str, ReputationState],
    credibilities: Mapping[str, float],
    params: ReputationParams = REPUTATION,
) -> dict[str, ReputationState]:
    """The committee-wide update of one epoch; nodes without a credibility keep their state.

    Validates every input before computing anything, so bad input changes nothing.
    """
    for node_id, value in credibilities.items():
        _check_unit(value, f"credibility of {node_id}")
    out = dict(states)
    for node_id in sorted(credibilities):
        out[node_id] = update(states.get(node_id, initial_state(params)), credibilities[node_id], params)
    return out


def trusted_nodes(states: Mapping[str, ReputationState]) -> list[str]:
    """The node ids the directory and every routing table may use, sorted."""
    return sorted(node_id for node_id, state in states.items() if not state.untrusted)
