"""Signed reply receipts: who served what, with which parameters, when.

Verifiers score a model node on the replies it signed, so a receipt must bind everything a
node could lie about: its id, the model it claims to run, the exact prompt (hash), the exact
output tokens (hash), the sampling parameters (hash) and the time, and the asker's audit commitment (so that an
audit of the reply can show its selection was fixed before the reply existed:
gentorrent/audits.py). Hashes are over canonical
encodings defined here, not over protobuf bytes (protobuf serialisation is not canonical
across implementations). The signature is Ed25519 over a domain-separated, length-prefixed
concatenation, so no two different receipts share a signed message.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable, Sequence

from gentorrent.crypto.keys import Identity, SignatureError, node_id_of, verify_signature
from gentorrent.wire import gentorrent_pb2 as pb

DOMAIN = b"gentorrent/reply-receipt/v1\x00"


class ReceiptError(ValueError):
    """A receipt does not match the reply, or its signature does not verify."""


def _lp(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def prompt_hash(prompt: str = "", messages: Iterable[tuple[str, str]] = ()) -> bytes:
    """SHA-256 of the request's prompt as the client wrote it (before any chat template).

    A raw prompt and a chat transcript are tagged differently, so a transcript can never
    hash like some raw prompt.
    """
    msgs = list(messages)
    h = hashlib.sha256()
    if msgs:
        h.update(b"chat\x00" + struct.pack(">I", len(msgs)))
        for role, content in msgs:
            h.update(_lp(role.encode()) + _lp(content.encode()))
    else:
        h.update(b"text\x00" + _lp(prompt.encode()))
    return h.digest()


def request_prompt_hash(request: pb.GenerateRequest) -> bytes:
    """The prompt's hash; what a tool-calling conversation adds to it (the tools the template
    shows, each message's tool calls and tool call id) and a detokenize request's token ids are
    covered too. Without them the hash is prompt_hash's, so plain asks keep their old hashes."""
    base = prompt_hash(request.prompt, ((m.role, m.content) for m in request.messages))
    extras = _prompt_extras(request)
    return hashlib.sha256(b"prompt+\x00" + base + extras).digest() if extras else base


def _prompt_extras(request: pb.GenerateRequest) -> bytes:
    parts = []
    if request.tools_json:
        parts.append(b"tools\x00" + _lp(request.tools_json.encode()))
    for i, m in enumerate(request.messages):
        if m.tool_calls or m.tool_call_id or m.name:
            calls = b"".join(_lp(c.id.encode()) + _lp(c.name.encode()) + _lp(c.arguments.encode()) for c in m.tool_calls)
            parts.append(b"message\x00" + struct.pack(">II", i, len(m.tool_calls)) + calls
                         + _lp(m.tool_call_id.encode()) + _lp(m.name.encode()))
    if request.prompt_token_ids:
        ids = list(request.prompt_token_ids)
        parts.append(b"token_ids\x00" + struct.pack(f">I{len(ids)}i", len(ids), *ids))
    return b"".join(parts)


def output_hash(token_ids: Sequence[int]) -> bytes:
    """SHA-256 of the output token ids as int32 little-endian (the proto's definition)."""
    return hashlib.sha256(struct.pack(f"<{len(token_ids)}i", *token_ids)).digest()


def sampling_hash(s: pb.SamplingParams) -> bytes:
    """SHA-256 of a fixed-layout encoding of the sampling parameters as requested."""
    body = struct.pack(">ffiI?QI", s.temperature, s.top_p, s.top_k, s.max_tokens, s.has_seed,
                       s.seed, len(s.stop))
    body += b"".join(_lp(x.encode()) for x in s.stop)
    return hashlib.sha256(b"sampling\x00" + body).digest()


