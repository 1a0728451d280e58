"""Behavioural cheaters (testkit.cheaters) sign what they did not compute honestly.

The weight cheats (pruned, noisy, other-model) run real engines: tests/test_epochs_live.py and
bench/detection.py use them. Here a scripted engine stands in for vLLM, to check each behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

from gentorrent.crypto.keys import Identity
from gentorrent import receipts
from testkit import cheaters
from model_node.engine import EngineDelta
from model_node.service import LocalGenerator
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.config import MODEL_NODE, EpochRunParams
from gentorrent.ledger.epoch_txs import Phase
from gentorrent.traffic.model import ChatRequest
from verifier.epochs.probe_format import challenge_request

NODE = Identity.from_seed(b"\x09" * 32)


@dataclass
class ScriptedEngine:
    model: str = "smollm2-135m"
    tokenizer: tuple = tuple(range(1000))
    reply: tuple = (7, 8, 9)  # what honest generation gives

    def encode(self, prompt):
        return [1, 2, 3]

    def check_fits(self, ids, reserve=1):
        return None

    def decode(self, ids):
        return " ".join(map(str, ids))

    async def generate(self, ids, sampling, request_id=None, logprobs=None):
        yield EngineDelta("honest", self.reply, (), True, "stop")


async def _reply(gen, request) -> pb.GenerateChunk:
    return [c async for c in gen(request)][-1]


def _request(text: str, session: str = "") -> pb.GenerateRequest:
    r = challenge_request(ChatRequest.question(text), "smollm2-135m")
    r.session_id = session
    return r


#: a deployment that pins the challenge sampling (as slow test machines do): greedy, 16 tokens
PINNED = EpochRunParams(challenge_temperature=0.0, challenge_max_tokens=16)


def _pinned(text: str, session: str = "") -> pb.GenerateRequest:
    """A challenge as such a deployment sends it."""
    from dataclasses import replace

    r = challenge_request(replace(ChatRequest.question(text), temperature=0.0, max_tokens=16), "smollm2-135m")
    r.stream = False
    r.session_id = session
    return r


async def test_random_and_replay_cheaters_sign_what_they_did_not_compute():
    honest = LocalGenerator(ScriptedEngine(), NODE)
    random_gen = cheaters.make_generator("random", honest, "smollm2-135m")
    req = _request("Why is the sky blue?")
    out = await _reply(random_gen, req)
    assert list(out.token_ids) != [7, 8, 9] and len(out.token_ids) == req.sampling.max_tokens
    receipts.verify_receipt(out.receipt, NODE.public_key, req, list(out.token_ids))  # validly signed garbage
    replay = cheaters.make_generator("replay", honest, "smollm2-135m")
    first = await _reply(replay, req)
    assert list(first.token_ids) == [7, 8, 9]
    other = _request("How do tides work?")
    second = await _reply(replay, other)
    assert list(second.token_ids) == [7, 8, 9]  # the first prompt's answer, replayed
    receipts.verify_receipt(second.receipt, NODE.public_key, other, [7, 8, 9])


async def test_the_random_cheater_runs_no_model_only_the_claimed_tokenizer():
    """`gt-model serve` with the random cheater plugged in starts no vLLM engine (what it
    serves needs none): the claimed model's tokenizer, random tokens of its vocabulary, signed."""
    from model_node import catalogue
    from model_node.cli import Serving

    cheat = cheaters.Cheat("random")
    assert isinstance(cheat, Serving) and cheat.weights("smollm2-135m", None) == ("smollm2-135m", None)
    engine = await cheat.start_engine(catalogue.resolve("smollm2-135m"), MODEL_NODE)
    assert isinstance(engine.llm, cheaters.TokenizerOnly) and engine.max_model_len == MODEL_NODE.max_model_len
    gen = cheat.generator(LocalGenerator(engine, NODE), "smollm2-135m")
    req = _request("Why is the sky blue?")
    out = await _reply(gen, req)
    assert len(out.token_ids) == req.sampling.max_tokens and out.text == engine.decode(list(out.token_ids))
    receipts.verify_receipt(out.receipt, NODE.public_key, req, list(out.token_ids))
    assert await engine.check_health() and engine.load().active == 0
    engine.shutdown()


