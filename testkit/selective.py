"""The selective cheater's challenge detector: every signal a real cheating node has, nothing
more. For the verification tests and the detection benchmark ONLY (testkit/cheaters.py).

A selective cheater answers honestly what it believes is a challenge and cheaply everything
else, so it is caught only as often as it mistakes a challenge for a user's ask (or as often
as the committee audits real replies). Its detector is the sum of four independent log-odds:

  shape   the request's structure and sampling parameters against the PUBLIC challenge shape
          (`ChallengeShape`). Challenges draw their shape from the public traffic model
          (gentorrent.traffic), the same profiles the project's own clients send, so the shape
          carries no signal (log-odds 0) unless a deployment pins the challenge sampling
          (EpochRunParams.challenge_temperature, as slow test machines do), which it then betrays.
  text    a logistic regression on word unigrams and bigrams, trained (testkit/cheater_training.py)
          on challenges the cheater generated itself with the public challenge generator,
          against prompts of real users it has served
  lookup  the public corpus, stored (`CorpusLookup`): challenges are corpus conversations,
          rewritten, so the asked message of one shares most of its character 5-grams with a
          message of the public challenge pool, which a user's prompt seldom does
  timing  the public epoch phase (`TimingSignal`): challenges only arrive while the committee's
          public state says an epoch is probing; asks outside that phase are user asks

What it never uses: committee-private data (reveals, the leader's plan secrets, nonces).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol

import numpy as np

from gentorrent.config import EPOCH_RUN, EpochRunParams
from gentorrent.ledger.epoch_txs import Phase
from gentorrent.wire import gentorrent_pb2 as pb

__all__ = ["ChallengeShape", "PublicChallengeShape", "TextModel", "CorpusLookup", "TimingSignal",
           "ChallengeDetector", "words", "features", "no_timing", "epoch_timing"]

_WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9]")


def words(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens (quotes and colons are strong tells)."""
    return _WORD.findall(text.lower())


def features(text: str, max_words: int = 400) -> list[str]:
    """Unigrams, bigrams and the opening two words (challenge openings repeat)."""
    w = words(text)[:max_words]
    return w + [f"{a} {b}" for a, b in zip(w, w[1:])] + ["^" + " ".join(w[:2])]


class ChallengeShape(Protocol):
    def log_odds(self, request: pb.GenerateRequest) -> float: ...


@dataclass(frozen=True)
class PublicChallengeShape:
    """Log-odds that a request is a challenge from its structure alone, against the public
    challenge parameters. A request that differs in any field a challenge fixes cannot be one."""

    params: EpochRunParams = EPOCH_RUN
    match_log_odds: float = 2.0  # user asks with exactly the challenge shape are rare, not absent
    mismatch_log_odds: float = -12.0

    def log_odds(self, request: pb.GenerateRequest) -> float:
        if self.params.challenge_temperature is None:
            # challenges take shape, sampling, streaming and length from the public traffic model
            # (gentorrent.traffic), as the project's own clients do: the shape says nothing —
            # unless the committee publishes a cap on their replies (gt-verifier start
            # --challenge-max-tokens, as the devnet does), which no client profile sends
            cap = self.params.challenge_max_tokens
            if cap is None:
                return 0.0
            return self.match_log_odds if request.sampling.max_tokens == cap else self.mismatch_log_odds
        s = request.sampling
        same = (len(request.messages) == 1 and request.messages[0].role == "user" and not request.prompt
                and not request.session_id and not request.stream and not s.has_seed and not s.stop
                and math.isclose(s.temperature, self.params.challenge_temperature, abs_tol=1e-6)
                and (self.params.challenge_max_tokens is None or s.max_tokens == self.params.challenge_max_tokens))
        return self.match_log_odds if same else self.mismatch_log_odds


@dataclass(frozen=True)
class TextModel:
    """A linear model over the presence of `features` (trained by testkit/cheater_training.py):
    log-odds = prior + the weights of the features present; an unseen feature weighs 0."""

    weights: Mapping[str, float] = field(default_factory=dict)
    unseen: float = 0.0  # a feature seen in neither class tells nothing
    prior: float = 0.0

    def log_odds(self, text: str) -> float:
        return self.prior + math.fsum(self.weights.get(f, self.unseen) for f in set(features(text)))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"weights": self.weights, "prior": self.prior}))

    @classmethod
    def load(cls, path: Path) -> "TextModel":
        data = json.loads(Path(path).read_text())
        return cls(data["weights"], prior=float(data.get("prior", 0.0)))


_SPACE = re.compile(r"\s+")
_GRAM = 5  # characters per gram, as the realism bench's lookup


