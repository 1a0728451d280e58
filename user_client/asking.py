"""Asking a model node through the anonymous overlay (ARCHITECTURE.md §3.3, paper §3.2 steps 3-4).

One attempt: choose a model node, seal the query (prompt, sampling, model, the n proxies'
reply routes, a fresh reply key) to its onion key, split it into n cloves, seal each clove
to the node again, and send clove i over path i. Reply cloves come back through the proxies;
k of each chunk rebuild it, chunks are delivered in order. If the node does not answer in
time, the next node is tried (with paths that failed replaced); the user sees an error only
when no model node answered. The node that served a session gets its follow-ups (affinity).

A failing model node must cost the user as little as possible, and never its paths:
- a node that failed an ask is tried last for `failed_model_last_s` (the committee's reputation
  is the lasting judgement; this is the user's short memory);
- a clove that no path could deliver means the node is unreachable (dead, or paused), not
  that every path broke at once: the paths are kept, unless they fail again for another node;
- reply cloves are authenticated with keys only the user and the node hold, so a reply whose
  cloves open but whose message does not decode was sent that way by the node: the attempt
  fails at once instead of waiting out the reply timeout.

Verifiers ask through exactly this code, so a challenge and a user's ask are the same bytes
on the wire.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import secrets
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import grpc

from gentorrent.config import CLOVES, OVERLAY, CloveParams, OverlayParams
from gentorrent.crypto import onion, sida
from gentorrent import generation, receipts
from gentorrent.overlay import sealing
from gentorrent.channels import ChannelPool
from gentorrent.overlay.pathtable import Drop, DropCounter, DropReason
from gentorrent.overlay.reassembly import CloveGroups
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.ledger.directory import Directory
from gentorrent.ledger.sections import ModelRecord
from user_client.paths import PathManager, ProxyPath

log = logging.getLogger(__name__)

#: error of an attempt whose node sent authentic reply cloves holding no valid reply
UNDECODABLE_REPLY = "undecodable reply from the model node"


class AskError(RuntimeError):
    """No model node could answer; `attempts` says what happened with each one tried.

    `code` says why, for the user's API to answer with the right status: "no_trusted_node",
    "no_model_node_answered", "overloaded" (every node tried was busy), or a client-error code
    of the model nodes (generation.CLIENT_ERROR_CODES: the request itself is wrong)."""

    def __init__(self, message: str, attempts: list[dict] | None = None,
                 code: str = "no_model_node_answered") -> None:
        super().__init__(message)
        self.attempts = attempts or []
        self.code = code


class _Refused(Exception):
    """A model node refused the request itself (a client error): other nodes would too."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


class _NodeFailed(Exception):
    def __init__(self, reason: DropReason, detail: str = "") -> None:
        super().__init__(detail or reason.value)
        self.reason = reason


@dataclass
class Delta:
    """New text of a streamed answer."""

    text: str
    token_ids: list[int]


