"""The verifier node: the composition root that wires one committee member together.

    home (config.json, genesis.json, keys)
      ├── the registry application (verifier.abci.app.RegistryApp, its SQLite store)
      ├── consensus over it (verifier.consensus.node.ConsensusNode: driver, WAL, signer, block
      │   store, mempool, peers, block sync), which knows the application only through
      │   verifier.abci.interface
      ├── the gRPC/TLS `Verifier` service: consensus traffic and block sync (to consensus),
      │   transactions and queries, directory proofs, status, the members' Private channel (to
      │   the epoch runner), users' sealed audits (to the audit desk)
      └── verification epochs and the audit desk, attached when they run here
          (verifier.epochs.wiring.attach_epochs sets `epochs` and `audits`)

Only this module knows all of them; each of them is built from what it is handed here.
Start-up (CometBFT's handshake): InitChain on an empty application; replay into the app the
blocks the store holds beyond the app's height (a crash between saving a block and committing
it); then enter the next height, replaying that height's inputs from the WAL.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import grpc

from gentorrent import failpoints
from gentorrent.crypto.keys import NodeKeys
from gentorrent.crypto.tls import TlsIdentity, new_server
from gentorrent.ledger.chain_params import ChainParams
from gentorrent.ledger.genesis import Genesis
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from verifier import dial_back, directory_service
from verifier.abci.app import RegistryApp
from verifier.abci.interface import Application
from verifier.consensus.home import DATA_DIR, NodeConfig
from verifier.consensus.node import FORWARDED_KEY, ConsensusNode
from verifier.epochs.runner import RunnerHost

log = logging.getLogger(__name__)

VERSION = "gt-verifier/0.1"
__all__ = ["VerifierNode", "VERSION"]


class VerifierNode:
    """One committee member (or observer) from its home: `app` replaces the registry
    application (tests), `listen` the home's listen address."""

    def __init__(self, home: Path, app: Application | None = None, listen: str | None = None) -> None:
        self.home = Path(home)
        self.config = NodeConfig.load(self.home)
        self.genesis = Genesis.load(self.home)
        self.keys = NodeKeys.load_or_create(self.home)
        self.identity = self.keys.identity
        self.tls = TlsIdentity.load_or_create_self_signed(self.home, self.identity)
        self.dial_backs = dial_back.DialBackLimiter()  # reachability checks of user nodes (verifier/dial_back.py)
        self.listen = listen or self.config.listen
        self.app = RegistryApp(self.home / DATA_DIR / "app.sqlite") if app is None else app
        self.consensus = ConsensusNode(self.home, self.genesis, self.identity, self.config, self.app)
        self.port = 0
        self.server: grpc.aio.Server | None = None
        self.epochs = None  # verification epochs: a verifier.epochs.runner.EpochRunner, when epochs run here
        self.audits = None  # the audit desk: a verifier.epochs.audit_service.AuditService, when it runs here

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.consensus.start()
        self.server, self.port = new_server(self.tls, self.listen)
        rpc.add_VerifierServicer_to_server(_Service(self), self.server)
        await self.server.start()
        self.consensus.connect()
        me = self.consensus.me
        log.info("verifier %s (%s) serving on port %d at height %d", self.identity.node_id_hex[:12],
                 "validator %d" % me if me is not None else "observer", self.port, self.consensus.driver.height)
        if failpoints.armed():
            log.warning("failpoints armed (test build of a crash): %s", failpoints.spec(failpoints.armed()))

    async def stop(self) -> None:
        if self.epochs is not None:
            await self.epochs.stop()
        await self.consensus.stop()
        if self.server:
            await self.server.stop(grace=0.5)
        await self.consensus.close()
        close = getattr(self.app, "close", None)
        if close:
            close()

    # ------------------------------------------------------------------ queries

    async def query(self, path: str, data: bytes, height: int) -> pb.QueryReply:
        consensus = self.consensus
        if directory_service.is_proven(path):
            return await directory_service.proven_reply(self.app, consensus.store, consensus.host.height,
                                                        consensus.wait_height, path, data, self._block_wait_s())
        if directory_service.is_light_block(path):
            return directory_service.light_block_reply(consensus.store, consensus.host.validators_at, consensus.host.height,
                                                       path)
        if directory_service.is_local(path):
            return pb.QueryReply(code=directory_service.CODE_LOCAL, log=f"{path[:64]} is this verifier's own read")
        q = self.app.query(path, data, height)
        return pb.QueryReply(code=q.code, log=q.log, value=q.value, height=q.height)

    def _block_wait_s(self) -> float:
        """How long a query waits for the next block: two rounds' timeouts."""
        t = self.consensus.timeouts
        return 2 * (t.propose(0) + t.prevote(0) + t.precommit(0) + t.commit_s)

    # ------------------------------------------------------------------ verification epochs

    def epoch_host(self) -> RunnerHost:
        """What verifier.epochs.runner.EpochRunner needs from this node: the committed state
        (its chain parameters among it), its mempool, the Private channel to its peers."""

        def query(path: str) -> tuple[int, bytes]:
            q = self.app.query(path, b"", 0)
            return q.code, q.value

        async def submit(tx: bytes) -> tuple[int, str]:
            reply = await self.consensus.submit_tx(tx, forwarded=False)
            return reply.code, reply.log

        code, params = query("/params")
        if code != 0:
            raise RuntimeError(f"the application does not answer /params (code {code})")
        return RunnerHost(self.identity, self.keys.onion.private_key, self.keys.onion.public_key,
                          self.genesis.chain_id, self.consensus.committee_keys, query, submit,
                          self.send_private, ChainParams.decode(params))

    async def send_private(self, public_key: bytes, payload: bytes) -> bool:
        """One Private message to the committee member with this key (pinned TLS)."""
        stub = self.consensus.peer_stub(public_key)
        if stub is None:
            return False
        try:
            ack = await stub.Private(pb.PrivateMessage(payload=payload), timeout=5.0)
        except grpc.aio.AioRpcError:
            return False
        return ack.ok

    def on_private(self, payload: bytes) -> pb.Ack:
        if self.epochs is None:
            return pb.Ack(ok=False, reason="verification epochs do not run on this node")
        return self.epochs.on_private(payload)

    def on_audit(self, sealed: bytes, channel: str) -> pb.AuditAck:
        """A sealed audit a user's proxy hands on (verifier/epochs/audit_service.py)."""
        if self.audits is None:
            return pb.AuditAck(accepted=False, reason="this member takes no audits")
        return self.audits.submit_sealed(sealed, channel)

    # ------------------------------------------------------------------ status

    def status(self) -> pb.VerifierStatusReply:
        consensus = self.consensus
        detail = {**consensus.status(), "epochs": self.epochs.status() if self.epochs is not None else None}
        return pb.VerifierStatusReply(node_id=self.identity.node_id_hex, height=consensus.host.height,
                                      app_hash=consensus.host.app_hash, peers=consensus.live_peers(),
                                      last_commit_time_ms=consensus.last_commit_time_ms,
                                      json=json.dumps(detail, sort_keys=True))


