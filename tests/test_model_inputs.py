"""Model node without an engine: request validation, receipts, admission, catalogue, CLI errors."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from gentorrent.config import MODEL_NODE, WIRE, ModelNodeParams
from gentorrent.crypto.keys import Identity
from gentorrent import generation, receipts
from model_node import catalogue
from model_node.engine import EngineDelta, SharedPasses
from model_node.service import Admission, BusyError, LocalGenerator, status_code_of
from gentorrent.wire import gentorrent_pb2 as pb

# --------------------------------------------------------------------------- inputs


def _req(**kw) -> pb.GenerateRequest:
    sampling = kw.pop("sampling", {})
    return pb.GenerateRequest(sampling=pb.SamplingParams(**sampling), **kw)


def test_defaults_of_unset_proto_fields():
    job = generation.parse_generate(_req(prompt="hi"), "m")
    assert job.sampling == generation.Sampling(0.0, 1.0, 0, None, None, ())  # max_tokens: until the context ends
    assert job.prompt == generation.Prompt(text="hi")


def test_chat_messages_and_seed():
    req = _req(messages=[pb.ChatMessage(role="user", content="q")],
               sampling=dict(temperature=0.7, top_p=0.9, top_k=40, max_tokens=5, has_seed=True, seed=9,
                             stop=["\n"]))
    job = generation.parse_generate(req, "m")
    assert job.prompt.messages == (("user", "q"),)
    assert job.sampling == generation.Sampling(pytest.approx(0.7), pytest.approx(0.9), 40, 5, 9, ("\n",))


@pytest.mark.parametrize("req, words", [
    (dict(prompt=""), "empty prompt"),
    (dict(prompt="   \n"), "empty prompt"),
    (dict(prompt="x", messages=[pb.ChatMessage(role="user", content="y")]), "not both"),
    (dict(messages=[pb.ChatMessage(role="robot", content="y")]), "role"),
    (dict(messages=[pb.ChatMessage(role="user", content="")]), "empty"),
    (dict(prompt="x" * (WIRE.max_prompt_bytes + 1)), "bytes"),
    (dict(prompt="x", sampling=dict(temperature=-0.1)), "temperature"),
    (dict(prompt="x", sampling=dict(temperature=math.nan)), "temperature"),
    (dict(prompt="x", sampling=dict(temperature=50)), "temperature"),
    (dict(prompt="x", sampling=dict(top_p=1.5)), "top_p"),
    (dict(prompt="x", sampling=dict(top_k=-2)), "top_k"),
    (dict(prompt="x", sampling=dict(max_tokens=-1)), "max_tokens"),
    (dict(prompt="x", sampling=dict(max_tokens=MODEL_NODE.max_new_tokens + 1)), "max_tokens"),
    (dict(prompt="x", sampling=dict(stop=[""])), "stop"),
    (dict(prompt="x", sampling=dict(stop=["s"] * 9)), "stop"),
    (dict(prompt="x", request_id="r" * 200), "request_id"),
    # vLLM's further parameters, bounded as vLLM bounds them
    (dict(prompt="x", sampling=dict(presence_penalty=2.5)), "presence_penalty"),
    (dict(prompt="x", sampling=dict(frequency_penalty=-3)), "frequency_penalty"),
    (dict(prompt="x", sampling=dict(repetition_penalty=-1)), "repetition_penalty"),
    (dict(prompt="x", sampling=dict(min_p=1.5)), "min_p"),
    (dict(prompt="x", sampling=dict(min_tokens=9, max_tokens=4)), "min_tokens"),
    (dict(prompt="x", sampling=dict(stop_token_ids=[1] * 65)), "stop token ids"),
    (dict(prompt="x", sampling=dict(logit_bias=[pb.LogitBias(token_id=1, bias=101)])), "logit bias"),
    (dict(prompt="x", sampling=dict(top_logprobs=21)), "top_logprobs"),
    (dict(prompt="x", structured=pb.StructuredOutput(kind=pb.StructuredOutput.JSON_SCHEMA, spec="[1]")), "schema"),
    (dict(prompt="x", structured=pb.StructuredOutput(kind=pb.StructuredOutput.CHOICE, spec="[]")), "choice"),
    (dict(prompt="x", structured=pb.StructuredOutput(kind=pb.StructuredOutput.REGEX)), "needs its spec"),
    (dict(prompt="x", structured=pb.StructuredOutput(spec="a+")), "needs its kind"),
    (dict(prompt="x", tools_json='[{"type":"function","function":{"name":"f"}}]'), "raw prompt"),
    (dict(messages=[pb.ChatMessage(role="user", content="y")], tools_json="[{}]"), "tools"),
    (dict(messages=[pb.ChatMessage(role="user", content="y")], tools_json="x" * 70000), "bytes"),
    (dict(messages=[pb.ChatMessage(role="user", content="y")],
          tools_json='[{"type":"function","function":{"name":"f"}}]', tool_choice="g"), "tool_choice"),
    (dict(messages=[pb.ChatMessage(role="user", content="y")], tool_choice="required"), "needs tools"),
    (dict(messages=[pb.ChatMessage(role="user", content="y", tool_calls=[pb.ToolCall(name="f")])]), "assistant"),
    (dict(messages=[pb.ChatMessage(role="user", content="y", tool_call_id="c1")]), "role tool"),
    (dict(operation=pb.GenerateRequest.DETOKENIZE, prompt_token_ids=[-1]), "detokenize"),
    (dict(prompt="x", prompt_token_ids=[1]), "detokenize"),
])
def test_bad_requests_are_refused_with_a_reason(req, words):
    with pytest.raises(generation.BadRequestError, match=words) as info:
        generation.parse_generate(_req(**req), "m")
    assert status_code_of(info.value) == grpc.StatusCode.INVALID_ARGUMENT


def test_vllm_parameters_tools_and_operations_are_read_into_the_job():
    tools = '[{"function":{"name":"f","parameters":{"type":"object"}},"type":"function"}]'
    req = generation.make_request(messages=[{"role": "user", "content": "q"},
                                            {"role": "assistant", "content": None, "tool_calls": [
                                                {"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
                                            {"role": "tool", "content": "sunny", "tool_call_id": "c1"}],
                                  model="m", max_tokens=None, presence_penalty=0.5, repetition_penalty=1.2,
                                  min_p=0.1, min_tokens=2, stop_token_ids=[7], top_logprobs=3, logit_bias={9: -5.0},
                                  structured=(pb.StructuredOutput.REGEX, "[ab]+"), tools=tools, tool_choice="f")
    job = generation.parse_generate(req, "m")
    s = job.sampling
    assert s.max_tokens is None  # until the context ends
    assert (s.presence_penalty, round(s.repetition_penalty, 3), round(s.min_p, 3), s.min_tokens, s.stop_token_ids,
            s.top_logprobs, s.logit_bias, s.structured) == (0.5, 1.2, 0.1, 2, (7,), 3, ((9, -5.0),),
                                                             (pb.StructuredOutput.REGEX, "[ab]+"))
    assert s.reshapes_distribution and job.calls_tools and job.tool_choice == "f"
    assert job.prompt.template_tools()[0]["function"]["name"] == "f"
    template = job.prompt.template_messages()
    assert template[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert template[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    detok = generation.parse_generate(generation.make_request(model="m", operation=pb.GenerateRequest.DETOKENIZE,
                                                              token_ids=[1, 2]), "m")
    assert detok.token_ids == (1, 2) and detok.operation == pb.GenerateRequest.DETOKENIZE


def test_wrong_model_is_not_found():
    with pytest.raises(generation.WrongModelError, match="serves 'a', not 'b'") as info:
        generation.parse_generate(_req(model="b", prompt="x"), "a")
    assert status_code_of(info.value) == grpc.StatusCode.NOT_FOUND
    generation.parse_generate(_req(model="a", prompt="x"), "a")  # its own name, or none, is fine


def test_score_request_needs_exactly_one_target():
    with pytest.raises(generation.BadRequestError, match="exactly one"):
        generation.parse_score(pb.ScoreRequest(prompt="p"), "m")
    with pytest.raises(generation.BadRequestError, match="exactly one"):
        generation.parse_score(pb.ScoreRequest(prompt="p", text="t", token_ids=[1]), "m")
    with pytest.raises(generation.BadRequestError, match="top_k"):
        generation.parse_score(pb.ScoreRequest(prompt="p", text="t", top_k=MODEL_NODE.max_score_top_k + 1), "m")
    job = generation.parse_score(pb.ScoreRequest(prompt="p", token_ids=[5, 6], top_k=2), "m")
    assert job.token_ids == (5, 6) and job.top_k == 2


# --------------------------------------------------------------------------- receipts


def _signed(identity: Identity, req: pb.GenerateRequest, out: list[int]) -> pb.ReplyReceipt:
    return receipts.make_receipt(identity, "smollm2-135m", req, out, time_ms=1_700_000_000_000)


def test_receipt_verifies_and_binds_every_field():
    me = Identity.generate()
    req = _req(prompt="What?", sampling=dict(temperature=0.5, max_tokens=7))
    r = _signed(me, req, [1, 2, 3])
    receipts.verify_receipt(r, me.public_key, req, [1, 2, 3])
    assert r.node_id == me.node_id
    for field, value in [("model", "other"), ("prompt_hash", b"\0" * 32), ("output_hash", b"\0" * 32),
                         ("sampling_hash", b"\0" * 32), ("time_ms", 1), ("node_id", b"\1" * 32)]:
        forged = pb.ReplyReceipt()
        forged.CopyFrom(r)
        setattr(forged, field, value)
        with pytest.raises(receipts.ReceiptError):
            receipts.verify_receipt(forged, me.public_key)
    with pytest.raises(receipts.ReceiptError, match="other than"):
        receipts.verify_receipt(r, Identity.generate().public_key)
    with pytest.raises(receipts.ReceiptError, match="output"):
        receipts.verify_receipt(r, me.public_key, req, [1, 2, 4])
    other = _req(prompt="What?", sampling=dict(temperature=0.6, max_tokens=7))
    with pytest.raises(receipts.ReceiptError, match="sampling"):
        receipts.verify_receipt(r, me.public_key, other)


def test_prompt_hash_separates_text_from_chat():
    assert receipts.prompt_hash("user\0hi") != receipts.prompt_hash(messages=[("user", "hi")])
    assert receipts.prompt_hash(messages=[("user", "ab"), ("user", "c")]) != \
        receipts.prompt_hash(messages=[("user", "a"), ("user", "bc")])


# --------------------------------------------------------------------------- admission


def test_admission_refuses_beyond_its_limit_and_recovers():
    adm = Admission(2)
    with adm, adm:
        with pytest.raises(BusyError):
            with adm:
                pass
        assert adm.inflight == 2 and adm.refused == 1
    assert adm.inflight == 0
    with adm:
        assert adm.inflight == 1


class _SlowEngine:
    """Unit-test stand-in: streams two deltas per request, waiting on an event."""

    model = "m"
    max_model_len = 100
    startup_s = 0.0

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.shared_passes = SharedPasses(0)  # status reports its scoring counters

    def encode(self, prompt):
        return [1, 2, 3]

    def check_fits(self, ids, reserve=1):
        pass

    async def generate(self, ids, sampling, request_id=None, logprobs=None):
        yield EngineDelta("a", (7,))
        await self.release.wait()
        yield EngineDelta("b", (8,), finished=True, finish_reason="stop")


async def test_generator_answers_busy_beyond_running_plus_queued_and_signs_replies():
    params = ModelNodeParams(max_running_requests=1, max_queued_requests=1)
    engine, me = _SlowEngine(), Identity.generate()
    gen = LocalGenerator(engine, me, params)
    req = _req(prompt="x")
    streams = [gen(req) for _ in range(3)]
    assert (await anext(streams[0])).text == "a"
    assert (await anext(streams[1])).text == "a"
    with pytest.raises(BusyError):
        await anext(streams[2])
    engine.release.set()
    last = await anext(streams[0])
    assert last.final and last.served_by == me.node_id_hex
    receipts.verify_receipt(last.receipt, me.public_key, req, [7, 8])
    await anext(streams[1])
    assert (await anext(gen(req))).text == "a"  # room again


# --------------------------------------------------------------------------- catalogue & CLI


def test_unknown_model_lists_the_catalogue():
    with pytest.raises(catalogue.UnknownModelError, match="smollm2-135m"):
        catalogue.resolve("gpt-17")


def test_weights_folder_is_checked(tmp_path):
    with pytest.raises(catalogue.WeightsMissingError, match="no such folder"):
        catalogue.check_available("llama3-8b", tmp_path / "nope")
    with pytest.raises(catalogue.WeightsMissingError, match="config.json"):
        catalogue.check_available("llama3-8b", tmp_path)


def _cli(*args: str, env_home: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(env_home), "HF_HOME": str(env_home / "hf")}
    return subprocess.run([sys.executable, "-m", "model_node.cli", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_serve_without_weights_fails_at_once_saying_where_to_put_them(tmp_path):
    r = _cli("serve", "--model", "llama3-8b", "--home", str(tmp_path / "h"), env_home=tmp_path)
    assert r.returncode == 2
    assert "meta-llama/Meta-Llama-3-8B-Instruct" in r.stderr and "--weights" in r.stderr
    assert "never downloads" in r.stderr
    assert not (tmp_path / "h" / "node.json").exists()


def test_cli_rejects_bad_arguments(tmp_path):
    r = _cli("serve", "--capacity", "11", env_home=tmp_path)
    assert r.returncode == 2 and "--capacity: 11 is not from 1 to 10" in r.stderr
    r = _cli("serve", "--model", "gpt-17", "--home", str(tmp_path / "h"), env_home=tmp_path)
    assert r.returncode == 2 and "unknown model 'gpt-17'" in r.stderr
    r = _cli("status", "--home", str(tmp_path / "none"), env_home=tmp_path)
    assert r.returncode == 3 and "no model node is running" in r.stderr  # as gt-user's (README "Exit statuses")


def test_a_failed_conversion_leaves_no_folder_behind(tmp_path):
    target = tmp_path / "models" / "broken"
    entry = catalogue.ModelEntry("broken", "a GGUF that is not there", package="json", gguf_file="nope.gguf")
    with pytest.raises(catalogue.WeightsMissingError, match="nope.gguf"):
        catalogue.ensure_converted(entry, target)
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file")
    with pytest.raises(Exception):
        catalogue._convert_atomically(bogus, target)
    assert not target.exists()
    assert not [p for p in target.parent.iterdir() if ".tmp-" in p.name]  # no temp dir left either


class _Load:
    active = queued = prefix_queries = prefix_hits = 0
    kv_cache_usage = 0.0


async def test_busy_over_real_grpc_tls_is_resource_exhausted():
    """The service shell maps admission refusals to RESOURCE_EXHAUSTED "busy" on the wire."""
    from gentorrent.crypto import tls
    from model_node.service import ModelNodeService
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    engine, me = _SlowEngine(), Identity.generate()
    engine.load = lambda: _Load()
    gen = LocalGenerator(engine, me, ModelNodeParams(max_running_requests=1, max_queued_requests=0))
    tls_id = tls.make_self_signed(me)
    server, port = tls.new_server(tls_id, "127.0.0.1:0")
    rpc.add_ModelNodeServicer_to_server(ModelNodeService(gen), server)
    await server.start()
    channel = await tls.connect(f"127.0.0.1:{port}", tls_id.cert_pem, timeout=10)
    try:
        stub = rpc.ModelNodeStub(channel)
        first = stub.Generate(_req(prompt="x"), timeout=10)
        assert (await first.read()).text == "a"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [c async for c in stub.Generate(_req(prompt="y"), timeout=10)]
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and info.value.details() == "busy"
        engine.release.set()
        final = await first.read()
        assert final.final
        receipts.verify_receipt(final.receipt, me.public_key, _req(prompt="x"), [7, 8])
        status = await stub.Status(pb.Empty(), timeout=10)
        assert status.model == "m" and '"refused_busy": 1' in status.json
    finally:
        await channel.close()
        await server.stop(None)


def test_load_stats_sum_prefix_counters_and_keep_the_latest_scheduler_view():
    from types import SimpleNamespace as NS

    from model_node.engine import LoadStats

    stats = LoadStats()
    for running, waiting, usage, q, h in [(2, 1, 0.25, 100, 0), (1, 0, 0.125, 40, 32)]:
        stats.record(NS(num_running_reqs=running, num_waiting_reqs=waiting, num_skipped_waiting_reqs=0,
                        kv_cache_usage=usage, prefix_cache_stats=NS(queries=q, hits=h)))
    assert (stats.running, stats.waiting, stats.kv_cache_usage) == (1, 0, 0.125)
    assert (stats.prefix_queries, stats.prefix_hits) == (140, 32)


# --------------------------------------------------------------------------- shared scoring passes


async def test_shared_passes_run_once_forget_failures_and_stay_bounded():
    """Identical passes coalesce (concurrent and later callers); a failure is not kept; kept
    results are bounded by scored tokens; a caller that gives up leaves the pass to the others."""
    passes = SharedPasses(max_tokens=10)
    ran: list[str] = []
    gate = asyncio.Event()

    def compute(name: str, fail: bool = False):
        async def run():
            ran.append(name)
            await gate.wait()
            if fail:
                raise RuntimeError("engine failed")
            return (name,)
        return run

    key_a, key_b = SharedPasses.key([1, 2], [3], 5), SharedPasses.key([1], [2, 3], 5)
    assert key_a != key_b != SharedPasses.key([1, 2], [3], 4)  # the split and k are part of the pass
    waiters = [asyncio.ensure_future(passes.get(key_a, 6, compute("a"))) for _ in range(3)]
    await asyncio.sleep(0)
    waiters[0].cancel()  # one caller gives up
    gate.set()
    assert await asyncio.gather(*waiters[1:]) == [("a",), ("a",)] and ran == ["a"]
    assert await passes.get(key_a, 6, compute("a again")) == ("a",) and ran == ["a"]
    assert (passes.requests, passes.passes) == (4, 1)

    with pytest.raises(RuntimeError, match="engine failed"):
        await passes.get(key_b, 6, compute("b", fail=True))
    assert await passes.get(key_b, 6, compute("b retried")) == ("b retried",)  # and it evicted "a" (12 > 10)
    assert await passes.get(key_a, 6, compute("a recomputed")) == ("a recomputed",)
    assert ran == ["a", "b", "b retried", "a recomputed"] and passes.passes == 4
