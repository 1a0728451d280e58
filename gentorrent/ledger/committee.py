"""The committee-backed Directory every node works from, and self-registration (ARCHITECTURE.md §3.1).

Reads the registry through a `light_client.CommitteeReader`, one proven query at a time
(gentorrent.ledger.queries): any verifier of the genesis may answer, an answer is accepted only
with a proof (> 2/3 of the committee of its height, as far as the light client has followed the
committee from the genesis, signed the app hash it hashes to), never older than
what was accepted before about the same thing, never certified longer ago than
`REGISTRY.max_directory_age_s`. No question is the whole registry: the directory holds what this
node uses, and `users()` / `models()` are what it holds: a sample of relays of its region drawn
at indices it chose itself (fresh at each path renewal, or at every refresh while its region is
small), the records of peers it met (`user`, `model`: by node id, kept `peer_ttl_s`), and the
rosters of the model groups it follows (`follow`: the models it asks, or its own group),
refreshed as the changes since the height it holds.

A node registers itself (`register_user`, `register_model`): it signs a register (or update)
transaction with its identity, advertised address, onion key (peers pin TLS by the identity key)
and region or model and capacity, submits it to a random verifier, and waits until the checked directory
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
import secrets
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import grpc

from gentorrent.channels import ChannelPool
from gentorrent.config import CLOVES, REACHABILITY, REGISTRY, WIRE, RegistryParams
from gentorrent.crypto.keys import Identity
from gentorrent.ledger import pow as pow_rule, queries, txs
from gentorrent.ledger.genesis import Genesis, GenesisValidator
from gentorrent.ledger.light_client import (DirectoryRejected, HeldChanged, LightClient, TrustAnchor, TrustExpired,
                                            committee_reader)
from gentorrent.ledger.sections import ModelRecord, UserRecord
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)

#: verifier node refusals that mean "already on its way", not "refused" (verifier.consensus.node: its mempool)
CODE_IN_MEMPOOL = 91
#: in a node's home: the committee headers its light client verified (light_client.Committee.encode_trust)
TRUST_FILE = "light_client.trust"
#: registry refusals a retry cannot fix: the node must change something first
FINAL_REFUSALS = frozenset({txs.CODE_ADDRESS_TAKEN, txs.CODE_INVALID_FIELD, txs.CODE_WRONG_CHAIN,
                            txs.CODE_BAD_SIGNATURE, txs.CODE_MALFORMED, txs.CODE_OVERSIZE, txs.CODE_PREFIX_FULL,
                            txs.CODE_BAD_POW, txs.CODE_NOT_LISTED})

Record = UserRecord | ModelRecord


class RegistrationError(RuntimeError):
    """The node could not register: the committee refused it, or could not be reached."""


class CommitteeUnreachable(RegistrationError):
    """No verifier of the genesis answered."""


# --------------------------------------------------------------------------- pure decisions


def kind_of(record: Record) -> str:
    return "user" if isinstance(record, UserRecord) else "model"


def same_registration(record: Record, registered: Record | None) -> bool:
    """Whether the registry already holds what this node would register (all but standing
    and heights, which are the committee's)."""
    if registered is None:
        return False
    common = ("address", "onion_key")
    extra = ("region",) if isinstance(record, UserRecord) else ("model", "capacity", "weights_digest")
    return all(getattr(record, f) == getattr(registered, f) for f in common + extra)


def registration_tx(identity: Identity, record: Record, registered: Record | None, sequence: int,
                    chain_id: str, pow_nonce: int = 0) -> bytes:
    """The transaction that brings the registry to `record`: register (with the proof of work
    `pow_nonce` for this key) when it holds nothing, update when it holds something else, renew
    when it already holds exactly this."""
    if same_registration(record, registered):
        return txs.renew_lease(identity, sequence, chain_id=chain_id)
    if isinstance(record, UserRecord):
        if registered is not None:
            return txs.update_user(identity, record.address, record.onion_key, record.region, sequence,
                                   chain_id=chain_id)
        return txs.register_user(identity, record.address, record.onion_key, record.region, sequence,
                                 chain_id=chain_id, pow_nonce=pow_nonce)
    if registered is not None:
        return txs.update_model(identity, record.address, record.model, record.capacity, sequence, record.onion_key,
                                chain_id=chain_id, weights_digest=record.weights_digest)
    return txs.register_model(identity, record.address, record.model, record.capacity, sequence, record.onion_key,
                              chain_id=chain_id, pow_nonce=pow_nonce, weights_digest=record.weights_digest)


def _newest(records: list) -> list:
    """One record per node id: the one changed last (a sample and a lookup may hold two)."""
    held: dict[bytes, Record] = {}
    for r in records:
        if r.node_id not in held or r.updated_height >= held[r.node_id].updated_height:
            held[r.node_id] = r
    return list(held.values())


def standing(roster: list[ModelRecord]) -> frozenset[tuple[bytes, bool]]:
    """Who is in a group and whether each is trusted: what a second verifier must confirm when
    it changes (a reputation that moves within trust needs no second answer)."""
    return frozenset((m.node_id, m.trusted) for m in roster)


def renew_interval_s(lease_ms: int, params: RegistryParams = REGISTRY) -> float:
    return lease_ms / 1000 / params.renewals_per_lease


# --------------------------------------------------------------------------- the directory


class CommitteeDirectory:
    """A `Directory` read from the committee, through which this node registers itself."""

    def __init__(self, genesis: Genesis, identity: Identity, timeout: float = WIRE.rpc_timeout_s, *,
                 params: RegistryParams = REGISTRY, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.time, roster_refresh_s: float | None = None,
                 trust_file: Path | None = None, trust_anchor: TrustAnchor | None = None,
                 anchor_source: Callable[[], TrustAnchor | None] | None = None) -> None:
        self.genesis = genesis
        self.identity = identity
        self.timeout = timeout
        self.params = params
        self.rng = rng or random.Random()
        self.clock = clock
        self.channels = ChannelPool()  # to the verifiers, kept open
        self.reader = committee_reader(genesis, timeout, self.channels, trust_file,
                                       client=LightClient(int(params.max_directory_age_s * 1000)),
                                       rng=self.rng, now_ms=lambda: int(self.clock() * 1000), anchor=trust_anchor,
                                       anchor_source=anchor_source)
        self.registered: Record | None = None  # what this node keeps registered
        self.renewals = 0
        self.seen_height = 0  # the highest height an accepted answer was certified at
        self.region = ""  # the region whose relays this node samples (its own)
        self.roster_refresh_s = params.user_roster_refresh_s if roster_refresh_s is None else roster_refresh_s
        self._sample: list[UserRecord] = []
        self._sample_at = float("-inf")
        self._region_count = 0
        self._users: dict[bytes, tuple[UserRecord | None, float]] = {}
        self._models: dict[bytes, tuple[ModelRecord | None, float]] = {}
        self._rosters: dict[str, tuple[list[ModelRecord], int, float]] = {}
        self._pow_nonce: int | None = None  # the proof of work for this key, once computed
        self._last_sequence = 0
        self._renewal: asyncio.Task | None = None

    @classmethod
    def from_args(cls, genesis_file: str, home: Path, **kwargs) -> "CommitteeDirectory":
        from gentorrent.crypto.keys import NodeKeys

        kwargs.setdefault("trust_file", Path(home) / TRUST_FILE)
        return cls(Genesis.load(Path(genesis_file)), NodeKeys.load_or_create(Path(home)).identity, **kwargs)

    # ------------------------------------------------------------------ reading

    def members_now(self) -> list[GenesisValidator]:
        """The committee members this node can reach now: of the verifiers it knows (the genesis'
        and those it learned), the ones in the committee it followed last (where audits go)."""
        return self.reader.members_now()

    @property
    def height(self) -> int:
        """The height this node's view is at: that of its oldest followed roster (what its asks
        choose from), else the newest answer it accepted."""
        if self._rosters:
            return min(height for _, height, _ in self._rosters.values())
        return self.seen_height

    def users(self) -> list[UserRecord]:
        """The user records this node holds: its relay sample and the peers it looked up."""
        return _newest(self._sample + [u for u, _ in self._users.values() if u is not None])

    def models(self) -> list[ModelRecord]:
        """The model records this node holds: the rosters it follows and the nodes it looked up."""
        return _newest([m for roster in self._rosters.values() for m in roster[0]]
                       + [m for m, _ in self._models.values() if m is not None])

    async def _ask(self, query, subject: str | None = None, confirm: bool | Callable = False, **kwargs):
        answer = await self.reader.ask(query, subject, confirm, **kwargs)
        self.seen_height = max(self.seen_height, answer.height)
        return answer

    async def refresh(self, region: str | None = None) -> None:
        """Bring what this node holds up to date: its relay sample when it is old (or its region
        small), the rosters it follows when they are. On failure keep what it holds and say why."""
        now = time.monotonic()
        try:
            region = region or self.region
            if region and (now - self._sample_at > CLOVES.path_renewal_s
                           or self._region_count <= 3 * self.params.relay_sample):
                await self.sample_relays(region)
            for model, (held, _, at) in list(self._rosters.items()):
                if now - at >= self.roster_refresh_s or not any(m.trusted for m in held):
                    await self.roster(model)  # a group with no trusted node yet: one may have joined
        except DirectoryRejected as exc:
            log.warning("directory not refreshed: %s", exc)
            if not self._sample and not self._rosters:
                raise

    async def sample_relays(self, region: str) -> list[UserRecord]:
        """A fresh uniform sample of relays of `region` at indices drawn here."""
        draws = tuple(secrets.randbits(64) for _ in range(self.params.relay_sample))
        answer = await self._ask(queries.RelaySample(region, draws), f"relays:{region}")
        self._region_count, records = answer.result
        self.region = region
        self._sample = [r for r in {r.node_id: r for r in records}.values() if r.node_id != self.identity.node_id]
        self._sample_at = time.monotonic()
        return self._sample

    async def follow(self, model: str) -> list[ModelRecord]:
        """The roster of `model`, fetched now if this node does not hold it, then kept fresh."""
        if model in self._rosters:
            return self._rosters[model][0]
        return await self.roster(model)

    async def roster(self, model: str) -> list[ModelRecord]:
        """The complete roster of `model` (the changes since the height held, when one is). An
        answer that changes who is in the group or who is trusted (or a first one) is confirmed
        by a second verifier, the newer of the two kept: a replay of an older state cannot hide
        a verdict behind one answer."""
        held = self._rosters.get(model)
        since = held[1] if held else 0
        query = queries.Roster(model, since)
        kwargs = {"held": {m.node_id: m for m in held[0]}} if held else {}
        confirm = (lambda answer: standing(answer.result) != standing(held[0])) if held else True
        try:
            try:
                answer = await self._ask(query, f"roster:{model}", confirm=confirm, **kwargs)
            except HeldChanged:  # a member it holds left: unchanged ones one by one, not in subtrees
                answer = await self._ask(replace(query, subtrees=False), f"roster:{model}", confirm=confirm, **kwargs)
        except DirectoryRejected:
            if not held:
                raise
            answer = await self._ask(queries.Roster(model), f"roster:{model}", confirm=True)  # a full one
        self._rosters[model] = (answer.result, answer.height, time.monotonic())
        return answer.result

    async def user(self, node_id: bytes, fresh: bool = False) -> UserRecord | None:
        """The user record of `node_id` (a peer met on a link), or None when it has none."""
        return await self._lookup(self._users, queries.UserLookup(node_id), fresh)

    async def model(self, node_id: bytes, fresh: bool = False) -> ModelRecord | None:
        return await self._lookup(self._models, queries.ModelLookup(node_id), fresh)

    async def _lookup(self, cache: dict, query, fresh: bool):
        held = cache.get(query.node_id)
        ttl = self.params.peer_ttl_s if held is not None and held[0] is not None else self.params.absent_ttl_s
        if held is not None and not fresh and time.monotonic() - held[1] < ttl:
            return held[0]
        record = (await self._ask(query)).result
        cache[query.node_id] = (record, time.monotonic())
        return record

    async def catalog(self) -> dict[str, tuple[int, int]]:
        """The model names served, each with (nodes, trusted nodes)."""
        return (await self._ask(queries.Catalog())).result

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
        if isinstance(record, UserRecord):
            self.region = record.region  # the relays it samples are its region's
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
            mine = await self.listed(record)
        except TrustExpired as exc:  # waiting changes nothing: the operator must give an anchor
            raise RegistrationError(str(exc)) from exc
        except DirectoryRejected as exc:
            raise CommitteeUnreachable(str(exc)) from exc
        nonce = await self.proof_of_work() if mine is None else 0
        tx = registration_tx(self.identity, record, mine, self._next_sequence(), self.genesis.chain_id, nonce)
        code, text = await self.submit(tx)
        if code == txs.CODE_REPLAY:  # this identity signed with a higher sequence before (clock skew)
            self._last_sequence = await self._account_sequence()
            tx = registration_tx(self.identity, record, mine, self._next_sequence(), self.genesis.chain_id, nonce)
            code, text = await self.submit(tx)
        if code in (txs.CODE_OK, CODE_IN_MEMPOOL):
            return self.seen_height
        if code in FINAL_REFUSALS:
            raise RegistrationError(f"the committee refused to register this {kind_of(record)} node at "
                                    f"{record.address}: {text}")
        raise CommitteeUnreachable(f"code {code}: {text}")

    async def proof_of_work(self) -> int:
        """The genesis' proof of work for this key (gentorrent.ledger.pow): computed once, off
        the event loop (2^bits Argon2id attempts), and reused for every later registration."""
        if self._pow_nonce is None:
            params = self.genesis.rules.pow
            if params.bits:
                log.info("computing the registration's proof of work (%d bits, about %d Argon2id attempts)",
                         params.bits, params.expected_attempts)
            self._pow_nonce = await asyncio.to_thread(pow_rule.solve, params, self.genesis.chain_id,
                                                      self.identity.public_key)
        return self._pow_nonce

    async def listed(self, record: Record) -> Record | None:
        """This node's record as the committee holds it now (same kind), or None."""
        if isinstance(record, UserRecord):
            return await self.user(record.node_id, fresh=True)
        return await self.model(record.node_id, fresh=True)

    async def _wait_listed(self, record: Record, after_height: int) -> None:
        deadline = time.monotonic() + self.params.commit_timeout_s
        while True:
            try:
                mine = await self.listed(record)
            except DirectoryRejected as exc:
                log.warning("waiting for the registration to be listed: %s", exc)
                mine = None
            if self.seen_height > after_height and same_registration(record, mine):
                return
            if time.monotonic() > deadline:
                raise RegistrationError(f"the registration of {record.address} was accepted but is not in the "
                                        f"committee's directory after {self.params.commit_timeout_s:.0f} s "
                                        f"(height {self.seen_height})")
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

    async def submit_signed(self, build: Callable[[int], bytes]) -> tuple[int, str]:
        """Submit the tx `build(sequence)` signs (a fresh sequence; once more with the account's
        next one if this identity signed a higher one before): (code, log)."""
        code, text = await self.submit(build(self._next_sequence()))
        if code == txs.CODE_REPLAY:
            self._last_sequence = await self._account_sequence()
            code, text = await self.submit(build(self._next_sequence()))
        return code, text

    async def catalogue(self) -> list[dict]:
        """The committee's model catalogue (gentorrent.ledger.catalogue), as one verifier says it:
        what operators read; the registry's rule, not this read, is what holds nodes to it."""
        reply = await self._ask_any(lambda stub: stub.Query(pb.QueryRequest(path="/catalogue"), timeout=self.timeout))
        return json.loads(reply.value or b"[]")

    async def dial_back(self, port: int) -> pb.DialBackReply:
        """Whether a member can dial this node at `port` on the host this call comes from
        (verifier/dial_back.py). A member that dialled this host moments ago (another node behind
        the same router) does not dial: the next one is asked, up to one try per member; the
        last answer then says `retry_after_s`. CommitteeUnreachable if no member answers."""
        request = pb.DialBackRequest(public_key=self.identity.public_key, port=port)
        return await self._ask_any(lambda stub: stub.DialBack(request, timeout=REACHABILITY.dial_timeout_s
                                                              + self.timeout),
                                   until=lambda reply: not reply.retry_after_s)

    async def _account_sequence(self) -> int:
        path = f"/account/{self.identity.public_key.hex()}"
        reply = await self._ask_any(lambda stub: stub.Query(pb.QueryRequest(path=path), timeout=self.timeout))
        try:
            return int(json.loads(reply.value or b"{}").get("last_sequence", 0))
        except (ValueError, TypeError, AttributeError):
            return 0

    async def _ask_any(self, call, until: Callable[[object], bool] = lambda reply: True):
        """The first answer `until` accepts, from the verifiers in a random order (else the last
        answer); CommitteeUnreachable if none answers."""
        order = list(self.genesis.validators)
        self.rng.shuffle(order)
        errors, answer = [], None
        for v in order:
            try:
                answer = await call(rpc.VerifierStub(self.channels.get(v.address, v.tls_cert_pem)))
            except grpc.aio.AioRpcError as exc:
                await self.channels.forget(v.address)
                errors.append(f"{v.name}: {exc.code().name}: {exc.details()}")
                continue
            if until(answer):
                return answer
        if answer is None:
            raise CommitteeUnreachable("; ".join(errors))
        return answer
