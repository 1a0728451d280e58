"""The registry's replicated state and the deterministic rules that change it (pure).

`CommittedState` is what was last made durable; every other view of the state (the block
being finalized, the mempool's CheckTx view, a proposal being simulated) is a `StateView`:
a copy-on-write overlay that reads through to the committed state and records its own
changes, so it can be thrown away (a rejected proposal, a new height for the mempool) or
folded into the committed state by `Commit` at the cost of the changes only.

Parts (interface.SECTIONS): meta (chain id, height, time, validators, the parameters of the
rules, fixed by the genesis: gentorrent.ledger.chain_params; the committee's changes and the model
catalogue), epochs, and the registry tree (gentorrent.ledger.authtree; its layout in
gentorrent.ledger.sections): users, models with their reputation and trusted flag, the relay and
roster indexes, accounts (sequences and leases) and each model's serving counts. The records live
in dicts for the rules to read; the tree is derived from them, and a block changes it only where
its records changed (`registry_changes`), so committing a block costs O(changes x log N), never a
pass over the registry.

Registry rules beyond the stateless checks of `gentorrent.ledger.txs` (ARCHITECTURE.md §3.1):
- every transaction must name this chain's id (`signed_tx.open_envelope`);
- Sybils cost something (THREAT_MODEL.md, "Sybil relays"): a registration carries a proof of
  work for its key (gentorrent.ledger.pow; CODE_BAD_POW), checked after every cheap check so a
  flood of bad ones costs one Argon2 attempt each at most; the genesis caps the relays of one
  IPv4 /24 or IPv6 /48 (CODE_PREFIX_FULL) and the registrations one block carries
  (CODE_BLOCK_FULL), since a Byzantine proposer's transactions are not in any member's
  verified cache (`signed_tx.VerifiedTxs`) and cost their full check (all from
  `params.registry`);
- one address, one node: a registration or update naming an address that another record
  holds is refused (CODE_ADDRESS_TAKEN). Nodes pin a peer's certificate by the address they
  dial, so a second record at a victim's address would make them pin the attacker's key;
- a registration is a lease: register, update and renew_lease set the signer's account's
  `lease_expires_ms` to the block time plus `lease_ms` (a renewal changes that one entry, no
  record); after each block, the records of accounts whose lease ended leave the registry, so a
  node that vanished stops being chosen. Which accounts end when is an index by second
  (`CommittedState.expiring`), so a block looks only at the leases that end in it;
- the model catalogue (in the meta section; gentorrent.ledger.catalogue): a committee member
  adds an entry (catalogue_add); a model registration or update naming a model the catalogue
  lists must give one of its weights digests (CODE_NOT_LISTED).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.crypto.keys import node_id_of
from gentorrent.ledger import addresses, catalogue, pow as pow_rule
from gentorrent.ledger import sections as sec
from gentorrent.ledger.authtree import Tree
from gentorrent.ledger.chain_params import ChainParams
from verifier.abci.interface import SECTIONS, TxResult, app_hash_of
from gentorrent.ledger.sections import Account, ModelRecord, UserRecord
from gentorrent.ledger.epoch_txs import MESSAGES
from gentorrent.ledger.txs import (CODE_ADDRESS_TAKEN, CODE_ALREADY_REGISTERED, CODE_BAD_POW, CODE_BLOCK_FULL,
                                   CODE_NOT_REGISTERED, CODE_OK, CODE_PREFIX_FULL, CODE_REPLAY, CODE_UNAUTHORIZED,
                                   Deregistration, LeaseRenewal, Registration, Role, ModelInfo, Tx, TxError,
                                   UserInfo, VerifiedTxs, decode_tx)
from verifier.abci import committee as committee_rules
from verifier.abci.committee import CommitteeBook
from verifier.epochs import machine as epoch_machine
from verifier.epochs.machine import standing_of

K = TypeVar("K")
V = TypeVar("V")
_DELETED = object()
#: who holds an address: (its registry, node id)
Holder = tuple[Role, bytes]


class Overlay(Generic[K, V]):
    """A dict view: reads fall through to `base`; writes and deletions stay in `changes`."""

    def __init__(self, base: dict[K, V]):
        self.base = base
        self.changes: dict[K, object] = {}

    def get(self, key: K) -> V | None:
        if key in self.changes:
            value = self.changes[key]
            return None if value is _DELETED else value  # type: ignore[return-value]
        return self.base.get(key)

    def set(self, key: K, value: V) -> None:
        self.changes[key] = value

    def delete(self, key: K) -> None:
        self.changes[key] = _DELETED

    def items(self) -> Iterator[tuple[K, V]]:
        """All live items, sorted by key (the canonical order of every section)."""
        keys = sorted(set(self.base) | set(self.changes))  # type: ignore[type-var]
        for key in keys:
            value = self.get(key)
            if value is not None:
                yield key, value

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def effective_changes(self) -> dict[K, V | None]:
        """Changes as {key: new value or None for deleted}."""
        return {k: (None if v is _DELETED else v) for k, v in self.changes.items()}  # type: ignore[misc]


@dataclass
class CommittedState:
    """The last durable state, with the indexes derived from it (not hashed)."""

    chain_id: str = ""
    height: int = 0
    time_ms: int = 0
    validators: tuple[tuple[bytes, int], ...] = ()
    #: the replicated rules' parameters, from the genesis (InitChain) and stored in meta
    params: ChainParams = field(default_factory=ChainParams)
    users: dict[bytes, UserRecord] = field(default_factory=dict)
    models: dict[bytes, ModelRecord] = field(default_factory=dict)
    accounts: dict[bytes, Account] = field(default_factory=dict)
    #: address -> its record (derived from users and models, not hashed: the registry's index)
    addresses: dict[str, Holder] = field(default_factory=dict)
    #: IPv4 /24 or IPv6 /48 -> how many relays registered there (derived from users)
    prefixes: dict[str, int] = field(default_factory=dict)
    #: second of block time -> the public keys whose lease ends in it (derived from accounts)
    expiring: dict[int, set[bytes]] = field(default_factory=dict)
    expiring_seconds: list[int] = field(default_factory=list)  # the keys of `expiring`, sorted
    #: the epochs section as a message (the epoch rules own its fields); treat as
    #: immutable: a view that changes it replaces it with a modified copy
    epochs: pb.EpochsSection = field(default_factory=pb.EpochsSection)
    committee: CommitteeBook = field(default_factory=CommitteeBook)  # (verifier.abci.committee)
    #: the model catalogue, in the order entries were added (immutable: a view replaces it)
    catalogue: tuple[pb.CatalogueEntry, ...] = ()
    #: the registry tree of users, models and accounts (derived from them; what the app hash commits to)
    tree: Tree = field(default_factory=Tree)
    initialized: bool = False

    def build_tree(self) -> None:
        """The registry tree of the records, from scratch (after loading them from the store)."""
        self.tree = Tree.from_items(registry_entries(self.users.values(), self.models.values(),
                                                     self.accounts.values()))

    def index_addresses(self) -> None:
        """Rebuild the address index from the records (after loading them)."""
        self.addresses = {u.address: (Role.USER, k) for k, u in self.users.items() if u.address}
        self.addresses.update({m.address: (Role.MODEL, k) for k, m in self.models.items()})
        self.prefixes = dict(Counter(addresses.cap_prefix(u.address) for u in self.users.values() if u.address))
    def index_leases(self) -> None:
        """Rebuild the lease index from the accounts (after loading them)."""
        self.expiring, self.expiring_seconds = {}, []
        for account in self.accounts.values():
            self._index_lease(account.public_key, 0, account.lease_expires_ms)

    def _index_lease(self, public_key: bytes, old_ms: int, new_ms: int) -> None:
        if old_ms:
            second = old_ms // 1000
            keys = self.expiring.get(second)
            if keys is not None:
                keys.discard(public_key)
                if not keys:
                    del self.expiring[second]
                    del self.expiring_seconds[bisect.bisect_left(self.expiring_seconds, second)]
        if new_ms:
            second = new_ms // 1000
            if second not in self.expiring:
                self.expiring[second] = set()
                bisect.insort(self.expiring_seconds, second)
            self.expiring[second].add(public_key)

    def leases_ending_by(self, time_ms: int) -> Iterator[bytes]:
        """Public keys whose committed lease ends in a second up to `time_ms`'s (a superset:
        the caller checks each account)."""
        last = time_ms // 1000
        for second in self.expiring_seconds:
            if second > last:
                return
            yield from self.expiring[second]


class StateView:
    """A speculative state on top of a CommittedState; see the module docstring."""

    def __init__(self, base: CommittedState, verified: VerifiedTxs | None = None):
        self.base = base
        self.verified = verified
        #: registrations this view may still take (a block's: the genesis' cap; None: unbounded)
        self.registrations_left: int | None = None
        self._tree: Tree | None = None
        self.chain_id = base.chain_id
        self.height = base.height
        self.time_ms = base.time_ms
        self.validators = base.validators
        self.params = base.params
        self.epochs = base.epochs
        self.committee = base.committee
        self.catalogue = base.catalogue
        self.block_changes = committee_rules.BlockChanges()
        self.users: Overlay[bytes, UserRecord] = Overlay(base.users)
        self.models: Overlay[bytes, ModelRecord] = Overlay(base.models)
        self.accounts: Overlay[bytes, Account] = Overlay(base.accounts)
        self.addresses: Overlay[str, Holder] = Overlay(base.addresses)
        self.prefixes: Overlay[str, int] = Overlay(base.prefixes)

    # ------------------------------------------------------------------ the registry tree and the app hash

    def registry_tree(self) -> Tree:
        """The registry tree of this view: the committed one with this view's changes made."""
        tree = self.base.tree.apply(registry_changes(self))
        self._tree = tree
        return tree

    def meta_bytes(self) -> bytes:
        return sec.encode_meta(self.chain_id, self.height, self.time_ms, self.validators, self.params.lease_ms,
                               self.params.encode(), self.committee, self.catalogue)

    def section_hashes(self, meta: bytes | None = None) -> dict[str, bytes]:
        """`meta`: this view's `meta_bytes()`, where the caller holds them already."""
        return {"meta": sec.section_hash(self.meta_bytes() if meta is None else meta),
                "epochs": sec.section_hash(sec.encode_epochs(self.epochs)),
                "registry": self.registry_tree().root_hash}

    def app_hash(self) -> bytes:
        """The app hash of this view (computed last, after the block's transactions and
        `end_block`: `fold_into_base` reuses the tree it built)."""
        return app_hash_of(self.section_hashes())

    # ------------------------------------------------------------------ transactions

    def is_validator(self, public_key: bytes) -> bool:
        return any(k == public_key for k, _ in self.validators)

    def deliver(self, raw: bytes) -> TxResult:
        """Check and apply one transaction; a failed one changes nothing."""
        try:
            tx = decode_tx(raw, self.chain_id, self.verified)
            self._check(tx)
        except TxError as exc:
            return TxResult(code=exc.code, log=str(exc))
        self._apply(tx)
        if self.verified is not None:
            self.verified.add(tx.hash, tx)
        return TxResult(code=CODE_OK, log="ok",
                        events=(("kind", tx.kind), ("node_id", tx.node_id.hex()), ("sequence", str(tx.sequence))))

    def _check(self, tx: Tx) -> None:
        account = self.accounts.get(tx.signer)
        last = account.last_sequence if account else 0
        if tx.sequence <= last:
            raise TxError(CODE_REPLAY, f"sequence {tx.sequence} already used: the signer's last sequence is {last}")
        if tx.committee_only and not self.is_validator(tx.signer):
            raise TxError(CODE_UNAUTHORIZED, f"{tx.kind} may only be signed by a committee member")
        _HANDLERS[type(tx.payload)].check(self, tx)

    def _apply(self, tx: Tx) -> None:
        """Apply a checked transaction: its signer's sequence (and lease: `_LEASE_SETTERS`), then
        what its payload changes."""
        account = self.accounts.get(tx.signer) or Account(tx.signer)
        if isinstance(tx.payload, _LEASE_SETTERS):
            account = replace(account, lease_expires_ms=self._expires())
        self.accounts.set(tx.signer, replace(account, last_sequence=tx.sequence))
        _HANDLERS[type(tx.payload)].apply(self, tx)

    # ------------------------------------------------------------------ registry kinds

    def _check_registration(self, tx: Tx) -> None:
        reg = tx.payload
        assert isinstance(reg, Registration)
        exists = self._table(reg.role).get(tx.node_id) is not None
        if reg.new and exists:
            raise TxError(CODE_ALREADY_REGISTERED, f"node {tx.node_id.hex()[:16]} is already registered; "
                                                   f"use update_{reg.role}")
        if not reg.new and not exists:
            raise TxError(CODE_NOT_REGISTERED, f"node {tx.node_id.hex()[:16]} is not registered")
        self._check_address(reg.info.address, (reg.role, tx.node_id))
        if isinstance(reg.info, UserInfo):
            self._check_prefix(reg.info.address, self.users.get(tx.node_id))
        if isinstance(reg.info, ModelInfo):
            catalogue.check_listed(self.catalogue, reg.info.model, reg.info.weights_digest)
        if reg.new:
            if self.registrations_left == 0:
                raise TxError(CODE_BLOCK_FULL, f"this block carries {self.params.registry.registrations_per_block} "
                                               "registrations already (the genesis' cap): the next block takes it")
            self._check_pow(tx)

    def _check_prefix(self, address: str, old: UserRecord | None) -> None:
        """At most the genesis' number of relays per IPv4 /24 or IPv6 /48."""
        rules = self.params.registry
        if not address:  # a client-only user is no relay
            return
        prefix = addresses.cap_prefix(address)
        cap = rules.relays_per_24 if ":" not in prefix else rules.relays_per_48
        if not cap or (old is not None and addresses.cap_prefix(old.address) == prefix):
            return
        if (self.prefixes.get(prefix) or 0) >= cap:
            raise TxError(CODE_PREFIX_FULL, f"{prefix} holds {cap} relays already, the most this network's genesis "
                                            "allows per network (one operator, one share of the relays)")

    def _check_pow(self, tx: Tx) -> None:
        """The proof of work, last: every cheap refusal comes first (one Argon2 attempt)."""
        work = self.params.registry.pow
        if not work.bits or (self.verified is not None and self.verified.get(tx.hash) is not None):
            return
        nonce = tx.payload.info.pow_nonce  # type: ignore[union-attr]
        if not pow_rule.verify(work, self.chain_id, tx.signer, nonce):
            raise TxError(CODE_BAD_POW, f"the registration carries no proof of work of {work.bits} bits for this "
                                        "key (gentorrent.ledger.pow; nodes compute it before they register)")

    def _check_deregistration(self, tx: Tx) -> None:
        role = tx.payload.role  # type: ignore[union-attr]
        if self._table(role).get(tx.node_id) is None:
            raise TxError(CODE_NOT_REGISTERED, f"node {tx.node_id.hex()[:16]} is not registered")

    def _check_renewal(self, tx: Tx) -> None:
        if self.users.get(tx.node_id) is None and self.models.get(tx.node_id) is None:
            raise TxError(CODE_NOT_REGISTERED, f"node {tx.node_id.hex()[:16]} has no registration to renew")

    def _check_address(self, address: str, me: Holder) -> None:
        holder = self.addresses.get(address) if address else None  # "": a client-only user dials out only
        if holder is None or holder == me:
            return
        record = self._table(holder[0]).get(holder[1])
        account = self.accounts.get(record.public_key) if record is not None else None
        until = ""
        if account is not None and account.lease_expires_ms:
            left_s = (account.lease_expires_ms - self.time_ms) / 1000
            until = f" until it deregisters or its lease ends ({left_s:.0f} s)"
        raise TxError(CODE_ADDRESS_TAKEN, f"address {address} is registered by {holder[0]} node "
                                          f"{holder[1].hex()[:16]}{until}; one address, one node")

    def _expires(self) -> int:
        lease_ms = self.params.lease_ms
        return self.time_ms + lease_ms if lease_ms else 0

    def _apply_registration(self, tx: Tx) -> None:
        reg = tx.payload
        assert isinstance(reg, Registration)
        node_id, info = tx.node_id, reg.info
        if reg.new and self.registrations_left is not None:
            self.registrations_left -= 1
        if isinstance(info, UserInfo):
            old = self.users.get(node_id)
            self._put(Role.USER, UserRecord(
                node_id=node_id, public_key=tx.signer, address=info.address, onion_key=info.onion_key,
                region=info.region,
                registered_height=old.registered_height if old else self.height, updated_height=self.height), old)
            return
        old_m = self.models.get(node_id)
        if old_m is None:  # a key the committee scored before resumes its standing
            rules = self.params.reputation
            reputation, trusted = standing_of(self.epochs, node_id) or (
                rules.initial_reputation, rules.initial_reputation >= rules.untrusted_below)
            record = ModelRecord(
                node_id=node_id, public_key=tx.signer, address=info.address, model=info.model,
                capacity=info.capacity, reputation=reputation,
                trusted=trusted, registered_height=self.height,
                updated_height=self.height, onion_key=info.onion_key, weights_digest=info.weights_digest)
        else:  # an update keeps reputation and trust: they are the committee's, not the node's
            record = replace(old_m, address=info.address, model=info.model, capacity=info.capacity,
                             onion_key=info.onion_key, updated_height=self.height,
                             weights_digest=info.weights_digest)
        self._put(Role.MODEL, record, old_m)

    def _apply_deregistration(self, tx: Tx) -> None:
        self._remove(tx.payload.role, tx.node_id)  # type: ignore[union-attr]

    def _apply_renewal(self, tx: Tx) -> None:
        """The account's lease, set by `_apply`, is all a renewal changes."""

    # ------------------------------------------------------------------ epoch kinds (verifier.epochs.machine)

    def _check_epoch(self, tx: Tx) -> None:
        self._next_epochs = epoch_machine.apply(self, tx.signer, tx.payload)

    def _apply_epoch(self, tx: Tx) -> None:
        """The epochs section _check computed (a new EpochsSection; model records rebuilt with
        `dataclasses.replace` happen at the end of the block)."""
        self.epochs = self._next_epochs

    # ------------------------------------------------------------------ the committee itself

    def _check_change(self, tx: Tx) -> None:
        committee_rules.check_change(self, tx)

    def _apply_change(self, tx: Tx) -> None:
        committee_rules.apply_change(self, tx.payload)

    # ------------------------------------------------------------------ the model catalogue

    def _check_catalogue_add(self, tx: Tx) -> None:
        catalogue.check_addition(self.catalogue, tx.payload)

    def _apply_catalogue_add(self, tx: Tx) -> None:
        entry = pb.CatalogueEntry()
        entry.CopyFrom(tx.payload)
        entry.added_height = self.height
        self.catalogue = self.catalogue + (entry,)

    def _table(self, role: Role) -> Overlay:
        return self.users if role is Role.USER else self.models

    def _put(self, role: Role, record: UserRecord | ModelRecord, old: UserRecord | ModelRecord | None) -> None:
        """Store a user or model record and keep the address and prefix indexes in step."""
        if old is not None and old.address != record.address and old.address:
            self.addresses.delete(old.address)
        if role is Role.USER:
            if old is not None:
                self._count_prefix(old.address, -1)
            self._count_prefix(record.address, +1)
        self._table(role).set(record.node_id, record)
        if record.address:
            self.addresses.set(record.address, (role, record.node_id))

    def _count_prefix(self, address: str, delta: int) -> None:
        if not address:  # a client-only user: no relay to count
            return
        prefix = addresses.cap_prefix(address)
        count = (self.prefixes.get(prefix) or 0) + delta
        if count:
            self.prefixes.set(prefix, count)
        else:
            self.prefixes.delete(prefix)

    def _remove(self, role: Role, node_id: bytes) -> None:
        table = self._table(role)
        old = table.get(node_id)
        if old is not None:
            table.delete(node_id)
            if role is Role.USER:
                self._count_prefix(old.address, -1)
            if old.address and self.addresses.get(old.address) == (role, node_id):
                self.addresses.delete(old.address)

    def expire_leases(self) -> list[bytes]:
        """Remove every record whose lease ended by this block's time; their node ids. Looks at
        the leases the index says end by now and at this view's own, never at every account."""
        if not self.params.lease_ms:
            return []
        now = self.time_ms
        candidates = set(self.base.leases_ending_by(now))
        candidates.update(k for k, a in self.accounts.changes.items()
                          if a is not _DELETED and 0 < a.lease_expires_ms <= now)  # type: ignore[union-attr]
        gone = []
        for public_key in sorted(candidates, key=node_id_of):
            account = self.accounts.get(public_key)
            if account is None or not 0 < account.lease_expires_ms <= now:
                continue  # renewed since, or no lease
            node_id = node_id_of(public_key)
            for role in Role:
                self._remove(role, node_id)
            self.accounts.set(public_key, replace(account, lease_expires_ms=0))
            gone.append(node_id)
        return gone

    def end_block(self, block_hash: bytes) -> None:
        """After a block's txs: leases that ended, then verification epochs (deadlines,
        reputation updates, the next epoch)."""
        self.expire_leases()
        epoch_machine.end_block(self, block_hash)

    # ------------------------------------------------------------------ folding into the base

    def fold_into_base(self) -> None:
        """Make this view the committed state (after the store has written it)."""
        b = self.base
        tree = self._tree if self._tree is not None else self.registry_tree()
        b.chain_id, b.height, b.time_ms, b.params = self.chain_id, self.height, self.time_ms, self.params
        b.validators, b.epochs, b.committee = self.validators, self.epochs, self.committee
        b.catalogue, b.tree = self.catalogue, tree
        for key, account in self.accounts.effective_changes().items():
            old = b.accounts.get(key)
            b._index_lease(key, old.lease_expires_ms if old else 0, account.lease_expires_ms if account else 0)
        for overlay, table in ((self.users, b.users), (self.models, b.models), (self.accounts, b.accounts),
                               (self.addresses, b.addresses), (self.prefixes, b.prefixes)):
            for key, value in overlay.effective_changes().items():
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value  # type: ignore[index]
            overlay.changes = {}
        self._tree = None


