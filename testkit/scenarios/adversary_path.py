"""Attacks on the anonymous path, run on the real overlay (see the package docstring for the contract).

Each scenario starts an overlay of in-process user nodes (real Relay servers over mutual TLS on
127.0.0.1) and the echo model node (the real clove intake), gives one or more nodes the code
of an attacker, lets an honest user ask, and reports what the attacker achieved. In-process
on purpose, as in testkit.scenarios.relays: a relay that tags, replays, times or steals link
IDs is a malicious relay's own code, which needs that relay's keys; the nodes around it run
the shipped code unchanged. Attacks use what the attacker really holds: its own path
entries, the cloves it relays, its own registered keys.

Every scenario returns the keys of bench.reliability.Outcome. `extra["attacker"]` holds
`attempts` (what the attacker tried), `successes` (how often it got what it wanted),
`success_rate` and `cost` (what it spent). **An attack that succeeds counts as lost**: `lost`
is the asks lost plus the attacker's successes, so a row survives only if the asks were
answered and the attack failed. The note says both.

    adv_tagging           hop 1 XORs a pattern into cloves; a colluding proxy looks for it
    adv_replay_flush      hop 1 floods its successor with junk on the link, then replays cloves
    adv_onion_replay      an establishment onion replayed after its path expired
    adv_link_theft        a registered node that knows a link ID sends on it (not a neighbour)
    adv_peer_quota        an attacker exhausts a relay's per-peer quota; the victim then builds
    adv_model_amplify     a stranger, then a registered proxy naming 16 routes, at a model node
    adv_position_timing   every relay times its hop-local acks to guess its position
    adv_position_alone    each relay alone, with the model node, guesses hop 1 from frames and timing
    adv_reply_linking     the model node links asks by their reply routes
    adv_sizes_tokens      relays read prompt length from sizes and token counts from reply cloves
    adv_address_hijack    the model node's and a relay's addresses registered with another key
    adv_nonce_reuse       k proxies replay a query's cloves after the model node forgot it
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import random
import statistics
import time
from pathlib import Path

ADVERSARY_SCENARIOS = ("adv_tagging", "adv_replay_flush", "adv_onion_replay", "adv_link_theft", "adv_peer_quota",
                       "adv_model_amplify", "adv_position_timing", "adv_position_alone", "adv_reply_linking", "adv_sizes_tokens",
                       "adv_address_hijack", "adv_nonce_reuse")
_ADDED: contextvars.ContextVar[list] = contextvars.ContextVar("adv_position_alone_added")
TAG_PATTERN = bytes.fromhex("5a") * 16  # what a tagging hop XORs into a clove body
PROMPT = "What is the boiling point of water at the top of Mount Everest, roughly?"


# --------------------------------------------------------------------------- the overlay


def _params(**changes):
    from gentorrent.config import CloveParams, OverlayParams

    cloves = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
    base = dict(first_reply_timeout_s=8.0, reply_idle_timeout_s=10.0, forward_timeout_s=3.0,
                establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=12)
    base.update(changes)
    return cloves, OverlayParams(**base)


class Net:
    """An echo model node and `users` user nodes, in this process, on 127.0.0.1."""

    def __init__(self, root: Path, users: int = 10, chunks: int = 1, chunk_delay_s: float = 0.0,
                 cloves=None, **params) -> None:
        """`cloves`: CloveParams other than the scenarios' (4 proxies kept); `params`: changes
        to their OverlayParams."""
        self.root, self.users, self.chunks, self.chunk_delay_s = Path(root), users, chunks, chunk_delay_s
        self.cloves, self.params = _params(**params)
        self.cloves = cloves or self.cloves
        self.model = None
        self.nodes: list = []

    async def __aenter__(self) -> "Net":
        from testkit.echo_model import EchoModelNode
        from testkit.localnet import start_user_nodes

        directory = self.root / "directory.json"
        self.model = EchoModelNode(self.root / "model", directory, chunks=self.chunks, cloves=self.cloves,
                                   params=self.params, chunk_delay_s=self.chunk_delay_s)
        await self.model.start()
        self.nodes = await start_user_nodes(self.users, directory, self.root, cloves=self.cloves,
                                            params=self.params, maintain=False, rng=random.Random(7))
        return self

    async def __aexit__(self, *exc) -> None:
        for node in self.nodes:
            await node.stop()
        await self.model.stop()

    @property
    def me(self):
        return self.nodes[0]

    def by_id(self, node_id: str):
        return next(n for n in self.nodes if n.node_id_hex == node_id)

    async def pin_paths(self, relays: list[list]) -> list:
        """Replace the asker's paths by paths over exactly these relays (user nodes, first hop first)."""
        me = self.me
        for path in list(me.paths.pool.paths.values()):
            me.paths.pool.remove(path)
        built = [await me.paths.establish_through([n.record for n in hops]) for hops in relays]
        if any(p is None for p in built):
            raise RuntimeError("could not build the pinned paths")
        return built

    async def ask(self, tally: dict, prompt: str = PROMPT, **kwargs) -> object | None:
        from testkit.echo_model import ECHO_PREFIX
        from user_client.asking import AskError

        tally["sent"] = tally.get("sent", 0) + 1
        try:
            answer = await asyncio.wait_for(self.me.ask(prompt, **kwargs), 60)
        except AskError as exc:
            tally["clear"] = tally.get("clear", 0) + 1
            tally.setdefault("errors", []).append(str(exc)[:200])
            return None
        except asyncio.TimeoutError:
            tally["lost"] = tally.get("lost", 0) + 1
            return None
        ok = answer.text == ECHO_PREFIX + prompt
        tally["answered" if ok else "lost"] = tally.get("answered" if ok else "lost", 0) + 1
        return answer


