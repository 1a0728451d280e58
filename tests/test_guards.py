"""Entry guards (gentorrent/overlay/guards.py): drawn once, kept for weeks, replaced when they
leave, in distinct networks; and the path manager puts one first on every path."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

import pytest

from gentorrent.config import GUARDS
from gentorrent.overlay.guards import GuardFileError, GuardSet

DAY = 24 * 3600.0


@dataclass
class Relay:
    node_id_hex: str
    address: str


def _relays(count: int, net: int | None = None) -> list[Relay]:
    """`count` relays; with `net`, every relay in one of `net` /16 networks."""
    return [Relay(f"{i:064x}", f"10.{(i % net) if net else i}.0.{i % 250}:9000") for i in range(1, count + 1)]


def _prefix(address: str) -> str:
    return ".".join(address.split(".")[:2])


def test_guards_are_kept_for_weeks_then_rotated():
    relays = _relays(50)
    guards = GuardSet()
    assert guards.refresh(relays, "self", 0.0, random.Random(1))
    chosen = [g.node_id for g in guards.guards]
    assert len(chosen) == GUARDS.sampled == len(set(chosen))
    for day in range(1, 42):  # every refresh for six weeks: the same guards, in the same order
        assert not guards.refresh(relays, "self", day * DAY, random.Random(day))
        assert [g.node_id for g in guards.guards] == chosen
    assert all(GUARDS.lifetime_min_s <= g.expires_s - g.chosen_s <= GUARDS.lifetime_max_s for g in guards.guards)
    guards.refresh(relays, "self", GUARDS.lifetime_max_s + 1, random.Random(9))
    assert not set(g.node_id for g in guards.guards) & set(chosen)  # all rotated


def test_a_missing_guard_is_stood_in_for_then_replaced_once_it_has_left():
    relays = _relays(50)
    guards = GuardSet()
    guards.refresh(relays, "self", 0.0, random.Random(2))
    first, second = guards.guards[0].node_id, guards.guards[1].node_id
    assert guards.first_hop() == first
    gone = [r for r in relays if r.node_id_hex != first]
    guards.refresh(gone, "self", 10.0, random.Random(3))  # it restarts: the next one stands in
    assert guards.first_hop() == second and guards.guards[0].node_id == first
    guards.refresh(relays, "self", 20.0, random.Random(4))  # back: first again, no new draw
    assert guards.first_hop() == first
    guards.refresh(gone, "self", 30.0, random.Random(5))
    guards.refresh(gone, "self", 30.0 + GUARDS.absent_drop_s, random.Random(6))  # gone for a day: left
    ids = [g.node_id for g in guards.guards]
    assert first not in ids and ids[0] == second and len(ids) == GUARDS.sampled
    assert guards.first_hop(usable=lambda node_id: node_id != second) == ids[1]  # a suspect one is skipped
    assert guards.first_hop(usable=lambda node_id: False) is None


def test_guards_are_in_distinct_networks_and_never_the_user():
    relays = _relays(60, net=3)
    for seed in range(20):
        guards = GuardSet()
        guards.refresh(relays, relays[0].node_id_hex, 0.0, random.Random(seed), prefix=_prefix)
        nets = [_prefix(g.address) for g in guards.guards]
        assert len(nets) == 3 == len(set(nets))
        assert relays[0].node_id_hex not in [g.node_id for g in guards.guards]
    few = GuardSet()
    few.refresh(_relays(10, net=2), "self", 0.0, random.Random(1), prefix=_prefix)
    assert len(few.guards) == 2  # only two networks: two guards, never two in one


def test_guards_round_trip_through_their_file_and_bad_files_are_refused():
    guards = GuardSet()
    guards.refresh(_relays(20), "self", 0.0, random.Random(1))
    back = GuardSet.from_json(guards.to_json())
    assert [vars(g) for g in back.guards] == [vars(g) for g in guards.guards]
    for bad in ("", "[]", '{"format": "other", "guards": []}', '{"format": "gentorrent/guards/v1"}',
                '{"format": "gentorrent/guards/v1", "guards": [{"node_id": "zz", "address": "a", '
                '"chosen_s": 0, "expires_s": 1}]}', "x" * 70_000):
        with pytest.raises(GuardFileError):
            GuardSet.from_json(bad)


def test_bad_parameters_are_refused():
    for bad in (dict(sampled=0), dict(lifetime_min_s=10.0, lifetime_max_s=5.0), dict(absent_drop_s=-1.0)):
        with pytest.raises(ValueError):
            GuardSet(replace(GUARDS, **bad))


# ---------------------------------------------------------------------------- on the real overlay


_SHIFTS: dict[int, list[float]] = {}


async def _first_hops(me, windows: int) -> set[str]:
    """The first hops of the paths `me` builds over `windows` renewal periods (its path clock moved on)."""
    import time

    shift = _SHIFTS.setdefault(id(me), [0.0])  # the path clock never goes back
    me.paths.clock = lambda: time.monotonic() + shift[0]
    seen = set()
    for _ in range(windows):
        await me.paths.fill()
        seen |= {p.first_hop for p in me.paths.pool.usable(me.paths.clock())}
        shift[0] += me.cloves.path_renewal_s + 1.0
    return seen


@pytest.mark.network
@pytest.mark.timeout(120)
async def test_attack_a_colluding_relay_is_a_users_first_hop_only_if_it_is_its_guard(tmp_path):
    """Over 6 renewal periods every path of the asker starts at its guard, so a colluder that is
    not its guard is never the asker's neighbour on a path; the guard survives a restart
    (kept in the home), and a guard that stops answering is stood in for by the next one. Without
    guards (the code before) nearly every relay of the net was a first hop of the asker."""
    from testkit.localnet import start_user_nodes
    from testkit.scenarios.adversary_path import Net

    async with Net(tmp_path, users=13) as net:
        me = net.me
        guard = me.paths.guards.first_hop()
        assert guard is None  # drawn at the first path
        assert await _first_hops(me, 6) == {me.paths.guards.first_hop()}
        guard = me.paths.guards.first_hop()
        saved = [vars(g) for g in me.paths.guards.guards]
        assert (me.home / "guards.json").stat().st_mode & 0o777 == 0o600
        await me.stop()
        again = (await start_user_nodes(1, net.root / "directory.json", net.root, cloves=net.cloves,
                                        params=net.params, maintain=False))[0]  # user0's home: the same node
        net.nodes[0] = again
        assert [vars(g) for g in again.paths.guards.guards] == saved
        assert await _first_hops(again, 2) == {guard}
        await net.by_id(guard).stop()  # the guard stops answering: the next one of the list stands in
        net.nodes.remove(net.by_id(guard))
        stand_in = await _first_hops(again, 2)
        assert stand_in == {again.paths.guards.guards[1].node_id}
        again.paths.guards = None  # the code before: a first hop drawn for every path
        assert len(await _first_hops(again, 6)) >= 8


async def test_a_guard_outside_the_nodes_relay_sample_is_looked_up_and_stays_its_first_hop():
    """A committee directory holds a sample of the region's relays, not the whole registry: a
    guard missing from the sample is looked up by node id before a path is built, so it stays
    the first hop instead of counting as gone (and being replaced) whenever the sample moves on."""
    from gentorrent.ledger.sections import UserRecord
    from user_client.paths import PathManager

    records = [UserRecord(bytes.fromhex(f"{i:064x}"), b"p" * 32, f"10.{i}.0.1:9000", b"o" * 32) for i in range(1, 9)]

    class SampledDirectory:
        """users(): a sample, plus the peers looked up (as gentorrent.ledger.committee holds them)."""

        def __init__(self) -> None:
            self.sample, self.looked_up, self.asked = records[:4], [], []

        def users(self):
            return self.sample + self.looked_up

        async def user(self, node_id: bytes):
            self.asked.append(node_id.hex())
            record = next((r for r in records if r.node_id == node_id), None)
            self.looked_up.append(record)
            return record

    directory = SampledDirectory()
    paths = PathManager(directory, None, None, "f" * 64, "default", rng=random.Random(3))
    guard = paths._choose(Counter(), set())[0]
    assert guard.node_id_hex == paths.guards.first_hop()
    directory.sample = records[4:]  # the next sample holds none of the guards
    await paths._hold_guards()
    assert guard.node_id_hex in directory.asked and len(directory.asked) == len(paths.guards.guards)
    later = paths.wall_clock() + 2 * GUARDS.absent_drop_s  # long after a missing guard would be dropped
    paths.wall_clock = lambda: later
    assert paths._choose(Counter(), set())[0].node_id_hex == guard.node_id_hex
    await paths._hold_guards()  # held now: asked no more
    assert len(directory.asked) == len(paths.guards.guards)
