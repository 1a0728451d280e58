"""Relay fault scenarios on the real overlay (see the package docstring for the contract).

Two kinds, by what the fault needs:

* `relay_process_faults` -- kill -9, SIGSTOP/SIGCONT, and a faulty link (drop, delay,
  blackhole through testkit.faultproxy) hit real `gt-user start` relay processes
  and the real echo model process: faults any operator or network can cause from outside.
* `relay_faults` -- a relay that drops, corrupts or replays the cloves it forwards. That is a
  *malicious relay's code*, not something done to a process from outside: a byte flipped on
  the wire is caught by TLS (the connection dies, which `link` already covers), and replay
  or silent drop inside TLS needs the relay's own keys. So these stay in-process, with the
  honest relay's next-hop stub swapped for a faulty one (`FaultyNextHop`); kill and hang are
  kept there too as the cheap in-process twins of kill9 and pause.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from gentorrent import settings

RELAY_CLOVES_N, RELAY_CLOVES_K = 4, 2
RELAY_MODES = ("kill", "hang", "drop", "corrupt", "replay")
_ROOT = Path(__file__).resolve().parents[2]  # the repository: cwd of spawned processes


class FaultyNextHop:
    """What a misbehaving relay does to the cloves it forwards to the next relay.

    Installed in place of one relay's `_send` (every clove it sends passes there), so the
    relay's own code runs unchanged up to the moment it sends: a drop is silent (the next hop
    never hears of the clove, the previous one saw it accepted), a corruption flips one byte
    of the layered clove, a replay sends the same clove twice, a hang holds it past every
    deadline (a paused process, as seen by its neighbours)."""

    def __init__(self, send, mode: str, rng: random.Random, counts: dict, hang_s: float,
                 is_model=lambda node_id: False) -> None:
        self.send, self.mode, self.rng, self.counts, self.hang_s = send, mode, rng, counts, hang_s
        self.is_model = is_model

    def __call__(self, node_id: str, forward: bool, cloves: list, ack: bool = False):
        from gentorrent.wire import gentorrent_pb2 as pb
        # replies, and a proxy's submissions to the model node, pass untouched (relays ask the
        # next relay for hop-local acks too, as the asker does: an ack says nothing of the hop)
        if not forward or self.is_model(node_id):
            return self.send(node_id, forward, cloves, ack)
        self.counts[self.mode] = self.counts.get(self.mode, 0) + len(cloves)
        if self.mode == "drop":
            return None
        if self.mode == "hang":
            asyncio.get_running_loop().call_later(self.hang_s, self.send, node_id, forward, cloves)
            return None
        if self.mode == "corrupt":
            bad = []
            for c in cloves:
                data = bytearray(c.payload)
                data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
                bad.append(pb.Clove(link_id=c.link_id, payload=bytes(data)))
            cloves = bad
        result = self.send(node_id, forward, cloves, ack)
        if self.mode == "replay":
            again = self.send(node_id, forward, cloves, ack=True)
            if again is not None:
                again.add_done_callback(lambda f: self._refused(f, len(cloves)))
        return result

    def _refused(self, future, sent: int) -> None:
        refused = future.result() or []
        hits = sum(1 for _, reason in refused if reason.value == "replay")
        self.counts["replay_refused"] = self.counts.get("replay_refused", 0) + hits
        self.counts["replay_sent"] = self.counts.get("replay_sent", 0) + sent


def _make_faulty(node, mode: str, rng: random.Random, counts: dict, hang_s: float) -> None:
    relay = node.relay
    relay._send = FaultyNextHop(relay._send, mode, rng, counts, hang_s,
                                is_model=lambda node_id: relay.index.model(node_id) is not None)


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
    reason, replays are refused. In-process on purpose: dropping, corrupting or replaying
    cloves inside TLS is a malicious relay's own code (see the module docstring); faults
    done to relay processes from outside are `relay_process_faults`."""
    from user_client.asking import AskError
    from testkit.echo_model import ECHO_PREFIX, EchoModelNode
    from testkit.localnet import start_user_nodes

    if mode not in RELAY_MODES:
        raise ValueError(f"mode is one of {RELAY_MODES}")
    rng = random.Random(seed)
    cloves, params = scenario_params()
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
        await me.paths.fill()  # the warm-up's single-use paths replaced: the next ask's
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
        built_before, failed_before = me.paths.built, me.paths.failed
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
        # a path is judged once the model node's word on its clove is due: the answer's delivery
        # list, or a delivery report within its grace (acks are hop-local, so not before)
        await asyncio.sleep(params.forward_timeout_s + 0.5)
        await me.paths.fill()
        pool = me.paths.pool.usable(time.monotonic())
        dead = set(victims) if mode == "kill" else set()
        repaired = len(pool) >= cloves.n and not any(set(p.relays) & dead for p in pool)
        # paths through a faulty relay now: a rebuilt path may pick it again (small network)
        # until it is suspected twice (a silent drop shows as a clove the model node never
        # listed as delivered in its reply: the path is failed like any other)
        still_faulty = sum(1 for p in pool if set(p.relays) & set(victims))
        rebuilt, failed = me.paths.built - built_before, me.paths.failed - failed_before
        relay_drops = _sum_drops([n.relay.status()["drops"] for n in nodes if n is not me])
        status = me.status()
    finally:
        for n in nodes:
            await n.stop()
        await model.stop()
    return {"requests_sent": sent, "answered": answered, "lost": sent - answered - clear, "failed_clearly": clear,
            "committed_txs_lost": None, "forks": None, "recover_s": recover_s,
            "note": f"{mode} on a relay of {len(victims)} of {cloves.n} paths (k = {cloves.k}); "
                    f"{failed} paths failed, {rebuilt} built, {still_faulty} still through a faulty relay",
            "extra": {"victims": len(victims), "fault_hits": counts, "relay_drops": relay_drops,
                      "model_intake_drops": model.intake.drops.as_dict(), "asker_drops": status["asking"]["drops"],
                      "paths_after": len(pool), "paths_repaired": repaired,
                      "paths_still_through_faulty_relay": still_faulty,
                      "paths_rebuilt": rebuilt, "paths_failed": failed}}


