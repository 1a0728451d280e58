"""A group member attacks its model group: what it gains, what routing the group keeps, what it costs.

Three honest members and one insider run as real gRPC/TLS gossip servers on 127.0.0.1
(testkit/gossip_group.py), all registered and trusted. Users' sessions start at the honest
members (each session's prefix is served, and cached, by one of them: its *holder*); then
follow-ups of every session, and new requests, enter the group at random honest members and
are routed by Algorithm 2 on each member's own view (`GroupRouting.decide`). The clock is
injected: a gossip round is `gossip_interval_s` of group time and takes milliseconds.

Phases: *baseline* (no attack), *attack* (the insider sends its crafted, validly signed
messages to every honest member before each of their gossip rounds, paced to the one message
per `gossip_min_spacing_s` a member reads), *recovery* (the insider
falls silent; up to `RECOVERY_ROUNDS` honest rounds). Modes (`GROUP_ATTACKS`):

- `subtree-forge`: deltas labelled with each honest member's id at version 2^64-1, empty;
- `stats-forge`: Sentry records labelled with each honest member (sealed, every request,
  a prefix no prompt reaches), and the insider's own record saying the same;
- `layout-pin`: a layout of the last epoch whose first chunk no prompt fills;
- `origin-flood`: subtree deltas of `group_split_size` made-up origins, then a new honest
  member joins the group and serves sessions of its own;
- `capacity-lie`: registered with capacity 1, the insider claims 10 (and a light load);
- `claim-and-lie`: the insider re-announces every subtree it hears as its own and claims an
  idle engine (both are statements about itself that peers cannot check: THREAT_MODEL.md
  lists it as not defended; this mode measures how far it gets).

Figures (the dict of bench.reliability.Outcome):
- requests_sent: requests routed by honest members during the attack;
- answered: of those, routed where the attack-free group routes them -- a follow-up to its
  session's holder, a new request to an honest member;
- lost: requests the attack diverted (sent - answered, minus what the baseline missed
  anyway); the scenario survived when nothing was diverted and routing recovered;
- recover_s: wall seconds after the attack until follow-ups reach their holders again
  (at least as often as in the baseline), None if not within RECOVERY_ROUNDS;
- extra: the attacker's success rate (its messages accepted / sent), its cost (messages,
  bytes), cache affinity and the insider's share of requests in each phase, honest gossip
  rounds that failed to send.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import replace
from pathlib import Path

GROUP_ATTACKS = ("subtree-forge", "stats-forge", "layout-pin", "origin-flood", "capacity-lie",
                 "claim-and-lie")
LAYOUT_MODES = ("stats-forge", "layout-pin")
RECOVERY_ROUNDS = 4
HONEST_ACTIVE, HONEST_CAPACITY = 4, 2  # every honest member runs at relative load 2.0
BUSY = HONEST_ACTIVE  # the load the insider reports where load is not its lever (capacity 1: 4.0)


async def group_adversary(root: Path, mode: str, seed: int = 0, quick: bool = False) -> dict:
    """One insider runs `mode` against three honest members; see the module docstring."""
    from testkit.gossip_group import PARAMS, Clock, GossipNode, start_group

    if mode not in GROUP_ATTACKS:
        raise ValueError(f"mode is one of {GROUP_ATTACKS}")
    rng = random.Random(seed)
    sessions = 12 if quick else 48
    attack_rounds = 6 if mode in LAYOUT_MODES or not quick else 2  # a refresh takes ~5 rounds
    # the layout modes act through the Sentry: refreshes fall due during their attack
    params = replace(PARAMS, sentry_refresh_requests=sessions // 2) if mode in LAYOUT_MODES else PARAMS
    clock = Clock()
    directory_path = Path(root) / "directory.json"
    honest, bad, directory = await start_group(directory_path, clock, params=params,
                                               active=HONEST_ACTIVE, capacity=HONEST_CAPACITY)
    late: GossipNode | None = None
    work = _Workload(rng, sessions)
    try:
        for i, s in enumerate(work.sessions):
            honest[i % len(honest)].serve(s.prefix, clock())
            s.holder = honest[i % len(honest)].id
        await _rounds(honest, clock, params, 1)
        before = work.measure(honest, bad.id, clock())
        sent_before = sum(n.gossip.sent for n in honest)
        adopted = set()
        for r in range(attack_rounds):
            if mode == "origin-flood" and r == 1:  # a real member joins while the slots are flooded
                late = await GossipNode(directory_path, clock, params=params, active=HONEST_ACTIVE,
                                        capacity=HONEST_CAPACITY).start()
                directory.add_model(late.record())
                clock.t += 1.0  # members re-read the roster for a sender they do not know
                for s in work.join(late, clock(), max(1, sessions // 3)):
                    s.holder = late.id
            await _attack(mode, bad, honest, params, clock)
            adopted |= {n.id for n in honest if n.group.sentry.layout.epoch == 2**32 - 1}
            if mode in LAYOUT_MODES:  # users keep asking while the insider works
                work.background(honest, clock(), sessions // 4)
            await _rounds(_members(honest, late), clock, params, 1)
        members = _members(honest, late)
        success = _success(mode, honest, late, adopted, params)
        during = work.measure(members, bad.id, clock())
        success = during.to_insider if success is None else success
        honest_sends = sum(n.gossip.sent for n in honest) - sent_before
        # each honest member to each roster peer (2 honest + the insider), and to the late one
        peers = len(honest)
        expected_sends = attack_rounds * len(honest) * peers + (attack_rounds - 1) * len(honest) * bool(late)
        stopped = time.monotonic()
        recover_s, recovery_rounds = None, None
        for k in range(1, RECOVERY_ROUNDS + 1):
            await _rounds(members, clock, params, 1)
            again = work.measure(members, bad.id, clock())
            if again.affinity >= before.affinity and again.to_insider <= before.to_insider:
                recover_s, recovery_rounds = round(time.monotonic() - stopped, 3), k
                break
        diverted = max(0, (during.sent - during.answered) - (before.sent - before.answered))
        return {
            "requests_sent": during.sent, "answered": during.answered, "lost": diverted,
            "recover_s": recover_s,
            "note": (f"attacker's success {success:.2f} ({bad.sent} messages, "
                     f"{bad.bytes_sent / 1024:.0f} KiB, {bad.accepted} accepted); "
                     f"cache affinity {before.affinity:.2f} -> {during.affinity:.2f}; "
                     f"insider's share of requests {before.to_insider:.2f} -> {during.to_insider:.2f}; "
                     f"honest gossip sends {honest_sends}/{expected_sends}"),
            "extra": {
                "mode": mode, "attacker_success_rate": success,
                "attacker_messages": bad.sent, "attacker_messages_accepted": bad.accepted,
                "attacker_bytes": bad.bytes_sent,
                "affinity_before": before.affinity, "affinity_during": during.affinity,
                "insider_share_before": before.to_insider, "insider_share_during": during.to_insider,
                "honest_sends_during_attack": honest_sends, "honest_sends_expected": expected_sends,
                "honest_tick_errors": sum(getattr(n.gossip, "tick_errors", 0) for n in honest),
                "honest_failed_rounds": sum(getattr(n, "failed_rounds", 0) for n in honest),
                "layout_epochs": sorted({n.group.sentry.layout.epoch for n in members}),
                "recovery_rounds": recovery_rounds, "sessions": sessions, "attack_rounds": attack_rounds,
            },
        }
    finally:
        for n in _members(honest, late):
            await n.stop()
        await bad.stop()


def _members(honest, late) -> list:
    """The group in gossip order: a member who just joined speaks first, before the others'
    rounds drop the insider's made-up origins (the insider floods before every round)."""
    return ([late] if late is not None else []) + honest