@dataclass
class Answer:
    text: str
    token_ids: list[int]
    served_by: str  # node id (hex) of the model node that served, as signed in the receipt
    model: str
    finish_reason: str
    receipt: pb.ReplyReceipt | None
    request: pb.GenerateRequest  # exactly what the model node was asked
    paths: list[list[str]]  # relays of each path the query went over
    attempts: list[dict]
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens as the serving node signed them in its receipt (0 without one)."""
        return self.receipt.prompt_tokens if self.receipt is not None else 0

    def as_dict(self) -> dict:
        return {"text": self.text, "served_by": self.served_by, "model": self.model,
                "finish_reason": self.finish_reason, "token_ids": self.token_ids,
                "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.token_ids)},
                "paths": self.paths, "attempts": self.attempts, "timings_ms": self.timings_ms}


def receipt_is_valid(receipt: pb.ReplyReceipt, node: ModelRecord, request: pb.GenerateRequest,
                     token_ids: list[int]) -> bool:
    """The reply is signed by the node the directory names, and covers what we asked and got."""
    if receipt.node_id != node.node_id:
        return False
    try:
        receipts.verify_receipt(receipt, node.public_key, request, token_ids)
    except (receipts.ReceiptError, ValueError):
        return False
    return True


class _Pending:
    """One attempt in flight: its reply key, paths, and reply chunks put back in order."""

    def __init__(self, rid: bytes, reply_key: bytes, paths: list[ProxyPath], node: ModelRecord) -> None:
        self.rid = rid
        self.reply_key = reply_key
        self.paths = paths
        self.node = node
        self.queue: asyncio.Queue[pb.GenerateChunk] = asyncio.Queue()
        self.next_seq = 0
        self.buffer: dict[int, pb.GenerateChunk] = {}
        self.tags = sealing.TagReader(reply_key)
        self.seqs: set[int] = set()  # chunks whose cloves were seen (to forget their groups)
        self.answered = False
        self.settle_timer: asyncio.TimerHandle | None = None
        self.cloves_from: set[int] = set()  # path indices that returned at least one clove
        self.timed_out = False  # the node went silent (rather than replied, if wrongly)

    def fail_now(self, error: str) -> None:
        """The node sent something no honest node sends: end the attempt now, out of order."""
        self.queue.put_nowait(pb.GenerateChunk(final=True, error=error))

    def deliver(self, seq: int, chunk: pb.GenerateChunk) -> None:
        self.buffer[seq] = chunk
        while self.next_seq in self.buffer:
            self.queue.put_nowait(self.buffer.pop(self.next_seq))
            self.next_seq += 1


class Asker:
    def __init__(
        self,
        directory: Directory,
        paths: PathManager,
        channels: ChannelPool,
        cloves: CloveParams = CLOVES,
        params: OverlayParams = OVERLAY,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.paths = paths
        if paths is not None:
            paths.replies_to = self.on_return  # reply blobs come from the relay straight here
        self.channels = channels
        self.cloves = cloves
        self.params = params
        self.rng = rng or random.SystemRandom()
        self.clock = clock
        self.groups = CloveGroups(cloves.k, params.max_pending_groups, params.reassembly_timeout_s,
                                  max_cloves=cloves.n, n=cloves.n)
        self.drops = DropCounter()
        self.affinity: dict[str, str] = {}  # session id -> model node id
        self._pending: dict[bytes, _Pending] = {}
        self._last_expire = 0.0
        self._on_link: dict[bytes, list[bytes]] = {}  # a path's first link -> requests replying on it
        self._failed_at: dict[str, float] = {}  # model node id -> when it last failed an attempt
        self._suspect_paths: set[int] = set()  # paths that could not reach an unreachable node
        self.asked = 0
        self.answered = 0
        self.chunks_in = 0  # reply chunks rebuilt and opened (progress of answers being streamed)

    # ------------------------------------------------------------------ reply cloves in

    async def on_return(self, path: ProxyPath, blob: bytes) -> None:
        """A blob came back on one of our paths; never raises (drops are counted)."""
        try:
            self._accept(path, blob)
        except Drop as drop:
            self.drops.count(drop.reason)

    def _accept(self, path: ProxyPath, blob: bytes) -> None:
        try:
            inner = onion.unwrap_return(path.secrets, blob)
        except onion.CloveLayerError as exc:
            raise Drop(DropReason.BAD_LAYER) from exc
        pending, index, seq = self._match(path, bytes(inner[: sealing.TAG_BYTES]))
        try:
            clove = sealing.open_reply_clove(pending.reply_key, index, seq, inner)
        except sealing.SealError as exc:
            raise Drop(DropReason.BAD_REPLY) from exc
        pending.cloves_from.add(index)
        path.replies += 1
        if pending.answered:  # a late clove of an ended attempt: only the path judgement needs it
            if len(pending.cloves_from) == len(pending.paths):
                self._settle(pending)  # every path has delivered: nothing left to wait for
            raise Drop(DropReason.LATE)
        pending.seqs.add(seq)
        now = self.clock()
        if now - self._last_expire > 1.0:
            self._last_expire = now
            self.groups.expire(now)
        try:
            message = self.groups.add((pending.rid, seq), clove, now)
        except Drop as drop:
            if drop.reason is DropReason.UNDECODABLE:  # authentic cloves that do not combine
                pending.fail_now(f"{UNDECODABLE_REPLY}: reply cloves do not combine")
            raise
        if message is None:
            return
        try:
            reply = sealing.open_reply(pending.reply_key, seq, message)
        except sealing.SealError as exc:
            pending.fail_now(f"{UNDECODABLE_REPLY}: {exc}")
            raise Drop(DropReason.BAD_REPLY) from exc
        pending.deliver(seq, reply.chunk)
        self.chunks_in += 1

    def _match(self, path: ProxyPath, tag: bytes) -> tuple[_Pending, int, int]:
        """The request, route index and chunk a reply clove on `path` belongs to."""
        for rid in reversed(self._on_link.get(path.first_link, ())):  # the newest request first
            pending = self._pending[rid]
            hit = pending.tags.read(tag)
            if hit is not None and hit[0] < len(pending.paths) and pending.paths[hit[0]] is path:
                return pending, hit[0], hit[1]
        raise Drop(DropReason.UNKNOWN_REQUEST)

    def _register(self, pending: _Pending) -> None:
        self._pending[pending.rid] = pending
        for path in pending.paths:
            self._on_link.setdefault(path.first_link, []).append(pending.rid)

    def _forget(self, pending: _Pending) -> None:
        self._pending.pop(pending.rid, None)
        for path in pending.paths:
            rids = self._on_link.get(path.first_link, [])
            if pending.rid in rids:
                rids.remove(pending.rid)
            if not rids:
                self._on_link.pop(path.first_link, None)
        for seq in pending.seqs:
            self.groups.discard((pending.rid, seq))

    # ------------------------------------------------------------------ choosing model nodes

    def candidates(self, model: str, session: str | None, node_id: str | None) -> list[ModelRecord]:
        askable = [m for m in self.directory.models() if len(m.onion_key) == sealing.KEY_BYTES]
        if node_id is not None:  # a verifier probing one node, or an explicit choice
            return [m for m in askable if m.node_id_hex == node_id][:1]
        nodes = [m for m in askable if m.model == model and m.trusted]
        self.rng.shuffle(nodes)
        nodes.sort(key=lambda m: -m.reputation)
        preferred = self.affinity.get(session) if session else None
        nodes.sort(key=lambda m: m.node_id_hex != preferred)
        nodes.sort(key=lambda m: self._failed_recently(m.node_id_hex))  # even a session's node
        return nodes[: self.params.max_model_attempts]

    def _failed_recently(self, node_id: str) -> bool:
        at = self._failed_at.get(node_id)
        return at is not None and self.clock() - at < self.params.failed_model_last_s

    def _note_failure(self, node_id: str) -> None:
        now = self.clock()
        for old in [n for n, at in self._failed_at.items() if now - at >= self.params.failed_model_last_s]:
            del self._failed_at[old]
        self._failed_at[node_id] = now

    # ------------------------------------------------------------------ asking

    async def ask_stream(self, request: pb.GenerateRequest, node_id: str | None = None,
                         buffered: bool = False, affinity: str | None = None) -> AsyncIterator[Delta | Answer]:
        """Deltas of the answer as they arrive, then exactly one Answer; AskError if nobody answered.

        Once a delta was passed on, a failing node cannot be replaced (the caller has shown
        its text); `buffered` passes on only the final Answer, so any failure moves on to
        the next node. `affinity` keys the session's node on this side only (default: the
        request's session id), so a conversation keeps its node even on turns that carry no
        session id. A node that refuses the request itself is checked with one more node, so
        one dishonest node cannot fail asks by calling them bad; two refusals end the ask.
        """
        self.asked += 1
        session = affinity or request.session_id or None
        nodes = self.candidates(request.model, session, node_id)
        if not nodes:  # the directory is refreshed every few seconds; a new node may be missing
            await self.directory.refresh()
            nodes = self.candidates(request.model, session, node_id)
        if not nodes:
            raise AskError(f"no trusted model node serves {request.model!r}", code="no_trusted_node")
        attempts: list[dict] = []
        refusals: list[_Refused] = []
        for node in nodes:
            started = False
            try:
                async for item in self._attempt(node, request, attempts):
                    if buffered and isinstance(item, Delta):
                        continue
                    started = True
                    yield item
                self.answered += 1
                if session:
                    self.affinity.pop(session, None)
                    self.affinity[session] = node.node_id_hex
                    while len(self.affinity) > self.params.max_affinities:
                        del self.affinity[next(iter(self.affinity))]
                return
            except _Refused as refused:
                attempts[-1].update(ok=False, reason=refused.code, detail=str(refused))
                refusals.append(refused)
                if started or len(refusals) >= 2:
                    break
                continue
            except _NodeFailed as failed:
                self.drops.count(failed.reason)
                self._note_failure(node.node_id_hex)
                attempts[-1].update(ok=False, reason=failed.reason.value, detail=str(failed))
                if started:
                    raise AskError(f"model node {node.node_id_hex[:16]} failed mid-answer: "
                                   f"{failed.reason.value}: {failed}", attempts) from None
        if refusals:
            raise AskError(f"the model node refused the request: {refusals[-1]}", attempts, code=refusals[-1].code)
        busy = all(a.get("reason") == DropReason.BUSY.value for a in attempts)
        raise AskError(
            f"no model node answered for {request.model!r} after {len(attempts)} attempt(s): "
            + "; ".join(f"{a['node'][:16]}: {a.get('reason')} ({a.get('detail')})" for a in attempts), attempts,
            code="overloaded" if busy else "no_model_node_answered")

    async def _attempt(self, node: ModelRecord, request: pb.GenerateRequest, attempts: list[dict]
                       ) -> AsyncIterator[Delta | Answer]:
        t0 = self.clock()
        attempt = {"node": node.node_id_hex, "address": node.address}
        attempts.append(attempt)
        n, k = self.cloves.n, self.cloves.k
        paths = await self.paths.pick(n)
        if len(paths) < n:
            # a model node decodes only cloves split n ways (sida.combine's expect=(n, k)): over
            # fewer paths it would never decode the query, and we would wait out the reply timeout
            raise _NodeFailed(DropReason.NO_ANSWER, f"only {len(paths)} usable paths, need {n}")
        attempt["paths"] = [list(p.relays) for p in paths]
        req = pb.GenerateRequest()
        req.CopyFrom(request)
        req.request_id = secrets.token_hex(16)
        pending = _Pending(secrets.token_bytes(16), secrets.token_bytes(sealing.KEY_BYTES), paths, node)
        query = pb.OverlayQuery(request=req, reply_key=pending.reply_key, k=k,
                                routes=[pb.ReplyRoute(proxy_address=p.proxy, link_id=p.reply_link) for p in paths])
        self._register(pending)
        timings: dict[str, float] = {}
        try:
            sealed = sealing.seal_query(node.onion_key, query)
            cloves = sida.split(sealed, len(paths), k)
            group = secrets.token_bytes(sealing.GROUP_BYTES)
            tokens = [secrets.token_bytes(sealing.TOKEN_BYTES) for _ in cloves]
            envelopes = [sealing.seal_clove(node.onion_key, group, c, t) for c, t in zip(cloves, tokens)]
            timings["seal_split_ms"] = (self.clock() - t0) * 1000
            t1 = self.clock()
            tried = list(paths)  # grows as spare paths replace failing ones
            sent = await asyncio.gather(*(self._send(node, p, e, t, tried) for p, e, t in zip(paths, envelopes, tokens)))
            timings["send_ms"] = (self.clock() - t1) * 1000
            delivered = sum(ok for ok, _ in sent)
            failed = [p for _, bad in sent for p in bad]
            if delivered == 0 and self._blame_node(failed):
                raise _NodeFailed(DropReason.NO_ANSWER, f"model node unreachable: none of {len(failed)} "
                                                        "sends delivered (paths kept)")
            for p in failed:
                self.paths.mark_failed(p)
            self._suspect_paths.difference_update({p.path_id for p in tried} - {p.path_id for p in failed})
            if delivered < k:
                raise _NodeFailed(DropReason.NO_ANSWER, f"only {delivered} of {len(paths)} cloves delivered")
            async for item in self._receive(pending, req, node, paths, attempts, timings, t0):
                yield item
        finally:
            if pending.cloves_from and not pending.timed_out and len(pending.cloves_from) < len(pending.paths):
                # the node replied (an answer, or an error or garbage that ended the attempt
                # early); its last reply cloves may still be on their way: judge the paths later
                pending.answered = True
                pending.settle_timer = asyncio.get_running_loop().call_later(
                    self.params.forward_timeout_s, self._settle, pending)
            else:
                self._settle(pending)
        attempt["ok"] = True

    def _settle(self, pending: _Pending) -> None:
        if pending.rid not in self._pending:
            return
        if pending.settle_timer is not None:
            pending.settle_timer.cancel()
        self._forget(pending)
        self._judge_paths(pending)

    def _blame_node(self, failed: list[ProxyPath]) -> bool:
        """No send delivered: blame the node (keep the paths) unless one of these paths already
        failed that way for another node, when the paths are the likelier culprit."""
        ids = {p.path_id for p in failed}
        if ids & self._suspect_paths:
            self._suspect_paths -= ids
            return False
        if len(self._suspect_paths) > 8 * self.cloves.proxies_kept:  # ids of retired paths: forget them
            self._suspect_paths.clear()
        self._suspect_paths |= ids
        return True

    async def _send(self, node: ModelRecord, path: ProxyPath, envelope: bytes, token: bytes,
                    in_use: list[ProxyPath]) -> tuple[bool, list[ProxyPath]]:
        """Send one clove, once more over a spare path if that fails; whether it was delivered,
        and the paths that failed (the caller decides whether they or the node are to blame).
        Delivered means the model node's Ack came back with the clove's delivery token: an ok
        without it is a relay that lost the clove and said otherwise."""
        instruction = pb.ProxyInstruction(destination=node.address, payload=envelope).SerializeToString()
        failed: list[ProxyPath] = []
        for _ in range(2):
            blob = onion.wrap_forward(path.secrets, instruction,
                                      pad_to=_bucket(len(instruction), self.params.pad_bucket_bytes))
            cert = self._relay_cert(path.first_hop)
            path.sends += 1
            if cert is None:
                log.info("path %d: first relay %s left the directory", path.path_id, path.first_hop)
            else:
                stub = rpc.RelayStub(self.channels.get(path.first_hop, cert))
                try:
                    ack = await stub.Forward(pb.CloveEnvelope(link_id=path.first_link, payload=blob),
                                             timeout=self.params.forward_timeout_s)
                    if ack.ok or ack.reason == DropReason.BUSY.value:
                        if hmac.compare_digest(ack.delivery_token, token):
                            return True, failed  # delivered; a busy node says so on the reply routes
                        self.drops.count(DropReason.UNPROVEN_DELIVERY)
                        log.info("path %d acknowledged a clove the model node never saw", path.path_id)
                    else:
                        log.info("path %d refused a clove: %s", path.path_id, ack.reason)
                except grpc.aio.AioRpcError as exc:
                    log.info("path %d failed a send: %s", path.path_id, exc.code())
            failed.append(path)
            spare = self.paths.spare(in_use)
            if spare is None:
                return False, failed
            in_use.append(spare)
            path = spare
        return False, failed

    def _relay_cert(self, address: str) -> bytes | None:
        return next((u.tls_cert_pem for u in self.directory.users() if u.address == address), None)

    async def _receive(self, pending: _Pending, req: pb.GenerateRequest, node: ModelRecord,
                       paths: list[ProxyPath], attempts: list[dict], timings: dict, t0: float
                       ) -> AsyncIterator[Delta | Answer]:
        text, token_ids = [], []
        timeout = self.params.first_reply_timeout_s
        while True:
            try:
                chunk = await asyncio.wait_for(pending.queue.get(), timeout)
            except asyncio.TimeoutError:
                pending.timed_out = True  # late reply cloves are not coming: judge the paths now
                raise _NodeFailed(DropReason.NO_ANSWER, f"no reply within {timeout:.0f} s") from None
            if "first_chunk_ms" not in timings:
                timings["first_chunk_ms"] = (self.clock() - t0) * 1000
            timeout = self.params.reply_idle_timeout_s
            if chunk.error and generation.client_error_code(chunk.error):
                raise _Refused(generation.client_error_code(chunk.error),
                               chunk.error.partition(": ")[2] or chunk.error)
            if chunk.error:
                reason = DropReason.BUSY if chunk.error.startswith(sealing.BUSY_ERROR) else DropReason.BAD_REPLY
                raise _NodeFailed(reason, f"model node error: {chunk.error}")
            if chunk.text or chunk.token_ids:
                text.append(chunk.text)
                token_ids.extend(chunk.token_ids)
                yield Delta(chunk.text, list(chunk.token_ids))
            if chunk.final:
                break
        if not chunk.HasField("receipt") or not receipt_is_valid(chunk.receipt, node, req, token_ids):
            raise _NodeFailed(DropReason.BAD_SIGNATURE, "reply receipt missing or not signed by the node")
        timings["total_ms"] = (self.clock() - t0) * 1000
        yield Answer("".join(text), token_ids, node.node_id_hex, req.model, chunk.finish_reason,
                     chunk.receipt, req, [list(p.relays) for p in paths], attempts, timings)

    def _judge_paths(self, pending: _Pending) -> None:
        """A path whose reply clove never came back (when others did) is failed: replace it."""
        if not pending.cloves_from:
            return
        for index, path in enumerate(pending.paths):
            if index not in pending.cloves_from:
                self.paths.mark_failed(path)

    def status(self) -> dict:
        return {"asked": self.asked, "answered": self.answered, "chunks_in": self.chunks_in,
                "pending": len(self._pending),
                "drops": self.drops.as_dict(), "sessions": len(self.affinity)}


def _bucket(size: int, bucket: int) -> int:
    return -(-size // bucket) * bucket
