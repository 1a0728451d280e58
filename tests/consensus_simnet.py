"""A seeded, virtual-time network of consensus drivers, for tests only.

Each simulated validator is the real pure core (Driver + HeightStateMachine + VoteKeeper),
the real signer (PrivValidator, in memory) and a tiny deterministic key-value application
(`KvHost`, a test fake). The network delays, drops, duplicates and reorders messages, can
partition the validators and crash/restart them; a crash loses the part of the write-ahead
log written after the last sync (the sync happens before every signature, as in the node).
A Byzantine validator sends conflicting signed votes and proposals to different peers.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from dataclasses import dataclass, field, replace

from gentorrent.config import CONSENSUS_FAST
from gentorrent.crypto.keys import Identity
from verifier.consensus.driver import (Broadcast, Decide, Driver, NeedBlock, Refused, StartTimer,
                                       TimeoutFired)
from verifier.consensus.privval import PrivValidator
from gentorrent.ledger.chain import (Block, Commit, CommitError, Proposal, Validator,
                                      ValidatorSet, Vote, make_block, verify_commit)

CHAIN = "sim-chain"


def identities(n: int, seed: int = 0) -> list[Identity]:
    return [Identity.from_seed(hashlib.sha256(f"val-{seed}-{i}".encode()).digest()) for i in range(n)]


class KvHost:
    """A deterministic toy application: txs are b"k=v"; app hash chains the block's txs."""

    def __init__(self, validators: ValidatorSet, me: int, clock) -> None:
        self.validators = validators
        self.me = me
        self.clock = clock
        self.height = 0
        self.app_hash = hashlib.sha256(b"genesis").digest()
        self.last_block_hash = b""
        self.last_commit: Commit | None = None
        self.last_time_ms = 0
        self.kv: dict[bytes, bytes] = {}
        self.mempool: list[bytes] = []

    def make_block(self, height, round_, evidence) -> Block:
        txs = tuple(self.mempool[:4])
        t = max(self.last_time_ms + 1, int(self.clock() * 1000))
        return make_block(CHAIN, height, t, self.validators[self.me].public_key, self.last_block_hash,
                          self.last_commit, txs, self.validators, self.app_hash, evidence)

    def validate_block(self, block: Block) -> bool:
        h = block.header
        if (h.height != self.height + 1 or h.chain_id != CHAIN or h.last_block_hash != self.last_block_hash
                or h.last_app_hash != self.app_hash or h.time_ms <= self.last_time_ms
                or h.validators_hash != self.validators.hash()
                or self.validators.index_of(h.proposer) is None):
            return False
        if any(b"=" not in tx for tx in block.txs):
            return False
        if self.height >= 1:
            try:
                verify_commit(block.last_commit, CHAIN, self.validators, self.height, self.last_block_hash)
            except (CommitError, AttributeError):
                return False
        return True

    def apply(self, block: Block, commit: Commit) -> None:
        for tx in block.txs:
            k, _, v = tx.partition(b"=")
            self.kv[k] = v
        self.app_hash = hashlib.sha256(self.app_hash + block.header.data_hash).digest()
        self.height = block.height
        self.last_block_hash = block.hash()
        self.last_commit = commit
        self.last_time_ms = block.header.time_ms
        done = set(block.txs)
        self.mempool = [tx for tx in self.mempool if tx not in done]


@dataclass
class SimNode:
    idx: int
    identity: Identity
    signer: PrivValidator
    host: KvHost
    driver: Driver | None = None
    wal: list = field(default_factory=list)
    wal_synced: int = 0
    store: dict[int, tuple[Block, Commit]] = field(default_factory=dict)
    alive: bool = True
    epoch: int = 0
    byzantine: bool = False
    catchup_pending: bool = False
    refused: list = field(default_factory=list)


@dataclass
class Faults:
    drop: float = 0.0
    duplicate: float = 0.0
    delay: tuple[float, float] = (0.001, 0.03)
    partitions: list[tuple[float, float, list[set[int]]]] = field(default_factory=list)
    crashes: list[tuple[float, int, float]] = field(default_factory=list)  # (at, node, down for)
    heal_at: float = 0.0  # drops/duplicates stop after this time
    byzantine: set[int] = field(default_factory=set)


