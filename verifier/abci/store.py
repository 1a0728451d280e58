"""The registry's durable store: one SQLite file, written only by Commit (and InitChain).

Each commit is one SQLite transaction that writes the rows a block changed plus the new
height and app hash, so the file always holds exactly one committed state: a crash before the
transaction commits leaves the previous state, which Info reports, and the engine replays the
block. On open the app hash is recomputed from the rows and compared with the stored one, so
a damaged or hand-edited store is refused instead of silently forking the node.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.chain_params import ChainParams
from gentorrent.ledger.sections import Account, ModelRecord, UserRecord, encode
from verifier.abci.committee import CommitteeBook
from verifier.abci.state import CommittedState, StateView

# 3: the app hash commits to the registry tree (accounts with their leases in a table) and the
# meta section holds the chain parameters, the committee's changes and the catalogue
SCHEMA_VERSION = "3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS users (node_id BLOB PRIMARY KEY, entry BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS models (node_id BLOB PRIMARY KEY, entry BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (public_key BLOB PRIMARY KEY, last_sequence INTEGER NOT NULL,
                                     lease_expires_ms INTEGER NOT NULL);
"""


class StoreError(RuntimeError):
    """The store on disk is unreadable or inconsistent."""


class Store:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)  # app serializes
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: every commit is atomic and survives a process crash; a power loss may
        # lose the last few commits, which is safe because Info then reports the lower height
        # and the engine replays those blocks from its own (fsynced) block store.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        version = self._kv("schema")
        if version is None:
            self._db.execute("INSERT INTO kv VALUES ('schema', ?)", (SCHEMA_VERSION.encode(),))
        elif version.decode() != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: store schema {version.decode()} is not {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def _kv(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    # ------------------------------------------------------------------ reading

    def load(self) -> tuple[CommittedState, bytes]:
        """The committed state and the app hash stored with it (b"" before InitChain)."""
        state = CommittedState()
        meta_raw = self._kv("meta")
        if meta_raw is None:
            return state, b""
        try:
            meta = pb.MetaSection.FromString(meta_raw)
            state.chain_id, state.height, state.time_ms = meta.chain_id, meta.height, meta.time_ms
            state.params = ChainParams.decode(meta.params)
            state.catalogue = tuple(meta.catalogue)
            state.validators = tuple((v.public_key, v.power) for v in meta.validators)
            state.committee = CommitteeBook.from_meta(meta)
            state.epochs = pb.EpochsSection.FromString(self._kv("epochs") or b"")
            for node_id, entry in self._db.execute("SELECT node_id, entry FROM users"):
                state.users[bytes(node_id)] = UserRecord.from_pb(pb.UserEntry.FromString(entry))
            for node_id, entry in self._db.execute("SELECT node_id, entry FROM models"):
                state.models[bytes(node_id)] = ModelRecord.from_pb(pb.ModelEntry.FromString(entry))
            for key, seq, lease in self._db.execute("SELECT public_key, last_sequence, lease_expires_ms FROM accounts"):
                state.accounts[bytes(key)] = Account(bytes(key), int(seq), int(lease))
            state.index_addresses()
            state.index_leases()
            state.build_tree()
        except Exception as exc:  # noqa: BLE001 - any decode failure means a damaged store
            raise StoreError(f"{self.path}: cannot read committed state: {exc}") from exc
        state.initialized = True
        app_hash = self._kv("app_hash") or b""
        recomputed = StateView(state).app_hash()
        if recomputed != app_hash:
            raise StoreError(f"{self.path}: stored app hash {app_hash.hex()} does not match the stored state "
                             f"({recomputed.hex()}); refusing to start on a damaged store")
        return state, app_hash

    # ------------------------------------------------------------------ writing

    def write(self, view: StateView, app_hash: bytes, replace_all: bool = False) -> None:
        """Persist `view` (its changes, or everything with `replace_all`) atomically."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if replace_all:
                for table in ("users", "models", "accounts"):
                    db.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
                users, models, accounts = (dict(o.items()) for o in (view.users, view.models, view.accounts))
            else:
                users = view.users.effective_changes()
                models = view.models.effective_changes()
                accounts = view.accounts.effective_changes()
            for node_id, rec in users.items():
                _put(db, "users", node_id, None if rec is None else encode(rec.to_pb()))
            for node_id, rec in models.items():
                _put(db, "models", node_id, None if rec is None else encode(rec.to_pb()))
            for key, account in accounts.items():
                db.execute("INSERT OR REPLACE INTO accounts VALUES (?, ?, ?)",
                           (key, account.last_sequence, account.lease_expires_ms))
            for key, value in (("meta", view.meta_bytes()), ("epochs", encode(view.epochs)),
                               ("app_hash", app_hash)):
                db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, value))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


def _put(db: sqlite3.Connection, table: str, key: bytes, value: bytes | None) -> None:
    if value is None:
        db.execute(f"DELETE FROM {table} WHERE node_id = ?", (key,))  # noqa: S608
    else:
        db.execute(f"INSERT OR REPLACE INTO {table} VALUES (?, ?)", (key, value))  # noqa: S608
