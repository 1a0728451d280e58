"""The committee's replicated application: the registry of users and model nodes (ABCI 2.0).

CometBFT v0.38 semantics (see verifier.abci.interface). The app keeps three views of state:
the committed one (on disk, what Query and Info answer from), the block being finalized
(made durable by Commit), and the mempool's CheckTx view (committed state plus the
transactions the mempool has accepted since, so a duplicate or replay is refused before it
reaches a block; reset at each Commit, after which CometBFT rechecks its mempool).

Everything is a function of (committed state, block): time comes from the BlockContext,
SQLite is written only in Commit and InitChain, and nothing else is read or written.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from verifier.abci.interface import (CODE_OK, BlockContext, FinalizeResult, InfoResult, QueryResult, TxResult,
                                     ValidatorInfo)
from gentorrent.ledger import catalogue, queries
from gentorrent.ledger.authtree import Tree
from gentorrent.ledger.chain_params import ChainParams
from gentorrent.ledger.signed_tx import TxError
from gentorrent.ledger.txs import VerifiedTxs
from gentorrent.ledger.sections import LOCAL_MODELS, LOCAL_USERS, encode, encode_models, encode_users
from verifier.abci import committee as committee_rules
from verifier.abci.state import CommittedState, StateView
from verifier.abci.store import Store

__all__ = ["RegistryApp", "APP_VERSION", "CODE_NOT_FOUND", "CODE_UNKNOWN_PATH", "CODE_BAD_HEIGHT", "CODE_BAD_QUERY",
           "CODE_NOT_INITIALIZED"]

APP_VERSION = 1
# Query codes (tx codes are in gentorrent.ledger.txs). Stable: never renumber.
CODE_NOT_FOUND = 20
CODE_UNKNOWN_PATH = 21
CODE_BAD_HEIGHT = 22  # only the latest committed state is kept
CODE_BAD_QUERY = 23
CODE_NOT_INITIALIZED = 24
#: committed heights whose registry tree is kept for proven queries (a proof of height H needs
#: the header of H+1, so the newest one cannot be proved yet; trees share their nodes)
SNAPSHOTS_KEPT = 4
#: per-tx framing overhead CometBFT counts against max_tx_bytes (field tag + length varint)
_TX_FRAME_OVERHEAD = 1 + 10

_HEX_ID = re.compile(r"[0-9a-f]{64}")
F = TypeVar("F", bound=Callable)


def _serialized(method: F) -> F:
    """One call at a time: a node shell may answer queries from another thread than the one
    that commits, and the views and the SQLite connection are not safe to share mid-call."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class AppError(RuntimeError):
    """The engine called the app out of order (an engine bug, not bad input)."""


