"""The mempool and how its transactions spread to the other members (pure: no I/O).

A transaction a client hands to one member must reach the member that proposes next, whoever
that is. One forward at submit time is not enough: a member a block behind refuses what is valid
only one block on (an epoch's plan, the VRF proof of an epoch it has not opened yet: code 30,
seen routinely in the epoch tests), and a forward can time out on a busy member. The submitter
alone then holds the transaction, and it waits for a round that the submitter proposes and
that commits: CI saw a leader's plan never committed, its epoch stuck until the plan deadline
(stop 46). CometBFT's mempool reactor holds a transaction back from a peer until the peer
reaches the height it was checked at; this member does not track its peers' heights, so the
member that took the transaction from a client sends it again to each member that has not
taken it yet, once after every block it commits (a laggard has caught up by then), for a
bounded number of blocks.

`TxSpread` is that bookkeeping; the consensus node (node.py) sends a new transaction to every
peer at once and what `due` names after each block, through one sender per peer, in arrival
order (a signer's sequence S before S + 1: reordered, a peer's CheckTx would refuse S as a
replay). What it costs: nothing more while members keep up (each transaction is sent to each
peer once, as before); a refusal costs one more forward a block, at most `SPREAD_ROUNDS`, and
the pending set is bounded by the mempool (10,000 transactions).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from gentorrent.ledger.chain import sha256
from verifier.abci.interface import Application

#: blocks after the first forward during which a transaction is sent again to a member that has
#: not taken it (refused, unreachable): a lagging member catches up within a few blocks (a test
#: chain with fast timeouts commits ~20 empty blocks a second, so this is ~1.5 s there; 32 s or
#: more at the default pace, a commit_s of 1 s); one that still refuses after this many disagrees
SPREAD_ROUNDS = 32
#: one forward's wait for a peer's SubmitTx answer
FORWARD_TIMEOUT_S = 2.0


class Mempool:
    """Transactions CheckTx accepted, in arrival order, bounded in count."""

    def __init__(self, max_txs: int) -> None:
        self.max_txs = max_txs
        self._txs: OrderedDict[bytes, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._txs)

    def __contains__(self, tx_hash: bytes) -> bool:
        return tx_hash in self._txs

    def get(self, tx_hash: bytes) -> bytes | None:
        return self._txs.get(tx_hash)

    def add(self, tx: bytes) -> None:
        self._txs[sha256(tx)] = tx

    def full(self) -> bool:
        return len(self._txs) >= self.max_txs

    def batch(self, n: int) -> list[bytes]:
        out = []
        for tx in self._txs.values():
            if len(out) >= n:
                break
            out.append(tx)
        return out

    def remove(self, txs) -> None:
        for tx in txs:
            self._txs.pop(sha256(tx), None)

    def recheck(self, app: Application) -> None:
        """After a commit the app's CheckTx view restarts from the committed state."""
        for h, tx in list(self._txs.items()):
            if not app.check_tx(tx).ok:
                del self._txs[h]


class TxSpread:
    """Which members still lack each transaction this member took from a client, and for how
    many more rounds it is sent to them. Bounded by the mempool: a transaction that left it
    (committed, or no longer valid) is forgotten at the next round."""

    def __init__(self, rounds: int = SPREAD_ROUNDS) -> None:
        self.rounds = rounds
        self._pending: OrderedDict[bytes, tuple[set[bytes], int]] = OrderedDict()  # hash -> (peers, rounds left)

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, tx_hash: bytes, peers: Iterable[bytes]) -> None:
        """A client's transaction, just accepted: every peer lacks it (the caller sends it to
        each at once; `due` sends it again after each of the next `rounds` blocks)."""
        peers = set(peers)
        if peers:
            self._pending[tx_hash] = (peers, self.rounds)

    def taken(self, tx_hash: bytes, peer: bytes) -> None:
        """`peer` holds the transaction (accepted it, or had it already)."""
        entry = self._pending.get(tx_hash)
        if entry is None:
            return
        entry[0].discard(peer)
        if not entry[0]:
            del self._pending[tx_hash]

    def due(self, held: Callable[[bytes], bool]) -> dict[bytes, list[bytes]]:
        """One round after a block: per peer, in arrival order, the transactions to send it
        again. Those out of rounds, or no longer `held` (committed, or invalid now), are
        forgotten. O(transactions pending): once a block, never once a transaction."""
        out: dict[bytes, list[bytes]] = {}
        for tx_hash, (peers, left) in list(self._pending.items()):
            if left <= 0 or not held(tx_hash):
                del self._pending[tx_hash]
                continue
            self._pending[tx_hash] = (peers, left - 1)
            for peer in sorted(peers):
                out.setdefault(peer, []).append(tx_hash)
        return out