@dataclass(frozen=True)
class _Handler:
    """How the registry checks and applies one payload type (both on a StateView)."""

    check: Callable[[StateView, Tx], None]
    apply: Callable[[StateView, Tx], None]


_EPOCH = _Handler(StateView._check_epoch, StateView._apply_epoch)
#: the payloads that start a lease (or extend it) for every registration of their signer
_LEASE_SETTERS = (Registration, LeaseRenewal)
#: payload type (gentorrent.ledger.txs.Payload) -> its handler: every kind txs.KINDS decodes has one
_HANDLERS: dict[type, _Handler] = {
    Registration: _Handler(StateView._check_registration, StateView._apply_registration),
    Deregistration: _Handler(StateView._check_deregistration, StateView._apply_deregistration),
    LeaseRenewal: _Handler(StateView._check_renewal, StateView._apply_renewal),
    **{message: _EPOCH for message in MESSAGES.values()},
    pb.CommitteeChange: _Handler(StateView._check_change, StateView._apply_change),
    pb.CatalogueEntry: _Handler(StateView._check_catalogue_add, StateView._apply_catalogue_add),
}


# --------------------------------------------------------------------------- the registry tree


def _user_entries(u: UserRecord) -> list[tuple[bytes, bytes]]:
    value = sec.encode(u.to_pb())
    return [(sec.user_key(u.node_id), value), (sec.relay_key(u.region, u.node_id), value)]


