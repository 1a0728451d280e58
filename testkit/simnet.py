"""A seeded, virtual-time network of real consensus validators (test tooling).

Each instance is one validator process made of the real parts: `Driver` (with its
`HeightStateMachine` and `VoteKeeper`), the real `WriteAheadLog` and the real `PrivValidator`
with its sign-state file, both in a scratch directory, and a block store that survives
crashes. The application is `KvHost`, a small deterministic key-value stand-in.

Time is virtual: events (message deliveries, timers, ticks, crashes) are popped from a heap in
time order, so a run is a pure function of its inputs and its seed. Each instance reads its own
clock, the virtual time plus its offset (skew), which may step (back or forward) when it
restarts; the driver is built as the node builds it, with the timeliness check against that
clock (`within_drift`), and round-state sequence numbers come from the real boot counter in the
instance's home (verifier/consensus/boots.py). What the network does to a message is asked of a
`Policy` (delays; none: dropped; two: duplicated); a replayer may deliver again any message
sent before, of any height (`replay_rate`). A crash kills an instance between two events or
inside every durable write: in a signature (before the signer runs, inside the WAL sync before
it, inside the sign-state write, which is torn, or after its state is durable but before the
message is logged or sent), inside a WAL rotation, inside the boot-counter write, or right after
a decision before the block is stored; the write-ahead log then keeps what was synced plus a
random part of what was written after (a torn tail included), exactly what a kill -9 or a power
cut can leave.

Byzantine instances run the same honest code; a `Behaviour` rewrites what they send (conflicting
signed messages, junk votes, poisoned blocks, omissions). Twins are two instances with one key.
An `Observer` sees every message on the wire and every signature, for the safety checks in
testkit/schedules.py.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gentorrent.config import CONSENSUS_FAST, ConsensusTimeouts
from gentorrent.crypto.keys import Identity
from gentorrent.ledger.chain import (Block, Commit, CommitError, Proposal, Step, Validator, ValidatorSet,
                                     Vote, make_block, verify_commit)
from verifier.consensus import boots
from verifier.consensus.driver import (Broadcast, Decide, Driver, NeedBlock, Refused, SendTo, StartTimer,
                                       TimeoutFired, within_drift)
from verifier.consensus.gossip import RoundState
from verifier.consensus.node import BLOCKS_PER_SYNC_CALL
from verifier.consensus.privval import PrivValidator
from verifier.consensus.valsets import ValidatorHistory
from verifier.consensus.wal import WriteAheadLog
from testkit.memdisk import tmpfs_root

CHAIN = "sim-chain"
#: how long an instance waits after asking a peer for a block before asking again
CATCHUP_DELAY_S = 0.05
#: the least virtual time from a decision to the next height. With the fast timeouts' commit_s
#: of 0, a committee the membership family had shrunk to one member decided height after height
#: in one virtual instant: time never advanced and the event queue grew until memory ran out
#: (campaign indices 6352 and 6748: membership, n=4, seeds 705 and 749). A real node spends at
#: least its block's fsyncs on a height.
MIN_HEIGHT_S = 0.001


def identities(n: int, seed: int = 0) -> list[Identity]:
    return [Identity.from_seed(hashlib.sha256(f"val-{seed}-{i}".encode()).digest()) for i in range(n)]


def validator_set(n: int, seed: int = 0, powers: list[int] | None = None) -> ValidatorSet:
    """The committee of `Network(n, seed, powers=powers)`."""
    return ValidatorSet([Validator(i.public_key, (powers or [1] * n)[k]) for k, i in enumerate(identities(n, seed))])


VAL_TX = b"val:"  # a committee change: b"val:<key hex>=<power>[,<key hex>=<power>...]#<nonce>"


def val_tx(updates: list[tuple[bytes, int]], nonce: int) -> bytes:
    """A KvHost transaction that changes the committee two heights after its block (power 0
    removes; several updates at once: a key rotation is one)."""
    return VAL_TX + b",".join(k.hex().encode() + b"=%d" % p for k, p in updates) + b"#%d" % nonce


class KvHost:
    """A deterministic toy application: txs are b"k=v"; app hash chains the block's txs. A
    `val_tx` changes the committee: FinalizeBlock's validator updates, applied two heights
    later (verifier/consensus/valsets.py), as the node's ChainHost does."""

    def __init__(self, validators: ValidatorSet, me: int | None, clock: Callable[[], float],
                 max_drift_ms: int | None = None, key: bytes | None = None) -> None:
        self.history = ValidatorHistory(validators)
        self.key = key if key is not None else validators[me].public_key  # the proposer's key
        self.clock = clock
        self.max_drift_ms = max_drift_ms  # None: every proposal is timely (no check)
        self.height = 0
        self.app_hash = hashlib.sha256(b"genesis").digest()
        self.last_block_hash = b""
        self.last_commit: Commit | None = None
        self.last_time_ms = 0
        self.kv: dict[bytes, bytes] = {}
        self.mempool: list[bytes] = []

    @property
    def validators(self) -> ValidatorSet:
        """The committee of the next height."""
        return self.history.at(self.height + 1)

    def validators_at(self, height: int) -> ValidatorSet:
        return self.history.at(height)

    def make_block(self, height, round_, evidence) -> Block:
        txs: list[bytes] = []  # (PrepareProposal: a committee change that no longer applies is left out)
        for tx in self.mempool:
            if len(txs) == 4:
                break
            if not tx.startswith(VAL_TX) or net_updates(self.history.at(height + 1), txs + [tx]) is not None:
                txs.append(tx)
        txs = tuple(txs)
        t = max(self.last_time_ms + 1, int(self.clock() * 1000))
        return make_block(CHAIN, height, t, self.key, self.last_block_hash, self.last_commit, txs,
                          self.history.at(height), self.app_hash, evidence, self.history.at(height + 1))

    def timely(self, block: Block) -> bool:
        """The node's rule (ChainHost.timely): a new proposal's time against this clock."""
        return within_drift(block.header.time_ms, int(self.clock() * 1000), self.max_drift_ms)

    def validate_block(self, block: Block) -> bool:
        h = block.header
        validators = self.history.at(h.height)
        if (h.height != self.height + 1 or h.chain_id != CHAIN or h.last_block_hash != self.last_block_hash
                or h.last_app_hash != self.app_hash or h.time_ms <= self.last_time_ms
                or h.validators_hash != validators.hash()
                or h.next_validators_hash != self.history.at(h.height + 1).hash()
                or validators.index_of(h.proposer) is None):
            return False
        if any(b"=" not in tx for tx in block.txs):
            return False
        if net_updates(self.history.at(h.height + 1), block.txs) is None:
            return False
        if self.height >= 1:
            try:
                verify_commit(block.last_commit, CHAIN, self.history.at(self.height), self.height,
                              self.last_block_hash)
            except (CommitError, AttributeError):
                return False
        return True

    def apply(self, block: Block, commit: Commit) -> None:
        for tx in block.txs:
            k, _, v = tx.partition(b"=")
            self.kv[k] = v
        self.history.record(block.height, tuple(net_updates(self.history.at(block.height + 1), block.txs)))
        self.app_hash = hashlib.sha256(self.app_hash + block.header.data_hash).digest()
        self.height = block.height
        self.last_block_hash = block.hash()
        self.last_commit = commit
        self.last_time_ms = block.header.time_ms
        done = set(block.txs)
        self.mempool = [tx for tx in self.mempool if tx not in done]


