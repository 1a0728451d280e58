"""Adversarial schedules for the committee's consensus, and the oracle that judges them.

A `Plan` is everything one run depends on: the committee (4 or 7 validators, powers), the
seed, the network before GST (drops, duplicates, delays that reorder, a laggard that hears
later rounds of the next height before it has decided the current one, partitions that heal),
crashes of honest validators (at a time, at their n-th signature before/after it is durable or
after it is sent, right after a decision before the block is stored; each with a torn
write-ahead log), Byzantine validators (≤ f by power: equivocating proposals and votes, junk
votes, poisoned block bodies, omissions, lying round states, silence) and Twins (one key, two
instances, honest code, usually in different partitions). `Plan.random(seed, n)` draws one;
`to_json`/`from_json` make any plan a replayable file; `save_failure` writes a failing one
with what it violated (fuzz/consensus_schedules.py runs long campaigns, and
tests/test_consensus_schedules.py replays every saved file).

`run_plan` runs it on testkit/simnet.py and returns the violations found:

safety, always: agreement (no two honest validators decide different blocks at a height,
across restarts too), validity (every decided block is a valid successor of the agreed chain,
with a commit that verifies), no double signing by an honest validator (by its signer, across
restarts, nor on the wire), lock discipline (an honest validator that precommitted v in round
r prevotes another non-nil value in a later round r' only if some round in [r, r') had a polka
for it, and precommits v only with a polka for v in that round);

liveness, after GST with at most f faulty: every honest validator decides `heights` more
heights than the highest decided at GST, within `deadline` virtual seconds.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from gentorrent.config import CONSENSUS, CONSENSUS_FAST
from gentorrent.ledger.chain import (NIL, CommitError, Proposal, Step, Vote, VoteType, make_block,
                                     verify_commit)
from testkit.simnet import (CHAIN, BlockReply, DecideCrash, Fate, Instance, KvHost, Network,
                            SignCrash, WriteCrash, val_tx)
from verifier.consensus import gossip
from verifier.consensus.gossip import RoundState, VoteBits

BEHAVIOURS = ("equivocate", "junk", "poison", "mute", "lie", "silent")
#: proposals that lie about time or about a lock: far-future block times (a fast clock gone
#: wrong, or an attempt to fast-forward the epochs' deadlines) and false proof-of-lock rounds
FUTURE_BEHAVIOURS = ("future", "falsepol")


# --------------------------------------------------------------------------- Byzantine behaviours


class Byzantine:
    """Rewrites what a Byzantine instance sends, per peer: its honest code decides *when* it
    speaks, these decide *what* (conflicting signed messages, junk, lies, silence)."""

    def __init__(self, kinds: list[str], silent_at: float = 0.0, p: float = 0.5) -> None:
        self.kinds, self.silent_at, self.p = set(kinds), silent_at, p

    def outgoing(self, net: Network, inst: Instance, dst: Instance, msg, rng: Fate) -> list:
        if "silent" in self.kinds and net.now >= self.silent_at:
            return []
        if "mute" in self.kinds and rng.random() < self.p:
            return []
        if isinstance(msg, RoundState):
            return [self._lie(inst, msg, rng)] if "lie" in self.kinds and rng.random() < self.p else [msg]
        if isinstance(msg, BlockReply) or msg.validator != net.index_at(msg.height, inst):
            return [msg]
        out = [msg]
        if isinstance(msg, Vote):
            if "junk" in self.kinds and rng.random() < self.p:
                out = self._junk(inst, msg, rng) + out
            if "equivocate" in self.kinds and rng.random() < self.p:
                out = self._twin_vote(inst, msg, rng, keep=rng.random() < 0.5)
        elif "poison" in self.kinds and rng.random() < self.p:
            out = [self._poisoned(inst, msg, rng)]
        elif "future" in self.kinds and rng.random() < self.p:
            out = [self._far_future(net, inst, msg, rng)]
        elif "falsepol" in self.kinds and msg.round >= 1 and rng.random() < self.p:
            block = msg.block if rng.random() < 0.5 else self._other_block(net, msg, rng)
            out = [_sign(inst, replace(msg, block=block, pol_round=rng.randrange(msg.round)))]
        elif "equivocate" in self.kinds and rng.random() < self.p:
            out = [_sign(inst, replace(msg, block=self._other_block(net, msg, rng)))]
        return out

    @staticmethod
    def _far_future(net: Network, inst: Instance, p: Proposal, rng: Fate) -> Proposal:
        """The same block, timed well beyond every honest clock's drift bound (sometimes with a
        false proof-of-lock round as well: re-proposals are not judged by their time)."""
        b, h = p.block, p.block.header
        ahead = rng.choice([2, 3, 10, 1000, 10**6]) * net.timeouts.max_clock_drift_ms
        block = make_block(CHAIN, h.height, h.time_ms + ahead, h.proposer, h.last_block_hash, b.last_commit,
                           b.txs, net.history.at(h.height), h.last_app_hash, b.evidence, net.history.at(h.height + 1))
        pol = rng.randrange(p.round) if p.round >= 1 and rng.random() < 0.3 else p.pol_round
        return _sign(inst, replace(p, block=block, pol_round=pol))

    @staticmethod
    def _junk(inst: Instance, msg: Vote, rng: Fate) -> list[Vote]:
        junk = [_sign(inst, replace(msg, block_hash=rng.randbytes(32))) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.3:  # a vote for a later round (it cannot make honest nodes skip alone)
            junk.append(_sign(inst, replace(msg, round=msg.round + rng.randint(1, 3), block_hash=NIL)))
        return junk

    @staticmethod
    def _twin_vote(inst: Instance, msg: Vote, rng: Fate, keep: bool) -> list[Vote]:
        known = [h for h in (inst.driver.sm.blocks if inst.driver and inst.driver.sm else {}) if h != msg.block_hash]
        choices = known + ([NIL] if msg.block_hash else []) + [rng.randbytes(32)]
        twin = _sign(inst, replace(msg, block_hash=rng.choice(choices)))
        return [msg, twin] if keep else [twin]

    @staticmethod
    def _other_block(net: Network, p: Proposal, rng: Fate):
        """Another valid block for the same height: same parent and contents, another time."""
        b, h = p.block, p.block.header
        return make_block(CHAIN, h.height, h.time_ms + rng.randint(1, 50), h.proposer, h.last_block_hash,
                          b.last_commit, b.txs[:rng.randint(0, len(b.txs))], net.history.at(h.height), h.last_app_hash,
                          b.evidence, net.history.at(h.height + 1))

    @staticmethod
    def _poisoned(inst: Instance, p: Proposal, rng: Fate) -> Proposal:
        """A known block's header with a foreign body: the signature covers only the header."""
        sm = inst.driver.sm if inst.driver else None
        blocks = [b for b, _ in sm.blocks.values()] if sm else []
        header = rng.choice(blocks).header if blocks else p.block.header
        body = replace(p.block, header=header, txs=(b"poison=%d" % rng.randrange(1000),))
        return _sign(inst, replace(p, block=body, pol_round=-1))

    @staticmethod
    def _lie(inst: Instance, state: RoundState, rng: Fate) -> RoundState:
        """Claim to hold nothing, or every vote of every value it lists."""
        def full(bits: tuple[VoteBits, ...]) -> tuple[VoteBits, ...]:
            return tuple(VoteBits(b.value, b"\xff" * len(b.bits)) for b in bits)

        if rng.random() < 0.5:
            lie = replace(state, rounds=())
        else:
            lie = replace(state, rounds=tuple(replace(e, has_proposal=True, prevotes=full(e.prevotes),
                                                      precommits=full(e.precommits)) for e in state.rounds))
        return gossip.signed(lie, CHAIN, inst.identity.sign)