async def test_the_replay_cheater_replays_when_its_consumer_stops_at_the_final_chunk():
    """Regression: the overlay intake and the forwarder stop at the final chunk and close the
    generator there, so a replayer that kept its reply after its last chunk never kept it
    through the overlay, and answered honestly until a peer's forwarded request (read to the
    end) gave it one: in one devnet run it was caught only 6 epochs after it registered."""
    honest = LocalGenerator(ScriptedEngine(), NODE)
    replay = cheaters.make_generator("replay", honest, "smollm2-135m")

    async def up_to_the_final_chunk(request):
        stream = replay(request)
        try:
            async for chunk in stream:
                if chunk.final:
                    return chunk
        finally:
            await stream.aclose()

    assert list((await up_to_the_final_chunk(_request("Why is the sky blue?"))).token_ids) == [7, 8, 9]
    honest.engine.reply = (11, 12)  # what honest generation gives the next prompt
    other = await up_to_the_final_chunk(_request("How do tides work?"))
    assert list(other.token_ids) == [7, 8, 9]  # the first prompt's answer, replayed


async def test_the_selective_cheater_is_honest_only_on_what_looks_like_a_challenge():
    honest = LocalGenerator(ScriptedEngine(), NODE)
    from testkit.selective import ChallengeDetector, PublicChallengeShape

    selective = cheaters.make_generator("selective", honest, "smollm2-135m")
    selective.detector = ChallengeDetector(shape=PublicChallengeShape(PINNED))
    assert selective.detector.is_challenge(_pinned("How do tides work?"))  # the pinned challenge shape
    assert list((await _reply(selective, _pinned("How do tides work?"))).token_ids) == [7, 8, 9]
    long_chat = _request("Tell me a story about a dragon. " * 20, session="s1")
    assert not selective.detector.is_challenge(long_chat)
    assert list((await _reply(selective, long_chat)).token_ids) != [7, 8, 9]
    assert cheaters.make_generator("pruned", honest, "smollm2-135m") is honest  # the cheat is in the weights


# ----------------------------------------------------------------------------- the selective cheater's detector


def _user_ask(text: str) -> pb.GenerateRequest:
    """An ask as an OpenAI client sends it: system prompt, temperature 1.0, streamed."""
    from gentorrent.generation import make_request

    return make_request(messages=[{"role": "system", "content": "You are a helpful assistant."},
                                  {"role": "user", "content": text}], model="smollm2-135m", max_tokens=256,
                        temperature=1.0, stream=True)


def test_pinned_challenge_sampling_gives_challenges_away_and_traffic_shaped_challenges_do_not():
    """With pinned challenge sampling no language model is needed: the sampling parameters and
    the message structure suffice. Challenges drawn from the traffic model (the default) have the
    shapes users' asks have, so the shape says nothing about any request."""
    from testkit.selective import ChallengeDetector, PublicChallengeShape

    pinned = ChallengeDetector(shape=PublicChallengeShape(PINNED))
    assert pinned.is_challenge(_pinned("Why do cats purr?"))
    assert not pinned.is_challenge(_user_ask("Why do cats purr?"))
    assert not pinned.is_challenge(_pinned("Why do cats purr?", session="s1"))
    default = PublicChallengeShape()
    assert {default.log_odds(r) for r in (_pinned("Why?"), _user_ask("Why?"), _request("Why?"))} == {0.0}


def test_a_published_reply_cap_gives_traffic_shaped_challenges_away(monkeypatch):
    """A committee that caps its challenges' replies (the devnet's --challenge-max-tokens 96)
    sends a max_tokens no client profile sends: the selective cheater that knows the cap (as a
    devnet cheater does: GT_SELECTIVE_CHALLENGE_MAX_TOKENS) answers exactly those honestly."""
    from dataclasses import replace

    # as the runner draws it under the cap (verifier.epochs.challenges.draw_challenge)
    challenge = challenge_request(replace(ChatRequest.question("Why do cats purr?"), max_tokens=96), "smollm2-135m")
    assert challenge.sampling.max_tokens == 96
    monkeypatch.setenv("GT_SELECTIVE_CHALLENGE_MAX_TOKENS", "96")
    detector = cheaters.selective_detector()
    assert detector.is_challenge(challenge) and not detector.is_challenge(_user_ask("Why do cats purr?"))
    monkeypatch.delenv("GT_SELECTIVE_CHALLENGE_MAX_TOKENS")
    assert not cheaters.selective_detector().is_challenge(challenge)  # uncapped: the shape says nothing


def test_a_text_model_trained_on_self_generated_challenges_recognises_held_out_ones():
    """The cheater writes its own labelled challenges with the public generator and reference
    model (tests/data/generated_challenges.json: questions SmolLM2-135M wrote from the public
    meta-prompt) and tells them from user prompts by their text alone."""
    import json
    from pathlib import Path

    from testkit.cheater_training import cross_validate
    from testkit.user_prompts import USER_PROMPTS

    challenges = json.loads((Path(__file__).parent / "data" / "generated_challenges.json").read_text())
    result = cross_validate(challenges, list(USER_PROMPTS), folds=5)
    assert result["accuracy"] >= 0.75 and result["tpr"] >= 0.7, result  # the text gives challenges away


