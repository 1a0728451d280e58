"""The link emulator's pure core (devnet.wan.links) and the WAN plan, without sockets or clocks."""

from __future__ import annotations

import ipaddress
import math
import random
import socket

import pytest

from devnet.wan import namespaces, profiles
from devnet.wan.links import AccessLink, Wan
from devnet.wan.profiles import LinkParams


def ipv4(src: str, dst: str, size: int = 100) -> bytes:
    """A minimal IPv4 packet of `size` bytes (only the version and addresses are read)."""
    header = bytes([0x45, 0]) + size.to_bytes(2, "big") + bytes(8) + socket.inet_aton(src) + socket.inet_aton(dst)
    return header + bytes(size - len(header))


def two_nodes(a: LinkParams, b: LinkParams, seed: int = 7) -> Wan:
    wan = Wan(seed)
    wan.add_node("a", socket.inet_aton("10.1.0.1"), a)
    wan.add_node("b", socket.inet_aton("10.2.0.1"), b)
    return wan


def run_all(wan: Wan, until: float = 1e9) -> list[tuple[str, bytes, float]]:
    return wan.advance(until)


def test_a_packet_crosses_the_senders_uplink_then_the_receivers_downlink():
    wan = two_nodes(LinkParams(delay_s=0.010), LinkParams(delay_s=0.025))
    wan.send(1.0, "a", ipv4("10.1.0.1", "10.2.0.1"))
    assert wan.advance(1.034) == []  # not early
    [(dst, _, at)] = wan.advance(1.036)
    assert dst == "b" and at == pytest.approx(1.035)
    wan.send(2.0, "b", ipv4("10.2.0.1", "10.1.0.1"))
    assert run_all(wan)[0][2] == pytest.approx(2.035)  # the same both ways


def test_the_schedule_is_kept_in_virtual_time_whatever_the_shell_wakes_late():
    """A late advance delivers the packet then, but later packets keep their own times."""
    wan = two_nodes(LinkParams(delay_s=0.010), LinkParams(delay_s=0.010))
    wan.send(0.0, "a", ipv4("10.1.0.1", "10.2.0.1"))
    wan.send(0.005, "a", ipv4("10.1.0.1", "10.2.0.1"))
    times = [at for _, _, at in wan.advance(5.0)]  # woke 5 s late
    assert times == pytest.approx([0.020, 0.025])


def test_loss_is_the_profiles_per_pair_and_seeded():
    loss = 0.05
    link = LinkParams(loss=profiles.crossing_loss(loss))
    counts = []
    for seed in (1, 1, 2):
        wan = two_nodes(link, link, seed)
        for i in range(20000):
            wan.send(i * 1e-3, "a", ipv4("10.1.0.1", "10.2.0.1"))
        counts.append(len(run_all(wan)))
    lost = 1 - counts[0] / 20000
    sigma = math.sqrt(loss * (1 - loss) / 20000)
    assert abs(lost - loss) < 4 * sigma, lost
    assert counts[0] == counts[1] and counts[0] != counts[2]  # the same seed, the same losses


def test_jitter_never_reorders_one_line():
    link = LinkParams(delay_s=0.010, jitter_s=0.020)
    wan = two_nodes(link, link)
    for i in range(2000):
        wan.send(i * 1e-4, "a", ipv4("10.1.0.1", "10.2.0.1", 40 + i % 1000))
    out = run_all(wan)
    sizes = [len(p) for _, p, _ in out]
    assert sizes == [40 + i % 1000 for i in range(2000)]  # in the order sent
    times = [at for _, _, at in out]
    assert times == sorted(times)
    spread = [at - i * 1e-4 for i, at in enumerate(times)]
    assert min(spread) >= 0.020 and max(spread) > 0.030  # delayed, and jittered


def test_rate_paces_a_burst_and_a_full_queue_drops():
    rate = 10_000_000  # 1250 bytes take 1 ms
    wan = two_nodes(LinkParams(rate_bps=rate, queue_s=0.0505), LinkParams())
    for _ in range(100):
        wan.send(0.0, "a", ipv4("10.1.0.1", "10.2.0.1", 1250))
    out = run_all(wan)
    times = [at for _, _, at in out]
    assert len(out) == 51  # 50 ms of queue: the 52nd packet would wait longer than queue_s
    assert times[0] == pytest.approx(0.001) and times[-1] == pytest.approx(0.051)
    assert wan.nodes["a"].up.dropped["queue"] == 49


def test_only_the_nodes_addresses_are_routed():
    wan = two_nodes(LinkParams(), LinkParams())
    wan.send(0.0, "a", ipv4("10.1.0.1", "8.8.8.8"))  # outside the box: never delivered
    wan.send(0.0, "a", bytes([0x60]) + bytes(60))  # IPv6
    wan.send(0.0, "a", b"\x45")  # truncated
    assert run_all(wan) == []
    assert wan.dropped == {"no_route": 1, "not_ipv4": 2}


def test_a_perfect_link_delivers_at_once_and_set_link_changes_a_line():
    wan = two_nodes(LinkParams(), LinkParams())
    wan.send(3.0, "a", ipv4("10.1.0.1", "10.2.0.1"))
    assert [at for _, _, at in wan.advance(3.0)] == [3.0]
    wan.set_link("b", LinkParams(loss=0.999))
    for i in range(100):
        wan.send(4.0, "a", ipv4("10.1.0.1", "10.2.0.1"))
    assert len(run_all(wan)) < 5


