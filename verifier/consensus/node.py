"""The consensus node: the async shell around the pure consensus core.

It owns everything of consensus with side effects: per-peer pinned channels and the ordered
stream of consensus messages to each, timers, the write-ahead log, the signer's state file, the
block store, the mempool, block sync, and the application it drives, which it knows only as
`verifier.abci.interface.Application` (the composition root, verifier/node.py, hands it the
registry application and serves its RPCs). All consensus work runs on the event loop thread: a
driver call and the effects it returns are performed without an `await` in between, so the core
never sees interleaved inputs.

Start-up (CometBFT's handshake): InitChain on an empty application; replay into the app the
blocks the store holds beyond the app's height (a crash between saving a block and committing
it); then enter the next height, replaying that height's inputs from the WAL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gentorrent import failpoints
from gentorrent.config import WIRE
from gentorrent.crypto.keys import Identity
from gentorrent.crypto.tls import pinned_channel
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from verifier.abci.interface import Application, BlockContext, ValidatorInfo
from verifier.consensus.blockstore import BlockStore
from verifier.consensus.boots import boot_state_seq
from verifier.consensus.driver import (Broadcast, Decide, Driver, NeedBlock, Refused, SendTo, StartTimer,
                                       TimeoutFired, within_drift)
from verifier.consensus.gossip import RoundState, decode_payload, encode_payload
from verifier.consensus.home import DATA_DIR, NodeConfig
from verifier.consensus.mempool import FORWARD_TIMEOUT_S, Mempool, TxSpread
from verifier.consensus.privval import PrivValidator
from verifier.consensus.valsets import ValidatorHistory
from gentorrent.ledger.chain import (Block, Commit, DecodeError,
                                      Evidence, make_block, sha256, verify_commit)
from verifier.consensus.wal import WriteAheadLog
from gentorrent.ledger.genesis import Genesis, GenesisValidator
from gentorrent.ledger.light_client import TrustAnchor

log = logging.getLogger(__name__)

CODE_MEMPOOL_FULL = 90  # node-level SubmitTx refusals (the app's codes are below 64)
CODE_IN_MEMPOOL = 91
CODE_OVERSIZE = 2  # same meaning as gentorrent.ledger.txs.CODE_OVERSIZE
BLOCKS_PER_SYNC_CALL = 100
PEER_QUEUE = 4096
FORWARDED_KEY = "x-gt-forwarded"  # SubmitTx metadata: a transaction a peer forwarded (not forwarded again)


class AppHashMismatch(RuntimeError):
    """This node's application disagrees with the committee: it must stop, not fork."""


# --------------------------------------------------------------------------- host


#: a node whose clock is behind finds every proposal early: say so once in a while, not each time
UNTIMELY_LOG_EVERY_S = 30.0


