"""A seeded rewrite of a corpus request, so that the challenge is not the corpus text verbatim (pure).

The corpus is public: a node that stored it could look every incoming prompt up and answer
honestly only on a hit. The rewrite changes what an exact or hashed lookup keys on, while
keeping what a user wrote: every number becomes another of the same length, and words with a
common synonym are swapped, in both directions, at rates that keep each form as frequent as in
user traffic. bench/challenge_realism.py measures both the realism of the result and how well
a nearest-neighbour lookup in the corpus still finds it: the rewrite beats an exact or hashed
lookup, not a fuzzy one (the honest state is in ARCHITECTURE.md §3.5).
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from gentorrent.traffic.model import ChatRequest

__all__ = ["disguise", "SWAPS"]

#: interchangeable words and phrases, with how often each occurs in the user and system
#: messages of the challenge pool (counted once, case-insensitive, whole words). A word w
#: becomes its partner v with probability rate * min(1, count_v / count_w), so as many
#: occurrences move each way and neither form becomes more frequent in challenges than in
#: user traffic (a swap that ignores this, "write" -> "compose" half the time, is what the
#: realism bench's classifier picked up first).
SWAPS = (
    ("write", "compose", 6753, 81), ("create", "make", 3641, 4842), ("explain", "describe", 1733, 760),
    ("big", "large", 408, 530), ("quick", "fast", 201, 249), ("simple", "easy", 715, 594),
    ("good", "great", 1654, 1102), ("start", "begin", 1965, 221), ("problem", "issue", 842, 456),
    ("maybe", "perhaps", 420, 110), ("buy", "purchase", 226, 198), ("I want you to", "I would like you to", 745, 54),
    ("can you", "could you", 4509, 528), ("give me", "provide me with", 1779, 80),
    ("important", "essential", 898, 188), ("several", "a few", 342, 511),
    ("help me", "assist me", 527, 93), ("understand", "grasp", 1327, 28),
)
_PARTNER = {w.casefold(): (v, count_v / count_w) for a, b, ca, cb in SWAPS
            for w, v, count_w, count_v in ((a, b, ca, cb), (b, a, cb, ca))}
_WORDS = re.compile(r"\b(?:(an?) )?(" + "|".join(sorted((re.escape(w) for a, b, _, _ in SWAPS for w in (a, b)),
                                                      key=len, reverse=True)) + r")\b", re.I)
_NUMBER = re.compile(r"\d+")


def _match_case(original: str, word: str) -> str:
    if original.isupper() and len(original) > 1:
        return word.upper()
    if original[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _swap(rng: random.Random, m: re.Match, rate: float) -> str:
    article, found = m.group(1), m.group(2)
    partner, ratio = _PARTNER[found.casefold()]
    if rng.random() >= rate * min(1.0, ratio):
        return m.group(0)
    word = _match_case(found, partner)
    if article is None:
        return word
    fixed = "an" if word[:1].casefold() in "aeiou" else "a"
    return f"{_match_case(article, fixed)} {word}"  # "a problem" -> "an issue"


def _number(rng: random.Random, m: re.Match) -> str:
    """Another number of the same length; a year stays in its century ("2019" -> "2047")."""
    digits = m.group(0)
    if len(digits) == 1:
        return str(rng.randrange(10))
    keep = digits[:2] if len(digits) == 4 and digits[:2] in ("19", "20") else digits[:1] if digits[0] == "0" else ""
    head = keep or str(rng.randrange(1, 10))
    return head + "".join(str(rng.randrange(10)) for _ in digits[len(head):])


def rewrite_text(text: str, rng: random.Random, rate: float = 0.5) -> str:
    text = _WORDS.sub(lambda m: _swap(rng, m, rate), text)
    return _NUMBER.sub(lambda m: _number(rng, m), text)


def disguise(request: ChatRequest, rng: random.Random, rate: float = 0.5) -> ChatRequest:
    """The request with every message rewritten (history included: it is corpus text as well)."""
    return replace(request, messages=tuple((role, rewrite_text(content, rng, rate)) for role, content in request.messages))