def _sign(inst: Instance, msg):
    return replace(msg, signature=inst.identity.sign(replace(msg, signature=b"").sign_bytes(CHAIN)))


# --------------------------------------------------------------------------- plans


FAMILIES = ("network", "crash", "torn", "clock", "byzantine", "future", "replay", "membership", "mixed")
SIZES = (4, 7, 10, 31)


@dataclass
class Plan:
    seed: int
    n: int = 4
    powers: list[int] | None = None
    timeouts: str = "fast"  # "fast" (CONSENSUS_FAST) or "default" (the shipped CONSENSUS)
    gst: float = 2.0
    drop: float = 0.0
    duplicate: float = 0.0
    delay: tuple[float, float] = (0.001, 0.02)  # before GST
    delta: float = 0.02  # after GST every message arrives within this
    partitions: list[tuple[float, float, list[list[int]]]] = field(default_factory=list)  # instance ids
    crashes: list[dict] = field(default_factory=list)
    byzantine: dict[int, list[str]] = field(default_factory=dict)  # validator -> behaviours
    silent_at: float = 0.0
    twins: list[int] = field(default_factory=list)
    slow: dict[int, float] = field(default_factory=dict)  # instance -> extra inbound delay before GST
    rotate_bytes: int = 8 * 1024 * 1024
    heights: int = 2
    deadline: float = 30.0
    family: str = "mixed"
    drift_ms: int | None = None  # the timeliness bound (None: the timeouts' own, 10 s)
    clocks: dict[int, float] = field(default_factory=dict)  # instance -> clock offset at first boot (s)
    clock_step: tuple[float, float] = (0.0, 0.0)  # each restart adds uniform(*step) to the offset
    clock_range: tuple[float, float] = (-1e9, 1e9)  # honest offsets stay within (liveness assumes it)
    replay_rate: float = 0.0  # old messages replayed per virtual second
    #: validators running honest code with a clock outside the honest window (counted in the
    #: faulty power for liveness, honest for every safety check: a bad clock is not a bad node)
    skewed: list[int] = field(default_factory=list)
    joiners: int = 0  # nodes outside the first committee (identities n.., instances after the twins)
    #: committee changes: {"at": virtual time, "updates": [[identity, power], ...]} (power 0 removes);
    #: each reaches every mempool at `at` and applies two heights after its block
    changes: list[dict] = field(default_factory=list)

    # -- files

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        d["delay"] = tuple(d["delay"])
        d["byzantine"] = {int(k): v for k, v in d["byzantine"].items()}
        d["slow"] = {int(k): v for k, v in d.get("slow", {}).items()}
        d["clocks"] = {int(k): v for k, v in d.get("clocks", {}).items()}
        for key in ("clock_step", "clock_range"):
            if key in d:
                d[key] = tuple(d[key])
        d["partitions"] = [tuple(p) for p in d["partitions"]]
        return cls(**d)

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: Path) -> "Plan":
        return cls.from_json(Path(path).read_text())

    # -- drawing

    @classmethod
    def random(cls, seed: int, n: int = 4, family: str | None = None) -> "Plan":
        """One seeded plan of `family` (one of FAMILIES; None: drawn too) for n validators.

        network: drops, duplicates, reordering, partitions, laggards. crash: and crashes at any
        step with torn WALs. torn: crashes inside durable writes (the sign state torn, a WAL
        rotation, the boot counter). clock: per-node clocks skewed up to the drift bound, which
        step back or forward at every restart, with small and shipped bounds. byzantine:
        equivocation, junk, poison, lies, silence, Twins. future: Byzantine proposals with
        far-future times and false proof-of-lock rounds. replay: old messages of any height
        delivered again, to anyone, before and after GST. mixed: all of it at once."""
        rng = random.Random(f"plan-{n}-{seed}-{family}")
        family = family or rng.choice(FAMILIES)
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
        on = _FAMILY_FAULTS[family]
        unequal = rng.random() < (0.9 if n >= 10 else 0.5)
        powers = [rng.choice([1, 1, 2, 3, 5]) for _ in range(n)] if unequal else None
        total = sum(powers or [1] * n)
        slow = rng.random() < (0.15 if n < 31 else 0.05)
        plan = cls(seed=seed, n=n, powers=powers, timeouts="default" if slow else "fast", family=family)
        plan.gst = rng.uniform(8.0, 20.0) if slow else rng.uniform(0.5, 4.0)
        plan.deadline = 240.0 if slow else 40.0
        plan.heights = rng.randint(3, 5)
        plan.delay = (0.001, rng.choice([0.005, 0.03, 0.1, 0.4]))
        plan.delta = rng.choice([0.005, 0.02, 0.05])
        if "net" in on:
            plan.drop = rng.choice([0.0, 0.05, 0.2, 0.4])
            plan.duplicate = rng.choice([0.0, 0.1, 0.3])
        plan.rotate_bytes = rng.choice([8 * 1024 * 1024, 4096, 1024] if "torn" in on else [8 * 1024 * 1024, 4096])
        faulty = _faulty(rng, n, powers or [1] * n, total) if on & {"byz", "future", "clock"} else []
        kinds = (BEHAVIOURS if "byz" in on else ()) + (FUTURE_BEHAVIOURS if "future" in on else ())
        for k in faulty:
            if "clock" in on and not kinds and rng.random() < 0.6:  # down for good: the others need
                plan.byzantine[k] = ["silent"]  # every remaining member, the restarted ones too
            elif "clock" in on and (not kinds or rng.random() < 0.3):
                plan.skewed.append(k)
            elif "byz" in on and rng.random() < 0.25:
                plan.twins.append(k)
            else:
                pick = sorted(rng.sample(kinds, rng.randint(1, min(3, len(kinds)))))
                if "future" in on and not set(pick) & set(FUTURE_BEHAVIOURS):
                    pick = sorted(pick + [rng.choice(FUTURE_BEHAVIOURS)])
                plan.byzantine[k] = pick
        plan.silent_at = 0.0 if kinds == () and plan.byzantine else rng.uniform(0.0, plan.gst * 1.5)
        instances = list(range(n)) + plan.twins
        if "net" in on:
            for _ in range(rng.choice([0, 0, 1, 2, 3])):
                plan.partitions.append(_partition(rng, instances, plan.twins, n, plan.gst))
            plan.partitions.sort()
        honest = [i for i in range(n) if i not in faulty or i in plan.skewed]
        if "net" in on and rng.random() < 0.4:  # a laggard: it hears the next height's later rounds
            laggard = rng.choice(honest)  # while still deciding the previous one, and often restarts
            plan.slow[laggard] = rng.choice([0.1, 0.3, 1.0])
            honest += [laggard] * len(honest)
        if "clock" in on:
            _clocks(rng, plan, honest)
        if "replay" in on:
            plan.replay_rate = rng.choice([2.0, 10.0, 50.0])
        if "members" in on:
            _membership(rng, plan, set(faulty) - set(plan.skewed))
        crashes = rng.choice([0, 1, 2, 4, 6]) if "crash" in on else 0
        if "torn" in on:
            crashes = rng.choice([1, 2, 3, 5])
        elif "clock" in on:
            crashes = max(crashes, 1)
        for _ in range(crashes):
            plan.crashes.append(_crash(rng, rng.choice(honest), plan.gst, torn="torn" in on))
        return plan

    # -- running

    def faulty(self) -> set[int]:
        return set(self.byzantine) | set(self.twins)  # (skewed validators run honest code)

    def drift_s(self) -> float:
        return (self.drift_ms if self.drift_ms is not None else CONSENSUS_FAST.max_clock_drift_ms) / 1000


