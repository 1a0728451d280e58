"""schemathesis against the user node's OpenAI-compatible API (user_client/openapi.json, served
at /openapi.json): an ApiServer on a real UserNode asking through real relays to the echo
model node. Checked for every generated request: the status is one the document lists, the
content type and body match the documented schema (errors are OpenAI's error JSON), documented
headers (Retry-After) are there, a 405 names the allowed methods, and every request the
document calls invalid is refused with a 4xx (negative_data_rejection: the document and
api_requests.py agree on what is valid). schemathesis' not_a_server_error check is not used:
the document lists 503 (no model node answered), which it counts as a failure.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import pytest

from gentorrent.config import CloveParams, OverlayParams
from testkit.echo_model import EchoModelNode
from testkit.localnet import start_user_nodes
from user_client.openai_api import ApiServer

pytestmark = [pytest.mark.network, pytest.mark.timeout(300)]
ST = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"]
CHECKS = ("status_code_conformance,content_type_conformance,response_schema_conformance,"
          "response_headers_conformance,negative_data_rejection,unsupported_method,allow_header_conformance")
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
    assert set(doc["paths"]) == {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models",
                                 "/v1/models/{model}", "/tokenize", "/detokenize", "/health", "/ping", "/version",
                                 "/docs", "/gt/ask", "/gt/status"}


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": 1e309}, None),           # JSON Infinity: not JSON at all
    ({"prompt": "x", "temperature": "nan"}, "temperature"),
    ({"prompt": "x", "session": {"a": 1}}, "session"),
    ({"prompt": "x", "node_id": 5}, "node_id"),
    ({"prompt": "x", "temperature": 9}, "temperature"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "12"}, "max_tokens"),
    ({"prompt": 7}, "prompt"),
    ({"prompt": "x", "raw": True, "session": "s"}, "raw"),
    ({"prompt": "x", "wizard": 1}, "wizard"),
])
async def test_gt_ask_odd_fields_get_a_clear_400_naming_the_problem(api, body, param):
    async with aiohttp.ClientSession() as s:
        async with s.post(api.url + "/gt/ask", data=json.dumps(body)) as r:
            assert r.status == 400, (r.status, await r.text())
            error = (await r.json())["error"]
    assert error["param"] == param and (param or "Infinity") in error["message"], error


async def test_schemathesis_finds_no_undocumented_status_body_or_accepted_invalid_request(api, tmp_path):
    proc = await asyncio.create_subprocess_exec(
        *ST, "run", api.url + "/openapi.json", "--checks", CHECKS,
        "--max-examples", str(MAX_EXAMPLES), "--workers", "1", "--request-timeout", "40", "--seed", "1",
        "--no-color", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 280)
    text = out.decode(errors="replace")
    (tmp_path / "schemathesis.txt").write_text(text)
    assert proc.returncode == 0, text[-4000:]
