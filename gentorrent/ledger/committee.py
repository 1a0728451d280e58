"""The committee-backed Directory every node works from, and self-registration (ARCHITECTURE.md §3.1).

Reads the registry through a `light_client.CommitteeReader`: any verifier of the genesis may
answer, the answer is accepted only with a proof (> 2/3 of the genesis committee signed the
app hash it hashes to), never older than what was accepted before, never certified longer ago
than `REGISTRY.max_directory_age_s`, and a change of membership or trust is confirmed by a
second verifier.

A node registers itself (`register_user`, `register_model`): it signs a register (or update)
transaction with its identity, advertised address, TLS certificate, onion key and region or
model and capacity, submits it to a random verifier, and waits until the checked directory
lists exactly that record. From then on it renews its lease `renewals_per_lease` times per
lease (the genesis says how long a lease is) with a small `renew_lease` transaction, and
re-registers if its record expired anyway (a long partition). A node that stops renewing
leaves the directory one lease after its last renewal.

Model entries need an X25519 onion key for queries to be sealed to them; a model entry
without one is listed but never asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from pathlib import Path
from typing import Callable

import grpc

from gentorrent.channels import ChannelPool
from gentorrent.config import REGISTRY, WIRE, RegistryParams
from gentorrent.crypto.keys import Identity
from gentorrent.ledger import txs
from gentorrent.ledger.genesis import Genesis
from gentorrent.ledger.light_client import DirectoryRejected, LightClient, committee_reader
from gentorrent.ledger.sections import DirectorySnapshot, ModelRecord, UserRecord
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)

#: verifier node refusals that mean "already on its way", not "refused" (verifier.consensus.node)
CODE_IN_MEMPOOL = 91
#: registry refusals a retry cannot fix: the node must change something first
FINAL_REFUSALS = frozenset({txs.CODE_ADDRESS_TAKEN, txs.CODE_INVALID_FIELD, txs.CODE_WRONG_CHAIN,
                            txs.CODE_BAD_SIGNATURE, txs.CODE_MALFORMED, txs.CODE_OVERSIZE})

Record = UserRecord | ModelRecord


class RegistrationError(RuntimeError):
    """The node could not register: the committee refused it, or could not be reached."""


class CommitteeUnreachable(RegistrationError):
    """No verifier of the genesis answered."""


# --------------------------------------------------------------------------- pure decisions


def kind_of(record: Record) -> str:
    return "user" if isinstance(record, UserRecord) else "model"


def listed(directory: DirectorySnapshot | None, record: Record) -> Record | None:
    """This node's record as the directory holds it (same kind), or None."""
    if directory is None:
        return None
    return directory.user(record.node_id) if isinstance(record, UserRecord) else directory.model(record.node_id)


def same_registration(record: Record, registered: Record | None) -> bool:
    """Whether the registry already holds what this node would register (all but standing
    and heights, which are the committee's)."""
    if registered is None:
        return False
    common = ("address", "onion_key", "tls_cert_pem")
    extra = ("region",) if isinstance(record, UserRecord) else ("model", "capacity")
    return all(getattr(record, f) == getattr(registered, f) for f in common + extra)


def registration_tx(identity: Identity, record: Record, registered: Record | None, sequence: int,
                    chain_id: str) -> bytes:
    """The transaction that brings the registry to `record`: register when it holds nothing,
    update when it holds something else, renew when it already holds exactly this."""
    if same_registration(record, registered):
        return txs.renew_lease(identity, sequence, chain_id=chain_id)
    if isinstance(record, UserRecord):
        build = txs.update_user if registered is not None else txs.register_user
        return build(identity, record.address, record.onion_key, record.tls_cert_pem, record.region, sequence,
                     chain_id=chain_id)
    build = txs.update_model if registered is not None else txs.register_model
    return build(identity, record.address, record.model, record.capacity, record.tls_cert_pem, sequence,
                 record.onion_key, chain_id=chain_id)


