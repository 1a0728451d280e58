"""The response objects of the user node's OpenAI API, as vLLM's server writes them (pure).

Chat completions and their stream chunks (content, logprobs, tool calls), text completions,
the Responses API's response object and its stream events. Built from `Answer`s and `Delta`s
(user_client.asking): everything here is what the serving node sent and signed, laid out as
OpenAI's clients (the official SDK, LangChain, LlamaIndex) parse it.
"""

from __future__ import annotations

import json
import secrets
import time

from user_client.api_requests import AskSpec

#: finish reasons OpenAI's clients know (vLLM passes its own through: "stop", "length", "tool_calls")
FINISH_REASONS = ("stop", "length", "tool_calls")


def finish(reason: str) -> str:
    return reason if reason in FINISH_REASONS else "stop"


def event(doc: dict) -> bytes:
    """One server-sent event of a chat or completion stream."""
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def usage(answers: list) -> dict:
    """Usage of one ask (n choices: the prompt once, every choice's tokens)."""
    prompt = answers[0].prompt_tokens if answers else 0
    completion = sum(len(a.token_ids) for a in answers)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_logprobs(tokens: list) -> dict:
    """OpenAI's chat `logprobs` object from pb.TokenAlternatives (one per output token)."""
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.token),
                         "top_logprobs": [{"token": s, "logprob": lp, "bytes": _bytes(s)}
                                          for s, lp in zip(t.tokens, t.logprobs)]} for t in tokens],
            "refusal": None}


def completion_logprobs(tokens: list, offset: int = 0) -> dict:
    """The legacy completions `logprobs` object (tokens, token_logprobs, top_logprobs, text_offset)."""
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(zip(t.tokens, t.logprobs)) for t in tokens], "text_offset": offsets}


def tool_calls(calls: list) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


class Shape:
    """OpenAI's response objects for one ask (chat.completion or text_completion)."""

    def __init__(self, chat: bool, spec: AskSpec) -> None:
        self.chat, self.spec = chat, spec
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.spec.model,
                "system_fingerprint": None}

    def _choice(self, index: int, answer) -> dict:
        reason = finish(answer.finish_reason)
        if not self.chat:
            return {"index": index, "text": answer.text, "finish_reason": reason,
                    "logprobs": completion_logprobs(answer.top_logprobs) if self.spec.logprobs else None}
        message = {"role": "assistant", "content": answer.text if answer.text or not answer.tool_calls else None,
                   "refusal": None}
        if answer.tool_calls:
            message["tool_calls"] = tool_calls(answer.tool_calls)
        return {"index": index, "message": message, "finish_reason": reason,
                "logprobs": chat_logprobs(answer.top_logprobs) if self.spec.logprobs else None}

    def completion(self, answers: list) -> dict:
        first = answers[0]
        return {**self._head("chat.completion" if self.chat else "text_completion"),
                "choices": [self._choice(i, a) for i, a in enumerate(answers)], "usage": usage(answers),
                "gentorrent": {"served_by": first.served_by, "paths": first.paths, "timings_ms": first.timings_ms,
                               "choices": [{"served_by": a.served_by, "paths": a.paths} for a in answers]}}

    def _chunk(self, choice: dict) -> bytes:
        doc = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if self.spec.include_usage:
            doc["usage"] = None
        return event(doc)

    def first(self, index: int) -> bytes:
        """A chat stream's opening chunk of one choice (its role)."""
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                            "logprobs": None})

    def delta(self, index: int, delta) -> bytes:
        """New text of one choice (a user_client.asking.Delta)."""
        lp = None
        if self.spec.logprobs:
            lp = chat_logprobs(delta.top_logprobs) if self.chat else completion_logprobs(delta.top_logprobs)
        if self.chat:
            return self._chunk({"index": index, "delta": {"content": delta.text}, "finish_reason": None,
                                "logprobs": lp})
        return self._chunk({"index": index, "text": delta.text, "finish_reason": None, "logprobs": lp})

    def tool_call_chunks(self, index: int, answer) -> list[bytes]:
        """A choice's tool calls in a stream, one chunk per call (name and whole arguments)."""
        return [self._chunk({"index": index, "delta": {"tool_calls": [{"index": i, **call}]}, "finish_reason": None,
                             "logprobs": None}) for i, call in enumerate(tool_calls(answer.tool_calls))]

    def end(self, index: int, answer) -> bytes:
        reason = finish(answer.finish_reason)
        if self.chat:
            return self._chunk({"index": index, "delta": {}, "finish_reason": reason, "logprobs": None})
        return self._chunk({"index": index, "text": "", "finish_reason": reason, "logprobs": None})

    def usage_chunk(self, answers: list) -> bytes:
        return event({**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                      "usage": usage(answers)})


