"""Challenge prompts: commitments, the probe set, uniqueness, and the question seed plan.

The probe set of an epoch is fixed by the chain at the election (`select_probe_set` over
`epoch_probe_seed`); the leader writes one fresh natural-language question per node of it. The chain stores only H(nonce || prompt) per node, so a
model node reading the public state learns nothing about which prompts are challenges; the
plain prompts and nonces travel privately to the other verifiers, who check every reveal
against its commitment. Two nodes never get the same question (normalised), so nodes cannot
collude by comparing prompts or replay one another's answers.

Questions must look like user traffic, so they are written at run time by the reference model
itself (a shell call to vLLM with the users' sampling parameters) from a meta-prompt built here:
a topic, a style, a persona and a question form drawn from a seeded rng over a varied
vocabulary. The seed is the leader's private randomness (never public chain data), so nobody can
predict the topics. Nothing here produces a question itself; there is no fixed question list.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from gentorrent.config import EPOCHS, WIRE, EpochParams

__all__ = [
    "ChallengeError",
    "commit_prompt",
    "verify_reveal",
    "prompt_key",
    "select_probe_set",
    "epoch_probe_seed",
    "ChallengeEntry",
    "ChallengePlan",
    "Reveal",
    "make_plan",
    "check_plan",
    "check_reveals",
    "QuestionSeed",
    "draw_question_seed",
    "build_meta_prompt",
    "question_engine_seed",
    "clean_question",
    "unique_questions",
    "TOPICS",
    "STYLES",
    "PERSONAS",
    "FORMS",
]

_COMMIT_DOMAIN = b"gentorrent/challenge-commitment/v1"
COMMITMENT_LEN = 32


class ChallengeError(ValueError):
    """A plan, reveal or generated question that breaks the rules (and changes nothing)."""


# --------------------------------------------------------------------------- commitments


def commit_prompt(nonce: bytes, prompt: str, params: EpochParams = EPOCHS) -> bytes:
    """SHA-256(domain || nonce || UTF-8 prompt); the fixed-length nonce makes it unambiguous."""
    if len(nonce) != params.challenge_nonce_bytes:
        raise ChallengeError(f"nonce must be {params.challenge_nonce_bytes} bytes, got {len(nonce)}")
    data = prompt.encode("utf-8")
    if len(data) > WIRE.max_prompt_bytes:
        raise ChallengeError("prompt too long")
    return hashlib.sha256(_COMMIT_DOMAIN + nonce + data).digest()


def verify_reveal(commitment: bytes, nonce: bytes, prompt: str, params: EpochParams = EPOCHS) -> bool:
    """Whether (nonce, prompt) opens `commitment`; malformed reveals are simply False."""
    try:
        return hmac.compare_digest(commitment, commit_prompt(nonce, prompt, params))
    except ChallengeError:
        return False


def prompt_key(prompt: str) -> str:
    """The form under which two prompts count as the same question (case, spacing, punctuation)."""
    text = unicodedata.normalize("NFKC", prompt).casefold()
    text = re.sub(r"[\W_]+", " ", text)
    return " ".join(text.split())


# --------------------------------------------------------------------------- the probe set


_PROBE_SEED_DOMAIN = b"gentorrent/probe-set-seed/v1"


def epoch_probe_seed(block_hash: bytes, vrf_outputs: Sequence[bytes]) -> bytes:
    """The seed of an epoch's probe set: H(domain || hash of the epoch-opening block || every
    election VRF output present on chain, in member-key order).

    No single verifier controls it: the block hash is fixed before anyone's VRF output is known,
    and each output is a deterministic function of that hash and a member's secret key, so a
    member can at most withhold its own proof (then the election deadline passes without it),
    never pick a value. Model nodes cannot compute it before the election closes on chain.
    """
    h = hashlib.sha256(_PROBE_SEED_DOMAIN + len(block_hash).to_bytes(2, "big") + block_hash)
    for out in vrf_outputs:
        h.update(len(out).to_bytes(2, "big") + out)
    return h.digest()


def select_probe_set(candidates: Iterable[str], seed: bytes, limit: int = EPOCHS.max_probed_nodes) -> list[str]:
    """The model nodes to probe: all of them, or a seeded sample of `limit` when there are more.

    Ranking by H(seed || node id) is deterministic and uniform. The chain computes it at the
    election from the eligible (registered) model nodes and `epoch_probe_seed`, and the plan
    rule rejects (and marks faulty) a leader whose plan covers any other set, so the leader
    cannot steer the choice or leave a node out. A model node gains nothing from knowing the
    set: with at most `limit` nodes every node is probed every epoch, so being in it says
    nothing; what stays secret is WHICH of its requests is the challenge and WHEN it arrives.
    """
    nodes = sorted(set(candidates))
    if limit < 0:
        raise ChallengeError("limit must be >= 0")
    if len(nodes) <= limit:
        return nodes
    ranked = sorted(nodes, key=lambda n: hashlib.sha256(seed + b"\x00" + n.encode("utf-8")).digest())
    return sorted(ranked[:limit])


@dataclass(frozen=True)
class ChallengeEntry:
    """What the chain stores for one probed node."""

    node_id: str
    commitment: bytes


@dataclass(frozen=True)
class ChallengePlan:
    """The public plan of one epoch: whom to probe and the commitments of their prompts."""

    epoch: int
    entries: tuple[ChallengeEntry, ...]

    @property
    def node_ids(self) -> list[str]:
        return [e.node_id for e in self.entries]

    def commitment_of(self, node_id: str) -> bytes:
        for e in self.entries:
            if e.node_id == node_id:
                return e.commitment
        raise ChallengeError(f"{node_id} is not in the plan of epoch {self.epoch}")


@dataclass(frozen=True)
class Reveal:
    """The private opening of one commitment, sent only to the other verifiers."""

    node_id: str
    nonce: bytes
    prompt: str


def make_plan(epoch: int, reveals: Sequence[Reveal], params: EpochParams = EPOCHS) -> ChallengePlan:
    """The leader's plan from its chosen (node, nonce, prompt) triples, checked before use."""
    _check_unique_prompts(reveals)
    entries = tuple(
        ChallengeEntry(r.node_id, commit_prompt(r.nonce, r.prompt, params))
        for r in sorted(reveals, key=lambda r: r.node_id)
    )
    plan = ChallengePlan(epoch, entries)
    check_plan(plan, {r.node_id for r in reveals}, params)
    return plan