def _success(mode: str, honest, late, adopted: set, params) -> float | None:
    """The share of its goal the attacker reached by the end of the attack (0 = nothing);
    None for the modes whose goal is drawing requests (measured on the routed requests)."""
    if mode == "subtree-forge":  # receivers that lost part of what a member really holds
        pairs = [(r, v) for r in honest for v in honest if r is not v]
        wrong = sum(not v.group.trees.current.subtree_paths(v.id) <= r.group.trees.current.subtree_paths(v.id)
                    for r, v in pairs)
        return round(wrong / len(pairs), 4)
    if mode == "stats-forge":  # members whose layout cuts at the prefix the insider made up
        cut = params.sentry_max_prefix_tokens - 1
        return round(sum(cut in n.group.sentry.layout.lengths for n in honest) / len(honest), 4)
    if mode == "layout-pin":  # members that took the pinned layout
        return round(len(adopted) / len(honest), 4)
    if mode == "origin-flood":  # members that never admitted the member who joined
        return round(sum(late.id not in n.group.trees.current.origins() for n in honest) / len(honest), 4)
    return None  # capacity-lie, claim-and-lie: the share of requests it drew


async def _rounds(members, clock, params, count: int) -> None:
    """`count` gossip rounds of group time: every member's round, then the clock moves on.
    A round that raises is skipped, as the gossip loop (`GroupGossip._run`) skips it."""
    for _ in range(count):
        for member in members:
            try:
                await member.gossip.round()
            except Exception:  # noqa: BLE001 - counted: the member sent nothing this round
                member.failed_rounds = getattr(member, "failed_rounds", 0) + 1
        clock.t += params.gossip_interval_s


