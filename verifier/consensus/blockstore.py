"""Decided blocks and the commits that decided them, in one SQLite file.

A block is saved (with its commit) *before* the application executes it, so after a crash
the store is at most one block ahead of the application and the node replays that block
into the app on start (CometBFT's handshake). Catch-up (GetBlocks) and directory proofs read
from here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gentorrent.ledger.chain import MAX_VALIDATORS, Block, Commit, Reader, Writer

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks (
    height INTEGER PRIMARY KEY,
    hash BLOB NOT NULL,
    block BLOB NOT NULL,
    commit_ BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS validator_updates (
    height INTEGER PRIMARY KEY,
    updates BLOB NOT NULL
);
"""


class BlockStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT MAX(height) FROM blocks").fetchone()
        self.height = int(row[0] or 0)

    def save(self, block: Block, commit: Commit) -> None:
        if block.height != self.height + 1:
            raise ValueError(f"block {block.height} does not follow stored height {self.height}")
        self._db.execute("INSERT INTO blocks VALUES (?, ?, ?, ?)",
                         (block.height, block.hash(), block.encode(), commit.encode()))
        self.height = block.height

    def load(self, height: int) -> tuple[Block, Commit] | None:
        row = self._db.execute("SELECT block, commit_ FROM blocks WHERE height = ?", (height,)).fetchone()
        if row is None:
            return None
        return Block.decode(bytes(row[0])), Commit.decode(bytes(row[1]))

    def load_raw(self, height: int) -> tuple[bytes, bytes] | None:
        row = self._db.execute("SELECT block, commit_ FROM blocks WHERE height = ?", (height,)).fetchone()
        return (bytes(row[0]), bytes(row[1])) if row else None

    def save_updates(self, height: int, updates: tuple[tuple[bytes, int], ...]) -> None:
        """The validator updates FinalizeBlock returned for block `height` (saved before the
        application commits: a crash in between executes the block again, with the same ones)."""
        if updates:
            w = Writer(b"gt/valupdates/v1").u32(len(updates))
            for key, power in updates:
                w.blob(key).u64(power)
            self._db.execute("INSERT OR REPLACE INTO validator_updates VALUES (?, ?)", (height, w.done()))

    def all_updates(self) -> list[tuple[int, tuple[tuple[bytes, int], ...]]]:
        """Every non-empty (height, updates), by height (valsets.ValidatorHistory rebuilds from them)."""
        out = []
        for height, data in self._db.execute("SELECT height, updates FROM validator_updates ORDER BY height"):
            r = Reader(bytes(data), b"gt/valupdates/v1")
            updates = tuple((r.blob(32), r.u64()) for _ in range(r.count(MAX_VALIDATORS)))
            r.end()
            out.append((int(height), updates))
        return out

    def close(self) -> None:
        self._db.close()
