"""Asking a model node through the anonymous overlay (ARCHITECTURE.md §3.3, paper §3.2 steps 3-4).

One attempt: choose a model node, build the query (prompt, sampling, model, a fresh reply
key, and n reply routes: each path's proxy with a reply link ID fresh for this ask), pad it
to its size class, split it into n cloves, seal each to the node (gentorrent.overlay.sealing)
and send clove i over path i. The first hop acknowledges it (hop-local: nothing further on
is visible to anyone); reply messages come back through the proxies, k cloves of each
rebuild it, and they are delivered in order. If the node does not answer in time, the next
node is tried (with paths that failed replaced); the user sees an error only when no model
node answered. The node that served a session gets its follow-ups (affinity).

A path is judged on what only the model node and the user can know: every reply message
lists the delivery tokens of the query cloves the node received (late ones follow in a
one-clove delivery report), so a path whose clove never reached the node -- a relay that
drops silently -- is failed and replaced, and so is a path whose reply clove never came back.

A failing model node must cost the user as little as possible, and never its paths:
- a node that failed an ask is tried last for `failed_model_last_s` (the committee's reputation
  is the lasting judgement; this is the user's short memory);
- proxies that cannot hand a clove to the node say so in a sealed notice; when too few
  cloves can reach it the node is unreachable (dead, or paused), not every path broken at
  once: the paths are kept, unless they fail again for another node;
- reply cloves are authenticated with keys only the user and the node hold, so a reply whose
  cloves open but whose message does not decode was sent that way by the node: the attempt
  fails at once instead of waiting out the reply timeout.

Verifiers ask through exactly this code, so a challenge and a user's ask are the same bytes
on the wire.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from google.protobuf.message import DecodeError

from gentorrent.config import CLOVES, OVERLAY, CloveParams, OverlayParams
from gentorrent.crypto import onion
from gentorrent import generation, receipts
from gentorrent.overlay import sealing
from gentorrent.overlay.pathtable import Drop, DropCounter, DropReason
from gentorrent.overlay.reassembly import CloveGroups
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.directory import Directory
from gentorrent.ledger.sections import ModelRecord
from user_client.paths import PathManager, ProxyPath
from user_client.ranking import rank_by_reputation
from user_client.relay import RETURN_NOTICE, RETURN_REPLY

log = logging.getLogger(__name__)

#: error of an attempt whose node sent authentic reply cloves holding no valid reply
UNDECODABLE_REPLY = "undecodable reply from the model node"
#: error of an attempt whose cloves the proxies could not hand to the node
UNREACHABLE = "model node unreachable"
#: AskError.code of an ask this node could not send: fewer than n usable proxy paths
NO_PATHS = "no_paths"
#: AskError.code of an ask no model node answered in time (or whose nodes all failed)
NO_ANSWER = "no_model_node_answered"
#: AskError.code of an ask every node tried said it was too busy for
OVERLOADED = "overloaded"
#: times an ask goes again to one node over new paths when ours failed it (first hops that took
#: too few cloves, paths closed by a hop): each try fails the paths it found broken, and a relay
#: that went away may sit on several of the pool's paths, each found only when used
PATH_RETRIES = 3


class AskError(RuntimeError):
    """No model node could answer; `attempts` says what happened with each one tried.

    `code` says why, for the user's API to answer with the right status: "no_trusted_node",
    NO_ANSWER, OVERLOADED (every node tried was busy), NO_PATHS (this node
    could not send the ask: too few proxy paths), or a client-error code of the model nodes
    (generation.CLIENT_ERROR_CODES: the request itself is wrong)."""

    def __init__(self, message: str, attempts: list[dict] | None = None,
                 code: str = NO_ANSWER) -> None:
        super().__init__(message)
        self.attempts = attempts or []
        self.code = code


class _Refused(Exception):
    """A model node refused the request itself (a client error): other nodes would too."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


class NoPaths(Exception):
    """Too few proxy paths to send an ask: this user node's own state, no model node's doing."""


class _NodeFailed(Exception):
    def __init__(self, reason: DropReason, detail: str = "") -> None:
        super().__init__(detail or reason.value)
        self.reason = reason