class RegistryApp:
    """interface.Application over an SQLite store at `db_path`."""

    def __init__(self, db_path: Path):
        self._lock = threading.RLock()
        self._store = Store(Path(db_path))
        self._committed, self._app_hash = self._store.load()
        self._pending: tuple[StateView, bytes] | None = None
        self._verified = VerifiedTxs()  # what CheckTx verified, FinalizeBlock does not verify again
        self._mempool = StateView(self._committed, self._verified)
        #: height -> (registry tree, meta hash, epochs hash) of recent committed states
        self._snapshots: dict[int, tuple[Tree, bytes, bytes, bytes]] = {}  # height -> tree, meta and epochs hashes, meta
        if self._committed.initialized:
            self._snapshot(StateView(self._committed))

    @_serialized
    def close(self) -> None:
        self._store.close()

    # ------------------------------------------------------------------ lifecycle

    @_serialized
    def info(self) -> InfoResult:
        return InfoResult(last_block_height=self._committed.height, last_block_app_hash=self._app_hash,
                          app_version=APP_VERSION)

    @_serialized
    def validators(self) -> tuple[ValidatorInfo, ...]:
        """The committee as of the last committed block."""
        return tuple(ValidatorInfo(k, p) for k, p in self._committed.validators)

    @_serialized
    def init_chain(self, chain_id: str, validators: Sequence[ValidatorInfo], app_state: bytes,
                   time_ms: int) -> bytes:
        if self._committed.initialized and self._committed.height > 0:
            raise AppError(f"init_chain on a store already at height {self._committed.height}")
        if not chain_id:
            raise ValueError("chain_id must not be empty")
        if not validators or any(len(v.public_key) != 32 or v.power <= 0 for v in validators):
            raise ValueError("init_chain needs validators with 32-byte Ed25519 keys and positive power")
        params, listed = _genesis_state(app_state)
        fresh = CommittedState()
        view = StateView(fresh)
        view.chain_id, view.height, view.time_ms, view.params = chain_id, 0, time_ms, params
        view.catalogue = tuple(listed)
        view.validators = tuple(sorted((bytes(v.public_key), int(v.power)) for v in validators))
        app_hash = view.app_hash()
        self._store.write(view, app_hash, replace_all=True)
        view.fold_into_base()
        fresh.initialized = True
        self._committed, self._app_hash = fresh, app_hash
        self._pending = None
        self._mempool = StateView(fresh, self._verified)
        self._snapshots = {}
        self._snapshot(StateView(fresh))
        return app_hash

    # ------------------------------------------------------------------ mempool

    @_serialized
    def check_tx(self, tx: bytes) -> TxResult:
        if not self._committed.initialized:
            return TxResult(code=CODE_NOT_INITIALIZED, log="the chain is not initialized")
        return self._mempool.deliver(tx)

    # ------------------------------------------------------------------ proposals

    @_serialized
    def prepare_proposal(self, txs: Sequence[bytes], max_tx_bytes: int, ctx: BlockContext) -> list[bytes]:
        """The valid transactions, in mempool order, that fit: an honest proposal never
        carries a transaction that ProcessProposal would reject."""
        view = self._block_view(ctx)
        chosen: list[bytes] = []
        used = 0
        for tx in txs:
            size = len(tx) + _TX_FRAME_OVERHEAD
            if 0 <= max_tx_bytes < used + size:
                continue
            if view.deliver(tx).code == CODE_OK:
                chosen.append(tx)
                used += size
        return chosen

    @_serialized
    def process_proposal(self, txs: Sequence[bytes], ctx: BlockContext) -> bool:
        """Accept only blocks whose every transaction applies (deterministic on every node)."""
        try:
            view = self._block_view(ctx)
        except AppError:
            return False
        return all(view.deliver(tx).code == CODE_OK for tx in txs)

    @_serialized
    def finalize_block(self, txs: Sequence[bytes], ctx: BlockContext) -> FinalizeResult:
        view = self._block_view(ctx)
        committee_rules.punish(view, ctx.misbehavior, ctx.height)  # (proven double signers leave)
        results = tuple(view.deliver(tx) for tx in txs)
        view.end_block(ctx.hash)  # verification epochs: verification epochs advance with block time
        updates = committee_rules.end_block(view)
        app_hash = view.app_hash()
        self._pending = (view, app_hash)  # a second finalize of the same height replaces it
        return FinalizeResult(tx_results=results, app_hash=app_hash,
                              validator_updates=tuple(ValidatorInfo(k, p) for k, p in updates))

    @_serialized
    def commit(self) -> int:
        if self._pending is None:
            raise AppError("commit without a finalized block")
        view, app_hash = self._pending
        self._store.write(view, app_hash)
        view.fold_into_base()
        self._app_hash = app_hash
        self._pending = None
        self._mempool = StateView(self._committed, self._verified)
        self._snapshot(StateView(self._committed))
        return 0

    def _snapshot(self, view: StateView) -> None:
        meta = view.meta_bytes()  # (kept: a queries.Members answer carries it)
        hashes = view.section_hashes(meta)  # a view without changes: its tree is the committed one
        self._snapshots[view.height] = (view.base.tree, hashes["meta"], hashes["epochs"], meta)
        for old in sorted(self._snapshots)[:-SNAPSHOTS_KEPT]:
            del self._snapshots[old]

    def _block_view(self, ctx: BlockContext) -> StateView:
        c = self._committed
        if not c.initialized:
            raise AppError("no block before init_chain")
        if ctx.height != c.height + 1:  # the chain starts at height 1 (CometBFT initial_height "1")
            raise AppError(f"block height {ctx.height} does not follow committed height {c.height}")
        view = StateView(c, self._verified)
        view.height, view.time_ms = ctx.height, ctx.time_ms
        view.registrations_left = c.params.registry.registrations_per_block or None
        committee_rules.start_block(view)  # (the committee signing this block)
        return view

    # ------------------------------------------------------------------ queries

    @_serialized
    def query(self, path: str, data: bytes = b"", height: int = 0) -> QueryResult:
        c = self._committed
        if not c.initialized:
            return QueryResult(code=CODE_NOT_INITIALIZED, log="the chain is not initialized")
        if height not in (0, c.height) and not (path.startswith(queries.PREFIX) and height in self._snapshots):
            return QueryResult(code=CODE_BAD_HEIGHT, height=c.height,
                               log=f"height {height} is not kept: proven queries answer for heights "
                                   f"{sorted(self._snapshots)}, the others for {c.height} only")
        if path.startswith(queries.PREFIX):
            return self._proven(path, data, height or c.height)
        parts = path.strip("/").split("/")
        if path == LOCAL_MODELS:  # this verifier's own reads (never answered to the network)
            return QueryResult(code=CODE_OK, value=encode_models(m for _, m in sorted(c.models.items())),
                               height=c.height)
        if path == LOCAL_USERS:
            return QueryResult(code=CODE_OK, value=encode_users(u for _, u in sorted(c.users.items())),
                               height=c.height)
        if path == "/info":
            return QueryResult(code=CODE_OK, value=self._info_json(), height=c.height)
        if path == "/epochs":  # verification epochs: the epochs section (EpochsSection) as committed
            return QueryResult(code=CODE_OK, value=encode(c.epochs), height=c.height)
        if path == "/params":  # the rules' parameters the genesis fixed (chain_params.ChainParams, JSON)
            return QueryResult(code=CODE_OK, value=c.params.encode(), height=c.height)
        if path == "/committee":  # who signs the next block, pending changes, added cards, removals
            return QueryResult(code=CODE_OK, value=json.dumps(committee_rules.to_json(c), sort_keys=True).encode(),
                               height=c.height)
        if path == "/catalogue":  # the model catalogue, JSON (operators, gt-verifier catalogue list)
            return QueryResult(code=CODE_OK, height=c.height,
                               value=json.dumps([catalogue.as_json(e) for e in c.catalogue]).encode())
        if len(parts) == 2 and parts[0] in ("user", "model", "account"):
            if not _HEX_ID.fullmatch(parts[1]):
                return QueryResult(code=CODE_BAD_QUERY, height=c.height,
                                   log=f"/{parts[0]}/<id> needs 64 lower-case hex digits")
            key = bytes.fromhex(parts[1])
            if parts[0] == "account":  # the sequence a client must exceed with its next tx, and its lease
                account = c.accounts.get(key)
                body = {"last_sequence": account.last_sequence if account else 0,
                        "lease_expires_ms": account.lease_expires_ms if account else 0}
                return QueryResult(code=CODE_OK, value=json.dumps(body).encode(), height=c.height)
            record = (c.users if parts[0] == "user" else c.models).get(key)
            if record is None:
                return QueryResult(code=CODE_NOT_FOUND, height=c.height, log=f"no {parts[0]} {parts[1][:16]}…")
            return QueryResult(code=CODE_OK, value=encode(record.to_pb()), height=c.height)
        return QueryResult(code=CODE_UNKNOWN_PATH, height=c.height,
                           log=f"unknown query path {path[:64]!r}; known: {queries.PREFIX}..., /info, /epochs, "
                               "/params, /committee, /catalogue, /user/<id>, /model/<id>, /account/<public key>")

    def _proven(self, path: str, data: bytes, height: int) -> QueryResult:
        """A registry query answered with a proof of the tree at `height` (gentorrent.ledger.queries)."""
        try:
            query = queries.parse(path, data)
        except queries.QueryError as exc:
            return QueryResult(code=CODE_BAD_QUERY, height=height, log=str(exc))
        tree, meta_hash, epochs_hash, meta = self._snapshots[height]
        return QueryResult(code=CODE_OK, height=height,
                           value=queries.encode_answer(height, meta_hash, epochs_hash, query.prove(tree),
                                                       meta if getattr(query, "reads_meta", False) else b""))

    @_serialized
    def proven_heights(self) -> list[int]:
        """The heights proven queries can be answered for now."""
        return sorted(self._snapshots)

    def _info_json(self) -> bytes:
        c = self._committed
        return json.dumps({
            "chain_id": c.chain_id, "height": c.height, "time_ms": c.time_ms, "app_hash": self._app_hash.hex(),
            "users": len(c.users), "models": len(c.models), "validators": len(c.validators),
            "app_version": APP_VERSION, "lease_ms": c.params.lease_ms,
        }, sort_keys=True).encode()


def _genesis_state(app_state: bytes) -> tuple[ChainParams, list]:
    """What a genesis app_state (empty, or a JSON object: no initial registrations yet) sets:
    the parameters of the rules (gentorrent.ledger.chain_params, the registry's rules among
    them) and the model catalogue it lists (gentorrent.ledger.catalogue)."""
    obj = {}
    if app_state.strip():
        try:
            obj = json.loads(app_state)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"app_state is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError("app_state must be a JSON object")
    try:  # (ChainParamsError is a ValueError)
        return ChainParams.from_app_state(obj), catalogue.entries_of_app_state(obj)
    except TxError as exc:
        raise ValueError(str(exc)) from exc
