"""Challenges: commitments, the probe set, uniqueness, and drawing a challenge from user traffic.

The probe set of an epoch is fixed by the chain at the election (`select_probe_set` over
`epoch_probe_seed`); the leader draws one fresh request per node of it. The chain stores only
H(nonce || canonical request) per node, so a model node reading the public state learns nothing
about which requests are challenges; the full requests (messages, sampling, streaming, session
id) and nonces travel privately to the other verifiers, who check every reveal against its
commitment and rebuild the exact wire request from it. Two nodes never get the same request text
(normalised), so nodes cannot collude by comparing prompts or replay one another's answers.

Challenges must be indistinguishable from user asks, so they are drawn from the traffic model
(gentorrent.traffic): a request shape and a client profile as real clients send them, filled
from real user conversations (the challenge pool of the corpus) and rewritten so the text is not
the public corpus verbatim. The draw is seeded by the leader's private randomness (never public
chain data), so nobody can predict it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from gentorrent.config import MAX_NODES_PER_EPOCH_TX, TRAFFIC, TrafficParams
from gentorrent.traffic import challenge as traffic_challenge
from gentorrent.traffic.model import ChatRequest, TrafficError, TrafficPool

__all__ = [
    "ChallengeError",
    "commit_request",
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
    "draw_challenge",
    "donated_challenge",
    "unique_questions",
]

_COMMIT_DOMAIN = b"gentorrent/challenge-commitment/v2"
COMMITMENT_LEN = 32
NONCE_BYTES = 32  # a commitment's nonce: fixed-length, so (nonce, request) is unambiguous


class ChallengeError(ValueError):
    """A plan, reveal or generated question that breaks the rules (and changes nothing)."""


# --------------------------------------------------------------------------- commitments


def commit_request(nonce: bytes, request: ChatRequest) -> bytes:
    """SHA-256(domain || nonce || canonical request): it binds the messages and how the request
    samples and streams, so a leader cannot open it to a different request; the fixed-length
    nonce makes it unambiguous."""
    if len(nonce) != NONCE_BYTES:
        raise ChallengeError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    try:
        request.check()
    except TrafficError as exc:
        raise ChallengeError(f"request out of bounds: {exc}") from exc
    return hashlib.sha256(_COMMIT_DOMAIN + nonce + request.canonical()).digest()


def verify_reveal(commitment: bytes, nonce: bytes, request: ChatRequest) -> bool:
    """Whether (nonce, request) opens `commitment`; malformed reveals are simply False."""
    try:
        return hmac.compare_digest(commitment, commit_request(nonce, request))
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


def select_probe_set(candidates: Iterable[str], seed: bytes, limit: int) -> list[str]:
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
    request: ChatRequest


def make_plan(epoch: int, reveals: Sequence[Reveal], max_nodes: int = MAX_NODES_PER_EPOCH_TX) -> ChallengePlan:
    """The leader's plan from its chosen (node, nonce, request) triples, checked before use."""
    _check_unique_prompts(reveals)
    entries = tuple(
        ChallengeEntry(r.node_id, commit_request(r.nonce, r.request))
        for r in sorted(reveals, key=lambda r: r.node_id)
    )
    plan = ChallengePlan(epoch, entries)
    check_plan(plan, {r.node_id for r in reveals}, max_nodes)
    return plan


def check_plan(plan: ChallengePlan, registered: Iterable[str], max_nodes: int) -> None:
    """Reject a plan with unknown or repeated nodes, repeated or malformed commitments, or more
    than `max_nodes` nodes (the chain's epochs.max_probed_nodes)."""
    known = set(registered)
    ids = plan.node_ids
    if plan.epoch < 0:
        raise ChallengeError("negative epoch")
    if len(ids) > max_nodes:
        raise ChallengeError(f"plan probes {len(ids)} nodes, more than {max_nodes}")
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
        key = prompt_key(r.request.text)
        if not key:
            raise ChallengeError(f"empty prompt for {r.node_id}")
        if key in seen:
            raise ChallengeError(f"{r.node_id} and {seen[key]} would get the same prompt")
        seen[key] = r.node_id


def check_reveals(plan: ChallengePlan, reveals: Sequence[Reveal]) -> dict[str, ChatRequest]:
    """node id -> request, if the reveals open exactly the plan's commitments with unique prompts."""
    by_node: dict[str, Reveal] = {}
    for r in reveals:
        if r.node_id in by_node:
            raise ChallengeError(f"two reveals for {r.node_id}")
        by_node[r.node_id] = r
    if set(by_node) != set(plan.node_ids):
        raise ChallengeError("reveals do not cover exactly the planned nodes")
    for e in plan.entries:
        r = by_node[e.node_id]
        if not verify_reveal(e.commitment, r.nonce, r.request):
            raise ChallengeError(f"the reveal for {e.node_id} does not open its commitment")
    _check_unique_prompts(reveals)
    return {n: by_node[n].request for n in plan.node_ids}


# --------------------------------------------------------------------------- drawing a challenge


def draw_challenge(pool: TrafficPool, seed: bytes, node_id: str, attempt: int = 0,
                   temperature: float | None = None, max_tokens_cap: int | None = None,
                   params: TrafficParams = TRAFFIC) -> ChatRequest:
    """The challenge for (leader's private seed, node, attempt) (gentorrent.traffic.challenge);
    ChallengeError when the draw falls out of bounds (the shell redraws)."""
    return _in_bounds(traffic_challenge.draw_challenge, pool, seed, node_id, attempt, temperature, max_tokens_cap,
                      params)


def donated_challenge(donated: ChatRequest, seed: bytes, node_id: str, attempt: int = 0,
                      temperature: float | None = None, max_tokens_cap: int | None = None,
                      params: TrafficParams = TRAFFIC) -> ChatRequest:
    """The challenge made of a user's donated audited ask (gentorrent.traffic.challenge,
    verifier/epochs/donations.py); ChallengeError when it falls out of bounds."""
    return _in_bounds(traffic_challenge.donated_challenge, donated, seed, node_id, attempt, temperature,
                      max_tokens_cap, params)


def _in_bounds(make, *args) -> ChatRequest:
    try:
        return make(*args)
    except TrafficError as exc:
        raise ChallengeError(f"challenge out of bounds: {exc}") from exc


def unique_questions(requests: Mapping[str, ChatRequest]) -> bool:
    """Whether no two nodes' challenges are the same under prompt_key."""
    keys = [prompt_key(r.text) for r in requests.values()]
    return len(set(keys)) == len(keys)