def _outcome(tally: dict, attempts: int, successes: int, cost: str, note: str, **extra) -> dict:
    rate = round(successes / attempts, 3) if attempts else None
    sent, answered = tally.get("sent", 0), tally.get("answered", 0)
    return {"requests_sent": sent or None, "answered": answered if sent else None,
            "lost": tally.get("lost", 0) + successes, "failed_clearly": tally.get("clear", 0) if sent else None,
            "committed_txs_lost": None, "forks": None,
            "recover_s": 0.0 if answered or not sent else None,
            "note": f"attacker: {successes} of {attempts} succeeded ({'n/a' if rate is None else f'{100 * rate:.0f} %'}), "
                    f"cost {cost}; {note}",
            "extra": {"attacker": {"attempts": attempts, "successes": successes, "success_rate": rate,
                                   "cost": cost}, "asks": tally, **extra}}


def _others(net: Net, exclude: set) -> list:
    return [n for n in net.nodes[1:] if n.node_id_hex not in exclude]


async def _settle(net: Net, seconds: float = 0.3) -> None:
    await asyncio.sleep(seconds)


# --------------------------------------------------------------------------- tagging


async def adv_tagging(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """Hop 1 XORs a fixed pattern into the body of every clove it relays on the user's path;
    the proxy of that path, colluding, XORs it out again and tries to open the clove. If it
    opens, the two have confirmed that this user talks to this model node."""
    from gentorrent.crypto import onion
    from gentorrent.wire import gentorrent_pb2 as pb

    asks = 4 if quick else 12
    async with Net(root, users=13) as net:
        tagger, honest, colluder, *rest = net.nodes[1:]
        counts = {"tagged": 0, "seen_by_colluder": 0, "confirmed": 0}
        send = tagger.relay._send

        def tagging_send(node_id, forward, cloves, ack=False):
            if forward and node_id == honest.node_id_hex:
                tagged = []
                for c in cloves:
                    body = bytearray(c.payload)
                    body[64:80] = bytes(a ^ b for a, b in zip(body[64:80], TAG_PATTERN))
                    tagged.append(pb.Clove(link_id=c.link_id, payload=bytes(body)))
                    counts["tagged"] += 1
                cloves = tagged
            return send(node_id, forward, cloves, ack)

        tagger.relay._send = tagging_send
        on_cloves = colluder.relay.on_cloves

        def colluding_on_cloves(link, batch):
            if batch.forward and link.peer.node_id == honest.node_id_hex:
                for c in batch.cloves:
                    entry = colluder.relay.table._by_in.get(c.link_id)
                    if entry is None or not entry.is_proxy:
                        continue
                    counts["seen_by_colluder"] += 1
                    body = bytearray(c.payload)
                    body[64:80] = bytes(a ^ b for a, b in zip(body[64:80], TAG_PATTERN))
                    try:
                        onion.open_forward(entry.keys, bytes(body))
                        counts["confirmed"] += 1
                    except onion.CloveLayerError:
                        pass
            return on_cloves(link, batch)

        colluder.relay.on_cloves = colluding_on_cloves
        tally: dict = {}
        for i in range(asks):  # the user keeps a path through both (re-pinned: a persistent attacker)
            await net.pin_paths([[tagger, honest, colluder], rest[0:3], rest[3:6], [rest[6], rest[0], rest[4]]])
            await net.ask(tally, f"{PROMPT} {i}")
        await _settle(net)
        drops = honest.relay.drops.as_dict()
    return _outcome(tally, counts["tagged"], counts["confirmed"], f"{counts['tagged']} tagged cloves",
                    f"{counts['seen_by_colluder']} tagged cloves reached the colluding proxy; the honest hop "
                    f"between them dropped {drops.get('bad_layer', 0)} as bad_layer",
                    counts=counts, honest_hop_drops=drops)


# --------------------------------------------------------------------------- replay


async def adv_replay_flush(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """Hop 1 keeps the cloves it relays, floods its successor with junk on the same link (enough
    to flush a 65,536-entry FIFO of digests), then replays every kept clove. A replay that the
    successor passes on produces byte-identical output at every later hop: a tag."""
    from gentorrent.wire import gentorrent_pb2 as pb

    flood = 4096 if quick else 65_536
    async with Net(root, users=13) as net:
        attacker, victim, *rest = net.nodes[1:]
        await net.pin_paths([[attacker, victim, rest[0]], rest[1:4], rest[4:7], [rest[7], rest[1], rest[4]]])
        kept: list[tuple[str, pb.Clove]] = []
        send = attacker.relay._send

        def keeping_send(node_id, forward, cloves, ack=False):
            if forward and node_id == victim.node_id_hex:
                kept.extend((node_id, c) for c in cloves)
            return send(node_id, forward, cloves, ack)

        attacker.relay._send = keeping_send
        tally: dict = {}
        for i in range(2 if quick else 5):
            await net.ask(tally, f"{PROMPT} {i}")
        await _settle(net)
        passed_on: list = []
        victim_send = victim.relay._send

        def counting_send(node_id, forward, cloves, ack=False):
            if forward:
                passed_on.extend(cloves)
            return victim_send(node_id, forward, cloves, ack)

        victim.relay._send = counting_send
        link = attacker.relay.hub.link_to(victim.node_id_hex)
        link_id = kept[0][1].link_id
        t0 = time.monotonic()
        for start in range(0, flood, 512):  # junk: right link ID, right size, random bytes
            size = len(kept[0][1].payload)
            link.send(True, [pb.Clove(link_id=link_id, payload=os.urandom(size)) for _ in range(min(512, flood - start))])
            await asyncio.sleep(0)
        refused = await asyncio.wait_for(link.send(True, [c for _, c in kept], ack=True), 60)
        flood_s = time.monotonic() - t0
        await _settle(net)
        reasons: dict[str, int] = {}
        for _, reason in refused:
            reasons[reason.value] = reasons.get(reason.value, 0) + 1
        replayed = len(kept)
        accepted = replayed - len(refused)
        passed = len(passed_on)
        await net.ask(tally, f"{PROMPT} after the flood")
    return _outcome(tally, replayed, accepted, f"{flood} junk cloves, {1000 * flood_s:.0f} ms",
                    f"replays refused: {reasons}; junk and replays the victim passed on: {passed}",
                    replayed=replayed, replay_refused=reasons, passed_on=passed,
                    victim_drops=victim.relay.drops.as_dict())


async def adv_onion_replay(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """The hop before a relay keeps the establishment onion it passed on; once the path has
    expired at that relay it sends the onion again: would the relay re-install the same keys and
    link IDs (so that old cloves, kept too, flow again)? Tried at once, after idle expiry, and an
    hour later (the relay's clock moved on)."""
    async with Net(root, users=8) as net:
        attacker, victim, last = net.nodes[1:4]
        onions: list[bytes] = []
        on_establish = victim.relay.on_establish

        async def keeping(link, request):
            if link.peer.node_id == attacker.node_id_hex:
                onions.append(bytes(request.onion))  # exactly what the attacker sent
            return await on_establish(link, request)

        victim.relay.on_establish = keeping
        path = (await net.pin_paths([[attacker, victim, last]]))[0]  # the user's own establishment
        link = attacker.relay.hub.link_to(victim.node_id_hex)
        results = {}
        reply = await link.establish(onions[0], 5)  # 1. at once, the path still up
        results["while_up"] = reply.reason or "accepted"
        victim.relay.table.idle_expiry_s = 0.0  # 2. the path expired (idle)
        await asyncio.sleep(0.01)
        victim.relay.expire()
        reply = await link.establish(onions[0], 5)
        results["after_expiry"] = reply.reason or "accepted"
        victim.relay.table.idle_expiry_s = 0.0
        await asyncio.sleep(0.01)
        victim.relay.expire()
        wall = victim.relay.wall_clock
        victim.relay.wall_clock = lambda: wall() + 3600  # 3. an hour later
        reply = await link.establish(onions[0], 5)
        results["an_hour_later"] = reply.reason or "accepted"
        assert path is not None
    accepted = sum(1 for r in results.values() if r == "accepted")
    return _outcome({}, len(results), accepted, "3 replayed onions", ", ".join(f"{k}: {v}" for k, v in results.items()),
                    results=results)


# --------------------------------------------------------------------------- who may send on a link


async def adv_link_theft(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """A registered node that knows a link ID of a path it is not on (a link ID leaks easily:
    both ends of the link hold it) sends forward and return cloves on it to the relay."""
    from gentorrent.wire import gentorrent_pb2 as pb

    async with Net(root, users=10) as net:
        first, middle, last, thief = net.nodes[1:5]
        taps: list[tuple[str, bytes, bytes]] = []
        middle.relay.tap = lambda e, l, p: taps.append((e, l, p))
        rest = net.nodes[5:]
        await net.pin_paths([[first, middle, last], rest[0:3], [rest[3], rest[4], rest[0]], [rest[1], rest[3], rest[2]]])
        tally: dict = {}
        await net.ask(tally)
        await _settle(net)
        fwd = next((l, p) for e, l, p in taps if e == "forward_in")
        ret = next((l, p) for e, l, p in taps if e == "return_in")
        link = thief.relay.hub.link_to(middle.node_id_hex)
        attempts = 20
        refused = 0
        for _ in range(attempts // 2):
            r1 = await asyncio.wait_for(link.send(True, [pb.Clove(link_id=fwd[0], payload=fwd[1])], ack=True), 10)
            r2 = await asyncio.wait_for(link.send(False, [pb.Clove(link_id=ret[0], payload=os.urandom(len(ret[1])))],
                                                  ack=True), 10)
            refused += len(r1) + len(r2)
        await net.ask(tally)
        reasons = {k: v for k, v in middle.relay.drops.as_dict().items()}
    return _outcome(tally, attempts, attempts - refused, f"{attempts} cloves on stolen link IDs",
                    f"the relay refused {refused} ({reasons})", relay_drops=reasons)


async def adv_peer_quota(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """An attacker opens as many paths through a relay as its per-peer quota allows (the old
    relay counted them against a claimed return address: the victim's); then the victim, a
    user who relays through the same relay, tries to build a path through it."""
    from gentorrent.crypto import onion

    quota = 16
    async with Net(root, users=8, max_paths_per_peer=quota) as net:
        attacker, relay, last, other = net.nodes[1:5]
        victim = net.me
        refused_attacker = 0
        link = attacker.relay.hub.link_to(relay.node_id_hex)
        for _ in range(quota + 4):
            blob, _ = onion.build_onion([onion.HopSpec(relay.keys.identity.node_id, relay.keys.onion.public_key),
                                         onion.HopSpec(last.keys.identity.node_id, last.keys.onion.public_key)],
                                        issued_s=int(time.time()))
            reply = await link.establish(blob, 5)
            refused_attacker += not reply.ok
        # (through another second hop: the attacker's paths also fill the relay's own quota as the
        # predecessor at `last`, a limit on the pair that every path through both shares)
        built = await victim.paths.establish_through([relay.record, other.record])
        peers = relay.relay.table.stats()["peers"]
    return _outcome({}, 1, int(built is None), f"{quota + 4} establishments",
                    f"{refused_attacker} of the attacker's own establishments refused (peer_limit); the victim's "
                    f"path {'was' if built is not None else 'was NOT'} built; the relay counts {peers} predecessors",
                    attacker_refused=refused_attacker)


async def adv_model_amplify(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """At a model node: (1) a stranger with no registered key opens a link and submits cloves;
    (2) a registered user node submits the k cloves of a well-formed query naming 16 reply routes
    (the other registered relays). How many reply cloves does the model node send per clove?"""
    from gentorrent.crypto.keys import Identity
    from gentorrent.overlay import sealing
    from gentorrent.overlay.links import LinkHub
    from gentorrent.wire import gentorrent_pb2 as pb

    async with Net(root, users=10) as net:
        model, attacker = net.model, net.nodes[1]
        # 1. a stranger: its own keys, never registered
        stranger_id = Identity.generate()
        hub = LinkHub(stranger_id.node_id_hex, stranger_id, attacker.index.get, attacker.channels,
                      attacker.relay, attacker.params)
        link = hub.link_to(model.keys.identity.node_id_hex)
        query = pb.OverlayQuery(request=pb.GenerateRequest(model=model.model, prompt="amplify"),
                                reply_key=os.urandom(32), k=3, issued_s=int(time.time()),
                                routes=[pb.ReplyRoute(proxy=n.keys.identity.node_id, link_id=os.urandom(16))
                                        for n in (net.nodes * 2)[:16]])
        envelopes = sealing.seal_ask(model.keys.onion.public_key, query, 4, 3).envelopes
        before = model.intake.reply_cloves
        link.send(True, [pb.Clove(payload=e) for e in envelopes[:3]])
        await asyncio.sleep(0.5)
        stranger_link_alive = link.alive
        await hub.close()
        # 2. a registered node, 16 routes
        envelopes = sealing.seal_ask(model.keys.onion.public_key, query, 4, 3).envelopes
        attacker.relay.hub.link_to(model.keys.identity.node_id_hex).send(True, [pb.Clove(payload=e) for e in envelopes[:3]])
        await asyncio.sleep(0.5)
        sent = model.intake.reply_cloves - before
        drops = model.intake.drops.as_dict()
        tally: dict = {}
        await net.ask(tally)
    return _outcome(tally, 6, sent, "6 cloves (2 x 3)",
                    f"reply cloves sent: {sent} (amplification {sent / 6:.1f}x); stranger's link "
                    f"{'open' if stranger_link_alive else 'refused'}; intake drops {drops}",
                    reply_cloves=sent, intake_drops=drops)


# --------------------------------------------------------------------------- what relays learn


async def adv_position_timing(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """Every relay asks for acks on what it forwards and times them (round trip to whatever
    answers the ack), and times the first reply clove after each forward clove on a path. It
    then guesses its position on each of the user's paths: the largest median comes first. The
    asker keeps one pool of paths (`single_use_paths` off), so each relay times many asks per
    path, more than the shipped single-use paths give it."""
    from dataclasses import replace

    asks = 10 if quick else 30
    async with Net(root, users=13, cloves=replace(_params()[0], single_use_paths=False)) as net:
        ack_rtt: dict[tuple[str, bytes], list[float]] = {}  # (relay, link it sent on; b"" to a model node)
        fwd_at: dict[tuple[str, bytes], float] = {}
        reply_delay: dict[tuple[str, bytes], list[float]] = {}
        loop = asyncio.get_running_loop()
        for node in net.nodes[1:]:
            relay = node.relay
            send = relay._send

            def timing_send(node_id, forward, cloves, ack=False, _send=send, _me=node):
                future = _send(node_id, forward, cloves, ack or forward)  # an ack on every forward
                if forward and future is not None:
                    t0, links = loop.time(), {c.link_id for c in cloves}
                    future.add_done_callback(lambda f: [ack_rtt.setdefault((_me.node_id_hex, l), []).append(
                        loop.time() - t0) for l in links])
                return future

            relay._send = timing_send

            def tap(event, link_id, payload, _me=node):
                table = _me.relay.table
                if event == "forward_in" and link_id in table._by_in:
                    fwd_at[(_me.node_id_hex, link_id)] = loop.time()
                elif event == "return_in" and link_id in table._by_out:
                    key = (_me.node_id_hex, table._by_out[link_id].link_in)
                    if key in fwd_at:
                        reply_delay.setdefault(key, []).append(loop.time() - fwd_at.pop(key))

            relay.tap = tap
        tally: dict = {}
        await net.me.paths.fill()
        for i in range(asks):
            await net.ask(tally, f"{PROMPT} {i}")
        await _settle(net)
        paths = [p for p in net.me.paths.pool.paths.values() if p.sends]
        guesses = {"ack": [0, 0], "reply_delay": [0, 0]}
        for path in paths:
            links = path.secrets.link_ids
            last = len(path.nodes) - 1
            keys = {"ack": [(node, links[h + 1] if h < last else b"") for h, node in enumerate(path.nodes)],
                    "reply_delay": [(node, links[h]) for h, node in enumerate(path.nodes)]}
            for name, table in (("ack", ack_rtt), ("reply_delay", reply_delay)):
                if not all(table.get(key) for key in keys[name]):
                    continue
                medians = [statistics.median(table[key]) for key in keys[name]]
                guessed = sorted(range(len(medians)), key=lambda h: -medians[h])  # slowest = first hop
                guesses[name][0] += sum(g == h for h, g in enumerate(guessed))
                guesses[name][1] += len(medians)
    right, total = guesses["ack"]
    rd_ok, rd_n = guesses["reply_delay"]
    p_ack, p_delay = above_chance(right, total, 1 / 3), above_chance(rd_ok, rd_n, 1 / 3)
    # one attempt: "learn positions from ack times"; it succeeds if the guesses beat chance (p < 0.01)
    return _outcome(tally, 1, int(p_ack < 0.01), f"acks on every forwarded clove over {asks} asks",
                    f"positions from ack times: {right}/{total} right (chance 1/3, p = {p_ack:.2g}); every hop of a "
                    f"path colluding, ranking their reply delays (who is ahead of whom, which the flow shows "
                    f"them anyway; a relay alone: adv_position_alone): {rd_ok}/{rd_n} right (p = {p_delay:.2g})", ack_guessed=right, ack_guesses=total, ack_p=p_ack,
                    reply_delay_guessed=rd_ok, reply_delay_guesses=rd_n, reply_delay_p=p_delay)


async def adv_position_alone(root: Path, seed: int = 0, quick: bool = False, params: dict | None = None) -> dict:
    """Each relay alone, with the model node colluding, guesses whether it is the first hop of a
    path (the proxy knows it is the proxy): (1) from the frames it gets (does its predecessor ask
    for acks, as only the asker used to?), (2) from its reply delay less the time the model node
    held that path's clove (it tells its relay when each clove came in and when the reply left
    for that proxy: the generation time, subtracted), (3) from its establishment round trip. Each
    guess is a threshold calibrated on the relays' paths of even renewal periods (their true
    positions known, as an attacker learns them from paths it builds itself) and scored on the
    odd ones; a tell succeeds when its guesses beat chance (binomial p < 0.01). `params`: changes
    to the overlay's parameters (hide_position=False: the code before the defence).

    The asker keeps a pool of paths for each renewal period (`single_use_paths` off): every relay
    then times several asks over one path and is guessed per path, which gives it more to go on
    than the shipped single-use paths, one ask each, would."""
    from dataclasses import replace

    from gentorrent.ledger.peers import USER

    windows, per_window = (8, 5) if quick else (12, 6)
    cloves = replace(_params()[0], single_use_paths=False)
    async with Net(root, users=13, cloves=cloves, **(params or {})) as net:
        loop = asyncio.get_running_loop()
        asked: set[tuple[str, bytes]] = set()  # (relay, link in) on which a forward frame asked for an ack
        fwd_at: dict[tuple[str, bytes], float] = {}
        reply_delay: list[tuple[str, bytes, float, float]] = []  # (relay, link in, forward at, delay)
        established: dict[tuple[str, bytes], float] = {}  # (relay, link in) -> establishment round trip
        for node in net.nodes[1:]:
            relay = node.relay

            def frames(link, batch, _on=relay.on_cloves, _me=node):
                if batch.forward and batch.batch and link.peer.role == USER:
                    asked.update((_me.node_id_hex, c.link_id) for c in batch.cloves)
                return _on(link, batch)

            async def timed_establish(link, request, _on=relay.on_establish, _me=node):
                t0, mine = loop.time(), []
                _ADDED.set(mine)  # this establishment's own task: the entry it adds lands here
                reply = await _on(link, request)
                if reply.ok and mine:
                    established[(_me.node_id_hex, mine[0])] = loop.time() - t0
                return reply

            def noting_add(entry, _add=relay.table.add):
                added = _ADDED.get(None)
                if added is not None:
                    added.append(entry.link_in)
                return _add(entry)

            relay.table.add = noting_add

            def tap(event, link_id, payload, _me=node):
                table = _me.relay.table
                if event == "forward_in" and link_id in table._by_in:
                    fwd_at[(_me.node_id_hex, link_id)] = loop.time()
                elif event == "return_in" and link_id in table._by_out:
                    key = (_me.node_id_hex, table._by_out[link_id].link_in)
                    if key in fwd_at:
                        at = fwd_at.pop(key)
                        reply_delay.append((*key, at, loop.time() - at))

            relay.on_cloves, relay.on_establish, relay.tap = frames, timed_establish, tap
        held: list[tuple[float, str, str]] = []  # the model node: (time, "in" | "out", proxy id)
        intake = net.model.intake

        def model_in(link, batch, _on=intake.on_cloves):
            held.extend((loop.time(), "in", link.peer.node_id) for _ in batch.cloves)
            return _on(link, batch)

        def model_out(route, blob, _send=intake._send):
            held.append((loop.time(), "out", route.proxy.hex()))
            return _send(route, blob)

        intake.on_cloves, intake._send = model_in, model_out
        shift = [0.0]
        me = net.me
        me.paths.clock = lambda: time.monotonic() + shift[0]
        tally: dict = {}
        units: list[tuple[int, int, str, bytes, str]] = []  # (window, hop, relay, link in, proxy)
        spans: list[tuple[float, float]] = []
        for w in range(windows):
            await me.paths.fill()
            for path in me.paths.pool.usable(me.paths.clock()):
                units += [(w, h, path.nodes[h], path.secrets.link_ids[h], path.proxy_id)
                          for h in range(len(path.nodes) - 1)]
            for j in range(per_window):
                t0 = loop.time()
                await net.ask(tally, f"{PROMPT} {w}.{j}")
                await _settle(net, net.params.position_cover_s + 0.05)  # every path's reply is back
                spans.append((t0, loop.time()))
            shift[0] += net.cloves.path_renewal_s + 1.0
        await _settle(net)

        def model_hold(proxy: str, start: float, end: float) -> float | None:
            ins = [t for t, kind, p in held if kind == "in" and p == proxy and start <= t <= end]
            outs = [t for t, kind, p in held if kind == "out" and p == proxy and start <= t <= end]
            return min(outs) - min(ins) if ins and outs else None

        residuals: list[tuple[int, int, float]] = []  # (window, hop, least reply delay less the model's hold)
        for w, h, relay_id, link, proxy in units:
            mine = []
            for r, l_in, at, delay in reply_delay:
                span = next((s for s in spans if s[0] <= at <= s[1]), None) if (r, l_in) == (relay_id, link) else None
                hold = model_hold(proxy, *span) if span else None
                if hold is not None:
                    mine.append(delay - hold)
            if mine:  # the least of a path's asks: what the path costs without the machine's noise
                residuals.append((w, h, min(mine)))
        tells = {
            "frames": [(w, h, float((r, l) in asked)) for w, h, r, l, _ in units],
            "reply_delay": residuals,
            "establishment": [(w, h, established[(r, l)]) for w, h, r, l, _ in units if (r, l) in established],
        }
        scores = {name: _threshold_guess(obs) for name, obs in tells.items()}
    successes = sum(1 for right, total in scores.values() if above_chance(right, total, 0.5) < 0.01)
    note = "; ".join(f"{name}: {right}/{total} right (chance 1/2, p = {above_chance(right, total, 0.5):.2g})"
                     for name, (right, total) in scores.items())
    return _outcome(tally, len(scores), successes, f"{windows * per_window} asks, every relay timing alone",
                    f"hop 1 or hop 2, guessed by each relay alone with the model node's times: {note}",
                    guesses={name: {"right": right, "total": total, "p": above_chance(right, total, 0.5)}
                             for name, (right, total) in scores.items()})


def _threshold_guess(observations: list[tuple[int, int, float]]) -> tuple[int, int]:
    """(right, total) guesses of "hop 1 when the value is above a threshold" on the odd renewal
    periods, the threshold the midpoint of the hop medians on the even ones (either side)."""
    train = [(h, v) for w, h, v in observations if w % 2 == 0]
    test = [(h, v) for w, h, v in observations if w % 2 == 1]
    first = [v for h, v in train if h == 0]
    second = [v for h, v in train if h == 1]
    if not first or not second or not test:
        return 0, 0
    m1, m2 = statistics.median(first), statistics.median(second)
    cut, above_is_first = (m1 + m2) / 2, m1 >= m2
    right = sum(1 for h, v in test if ((v > cut) == above_is_first) == (h == 0))
    return right, len(test)


def above_chance(right: int, total: int, chance: float) -> float:
    """P(at least `right` of `total` guesses right by chance): the exact binomial tail."""
    from math import comb

    return sum(comb(total, i) * chance ** i * (1 - chance) ** (total - i) for i in range(right, total + 1)) if total else 1.0


async def adv_reply_linking(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """The model node keeps the reply routes of every query and links two queries when they
    share one (a (proxy, link ID) pair), or (weaker) when their proxy sets overlap."""
    asks = 6 if quick else 10
    async with Net(root, users=10) as net:
        routes: list[set] = []
        prepare = net.model.intake._prepare

        def record_routes(ask, query):
            routes.append({(r.proxy, r.link_id) for r in query.routes})
            return prepare(ask, query)

        net.model.intake._prepare = record_routes
        tally: dict = {}
        for i in range(asks):
            await net.ask(tally, f"unrelated question {i}")
        pairs = [(a, b) for i, a in enumerate(routes) for b in routes[i + 1:]]
        linked = sum(1 for a, b in pairs if a & b)
        proxies = [{p for p, _ in r} for r in routes]
        overlapping = sum(1 for i, a in enumerate(proxies) for b in proxies[i + 1:] if a & b)
        distinct = len(set().union(*routes)) if routes else 0
    return _outcome(tally, len(pairs), linked, f"{asks} asks observed",
                    f"{distinct} distinct reply routes in {len(routes)} queries; NOT DEFENDED: {overlapping} of "
                    f"{len(pairs)} query pairs share a proxy (the user's pool of proxies)",
                    distinct_routes=distinct, queries=len(routes), proxy_set_overlaps=overlapping)


async def adv_sizes_tokens(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """A relay reads the size of every forward clove (prompt length?) and counts the reply
    cloves of every ask (token count?) and their spacing (token timing?)."""
    lengths = [10, 200, 600, 1200]
    async with Net(root, users=10, chunks=1) as net:
        seen: list[tuple[str, bytes, int, float]] = []
        loop = asyncio.get_running_loop()
        for node in net.nodes[1:]:
            node.relay.tap = lambda e, l, p, _n=node: seen.append((e, l, len(p), loop.time()))
        tally: dict = {}
        sizes = {}
        for n in lengths:
            seen.clear()
            await net.ask(tally, "x" * n)
            sizes[n] = sorted({s for e, _, s, _ in seen if e == "forward_in"})
        classes = len({tuple(v) for v in sizes.values()})
        # token counts: streamed answers of many fast chunks; a relay counts reply cloves per route
        counts = {}
        for chunks in ([8, 24] if quick else [8, 24, 60]):
            net.model.chunks, net.model.chunk_delay_s = chunks, 0.004
            seen.clear()
            await net.ask(tally, f"count my {chunks} tokens please, " * 2)
            await _settle(net)
            per_link: dict[bytes, int] = {}
            for e, l, _, _ in seen:
                if e == "return_in":
                    per_link[l] = per_link.get(l, 0) + 1
            counts[chunks] = max(per_link.values()) if per_link else 0
        exact = sum(1 for c, seen_count in counts.items() if seen_count >= c)
    return _outcome(tally, len(lengths) + len(counts), (classes - 1) + exact,
                    f"{len(lengths)} prompt lengths, {len(counts)} streamed answers",
                    f"forward sizes: {classes} class(es) for prompts of {lengths} chars; reply cloves per route for "
                    f"{list(counts)} chunks: {list(counts.values())}", forward_sizes=sizes, reply_cloves=counts)


# --------------------------------------------------------------------------- the registry, as the overlay reads it


async def adv_address_hijack(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """An attacker registers, under its own node id and certificate, the address of the model
    node and of 3 relays. Connections go by node id, so they should neither reach nor pin the
    attacker's key; the asks go on."""
    from gentorrent.crypto.keys import Identity
    from gentorrent.ledger.sections import ModelRecord, UserRecord

    async with Net(root, users=10) as net:
        tally: dict = {}
        # before any link exists (links are long-lived: an open one would never dial again)
        targets = [(net.model.record, "model")] + [(n.record, "user") for n in net.nodes[1:4]]
        for target, kind in targets:
            thief = Identity.generate()
            if kind == "model":
                net.model.directory.add_model(ModelRecord(thief.node_id, thief.public_key, target.address,
                                                          target.model, os.urandom(32), trusted=False))
            else:
                await net.me.directory.register_user(UserRecord(thief.node_id, thief.public_key, target.address,
                                                                os.urandom(32)))
        for node in net.nodes:
            await node.refresh_directory()
        await net.model.intake._refresh()
        asks = 3 if quick else 8
        for i in range(asks):
            await net.ask(tally, f"{PROMPT} {i}")
        failed = tally.get("clear", 0) + tally.get("lost", 0)
    return _outcome(tally, asks, failed, f"{len(targets)} registrations", f"{asks - failed} of {asks} asks after "
                    "the hijacking registrations (the model node's and 3 relays' addresses) answered",
                    errors=tally.get("errors", []))


async def adv_nonce_reuse(root: Path, seed: int = 0, quick: bool = False) -> dict:
    """k colluding proxies keep the cloves they hand to the model node and submit them again,
    once while the node still remembers the ask and once after it forgot it (or restarted).
    Served twice under the same reply key, would any reply (key, nonce) pair repeat?"""
    from gentorrent.overlay.reassembly import AskBook, CloveGroups
    from gentorrent.wire import gentorrent_pb2 as pb

    async with Net(root, users=10) as net:
        model = net.model
        kept: dict[str, list[bytes]] = {}
        replies: list[bytes] = []
        for node in net.nodes[1:]:
            def tap(event, link_id, payload, _n=node):
                if event == "submit_out":
                    kept.setdefault(_n.node_id_hex, []).append(bytes(payload))
                elif event == "return_in" and _n.relay.table._by_out.get(link_id) is not None \
                        and _n.relay.table._by_out[link_id].is_proxy:
                    replies.append(bytes(payload))
            node.relay.tap = tap
        tally: dict = {}
        await net.ask(tally)
        await _settle(net)
        original = list(replies)
        served_before = model.intake.served

        async def replay() -> None:
            for node_id, envelopes in list(kept.items())[:3]:
                net.by_id(node_id).relay.hub.link_to(model.keys.identity.node_id_hex).send(
                    True, [pb.Clove(payload=e) for e in envelopes])
            await _settle(net, 0.6)

        await replay()  # 1. the node still remembers
        refused_while_known = model.intake.drops.as_dict().get("replay", 0)
        intake = model.intake  # 2. it forgot the ask (a restart: a fresh table)
        intake.asks = AskBook(intake.params.max_pending_groups, intake.params.reassembly_timeout_s,
                              seen_s=intake.asks.seen_s, grace_s=intake.asks.grace_s)
        intake.groups = CloveGroups(intake.cloves.k, intake.params.max_pending_groups,
                                    intake.params.reassembly_timeout_s, max_cloves=intake.cloves.n, n=intake.cloves.n)
        replies.clear()
        await replay()
        reserved = model.intake.served - served_before
        nonces_before = {r[16:28] for r in original}
        repeats = sum(1 for r in replies if r[16:28] in nonces_before)
        await net.ask(tally)
    return _outcome(tally, len(replies), repeats, "3 proxies x their cloves, twice",
                    f"served again after forgetting: {reserved}; refused while remembered: {refused_while_known}; "
                    f"{len(replies)} reply cloves of the re-serve, {repeats} with a nonce seen before",
                    reserved=reserved, refused_while_known=refused_while_known)
