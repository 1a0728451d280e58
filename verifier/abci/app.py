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
from gentorrent.ledger.genesis import GenesisError, lease_ms_of
from gentorrent.ledger.sections import encode
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
        self._mempool = StateView(self._committed)

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
        lease_ms = _check_app_state(app_state)
        fresh = CommittedState()
        view = StateView(fresh)
        view.chain_id, view.height, view.time_ms, view.lease_ms = chain_id, 0, time_ms, lease_ms
        view.validators = tuple(sorted((bytes(v.public_key), int(v.power)) for v in validators))
        app_hash = view.app_hash()
        self._store.write(view, app_hash, replace_all=True)
        view.fold_into_base()
        fresh.initialized = True
        self._committed, self._app_hash = fresh, app_hash
        self._pending = None
        self._mempool = StateView(fresh)
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
        results = tuple(view.deliver(tx) for tx in txs)
        view.end_block(ctx.hash)  # verification epochs: verification epochs advance with block time
        app_hash = view.app_hash()
        self._pending = (view, app_hash)  # a second finalize of the same height replaces it
        return FinalizeResult(tx_results=results, app_hash=app_hash)

    @_serialized
    def commit(self) -> int:
        if self._pending is None:
            raise AppError("commit without a finalized block")
        view, app_hash = self._pending
        self._store.write(view, app_hash)
        view.fold_into_base()
        self._app_hash = app_hash
        self._pending = None
        self._mempool = StateView(self._committed)
        return 0

    def _block_view(self, ctx: BlockContext) -> StateView:
        c = self._committed
        if not c.initialized:
            raise AppError("no block before init_chain")
        if ctx.height != c.height + 1:  # the chain starts at height 1 (CometBFT initial_height "1")
            raise AppError(f"block height {ctx.height} does not follow committed height {c.height}")
        view = StateView(c)
        view.height, view.time_ms = ctx.height, ctx.time_ms
        return view

    # ------------------------------------------------------------------ queries

    @_serialized
    def query(self, path: str, data: bytes = b"", height: int = 0) -> QueryResult:
        c = self._committed
        if not c.initialized:
            return QueryResult(code=CODE_NOT_INITIALIZED, log="the chain is not initialized")
        if height not in (0, c.height):
            return QueryResult(code=CODE_BAD_HEIGHT, height=c.height,
                               log=f"only the latest committed height {c.height} can be queried")
        view = StateView(c)
        parts = path.strip("/").split("/")
        if path == "/directory":
            return QueryResult(code=CODE_OK, value=view.directory_value(), height=c.height)
        if path == "/info":
            return QueryResult(code=CODE_OK, value=self._info_json(), height=c.height)
        if path == "/epochs":  # verification epochs: the epochs section (EpochsSection) as committed
            return QueryResult(code=CODE_OK, value=encode(c.epochs), height=c.height)
        if len(parts) == 2 and parts[0] in ("user", "model", "account"):
            if not _HEX_ID.fullmatch(parts[1]):
                return QueryResult(code=CODE_BAD_QUERY, height=c.height,
                                   log=f"/{parts[0]}/<id> needs 64 lower-case hex digits")
            key = bytes.fromhex(parts[1])
            if parts[0] == "account":  # the sequence a client must exceed with its next tx
                seq = c.accounts.get(key, 0)
                return QueryResult(code=CODE_OK, value=json.dumps({"last_sequence": seq}).encode(), height=c.height)
            record = (c.users if parts[0] == "user" else c.models).get(key)
            if record is None:
                return QueryResult(code=CODE_NOT_FOUND, height=c.height, log=f"no {parts[0]} {parts[1][:16]}…")
            return QueryResult(code=CODE_OK, value=encode(record.to_pb()), height=c.height)
        return QueryResult(code=CODE_UNKNOWN_PATH, height=c.height,
                           log=f"unknown query path {path[:64]!r}; known: /directory, /info, /epochs, "
                               "/user/<id>, /model/<id>, /account/<public key>")

    def _info_json(self) -> bytes:
        c = self._committed
        return json.dumps({
            "chain_id": c.chain_id, "height": c.height, "time_ms": c.time_ms, "app_hash": self._app_hash.hex(),
            "users": len(c.users), "models": len(c.models), "validators": len(c.validators),
            "app_version": APP_VERSION, "lease_ms": c.lease_ms,
        }, sort_keys=True).encode()


def _check_app_state(app_state: bytes) -> int:
    """Genesis app_state must be empty or a JSON object (no initial registrations yet);
    returns the registration lease it sets (gentorrent.ledger.genesis.lease_ms_of)."""
    obj = {}
    if app_state.strip():
        try:
            obj = json.loads(app_state)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"app_state is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError("app_state must be a JSON object")
    try:
        return lease_ms_of(obj)
    except GenesisError as exc:
        raise ValueError(str(exc)) from exc