#: which fault kinds each family turns on
_FAMILY_FAULTS = {
    "network": {"net"},
    "crash": {"net", "crash"},
    "torn": {"crash", "torn"},
    "clock": {"clock", "crash", "net"},
    "byzantine": {"net", "byz"},
    "future": {"future", "crash"},
    "replay": {"replay", "crash", "net"},
    "membership": {"members", "net", "crash", "byz"},
    "mixed": {"net", "crash", "torn", "clock", "byz", "future", "replay", "members"},
}


def _clocks(rng: random.Random, plan: Plan, honest: list[int]) -> None:
    """Clock offsets of every instance and their steps at restarts. Honest clocks keep within
    a window whose width plus two message delays fits the drift bound (what liveness needs:
    a proposal made by the fastest clock is timely for the slowest); inside it they start
    anywhere, near the edges often, and step back or forward at each restart (the audit found
    a 0.2 s step enough). Faulty instances' clocks are anywhere."""
    plan.drift_ms = rng.choice([None, None, None, 1000, 300])
    drift = plan.drift_s()
    width = rng.choice([0.02, 0.5, 0.95]) * max(0.0, drift - 2 * max(plan.delta, 0.05) - 0.02)
    low = -rng.uniform(0.0, width)
    plan.clock_range = (round(low, 4), round(low + width, 4))
    for i in range(plan.n + len(plan.twins)):
        if i in plan.skewed:  # just beyond the window: its proposals, or its view of others', sit
            side = rng.choice([0, 1])  # on the timeliness boundary, which a restart's step crosses
            beyond = drift * rng.uniform(0.7, 1.3)
            plan.clocks[i] = round(plan.clock_range[side] + (beyond if side else -beyond), 4)
        elif i in honest:
            edge = rng.random() < 0.4
            plan.clocks[i] = round(rng.choice(plan.clock_range) if edge else rng.uniform(*plan.clock_range), 4)
        else:
            plan.clocks[i] = round(rng.uniform(-3 * drift, 3 * drift), 4)
    # back (NTP, snapshots) more often than ahead; a step across the window goes behind the
    # node's previous boot, as the audit's 9 s did (round-state numbers once came from the clock)
    big = rng.choice([0.2, 1.0, width, width, 2 * drift])
    plan.clock_step = (-big, rng.choice([0.0, big / 4, big]))
    window = [i for i in honest if i not in plan.skewed]
    if window and rng.random() < 0.5:  # the audit's case: a member at the fast edge restarts with its clock
        k = rng.choice(window)  # set back across the window, behind its previous boot (while another
        plan.clocks[k] = plan.clock_range[1]  # member may be down for good: the rest need it)
        plan.clock_step = (-width, -width * rng.choice([0.5, 1.0]))
        plan.crashes.append({"kind": "time", "instance": k, "at": rng.uniform(0.2, plan.gst),
                             "down": rng.choice([0.05, 0.2, 0.5])})
    plan.deadline += 6 * width  # a block at the far edge costs the slowest clocks up to `width` once


