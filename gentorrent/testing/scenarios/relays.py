"""Relay fault scenarios on the real overlay (see the package docstring for the contract)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

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