class SimNet:
    def __init__(self, seed: int, faults: Faults, n: int = 4, powers: list[int] | None = None,
                 txs_per_node: int = 6) -> None:
        self.rng = random.Random(seed)
        self.faults = faults
        self.now = 0.0
        self._seq = itertools.count()
        self._events: list = []
        ids = identities(n, seed)
        self.validators = ValidatorSet([Validator(i.public_key, (powers or [1] * n)[k]) for k, i in enumerate(ids)])
        self.nodes: list[SimNode] = []
        for k, ident in enumerate(ids):
            node = SimNode(k, ident, PrivValidator(ident), KvHost(self.validators, k, lambda: self.now),
                           byzantine=k in faults.byzantine)
            node.signer.before_sign = (lambda node=node: setattr(node, "wal_synced", len(node.wal)))
            node.host.mempool = [f"n{k}-tx{j}=v{j}".encode() for j in range(txs_per_node)]
            self.nodes.append(node)
        self.decisions: dict[int, dict[int, bytes]] = {k: {} for k in range(n)}
        self.evidence_seen: set = set()
        self.signed: dict[tuple, set[bytes]] = {}  # honest (node, h, r, step) -> sign bytes sent
        for at, k, down in faults.crashes:
            self._push(at, "crash", k)
            self._push(at + down, "restart", k)
        for node in self.nodes:
            self._boot(node)
            self._push(0.5, "tick", node.idx)

    # -- plumbing

    def _push(self, at: float, kind: str, *args) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, args))

    def _connected(self, a: int, b: int) -> bool:
        for start, end, groups in self.faults.partitions:
            if start <= self.now < end:
                return any(a in g and b in g for g in groups)
        return True

    def _send(self, src: int, dst: int, kind: str, *payload) -> None:
        faulty = self.now < self.faults.heal_at
        if faulty and self.rng.random() < self.faults.drop:
            return
        copies = 2 if faulty and self.rng.random() < self.faults.duplicate else 1
        for _ in range(copies):
            lo, hi = self.faults.delay
            self._push(self.now + self.rng.uniform(lo, hi), kind, src, dst, *payload)

    def _boot(self, node: SimNode) -> None:
        node.driver = Driver(CHAIN, self.validators, node.idx, node.signer, node.host, CONSENSUS_FAST,
                             journal=node.wal.append)
        self._perform(node, node.driver.start_height(node.host.height + 1, replay=list(node.wal)))

    # -- effects

    def _perform(self, node: SimNode, effects) -> None:
        for e in effects:
            if not node.alive:
                return
            if isinstance(e, Broadcast):
                self._broadcast(node, e.message)
            elif isinstance(e, StartTimer):
                self._push(self.now + e.seconds, "timer", node.idx, node.epoch, e.step, e.height, e.round)
            elif isinstance(e, Decide):
                self._decide(node, e)
            elif isinstance(e, NeedBlock):
                if not node.catchup_pending:
                    node.catchup_pending = True
                    self._push(self.now + 0.05, "catchup", node.idx, node.epoch, e.height, e.peer)
            elif isinstance(e, Refused):
                node.refused.append(e)

    def _broadcast(self, node: SimNode, msg) -> None:
        if not self.nodes[msg.validator].byzantine:
            step = 1 if isinstance(msg, Proposal) else int(msg.type)
            self.signed.setdefault((msg.validator, msg.height, msg.round, step), set()).add(msg.sign_bytes(CHAIN))
        for peer in range(len(self.nodes)):
            if peer == node.idx or not self._connected(node.idx, peer):
                continue
            out = msg
            if node.byzantine and msg.validator == node.idx and self.rng.random() < 0.5:
                out = self._conflicting(node, msg)
            self._send(node.idx, peer, "msg", out)

    def _conflicting(self, node: SimNode, msg):
        """A Byzantine twin of `msg`: same step, other value, validly signed."""
        if isinstance(msg, Vote):
            other = bytes(self.rng.getrandbits(8) for _ in range(32)) if msg.block_hash else hashlib.sha256(b"x").digest()
            twin = replace(msg, block_hash=other, signature=b"")
        else:
            block = msg.block
            header = replace(block.header, time_ms=block.header.time_ms + 1 + self.rng.randrange(1000))
            twin = replace(msg, block=Block(header, block.txs, block.last_commit, block.evidence), signature=b"")
        return replace(twin, signature=node.identity.sign(twin.sign_bytes(CHAIN)))

    def _decide(self, node: SimNode, d: Decide) -> None:
        h = d.block.height
        node.store[h] = (d.block, d.commit)
        self.decisions[node.idx][h] = d.block.hash()
        for ev in d.block.evidence:
            self.evidence_seen.add(ev)
        node.host.apply(d.block, d.commit)
        node.driver.block_applied(d.block)
        node.wal.clear()  # EndHeight: the log restarts with the next height
        node.wal_synced = 0
        self._perform(node, node.driver.start_height(h + 1))

    # -- run

    def run(self, until: float, stop_height: int | None = None) -> None:
        while self._events and self._events[0][0] <= until:
            at, _, kind, args = heapq.heappop(self._events)
            self.now = at
            getattr(self, f"_on_{kind}")(*args)
            if stop_height and all(n.host.height >= stop_height for n in self.honest_nodes()):
                return

    def honest_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes if not n.byzantine]

    def _on_msg(self, src: int, dst: int, msg) -> None:
        node = self.nodes[dst]
        if not node.alive or not self._connected(src, dst):
            return
        node.wal.append(msg)
        self._perform(node, node.driver.on_message(msg))

    def _on_timer(self, k: int, epoch: int, step, height: int, round_: int) -> None:
        node = self.nodes[k]
        if not node.alive or node.epoch != epoch:
            return
        ev = TimeoutFired(step, height, round_)
        if height == node.driver.height:
            node.wal.append(ev)
        self._perform(node, node.driver.on_timeout(step, height, round_))

    def _on_tick(self, k: int) -> None:
        node = self.nodes[k]
        if node.alive:
            self._perform(node, node.driver.rebroadcast())
        self._push(self.now + 0.5, "tick", k)

    def _on_catchup(self, k: int, epoch: int, height: int, peer: int | None) -> None:
        node = self.nodes[k]
        node.catchup_pending = False
        if not node.alive or node.epoch != epoch or node.host.height >= height:
            return
        candidates = [peer] if peer is not None else [p for p in range(len(self.nodes)) if p != k]
        src = self.rng.choice(candidates)
        if self.nodes[src].alive and node.host.height + 1 in self.nodes[src].store and self._connected(k, src):
            block, commit = self.nodes[src].store[node.host.height + 1]
            self._send(src, k, "block", block, commit)

    def _on_block(self, src: int, dst: int, block: Block, commit: Commit) -> None:
        node = self.nodes[dst]
        if node.alive:
            self._perform(node, node.driver.on_decided_block(block, commit))

    def _on_crash(self, k: int) -> None:
        node = self.nodes[k]
        node.alive = False
        node.epoch += 1
        del node.wal[node.wal_synced:]  # what was not synced is lost
        node.driver = None

    def _on_restart(self, k: int) -> None:
        node = self.nodes[k]
        node.alive = True
        node.catchup_pending = False
        self._boot(node)

    # -- checks

    def assert_agreement(self) -> None:
        """No two honest validators decided different blocks at one height."""
        by_height: dict[int, set[bytes]] = {}
        for node in self.honest_nodes():
            for h, bh in self.decisions[node.idx].items():
                by_height.setdefault(h, set()).add(bh)
        forks = {h: s for h, s in by_height.items() if len(s) > 1}
        assert not forks, f"fork at heights {sorted(forks)}"

    def assert_no_double_sign(self) -> None:
        """No honest validator ever sent two different signed messages for one step."""
        doubles = [k for k, v in self.signed.items() if len(v) > 1]
        assert not doubles, f"double signing at {doubles[:5]}"

    def assert_every_height_decided(self, upto: int) -> None:
        for node in self.honest_nodes():
            missing = [h for h in range(1, upto + 1) if h not in self.decisions[node.idx]]
            assert not missing, f"node {node.idx} never decided heights {missing[:10]}"

    def min_honest_height(self) -> int:
        return min(n.host.height for n in self.honest_nodes())
