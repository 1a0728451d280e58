"""Verifier fault scenarios: kill -9/pause, partitions, a Byzantine member (see the package
docstring for the contract)."""

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