def test_the_public_epoch_phase_tells_a_node_when_it_can_be_probed():
    from testkit.selective import epoch_timing

    me, other = b"m" * 32, b"o" * 32
    probing = pb.EpochsSection(current=pb.EpochStateEntry(phase=Phase.PROBING, plan=[pb.ChallengeCommitment(node_id=me)]))
    assert epoch_timing(probing, me) > 0 > epoch_timing(probing, other)  # the plan names who is probed
    assert epoch_timing(pb.EpochsSection(current=pb.EpochStateEntry(phase=Phase.ATTESTING)), me) < 0
    hidden = pb.EpochsSection(current=pb.EpochStateEntry(phase=Phase.PROBING, plan=[pb.ChallengeCommitment()]))
    assert epoch_timing(hidden, other) > 0  # a plan of hashes only: the phase is all it knows
    assert epoch_timing(None, me) == 0.0


_STORED = (
    "Can you write a short story about a lighthouse keeper who finds a message in a bottle? Make it 300 words.",
    "I have a pandas dataframe with columns date, store and sales. How do I compute the 7 day rolling mean per store?",
    "Explain the difference between a mutex and a semaphore, with an example in C.",
)


def test_a_corpus_lookup_finds_a_rewritten_corpus_message_and_not_a_new_one():
    """The selective cheater's stored corpus: a challenge is a corpus message rewritten (numbers
    and a few words swapped, gentorrent.traffic.transform), which keeps most of its 5-grams, so
    the lookup finds it; a prompt no corpus holds (a user's, a donated one) it does not, nor one
    the corpus holds verbatim (real users send common prompts as they are)."""
    import random

    from gentorrent.traffic.transform import rewrite_text
    from testkit.selective import ChallengeDetector, CorpusLookup, grams

    lookup = CorpusLookup(_STORED, threshold=0.5)
    rewritten = rewrite_text(_STORED[1], random.Random(3), rate=1.0)
    assert rewritten != _STORED[1]
    assert lookup.similarity(_STORED[1]) == 1.0
    assert lookup.similarity(_STORED[1].upper().replace(" ", "  ")) == 1.0  # case and spacing folded
    assert 0.5 < lookup.similarity(rewritten) < 1.0
    new = "What should I pack for a week of hiking in Patagonia in March?"
    assert lookup.similarity(new) < 0.2 and lookup.similarity("") == 0.0 and len(grams("abcd")) == 0
    assert lookup.log_odds(rewritten) == lookup.hit and lookup.log_odds(new) == 0.0
    assert lookup.log_odds(_STORED[1]) == 0.0  # verbatim: what users who paste a common prompt send
    detector = ChallengeDetector(lookup=lookup)
    assert detector.is_challenge(_request(rewritten)) and not detector.is_challenge(_request(new))
    assert CorpusLookup([], threshold=0.5).similarity(new) == 0.0


def test_the_cheaters_operating_threshold_bounds_its_false_alarms():
    from testkit.cheater_training import operating_threshold

    scores = [float(i) for i in range(100)]
    t = operating_threshold(scores, 0.05)
    assert sum(1 for s in scores if s > t) == 5
    assert sum(1 for s in scores if s > operating_threshold(scores, 0.0)) == 0
    assert operating_threshold(scores, 1.0) == float("-inf")


async def test_a_routers_reported_latency_counts_replies_whose_consumer_stops_at_the_final_chunk():
    """The same closing, on an honest node: the router measured a request's latency after its
    last chunk, which the overlay intake never asks for, so the mean latency a node reports
    (gossip, status) stayed 0 for all overlay traffic."""
    from model_node.engine import Load
    from model_node.forwarding import Router
    from gentorrent.routing.group import GroupRouting

    engine = ScriptedEngine()
    engine.load = lambda: Load(0, 0, 0.0, 0, 0)
    ticks = iter(range(0, 100, 2))
    router = Router(LocalGenerator(engine, NODE), GroupRouting(NODE.node_id_hex, 4, 1000, version_base=0),
                    lambda node_id: None, clock=lambda: float(next(ticks)))
    stream = router(_request("Why is the sky blue?"))
    async for chunk in stream:
        if chunk.final:
            break
    await stream.aclose()
    assert router.local_load().latency_s > 0