class ChainHost:
    """driver.Host over the application and the block store: builds and checks blocks."""

    def __init__(self, genesis: Genesis, app: Application, store: BlockStore, me_key: bytes,
                 mempool: Mempool, config: NodeConfig) -> None:
        self.genesis = genesis
        self.app = app
        self.store = store
        self.history = ValidatorHistory.load(genesis.validator_set(), store.all_updates())
        self.validators_at = self.history.at  # (driver.Host: the committee of each height)
        self.me_key = me_key
        self.mempool = mempool
        self.config = config
        self.height = 0
        self.last_block: Block | None = None
        self.last_commit: Commit | None = None
        self.app_hash = b""
        self.last_time_ms = genesis.genesis_time_ms
        self.max_clock_drift_ms = config.consensus_timeouts().max_clock_drift_ms
        self.untimely = 0  # live proposals this node prevoted nil for being ahead of its clock
        self._untimely_logged = float("-inf")

    def load_tip(self, app_hash: bytes) -> None:
        self.app_hash = app_hash
        self.height = self.store.height
        if self.height:
            self.last_block, self.last_commit = self.store.load(self.height)
            self.last_time_ms = self.last_block.header.time_ms

    def _ctx(self, height: int, time_ms: int, proposer: bytes, block_hash: bytes,
             evidence: tuple[Evidence, ...]) -> BlockContext:
        misbehaving = tuple(sorted({self.history.at(e.height)[e.validator].public_key
                                    for e in evidence}))
        return BlockContext(height=height, time_ms=time_ms, proposer=proposer, hash=block_hash,
                            misbehavior=misbehaving)

    def make_block(self, height: int, round_: int, evidence: tuple[Evidence, ...]) -> Block:
        time_ms = max(int(time.time() * 1000), self.last_time_ms + 1)
        ctx = self._ctx(height, time_ms, self.me_key, b"", evidence)
        txs = self.app.prepare_proposal(self.mempool.batch(self.config.max_block_txs),
                                        self.config.max_block_bytes, ctx)
        return make_block(self.genesis.chain_id, height, time_ms, self.me_key,
                          self.last_block.hash() if self.last_block else b"", self.last_commit,
                          tuple(txs), self.history.at(height), self.app_hash, evidence, self.history.at(height + 1))

    def timely(self, block: Block) -> bool:
        """A live proposal's time against this node's clock (prevote nil if too far ahead)."""
        now_ms = int(time.time() * 1000)
        if within_drift(block.header.time_ms, now_ms, self.max_clock_drift_ms):
            return True
        self.untimely += 1
        if time.monotonic() - self._untimely_logged >= UNTIMELY_LOG_EVERY_S:  # a slow clock: every proposal
            self._untimely_logged = time.monotonic()
            log.warning("proposal for height %d is %d ms ahead of this node's clock (bound %d ms): prevote nil "
                        "(%d such proposals so far; is this node's clock behind?)", block.height,
                        block.header.time_ms - now_ms, self.max_clock_drift_ms, self.untimely)
        return False

    def validate_block(self, block: Block) -> bool:
        h = block.header
        if h.chain_id != self.genesis.chain_id or h.height != self.height + 1:
            return False
        if h.last_block_hash != (self.last_block.hash() if self.last_block else b""):
            return False
        validators = self.history.at(h.height)
        if (h.last_app_hash != self.app_hash or h.validators_hash != validators.hash()
                or h.next_validators_hash != self.history.at(h.height + 1).hash()):
            return False
        if validators.index_of(h.proposer) is None or h.time_ms <= self.last_time_ms:
            return False
        if len(block.txs) > self.config.max_block_txs or sum(map(len, block.txs)) > self.config.max_block_bytes:
            return False
        if self.height:
            try:
                if block.last_commit is None:
                    return False
                verify_commit(block.last_commit, h.chain_id, self.history.at(self.height), self.height,
                              h.last_block_hash)
            except ValueError:
                return False
        elif block.last_commit is not None:
            return False
        ctx = self._ctx(h.height, h.time_ms, h.proposer, block.hash(), block.evidence)
        return self.app.process_proposal(block.txs, ctx)

    def apply(self, block: Block, commit: Commit, save: bool = True) -> None:
        """Execute a decided block: store it, FinalizeBlock, Commit."""
        failpoints.hit("verifier.before_apply")
        if block.header.last_app_hash != self.app_hash:
            raise AppHashMismatch(
                f"block {block.height} certifies app hash {block.header.last_app_hash.hex()[:16]}… after "
                f"block {block.height - 1}, this node computed {self.app_hash.hex()[:16]}…")
        if save:
            self.store.save(block, commit)
            failpoints.hit("verifier.after_save_block")
        h = block.header
        result = self.app.finalize_block(block.txs, self._ctx(h.height, h.time_ms, h.proposer, block.hash(),
                                                              block.evidence))
        failpoints.hit("verifier.after_finalize")
        updates = tuple((u.public_key, u.power) for u in result.validator_updates)
        if self.history.record(block.height, updates) is not None:  # (invalid updates stop the node here)
            log.info("committee changes from height %d: %d validator updates of block %d", block.height + 2,
                     len(updates), block.height)
        self.store.save_updates(block.height, updates)  # (before Commit: see BlockStore.save_updates)
        self.app.commit()
        failpoints.hit("verifier.after_commit")
        self.app_hash = result.app_hash
        self.height = block.height
        self.last_block, self.last_commit = block, commit
        self.last_time_ms = h.time_ms


# --------------------------------------------------------------------------- peers


@dataclass
class Peer:
    public_key: bytes
    name: str
    address: str
    channel: grpc.aio.Channel
    stub: rpc.VerifierStub
    queue: asyncio.Queue
    task: asyncio.Task | None = None
    last_ok: float = 0.0
    sent: int = 0
    failed: int = 0


@dataclass
class _Outbox:
    """The clients' transactions queued for one peer's sender (mempool.py: TxSpread), in
    arrival order, each once."""
    queued: dict[bytes, None] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