def grams(text: str, max_chars: int = 4000) -> np.ndarray:
    """The distinct character 5-grams of a text (case and runs of white space folded), each packed
    in an integer: the keys of a fuzzy lookup that a rewrite of a few words and numbers leaves
    mostly intact."""
    folded = _SPACE.sub(" ", unicodedata.normalize("NFKC", text[:max_chars]).casefold()).strip()
    data = np.frombuffer(folded.encode("utf-8"), dtype=np.uint8).astype(np.uint64)
    if len(data) < _GRAM:
        return np.zeros(0, dtype=np.uint64)
    n = len(data) - _GRAM + 1
    packed = np.zeros(n, dtype=np.uint64)
    for i in range(_GRAM):
        packed |= data[i:i + n] << np.uint64(8 * (_GRAM - 1 - i))
    return np.unique(packed)


class CorpusLookup:
    """The public corpus, stored by a cheater and searched for every prompt it is sent.

    `similarity` is the highest cosine of the prompt's 5-gram set with any stored message's
    (|q & d| / sqrt(|q| |d|)): an inverted index over sorted grams, one numpy pass per prompt.
    `log_odds` is `hit` for a NEAR copy, above `threshold` but not the message itself: a
    challenge is a corpus message rewritten, while real users send the corpus's commonest
    messages verbatim (12 % of held-out ShareGPT prompts are in the challenge pool word for
    word, against 2 % within 0.7-1). The cheater sets `threshold` on its own users' prompts, at
    the false-alarm rate it accepts. A miss is no evidence of a user, since a donated ask, which
    no corpus holds, is a challenge too.
    """

    def __init__(self, messages: Iterable[str], threshold: float, hit: float = 8.0, near_only: bool = True) -> None:
        """`near_only=False`: a verbatim copy counts too (for a corpus no user sends from)."""
        sets = [grams(m) for m in messages]
        self.sizes = np.array([max(1, len(g)) for g in sets], dtype=np.float64)
        keys = np.concatenate(sets) if sets else np.zeros(0, dtype=np.uint64)
        docs = np.repeat(np.arange(len(sets), dtype=np.int32), [len(g) for g in sets])
        order = np.argsort(keys, kind="stable")
        self.keys, self.docs = keys[order], docs[order]
        self.threshold, self.hit, self.near_only = threshold, hit, near_only

    def similarity(self, text: str) -> float:
        q = grams(text)
        if not len(q) or not len(self.keys):
            return 0.0
        lo, hi = np.searchsorted(self.keys, q, "left"), np.searchsorted(self.keys, q, "right")
        counts = hi - lo
        total = int(counts.sum())
        if total == 0:
            return 0.0
        starts = np.repeat(lo - np.cumsum(counts) + counts, counts)  # each posting's run start, per slot
        shared = np.bincount(self.docs[starts + np.arange(total)], minlength=len(self.sizes))
        return float((shared / np.sqrt(self.sizes * len(q))).max())

    def log_odds(self, text: str) -> float:
        similar = self.similarity(text)
        return self.hit if self.threshold < similar and (similar < 1.0 or not self.near_only) else 0.0


class NoLookup:
    """A cheater that stores no corpus."""

    def log_odds(self, text: str) -> float:
        return 0.0


#: log-odds from the public epoch phase right now (0: no information, e.g. no committee view)
TimingSignal = Callable[[], float]


def no_timing() -> float:
    return 0.0


def epoch_timing(section: pb.EpochsSection | None, node_id: bytes, sure: float = 4.0) -> float:
    """Log-odds from the committee's PUBLIC epochs section (the `/epochs` query any node may make).

    Challenges leave only while an epoch is probing (and members' own probes of nodes reported
    missing while it is resolving); a public plan that names the planned nodes tells a node
    whether it is probed at all. Where the plan names no one (committed only as hashes), the
    phase alone is the signal.
    """
    if section is None or not section.HasField("current"):
        return 0.0
    cur = section.current
    if cur.phase == Phase.PROBING:
        named = {e.node_id for e in cur.plan if e.node_id}
        return sure if not named or node_id in named else -sure
    if cur.phase == Phase.RESOLVING:
        return sure if any(r.node_id == node_id and r.missing for r in cur.replies) else -sure
    return -sure  # electing, planning, attesting, done: no challenge is in flight


@dataclass
class ChallengeDetector:
    """The cheater's verdict: the summed log-odds above `threshold` means 'answer honestly'."""

    shape: ChallengeShape = field(default_factory=PublicChallengeShape)
    text: TextModel = field(default_factory=TextModel)
    timing: TimingSignal = no_timing
    lookup: CorpusLookup | NoLookup = field(default_factory=NoLookup)
    threshold: float = 0.0

    def log_odds(self, request: pb.GenerateRequest) -> float:
        text = request.prompt or "\n".join(m.content for m in request.messages if m.role == "user")
        asked = request.prompt or next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        return self.shape.log_odds(request) + self.timing() + self.content_log_odds(text, asked)

    def content_log_odds(self, text: str, asked: str | None = None) -> float:
        """What the words say: the users' text (`text`), the asked message looked up (`asked`,
        by default the text itself)."""
        return self.text.log_odds(text) + self.lookup.log_odds(text if asked is None else asked)

    def is_challenge(self, request: pb.GenerateRequest) -> bool:
        return self.log_odds(request) > self.threshold
