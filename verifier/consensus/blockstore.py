"""Decided blocks and the commits that decided them, in one SQLite file.

A block is saved (with its commit) *before* the application executes it, so after a crash
the store is at most one block ahead of the application and the node replays that block
into the app on start (CometBFT's handshake). Catch-up (GetBlocks) and directory proofs read
from here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gentorrent.ledger.chain import Block, Commit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks (
    height INTEGER PRIMARY KEY,
    hash BLOB NOT NULL,
    block BLOB NOT NULL,
    commit_ BLOB NOT NULL
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

    def close(self) -> None:
        self._db.close()