def _model_entries(m: ModelRecord) -> list[tuple[bytes, bytes]]:
    value = sec.encode(m.to_pb())
    return [(sec.model_key(m.node_id), value), (sec.group_key(m.model, m.node_id), value)]


def registry_entries(users: Iterable[UserRecord], models: Iterable[ModelRecord],
                     accounts: Iterable[Account]) -> Iterator[tuple[bytes, bytes]]:
    """Every entry of the registry tree of these records (gentorrent.ledger.sections' layout)."""
    catalog: Counter = Counter()
    for u in users:
        yield from _user_entries(u)
    for m in models:
        yield from _model_entries(m)
        catalog[(m.model, 0)] += 1
        catalog[(m.model, 1)] += m.trusted
    for account in accounts:
        yield sec.account_key(account.public_key), sec.encode(account.to_pb())
    for model in sorted({name for name, _ in catalog}):
        yield sec.catalog_key(model), sec.encode_catalog(catalog[(model, 0)], catalog[(model, 1)])


def registry_changes(view: "StateView") -> dict[bytes, bytes | None]:
    """What `view` changes in the committed registry tree: the same entries `registry_entries`
    would give for the view's records, computed from its changed records only."""
    base = view.base
    changes: dict[bytes, bytes | None] = {}
    for node_id, new in view.users.effective_changes().items():
        old = base.users.get(node_id)
        if old is not None:
            changes[sec.user_key(node_id)] = changes[sec.relay_key(old.region, node_id)] = None
        if new is not None:
            changes.update(_user_entries(new))
    catalog: Counter = Counter()
    for node_id, new in view.models.effective_changes().items():
        old = base.models.get(node_id)
        if old is not None:
            changes[sec.model_key(node_id)] = changes[sec.group_key(old.model, node_id)] = None
            catalog[(old.model, 0)] -= 1
            catalog[(old.model, 1)] -= old.trusted
        if new is not None:
            changes.update(_model_entries(new))
            catalog[(new.model, 0)] += 1
            catalog[(new.model, 1)] += new.trusted
    for model in {name for name, _ in catalog}:
        if catalog[(model, 0)] == 0 and catalog[(model, 1)] == 0:
            continue
        current = base.tree.get(sec.catalog_key(model))
        entry = pb.CatalogEntry.FromString(current) if current is not None else pb.CatalogEntry()
        nodes, trusted = entry.nodes + catalog[(model, 0)], entry.trusted + catalog[(model, 1)]
        changes[sec.catalog_key(model)] = sec.encode_catalog(nodes, trusted) if nodes else None
    for key, account in view.accounts.effective_changes().items():
        if account is not None:
            changes[sec.account_key(key)] = sec.encode(account.to_pb())
    return changes


assert SECTIONS == ("meta", "epochs", "registry")
