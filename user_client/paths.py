"""Proxy paths of a user node (ARCHITECTURE.md §3.2): choose relays, establish, renew, repair.

A user keeps N >= n established paths of l relays each; the last relay of a path is one of the
user's proxies. The first hop of every path is the user's first usable entry guard
(gentorrent/overlay/guards.py, kept in the node's home for weeks); the other relays come from the
directory: same region, never the user itself nor in its guard's network, least used first so
that paths overlap as little as the region allows. A path is tried, not
trusted: one whose first hop refuses a clove, whose clove the model node never listed as
delivered, whose reply clove never came back, or that a hop closed (its successor was gone:
a sealed notice from that hop), is marked failed and replaced at once; every
path is renewed after `path_renewal_s` anyway. Paths are pinned to node ids: onions name each
successor by id, and the first hop is dialled by id (gentorrent.channels).

Paths are single-use by default (`CLOVES.single_use_paths`): an ask takes n of the ready paths,
the manager starts building their replacements at once, and when the ask is settled its paths
are retired here and at their relays too, once idle for the asker's longest reply wait plus
`used_path_linger_s` (`PathManager.linger_s`, which the onion tells them). So a user's asks share a proxy only as often as any two asks drawn from the
region do, and colluding proxies and model nodes cannot link a user's asks by the proxy they
came through (THREAT_MODEL.md); the guard, the first hop, stays the same by design.

`PathPool` and `choose_relays` are pure (time and rng passed in); `PathManager` is the async
shell that talks to relays.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gentorrent.ledger.peers import PeerIndex
from gentorrent.config import CLOVES, GUARDS, OVERLAY, CloveParams, GuardParams, OverlayParams
from gentorrent.crypto import keys, onion
from gentorrent.overlay.guards import GuardFileError, GuardSet
from gentorrent.overlay.pathtable import DropReason
from user_client.relay import CONFIRMATION, Relay
from gentorrent.ledger import addresses
from gentorrent.ledger.directory import Directory
from gentorrent.ledger.sections import UserRecord

log = logging.getLogger(__name__)


BUILD_TIMES_KEPT = 16  # establishment times the status shows (dial, onion out, confirmation back)


class NotEnoughRelays(RuntimeError):
    """The directory has too few usable relays in this region for one path."""


@dataclass
class ProxyPath:
    path_id: int
    relays: tuple[str, ...]  # relay addresses, first hop first; the last one is the proxy
    nodes: tuple[str, ...]  # their node ids (hex): what the path is pinned to
    secrets: onion.PathSecrets
    built_at: float
    failed: bool = False
    taken: bool = False  # handed to one ask already (single-use pools never pick it again)
    sends: int = 0
    replies: int = 0
    next_seq: int = 0  # the next forward clove's number on this path (each hop's replay window)
    next_reply: int = 0  # the next fresh reply link's counter (crypto.onion.reply_link)

    @property
    def proxy(self) -> str:
        return self.relays[-1]

    @property
    def proxy_id(self) -> str:
        return self.nodes[-1]

    @property
    def first_hop(self) -> str:
        return self.nodes[0]

    @property
    def first_link(self) -> bytes:
        return self.secrets.first_link

    def take_seq(self) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        return seq

    def fresh_reply_link(self) -> bytes:
        """A reply link ID the proxy knows and nobody has seen: one per ask, so that the
        model node cannot tell two asks over this path apart by their reply routes."""
        counter, self.next_reply = self.next_reply, self.next_reply + 1
        return onion.reply_link(self.secrets.hop_keys[-1], counter)

    def describe(self) -> dict:
        return {"id": self.path_id, "relays": list(self.relays), "failed": self.failed,
                "sends": self.sends, "replies": self.replies}


def choose_relays(
    users: list[UserRecord], self_id: str, region: str, length: int, rng: random.Random,
    usage: Counter | None = None, exclude: set[str] = frozenset(), distinct_prefixes: bool = False,
) -> list[UserRecord]:
    """`length` distinct relays of `region`, never `self_id` nor a client-only user, the least used first; with
    `distinct_prefixes` (the genesis' rule) never two of one IPv4 /16 or IPv6 /32, as Tor builds
    circuits: one operator's block of addresses holds at most one hop of a path."""
    pool = [u for u in users
            if u.relays and u.region == region and u.node_id_hex != self_id and u.address not in exclude]
    usage = usage or Counter()
    rng.shuffle(pool)
    pool.sort(key=lambda u: usage[u.address])  # stable: random among equally used
    chosen, prefixes = [], set()
    for u in pool:
        prefix = addresses.path_prefix(u.address) if distinct_prefixes else u.address
        if prefix in prefixes:
            continue
        prefixes.add(prefix)
        chosen.append(u)
        if len(chosen) == length:
            break
    if len(chosen) < length:
        which = "networks (/16, /32)" if distinct_prefixes else "relays"
        raise NotEnoughRelays(f"{len(chosen)} usable {which} in region {region!r}, a path needs {length}")
    rng.shuffle(chosen)
    return chosen


class PathPool:
    """The user's established paths and the decisions about them (pure)."""

    def __init__(self, keep: int, renewal_s: float, single_use: bool = False) -> None:
        self.keep = keep
        self.renewal_s = renewal_s
        self.single_use = single_use
        self.paths: dict[int, ProxyPath] = {}

    def add(self, path: ProxyPath) -> None:
        self.paths[path.path_id] = path

    def remove(self, path: ProxyPath) -> None:
        self.paths.pop(path.path_id, None)

    def usable(self, now: float) -> list[ProxyPath]:
        return [p for p in self.paths.values()
                if not p.failed and not p.taken and now - p.built_at < self.renewal_s]

    def stale(self, now: float) -> list[ProxyPath]:
        """Paths to retire: failed, or older than the renewal period."""
        return [p for p in self.paths.values() if p.failed or now - p.built_at >= self.renewal_s]

    def missing(self, now: float) -> int:
        return max(0, self.keep - len(self.usable(now)))

    def relay_usage(self, now: float) -> Counter:
        return Counter(r for p in self.usable(now) for r in p.relays)

    def pick(self, n: int, now: float, rng: random.Random) -> list[ProxyPath]:
        """n usable paths, distinct proxies first, least used first (ties at random)."""
        usable = self.usable(now)
        rng.shuffle(usable)
        usable.sort(key=lambda p: p.sends)
        chosen, proxies = [], set()
        for p in usable:
            if p.proxy not in proxies:
                chosen.append(p)
                proxies.add(p.proxy)
        chosen += [p for p in usable if p not in chosen]
        return self.take(chosen[:n])

    def take(self, paths: list[ProxyPath]) -> list[ProxyPath]:
        """Hand `paths` to one ask; a single-use pool never offers them again."""
        for p in paths:
            p.taken = self.single_use
        return paths


class PathManager:
    """Builds and maintains the paths of one user node (async shell over PathPool)."""

    def __init__(
        self,
        directory: Directory,
        relay: Relay,
        index: PeerIndex,
        self_id: str,
        region: str,
        cloves: CloveParams = CLOVES,
        params: OverlayParams = OVERLAY,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        guards_file: Path | None = None,
        guard_params: GuardParams = GUARDS,
    ) -> None:
        """`guards_file`: where this node keeps its entry guards (its home's guards.json); None
        keeps them in memory only. `guard_params.enabled` False: a first hop drawn per path."""
        self.directory = directory
        self.relay = relay
        self.index = index
        self.self_id = self_id
        self.region = region
        # where reply blobs of our paths go, straight from the relay (the Asker sets itself)
        self.replies_to: Callable[[ProxyPath, bytes], None] | None = None
        self.closed = 0  # paths a hop closed (its successor was gone)
        self.failed = 0  # paths found failing (a send, a reply, a delivery, a close): replaced at once
        self.cloves = cloves
        self.params = params
        self.rng = rng or random.SystemRandom()  # relay choice; seeded only in tests
        self.clock = clock
        self.wall_clock = wall_clock
        self.pool = PathPool(cloves.proxies_kept, cloves.path_renewal_s, cloves.single_use_paths)
        # what a single-use path's onion asks its relays: keep me this long idle once used
        self.linger_s = (math.ceil(max(params.first_reply_timeout_s, params.reply_idle_timeout_s))
                         + cloves.used_path_linger_s) if cloves.single_use_paths else 0
        genesis = getattr(directory, "genesis", None)  # a committee's directory: its genesis' path rule
        self.distinct_prefixes = bool(genesis is not None and genesis.rules.distinct_path_prefixes)
        self._ids = itertools.count(1)
        self._fill_lock = asyncio.Lock()
        self._suspect_hops: Counter = Counter()
        self._building: Counter = Counter()
        self.built = 0
        self.build_failures = 0
        self.last_error = ""  # the last reason a fill could not build a path (status)
        self.build_s: list[float] = []  # how long the last successful establishments took (bench/wan.py)
        self._repair: asyncio.Task | None = None
        self.guards_file = Path(guards_file) if guards_file is not None else None
        self.guards = _load_guards(self.guards_file, guard_params) if guard_params.enabled else None

    # ------------------------------------------------------------------ entry guards

    def _entry_guard(self, users: list[UserRecord], exclude: set[str]) -> UserRecord | None:
        """The first hop of the next path: the first usable guard (the list refreshed first)."""
        relays = [u for u in users if u.relays and u.region == self.region]
        prefix = addresses.path_prefix if self.distinct_prefixes else (lambda address: address)
        if self.guards.refresh(relays, self.self_id, self.wall_clock(), self.rng, prefix) and self.guards_file:
            keys.replace_private(self.guards_file, self.guards.to_json().encode())
        by_id = {u.node_id_hex: u for u in relays}
        first = self.guards.first_hop(lambda node_id: node_id in by_id and by_id[node_id].address not in exclude)
        return by_id.get(first) if first is not None else None

    async def _hold_guards(self) -> None:
        """The guards' own records, looked up by node id: the directory holds a sample of the
        region's relays and the peers looked up (gentorrent.ledger.committee), not necessarily a
        guard, and a guard it does not list would count as gone. A lookup is kept for the
        directory's peer TTL, so this asks the committee about once per guard per TTL."""
        held = {u.node_id_hex for u in self.directory.users()}
        for guard in self.guards.guards if self.guards is not None else ():
            if guard.node_id in held:
                continue
            try:
                await self.directory.user(bytes.fromhex(guard.node_id))
            except Exception as exc:  # noqa: BLE001 - the committee out of reach: missing this time
                log.info("entry guard %s not looked up: %s", guard.node_id[:16], exc)

    def _choose(self, usage: Counter, exclude: set[str]) -> list[UserRecord]:
        """The relays of a new path, first hop first: the entry guard, then the others."""
        users = self.directory.users()
        if self.guards is None:
            return choose_relays(users, self.self_id, self.region, self.cloves.path_length, self.rng, usage, exclude,
                                 self.distinct_prefixes)
        guard = self._entry_guard(users, exclude)
        if guard is None:
            raise NotEnoughRelays(f"none of the {len(self.guards.guards)} entry guards is listed and reachable")
        if self.distinct_prefixes:  # the other hops come from other networks than the guard's
            taken = addresses.path_prefix(guard.address)
            users = [u for u in users if addresses.path_prefix(u.address) != taken]
        rest = choose_relays(users, self.self_id, self.region, self.cloves.path_length - 1, self.rng, usage,
                             exclude | {guard.address}, self.distinct_prefixes)
        return [guard, *rest]

    # ------------------------------------------------------------------ building

    async def build_one(self) -> ProxyPath | None:
        """Try up to `build_attempts` relay choices; None if none holds."""
        await self._hold_guards()
        for _ in range(self.params.build_attempts):
            exclude = {a for a, n in self._suspect_hops.items() if n >= 2}
            usage = self.pool.relay_usage(self.clock()) + self._building
            try:
                relays = self._choose(usage, exclude)
            except NotEnoughRelays:
                if not exclude:
                    raise
                self._suspect_hops.clear()
                continue
            addresses = Counter(r.address for r in relays)
            self._building += addresses  # concurrent builds spread over other relays
            try:
                path = await self._establish(relays)
            finally:
                self._building -= addresses
            if path is not None:
                return path
        return None

    async def establish_through(self, relays: list[UserRecord]) -> ProxyPath | None:
        """One path over exactly `relays` (first hop first), pooled like any other: how a probe
        checks that one given relay carries traffic (again), e.g. after it was paused."""
        return await self._establish(relays)

    async def _establish(self, relays: list[UserRecord]) -> ProxyPath | None:
        hops = [onion.HopSpec(r.node_id, r.onion_key) for r in relays]
        # keys and link IDs from the OS CSPRNG; the time lets hops refuse this onion once it is old
        onion_bytes, secrets = onion.build_onion(hops, issued_s=int(self.wall_clock()), linger_s=self.linger_s)
        first = relays[0]
        started = self.clock()
        path = ProxyPath(next(self._ids), tuple(r.address for r in relays), tuple(r.node_id_hex for r in relays),
                         secrets, started)
        link = self.relay.hub.link_to(first.node_id_hex)
        reply = None
        if link is not None:
            try:
                reply = await link.establish(onion_bytes, self.params.establish_timeout_s)
            except asyncio.TimeoutError:
                # a hop further on may be the one that hangs (paused, blackholed): each hop's
                # wait for the next runs into the same deadline, so the answer never says which
                # hop it was. Suspect them all once; a hop on a later good path is cleared.
                self._blame(relays)
                self.build_failures += 1
                return None
        if link is None or (not link.alive and reply is not None and not reply.ok
                            and reply.reason == DropReason.NEXT_HOP_UNREACHABLE.value):
            self._suspect_hops[first.address] += 2  # the first hop itself is unreachable
            self.build_failures += 1
            return None
        try:
            ok = reply.ok and onion.unwrap_return(secrets, reply.confirmation) == CONFIRMATION
        except onion.CloveLayerError:
            ok = False
        if not ok:
            self._blame(relays)
            self.build_failures += 1
            return None
        for r in relays:
            self._suspect_hops.pop(r.address, None)
        self.pool.add(path)
        self.build_s = [*self.build_s[-(BUILD_TIMES_KEPT - 1):], self.clock() - started]
        if self.replies_to is not None:
            self.relay.add_endpoint(path.first_link, path.first_hop, functools.partial(self.replies_to, path))
        self.built += 1
        return path

    def _blame(self, relays: list[UserRecord]) -> None:
        """Suspect the hops of an establishment that failed somewhere along the path.

        The answer does not say which hop failed. A hop that carries one of the usable paths
        relays establishments now, so the blame goes to the others; only when every hop does
        (a link between two of them broke) are all suspected. Blaming them all alike let one
        relay nobody can reach (a node behind NAT) take the user's guard down with it on every
        try: both were excluded, the guard's absence left too few relays, the exclusions were
        cleared and the same path was chosen again, thousands of times (test_wan_devnet)."""
        carrying = {address for path in self.pool.usable(self.clock()) for address in path.relays}
        for r in [r for r in relays if r.address not in carrying] or relays:
            self._suspect_hops[r.address] += 1

    async def fill(self) -> int:
        """Retire stale paths and build until N usable paths are held; returns usable count."""
        async with self._fill_lock:
            now = self.clock()
            for path in self.pool.stale(now):
                self._retire(path)
            missing = self.pool.missing(now)
            if missing:
                await self.directory.refresh()
                results = await asyncio.gather(*(self.build_one() for _ in range(missing)),
                                               return_exceptions=True)
                for r in results:
                    if isinstance(r, BaseException) and not isinstance(r, Exception):
                        raise r
                    if isinstance(r, Exception):  # (NotEnoughRelays, a directory out of reach): for status
                        self.last_error = f"{type(r).__name__}: {str(r)[:200]}"
            return len(self.pool.usable(self.clock()))

    def _retire(self, path: ProxyPath) -> None:
        """Stop using `path`; its reply link keeps working for a grace period (late replies)."""
        self.pool.remove(path)
        grace = self.params.first_reply_timeout_s + self.params.reply_idle_timeout_s

        asyncio.get_running_loop().call_later(grace, self.relay.remove_endpoint, path.first_link)

    def closed_by(self, path: ProxyPath, hop: int) -> None:
        """Hop `hop` of `path` closed it, its successor being gone: the path is replaced now,
        and that successor is suspected (twice and it is left out of new paths until a path
        through it holds again), so the repair does not build over it again."""
        if path.failed:
            return
        self.closed += 1
        if hop + 1 < len(path.relays):
            self._suspect_hops[path.relays[hop + 1]] += 1
        self.mark_failed(path)

    def mark_failed(self, path: ProxyPath) -> None:
        """A path failed a send or lost a reply: replace it now, in the background."""
        if path.failed:
            return
        path.failed = True
        self.failed += 1
        self._refill()

    def _refill(self) -> None:
        """Build what the pool misses, in the background (one fill at a time)."""
        if self._repair is None or self._repair.done():
            self._repair = asyncio.get_running_loop().create_task(self._fill_quietly())

    def release(self, paths: list[ProxyPath]) -> None:
        """An ask (or an audit hand-in) is done with `paths`. Single-use paths are retired now
        (their relays forget them `used_path_linger_s` after their last clove: the onion said
        so); pooled ones stay for the next ask."""
        if not self.pool.single_use:
            return
        for path in {p.path_id: p for p in paths}.values():
            if self.pool.paths.get(path.path_id) is path:
                self._retire(path)

    async def _fill_quietly(self) -> None:
        try:
            await self.fill()
        except Exception as exc:  # reported by status; the maintenance loop retries
            log.info("path repair failed: %s", exc)

    async def pick(self, n: int) -> list[ProxyPath]:
        """n paths to ask over, building more first when fewer than n are usable. Single-use
        paths are replaced at once, so the next ask finds paths ready rather than waits for them."""
        if len(self.pool.usable(self.clock())) < n:
            await self.fill()
        picked = self.pool.pick(n, self.clock(), self.rng)
        if self.pool.single_use and picked:
            self._refill()
        return picked

    async def wait_for(self, n: int, wait_s: float) -> int:
        """Build until n paths are usable, for up to wait_s; the usable count.

        A node just started, or one whose single-use paths the last asks used up, is short of
        paths for a few seconds: a condition of this node, which no model node should answer for."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s  # real time: the path clock may be a test's
        usable = len(self.pool.usable(self.clock()))
        while usable < n:
            usable = await self.fill()
            left = deadline - loop.time()
            if usable >= n or left <= 0:
                break
            await asyncio.sleep(min(self.params.path_retry_s, left))
        return usable

    def spare(self, exclude: list[ProxyPath]) -> ProxyPath | None:
        """A usable path not in `exclude` (to resend a clove whose path failed)."""
        used = {p.path_id for p in exclude}
        spare = [p for p in self.pool.usable(self.clock()) if p.path_id not in used]
        if not spare:
            return None
        if self.pool.single_use:
            self._refill()
        return self.pool.take([min(spare, key=lambda p: p.sends)])[0]

    def status(self) -> dict:
        now = self.clock()
        return {"usable": len(self.pool.usable(now)), "keep": self.pool.keep, "built": self.built,
                "build_failures": self.build_failures, "failed": self.failed, "closed": self.closed,
                "suspects": dict(self._suspect_hops),
                "last_error": self.last_error, "relays_known": len(self.directory.users()),
                "build_ms": [round(t * 1000, 1) for t in self.build_s],
                "guards": [g.node_id for g in self.guards.guards] if self.guards is not None else None,
                "paths": [p.describe() for p in self.pool.paths.values()]}


def _load_guards(path: Path | None, params: GuardParams) -> GuardSet:
    """The guards kept in `path`, or a new empty list; a file that cannot be read is refused,
    saying what to do (drawing new guards exposes the user to more relays: the operator decides)."""
    if path is None or not path.exists():
        return GuardSet(params)
    try:
        return GuardSet.from_json(path.read_text(), params)
    except (GuardFileError, OSError, UnicodeDecodeError) as exc:
        raise GuardFileError(f"{path}: {exc}. It holds this node's entry guards; if it is damaged, remove it and "
                             "the node draws new ones (which exposes it to new first hops)") from exc
