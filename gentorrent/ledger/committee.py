"""The committee-backed Directory of a user node (ARCHITECTURE.md §3.1).

Reads the registry from any verifier of the genesis file and accepts it only after the
light-client check of gentorrent.ledger.light_client (>2/3 of the genesis committee signed the app hash
the value hashes to). Registers the node with a signed `register_user` transaction (or
`update_user` when its address, keys or region changed), submitted to the first verifier
that takes it.

Model entries need an X25519 onion key for queries to be sealed to them; a model entry
without one (a registry format that predates it) is listed but never asked.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import grpc

from gentorrent.config import WIRE
from gentorrent.crypto.keys import Identity
from gentorrent.crypto.tls import TlsError, connect
from gentorrent.ledger.light_client import DirectoryRejected, fetch_from_committee
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.ledger.sections import ModelRecord, UserRecord
from gentorrent.ledger import txs
from gentorrent.ledger.genesis import Genesis

log = logging.getLogger(__name__)


class RegistrationError(RuntimeError):
    """No verifier accepted this node's registration."""


class CommitteeDirectory:
    def __init__(self, genesis: Genesis, identity: Identity, timeout: float = WIRE.rpc_timeout_s) -> None:
        self.genesis = genesis
        self.identity = identity
        self.timeout = timeout
        self.height = 0
        self._users: list[UserRecord] = []
        self._models: list[ModelRecord] = []

    @classmethod
    def from_args(cls, genesis_file: str, home: Path) -> "CommitteeDirectory":
        from gentorrent.crypto.keys import NodeKeys

        return cls(Genesis.load(Path(genesis_file)), NodeKeys.load_or_create(Path(home)).identity)

    def users(self) -> list[UserRecord]:
        return list(self._users)

    def models(self) -> list[ModelRecord]:
        return list(self._models)

    async def refresh(self) -> None:
        """Fetch and check the directory; on failure keep the last good one and say why."""
        try:
            directory = await fetch_from_committee(self.genesis, self.timeout)
        except DirectoryRejected as exc:
            log.warning("directory not refreshed: %s", exc)
            if not self.height:
                raise
            return
        self.height = directory.height
        self._users = list(directory.users)
        self._models = list(directory.models)

    async def register_user(self, record: UserRecord) -> None:
        errors = []
        for v in self.genesis.validators:
            try:
                channel = await connect(v.address, v.tls_cert_pem, timeout=self.timeout)
            except (TlsError, OSError) as exc:
                errors.append(f"{v.name}: {exc}")
                continue
            try:
                reply = await self._submit(rpc.VerifierStub(channel), record)
            except (grpc.aio.AioRpcError, ValueError) as exc:
                errors.append(f"{v.name}: {exc}")
                continue
            finally:
                await channel.close()
            if reply.code == 0:
                return
            errors.append(f"{v.name}: code {reply.code}: {reply.log}")
        raise RegistrationError("no verifier accepted the registration: " + "; ".join(errors))

    async def _submit(self, stub: rpc.VerifierStub, record: UserRecord) -> pb.TxReply:
        account = await stub.Query(pb.QueryRequest(path=f"/account/{self.identity.public_key.hex()}"),
                                   timeout=self.timeout)
        sequence = json.loads(account.value or b"{}").get("last_sequence", 0) + 1
        known = await stub.Query(pb.QueryRequest(path=f"/user/{self.identity.node_id_hex}"), timeout=self.timeout)
        build = txs.update_user if known.code == 0 and known.value else txs.register_user
        tx = build(self.identity, record.address, record.onion_key, record.tls_cert_pem, record.region, sequence,
                   chain_id=self.genesis.chain_id)
        return await stub.SubmitTx(pb.TxRequest(tx=tx), timeout=self.timeout)
