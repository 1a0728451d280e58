"""The pure part of reachability checks (verifier/dial_back.py): whom a member dials, how often."""

from __future__ import annotations

import pytest

from gentorrent.config import ReachabilityParams
from verifier.dial_back import DialBackError, DialBackLimiter, dial_target


def test_a_member_dials_the_host_the_call_came_from_never_one_the_caller_names():
    assert dial_target("ipv4:203.0.113.7:51234", 9000) == "203.0.113.7:9000"
    assert dial_target("ipv6:[2001:db8::1]:51234", 9000) == "[2001:db8::1]:9000"
    for peer, port, reason in [("unix:/tmp/socket", 9000, "not IP"), ("", 9000, "not IP"),
                               ("ipv4:203.0.113.7:51234", 0, "port"), ("ipv4:203.0.113.7:51234", 70000, "port"),
                               ("ipv4:0.0.0.0:1", 9000, "cannot be dialled")]:
        with pytest.raises(DialBackError, match=reason):
            dial_target(peer, port)


def test_attack_a_caller_cannot_make_a_member_dial_one_host_over_and_over():
    limiter = DialBackLimiter(ReachabilityParams(host_interval_s=10.0, hosts_remembered=2))
    assert limiter.admit("203.0.113.7", 100.0) == 0.0
    assert limiter.admit("203.0.113.7", 104.0) == pytest.approx(6.0)  # held back, not dialled
    assert limiter.admit("203.0.113.7", 110.0) == 0.0
    assert limiter.admit("198.51.100.1", 111.0) == 0.0 and limiter.admit("198.51.100.2", 111.0) == 0.0
    assert limiter.admit("203.0.113.7", 112.0) == 0.0  # forgotten: at most `hosts_remembered` held
    for _ in range(3):  # loopback: a devnet's nodes on one host, no third party to protect
        assert limiter.admit("127.0.0.1", 100.0) == 0.0


def test_a_host_dialled_moments_ago_is_not_dialled_and_told_to_ask_another_member():
    """Two nodes behind one router ask within seconds: the second is not dialled by that member
    (no scan through it) and is not called unreachable either: `retry_after_s` sends it to
    another member (gentorrent/ledger/committee.py), and it stays a relay if all say so."""
    import asyncio

    from gentorrent.crypto.keys import Identity
    from gentorrent.wire import gentorrent_pb2 as pb
    from verifier.dial_back import dial_back

    limiter = DialBackLimiter(ReachabilityParams(host_interval_s=10.0))
    assert limiter.admit("203.0.113.7", 100.0) == 0.0
    request = pb.DialBackRequest(public_key=Identity.from_seed(bytes(32)).public_key, port=9000)
    reply = asyncio.run(dial_back(request, "ipv4:203.0.113.7:5555", Identity.from_seed(bytes([1]) * 32), limiter,
                                  103.5))
    assert not reply.reachable and reply.retry_after_s == 7 and reply.address == "203.0.113.7:9000"
    bad = asyncio.run(dial_back(pb.DialBackRequest(public_key=b"short", port=9000), "ipv4:203.0.113.8:1",
                                Identity.from_seed(bytes([1]) * 32), limiter, 103.5))
    assert not bad.reachable and not bad.retry_after_s and "32-byte" in bad.reason
