"""Fault scenarios shared by the tests (tests/test_faults_*.py) and the results table
(bench/reliability.py): each is `async def name(root, seed, quick) -> dict` with the keys of
bench.reliability.Outcome (requests_sent, answered, lost, failed_clearly, committed_txs_lost,
forks, recover_s, note, extra); the tests assert on that dict, the bench prints it.

Every scenario builds its own real processes/servers under `root` on 127.0.0.1 and tears
them down; `seed` fixes every random choice (which node dies when), so a failure replays.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path

from gentorrent.crypto.keys import Identity
from gentorrent.testing.committee import (Ledger, ProxiedCommittee, audit, home_secrets_hex,
                                        scan_for_secrets)
from verifier.consensus.types import Vote, VoteType, encode_message


def _verifier_outcome(ledger: Ledger, a, recover_s: float | None, note: str, extra: dict) -> dict:
    sent = len(ledger.accepted) + ledger.refused
    return {"requests_sent": sent, "answered": len(ledger.accepted), "lost": 0,
            "failed_clearly": ledger.refused, "committed_txs_lost": a.committed_txs_lost, "forks": a.forks,
            "recover_s": recover_s, "note": note,
            "extra": {"height": a.height, "app_hashes_equal": a.app_hashes_equal,
                      "evidence_against": a.evidence_against, **extra}}


async def _submit_for(c: ProxiedCommittee, ledger: Ledger, seconds: float, counter: list[int],
                      interval: float = 0.4) -> None:
    """Submit registrations at a steady pace to whichever live node accepts them."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        live = [i for i in range(c.n) if c.alive(i)]
        counter[0] += 1
        await c.submit(ledger, counter[0], live)
        await asyncio.sleep(interval)