async def _attack(mode: str, bad, honest, params, clock) -> None:
    """One round of the insider's messages to every honest member. The insider paces itself
    to one message per member per `gossip_min_spacing_s` (faster ones are refused unread), so
    a round carries at most `gossip_interval_s / gossip_min_spacing_s` messages per member;
    the clock moves on by the spacing after each."""
    # (getattr: the same scenario also runs on code from before the spacing rule, unpaced,
    # to measure what the attacks did there)
    spacing = getattr(params, "gossip_min_spacing_s", 0.0)
    slots = max(1, int(params.gossip_interval_s / spacing)) if spacing else params.group_split_size
    plans = {target.id: _plan(mode, bad, honest, target, params)[:slots] for target in honest}
    for k in range(max(len(p) for p in plans.values())):
        for target in honest:
            if k < len(plans[target.id]):
                await bad.send(target, plans[target.id][k]())
        clock.t += spacing


def _plan(mode: str, bad, honest, target, params) -> list:
    """The insider's messages for `target` this round, most useful first (each a callable, so
    that its sequence number is drawn when it is sent)."""
    from gentorrent.routing.chunking import ChunkLayout
    from gentorrent.routing.hrtree import HRTree
    from gentorrent.routing.sentry import PrefixStat, StatsRecord
    from testkit.gossip_group import own_delta

    layout = target.group.sentry.layout
    others = [n for n in honest if n is not target]
    bogus = PrefixStat(params.sentry_max_prefix_tokens - 1, b"\x07" * 8, params.sentry_sample_size)
    if mode == "subtree-forge":
        return [lambda v=v: bad.message(tree_delta=own_delta(v.id, [], version=2**64 - 1, layout=layout,
                                                             params=params), layout=layout, active=BUSY)
                for v in others]
    if mode == "stats-forge":  # its own record first, then records in the others' names
        return [lambda s=s: bad.message(
                    sentry_stats=StatsRecord(s.id, layout.epoch, 2**32 - 1, params.sentry_sample_size,
                                             True, (bogus,)).encode(),
                    layout=layout, tree_delta=_empty(bad, layout, params), active=BUSY)
                for s in [bad, *others]]
    if mode == "layout-pin":
        pinned = ChunkLayout(2**32 - 1, (bogus.length, params.sentry_separator_tokens),
                             params.default_chunk_length, params.max_tree_depth)
        return [lambda: bad.message(layout=pinned, active=BUSY)]
    if mode == "origin-flood":
        return [lambda: bad.message(tree_delta=own_delta(secrets.token_hex(32), [[5, 6, 7]], version=1,
                                                         layout=layout, params=params),
                                    layout=layout, active=BUSY)
                for _ in range(params.group_split_size)]
    if mode == "capacity-lie":
        return [lambda: bad.message(active=1, capacity=10, layout=layout,
                                    tree_delta=_empty(bad, layout, params))]
    # claim-and-lie: every subtree it heard, as its own, and an idle engine
    scratch = HRTree(bad.id, layout, params)
    for delta in bad.heard.values():
        scratch.merge_delta(delta)
    paths = sorted(set().union(*(scratch.subtree_paths(o) for o in scratch.origins() if o != bad.id)))
    return [lambda: bad.message(active=0, layout=layout,
                                tree_delta=own_delta(bad.id, paths, version=max(1, bad._seq),
                                                     layout=layout, params=params))]


