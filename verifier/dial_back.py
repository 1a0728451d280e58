"""Reachability: a member dials a node back before the node registers as a relay (libp2p's AutoNAT).

Why the member and not the node itself: a node behind NAT knows its router's public address but
not whether anything is forwarded to it; only a dial from outside says so, and a node that
registers an address nobody can dial has every path through it fail
(THREAT_MODEL.md "Squatted or undiallable addresses"). A node the member cannot reach registers
client-only: it builds paths and asks, and is never chosen as a hop.

What keeps a member from being anyone's scanner or amplifier: it dials only the host the call
came from (the caller names a port, never a host), at most once per host per
`host_interval_s` (loopback excepted), within `dial_timeout_s`, and it pins the caller's key, so a port another
node answers on at that host does not count as the caller's. `DialBackLimiter` and
`dial_target` are the pure part; `dial_back` is the one dial.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
from collections import OrderedDict

import grpc

from gentorrent.config import REACHABILITY, ReachabilityParams
from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity, node_id_of
from gentorrent.ledger import addresses
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

__all__ = ["DialBackLimiter", "dial_target", "dial_back"]


class DialBackError(ValueError):
    """A request this member will not dial for (said in the reply, nothing dialled)."""


def dial_target(peer: str, port: int) -> str:
    """The address to dial: the host of gRPC's `peer` string ("ipv4:1.2.3.4:5678",
    "ipv6:[::1]:5678") with the caller's `port`."""
    family, _, rest = peer.partition(":")
    if family not in ("ipv4", "ipv6") or not rest:
        raise DialBackError(f"the call came over {family or 'an unknown transport'}, not IP: nothing to dial")
    host = rest.rpartition(":")[0]
    if not 0 < port < 65536:
        raise DialBackError(f"port must be in 1..65535, got {port}")
    try:
        return addresses.canonical(f"{host}:{port}")
    except addresses.AddressError as exc:
        raise DialBackError(str(exc)) from exc


class DialBackLimiter:
    """At most one dial back per source host per interval, for a bounded number of hosts."""

    def __init__(self, params: ReachabilityParams = REACHABILITY) -> None:
        self.params = params
        self._last: OrderedDict[str, float] = OrderedDict()

    def admit(self, host: str, now: float) -> float:
        """0 if `host` may be dialled now (and counts it), else the seconds until it may. A
        loopback host is never held back: a member dials no third party there, and a devnet's
        nodes all start on one host at once."""
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return 0.0
        last = self._last.get(host)
        if last is not None and now - last < self.params.host_interval_s:
            return self.params.host_interval_s - (now - last)
        self._last[host] = now
        self._last.move_to_end(host)
        while len(self._last) > self.params.hosts_remembered:
            self._last.popitem(last=False)
        return 0.0


async def dial_back(request: pb.DialBackRequest, peer: str, own: Identity, limiter: DialBackLimiter,
                    now: float, params: ReachabilityParams = REACHABILITY) -> pb.DialBackReply:
    """Dial the caller back at its source host and `request.port`, pinning `request.public_key`."""
    try:
        if len(request.public_key) != 32:
            raise DialBackError("public_key must be a 32-byte Ed25519 key")
        target = dial_target(peer, request.port)
    except DialBackError as exc:
        return pb.DialBackReply(reachable=False, reason=str(exc))
    wait = limiter.admit(target.rpartition(":")[0], now)
    if wait:
        return pb.DialBackReply(reachable=False, address=target, retry_after_s=max(1, math.ceil(wait)),
                                reason=f"this host was dialled back moments ago: ask again in {wait:.0f} s")
    expected = node_id_of(request.public_key).hex()
    channel = tls.pinned_channel(target, tls.anchor_pem(request.public_key), tls.TlsIdentity.bound(own))
    try:
        await asyncio.wait_for(channel.channel_ready(), params.dial_timeout_s)
        health = await rpc.RelayStub(channel).Health(pb.Empty(), timeout=params.dial_timeout_s)
    except asyncio.TimeoutError:
        return pb.DialBackReply(reachable=False, address=target,
                                reason=f"no TLS connection to {target} within {params.dial_timeout_s:.0f} s")
    except grpc.aio.AioRpcError as exc:
        return pb.DialBackReply(reachable=False, address=target, reason=f"{exc.code().name}: {exc.details()}")
    finally:
        await channel.close()
    if health.node_id != expected:
        return pb.DialBackReply(reachable=False, address=target, reason="another node answered there")
    return pb.DialBackReply(reachable=True, address=target)