def net_updates(base: ValidatorSet, txs) -> list[tuple[bytes, int]] | None:
    """The validator updates of a block's val_txs, applied in order to `base` (the committee
    they change): (key, power) for each member whose power ends up changed. None if one is
    malformed, removes a non-member, or leaves the committee empty (the block is invalid)."""
    before = {v.public_key: v.power for v in base}
    power = dict(before)
    for tx in txs:
        if not tx.startswith(VAL_TX):
            continue
        body, _, _ = tx[len(VAL_TX):].partition(b"#")
        for item in body.split(b","):
            key, _, p = item.partition(b"=")
            try:
                k, p = bytes.fromhex(key.decode()), int(p)
            except ValueError:
                return None
            if len(k) != 32 or not 0 <= p <= 1000 or (p == 0 and not power.get(k)):
                return None
            power[k] = p
        if not any(power.values()):
            return None
    return sorted((k, p) for k, p in power.items() if p != before.get(k, 0))


class Fate:
    """A small deterministic random source for one decision, seeded by what the decision is
    about (the plan's seed, the purpose, the message, the link, how many times that message went
    over that link): a message meets the same fate whatever else the engine sends, so a saved
    schedule replays the same adversary after unrelated code changes."""

    _MASK = (1 << 64) - 1

    def __init__(self, *key, text: str | None = None) -> None:
        text = repr(key) if text is None else text  # (`text`: repr(key), already made by the caller)
        self._state = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")

    def _next(self) -> int:  # splitmix64
        self._state = (self._state + 0x9E3779B97F4A7C15) & self._MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self._MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self._MASK
        return z ^ (z >> 31)

    def random(self) -> float:
        return (self._next() >> 11) / float(1 << 53)

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.random()

    def randrange(self, n: int) -> int:
        return self._next() % n

    def randint(self, a: int, b: int) -> int:
        return a + self.randrange(b - a + 1)

    def choice(self, items):
        return items[self.randrange(len(items))]

    def randbytes(self, n: int) -> bytes:
        return b"".join(self._next().to_bytes(8, "big") for _ in range((n + 7) // 8))[:n]


def message_key(msg) -> tuple:
    """What identifies a message for its fate (no Python hash(): runs replay across processes)."""
    if isinstance(msg, Vote):
        return ("vote", int(msg.type), msg.height, msg.round, msg.validator, msg.block_hash)
    if isinstance(msg, Proposal):
        b = msg.block
        return ("proposal", msg.height, msg.round, msg.pol_round, msg.validator, b.hash(), len(b.txs), b.txs[:1])
    if isinstance(msg, RoundState):
        return ("state", msg.validator, msg.seq, msg.height, msg.round, len(msg.rounds))
    if isinstance(msg, BlockReply):
        return ("block", msg.height, msg.block.hash())
    return (type(msg).__name__,)


class Crash(Exception):
    """Raised inside an instance to kill it at exactly this point (nothing after runs)."""


# --------------------------------------------------------------------------- policies


class Policy(Protocol):
    def delays(self, net: Network, src: Instance, dst: Instance, msg, fate: Fate) -> list[float]:
        """When `msg` from `src` reaches `dst`, as delays from now: [] drops it, two duplicate it
        (`fate`: this transmission's own random source)."""


@dataclass
class FixedDelay:
    """Every message arrives after `delay` seconds, unless `drop(net, src, dst, msg)` says no."""

    delay: float = 0.01
    drop: Callable[[Network, Instance, Instance, object], bool] | None = None

    def delays(self, net, src, dst, msg, fate=None) -> list[float]:
        if self.drop is not None and self.drop(net, src, dst, msg):
            return []
        return [self.delay]


class Behaviour(Protocol):
    """What a Byzantine instance sends instead of an honest message to one peer."""

    def outgoing(self, net: Network, inst: Instance, dst: Instance, msg, fate: Fate) -> list:
        ...


@dataclass(frozen=True)
class BlockReply:
    """A decided block with its commit, sent to a node that is catching up."""

    block: Block
    commit: Commit
    #: the decided blocks that follow it, in order: one GetBlocks call streams up to
    #: BLOCKS_PER_SYNC_CALL, which the node applies one after the other (one block per ask left
    #: the removed members of seed 705 behind a lone member deciding 1,000 heights a second)
    later: tuple[tuple[Block, Commit], ...] = ()

    @property
    def height(self) -> int:
        return self.block.height


@dataclass
class SignCrash:
    """Kill `instance` at the first signature matching `when(step, height, round)` (or at its
    `nth` signature): "before" the signer runs, "after" its state is durable (the message is
    then neither logged nor sent), or "after_send", once the input that caused the signature
    has been handled (the message is sent)."""

    instance: int
    when: Callable[[Step, int, int], bool] | None = None
    point: str = "after"
    down_for: float | None = None  # None: it never comes back
    nth: int | None = None  # its nth signature (of `step` only, if given), across restarts
    step: Step | None = None
    fired: bool = False

    def matches(self, inst: "Instance", step: Step, height: int, round_: int) -> bool:
        if self.fired or inst.id != self.instance:
            return False
        if self.nth is None:
            return self.when(step, height, round_)
        if self.step is None:
            return inst.signatures == self.nth
        return step is self.step and inst.signed_steps.get(step, 0) == self.nth


@dataclass
class DecideCrash:
    """Kill `instance` right after its n-th decision, before the block is stored."""

    instance: int
    nth: int
    down_for: float | None = None
    fired: bool = False


@dataclass
class WriteCrash:
    """Kill `instance` inside its n-th durable write of one kind: "rotate" (a WAL rotation: the
    new file written, not yet renamed over the old one) or "boot" (the boot counter: the new
    value written to its temporary file, not yet renamed)."""

    instance: int
    kind: str
    nth: int
    down_for: float | None = None
    fired: bool = False


# --------------------------------------------------------------------------- instances


@dataclass
class Instance:
    id: int
    validator: int
    identity: Identity
    home: Path
    honest: bool
    alive: bool = True
    epoch: int = 0
    wal: WriteAheadLog | None = None
    privval: PrivValidator | None = None
    host: KvHost | None = None
    driver: Driver | None = None
    store: dict[int, tuple[Block, Commit]] = field(default_factory=dict)  # durable
    synced: int = 0  # WAL bytes known to be on disk
    wal_ino: int = 0
    signatures: int = 0
    signed_steps: dict = field(default_factory=dict)  # Step -> signatures of that step
    decisions: int = 0
    height_started: float = 0.0
    catchup_pending: bool = False
    restarts: int = 0
    refused: list = field(default_factory=list)
    offset: float = 0.0  # its clock minus the virtual time
    writes: dict = field(default_factory=dict)  # "rotate" | "boot" -> durable writes of that kind so far


class _SimPrivValidator(PrivValidator):
    """The real signer; a crash planned inside its state write tears that write."""

    def __init__(self, net: "Network", inst: Instance, *args, **kwargs) -> None:
        self.net, self.inst = net, inst
        super().__init__(*args, **kwargs)

    def _write_slot(self, slot: bytes, offset: int) -> None:
        if self.net._tear_sign_state.get(self.inst.id):
            fate = self.net.fate("torn-sign-state", self.inst.id, self.inst.signatures)
            keep = fate.randint(0, len(slot) - 1)
            junk = fate.randbytes(fate.randint(0, len(slot) - keep))  # what the disk held there
            super()._write_slot(slot[:keep] + junk, offset)
            raise Crash()
        super()._write_slot(slot, offset)


class _SimWriteAheadLog(WriteAheadLog):
    """The real WAL; a crash planned inside a rotation stops it before the rename."""

    def __init__(self, net: "Network", inst: Instance, *args, **kwargs) -> None:
        self.net, self.inst = net, inst
        super().__init__(*args, **kwargs)

    def _rotate(self, height: int, later: list) -> None:
        if self.net._write_crash(self.inst, "rotate"):
            self._f.flush()
            tmp = self.path.with_suffix(".rotating")  # (what _rotate writes first; it never gets renamed)
            tmp.write_bytes(b"\x00\x00\x00\x10half a rotation")
            raise Crash()
        super()._rotate(height, later)


class _Signer:
    """The instance's PrivValidator, with crash points around it and the observer told."""

    def __init__(self, net: Network, inst: Instance) -> None:
        self.net, self.inst = net, inst

    def sign(self, step: Step, height: int, round_: int, sign_bytes: bytes) -> bytes:
        self.inst.signatures += 1
        self.inst.signed_steps[step] = self.inst.signed_steps.get(step, 0) + 1
        trigger = self.net._sign_trigger(self.inst, step, height, round_)
        if trigger is not None and trigger.point == "before":
            raise Crash()
        if trigger is not None and trigger.point == "in_sign_state":
            self.net._tear_sign_state[self.inst.id] = True
        try:
            sig = self.inst.privval.sign(step, height, round_, sign_bytes)
        finally:  # (a step signed before returns its stored signature: nothing written, nothing torn)
            self.net._tear_sign_state.pop(self.inst.id, None)
        self.net.observer.signed(self.inst, step, height, round_, sign_bytes)
        if trigger is not None and trigger.point == "after":
            raise Crash()
        return sig


# --------------------------------------------------------------------------- observer


class Observer:
    """Everything the safety checks need: messages on the wire, signatures, decisions."""

    def __init__(self, validators: ValidatorSet) -> None:
        self.validators = validators
        #: (validator, height, round, step) -> sign bytes of every honest signature and message
        self.signatures: dict[tuple[int, int, int, int], set[bytes]] = {}
        self.sent: dict[tuple[int, int, int, int], set[bytes]] = {}
        #: (height, round, type, value) -> validators that signed such a vote (seen on the wire)
        self.votes: dict[tuple[int, int, int, bytes], set[int]] = {}
        #: honest validator -> [(height, round, type, value)] it signed, for lock discipline
        self.honest_votes: dict[int, set[tuple[int, int, int, bytes]]] = {}
        #: instance -> {height: block hash} of every decision (across restarts)
        self.decisions: dict[int, dict[int, set[bytes]]] = {}
        self.decided_blocks: dict[tuple[int, bytes], tuple[Block, Commit]] = {}
        self.first_decided_at: dict[tuple[int, bytes], float] = {}  # virtual time of the first decision
        self._seen: dict[int, object] = {}

    def signed(self, inst: Instance, step: Step, height: int, round_: int, sign_bytes: bytes) -> None:
        if inst.honest:
            self.signatures.setdefault((inst.validator, height, round_, int(step)), set()).add(sign_bytes)

    def wire(self, msg, honest_sender: bool, signer: int | None = None) -> None:
        """A message on the wire; `signer`: the identity that signed it (its validator index
        names a member of its height's committee, which changes)."""
        if id(msg) in self._seen:
            return
        self._seen[id(msg)] = msg  # (kept: an id is not reused while its object lives)
        step = int(Step.PROPOSE) if isinstance(msg, Proposal) else int(msg.type)
        if honest_sender:
            self.sent.setdefault((msg.validator, msg.height, msg.round, step), set()).add(msg.sign_bytes(CHAIN))
        if isinstance(msg, Vote):
            self.votes.setdefault((msg.height, msg.round, int(msg.type), msg.block_hash), set()).add(msg.validator)
            if honest_sender:
                self.honest_votes.setdefault(msg.validator if signer is None else signer, set()).add(
                    (msg.height, msg.round, int(msg.type), msg.block_hash))

    def decided(self, inst: Instance, block: Block, commit: Commit, now: float = 0.0) -> None:
        self.decisions.setdefault(inst.id, {}).setdefault(block.height, set()).add(block.hash())
        self.decided_blocks[(block.height, block.hash())] = (block, commit)
        self.first_decided_at.setdefault((block.height, block.hash()), now)


# --------------------------------------------------------------------------- the network


class Network:
    """n validators (plus twins) on a simulated network; see the module docstring."""

    def __init__(self, n: int = 4, seed: int = 0, policy: Policy | None = None,
                 powers: list[int] | None = None, byzantine: dict[int, Behaviour] | None = None,
                 twins: tuple[int, ...] = (), timeouts: ConsensusTimeouts = CONSENSUS_FAST,
                 rotate_bytes: int = 8 * 1024 * 1024, txs_per_node: int = 6,
                 wal_loss: str = "random", workdir: Path | None = None,
                 clocks: dict[int, float] | None = None, clock_step: tuple[float, float] = (0.0, 0.0),
                 clock_range: tuple[float, float] = (-1e9, 1e9), timely: bool = True,
                 replay_rate: float = 0.0, joiners: int = 0) -> None:
        self.seed = seed
        #: per instance: clock offset at the first boot; each restart adds uniform(*clock_step),
        #: kept within clock_range (the window of honest clocks that liveness assumes)
        self.clocks = dict(clocks or {})
        self.clock_step = clock_step
        self.clock_range = clock_range
        self.max_offset = 0.0  # the fastest honest clock so far (the block-time bound of the oracle)
        self.timely = timely  # build drivers with the timeliness check, as the node does
        self.replay_rate = replay_rate  # replays of old messages per virtual second
        self._archive: list = []  # a uniform sample of everything sent so far (for replays)
        self._sent_count = 0
        self._tear_sign_state: dict[int, bool] = {}
        self._times: dict[tuple, int] = {}  # (purpose, key) -> decisions made so far
        self.now = 0.0
        self.policy = policy or FixedDelay()
        self.timeouts = timeouts
        self.rotate_bytes = rotate_bytes
        self.wal_loss = wal_loss  # "random" (any cut from the last sync on), "all" or "none"
        self.tick_s = timeouts.gossip_s
        self._seq = itertools.count()
        self._events: list = []
        _SIGNATURES.acquire()
        self._closed = False
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="gt-simnet-", dir=tmpfs_root()))  # (simulated disks in memory)
        ids = identities(n + joiners, seed)  # (joiners: nodes outside the first committee)
        self.identities = ids
        self.validators = validator_set(n, seed, powers)  # the first committee
        self.history = ValidatorHistory(self.validators)  # every height's, from the first decisions
        self.val_txs: list[bytes] = []  # committee changes submitted so far (submit_at)
        self._history_height = 0
        self._keyed: dict[bytes, list[Instance]] | None = None  # public key -> its instances
        self.behaviour: dict[int, Behaviour] = dict(byzantine or {})  # instance id -> behaviour
        faulty = set(self.behaviour) | set(twins)
        self.observer = Observer(self.validators)
        self.instances: list[Instance] = []
        for k in list(range(n)) + list(twins):
            inst = Instance(len(self.instances), k, ids[k], self.workdir / f"i{len(self.instances)}",
                            honest=k not in faulty)
            inst.home.mkdir(parents=True)
            self.instances.append(inst)
        for j in range(n, n + joiners):
            inst = Instance(len(self.instances), j, ids[j], self.workdir / f"i{len(self.instances)}", honest=True)
            inst.home.mkdir(parents=True)
            self.instances.append(inst)
        self.mempools = {k: [f"n{k}-tx{j}=v{j}".encode() for j in range(txs_per_node)] for k in range(n + joiners)}
        self._pending_down: dict[int, float | None] = {}  # instance -> down time of a crash in flight
        self.trace: list[str] | None = None  # a list: every send, delivery and decision is noted
        self.sign_crashes: list[SignCrash] = []
        self.decide_crashes: list[DecideCrash] = []
        self.write_crashes: list[WriteCrash] = []
        self.partitions: list[tuple[float, float, list[set[int]]]] = []  # over instance ids
        for inst in self.instances:
            inst.offset = self.clocks.get(inst.id, 0.0)
            if inst.honest:
                self.max_offset = max(self.max_offset, inst.offset)
            self._boot(inst)
            if inst.alive:
                self._push(self.tick_s, "tick", inst.id, inst.epoch)
        if self.replay_rate > 0:
            self._push(self.fate("replay-at").uniform(0.0, 2.0 / self.replay_rate), "replay")

    # -- lifecycle

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _SIGNATURES.release()
        for inst in self.instances:
            if inst.alive:
                inst.wal.close()
                inst.privval.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def honest(self) -> list[Instance]:
        return [i for i in self.instances if i.honest]

    def crash_at(self, at: float, instance: int, down_for: float | None) -> None:
        self._push(at, "crash", instance, down_for)

    # -- plumbing

    def _push(self, at: float, kind: str, *args) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, args))

    def connected(self, a: int, b: int) -> bool:
        for start, end, groups in self.partitions:
            if start <= self.now < end:
                return any(a in g and b in g for g in groups)
        return True

    def clock(self, inst: Instance) -> float:
        """What `inst`'s wall clock reads now."""
        return self.now + inst.offset

    def _boot(self, inst: Instance) -> None:
        """Start an instance as the node starts: boot counter, WAL, signer, app, driver, replay."""
        if self._write_crash(inst, "boot"):  # killed inside the boot-counter write: the old value holds
            path = inst.home / boots.BOOT_FILE
            path.with_name(path.name + ".new").write_text("99\n")
            self._kill(inst, self._pending_down.pop(inst.id, None), booting=True)
            return
        state_seq = boots.boot_state_seq(inst.home)
        inst.wal = _SimWriteAheadLog(self, inst, inst.home / "cs.wal", rotate_bytes=self.rotate_bytes)
        inst.synced, inst.wal_ino = _size_ino(inst.wal.path)
        inst.privval = _SimPrivValidator(self, inst, inst.identity, inst.home / "sign_state",
                                         before_sign=lambda: self._sync(inst))
        drift = self.timeouts.max_clock_drift_ms if self.timely else None
        key = inst.identity.public_key
        inst.host = KvHost(self.validators, None, lambda: self.clock(inst), drift, key=key)
        for h in sorted(inst.store):
            inst.host.apply(*inst.store[h])
        self._refill(inst)
        inst.driver = Driver(CHAIN, self.validators, self.validators.index_of(key), _Signer(self, inst), inst.host,
                             self.timeouts, journal=inst.wal.append, state_signer=inst.identity.sign,
                             state_seq=state_seq, timely=inst.host.timely if self.timely else None, my_key=key)
        inst.height_started = self.now
        h = inst.host.height + 1
        self._run(inst, lambda: inst.driver.start_height(h, replay=inst.wal.replay_from(h)))

    def _refill(self, inst: Instance) -> None:
        """Its mempool: the committee changes submitted and not yet decided, first, in the
        order submitted (so that every proposer takes them in one order), then its own txs."""
        done = {tx for b, _ in inst.store.values() for tx in b.txs}
        own = inst.host.mempool or self.mempools[inst.validator]
        inst.host.mempool = ([tx for tx in self.val_txs if tx not in done]
                             + [tx for tx in own if tx not in done and not tx.startswith(VAL_TX)])

    def submit_at(self, at: float, tx: bytes) -> None:
        """A committee change (`val_tx`) reaches every mempool at virtual time `at`."""
        self._push(at, "submit", tx)

    def _on_submit(self, tx: bytes) -> None:
        self.val_txs.append(tx)
        for inst in self.instances:
            if inst.alive and inst.host is not None:
                self._refill(inst)

    def by_key(self, public_key: bytes) -> list[Instance]:
        if self._keyed is None:
            self._keyed = {}
            for i in self.instances:
                self._keyed.setdefault(i.identity.public_key, []).append(i)
        return self._keyed.get(public_key, [])

    def instances_at(self, height: int, index: int) -> list[Instance]:
        """The instances of validator `index` of height `height`'s committee."""
        vs = self.history.at(height)
        return self.by_key(vs[index].public_key) if 0 <= index < len(vs) else []

    def index_at(self, height: int, inst: Instance) -> int | None:
        """`inst`'s validator index at `height` (None: not a member then)."""
        return self.history.at(height).index_of(inst.identity.public_key)

    def _write_crash(self, inst: Instance, kind: str) -> bool:
        """Count a durable write of `kind`; True if a crash is planned inside this one."""
        n = inst.writes[kind] = inst.writes.get(kind, 0) + 1
        for c in self.write_crashes:
            if not c.fired and c.instance == inst.id and c.kind == kind and c.nth == n:
                c.fired = True
                self._pending_down[inst.id] = c.down_for
                return True
        return False

    def _sync(self, inst: Instance) -> None:
        inst.wal.sync()
        inst.synced, inst.wal_ino = _size_ino(inst.wal.path)

    def _run(self, inst: Instance, call: Callable[[], list]) -> None:
        """One input into an instance, then its effects; a Crash anywhere kills it there."""
        try:
            self._perform(inst, call())
        except Crash:
            self._kill(inst, self._pending_down.pop(inst.id, None))
            return
        if inst.id in self._pending_down and inst.alive:  # a crash "after_send"
            self._kill(inst, self._pending_down.pop(inst.id))

    def _sign_trigger(self, inst: Instance, step: Step, height: int, round_: int) -> SignCrash | None:
        for c in self.sign_crashes:
            if c.matches(inst, step, height, round_):
                c.fired = True
                self._pending_down[inst.id] = c.down_for
                return c
        return None

    # -- effects

    def _perform(self, inst: Instance, effects) -> None:
        for e in effects:
            if not inst.alive:
                return
            if isinstance(e, Broadcast):
                self.broadcast(inst, e.message)
            elif isinstance(e, SendTo):  # (e.peer: an index in the sender's committee of its height)
                for dst in self.by_key(inst.driver.validators[e.peer].public_key):
                    if dst.id != inst.id:
                        self.send(inst, dst, e.message)
            elif isinstance(e, StartTimer):
                self._push(self.now + e.seconds, "timer", inst.id, inst.epoch, e.step, e.height, e.round)
            elif isinstance(e, Decide):
                self._decide(inst, e, catching_up=False)
            elif isinstance(e, NeedBlock):
                if not inst.catchup_pending:
                    inst.catchup_pending = True
                    peers = (tuple(i.id for i in self.by_key(inst.driver.validators[e.peer].public_key))
                             if e.peer is not None and inst.driver is not None else None)
                    self._push(self.now + CATCHUP_DELAY_S, "catchup", inst.id, inst.epoch, e.height, peers)
            elif isinstance(e, Refused):
                inst.refused.append(e)

    def broadcast(self, inst: Instance, msg) -> None:
        for dst in self.instances:
            if dst.id != inst.id:
                self.send(inst, dst, msg)

    def fate(self, purpose: str, *key) -> Fate:
        """The random source of one decision: the n-th time for the same purpose and key gets
        its own (a message sent again over a link is a new transmission)."""
        k = (purpose,) + key
        n = self._times.get(k, 0)
        self._times[k] = n + 1
        return Fate(self.seed, k, n)

    def message_fate(self, purpose: str, src: int, dst: int, msg) -> Fate:
        """fate(purpose, src, dst, message_key(msg)), the same random source, made faster: the
        message's key and its repr are made once per message object (a broadcast, relays and
        duplicates send one object many times) and the repr of the whole key is assembled."""
        mk = msg.__dict__.get("_fate_key")
        if mk is None:
            mk = repr(message_key(msg))
            object.__setattr__(msg, "_fate_key", mk)
        k = (purpose, src, dst, mk)
        n = self._times.get(k, 0)
        self._times[k] = n + 1
        return Fate(text=f"({self.seed!r}, ({purpose!r}, {src!r}, {dst!r}, {mk}), {n!r})")

    def send(self, src: Instance, dst: Instance, msg) -> None:
        """One message from src to dst, as the Byzantine behaviour and the network have it."""
        behaviour = self.behaviour.get(src.id)
        if behaviour is None:
            out = [msg]
        else:
            out = behaviour.outgoing(self, src, dst, msg, self.message_fate("byzantine", src.id, dst.id, msg))
        for m in out:
            self.transmit(src, dst, m)

    def transmit(self, src: Instance, dst: Instance, msg) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now:8.3f} send {src.id}->{dst.id} {describe(msg)}")
        if self.replay_rate > 0:
            self._keep_for_replay(src, msg)
        if isinstance(msg, (Proposal, Vote)):
            signers = self.instances_at(msg.height, msg.validator)
            self.observer.wire(msg, bool(signers) and signers[0].honest, signers[0].validator if signers else None)
        if not self.connected(src.id, dst.id):
            return
        for d in self.policy.delays(self, src, dst, msg, self.message_fate("link", src.id, dst.id, msg)):
            self._push(self.now + d, "deliver", src.id, dst.id, dst.epoch, msg)

    ARCHIVE = 256

    def _keep_for_replay(self, src: Instance, msg) -> None:
        """Reservoir sample of every message sent: a replay may pick one of any height."""
        self._sent_count += 1
        if len(self._archive) < self.ARCHIVE:
            self._archive.append((src.id, msg))
            return
        k = self.fate("archive", self._sent_count).randrange(self._sent_count)
        if k < self.ARCHIVE:
            self._archive[k] = (src.id, msg)

    def _on_replay(self) -> None:
        """Deliver an old message again, to anyone, as a network adversary that recorded it would."""
        fate = self.fate("replay", round(self.now, 6))
        self._push(self.now + fate.uniform(0.0, 2.0 / self.replay_rate), "replay")
        if not self._archive:
            return
        src, msg = fate.choice(self._archive)
        dst = fate.choice(self.instances)
        if dst.id != src:
            self._push(self.now, "deliver", src, dst.id, dst.epoch, msg)

    def instances_of(self, validator: int) -> list[Instance]:
        return [i for i in self.instances if i.validator == validator]

    def _decide(self, inst: Instance, d: Decide, catching_up: bool) -> None:
        inst.decisions += 1
        if self.trace is not None:
            self.trace.append(f"{self.now:8.3f} DECIDE {inst.id} h={d.block.height} {d.block.hash().hex()[:8]}")
        self.observer.decided(inst, d.block, d.commit, self.now)
        for c in self.decide_crashes:
            if not c.fired and c.instance == inst.id and c.nth == inst.decisions:
                c.fired = True
                self._pending_down[inst.id] = c.down_for
                raise Crash()
        h = d.block.height
        if h == self._history_height + 1:  # the first decision of a height fixes its committee changes
            self.history.record(h, tuple(net_updates(self.history.at(h + 1), d.block.txs)))
            self._history_height = h
        inst.store[h] = (d.block, d.commit)
        inst.host.apply(d.block, d.commit)
        inst.wal.end_height(h)
        size, ino = _size_ino(inst.wal.path)
        if ino != inst.wal_ino:  # rotated: the new file was written and synced whole
            inst.synced, inst.wal_ino = size, ino
        inst.driver.block_applied(d.block)
        delay = 0.0 if catching_up else max(MIN_HEIGHT_S, self.timeouts.commit_s)
        self._push(self.now + delay, "start_next", inst.id, inst.epoch)

    # -- events

    def run(self, until: float, stop: Callable[[Network], bool] | None = None) -> None:
        while self._events and self._events[0][0] <= until:
            at, _, kind, args = heapq.heappop(self._events)
            self.now = at
            getattr(self, f"_on_{kind}")(*args)
            if stop is not None and stop(self):
                return
        self.now = max(self.now, until)

    def _live(self, k: int, epoch: int) -> Instance | None:
        inst = self.instances[k]
        return inst if inst.alive and inst.epoch == epoch else None

    def _on_deliver(self, src: int, dst: int, epoch: int, msg) -> None:
        inst = self._live(dst, epoch)
        if inst is None or not self.connected(src, dst):
            return
        if self.trace is not None:
            self.trace.append(f"{self.now:8.3f} recv {src}->{dst} {describe(msg)}")
        if isinstance(msg, BlockReply):
            self._on_block(inst, msg, src)
        elif isinstance(msg, RoundState):
            self._run(inst, lambda: inst.driver.on_round_state(msg))
        else:
            self.receive(inst, msg)

    def receive(self, inst: Instance, msg) -> None:
        """What the node's Consensus handler does: write ahead what changes state, then handle."""
        def handle():
            if inst.driver.admits(msg):
                inst.wal.append(msg)
            return inst.driver.on_message(msg)
        self._run(inst, handle)

    def _on_timer(self, k: int, epoch: int, step: Step, height: int, round_: int) -> None:
        inst = self._live(k, epoch)
        if inst is None:
            return

        def fire():
            if height == inst.driver.height:
                inst.wal.append(TimeoutFired(step, height, round_))
            return inst.driver.on_timeout(step, height, round_)
        self._run(inst, fire)

    def _on_tick(self, k: int, epoch: int) -> None:
        inst = self._live(k, epoch)
        if inst is None:
            return
        self._push(self.now + self.tick_s, "tick", k, epoch)
        if self.now - inst.height_started >= self.tick_s:
            self._run(inst, inst.driver.gossip_tick)
            if inst.alive:
                self._perform(inst, [NeedBlock(inst.driver.height, None)])

    def _on_start_next(self, k: int, epoch: int) -> None:
        inst = self._live(k, epoch)
        if inst is None or inst.driver.height > inst.host.height:
            return
        inst.height_started = self.now
        self._run(inst, lambda: inst.driver.start_height(inst.host.height + 1))

    def _on_catchup(self, k: int, epoch: int, height: int, peer: tuple[int, ...] | None) -> None:
        inst = self._live(k, epoch)
        if inst is None:
            return
        inst.catchup_pending = False
        if inst.host.height >= height:
            return
        if peer:
            sources = [self.instances[i] for i in peer]
        else:
            sources = [i for i in self.instances if i.id != k]
        src = self.fate("catchup", k, inst.host.height).choice(sources)
        want = inst.host.height + 1
        if src.alive and want in src.store:
            later = tuple(itertools.takewhile(lambda b: b is not None, (src.store.get(h) for h in
                                                           range(want + 1, want + BLOCKS_PER_SYNC_CALL))))
            self.send(src, inst, BlockReply(*src.store[want], later))

    def _on_block(self, inst: Instance, reply: BlockReply, src: int) -> None:
        applied = False
        try:
            for e in inst.driver.on_decided_block(reply.block, reply.commit):
                if isinstance(e, Decide):
                    self._decide(inst, e, catching_up=True)
                    applied = True
        except Crash:
            self._kill(inst, self._pending_down.pop(inst.id, None))
            return
        if applied and reply.later:  # the rest of the stream, after the next height starts (same instant)
            self._push(self.now, "deliver", src, inst.id, inst.epoch, BlockReply(*reply.later[0], reply.later[1:]))

    def _on_crash(self, k: int, down_for: float | None) -> None:
        inst = self.instances[k]
        if inst.alive:
            self._kill(inst, down_for)

    def _on_restart(self, k: int, epoch: int) -> None:
        inst = self.instances[k]
        if inst.alive or inst.epoch != epoch:
            return
        if self.trace is not None:
            self.trace.append(f"{self.now:8.3f} RESTART {inst.id}")
        inst.alive = True
        inst.restarts += 1
        inst.catchup_pending = False
        if self.clock_step != (0.0, 0.0):  # NTP stepping it, a VM snapshot, no hardware clock
            step = self.fate("clock-step", inst.id, inst.restarts).uniform(*self.clock_step)
            lo, hi = self.clock_range
            inst.offset += step
            if lo <= self.clocks.get(inst.id, 0.0) <= hi:  # (a clock outside the window stays outside)
                inst.offset = max(lo, min(hi, inst.offset))
            if inst.honest:
                self.max_offset = max(self.max_offset, inst.offset)
        self._boot(inst)
        if inst.alive:
            self._push(self.now + self.tick_s, "tick", inst.id, inst.epoch)

    def _kill(self, inst: Instance, down_for: float | None, booting: bool = False) -> None:
        """kill -9: the WAL keeps what was synced and maybe part of what was written after."""
        if self.trace is not None:
            self.trace.append(f"{self.now:8.3f} CRASH {inst.id}")
        inst.alive = False
        inst.epoch += 1
        inst.driver = None
        if booting:  # (killed before it opened its WAL and signer)
            if down_for is not None:
                self._push(self.now + down_for, "restart", inst.id, inst.epoch)
            return
        inst.wal.close()  # (everything reaches the file; the cut below decides what survived)
        inst.privval.close()
        size = os.path.getsize(inst.wal.path)
        keep = {"all": inst.synced, "none": size}.get(self.wal_loss)
        if keep is None:
            keep = self.fate("torn-wal", inst.id, inst.epoch).randint(inst.synced, size) if size > inst.synced else size
        os.truncate(inst.wal.path, min(size, max(inst.synced, keep)))
        if down_for is not None:
            self._push(self.now + down_for, "restart", inst.id, inst.epoch)

    def restart(self, k: int) -> None:
        inst = self.instances[k]
        if not inst.alive:
            self._on_restart(k, inst.epoch)

    # -- queries

    def heights(self) -> dict[int, int]:
        return {i.id: (i.host.height if i.host else 0) for i in self.instances}

    def min_honest_height(self) -> int:
        return min(i.host.height for i in self.honest())


