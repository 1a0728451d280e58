"""Proxy paths of a user node (ARCHITECTURE.md §3.2): choose relays, establish, renew, repair.

A user keeps N >= n established paths of l relays each; the last relay of a path is one of the
user's proxies. Relays come from the directory: same region, never the user itself, least
used first so that paths overlap as little as the region allows. A path is tried, not
trusted: one whose first hop refuses a clove, whose clove the model node never listed as
delivered, or whose reply clove never came back, is marked failed and replaced at once; every
path is renewed after `path_renewal_s` anyway. Paths are pinned to node ids: onions name each
successor by id, and the first hop is dialled by id (gentorrent.channels).

`PathPool` and `choose_relays` are pure (time and rng passed in); `PathManager` is the async
shell that talks to relays.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from gentorrent.ledger.peers import PeerIndex
from gentorrent.config import CLOVES, OVERLAY, CloveParams, OverlayParams
from gentorrent.crypto import onion
from gentorrent.overlay.pathtable import DropReason
from user_client.relay import CONFIRMATION, Relay
from gentorrent.ledger.directory import Directory
from gentorrent.ledger.sections import UserRecord

log = logging.getLogger(__name__)


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
    usage: Counter | None = None, exclude: set[str] = frozenset(),
) -> list[UserRecord]:
    """`length` distinct relays of `region`, never `self_id`, the least used first."""
    pool = [u for u in users if u.region == region and u.node_id_hex != self_id and u.address not in exclude]
    if len(pool) < length:
        raise NotEnoughRelays(f"{len(pool)} usable relays in region {region!r}, a path needs {length}")
    usage = usage or Counter()
    rng.shuffle(pool)
    pool.sort(key=lambda u: usage[u.address])  # stable: random among equally used
    chosen = pool[:length]
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
    ) -> None:
        self.directory = directory
        self.relay = relay
        self.index = index
        self.self_id = self_id
        self.region = region
        # where reply blobs of our paths go, straight from the relay (the Asker sets itself)
        self.replies_to: Callable[[ProxyPath, bytes], None] | None = None
        self.cloves = cloves
        self.params = params
        self.rng = rng or random.SystemRandom()  # relay choice; seeded only in tests
        self.clock = clock
        self.wall_clock = wall_clock
        self.pool = PathPool(cloves.proxies_kept, cloves.path_renewal_s, cloves.single_use_paths)
        self._ids = itertools.count(1)
        self._fill_lock = asyncio.Lock()
        self._suspect_hops: Counter = Counter()
        self._building: Counter = Counter()
        self.built = 0
        self.build_failures = 0
        self._repair: asyncio.Task | None = None

    # ------------------------------------------------------------------ building

    async def build_one(self) -> ProxyPath | None:
        """Try up to `build_attempts` relay choices; None if none holds."""
        for _ in range(self.params.build_attempts):
            exclude = {a for a, n in self._suspect_hops.items() if n >= 2}
            usage = self.pool.relay_usage(self.clock()) + self._building
            try:
                relays = choose_relays(self.directory.users(), self.self_id, self.region,
                                       self.cloves.path_length, self.rng, usage, exclude)
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
        onion_bytes, secrets = onion.build_onion(hops, issued_s=int(self.wall_clock()))
        first = relays[0]
        path = ProxyPath(next(self._ids), tuple(r.address for r in relays), tuple(r.node_id_hex for r in relays),
                         secrets, self.clock())
        link = self.relay.hub.link_to(first.node_id_hex)
        reply = None
        if link is not None:
            try:
                reply = await link.establish(onion_bytes, self.params.establish_timeout_s)
            except asyncio.TimeoutError:
                # a hop further on may be the one that hangs (paused, blackholed): each hop's
                # wait for the next runs into the same deadline, so the answer never says which
                # hop it was. Suspect them all once; a hop on a later good path is cleared.
                for r in relays:
                    self._suspect_hops[r.address] += 1
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
            for r in relays:
                self._suspect_hops[r.address] += 1
            self.build_failures += 1
            return None
        for r in relays:
            self._suspect_hops.pop(r.address, None)
        self.pool.add(path)
        if self.replies_to is not None:
            self.relay.add_endpoint(path.first_link, path.first_hop, functools.partial(self.replies_to, path))
        self.built += 1
        return path

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
            return len(self.pool.usable(self.clock()))

    def _retire(self, path: ProxyPath) -> None:
        """Stop using `path`; its reply link keeps working for a grace period (late replies)."""
        self.pool.remove(path)
        grace = self.params.first_reply_timeout_s + self.params.reply_idle_timeout_s

        asyncio.get_running_loop().call_later(grace, self.relay.remove_endpoint, path.first_link)

    def mark_failed(self, path: ProxyPath) -> None:
        """A path failed a send or lost a reply: replace it now, in the background."""
        if path.failed:
            return
        path.failed = True
        if self._repair is None or self._repair.done():
            self._repair = asyncio.get_running_loop().create_task(self._fill_quietly())

    async def _fill_quietly(self) -> None:
        try:
            await self.fill()
        except Exception as exc:  # reported by status; the maintenance loop retries
            log.info("path repair failed: %s", exc)

    async def pick(self, n: int) -> list[ProxyPath]:
        """n paths to ask over, building more first when fewer than n are usable."""
        if len(self.pool.usable(self.clock())) < n:
            await self.fill()
        return self.pool.pick(n, self.clock(), self.rng)

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
        return self.pool.take([min(spare, key=lambda p: p.sends)])[0] if spare else None

    def status(self) -> dict:
        now = self.clock()
        return {"usable": len(self.pool.usable(now)), "keep": self.pool.keep, "built": self.built,
                "build_failures": self.build_failures, "suspects": dict(self._suspect_hops),
                "paths": [p.describe() for p in self.pool.paths.values()]}
