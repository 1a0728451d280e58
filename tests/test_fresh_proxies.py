"""Asks that cannot be linked by their proxy, on the real overlay.

Colluding proxies (and the model node they serve, which sees which proxies an ask came
through) link the asks of one user when those asks share proxies more often than the asks of
two different users do. With a pool of paths kept for a renewal period, two asks of one user
share at least 2 of their 4 proxies, every time (two 4-subsets of 6 paths); with single-use
paths, the shipped default, a user's asks share proxies only as often as anyone's asks do.
Then the relays of a used path forget it once idle for the asker's longest reply wait plus
`used_path_linger_s`, as its onion told them, while the ready paths nobody used yet keep the
full idle expiry.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
from dataclasses import replace

import pytest

from gentorrent.config import CLOVES as SHIPPED, CloveParams
from testkit.echo_model import ECHO_PREFIX
from testkit.scenarios.adversary_path import PROMPT, Net
from testkit.waiting import until

pytestmark = [pytest.mark.network, pytest.mark.timeout(300)]

USERS, ASKS = 16, 10
CLOVES = CloveParams(n=4, k=3, path_length=3, proxies_kept=6)  # the shipped n, l and paths kept


async def _proxies_of_asks(net: Net, askers: list, asks: int
                           ) -> tuple[dict[int, list[frozenset[str]]], set[str]]:
    """Each asker's asks, in turn: the proxies (last relays) each ask went over, and the relays
    one of the askers may not draw as a proxy: the askers themselves and the first hops (a
    user's guard is never its proxy)."""
    seen: dict[int, list[frozenset[str]]] = {i: [] for i in range(len(askers))}
    barred = {node.address for node in askers}
    for j in range(asks):
        for i, node in enumerate(askers):
            answer = await asyncio.wait_for(node.ask(f"{PROMPT} {i}.{j}"), 60)
            assert answer.text == ECHO_PREFIX + f"{PROMPT} {i}.{j}"
            seen[i].append(frozenset(path[-1] for path in answer.paths))
            barred |= {path[0] for path in answer.paths}
    return seen, barred


def _shared(seen: dict[int, list[frozenset[str]]], barred: set[str]) -> tuple[float, float]:
    """Mean proxies shared by two asks of one user, and by an ask of one user and one of another,
    counting only the relays both askers could draw. Two users draw those alike; the few others
    would make a user's asks look alike by what it may not choose (2 of 16 relays here, 2 of the
    region's relays in a deployment)."""
    seen = {i: [proxies - barred for proxies in asks] for i, asks in seen.items()}
    same = [len(a & b) for asks in seen.values() for a, b in itertools.combinations(asks, 2)]
    cross = [len(a & b) for a in seen[0] for b in seen[1]]
    return statistics.mean(same), statistics.mean(cross)


async def test_pooled_paths_link_a_users_asks_by_their_proxies(tmp_path):
    """The attack, on the code before 2026-12-04: every two asks of a user in one renewal period
    share 2 or more proxies, far more than an ask of another user shares with them."""
    async with Net(tmp_path, users=USERS, cloves=replace(CLOVES, single_use_paths=False)) as net:
        seen, barred = await _proxies_of_asks(net, net.nodes[:2], ASKS)
    same, cross = _shared(seen, barred)
    print(f"pooled: proxies shared by two asks of one user {same:.2f}, of two users {cross:.2f}")
    assert min(len(a & b) for a, b in itertools.combinations(seen[0], 2)) >= 2, seen[0]
    assert same > cross + 0.8, (same, cross)


async def test_single_use_paths_share_proxies_no_more_often_within_a_user_than_across_users(tmp_path):
    """Shipped: no path carries two asks, a user's asks share proxies no more than anyone's do,
    the pool holds no used path, and its relays keep a used path only as long as its onion said."""
    assert SHIPPED.single_use_paths and CLOVES.single_use_paths
    async with Net(tmp_path, users=USERS, cloves=CLOVES) as net:
        askers = net.nodes[:2]
        picked: list[tuple[int, int]] = []  # (asker, path id) of every path handed to an ask
        for i, node in enumerate(askers):
            def recording(n, now, rng, _pick=node.paths.pool.pick, _i=i):
                paths = _pick(n, now, rng)
                picked.extend((_i, p.path_id) for p in paths)
                return paths

            node.paths.pool.pick = recording
        seen, barred = await _proxies_of_asks(net, askers, ASKS)
        for node in askers:  # the last ask settles (its last reply clove is in) and its paths are replaced
            await until(lambda: not [p for p in node.paths.pool.paths.values() if p.taken]
                        and len(node.paths.pool.usable(node.paths.clock())) >= CLOVES.n, 10,
                        f"used paths retired and ready ones rebuilt ({node.paths.status()['usable']} usable)")
        entries = [(node.relay, e) for node in net.nodes for e in list(node.relay.table._by_in.values())]
        used = [(relay, e) for relay, e in entries if e.forwarded or e.returned]
        ready = [(relay, e) for relay, e in entries if not (e.forwarded or e.returned)]
        assert used and ready
        linger = askers[0].paths.linger_s  # the asker's longest reply wait (10 s here) + 30 s
        assert linger == 10 + CLOVES.used_path_linger_s and all(e.linger_s == linger for _, e in entries)
        later = max(e.last_used for _, e in entries) + linger + 1
        for relay, _ in entries:
            relay.table.expire(later)
        assert not any(relay.table.holds(e) for relay, e in used), "a relay kept a used single-use path"
        assert all(relay.table.holds(e) for relay, e in ready), "a ready path was forgotten before its use"
    assert len(picked) == len(set(picked)) == 2 * ASKS * CLOVES.n  # no path carried two asks
    same, cross = _shared(seen, barred)
    print(f"single-use: proxies shared by two asks of one user {same:.2f}, of two users {cross:.2f}")
    # (about 1 of the 4 proxies is shared by any two asks here; pooled paths share >= 2 of them)
    assert same <= cross + 0.3, (same, cross, seen)