class _MemoizedSignatures:
    """Ed25519 verification is deterministic, and a simulated committee checks each signature
    many times (every receiver, every relay, every commit): while a Network exists, each
    distinct (key, signature, message) is checked once by the real code and remembered
    (bounded). Results are the same; schedules run several times faster."""

    MODULES = ("gentorrent.ledger.chain", "verifier.consensus.gossip")
    MAX = 200_000

    def __init__(self) -> None:
        self.users = 0
        self.memo: dict[tuple[bytes, bytes, bytes], bool] = {}
        self.real = None

    def check(self, public_key: bytes, signature: bytes, message: bytes) -> bool:
        key = (public_key, signature, message)
        ok = self.memo.get(key)
        if ok is None:
            if len(self.memo) >= self.MAX:
                self.memo.clear()
            ok = self.memo[key] = self.real(public_key, signature, message)
        return ok

    def acquire(self) -> None:
        import importlib
        if self.users == 0:
            mods = [importlib.import_module(m) for m in self.MODULES]
            self.real = mods[0].is_valid_signature
            for m in mods:
                m.is_valid_signature = self.check
        self.users += 1

    def release(self) -> None:
        import importlib
        self.users -= 1
        if self.users == 0:
            for m in self.MODULES:
                importlib.import_module(m).is_valid_signature = self.real
            self.memo.clear()


_SIGNATURES = _MemoizedSignatures()


def describe(msg) -> str:
    """A short line for traces."""
    if isinstance(msg, Vote):
        value = msg.block_hash.hex()[:8] if msg.block_hash else "nil"
        return f"{msg.type.name.lower()} v{msg.validator} h={msg.height} r={msg.round} {value}"
    if isinstance(msg, Proposal):
        return (f"proposal v{msg.validator} h={msg.height} r={msg.round} pol={msg.pol_round} "
                f"{msg.block.hash().hex()[:8]}")
    if isinstance(msg, BlockReply):
        return f"block h={msg.height} {msg.block.hash().hex()[:8]}"
    if isinstance(msg, RoundState):
        return f"state v{msg.validator} h={msg.height} r={msg.round} rounds={[e.round for e in msg.rounds]}"
    return type(msg).__name__


def _size_ino(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_ino

