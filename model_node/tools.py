"""Tool calling on the model node, as vLLM's OpenAI server does it (its own code where it has one).

A request with tools and a tool choice other than "none" is answered in one of two ways:

- forced (`tool_choice` "required" or a function's name): the output is constrained by guided
  decoding to the JSON schema vLLM derives from the tools (`get_json_schema_from_tools`):
  a named choice produces that function's arguments, "required" a JSON list of
  {"name", "parameters"} objects. Any model can do this, however small: the grammar, not the
  model, guarantees the call's shape (SmolLM2-135M fills the arguments, not always sensibly).
- "auto": the model writes freely and vLLM's tool parser for its family (`--tool-call-parser`,
  e.g. hermes: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`) finds the calls in the
  text. Only a model trained to emit that format calls tools this way; SmolLM2-135M rarely does.

The calls travel back on the reply's final chunk (`GenerateChunk.tool_calls`), the content
without the calls' markup as its text; the user node only forwards them.
"""

from __future__ import annotations

import json
import logging
import secrets

from gentorrent.generation import GenerateJob, Structured, canonical_json
from gentorrent.wire import gentorrent_pb2 as pb

log = logging.getLogger(__name__)

#: the parser `--tool-call-parser` defaults to (vLLM's name); SmolLM2's instruct data uses this format
DEFAULT_TOOL_PARSER = "hermes"


def forced(job: GenerateJob) -> bool:
    return job.calls_tools and job.tool_choice not in ("", "auto")


def constraint(job: GenerateJob) -> tuple[int, str] | None:
    """The guided-decoding schema of a forced tool choice (vLLM's own derivation), else None."""
    if not forced(job):
        return None
    from vllm.entrypoints.openai.chat_completion.protocol import (ChatCompletionNamedToolChoiceParam,
                                                                  ChatCompletionToolsParam)
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    tools = [ChatCompletionToolsParam.model_validate(t) for t in job.prompt.template_tools()]
    choice = job.tool_choice if job.tool_choice == "required" else ChatCompletionNamedToolChoiceParam.model_validate(
        {"type": "function", "function": {"name": job.tool_choice}})
    schema = get_json_schema_from_tools(choice, tools, job.parallel_tool_calls)
    return (Structured.JSON_SCHEMA, canonical_json(schema if isinstance(schema, dict) else json.loads(schema)))


def _call(name: str, arguments) -> pb.ToolCall:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return pb.ToolCall(id=f"chatcmpl-tool-{secrets.token_hex(16)}", name=name, arguments=args)


def parse_reply(job: GenerateJob, text: str, tokenizer, parser: str | None) -> tuple[str, list[pb.ToolCall]]:
    """(content, tool calls) of a finished reply to a request that may call tools."""
    if not job.calls_tools:
        return text, []
    if forced(job):
        try:
            if job.tool_choice == "required":
                return "", [_call(c["name"], c.get("parameters", {})) for c in json.loads(text)]
            json.loads(text)
            return "", [_call(job.tool_choice, text)]
        except (ValueError, KeyError, TypeError):  # cut off by max_tokens before the JSON closed
            log.info("a forced tool call did not parse (the reply was cut?): content instead")
            return text, []
    if not parser:
        return text, []
    return _auto(job, text, tokenizer, parser)


def _auto(job: GenerateJob, text: str, tokenizer, parser: str) -> tuple[str, list[pb.ToolCall]]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    request = ChatCompletionRequest(messages=[{"role": "user", "content": ""}], tools=job.prompt.template_tools(),
                                    tool_choice="auto")
    found = ToolParserManager.get_tool_parser(parser)(tokenizer, request.tools).extract_tool_calls(text, request)
    if not found.tools_called:
        return text, []
    return found.content or "", [_call(c.function.name, c.function.arguments) for c in found.tool_calls]