# --------------------------------------------------------------------------- the Responses API (text)


class ResponseShape:
    """POST /v1/responses for text: the response object and its stream's events."""

    def __init__(self, spec: AskSpec, instructions: str | None, max_output_tokens: int | None) -> None:
        self.spec, self.instructions, self.max_output_tokens = spec, instructions, max_output_tokens
        self.id, self.item_id = "resp_" + secrets.token_hex(24), "msg_" + secrets.token_hex(24)
        self.created = int(time.time())
        self.seq = 0

    def response(self, answer=None, status: str = "completed") -> dict:
        output = []
        if answer is not None:
            output = [self._item(answer.text, "completed")]
        doc = {"id": self.id, "object": "response", "created_at": self.created, "model": self.spec.model,
               "status": status, "output": output, "instructions": self.instructions,
               "max_output_tokens": self.max_output_tokens, "temperature": self.spec.temperature,
               "top_p": self.spec.top_p, "parallel_tool_calls": False, "tool_choice": "none", "tools": [],
               "text": {"format": {"type": "text"}}, "truncation": "disabled", "error": None,
               "incomplete_details": None, "metadata": {}, "usage": None}
        if answer is not None:
            doc["output_text"] = answer.text
            if answer.finish_reason == "length":
                doc["status"], doc["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            u = usage([answer])
            doc["usage"] = {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                            "total_tokens": u["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                            "output_tokens_details": {"reasoning_tokens": 0}}
            doc["gentorrent"] = {"served_by": answer.served_by, "paths": answer.paths}
        return doc

    def _item(self, text: str, status: str) -> dict:
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}

    def _event(self, kind: str, **fields) -> bytes:
        self.seq += 1
        doc = {"type": kind, "sequence_number": self.seq, **fields}
        return f"event: {kind}\ndata: {json.dumps(doc)}\n\n".encode()

    def opening(self) -> list[bytes]:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self._event("response.created", response=self.response(status="in_progress")),
                self._event("response.in_progress", response=self.response(status="in_progress")),
                self._event("response.output_item.added", output_index=0, item=self._item("", "in_progress")),
                self._event("response.content_part.added", item_id=self.item_id, output_index=0, content_index=0,
                            part=part)]

    def delta(self, text: str) -> bytes:
        return self._event("response.output_text.delta", item_id=self.item_id, output_index=0, content_index=0,
                           delta=text, logprobs=[])

    def closing(self, answer) -> list[bytes]:
        part = {"type": "output_text", "text": answer.text, "annotations": [], "logprobs": []}
        return [self._event("response.output_text.done", item_id=self.item_id, output_index=0, content_index=0,
                            text=answer.text, logprobs=[]),
                self._event("response.content_part.done", item_id=self.item_id, output_index=0, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=0, item=self._item(answer.text, "completed")),
                self._event("response.completed", response=self.response(answer))]

    def failed(self, error: dict) -> bytes:
        doc = self.response(status="failed")
        doc["error"] = {"code": error.get("code") or "server_error", "message": error.get("message", "")}
        return self._event("response.failed", response=doc)