def check_plan(plan: ChallengePlan, registered: Iterable[str], params: EpochParams = EPOCHS) -> None:
    """Reject a plan with unknown or repeated nodes, repeated or malformed commitments, or too many nodes."""
    known = set(registered)
    ids = plan.node_ids
    if plan.epoch < 0:
        raise ChallengeError("negative epoch")
    if len(ids) > params.max_probed_nodes:
        raise ChallengeError(f"plan probes {len(ids)} nodes, more than {params.max_probed_nodes}")
    if len(set(ids)) != len(ids):
        raise ChallengeError("a node appears twice in the plan")
    unknown = [n for n in ids if n not in known]
    if unknown:
        raise ChallengeError(f"plan names unregistered model nodes: {unknown}")
    commitments = [e.commitment for e in plan.entries]
    if any(len(c) != COMMITMENT_LEN for c in commitments):
        raise ChallengeError("a commitment is not 32 bytes")
    if len(set(commitments)) != len(commitments):
        raise ChallengeError("two nodes share a commitment (the same prompt)")


def _check_unique_prompts(reveals: Sequence[Reveal]) -> None:
    seen: dict[str, str] = {}
    for r in reveals:
        key = prompt_key(r.prompt)
        if not key:
            raise ChallengeError(f"empty prompt for {r.node_id}")
        if key in seen:
            raise ChallengeError(f"{r.node_id} and {seen[key]} would get the same prompt")
        seen[key] = r.node_id


def check_reveals(plan: ChallengePlan, reveals: Sequence[Reveal], params: EpochParams = EPOCHS) -> dict[str, str]:
    """node id -> prompt, if the reveals open exactly the plan's commitments with unique prompts."""
    by_node: dict[str, Reveal] = {}
    for r in reveals:
        if r.node_id in by_node:
            raise ChallengeError(f"two reveals for {r.node_id}")
        by_node[r.node_id] = r
    if set(by_node) != set(plan.node_ids):
        raise ChallengeError("reveals do not cover exactly the planned nodes")
    for e in plan.entries:
        r = by_node[e.node_id]
        if not verify_reveal(e.commitment, r.nonce, r.prompt, params):
            raise ChallengeError(f"the reveal for {e.node_id} does not open its commitment")
    _check_unique_prompts(reveals)
    return {n: by_node[n].prompt for n in plan.node_ids}


# --------------------------------------------------------------------------- question seed plan

TOPICS = (
    "sourdough baking", "the French Revolution", "black holes", "personal budgeting", "marathon training",
    "houseplant care", "the history of jazz", "machine learning basics", "climate change adaptation",
    "learning a second language", "ancient Egypt", "home electrical wiring", "vegetarian cooking",
    "job interviews", "the immune system", "chess openings", "renting an apartment", "photosynthesis",
    "the Roman Empire", "writing a cover letter", "volcanoes", "sleep hygiene", "electric cars",
    "Python programming", "birdwatching", "the stock market", "first aid", "Shakespeare's plays",
    "bicycle maintenance", "the water cycle", "negotiating a salary", "dog training", "quantum computing",
    "composting", "the Silk Road", "public speaking", "knitting", "the human brain", "tax deductions",
    "coffee brewing", "the Cold War", "solar panels", "raising teenagers", "origami", "plate tectonics",
    "SQL databases", "meditation", "the Olympic Games", "vaccines", "podcast production",
    "medieval castles", "bread yeast", "credit scores", "the Moon landing", "urban gardening",
    "impressionist painting", "time management", "earthquakes", "cybersecurity at home", "mushrooms",
    "the printing press", "travelling on a budget", "probability puzzles", "wine tasting", "tsunamis",
    "philosophy of mind", "3D printing", "honeybees", "the Renaissance", "starting a small business",
    "board game design", "ocean currents", "Linux command line", "nutrition labels", "ancient Greek myths",
    "wedding planning", "the periodic table", "moving to another country", "film photography",
    "rainforests", "hiking safety", "supply and demand", "poetry forms", "DNA", "car insurance",
)