# --------------------------------------------------------------------------- relay processes

RELAY_PROCESS_MODES = ("kill9", "pause", "link")
RELAY_PROCESSES = 8  # relays for n = 4 paths of 3 hops: n - k paths can be hit and others left whole
LINK_PHASES = ("drop", "delay", "blackhole")  # in this order, each on freshly chosen relays, then healed
LINK_DELAY_S, LINK_JITTER_S = 0.3, 0.3  # per chunk and direction: slower, reordered cloves, no deadline hit
ASK_HANG_S = 60.0  # an ask not over by then hangs: counted lost


def scenario_params():
    """Clove and timer settings of the relay scenarios (asker and relay processes alike):
    k = 2 of n = 4 so that n - k = 2 paths may fail; short timers so faults show in seconds."""
    from gentorrent.config import CloveParams, OverlayParams

    cloves = CloveParams(n=RELAY_CLOVES_N, k=RELAY_CLOVES_K, path_length=3, proxies_kept=4)
    params = OverlayParams(first_reply_timeout_s=10.0, reply_idle_timeout_s=15.0, forward_timeout_s=3.0,
                           establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=12,
                           path_wait_s=5.0)
    return cloves, params


class RelayFleet:
    """Real `gt-user start` relay processes and the real echo model process on 127.0.0.1,
    sharing one static directory, run through devnet.supervisor as bench/load.py does.

    With `proxied`, relay i listens on a port of its own behind FaultProxy i and registers the
    proxy's address (`gt-user start --advertise`): every connection *into* the relay --
    Establish, Forward and Return from its neighbours, the model node's reply cloves, the
    asker's first clove -- crosses the proxy, in both directions. Its own outgoing calls
    do not, so a fault there is "nobody can reach this relay", not a full partition."""

    def __init__(self, root: Path, count: int, cloves, params, proxied: bool = False, seed: int = 0) -> None:
        from devnet.supervisor import Supervisor

        self.root = Path(root)
        self.directory = self.root / "directory.json"
        self.sup = Supervisor(self.root / "procs")
        self.count, self.cloves, self.params, self.proxied, self.seed = count, cloves, params, proxied, seed
        self.homes = [self.root / f"relay{i}" for i in range(count)]
        self.model_home = self.root / "model"
        self.proxies: dict[str, object] = {}  # relay address -> its FaultProxy
        self.names: dict[str, str] = {}  # relay address (as registered) -> process name
        self._proxy_by_name: dict[str, object] = {}  # every proxy started, even if start() fails later
        # every process (the model too: it splits and decodes with our k) reads these from its home
        self._config = settings.render({"cloves": cloves, "overlay": params})

    async def start(self) -> "RelayFleet":
        from devnet.supervisor import free_port_block, python_module, wait_until
        from testkit.faultproxy import FaultProxy

        env = {"PYTHONUNBUFFERED": "1"}
        self.model_home.mkdir(parents=True, exist_ok=True)
        (self.model_home / settings.CONFIG_FILE).write_text(self._config)
        model = self.sup.spawn("model", python_module(
            "testkit.echo_model", "--home", str(self.model_home), "--directory", str(self.directory)),
            env=env, cwd=_ROOT)
        await asyncio.to_thread(wait_until, lambda: '"address"' in Path(model.log).read_text(), 120,
                                "the echo model process")
        by_name = self._proxy_by_name
        for i, home in enumerate(self.homes):
            home.mkdir(parents=True, exist_ok=True)
            (home / settings.CONFIG_FILE).write_text(self._config)
            args = ["--log-level", "INFO", "start", "--home", str(home), "--directory", str(self.directory)]
            if self.proxied:
                port = free_port_block(1)
                proxy = await FaultProxy("127.0.0.1", port, seed=self.seed + i, name=f"link->relay{i}").start()
                by_name[f"relay{i}"] = proxy
                args += ["--listen", f"127.0.0.1:{port}", "--advertise", proxy.address]
            self.sup.spawn(f"relay{i}", python_module("user_client.cli", *args), env=env, cwd=_ROOT)
        await asyncio.to_thread(wait_until, lambda: all((h / "node.json").exists() for h in self.homes), 120,
                                f"{self.count} relay processes")
        for i, home in enumerate(self.homes):
            address = json.loads((home / "node.json").read_text())["address"]
            self.names[address] = f"relay{i}"
            if self.proxied:
                self.proxies[address] = by_name[f"relay{i}"]
        return self

    def signal(self, address: str, sig: int) -> None:
        self.sup.kill(self.names[address], sig)

    def api(self, address: str) -> str:
        home = self.root / self.names[address]
        return json.loads((home / "node.json").read_text())["api"]

    async def stop(self) -> None:
        import signal as signals

        for name in self.names.values():  # a paused process ignores SIGTERM until continued
            if self.sup.alive(name):
                self.sup.kill(name, signals.SIGCONT)
        await asyncio.to_thread(self.sup.stop_all, 15.0)
        for proxy in self._proxy_by_name.values():
            await proxy.stop()

    def secret_hits(self) -> dict:
        """Every process log scanned for every process's private keys (run after stop())."""
        from testkit.keyleaks import leak_report

        return leak_report(self.sup.logs.glob("*.log"), [*self.homes, self.model_home])