def _decode_notice(body: bytes) -> pb.ProxyNotice:
    try:
        return pb.ProxyNotice.FromString(body)
    except DecodeError as exc:
        raise Drop(DropReason.BAD_LAYER) from exc


class _FirstHopsFailed(_NodeFailed):
    """Too few of an ask's cloves were taken by our first hops (an entry guard that went away
    takes every path with it), or hops closed too many of its paths before the node replied (a
    relay further on is gone): the paths are failed, and the ask goes again over new ones."""


@dataclass
class Delta:
    """New text of a streamed answer."""

    text: str
    token_ids: list[int]
    top_logprobs: list = field(default_factory=list)  # pb.TokenAlternatives per token, when asked


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
    top_logprobs: list = field(default_factory=list)  # pb.TokenAlternatives per token, when asked
    tool_calls: list = field(default_factory=list)  # pb.ToolCall found by the serving node's tool parser
    max_model_len: int = 0  # a TOKENIZE reply's context length

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens as the serving node signed them in its receipt (0 without one)."""
        return self.receipt.prompt_tokens if self.receipt is not None else 0

    def as_dict(self) -> dict:
        return {"text": self.text, "served_by": self.served_by, "model": self.model,
                "finish_reason": self.finish_reason, "token_ids": self.token_ids,
                "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.token_ids)},
                "paths": self.paths, "attempts": self.attempts, "timings_ms": self.timings_ms}


def receipt_is_valid(receipt: pb.ReplyReceipt, node: ModelRecord | None, request: pb.GenerateRequest,
                     token_ids: list[int]) -> bool:
    """The reply is signed by `node` (the directory's record of the node the receipt names),
    and covers what we asked and got."""
    if node is None or receipt.node_id != node.node_id:
        return False
    try:
        receipts.verify_receipt(receipt, node.public_key, request, token_ids)
    except (receipts.ReceiptError, ValueError):
        return False
    return True


class _Pending:
    """One attempt in flight: its reply keys, paths, delivery tokens, and reply chunks put back in order."""

    def __init__(self, rid: bytes, reply_key: bytes, paths: list[ProxyPath], node: ModelRecord, k: int) -> None:
        self.rid = rid
        self.k = k
        self.reply_key = reply_key
        self.paths = paths
        self.node = node
        self.queue: asyncio.Queue[pb.GenerateChunk] = asyncio.Queue()
        self.next_seq = 0
        self.buffer: dict[int, pb.GenerateChunk] = {}
        self.opener = sealing.ReplyOpener(reply_key, len(paths))
        self.seqs: set[int] = set()  # messages whose cloves were seen (to forget their groups)
        self.answered = False
        self.settle_timer: asyncio.TimerHandle | None = None
        self.cloves_from: set[int] = set()  # path indices that returned at least one clove
        self.timed_out = False  # the node went silent (rather than replied, if wrongly)
        self.tokens: dict[bytes, ProxyPath] = {}  # delivery token -> the path its clove last went over
        self.delivered: set[bytes] = set()  # tokens the node listed
        self.sent: dict[tuple[int, int], bytes] = {}  # (path id, clove number) -> token of that clove
        self.undeliverable: set[bytes] = set()  # tokens a proxy could not hand to the node
        self.failure: _NodeFailed | None = None
        self.closed: set[int] = set()  # ids of its paths a hop closed

    def fail_now(self, failure: "_NodeFailed") -> None:
        """End the attempt now, out of order (the node sent what no honest node sends, or it
        cannot be reached)."""
        if self.failure is None:
            self.failure = failure
            self.queue.put_nowait(pb.GenerateChunk(final=True, error=str(failure)))

    def deliver(self, seq: int, chunk: pb.GenerateChunk) -> None:
        self.buffer[seq] = chunk
        while self.next_seq in self.buffer:
            self.queue.put_nowait(self.buffer.pop(self.next_seq))
            self.next_seq += 1

    def settled(self) -> bool:
        """Nothing left to learn about the paths: every one returned a clove and proved delivery."""
        return len(self.cloves_from) == len(self.paths) and set(self.tokens) <= self.delivered


class Asker:
    def __init__(
        self,
        directory: Directory,
        paths: PathManager,
        cloves: CloveParams = CLOVES,
        params: OverlayParams = OVERLAY,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.paths = paths
        if paths is not None:
            paths.replies_to = self.on_return  # reply blobs come from the relay straight here
        self.wall_clock = wall_clock
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

    def on_return(self, path: ProxyPath, blob: bytes) -> None:
        """A blob came back on one of our paths; never raises (drops are counted)."""
        try:
            self._accept(path, blob)
        except Drop as drop:
            self.drops.count(drop.reason)

    def _accept(self, path: ProxyPath, blob: bytes) -> None:
        try:
            hop, inner = onion.unwrap_return_from(path.secrets, blob)
        except onion.CloveLayerError as exc:
            raise Drop(DropReason.BAD_LAYER) from exc
        proxy = hop == len(path.relays) - 1
        if inner[:1] == bytes((RETURN_NOTICE,)):
            notice = _decode_notice(inner[1:])
            if proxy:
                self._notice(path, notice)
            elif notice.reason == DropReason.PATH_CLOSED.value:  # a hop before the proxy has one word
                self._closed_by(path, hop)
            else:
                raise Drop(DropReason.BAD_LAYER)
            return
        if inner[:1] != bytes((RETURN_REPLY,)) or not proxy:
            raise Drop(DropReason.BAD_LAYER)
        inner = inner[1:]
        pending, index, seq = self._match(path, bytes(inner[: sealing.TAG_BYTES]))
        if seq >= sealing.DELIVERY_SEQ:
            try:
                pending.delivered.update(pending.opener.report(index, seq, inner))
            except sealing.SealError as exc:
                raise Drop(DropReason.BAD_REPLY) from exc
            self._maybe_settle(pending)
            return
        try:
            clove = pending.opener.clove(index, inner)
        except sealing.SealError as exc:
            raise Drop(DropReason.BAD_REPLY) from exc
        pending.cloves_from.add(index)
        path.replies += 1
        if pending.answered:  # a late clove of an ended attempt: only the path judgement needs it
            self._maybe_settle(pending)
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
                pending.fail_now(_NodeFailed(DropReason.BAD_REPLY,
                                             f"model node error: {UNDECODABLE_REPLY}: reply cloves do not combine"))
            raise
        if message is None:
            return
        try:
            reply = pending.opener.message(seq, message)
        except sealing.SealError as exc:
            pending.fail_now(_NodeFailed(DropReason.BAD_REPLY, f"model node error: {UNDECODABLE_REPLY}: {exc}"))
            raise Drop(DropReason.BAD_REPLY) from exc
        pending.delivered.update(reply.delivered)
        pending.deliver(seq, reply.chunk)
        self.chunks_in += 1

    def _closed_by(self, path: ProxyPath, hop: int) -> None:
        """Hop `hop` of `path` closed it (relay.py `_close`): the path is replaced, and an
        attempt over it that has no reply yet, left with fewer than k working routes or cloves,
        can never be answered (its query names the reply routes): it ends now and goes again
        over new paths instead of waiting out the reply timeout on a path that blackholes. One
        already replying keeps its timeouts."""
        self.paths.closed_by(path, hop)
        for rid in list(self._on_link.get(path.first_link, ())):
            pending = self._pending[rid]
            if pending.cloves_from or pending.failure is not None:
                continue
            pending.closed.add(path.path_id)
            routes = sum(p.path_id not in pending.closed for p in pending.paths)
            lost = {t for t, p in pending.tokens.items() if p.path_id in pending.closed} | pending.undeliverable
            cloves = len(pending.paths) - len(lost)
            if min(routes, cloves) < pending.k:  # (counted where the ask goes again: ask_stream)
                pending.fail_now(_FirstHopsFailed(DropReason.PATH_CLOSED, f"hops closed {len(pending.closed)} of the "
                                                  f"{len(pending.paths)} paths before the node replied"))

    def _maybe_settle(self, pending: _Pending) -> None:
        if pending.answered and pending.settled():
            self._settle(pending)  # every path has proven itself: nothing left to wait for

    def _notice(self, path: ProxyPath, notice: pb.ProxyNotice) -> None:
        """The proxy of `path` could not hand one of our cloves to the model node."""
        for rid in self._on_link.get(path.first_link, ()):
            pending = self._pending[rid]
            token = pending.sent.get((path.path_id, notice.seq))
            if token is None:
                continue
            pending.undeliverable.add(token)
            reachable = len(pending.tokens) - len(pending.undeliverable)
            if reachable < pending.k and not pending.cloves_from:
                pending.fail_now(_NodeFailed(DropReason.NO_ANSWER, f"{UNREACHABLE}: the proxies could not "
                                             f"deliver {len(pending.undeliverable)} of {len(pending.tokens)} cloves "
                                             f"({notice.reason})"))
            return
        raise Drop(DropReason.UNKNOWN_REQUEST)

    def _match(self, path: ProxyPath, tag: bytes) -> tuple[_Pending, int, int]:
        """The request, route index and chunk a reply clove on `path` belongs to."""
        for rid in reversed(self._on_link.get(path.first_link, ())):  # the newest request first
            pending = self._pending[rid]
            hit = pending.opener.tags.read(tag)
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
        nodes = rank_by_reputation(nodes, lambda m: m.reputation, self.params.reputation_band, self.rng)
        preferred = self.affinity.get(session) if session else None
        nodes.sort(key=lambda m: m.node_id_hex != preferred)
        nodes.sort(key=lambda m: self._failed_recently(m.node_id_hex))  # even a session's node
        return nodes[: self.params.max_model_attempts]

    async def _hold(self, model: str, node_id: str | None) -> None:
        """Make the directory hold what this ask chooses from: the roster of `model` (followed
        from now on), or the one node a verifier probes (looked up by id)."""
        try:
            if node_id is not None:
                await self.directory.model(bytes.fromhex(node_id))
            else:
                await self.directory.follow(model)
        except Exception as exc:  # noqa: BLE001 - the committee out of reach: choose from what is held
            log.info("could not fetch the nodes of %s: %s", node_id or model, exc)

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
        await self._hold(request.model, node_id)
        nodes = self.candidates(request.model, session, node_id)
        if not nodes:  # the directory is refreshed every few seconds; a new node may be missing
            await self.directory.refresh()
            nodes = self.candidates(request.model, session, node_id)
        if not nodes:
            raise AskError(f"no trusted model node serves {request.model!r}", code="no_trusted_node")
        attempts: list[dict] = []
        refusals: list[_Refused] = []
        queue, again = list(nodes), Counter()  # node id -> times it was asked again over new paths
        while queue:
            node = queue.pop(0)
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
            except NoPaths as short:  # this node's own state: no model node is to blame, none other is tried
                attempts[-1].update(ok=False, reason=NO_PATHS, detail=str(short))
                raise AskError(str(short), attempts, code=NO_PATHS) from None
            except _FirstHopsFailed as failed:  # ours, not the node's: again over new paths (PATH_RETRIES)
                self.drops.count(failed.reason)
                attempts[-1].update(ok=False, reason=failed.reason.value, detail=str(failed))
                if again[node.node_id_hex] < PATH_RETRIES:
                    again[node.node_id_hex] += 1
                    queue.insert(0, node)
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
            code=OVERLOADED if busy else NO_ANSWER)

    async def _attempt(self, node: ModelRecord, request: pb.GenerateRequest, attempts: list[dict]
                       ) -> AsyncIterator[Delta | Answer]:
        t0 = self.clock()
        attempt = {"node": node.node_id_hex, "address": node.address}
        attempts.append(attempt)
        n, k = self.cloves.n, self.cloves.k
        usable = await self.paths.wait_for(n, self.params.path_wait_s)
        paths = await self.paths.pick(n) if usable >= n else []
        if len(paths) < n:
            # a model node decodes only cloves split n ways (sida.combine's expect=(n, k)): over
            # fewer paths it would never decode the query, and we would wait out the reply timeout
            raise NoPaths(f"this user node holds only {max(usable, len(paths))} usable proxy paths, an ask "
                          f"needs {n}; it is still building them (`gt-user status` shows them): ask again "
                          "in a minute")
        attempt["paths"] = [list(p.relays) for p in paths]
        req = pb.GenerateRequest()
        req.CopyFrom(request)
        req.request_id = secrets.token_hex(16)
        pending = _Pending(secrets.token_bytes(16), secrets.token_bytes(sealing.KEY_BYTES), paths, node, k)
        granularity = self.params.query_time_granularity_s
        query = pb.OverlayQuery(request=req, reply_key=pending.reply_key, k=k,
                                issued_s=int(self.wall_clock()) // granularity * granularity,
                                routes=[pb.ReplyRoute(proxy=bytes.fromhex(p.proxy_id), link_id=p.fresh_reply_link())
                                        for p in paths])
        self._register(pending)
        timings: dict[str, float] = {}
        try:
            sealed = sealing.seal_ask(node.onion_key, query, n, k, minimum=self.params.query_size_min)
            timings["seal_split_ms"] = (self.clock() - t0) * 1000
            t1 = self.clock()
            tried = list(paths)  # grows as spare paths replace failing ones
            sent = await asyncio.gather(*(self._send(pending, p, e, t, tried)
                                          for p, e, t in zip(paths, sealed.envelopes, sealed.tokens)))
            timings["send_ms"] = (self.clock() - t1) * 1000
            accepted = sum(ok for ok, _ in sent)
            failed = [p for _, bad in sent for p in bad]
            for p in failed:
                self.paths.mark_failed(p)
            if accepted < k:
                raise _FirstHopsFailed(DropReason.NO_ANSWER, f"only {accepted} of {len(paths)} cloves accepted by a first hop")
            async for item in self._receive(pending, req, node, paths, attempts, timings, t0):
                yield item
        except _NodeFailed as failed:
            if failed.reason is DropReason.NO_ANSWER and UNREACHABLE in str(failed):
                self._blame(pending)
            raise
        finally:
            if pending.cloves_from and not pending.timed_out and not pending.settled():
                # the node replied (an answer, or an error or garbage that ended the attempt
                # early); its last reply cloves and delivery report may still be on their way
                pending.answered = True
                pending.settle_timer = asyncio.get_running_loop().call_later(
                    self.params.forward_timeout_s, self._settle, pending)
            else:
                self._settle(pending)
        attempt["ok"] = True

    def _blame(self, pending: _Pending) -> None:
        """Proxies could not reach the node: blame it and keep the paths, unless these paths
        already failed that way for another node (then they are the likelier culprit)."""
        used = list(pending.tokens.values())
        if not self._blame_node(used):
            for p in used:
                self.paths.mark_failed(p)

    def _settle(self, pending: _Pending) -> None:
        if pending.rid not in self._pending:
            return
        if pending.settle_timer is not None:
            pending.settle_timer.cancel()
        self._forget(pending)
        self._judge_paths(pending)
        self.paths.release([*pending.paths, *pending.tokens.values()])

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

    async def _send(self, pending: _Pending, path: ProxyPath, envelope: bytes, token: bytes,
                    in_use: list[ProxyPath]) -> tuple[bool, list[ProxyPath]]:
        """Send one clove, once more over a spare path if its first hop refuses it or does not
        acknowledge it in time; whether a first hop accepted it, and the paths that failed.
        Acknowledgements are hop-local: delivery to the node is proven later, in its reply."""
        instruction = pb.ProxyInstruction(destination=pending.node.node_id, payload=envelope).SerializeToString()
        failed: list[ProxyPath] = []
        for _ in range(2):
            seq = path.take_seq()
            blob = onion.wrap_forward(path.secrets, instruction, seq)
            pending.tokens[token] = path
            pending.sent[(path.path_id, seq)] = token
            path.sends += 1
            link = self.paths.relay.hub.link_to(path.first_hop)
            result = None
            if link is None:
                log.info("path %d: first relay %s left the directory", path.path_id, path.first_hop[:16])
            else:
                ack = link.send(True, [pb.Clove(link_id=path.first_link, payload=blob)], ack=True)
                try:
                    result = await asyncio.wait_for(ack, self.params.forward_timeout_s)
                except asyncio.TimeoutError:
                    log.info("path %d: first hop did not acknowledge in time", path.path_id)
                if result == []:
                    return True, failed
                if result:
                    log.info("path %d refused a clove: %s", path.path_id, result[0][1].value)
            failed.append(path)
            spare = self.paths.spare(in_use)
            if spare is None:
                return False, failed
            in_use.append(spare)
            path = spare
        return False, failed

    async def _receive(self, pending: _Pending, req: pb.GenerateRequest, node: ModelRecord,
                       paths: list[ProxyPath], attempts: list[dict], timings: dict, t0: float
                       ) -> AsyncIterator[Delta | Answer]:
        text, token_ids, top = [], [], []
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
            if pending.failure is not None:
                raise pending.failure
            if chunk.error and generation.client_error_code(chunk.error):
                raise _Refused(generation.client_error_code(chunk.error),
                               chunk.error.partition(": ")[2] or chunk.error)
            if chunk.error:
                reason = DropReason.BUSY if chunk.error.startswith(sealing.BUSY_ERROR) else DropReason.BAD_REPLY
                raise _NodeFailed(reason, f"model node error: {chunk.error}")
            if chunk.text or chunk.token_ids:
                text.append(chunk.text)
                token_ids.extend(chunk.token_ids)
                top.extend(chunk.top_logprobs)
                yield Delta(chunk.text, list(chunk.token_ids), list(chunk.top_logprobs))
            if chunk.final:
                break
        server = self._server_of(chunk.receipt, node) if chunk.HasField("receipt") else None
        if not chunk.HasField("receipt") or not receipt_is_valid(chunk.receipt, server, req, token_ids):
            raise _NodeFailed(DropReason.BAD_SIGNATURE, "reply receipt missing or not signed by the node")
        timings["total_ms"] = (self.clock() - t0) * 1000
        yield Answer("".join(text), token_ids, server.node_id_hex, req.model, chunk.finish_reason,
                     chunk.receipt, req, [list(p.relays) for p in paths], attempts, timings, top,
                     list(chunk.tool_calls), chunk.max_model_len)

    def _server_of(self, receipt: pb.ReplyReceipt, node: ModelRecord) -> ModelRecord | None:
        """Who signed the reply: the node asked, or the group member it forwarded the request to
        (model_node/forwarding.py: the serving node signs and names itself), which must be a
        trusted node of the same model in our directory; None for anyone else."""
        if receipt.node_id == node.node_id:
            return node
        return next((m for m in self.directory.models() if m.node_id == receipt.node_id
                     and m.model == node.model and m.trusted), None)

    def _judge_paths(self, pending: _Pending) -> None:
        """Once the node replied: a path whose clove it never listed as delivered (a relay that
        drops), or whose reply clove never came back, is failed and replaced. A clove its proxy
        reported undeliverable is the node's failure, not the path's. A reply that did not open
        (garbage from the node) lists nothing readable: then only the reply cloves that came
        back say which paths work."""
        if not pending.cloves_from:
            return
        unreadable = pending.failure is not None and pending.failure.reason is DropReason.BAD_REPLY
        for token, path in pending.tokens.items():
            if unreadable:
                break
            if token in pending.delivered:
                self._suspect_paths.discard(path.path_id)  # it reached a node: not the paths' fault
            elif token not in pending.undeliverable:
                self.drops.count(DropReason.UNPROVEN_DELIVERY)
                log.info("path %d: the model node never listed its clove as delivered", path.path_id)
                self.paths.mark_failed(path)
        for index, path in enumerate(pending.paths):
            if index not in pending.cloves_from:
                self.paths.mark_failed(path)

    def status(self) -> dict:
        return {"asked": self.asked, "answered": self.answered, "chunks_in": self.chunks_in,
                "pending": len(self._pending),
                "drops": self.drops.as_dict(), "sessions": len(self.affinity)}