def _membership(rng: random.Random, plan: Plan, faulty: set[int]) -> None:
    """Committee changes through the chain: members join (nodes outside the first committee),
    leave, change power, or rotate their key (one leaves as another joins with its power, in
    one change), before and after GST. Every committee keeps the faulty power below a third and
    someone in it (what liveness needs)."""
    plan.joiners = rng.choice([1, 1, 2])
    power = {k: p for k, p in enumerate(plan.powers or [1] * plan.n)}
    outside = list(range(plan.n, plan.n + plan.joiners))
    at = rng.uniform(0.05, plan.gst * 0.8)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["add", "remove", "reweight", "rotate"])
        members = sorted(k for k, p in power.items() if p)
        honest = [k for k in members if k not in faulty]
        if kind in ("add", "rotate") and not outside:
            kind = "reweight"
        if kind == "add":
            updates = [[outside.pop(0), rng.choice([1, 2, 3])]]
        elif kind == "remove":
            updates = [[rng.choice(members), 0]]
        elif kind == "reweight" and honest:
            updates = [[rng.choice(honest), rng.choice([1, 2, 3, 5])]]
        elif kind == "rotate" and honest:
            old = rng.choice(honest)
            updates = [[old, 0], [outside.pop(0), power[old]]]
        else:
            continue
        after = dict(power)
        after.update({k: p for k, p in updates})
        total = sum(after.values())
        if total == 0 or 3 * sum(p for k, p in after.items() if k in faulty) >= total:
            for k, p in updates:  # (a joiner drawn but not used may join later)
                if k >= plan.n and k not in power and k not in outside:
                    outside.insert(0, k)
            continue
        power = after
        plan.changes.append({"at": round(at, 4), "updates": updates})
        at += rng.uniform(0.05, 1.0)


