"""Challenges the reference model writes fresh, in the style of real users (pure).

Why: a challenge made of corpus text, however rewritten, is found by a node that stored the
public corpus (gentorrent/traffic/lookup.py undoes the old rewrite exactly, and any verbatim
span shows in its shingles). Text no public index holds has to be new text. So the leader has
the reference model write it: for each challenge, the traffic model picks the shape and the
client profile as before, and the reference writes the user's message(s) after a few real user
messages of that shape (`shots`, drawn with the leader's private randomness from the challenge
pool), as one more message of the same conversation-less list. The shots set the style and
length; the model sets the words. A composition that copies a corpus span is refused
(`CorpusIndex.copied`) and written again.

Sessions: a follow-up challenge carries a history. Its earlier user turns are composed the same
way and its assistant turns are the reference's own replies to them (stage 1: in deployment the
earlier turns are to be the probed node's own: a real session with it).

Everything here is pure and seeded: `plan` says what to write, `generation_prompt` renders the
text the reference continues, `finish` assembles the ChatRequest from what the model wrote. The
shell that runs the model is the leader's (bench/challenge_realism.py --compose uses the same
functions). Cost: one short generation per user turn (~40-120 tokens after ~300 tokens of
shots), one reply per history turn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from gentorrent.config import TRAFFIC, TrafficParams
from gentorrent.traffic.model import (COMMON_SYSTEM_PROMPTS, ChatRequest, TrafficError, TrafficPool, client_sampling,
                                      weighted_choice)

__all__ = ["Composition", "plan", "generation_prompt", "finish", "WRITE_SAMPLING", "SHOTS"]

SHOTS = 4  # real messages shown before the one the model writes
SHOT_CHARS = 600  # a shot longer than this is cut (prefill cost; documents keep their opening)
#: how the reference writes a user message: sampled (a greedy writer repeats itself), short of
#: the pool's longest messages (a 135M model drifts after a few hundred tokens)
WRITE_SAMPLING = {"temperature": 1.0, "top_p": 0.95}
WRITE_TOKENS = {"single": 120, "system": 120, "session": 80, "document": 500, "code": 400}
#: ChatML, the reference model's own turn markers (SmolLM2): each shot one user turn
TURN_OPEN, TURN_CLOSE = "<|im_start|>user\n", "<|im_end|>\n"


@dataclass(frozen=True)
class Composition:
    """What one challenge will be: its shape and client, the shots for each user turn to write
    (the last one is the asked turn), and a system prompt when the shape has one."""

    shape: str
    client: str
    sampling: dict
    shots: tuple[tuple[str, ...], ...]  # one tuple of shots per user turn, oldest first
    system: str = ""


def _cut(text: str) -> str:
    return text if len(text) <= SHOT_CHARS else text[:SHOT_CHARS].rsplit(" ", 1)[0]


def _followups(pool: TrafficPool) -> tuple[str, ...]:
    return tuple(s[-1][1] for s in pool.sessions)


def plan(pool: TrafficPool, rng: random.Random, params: TrafficParams = TRAFFIC) -> Composition:
    """The shape, client profile and shots of one composed challenge (seeded)."""
    shape = weighted_choice(rng, params.shape_weights)
    client = weighted_choice(rng, params.client_weights)
    firsts = {"single": pool.singles, "system": pool.singles, "session": pool.singles,
              "document": pool.documents, "code": pool.code}[shape]
    turns = [tuple(_cut(t) for t in rng.sample(firsts, SHOTS))]
    if shape == "session":
        follow = _followups(pool)
        for _ in range(rng.choice((1, 1, 2))):  # one or two follow-ups (ShareGPT: mostly short sessions)
            turns.append(tuple(_cut(t) for t in rng.sample(follow, SHOTS)))
    # a client's own default, never one of the corpus's personas (those are corpus text, found)
    system = rng.choice(COMMON_SYSTEM_PROMPTS) if shape == "system" else ""
    return Composition(shape, client, client_sampling(client, rng, params), tuple(turns), system)


def generation_prompt(shots: tuple[str, ...]) -> str:
    """The raw text the reference continues to write one more user message like the shots."""
    return "".join(f"{TURN_OPEN}{s}{TURN_CLOSE}" for s in shots) + TURN_OPEN


def written(text: str) -> str:
    """A written message cleaned as a user's would be: up to the model's turn end, trimmed."""
    return text.split("<|im_end|>")[0].split("<|im_start|>")[0].strip()


def finish(composition: Composition, users: list[str], assistants: list[str], rng: random.Random,
           params: TrafficParams = TRAFFIC) -> ChatRequest:
    """The challenge from the written user turns (oldest first) and the assistant replies between
    them; TrafficError when a turn came out empty or the request out of bounds."""
    if len(users) != len(composition.shots) or len(assistants) != len(users) - 1:
        raise TrafficError("one written message per planned turn, one reply between each two")
    if any(len(u) < params.min_user_chars for u in users) or any(not a.strip() for a in assistants):
        raise TrafficError("a written turn is too short")
    messages: list[tuple[str, str]] = [("system", composition.system)] if composition.system else []
    for i, u in enumerate(users):
        if i:
            messages.append(("assistant", assistants[i - 1]))
        messages.append(("user", u))
    request = ChatRequest(tuple(messages), **composition.sampling).with_session(rng)
    request.check(params)
    return replace(request)
