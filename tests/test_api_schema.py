"""schemathesis against the user node's OpenAI-compatible API (user_client/openapi.json, served
at /openapi.json): an ApiServer on a real UserNode asking through real relays to the echo
model node. Every generated request must get a documented status (200, 400, 413, or 503 when no
model node answers, e.g. for an unknown model name): an undocumented 500 fails the check.
(schemathesis' own not_a_server_error check is not used: it counts the documented 503 too.)"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import aiohttp
import pytest

from gentorrent.config import CloveParams, OverlayParams
from testkit.echo_model import EchoModelNode
from testkit.localnet import start_user_nodes
from user_client.openai_api import ApiServer

pytestmark = [pytest.mark.network, pytest.mark.timeout(300)]
ST = Path(sys.executable).with_name("st")
CLOVES = CloveParams(n=2, k=1, path_length=2, proxies_kept=2)
FAST = OverlayParams(first_reply_timeout_s=8.0, reply_idle_timeout_s=10.0, forward_timeout_s=5.0,
                     establish_timeout_s=5.0, maintenance_interval_s=2.0, build_attempts=6)
MAX_EXAMPLES = 12  # per operation: bounded, the whole run stays well under a minute on an idle machine


@pytest.fixture
async def api(tmp_path):
    directory = tmp_path / "directory.json"
    model = EchoModelNode(tmp_path / "model", directory, cloves=CLOVES, params=FAST)
    await model.start()
    nodes = await start_user_nodes(5, directory, tmp_path, cloves=CLOVES, params=FAST, maintain=False)
    await nodes[0].paths.fill()
    server = ApiServer(nodes[0])
    await server.start()
    yield server
    await server.stop()
    for n in nodes:
        await n.stop()
    await model.stop()


async def test_openapi_document_is_served_and_describes_the_routes(api):
    async with aiohttp.ClientSession() as s:
        async with s.get(api.url + "/openapi.json") as r:
            assert r.status == 200
            doc = await r.json()
    assert set(doc["paths"]) == {"/v1/chat/completions", "/v1/models", "/gt/ask", "/gt/status"}


@pytest.mark.parametrize("body", [
    {"prompt": "x", "max_tokens": 1e309},           # JSON infinity
    {"prompt": "x", "temperature": "nan"},
    {"prompt": "x", "session": {"a": 1}},
    {"prompt": "x", "node_id": 5},
    {"prompt": "x", "temperature": 9},
    {"prompt": "x", "max_tokens": True},
    {"prompt": "x", "max_tokens": "12"},
    {"prompt": 7},
])
async def test_gt_ask_odd_fields_get_a_clear_400_naming_the_problem(api, body):
    async with aiohttp.ClientSession() as s:
        async with s.post(api.url + "/gt/ask", data=json.dumps(body)) as r:
            assert r.status == 400, (r.status, await r.text())
            message = (await r.json())["error"]["message"]
    named = [k for k in ("max_tokens", "temperature", "session", "prompt") if k in message]
    assert named and (named[0] in body or named[0] == "session"), message


@pytest.mark.skipif(not ST.exists() and not shutil.which("st"), reason="schemathesis not installed")
async def test_schemathesis_finds_no_server_error_and_no_undocumented_status(api, tmp_path):
    st = str(ST if ST.exists() else shutil.which("st"))
    proc = await asyncio.create_subprocess_exec(
        st, "run", api.url + "/openapi.json", "--checks", "status_code_conformance",
        "--max-examples", str(MAX_EXAMPLES), "--workers", "1", "--request-timeout", "40", "--seed", "1",
        "--no-color", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 280)
    text = out.decode(errors="replace")
    (tmp_path / "schemathesis.txt").write_text(text)
    assert proc.returncode == 0, text[-4000:]