STYLES = (
    "casually, the way someone types into a chat box", "formally and precisely",
    "as a beginner who knows almost nothing", "as an expert asking for a subtle detail",
    "briefly, in one short sentence", "with some background context first",
    "with a small spelling mistake or two", "enthusiastically", "sceptically",
    "as a request for step-by-step instructions", "as a request for a comparison",
    "as a request for a short list", "as a request for an explanation for a child",
    "as a follow-up to something they read online", "politely, starting with a greeting",
    "bluntly, without any greeting", "with a concrete number or example in it",
    "as a hypothetical 'what if' question", "as a request for pros and cons",
    "as someone in a hurry",
)

PERSONAS = (
    "a high-school student", "a retired teacher", "a nurse on a night shift", "a software developer",
    "a small-business owner", "a curious ten-year-old's parent", "a university researcher",
    "a farmer", "a journalist", "a first-time home buyer", "an amateur musician", "a truck driver",
    "a graphic designer", "someone preparing for an exam", "a new immigrant", "a hobbyist",
)

FORMS = (
    "how", "why", "what is the difference between", "can you explain", "what happens if",
    "what are good ways to", "is it true that", "how long does it take to", "what should I know about",
    "which is better",
)


@dataclass(frozen=True)
class QuestionSeed:
    """One draw of the seed plan: what the reference model is asked to write a question about."""

    topic: str
    style: str
    persona: str
    form: str


def draw_question_seed(seed: bytes, node_id: str, attempt: int = 0) -> QuestionSeed:
    """A deterministic draw for (leader's private seed, node, attempt).

    `attempt` lets the shell redraw when the model's question collides with another node's.
    """
    digest = hashlib.sha256(b"gentorrent/question-seed/v1" + seed + node_id.encode("utf-8") + attempt.to_bytes(4, "big")).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    return QuestionSeed(rng.choice(TOPICS), rng.choice(STYLES), rng.choice(PERSONAS), rng.choice(FORMS))


def question_engine_seed(seed: bytes, node_id: str, attempt: int) -> int:
    """The sampling seed the reference model writes one node's question with: H(private seed ||
    node || attempt), so no two questions of an epoch share a seed (one shared seed made the
    questions of an epoch look alike, e.g. several opening with the same four words)."""
    digest = hashlib.sha256(b"gentorrent/question-engine-seed/v1" + seed + node_id.encode("utf-8")
                            + attempt.to_bytes(4, "big")).digest()
    return int.from_bytes(digest[:4], "big")


def build_meta_prompt(q: QuestionSeed) -> str:
    """The instruction the shell sends to the reference model to write one challenge question."""
    return (
        f"Write one question that {q.persona} might type to an AI assistant about {q.topic}. "
        f"Write it {q.style}. It could start with or use the phrase \"{q.form}\", but only if that "
        "sounds natural. Reply with the question only: no answer, no quotation marks, no preamble."
    )


_PREAMBLE = re.compile(r"^\s*(sure[,!.]?\s*)?(here(?:'s| is) (?:a|the|one) question[^:]*:|question\s*:)\s*", re.I)


def clean_question(text: str, params: EpochParams = EPOCHS) -> str:
    """The model's output reduced to the question itself; ChallengeError if nothing usable is left."""
    text = _PREAMBLE.sub("", text.strip())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ChallengeError("the model wrote no question")
    question = lines[0].strip().strip("\"'“”‘’`*").strip()
    if len(question) > params.max_question_chars:
        raise ChallengeError(f"generated question longer than {params.max_question_chars} characters")
    if len(prompt_key(question).split()) < 3:
        raise ChallengeError(f"generated question too short: {question!r}")
    if not _looks_like_request(question):
        raise ChallengeError(f"generated text is not a question or request: {question[:80]!r}")
    return question


_REQUEST_WORDS = frozenset(
    "how what why when where which who whom whose is are was were do does did can could should "
    "would will shall may might explain describe tell give list compare help write suggest "
    "recommend show please".split()
)


def _looks_like_request(text: str) -> bool:
    """A question mark, or a first word that opens a question or a request to an assistant.

    Small reference models sometimes answer the meta-prompt with a statement instead of a
    question; the shell then redraws (draw_question_seed with attempt + 1).
    """
    if "?" in text:
        return True
    words = prompt_key(text).split()
    return bool(words) and words[0] in _REQUEST_WORDS


def unique_questions(questions: Mapping[str, str]) -> bool:
    """Whether no two nodes' questions are the same under prompt_key."""
    keys = [prompt_key(q) for q in questions.values()]
    return len(set(keys)) == len(keys)
