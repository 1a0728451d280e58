"""The contract between the consensus engine and the replicated application (ABCI 2.0).

The embedded Tendermint engine (verifier.consensus) and the CometBFT socket server
(verifier.abci.socket_server) both drive an `Application` through exactly these calls, with
CometBFT v0.38 semantics, so the application cannot tell which engine runs it:

    info -> (init_chain on an empty store) -> for each height:
        prepare_proposal (proposer only) / process_proposal (everyone)
        finalize_block (decided block) -> commit (persist; app_hash becomes durable)
    check_tx for the mempool at any time, query at any time (against committed state).

Rules both sides rely on:
- Everything is deterministic in (committed state, block): no clocks, no randomness, no I/O
  other than the application's own store, written only in `commit`.
- `finalize_block` returns the app hash of the state *after* the block; Tendermint puts it in
  the header of the next block (`last_app_hash`), so the commit of block H+1 certifies the
  state after block H. A directory proof therefore is: query value at height H, the header of
  block H+1 and the commit (> 2/3 precommits) of block H+1 (see `DirectoryProof`).
- App hash = SHA-256 of a domain and the state's part hashes in `SECTIONS` order: the meta
  and epochs sections by SHA-256 of their canonical encodings, the registry by the root of its
  Merkle treap (gentorrent.ledger.sections, gentorrent.ledger.authtree). A query about the
  registry returns a proof of the tree entries it shows plus the other parts' hashes, so a
  light client recomputes the app hash from the reply alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from gentorrent.ledger.sections import SECTIONS, app_hash_of  # noqa: F401  (the app-hash contract)

CODE_OK = 0


@dataclass(frozen=True)
class ValidatorInfo:
    public_key: bytes  # Ed25519, 32 bytes
    power: int


@dataclass(frozen=True)
class InfoResult:
    last_block_height: int
    last_block_app_hash: bytes
    app_version: int = 1


@dataclass(frozen=True)
class TxResult:
    code: int
    log: str = ""
    events: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.code == CODE_OK


@dataclass(frozen=True)
class BlockContext:
    """What the engine tells the app about the block being proposed, checked or executed."""

    height: int
    time_ms: int
    proposer: bytes  # proposer's Ed25519 public key
    hash: bytes = b""  # block hash (empty in prepare_proposal)
    misbehavior: tuple[bytes, ...] = ()  # public keys of validators caught equivocating


@dataclass(frozen=True)
class FinalizeResult:
    tx_results: tuple[TxResult, ...]
    app_hash: bytes
    validator_updates: tuple[ValidatorInfo, ...] = ()


@dataclass(frozen=True)
class QueryResult:
    code: int
    value: bytes = b""
    height: int = 0
    log: str = ""


class Application(Protocol):
    def info(self) -> InfoResult: ...

    def init_chain(self, chain_id: str, validators: Sequence[ValidatorInfo], app_state: bytes,
                   time_ms: int) -> bytes:
        """Genesis; returns the initial app hash."""

    def check_tx(self, tx: bytes) -> TxResult: ...

    def prepare_proposal(self, txs: Sequence[bytes], max_tx_bytes: int, ctx: BlockContext) -> list[bytes]: ...

    def process_proposal(self, txs: Sequence[bytes], ctx: BlockContext) -> bool: ...

    def finalize_block(self, txs: Sequence[bytes], ctx: BlockContext) -> FinalizeResult: ...

    def commit(self) -> int:
        """Persist the finalized state; returns retain_height (0 = keep all blocks)."""

    def query(self, path: str, data: bytes, height: int = 0) -> QueryResult: ...
