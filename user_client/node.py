"""A user node, programmatically: relay for others, keep proxy paths, ask (ARCHITECTURE.md §1).

    node = UserNode(home, StaticDirectory(path))          # or any Directory
    await node.start()                                      # keys, TLS, Relay server, register, paths
    answer = await node.ask("What is 2+2?", model="smollm2-135m")
    async for item in node.ask_stream(...): ...             # Delta ..., then one Answer
    await node.stop()

`gt-user` (user_client.cli) and the OpenAI-compatible API (user_client.openai_api) are thin
layers over this class; verifiers use `ask` with `node_id=` to probe one model node.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from typing import AsyncIterator, Callable, Mapping

from gentorrent.config import AUDITS, CLOVES, MODEL_NODE, OVERLAY, AuditParams, CloveParams, OverlayParams
from gentorrent.crypto import tls
from gentorrent.crypto.keys import NodeKeys
from gentorrent.channels import ChannelPool
from gentorrent.ledger.peers import PeerIndex
from user_client.relay import Relay, Tap
from gentorrent.audits import AuditMember, members_among
from gentorrent.generation import make_request
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from user_client.asking import Answer, AskError, Asker, Delta
from user_client.audit_handoff import CommitteeHandoff
from user_client.auditing import Auditor, OverlayAuditChannel
from gentorrent.ledger.directory import Directory
from gentorrent.ledger.sections import UserRecord
from gentorrent.ledger import addresses
from gentorrent.ledger.txs import advertised_address, check_listen
from user_client.paths import PathManager

log = logging.getLogger(__name__)

__all__ = ["UserNode", "Answer", "AskError", "Delta"]


class UserNode:
    def __init__(
        self,
        home: Path,
        directory: Directory,
        listen: str = "127.0.0.1:0",
        region: str = "default",
        cloves: CloveParams = CLOVES,
        params: OverlayParams = OVERLAY,
        rng: random.Random | None = None,
        tap: Tap | None = None,
        maintain: bool = True,
        advertise: str | None = None,
        audits: AuditParams = AUDITS,
        committee: Callable[[], Mapping[bytes, AuditMember]] | None = None,
    ) -> None:
        """`advertise`: the address peers reach this node at, when it is not the one it listens
        on (a port forward, or a fault proxy in a test); it is what the directory lists and
        what this relay names as its return address. `audits`: whether (user_enabled) and at
        which rate this node's own asks are audited (user_client/auditing.py); `committee`: the
        members that take audits (with their audit keys): this node hands its audits to them
        over its paths, and as a proxy hands others' on; None: the members of the committee
        directory that publish an audit key, as it follows the committee (none in its genesis:
        audits wait in the outbox)."""
        self.home = Path(home)
        self.directory = directory
        self.listen = listen
        self.region = region
        self.cloves = cloves
        self.params = params
        self.rng = rng
        self.tap = tap
        self.maintain = maintain
        self.advertise = advertise
        self.keys = NodeKeys.load_or_create(self.home)
        self.tls = tls.TlsIdentity.load_or_create(self.home, self.keys.identity)
        self.node_id_hex = self.keys.identity.node_id_hex
        self.address = ""
        self.relaying = True  # False: client-only, since no member could dial it back (registers no address)
        self.reachability = "not checked yet"
        self.started_at = 0.0
        self._server = None
        self._tasks: list[asyncio.Task] = []
        self.index: PeerIndex | None = None
        self.relay: Relay | None = None
        self.paths: PathManager | None = None
        self.asker: Asker | None = None
        self.channels = ChannelPool(own=self.tls)  # relays ask for it: mutual TLS on every link
        self.auditor = Auditor(audits, rng=rng)
        # a committee directory: the members it follows (the genesis' at first) that publish audit keys
        members_now = getattr(directory, "members_now", None)
        if committee is None and members_now is not None and members_among(members_now()):
            committee = lambda: members_among(members_now())  # noqa: E731
        self.committee = committee
        self.audit_channel: OverlayAuditChannel | None = None
        self._flush: asyncio.Task | None = None

    @property
    def record(self) -> UserRecord:
        return UserRecord(node_id=self.keys.identity.node_id, public_key=self.keys.identity.public_key,
                          address=self.address if self.relaying else "", onion_key=self.keys.onion.public_key,
                          region=self.region)

    async def start(self, build_paths: bool = True) -> None:
        """Listen, register with the directory (the committee's: a signed registration,
        waited for until it is committed), then (optionally) build the first paths.

        The relay server demands a client certificate and admits exactly the callers whose leaf
        is signed by a registered node's key (mutual TLS; checked by `Relay.Link`)."""
        check_listen(self.listen, self.advertise)  # a wildcard without --advertise: stop here
        self.index = PeerIndex(self.directory)  # a peer it does not hold is looked up by id (Relay)
        server, port = tls.new_server(self.tls, self.listen, identify_callers=True)
        self.address = advertised_address(self.listen, port, self.advertise)
        self.relay = Relay(self.keys.onion, self.node_id_hex, self.keys.identity, self.index, self.channels,
                           self.params, tap=self.tap,
                           handoff=CommitteeHandoff(self.committee) if self.committee else None,
                           path_idle_expiry_s=self.cloves.path_idle_expiry_s)
        rpc.add_RelayServicer_to_server(self.relay, server)
        await server.start()
        self._server = server
        self._loop = asyncio.get_running_loop()
        self.started_at = time.time()
        self.relaying, self.reachability = await self._reachable()
        await self.directory.register_user(self.record)
        await self.refresh_directory()
        self.paths = PathManager(self.directory, self.relay, self.index, self.node_id_hex, self.region,
                                 self.cloves, self.params, rng=self.rng, guards_file=self.home / "guards.json")
        self.asker = Asker(self.directory, self.paths, self.cloves, self.params, rng=self.rng)
        if self.committee:
            self.audit_channel = OverlayAuditChannel(self.paths, self.committee)
        if build_paths:
            await self.paths.fill()
        if self.maintain:
            self._tasks.append(asyncio.ensure_future(self._maintenance()))

    async def _reachable(self) -> tuple[bool, str]:
        """Whether to register as a relay: a committee member dials this node back (verifier/
        dial_back.py), from outside, at the host this node's call came from. One it cannot reach
        (behind NAT, a firewall) registers client-only: it builds paths and asks, and nobody
        chooses it as a hop, whose paths would all fail. A directory file (nodes on one machine)
        asks nobody; a committee that cannot answer leaves the node a relay, as before."""
        dial_back = getattr(self.directory, "dial_back", None)
        if dial_back is None:
            return True, "not checked (a directory file)"
        port = addresses.parse(self.address)[1]
        try:
            reply = await dial_back(port)
        except Exception as exc:  # noqa: BLE001 - an older committee, or none reachable: a relay, as before
            log.warning("reachability not checked (%s): registering %s as a relay", exc, self.address)
            return True, f"not checked: {exc}"
        if reply.retry_after_s:  # every member asked had just dialled this host: not known, a relay as before
            log.warning("reachability not checked (%s): registering %s as a relay", reply.reason, self.address)
            return True, f"not checked: {reply.reason}"
        if reply.reachable and reply.address == self.address:
            return True, f"a member dialled {self.address} back"
        if reply.reachable:  # reachable, but the committee sees another host than the advertised one
            log.warning("a member reached this node at %s, not the advertised %s: registering it as a relay; "
                        "if peers cannot reach %s, fix --advertise", reply.address, self.address, self.address)
            return True, f"a member dialled {reply.address} back, not {self.address}"
        log.warning("no member could dial this node back at %s (%s): registering client-only (it asks, and "
                    "relays nothing). To relay, forward TCP port %d to this machine and restart",
                    reply.address or self.address, reply.reason, port)
        return False, f"client-only: {reply.reason}"

    async def refresh_directory(self) -> None:
        await self.directory.refresh()
        self.index.rebuild()

    async def _maintenance(self) -> None:
        while True:
            await asyncio.sleep(self.params.maintenance_interval_s)
            try:
                await self.refresh_directory()
                self.relay.expire()
                await self.paths.fill()
                if self.audit_channel is not None and self.auditor.outbox and (
                        self._flush is None or self._flush.done()):  # a flush waits random delays
                    self._flush = asyncio.ensure_future(self.auditor.flush(self.audit_channel))
            except Exception as exc:  # keep relaying; report through status
                log.info("maintenance round failed: %s", exc)

    async def stop(self) -> None:
        tasks = self._tasks + [self._flush] if self._flush is not None else self._tasks
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        await self.directory.close()  # stop renewing the registration
        if self.relay is not None:
            await self.relay.close()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        await self.channels.close()

    # ------------------------------------------------------------------ asking

    async def ask_stream(self, prompt: str | None = None, messages: list[dict] | None = None,
                         model: str = MODEL_NODE.default_model, session: str | None = None,
                         node_id: str | None = None, affinity: str | None = None,
                         **sampling) -> AsyncIterator[Delta | Answer]:
        """Deltas as the answer streams in, then one Answer. Raises AskError if nobody answered.

        `session` is the session id the request carries to the model node; `affinity` keys
        the node a conversation sticks to on this node only (it never leaves it)."""
        ticket = self.auditor.ticket()
        request = make_request(prompt, messages, model, session=session, stream=True,
                               audit_commitment=self.auditor.commitment(ticket), **sampling)
        async for item in self.asker.ask_stream(request, node_id=node_id, affinity=affinity):
            if isinstance(item, Answer):
                self.auditor.after(item, ticket)
            yield item

    async def ask(self, prompt: str | None = None, messages: list[dict] | None = None,
                  model: str = MODEL_NODE.default_model, session: str | None = None,
                  node_id: str | None = None, affinity: str | None = None, **sampling) -> Answer:
        ticket = self.auditor.ticket()
        request = make_request(prompt, messages, model, session=session, stream=False,
                               audit_commitment=self.auditor.commitment(ticket), **sampling)
        answer = await self.ask_request(request, node_id=node_id, affinity=affinity)
        self.auditor.after(answer, ticket)
        return answer

    async def ask_request(self, request: pb.GenerateRequest, node_id: str | None = None,
                          affinity: str | None = None) -> Answer:
        """Ask with a ready GenerateRequest (what verifiers' challenges use); never audited."""
        answer = None
        async for item in self.asker.ask_stream(request, node_id=node_id, buffered=True, affinity=affinity):
            if isinstance(item, Answer):
                answer = item
        if answer is None:  # pragma: no cover - ask_stream always ends with an Answer or raises
            raise AskError("no answer")
        return answer

    def status(self) -> dict:
        return {
            "node_id": self.node_id_hex,
            "address": self.address,
            "relaying": self.relaying,  # False: client-only (registered no address)
            "reachability": self.reachability,
            "region": self.region,
            "uptime_s": round(time.time() - self.started_at, 1) if self.started_at else 0,
            "directory_height": getattr(self.directory, "height", 0),  # the committee's, when it is one
            "paths": self.paths.status() if self.paths else {},
            "relay": self.relay.status() if self.relay else {},
            "asking": self.asker.status() if self.asker else {},
            "audits": self.auditor.status(),
        }