def test_access_link_rejects_nonsense_parameters():
    for bad in ({"loss": 1.0}, {"delay_s": -1}, {"queue_s": 0}, {"rate_bps": -5}):
        with pytest.raises(ValueError):
            LinkParams(**bad)
    AccessLink(LinkParams(), random.Random(0))


# --------------------------------------------------------------------------- profiles and the plan


@pytest.mark.parametrize("name", ["home", "global"])
def test_profile_pairs_fall_in_the_issues_ranges(name):
    p = profiles.profile(name)
    rng = random.Random(3)
    links = [p.draw(rng) for _ in range(200)]
    pairs = [a.delay_s + b.delay_s for a, b in zip(links, links[1:])]
    low, high = p.one_way_s
    assert low - 1e-9 <= min(pairs) and max(pairs) <= high + 1e-9
    assert 1 - (1 - links[0].loss) ** 2 == pytest.approx(p.loss)
    assert links[0].rate_bps == 20 * profiles.MBIT


def test_home_is_the_issues_profile_and_an_unknown_one_is_named():
    home = profiles.profile("home")
    assert (home.one_way_s, home.loss, home.rate_bps) == ((0.015, 0.060), 0.005, 20_000_000)
    assert profiles.profile("global").one_way_s == (0.040, 0.150) and profiles.profile("global").loss == 0.01
    with pytest.raises(ValueError, match="unknown WAN profile 'moon'; one of home, global"):
        profiles.profile("moon")


def test_plan_gives_each_node_its_own_slash16_and_puts_the_last_users_behind_nat():
    nodes = [(f"v{i}", "verifier") for i in range(4)] + [("honest0", "model"), ("honest1", "model"),
                                                         ("dishonest0", "model")] + \
            [(f"u{i:02d}", "user") for i in range(8)]
    plan = namespaces.make_plan("gtwabcdef", nodes, profiles.profile("home"), seed=5, local=frozenset({"v0"}))
    assert plan.operator.link_params().perfect and plan.node("v0").link_params().perfect
    nets = [ipaddress.ip_network(f"{n.address}/16", strict=False) for n in plan.nodes]
    assert len(set(nets)) == len(nets)
    assert [n.name for n in plan.nodes if n.nat] == ["dishonest0", "u06", "u07"]
    assert not plan.node("u00").nat and not plan.node("honest0").nat
    assert plan.node("u07").listen_host == namespaces.LAN_HOST and plan.node("u07").wan_netns == "gtwabcdef-u07-nat"
    assert len(set(plan.namespaces())) == len(plan.nodes) + 3
    assert all(ns.startswith("gtwabcdef-") for ns in plan.namespaces())
    again = namespaces.make_plan("gtwabcdef", nodes, profiles.profile("home"), seed=5, local=frozenset({"v0"}))
    assert again == plan  # seeded


def test_remove_refuses_a_prefix_that_is_not_ours():
    with pytest.raises(namespaces.WanError):
        namespaces.remove("gtw")
    with pytest.raises(namespaces.WanError):
        namespaces.remove("")


# --------------------------------------------------------------------------- bench/wan.py's floors


def _wan_bench():
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("wan_bench",
                                                  Path(__file__).resolve().parents[1] / "bench" / "wan.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # bench/ is scripts, not a package
    spec.loader.exec_module(module)
    return module


def test_the_benchs_floors_are_the_planned_propagation_of_each_way():
    """Direct: one round trip over the user's and the model's lines. Overlay: k = 3 of 4 cloves
    each way, so twice the third-fastest path; a path's one-way time counts each relay's line
    twice (in and out)."""
    plan = namespaces.WanPlan("gtwtest", {}, 0, [
        namespaces.PlacedNode(name, "user", f"gtwtest-{name}", f"10.{k}.0.1", "", {"delay_s": d})
        for k, (name, d) in enumerate([("u", 0.010), ("m", 0.020), ("r1", 0.001), ("r2", 0.002), ("r3", 0.003),
                                      ("r4", 0.004), ("r5", 0.005)], start=1)])
    floors = _wan_bench().Floors(plan)
    u, m = "10.1.0.1:5", "10.2.0.1:6"
    assert floors.direct_ms(u, m) == pytest.approx(2 * 30)
    r = {i: f"10.{i + 2}.0.1:7" for i in range(1, 6)}
    paths = [[r[1], r[2], r[3]], [r[2], r[3], r[4]], [r[3], r[4], r[5]], [r[1], r[1], r[1]]]
    # one way: u + m + 2 * (sum of the three relays' lines): 30 + 2 * (6, 9, 12, 3) ms
    assert floors.one_way([u, *paths[0], m]) == pytest.approx(0.042)
    assert floors.overlay_ms(u, m, paths) == pytest.approx(2 * (30 + 2 * 9))  # the third fastest of 36, 42, 48, 54
    assert floors.build_ms(u, paths[0]) == pytest.approx(2 * (10 + 2 * 1 + 2 * 2 + 3))