def choose_victims(paths, budget: int, rng: random.Random) -> tuple[list[str], set[int]]:
    """Relays that together sit on as many of `paths` as possible but never more than
    `budget` (n - k); among equal choices, more relays, then at random. Small pools only
    (subsets of at most `budget` relays are tried)."""
    import itertools

    on: dict[str, set[int]] = {}
    for p in paths:
        for r in p.relays:
            on.setdefault(r, set()).add(p.path_id)
    relays = sorted(on)
    best, best_key = ([], set()), (0, 0, 0.0)
    for size in range(1, budget + 1):
        for combo in itertools.combinations(relays, size):
            hit = set().union(*(on[r] for r in combo))
            key = (len(hit), size, rng.random())
            if len(hit) <= budget and key > best_key:
                best, best_key = (list(combo), hit), key
    return best


async def _ask_batch(me, count: int, tag: str, since: float) -> dict:
    """`count` asks one after another: answered, failed with a clear AskError, or lost (a
    wrong answer, or no end within ASK_HANG_S); latencies; seconds from `since` to the first answer."""
    from user_client.asking import AskError
    from testkit.echo_model import ECHO_PREFIX

    out = {"sent": 0, "answered": 0, "clear": 0, "lost": 0, "latency_ms": [], "first_ok_s": None}
    for i in range(count):
        prompt = f"{tag} ask {i}"
        out["sent"] += 1
        t0 = time.monotonic()
        try:
            answer = await asyncio.wait_for(me.ask(prompt), ASK_HANG_S)
        except AskError as exc:
            out["clear"] += 1
            out.setdefault("errors", []).append(str(exc)[:300])
            continue
        except asyncio.TimeoutError:
            out["lost"] += 1
            continue
        if answer.text != ECHO_PREFIX + prompt:
            out["lost"] += 1
            continue
        out["answered"] += 1
        out["latency_ms"].append(round((time.monotonic() - t0) * 1000))
        if out["first_ok_s"] is None:
            out["first_ok_s"] = round(time.monotonic() - since, 2)
    return out


