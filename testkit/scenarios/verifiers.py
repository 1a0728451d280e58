"""Verifier fault scenarios: kill -9/pause, kill -9 at exact crash points (failpoints),
partitions, a quorum that needs relayed votes, a Byzantine member (see the package docstring
for the contract)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import time
from pathlib import Path

from gentorrent import failpoints
from gentorrent.crypto.keys import Identity
from testkit.committee import Ledger, ProxiedCommittee, audit
from testkit.keyleaks import home_secrets, scan_for_secrets
from gentorrent.ledger.chain import Vote, VoteType, encode_message


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
        secrets = scan_for_secrets(c.logs(), [x for h in c.homes for x in home_secrets(h)])
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


async def verifier_gossip(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """Validator 2 is down and validator 3's link to 1 is cut one way: 0, 1 and 3 are exactly
    a quorum and 1 hears 3 only through the others' relays (verifier/consensus/gossip.py), so
    every height needs a relayed vote. The three must keep committing; then heal, restart 2,
    and everyone converges (no fork, nothing lost, identical app hashes)."""
    c = await ProxiedCommittee(Path(root), seed=seed).start()
    ledger, counter = Ledger(), [0]
    heights = 20 if quick else 100
    try:
        await c.wait_height(list(range(c.n)), 2, 90)
        c.kill(2, signal.SIGKILL)
        c.net.link("v3", "v1").blackhole()
        await asyncio.sleep(0.5)
        start_h, t0 = await c.top_height(), time.monotonic()
        waiting = asyncio.ensure_future(c.wait_height([0, 1, 3], start_h + heights, 120))
        while not waiting.done():
            counter[0] += 1
            await c.submit(ledger, counter[0], [0, 1, 3])
            await asyncio.sleep(0.4)
        cut_s = time.monotonic() - t0
        waiting.result()
        gossip = {f"v{i}": json.loads((await c.status(i)).json)["gossip"] for i in (0, 1, 3)}
        c.net.heal()
        c.start_node(2)
        recover = await c.wait_height([2], await c.top_height(), 90)
        a = await audit(c, ledger)
    finally:
        await c.stop()
    return _verifier_outcome(ledger, a, recover, f"v2 down, link v3->v1 cut for {heights} heights, seed {seed}",
                             {"heights_with_the_cut": heights, "s_per_height_with_the_cut": round(cut_s / heights, 3),
                              "gossip": gossip})


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
        c.start_node(3)  # back to honest; it must still follow the one chain (no longer a member)
        await _submit_for(c, ledger, 1.0, counter)
        a = await audit(c, ledger)
        committee = json.loads((await c.status(0)).json)["committee"]
    finally:
        await c.stop()
    honest_accused = sum(a.evidence_against.get(i, 0) for i in range(3))
    out = _verifier_outcome(ledger, a, 0.0, f"validator 3 equivocates, forged votes for 0..2, {rounds} rounds",
                            {"acks": acks, "evidence_against_honest": honest_accused,
                             "committee_size": committee["size"], "removed": committee["removed"]})
    if honest_accused:
        out["note"] += f"; EVIDENCE AGAINST HONEST NODES: {honest_accused}"
        out["forks"] = out["forks"] or 0
    return out


#: the moments a crash is most dangerous (gentorrent.failpoints.POINTS says why); quick runs
#: take those where durable state is split between two stores
CRASH_POINTS = tuple(p for p in failpoints.POINTS if p.startswith("verifier."))
QUICK_CRASH_POINTS = ("verifier.after_finalize", "verifier.after_sign", "verifier.after_commit",
                      "verifier.after_sign_proposal")


async def _submit_until(c: ProxiedCommittee, ledger: Ledger, counter: list[int], stop: asyncio.Event,
                        avoid: set[int], interval: float = 0.4) -> None:
    """Submit registrations to live nodes outside `avoid` until `stop` is set. A node armed to
    crash is avoided: a mempool is not durable (nor is CometBFT's), so a transaction only it
    accepted may die with it; what must never be lost is what a block committed."""
    while not stop.is_set():
        counter[0] += 1
        await c.submit(ledger, counter[0], [i for i in range(c.n) if c.alive(i) and i not in avoid])
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass


async def _wait_exit(c: ProxiedCommittee, i: int, point: str, timeout_s: float) -> int:
    start = time.monotonic()
    while c.exit_code(i) is None:
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"failpoint {point} armed on v{i} did not fire within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)
    return c.exit_code(i)


async def verifier_crash_points(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """kill -9 at exact moments: for each crash point in turn, a seeded validator is restarted
    with that failpoint armed for a seeded hit (2nd..4th block or signature after its start),
    dies there by SIGKILL (exit status and the "failpoint ... fired" line are checked), and is
    restarted clean; registrations are submitted throughout. Then the usual audit: no fork,
    nothing committed lost, identical app hashes, no evidence (nobody signed twice)."""
    rng = random.Random(seed)
    points = QUICK_CRASH_POINTS if quick else CRASH_POINTS
    c = await ProxiedCommittee(Path(root), seed=seed).start()
    ledger, counter, avoid, stop = Ledger(), [0], set(), asyncio.Event()
    crashes: list[dict] = []
    recover: list[float] = []
    submitter = asyncio.create_task(_submit_until(c, ledger, counter, stop, avoid))
    try:
        await c.wait_height(list(range(c.n)), 2, 90)
        for point in points:
            victim, on_hit = rng.randrange(c.n), rng.randint(2, 4)
            avoid.add(victim)
            await asyncio.to_thread(c.kill, victim, signal.SIGTERM)  # a clean stop, to restart it armed
            log_from = len(c.log_text(victim))
            c.start_node(victim, {failpoints.ENV_VAR: f"{point}=kill@{on_hit}"})
            status = await _wait_exit(c, victim, point, 90)
            fired = f"failpoint {point} fired (kill on hit {on_hit})" in c.log_text(victim)[log_from:]
            before = await c.top_height()
            c.start_node(victim)  # no failpoint: it must recover from whatever it left on disk
            recover.append(await c.wait_height([victim], before, 90))
            avoid.discard(victim)
            crashes.append({"point": point, "node": victim, "hit": on_hit, "exit": status, "fired": fired,
                            "recover_s": round(recover[-1], 2)})
        await asyncio.sleep(1.0)
        stop.set()
        await submitter
        a = await audit(c, ledger)
        logs = [c.log_text(i) for i in range(c.n)]
        # the double-sign guard at work (the node shell logs each Refused effect once)
        refused = sum(len(re.findall(r"consensus\.node \w+ refused to sign", text)) for text in logs)
        replayed = sum(text.count("replaying stored block") for text in logs)  # saved, not yet committed
        recovered = sum(text.count("recovered from the write-ahead log") for text in logs)  # signed, not logged
    finally:
        stop.set()
        await asyncio.gather(submitter, return_exceptions=True)
        await c.stop()
    all_fired = all(x["fired"] and x["exit"] == -signal.SIGKILL for x in crashes)
    note = f"kill -9 at {', '.join(p.removeprefix('verifier.') for p in points)}; restart; seed {seed}"
    if not all_fired:  # then the crash asked for was not the one tested: not survived
        note += "; A FAILPOINT DID NOT FIRE AS ARMED"
    return _verifier_outcome(ledger, a, max(recover) if all_fired else None, note,
                             {"crashes": crashes, "all_fired": all_fired, "refused_to_sign": refused,
                              "blocks_replayed_at_start": replayed, "proposals_recovered": recovered})


async def verifier_clock_skew(root: Path, seed: int = 0, quick: bool = False, skew_s: int = 3600) -> dict:
    """One validator's wall clock `skew_s` ahead, another's as far behind (libfaketime; the
    monotonic clock stays real), registrations submitted throughout. The committee must keep
    committing without a fork; block times strictly increase and never run ahead of the
    honest clocks by more than max_clock_drift_ms (the fast node's own blocks are prevoted
    nil); the slow node's TLS handshakes still work (certificates are backdated), which the
    blocks it proposed prove; nobody is accused."""
    from gentorrent.config import CONSENSUS
    from testkit import faketime

    rng = random.Random(seed)
    fast, slow = rng.sample(range(4), 2)
    env = {fast: faketime.skewed_env(skew_s), slow: faketime.skewed_env(-skew_s)}
    c = await ProxiedCommittee(Path(root), seed=seed, node_env=env).start()
    ledger, counter = Ledger(), [0]
    hold = 8.0 if quick else 30.0
    try:
        start_s = await c.wait_height(list(range(c.n)), 2, 90)
        await _submit_for(c, ledger, hold, counter)
        a = await audit(c, ledger)
        now_ms = int(time.time() * 1000)  # this process's clock is an honest one
        chain = await c.blocks(min(set(range(c.n)) - {fast, slow}), a.height)
        statuses = {i: json.loads((await c.status(i)).json) for i in (fast, slow)}
        untimely = [json.loads((await c.status(i)).json)["untimely_proposals"] for i in range(c.n)]
    finally:
        await c.stop()
    times = [b.header.time_ms for b in chain]
    keys = [v.public_key for v in c.genesis.validators]
    proposers = [keys.index(b.header.proposer) for b in chain]
    bound = CONSENSUS.max_clock_drift_ms
    ahead = max(t - now_ms for t in times)
    clock_offsets = {role: round((statuses[i]["last_commit_time_ms"] - now_ms) / 1000)
                     for role, i in (("fast", fast), ("slow", slow))}
    slow_reached = sum(1 for p in statuses[slow]["peers"].values() if p["sent"] > 0)
    extra = {"fast_node": fast, "slow_node": slow, "skew_s": skew_s,
             "node_clock_offsets_s": clock_offsets,  # measured: proves the skew was in effect
             "increasing": all(t1 > t0 for t0, t1 in zip(times, times[1:])),
             "max_block_time_ahead_ms": ahead, "bound_ms": bound,
             "blocks_by_fast": proposers.count(fast), "blocks_by_slow": proposers.count(slow),
             "slow_node_peers_reached": slow_reached, "nil_prevotes_for_untimely_proposals": untimely,
             "s_to_height_2": round(start_s, 2)}
    note = f"v{fast} clock +{skew_s} s, v{slow} -{skew_s} s (libfaketime), {hold:.0f} s of load"
    problems = []
    if not extra["increasing"]:
        problems.append("block times not increasing")
    if ahead > bound:
        problems.append(f"block time {ahead} ms ahead of honest clocks")
    if not extra["blocks_by_slow"]:
        problems.append("the slow node got no block in (TLS?)")
    if problems:  # no recovery from the skew: the table shows the row as not survived
        note += "; " + "; ".join(problems).upper()
    return _verifier_outcome(ledger, a, None if problems else 0.0, note, extra)
