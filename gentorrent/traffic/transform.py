"""A seeded rewrite of a corpus request, so that the challenge is not the corpus text verbatim (pure).

The corpus is public: a node that stored it could look every incoming prompt up and answer
honestly only on a hit. The rewrite changes what an exact or hashed lookup keys on, while
keeping what a user wrote: every number becomes another of the same length, and words with a
common synonym are swapped, in both directions, so that neither form becomes more frequent in
challenges than in user traffic (bench/challenge_realism.py measures both the realism of the
result and how well a nearest-neighbour lookup in the corpus still finds it).
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from gentorrent.traffic.model import ChatRequest

__all__ = ["disguise", "SWAPS"]

#: interchangeable words and phrases (each group: any member may stand for any other)
SWAPS = (
    ("write", "compose"), ("create", "make"), ("explain", "describe"), ("big", "large"), ("quick", "fast"),
    ("simple", "easy"), ("good", "great"), ("start", "begin"), ("problem", "issue"), ("maybe", "perhaps"),
    ("buy", "purchase"), ("I want you to", "I would like you to"), ("can you", "could you"),
    ("give me", "provide me with"), ("important", "essential"), ("several", "a few"), ("also", "as well"),
    ("show me", "give me"), ("help me", "assist me"), ("understand", "grasp"), ("answer", "reply"),
)
_INDEX = {w.casefold(): group for group in SWAPS for w in group}
_WORDS = re.compile(r"\b(" + "|".join(sorted((re.escape(w) for g in SWAPS for w in g), key=len, reverse=True))
                    + r")\b", re.I)
_NUMBER = re.compile(r"\d+")


def _match_case(original: str, word: str) -> str:
    if original.isupper() and len(original) > 1:
        return word.upper()
    if original[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _swap(rng: random.Random, m: re.Match, rate: float) -> str:
    found = m.group(0)
    if rng.random() >= rate:
        return found
    choices = [w for w in _INDEX[found.casefold()] if w.casefold() != found.casefold()]
    return _match_case(found, rng.choice(choices))


def _number(rng: random.Random, m: re.Match) -> str:
    digits = m.group(0)
    if len(digits) == 1:
        return str(rng.randrange(10))
    return str(rng.randrange(1, 10)) + "".join(str(rng.randrange(10)) for _ in digits[1:])


def rewrite_text(text: str, rng: random.Random, rate: float = 0.5) -> str:
    text = _WORDS.sub(lambda m: _swap(rng, m, rate), text)
    return _NUMBER.sub(lambda m: _number(rng, m), text)


def disguise(request: ChatRequest, rng: random.Random, rate: float = 0.5) -> ChatRequest:
    """The request with every message rewritten (history included: it is corpus text as well)."""
    return replace(request, messages=tuple((role, rewrite_text(content, rng, rate)) for role, content in request.messages))