async def _repair(me, faulty: set[str], n: int, sends_before: dict[int, int]) -> dict:
    """Let the path manager refill. Repaired: n usable paths, and none of them both through a
    faulty relay and used since the fault (a path nobody sent on cannot have been noticed:
    the pool may hold more paths than one ask uses, so that one is reported, not failed).
    The asker judges an ask's paths once its last reply cloves and delivery report had their
    time (up to forward_timeout_s after the answer): that is waited for first."""
    t0 = time.monotonic()
    deadline = t0 + me.params.forward_timeout_s + 1.0
    while me.asker.status()["pending"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await me.paths.fill()
    pool = me.paths.pool.usable(time.monotonic())
    through = [p for p in pool if set(p.relays) & faulty]
    tried = [p for p in through if p.sends > sends_before.get(p.path_id, 0)]
    return {"paths": len(pool), "through_faulty": len(through), "through_faulty_tried": len(tried),
            "repaired": len(pool) >= n and not tried, "fill_s": round(time.monotonic() - t0, 2)}


async def _probe(me, address: str, avoid: set[str], rng: random.Random, within_s: float = 10.0) -> dict:
    """Is `address` a working relay again? Seconds until its Health RPC answers (a channel
    that failed during the fault waits out gRPC's reconnect backoff, capped at ~2 s by
    gentorrent.crypto.tls), then a fresh path with it as the middle hop -- Establish,
    Forward and Return all cross it -- and asks until that path carried one."""
    from gentorrent.wire import gentorrent_pb2 as pb
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    users = {u.address: u for u in me.directory.users()}
    out = {"health": False, "established": False, "replied": False}
    t0 = time.monotonic()
    while not out["health"] and time.monotonic() - t0 < within_s:
        try:
            stub = rpc.RelayStub(me.channels.to(users[address]))
            out["health"] = (await stub.Health(pb.Empty(), timeout=2.0)).serving
        except Exception as exc:  # noqa: BLE001 - reported, the test asserts on the outcome
            out["health_error"] = f"{type(exc).__name__}: {getattr(exc, 'code', lambda: '')()}"
            await asyncio.sleep(0.5)
    out["reachable_after_s"] = round(time.monotonic() - t0, 2)
    others = sorted(a for a in users if a not in avoid | {address, me.address})
    path = None
    for _ in range(3):  # the neighbours' channels to it may still be backing off too
        first, last = rng.sample(others, 2)
        path = await me.paths.establish_through([users[first], users[address], users[last]])
        if path is not None:
            break
        await asyncio.sleep(1.0)
    if path is None:
        return out
    out["established"] = True
    for _ in range(4):  # the pool holds one path more than an ask uses: the probe may sit one out
        await _ask_batch(me, 1, "probe", time.monotonic())
        if path.sends:
            break
    for _ in range(10):  # a reply clove may trail the answer (k of n suffice)
        if path.replies:
            break
        await asyncio.sleep(0.3)
    out["replied"] = path.replies > 0
    me.paths.mark_failed(path)  # done: the pool is back to `keep` paths, all of which the next ask uses
    return out


def _api_ask(api: str, prompt: str, timeout_s: float) -> bool:
    """One ask through a relay process's own local API (gt-user ask): is that node whole?"""
    import urllib.request

    from testkit.echo_model import ECHO_PREFIX

    body = json.dumps({"prompt": prompt, "max_tokens": 32, "raw": True}).encode()  # the echo answers the raw prompt
    request = urllib.request.Request(api + "/gt/ask", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())["text"] == ECHO_PREFIX + prompt
    except OSError:
        return False


async def _fill_when_known(me, refresh_s: float, timeout_s: float = 30.0) -> int:
    """Build the asker's first paths once the relays know it: a relay refuses an Establish
    from a return address it has not seen in the directory yet (it re-reads it every `refresh_s`)."""
    await asyncio.sleep(2 * refresh_s)
    deadline = time.monotonic() + timeout_s
    while (usable := await me.paths.fill()) < me.cloves.n and time.monotonic() < deadline:
        await asyncio.sleep(refresh_s)
    return usable


async def _fault_phase(me, fleet, phase: str, inject, lift, budget: int, asks: int, rng: random.Random,
                       failing: bool = True) -> dict:
    """Fault the relays of at most `budget` of the asker's paths, ask, let paths be repaired;
    then (if `lift`) lift the fault, ask again and probe each faulted relay."""
    n = me.cloves.n
    await me.paths.fill()  # the last ask's single-use paths replaced: the pool the next ask uses
    pool = me.paths.pool.usable(time.monotonic())
    victims, hit = choose_victims(pool, budget, rng)
    built, failed = me.paths.built, me.paths.failed
    sends_before = {p.path_id: p.sends for p in pool}
    t_fault = time.monotonic()
    for v in victims:
        inject(v)
    during = await _ask_batch(me, asks, f"{phase} on", t_fault)
    repair = await _repair(me, set(victims) if failing else set(), n, sends_before)
    out = {"phase": phase, "victims": [fleet.names[v] for v in victims], "paths": len(pool),
           "pool": [[fleet.names.get(r, r) for r in p.relays] for p in pool],
           "paths_hit": len(hit), "during": during, "repair": repair,
           "repair_s": round(time.monotonic() - t_fault, 2), "recover_s": during["first_ok_s"],
           "paths_rebuilt": me.paths.built - built,  # around the fault (the probes below build their own)
           "paths_failed": me.paths.failed - failed}
    if lift is not None:
        t_lift = time.monotonic()
        for v in victims:
            lift(v)
        after = await _ask_batch(me, max(1, asks // 2), f"{phase} lifted", t_lift)
        out["after"] = after
        out["recover_s"] = after["first_ok_s"]
        out["probes"] = {fleet.names[v]: await _probe(me, v, set(victims), rng) for v in victims}
    return out


def _link_fault(phase: str):
    def inject(proxy) -> None:
        if phase == "drop":
            proxy.drop()
        elif phase == "delay":
            proxy.delay(LINK_DELAY_S, LINK_JITTER_S)
        else:
            proxy.blackhole()
    return inject


async def relay_process_faults(root: Path, mode: str, seed: int = 0, quick: bool = False) -> dict:
    """RELAY_PROCESSES real relay processes, the real echo model process, and one in-process
    asker (so its path pool can be read); n = 4 paths of 3 relays, k = 2. Relays sitting
    on at most n - k = 2 of the asker's paths are

    * `kill9`: SIGKILLed (for good);
    * `pause`: SIGSTOPped while asks go on, then SIGCONTed: asked again, and each is probed
      (Health, a path through it, an ask over that path) and asks through its own API;
    * `link`: reached through their fault proxy, which drops, then (other relays) delays,
      then (others again) blackholes, each phase healed before the next.

    Every ask must be answered while the fault holds, failed paths are rebuilt around it, and
    after a pause or heal the relay carries traffic again. Afterwards every process log is
    scanned for every process's private keys (hex, base64, PEM)."""
    import signal as signals

    from testkit.localnet import start_user_nodes

    if mode not in RELAY_PROCESS_MODES:
        raise ValueError(f"mode is one of {RELAY_PROCESS_MODES}")
    rng = random.Random(seed)
    cloves, params = scenario_params()
    budget = cloves.n - cloves.k
    asks = 3 if quick else 8
    root = Path(root)
    fleet = RelayFleet(root, RELAY_PROCESSES, cloves, params, proxied=mode == "link", seed=seed)
    me, phases, extra = None, [], {}
    try:
        await fleet.start()
        me = (await start_user_nodes(1, fleet.directory, root / "asker", cloves=cloves, params=params,
                                     maintain=False, rng=random.Random(seed)))[0]
        extra["paths_at_start"] = await _fill_when_known(me, params.maintenance_interval_s)
        warm = await _ask_batch(me, 3, "warm-up", time.monotonic())  # channels, a racing directory refresh
        extra["warmup_answered"] = warm["answered"]
        if mode == "kill9":
            phases.append(await _fault_phase(me, fleet, "kill9", lambda v: fleet.signal(v, signals.SIGKILL),
                                             None, budget, asks, rng))
        elif mode == "pause":
            phase = await _fault_phase(me, fleet, "pause", lambda v: fleet.signal(v, signals.SIGSTOP),
                                       lambda v: fleet.signal(v, signals.SIGCONT), budget, asks, rng)
            phase["own_api_ask"] = {name: await asyncio.to_thread(_api_ask, fleet.api(v), f"from {name}", 60.0)
                                    for v, name in fleet.names.items() if name in phase["victims"]}
            phases.append(phase)
        else:
            for kind in LINK_PHASES:
                fault = _link_fault(kind)
                phase = await _fault_phase(me, fleet, f"link-{kind}", lambda v: fault(fleet.proxies[v]),
                                           lambda v: fleet.proxies[v].pass_through(), budget, asks, rng,
                                           failing=kind != "delay")
                stats = [fleet.proxies[v].stats for v in fleet.names if fleet.names[v] in phase["victims"]]
                phase["proxy"] = {"refused": sum(s.refused for s in stats), "reset": sum(s.reset for s in stats),
                                  "blackholed_bytes": sum(sum(s.blackholed.values()) for s in stats),
                                  "forwarded_bytes": sum(sum(s.forwarded.values()) for s in stats)}
                phases.append(phase)
        await asyncio.sleep(params.forward_timeout_s + 0.5)  # answered asks wait this long for trailing cloves
        extra["asker_pending_after"] = me.asker.status()["pending"]
        extra["asker_suspects"] = {fleet.names.get(a, a): n for a, n in me.paths.status()["suspects"].items()}
        extra["asker_drops"] = me.asker.status()["drops"]
    finally:
        if me is not None:
            await me.stop()
        await fleet.stop()
    extra["secrets_in_logs"] = fleet.secret_hits()
    extra["phases"] = phases
    batches = [b for p in phases for b in (p["during"], p.get("after")) if b]
    sent = sum(b["sent"] for b in batches)
    answered = sum(b["answered"] for b in batches)
    clear = sum(b["clear"] for b in batches)
    recovers = [p["recover_s"] for p in phases]
    notes = "; ".join(f"{p['phase']} on {len(p['victims'])} relays of {p['paths_hit']}/{p['paths']} paths, "
                      f"{p['paths_failed']} paths failed" for p in phases)
    return {"requests_sent": sent, "answered": answered, "lost": sent - answered - clear, "failed_clearly": clear,
            "committed_txs_lost": None, "forks": None,
            "recover_s": None if None in recovers or not recovers else max(recovers),
            "note": f"{RELAY_PROCESSES} relay processes, k = {cloves.k} of n = {cloves.n}: {notes}; "
                    f"{len(extra['secrets_in_logs']['hits'])} key leaks in logs",
            "extra": extra}
