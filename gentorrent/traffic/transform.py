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


#: the commonest numbers of each length in the challenge pool's user messages, with counts, and
#: the share of that length they cover; a number is replaced by one drawn from this (else a
#: uniform one of the same length), so challenges have users' round numbers and recent years
#: (uniform digits were the realism bench's strongest text signal: "10" marked real requests)
_COMMON_NUMBERS = {
    1: (("1", 15503), ("2", 11882), ("0", 11349), ("3", 8524), ("4", 6051), ("5", 5392), ("8", 2850), ("7", 2764),
        ("6", 2751), ("9", 1752)),
    2: (("10", 3980), ("15", 2705), ("00", 2041), ("36", 1805), ("12", 1702), ("20", 1632), ("01", 1525), ("22", 1357),
        ("11", 1215), ("14", 1168), ("50", 1167), ("30", 1103), ("13", 943), ("24", 885), ("18", 878), ("16", 860),
        ("23", 845), ("17", 772), ("25", 742), ("32", 673), ("19", 662), ("04", 633), ("40", 632), ("07", 629),
        ("03", 623), ("02", 591), ("26", 582), ("21", 580), ("05", 553), ("27", 550), ("64", 549), ("29", 548)),
    3: (("100", 1129), ("000", 678), ("200", 441), ("500", 365), ("255", 291), ("300", 279), ("256", 278), ("150", 236),
        ("400", 205), ("800", 160), ("120", 149), ("250", 132), ("600", 97), ("700", 94), ("110", 91), ("127", 80),
        ("512", 78), ("750", 77), ("900", 70), ("350", 70), ("365", 65)),
    4: (("2023", 1389), ("2022", 934), ("2021", 376), ("2020", 295), ("2019", 264), ("1000", 259), ("2000", 208),
        ("2010", 150), ("2018", 148), ("2007", 143), ("2016", 139), ("2013", 129), ("2017", 123), ("2009", 121),
        ("2005", 118), ("2004", 114), ("2006", 114), ("2002", 111), ("2012", 108), ("2008", 106), ("2014", 104),
        ("2015", 102), ("2003", 95), ("1992", 83), ("5000", 78), ("2001", 75), ("2011", 71), ("3000", 66)),
}
_TOTAL_NUMBERS = {1: 68819, 2: 49976, 3: 20390, 4: 11195}  # all numbers of that length


def _number(rng: random.Random, m: re.Match) -> str:
    """Another number of the same length, as users write them (_COMMON_NUMBERS)."""
    digits = m.group(0)
    common = _COMMON_NUMBERS.get(len(digits), ())
    pick = rng.random() * _TOTAL_NUMBERS.get(len(digits), 1)
    for value, count in common:
        pick -= count
        if pick < 0:
            return value
    return str(rng.randrange(1, 10)) + "".join(str(rng.randrange(10)) for _ in digits[1:])


def rewrite_text(text: str, rng: random.Random, rate: float = 0.5) -> str:
    text = _WORDS.sub(lambda m: _swap(rng, m, rate), text)
    return _NUMBER.sub(lambda m: _number(rng, m), text)


def disguise(request: ChatRequest, rng: random.Random, rate: float = 0.5) -> ChatRequest:
    """The request with every message rewritten (history included: it is corpus text as well)."""
    return replace(request, messages=tuple((role, rewrite_text(content, rng, rate)) for role, content in request.messages))
