"""The registry's replicated state and the deterministic rules that change it (pure).

`CommittedState` is what was last made durable; every other view of the state (the block
being finalized, the mempool's CheckTx view, a proposal being simulated) is a `StateView`:
a copy-on-write overlay that reads through to the committed state and records its own
changes, so it can be thrown away (a rejected proposal, a new height for the mempool) or
folded into the committed state by `Commit` at the cost of the changes only.

Sections (interface.SECTIONS): meta (chain id, height, time, validators, account sequences,
the registration lease), users, models (with reputation and trusted flag), epochs.

Registry rules beyond the stateless checks of `gentorrent.ledger.txs` (ARCHITECTURE.md §3.1):
- every transaction must name this chain's id (`signed_tx.open_envelope`);
- one address, one node: a registration or update naming an address that another record
  holds is refused (CODE_ADDRESS_TAKEN). Nodes pin a peer's certificate by the address they
  dial, so a second record at a victim's address would make them pin the attacker's key;
- a registration is a lease: register, update and renew_lease set `expires_ms` to the block
  time plus `lease_ms`; after each block, records whose lease ended (block time past
  `expires_ms`) leave the registry, so a node that vanished stops being chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Generic, Iterator, TypeVar

from gentorrent.config import REPUTATION
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger import sections as sec
from verifier.abci.interface import SECTIONS, TxResult, app_hash_of
from gentorrent.ledger.sections import ModelRecord, UserRecord
from gentorrent.ledger.txs import (CODE_ADDRESS_TAKEN, CODE_ALREADY_REGISTERED, CODE_NOT_REGISTERED, CODE_OK,
                                   CODE_REPLAY, CODE_UNAUTHORIZED, COMMITTEE_KINDS, EPOCH_KINDS, ModelInfo, Tx,
                                   TxError, UserInfo, decode_tx)

K = TypeVar("K")
V = TypeVar("V")
_DELETED = object()
#: who holds an address: ("user" | "model", node id)
Holder = tuple[str, bytes]


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
    """The last durable state (its section encodings are cached: most blocks touch few)."""

    chain_id: str = ""
    height: int = 0
    time_ms: int = 0
    validators: tuple[tuple[bytes, int], ...] = ()
    lease_ms: int = 0  # 0: a store from before leases (nothing expires)
    users: dict[bytes, UserRecord] = field(default_factory=dict)
    models: dict[bytes, ModelRecord] = field(default_factory=dict)
    accounts: dict[bytes, int] = field(default_factory=dict)
    #: address -> its record (derived from users and models, not hashed: the registry's index)
    addresses: dict[str, Holder] = field(default_factory=dict)
    #: the epochs section as a message (the epoch rules own its fields); treat as
    #: immutable: a view that changes it replaces it with a modified copy
    epochs: pb.EpochsSection = field(default_factory=pb.EpochsSection)
    initialized: bool = False
    _cache: dict[str, bytes] = field(default_factory=dict, repr=False)

    def section_bytes(self, name: str, make: Callable[[], bytes]) -> bytes:
        if name not in self._cache:
            self._cache[name] = make()
        return self._cache[name]

    def invalidate(self, *names: str) -> None:
        for n in names:
            self._cache.pop(n, None)

    def index_addresses(self) -> None:
        """Rebuild the address index from the records (after loading them)."""
        self.addresses = {u.address: ("user", k) for k, u in self.users.items()}
        self.addresses.update({m.address: ("model", k) for k, m in self.models.items()})


class StateView:
    """A speculative state on top of a CommittedState; see the module docstring."""

    def __init__(self, base: CommittedState):
        self.base = base
        self.chain_id = base.chain_id
        self.height = base.height
        self.time_ms = base.time_ms
        self.validators = base.validators
        self.lease_ms = base.lease_ms
        self.epochs = base.epochs
        self.users: Overlay[bytes, UserRecord] = Overlay(base.users)
        self.models: Overlay[bytes, ModelRecord] = Overlay(base.models)
        self.accounts: Overlay[bytes, int] = Overlay(base.accounts)
        self.addresses: Overlay[str, Holder] = Overlay(base.addresses)

    # ------------------------------------------------------------------ encodings and hashes

    def section_bytes(self) -> dict[str, bytes]:
        b = self.base
        meta = sec.encode_meta(self.chain_id, self.height, self.time_ms, self.validators, self.accounts.items(),
                               self.lease_ms)
        users = (b.section_bytes("users", lambda: sec.encode_users(b.users[k] for k in sorted(b.users)))
                 if not self.users.changes else sec.encode_users(v for _, v in self.users.items()))
        models = (b.section_bytes("models", lambda: sec.encode_models(b.models[k] for k in sorted(b.models)))
                  if not self.models.changes else sec.encode_models(v for _, v in self.models.items()))
        epochs = sec.encode_epochs(self.epochs)
        return {"meta": meta, "users": users, "models": models, "epochs": epochs}

    def section_hashes(self) -> dict[str, bytes]:
        return {name: sec.section_hash(data) for name, data in self.section_bytes().items()}

    def app_hash(self) -> bytes:
        return app_hash_of(self.section_hashes())

    def directory_value(self) -> bytes:
        data = self.section_bytes()
        return sec.encode_directory(self.height, data["users"], data["models"], sec.section_hash(data["meta"]),
                                    sec.section_hash(data["epochs"]))

    # ------------------------------------------------------------------ transactions

    def is_validator(self, public_key: bytes) -> bool:
        return any(k == public_key for k, _ in self.validators)

    def deliver(self, raw: bytes) -> TxResult:
        """Check and apply one transaction; a failed one changes nothing."""
        try:
            tx = decode_tx(raw, self.chain_id)
            self._check(tx)
        except TxError as exc:
            return TxResult(code=exc.code, log=str(exc))
        self._apply(tx)
        return TxResult(code=CODE_OK, log="ok",
                        events=(("kind", tx.kind), ("node_id", tx.node_id.hex()), ("sequence", str(tx.sequence))))

    def _check(self, tx: Tx) -> None:
        last = self.accounts.get(tx.signer) or 0
        if tx.sequence <= last:
            raise TxError(CODE_REPLAY, f"sequence {tx.sequence} already used: the signer's last sequence is {last}")
        if tx.kind in COMMITTEE_KINDS and not self.is_validator(tx.signer):
            raise TxError(CODE_UNAUTHORIZED, f"{tx.kind} may only be signed by a committee member")
        if tx.kind in EPOCH_KINDS:  # --- verification epochs (verifier.epochs.rules)
            from verifier.epochs import rules as epoch_rules

            self._next_epochs = epoch_rules.next_section(self, tx)
            return
        if tx.kind == "renew_lease":
            if self.users.get(tx.node_id) is None and self.models.get(tx.node_id) is None:
                raise TxError(CODE_NOT_REGISTERED, f"node {tx.node_id.hex()[:16]} has no registration to renew")
            return
        table = self.users if tx.kind.endswith("_user") else self.models
        exists = table.get(tx.node_id) is not None
        if tx.kind.startswith("register_") and exists:
            raise TxError(CODE_ALREADY_REGISTERED, f"node {tx.node_id.hex()[:16]} is already registered; "
                                                   f"use update_{tx.kind.split('_', 1)[1]}")
        if not tx.kind.startswith("register_") and not exists:
            raise TxError(CODE_NOT_REGISTERED, f"node {tx.node_id.hex()[:16]} is not registered")
        if isinstance(tx.payload, (UserInfo, ModelInfo)):
            self._check_address(tx.payload.address, (_table_name(tx.kind), tx.node_id))

    def _check_address(self, address: str, me: Holder) -> None:
        holder = self.addresses.get(address)
        if holder is None or holder == me:
            return
        record = (self.users if holder[0] == "user" else self.models).get(holder[1])
        until = ""
        if record is not None and record.expires_ms:
            until = f" until it deregisters or its lease ends ({(record.expires_ms - self.time_ms) / 1000:.0f} s)"
        raise TxError(CODE_ADDRESS_TAKEN, f"address {address} is registered by {holder[0]} node "
                                          f"{holder[1].hex()[:16]}{until}; one address, one node")

    def _apply(self, tx: Tx) -> None:
        """The verification epochs adds its epoch / reputation kinds here: they change `self.epochs` (a new
        EpochsSection) and `self.models` (records rebuilt with `dataclasses.replace`)."""
        self.accounts.set(tx.signer, tx.sequence)
        node_id = tx.node_id
        expires = self.time_ms + self.lease_ms if self.lease_ms else 0
        if tx.kind in ("register_user", "update_user"):
            info = tx.payload
            assert isinstance(info, UserInfo)
            old = self.users.get(node_id)
            self._put("user", UserRecord(
                node_id=node_id, public_key=tx.signer, address=info.address, onion_key=info.onion_key,
                tls_cert_pem=info.tls_cert_pem, region=info.region,
                registered_height=old.registered_height if old else self.height, updated_height=self.height,
                expires_ms=expires), old)
        elif tx.kind in ("register_model", "update_model"):
            info = tx.payload
            assert isinstance(info, ModelInfo)
            old_m = self.models.get(node_id)
            if old_m is None:  # a key the committee scored before resumes its standing
                from verifier.epochs.rules import standing_of

                reputation, trusted = standing_of(self.epochs, node_id) or (
                    REPUTATION.initial_reputation, REPUTATION.initial_reputation >= REPUTATION.untrusted_below)
                record = ModelRecord(
                    node_id=node_id, public_key=tx.signer, address=info.address, model=info.model,
                    capacity=info.capacity, tls_cert_pem=info.tls_cert_pem, reputation=reputation,
                    trusted=trusted, registered_height=self.height,
                    updated_height=self.height, onion_key=info.onion_key, expires_ms=expires)
            else:  # an update keeps reputation and trust: they are the committee's, not the node's
                record = replace(old_m, address=info.address, model=info.model, capacity=info.capacity,
                                 tls_cert_pem=info.tls_cert_pem, onion_key=info.onion_key,
                                 updated_height=self.height, expires_ms=expires)
            self._put("model", record, old_m)
        elif tx.kind == "renew_lease":
            for table in (self.users, self.models):
                current = table.get(node_id)
                if current is not None:
                    table.set(node_id, replace(current, expires_ms=expires))  # type: ignore[arg-type]
        elif tx.kind == "deregister_user":
            self._remove("user", node_id)
        elif tx.kind == "deregister_model":
            self._remove("model", node_id)
        elif tx.kind in EPOCH_KINDS:  # the section _check computed
            self.epochs = self._next_epochs
        else:  # decode_tx only lets known kinds through
            raise AssertionError(tx.kind)

    def _put(self, kind: str, record: UserRecord | ModelRecord, old: UserRecord | ModelRecord | None) -> None:
        """Store a user or model record and keep the address index in step."""
        table = self.users if kind == "user" else self.models
        if old is not None and old.address != record.address:
            self.addresses.delete(old.address)
        table.set(record.node_id, record)  # type: ignore[arg-type]
        self.addresses.set(record.address, (kind, record.node_id))

    def _remove(self, kind: str, node_id: bytes) -> None:
        table = self.users if kind == "user" else self.models
        old = table.get(node_id)
        if old is not None:
            table.delete(node_id)
            if self.addresses.get(old.address) == (kind, node_id):
                self.addresses.delete(old.address)

    def expire_leases(self) -> list[bytes]:
        """Remove every record whose lease ended by this block's time; their node ids."""
        if not self.lease_ms:
            return []
        gone = []
        for kind, table in (("user", self.users), ("model", self.models)):
            ended = [k for k, r in _live_items(table) if 0 < r.expires_ms <= self.time_ms]
            for node_id in sorted(ended):
                self._remove(kind, node_id)
                gone.append(node_id)
        return gone

    def end_block(self, block_hash: bytes) -> None:
        """After a block's txs: leases that ended, then verification epochs (deadlines,
        reputation updates, the next epoch)."""
        from verifier.epochs import rules as epoch_rules

        self.expire_leases()
        epoch_rules.end_block(self, block_hash)

    # ------------------------------------------------------------------ folding into the base

    def fold_into_base(self) -> None:
        """Make this view the committed state (after the store has written it)."""
        b = self.base
        b.chain_id, b.height, b.time_ms, b.lease_ms = self.chain_id, self.height, self.time_ms, self.lease_ms
        b.validators, b.epochs = self.validators, self.epochs
        for overlay, table, name in ((self.users, b.users, "users"), (self.models, b.models, "models"),
                                     (self.accounts, b.accounts, "accounts"),
                                     (self.addresses, b.addresses, "addresses")):
            if overlay.changes:
                b.invalidate(name)
            for key, value in overlay.effective_changes().items():
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value  # type: ignore[index]
            overlay.changes = {}


def _table_name(kind: str) -> str:
    return "user" if kind.endswith("_user") else "model"


def _live_items(table: Overlay) -> Iterator[tuple]:
    """(key, value) of every live item, unsorted (a scan over the committed records and this
    view's changes, without sorting the whole table as `Overlay.items` does)."""
    for key, value in table.base.items():
        if key not in table.changes:
            yield key, value
    for key, value in table.changes.items():
        if value is not _DELETED:
            yield key, value


assert SECTIONS == ("meta", "users", "models", "epochs")