def request_sampling_hash(request: pb.GenerateRequest) -> bytes:
    """How the reply was to be generated: the sampling parameters, and whatever else of the
    request constrains the output (vLLM's penalties and friends, guided decoding, the tool
    choice, the operation). Without any of those it is sampling_hash's, as before them."""
    base = sampling_hash(request.sampling)
    extras = _sampling_extras(request)
    return hashlib.sha256(b"sampling+\x00" + base + extras).digest() if extras else base


def _sampling_extras(request: pb.GenerateRequest) -> bytes:
    s = request.sampling
    vllm = (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_p, s.min_tokens, s.ignore_eos,
            s.top_logprobs)
    parts = []
    if any(vllm) or s.stop_token_ids or s.logit_bias:
        ids, bias = list(s.stop_token_ids), [(b.token_id, b.bias) for b in s.logit_bias]
        parts.append(b"vllm\x00" + struct.pack(">ffffI?I", *vllm) + struct.pack(f">I{len(ids)}i", len(ids), *ids)
                     + struct.pack(">I", len(bias)) + b"".join(struct.pack(">if", t, v) for t, v in bias))
    if request.structured.kind:
        parts.append(b"structured\x00" + struct.pack(">I", request.structured.kind)
                     + _lp(request.structured.spec.encode()))
    if request.tool_choice or request.parallel_tool_calls:
        parts.append(b"tools\x00" + _lp(request.tool_choice.encode()) + struct.pack(">?", request.parallel_tool_calls))
    if request.operation:
        parts.append(b"operation\x00" + struct.pack(">I", request.operation))
    return b"".join(parts)


def signed_message(r: pb.ReplyReceipt) -> bytes:
    """The audit commitment is appended only when present: receipts without one keep their
    old signed bytes, and the fixed-size tail before it keeps the two forms apart."""
    body = (DOMAIN + _lp(r.node_id) + _lp(r.model.encode()) + _lp(r.prompt_hash)
            + _lp(r.output_hash) + _lp(r.sampling_hash) + struct.pack(">QI", r.time_ms, r.prompt_tokens))
    return body + _lp(r.audit_commitment) if r.audit_commitment else body


def make_receipt(identity: Identity, model: str, request: pb.GenerateRequest,
                 output_token_ids: Sequence[int], time_ms: int, prompt_tokens: int = 0) -> pb.ReplyReceipt:
    """`prompt_tokens`: how many tokens the prompt was after the chat template, signed so that
    the usage a user's API reports comes from the serving node, not from a guess."""
    receipt = pb.ReplyReceipt(
        node_id=identity.node_id, model=model, prompt_hash=request_prompt_hash(request),
        output_hash=output_hash(output_token_ids), sampling_hash=request_sampling_hash(request),
        time_ms=time_ms, prompt_tokens=prompt_tokens, audit_commitment=request.audit_commitment,
    )
    receipt.signature = identity.sign(signed_message(receipt))
    return receipt


def verify_receipt(receipt: pb.ReplyReceipt, public_key: bytes,
                   request: pb.GenerateRequest | None = None,
                   output_token_ids: Sequence[int] | None = None) -> None:
    """Raise ReceiptError unless `receipt` is signed by `public_key` (and, when given,
    covers exactly `request` and `output_token_ids`)."""
    if receipt.node_id != node_id_of(public_key):
        raise ReceiptError("receipt names a node other than the key's owner")
    try:
        verify_signature(public_key, receipt.signature, signed_message(receipt))
    except SignatureError as exc:
        raise ReceiptError("receipt signature does not verify") from exc
    if request is not None:
        if receipt.prompt_hash != request_prompt_hash(request):
            raise ReceiptError("receipt covers a different prompt")
        if receipt.sampling_hash != request_sampling_hash(request):
            raise ReceiptError("receipt covers different sampling parameters")
        if request.model and receipt.model != request.model:
            raise ReceiptError("receipt names a different model")
        if receipt.audit_commitment != request.audit_commitment:
            raise ReceiptError("receipt covers a different audit commitment")
    if output_token_ids is not None and receipt.output_hash != output_hash(output_token_ids):
        raise ReceiptError("receipt covers different output tokens")
