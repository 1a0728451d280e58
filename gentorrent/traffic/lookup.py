"""What a node that stored the public corpus can look an incoming request up in (pure).

The corpus challenges used to be drawn from is public, and so is every rule that rewrote them.
A node that keeps the corpus can undo any published rewrite and look a request up; these are
the lookups the committee assumes it runs, strongest first (bench/challenge_realism.py measures
each, and a sentence-embedding nearest neighbour, against real prompts from outside the index):

    exact        the request's messages after `normalise` (case, digits -> 0, every word of the
                 old rewrite's SWAPS to one form, "an" -> "a", punctuation and spacing): what
                 undoes the rewrite of gentorrent/traffic/transform.py exactly
    containment  the share of a message's word 5-gram shingles (normalised) that occur anywhere
                 in the corpus: a verbatim span of a corpus message, however it was cut,
                 recombined or framed, shows here (plagiarism detection)

A challenge composed fresh by the reference model (gentorrent/traffic/composed.py) must score
on these like a real user's prompt; the leader uses the very same index to refuse a composition
that copied a corpus span (`CorpusIndex.copied`).
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from gentorrent.traffic.transform import SWAPS

__all__ = ["normalise", "shingles", "CorpusIndex", "SHINGLE_WORDS"]

SHINGLE_WORDS = 5
INDEXED_CHARS = 4000  # the opening of each message that is indexed and looked up (as a reader would)
_CANONICAL = {w.casefold(): a.casefold() for a, b, _, _ in SWAPS for w in (a, b)}
_SWAP_WORDS = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(_CANONICAL, key=len, reverse=True)) + r")\b")


def normalise(text: str) -> str:
    """The form under which a rewritten corpus message equals its source."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"\d", "0", text)
    text = _SWAP_WORDS.sub(lambda m: _CANONICAL[m.group(0)], text)
    text = re.sub(r"\ban\b", "a", text)
    return " ".join(re.sub(r"[\W_]+", " ", text).split())


def _hash(words: Sequence[str]) -> int:
    """A deterministic 63-bit hash (two C-speed checksums: millions of shingles per index)."""
    data = " ".join(words).encode("utf-8")
    return (zlib.crc32(data) << 31) ^ zlib.adler32(data)


def shingles(text: str, n: int = SHINGLE_WORDS) -> np.ndarray:
    """The distinct hashed word n-grams of the normalised text (one, of the whole, when shorter)."""
    words = normalise(text).split()
    if not words:
        return np.zeros(0, dtype=np.int64)
    grams = [words] if len(words) < n else [words[i:i + n] for i in range(len(words) - n + 1)]
    return np.unique(np.array([_hash(g) for g in grams], dtype=np.int64))


@dataclass(frozen=True)
class CorpusIndex:
    """Every message of a corpus, stored for the two lookups (sorted hash arrays: ~8 bytes a shingle)."""

    exact: np.ndarray  # sorted hashes of whole normalised messages
    grams: np.ndarray  # sorted distinct shingle hashes

    @classmethod
    def build(cls, messages: Iterable[str]) -> "CorpusIndex":
        exact, grams = [], []
        for text in dict.fromkeys(m[:INDEXED_CHARS] for m in messages):
            key = normalise(text)
            if key:
                exact.append(_hash([key]))
                grams.append(shingles(text))
        return cls(np.unique(np.array(exact, dtype=np.int64)),
                   np.unique(np.concatenate(grams)) if grams else np.zeros(0, dtype=np.int64))

    @staticmethod
    def _contains(sorted_array: np.ndarray, values: np.ndarray) -> np.ndarray:
        if not len(sorted_array) or not len(values):
            return np.zeros(len(values), dtype=bool)
        at = np.minimum(np.searchsorted(sorted_array, values), len(sorted_array) - 1)
        return sorted_array[at] == values

    def save(self, path) -> None:
        with open(path, "wb") as f:
            np.savez(f, exact=self.exact, grams=self.grams)

    @classmethod
    def load(cls, path) -> "CorpusIndex":
        with np.load(path) as data:
            return cls(data["exact"], data["grams"])

    def exact_hit(self, text: str) -> bool:
        key = normalise(text[:INDEXED_CHARS])
        return bool(key) and bool(self._contains(self.exact, np.array([_hash([key])], dtype=np.int64))[0])

    def containment(self, text: str) -> float:
        """The share of the text's shingles found in the corpus (0: no 5-word span in common)."""
        mine = shingles(text[:INDEXED_CHARS])
        return float(self._contains(self.grams, mine).mean()) if len(mine) else 0.0

    def request_scores(self, messages: Sequence[tuple[str, str]]) -> dict[str, float]:
        """The lookups over every message a request carries (a node sees them all): an exact
        hit of any, and the highest containment of any."""
        texts = [c for _, c in messages if c.strip()]
        return {"exact": float(any(self.exact_hit(t) for t in texts)),
                "containment": max((self.containment(t) for t in texts), default=0.0)}

    def copied(self, text: str, limit: float) -> bool:
        """Whether a composed message is too much of the corpus to send: an exact hit, or more of
        its shingles in the corpus than `limit` (what real prompts show)."""
        return self.exact_hit(text) or self.containment(text) > limit