def _faulty(rng: random.Random, n: int, powers: list[int], total: int) -> list[int]:
    """Up to f validators, by power: their total stays below a third."""
    order = rng.sample(range(n), n)
    want = rng.choice([0, 1, 1, 2, 2, 2]) if n > 4 else rng.choice([0, 1, 1, 1])
    out: list[int] = []
    for k in order:
        if len(out) < want and 3 * (sum(powers[i] for i in out) + powers[k]) < total:
            out.append(k)
    return out


def _partition(rng: random.Random, instances: list[int], twins: list[int], n: int, gst: float):
    start = rng.uniform(0.0, gst)
    end = min(gst, start + rng.uniform(0.1, gst))
    groups: list[list[int]] = [[], []] if rng.random() < 0.7 else [[], [], []]
    for i in instances:
        groups[rng.randrange(len(groups))].append(i)
    for k, twin in zip(twins, range(n, n + len(twins))):  # Twins: the two halves apart
        for g in groups:
            for i in (k, twin):
                if i in g:
                    g.remove(i)
        groups[0].append(k)
        groups[1].append(twin)
    return (start, end, [sorted(g) for g in groups if g])


def _crash(rng: random.Random, instance: int, gst: float, torn: bool = False) -> dict:
    down = rng.choice([0.01, 0.1, 0.5, 1.5])
    if torn:  # inside a durable write: the sign state (torn), a WAL rotation, the boot counter
        kind = rng.choice(["sign_state", "sign_state", "sign_state", "rotate", "boot"])
        if kind == "sign_state":
            step = rng.choice([None, "PROPOSE", "PREVOTE", "PRECOMMIT"])
            return {"kind": "sign", "instance": instance, "step": step, "nth": rng.randint(1, 10 if step else 30),
                    "down": down, "point": "in_sign_state"}
        return {"kind": "write", "what": kind, "instance": instance, "down": down,
                "nth": rng.randint(1, 4) if kind == "rotate" else rng.randint(2, 3)}
    kind = rng.choice(["time", "time", "sign", "sign", "decide"])
    if kind == "time":
        return {"kind": "time", "instance": instance, "at": rng.uniform(0.0, gst), "down": down}
    if kind == "sign" and rng.random() < 0.5:  # right at a precommit: the moment a lock is taken
        return {"kind": "sign", "instance": instance, "step": "PRECOMMIT", "nth": rng.randint(1, 12), "down": down,
                "point": rng.choice(["before", "after", "after_send", "after_send"])}
    if kind == "sign":
        return {"kind": "sign", "instance": instance, "nth": rng.randint(1, 40), "down": down,
                "point": rng.choice(["before", "after", "after_send"])}
    return {"kind": "decide", "instance": instance, "nth": rng.randint(1, 6), "down": down}