def renew_interval_s(lease_ms: int, params: RegistryParams = REGISTRY) -> float:
    return lease_ms / 1000 / params.renewals_per_lease


# --------------------------------------------------------------------------- the directory


class CommitteeDirectory:
    """A `Directory` read from the committee, through which this node registers itself."""

    def __init__(self, genesis: Genesis, identity: Identity, timeout: float = WIRE.rpc_timeout_s, *,
                 params: RegistryParams = REGISTRY, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.genesis = genesis
        self.identity = identity
        self.timeout = timeout
        self.params = params
        self.rng = rng or random.Random()
        self.clock = clock
        self.channels = ChannelPool()  # to the verifiers, kept open
        self.reader = committee_reader(genesis, timeout, self.channels,
                                       client=LightClient(int(params.max_directory_age_s * 1000)),
                                       rng=self.rng, now_ms=lambda: int(self.clock() * 1000))
        self.registered: Record | None = None  # what this node keeps registered
        self.renewals = 0
        self._last_sequence = 0
        self._renewal: asyncio.Task | None = None

    @classmethod
    def from_args(cls, genesis_file: str, home: Path) -> "CommitteeDirectory":
        from gentorrent.crypto.keys import NodeKeys

        return cls(Genesis.load(Path(genesis_file)), NodeKeys.load_or_create(Path(home)).identity)

    # ------------------------------------------------------------------ reading

    @property
    def current(self) -> DirectorySnapshot | None:
        return self.reader.client.current

    @property
    def height(self) -> int:
        return self.current.height if self.current else 0

    def users(self) -> list[UserRecord]:
        return list(self.current.users) if self.current else []

    def models(self) -> list[ModelRecord]:
        return list(self.current.models) if self.current else []

    async def refresh(self) -> None:
        """Fetch and check the directory; on failure keep the last good one and say why."""
        try:
            await self.reader.refresh()
        except DirectoryRejected as exc:
            log.warning("directory not refreshed: %s", exc)
            if self.current is None:
                raise

    # ------------------------------------------------------------------ registering

    async def register_user(self, record: UserRecord) -> None:
        await self.register(record)

    async def register_model(self, record: ModelRecord) -> None:
        await self.register(record)

    async def register(self, record: Record) -> None:
        """Register `record` (this node), wait until the checked directory lists it, then keep
        its lease renewed in the background. RegistrationError if the committee refuses it or
        cannot be reached within `register_timeout_s`."""
        if record.node_id != self.identity.node_id:
            raise RegistrationError("a node registers only itself")
        deadline = time.monotonic() + self.params.register_timeout_s
        while True:
            try:
                height = await self._submit_registration(record)
                break
            except CommitteeUnreachable as exc:
                if time.monotonic() > deadline:
                    raise CommitteeUnreachable(f"no verifier of chain {self.genesis.chain_id!r} answered for "
                                               f"{self.params.register_timeout_s:.0f} s: {exc}") from exc
                log.warning("waiting for the committee: %s", exc)
                await asyncio.sleep(self.params.retry_s)
        self.registered = record  # renewals start now: a short lease may end before we see it listed
        if self._renewal is None:
            self._renewal = asyncio.ensure_future(self._renew_forever())
        await self._wait_listed(record, height)

    async def _submit_registration(self, record: Record) -> int:
        """Submit the tx that brings the registry to `record`; the directory height it was
        decided on. CommitteeUnreachable, or RegistrationError for a final refusal."""
        try:
            await self.reader.refresh()
        except DirectoryRejected as exc:
            raise CommitteeUnreachable(str(exc)) from exc
        current = self.current
        tx = registration_tx(self.identity, record, listed(current, record), self._next_sequence(),
                             self.genesis.chain_id)
        code, text = await self.submit(tx)
        if code == txs.CODE_REPLAY:  # this identity signed with a higher sequence before (clock skew)
            self._last_sequence = await self._account_sequence()
            tx = registration_tx(self.identity, record, listed(current, record), self._next_sequence(),
                                 self.genesis.chain_id)
            code, text = await self.submit(tx)
        if code in (txs.CODE_OK, CODE_IN_MEMPOOL):
            return current.height if current else 0
        if code in FINAL_REFUSALS:
            raise RegistrationError(f"the committee refused to register this {kind_of(record)} node at "
                                    f"{record.address}: {text}")
        raise CommitteeUnreachable(f"code {code}: {text}")

    async def _wait_listed(self, record: Record, after_height: int) -> None:
        deadline = time.monotonic() + self.params.commit_timeout_s
        while True:
            await self.refresh()
            mine = listed(self.current, record)
            if self.height > after_height and same_registration(record, mine):
                return
            if time.monotonic() > deadline:
                raise RegistrationError(f"the registration of {record.address} was accepted but is not in the "
                                        f"committee's directory after {self.params.commit_timeout_s:.0f} s "
                                        f"(height {self.height})")
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ leases

    async def _renew_forever(self) -> None:
        interval = renew_interval_s(self.genesis.lease_ms, self.params)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep serving; the next renewal may reach the committee
                log.warning("lease renewal failed (retrying in %.0f s): %s", interval, exc)

    async def renew(self) -> None:
        """One renewal: a small renew_lease tx; a full registration again if the record is
        gone (its lease ended while the committee was out of reach)."""
        record = self.registered
        if record is None:
            return
        code, text = await self.submit(txs.renew_lease(self.identity, self._next_sequence(),
                                                       chain_id=self.genesis.chain_id))
        if code == txs.CODE_NOT_REGISTERED:
            log.warning("registration lapsed: registering %s again", record.address)
            await self._submit_registration(record)
        elif code == txs.CODE_REPLAY:  # the clock went back: continue from the committee's sequence
            self._last_sequence = await self._account_sequence()
            raise RegistrationError("lease renewal used an old sequence; the next one continues from the "
                                    f"committee's ({self._last_sequence})")
        elif code not in (txs.CODE_OK, CODE_IN_MEMPOOL):
            raise RegistrationError(f"lease renewal refused: code {code}: {text}")
        self.renewals += 1

    async def close(self) -> None:
        """Stop renewing (the registration then lapses one lease later)."""
        if self._renewal is not None:
            self._renewal.cancel()
            await asyncio.gather(self._renewal, return_exceptions=True)
            self._renewal = None
        await self.channels.close()

    # ------------------------------------------------------------------ transactions

    def _next_sequence(self) -> int:
        """Strictly increasing: a millisecond clock, so a restarted node needs no query."""
        self._last_sequence = max(int(self.clock() * 1000), self._last_sequence + 1)
        return self._last_sequence

    async def submit(self, tx: bytes) -> tuple[int, str]:
        """Submit to verifiers in a random order; the first answer (code, log).
        CommitteeUnreachable if none answers."""
        reply = await self._ask_any(lambda stub: stub.SubmitTx(pb.TxRequest(tx=tx), timeout=self.timeout))
        return reply.code, reply.log

    async def _account_sequence(self) -> int:
        path = f"/account/{self.identity.public_key.hex()}"
        reply = await self._ask_any(lambda stub: stub.Query(pb.QueryRequest(path=path), timeout=self.timeout))
        try:
            return int(json.loads(reply.value or b"{}").get("last_sequence", 0))
        except (ValueError, TypeError, AttributeError):
            return 0

    async def _ask_any(self, call):
        order = list(self.genesis.validators)
        self.rng.shuffle(order)
        errors = []
        for v in order:
            try:
                return await call(rpc.VerifierStub(self.channels.get(v.address, v.tls_cert_pem)))
            except grpc.aio.AioRpcError as exc:
                await self.channels.forget(v.address)
                errors.append(f"{v.name}: {exc.code().name}: {exc.details()}")
        raise CommitteeUnreachable("; ".join(errors))