async def verifier_kills(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """kill -9 a random validator at a random moment (several times), SIGSTOP/SIGCONT one,
    restart each; registrations are submitted throughout. Then: no fork, nothing lost,
    identical app hashes, no evidence against anyone (all are honest)."""
    rng = random.Random(seed)
    c = await ProxiedCommittee(Path(root), seed=seed).start()
    ledger, counter = Ledger(), [0]
    rounds = 2 if quick else 4
    recover: list[float] = []
    try:
        await c.wait_height(list(range(c.n)), 2, 90)
        for _ in range(rounds):
            victim = rng.randrange(c.n)
            await _submit_for(c, ledger, rng.uniform(0.3, 2.0), counter)  # a random moment
            c.kill(victim, signal.SIGKILL)
            await _submit_for(c, ledger, 2.0, counter)
            before = await c.top_height()
            c.start_node(victim)
            recover.append(await c.wait_height([victim], before, 90))
        paused = rng.randrange(c.n)
        c.kill(paused, signal.SIGSTOP)
        await _submit_for(c, ledger, 3.0, counter)
        c.kill(paused, signal.SIGCONT)
        before = await c.top_height()
        recover.append(await c.wait_height([paused], before, 90))
        await _submit_for(c, ledger, 1.0, counter)
        a = await audit(c, ledger)
        secrets = scan_for_secrets(c.logs(), [x for h in c.homes for x in home_secrets_hex(h)])
    finally:
        await c.stop()
    return _verifier_outcome(ledger, a, max(recover), f"{rounds} kill -9 + restart, 1 SIGSTOP/SIGCONT, seed {seed}",
                             {"secret_hits_in_logs": secrets, "recover_each_s": [round(r, 2) for r in recover]})


async def verifier_partitions(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """2-2 partition (no quorum: no commit, no fork), then 3-1 (the three progress), then heal
    (the fourth catches up, identical app hash); registrations submitted throughout."""
    c = await ProxiedCommittee(Path(root), seed=seed).start()
    ledger, counter = Ledger(), [0]
    names = [f"v{i}" for i in range(c.n)]
    hold = 4.0 if quick else 8.0
    try:
        await c.wait_height(list(range(c.n)), 2, 90)
        c.net.partition([names[:2], names[2:]])
        await asyncio.sleep(1.5)  # a height in flight may still finish
        h_split = await c.top_height()
        await _submit_for(c, ledger, hold, counter)
        h_after_split = await c.top_height()
        c.net.partition([names[:3], names[3:]])
        t_majority = time.monotonic()
        await _submit_for(c, ledger, 1.0, counter)
        await c.wait_height([0, 1, 2], h_after_split + 3, 90)
        majority_s = time.monotonic() - t_majority
        await _submit_for(c, ledger, hold / 2, counter)
        c.net.heal()
        h_healed = await c.top_height()
        heal_s = await c.wait_height([3], h_healed, 90)
        a = await audit(c, ledger)
    finally:
        await c.stop()
    stalled = h_after_split - h_split
    out = _verifier_outcome(ledger, a, heal_s, f"2-2 for {hold:.0f} s, 3-1, heal, seed {seed}",
                            {"heights_gained_in_2_2": stalled,
                             "s_to_3_blocks_in_3_1": round(majority_s, 2),
                             "heal_catch_up_s": round(heal_s, 2)})
    return out


async def verifier_byzantine(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """Validator 3 turns Byzantine: it equivocates (two signed prevotes for different blocks at
    the current height, sent to every honest node), and someone sends votes in the name of
    validators 0..2 with invalid signatures. The forgeries must be ignored (no evidence against
    honest nodes, no fork); the equivocation may only ever count against validator 3."""
    rng = random.Random(seed)
    c = await ProxiedCommittee(Path(root), seed=seed).start()
    ledger, counter = Ledger(), [0]
    home3 = c.homes[3]
    byz = Identity.from_pem((home3 / "identity.key.pem").read_bytes())
    stranger = Identity.generate()
    chain = c.genesis.chain_id
    acks: dict[str, int] = {}
    try:
        await c.wait_height(list(range(c.n)), 2, 90)
        c.kill(3, signal.SIGKILL)  # its own process would sign honestly: the attacker replaces it
        rounds = 6 if quick else 15

        def signed(kind: str, vtype: VoteType, height: int, validator: int, key: Identity) -> tuple[str, Vote]:
            v = Vote(vtype, height, 0, rng.randbytes(32), validator)
            return kind, Vote(v.type, v.height, v.round, v.block_hash, validator, key.sign(v.sign_bytes(chain)))

        async def attack(i: int) -> None:
            """Votes for node i's current height, sent at once (heights pass in ~0.3 s)."""
            h = await c.height(i)
            if h is None:
                return
            msgs = [signed("equivocation", VoteType.PREVOTE, h + 1, 3, byz) for _ in range(2)]
            msgs += [signed("forged", VoteType.PRECOMMIT, h + 1, victim, stranger) for victim in range(3)]
            for kind, msg in msgs:
                ack = await c.send_consensus(i, encode_message(msg))
                acks[f"{kind}:{ack.ok}"] = acks.get(f"{kind}:{ack.ok}", 0) + 1

        for _ in range(rounds):
            await asyncio.gather(*(attack(i) for i in range(3)))
            await _submit_for(c, ledger, 0.3, counter)
        c.start_node(3)  # back to honest; it must still follow the one chain
        await _submit_for(c, ledger, 1.0, counter)
        a = await audit(c, ledger)
    finally:
        await c.stop()
    honest_accused = sum(a.evidence_against.get(i, 0) for i in range(3))
    out = _verifier_outcome(ledger, a, 0.0, f"validator 3 equivocates, forged votes for 0..2, {rounds} rounds",
                            {"acks": acks, "evidence_against_honest": honest_accused})
    if honest_accused:
        out["note"] += f"; EVIDENCE AGAINST HONEST NODES: {honest_accused}"
        out["forks"] = out["forks"] or 0
    return out


# --------------------------------------------------------------------------- relays

RELAY_CLOVES_N, RELAY_CLOVES_K = 4, 2
RELAY_MODES = ("kill", "hang", "drop", "corrupt", "replay")


class FaultyNextHop:
    """What a misbehaving relay does to the cloves it forwards to the next relay.

    Installed in place of one relay's `_relay_stub` (looked up per call), so the relay's
    own code runs unchanged up to the moment it sends: a drop is silent (the sender gets ok),
    a corruption flips one byte of the onion layer, a replay sends the same clove twice, a
    hang holds it past every deadline (a paused process, as seen by its neighbours)."""

    def __init__(self, inner, mode: str, rng: random.Random, counts: dict, hang_s: float) -> None:
        self.inner, self.mode, self.rng, self.counts, self.hang_s = inner, mode, rng, counts, hang_s

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def Forward(self, envelope, timeout=None):
        from gentorrent.wire import gentorrent_pb2 as pb
        self.counts[self.mode] = self.counts.get(self.mode, 0) + 1
        if self.mode == "drop":
            return pb.Ack(ok=True)
        if self.mode == "hang":
            await asyncio.sleep(self.hang_s)
            return pb.Ack(ok=False, reason="hung")
        if self.mode == "corrupt":
            data = bytearray(envelope.payload)
            data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
            envelope = pb.CloveEnvelope(link_id=envelope.link_id, payload=bytes(data))
        ack = await self.inner.Forward(envelope, timeout=timeout)
        if self.mode == "replay":
            again = await self.inner.Forward(envelope, timeout=timeout)
            self.counts["replay_refused"] = self.counts.get("replay_refused", 0) + (not again.ok)
        return ack


def _make_faulty(node, mode: str, rng: random.Random, counts: dict, hang_s: float) -> None:
    relay = node.relay
    original = relay._relay_stub
    relay._relay_stub = lambda address: FaultyNextHop(original(address), mode, rng, counts, hang_s)


def _sum_drops(statuses: list[dict]) -> dict:
    total: dict[str, int] = {}
    for drops in statuses:
        for reason, n in drops.items():
            total[reason] = total.get(reason, 0) + n
    return total


async def relay_faults(root: Path, mode: str, seed: int = 0, quick: bool = False) -> dict:
    """n = 4 paths of 3 relays, k = 2: `mode` hits one relay (first or second hop) of n - k = 2 paths (relays
    that sit on no other path); the user keeps asking. Every ask must still be answered;
    failed paths are repaired (kill/hang/drop), corrupted cloves are dropped with a counted
    reason, replays are refused."""
    from gentorrent.config import CloveParams, OverlayParams
    from user_client.asking import AskError
    from user_client.localnet import ECHO_PREFIX, EchoModelNode, start_user_nodes

    if mode not in RELAY_MODES:
        raise ValueError(f"mode is one of {RELAY_MODES}")
    rng = random.Random(seed)
    cloves = CloveParams(n=RELAY_CLOVES_N, k=RELAY_CLOVES_K, path_length=3, proxies_kept=4)
    params = OverlayParams(first_reply_timeout_s=10.0, reply_idle_timeout_s=15.0, forward_timeout_s=3.0,
                           establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=12)
    root = Path(root)
    directory = root / "directory.json"
    model = EchoModelNode(root / "model", directory, cloves=cloves, params=params)
    await model.start()
    nodes = await start_user_nodes(14, directory, root, cloves=cloves, params=params, maintain=False)
    me = nodes[0]
    counts: dict[str, int] = {}
    sent = answered = clear = 0
    recover_s = None
    try:
        await me.paths.fill()
        await me.ask("warm up")
        used = sorted(me.paths.pool.usable(time.monotonic()), key=lambda p: p.path_id)
        on_paths: dict[str, int] = {}
        for p in used:
            for r in p.relays:
                on_paths[r] = on_paths.get(r, 0) + 1
        victims = []  # one relay (not the last: it forwards to a relay) per path, on no other path
        for p in used:
            alone = [r for r in p.relays[:-1] if on_paths[r] == 1]
            if alone and len(victims) < cloves.n - cloves.k:
                victims.append(alone[0])
        by_address = {n.address: n for n in nodes}
        for v in victims:
            if mode == "kill":
                await by_address[v].stop()
            else:
                _make_faulty(by_address[v], mode, rng, counts, hang_s=3 * params.forward_timeout_s)
        asks = 4 if quick else 10
        built_before = me.paths.built
        fault_end = time.monotonic()
        for i in range(asks):
            prompt = f"ask {i} under {mode}"
            sent += 1
            try:
                answer = await asyncio.wait_for(me.ask(prompt), 60)
                if answer.text == ECHO_PREFIX + prompt:
                    answered += 1
                    if recover_s is None:
                        recover_s = time.monotonic() - fault_end
            except (AskError, asyncio.TimeoutError):
                clear += 1
        await asyncio.sleep(0.5)
        await me.paths.fill()
        pool = me.paths.pool.usable(time.monotonic())
        dead = set(victims) if mode == "kill" else set()
        repaired = len(pool) >= cloves.n and not any(set(p.relays) & dead for p in pool)
        # paths through a faulty relay now: a rebuilt path may pick it again (small network)
        # until it is suspected twice; a silent drop is never noticed (see the report)
        still_faulty = sum(1 for p in pool if set(p.relays) & set(victims))
        rebuilt = me.paths.built - built_before
        relay_drops = _sum_drops([n.relay.status()["drops"] for n in nodes if n is not me])
        status = me.status()
    finally:
        for n in nodes:
            await n.stop()
        await model.stop()
    return {"requests_sent": sent, "answered": answered, "lost": sent - answered - clear, "failed_clearly": clear,
            "committed_txs_lost": None, "forks": None, "recover_s": recover_s,
            "note": f"{mode} on a relay of {len(victims)} of {cloves.n} paths (k = {cloves.k}); "
                    f"{rebuilt} paths rebuilt, {still_faulty} still through a faulty relay",
            "extra": {"victims": len(victims), "fault_hits": counts, "relay_drops": relay_drops,
                      "model_intake_drops": model.intake.drops.as_dict(), "asker_drops": status["asking"]["drops"],
                      "paths_after": len(pool), "paths_repaired": repaired,
                      "paths_still_through_faulty_relay": still_faulty,
                      "paths_rebuilt": rebuilt}}
