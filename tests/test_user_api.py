"""The user node's local API with the official `openai` client, and gt-user as real processes.

The model node is `EchoModelNode` (test double: real intake, keys, TLS and receipts; its
engine echoes), so the answers are known exactly; every answer crosses the overlay.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import openai
import pytest

from gentorrent.config import CloveParams, OverlayParams
from testkit.echo_model import ECHO_PREFIX, EchoModelNode
from testkit.localnet import start_user_nodes
from user_client.openai_api import ApiServer, BadRequest, parse_chat_request

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]

CLOVES = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
FAST = OverlayParams(first_reply_timeout_s=10.0, reply_idle_timeout_s=15.0, forward_timeout_s=5.0,
                     establish_timeout_s=5.0, maintenance_interval_s=1.0)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def api(tmp_path):
    directory = tmp_path / "directory.json"
    # 4 chunks, slower than the reply cadence: each leaves the model node as its own reply message
    model = EchoModelNode(tmp_path / "model", directory, chunks=4, cloves=CLOVES, params=FAST,
                          chunk_delay_s=3 * FAST.reply_cadence_s)
    await model.start()
    nodes = await start_user_nodes(6, directory, tmp_path, cloves=CLOVES, params=FAST, maintain=False)
    await nodes[0].paths.fill()
    server = ApiServer(nodes[0], "127.0.0.1:0")
    await server.start()
    yield server, model
    await server.stop()
    for node in nodes:
        await node.stop()
    await model.stop()


async def test_openai_client_chat_completion_and_models(api):
    server, model = api
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = await client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=16)
    assert reply.choices[0].message.content == ECHO_PREFIX + "user: What is the capital of France?"
    assert reply.choices[0].finish_reason == "stop"
    stream = await client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=16,
                                                  stream=True)
    parts = [chunk.choices[0].delta.content or "" async for chunk in stream]
    assert "".join(parts) == ECHO_PREFIX + "user: What is the capital of France?"
    assert len([p for p in parts if p]) == 4  # the answer streamed in the model's 4 chunks
    await client.close()


async def test_openai_client_gets_clear_errors(api):
    server, model = api
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="smollm2-135m", messages=[], max_tokens=16)
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 503 and "no-such-model" in str(err.value)
    await client.close()


def test_chat_request_validation():
    ok = parse_chat_request({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                             "max_tokens": 5, "stop": "\n", "user": "s1"})
    assert ok["messages"] == [{"role": "user", "content": "hi"}] and ok["stop"] == ["\n"]
    assert ok["session"] == "s1"
    for bad in ({}, {"messages": "x"}, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
                {"messages": [{"role": "user", "content": "x"}], "temperature": 9},
                {"messages": [{"role": "user", "content": "x"}], "n": 2}, []):
        with pytest.raises(BadRequest):
            parse_chat_request(bad)


async def _cli(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "user_client.cli", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


async def test_gt_user_processes_ask_status_and_errors(tmp_path):
    """Four `gt-user start` processes relay for each other; `gt-user ask` answers through them."""
    directory = tmp_path / "directory.json"
    model = EchoModelNode(tmp_path / "model", directory)
    await model.start()
    procs = []
    try:
        for i in range(4):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "user_client.cli", "start", "--home", str(tmp_path / f"u{i}"),
                "--directory", str(directory), cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            procs.append(proc)
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert json.loads(line)["api"].startswith("http://127.0.0.1:")
        home = str(tmp_path / "u3")
        for _ in range(30):  # the nodes started first learn of the later ones within seconds
            code, out, err = await _cli("status", "--home", home, "--json")
            if code == 0 and json.loads(out)["paths"]["usable"] >= 4:
                break
            await asyncio.sleep(1)
        code, out, err = await _cli("ask", "hello overlay", "--home", home)
        assert code == 0, err
        assert out.strip() == ECHO_PREFIX + "hello overlay"
        assert "served by" in err
        code, out, err = await _cli("ask", "stream me", "--home", home, "--stream", "--json")
        assert code == 0, err
        assert json.loads(out)["text"] == ECHO_PREFIX + "stream me"
        code, out, err = await _cli("status", "--home", home, "--json")
        assert code == 0 and json.loads(out)["asking"]["answered"] == 2, out
        code, out, err = await _cli("ask", "x", "--home", home, "--model", "no-such-model")
        assert code == 1 and "no trusted model node serves 'no-such-model'" in err
        code, out, err = await _cli("ask", "x", "--home", str(tmp_path / "nobody"))
        assert code == 2 and "no running user node" in err
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            await asyncio.wait_for(proc.wait(), 30)
        await model.stop()
