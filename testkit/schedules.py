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
                            SignCrash)
from verifier.consensus import gossip
from verifier.consensus.gossip import RoundState, VoteBits

BEHAVIOURS = ("equivocate", "junk", "poison", "mute", "lie", "silent")


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
        if isinstance(msg, BlockReply) or msg.validator != inst.validator:
            return [msg]
        out = [msg]
        if isinstance(msg, Vote):
            if "junk" in self.kinds and rng.random() < self.p:
                out = self._junk(inst, msg, rng) + out
            if "equivocate" in self.kinds and rng.random() < self.p:
                out = self._twin_vote(inst, msg, rng, keep=rng.random() < 0.5)
        elif "poison" in self.kinds and rng.random() < self.p:
            out = [self._poisoned(inst, msg, rng)]
        elif "equivocate" in self.kinds and rng.random() < self.p:
            out = [_sign(inst, replace(msg, block=self._other_block(net, msg, rng)))]
        return out

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
                          b.last_commit, b.txs[:rng.randint(0, len(b.txs))], net.validators, h.last_app_hash,
                          b.evidence)

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

    # -- files

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        d["delay"] = tuple(d["delay"])
        d["byzantine"] = {int(k): v for k, v in d["byzantine"].items()}
        d["slow"] = {int(k): v for k, v in d.get("slow", {}).items()}
        d["partitions"] = [tuple(p) for p in d["partitions"]]
        return cls(**d)

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: Path) -> "Plan":
        return cls.from_json(Path(path).read_text())

    # -- drawing

    @classmethod
    def random(cls, seed: int, n: int = 4) -> "Plan":
        rng = random.Random(f"plan-{n}-{seed}")
        powers = None if rng.random() < 0.8 else [rng.randint(1, 3) for _ in range(n)]
        total = sum(powers or [1] * n)
        slow = rng.random() < 0.15
        plan = cls(seed=seed, n=n, powers=powers, timeouts="default" if slow else "fast")
        plan.gst = rng.uniform(8.0, 20.0) if slow else rng.uniform(0.5, 4.0)
        plan.deadline = 240.0 if slow else 40.0
        plan.drop = rng.choice([0.0, 0.05, 0.2, 0.4])
        plan.duplicate = rng.choice([0.0, 0.1, 0.3])
        plan.delay = (0.001, rng.choice([0.005, 0.03, 0.1, 0.4]))
        plan.delta = rng.choice([0.005, 0.02, 0.05])
        plan.rotate_bytes = rng.choice([8 * 1024 * 1024, 4096])
        faulty = _faulty(rng, n, powers or [1] * n, total)
        for k in faulty:
            if rng.random() < 0.25:
                plan.twins.append(k)
            else:
                plan.byzantine[k] = sorted(rng.sample(BEHAVIOURS, rng.randint(1, 3)))
        plan.silent_at = rng.uniform(0.0, plan.gst * 1.5)
        instances = list(range(n)) + plan.twins
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            plan.partitions.append(_partition(rng, instances, plan.twins, n, plan.gst))
        plan.partitions.sort()
        honest = [i for i in range(n) if i not in faulty]
        if rng.random() < 0.4:  # a laggard: it hears the next height's later rounds while still
            laggard = rng.choice(honest)  # deciding the previous one, and often restarts
            plan.slow[laggard] = rng.choice([0.1, 0.3, 1.0])
            honest += [laggard] * len(honest)
        for _ in range(rng.choice([0, 1, 2, 4, 6])):
            plan.crashes.append(_crash(rng, rng.choice(honest), plan.gst))
        return plan

    # -- running

    def faulty(self) -> set[int]:
        return set(self.byzantine) | set(self.twins)


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


def _crash(rng: random.Random, instance: int, gst: float) -> dict:
    down = rng.choice([0.01, 0.1, 0.5, 1.5])
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
    net = Network(plan.n, plan.seed, policy=_PlanPolicy(plan), powers=plan.powers, byzantine=byzantine,
                  twins=tuple(plan.twins), timeouts=CONSENSUS if plan.timeouts == "default" else CONSENSUS_FAST,
                  rotate_bytes=plan.rotate_bytes)
    net.partitions = [(s, e, [set(g) for g in groups]) for s, e, groups in plan.partitions]
    for c in plan.crashes:
        if c["kind"] == "time":
            net.crash_at(c["at"], c["instance"], c["down"])
        elif c["kind"] == "sign":
            step = Step[c["step"]] if c.get("step") else None
            net.sign_crashes.append(SignCrash(c["instance"], nth=c["nth"], point=c["point"], down_for=c["down"],
                                              step=step))
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
    return agreement(net) + validity(net) + double_signing(net) + lock_discipline(net)


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
            verify_commit(commit, CHAIN, net.validators, h, block.hash())
        except (ValueError, CommitError) as exc:
            out.append(f"validity: decided block {h} is malformed or badly committed: {exc}")
            break
        if not ref.validate_block(block):
            out.append(f"validity: decided block {h} is not a valid successor of block {h - 1}")
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
    obs, vs = net.observer, net.validators
    q = vs.quorum()

    def polka(h: int, r: int, value: bytes) -> bool:
        return sum(vs[i].power for i in obs.votes.get((h, r, int(VoteType.PREVOTE), value), ())) >= q

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