# --------------------------------------------------------------------------- running and judging


class _PlanPolicy:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def delays(self, net: Network, src, dst, msg, rng: Fate) -> list[float]:
        p = self.plan
        if net.now >= p.gst:
            return [rng.uniform(p.delay[0], p.delta)]
        if rng.random() < p.drop:
            return []
        extra = p.slow.get(dst.id, 0.0)
        out = [rng.uniform(*p.delay) + rng.uniform(0.0, extra)]
        if rng.random() < p.duplicate:
            out.append(rng.uniform(*p.delay) + rng.uniform(0.0, extra))
        return out


@dataclass
class Verdict:
    plan: Plan
    violations: list[str]
    heights: dict[int, int]
    virtual_s: float
    trace: list[str] | None = None

    @property
    def ok(self) -> bool:
        return not self.violations


def build(plan: Plan) -> Network:
    """The network of a plan, before it runs (faults scheduled)."""
    byzantine = {k: Byzantine(kinds, plan.silent_at) for k, kinds in plan.byzantine.items()}
    timeouts = CONSENSUS if plan.timeouts == "default" else CONSENSUS_FAST
    if plan.drift_ms is not None:
        timeouts = replace(timeouts, max_clock_drift_ms=plan.drift_ms)
    net = Network(plan.n, plan.seed, policy=_PlanPolicy(plan), powers=plan.powers, byzantine=byzantine,
                  twins=tuple(plan.twins), timeouts=timeouts, rotate_bytes=plan.rotate_bytes,
                  clocks=plan.clocks, clock_step=plan.clock_step, clock_range=plan.clock_range,
                  replay_rate=plan.replay_rate, joiners=plan.joiners)
    for k, change in enumerate(plan.changes):
        updates = [(net.identities[identity].public_key, power) for identity, power in change["updates"]]
        net.submit_at(change["at"], val_tx(updates, k))
    net.partitions = [(s, e, [set(g) for g in groups]) for s, e, groups in plan.partitions]
    for c in plan.crashes:
        if c["kind"] == "time":
            net.crash_at(c["at"], c["instance"], c["down"])
        elif c["kind"] == "sign":
            step = Step[c["step"]] if c.get("step") else None
            net.sign_crashes.append(SignCrash(c["instance"], nth=c["nth"], point=c["point"], down_for=c["down"],
                                              step=step))
        elif c["kind"] == "write":
            net.write_crashes.append(WriteCrash(c["instance"], c["what"], c["nth"], c["down"]))
        else:
            net.decide_crashes.append(DecideCrash(c["instance"], c["nth"], c["down"]))
    return net


