"""A challenge as the committee draws it: a traffic-model request from the challenge pool, rewritten (pure).

It lives in the base, public, on purpose: the committee's secret is its seed, not its method
(verifier.epochs.challenges seeds it with the leader's private randomness), and a model node
may run this very function with seeds of its own to label as many challenges as it likes (the
cheater zoo's selective node trains on them). What must stay unpredictable is which request
is drawn, never how. A node that stores the public corpus can look its draws up, though; a
challenge made of a user's donated audited ask (`donated_challenge`: the leader's private pool,
verifier/epochs/donations.py) is in no corpus.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

from gentorrent.config import TRAFFIC, TrafficParams
from gentorrent.traffic.model import ChatRequest, TrafficPool, draw
from gentorrent.traffic.transform import disguise

__all__ = ["draw_challenge", "donated_challenge"]


def _rng(seed: bytes, node_id: str, attempt: int) -> random.Random:
    digest = hashlib.sha256(b"gentorrent/challenge-draw/v1" + seed + node_id.encode("utf-8")
                            + attempt.to_bytes(4, "big")).digest()
    return random.Random(int.from_bytes(digest, "big"))


def draw_challenge(pool: TrafficPool, seed: bytes, node_id: str, attempt: int = 0,
                   temperature: float | None = None, max_tokens_cap: int | None = None,
                   params: TrafficParams = TRAFFIC) -> ChatRequest:
    """The challenge for (seed, node, attempt); TrafficError when it falls out of bounds.

    `attempt` lets the caller redraw on a collision; `temperature` and `max_tokens_cap` exist
    for tests on a slow machine (greedy replies, short replies) and are None in deployments."""
    rng = _rng(seed, node_id, attempt)
    return _finish(draw(rng, pool, params).request, rng, temperature, max_tokens_cap, params)


def donated_challenge(donated: ChatRequest, seed: bytes, node_id: str, attempt: int = 0,
                      temperature: float | None = None, max_tokens_cap: int | None = None,
                      params: TrafficParams = TRAFFIC) -> ChatRequest:
    """The challenge made of a user's donated audited ask: its messages rewritten like any
    challenge's, its client's own sampling and streaming kept (a real client's, not a profile's),
    a fresh session id when it carries history. Arguments as draw_challenge's."""
    rng = _rng(seed, node_id, attempt)
    return _finish(donated.with_session(rng), rng, temperature, max_tokens_cap, params)


def _finish(request: ChatRequest, rng: random.Random, temperature: float | None, max_tokens_cap: int | None,
            params: TrafficParams) -> ChatRequest:
    request = disguise(request, rng)
    if temperature is not None:
        request = replace(request, temperature=temperature)
    if max_tokens_cap is not None:
        request = replace(request, max_tokens=min(request.max_tokens, max_tokens_cap))
    request.check(params)  # the rewrite may lengthen a transcript past its bound
    return request
