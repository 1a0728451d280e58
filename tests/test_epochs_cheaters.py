"""Behavioural cheaters (model_node.cheaters) sign what they did not compute honestly.

The weight cheats (pruned, noisy, other-model) run real engines: tests/test_epochs_live.py and
bench/detection.py use them. Here a scripted engine stands in for vLLM, to check each behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

from gentorrent.crypto.keys import Identity
from gentorrent import receipts
from model_node import cheaters
from model_node.engine import EngineDelta
from model_node.service import LocalGenerator
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.traffic.model import ChatRequest
from verifier.epochs.probe_format import challenge_request

NODE = Identity.from_seed(b"\x09" * 32)


@dataclass
class ScriptedEngine:
    model: str = "smollm2-135m"
    tokenizer: tuple = tuple(range(1000))

    def encode(self, prompt):
        return [1, 2, 3]

    def check_fits(self, ids, reserve=1):
        return None

    def decode(self, ids):
        return " ".join(map(str, ids))

    async def generate(self, ids, sampling, request_id=None, logprobs=None):
        yield EngineDelta("honest", (7, 8, 9), (), True, "stop")


async def _reply(gen, request) -> pb.GenerateChunk:
    return [c async for c in gen(request)][-1]


def _request(text: str, session: str = "") -> pb.GenerateRequest:
    r = challenge_request(ChatRequest.question(text), "smollm2-135m")
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


async def test_the_selective_cheater_is_honest_only_on_what_looks_like_a_challenge():
    honest = LocalGenerator(ScriptedEngine(), NODE)
    selective = cheaters.make_generator("selective", honest, "smollm2-135m")
    assert cheaters.looks_like_challenge(_request("How do tides work?"))
    assert list((await _reply(selective, _request("How do tides work?"))).token_ids) == [7, 8, 9]
    long_chat = _request("Tell me a story about a dragon. " * 20, session="s1")
    assert not cheaters.looks_like_challenge(long_chat)
    assert list((await _reply(selective, long_chat)).token_ids) != [7, 8, 9]
    assert cheaters.make_generator("pruned", honest, "smollm2-135m") is honest  # the cheat is in the weights