def run_plan(plan: Plan, trace: bool = False) -> Verdict:
    """Run `plan` to its liveness deadline (or until the liveness goal is met); judge it."""
    with build(plan) as net:
        if trace:
            net.trace = []
        net.run(plan.gst)
        for c in net.sign_crashes + net.decide_crashes:  # no faults of honest nodes after GST
            c.fired = True
        for inst in net.honest():
            net.restart(inst.id)
        start = max(net.heights()[i.id] for i in net.honest())
        goal = start + plan.heights
        net.run(plan.gst + plan.deadline, stop=lambda n: all(i.host.height >= goal for i in n.honest()))
        violations = safety(net)
        if not all(i.host.height >= goal for i in net.honest()):
            violations.append(f"liveness: honest heights {[i.host.height for i in net.honest()]} did not all reach "
                              f"{goal} within {plan.deadline} s after GST (at GST: {start})")
        return Verdict(plan, violations, net.heights(), net.now, net.trace)


def safety(net: Network) -> list[str]:
    return (agreement(net) + validity(net) + double_signing(net) + lock_discipline(net) + determinism(net)
            + blame(net))


def blame(net: Network) -> list[str]:
    """Evidence committed in a decided block names a faulty validator only: no one can frame an
    honest one (every piece carries two signatures of the accused key)."""
    out = []
    honest_keys = {i.identity.public_key for i in net.honest()} - {i.identity.public_key for i in net.instances
                                                                   if not i.honest}
    for (h, _), (block, _) in sorted(net.observer.decided_blocks.items(), key=lambda kv: kv[0][0]):
        for ev in block.evidence:
            committee = net.history.at(ev.height)
            key = committee[ev.validator].public_key if ev.validator < len(committee) else None
            if key in honest_keys:
                out.append(f"blame: block {h} holds {type(ev).__name__} against honest validator {ev.validator} "
                           f"of height {ev.height}")
    return out


def determinism(net: Network) -> list[str]:
    """A restarted honest validator replays to exactly what it signed: it never has to refuse
    a signature (every input that led to one was durable before it, and replay asks no clock).
    A refusal is safe, but it silences the validator for that step: a replay that went another
    way."""
    return [f"determinism: honest validator {i.validator} (instance {i.id}) refused to sign {r.step.name} at "
            f"{r.height}/{r.round}: {r.reason}" for i in net.honest() for r in i.refused[:1]]


def agreement(net: Network) -> list[str]:
    by_height: dict[int, set[bytes]] = {}
    for inst in net.honest():
        for h, hashes in net.observer.decisions.get(inst.id, {}).items():
            by_height.setdefault(h, set()).update(hashes)
    return [f"agreement: honest validators decided {len(s)} blocks at height {h}"
            for h, s in sorted(by_height.items()) if len(s) > 1]