class _Service(rpc.VerifierServicer):
    """The Verifier gRPC service: each call to the part of the node that answers it."""

    def __init__(self, node: VerifierNode) -> None:
        self.node = node

    async def SubmitTx(self, request, context):
        forwarded = any(k == FORWARDED_KEY for k, _ in (context.invocation_metadata() or ()))
        return await self.node.consensus.submit_tx(request.tx, forwarded)

    async def Query(self, request, context):
        if len(request.path) > 256:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "query path longer than 256 characters")
        return await self.node.query(request.path, request.data, request.height)

    async def Status(self, request, context):
        return self.node.status()

    async def Consensus(self, request, context):
        return self.node.consensus.on_consensus_payload(request.payload)

    async def GetBlocks(self, request, context):
        if request.from_height < 1 or request.to_height < request.from_height:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "need 1 <= from_height <= to_height")
        for item in self.node.consensus.blocks(request.from_height, request.to_height):
            yield item

    async def Private(self, request, context):
        return self.node.on_private(request.payload)

    async def SubmitAudit(self, request, context):
        peer = context.peer() or ""
        return self.node.on_audit(request.sealed, peer.rsplit(":", 1)[0])  # the proxy's host: one link

    async def DialBack(self, request, context):
        return await dial_back.dial_back(request, context.peer() or "", self.node.identity, self.node.dial_backs,
                                         time.monotonic())

    async def Health(self, request, context):
        return pb.HealthReply(node_id=self.node.identity.node_id_hex, role="verifier", version=VERSION,
                              serving=self.node.consensus.halted is None)