# --------------------------------------------------------------------------- node


class ConsensusNode:
    """One committee member's consensus over `app`: its own keys, its home's data directory,
    its peers from the genesis."""

    def __init__(self, home: Path, genesis: Genesis, identity: Identity, config: NodeConfig,
                 app: Application) -> None:
        self.home = Path(home)
        self.config = config
        self.genesis = genesis
        self.identity = identity
        self.validators = self.genesis.validator_set()
        self.me = self.validators.index_of(self.identity.public_key)
        self.timeouts = self.config.consensus_timeouts()
        data = self.home / DATA_DIR
        data.mkdir(parents=True, exist_ok=True)
        self.app = app
        self.store = BlockStore(data / "blocks.sqlite")
        self.wal = WriteAheadLog(data / "cs.wal")
        self.privval = PrivValidator(self.identity, data / "sign_state.json", before_sign=self.wal.sync)
        self.mempool = Mempool(self.config.max_mempool_txs)
        self.tx_spread = TxSpread()  # clients' transactions still to reach other members
        self._outboxes: dict[bytes, _Outbox] = {}  # peer key -> the transactions queued for it
        self.host = ChainHost(self.genesis, self.app, self.store, self.identity.public_key, self.mempool,
                              self.config)
        self.driver = Driver(self.genesis.chain_id, self.validators, self.me, self.privval, self.host,
                             self.timeouts, journal=self.wal.append, timely=self.host.timely,
                             state_signer=self.identity.sign, state_seq=boot_state_seq(data),
                             my_key=self.identity.public_key)
        self.gossip = {"states_sent": 0, "states_received": 0, "states_answered": 0, "relayed": 0,
                       "txs_forwarded": 0, "txs_refused_by_peers": 0, "tx_forwards_failed": 0}
        self._state_answered: dict[int, float] = {}  # validator -> when its last state was answered
        self.peers: dict[bytes, Peer] = {}  # public key -> the member's channel
        #: who a member is (address, certificate) by key: the genesis file's members, and those
        #: the chain added (the application's /committee cards)
        self.member_records = self._member_records
        self.committee_keys: set[bytes] = {v.public_key for v in self.validators}  # (updated in place)
        self.last_commit_time_ms = 0
        self.commit_log: deque[tuple[int, float, int]] = deque(maxlen=10_000)  # (height, t, n_txs)
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: list[asyncio.Task] = []
        self._catchup: asyncio.Task | None = None
        self._committed = asyncio.Event()  # set (and replaced) at every commit
        self._stopping = False
        self._halted: str | None = None
        self.halt_event = asyncio.Event()  # set when consensus halts: `gt-verifier start` then exits non-zero
        self._loop: asyncio.AbstractEventLoop | None = None
        self._height_started_at = time.monotonic()

    @property
    def halted(self) -> str | None:
        """Why consensus stopped on this node (an app hash mismatch, an app failure), or None."""
        return self._halted

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Handshake with the application (InitChain, replay), then consensus with the peers.
        The caller serves this node's RPCs (verifier/node.py) before peers call them."""
        self._loop = asyncio.get_running_loop()
        self._handshake()

    def connect(self) -> None:
        """Open the pinned channel to every member of the next two heights and enter the next height."""
        self._reconcile_peers()
        h = self.host.height + 1
        self._perform(self.driver.start_height(h, replay=self.wal.replay_from(h)))
        self._tasks.append(asyncio.create_task(self._ticker()))

    def _member_records(self) -> dict[bytes, GenesisValidator]:
        records = {v.public_key: v for v in self.genesis.validators}
        q = self.app.query("/committee", b"", 0)
        if q.code == 0:
            for card in json.loads(q.value)["cards"]:
                v = GenesisValidator.from_json(card)
                records[v.public_key] = v
        return records

    def committee_view(self) -> dict:
        """The committee signing the next block and the members removed, by name (status page,
        metrics): who was proven to double-sign is named here."""
        records = self.member_records()
        members = [{"name": records[v.public_key].name if v.public_key in records else "?",
                    "public_key": v.public_key.hex(), "power": v.power,
                    "address": records[v.public_key].address if v.public_key in records else ""}
                   for v in self.host.validators_at(self.host.height + 1)]
        q = self.app.query("/committee", b"", 0)
        removed = json.loads(q.value)["removed"] if q.code == 0 else []
        for r in removed:
            key = bytes.fromhex(r["public_key"])
            r["name"] = r["name"] or (records[key].name if key in records else key.hex()[:16])
        return {"members": members, "removed": removed}

    def _reconcile_peers(self) -> None:
        """Channels to the members of the next two heights' committees (what this node sends to
        and fetches from), opened for newcomers and closed for those who left both."""
        h = self.host.height
        wanted = {v.public_key for height in (h + 1, h + 2) for v in self.host.validators_at(height)}
        current = {v.public_key for v in self.host.validators_at(h + 1)}
        if current != self.committee_keys:  # (the epoch runner reads this set: who its peers are)
            self.committee_keys.clear()
            self.committee_keys.update(current)
        wanted.discard(self.identity.public_key)
        records = self.member_records()
        for key in sorted(wanted - set(self.peers)):
            v = records.get(key)
            if v is None:
                log.warning("member %s… has no known address yet: not dialled", key.hex()[:16])
                continue
            channel = pinned_channel(v.address, v.tls_cert_pem)
            peer = Peer(key, v.name, v.address, channel, rpc.VerifierStub(channel), asyncio.Queue(PEER_QUEUE))
            peer.task = asyncio.create_task(self._sender(peer))
            self.peers[key] = peer
        for key in sorted(set(self.peers) - wanted):
            peer = self.peers.pop(key)
            if peer.task:
                peer.task.cancel()
            self._tasks.append(asyncio.create_task(peer.channel.close()))

    async def stop(self) -> None:
        """Stop deciding: timers, the peers' senders, block sync (the files stay open: `close`)."""
        self._stopping = True
        for t in self._timers:
            t.cancel()
        tasks = (list(self._tasks) + [p.task for p in self.peers.values() if p.task]
                 + [b.task for b in self._outboxes.values() if b.task])
        if self._catchup:
            tasks.append(self._catchup)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        for p in self.peers.values():
            await p.channel.close()
        self.wal.close()
        self.privval.close()
        self.store.close()

    def _handshake(self) -> None:
        info = self.app.info()
        app_height, app_hash = info.last_block_height, info.last_block_app_hash
        if app_height == 0 and not app_hash:
            app_hash = self.app.init_chain(
                self.genesis.chain_id, [ValidatorInfo(v.public_key, v.power) for v in self.genesis.validators],
                self.genesis.app_state_bytes(), self.genesis.genesis_time_ms)
        if self.store.height < app_height:
            raise AppHashMismatch(f"the application is at height {app_height} but the block store only at "
                                  f"{self.store.height}; refusing to start on inconsistent data")
        self.host.app_hash = app_hash
        self.host.height = app_height
        if app_height:
            self.host.last_block, self.host.last_commit = self.store.load(app_height)
            self.host.last_time_ms = self.host.last_block.header.time_ms
        for h in range(app_height + 1, self.store.height + 1):
            block, commit = self.store.load(h)
            log.info("replaying stored block %d into the application", h)
            self.host.apply(block, commit, save=False)

    # ------------------------------------------------------------------ effects

    def _perform(self, effects, catching_up: bool = False) -> None:
        for e in effects:
            if self._stopping:
                return
            if isinstance(e, Broadcast):
                self._broadcast(e.message)
            elif isinstance(e, SendTo):
                self._send_to(e.peer, e.message)
            elif isinstance(e, StartTimer):
                self._timers.append(self._loop.call_later(e.seconds, self._on_timer, e))
            elif isinstance(e, Decide):
                self._decide(e, catching_up)
            elif isinstance(e, NeedBlock):
                self._want_block(e.height, e.peer)
            elif isinstance(e, Refused):
                log.error("refused to sign %s at %d/%d: %s", e.step.name, e.height, e.round, e.reason)

    def _broadcast(self, msg) -> None:
        if isinstance(msg, RoundState):
            self.gossip["states_sent"] += len(self.peers)
        data = encode_payload(msg)
        for peer in self.peers.values():
            self._enqueue(peer, data)

    def _send_to(self, index: int, msg) -> None:
        vs = self.driver.validators  # (effects name peers by their index in this height's committee)
        peer = self.peers.get(vs[index].public_key) if 0 <= index < len(vs) else None
        if peer is None:
            return
        if isinstance(msg, RoundState):
            self.gossip["states_sent"] += 1
        else:
            self.gossip["relayed"] += 1
        self._enqueue(peer, encode_payload(msg))

    @staticmethod
    def _enqueue(peer: Peer, data: bytes) -> None:
        if peer.queue.full():
            peer.queue.get_nowait()  # drop the oldest; gossip recovers what matters
        peer.queue.put_nowait(data)

    def _on_timer(self, e: StartTimer) -> None:
        if self._stopping or self._halted:
            return
        if e.height == self.driver.height:
            self.wal.append(TimeoutFired(e.step, e.height, e.round))
        self._perform(self.driver.on_timeout(e.step, e.height, e.round))

    def _decide(self, d: Decide, catching_up: bool) -> None:
        block = d.block
        try:
            self.host.apply(block, d.commit)
        except AppHashMismatch as exc:
            self._halt(str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - an app failing a decided block must stop the node
            log.exception("the application failed on decided block %d", block.height)
            self._halt(f"the application failed on decided block {block.height}: {exc}")
            return
        self.wal.end_height(block.height)
        self.driver.block_applied(block)
        self.mempool.remove(block.txs)
        self.mempool.recheck(self.app)
        if not catching_up:
            self._spread_txs()  # (a member that refused a client's tx a block ago takes it now)
        self._reconcile_peers()  # (a committee change of two blocks ago takes effect)
        self._notify_commit()
        now = time.time()
        self.last_commit_time_ms = int(now * 1000)
        self.commit_log.append((block.height, now, len(block.txs)))
        for t in self._timers:
            t.cancel()
        self._timers = []
        if catching_up:
            self._start_next()  # the next fetched block is for the next height
        else:  # through the loop even for 0 s: a lone validator would otherwise recurse forever
            self._timers.append(self._loop.call_later(max(0.0, self.timeouts.commit_s), self._start_next))

    def _start_next(self) -> None:
        if self._stopping or self._halted or self.driver.height > self.host.height:
            return
        self._height_started_at = time.monotonic()
        self._perform(self.driver.start_height(self.host.height + 1))

    def _halt(self, reason: str) -> None:
        self._halted = reason
        self.halt_event.set()
        log.critical("CONSENSUS HALTED: %s", reason)
        for t in self._timers:
            t.cancel()

    def _notify_commit(self) -> None:
        self._committed.set()
        self._committed = asyncio.Event()

    async def wait_height(self, height: int, timeout: float) -> bool:
        """Whether this node committed `height` within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.host.height < height:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._committed.wait(), left)
            except asyncio.TimeoutError:
                return False
        return True

    # ------------------------------------------------------------------ network

    async def _sender(self, peer: Peer) -> None:
        """One ordered stream of consensus messages per peer; failures drop the message."""
        while True:
            data = await peer.queue.get()
            try:
                await peer.stub.Consensus(pb.ConsensusMessage(payload=data), timeout=2.0)
                peer.sent += 1
                peer.last_ok = time.time()
            except (grpc.aio.AioRpcError, asyncio.TimeoutError):
                peer.failed += 1
                # the peer is down: drop what is queued (stale by the time it is back; gossip
                # relays what it lacks once it says where it is) and do not spin
                while not peer.queue.empty():
                    peer.queue.get_nowait()
                await asyncio.sleep(0.2)

    def on_consensus_payload(self, payload: bytes) -> pb.Ack:
        if self._halted:
            return pb.Ack(ok=False, reason="halted")
        try:
            msg = decode_payload(payload)
        except DecodeError as exc:
            return pb.Ack(ok=False, reason=f"malformed: {exc}"[:120])
        if isinstance(msg, RoundState):  # a peer's state: never logged (it changes no vote)
            self._on_round_state(msg)
            return pb.Ack(ok=True)
        if self.driver.admits(msg):  # only what changes the driver: no log growth from forgeries
            self.wal.append(msg)
        self._perform(self.driver.on_message(msg))
        return pb.Ack(ok=True)

    def _on_round_state(self, state: RoundState) -> None:
        """Answer a peer's round state, at most once per half gossip period per validator: an
        honest node sends one per period, and an answer can carry megabytes (a proposal), so a
        validator asking faster only gets its next answer later. (The time is noted only once
        the driver accepted the state as signed and new: a forgery cannot use up the slot.)"""
        self.gossip["states_received"] += 1
        now = time.monotonic()
        if now - self._state_answered.get(state.validator, float("-inf")) < self.timeouts.gossip_s / 2:
            return
        effects = self.driver.on_round_state(state)
        if self.driver.peer_state_seq(state.validator) == state.seq:
            self._state_answered[state.validator] = now
            self.gossip["states_answered"] += 1
        self._perform(effects)

    async def _ticker(self) -> None:
        """While a height makes no progress: send peers this node's round state (they relay
        what it lacks, gossip.py), and ask them for blocks (an observer gets no votes)."""
        period = max(0.05, self.timeouts.gossip_s)  # (a zero in a config must not spin)
        while True:
            await asyncio.sleep(period)
            if self._halted:
                continue
            if time.monotonic() - self._height_started_at >= period:
                self._perform(self.driver.gossip_tick())
                self._want_block(self.driver.height, None)

    def _want_block(self, height: int, peer: int | None) -> None:
        if self._catchup and not self._catchup.done():
            return
        self._catchup = asyncio.create_task(self._catch_up(height, peer))

    async def _catch_up(self, height: int, peer: int | None) -> None:
        """Fetch decided blocks with their commits from peers until past `height`."""
        vs = self.driver.validators
        peer = vs[peer].public_key if peer is not None and 0 <= peer < len(vs) else None
        await asyncio.sleep(2 * self.timeouts.precommit_s)  # it may still arrive by consensus
        if self.host.height >= height or self._stopping:
            return
        order = list(self.peers)
        random.shuffle(order)
        if peer in self.peers:
            order.remove(peer)
            order.insert(0, peer)
        for key in order:
            source = self.peers.get(key)
            if source is None:  # (it left the committee meanwhile)
                continue
            try:
                while await self._sync_from(source):
                    pass
            except grpc.aio.AioRpcError as exc:
                log.info("block sync from %s failed: %s %s", source.name, exc.code().name,
                         (exc.details() or "")[:120])
                continue
            except (asyncio.TimeoutError, DecodeError, ValueError) as exc:
                log.info("block sync from %s failed: %s", source.name, exc)
                continue
            if self.host.height >= height:
                return

    async def _sync_from(self, peer: Peer) -> bool:
        """One GetBlocks call; True if it advanced and more may follow."""
        start = self.host.height + 1
        req = pb.BlockRangeRequest(from_height=start, to_height=start + BLOCKS_PER_SYNC_CALL - 1)
        applied = 0
        async for item in peer.stub.GetBlocks(req, timeout=10.0):
            if self._stopping or self._halted:
                return False
            block, commit = Block.decode(item.block), Commit.decode(item.commit)
            if block.height != self.driver.height or self.driver.decided:
                break
            self._perform(self.driver.on_decided_block(block, commit), catching_up=True)
            if self.host.height < block.height:
                raise ValueError(f"peer {peer.name} sent block {block.height} that does not verify")
            applied += 1
        if applied:
            log.info("caught up %d blocks from %s, now at %d", applied, peer.name, self.host.height)
        return applied == BLOCKS_PER_SYNC_CALL

    # ------------------------------------------------------------------ services

    async def submit_tx(self, tx: bytes, forwarded: bool) -> pb.TxReply:
        h = sha256(tx)
        if len(tx) > WIRE.max_tx_bytes:
            return pb.TxReply(code=CODE_OVERSIZE, log=f"tx of {len(tx)} bytes exceeds {WIRE.max_tx_bytes}", tx_hash=h)
        if h in self.mempool:
            return pb.TxReply(code=CODE_IN_MEMPOOL, log="already in the mempool", tx_hash=h)
        if self.mempool.full():
            return pb.TxReply(code=CODE_MEMPOOL_FULL, log="mempool full, retry later", tx_hash=h)
        res = self.app.check_tx(tx)
        if not res.ok:
            return pb.TxReply(code=res.code, log=res.log, tx_hash=h)
        self.mempool.add(tx)
        if not forwarded:  # (a forwarded one is its submitter's to spread)
            self.tx_spread.add(h, self.peers)
            for key in self.peers:
                self._send_txs(key, [h])
        return pb.TxReply(code=0, log="accepted", tx_hash=h)

    def _spread_txs(self) -> None:
        """After a block: the clients' transactions some peer still lacks, to its sender again."""
        for key, hashes in self.tx_spread.due(self.mempool.__contains__).items():
            self._send_txs(key, hashes)

    def _send_txs(self, key: bytes, hashes: list[bytes]) -> None:
        """Queue for the peer's sender those of `hashes` not queued already (one sender per
        peer: arrival order kept, at most a mempool's worth queued)."""
        box = self._outboxes.get(key)
        if box is None or box.task.done():
            box = self._outboxes[key] = _Outbox()
            box.task = asyncio.create_task(self._tx_sender(key, box))
        box.queued.update(dict.fromkeys(hashes))
        box.wake.set()

    async def _tx_sender(self, key: bytes, box: _Outbox) -> None:
        """What the peer refuses, or misses while unreachable, the next block's round sends again."""
        while True:
            await box.wake.wait()
            box.wake.clear()
            while box.queued:
                h = next(iter(box.queued))
                del box.queued[h]
                tx, peer = self.mempool.get(h), self.peers.get(key)
                if tx is None or peer is None:
                    continue
                self.gossip["txs_forwarded"] += 1
                try:
                    reply = await peer.stub.SubmitTx(pb.TxRequest(tx=tx), timeout=FORWARD_TIMEOUT_S,
                                                     metadata=((FORWARDED_KEY, "1"),))
                except grpc.aio.AioRpcError as exc:
                    self.gossip["tx_forwards_failed"] += 1
                    log.debug("forwarding txs to %s failed (%s): again after the next block", peer.name, exc.code())
                    box.queued.clear()
                    break
                if reply.code in (0, CODE_IN_MEMPOOL):
                    self.tx_spread.taken(h, key)
                else:
                    self.gossip["txs_refused_by_peers"] += 1
                    log.debug("%s refused a forwarded tx (%d: %s): again after the next block",
                              peer.name, reply.code, reply.log)

    def peer_stub(self, public_key: bytes) -> rpc.VerifierStub | None:
        """The pinned stub of the committee member with this key (None: not a peer)."""
        peer = self.peers.get(public_key)
        return peer.stub if peer is not None else None

    def trust_anchor(self) -> TrustAnchor | None:
        """The newest block this node committed, as a light client is told to trust it."""
        block = self.host.last_block
        return TrustAnchor(block.height, block.hash()) if block is not None else None

    def status(self) -> dict:
        """What consensus looks like on this node (the composition root's status adds the rest)."""
        now = time.time()
        sm = self.driver.sm
        return {
            "chain_id": self.genesis.chain_id, "node_id": self.identity.node_id_hex,
            "validator_index": self.driver.me, "height": self.host.height, "app_hash": self.host.app_hash.hex(),
            # what a node starting with an old genesis is told to trust (light_client.TrustAnchor)
            "trust_anchor": str(anchor) if (anchor := self.trust_anchor()) else None,
            "committee": {"size": len(self.driver.validators), "power": self.driver.validators.total_power,
                          "since_height": self.driver.validators.start_height, **self.committee_view()},
            "consensus": {"height": self.driver.height, "round": sm.round if sm else -1,
                          "step": sm.step.name if sm else None},
            "peers": {p.name: {"address": p.address, "sent": p.sent, "failed": p.failed,
                               "last_ok_s_ago": round(now - p.last_ok, 2) if p.last_ok else None}
                      for p in self.peers.values()},
            "heights_per_s_10s": round(sum(1 for _, t, _ in self.commit_log if now - t <= 10.0) / 10.0, 2),
            "mempool": len(self.mempool), "last_commit_time_ms": self.last_commit_time_ms,
            "halted": self._halted, "evidence_pending": len(self.driver.pending_evidence),
            "untimely_proposals": self.host.untimely,
            "next_height_buffered": dict(zip(("messages", "bytes"), self.driver.buffered_future())),
            "gossip": dict(self.gossip),
            "signatures": self.privval.signed_count, "wal_syncs": self.wal.syncs,
        }

    def live_peers(self, within_s: float = 5.0) -> list[str]:
        """name@address of the peers heard from within the last `within_s` seconds."""
        now = time.time()
        return [f"{p.name}@{p.address}" for p in self.peers.values() if now - p.last_ok < within_s]

    def blocks(self, start: int, end: int):
        end = min(end, start + BLOCKS_PER_SYNC_CALL - 1, self.store.height)
        for h in range(max(1, start), end + 1):
            raw = self.store.load_raw(h)
            if raw is None:
                return
            yield pb.BlockWithCommit(block=raw[0], commit=raw[1])