def validity(net: Network) -> list[str]:
    """Replay the agreed chain on a reference app: each block must be a valid successor."""
    out = []
    ref = KvHost(net.validators, 0, lambda: 0.0)
    decided = net.observer.decided_blocks
    for h in range(1, 1 + max((h for h, _ in decided), default=0)):
        honest = {bh for inst in net.honest() for bh in net.observer.decisions.get(inst.id, {}).get(h, ())}
        if len(honest) != 1:
            break  # not decided by an honest validator (yet), or a fork (reported by agreement)
        block, commit = decided[(h, honest.pop())]
        try:
            block.check_internal()
            verify_commit(commit, CHAIN, ref.history.at(h), h, block.hash())
        except (ValueError, CommitError) as exc:
            out.append(f"validity: decided block {h} is malformed or badly committed: {exc}")
            break
        if not ref.validate_block(block):
            out.append(f"validity: decided block {h} is not a valid successor of block {h - 1}")
            break
        fastest = min(net.max_offset, net.clock_range[1])  # (a polka needs a clock of the window)
        latest = net.observer.first_decided_at[(h, block.hash())] + fastest + net.timeouts.max_clock_drift_ms / 1000
        if net.timely and block.header.time_ms > latest * 1000 + 1:
            out.append(f"validity: decided block {h} has time {block.header.time_ms} ms, beyond every honest "
                       f"clock's drift bound ({latest * 1000:.0f} ms)")
            break
        ref.apply(block, commit)
    return out


def double_signing(net: Network) -> list[str]:
    out = []
    for what, table in (("signed", net.observer.signatures), ("sent", net.observer.sent)):
        for (v, h, r, step), sigs in sorted(table.items()):
            if len(sigs) > 1:
                out.append(f"double sign: honest validator {v} {what} {len(sigs)} different messages "
                           f"for height {h} round {r} step {step}")
    return out


def lock_discipline(net: Network) -> list[str]:
    """An honest precommit for v in round r needs a polka for v in r; a later non-nil prevote
    for another value needs a polka for that value in some round of [r, later round)."""
    obs = net.observer

    def polka(h: int, r: int, value: bytes) -> bool:
        vs = net.history.at(h)
        return sum(vs[i].power for i in obs.votes.get((h, r, int(VoteType.PREVOTE), value), ())) >= vs.quorum()

    out = []
    for v, votes in sorted(obs.honest_votes.items()):
        precommits = [(h, r, x) for h, r, t, x in votes if t == VoteType.PRECOMMIT and x != NIL]
        prevotes = [(h, r, x) for h, r, t, x in votes if t == VoteType.PREVOTE and x != NIL]
        for h, r, x in precommits:
            if not polka(h, r, x):
                out.append(f"lock: honest validator {v} precommitted {x.hex()[:8]} at {h}/{r} without a polka")
            for h2, r2, y in prevotes:
                if h2 == h and r2 > r and y != x and not any(polka(h, vr, y) for vr in range(r, r2)):
                    out.append(f"lock: honest validator {v} precommitted {x.hex()[:8]} at {h}/{r}, then prevoted "
                               f"{y.hex()[:8]} at round {r2} with no polka for it since round {r}")
    return out


# --------------------------------------------------------------------------- campaigns


def judge(plan: Plan) -> Verdict:
    """run_plan, with any exception out of the engine counted as a violation too."""
    try:
        return run_plan(plan)
    except Exception as exc:  # noqa: BLE001 - a crash of the engine is a finding, not the end
        return Verdict(plan, [f"exception: {type(exc).__name__}: {exc}"], {}, 0.0)


def save_failure(verdict: Verdict, directory: Path) -> Path:
    """A failing schedule as a replayable file (tests/test_consensus_schedules.py replays all)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"n{verdict.plan.n}-seed{verdict.plan.seed}.json"
    path.write_text(json.dumps({"plan": asdict(verdict.plan), "violations": verdict.violations},
                               sort_keys=True, indent=1) + "\n")
    return path


def load_failure(path: Path) -> tuple[Plan, list[str]]:
    data = json.loads(Path(path).read_text())
    return Plan.from_json(json.dumps(data["plan"])), data.get("violations", [])
