"""The order in which a user tries the trusted model nodes of one model: by reputation, fairly.

Why a band and not the exact value: reputations are floats updated every epoch, so one slightly
unlucky challenge leaves an honest node at 0.99999994 next to nodes at exactly 1.0. Sorting on
the exact value then sends it no traffic at all until it is back at 1.0 (~33 epochs of the
reputation update), although the committee considers it just as trustworthy. Nodes whose
reputation lies within `band` of the best remaining one are treated as equal and shuffled with
the user's CSPRNG, so each gets its fair share of first choices; a clearly lower reputation is
still tried later.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence, TypeVar

__all__ = ["rank_by_reputation"]

T = TypeVar("T")


def rank_by_reputation(nodes: Sequence[T], reputation: Callable[[T], float], band: float,
                       rng: random.Random) -> list[T]:
    """`nodes` best first, shuffled within tiers of reputations less than `band` apart.

    Tiers are cut greedily from the top: a tier holds every node within `band` of its best
    member, so the ranking never depends on where fixed bucket edges happen to fall.
    """
    if band < 0:
        raise ValueError(f"band must be >= 0, got {band}")
    remaining = sorted(nodes, key=reputation, reverse=True)
    ranked: list[T] = []
    while remaining:
        top = reputation(remaining[0])
        cut = next((i for i, n in enumerate(remaining) if reputation(n) < top - band), len(remaining))
        tier = remaining[:cut]
        rng.shuffle(tier)
        ranked.extend(tier)
        remaining = remaining[cut:]
    return ranked