def _empty(bad, layout, params) -> bytes:
    """The insider's own (empty) subtree, at a version its clock allows."""
    from testkit.gossip_group import own_delta

    return own_delta(bad.id, [], version=max(1, bad._seq), layout=layout, params=params)


class _Session:
    def __init__(self, prefix) -> None:
        self.prefix = prefix
        self.holder = ""


class _Phase:
    def __init__(self) -> None:
        self.sent = self.answered = self.follow_ups = self.affine = self.to_insider_n = 0

    @property
    def affinity(self) -> float:
        return round(self.affine / max(1, self.follow_ups), 4)

    @property
    def to_insider(self) -> float:
        return round(self.to_insider_n / max(1, self.sent), 4)


class _Workload:
    """Sessions with 600-token prefixes; follow-ups and new requests enter at random members."""

    def __init__(self, rng: random.Random, sessions: int) -> None:
        self.rng = rng
        self.sessions = [_Session(self._tokens(600)) for _ in range(sessions)]

    def _tokens(self, n: int):
        import numpy as np

        return np.random.default_rng(self.rng.getrandbits(32)).integers(0, 49_000, n)

    def join(self, node, now: float, count: int) -> list[_Session]:
        new = [_Session(self._tokens(600)) for _ in range(count)]
        for s in new:
            node.serve(s.prefix, now)
        self.sessions += new
        return new

    def background(self, members, now: float, count: int) -> None:
        """`count` new requests (not measured) enter at random members."""
        by_id = {m.id: m for m in members}
        for _ in range(count):
            self._route(self.rng.choice(members), self._tokens(800), by_id, now)

    def measure(self, members, insider_id: str, now: float) -> _Phase:
        import numpy as np

        phase = _Phase()
        honest_ids = {m.id for m in members}
        by_id = {m.id: m for m in members}
        for s in self.sessions:
            entry = self.rng.choice([m for m in members if m.id != s.holder])
            d = self._route(entry, np.concatenate([s.prefix, self._tokens(200)]), by_id, now)
            phase.sent += 1
            phase.follow_ups += 1
            phase.affine += d.node_id == s.holder
            phase.answered += d.node_id == s.holder
            phase.to_insider_n += d.node_id == insider_id
        for _ in range(len(self.sessions) // 2):
            d = self._route(self.rng.choice(members), self._tokens(800), by_id, now)
            phase.sent += 1
            phase.answered += d.node_id in honest_ids
            phase.to_insider_n += d.node_id == insider_id
        return phase

    @staticmethod
    def _route(entry, tokens, by_id: dict, now: float):
        """Algorithm 2 at the entry member; a forward is served where it lands (hops = 1), so
        the serving member's own subtree grows as its engine's cache would."""
        d = entry.serve(tokens, now)
        target = by_id.get(d.node_id)
        if d.forward and target is not None:
            target.group.decide(tokens, 1, now, target.load)
        return d
